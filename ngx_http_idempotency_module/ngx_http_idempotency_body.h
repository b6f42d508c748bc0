/*
 * What ngx_http_idempotency_body.c exports: the body's part of the
 * fingerprint, idempotency_fingerprint_exclude and idempotency_thread_pool.
 */

#ifndef NGX_HTTP_IDEMPOTENCY_BODY_H
#define NGX_HTTP_IDEMPOTENCY_BODY_H

#include <ngx_config.h>
#include <ngx_core.h>
#include "ngx_http_idempotency.h"


ngx_int_t ngx_http_idem_body_fingerprint(ngx_http_request_t *r,
    ngx_http_idem_ctx_t *ctx, idem_fp_input_t *in);
char *ngx_http_idem_fp_exclude(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf);
char *ngx_http_idem_thread_pool(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf);
char *ngx_http_idem_thread_pool_merge(ngx_conf_t *cf,
    ngx_http_idem_loc_conf_t *prev, ngx_http_idem_loc_conf_t *conf);

#endif /* NGX_HTTP_IDEMPOTENCY_BODY_H */
