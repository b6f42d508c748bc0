/*
 * What ngx_http_idempotency_claim_business.c exports: the part of
 * idempotency_unique and idempotency_lock in a claim.
 */

#ifndef NGX_HTTP_IDEMPOTENCY_CLAIM_BUSINESS_H
#define NGX_HTTP_IDEMPOTENCY_CLAIM_BUSINESS_H

#include <ngx_config.h>
#include <ngx_core.h>
#include "ngx_http_idempotency.h"


extern ngx_http_idem_claim_part_t  ngx_http_idem_claim_business;

/* another key's operation holds the business identity: its answer */
ngx_http_idem_answer_e ngx_http_idem_claim_reused(ngx_http_request_t *r,
    ngx_http_idem_ctx_t *ctx, idem_claim_t *c);

#endif /* NGX_HTTP_IDEMPOTENCY_CLAIM_BUSINESS_H */
