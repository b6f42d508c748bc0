/*
 * What ngx_http_idempotency_reply.c exports: the module's own answers
 * (replays, problem+json), idempotency_conflict_status.
 */

#ifndef NGX_HTTP_IDEMPOTENCY_REPLY_H
#define NGX_HTTP_IDEMPOTENCY_REPLY_H

#include <ngx_config.h>
#include <ngx_core.h>
#include "ngx_http_idempotency.h"


ngx_int_t ngx_http_idem_send_answer(ngx_http_request_t *r,
    ngx_http_idem_ctx_t *ctx);
ngx_int_t ngx_http_idem_send_problem(ngx_http_request_t *r,
    ngx_http_idem_ctx_t *ctx, ngx_http_idem_problem_e problem,
    const char *detail);
ngx_int_t ngx_http_idem_problem_page(ngx_http_request_t *r,
    ngx_http_idem_problem_e problem, ngx_uint_t headers, ngx_str_t *text);
ngx_int_t ngx_http_idem_send_json(ngx_http_request_t *r, ngx_uint_t status,
    u_char *body, size_t len);
ngx_int_t ngx_http_idem_send_not_allowed(ngx_http_request_t *r,
    const char *allow);
u_char *ngx_http_idem_json_str(u_char *p, u_char *end, u_char *s,
    size_t len);
u_char *ngx_http_idem_json_time(u_char *p, u_char *end, long long ms);
char *ngx_http_idem_conflict_status(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf);

#endif /* NGX_HTTP_IDEMPOTENCY_REPLY_H */
