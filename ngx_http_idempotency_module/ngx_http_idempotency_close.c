/*
 * Closing a claimed record: complete (the response is recorded), release
 * (the upstream never got the request, so the key is free again) or fail
 * (sent, but no complete response: the outcome is unknown).  Also the
 * lease renewal that keeps the claim while the request is alive, and the
 * giving back of a claim that nobody will use.
 *
 * These scripts are fenced by the owner token, so they are durable: one
 * that cannot reach Redis now is sent again once Redis is back.
 */

#include "ngx_http_idempotency.h"


/* every fenced script declares "owner" first, in its "--: args" line */
#define NGX_HTTP_IDEM_FENCED_OWNER  0

typedef char  ngx_http_idem_owner_first_t[
    (NGX_HTTP_IDEM_COMPLETE_OWNER == NGX_HTTP_IDEM_FENCED_OWNER
     && NGX_HTTP_IDEM_RELEASE_OWNER == NGX_HTTP_IDEM_FENCED_OWNER
     && NGX_HTTP_IDEM_FAIL_OWNER == NGX_HTTP_IDEM_FENCED_OWNER
     && NGX_HTTP_IDEM_RENEW_OWNER == NGX_HTTP_IDEM_FENCED_OWNER) ? 1 : -1];


static void
ngx_http_idem_closed(ngx_http_idem_cmd_t *cmd, redisReply *reply)
{
    const char  *what;
    ngx_log_t   *log;

    log = cmd->redis->log;
    what = cmd->redis->scripts[cmd->script].name;

    if (reply == NULL) {
        ngx_log_error(NGX_LOG_ERR, log, 0,
                      "idempotency: %s script got no reply; the record "
                      "turns unknown when its lease lapses",
                      what);
        return;
    }

    if (reply->type == REDIS_REPLY_ERROR) {
        ngx_log_error(NGX_LOG_ERR, log, 0,
                      "idempotency: %s script failed: %*s%s",
                      what, (size_t) reply->len, reply->str,
                      cmd->script == NGX_HTTP_IDEM_SCRIPT_RENEW
                      ? "" : "; the record turns unknown when its lease lapses");
        return;
    }

    if (reply->type == REDIS_REPLY_INTEGER && reply->integer == 0) {
        ngx_log_error(NGX_LOG_WARN, log, 0,
                      "idempotency: %s script: the claim was no longer "
                      "held by this request", what);
    }
}


/* a fenced script that names the record and the owner, then its own args */
static ngx_http_idem_cmd_t *
ngx_http_idem_fenced_cmd(ngx_http_idem_redis_t *rd,
    ngx_http_idem_script_e script, const u_char *key, const u_char *owner,
    size_t size, ngx_log_t *log)
{
    ngx_http_idem_cmd_t  *cmd;

    cmd = ngx_http_idem_cmd_create(rd, script, key,
                                   NGX_HTTP_IDEM_TOKEN_HEX + size, log);
    if (cmd == NULL) {
        return NULL;
    }

    ngx_http_idem_cmd_set(cmd, NGX_HTTP_IDEM_FENCED_OWNER, owner,
                          NGX_HTTP_IDEM_TOKEN_HEX);
    cmd->durable = (script != NGX_HTTP_IDEM_SCRIPT_RENEW);

    return cmd;
}


static ngx_http_idem_cmd_t *
ngx_http_idem_complete_cmd(ngx_http_request_t *r, ngx_http_idem_ctx_t *ctx)
{
    u_char                    *p;
    size_t                     body;
    ngx_chain_t               *cl;
    ngx_http_idem_cmd_t       *cmd;
    ngx_http_idem_loc_conf_t  *lcf;

    lcf = ctx->conf;
    body = ctx->too_large ? 0 : ctx->body_size;

    cmd = ngx_http_idem_fenced_cmd(lcf->redis, NGX_HTTP_IDEM_SCRIPT_COMPLETE,
                                   ctx->rkey, ctx->owner,
                                   2 * NGX_INT64_LEN + ctx->headers.len
                                   + body + 1, r->connection->log);
    if (cmd == NULL) {
        return NULL;
    }

    ngx_http_idem_cmd_set_num(cmd, NGX_HTTP_IDEM_COMPLETE_STATUS,
                              ctx->status);
    ngx_http_idem_cmd_set(cmd, NGX_HTTP_IDEM_COMPLETE_HDR, ctx->headers.data,
                          ctx->headers.len);

    p = ngx_http_idem_cmd_reserve(cmd, NGX_HTTP_IDEM_COMPLETE_BODY, body);
    for (cl = ctx->too_large ? NULL : ctx->body; cl; cl = cl->next) {
        p = ngx_cpymem(p, cl->buf->pos, cl->buf->last - cl->buf->pos);
    }

    ngx_http_idem_cmd_set(cmd, NGX_HTTP_IDEM_COMPLETE_STORED,
                          ctx->too_large ? "0" : "1", 1);
    ngx_http_idem_cmd_set_num(cmd, NGX_HTTP_IDEM_COMPLETE_TTL, lcf->ttl);

    return cmd;
}


void
ngx_http_idem_finish(ngx_http_request_t *r, ngx_http_idem_ctx_t *ctx,
    ngx_http_idem_end_e end)
{
    ngx_http_idem_cmd_t  *cmd;

    ctx->end = end;

    if (ctx->renew.timer_set) {
        ngx_del_timer(&ctx->renew);
    }

    if (end == NGX_HTTP_IDEM_END_COMPLETE) {
        cmd = ngx_http_idem_complete_cmd(r, ctx);

    } else {
        cmd = ngx_http_idem_fenced_cmd(ctx->conf->redis,
                                       end == NGX_HTTP_IDEM_END_RELEASE
                                       ? NGX_HTTP_IDEM_SCRIPT_RELEASE
                                       : NGX_HTTP_IDEM_SCRIPT_FAIL,
                                       ctx->rkey, ctx->owner, 0,
                                       r->connection->log);
    }

    if (cmd == NULL
        || ngx_http_idem_cmd_send(cmd, ngx_http_idem_closed, NULL) != NGX_OK)
    {
        ngx_log_error(NGX_LOG_ERR, r->connection->log, 0,
                      "idempotency: cannot close the record of key \"%V\"; "
                      "it turns unknown when its lease lapses", &ctx->key);
    }
}


/*
 * The request ends without a complete response having passed the body
 * filter: if nothing reached the upstream the key is free again, otherwise
 * the upstream may have acted.
 */
void
ngx_http_idem_abandon(ngx_http_request_t *r, ngx_http_idem_ctx_t *ctx)
{
    if (ctx->renew.timer_set) {
        ngx_del_timer(&ctx->renew);
    }

    if (!ctx->claimed || ctx->end != NGX_HTTP_IDEM_END_NONE) {
        return;
    }

    if (r->upstream && !r->upstream->request_sent) {
        ngx_http_idem_finish(r, ctx, NGX_HTTP_IDEM_END_RELEASE);
        return;
    }

    ngx_log_error(NGX_LOG_WARN, r->connection->log, 0,
                  "idempotency: no complete response for key "
                  "\"%V\", outcome unknown%s", &ctx->key,
                  r->connection->error
                  ? " (the client went away first; "
                    "\"proxy_ignore_client_abort on\" lets the "
                    "response be read and recorded)"
                  : "");

    ngx_http_idem_finish(r, ctx, NGX_HTTP_IDEM_END_FAIL);
}


/*
 * A claim made for nobody (its answer never came, or its request had gone)
 * is released, fenced by its owner token, at once or once Redis is back,
 * so that the key is not blocked until the lease lapses.
 */
void
ngx_http_idem_give_back(ngx_http_idem_redis_t *rd, ngx_str_t *key,
    ngx_str_t *owner)
{
    ngx_http_idem_cmd_t  *cmd;

    if (rd->exiting || key->len != IDEM_RECORD_KEY_LEN
        || owner->len != NGX_HTTP_IDEM_TOKEN_HEX)
    {
        return;
    }

    cmd = ngx_http_idem_fenced_cmd(rd, NGX_HTTP_IDEM_SCRIPT_RELEASE,
                                   key->data, owner->data, 0, rd->log);

    if (cmd == NULL
        || ngx_http_idem_cmd_send(cmd, ngx_http_idem_closed, NULL) != NGX_OK)
    {
        ngx_log_error(NGX_LOG_WARN, rd->log, 0,
                      "idempotency: an unanswered claim cannot be given "
                      "back; it turns unknown when its lease lapses");
    }
}


/* lease renewal: a third of the lease, so two renewals may be lost */

static void
ngx_http_idem_renew_handler(ngx_event_t *ev)
{
    ngx_http_request_t    *r;
    ngx_http_idem_cmd_t   *cmd;
    ngx_http_idem_ctx_t   *ctx;

    ctx = ev->data;
    r = ctx->request;

    if (ctx->end != NGX_HTTP_IDEM_END_NONE) {
        return;
    }

    cmd = ngx_http_idem_fenced_cmd(ctx->conf->redis,
                                   NGX_HTTP_IDEM_SCRIPT_RENEW, ctx->rkey,
                                   ctx->owner, NGX_INT64_LEN,
                                   r->connection->log);
    if (cmd) {
        ngx_http_idem_cmd_set_num(cmd, NGX_HTTP_IDEM_RENEW_LEASE,
                                  ctx->conf->lease);
        (void) ngx_http_idem_cmd_send(cmd, ngx_http_idem_closed, NULL);
    }

    ngx_add_timer(ev, ngx_max(ctx->conf->lease / 3, 1));
}


void
ngx_http_idem_start_lease(ngx_http_request_t *r, ngx_http_idem_ctx_t *ctx)
{
    ctx->renew.handler = ngx_http_idem_renew_handler;
    ctx->renew.data = ctx;
    ctx->renew.log = r->connection->log;
    ctx->renew.cancelable = 1;

    ngx_add_timer(&ctx->renew, ngx_max(ctx->conf->lease / 3, 1));
}
