/*
 * What ngx_http_idempotency_close.c exports: closing the record (complete,
 * release, fail), its lease, giving back a claim.
 */

#ifndef NGX_HTTP_IDEMPOTENCY_CLOSE_H
#define NGX_HTTP_IDEMPOTENCY_CLOSE_H

#include <ngx_config.h>
#include <ngx_core.h>
#include "ngx_http_idempotency.h"


void ngx_http_idem_start_lease(ngx_http_request_t *r,
    ngx_http_idem_ctx_t *ctx);
ngx_int_t ngx_http_idem_finish(ngx_http_request_t *r,
    ngx_http_idem_ctx_t *ctx, ngx_http_idem_end_e end);
void ngx_http_idem_abandon(ngx_http_request_t *r, ngx_http_idem_ctx_t *ctx);
void ngx_http_idem_give_back(ngx_http_idem_cmd_t *cmd, ngx_str_t *key,
    ngx_str_t *claim);

#endif /* NGX_HTTP_IDEMPOTENCY_CLOSE_H */
