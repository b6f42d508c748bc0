/*
 * What ngx_http_idempotency_claim_confirm.c exports: idempotency_confirm's
 * part in a claim (the proposal, its index; a recorded approval).
 */

#ifndef NGX_HTTP_IDEMPOTENCY_CLAIM_CONFIRM_H
#define NGX_HTTP_IDEMPOTENCY_CLAIM_CONFIRM_H

#include <ngx_config.h>
#include <ngx_core.h>
#include "ngx_http_idempotency.h"


extern ngx_http_idem_claim_part_t  ngx_http_idem_claim_confirm;

/* a recorded approval: the request is claimed as its approver's */
ngx_int_t ngx_http_idem_claim_approver(ngx_http_request_t *r,
    ngx_http_idem_ctx_t *ctx, const char *approver, size_t len);

#endif /* NGX_HTTP_IDEMPOTENCY_CLAIM_CONFIRM_H */
