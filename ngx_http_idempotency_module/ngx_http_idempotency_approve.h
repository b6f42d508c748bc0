/*
 * What ngx_http_idempotency_approve.c exports: idempotency_approve: the
 * approval endpoint.
 */

#ifndef NGX_HTTP_IDEMPOTENCY_APPROVE_H
#define NGX_HTTP_IDEMPOTENCY_APPROVE_H

#include <ngx_config.h>
#include <ngx_core.h>
#include "ngx_http_idempotency.h"


/* what a person decided, and who answers it (the JSON endpoint, the page) */
typedef struct ngx_http_idem_approval_s  ngx_http_idem_approval_t;

typedef ngx_int_t (*ngx_http_idem_decided_pt)(ngx_http_request_t *r,
    ngx_http_idem_ctx_t *ctx, idem_approve_kind_e kind, const char *state,
    long long at);

struct ngx_http_idem_approval_s {
    ngx_str_t                    op;
    ngx_str_t                    fp;
    ngx_str_t                    approver;
    ngx_int_t                    expires_in;    /* s; approve only */
    ngx_uint_t                   decline;
    ngx_uint_t                   once;          /* not if approved */
    ngx_http_idem_decided_pt     decided;
};

ngx_int_t ngx_http_idem_approve_record(ngx_http_request_t *r,
    ngx_http_idem_ctx_t *ctx, ngx_http_idem_approval_t *a);
ngx_int_t ngx_http_idem_approve_who(ngx_http_request_t *r,
    ngx_http_idem_loc_conf_t *conf, ngx_str_t *who);
ngx_int_t ngx_http_idem_same_site(ngx_http_request_t *r);
char *ngx_http_idem_approve_conf(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf);

#endif /* NGX_HTTP_IDEMPOTENCY_APPROVE_H */
