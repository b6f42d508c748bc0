/*
 * What ngx_http_idempotency_claim_audit.c exports: idempotency_audit's
 * part in a claim (the audited first look), and the entries of an answer
 * that changed no record.
 */

#ifndef NGX_HTTP_IDEMPOTENCY_CLAIM_AUDIT_H
#define NGX_HTTP_IDEMPOTENCY_CLAIM_AUDIT_H

#include <ngx_config.h>
#include <ngx_core.h>
#include "ngx_http_idempotency.h"


extern ngx_http_idem_claim_part_t  ngx_http_idem_claim_audit;

ngx_int_t ngx_http_idem_claim_audit_answer(ngx_http_request_t *r,
    ngx_http_idem_ctx_t *ctx);

#endif /* NGX_HTTP_IDEMPOTENCY_CLAIM_AUDIT_H */
