/*
 * idempotency_unique and idempotency_lock on a Redis Cluster
 * (docs/business-keys.md, "On a Redis Cluster").
 *
 * The claim has made the record in_progress in its slot, with this
 * attempt's operation id; nothing has reached the upstream yet.  The gate
 * beside the record (<record key>:p, business_gate.lua) is shut first:
 * while it names the operation, the operation provably has not run.  Each
 * business key is then taken in its own slot, the unique key first, one
 * single-key script at a time (business_key.lua): taken when absent, or
 * when it names an operation that its record, read in the record's slot
 * (business_holder.lua), shows to hold nothing (or that never ran and
 * whose lease lapsed: taken over, record and gate deleted); a key whose
 * name changed meanwhile is decided again, at most three times.  A key held
 * by a live operation refuses the request with claim.lua's answer (reused,
 * in progress, unknown, lock held); what this attempt took is then given
 * back, the record by a compare on its owner token, each key by a compare
 * on its name.  When every key is taken, the gate is opened by a compare
 * in the record's slot: only that lets the request go to the upstream,
 * after the claim's parts had their last word (the audit file's "sent")
 * and, with idempotency_redis_wait, once the replicas have the opening
 * (and, before, each key: WAIT on the connection of each write).
 *
 * Why no two operations run at once: a key leaves an operation's name
 * only after that operation's record was seen holding nothing, or was
 * taken over with its gate still shut; an operation that holds nothing
 * never holds again (its record is only ever claimed anew under a new
 * operation id), and one taken over can no longer open its gate (the
 * takeover and the opening are compares in one slot).  An operation runs
 * only after it has taken its keys and opened its gate.
 */

#include <ngx_config.h>
#include <ngx_core.h>

#include "ngx_http_idempotency_bkeys.h"
#include "ngx_http_idempotency_close.h"
#include "ngx_http_idempotency_command.h"
#include "ngx_http_idempotency_redis.h"
#include "ngx_http_idempotency_replicas.h"


#define NGX_HTTP_IDEM_BKEY_ROUNDS  3


typedef struct {
    u_char                      *key;       /* the unique or lock key */
    ngx_str_t                    name;      /* this attempt's value */
    ngx_str_t                    tag;       /* location or scope */
    char                         kind;      /* 'u' or 'l' */
    unsigned                     taken:1;   /* may name this attempt */
} ngx_http_idem_bkey_t;


typedef struct ngx_http_idem_bkeys_s {
    ngx_http_idem_ctx_t         *ctx;
    ngx_http_idem_cmd_t         *cmd;       /* in flight */
    ngx_http_idem_bkey_t         key[2];
    ngx_uint_t                   n;
    ngx_uint_t                   i;         /* the key being taken */
    ngx_uint_t                   rounds;
    ngx_str_t                    expect;    /* a name seen holding nothing */
    ngx_event_t                  keep;      /* with the lease renewals */
    ngx_http_idem_bkeys_answer_pt  answer;
    ngx_http_idem_bkeys_done_pt    done;
    ngx_http_idem_bkeys_let_pt     let;
    ngx_http_idem_replicas_t     replicas;  /* idempotency_redis_wait */
    void                       (*then)(struct ngx_http_idem_bkeys_s *p);
    unsigned                     deciding:1;
} ngx_http_idem_bkeys_t;


static void ngx_http_idem_bkeys_take(ngx_http_idem_bkeys_t *p);
static void ngx_http_idem_bkeys_opened(ngx_http_idem_cmd_t *cmd,
    redisReply *reply);
static ngx_int_t ngx_http_idem_bkeys_gate(ngx_http_idem_bkeys_t *p,
    const char *mode, ngx_http_idem_reply_pt handler);
static void ngx_http_idem_bkeys_keep(ngx_http_idem_bkeys_t *p,
    ngx_log_t *log, ngx_http_idem_reply_pt handler);
static void ngx_http_idem_bkeys_keep_handler(ngx_event_t *ev);
static void ngx_http_idem_bkeys_answered(ngx_http_idem_bkeys_t *p,
    ngx_http_idem_answer_e answer);
static void ngx_http_idem_bkeys_replicate(ngx_http_idem_bkeys_t *p,
    void (*then)(ngx_http_idem_bkeys_t *p));


static int64_t
ngx_http_idem_bkeys_ttl(ngx_http_idem_ctx_t *ctx)
{
    /* twice the record's, as on one server (redis-scripts/prelude.lua) */
    return 2 * (int64_t) ctx->conf->ttl * 1000;
}


static ngx_http_idem_cmd_t *
ngx_http_idem_bkeys_cmd(ngx_http_idem_redis_t *rd, u_char *key,
    const char *mode, ngx_str_t *name, ngx_str_t *expect, int64_t ttl,
    ngx_log_t *log)
{
    ngx_http_idem_cmd_t  *cmd;

    cmd = ngx_http_idem_cmd_create(rd, NGX_HTTP_IDEM_SCRIPT_BUSINESS_KEY, key,
                                   4 + name->len + expect->len
                                   + NGX_INT64_LEN, log);
    if (cmd == NULL) {
        return NULL;
    }

    ngx_http_idem_cmd_set(cmd, NGX_HTTP_IDEM_BUSINESS_KEY_MODE, mode,
                          ngx_strlen(mode));
    ngx_http_idem_cmd_set(cmd, NGX_HTTP_IDEM_BUSINESS_KEY_NAME, name->data,
                          name->len);
    ngx_http_idem_cmd_set(cmd, NGX_HTTP_IDEM_BUSINESS_KEY_EXPECT,
                          expect->data, expect->len);
    ngx_http_idem_cmd_set_num(cmd, NGX_HTTP_IDEM_BUSINESS_KEY_TTL, ttl);

    return cmd;
}


/*
 * A keep while the operation runs answered 0: the key names another
 * operation, which took it while this one ran (the key lost with a failover
 * of its master, then taken): that one may run beside this one.
 */
static void
ngx_http_idem_bkeys_kept(ngx_http_idem_cmd_t *cmd, redisReply *reply)
{
    ngx_str_t  key;

    if (reply == NULL || reply->type != REDIS_REPLY_INTEGER
        || reply->integer != 0)
    {
        return;
    }

    key = ngx_http_idem_cmd_key(cmd);

    ngx_log_error(NGX_LOG_ERR, cmd->redis->log, 0,
                  "idempotency: business key \"%V\" names another "
                  "operation while its own runs (lost with a failover of "
                  "its master, then taken): the two may run at once", &key);
}


/*
 * A key this attempt may have taken, back, or kept for twice the TTL
 * ("keep"): a compare on its name, so harmless when late; a give-back is
 * sent again after a lost connection.
 */
static void
ngx_http_idem_bkeys_send(ngx_http_idem_redis_t *rd, u_char *key,
    const char *mode, ngx_str_t *name, int64_t ttl, ngx_log_t *log,
    ngx_http_idem_reply_pt handler)
{
    ngx_str_t             none = ngx_null_string;
    ngx_http_idem_cmd_t  *cmd;

    cmd = ngx_http_idem_bkeys_cmd(rd, key, mode, name, &none, ttl, log);

    if (cmd) {
        cmd->durable = (mode[0] == 'd');
    }

    if (cmd == NULL
        || ngx_http_idem_cmd_send(cmd, handler, NULL) == NGX_ERROR)
    {
        ngx_log_error(NGX_LOG_WARN, log, 0,
                      "idempotency: cannot %s a business key; it names a "
                      "record, which alone says whether it is held", mode);
    }
}


/* a refusal: the keys taken and the record go back, then the answer */
static void
ngx_http_idem_bkeys_give_back(ngx_http_idem_bkeys_t *p)
{
    ngx_uint_t            k;
    ngx_http_idem_ctx_t  *ctx;

    ctx = p->ctx;
    p->deciding = 0;

    for (k = 0; k < p->n; k++) {
        if (p->key[k].taken) {
            ngx_http_idem_bkeys_send(ctx->conf->redis, p->key[k].key, "drop",
                                     &p->key[k].name, 0,
                                     ctx->request->connection->log, NULL);
            p->key[k].taken = 0;
        }
    }

    (void) ngx_http_idem_bkeys_gate(p, "drop", NULL);

    /* no status: the record is deleted, fenced by the owner token */
    (void) ngx_http_idem_finish(ctx->request, ctx, NGX_HTTP_IDEM_END_RELEASE);
}


static void
ngx_http_idem_bkeys_answered(ngx_http_idem_bkeys_t *p,
    ngx_http_idem_answer_e answer)
{
    ngx_http_idem_ctx_t  *ctx;

    ctx = p->ctx;

    if (answer != NGX_HTTP_IDEM_ANS_NONE) {
        if (p->deciding) {
            ngx_http_idem_bkeys_give_back(p);
        }

        ctx->answer = answer;
    }

    if (answer == NGX_HTTP_IDEM_ANS_NONE) {
        /* kept twice the TTL ahead, as the claim's lease is renewed */
        p->keep.handler = ngx_http_idem_bkeys_keep_handler;
        p->keep.data = p;
        p->keep.log = ctx->request->connection->log;
        p->keep.cancelable = 1;
        ngx_add_timer(&p->keep, ngx_max(ctx->conf->lease / 3, 1));
    }

    p->deciding = 0;
    p->done(ctx);
}


/*
 * A reply that is not one of the script's: Redis's error about reaching
 * the data (TRYAGAIN while a slot of two of the script's keys moves,
 * CLUSTERDOWN, ...: the transport has asked for the slot map again) is
 * store-unavailable, as for the claim; a complaint about the data itself,
 * or a reply of the wrong shape, is store-error.
 */
static ngx_http_idem_answer_e
ngx_http_idem_bkeys_failed(redisReply *reply)
{
    ngx_str_t  text = ngx_string("");  /* never NULL: %V copies it */

    if (reply == NULL
        || (reply->type == REDIS_REPLY_ERROR
            && !ngx_http_idem_reply_corrupt(reply)))
    {
        return NGX_HTTP_IDEM_ANS_STORE_DOWN;
    }

    if (reply->type == REDIS_REPLY_ERROR || reply->type == REDIS_REPLY_STRING) {
        text.data = (u_char *) reply->str;
        text.len = ngx_min((size_t) reply->len, 120);
    }

    ngx_log_error(NGX_LOG_ERR, ngx_cycle->log, 0,
                  "idempotency: unexpected reply to a business key's script "
                  "(type %d): %V", reply->type, &text);

    return NGX_HTTP_IDEM_ANS_STORE_ERROR;
}


/* {"free"}: the name seen holds nothing; anything else refuses */
static void
ngx_http_idem_bkeys_looked(ngx_http_idem_cmd_t *cmd, redisReply *reply)
{
    ngx_str_t               s;
    ngx_http_idem_ctx_t    *ctx;
    ngx_http_idem_bkeys_t  *p;
    ngx_http_idem_answer_e  answer;

    p = cmd->data;

    if (p == NULL) {
        return;
    }

    p->cmd = NULL;
    ctx = p->ctx;

    if (reply == NULL || reply->type != REDIS_REPLY_ARRAY
        || reply->elements == 0
        || ngx_http_idem_reply_str(reply->element[0], &s) != NGX_OK)
    {
        ngx_http_idem_bkeys_answered(p, ngx_http_idem_bkeys_failed(reply));
        return;
    }

    if (s.len == 4 && ngx_strncmp(s.data, "free", 4) == 0) {
        ngx_http_idem_bkeys_take(p);
        return;
    }

    /* given back first: the answer rewrites what the request knows */
    ngx_http_idem_bkeys_give_back(p);

    answer = p->answer(ctx->request, ctx, reply);

    if (answer == NGX_HTTP_IDEM_ANS_CLAIMED
        || answer == NGX_HTTP_IDEM_ANS_STORE_ERROR)
    {
        ngx_log_error(NGX_LOG_ERR, ctx->request->connection->log, 0,
                      "idempotency: the record a business key of key "
                      "\"%V\" names cannot be read (%*s)",
                      ngx_http_idem_log_key(ctx), ngx_min(s.len, 40), s.data);
        answer = NGX_HTTP_IDEM_ANS_STORE_ERROR;
    }

    ngx_http_idem_bkeys_answered(p, answer);
}


/* another operation's name h: read its record, in the record's slot */
static void
ngx_http_idem_bkeys_look(ngx_http_idem_bkeys_t *p, ngx_str_t *h)
{
    ngx_uint_t             same;
    ngx_http_idem_cmd_t   *cmd;
    ngx_http_idem_ctx_t   *ctx;
    ngx_http_idem_bkey_t  *k;

    ctx = p->ctx;
    k = &p->key[p->i];

    if (h->len < IDEM_RECORD_KEY_LEN + NGX_HTTP_IDEM_TOKEN_HEX
        || ++p->rounds > NGX_HTTP_IDEM_BKEY_ROUNDS)
    {
        /* not a name of this module, or a key changing hands too fast */
        ngx_http_idem_bkeys_answered(p, NGX_HTTP_IDEM_ANS_STORE_DOWN);
        return;
    }

    p->expect.data = ngx_pstrdup(ctx->request->pool, h);
    p->expect.len = h->len;

    same = h->len == IDEM_RECORD_KEY_LEN + NGX_HTTP_IDEM_TOKEN_HEX
                     + k->tag.len
           && ngx_memcmp(h->data + IDEM_RECORD_KEY_LEN
                         + NGX_HTTP_IDEM_TOKEN_HEX, k->tag.data, k->tag.len)
              == 0;

    cmd = p->expect.data == NULL
          ? NULL
          : ngx_http_idem_cmd_create(ctx->conf->redis,
                                     NGX_HTTP_IDEM_SCRIPT_BUSINESS_HOLDER,
                                     p->expect.data,
                                     NGX_HTTP_IDEM_TOKEN_HEX + 2,
                                     ctx->request->connection->log);
    if (cmd) {
        ngx_http_idem_cmd_set(cmd, NGX_HTTP_IDEM_BUSINESS_HOLDER_OP,
                              p->expect.data + IDEM_RECORD_KEY_LEN,
                              NGX_HTTP_IDEM_TOKEN_HEX);
        ngx_http_idem_cmd_set(cmd, NGX_HTTP_IDEM_BUSINESS_HOLDER_KIND,
                              &k->kind, 1);
        ngx_http_idem_cmd_set(cmd, NGX_HTTP_IDEM_BUSINESS_HOLDER_SAME,
                              same ? "1" : "0", 1);
    }

    if (cmd == NULL
        || ngx_http_idem_cmd_send(cmd, ngx_http_idem_bkeys_looked, p)
           != NGX_OK)
    {
        ngx_http_idem_bkeys_answered(p, NGX_HTTP_IDEM_ANS_STORE_DOWN);
        return;
    }

    p->cmd = cmd;
}


/* a key taken (and on its replicas): the next one, or the gate opened */
static void
ngx_http_idem_bkeys_next(ngx_http_idem_bkeys_t *p)
{
    p->i++;
    p->rounds = 0;
    ngx_str_null(&p->expect);

    if (p->i < p->n) {
        ngx_http_idem_bkeys_take(p);

    } else if (ngx_http_idem_bkeys_gate(p, "open", ngx_http_idem_bkeys_opened)
               != NGX_OK)
    {
        ngx_http_idem_bkeys_answered(p, NGX_HTTP_IDEM_ANS_STORE_DOWN);
    }
}


/* the gate opened and on its replicas: the request runs */
static void
ngx_http_idem_bkeys_run(ngx_http_idem_bkeys_t *p)
{
    ngx_http_idem_bkeys_answered(p, NGX_HTTP_IDEM_ANS_NONE);
}


/*
 * idempotency_redis_wait: what a step wrote is on the replicas, or
 * everything goes back and the request is answered 503 before the
 * upstream sees it, as a claim on one server (a key lost in a failover
 * lets a competitor run beside this operation; an opening lost lets its
 * operation be taken over as one that never ran, and run again).
 */
static void
ngx_http_idem_bkeys_replicated(ngx_http_idem_replicas_t *w, ngx_int_t acked)
{
    ngx_http_idem_bkeys_t  *p = w->data;
    ngx_http_idem_ctx_t    *ctx;

    ctx = p->ctx;

    if (acked >= (ngx_int_t) ctx->conf->wait_replicas) {
        p->then(p);
        return;
    }

    ngx_log_error(NGX_LOG_WARN, ctx->request->connection->log, 0,
                  "idempotency: the %s of key \"%V\" reached %i of %ui "
                  "replicas within %Mms (-1: no WAIT answer); everything is "
                  "given back and answered 503",
                  p->i < p->n ? "business key" : "gate's opening",
                  ngx_http_idem_log_key(ctx), acked, ctx->conf->wait_replicas,
                  ctx->conf->wait_replicas_timeout);

    ngx_http_idem_bkeys_answered(p, NGX_HTTP_IDEM_ANS_NOT_REPLICATED);
}


/* from the handler of the write's reply: WAIT on that write's node */
static void
ngx_http_idem_bkeys_replicate(ngx_http_idem_bkeys_t *p,
    void (*then)(ngx_http_idem_bkeys_t *p))
{
    ngx_http_idem_loc_conf_t  *lcf;

    lcf = p->ctx->conf;
    p->then = then;

    if (lcf->wait_replicas == 0) {
        then(p);
        return;
    }

    p->replicas.handler = ngx_http_idem_bkeys_replicated;
    p->replicas.data = p;

    if (ngx_http_idem_replicas_wait(lcf->redis, &p->replicas,
                                    lcf->wait_replicas,
                                    lcf->wait_replicas_timeout)
        != NGX_OK)
    {
        ngx_http_idem_bkeys_replicated(&p->replicas, -1);
    }
}


/* {"taken"}: the next key, or the upstream; {"named", h}: look at h */
static void
ngx_http_idem_bkeys_taken(ngx_http_idem_cmd_t *cmd, redisReply *reply)
{
    ngx_str_t               s, h, key, name;
    ngx_http_idem_bkeys_t  *p;

    p = cmd->data;

    s.len = 0;

    if (reply && reply->type == REDIS_REPLY_ARRAY && reply->elements > 0) {
        (void) ngx_http_idem_reply_str(reply->element[0], &s);
    }

    if (p == NULL) {
        /* the request went: a key this may have taken goes back */
        if (reply == NULL
            || (s.len == 5 && ngx_strncmp(s.data, "taken", 5) == 0))
        {
            key = ngx_http_idem_cmd_key(cmd);
            name = ngx_http_idem_cmd_get(cmd, NGX_HTTP_IDEM_BUSINESS_KEY_NAME);
            ngx_http_idem_bkeys_send(cmd->redis, key.data, "drop", &name, 0,
                                     ngx_cycle->log, NULL);
        }

        return;
    }

    p->cmd = NULL;

    if (reply == NULL || (s.len == 5 && ngx_strncmp(s.data, "taken", 5) == 0)) {
        p->key[p->i].taken = 1;
    }

    if (reply == NULL) {
        ngx_http_idem_bkeys_answered(p, NGX_HTTP_IDEM_ANS_STORE_DOWN);
        return;
    }

    if (p->key[p->i].taken) {
        ngx_http_idem_bkeys_replicate(p, ngx_http_idem_bkeys_next);
        return;
    }

    if (s.len == 5 && ngx_strncmp(s.data, "named", 5) == 0
        && reply->elements == 2
        && ngx_http_idem_reply_str(reply->element[1], &h) == NGX_OK)
    {
        ngx_http_idem_bkeys_look(p, &h);
        return;
    }

    ngx_http_idem_bkeys_answered(p, ngx_http_idem_bkeys_failed(reply));
}


/* the gate beside the record (business_gate.lua): shut, open or drop */
static ngx_int_t
ngx_http_idem_bkeys_gate(ngx_http_idem_bkeys_t *p, const char *mode,
    ngx_http_idem_reply_pt handler)
{
    u_char               *lock;
    size_t                len;
    ngx_uint_t            k;
    ngx_http_idem_cmd_t  *cmd;
    ngx_http_idem_ctx_t  *ctx;

    ctx = p->ctx;

    /* opened: the lock's name beside the record, for the status endpoint */
    lock = (u_char *) "";
    len = 0;

    for (k = 0; k < p->n; k++) {
        if (p->key[k].kind == 'l' && ngx_strcmp(mode, "open") == 0) {
            lock = p->key[k].key;
            len = IDEM_RECORD_KEY_LEN;
        }
    }

    cmd = ngx_http_idem_cmd_create(ctx->conf->redis,
                                   NGX_HTTP_IDEM_SCRIPT_BUSINESS_GATE,
                                   ctx->rkey,
                                   5 + 2 * NGX_HTTP_IDEM_TOKEN_HEX
                                   + NGX_INT64_LEN + IDEM_RECORD_KEY_LEN,
                                   ctx->request->connection->log);
    if (cmd == NULL) {
        return NGX_ERROR;
    }

    ngx_http_idem_cmd_set(cmd, NGX_HTTP_IDEM_BUSINESS_GATE_MODE, mode,
                          ngx_strlen(mode));
    ngx_http_idem_cmd_set(cmd, NGX_HTTP_IDEM_BUSINESS_GATE_OP,
                          ctx->op_id.data, NGX_HTTP_IDEM_TOKEN_HEX);
    ngx_http_idem_cmd_set(cmd, NGX_HTTP_IDEM_BUSINESS_GATE_OWNER, ctx->owner,
                          NGX_HTTP_IDEM_TOKEN_HEX);
    ngx_http_idem_cmd_set_num(cmd, NGX_HTTP_IDEM_BUSINESS_GATE_TTL,
                              ngx_http_idem_bkeys_ttl(ctx));
    ngx_http_idem_cmd_set(cmd, NGX_HTTP_IDEM_BUSINESS_GATE_LOCK, lock, len);

    if (ngx_http_idem_cmd_send(cmd, handler, handler ? p : NULL) != NGX_OK) {
        return NGX_ERROR;
    }

    if (handler) {
        p->cmd = cmd;
    }

    return NGX_OK;
}


/* the gate shut: now the business keys may name this operation */
static void
ngx_http_idem_bkeys_shut(ngx_http_idem_cmd_t *cmd, redisReply *reply)
{
    ngx_http_idem_bkeys_t  *p;

    p = cmd->data;

    if (p == NULL) {
        return;
    }

    p->cmd = NULL;

    if (reply == NULL || reply->type != REDIS_REPLY_INTEGER
        || reply->integer != 1)
    {
        ngx_http_idem_bkeys_answered(p, NGX_HTTP_IDEM_ANS_STORE_DOWN);
        return;
    }

    ngx_http_idem_bkeys_take(p);
}


/*
 * The gate opened: the request may run.  Not opened (taken over by a
 * competitor that found the lease lapsed, or no answer): it must not, and
 * gives everything back.
 */
static void
ngx_http_idem_bkeys_opened(ngx_http_idem_cmd_t *cmd, redisReply *reply)
{
    ngx_http_idem_bkeys_t  *p;

    p = cmd->data;

    if (p == NULL) {
        return;
    }

    p->cmd = NULL;

    if (reply == NULL || reply->type != REDIS_REPLY_INTEGER
        || reply->integer != 1)
    {
        ngx_http_idem_bkeys_answered(p, NGX_HTTP_IDEM_ANS_STORE_DOWN);
        return;
    }

    /* the audit file's "sent", before anything runs (fail closed) */
    if (p->let(p->ctx) != NGX_OK) {
        ngx_http_idem_bkeys_answered(p, p->ctx->answer);
        return;
    }

    ngx_http_idem_bkeys_replicate(p, ngx_http_idem_bkeys_run);
}


static void
ngx_http_idem_bkeys_take(ngx_http_idem_bkeys_t *p)
{
    ngx_http_idem_cmd_t   *cmd;
    ngx_http_idem_bkey_t  *k;

    k = &p->key[p->i];

    cmd = ngx_http_idem_bkeys_cmd(p->ctx->conf->redis, k->key, "take",
                                  &k->name, &p->expect,
                                  ngx_http_idem_bkeys_ttl(p->ctx),
                                  p->ctx->request->connection->log);

    if (cmd == NULL
        || ngx_http_idem_cmd_send(cmd, ngx_http_idem_bkeys_taken, p)
           != NGX_OK)
    {
        ngx_http_idem_bkeys_answered(p, NGX_HTTP_IDEM_ANS_STORE_DOWN);
        return;
    }

    p->cmd = cmd;
}


/* this attempt's value of a key: record key, operation id, tag */
static ngx_int_t
ngx_http_idem_bkeys_name(ngx_http_idem_ctx_t *ctx, ngx_http_idem_bkey_t *k,
    u_char *key, char kind, u_char *tag, size_t len)
{
    u_char  *n;

    n = ngx_pnalloc(ctx->request->pool,
                    IDEM_RECORD_KEY_LEN + NGX_HTTP_IDEM_TOKEN_HEX + len);
    if (n == NULL) {
        return NGX_ERROR;
    }

    k->key = key;
    k->kind = kind;
    k->tag.data = tag;
    k->tag.len = len;
    k->name.data = n;

    n = ngx_cpymem(n, ctx->rkey, IDEM_RECORD_KEY_LEN);
    n = ngx_cpymem(n, ctx->op_id.data, NGX_HTTP_IDEM_TOKEN_HEX);
    n = ngx_cpymem(n, tag, len);

    k->name.len = n - k->name.data;

    return NGX_OK;
}


ngx_int_t
ngx_http_idem_bkeys_start(ngx_http_idem_ctx_t *ctx,
    ngx_http_idem_bkeys_answer_pt answer, ngx_http_idem_bkeys_done_pt done,
    ngx_http_idem_bkeys_let_pt let)
{
    ngx_http_idem_bkeys_t  *p;

    if (ctx->answer != NGX_HTTP_IDEM_ANS_CLAIMED
        || ctx->conf->redis->topology != NGX_HTTP_IDEM_TOPO_CLUSTER
        || (ctx->ukey[0] == '\0' && ctx->lkey[0] == '\0'))
    {
        return NGX_DECLINED;
    }

    p = ngx_pcalloc(ctx->request->pool, sizeof(ngx_http_idem_bkeys_t));

    /*
     * the unique key first: a reused answer is never held up by a lock;
     * no memory: refused, never run without its keys (nor its "sent")
     */
    if (p == NULL
        || (ctx->ukey[0]
            && ngx_http_idem_bkeys_name(ctx, &p->key[p->n++], ctx->ukey, 'u',
                                        ctx->conf->loc_tag,
                                        ngx_strlen(ctx->conf->loc_tag))
               != NGX_OK)
        || (ctx->lkey[0]
            && ngx_http_idem_bkeys_name(ctx, &p->key[p->n++], ctx->lkey, 'l',
                                        ctx->stag, ngx_strlen(ctx->stag))
               != NGX_OK))
    {
        ctx->bkeys = NULL;
        ctx->answer = NGX_HTTP_IDEM_ANS_STORE_ERROR;
        (void) ngx_http_idem_finish(ctx->request, ctx,
                                    NGX_HTTP_IDEM_END_RELEASE);
        return NGX_DECLINED;
    }

    p->ctx = ctx;
    p->answer = answer;
    p->done = done;
    p->let = let;
    ctx->bkeys = p;
    p->deciding = 1;

    if (ngx_http_idem_bkeys_gate(p, "shut", ngx_http_idem_bkeys_shut)
        != NGX_OK)
    {
        ngx_http_idem_bkeys_answered(p, NGX_HTTP_IDEM_ANS_STORE_DOWN);
    }

    return NGX_OK;
}


static void
ngx_http_idem_bkeys_keep(ngx_http_idem_bkeys_t *p, ngx_log_t *log,
    ngx_http_idem_reply_pt handler)
{
    ngx_uint_t  k;

    for (k = 0; k < p->n; k++) {
        if (p->key[k].taken) {
            ngx_http_idem_bkeys_send(p->ctx->conf->redis, p->key[k].key,
                                     "keep", &p->key[k].name,
                                     ngx_http_idem_bkeys_ttl(p->ctx), log,
                                     handler);
        }
    }
}


/* beside the record's renewals (renew.lua), while the request runs */
static void
ngx_http_idem_bkeys_keep_handler(ngx_event_t *ev)
{
    ngx_http_idem_bkeys_t  *p = ev->data;

    if (p->ctx->end != NGX_HTTP_IDEM_END_NONE) {
        return;
    }

    ngx_http_idem_bkeys_keep(p, ev->log, ngx_http_idem_bkeys_kept);
    ngx_add_timer(ev, ngx_max(p->ctx->conf->lease / 3, 1));
}


void
ngx_http_idem_bkeys_cleanup(ngx_http_idem_ctx_t *ctx)
{
    ngx_http_idem_bkeys_t  *p;

    p = ctx->bkeys;

    if (p == NULL) {
        return;
    }

    if (p->keep.timer_set) {
        ngx_del_timer(&p->keep);
    }

    ngx_http_idem_replicas_cancel(&p->replicas);

    if (!p->deciding) {
        /* completed: the keys outlive its record's retention (as complete.lua) */
        if (ctx->end == NGX_HTTP_IDEM_END_COMPLETE) {
            /* a lock may be taken once it ended: no complaint then */
            ngx_http_idem_bkeys_keep(p, ngx_cycle->log, NULL);
        }

        return;
    }

    if (p->cmd) {
        /* its reply finds no request: a key it took goes back then */
        p->cmd->data = NULL;
        p->cmd = NULL;
    }

    ngx_http_idem_bkeys_give_back(p);
}
