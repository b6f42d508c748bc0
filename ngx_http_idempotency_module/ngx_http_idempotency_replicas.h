/*
 * What ngx_http_idempotency_replicas.c exports: WAIT on the link whose
 * reply is being handled (idempotency_redis_wait); part of the transport.
 */

#ifndef NGX_HTTP_IDEMPOTENCY_REPLICAS_H
#define NGX_HTTP_IDEMPOTENCY_REPLICAS_H

#include <ngx_config.h>
#include <ngx_core.h>
#include "ngx_http_idempotency_transport.h"


/*
 * Called from the handler of a write's reply: WAIT for that write (and
 * every earlier one of the connection) to reach the replicas; w's handler
 * is called once.  NGX_ERROR: not possible on this connection, nothing
 * will be called.
 */
ngx_int_t ngx_http_idem_replicas_wait(ngx_http_idem_redis_t *rd,
    ngx_http_idem_replicas_t *w, ngx_uint_t replicas, ngx_msec_t timeout);
void ngx_http_idem_replicas_cancel(ngx_http_idem_replicas_t *w);

#endif /* NGX_HTTP_IDEMPOTENCY_REPLICAS_H */
