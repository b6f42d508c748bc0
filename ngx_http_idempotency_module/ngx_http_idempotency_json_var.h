/*
 * What ngx_http_idempotency_json_var.c exports: idempotency_json_var: body
 * members as variables, the body parsed once.
 */

#ifndef NGX_HTTP_IDEMPOTENCY_JSON_VAR_H
#define NGX_HTTP_IDEMPOTENCY_JSON_VAR_H

#include <ngx_config.h>
#include <ngx_core.h>
#include "ngx_http_idempotency.h"


char *ngx_http_idem_json_var(ngx_conf_t *cf, ngx_command_t *cmd, void *conf);
ngx_int_t ngx_http_idem_pointer_conf(ngx_conf_t *cf, ngx_str_t *directive,
    ngx_str_t *text, ngx_http_idem_pointer_t *ptr);
struct cJSON *ngx_http_idem_json_body(ngx_http_request_t *r,
    ngx_http_idem_ctx_t *ctx);
ngx_int_t ngx_http_idem_json_text(ngx_http_request_t *r,
    const struct cJSON *node, ngx_str_t *text);

#endif /* NGX_HTTP_IDEMPOTENCY_JSON_VAR_H */
