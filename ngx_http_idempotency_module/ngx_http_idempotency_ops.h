/*
 * What ngx_http_idempotency_ops.c exports: the status, admin and metrics
 * endpoints, their directives and those of the counters
 * (idempotency_metrics_zone, idempotency_metrics_label), and the
 * content-handler set-up that idempotency_approve and its page share.
 */

#ifndef NGX_HTTP_IDEMPOTENCY_OPS_H
#define NGX_HTTP_IDEMPOTENCY_OPS_H

#include <ngx_config.h>
#include <ngx_core.h>
#include "ngx_http_idempotency.h"


/* a content handler that needs Redis like "idempotency on" does */
char *ngx_http_idem_ops_location(ngx_conf_t *cf, ngx_http_handler_pt handler);

char *ngx_http_idem_status(ngx_conf_t *cf, ngx_command_t *cmd, void *conf);
char *ngx_http_idem_admin(ngx_conf_t *cf, ngx_command_t *cmd, void *conf);
char *ngx_http_idem_metrics_conf(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf);

/* idempotency_metrics_zone name size */
char *ngx_http_idem_metrics_zone_conf(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf);
char *ngx_http_idem_metrics_label(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf);

/* a later directive took the location from the module's content handler */
char *ngx_http_idem_check_content(ngx_conf_t *cf,
    ngx_http_idem_loc_conf_t *conf);

/* nginx's own 413 and 500 in an endpoint's location, as problems */
ngx_int_t ngx_http_idem_ops_filter_init(ngx_conf_t *cf);

ngx_int_t ngx_http_idem_status_handler(ngx_http_request_t *r);
ngx_int_t ngx_http_idem_admin_handler(ngx_http_request_t *r);
ngx_int_t ngx_http_idem_metrics_handler(ngx_http_request_t *r);

#endif /* NGX_HTTP_IDEMPOTENCY_OPS_H */
