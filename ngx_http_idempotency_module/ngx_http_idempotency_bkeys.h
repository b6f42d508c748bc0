/*
 * idempotency_unique and idempotency_lock on a Redis Cluster: the business
 * keys are in other hash slots than the record, so they are taken in a
 * second step, each in its own slot, once the record is claimed
 * (docs/business-keys.md, "On a Redis Cluster").  One server and Sentinel
 * take them inside the claim script, and never come here.
 */

#ifndef NGX_HTTP_IDEMPOTENCY_BKEYS_H
#define NGX_HTTP_IDEMPOTENCY_BKEYS_H

#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>

#include "ngx_http_idempotency.h"


/*
 * What the claim lends this step (it calls the claim's file through these
 * only, so that the calls between the files stay acyclic): the answer of a
 * reply in claim.lua's words ("reused", "locked", "elsewhere"), and the
 * request's resumption with ctx->answer.
 */
typedef ngx_http_idem_answer_e (*ngx_http_idem_bkeys_answer_pt)(
    ngx_http_request_t *r, ngx_http_idem_ctx_t *ctx, redisReply *reply);
typedef void (*ngx_http_idem_bkeys_done_pt)(ngx_http_idem_ctx_t *ctx);

/*
 * Every key taken and the gate opened, before the request may run (and
 * before the opening is waited on the replicas): what the claim's parts
 * do then (the audit file's "sent").  NGX_ERROR: it must not run, with
 * ctx->answer; everything is given back.
 */
typedef ngx_int_t (*ngx_http_idem_bkeys_let_pt)(ngx_http_idem_ctx_t *ctx);

/*
 * After a claim was answered: NGX_OK when the request's business keys are
 * being taken on a cluster (done is called when that is decided, with
 * ctx->answer CLAIMED or the refusal); NGX_DECLINED when there is nothing
 * to take (not a cluster, no key, not claimed): the caller goes on.
 */
ngx_int_t ngx_http_idem_bkeys_start(ngx_http_idem_ctx_t *ctx,
    ngx_http_idem_bkeys_answer_pt answer, ngx_http_idem_bkeys_done_pt done,
    ngx_http_idem_bkeys_let_pt let);

/*
 * The request goes away: keys being taken are given back with the claim;
 * keys taken by an operation that completed live twice the TTL on.
 */
void ngx_http_idem_bkeys_cleanup(ngx_http_idem_ctx_t *ctx);

#endif /* NGX_HTTP_IDEMPOTENCY_BKEYS_H */
