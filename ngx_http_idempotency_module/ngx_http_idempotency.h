/*
 * ngx_http_idempotency_module: shared types of the nginx glue.
 */

#ifndef NGX_HTTP_IDEMPOTENCY_H
#define NGX_HTTP_IDEMPOTENCY_H

#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include <hiredis/hiredis.h>
#include <hiredis/async.h>

#include "idem_fingerprint.h"
#include "idem_key.h"
#include "idem_record.h"


#define NGX_HTTP_IDEM_TOKEN_HEX       32   /* 128 random bits as hex */
#define NGX_HTTP_IDEM_SHA1_HEX        40

/* idempotency_thread_pool: smaller JSON bodies are not worth a hand-off */
#define NGX_HTTP_IDEM_THREAD_MIN      (32 * 1024)

#define NGX_HTTP_IDEM_FAILURE_CLOSED  0
#define NGX_HTTP_IDEM_FAILURE_OPEN    1


typedef enum {
    NGX_HTTP_IDEM_SCRIPT_CLAIM = 0,
    NGX_HTTP_IDEM_SCRIPT_COMPLETE,
    NGX_HTTP_IDEM_SCRIPT_RELEASE,
    NGX_HTTP_IDEM_SCRIPT_FAIL,
    NGX_HTTP_IDEM_SCRIPT_RENEW,
    NGX_HTTP_IDEM_SCRIPT_STATUS,
    NGX_HTTP_IDEM_SCRIPT_ADMIN,
    NGX_HTTP_IDEM_NSCRIPTS
} ngx_http_idem_script_e;


typedef struct {
    const char                  *name;      /* for logs */
    ngx_str_t                    text;
    u_char                       sha1[NGX_HTTP_IDEM_SHA1_HEX];
} ngx_http_idem_script_t;


typedef enum {
    NGX_HTTP_IDEM_REDIS_DOWN = 0,
    NGX_HTTP_IDEM_REDIS_CONNECTING,
    NGX_HTTP_IDEM_REDIS_READY
} ngx_http_idem_redis_state_e;


typedef struct ngx_http_idem_redis_s  ngx_http_idem_redis_t;


/*
 * One connection of a worker to a server: the pipelined command link, or
 * the subscriber link that hears about completions others wait for.
 */
typedef struct {
    ngx_http_idem_redis_t       *redis;
    redisAsyncContext           *ac;
    ngx_connection_t            *conn;
    ngx_http_idem_redis_state_e  state;
    ngx_msec_t                   backoff;
    ngx_event_t                  reconnect;
    ngx_event_t                  connect_timer;
    ngx_event_t                  recycle;
    redisAsyncContext           *recycle_ac;
    unsigned                     subscriber:1;
    unsigned                     subscribed:1;
} ngx_http_idem_link_t;


/*
 * One configured Redis server.  The configuration part is set when the
 * directive is parsed; the links are each worker's own.
 */
struct ngx_http_idem_redis_s {
    ngx_str_t                    name;          /* as written, for logs */
    ngx_str_t                    host;          /* numeric address or path */
    int                          port;          /* 0 for a unix socket */
    ngx_str_t                    user;
    ngx_str_t                    password;
    ngx_int_t                    db;
    ngx_msec_t                   connect_timeout;
    ngx_msec_t                   timeout;
    ngx_uint_t                   subscribe;     /* some location waits */

    ngx_http_idem_script_t      *scripts;

    ngx_log_t                   *log;
    ngx_http_idem_link_t         cmd;
    ngx_http_idem_link_t         sub;
    ngx_queue_t                  waiters;       /* ngx_http_idem_ctx_t */
    ngx_array_t                 *orphans;       /* ngx_http_idem_orphan_t */
    ngx_queue_t                  resend;        /* ngx_http_idem_cmd_t */
    struct ngx_http_idem_cmd_s  *timing_out;
    ngx_uint_t                   resend_n;
    size_t                       resend_size;
    unsigned                     exiting:1;
};


/*
 * Closing scripts (complete, release, fail) are fenced by the owner token,
 * so one whose answer never came is sent again once Redis is back instead
 * of leaving the record to turn unknown; bounded in count and bytes.
 */
#define NGX_HTTP_IDEM_RESEND_MAX       1024
#define NGX_HTTP_IDEM_RESEND_BYTES     (64 * 1024 * 1024)


/* completions of records someone waits for are announced here */
#define NGX_HTTP_IDEM_CHANNEL        "idem:done"


/*
 * A claim sent without an answer (timeout, lost connection) may or may not
 * have been made; it is released, fenced by its owner token, once the
 * connection is back, so that the key is not blocked until its lease ends.
 */
typedef struct {
    u_char                       key[IDEM_RECORD_KEY_LEN];
    u_char                       owner[NGX_HTTP_IDEM_TOKEN_HEX];
} ngx_http_idem_orphan_t;

#define NGX_HTTP_IDEM_ORPHANS_MAX    4096


typedef struct ngx_http_idem_cmd_s  ngx_http_idem_cmd_t;

/* reply is NULL when the command failed: no connection, timeout, closed */
typedef void (*ngx_http_idem_reply_pt)(ngx_http_idem_cmd_t *cmd,
    redisReply *reply);

/*
 * A command outlives the request that sent it (a reply may come after the
 * client has gone), so it is allocated outside any pool; the request's
 * pool cleanup clears "data" and the reply callback frees the command.
 */
struct ngx_http_idem_cmd_s {
    ngx_http_idem_redis_t       *redis;
    ngx_http_idem_script_e       script;
    ngx_http_idem_reply_pt       handler;
    void                        *data;
    ngx_event_t                  timer;
    ngx_queue_t                  queue;     /* in redis->resend */
    size_t                       size;
    ngx_uint_t                   argc;
    const char                 **argv;
    size_t                      *argvlen;
    u_char                      *pos;       /* next free byte for args */
    unsigned                     eval:1;    /* resent as EVAL (NOSCRIPT) */
    unsigned                     failed:1;  /* handler already told */
};


typedef struct {
    ngx_array_t                  servers;   /* ngx_http_idem_redis_t * */
    ngx_http_idem_script_t      *scripts;
    ngx_uint_t                   used;
} ngx_http_idem_main_conf_t;


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
    ngx_array_t                 *release_statuses; /* ngx_uint_t */
    ngx_msec_t                   wait;
    ngx_uint_t                   ops;    /* status or admin location */
#if (NGX_THREADS)
    ngx_thread_pool_t           *thread_pool;      /* NULL: off */
#else
    void                        *thread_pool;      /* always NULL */
#endif
    size_t                       thread_min;       /* body bytes */
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
    NGX_HTTP_IDEM_OUT_BYPASSED
} ngx_http_idem_outcome_e;


/* What the claim script said. */
typedef enum {
    NGX_HTTP_IDEM_ANS_NONE = 0,
    NGX_HTTP_IDEM_ANS_CLAIMED,
    NGX_HTTP_IDEM_ANS_COMPLETED,
    NGX_HTTP_IDEM_ANS_MISMATCH,
    NGX_HTTP_IDEM_ANS_IN_PROGRESS,
    NGX_HTTP_IDEM_ANS_UNKNOWN,
    NGX_HTTP_IDEM_ANS_STORE_DOWN,    /* no reply: connection, timeout */
    NGX_HTTP_IDEM_ANS_STORE_ERROR    /* a reply we do not understand */
} ngx_http_idem_answer_e;


/* How a claimed request ended, i.e. which script closes the record. */
typedef enum {
    NGX_HTTP_IDEM_END_NONE = 0,
    NGX_HTTP_IDEM_END_COMPLETE,
    NGX_HTTP_IDEM_END_RELEASE,
    NGX_HTTP_IDEM_END_FAIL
} ngx_http_idem_end_e;


typedef struct ngx_http_idem_ctx_s  ngx_http_idem_ctx_t;

/* how an operations endpoint turns a script's reply into a response */
typedef ngx_int_t (*ngx_http_idem_ops_answer_pt)(ngx_http_request_t *r,
    ngx_http_idem_ctx_t *ctx, redisReply *reply);


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

    ngx_http_idem_cmd_t         *cmd;       /* claim in flight */

    /* the claim's answer */
    ngx_http_idem_answer_e       answer;
    ngx_str_t                    state;
    ngx_uint_t                   stored_status;
    ngx_str_t                    stored_headers;
    ngx_str_t                    stored_body;
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
    ngx_http_idem_ops_answer_pt  ops_answer;

    /* waiting for an in-flight duplicate to finish (idempotency_wait) */
    ngx_queue_t                  wait_queue;
    ngx_event_t                  wait_timer;
    ngx_msec_t                   wait_deadline;
    ngx_msec_t                   lease_left;    /* from the claim's answer */
    unsigned                     waiting:1;
    unsigned                     wait_expired:1;

    unsigned                     fingerprinted:1;
    unsigned                     claimed:1;
    unsigned                     capturing:1;
    unsigned                     too_large:1;
};


extern ngx_module_t  ngx_http_idempotency_module;


/* ngx_http_idempotency_handler.c */
ngx_int_t ngx_http_idem_rewrite_handler(ngx_http_request_t *r);
ngx_int_t ngx_http_idem_precontent_handler(ngx_http_request_t *r);
ngx_http_idem_ctx_t *ngx_http_idem_get_ctx(ngx_http_request_t *r);
ngx_http_idem_ctx_t *ngx_http_idem_create_ctx(ngx_http_request_t *r);
ngx_int_t ngx_http_idem_parse_key(ngx_http_request_t *r,
    ngx_http_idem_ctx_t *ctx, ngx_str_t *name, const char **detail);
ngx_int_t ngx_http_idem_record_key(ngx_http_request_t *r,
    ngx_http_idem_ctx_t *ctx, ngx_str_t *scope);
ngx_int_t ngx_http_idem_reply_str(redisReply *e, ngx_str_t *s);
ngx_uint_t ngx_http_idem_is(ngx_str_t *s, const char *lit);
ngx_uint_t ngx_http_idem_reply_corrupt(redisReply *reply);
size_t ngx_http_idem_reply_elements(redisReply *reply, idem_rv_t *el,
    size_t max);

/* ngx_http_idempotency_body.c */
ngx_int_t ngx_http_idem_body_fingerprint(ngx_http_request_t *r,
    ngx_http_idem_ctx_t *ctx, idem_fp_input_t *in);

/* ngx_http_idempotency_ops.c */
ngx_int_t ngx_http_idem_status_handler(ngx_http_request_t *r);
ngx_int_t ngx_http_idem_admin_handler(ngx_http_request_t *r);

/* ngx_http_idempotency_reply.c */
ngx_int_t ngx_http_idem_send_replay(ngx_http_request_t *r,
    ngx_http_idem_ctx_t *ctx);
ngx_int_t ngx_http_idem_send_answer(ngx_http_request_t *r,
    ngx_http_idem_ctx_t *ctx);
ngx_int_t ngx_http_idem_send_problem(ngx_http_request_t *r,
    ngx_http_idem_ctx_t *ctx, ngx_uint_t status, const char *slug,
    const char *title, const char *detail);
ngx_int_t ngx_http_idem_send_json(ngx_http_request_t *r, ngx_uint_t status,
    u_char *body, size_t len);
u_char *ngx_http_idem_json_str(u_char *p, u_char *end, u_char *s,
    size_t len);

/* ngx_http_idempotency_filter.c */
ngx_int_t ngx_http_idem_filter_init(ngx_conf_t *cf);
void ngx_http_idem_start_lease(ngx_http_request_t *r,
    ngx_http_idem_ctx_t *ctx);
void ngx_http_idem_finish(ngx_http_request_t *r, ngx_http_idem_ctx_t *ctx,
    ngx_http_idem_end_e end);

/* ngx_http_idempotency_redis.c */
ngx_int_t ngx_http_idem_scripts_init(ngx_conf_t *cf,
    ngx_http_idem_main_conf_t *mcf);
ngx_int_t ngx_http_idem_redis_init_process(ngx_cycle_t *cycle);
void ngx_http_idem_redis_exit_process(ngx_cycle_t *cycle);
ngx_http_idem_cmd_t *ngx_http_idem_cmd_create(ngx_http_idem_redis_t *redis,
    ngx_http_idem_script_e script, ngx_uint_t argc, size_t size,
    ngx_log_t *log);
void ngx_http_idem_cmd_arg(ngx_http_idem_cmd_t *cmd, const void *data,
    size_t len);
u_char *ngx_http_idem_cmd_arg_reserve(ngx_http_idem_cmd_t *cmd, size_t len);
ngx_int_t ngx_http_idem_cmd_send(ngx_http_idem_cmd_t *cmd,
    ngx_http_idem_reply_pt handler, void *data);
ngx_int_t ngx_http_idem_wait_add(ngx_http_idem_redis_t *rd,
    ngx_http_idem_ctx_t *ctx);
void ngx_http_idem_wait_remove(ngx_http_idem_ctx_t *ctx);

/* ngx_http_idempotency_handler.c, called by the subscriber */
void ngx_http_idem_wake(ngx_http_idem_ctx_t *ctx);

#endif /* NGX_HTTP_IDEMPOTENCY_H */
