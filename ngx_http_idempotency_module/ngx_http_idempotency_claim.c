/*
 * The claim: one script that takes (scope, key) for this attempt or says
 * what already holds it, and the decoding of its answer into the request
 * context.  A claim whose answer never came, or came for a request that
 * has gone, is given back so that the key is not blocked.
 */

#include <openssl/rand.h>

#include "ngx_http_idempotency.h"


static void ngx_http_idem_claim_done(ngx_http_idem_cmd_t *cmd,
    redisReply *reply);


/*
 * Random bytes from a per-worker reserve filled by RAND_bytes() 4 KiB at
 * a time: every RAND_bytes() call runs OpenSSL's DRBG set-up and a getpid()
 * fork check, 7k instructions for 32 bytes (bench/RESULTS.md).  The reserve
 * is refilled when it runs out or when the process is not the one that
 * filled it (ngx_pid is set after fork), and used bytes are wiped.
 */
#define NGX_HTTP_IDEM_RANDOM_RESERVE  4096

static u_char *
ngx_http_idem_random(size_t n)
{
    static u_char     reserve[NGX_HTTP_IDEM_RANDOM_RESERVE];
    static size_t     left;
    static ngx_pid_t  filled_by;

    if (left < n || filled_by != ngx_pid) {
        if (RAND_bytes(reserve, sizeof(reserve)) != 1) {
            left = 0;
            return NULL;
        }

        left = sizeof(reserve);
        filled_by = ngx_pid;
    }

    left -= n;

    return reserve + left;
}


/* the operation id and the owner token */
ngx_int_t
ngx_http_idem_tokens(ngx_http_request_t *r, ngx_http_idem_ctx_t *ctx)
{
    u_char  *raw;

    ctx->op_id.data = ngx_pnalloc(r->pool, NGX_HTTP_IDEM_TOKEN_HEX);
    if (ctx->op_id.data == NULL) {
        return NGX_ERROR;
    }

    raw = ngx_http_idem_random(NGX_HTTP_IDEM_TOKEN_HEX);
    if (raw == NULL) {
        return NGX_ERROR;
    }

    ngx_hex_dump(ctx->op_id.data, raw, NGX_HTTP_IDEM_TOKEN_HEX / 2);
    ngx_hex_dump(ctx->owner, raw + NGX_HTTP_IDEM_TOKEN_HEX / 2,
                 NGX_HTTP_IDEM_TOKEN_HEX / 2);
    ngx_explicit_memzero(raw, NGX_HTTP_IDEM_TOKEN_HEX);
    ctx->op_id.len = NGX_HTTP_IDEM_TOKEN_HEX;

    return NGX_OK;
}


static ngx_http_idem_cmd_t *
ngx_http_idem_claim_cmd(ngx_http_request_t *r, ngx_http_idem_ctx_t *ctx)
{
    ngx_http_idem_cmd_t       *cmd;
    ngx_http_idem_loc_conf_t  *lcf;

    lcf = ctx->conf;

    cmd = ngx_http_idem_cmd_create(lcf->redis, NGX_HTTP_IDEM_SCRIPT_CLAIM,
                                   ctx->rkey, IDEM_FP_HEX_LEN
                                   + 2 * NGX_HTTP_IDEM_TOKEN_HEX
                                   + 2 * NGX_INT64_LEN + 1,
                                   r->connection->log);
    if (cmd == NULL) {
        return NULL;
    }

    ngx_http_idem_cmd_set(cmd, NGX_HTTP_IDEM_CLAIM_FP, ctx->fingerprint,
                          IDEM_FP_HEX_LEN);
    ngx_http_idem_cmd_set(cmd, NGX_HTTP_IDEM_CLAIM_OWNER, ctx->owner,
                          NGX_HTTP_IDEM_TOKEN_HEX);
    ngx_http_idem_cmd_set(cmd, NGX_HTTP_IDEM_CLAIM_OP, ctx->op_id.data,
                          NGX_HTTP_IDEM_TOKEN_HEX);
    ngx_http_idem_cmd_set_num(cmd, NGX_HTTP_IDEM_CLAIM_LEASE, lcf->lease);
    ngx_http_idem_cmd_set_num(cmd, NGX_HTTP_IDEM_CLAIM_TTL, lcf->ttl);
    ngx_http_idem_cmd_set(cmd, NGX_HTTP_IDEM_CLAIM_WAIT,
                          lcf->wait ? "1" : "0", 1);

    return cmd;
}


/*
 * NGX_OK: the claim is on its way and its answer resumes the request.
 * NGX_ERROR: Redis cannot be reached; the answer is "store down" already.
 */
ngx_int_t
ngx_http_idem_claim_send(ngx_http_request_t *r, ngx_http_idem_ctx_t *ctx)
{
    ngx_http_idem_cmd_t  *cmd;

    ctx->phase = NGX_HTTP_IDEM_CLAIMING;

    cmd = ngx_http_idem_claim_cmd(r, ctx);

    if (cmd && ngx_http_idem_cmd_send(cmd, ngx_http_idem_claim_done, ctx)
               == NGX_OK)
    {
        ctx->cmd = cmd;
        return NGX_OK;
    }

    ctx->answer = NGX_HTTP_IDEM_ANS_STORE_DOWN;
    ctx->phase = NGX_HTTP_IDEM_ANSWERED;

    return NGX_ERROR;
}


static ngx_int_t
ngx_http_idem_copy_rv(ngx_pool_t *pool, idem_rv_t *v, ngx_str_t *dst)
{
    dst->len = v->len;
    dst->data = ngx_pnalloc(pool, v->len + 1);
    if (dst->data == NULL) {
        return NGX_ERROR;
    }

    ngx_memcpy(dst->data, v->data, v->len);

    return NGX_OK;
}


/* what a decoded, valid answer says, with its fields copied to ctx */
static ngx_http_idem_answer_e
ngx_http_idem_claim_answer(ngx_http_request_t *r, ngx_http_idem_ctx_t *ctx,
    idem_claim_t *c)
{
    if (ngx_http_idem_copy_rv(r->pool, &c->op, &ctx->op_id) != NGX_OK) {
        return NGX_HTTP_IDEM_ANS_STORE_ERROR;
    }

    if (c->state) {
        ctx->state.data = (u_char *) c->state;
        ctx->state.len = ngx_strlen(c->state);
    }

    switch (c->kind) {

    case IDEM_CLAIM_CLAIMED:
        return NGX_HTTP_IDEM_ANS_CLAIMED;

    case IDEM_CLAIM_COMPLETED:
        if (ngx_http_idem_copy_rv(r->pool, &c->hdr, &ctx->stored_headers)
            != NGX_OK
            || ngx_http_idem_copy_rv(r->pool, &c->body, &ctx->stored_body)
               != NGX_OK)
        {
            return NGX_HTTP_IDEM_ANS_STORE_ERROR;
        }

        ctx->stored_status = c->status;
        ctx->body_stored = c->body_stored;
        return NGX_HTTP_IDEM_ANS_COMPLETED;

    case IDEM_CLAIM_IN_PROGRESS:
        ctx->lease_left = (ngx_msec_t) c->lease_left;
        return NGX_HTTP_IDEM_ANS_IN_PROGRESS;

    case IDEM_CLAIM_UNKNOWN:
        return NGX_HTTP_IDEM_ANS_UNKNOWN;

    case IDEM_CLAIM_MISMATCH:
        return NGX_HTTP_IDEM_ANS_MISMATCH;

    default: /* IDEM_CLAIM_CORRUPT: a completed record with bad fields */
        return NGX_HTTP_IDEM_ANS_STORE_ERROR;
    }
}


static ngx_http_idem_answer_e
ngx_http_idem_claim_parse(ngx_http_request_t *r, ngx_http_idem_ctx_t *ctx,
    redisReply *reply)
{
    size_t        n;
    idem_rv_t     el[IDEM_CLAIM_ELEMS];
    idem_claim_t  c;

    if (reply == NULL) {
        return NGX_HTTP_IDEM_ANS_STORE_DOWN;
    }

    if (reply->type == REDIS_REPLY_ERROR) {
        ngx_log_error(NGX_LOG_ERR, r->connection->log, 0,
                      "idempotency: claim failed: %*s",
                      (size_t) reply->len, reply->str);

        return ngx_http_idem_reply_corrupt(reply)
               ? NGX_HTTP_IDEM_ANS_STORE_ERROR
               : NGX_HTTP_IDEM_ANS_STORE_DOWN;
    }

    if (reply->type == REDIS_REPLY_ARRAY) {
        n = ngx_http_idem_reply_elements(reply, el, IDEM_CLAIM_ELEMS);

        if (idem_claim_decode(el, n, &c) != IDEM_CLAIM_INVALID) {
            return ngx_http_idem_claim_answer(r, ctx, &c);
        }
    }

    ngx_log_error(NGX_LOG_ERR, r->connection->log, 0,
                  "idempotency: unexpected reply to the claim script");

    return NGX_HTTP_IDEM_ANS_STORE_ERROR;
}


/*
 * A claim that may have been made for nobody: no answer came (it may have
 * run), or it was made after its request had gone.  Either way the key is
 * given back, fenced by the claim's owner token.
 */
static void
ngx_http_idem_claim_orphan(ngx_http_idem_cmd_t *cmd, redisReply *reply)
{
    size_t        n;
    ngx_str_t     key, owner;
    idem_rv_t     el[IDEM_CLAIM_ELEMS];
    idem_claim_t  c;

    if (reply) {
        if (reply->type != REDIS_REPLY_ARRAY) {
            return;
        }

        n = ngx_http_idem_reply_elements(reply, el, IDEM_CLAIM_ELEMS);

        if (idem_claim_decode(el, n, &c) != IDEM_CLAIM_CLAIMED) {
            return;
        }
    }

    key = ngx_http_idem_cmd_key(cmd);
    owner = ngx_http_idem_cmd_get(cmd, NGX_HTTP_IDEM_CLAIM_OWNER);

    ngx_http_idem_give_back(cmd->redis, &key, &owner);
}


static void
ngx_http_idem_claim_done(ngx_http_idem_cmd_t *cmd, redisReply *reply)
{
    ngx_connection_t     *c;
    ngx_http_request_t   *r;
    ngx_http_idem_ctx_t  *ctx;

    ctx = cmd->data;

    if (ctx == NULL || reply == NULL) {
        ngx_http_idem_claim_orphan(cmd, reply);

        if (ctx == NULL) {
            return;
        }
    }

    ctx->cmd = NULL;
    r = ctx->request;
    c = r->connection;

    ngx_str_null(&ctx->state);

    ctx->answer = ngx_http_idem_claim_parse(r, ctx, reply);
    ctx->phase = NGX_HTTP_IDEM_ANSWERED;

    /* r may be freed inside: only c is touched afterwards */
    ngx_http_core_run_phases(r);
    ngx_http_run_posted_requests(c);
}
