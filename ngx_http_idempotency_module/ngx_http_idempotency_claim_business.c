/*
 * idempotency_unique's and idempotency_lock's part in a claim: the unique
 * and lock keys (and the h key that names the lock) are claim.lua's
 * KEYS; a business identity held by another key's operation is that
 * operation's answer (a reuse), a lock held by another operation refuses
 * the request, an identity of another location is a conflict.
 *
 * On one server or behind Sentinel the first look of a first write is
 * native (docs/business-keys.md, "The native claim"): SET NX PX GET of the
 * record, then of the unique key, the lock key and the h key, with
 * exactly the values claim.lua writes, pipelined in this order.  All
 * taken: claimed, as claim.lua would have answered.  None of the business
 * keys taken: the record's reply is the answer, as the native first look
 * of a request without them.  Otherwise claim.lua, which first deletes by
 * a compare what this attempt took ("undo"), then decides on the keys as
 * they are.
 */

#include <ngx_config.h>
#include <ngx_core.h>

#include "ngx_http_idempotency.h"
#include "ngx_http_idempotency_claim.h"
#include "ngx_http_idempotency_claim_business.h"
#include "ngx_http_idempotency_business.h"
#include "ngx_http_idempotency_command.h"
#include "ngx_http_idempotency_close.h"


static void ngx_http_idem_claim_business_part(ngx_http_idem_cmd_t *cmd,
    ngx_uint_t i, redisReply *reply);


typedef char  ngx_http_idem_claim_keys_check[
    NGX_HTTP_IDEM_BUSINESS_KEYS <= NGX_HTTP_IDEM_CLAIM_KEYS ? 1 : -1];


static ngx_uint_t
ngx_http_idem_claim_business_scripted(ngx_http_idem_ctx_t *ctx)
{
    return ctx->ukey[0] || ctx->lkey[0];
}


/*
 * The location tag, by which claim.lua tells an identity of another one;
 * "undo" after a native claim that did not take every key
 */
static void
ngx_http_idem_claim_business_args(ngx_http_idem_ctx_t *ctx,
    ngx_http_idem_cmd_t *cmd)
{
    ngx_http_idem_cmd_set(cmd, NGX_HTTP_IDEM_CLAIM_LOC, ctx->conf->loc_tag,
                          ctx->ukey[0] ? ngx_strlen(ctx->conf->loc_tag) : 0);
    ngx_http_idem_cmd_set(cmd, NGX_HTTP_IDEM_CLAIM_UNDO, "1",
                          ctx->undo ? 1 : 0);
}


/* a SET, its key, value, NX, PX, its TTL, GET: one command of the batch */
#define NGX_HTTP_IDEM_BATCH_ARGS  7

static ngx_str_t  ngx_http_idem_batch_words[] = {
    ngx_string("SET"), ngx_null_string, ngx_null_string,
    ngx_string("NX"), ngx_string("PX"), ngx_null_string, ngx_string("GET")
};


/*
 * SET key <record key><op id><tail> NX PX <bttl> GET, as argument "at"
 * onwards: the name claim.lua writes in the key (claimfresh.lua)
 */
static ngx_uint_t
ngx_http_idem_claim_batch_set(ngx_http_idem_ctx_t *ctx,
    ngx_http_idem_cmd_t *cmd, ngx_uint_t at, u_char *key, u_char *tail,
    size_t len, int64_t bttl)
{
    u_char      *p;
    ngx_uint_t   i;

    for (i = 0; i < NGX_HTTP_IDEM_BATCH_ARGS; i++) {
        if (ngx_http_idem_batch_words[i].len) {
            ngx_http_idem_cmd_set(cmd, at + i,
                                  ngx_http_idem_batch_words[i].data,
                                  ngx_http_idem_batch_words[i].len);
        }
    }

    ngx_http_idem_cmd_set(cmd, at + 1, key, ngx_strlen(key));
    p = ngx_http_idem_cmd_reserve(cmd, at + 2, IDEM_RECORD_KEY_LEN
                                               + NGX_HTTP_IDEM_TOKEN_HEX
                                               + len);
    p = ngx_cpymem(p, ctx->rkey, IDEM_RECORD_KEY_LEN);
    p = ngx_cpymem(p, ctx->op_id.data, NGX_HTTP_IDEM_TOKEN_HEX);
    ngx_memcpy(p, tail, len);
    ngx_http_idem_cmd_set_num(cmd, at + 5, bttl);

    return at + NGX_HTTP_IDEM_BATCH_ARGS;
}


/*
 * The native claim: a first write of one server or Sentinel, claimed (not
 * proposed), without the audit, that does not wait; anything else is
 * claim.lua's to decide, as before.
 */
static ngx_int_t
ngx_http_idem_claim_business_look(ngx_http_request_t *r,
    ngx_http_idem_ctx_t *ctx, ngx_http_idem_cmd_t **cmd)
{
    size_t                size;
    int64_t               bttl;
    ngx_uint_t            n, at;
    ngx_http_idem_cmd_t  *c;

    if ((ctx->ukey[0] == '\0' && ctx->lkey[0] == '\0')
        || ctx->conf->redis->topology == NGX_HTTP_IDEM_TOPO_CLUSTER
        || ctx->conf->audit || ctx->confirm != NGX_HTTP_IDEM_CONFIRM_NONE
        || ctx->waiting || ctx->undo)
    {
        return NGX_DECLINED;
    }

    n = (ctx->ukey[0] ? 1 : 0) + (ctx->lkey[0] ? 2 : 0);
    size = n * (sizeof("SETNXPXGET") - 1 + NGX_INT64_LEN
                + 3 * IDEM_RECORD_KEY_LEN + NGX_HTTP_IDEM_TOKEN_HEX);

    c = ngx_http_idem_claim_set_more(r, ctx, n * NGX_HTTP_IDEM_BATCH_ARGS,
                                     size);
    *cmd = c;

    if (c == NULL) {
        return NGX_OK;
    }

    c->batch = NGX_HTTP_IDEM_BATCH_ARGS;
    c->part_handler = ngx_http_idem_claim_business_part;
    ctx->bkeys_look_type = 0;
    bttl = 2 * ngx_http_idem_claim_record_ttl(ctx);
    at = NGX_HTTP_IDEM_CLAIM_SET_NARGS;

    /* the record first: whoever meets a name of ours meets our claim */
    if (ctx->ukey[0]) {
        at = ngx_http_idem_claim_batch_set(ctx, c, at, ctx->ukey,
                                           ctx->conf->loc_tag,
                                           ngx_strlen(ctx->conf->loc_tag),
                                           bttl);
    }

    if (ctx->lkey[0]) {
        at = ngx_http_idem_claim_batch_set(ctx, c, at, ctx->lkey, ctx->stag,
                                           ngx_strlen(ctx->stag), bttl);
        (void) ngx_http_idem_claim_batch_set(ctx, c, at, ctx->hkey,
                                             ctx->lkey,
                                             ngx_strlen(ctx->lkey), bttl);
    }

    return NGX_OK;
}


/* the record SET's reply, kept with the request for the last reply */
static void
ngx_http_idem_claim_business_part(ngx_http_idem_cmd_t *cmd, ngx_uint_t i,
    redisReply *reply)
{
    ngx_http_idem_ctx_t  *ctx = cmd->data;

    if (i != 0 || ctx == NULL || reply == NULL) {
        return;
    }

    ctx->bkeys_look_type = reply->type;

    if (reply->type != REDIS_REPLY_STRING && reply->type != REDIS_REPLY_ERROR) {
        return;
    }

    ctx->bkeys_look.data = ngx_pnalloc(ctx->request->pool, reply->len + 1);
    if (ctx->bkeys_look.data == NULL) {
        /* claim.lua reads the record again */
        ctx->bkeys_look_type = REDIS_REPLY_ERROR;
        ctx->bkeys_look.len = 0;
        return;
    }

    ngx_memcpy(ctx->bkeys_look.data, reply->str, reply->len);
    ctx->bkeys_look.len = reply->len;
}


/* bit i: the batch's command i took its key (answered NIL) */
static ngx_uint_t
ngx_http_idem_claim_batch_taken(ngx_http_idem_cmd_t *cmd, redisReply *last,
    ngx_uint_t *n)
{
    *n = cmd->argc / NGX_HTTP_IDEM_BATCH_ARGS;

    return cmd->nil | ((ngx_uint_t) (last && last->type == REDIS_REPLY_NIL)
                       << (*n - 1));
}


/*
 * A native claim whose request has gone, or whose last reply did not
 * come: its record, unless its SET is known to have found the key held,
 * is given back as any such claim (ngx_http_idem_give_back); a business
 * key left naming it holds nothing once its record does not.
 */
static ngx_int_t
ngx_http_idem_claim_business_reply(ngx_http_idem_cmd_t *cmd,
    redisReply **reply)
{
    ngx_str_t  key, value;

    if (cmd->batch == 0 || (cmd->data && *reply)) {
        return NGX_DECLINED;
    }

    if ((cmd->nil & 1) || !(cmd->got & 1)) {
        key = ngx_http_idem_cmd_key(cmd);
        value = ngx_http_idem_cmd_get(cmd, 0);
        ngx_http_idem_give_back(cmd, &key, &value);
    }

    return cmd->data ? NGX_OK : NGX_DONE;
}


/*
 * The last reply: with the record's (kept by the part hook) and the
 * others' (cmd->nil), whether each SET took its key.
 */
static ngx_int_t
ngx_http_idem_claim_business_parse(ngx_http_request_t *r,
    ngx_http_idem_ctx_t *ctx, ngx_http_idem_cmd_t *cmd, redisReply *reply,
    ngx_http_idem_answer_e *answer)
{
    ngx_uint_t  taken, n, all;
    redisReply  look;

    if (cmd->batch == 0) {
        return NGX_DECLINED;
    }

    taken = ngx_http_idem_claim_batch_taken(cmd, reply, &n);
    all = ((ngx_uint_t) 1 << n) - 1;
    *answer = NGX_HTTP_IDEM_ANS_NONE;

    if (taken == all) {
        ngx_http_idem_set_state(ctx, 'i');
        *answer = NGX_HTTP_IDEM_ANS_CLAIMED;
        return NGX_OK;
    }

    if (taken) {
        ctx->undo = 1;
        return NGX_OK;
    }

    /* nothing taken: the record that holds the key, as a first look */
    ngx_memzero(&look, sizeof(redisReply));
    look.type = ctx->bkeys_look_type ? ctx->bkeys_look_type
                                     : REDIS_REPLY_ERROR;
    look.str = (char *) ctx->bkeys_look.data;
    look.len = ctx->bkeys_look.len;

    *answer = ngx_http_idem_claim_decode(r, ctx, cmd, &look);

    return NGX_OK;
}


/*
 * idempotency_unique: the operation of another key holds the request's
 * business identity; its answer is this request's, under its id.
 */
ngx_http_idem_answer_e
ngx_http_idem_claim_reused(ngx_http_request_t *r, ngx_http_idem_ctx_t *ctx,
    idem_claim_t *c)
{
    if (ngx_http_idem_claim_record(r, ctx, &c->rec) != NGX_OK) {
        return NGX_HTTP_IDEM_ANS_STORE_ERROR;
    }

    ctx->reused = 1;
    ngx_str_set(&ctx->problem_extra, ",\"reused\":true");

    switch (c->rec.state) {

    case 'c':
        return NGX_HTTP_IDEM_ANS_REUSED;

    case 'i':
        ctx->lease_left = (ngx_msec_t) c->lease_left;
        return NGX_HTTP_IDEM_ANS_IN_PROGRESS;

    default: /* 'u' */
        return NGX_HTTP_IDEM_ANS_UNKNOWN;
    }
}


/*
 * idempotency_lock: another operation holds the lock; nothing was
 * written.  Its id is told only to a request of its own scope.
 */
static ngx_http_idem_answer_e
ngx_http_idem_claim_locked(ngx_http_request_t *r, ngx_http_idem_ctx_t *ctx,
    idem_claim_t *c)
{
    ngx_str_null(&ctx->op_id);

    /* in flight: as soon as it may end; unknown: an operator resolves it */
    ctx->retry_after = c->lease_left ? 1 : 60;

    if (c->op && ngx_http_idem_claim_op(r, ctx, c->op) != NGX_OK) {
        return NGX_HTTP_IDEM_ANS_STORE_ERROR;
    }

    return NGX_HTTP_IDEM_ANS_LOCKED;
}


static ngx_int_t
ngx_http_idem_claim_business_decoded(ngx_http_request_t *r,
    ngx_http_idem_ctx_t *ctx, idem_claim_t *c, ngx_http_idem_answer_e *answer)
{
    switch (c->kind) {

    case IDEM_CLAIM_REUSED:
        *answer = ngx_http_idem_claim_reused(r, ctx, c);
        return NGX_OK;

    case IDEM_CLAIM_LOCKED:
        *answer = ngx_http_idem_claim_locked(r, ctx, c);
        return NGX_OK;

    case IDEM_CLAIM_ELSEWHERE:
        /* the holder is another location's: its id is not this request's */
        ngx_str_null(&ctx->op_id);
        *answer = NGX_HTTP_IDEM_ANS_ELSEWHERE;
        return NGX_OK;

    default:
        return NGX_DECLINED;
    }
}


ngx_http_idem_claim_part_t  ngx_http_idem_claim_business = {
    ngx_http_idem_business_keys,            /* prepare */
    ngx_http_idem_claim_business_look,      /* look */
    ngx_http_idem_claim_business_scripted,  /* scripted */
    ngx_http_idem_business_args,            /* keys */
    NULL,                                   /* create */
    ngx_http_idem_claim_business_args,      /* args */
    NULL,                                   /* value */
    ngx_http_idem_claim_business_reply,     /* reply */
    ngx_http_idem_claim_business_parse,     /* parse */
    ngx_http_idem_claim_business_decoded,   /* decoded */
    NULL,                                   /* held */
    NULL,                                   /* answered */
    NULL                                    /* let */
};
