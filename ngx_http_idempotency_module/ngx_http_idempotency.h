/*
 * ngx_http_idempotency_module: the types the nginx glue shares (the
 * configuration, the request context, the enums, the log helpers), and no
 * function: each glue file declares its own in ngx_http_idempotency_X.h,
 * which a caller includes.  docs/architecture.md says which file owns what
 * and in which direction they call each other.
 */

#ifndef NGX_HTTP_IDEMPOTENCY_H
#define NGX_HTTP_IDEMPOTENCY_H

#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include "idem_answer.h"
#include "idem_audit.h"
#include "idem_fingerprint.h"
#include "idem_json.h"
#include "idem_jws.h"
#include "idem_key.h"
#include "idem_record.h"
#include "idem_text.h"
#include "ngx_http_idempotency_transport.h"


#define NGX_HTTP_IDEM_TOKEN_HEX       IDEM_TOKEN_LEN  /* 128 bits as hex */

/* idempotency_thread_pool: smaller JSON bodies are not worth a hand-off */
#define NGX_HTTP_IDEM_THREAD_MIN      (32 * 1024)

/* idempotency_redis_wait */
#define NGX_HTTP_IDEM_WAIT_REPLICAS_TIMEOUT  100
#define NGX_HTTP_IDEM_WAIT_REPLICAS_MAX      64

#define NGX_HTTP_IDEM_FAILURE_CLOSED  0
#define NGX_HTTP_IDEM_FAILURE_OPEN    1


/*
 * The audit file device (idempotency_audit file=PATH): one per path in
 * the configuration, one chain whose head is in its shared memory zone
 * (ngx_http_idempotency_audit_file.c).
 */
typedef struct {
    ngx_str_t                    path;      /* full, NUL-terminated */
    ngx_int_t                    fsync;     /* 0 off, -1 every, N */
    ngx_open_file_t             *file;      /* reopened by nginx (USR1) */
    ngx_shm_zone_t              *zone;
    void                        *sh;        /* the head, in the zone */
    ngx_slab_pool_t             *shpool;    /* its mutex guards the head */
    idem_jws_key_t              *key;
    ngx_uint_t                   anchor;
    void                        *hasher;    /* the chain's, set up once */
    void                        *batch;     /* this process' lines to come */
    dev_t                        dev;       /* the file of this process' */
    ino_t                        ino;       /* descriptor, while "known" */
    unsigned                     used:1;    /* key and anchor are set */
    unsigned                     known:1;
} ngx_http_idem_audit_file_t;


/*
 * A request waiting for lines of its own to be in the audit file (a
 * claim's "sent": fail closed), written with the others of the event
 * loop's turn: the handler is called from a posted event, rc NGX_OK when
 * they are all in the file, NGX_ERROR when the write failed (none is) or
 * its fdatasync() did (they may not be on the disk).
 */
typedef struct ngx_http_idem_audit_wait_s  ngx_http_idem_audit_wait_t;

struct ngx_http_idem_audit_wait_s {
    ngx_queue_t                  queue;
    void                       (*handler)(ngx_http_idem_audit_wait_t *w);
    void                        *data;
    ngx_int_t                    rc;
    unsigned                     linked:1;
};


/* a request gone while it waited: its handler is not called */
static ngx_inline void
ngx_http_idem_audit_wait_cancel(ngx_http_idem_audit_wait_t *w)
{
    if (w->linked) {
        ngx_queue_remove(&w->queue);
        w->linked = 0;
    }
}


/*
 * The audit devices of one Redis server (idempotency_audit): the stream
 * when "stream" is set, the file when "file" is; every location that
 * writes them shares this, so a chain has one key.
 */
typedef struct {
    ngx_http_idem_redis_t       *redis;
    ngx_str_t                    stream;    /* NUL-terminated */
    ngx_str_t                    head_key;  /* "<stream>:head", the same */
    ngx_uint_t                   anchor;    /* the head is logged each N */
    idem_jws_key_t              *key;       /* NULL: a plain SHA-256 chain */
    ngx_http_idem_audit_file_t  *file;      /* NULL: no file device */
    unsigned                     on_stream:1;
} ngx_http_idem_audit_t;


typedef struct {
    ngx_array_t                  servers;   /* ngx_http_idem_redis_t * */
    ngx_http_idem_script_t      *scripts;
    ngx_uint_t                   used;
    ngx_shm_zone_t              *metrics_zone;
    ngx_array_t                  metrics_labels;   /* ngx_str_t; [0] "" */
    ngx_array_t                  json_vars;  /* idempotency_json_var */
    ngx_array_t                  audits;    /* ngx_http_idem_audit_t * */
    ngx_array_t                  audit_files;
                                 /* ngx_http_idem_audit_file_t * */
    ngx_int_t                    request_id;   /* $request_id's index */
    ngx_array_t                 *unique_nss;   /* ngx_str_t: location
                                                  identity namespaces */
} ngx_http_idem_main_conf_t;


/* a JSON pointer of nginx.conf, parsed once (idempotency_json_var, _show) */
typedef struct {
    ngx_str_t                    text;
    idem_ptr_t                   parsed;
} ngx_http_idem_pointer_t;


/* idempotency_json_var $name /pointer, in the main conf's json_vars */
typedef struct {
    ngx_str_t                    name;
    ngx_http_idem_pointer_t      pointer;
} ngx_http_idem_json_var_t;


/*
 * A value of idempotency_unique or idempotency_lock, and each of its
 * variables alone ("tickets:$host:$id": "$host", "$id"): an identity is
 * none when one of them is empty (a body without the member must not make
 * every such request one identity), a lock is none only when all are.
 */
typedef struct {
    ngx_http_complex_value_t     value;
    ngx_array_t                 *vars;     /* ngx_http_complex_value_t */
    ngx_str_t                    shared;   /* unique: shared=NAME, or "" */
    ngx_uint_t                   optional; /* lock: an empty value passes */
} ngx_http_idem_business_t;


typedef struct {
    ngx_flag_t                   enable;
    ngx_http_idem_redis_t       *redis;
    ngx_uint_t                   methods;
    ngx_str_t                    key_header;
    ngx_flag_t                   required;
    ngx_http_complex_value_t    *scope;
    time_t                       ttl;
    ngx_msec_t                   lease;
    ngx_uint_t                   conflict_status;
    size_t                       store_max;
    ngx_array_t                 *store_headers;    /* ngx_str_t, lowercase */
    ngx_uint_t                   store_failure;
    ngx_array_t                 *fp_headers;       /* ngx_str_t, lowercase */
    idem_ptr_set_t              *fp_exclude;       /* NULL: none */
    ngx_array_t                 *release_statuses; /* ngx_uint_t */
    ngx_msec_t                   wait;
    ngx_flag_t                   complete_beside;  /* native completion */
    ngx_uint_t                   wait_replicas;    /* 0: no WAIT */
    ngx_msec_t                   wait_replicas_timeout;
    ngx_uint_t                   ops;    /* status or admin location */
    ngx_http_handler_pt          content;  /* the module's, not inherited */
    ngx_uint_t                   metrics_label;    /* in metrics_labels */
#if (NGX_THREADS)
    ngx_thread_pool_t           *thread_pool;      /* NULL: off */
#else
    void                        *thread_pool;      /* always NULL */
#endif
    size_t                       thread_min;       /* body bytes */

    /* idempotency_confirm: NULL when off */
    ngx_http_complex_value_t    *confirm;
    ngx_array_t                 *confirm_keys;     /* idem_jws_key_t */
    ngx_array_t                 *confirm_show;     /* ngx_http_idem_pointer_t */
    ngx_array_t                 *confirm_labels;   /* ngx_str_t, per show */
    time_t                       confirm_ttl;
    ngx_http_complex_value_t    *confirm_describe; /* NULL: none */
    ngx_str_t                    confirm_link;     /* "": no approve_url */

    /* idempotency_approve(_page): who approves; NULL: the body says */
    ngx_http_complex_value_t    *approve_identity;
    idem_jws_key_t              *page_secret;      /* NULL: no page here */
    time_t                       page_ttl_max;     /* s */

    /* idempotency_unique, idempotency_lock: NULL when off */
    ngx_http_idem_business_t    *unique;
    ngx_http_idem_business_t    *lock;

    /*
     * A guarded location (idempotency_confirm, _unique or _lock): what a
     * client omits or relabels never turns a guard off (docs/directives.md,
     * "Guarded locations").  "allow" is the Allow of its 405; "unique_ns"
     * the namespace of its identities (the location, or shared=NAME), and
     * "loc_tag" names the location to the holder of an identity.
     */
    ngx_uint_t                   guarded;
    ngx_str_t                    loc_name;         /* for the error log */
    ngx_str_t                    allow;
    ngx_array_t                 *json_types;       /* ngx_str_t, lowercase */
    ngx_str_t                    unique_ns;
    u_char                       loc_tag[IDEM_RECORD_KEY_LEN + 1];

    /* idempotency_audit: the devices, NULL when off */
    ngx_flag_t                   audit_on;         /* the stream */
    ngx_http_idem_audit_file_t  *audit_file;       /* file=, NULL: none */
    ngx_http_idem_audit_t       *audit;
    ngx_str_t                    audit_stream;
    ngx_uint_t                   audit_anchor;
    idem_jws_key_t              *audit_key;        /* NULL: none */
    ngx_http_complex_value_t    *audit_identity;
    ngx_str_t                    audit_ref;        /* a response header */
} ngx_http_idem_loc_conf_t;


typedef enum {
    NGX_HTTP_IDEM_NEW = 0,
    NGX_HTTP_IDEM_READING_BODY,
    NGX_HTTP_IDEM_BODY_READ,
    NGX_HTTP_IDEM_FINGERPRINTING,   /* in idempotency_thread_pool */
    NGX_HTTP_IDEM_FINGERPRINTED,
    NGX_HTTP_IDEM_CLAIMING,
    NGX_HTTP_IDEM_WAITING,
    NGX_HTTP_IDEM_ANSWERED,
    NGX_HTTP_IDEM_PASSED,       /* handed to the content handler */
    NGX_HTTP_IDEM_DONE          /* the module answered or stepped aside */
} ngx_http_idem_phase_e;


typedef enum {
    NGX_HTTP_IDEM_OUT_NONE = 0,
    NGX_HTTP_IDEM_OUT_EXECUTED,
    NGX_HTTP_IDEM_OUT_REPLAYED,
    NGX_HTTP_IDEM_OUT_CONFLICT,
    NGX_HTTP_IDEM_OUT_IN_PROGRESS,
    NGX_HTTP_IDEM_OUT_UNKNOWN,
    NGX_HTTP_IDEM_OUT_REJECTED,
    NGX_HTTP_IDEM_OUT_BYPASSED,
    NGX_HTTP_IDEM_OUT_CONFIRM_REQUIRED,
    NGX_HTTP_IDEM_OUT_REUSED,         /* idempotency_unique */
    NGX_HTTP_IDEM_OUT_LOCKED,         /* idempotency_lock */
    NGX_HTTP_IDEM_NOUTCOME_NAMES     /* with "none" */
} ngx_http_idem_outcome_e;


/* What the claim script said. */
typedef enum {
    NGX_HTTP_IDEM_ANS_NONE = 0,
    NGX_HTTP_IDEM_ANS_CLAIMED,
    NGX_HTTP_IDEM_ANS_COMPLETED,
    NGX_HTTP_IDEM_ANS_MISMATCH,
    NGX_HTTP_IDEM_ANS_IN_PROGRESS,
    NGX_HTTP_IDEM_ANS_UNKNOWN,
    NGX_HTTP_IDEM_ANS_RELEASED,      /* the attempt waited on: "later" */
    NGX_HTTP_IDEM_ANS_CONFIRM,       /* awaiting_confirmation: 428 */
    NGX_HTTP_IDEM_ANS_APPROVAL_EXPIRED,  /* approved, but no longer: 428 */
    NGX_HTTP_IDEM_ANS_DECLINED,      /* a person said no: 403 */
    NGX_HTTP_IDEM_ANS_REUSED,        /* another key's stored 2xx */
    NGX_HTTP_IDEM_ANS_LOCKED,        /* idempotency_lock held: 409 */
    NGX_HTTP_IDEM_ANS_STORE_DOWN,    /* no reply: connection, timeout */
    NGX_HTTP_IDEM_ANS_NOT_REPLICATED,   /* claimed, then released: WAIT */
    NGX_HTTP_IDEM_ANS_STORE_ERROR,   /* a reply we do not understand */
    NGX_HTTP_IDEM_ANS_AUDIT_DOWN,    /* claimed, then released: the audit
                                        file could not record it */
    NGX_HTTP_IDEM_ANS_ELSEWHERE      /* identity held by another location */
} ngx_http_idem_answer_e;


/* What idempotency_confirm asks of this request. */
typedef enum {
    NGX_HTTP_IDEM_CONFIRM_NONE = 0,   /* not asked: claim as always */
    NGX_HTTP_IDEM_CONFIRM_PROPOSE,    /* asked, no approval: a proposal */
    NGX_HTTP_IDEM_CONFIRM_APPROVED,   /* asked, a valid approval came */
    NGX_HTTP_IDEM_CONFIRM_RECORDED    /* the record holds an approval */
} ngx_http_idem_confirm_e;


/*
 * idempotency_audit: what the entries of the next claim script are made
 * for (redis-scripts/audit.lua): none yet (the script only decides), this
 * attempt's claim, or what the script said it would do.
 */
typedef enum {
    NGX_HTTP_IDEM_AUDIT_DECIDE = 0,
    NGX_HTTP_IDEM_AUDIT_CLAIM,
    NGX_HTTP_IDEM_AUDIT_APPROVE,
    NGX_HTTP_IDEM_AUDIT_REUSE,
    NGX_HTTP_IDEM_AUDIT_UNKNOWN
} ngx_http_idem_audit_kind_e;


/* How a claimed request ended, i.e. which script closes the record. */
typedef enum {
    NGX_HTTP_IDEM_END_NONE = 0,
    NGX_HTTP_IDEM_END_COMPLETE,
    NGX_HTTP_IDEM_END_RELEASE,
    NGX_HTTP_IDEM_END_FAIL
} ngx_http_idem_end_e;


/*
 * Every answer the module makes itself, as an application/problem+json.
 * Their slugs, titles, statuses, details and the client's action are one
 * table in the core (idem_answer.c), indexed by these values: each takes
 * its row's index, so the two cannot drift apart (a value added here
 * without a row fails the check in _reply.c).
 */
typedef enum {
    NGX_HTTP_IDEM_P_KEY_MISSING            = IDEM_ANS_KEY_MISSING,
    NGX_HTTP_IDEM_P_KEY_MALFORMED          = IDEM_ANS_KEY_MALFORMED,
    NGX_HTTP_IDEM_P_MISMATCH               = IDEM_ANS_MISMATCH,
    NGX_HTTP_IDEM_P_IN_PROGRESS            = IDEM_ANS_IN_PROGRESS,
    NGX_HTTP_IDEM_P_UNKNOWN                = IDEM_ANS_UNKNOWN,
    NGX_HTTP_IDEM_P_NOT_STORED             = IDEM_ANS_NOT_STORED,
    NGX_HTTP_IDEM_P_STORE_DOWN             = IDEM_ANS_STORE_DOWN,
    NGX_HTTP_IDEM_P_STORE_ERROR            = IDEM_ANS_STORE_ERROR,
    NGX_HTTP_IDEM_P_NOT_REPLICATED         = IDEM_ANS_NOT_REPLICATED,
    NGX_HTTP_IDEM_P_NOT_FOUND              = IDEM_ANS_NOT_FOUND,
    NGX_HTTP_IDEM_P_NOT_RESOLVABLE         = IDEM_ANS_NOT_RESOLVABLE,
    NGX_HTTP_IDEM_P_BAD_ADMIN              = IDEM_ANS_BAD_ADMIN,
    NGX_HTTP_IDEM_P_RETRY_LATER            = IDEM_ANS_RETRY_LATER,
    NGX_HTTP_IDEM_P_CONFIRM_REQUIRED       = IDEM_ANS_CONFIRM_REQUIRED,
    NGX_HTTP_IDEM_P_CONFIRM_INVALID        = IDEM_ANS_CONFIRM_INVALID,
    NGX_HTTP_IDEM_P_CONFIRM_EXPIRED        = IDEM_ANS_CONFIRM_EXPIRED,
    NGX_HTTP_IDEM_P_BAD_APPROVAL           = IDEM_ANS_BAD_APPROVAL,
    NGX_HTTP_IDEM_P_APPROVAL_MISMATCH      = IDEM_ANS_APPROVAL_MISMATCH,
    NGX_HTTP_IDEM_P_NOT_APPROVABLE         = IDEM_ANS_NOT_APPROVABLE,
    NGX_HTTP_IDEM_P_LOCK_HELD              = IDEM_ANS_LOCK_HELD,
    NGX_HTTP_IDEM_P_BODY_UNREADABLE        = IDEM_ANS_BODY_UNREADABLE,
    NGX_HTTP_IDEM_P_METHOD_NOT_ALLOWED     = IDEM_ANS_METHOD_NOT_ALLOWED,
    NGX_HTTP_IDEM_P_UNSUPPORTED_MEDIA      = IDEM_ANS_UNSUPPORTED_MEDIA,
    NGX_HTTP_IDEM_P_LOCK_VALUE_MISSING     = IDEM_ANS_LOCK_VALUE_MISSING,
    NGX_HTTP_IDEM_P_IDENTITY_ELSEWHERE     = IDEM_ANS_IDENTITY_ELSEWHERE,
    NGX_HTTP_IDEM_P_CROSS_SITE             = IDEM_ANS_CROSS_SITE,
    NGX_HTTP_IDEM_P_CONFIRM_DECLINED       = IDEM_ANS_CONFIRM_DECLINED,
    NGX_HTTP_IDEM_P_APPROVER_MISMATCH      = IDEM_ANS_APPROVER_MISMATCH,
    NGX_HTTP_IDEM_P_AUDIT_UNAVAILABLE      = IDEM_ANS_AUDIT_UNAVAILABLE,
    NGX_HTTP_IDEM_P_BODY_TOO_LARGE         = IDEM_ANS_BODY_TOO_LARGE,
    NGX_HTTP_IDEM_P_INTERNAL_ERROR         = IDEM_ANS_INTERNAL_ERROR,
    NGX_HTTP_IDEM_NPROBLEMS
} ngx_http_idem_problem_e;


typedef struct ngx_http_idem_ctx_s  ngx_http_idem_ctx_t;

/* a feature's part in a claim: its hooks, ngx_http_idempotency_claim.h */
typedef struct ngx_http_idem_claim_part_s  ngx_http_idem_claim_part_t;

/*
 * The link from a complete script in flight to the request that holds its
 * response's end for the answer.  The script may outlive the request, and
 * the request may stop waiting first, so neither points into the other:
 * the request clears "ctx" when it stops waiting, and the script's handler
 * frees the link.
 */
typedef struct {
    ngx_http_idem_ctx_t         *ctx;
} ngx_http_idem_ack_t;


/*
 * r->buffered while the response's end is held: nginx then finalizes the
 * request only once that is sent.  r->buffered has four bits and nginx's
 * own filters use them all; this is the image filter's, which does not
 * run on the JSON answers of a write endpoint (docs/directives.md).
 */
#define NGX_HTTP_IDEM_BUFFERED  0x08

struct ngx_http_idem_ctx_s {
    ngx_http_request_t          *request;
    ngx_http_idem_loc_conf_t    *conf;      /* where the key was claimed */
    ngx_http_idem_phase_e        phase;
    ngx_http_idem_outcome_e      outcome;

    ngx_str_t                    route;
    ngx_str_t                    key;
    u_char                       fingerprint[IDEM_FP_HEX_LEN];
    idem_body_form_t             body_form;
    u_char                       rkey[IDEM_RECORD_KEY_LEN + 1];
    u_char                       owner[NGX_HTTP_IDEM_TOKEN_HEX];
    ngx_str_t                    op_id;
    int64_t                      created;   /* ms, when claimed */

    ngx_http_idem_cmd_t         *cmd;       /* a command awaited */

    /* the claim's answer */
    ngx_http_idem_answer_e       answer;
    ngx_str_t                    state;
    ngx_str_t                    record;    /* the value, for a replay */
    ngx_uint_t                   stored_status;
    ngx_str_t                    stored_headers;
    ngx_str_t                    stored_body;
    ngx_int_t                    retry_after;  /* RELEASED; -1: none */
    unsigned                     body_stored:1;

    /* capture of the upstream's response */
    ngx_http_idem_end_e          end;
    ngx_uint_t                   status;
    ngx_str_t                    headers;
    ngx_chain_t                 *body;
    ngx_chain_t                **last;
    size_t                       body_size;
    off_t                        content_length;
    ngx_event_t                  renew;

    /*
     * The response's end waits for Redis to acknowledge its record, so
     * that a client that has read it all and retries gets the replay.
     * "closed" is called when the complete script answered.
     */
    ngx_chain_t                 *held;
    ngx_chain_t                 *pending;   /* withheld until the next */
    ngx_chain_t                 *tail;      /* the last stored copy */
    ngx_event_t                  hold;
    ngx_http_idem_ack_t         *ack;
    void                       (*closed)(ngx_http_idem_ctx_t *ctx);

    /* a claim or a completion waiting for replicas (idempotency_redis_wait) */
    ngx_http_idem_replicas_t     replicas;

    /* a claim waiting for its lines in the audit file (file=, alone) */
    ngx_http_idem_audit_wait_t   audit_wait;

    /* waiting for an in-flight duplicate to finish (idempotency_wait) */
    ngx_http_idem_waiter_t       waiter;
    ngx_event_t                  wait_timer;
    ngx_msec_t                   wait_deadline;
    ngx_msec_t                   lease_left;    /* from the claim's answer */
    u_char                       waited_op[NGX_HTTP_IDEM_TOKEN_HEX];
    unsigned                     waited:1;      /* waited_op is set */
    unsigned                     waiting:1;
    unsigned                     wait_expired:1;

    /* idempotency_confirm */
    ngx_http_idem_confirm_e      confirm;
    idem_jws_rc_t                jws_rc;       /* a refused approval */
    ngx_str_t                    approver;     /* sub, or the recorded */
    int64_t                      proposal_expires;   /* ms */
    ngx_str_t                    problem_extra;   /* ",..." members */
    void                        *approval;     /* idempotency_approve's */
    ngx_str_t                    proposal;     /* its JSON, as stored */
    void                        *lookup;       /* by operation id */
    ngx_int_t                  (*propose)(ngx_http_request_t *r,
                                          ngx_http_idem_ctx_t *ctx);

    unsigned                     fingerprinted:1;
    unsigned                     reclaimed:1;   /* a recorded approval */
    unsigned                     claimed:1;
    unsigned                     capturing:1;
    unsigned                     too_large:1;

    /* idempotency_json_var: the body parsed once, NULL if not JSON */
    void                        *json_root;   /* cJSON * */
    unsigned                     json_parsed:1;
    /*
     * a variable was read, and empty because the body, of a JSON media
     * type, could not be (not canonical JSON, or too large)
     */
    unsigned                     json_unreadable:1;
    /* a variable was read once the body was (a guard's 415) */
    unsigned                     json_read:1;

    /*
     * idempotency_unique and idempotency_lock: their keys, "" when the
     * location has none or the value is empty; with a lock, the scope's
     * tag and the key beside the record that names the lock (hkey)
     */
    ngx_str_t                    scope;        /* as the record key has it */
    u_char                       ukey[IDEM_RECORD_KEY_LEN + 1];
    u_char                       lkey[IDEM_RECORD_KEY_LEN + 1];
    u_char                       stag[IDEM_RECORD_KEY_LEN + 1];
    u_char                       hkey[IDEM_RECORD_KEY_LEN + 1];
    ngx_str_t                    op;      /* LOCKED: the holder's */
    unsigned                     reused:1;     /* another key's operation */
    unsigned                     business:1;   /* ukey, lkey, hkey set */
    unsigned                     lock_missing:1;  /* no lock value */
    unsigned                     undo:1;  /* claim.lua gives back first */
    /* the native claim: its record SET's reply, type and string */
    int                          bkeys_look_type;
    ngx_str_t                    bkeys_look;
    void                        *bkeys;   /* on a cluster (_bkeys.c) */

    /* idempotency_audit */
    ngx_str_t                    audit_identity;
    ngx_str_t                    audit_request;   /* $request_id */
    ngx_str_t                    audit_ref;       /* the upstream's */
    ngx_str_t                    audit_expect;    /* see audit.lua */
    ngx_http_idem_audit_kind_e   audit_kind;
    unsigned                     audit_prepared:1;
    unsigned                     audit_attempted:1;  /* in the stream */
    unsigned                     audit_answered:1;   /* the answer's too */
    unsigned                     audit_unrecorded:1; /* file: the claim
                                                        is not in it */
    unsigned                     audit_later:1;      /* file, cluster: the
                                                        claim's entries wait
                                                        for its business
                                                        keys */
};


extern ngx_module_t  ngx_http_idempotency_module;


/* the worker's cached clock in ms since the epoch: what records stamp */
static ngx_inline int64_t
ngx_http_idem_now_ms(void)
{
    ngx_time_t  *tp;

    tp = ngx_timeofday();

    return (int64_t) tp->sec * 1000 + tp->msec;
}

/*
 * A value a client or an approver chose (a key, an approval's sub), as
 * the error log may show it: control characters, DEL and ill-formed UTF-8
 * as \xNN (idem_log_escape()), so that it cannot forge a line or send a
 * terminal escape.  In the pool; a placeholder when memory is short,
 * never the raw value.
 */
static ngx_inline ngx_str_t *
ngx_http_idem_log_str(ngx_pool_t *pool, ngx_str_t *v)
{
    size_t      n;
    ngx_str_t  *out;

    static ngx_str_t  unloggable = ngx_string("(not logged)");

    n = idem_log_escape_len((const char *) v->data, v->len);

    if (n == v->len) {
        return v;
    }

    /* NULL: a request's pool while nginx frees the request (its cleanups) */
    out = pool ? ngx_palloc(pool, sizeof(ngx_str_t)) : NULL;
    if (out == NULL) {
        return &unloggable;
    }

    out->data = ngx_pnalloc(pool, n);
    if (out->data == NULL) {
        return &unloggable;
    }

    out->len = idem_log_escape((char *) out->data, (const char *) v->data,
                               v->len);

    return out;
}


/*
 * The request's key, as the error log may show it.  A key is printable
 * ASCII (idem_key.c), so this never allocates, and it is safe in the
 * request's pool cleanup, where r->pool is already NULL.
 */
#define ngx_http_idem_log_key(ctx)                                          \
    ngx_http_idem_log_str((ctx)->request->pool, &(ctx)->key)


/* the keys a claim may take beside its record: unique, lock, the h key */
#define NGX_HTTP_IDEM_BUSINESS_KEYS  3


#endif /* NGX_HTTP_IDEMPOTENCY_H */
