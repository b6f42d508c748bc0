/*
 * The waiters of records: queued per server while its subscriber link is
 * subscribed, woken when a message names their record (or all of them when
 * a change may have been missed).
 */

#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_event.h>

#include "ngx_http_idempotency_waiters.h"


ngx_int_t
ngx_http_idem_waiter_add(ngx_http_idem_redis_t *rd, ngx_http_idem_waiter_t *w)
{
    if (!rd->sub.subscribed) {
        return NGX_DECLINED;
    }

    ngx_queue_insert_tail(&rd->waiters, &w->queue);
    w->linked = 1;

    return NGX_OK;
}


void
ngx_http_idem_waiter_remove(ngx_http_idem_waiter_t *w)
{
    if (w->linked) {
        ngx_queue_remove(&w->queue);
        w->linked = 0;
    }
}


void
ngx_http_idem_waiters_wake(ngx_http_idem_redis_t *rd, const u_char *key)
{
    ngx_queue_t             *q, *next;
    ngx_http_idem_waiter_t  *w;

    for (q = ngx_queue_head(&rd->waiters);
         q != ngx_queue_sentinel(&rd->waiters);
         q = next)
    {
        /* a woken waiter may finish, and leave the queue, at once */
        next = ngx_queue_next(q);
        w = ngx_queue_data(q, ngx_http_idem_waiter_t, queue);

        if (key == NULL
            || ngx_memcmp(w->key, key, IDEM_RECORD_KEY_LEN) == 0)
        {
            w->wake(w);
        }
    }
}
