/*
 * hiredis' asynchronous API inside nginx's event loop: one connection per
 * worker and configured server (per node of a Redis Cluster, which a
 * topology's hooks name), pipelined, with nginx timers for the link set-up
 * and for each command (hiredis 0.14 has none), reconnect with backoff,
 * MOVED and ASK followed, and the queue of durable commands sent again
 * after a loss.
 */

#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_event.h>

#include "ngx_http_idempotency_redis.h"
#include "ngx_http_idempotency_command.h"
#include "ngx_http_idempotency_io.h"
#include "ngx_http_idempotency_metrics.h"
#include "ngx_http_idempotency_waiters.h"


static void ngx_http_idem_link_schedule(ngx_http_idem_link_t *lk);
static void ngx_http_idem_link_recycle_later(ngx_http_idem_link_t *lk);
static void ngx_http_idem_link_init(ngx_http_idem_link_t *lk,
    ngx_http_idem_redis_t *rd, ngx_uint_t subscriber);
static void ngx_http_idem_redis_reply(redisAsyncContext *ac, void *r,
    void *privdata);
static void ngx_http_idem_resend(ngx_http_idem_redis_t *rd);
static void ngx_http_idem_held_release(ngx_http_idem_redis_t *rd,
    ngx_uint_t located);


static const char *
ngx_http_idem_link_name(ngx_http_idem_link_t *lk)
{
    return lk->label;
}


static void
ngx_http_idem_link_down(ngx_http_idem_link_t *lk)
{
    lk->state = NGX_HTTP_IDEM_REDIS_DOWN;

    if (lk->counted) {
        lk->counted = 0;
        ngx_http_idem_metrics_redis_link(-1);
    }
}


/*
 * The link is usable once every set-up command has answered: until then
 * connect_timeout bounds it, so a server that accepts the connection and
 * never answers costs a request connect_timeout, not a command timeout.
 */
static void
ngx_http_idem_link_ready(ngx_http_idem_link_t *lk)
{
    ngx_http_idem_redis_t  *rd = lk->redis;

    if (lk->connect_timer.timer_set) {
        ngx_del_timer(&lk->connect_timer);
    }

    lk->state = NGX_HTTP_IDEM_REDIS_READY;
    lk->backoff = 0;

    if (!lk->subscriber && !lk->counted) {
        lk->counted = 1;
        ngx_http_idem_metrics_redis_link(1);
    }

    ngx_log_error(NGX_LOG_INFO, rd->log, 0,
                  "idempotency: connected to redis %V%s",
                  &rd->name, ngx_http_idem_link_name(lk));

    if (!lk->subscriber) {
        ngx_http_idem_resend(rd);
    }
}


static void
ngx_http_idem_link_on_connect(const redisAsyncContext *ac, int status)
{
    ngx_http_idem_link_t   *lk = ac->data;
    ngx_http_idem_redis_t  *rd = lk->redis;

    if (status == REDIS_OK) {
        return;             /* the set-up commands' answers decide */
    }

    if (lk->connect_timer.timer_set) {
        ngx_del_timer(&lk->connect_timer);
    }

    ngx_log_error(NGX_LOG_ERR, rd->log, 0,
                  "idempotency: connect to redis %V%s failed: %s",
                  &rd->name, ngx_http_idem_link_name(lk), ac->errstr);
    ngx_http_idem_metrics_redis_error(NGX_HTTP_IDEM_RERR_CONNECT);

    /* hiredis frees the context right after this callback */
    lk->io.ac = NULL;
    ngx_http_idem_link_down(lk);
    ngx_http_idem_link_schedule(lk);
}


static void
ngx_http_idem_link_on_disconnect(const redisAsyncContext *ac, int status)
{
    ngx_http_idem_link_t   *lk = ac->data;
    ngx_http_idem_redis_t  *rd = lk->redis;

    if (lk->io.ac == ac) {
        lk->io.ac = NULL;
    }

    if (lk->connect_timer.timer_set) {
        ngx_del_timer(&lk->connect_timer);
    }

    ngx_http_idem_link_down(lk);

    if (status != REDIS_OK && !rd->exiting) {
        ngx_log_error(NGX_LOG_ERR, rd->log, 0,
                      "idempotency: redis %V%s connection lost: %s",
                      &rd->name, ngx_http_idem_link_name(lk),
                      ac->errstr ? ac->errstr : "closed");
        ngx_http_idem_metrics_redis_error(NGX_HTTP_IDEM_RERR_LOST);
    }

    if (lk->subscriber && lk->subscribed) {
        lk->subscribed = 0;
        /* a change may be missed now: let every waiter look again */
        ngx_http_idem_waiters_wake(rd, NULL);
    }

    ngx_http_idem_link_schedule(lk);
}


static void
ngx_http_idem_link_handshake(redisAsyncContext *ac, void *r, void *privdata)
{
    redisReply            *reply = r;
    ngx_http_idem_link_t  *lk = ac->data;

    if (reply == NULL || lk->io.ac != ac) {
        return;             /* the context is being freed */
    }

    if (reply->type == REDIS_REPLY_ERROR) {
        ngx_log_error(NGX_LOG_ERR, lk->redis->log, 0,
                      "idempotency: redis %V%s: %s failed: %*s",
                      &lk->redis->name, ngx_http_idem_link_name(lk),
                      (char *) privdata, (size_t) reply->len, reply->str);

        ngx_http_idem_link_recycle_later(lk);
        return;
    }

    if (lk->handshake && --lk->handshake == 0 && !lk->subscriber
        && lk->state == NGX_HTTP_IDEM_REDIS_CONNECTING)
    {
        ngx_http_idem_link_ready(lk);
    }
}


/*
 * Every message names a record key; the waiters for that key look at the
 * record again.  The confirmation of the subscription itself makes the
 * link ready and wakes every waiter, since a change may have come while
 * there was no subscription.
 */
static void
ngx_http_idem_link_message(redisAsyncContext *ac, void *r, void *privdata)
{
    redisReply            *reply = r;
    ngx_http_idem_link_t  *lk = ac->data;

    ngx_str_t  type, key;

    if (reply == NULL || reply->type != REDIS_REPLY_ARRAY
        || reply->elements != 3
        || ngx_http_idem_reply_str(reply->element[0], &type) != NGX_OK)
    {
        return;
    }

    if (type.len == 9 && ngx_strncmp(type.data, "subscribe", 9) == 0) {
        lk->subscribed = 1;
        ngx_http_idem_link_ready(lk);
        ngx_http_idem_waiters_wake(lk->redis, NULL);
        return;
    }

    if (type.len == 7 && ngx_strncmp(type.data, "message", 7) == 0
        && ngx_http_idem_reply_str(reply->element[2], &key) == NGX_OK
        && key.len == IDEM_RECORD_KEY_LEN)
    {
        ngx_http_idem_waiters_wake(lk->redis, key.data);
    }
}


/*
 * A master that Sentinel named may have been demoted since (a stale
 * answer, or a failover between the answer and the connect): writing to a
 * replica would only earn READONLY, and an old master that has not heard
 * yet would lose the writes when it is turned into a replica.
 */
static void
ngx_http_idem_link_role(redisAsyncContext *ac, void *r, void *privdata)
{
    redisReply            *reply = r;
    ngx_http_idem_link_t  *lk = ac->data;

    ngx_str_t  role;

    if (reply == NULL || lk->io.ac != ac || reply->type == REDIS_REPLY_ERROR) {
        ngx_http_idem_link_handshake(ac, r, privdata);
        return;
    }

    if (reply->type == REDIS_REPLY_ARRAY && reply->elements > 0
        && ngx_http_idem_reply_str(reply->element[0], &role) == NGX_OK
        && role.len == 6 && ngx_strncmp(role.data, "master", 6) == 0)
    {
        ngx_http_idem_link_handshake(ac, r, privdata);
        return;
    }

    ngx_log_error(NGX_LOG_WARN, lk->redis->log, 0,
                  "idempotency: redis %V at %V:%d%s is not a master, "
                  "asking the sentinels again",
                  &lk->redis->name, &lk->redis->host, lk->redis->port,
                  ngx_http_idem_link_name(lk));

    ngx_http_idem_link_recycle_later(lk);
}


static void
ngx_http_idem_link_setup(ngx_http_idem_link_t *lk, redisCallbackFn *fn,
    void *what, const char *format, ...)
{
    va_list  ap;

    va_start(ap, format);

    if (redisvAsyncCommand(lk->io.ac, fn, what, format, ap) == REDIS_OK
        && fn != ngx_http_idem_link_message)
    {
        lk->handshake++;
    }

    va_end(ap);
}


static void
ngx_http_idem_link_handshake_send(ngx_http_idem_link_t *lk)
{
    char                     db[NGX_INT_T_LEN + 1];
    ngx_uint_t               i;
    ngx_http_idem_redis_t   *rd = lk->redis;
    ngx_http_idem_script_t  *s;

    lk->handshake = 0;

    if (rd->password.len && rd->user.len) {
        ngx_http_idem_link_setup(lk, ngx_http_idem_link_handshake, "AUTH",
                                 "AUTH %b %b", rd->user.data, rd->user.len,
                                 rd->password.data, rd->password.len);

    } else if (rd->password.len) {
        ngx_http_idem_link_setup(lk, ngx_http_idem_link_handshake, "AUTH",
                                 "AUTH %b", rd->password.data,
                                 rd->password.len);
    }

    /* a Cluster's nodes redirect what is not theirs: no ROLE there */
    if (rd->topology == NGX_HTTP_IDEM_TOPO_SENTINEL) {
        ngx_http_idem_link_setup(lk, ngx_http_idem_link_role, "ROLE", "ROLE");
    }

    if (lk->subscriber) {
        /* channels are not per database: no SELECT */
        ngx_http_idem_link_setup(lk, ngx_http_idem_link_message, NULL,
                                 "SUBSCRIBE " IDEM_CHANNEL);
        return;
    }

    if (rd->db) {
        *ngx_sprintf((u_char *) db, "%i", rd->db) = '\0';
        ngx_http_idem_link_setup(lk, ngx_http_idem_link_handshake, "SELECT",
                                 "SELECT %s", db);
    }

    for (i = 0; i < NGX_HTTP_IDEM_NSCRIPTS; i++) {
        s = &rd->scripts[i];
        ngx_http_idem_link_setup(lk, ngx_http_idem_link_handshake,
                                 "SCRIPT LOAD", "SCRIPT LOAD %b",
                                 s->text.data, s->text.len);
    }
}


/* an event of the link's connection could not be added */
static void
ngx_http_idem_link_failed(ngx_http_idem_io_t *io)
{
    ngx_http_idem_link_recycle_later(io->data);
}


static ngx_int_t
ngx_http_idem_link_attach(ngx_http_idem_link_t *lk, redisAsyncContext *ac)
{
    if (ngx_http_idem_io_attach(&lk->io, ac, lk->redis->log, lk,
                                ngx_http_idem_link_on_connect,
                                ngx_http_idem_link_on_disconnect)
        != NGX_OK)
    {
        return NGX_ERROR;
    }

    lk->io.failed = ngx_http_idem_link_failed;

    return NGX_OK;
}


static redisAsyncContext *
ngx_http_idem_link_context(ngx_http_idem_link_t *lk)
{
    ngx_http_idem_redis_t  *rd = lk->redis;

    if (lk->node) {
        return redisAsyncConnect((char *) lk->host, lk->port);
    }

    if (rd->port) {
        return redisAsyncConnect((char *) rd->host.data, rd->port);
    }

    return redisAsyncConnectUnix((char *) rd->host.data);
}


static void
ngx_http_idem_link_connect(ngx_http_idem_link_t *lk)
{
    redisAsyncContext      *ac;
    ngx_http_idem_redis_t  *rd = lk->redis;

    /*
     * Every loss of a located server asks where the master is now (in a
     * Cluster: where the subscriber goes); a node's link has its address.
     * Until the answer, a Sentinel's commands wait for it (a Cluster's are
     * routed by slot instead).
     */
    if (rd->topology != NGX_HTTP_IDEM_TOPO_SINGLE && lk->gen == rd->gen && !lk->node) {
        rd->locating = (rd->topology == NGX_HTTP_IDEM_TOPO_SENTINEL);
        rd->locate(rd);
        return;
    }

    lk->gen = rd->gen;

    ac = ngx_http_idem_link_context(lk);

    if (ac == NULL) {
        ngx_log_error(NGX_LOG_ALERT, rd->log, 0,
                      "idempotency: cannot allocate a redis context");
        ngx_http_idem_link_schedule(lk);
        return;
    }

    if (ac->err) {
        ngx_log_error(NGX_LOG_ERR, rd->log, 0,
                      "idempotency: connect to redis %V%s failed: %s",
                      &rd->name, ngx_http_idem_link_name(lk), ac->errstr);
        ngx_http_idem_metrics_redis_error(NGX_HTTP_IDEM_RERR_CONNECT);
        redisAsyncFree(ac);
        ngx_http_idem_link_schedule(lk);
        return;
    }

    if (ngx_http_idem_link_attach(lk, ac) != NGX_OK) {
        redisAsyncFree(ac);
        ngx_http_idem_link_schedule(lk);
        return;
    }

    lk->state = NGX_HTTP_IDEM_REDIS_CONNECTING;

    /* the whole set-up: TCP, AUTH, SELECT, SCRIPT LOAD or SUBSCRIBE */
    ngx_add_timer(&lk->connect_timer, rd->connect_timeout);

    ngx_http_idem_link_handshake_send(lk);

    ngx_http_idem_io_connect(&lk->io);
}


static void
ngx_http_idem_link_schedule(ngx_http_idem_link_t *lk)
{
    if (lk->redis->exiting || lk->stopped || lk->reconnect.timer_set) {
        return;
    }

    /* a Cluster node lost: its slots may be failing over */
    if (lk->node) {
        lk->redis->locate(lk->redis);
    }

    lk->backoff = ngx_http_idem_backoff_step(lk->backoff);

    /*
     * A given-back claim that Redis runs late exists, as in_progress, until
     * its give-back (queued here) reaches Redis: retrying soon keeps that
     * window short after a stall.  One connection attempt per worker every
     * 75-100 ms is little load for a Redis that is not there.
     */
    if (!lk->subscriber && lk->redis->resend_n) {
        lk->backoff = NGX_HTTP_IDEM_BACKOFF_MIN;
    }

    ngx_add_timer(&lk->reconnect, ngx_http_idem_backoff_jitter(lk->backoff));
}


static void
ngx_http_idem_link_reconnect_handler(ngx_event_t *ev)
{
    ngx_http_idem_link_t  *lk = ev->data;

    if (lk->io.ac == NULL && !lk->redis->exiting && !lk->stopped) {
        ngx_http_idem_link_connect(lk);
    }
}


/*
 * Freeing a context from inside one of its callbacks is not allowed, and
 * most recycles are decided there, so they run as a posted event.
 */
static void
ngx_http_idem_link_recycle_later(ngx_http_idem_link_t *lk)
{
    if (lk->io.ac == NULL) {
        return;
    }

    ngx_http_idem_link_down(lk);
    lk->recycle_ac = lk->io.ac;

    if (!lk->recycle.posted) {
        ngx_post_event(&lk->recycle, &ngx_posted_events);
    }
}


static void
ngx_http_idem_link_recycle_handler(ngx_event_t *ev)
{
    ngx_http_idem_link_t  *lk = ev->data;

    redisAsyncContext  *ac;

    ac = lk->io.ac;

    if (ac == NULL || ac != lk->recycle_ac) {
        return;
    }

    lk->io.ac = NULL;
    lk->recycle_ac = NULL;
    ngx_http_idem_link_down(lk);

    if (lk->connect_timer.timer_set) {
        ngx_del_timer(&lk->connect_timer);
    }

    ngx_log_error((lk->stopped ? NGX_LOG_NOTICE : NGX_LOG_WARN),
                  lk->redis->log, 0,
                  "idempotency: closing redis %V%s connection%s",
                  &lk->redis->name, ngx_http_idem_link_name(lk),
                  lk->stopped ? ": the node left the slot map" : "");

    /* fails every pending command (NULL replies), then closes the fd */
    redisAsyncFree(ac);

    ngx_http_idem_link_schedule(lk);
}


static void
ngx_http_idem_link_connect_timeout(ngx_event_t *ev)
{
    ngx_http_idem_link_t  *lk = ev->data;

    ngx_log_error(NGX_LOG_ERR, lk->redis->log, 0,
                  "idempotency: connect to redis %V%s timed out "
                  "(connect_timeout, including AUTH, SELECT and scripts)",
                  &lk->redis->name, ngx_http_idem_link_name(lk));
    ngx_http_idem_metrics_redis_error(NGX_HTTP_IDEM_RERR_CONNECT);

    ngx_http_idem_link_recycle_later(lk);
}


static void
ngx_http_idem_event_init(ngx_event_t *ev, ngx_event_handler_pt handler,
    void *data, ngx_log_t *log, ngx_uint_t cancelable)
{
    ngx_memzero(ev, sizeof(ngx_event_t));
    ev->handler = handler;
    ev->data = data;
    ev->log = log;
    ev->cancelable = cancelable;
}


static void
ngx_http_idem_link_init(ngx_http_idem_link_t *lk, ngx_http_idem_redis_t *rd,
    ngx_uint_t subscriber)
{
    lk->redis = rd;
    lk->subscriber = subscriber;

    if (lk->label == NULL) {
        lk->label = subscriber ? " (subscriber)" : "";
    }

    ngx_http_idem_event_init(&lk->reconnect,
                             ngx_http_idem_link_reconnect_handler,
                             lk, rd->log, 1);
    ngx_http_idem_event_init(&lk->connect_timer,
                             ngx_http_idem_link_connect_timeout,
                             lk, rd->log, 1);
    ngx_http_idem_event_init(&lk->recycle,
                             ngx_http_idem_link_recycle_handler,
                             lk, rd->log, 1);

    ngx_http_idem_link_connect(lk);
}


void
ngx_http_idem_link_close(ngx_http_idem_link_t *lk)
{
    redisAsyncContext  *ac;

    if (lk->redis == NULL) {
        return;                        /* never started */
    }

    if (lk->reconnect.timer_set) {
        ngx_del_timer(&lk->reconnect);
    }

    if (lk->connect_timer.timer_set) {
        ngx_del_timer(&lk->connect_timer);
    }

    if (lk->recycle.posted) {
        ngx_delete_posted_event(&lk->recycle);
    }

    ac = lk->io.ac;
    lk->io.ac = NULL;

    if (ac) {
        redisAsyncFree(ac);
    }
}


void
ngx_http_idem_link_open(ngx_http_idem_link_t *lk, ngx_http_idem_redis_t *rd,
    u_char *host, int port, const char *label)
{
    if (rd->exiting) {
        return;
    }

    lk->node = 1;
    lk->host = host;
    lk->port = port;
    lk->label = label;

    if (lk->redis == NULL) {
        ngx_http_idem_link_init(lk, rd, 0);
        return;
    }

    if (!lk->stopped) {
        return;
    }

    /* a stop whose connection is still to be freed: that reconnects */
    lk->stopped = 0;
    lk->backoff = 0;

    if (lk->io.ac == NULL && !lk->reconnect.timer_set) {
        ngx_http_idem_link_connect(lk);
    }
}


/*
 * Its node left the map: commands in flight there get their answer (or a
 * MOVED that the map already follows) until the posted close fails the
 * rest, which are routed again.
 */
void
ngx_http_idem_link_stop(ngx_http_idem_link_t *lk)
{
    if (lk->redis == NULL || lk->stopped) {
        return;
    }

    lk->stopped = 1;

    if (lk->reconnect.timer_set) {
        ngx_del_timer(&lk->reconnect);
    }

    ngx_http_idem_link_recycle_later(lk);
}


static void
ngx_http_idem_link_follow(ngx_http_idem_link_t *lk, ngx_uint_t moved)
{
    if (lk->redis == NULL) {
        return;                        /* no such link in this worker */
    }

    if (lk->io.ac) {
        if (moved) {
            ngx_http_idem_link_recycle_later(lk);

        } else {
            lk->gen = lk->redis->gen;
        }

        return;
    }

    if (lk->reconnect.timer_set) {
        ngx_del_timer(&lk->reconnect);
    }

    ngx_http_idem_link_connect(lk);
}


void
ngx_http_idem_redis_located(ngx_http_idem_redis_t *rd, ngx_str_t *host,
    ngx_int_t port)
{
    ngx_uint_t  moved;

    if (rd->exiting) {
        return;
    }

    rd->locating = 0;

    if (host == NULL) {
        if (rd->cmd.redis && rd->cmd.io.ac == NULL) {
            ngx_http_idem_link_schedule(&rd->cmd);
        }

        if (rd->sub.redis && rd->sub.io.ac == NULL) {
            ngx_http_idem_link_schedule(&rd->sub);
        }

        ngx_http_idem_held_release(rd, 0);
        return;
    }

    moved = (rd->port != port || rd->host.len != host->len
             || ngx_strncmp(rd->host.data, host->data, host->len) != 0);

    if (moved) {
        ngx_log_error(NGX_LOG_NOTICE, rd->log, 0,
                      "idempotency: redis %V: %s at %V:%i", &rd->name,
                      rd->topology == NGX_HTTP_IDEM_TOPO_CLUSTER ? "subscriber" : "master",
                      host, port);
    }

    rd->host.len = ngx_min(host->len, NGX_SOCKADDR_STRLEN);
    rd->host.data = rd->addr;
    *ngx_cpymem(rd->addr, host->data, rd->host.len) = '\0';
    rd->port = (int) port;
    rd->gen++;

    ngx_http_idem_link_follow(&rd->cmd, moved);
    ngx_http_idem_link_follow(&rd->sub, moved);

    /* a Cluster's new slot map: what waited for a node may go now */
    if (rd->topology == NGX_HTTP_IDEM_TOPO_CLUSTER) {
        ngx_http_idem_resend(rd);
    }

    /* onto the link now connecting, behind its set-up commands */
    ngx_http_idem_held_release(rd, 1);
}


ngx_int_t
ngx_http_idem_redis_init_process(ngx_cycle_t *cycle, ngx_array_t *servers,
    ngx_http_idem_script_t *scripts)
{
    ngx_uint_t               i;
    ngx_http_idem_redis_t  **rds, *rd;

    rds = servers->elts;

    for (i = 0; i < servers->nelts; i++) {
        rd = rds[i];
        rd->log = cycle->log;
        rd->scripts = scripts;
        ngx_queue_init(&rd->waiters);
        ngx_queue_init(&rd->resend);
        ngx_queue_init(&rd->held);

        /* a Cluster's command links are its nodes' */
        if (rd->topology != NGX_HTTP_IDEM_TOPO_CLUSTER) {
            ngx_http_idem_link_init(&rd->cmd, rd, 0);
        }

        if (rd->subscribe) {
            ngx_http_idem_link_init(&rd->sub, rd, 1);
        }
    }

    return NGX_OK;
}


void
ngx_http_idem_redis_exit_process(ngx_array_t *servers)
{
    ngx_uint_t               i;
    ngx_queue_t             *q;
    ngx_http_idem_redis_t  **rds, *rd;

    rds = servers->elts;

    for (i = 0; i < servers->nelts; i++) {
        rd = rds[i];
        rd->exiting = 1;

        ngx_http_idem_link_close(&rd->cmd);
        ngx_http_idem_link_close(&rd->sub);
        ngx_http_idem_held_release(rd, 0);

        if (rd->resend_n) {
            ngx_log_error(NGX_LOG_WARN, rd->log, 0,
                          "idempotency: %ui results not recorded in redis "
                          "%V at exit; those records turn unknown",
                          rd->resend_n, &rd->name);
        }

        while (rd->resend.next && !ngx_queue_empty(&rd->resend)) {
            q = ngx_queue_head(&rd->resend);
            ngx_queue_remove(q);
            ngx_free(ngx_queue_data(q, ngx_http_idem_cmd_t, queue));
        }
    }
}


ngx_int_t
ngx_http_idem_announce(ngx_http_idem_redis_t *rd, const u_char *key,
    ngx_log_t *log)
{
    ngx_http_idem_cmd_t  *cmd;

    static ngx_str_t      publish = ngx_string("PUBLISH");

    cmd = ngx_http_idem_cmd_native(rd, &publish, 1, key, 0, log);
    if (cmd == NULL) {
        return NGX_ERROR;
    }

    /* the channel first; the key still routes it (a Cluster broadcasts) */
    cmd->argv[1] = IDEM_CHANNEL;
    cmd->argvlen[1] = sizeof(IDEM_CHANNEL) - 1;
    cmd->argv[2] = (const char *) cmd->key;
    cmd->argvlen[2] = IDEM_RECORD_KEY_LEN;

    return ngx_http_idem_cmd_send(cmd, NULL, NULL);
}


/*
 * Where a command goes: the server's link, or in a Cluster the link of
 * the node that serves its key's slot (none while nobody can say); a
 * pinned command (WAIT, CLUSTER SLOTS) goes on its own link only.
 */
static ngx_http_idem_link_t *
ngx_http_idem_cmd_route(ngx_http_idem_cmd_t *cmd)
{
    ngx_http_idem_redis_t  *rd = cmd->redis;

    if (cmd->pinned) {
        return cmd->link;
    }

    if (rd->topology != NGX_HTTP_IDEM_TOPO_CLUSTER) {
        return &rd->cmd;
    }

    return cmd->key ? rd->route(rd, cmd->key) : NULL;
}


/*
 * Keeps a durable command for the next connection (in a Cluster: for the
 * next link that comes up or the next slot map); NGX_DECLINED: full.  lk
 * is the link it could not go on, if any.
 */
static ngx_int_t
ngx_http_idem_resend_later(ngx_http_idem_cmd_t *cmd, ngx_http_idem_link_t *lk)
{
    ngx_http_idem_redis_t  *rd;

    rd = cmd->redis;

    if (!cmd->durable || rd->exiting) {
        return NGX_DECLINED;
    }

    if (rd->resend_n >= NGX_HTTP_IDEM_RESEND_MAX
        || rd->resend_size + cmd->size > NGX_HTTP_IDEM_RESEND_BYTES)
    {
        ngx_log_error(NGX_LOG_WARN, rd->log, 0,
                      "idempotency: too many unrecorded results kept for "
                      "redis %V, one record turns unknown when its lease "
                      "lapses", &rd->name);
        return NGX_DECLINED;
    }

    rd->resend_n++;
    rd->resend_size += cmd->size;
    ngx_queue_insert_tail(&rd->resend, &cmd->queue);

    /* a reconnect already scheduled with a long backoff comes sooner */
    if (lk && lk->redis && lk->reconnect.timer_set
        && lk->backoff > NGX_HTTP_IDEM_BACKOFF_MIN)
    {
        ngx_del_timer(&lk->reconnect);
        lk->backoff = 0;
        ngx_http_idem_link_schedule(lk);
    }

    return NGX_OK;
}


static void
ngx_http_idem_resend(ngx_http_idem_redis_t *rd)
{
    ngx_uint_t            n;
    ngx_queue_t           queue, *q;
    ngx_http_idem_cmd_t  *cmd;

    if (rd->resend_n == 0) {
        return;
    }

    /* one that cannot go yet is kept again, for the next round */
    ngx_queue_init(&queue);
    ngx_queue_add(&queue, &rd->resend);
    ngx_queue_init(&rd->resend);
    rd->resend_n = 0;
    rd->resend_size = 0;
    n = 0;

    while (!ngx_queue_empty(&queue)) {
        q = ngx_queue_head(&queue);
        ngx_queue_remove(q);

        cmd = ngx_queue_data(q, ngx_http_idem_cmd_t, queue);
        cmd->resent = 1;

        if (ngx_http_idem_cmd_send(cmd, cmd->handler, cmd->data) == NGX_OK) {
            n++;
        }
    }

    if (n) {
        ngx_log_error(NGX_LOG_NOTICE, rd->log, 0,
                      "idempotency: sending %ui unrecorded results again", n);
    }
}


/*
 * A worker busy with other requests (large bodies to canonicalize) may
 * reach the timer before the read event of an answer already waiting on
 * the socket: read what is there first.  NGX_OK when the command's
 * callback ran meanwhile (the command is gone then).
 */
static ngx_int_t
ngx_http_idem_cmd_drain(ngx_http_idem_redis_t *rd, ngx_http_idem_cmd_t *cmd)
{
    int                    n;
    ngx_uint_t             i;
    ngx_http_idem_link_t  *lk;

    lk = cmd->link;
    rd->timing_out = cmd;

    for (i = 0; i < 256 && rd->timing_out == cmd; i++) {
        if (lk->io.ac == NULL || lk->io.conn == NULL
            || ioctl(lk->io.conn->fd, FIONREAD, &n) == -1 || n <= 0)
        {
            break;
        }

        redisAsyncHandleRead(lk->io.ac);
    }

    if (rd->timing_out != cmd) {
        return NGX_OK;
    }

    rd->timing_out = NULL;

    return NGX_DECLINED;
}


/*
 * The sender learns at once that no answer came; the command itself stays
 * with hiredis until the connection is freed, and a durable one is then
 * kept for the next connection.
 */
static void
ngx_http_idem_cmd_timeout(ngx_event_t *ev)
{
    ngx_http_idem_cmd_t  *cmd = ev->data;

    ngx_http_idem_link_t   *lk;
    ngx_http_idem_redis_t  *rd;

    rd = cmd->redis;
    lk = cmd->link;

    if (ngx_http_idem_cmd_drain(rd, cmd) == NGX_OK) {
        return;
    }

    ngx_log_error(NGX_LOG_ERR, rd->log, 0,
                  "idempotency: redis %V command timed out%s", &rd->name,
                  ngx_http_idem_link_name(lk));
    ngx_http_idem_metrics_redis_error(NGX_HTTP_IDEM_RERR_TIMEOUT);

    if (!cmd->durable) {
        cmd->told = 1;

        if (cmd->handler) {
            cmd->handler(cmd, NULL);
        }
    }

    ngx_http_idem_link_recycle_later(lk);
}


/*
 * The command in the Redis protocol, formatted here: hiredis's formatter
 * (sdscatfmt() per argument) was a seventh of a first write's instructions
 * in the worker (bench/RESULTS.md).  Short commands are built on the stack;
 * hiredis copies them into its output buffer either way.
 */
#define NGX_HTTP_IDEM_CMD_STACK  2048

static ngx_uint_t
ngx_http_idem_cmd_skipped(ngx_http_idem_cmd_t *cmd, ngx_uint_t i)
{
    return cmd->skip && i >= cmd->arg0 && i - cmd->arg0 < 32
           && (cmd->skip & ((uint32_t) 1 << (i - cmd->arg0)));
}


static int
ngx_http_idem_cmd_format(redisAsyncContext *ac, ngx_http_idem_cmd_t *cmd,
    ngx_uint_t from, ngx_uint_t argc, redisCallbackFn *fn)
{
    u_char      stack[NGX_HTTP_IDEM_CMD_STACK], *buf, *p;
    size_t      len;
    ngx_uint_t  i, n;
    int         rc;

    /* the script's own arguments a lighter script does not read: skip */
    len = sizeof("*\r\n") - 1 + NGX_SIZE_T_LEN;
    n = argc;

    for (i = from; i < from + argc; i++) {
        if (ngx_http_idem_cmd_skipped(cmd, i)) {
            n--;
            continue;
        }

        len += sizeof("$\r\n\r\n") - 1 + NGX_SIZE_T_LEN + cmd->argvlen[i];
    }

    buf = (len <= sizeof(stack)) ? stack : ngx_alloc(len, cmd->redis->log);
    if (buf == NULL) {
        return REDIS_ERR;
    }

    p = ngx_sprintf(buf, "*%ui\r\n", n);

    for (i = from; i < from + argc; i++) {
        if (ngx_http_idem_cmd_skipped(cmd, i)) {
            continue;
        }

        p = ngx_sprintf(p, "$%uz\r\n", cmd->argvlen[i]);
        p = ngx_cpymem(p, cmd->argv[i], cmd->argvlen[i]);
        *p++ = CR;
        *p++ = LF;
    }

    rc = redisAsyncFormattedCommand(ac, fn, cmd, (const char *) buf, p - buf);

    if (buf != stack) {
        ngx_free(buf);
    }

    return rc;
}


/*
 * A reply of a batch's command before its last: kept as the batch's
 * (cmd->nil, cmd->got) and shown to its sender's hook while anyone is
 * told; the last one's reply is the command's.  The callbacks of one link
 * run in order and the last frees the command, so it is alive here.
 */
static void
ngx_http_idem_redis_part(redisAsyncContext *ac, void *r, void *privdata)
{
    redisReply           *reply = r;
    ngx_http_idem_cmd_t  *cmd = privdata;

    if (reply) {
        cmd->got |= (ngx_uint_t) 1 << cmd->part;
        cmd->nil |= (ngx_uint_t) (reply->type == REDIS_REPLY_NIL)
                    << cmd->part;
    }

    if (!cmd->told && cmd->part_handler) {
        cmd->part_handler(cmd, cmd->part, reply);
    }

    cmd->part++;
}


/*
 * A batch (cmd->batch arguments per command): its commands written one
 * after the other, in one write, in this order; each gets its own reply
 * (ngx_http_idem_redis_part), the last one's is the command's.
 */
static int
ngx_http_idem_cmd_write(redisAsyncContext *ac, ngx_http_idem_cmd_t *cmd)
{
    ngx_uint_t  i, argc;

    /* the audit file's entries ride along for the reply, unsent */
    argc = cmd->argc - cmd->hidden;

    if (cmd->batch == 0) {
        return ngx_http_idem_cmd_format(ac, cmd, 0, argc,
                                        ngx_http_idem_redis_reply);
    }

    cmd->part = 0;
    cmd->got = 0;
    cmd->nil = 0;

    for (i = 0; i + cmd->batch < argc; i += cmd->batch) {
        if (ngx_http_idem_cmd_format(ac, cmd, i, cmd->batch,
                                     ngx_http_idem_redis_part)
            != REDIS_OK)
        {
            goto failed;
        }
    }

    if (ngx_http_idem_cmd_format(ac, cmd, i, argc - i,
                                 ngx_http_idem_redis_reply)
        == REDIS_OK)
    {
        return REDIS_OK;
    }

failed:

    if (i == 0) {
        return REDIS_ERR;
    }

    /*
     * hiredis holds callbacks naming the command already: it must outlive
     * them, so it counts as written, its timer answers "no reply", and it
     * is never freed (an allocation failed inside hiredis: not seen yet)
     */
    ngx_log_error(NGX_LOG_ERR, cmd->redis->log, 0,
                  "idempotency: a pipelined claim was written in part");

    return REDIS_OK;
}


/*
 * ASKING lets the node that imports a slot run the one command that
 * follows it on the connection: hiredis writes the two in this order.
 */
static int
ngx_http_idem_cmd_put(ngx_http_idem_link_t *lk, ngx_http_idem_cmd_t *cmd)
{
    static const char  asking[] = "*1\r\n$6\r\nASKING\r\n";

    if (lk->io.ac == NULL || lk->state == NGX_HTTP_IDEM_REDIS_DOWN) {
        return REDIS_ERR;
    }

    if (cmd->asking
        && redisAsyncFormattedCommand(lk->io.ac, NULL, NULL, asking,
                                      sizeof(asking) - 1)
           != REDIS_OK)
    {
        return REDIS_ERR;
    }

    return ngx_http_idem_cmd_write(lk->io.ac, cmd);
}


/*
 * A command that waited for locate and will not get its answer: its
 * sender was told NGX_OK, so the handler is the one to know.
 */
static void
ngx_http_idem_held_fail(ngx_http_idem_cmd_t *cmd)
{
    if (cmd->timer.timer_set) {
        ngx_del_timer(&cmd->timer);
    }

    if (!cmd->told && cmd->handler) {
        cmd->told = 1;
        cmd->handler(cmd, NULL);
    }

    ngx_free(cmd);
}


static void
ngx_http_idem_held_timeout(ngx_event_t *ev)
{
    ngx_http_idem_cmd_t    *cmd = ev->data;
    ngx_http_idem_redis_t  *rd = cmd->redis;

    ngx_log_error(NGX_LOG_ERR, rd->log, 0,
                  "idempotency: redis %V: no master named within "
                  "connect_timeout + timeout", &rd->name);
    ngx_http_idem_metrics_redis_error(NGX_HTTP_IDEM_RERR_CONNECT);

    ngx_queue_remove(&cmd->queue);
    ngx_http_idem_held_fail(cmd);
}


/*
 * Sentinel: while a worker asks where its master is (at its start, which
 * every reload is for its new workers, and after losing the master) there
 * is no link to write on.  A command waits for the answer, as it would
 * wait for a link still connecting, but no longer than asking a sentinel
 * may take: a connect and a command.  A durable one is kept for the next
 * link as always.
 */
static ngx_int_t
ngx_http_idem_cmd_hold(ngx_http_idem_cmd_t *cmd)
{
    ngx_http_idem_redis_t  *rd = cmd->redis;

    if (!rd->locating || rd->exiting || cmd->durable || cmd->pinned) {
        return NGX_DECLINED;
    }

    cmd->held = 1;
    ngx_queue_insert_tail(&rd->held, &cmd->queue);

    ngx_http_idem_event_init(&cmd->timer, ngx_http_idem_held_timeout, cmd,
                             rd->log, 0);
    ngx_add_timer(&cmd->timer, rd->connect_timeout + rd->timeout);

    return NGX_OK;
}


/*
 * locate answered: the commands that waited are sent (located), or told
 * that there is no master; a handler that sends again meets the new state.
 */
static void
ngx_http_idem_held_release(ngx_http_idem_redis_t *rd, ngx_uint_t located)
{
    ngx_queue_t           queue, *q;
    ngx_http_idem_cmd_t  *cmd;

    if (rd->held.next == NULL || ngx_queue_empty(&rd->held)) {
        return;
    }

    ngx_queue_init(&queue);
    ngx_queue_add(&queue, &rd->held);
    ngx_queue_init(&rd->held);

    while (!ngx_queue_empty(&queue)) {
        q = ngx_queue_head(&queue);
        ngx_queue_remove(q);

        cmd = ngx_queue_data(q, ngx_http_idem_cmd_t, queue);

        if (cmd->timer.timer_set) {
            ngx_del_timer(&cmd->timer);
        }

        if (located && !rd->exiting) {
            (void) ngx_http_idem_cmd_send(cmd, cmd->handler, cmd->data);

        } else {
            ngx_http_idem_held_fail(cmd);
        }
    }
}


ngx_int_t
ngx_http_idem_cmd_send(ngx_http_idem_cmd_t *cmd,
    ngx_http_idem_reply_pt handler, void *data)
{
    ngx_http_idem_link_t   *lk;
    ngx_http_idem_redis_t  *rd;

    rd = cmd->redis;

    cmd->handler = handler;
    cmd->data = data;
    cmd->asking = 0;
    /* each send (a resend of a kept command too) may follow a few */
    cmd->redirects = 0;

    lk = ngx_http_idem_cmd_route(cmd);

    if (lk == NULL || ngx_http_idem_cmd_put(lk, cmd) != REDIS_OK) {
        /* not written: no callback will ever come for this one */
        if (ngx_http_idem_cmd_hold(cmd) == NGX_OK) {
            return NGX_OK;
        }

        if (ngx_http_idem_resend_later(cmd, lk) == NGX_OK) {
            return NGX_AGAIN;
        }

        if ((cmd->resent || cmd->held) && !cmd->told && cmd->handler) {
            /* its sender is long gone: the handler is the one to know */
            cmd->told = 1;
            cmd->handler(cmd, NULL);
        }

        ngx_free(cmd);
        return NGX_ERROR;
    }

    cmd->link = lk;

    ngx_http_idem_event_init(&cmd->timer, ngx_http_idem_cmd_timeout, cmd,
                             rd->log, 0);
    ngx_add_timer(&cmd->timer, cmd->timeout ? cmd->timeout : rd->timeout);

    cmd->sent = ngx_http_idem_metrics ? ngx_http_idem_metrics_now() : 0;

    return NGX_OK;
}


static ngx_uint_t
ngx_http_idem_is_noscript(redisReply *reply)
{
    return reply->type == REDIS_REPLY_ERROR
           && reply->len >= 8
           && ngx_strncmp(reply->str, "NOSCRIPT", 8) == 0;
}


/* Redis restarted or failed over: its script cache is empty */
static ngx_int_t
ngx_http_idem_cmd_eval(ngx_http_idem_link_t *lk, ngx_http_idem_cmd_t *cmd)
{
    ngx_http_idem_script_t  *s;

    s = &cmd->redis->scripts[cmd->script];

    /* the text is the command's script's, which reads all its arguments */
    cmd->eval = 1;
    cmd->skip = 0;
    cmd->argv[0] = "EVAL";
    cmd->argvlen[0] = sizeof("EVAL") - 1;
    cmd->argv[1] = (const char *) s->text.data;
    cmd->argvlen[1] = s->text.len;

    return ngx_http_idem_cmd_put(lk, cmd) == REDIS_OK ? NGX_OK : NGX_ERROR;
}


/* idempotency_metrics: the reply's time, or what went wrong */
static void
ngx_http_idem_redis_observe(ngx_http_idem_cmd_t *cmd, redisReply *reply)
{
    if (reply == NULL) {
        return;     /* counted as the connection's loss or a timeout */
    }

    ngx_http_idem_metrics_redis_reply(cmd->sent);

    /* what a record holds (an old layout, a foreign value) is not Redis's */
    if (reply->type == REDIS_REPLY_ERROR && !ngx_http_idem_reply_corrupt(reply))
    {
        ngx_http_idem_metrics_redis_error(NGX_HTTP_IDEM_RERR_REPLY);
    }
}


/*
 * A located server that refuses writes was a master: it has been demoted
 * (READONLY), or has lost the replicas that min-replicas-to-write asks for
 * (NOREPLICAS), as an old master does during a failover.  Nothing was
 * written, so the command counts as unanswered: a durable one is sent
 * again to the master found next, a claim is answered store-unavailable.
 */
static redisReply *
ngx_http_idem_cmd_unwritable(ngx_http_idem_cmd_t *cmd, redisReply *reply)
{
    ngx_http_idem_redis_t  *rd = cmd->redis;

    if (reply == NULL || rd->topology != NGX_HTTP_IDEM_TOPO_SENTINEL
        || reply->type != REDIS_REPLY_ERROR
        || (ngx_strncmp(reply->str, "READONLY", 8) != 0
            && ngx_strncmp(reply->str, "NOREPLICAS", 10) != 0))
    {
        return reply;
    }

    ngx_log_error(NGX_LOG_WARN, rd->log, 0,
                  "idempotency: redis %V at %V:%d refuses writes (%*s), "
                  "asking the sentinels again", &rd->name, &rd->host,
                  rd->port, ngx_min((size_t) reply->len, 60), reply->str);

    ngx_http_idem_metrics_redis_error(NGX_HTTP_IDEM_RERR_REPLY);
    ngx_http_idem_link_recycle_later(cmd->link);

    return NULL;
}


/*
 * Redis Cluster: MOVED (the slot has another master: the map learns it)
 * and ASK (the slot is being moved there, and this key with it: this
 * command alone goes there, after ASKING) are followed a few times; the
 * command did not run where it went.
 */
#define NGX_HTTP_IDEM_REDIRECTS_MAX  5

static ngx_int_t
ngx_http_idem_cmd_redirect(ngx_http_idem_cmd_t *cmd,
    ngx_http_idem_link_t *from, redisReply *reply)
{
    idem_redirect_t         to;
    ngx_http_idem_link_t   *lk;
    ngx_http_idem_redis_t  *rd = cmd->redis;

    if (rd->topology != NGX_HTTP_IDEM_TOPO_CLUSTER || reply == NULL || cmd->told || cmd->pinned
        || reply->type != REDIS_REPLY_ERROR
        || !idem_redirect(reply->str, reply->len, &to))
    {
        return NGX_DECLINED;
    }

    if (cmd->redirects++ >= NGX_HTTP_IDEM_REDIRECTS_MAX) {
        ngx_log_error(NGX_LOG_WARN, rd->log, 0,
                      "idempotency: redis %V: \"%*s\" after %d "
                      "redirections of one command", &rd->name,
                      ngx_min((size_t) reply->len, 80), reply->str,
                      NGX_HTTP_IDEM_REDIRECTS_MAX);
        return NGX_DECLINED;
    }

    lk = rd->redirect(rd, from, &to);

    if (lk == NULL) {
        return NGX_DECLINED;
    }

    cmd->asking = to.ask;

    if (ngx_http_idem_cmd_put(lk, cmd) != REDIS_OK) {
        return NGX_DECLINED;
    }

    cmd->link = lk;

    /* a timer that found this answer waiting: the command goes on */
    if (rd->timing_out == cmd) {
        rd->timing_out = NULL;
    }

    if (cmd->timer.timer_set) {
        ngx_del_timer(&cmd->timer);
    }

    ngx_add_timer(&cmd->timer, cmd->timeout ? cmd->timeout : rd->timeout);

    return NGX_OK;
}


/*
 * Redis Cluster: answers that say the command did not run and the
 * cluster must settle first: a redirection not followed, CLUSTERDOWN (a
 * slot without a master: a failover under way), TRYAGAIN (keys of a slot
 * being moved), NOREPLICAS, READONLY.  The slot map is asked for again; a
 * durable command waits for it, another one is answered with the error
 * (store-unavailable).
 */
static ngx_uint_t
ngx_http_idem_cmd_unserved(ngx_http_idem_cmd_t *cmd, redisReply *reply)
{
    ngx_uint_t              i;
    ngx_http_idem_redis_t  *rd = cmd->redis;

    static ngx_str_t  words[] = {
        ngx_string("MOVED "), ngx_string("ASK "),
        ngx_string("CLUSTERDOWN"), ngx_string("TRYAGAIN"),
        ngx_string("NOREPLICAS"), ngx_string("READONLY")
    };

    if (rd->topology != NGX_HTTP_IDEM_TOPO_CLUSTER || reply == NULL
        || reply->type != REDIS_REPLY_ERROR)
    {
        return 0;
    }

    for (i = 0; i < sizeof(words) / sizeof(words[0]); i++) {
        if ((size_t) reply->len >= words[i].len
            && ngx_strncmp(reply->str, words[i].data, words[i].len) == 0)
        {
            ngx_log_error(NGX_LOG_WARN, rd->log, 0,
                          "idempotency: redis %V%s: %*s", &rd->name,
                          ngx_http_idem_link_name(cmd->link),
                          ngx_min((size_t) reply->len, 80), reply->str);

            rd->locate(rd);
            return 1;
        }
    }

    return 0;
}


static void
ngx_http_idem_redis_reply(redisAsyncContext *ac, void *r, void *privdata)
{
    redisReply            *reply = r;
    ngx_http_idem_cmd_t   *cmd = privdata;
    ngx_http_idem_link_t  *lk = ac->data;

    reply = ngx_http_idem_cmd_unwritable(cmd, reply);

    if (reply && !cmd->eval && cmd->script != NGX_HTTP_IDEM_NSCRIPTS
        && ngx_http_idem_is_noscript(reply))
    {
        if (ngx_http_idem_cmd_eval(lk, cmd) == NGX_OK) {
            return;
        }

        reply = NULL;
    }

    if (ngx_http_idem_cmd_redirect(cmd, lk, reply) == NGX_OK) {
        return;
    }

    if (cmd->timer.timer_set) {
        ngx_del_timer(&cmd->timer);
    }

    if (!cmd->told) {
        ngx_http_idem_redis_observe(cmd, reply);
    }

    if (cmd->redis->timing_out == cmd) {
        cmd->redis->timing_out = NULL;
    }

    if ((reply == NULL || ngx_http_idem_cmd_unserved(cmd, reply))
        && ngx_http_idem_resend_later(cmd, lk) == NGX_OK)
    {
        return;
    }

    if (!cmd->told && cmd->handler) {
        cmd->told = 1;
        cmd->redis->replying = (ac == lk->io.ac) ? lk : NULL;
        cmd->handler(cmd, reply);
        cmd->redis->replying = NULL;
    }

    ngx_free(cmd);
}
