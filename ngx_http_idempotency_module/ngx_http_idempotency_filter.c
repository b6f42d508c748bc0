/*
 * Capture of the claimed request's final response (status, stored headers,
 * body) and the script that closes its record: complete, release or fail.
 * Also the lease renewal that keeps the claim while the request is alive.
 */

#include "ngx_http_idempotency.h"


static ngx_http_output_header_filter_pt  ngx_http_next_header_filter;
static ngx_http_output_body_filter_pt    ngx_http_next_body_filter;


/* not end-to-end, or meaningless to replay (RFC 9110 section 7.6.1) */
static ngx_str_t  ngx_http_idem_never_stored[] = {
    ngx_string("date"),
    ngx_string("server"),
    ngx_string("connection"),
    ngx_string("keep-alive"),
    ngx_string("transfer-encoding"),
    ngx_string("content-length"),
    ngx_string("set-cookie"),
    ngx_string("te"),
    ngx_string("trailer"),
    ngx_string("upgrade"),
    ngx_string("proxy-connection"),
    ngx_string("idempotent-replayed"),
    ngx_null_string
};


static ngx_uint_t
ngx_http_idem_in_list(ngx_str_t *name, ngx_str_t *list, ngx_uint_t n)
{
    ngx_uint_t  i;

    for (i = 0; n ? i < n : list[i].len != 0; i++) {
        if (list[i].len == name->len
            && ngx_strncasecmp(list[i].data, name->data, name->len) == 0)
        {
            return 1;
        }
    }

    return 0;
}


static ngx_uint_t
ngx_http_idem_store_header(ngx_http_idem_loc_conf_t *lcf, ngx_table_elt_t *h)
{
    if (h->hash == 0
        || ngx_http_idem_in_list(&h->key, ngx_http_idem_never_stored, 0))
    {
        return 0;
    }

    if (lcf->store_headers == NULL) {
        return 1;
    }

    return ngx_http_idem_in_list(&h->key, lcf->store_headers->elts,
                                 lcf->store_headers->nelts);
}


/* two passes over the headers: the size, then the netstrings */
static ngx_int_t
ngx_http_idem_capture_headers(ngx_http_request_t *r, ngx_http_idem_ctx_t *ctx)
{
    char             *p;
    size_t            len;
    ngx_uint_t        i, pass;
    ngx_list_part_t  *part;
    ngx_table_elt_t  *h;

    len = 0;
    p = NULL;

    for (pass = 0; pass < 2; pass++) {

        if (r->headers_out.content_type.len) {
            if (pass == 0) {
                len += idem_hdrs_pair_len(12, r->headers_out.content_type.len);

            } else {
                p = idem_hdrs_put(p, "Content-Type", 12,
                                  (char *) r->headers_out.content_type.data,
                                  r->headers_out.content_type.len);
            }
        }

        part = &r->headers_out.headers.part;
        h = part->elts;

        for (i = 0; /* void */; i++) {

            if (i >= part->nelts) {
                if (part->next == NULL) {
                    break;
                }

                part = part->next;
                h = part->elts;
                i = 0;
            }

            if (!ngx_http_idem_store_header(ctx->conf, &h[i])) {
                continue;
            }

            if (pass == 0) {
                len += idem_hdrs_pair_len(h[i].key.len, h[i].value.len);

            } else {
                p = idem_hdrs_put(p, (char *) h[i].key.data, h[i].key.len,
                                  (char *) h[i].value.data, h[i].value.len);
            }
        }

        if (pass == 0) {
            /* idem_hdrs_put() writes with sprintf: room for its NUL */
            p = ngx_pnalloc(r->pool, len + 1);
            if (p == NULL) {
                return NGX_ERROR;
            }

            ctx->headers.data = (u_char *) p;
        }
    }

    ctx->headers.len = (u_char *) p - ctx->headers.data;

    return NGX_OK;
}


static ngx_uint_t
ngx_http_idem_releases(ngx_http_idem_loc_conf_t *lcf, ngx_uint_t status)
{
    ngx_uint_t   i, *s;

    if (lcf->release_statuses == NULL) {
        return 0;
    }

    s = lcf->release_statuses->elts;

    for (i = 0; i < lcf->release_statuses->nelts; i++) {
        if (s[i] == status) {
            return 1;
        }
    }

    return 0;
}


static ngx_int_t
ngx_http_idem_header_filter(ngx_http_request_t *r)
{
    ngx_http_upstream_t  *u;
    ngx_http_idem_ctx_t  *ctx;

    if (r != r->main) {
        return ngx_http_next_header_filter(r);
    }

    ctx = ngx_http_idem_get_ctx(r);

    if (ctx == NULL || !ctx->claimed || ctx->capturing
        || ctx->end != NGX_HTTP_IDEM_END_NONE)
    {
        return ngx_http_next_header_filter(r);
    }

    u = r->upstream;

    if (u && u->headers_in.status_n == 0) {
        /* nginx's own error page: the upstream gave no answer */
        ngx_http_idem_finish(r, ctx, u->request_sent
                                     ? NGX_HTTP_IDEM_END_FAIL
                                     : NGX_HTTP_IDEM_END_RELEASE);
        return ngx_http_next_header_filter(r);
    }

    ctx->status = r->headers_out.status;

    if (ngx_http_idem_releases(ctx->conf, ctx->status)) {
        ngx_http_idem_finish(r, ctx, NGX_HTTP_IDEM_END_RELEASE);
        return ngx_http_next_header_filter(r);
    }

    if (ngx_http_idem_capture_headers(r, ctx) != NGX_OK) {
        ngx_http_idem_finish(r, ctx, NGX_HTTP_IDEM_END_FAIL);
        return NGX_ERROR;
    }

    ctx->capturing = 1;
    ctx->last = &ctx->body;
    ctx->content_length = r->headers_out.content_length_n;

    if (ctx->status == NGX_HTTP_NO_CONTENT
        || ctx->status == NGX_HTTP_NOT_MODIFIED || r->header_only)
    {
        /* no body filter call will follow */
        ngx_http_idem_finish(r, ctx, NGX_HTTP_IDEM_END_COMPLETE);
        return ngx_http_next_header_filter(r);
    }

    /* the copy filter then hands us memory, not file, buffers */
    r->filter_need_in_memory = 1;

    return ngx_http_next_header_filter(r);
}


static ngx_int_t
ngx_http_idem_capture_buf(ngx_http_request_t *r, ngx_http_idem_ctx_t *ctx,
    ngx_buf_t *b)
{
    size_t        size;
    ngx_buf_t    *copy;
    ngx_chain_t  *cl;

    if (!ngx_buf_in_memory(b)) {
        if (ngx_buf_size(b) > 0) {
            /* should not happen with filter_need_in_memory; keep it safe */
            ctx->too_large = 1;
        }

        return NGX_OK;
    }

    size = b->last - b->pos;
    ctx->body_size += size;

    if (size == 0 || ctx->too_large) {
        return NGX_OK;
    }

    if (ctx->body_size > ctx->conf->store_max) {
        ctx->too_large = 1;
        ctx->body = NULL;
        return NGX_OK;
    }

    copy = ngx_create_temp_buf(r->pool, size);
    cl = ngx_alloc_chain_link(r->pool);
    if (copy == NULL || cl == NULL) {
        return NGX_ERROR;
    }

    copy->last = ngx_cpymem(copy->pos, b->pos, size);
    cl->buf = copy;
    cl->next = NULL;

    *ctx->last = cl;
    ctx->last = &cl->next;

    return NGX_OK;
}


static ngx_int_t
ngx_http_idem_body_filter(ngx_http_request_t *r, ngx_chain_t *in)
{
    ngx_uint_t            last;
    ngx_chain_t          *cl;
    ngx_http_idem_ctx_t  *ctx;

    if (r != r->main || in == NULL) {
        return ngx_http_next_body_filter(r, in);
    }

    ctx = ngx_http_idem_get_ctx(r);

    if (ctx == NULL || !ctx->capturing
        || ctx->end != NGX_HTTP_IDEM_END_NONE)
    {
        return ngx_http_next_body_filter(r, in);
    }

    last = 0;

    for (cl = in; cl; cl = cl->next) {
        if (ngx_http_idem_capture_buf(r, ctx, cl->buf) != NGX_OK) {
            ngx_http_idem_finish(r, ctx, NGX_HTTP_IDEM_END_FAIL);
            return NGX_ERROR;
        }

        if (cl->buf->last_buf) {
            last = 1;
        }
    }

    if (last) {
        if (ctx->content_length >= 0
            && (off_t) ctx->body_size != ctx->content_length)
        {
            /* a body shorter than announced is not a final response */
            ngx_http_idem_finish(r, ctx, NGX_HTTP_IDEM_END_FAIL);

        } else {
            ngx_http_idem_finish(r, ctx, NGX_HTTP_IDEM_END_COMPLETE);
        }
    }

    return ngx_http_next_body_filter(r, in);
}


ngx_int_t
ngx_http_idem_filter_init(ngx_conf_t *cf)
{
    ngx_http_next_header_filter = ngx_http_top_header_filter;
    ngx_http_top_header_filter = ngx_http_idem_header_filter;

    ngx_http_next_body_filter = ngx_http_top_body_filter;
    ngx_http_top_body_filter = ngx_http_idem_body_filter;

    return NGX_OK;
}


/* closing the record */

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


static ngx_http_idem_cmd_t *
ngx_http_idem_complete_cmd(ngx_http_request_t *r, ngx_http_idem_ctx_t *ctx)
{
    u_char                    *p, status[NGX_INT_T_LEN], ttl[NGX_TIME_T_LEN];
    size_t                     body;
    ngx_chain_t               *cl;
    ngx_http_idem_cmd_t       *cmd;
    ngx_http_idem_loc_conf_t  *lcf;

    lcf = ctx->conf;
    body = ctx->too_large ? 0 : ctx->body_size;

    cmd = ngx_http_idem_cmd_create(lcf->redis, NGX_HTTP_IDEM_SCRIPT_COMPLETE,
                                   7, IDEM_RECORD_KEY_LEN
                                   + NGX_HTTP_IDEM_TOKEN_HEX + sizeof(status)
                                   + ctx->headers.len + body + 1
                                   + sizeof(ttl), r->connection->log);
    if (cmd == NULL) {
        return NULL;
    }

    ngx_http_idem_cmd_arg(cmd, ctx->rkey, IDEM_RECORD_KEY_LEN);
    ngx_http_idem_cmd_arg(cmd, ctx->owner, NGX_HTTP_IDEM_TOKEN_HEX);
    p = ngx_sprintf(status, "%ui", ctx->status);
    ngx_http_idem_cmd_arg(cmd, status, p - status);
    ngx_http_idem_cmd_arg(cmd, ctx->headers.data, ctx->headers.len);

    p = ngx_http_idem_cmd_arg_reserve(cmd, body);
    for (cl = ctx->too_large ? NULL : ctx->body; cl; cl = cl->next) {
        p = ngx_cpymem(p, cl->buf->pos, cl->buf->last - cl->buf->pos);
    }

    ngx_http_idem_cmd_arg(cmd, ctx->too_large ? "0" : "1", 1);
    p = ngx_sprintf(ttl, "%T", lcf->ttl);
    ngx_http_idem_cmd_arg(cmd, ttl, p - ttl);

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
        cmd = ngx_http_idem_cmd_create(ctx->conf->redis,
                                       end == NGX_HTTP_IDEM_END_RELEASE
                                       ? NGX_HTTP_IDEM_SCRIPT_RELEASE
                                       : NGX_HTTP_IDEM_SCRIPT_FAIL,
                                       2, IDEM_RECORD_KEY_LEN
                                          + NGX_HTTP_IDEM_TOKEN_HEX,
                                       r->connection->log);
        if (cmd) {
            ngx_http_idem_cmd_arg(cmd, ctx->rkey, IDEM_RECORD_KEY_LEN);
            ngx_http_idem_cmd_arg(cmd, ctx->owner, NGX_HTTP_IDEM_TOKEN_HEX);
        }
    }

    if (cmd == NULL
        || ngx_http_idem_cmd_send(cmd, ngx_http_idem_closed, NULL) != NGX_OK)
    {
        ngx_log_error(NGX_LOG_ERR, r->connection->log, 0,
                      "idempotency: cannot close the record of key \"%V\"; "
                      "it turns unknown when its lease lapses", &ctx->key);
    }
}


/* lease renewal: a third of the lease, so two renewals may be lost */

static void
ngx_http_idem_renew_handler(ngx_event_t *ev)
{
    u_char                *p, lease[NGX_INT_T_LEN];
    ngx_http_request_t    *r;
    ngx_http_idem_cmd_t   *cmd;
    ngx_http_idem_ctx_t   *ctx;

    ctx = ev->data;
    r = ctx->request;

    if (ctx->end != NGX_HTTP_IDEM_END_NONE) {
        return;
    }

    cmd = ngx_http_idem_cmd_create(ctx->conf->redis,
                                   NGX_HTTP_IDEM_SCRIPT_RENEW, 3,
                                   IDEM_RECORD_KEY_LEN
                                   + NGX_HTTP_IDEM_TOKEN_HEX + sizeof(lease),
                                   r->connection->log);
    if (cmd) {
        ngx_http_idem_cmd_arg(cmd, ctx->rkey, IDEM_RECORD_KEY_LEN);
        ngx_http_idem_cmd_arg(cmd, ctx->owner, NGX_HTTP_IDEM_TOKEN_HEX);
        p = ngx_sprintf(lease, "%M", ctx->conf->lease);
        ngx_http_idem_cmd_arg(cmd, lease, p - lease);
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
