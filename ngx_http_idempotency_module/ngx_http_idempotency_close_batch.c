/*
 * The completions of one turn of the event loop, when the audit stream is
 * their only device, go to Redis together at the end of the turn (a posted
 * event): one completes.lua and one stream entry for up to
 * NGX_HTTP_IDEM_AUDIT_BATCH of them (docs/audit.md, "Completions share an
 * entry").  Each completion is built as its complete.lua and kept here;
 * a completion alone in its turn is sent as that.  Each keeps its handler
 * and data, and hears the batch's answer as its own.
 */

#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_event.h>

#include "ngx_http_idempotency.h"
#include "ngx_http_idempotency_close_batch.h"
#include "ngx_http_idempotency_audit.h"
#include "ngx_http_idempotency_command.h"
#include "ngx_http_idempotency_redis.h"


/* waiting at most; one more sends them at once */
#define NGX_HTTP_IDEM_CLOSE_WAITING  (4 * NGX_HTTP_IDEM_AUDIT_BATCH)


typedef struct {
    ngx_uint_t            n;
    ngx_http_idem_cmd_t  *m[NGX_HTTP_IDEM_AUDIT_BATCH];
} ngx_http_idem_batch_t;


static void ngx_http_idem_close_batch_send(ngx_http_idem_cmd_t **m,
    ngx_uint_t n);


static ngx_http_idem_cmd_t  *ngx_http_idem_close_waiting[
                                 NGX_HTTP_IDEM_CLOSE_WAITING];
static ngx_uint_t            ngx_http_idem_close_nwaiting;
static ngx_event_t           ngx_http_idem_close_flush_ev;


/* a member hears the batch's answer as complete.lua's, then goes */
static void
ngx_http_idem_close_tell(ngx_http_idem_cmd_t *m, redisReply *reply)
{
    m->batched = 1;
    m->told = 1;

    if (m->handler) {
        m->handler(m, reply);
    }

    ngx_free(m);
}


/*
 * {"lost", i, ...}: those records' owners no longer hold them (complete.lua
 * would have answered 0) and nothing was written: the others go again,
 * with an entry of their events alone.
 */
static void
ngx_http_idem_close_lost(ngx_http_idem_batch_t *b, redisReply *reply)
{
    ngx_uint_t            i, j, k, lost;
    ngx_http_idem_cmd_t  *keep[NGX_HTTP_IDEM_AUDIT_BATCH];

    static redisReply     zero = { .type = REDIS_REPLY_INTEGER };

    k = 0;

    for (i = 0; i < b->n; i++) {
        lost = 0;

        for (j = 1; j < reply->elements; j++) {
            if (reply->element[j]->type == REDIS_REPLY_INTEGER
                && reply->element[j]->integer == (long long) i + 1)
            {
                lost = 1;
            }
        }

        if (lost) {
            ngx_http_idem_close_tell(b->m[i], &zero);

        } else {
            keep[k++] = b->m[i];
        }
    }

    if (k) {
        ngx_http_idem_close_batch_send(keep, k);
    }
}


static ngx_uint_t
ngx_http_idem_close_is_lost(redisReply *reply)
{
    return reply && ngx_http_idem_reply_tagged(reply, "lost")
           && reply->elements > 1;
}


static void
ngx_http_idem_close_batched(ngx_http_idem_cmd_t *cmd, redisReply *reply)
{
    ngx_int_t               rc;
    ngx_uint_t              i;
    ngx_http_idem_cmd_t    *next;
    ngx_http_idem_batch_t  *b;

    b = cmd->data;

    /* a lost race for the stream's head: a copy went, with b */
    rc = ngx_http_idem_audit_reply(cmd, &reply, &next);

    if (rc == NGX_AGAIN || rc == NGX_DECLINED || b == NULL) {
        return;
    }

    cmd->data = NULL;

    if (rc == NGX_ERROR) {
        reply = NULL;
    }

    if (ngx_http_idem_close_is_lost(reply)) {
        ngx_http_idem_close_lost(b, reply);

    } else {
        for (i = 0; i < b->n; i++) {
            ngx_http_idem_close_tell(b->m[i], reply);
        }
    }

    ngx_free(b);
}


/*
 * Kept for the next connection (Redis is down): nobody waits that long,
 * as for a completion sent alone (ngx_http_idem_finish()).
 */
static void
ngx_http_idem_close_unwait(ngx_http_idem_cmd_t *m)
{
    ngx_http_idem_ack_t  *ack;
    ngx_http_idem_ctx_t  *ctx;

    ack = m->data;

    if (ack == NULL || ack->ctx == NULL) {
        return;
    }

    ctx = ack->ctx;
    ack->ctx = NULL;
    ctx->ack = NULL;
    ctx->closed(ctx);
}


static void
ngx_http_idem_close_batch_send(ngx_http_idem_cmd_t **m, ngx_uint_t n)
{
    ngx_int_t               rc;
    ngx_uint_t              i;
    ngx_http_idem_cmd_t    *cmd;
    ngx_http_idem_batch_t  *b;

    cmd = ngx_http_idem_audit_batch(m, n);
    b = NULL;

    if (cmd && n == 1) {
        rc = ngx_http_idem_cmd_send(cmd, m[0]->handler, m[0]->data);

        if (rc == NGX_AGAIN) {
            ngx_http_idem_close_unwait(m[0]);
        }

        if (rc != NGX_ERROR) {
            ngx_free(m[0]);
            return;
        }

        /* ngx_http_idem_cmd_send() freed it */
        cmd = NULL;

    } else if (cmd) {
        b = ngx_alloc(sizeof(ngx_http_idem_batch_t), cmd->redis->log);
    }

    if (b) {
        b->n = n;
        ngx_memcpy(b->m, m, n * sizeof(ngx_http_idem_cmd_t *));

        rc = ngx_http_idem_cmd_send(cmd, ngx_http_idem_close_batched, b);

        for (i = 0; rc == NGX_AGAIN && i < n; i++) {
            ngx_http_idem_close_unwait(m[i]);
        }

        if (rc != NGX_ERROR) {
            return;
        }

        ngx_free(b);

    } else if (cmd) {
        ngx_free(cmd);
    }

    /* not sent: each is told as complete.lua's unanswered command */
    for (i = 0; i < n; i++) {
        ngx_http_idem_close_tell(m[i], NULL);
    }
}


/* the waiting completions, by stream, in order, NGX_HTTP_IDEM_AUDIT_BATCH at a time */
static void
ngx_http_idem_close_flush(ngx_event_t *ev)
{
    ngx_uint_t              i, j, n, total;
    ngx_http_idem_cmd_t    *all[NGX_HTTP_IDEM_CLOSE_WAITING];
    ngx_http_idem_cmd_t    *m[NGX_HTTP_IDEM_AUDIT_BATCH];
    ngx_http_idem_audit_t  *audit;

    total = ngx_http_idem_close_nwaiting;
    ngx_memcpy(all, ngx_http_idem_close_waiting,
               total * sizeof(ngx_http_idem_cmd_t *));
    ngx_http_idem_close_nwaiting = 0;

    for (i = 0; i < total; i++) {
        if (all[i] == NULL) {
            continue;
        }

        audit = ngx_http_idem_audit_of(all[i]);
        n = 0;

        for (j = i; j < total && n < NGX_HTTP_IDEM_AUDIT_BATCH; j++) {
            if (all[j] && ngx_http_idem_audit_of(all[j]) == audit) {
                m[n++] = all[j];
                all[j] = NULL;
            }
        }

        ngx_http_idem_close_batch_send(m, n);
    }
}


/*
 * Sends a closing command, or keeps a completion for the end of the turn
 * (NGX_OK: its answer reaches handler as if it had been sent now).
 */
ngx_int_t
ngx_http_idem_close_send(ngx_http_idem_cmd_t *cmd,
    ngx_http_idem_reply_pt handler, void *data)
{
    ngx_event_t  *ev;

    if (!ngx_http_idem_audit_deferred(cmd)) {
        return ngx_http_idem_cmd_send(cmd, handler, data);
    }

    ev = &ngx_http_idem_close_flush_ev;

    if (ngx_http_idem_close_nwaiting == NGX_HTTP_IDEM_CLOSE_WAITING) {
        if (ev->posted) {
            ngx_delete_posted_event(ev);
        }

        ngx_http_idem_close_flush(ev);
    }

    cmd->handler = handler;
    cmd->data = data;
    ngx_http_idem_close_waiting[ngx_http_idem_close_nwaiting++] = cmd;

    if (!ev->posted) {
        ev->handler = ngx_http_idem_close_flush;
        ev->log = ngx_cycle->log;
        ngx_post_event(ev, &ngx_posted_events);
    }

    return NGX_OK;
}
