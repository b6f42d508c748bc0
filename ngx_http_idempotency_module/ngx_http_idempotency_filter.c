/*
 * Capture of the claimed request's final response: its status, the headers
 * to store and the body, in the header and body filters.  How the response
 * ends decides how the record is closed (_close.c).
 */

#include <ngx_config.h>
#include <ngx_core.h>
#include "ngx_http_idempotency.h"
#include "ngx_http_idempotency_filter.h"
#include "ngx_http_idempotency_audit.h"
#include "ngx_http_idempotency_close.h"
#include "ngx_http_idempotency_ctx.h"
#include "ngx_http_idempotency_replicas.h"


static ngx_http_output_header_filter_pt  ngx_http_next_header_filter;
static ngx_http_output_body_filter_pt    ngx_http_next_body_filter;

static void ngx_http_idem_hold_release(ngx_http_idem_ctx_t *ctx);


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
            p = ngx_pnalloc(r->pool, len);
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


/* NGX_OK: the response's end is to wait for the answer */
static ngx_int_t
ngx_http_idem_complete(ngx_http_request_t *r, ngx_http_idem_ctx_t *ctx)
{
    ctx->closed = ngx_http_idem_hold_release;

    return ngx_http_idem_finish(r, ctx, NGX_HTTP_IDEM_END_COMPLETE);
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
    ngx_http_idem_audit_capture_ref(r, ctx);

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
        /*
         * No body, but the last buffer follows and is held.  Not when
         * nginx itself makes a 204 or 304 without a status line: its
         * header filter then writes the end with the headers, past the
         * body filters (docs/directives.md).
         */
        (void) ngx_http_idem_complete(r, ctx);
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
    ctx->tail = cl;

    return NGX_OK;
}


/*
 * Holding the response's end until Redis has acknowledged the record: a
 * client that has read the whole response and retries at once then finds
 * it completed, never in progress.  What is held is the chain with the
 * last buffer (for a proxied response, the empty one nginx sends at the
 * end); everything before it has gone on.  The upstream's buffers in it
 * stay unconsumed, so nothing reuses them meanwhile.
 */

static void
ngx_http_idem_hold_release(ngx_http_idem_ctx_t *ctx)
{
    ngx_chain_t         *held;
    ngx_http_request_t  *r;

    r = ctx->request;

    if (ctx->ack) {
        ctx->ack->ctx = NULL;
        ctx->ack = NULL;
    }

    ngx_http_idem_replicas_cancel(&ctx->replicas);

    if (ctx->hold.timer_set) {
        ngx_del_timer(&ctx->hold);
    }

    held = ctx->held;

    if (held == NULL) {
        return;
    }

    ctx->held = NULL;
    r->buffered &= ~NGX_HTTP_IDEM_BUFFERED;

    (void) ngx_http_next_body_filter(r, held);

    /* nginx's writer sends the rest and finalizes the request */
    ngx_post_event(r->connection->write, &ngx_posted_events);
}


static void
ngx_http_idem_hold_timeout(ngx_event_t *ev)
{
    ngx_http_idem_ctx_t  *ctx = ev->data;

    ngx_log_error(NGX_LOG_WARN, ev->log, 0,
                  "idempotency: the record of key \"%V\" was not "
                  "acknowledged in time; the response is sent, and a retry "
                  "may find the record in progress",
                  ngx_http_idem_log_key(ctx));

    ngx_http_idem_hold_release(ctx);
}


static ngx_uint_t
ngx_http_idem_has_last(ngx_chain_t *in)
{
    for ( /* void */ ; in; in = in->next) {
        if (in->buf->last_buf) {
            return 1;
        }
    }

    return 0;
}


static ngx_int_t
ngx_http_idem_hold(ngx_http_request_t *r, ngx_http_idem_ctx_t *ctx,
    ngx_chain_t *in)
{
    ngx_int_t     rc;
    ngx_chain_t  *cl, **ll;

    for (ll = &ctx->held; *ll; ll = &(*ll)->next) { /* void */ }

    for ( /* void */ ; in; in = in->next) {
        cl = ngx_alloc_chain_link(r->pool);
        if (cl == NULL) {
            return NGX_ERROR;
        }

        cl->buf = in->buf;
        cl->next = NULL;
        *ll = cl;
        ll = &cl->next;
    }

    if (!ctx->hold.timer_set) {
        ctx->hold.handler = ngx_http_idem_hold_timeout;
        ctx->hold.data = ctx;
        ctx->hold.log = r->connection->log;
        ngx_add_timer(&ctx->hold, ctx->conf->redis->timeout
                                  + (ctx->conf->wait_replicas
                                     ? ctx->conf->wait_replicas_timeout : 0));
    }

    r->buffered |= NGX_HTTP_IDEM_BUFFERED;

    /* what went on before may still wait in the write filter */
    rc = ngx_http_next_body_filter(r, NULL);

    return rc == NGX_ERROR ? NGX_ERROR : NGX_AGAIN;
}


/*
 * The response's last bytes must not reach the client before the record
 * is stored, and with a Content-Length the client needs no last buffer to
 * know it has them.  So the last data of each chain is withheld until the
 * next chain comes (or the end, which is held): it is taken from the
 * producer's buffer (consumed, so that the buffer is free again: holding
 * on to it could stall a proxy_buffering off upstream) and sent from the
 * copy the record stores.  A body over idempotency_store_max has no such
 * copy; only its last buffer is held (docs/directives.md).
 */
static ngx_int_t
ngx_http_idem_withhold(ngx_http_request_t *r, ngx_http_idem_ctx_t *ctx,
    ngx_chain_t *in, ngx_uint_t last, ngx_chain_t **out)
{
    ngx_buf_t    *b;
    ngx_chain_t  *cl, *hide, *ln, **ll;

    hide = NULL;

    for (cl = in; cl && !last && !ctx->too_large && ctx->tail; cl = cl->next) {
        if (ngx_buf_in_memory(cl->buf) && ngx_buf_size(cl->buf) > 0) {
            hide = cl;
        }
    }

    ll = out;

    if (ctx->pending) {
        *ll = ctx->pending;
        ll = &ctx->pending->next;
        ctx->pending = NULL;
    }

    for (cl = in; cl; cl = cl->next) {
        if (cl == hide) {
            continue;
        }

        ln = ngx_alloc_chain_link(r->pool);
        if (ln == NULL) {
            return NGX_ERROR;
        }

        ln->buf = cl->buf;
        *ll = ln;
        ll = &ln->next;
    }

    *ll = NULL;

    if (hide == NULL) {
        return NGX_OK;
    }

    b = ngx_calloc_buf(r->pool);
    ln = ngx_alloc_chain_link(r->pool);
    if (b == NULL || ln == NULL) {
        return NGX_ERROR;
    }

    b->pos = ctx->tail->buf->pos;
    b->last = ctx->tail->buf->last;
    b->memory = 1;
    b->flush = hide->buf->flush;
    b->tag = (ngx_buf_tag_t) &ngx_http_idempotency_module;

    hide->buf->pos = hide->buf->last;

    ln->buf = b;
    ln->next = NULL;
    ctx->pending = ln;

    return NGX_OK;
}


/* while the record's answer is awaited or the end is held */
static ngx_int_t
ngx_http_idem_body_holding(ngx_http_request_t *r, ngx_http_idem_ctx_t *ctx,
    ngx_chain_t *in)
{
    ngx_int_t  rc;

    if (in && ngx_http_idem_has_last(in)) {
        return ngx_http_idem_hold(r, ctx, in);
    }

    rc = ngx_http_next_body_filter(r, in);

    if (ctx->held && rc != NGX_ERROR) {
        return NGX_AGAIN;
    }

    return rc;
}


static ngx_int_t
ngx_http_idem_body_filter(ngx_http_request_t *r, ngx_chain_t *in)
{
    ngx_uint_t            last;
    ngx_chain_t          *cl, *out;
    ngx_http_idem_ctx_t  *ctx;

    if (r != r->main) {
        return ngx_http_next_body_filter(r, in);
    }

    ctx = ngx_http_idem_get_ctx(r);

    if (ctx && (ctx->ack || ctx->held)) {
        return ngx_http_idem_body_holding(r, ctx, in);
    }

    if (ctx == NULL || in == NULL || !ctx->capturing
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

    if (ngx_http_idem_withhold(r, ctx, in, last, &out) != NGX_OK) {
        ngx_http_idem_finish(r, ctx, NGX_HTTP_IDEM_END_FAIL);
        return NGX_ERROR;
    }

    if (last) {
        if (ctx->content_length >= 0
            && (off_t) ctx->body_size != ctx->content_length)
        {
            /* a body shorter than announced is not a final response */
            ngx_http_idem_finish(r, ctx, NGX_HTTP_IDEM_END_FAIL);

        } else if (ngx_http_idem_complete(r, ctx) == NGX_OK) {
            return ngx_http_idem_hold(r, ctx, out);
        }
    }

    return ngx_http_next_body_filter(r, out);
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


/* 429 and 503 mean "not done, try later": the key is given back */
static ngx_array_t *
ngx_http_idem_default_releases(ngx_conf_t *cf)
{
    ngx_uint_t   *s;
    ngx_array_t  *a;

    a = ngx_array_create(cf->pool, 2, sizeof(ngx_uint_t));
    if (a == NULL) {
        return NULL;
    }

    s = ngx_array_push_n(a, 2);
    if (s == NULL) {
        return NULL;
    }

    s[0] = NGX_HTTP_TOO_MANY_REQUESTS;
    s[1] = NGX_HTTP_SERVICE_UNAVAILABLE;

    return a;
}


char *
ngx_http_idem_release_statuses(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf)
{
    ngx_http_idem_loc_conf_t  *lcf = conf;

    ngx_int_t    n;
    ngx_str_t   *value;
    ngx_uint_t   i, *s;

    if (lcf->release_statuses != NGX_CONF_UNSET_PTR) {
        return "is duplicate";
    }

    value = cf->args->elts;

    if (cf->args->nelts == 2 && ngx_strcmp(value[1].data, "off") == 0) {
        lcf->release_statuses = NULL;
        return NGX_CONF_OK;
    }

    lcf->release_statuses = ngx_array_create(cf->pool, cf->args->nelts - 1,
                                             sizeof(ngx_uint_t));
    if (lcf->release_statuses == NULL) {
        return NGX_CONF_ERROR;
    }

    for (i = 1; i < cf->args->nelts; i++) {
        n = ngx_atoi(value[i].data, value[i].len);

        if (n < 200 || n > 599) {
            ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                               "invalid status \"%V\" in \"%V\" directive, "
                               "it must be from 200 to 599 or \"off\"",
                               &value[i], &cmd->name);
            return NGX_CONF_ERROR;
        }

        s = ngx_array_push(lcf->release_statuses);
        if (s == NULL) {
            return NGX_CONF_ERROR;
        }

        *s = (ngx_uint_t) n;
    }

    return NGX_CONF_OK;
}


/* the release statuses are inherited as a whole, 429 and 503 by default */
char *
ngx_http_idem_release_merge(ngx_conf_t *cf, ngx_http_idem_loc_conf_t *prev,
    ngx_http_idem_loc_conf_t *conf)
{
    if (conf->release_statuses == NGX_CONF_UNSET_PTR) {
        if (prev->release_statuses == NGX_CONF_UNSET_PTR) {
            prev->release_statuses = ngx_http_idem_default_releases(cf);
            if (prev->release_statuses == NULL) {
                return NGX_CONF_ERROR;
            }
        }

        conf->release_statuses = prev->release_statuses;
    }

    return NGX_CONF_OK;
}
