/*
 * What ngx_http_idempotency_proposal.c exports: a proposal by its operation
 * id.
 */

#ifndef NGX_HTTP_IDEMPOTENCY_PROPOSAL_H
#define NGX_HTTP_IDEMPOTENCY_PROPOSAL_H

#include <ngx_config.h>
#include <ngx_core.h>
#include "ngx_http_idempotency.h"


/* a proposal looked up by its operation id, and who is told */
typedef struct ngx_http_idem_lookup_s  ngx_http_idem_lookup_t;

typedef ngx_int_t (*ngx_http_idem_lookup_pt)(ngx_http_request_t *r,
    ngx_http_idem_ctx_t *ctx, ngx_http_idem_lookup_t *lk);

struct ngx_http_idem_lookup_s {
    ngx_str_t                    op;
    ngx_uint_t                   found;     /* the index holds it */
    ngx_str_t                    proposal;  /* its JSON; empty: not kept */
    ngx_str_t                    value;     /* its record's, copied */
    idem_value_t                 rec;       /* valid when has_rec */
    ngx_uint_t                   has_rec;   /* a record of this op */
    ngx_http_idem_problem_e      problem;   /* store down or error */
    ngx_uint_t                   failed;
    ngx_http_idem_lookup_pt      done;
};

ngx_int_t ngx_http_idem_lookup(ngx_http_request_t *r,
    ngx_http_idem_ctx_t *ctx, ngx_http_idem_lookup_t *lk);
ngx_int_t ngx_http_idem_op_arg(ngx_http_request_t *r, ngx_str_t *op);

#endif /* NGX_HTTP_IDEMPOTENCY_PROPOSAL_H */
