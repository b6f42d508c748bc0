/*
 * What ngx_http_idempotency_filter.c exports: capture of the upstream's
 * response, idempotency_release_statuses.
 */

#ifndef NGX_HTTP_IDEMPOTENCY_FILTER_H
#define NGX_HTTP_IDEMPOTENCY_FILTER_H

#include <ngx_config.h>
#include <ngx_core.h>
#include "ngx_http_idempotency.h"


ngx_int_t ngx_http_idem_filter_init(ngx_conf_t *cf);
char *ngx_http_idem_release_statuses(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf);
char *ngx_http_idem_release_merge(ngx_conf_t *cf,
    ngx_http_idem_loc_conf_t *prev, ngx_http_idem_loc_conf_t *conf);

#endif /* NGX_HTTP_IDEMPOTENCY_FILTER_H */
