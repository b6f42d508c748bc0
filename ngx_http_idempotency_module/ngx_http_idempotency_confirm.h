/*
 * What ngx_http_idempotency_confirm.c exports: idempotency_confirm: its
 * directives, the approval check before the claim, the 428 answers.
 */

#ifndef NGX_HTTP_IDEMPOTENCY_CONFIRM_H
#define NGX_HTTP_IDEMPOTENCY_CONFIRM_H

#include <ngx_config.h>
#include <ngx_core.h>
#include "ngx_http_idempotency.h"


char *ngx_http_idem_confirm_conf(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf);
char *ngx_http_idem_confirm_key_conf(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf);
char *ngx_http_idem_confirm_show_conf(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf);
char *ngx_http_idem_confirm_merge(ngx_conf_t *cf,
    ngx_http_idem_loc_conf_t *prev, ngx_http_idem_loc_conf_t *conf);
ngx_int_t ngx_http_idem_confirm_proposal(ngx_http_request_t *r,
    ngx_http_idem_ctx_t *ctx);
ngx_int_t ngx_http_idem_confirm_check(ngx_http_request_t *r,
    ngx_http_idem_ctx_t *ctx);
ngx_int_t ngx_http_idem_confirm_send(ngx_http_request_t *r,
    ngx_http_idem_ctx_t *ctx);

#endif /* NGX_HTTP_IDEMPOTENCY_CONFIRM_H */
