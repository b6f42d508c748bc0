/*
 * ngx_http_idempotency_module: the types the nginx glue shares, and each
 * file's functions.  docs/architecture.md says which file owns what and in
 * which direction they call each other.
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
#include "ngx_http_idempotency_redis.h"
#include "ngx_http_idempotency_metrics.h"


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
    unsigned                     used:1;    /* key and anchor are set */
} ngx_http_idem_audit_file_t;


/*
 * The audit devices of one Redis server (idempotency_audit): the stream
 * when "stream" is set, the file when "file" is; every location that
 * writes them shares this, so a chain has one key.
 */
typedef struct {
    ngx_http_idem_redis_t       *redis;
    ngx_str_t                    stream;    /* NUL-terminated */
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
    NGX_HTTP_IDEM_NPROBLEMS
} ngx_http_idem_problem_e;


typedef struct ngx_http_idem_ctx_s  ngx_http_idem_ctx_t;

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


/* ngx_http_idempotency_ctx.c: the request context */
ngx_http_idem_ctx_t *ngx_http_idem_get_ctx(ngx_http_request_t *r);
ngx_http_idem_ctx_t *ngx_http_idem_create_ctx(ngx_http_request_t *r);

/* ngx_http_idempotency_request.c: what names the record */
ngx_int_t ngx_http_idem_parse_key(ngx_http_request_t *r,
    ngx_http_idem_ctx_t *ctx, ngx_str_t *name, const char **detail);
ngx_int_t ngx_http_idem_record_key(ngx_http_request_t *r,
    ngx_http_idem_ctx_t *ctx, ngx_str_t *scope);
ngx_int_t ngx_http_idem_fp_headers(ngx_http_request_t *r,
    ngx_http_idem_ctx_t *ctx, idem_fp_input_t *in);
u_char *ngx_http_idem_operation_key(ngx_pool_t *pool, ngx_str_t *op);
ngx_table_elt_t *ngx_http_idem_find_header(ngx_http_request_t *r,
    ngx_str_t *name, ngx_uint_t *count);
ngx_table_elt_t *ngx_http_idem_header_out(ngx_http_request_t *r,
    u_char *name, size_t len);

/* ngx_http_idempotency_handler.c: the phases */
ngx_int_t ngx_http_idem_rewrite_handler(ngx_http_request_t *r);
ngx_int_t ngx_http_idem_precontent_handler(ngx_http_request_t *r);
ngx_int_t ngx_http_idem_log_handler(ngx_http_request_t *r);

/* ngx_http_idempotency_body.c: the body's part of the fingerprint */
ngx_int_t ngx_http_idem_body_fingerprint(ngx_http_request_t *r,
    ngx_http_idem_ctx_t *ctx, idem_fp_input_t *in);

/* ngx_http_idempotency_confirm.c: idempotency_confirm */
char *ngx_http_idem_confirm_conf(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf);
char *ngx_http_idem_confirm_key_conf(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf);
char *ngx_http_idem_confirm_show_conf(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf);
char *ngx_http_idem_confirm_merge(ngx_conf_t *cf,
    ngx_http_idem_loc_conf_t *prev, ngx_http_idem_loc_conf_t *conf);
ngx_int_t ngx_http_idem_confirm_proposal(ngx_http_request_t *r,
    ngx_http_idem_ctx_t *ctx);
ngx_int_t ngx_http_idem_confirm_check(ngx_http_request_t *r,
    ngx_http_idem_ctx_t *ctx);
ngx_int_t ngx_http_idem_confirm_send(ngx_http_request_t *r,
    ngx_http_idem_ctx_t *ctx);

/* ngx_http_idempotency_business.c: idempotency_unique, idempotency_lock */
char *ngx_http_idem_business_conf(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf);
ngx_int_t ngx_http_idem_business_keys(ngx_http_request_t *r,
    ngx_http_idem_ctx_t *ctx);
#define NGX_HTTP_IDEM_BUSINESS_KEYS  3
ngx_uint_t ngx_http_idem_business_args(ngx_http_idem_ctx_t *ctx,
    u_char **keys);

/* ngx_http_idempotency_json_var.c: idempotency_json_var, the parsed body */
char *ngx_http_idem_json_var(ngx_conf_t *cf, ngx_command_t *cmd, void *conf);
ngx_int_t ngx_http_idem_pointer_conf(ngx_conf_t *cf, ngx_str_t *directive,
    ngx_str_t *text, ngx_http_idem_pointer_t *ptr);
struct cJSON *ngx_http_idem_json_body(ngx_http_request_t *r,
    ngx_http_idem_ctx_t *ctx);
ngx_int_t ngx_http_idem_json_text(ngx_http_request_t *r,
    const struct cJSON *node, ngx_str_t *text);

/* ngx_http_idempotency_audit.c: idempotency_audit */
char *ngx_http_idem_audit_stream_conf(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf);
char *ngx_http_idem_audit_key_conf(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf);
char *ngx_http_idem_audit_ref_conf(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf);
char *ngx_http_idem_audit_merge(ngx_conf_t *cf,
    ngx_http_idem_loc_conf_t *prev, ngx_http_idem_loc_conf_t *conf);
void ngx_http_idem_audit_init_process(void);
idem_jws_key_t *ngx_http_idem_key_file(ngx_conf_t *cf, ngx_str_t *name,
    idem_jws_alg_e alg, const char *kid, const char *directive);
ngx_int_t ngx_http_idem_audit_prepare(ngx_http_request_t *r,
    ngx_http_idem_ctx_t *ctx);
void ngx_http_idem_audit_capture_ref(ngx_http_request_t *r,
    ngx_http_idem_ctx_t *ctx);
void ngx_http_idem_audit_entry(ngx_http_idem_ctx_t *ctx,
    idem_audit_event_e event, ngx_uint_t status, idem_audit_entry_t *e);
ngx_int_t ngx_http_idem_audit_digest(ngx_pool_t *pool, ngx_chain_t *cl,
    ngx_str_t *body, idem_str_t *hex);
void ngx_http_idem_audit_stored_ref(ngx_http_idem_ctx_t *ctx,
    idem_audit_entry_t *e);
ngx_http_idem_cmd_t *ngx_http_idem_audit_cmd(ngx_http_idem_audit_t *audit,
    ngx_http_idem_script_e script, const u_char *key, u_char **keys,
    ngx_uint_t n, size_t size, ngx_str_t *expect, idem_audit_entry_t *e,
    ngx_uint_t nentries, ngx_log_t *log);
ngx_int_t ngx_http_idem_audit_reply(ngx_http_idem_cmd_t *cmd,
    redisReply **reply, ngx_http_idem_cmd_t **next);
ngx_int_t ngx_http_idem_audit_ctx_reply(ngx_http_idem_cmd_t *cmd,
    redisReply **reply, ngx_uint_t *appended);
ngx_uint_t ngx_http_idem_audit_entries(ngx_http_idem_cmd_t *cmd,
    idem_audit_entry_t *e, ngx_uint_t max);
ngx_http_idem_audit_t *ngx_http_idem_audit_of(ngx_http_idem_cmd_t *cmd);
ngx_int_t ngx_http_idem_audit_direct(ngx_http_idem_audit_t *audit,
    idem_audit_entry_t *e, ngx_uint_t n, ngx_log_t *log);

/* ngx_http_idempotency_audit_file.c: the file device */
char *ngx_http_idem_audit_conf(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf);
char *ngx_http_idem_audit_file_merge(ngx_conf_t *cf,
    ngx_http_idem_audit_file_t *file, idem_jws_key_t *key, ngx_uint_t anchor);
ngx_int_t ngx_http_idem_audit_file_append(ngx_http_idem_audit_file_t *file,
    idem_audit_entry_t *e, ngx_uint_t n, ngx_log_t *log);

/* ngx_http_idempotency_claim.c: the claim and its answer */
ngx_int_t ngx_http_idem_tokens(ngx_http_request_t *r,
    ngx_http_idem_ctx_t *ctx);
ngx_int_t ngx_http_idem_claim_send(ngx_http_request_t *r,
    ngx_http_idem_ctx_t *ctx);
void ngx_http_idem_resume(ngx_http_idem_ctx_t *ctx);
ngx_int_t ngx_http_idem_claim_audit_answer(ngx_http_request_t *r,
    ngx_http_idem_ctx_t *ctx);

/* ngx_http_idempotency_wait.c: idempotency_wait */
ngx_int_t ngx_http_idem_wait(ngx_http_request_t *r,
    ngx_http_idem_ctx_t *ctx);
void ngx_http_idem_wait_stop(ngx_http_idem_ctx_t *ctx);

/* ngx_http_idempotency_close.c: closing the record, and its lease */
void ngx_http_idem_start_lease(ngx_http_request_t *r,
    ngx_http_idem_ctx_t *ctx);
ngx_int_t ngx_http_idem_finish(ngx_http_request_t *r,
    ngx_http_idem_ctx_t *ctx, ngx_http_idem_end_e end);
void ngx_http_idem_abandon(ngx_http_request_t *r, ngx_http_idem_ctx_t *ctx);
void ngx_http_idem_give_back(ngx_http_idem_cmd_t *cmd, ngx_str_t *key,
    ngx_str_t *claim);

/* ngx_http_idempotency_filter.c: capture of the upstream's response */
ngx_int_t ngx_http_idem_filter_init(ngx_conf_t *cf);

/* ngx_http_idempotency_reply.c: the module's own answers */
ngx_int_t ngx_http_idem_send_answer(ngx_http_request_t *r,
    ngx_http_idem_ctx_t *ctx);
ngx_int_t ngx_http_idem_send_problem(ngx_http_request_t *r,
    ngx_http_idem_ctx_t *ctx, ngx_http_idem_problem_e problem,
    const char *detail);
ngx_int_t ngx_http_idem_send_json(ngx_http_request_t *r, ngx_uint_t status,
    u_char *body, size_t len);
ngx_int_t ngx_http_idem_send_not_allowed(ngx_http_request_t *r,
    const char *allow);
u_char *ngx_http_idem_json_str(u_char *p, u_char *end, u_char *s,
    size_t len);
u_char *ngx_http_idem_json_time(u_char *p, u_char *end, long long ms);

/* ngx_http_idempotency_ops.c: the status and admin endpoints */
ngx_int_t ngx_http_idem_status_handler(ngx_http_request_t *r);
ngx_int_t ngx_http_idem_admin_handler(ngx_http_request_t *r);
ngx_int_t ngx_http_idem_metrics_handler(ngx_http_request_t *r);

/* ngx_http_idempotency_approve.c: idempotency_approve */

/* what a person decided, and who answers it (the JSON endpoint, the page) */
typedef struct ngx_http_idem_approval_s  ngx_http_idem_approval_t;

typedef ngx_int_t (*ngx_http_idem_decided_pt)(ngx_http_request_t *r,
    ngx_http_idem_ctx_t *ctx, idem_approve_kind_e kind, const char *state,
    long long at);

struct ngx_http_idem_approval_s {
    ngx_str_t                    op;
    ngx_str_t                    fp;
    ngx_str_t                    approver;
    ngx_int_t                    expires_in;    /* s; approve only */
    ngx_uint_t                   decline;
    ngx_uint_t                   once;          /* not if approved */
    ngx_http_idem_decided_pt     decided;
};

ngx_int_t ngx_http_idem_approve_handler(ngx_http_request_t *r);
ngx_int_t ngx_http_idem_approve_record(ngx_http_request_t *r,
    ngx_http_idem_ctx_t *ctx, ngx_http_idem_approval_t *a);
ngx_int_t ngx_http_idem_approve_who(ngx_http_request_t *r,
    ngx_http_idem_loc_conf_t *conf, ngx_str_t *who);
ngx_int_t ngx_http_idem_same_site(ngx_http_request_t *r);

/* ngx_http_idempotency_page.c: idempotency_approve_page */
ngx_int_t ngx_http_idem_page_handler(ngx_http_request_t *r);
char *ngx_http_idem_page_conf(ngx_conf_t *cf, ngx_http_idem_loc_conf_t *lcf);

/* ngx_http_idempotency_proposal.c: a proposal by its operation id */
typedef struct ngx_http_idem_lookup_s  ngx_http_idem_lookup_t;

typedef ngx_int_t (*ngx_http_idem_lookup_pt)(ngx_http_request_t *r,
    ngx_http_idem_ctx_t *ctx, ngx_http_idem_lookup_t *lk);

struct ngx_http_idem_lookup_s {
    ngx_str_t                    op;
    ngx_uint_t                   found;     /* the index holds it */
    ngx_str_t                    proposal;  /* its JSON; empty: not kept */
    ngx_str_t                    value;     /* its record's, copied */
    idem_value_t                 rec;       /* valid when has_rec */
    ngx_uint_t                   has_rec;   /* a record of this op */
    ngx_http_idem_problem_e      problem;   /* store down or error */
    ngx_uint_t                   failed;
    ngx_http_idem_lookup_pt      done;
};

ngx_int_t ngx_http_idem_lookup(ngx_http_request_t *r,
    ngx_http_idem_ctx_t *ctx, ngx_http_idem_lookup_t *lk);
ngx_int_t ngx_http_idem_op_arg(ngx_http_request_t *r, ngx_str_t *op);

/* ngx_http_idempotency_variables.c */
ngx_int_t ngx_http_idem_add_variables(ngx_conf_t *cf);
extern ngx_str_t  ngx_http_idem_outcome_names[];   /* by outcome */

#endif /* NGX_HTTP_IDEMPOTENCY_H */
