/*
 * What ngx_http_idempotency_wait.c exports: idempotency_wait.
 */

#ifndef NGX_HTTP_IDEMPOTENCY_WAIT_H
#define NGX_HTTP_IDEMPOTENCY_WAIT_H

#include <ngx_config.h>
#include <ngx_core.h>
#include "ngx_http_idempotency.h"


ngx_int_t ngx_http_idem_wait(ngx_http_request_t *r,
    ngx_http_idem_ctx_t *ctx);
void ngx_http_idem_wait_stop(ngx_http_idem_ctx_t *ctx);

#endif /* NGX_HTTP_IDEMPOTENCY_WAIT_H */
