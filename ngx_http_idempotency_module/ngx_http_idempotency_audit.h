/*
 * What ngx_http_idempotency_audit.c exports: idempotency_audit: its
 * directives, a request's entries, the audit arguments of a script command.
 */

#ifndef NGX_HTTP_IDEMPOTENCY_AUDIT_H
#define NGX_HTTP_IDEMPOTENCY_AUDIT_H

#include <ngx_config.h>
#include <ngx_core.h>
#include "ngx_http_idempotency.h"


/* completions of one turn sent in one completes.lua at most */
#define NGX_HTTP_IDEM_AUDIT_BATCH  16


char *ngx_http_idem_audit_stream_conf(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf);
char *ngx_http_idem_audit_key_conf(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf);
char *ngx_http_idem_audit_ref_conf(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf);
char *ngx_http_idem_audit_merge(ngx_conf_t *cf,
    ngx_http_idem_loc_conf_t *prev, ngx_http_idem_loc_conf_t *conf);
void ngx_http_idem_audit_init_process(void);
ngx_int_t ngx_http_idem_audit_prepare(ngx_http_request_t *r,
    ngx_http_idem_ctx_t *ctx);
void ngx_http_idem_audit_capture_ref(ngx_http_request_t *r,
    ngx_http_idem_ctx_t *ctx);
void ngx_http_idem_audit_entry(ngx_http_idem_ctx_t *ctx,
    idem_audit_event_e event, ngx_uint_t status, idem_audit_entry_t *e);
ngx_int_t ngx_http_idem_audit_digest(ngx_pool_t *pool, ngx_chain_t *cl,
    ngx_str_t *body, idem_str_t *hex);
void ngx_http_idem_audit_stored_ref(ngx_http_idem_ctx_t *ctx,
    idem_audit_entry_t *e);
ngx_http_idem_cmd_t *ngx_http_idem_audit_cmd(ngx_http_idem_audit_t *audit,
    ngx_http_idem_script_e script, const u_char *key, u_char **keys,
    ngx_uint_t n, size_t size, ngx_str_t *expect, idem_audit_entry_t *e,
    ngx_uint_t nentries, ngx_log_t *log);
ngx_int_t ngx_http_idem_audit_reply(ngx_http_idem_cmd_t *cmd,
    redisReply **reply, ngx_http_idem_cmd_t **next);
ngx_int_t ngx_http_idem_audit_ctx_reply(ngx_http_idem_cmd_t *cmd,
    redisReply **reply, ngx_uint_t *appended);
ngx_uint_t ngx_http_idem_audit_entries(ngx_http_idem_cmd_t *cmd,
    idem_audit_entry_t *e, ngx_uint_t max);
ngx_http_idem_audit_t *ngx_http_idem_audit_of(ngx_http_idem_cmd_t *cmd);
ngx_uint_t ngx_http_idem_audit_deferred(ngx_http_idem_cmd_t *cmd);
ngx_http_idem_cmd_t *ngx_http_idem_audit_batch(ngx_http_idem_cmd_t **m,
    ngx_uint_t n);
ngx_int_t ngx_http_idem_audit_direct(ngx_http_idem_audit_t *audit,
    idem_audit_entry_t *e, ngx_uint_t n, ngx_log_t *log);
ngx_int_t ngx_http_idem_audit_direct_wait(ngx_http_idem_audit_t *audit,
    idem_audit_entry_t *e, ngx_uint_t n, ngx_http_idem_audit_wait_t *w,
    ngx_log_t *log);

#endif /* NGX_HTTP_IDEMPOTENCY_AUDIT_H */
