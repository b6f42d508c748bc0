/*
 * What ngx_http_idempotency_conf.c exports: the slot functions several
 * directives share, and the key-file loader.
 */

#ifndef NGX_HTTP_IDEMPOTENCY_CONF_H
#define NGX_HTTP_IDEMPOTENCY_CONF_H

#include <ngx_config.h>
#include <ngx_core.h>
#include "ngx_http_idempotency.h"


/* a key file read with the configuration; "directive" names it in errors */
idem_jws_key_t *ngx_http_idem_key_file(ngx_conf_t *cf, ngx_str_t *name,
    idem_jws_alg_e alg, const char *kid, const char *directive);

/* the words, lower-cased (store and fingerprinted headers, media types) */
char *ngx_http_idem_lowercase_list(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf);
/* a two-valued enum whose error names the directive and both values */
char *ngx_http_idem_enum(ngx_conf_t *cf, ngx_command_t *cmd, void *conf);
/* a complex value into a field that starts as NGX_CONF_UNSET_PTR */
char *ngx_http_idem_unset_cv_slot(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf);

#endif /* NGX_HTTP_IDEMPOTENCY_CONF_H */
