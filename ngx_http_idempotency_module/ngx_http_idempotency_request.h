/*
 * What ngx_http_idempotency_request.c exports: what names the record and
 * enters its fingerprint (the key header, the scope, the record key, the
 * fingerprinted headers), a header looked up by name.
 */

#ifndef NGX_HTTP_IDEMPOTENCY_REQUEST_H
#define NGX_HTTP_IDEMPOTENCY_REQUEST_H

#include <ngx_config.h>
#include <ngx_core.h>
#include "ngx_http_idempotency.h"


ngx_int_t ngx_http_idem_parse_key(ngx_http_request_t *r,
    ngx_http_idem_ctx_t *ctx, ngx_str_t *name, const char **detail);
ngx_int_t ngx_http_idem_record_key(ngx_http_request_t *r,
    ngx_http_idem_ctx_t *ctx, ngx_str_t *scope);
ngx_int_t ngx_http_idem_fp_headers(ngx_http_request_t *r,
    ngx_http_idem_ctx_t *ctx, idem_fp_input_t *in);
u_char *ngx_http_idem_operation_key(ngx_pool_t *pool, ngx_str_t *op);
ngx_table_elt_t *ngx_http_idem_find_header(ngx_http_request_t *r,
    ngx_str_t *name, ngx_uint_t *count);
ngx_table_elt_t *ngx_http_idem_header_out(ngx_http_request_t *r,
    u_char *name, size_t len);
char *ngx_http_idem_check_fp_headers(ngx_conf_t *cf,
    ngx_http_idem_loc_conf_t *conf);

#endif /* NGX_HTTP_IDEMPOTENCY_REQUEST_H */
