/*
 * What ngx_http_idempotency_tokens.c exports: an attempt's operation id and
 * owner token, from a per-worker reserve of random bytes.
 */

#ifndef NGX_HTTP_IDEMPOTENCY_TOKENS_H
#define NGX_HTTP_IDEMPOTENCY_TOKENS_H

#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include "ngx_http_idempotency.h"


ngx_int_t ngx_http_idem_tokens(ngx_http_request_t *r,
    ngx_http_idem_ctx_t *ctx);
ngx_int_t ngx_http_idem_request_id(ngx_http_request_t *r,
    ngx_http_variable_value_t *vv);

#endif /* NGX_HTTP_IDEMPOTENCY_TOKENS_H */
