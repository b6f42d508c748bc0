/*
 * A proposal by its operation id: the index the claim wrote when it made
 * the proposal (IDEM_OPERATION_PREFIX + op id + IDEM_OPERATION_SUFFIX:
 * the record key, then the proposal's JSON as the 428 showed it), then
 * the record, for its state now.  The status endpoint (?op=), the
 * approval page and idempotency-approve show a person this, never a
 * proposal a client hands over.  Two native GETs, not a script: the two
 * keys are in different hash slots.
 */

#include <ngx_config.h>
#include <ngx_core.h>

#include "ngx_http_idempotency.h"
#include "ngx_http_idempotency_proposal.h"
#include "ngx_http_idempotency_command.h"
#include "ngx_http_idempotency_redis.h"
#include "ngx_http_idempotency_reply.h"
#include "ngx_http_idempotency_request.h"


static ngx_str_t  ngx_http_idem_lookup_get = ngx_string("GET");

static void ngx_http_idem_lookup_record(ngx_http_idem_cmd_t *cmd,
    redisReply *reply);


/* ?op=<32 lowercase hex>: NGX_OK, NGX_DECLINED absent, NGX_ERROR malformed */
ngx_int_t
ngx_http_idem_op_arg(ngx_http_request_t *r, ngx_str_t *op)
{
    if (ngx_http_arg(r, (u_char *) "op", 2, op) != NGX_OK) {
        return NGX_DECLINED;
    }

    if (op->len != IDEM_TOKEN_LEN
        || !idem_is_hex((const char *) op->data, op->len))
    {
        return NGX_ERROR;
    }

    return NGX_OK;
}


static void
ngx_http_idem_lookup_end(ngx_http_idem_ctx_t *ctx, ngx_http_idem_lookup_t *lk)
{
    ngx_int_t            rc;
    ngx_connection_t    *c;
    ngx_http_request_t  *r;

    r = ctx->request;
    c = r->connection;

    rc = lk->done(r, ctx, lk);

    if (rc != NGX_DONE) {
        ngx_http_finalize_request(r, rc);
        ngx_http_run_posted_requests(c);
    }
}


static ngx_int_t
ngx_http_idem_lookup_send(ngx_http_idem_ctx_t *ctx, const u_char *key,
    ngx_http_idem_reply_pt handler)
{
    ngx_http_idem_cmd_t  *cmd;

    cmd = ngx_http_idem_cmd_native(ctx->conf->redis, &ngx_http_idem_lookup_get,
                                   0, key, 0, ctx->request->connection->log);

    if (cmd == NULL || ngx_http_idem_cmd_send(cmd, handler, ctx) != NGX_OK) {
        return NGX_ERROR;
    }

    ctx->cmd = cmd;

    return NGX_OK;
}


/* NGX_OK with a string or nil; else lk->failed is set */
static ngx_int_t
ngx_http_idem_lookup_reply(ngx_http_idem_ctx_t *ctx,
    ngx_http_idem_lookup_t *lk, redisReply *reply)
{
    ctx->cmd = NULL;

    if (reply == NULL || reply->type == REDIS_REPLY_ERROR) {
        lk->failed = 1;
        lk->problem = NGX_HTTP_IDEM_P_STORE_DOWN;
        return NGX_ERROR;
    }

    if (reply->type != REDIS_REPLY_STRING && reply->type != REDIS_REPLY_NIL) {
        lk->failed = 1;
        lk->problem = NGX_HTTP_IDEM_P_STORE_ERROR;
        return NGX_ERROR;
    }

    return NGX_OK;
}


static ngx_int_t
ngx_http_idem_lookup_copy(ngx_http_request_t *r, ngx_str_t *dst,
    const char *s, size_t len)
{
    dst->len = len;
    dst->data = ngx_pnalloc(r->pool, len + 1);

    if (dst->data == NULL) {
        return NGX_ERROR;
    }

    ngx_memcpy(dst->data, s, len);
    dst->data[len] = '\0';

    return NGX_OK;
}


static void
ngx_http_idem_lookup_index(ngx_http_idem_cmd_t *cmd, redisReply *reply)
{
    ngx_http_idem_ctx_t     *ctx;
    ngx_http_idem_lookup_t  *lk;

    ctx = cmd->data;

    /* the request went away while Redis worked */
    if (ctx == NULL) {
        return;
    }

    lk = ctx->lookup;

    if (ngx_http_idem_lookup_reply(ctx, lk, reply) != NGX_OK
        || reply->type == REDIS_REPLY_NIL)
    {
        ngx_http_idem_lookup_end(ctx, lk);
        return;
    }

    if (reply->len < IDEM_RECORD_KEY_LEN
        || !idem_is_key(reply->str, IDEM_RECORD_KEY_LEN, IDEM_RECORD_SUFFIX)
        || ngx_http_idem_lookup_copy(ctx->request, &lk->proposal,
                                     reply->str + IDEM_RECORD_KEY_LEN,
                                     reply->len - IDEM_RECORD_KEY_LEN)
           != NGX_OK)
    {
        lk->failed = 1;
        lk->problem = NGX_HTTP_IDEM_P_STORE_ERROR;
        ngx_http_idem_lookup_end(ctx, lk);
        return;
    }

    lk->found = 1;
    ngx_memcpy(ctx->rkey, reply->str, IDEM_RECORD_KEY_LEN);
    ctx->rkey[IDEM_RECORD_KEY_LEN] = '\0';

    if (ngx_http_idem_lookup_send(ctx, ctx->rkey, ngx_http_idem_lookup_record)
        != NGX_OK)
    {
        lk->failed = 1;
        lk->problem = NGX_HTTP_IDEM_P_STORE_DOWN;
        ngx_http_idem_lookup_end(ctx, lk);
    }
}


/* the record, when it is still this operation's */
static void
ngx_http_idem_lookup_record(ngx_http_idem_cmd_t *cmd, redisReply *reply)
{
    ngx_http_idem_ctx_t     *ctx;
    ngx_http_idem_lookup_t  *lk;

    ctx = cmd->data;

    if (ctx == NULL) {
        return;
    }

    lk = ctx->lookup;

    if (ngx_http_idem_lookup_reply(ctx, lk, reply) == NGX_OK
        && reply->type == REDIS_REPLY_STRING
        && ngx_http_idem_lookup_copy(ctx->request, &lk->value, reply->str,
                                     reply->len) == NGX_OK
        && idem_value_decode((const char *) lk->value.data, lk->value.len,
                             &lk->rec) == 0
        && lk->rec.state != 'r' && lk->rec.state != 's'
        && ngx_strncmp(lk->rec.op, lk->op.data, IDEM_TOKEN_LEN) == 0)
    {
        lk->has_rec = 1;
    }

    ngx_http_idem_lookup_end(ctx, lk);
}


/* NGX_DONE: lk->done answers, once both are read (or one failed) */
ngx_int_t
ngx_http_idem_lookup(ngx_http_request_t *r, ngx_http_idem_ctx_t *ctx,
    ngx_http_idem_lookup_t *lk)
{
    u_char  *key;

    key = ngx_http_idem_operation_key(r->pool, &lk->op);
    if (key == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    ctx->lookup = lk;

    if (ngx_http_idem_lookup_send(ctx, key, ngx_http_idem_lookup_index)
        != NGX_OK)
    {
        return ngx_http_idem_send_problem(r, ctx, NGX_HTTP_IDEM_P_STORE_DOWN,
                                          NULL);
    }

    r->main->count++;

    return NGX_DONE;
}
