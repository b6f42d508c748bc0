/*
 * What ngx_http_idempotency_waiters.c exports: the waiters of records,
 * woken by the subscriber; part of the transport.
 */

#ifndef NGX_HTTP_IDEMPOTENCY_WAITERS_H
#define NGX_HTTP_IDEMPOTENCY_WAITERS_H

#include <ngx_config.h>
#include <ngx_core.h>
#include "ngx_http_idempotency_transport.h"


/*
 * NGX_DECLINED when nobody would hear about the record: no subscription.
 */
ngx_int_t ngx_http_idem_waiter_add(ngx_http_idem_redis_t *rd,
    ngx_http_idem_waiter_t *w);
void ngx_http_idem_waiter_remove(ngx_http_idem_waiter_t *w);

/* the subscriber heard of key's record; key NULL wakes every waiter */
void ngx_http_idem_waiters_wake(ngx_http_idem_redis_t *rd, const u_char *key);

#endif /* NGX_HTTP_IDEMPOTENCY_WAITERS_H */
