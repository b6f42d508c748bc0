/*
 * What ngx_http_idempotency_ctx.c exports: the request context: create, find
 * after an internal redirect.
 */

#ifndef NGX_HTTP_IDEMPOTENCY_CTX_H
#define NGX_HTTP_IDEMPOTENCY_CTX_H

#include <ngx_config.h>
#include <ngx_core.h>
#include "ngx_http_idempotency.h"


ngx_http_idem_ctx_t *ngx_http_idem_get_ctx(ngx_http_request_t *r);
ngx_http_idem_ctx_t *ngx_http_idem_create_ctx(ngx_http_request_t *r);

#endif /* NGX_HTTP_IDEMPOTENCY_CTX_H */
