/*
 * What ngx_http_idempotency_claim.c exports: the claim and its answer.
 */

#ifndef NGX_HTTP_IDEMPOTENCY_CLAIM_H
#define NGX_HTTP_IDEMPOTENCY_CLAIM_H

#include <ngx_config.h>
#include <ngx_core.h>
#include "ngx_http_idempotency.h"


ngx_int_t ngx_http_idem_tokens(ngx_http_request_t *r,
    ngx_http_idem_ctx_t *ctx);
ngx_int_t ngx_http_idem_claim_send(ngx_http_request_t *r,
    ngx_http_idem_ctx_t *ctx);
void ngx_http_idem_resume(ngx_http_idem_ctx_t *ctx);
ngx_int_t ngx_http_idem_claim_audit_answer(ngx_http_request_t *r,
    ngx_http_idem_ctx_t *ctx);

#endif /* NGX_HTTP_IDEMPOTENCY_CLAIM_H */
