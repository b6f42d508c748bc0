/*
 * What ngx_http_idempotency_audit_file.c exports: idempotency_audit file=:
 * the file device.
 */

#ifndef NGX_HTTP_IDEMPOTENCY_AUDIT_FILE_H
#define NGX_HTTP_IDEMPOTENCY_AUDIT_FILE_H

#include <ngx_config.h>
#include <ngx_core.h>
#include "ngx_http_idempotency.h"


char *ngx_http_idem_audit_conf(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf);
char *ngx_http_idem_audit_file_merge(ngx_conf_t *cf,
    ngx_http_idem_audit_file_t *file, idem_jws_key_t *key, ngx_uint_t anchor);
ngx_int_t ngx_http_idem_audit_file_append(ngx_http_idem_audit_file_t *file,
    idem_audit_entry_t *e, ngx_uint_t n, ngx_log_t *log);
void ngx_http_idem_audit_file_later(ngx_http_idem_audit_file_t *file,
    idem_audit_entry_t *e, ngx_uint_t n, ngx_log_t *log);
ngx_int_t ngx_http_idem_audit_file_wait(ngx_http_idem_audit_file_t *file,
    idem_audit_entry_t *e, ngx_uint_t n, ngx_http_idem_audit_wait_t *w,
    ngx_log_t *log);
size_t ngx_http_idem_audit_file_packed(idem_audit_entry_t *e);
u_char *ngx_http_idem_audit_file_pack(u_char *p, idem_audit_entry_t *e);
ngx_int_t ngx_http_idem_audit_file_unpack(u_char *p, size_t len,
    idem_audit_entry_t *e);

#endif /* NGX_HTTP_IDEMPOTENCY_AUDIT_FILE_H */
