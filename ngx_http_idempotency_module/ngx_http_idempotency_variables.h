/*
 * What ngx_http_idempotency_variables.c exports: the $idempotency_*
 * variables.
 */

#ifndef NGX_HTTP_IDEMPOTENCY_VARIABLES_H
#define NGX_HTTP_IDEMPOTENCY_VARIABLES_H

#include <ngx_config.h>
#include <ngx_core.h>
#include "ngx_http_idempotency.h"


ngx_int_t ngx_http_idem_add_variables(ngx_conf_t *cf);
extern ngx_str_t  ngx_http_idem_outcome_names[];   /* by outcome */

#endif /* NGX_HTTP_IDEMPOTENCY_VARIABLES_H */
