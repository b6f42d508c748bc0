/*
 * idempotency_wait: a duplicate that finds its key in progress waits for
 * the record to change (the subscriber wakes it), or for the owner's lease
 * to lapse, or for its own time to run out, and then claims again.
 */

#include <ngx_config.h>
#include <ngx_core.h>
#include "ngx_http_idempotency.h"
#include "ngx_http_idempotency_wait.h"
#include "ngx_http_idempotency_claim.h"
#include "ngx_http_idempotency_waiters.h"


/* how often a waiter looks again while Redis cannot be reached */
#define NGX_HTTP_IDEM_RECHECK     500


static ngx_uint_t
ngx_http_idem_wait_over(ngx_http_idem_ctx_t *ctx)
{
    return (ngx_msec_int_t) (ctx->wait_deadline - ngx_current_msec) <= 0;
}


/*
 * The record may have changed: claim again, which replays, executes (the
 * first attempt was released) or finds it still in progress.
 */
static void
ngx_http_idem_recheck(ngx_http_idem_ctx_t *ctx)
{
    if (ngx_http_idem_wait_over(ctx)) {
        ctx->wait_expired = 1;
    }

    if (ngx_http_idem_claim_send(ctx->request, ctx) == NGX_OK) {
        return;
    }

    if (!ctx->wait_expired) {
        /* Redis is away: keep waiting, and look again in a while */
        ctx->answer = NGX_HTTP_IDEM_ANS_NONE;
        ctx->phase = NGX_HTTP_IDEM_WAITING;

        if (!ctx->wait_timer.timer_set) {
            ngx_add_timer(&ctx->wait_timer,
                          ngx_min(ctx->wait_deadline - ngx_current_msec,
                                  NGX_HTTP_IDEM_RECHECK));
        }

        return;
    }

    ngx_http_idem_resume(ctx);
}


/*
 * The timer fires when the wait runs out, or when the owner's lease would
 * lapse: a live owner has renewed it by then, a dead one has not, and the
 * look at the record then turns it unknown instead of waiting in vain.
 */
static void
ngx_http_idem_wait_timeout(ngx_event_t *ev)
{
    ngx_http_idem_ctx_t  *ctx = ev->data;

    if (ctx->phase != NGX_HTTP_IDEM_WAITING) {
        /* a look at the record is on its way; its answer decides */
        if (ngx_http_idem_wait_over(ctx)) {
            ctx->wait_expired = 1;
        }

        return;
    }

    ngx_http_idem_recheck(ctx);
}


static void
ngx_http_idem_wait_wake(ngx_http_idem_waiter_t *w)
{
    ngx_http_idem_ctx_t  *ctx = w->data;

    if (ctx->phase == NGX_HTTP_IDEM_WAITING) {
        ngx_http_idem_recheck(ctx);
    }
}


static ngx_int_t
ngx_http_idem_wait_start(ngx_http_request_t *r, ngx_http_idem_ctx_t *ctx)
{
    ctx->waiter.key = ctx->rkey;
    ctx->waiter.wake = ngx_http_idem_wait_wake;
    ctx->waiter.data = ctx;

    if (ngx_http_idem_waiter_add(ctx->conf->redis, &ctx->waiter) != NGX_OK) {
        /* nobody would tell us about the completion */
        return NGX_DECLINED;
    }

    ctx->waiting = 1;
    ctx->wait_deadline = ngx_current_msec + ctx->conf->wait;
    ctx->wait_timer.handler = ngx_http_idem_wait_timeout;
    ctx->wait_timer.data = ctx;
    ctx->wait_timer.log = r->connection->log;

    return NGX_OK;
}


/*
 * NGX_DONE while the request waits for the first attempt to finish,
 * NGX_DECLINED when it cannot or may not wait any longer.
 */
ngx_int_t
ngx_http_idem_wait(ngx_http_request_t *r, ngx_http_idem_ctx_t *ctx)
{
    ngx_msec_t  left;

    if (ctx->conf->wait == 0 || ctx->wait_expired) {
        return NGX_DECLINED;
    }

    if (!ctx->waiting && ngx_http_idem_wait_start(r, ctx) != NGX_OK) {
        return NGX_DECLINED;
    }

    if (ngx_http_idem_wait_over(ctx)) {
        return NGX_DECLINED;
    }

    left = ctx->wait_deadline - ngx_current_msec;

    /* a little after the lease would lapse, so the owner's renewal is in */
    ngx_add_timer(&ctx->wait_timer, ngx_min(left, ctx->lease_left + 100));

    ctx->phase = NGX_HTTP_IDEM_WAITING;

    return NGX_DONE;
}


void
ngx_http_idem_wait_stop(ngx_http_idem_ctx_t *ctx)
{
    ngx_http_idem_waiter_remove(&ctx->waiter);

    if (ctx->wait_timer.timer_set) {
        ngx_del_timer(&ctx->wait_timer);
    }
}
