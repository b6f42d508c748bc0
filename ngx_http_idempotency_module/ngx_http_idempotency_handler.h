/*
 * What ngx_http_idempotency_handler.c exports: the phase handlers of the
 * request flow, idempotency_methods and what makes a location guarded.
 */

#ifndef NGX_HTTP_IDEMPOTENCY_HANDLER_H
#define NGX_HTTP_IDEMPOTENCY_HANDLER_H

#include <ngx_config.h>
#include <ngx_core.h>
#include "ngx_http_idempotency.h"


ngx_int_t ngx_http_idem_rewrite_handler(ngx_http_request_t *r);
ngx_int_t ngx_http_idem_precontent_handler(ngx_http_request_t *r);
ngx_int_t ngx_http_idem_log_handler(ngx_http_request_t *r);
char *ngx_http_idem_methods(ngx_conf_t *cf, ngx_command_t *cmd, void *conf);
char *ngx_http_idem_guard_merge(ngx_conf_t *cf,
    ngx_http_idem_loc_conf_t *prev, ngx_http_idem_loc_conf_t *conf);

#endif /* NGX_HTTP_IDEMPOTENCY_HANDLER_H */
