/*
 * What ngx_http_idempotency_page.c exports: idempotency_approve_page: the
 * approval page.
 */

#ifndef NGX_HTTP_IDEMPOTENCY_PAGE_H
#define NGX_HTTP_IDEMPOTENCY_PAGE_H

#include <ngx_config.h>
#include <ngx_core.h>
#include "ngx_http_idempotency.h"


char *ngx_http_idem_approve_page_conf(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf);

#endif /* NGX_HTTP_IDEMPOTENCY_PAGE_H */
