/*
 * The request context: made when a handled request is first seen, found
 * again after an internal redirect (which wipes r->ctx), and cleaned up
 * with the request's pool, which is where an unfinished claim is closed.
 */

#include <ngx_config.h>
#include <ngx_core.h>
#include "ngx_http_idempotency.h"
#include "ngx_http_idempotency_ctx.h"
#include "ngx_http_idempotency_close.h"
#include "ngx_http_idempotency_replicas.h"
#include "ngx_http_idempotency_wait.h"
#include "ngx_http_idempotency_bkeys.h"


static void
ngx_http_idem_cleanup(void *data)
{
    ngx_http_idem_ctx_t  *ctx = data;

    if (ctx->cmd) {
        /* the reply finds no request: a claim it made is given back */
        ctx->cmd->data = NULL;
        ctx->cmd = NULL;
    }

    if (ctx->ack) {
        /* a response's end held for its record's answer goes unsent */
        ctx->ack->ctx = NULL;
        ctx->ack = NULL;
    }

    if (ctx->hold.timer_set) {
        ngx_del_timer(&ctx->hold);
    }

    if (ctx->replicas.linked) {
        ngx_http_idem_replicas_cancel(&ctx->replicas);

        if (ctx->phase == NGX_HTTP_IDEM_CLAIMING) {
            /* a claim waiting for its replicas: nobody will use it */
            (void) ngx_http_idem_finish(ctx->request, ctx,
                                        NGX_HTTP_IDEM_END_RELEASE);
        }
    }

    if (ctx->audit_wait.linked) {
        ngx_http_idem_audit_wait_cancel(&ctx->audit_wait);

        /* a claim waiting for its lines in the audit file: nobody uses it */
        (void) ngx_http_idem_finish(ctx->request, ctx,
                                    NGX_HTTP_IDEM_END_RELEASE);
    }

    /* business keys being taken on a cluster: given back, with the claim */
    ngx_http_idem_bkeys_cleanup(ctx);

    ngx_http_idem_wait_stop(ctx);
    ngx_http_idem_abandon(ctx->request, ctx);
}


/*
 * Internal redirects (error_page, named locations) wipe r->ctx; the pool
 * cleanup still holds the context, so it is found again there.
 */
ngx_http_idem_ctx_t *
ngx_http_idem_get_ctx(ngx_http_request_t *r)
{
    ngx_pool_cleanup_t   *cln;
    ngx_http_idem_ctx_t  *ctx;

    ctx = ngx_http_get_module_ctx(r, ngx_http_idempotency_module);
    if (ctx) {
        return ctx;
    }

    for (cln = r->pool->cleanup; cln; cln = cln->next) {
        if (cln->handler == ngx_http_idem_cleanup) {
            ctx = cln->data;
            ngx_http_set_ctx(r, ctx, ngx_http_idempotency_module);
            return ctx;
        }
    }

    return NULL;
}


ngx_http_idem_ctx_t *
ngx_http_idem_create_ctx(ngx_http_request_t *r)
{
    ngx_pool_cleanup_t   *cln;
    ngx_http_idem_ctx_t  *ctx;

    ctx = ngx_pcalloc(r->pool, sizeof(ngx_http_idem_ctx_t));
    if (ctx == NULL) {
        return NULL;
    }

    cln = ngx_pool_cleanup_add(r->pool, 0);
    if (cln == NULL) {
        return NULL;
    }

    cln->handler = ngx_http_idem_cleanup;
    cln->data = ctx;

    ctx->request = r;
    ctx->route = r->uri;

    ngx_http_set_ctx(r, ctx, ngx_http_idempotency_module);

    return ctx;
}
