/*
 * idempotency_redis_wait: WAIT for the replicas, on the connection whose
 * reply is being handled, one WAIT in flight serving many writes.
 */

#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_event.h>

#include "ngx_http_idempotency_replicas.h"
#include "ngx_http_idempotency_command.h"
#include "ngx_http_idempotency_redis.h"


/*
 * WAIT blocks the connection in Redis until the replicas have every write
 * sent on it before, so a WAIT in flight serves every write whose reply
 * came before WAIT's: Redis ran those writes first.  Writes answered while
 * one is in flight join the last one sent, when it has their replica count
 * and timeout, instead of queueing a WAIT each, which would hold the
 * connection up to "timeout" per WAIT when a replica is gone.
 */
typedef struct {
    ngx_queue_t                  waiters;   /* ngx_http_idem_replicas_t */
    ngx_http_idem_link_t        *link;
    ngx_uint_t                   replicas;
    ngx_msec_t                   timeout;
} ngx_http_idem_wait_t;


static ngx_str_t  ngx_http_idem_wait_cmd = ngx_string("WAIT");

static void
ngx_http_idem_replicas_done(ngx_http_idem_cmd_t *cmd, redisReply *reply)
{
    ngx_int_t                  acked;
    ngx_queue_t               *q;
    ngx_http_idem_wait_t      *wt;
    ngx_http_idem_redis_t     *rd;
    ngx_http_idem_replicas_t  *w;

    rd = cmd->redis;
    wt = cmd->data;

    if (wt->link->wait_last == wt) {
        wt->link->wait_last = NULL;
    }

    acked = (reply && reply->type == REDIS_REPLY_INTEGER)
            ? (ngx_int_t) reply->integer : -1;

    if (reply && reply->type == REDIS_REPLY_ERROR) {
        ngx_log_error(NGX_LOG_ERR, rd->log, 0,
                      "idempotency: redis %V: WAIT failed: %*s",
                      &rd->name, (size_t) reply->len, reply->str);
    }

    /* a handler may write and wait again: that is another WAIT's */
    while (!ngx_queue_empty(&wt->waiters)) {
        q = ngx_queue_head(&wt->waiters);
        ngx_queue_remove(q);
        w = ngx_queue_data(q, ngx_http_idem_replicas_t, queue);
        w->linked = 0;
        w->handler(w, acked);
    }

    ngx_free(wt);
}


static ngx_http_idem_wait_t *
ngx_http_idem_replicas_send(ngx_http_idem_link_t *lk, ngx_uint_t replicas,
    ngx_msec_t timeout)
{
    ngx_http_idem_cmd_t    *cmd;
    ngx_http_idem_wait_t   *wt;
    ngx_http_idem_redis_t  *rd = lk->redis;

    wt = ngx_alloc(sizeof(ngx_http_idem_wait_t), rd->log);
    if (wt == NULL) {
        return NULL;
    }

    cmd = ngx_http_idem_cmd_pinned(lk, &ngx_http_idem_wait_cmd, 1, 2,
                                   2 * NGX_INT64_LEN);
    if (cmd == NULL) {
        ngx_free(wt);
        return NULL;
    }

    ngx_queue_init(&wt->waiters);
    wt->link = lk;
    wt->replicas = replicas;
    wt->timeout = timeout;

    ngx_http_idem_cmd_set_num(cmd, 0, (int64_t) replicas);
    ngx_http_idem_cmd_set_num(cmd, 1, (int64_t) timeout);

    /* Redis answers WAIT at "timeout": only a silent Redis times out here */
    cmd->timeout = timeout + rd->timeout;

    if (ngx_http_idem_cmd_send(cmd, ngx_http_idem_replicas_done, wt)
        != NGX_OK)
    {
        ngx_free(wt);
        return NULL;
    }

    lk->wait_last = wt;

    return wt;
}


ngx_int_t
ngx_http_idem_replicas_wait(ngx_http_idem_redis_t *rd,
    ngx_http_idem_replicas_t *w, ngx_uint_t replicas, ngx_msec_t timeout)
{
    ngx_http_idem_link_t  *lk;
    ngx_http_idem_wait_t  *wt;

    /*
     * WAIT counts the writes of the connection it is sent on: it goes on
     * the one whose reply is being handled, while that one is current.
     */
    lk = rd->replying;

    if (lk == NULL || lk->state != NGX_HTTP_IDEM_REDIS_READY) {
        return NGX_ERROR;
    }

    wt = lk->wait_last;

    if (wt == NULL || wt->replicas != replicas || wt->timeout != timeout) {
        wt = ngx_http_idem_replicas_send(lk, replicas, timeout);
        if (wt == NULL) {
            return NGX_ERROR;
        }
    }

    ngx_queue_insert_tail(&wt->waiters, &w->queue);
    w->linked = 1;

    return NGX_OK;
}


void
ngx_http_idem_replicas_cancel(ngx_http_idem_replicas_t *w)
{
    if (w->linked) {
        ngx_queue_remove(&w->queue);
        w->linked = 0;
    }
}
