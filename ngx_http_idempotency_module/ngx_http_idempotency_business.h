/*
 * What ngx_http_idempotency_business.c exports: idempotency_unique and
 * idempotency_lock, and the names of a guarded location.
 */

#ifndef NGX_HTTP_IDEMPOTENCY_BUSINESS_H
#define NGX_HTTP_IDEMPOTENCY_BUSINESS_H

#include <ngx_config.h>
#include <ngx_core.h>
#include "ngx_http_idempotency.h"


char *ngx_http_idem_business_conf(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf);
ngx_int_t ngx_http_idem_business_keys(ngx_http_request_t *r,
    ngx_http_idem_ctx_t *ctx);

ngx_uint_t ngx_http_idem_business_args(ngx_http_idem_ctx_t *ctx,
    u_char **keys);
char *ngx_http_idem_guard_names(ngx_conf_t *cf,
    ngx_http_idem_loc_conf_t *conf);

#endif /* NGX_HTTP_IDEMPOTENCY_BUSINESS_H */
