/*
 * idempotency_unique's and idempotency_lock's part in a claim: the unique
 * and lock keys (and the h key that names the lock) are claim.lua's
 * KEYS, so the first look is claim.lua's (SET NX cannot look at them); a
 * business identity held by another key's operation is that operation's
 * answer (a reuse), a lock held by another operation refuses the request,
 * an identity of another location is a conflict.
 */

#include <ngx_config.h>
#include <ngx_core.h>

#include "ngx_http_idempotency.h"
#include "ngx_http_idempotency_claim.h"
#include "ngx_http_idempotency_claim_business.h"
#include "ngx_http_idempotency_business.h"
#include "ngx_http_idempotency_command.h"


typedef char  ngx_http_idem_claim_keys_check[
    NGX_HTTP_IDEM_BUSINESS_KEYS <= NGX_HTTP_IDEM_CLAIM_KEYS ? 1 : -1];


static ngx_uint_t
ngx_http_idem_claim_business_scripted(ngx_http_idem_ctx_t *ctx)
{
    return ctx->ukey[0] || ctx->lkey[0];
}


/* the location tag, by which claim.lua tells an identity of another one */
static void
ngx_http_idem_claim_business_args(ngx_http_idem_ctx_t *ctx,
    ngx_http_idem_cmd_t *cmd)
{
    ngx_http_idem_cmd_set(cmd, NGX_HTTP_IDEM_CLAIM_LOC, ctx->conf->loc_tag,
                          ctx->ukey[0] ? ngx_strlen(ctx->conf->loc_tag) : 0);
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
    NULL,                                   /* look */
    ngx_http_idem_claim_business_scripted,  /* scripted */
    ngx_http_idem_business_args,            /* keys */
    NULL,                                   /* create */
    ngx_http_idem_claim_business_args,      /* args */
    NULL,                                   /* value */
    NULL,                                   /* reply */
    NULL,                                   /* parse */
    ngx_http_idem_claim_business_decoded,   /* decoded */
    NULL,                                   /* held */
    NULL,                                   /* answered */
    NULL                                    /* let */
};
