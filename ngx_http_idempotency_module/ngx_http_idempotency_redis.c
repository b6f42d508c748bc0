/*
 * hiredis' asynchronous API inside nginx's event loop: one connection per
 * worker and configured server, pipelined, with nginx timers for the link
 * set-up and for each command (hiredis 0.14 has none), reconnect with
 * backoff, and the queue of durable commands sent again after a loss.
 */

#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_event.h>

#include "ngx_http_idempotency_redis.h"
#include "ngx_http_idempotency_metrics.h"


#define NGX_HTTP_IDEM_BACKOFF_MIN  100
#define NGX_HTTP_IDEM_BACKOFF_MAX  2000


static void ngx_http_idem_link_schedule(ngx_http_idem_link_t *lk);
static void ngx_http_idem_link_recycle_later(ngx_http_idem_link_t *lk);
static void ngx_http_idem_waiters_wake(ngx_http_idem_redis_t *rd,
    const u_char *key);
static void ngx_http_idem_redis_reply(redisAsyncContext *ac, void *r,
    void *privdata);
static void ngx_http_idem_resend(ngx_http_idem_redis_t *rd);


/* event hooks hiredis calls; level-triggered so replies > 16 KiB flow */

static void
ngx_http_idem_link_add(ngx_http_idem_link_t *lk, ngx_uint_t write)
{
    ngx_event_t  *ev;

    if (lk->conn == NULL) {
        return;
    }

    ev = write ? lk->conn->write : lk->conn->read;

    if (!ev->active) {
        if (ngx_add_event(ev, write ? NGX_WRITE_EVENT : NGX_READ_EVENT,
                          NGX_LEVEL_EVENT)
            != NGX_OK)
        {
            ngx_http_idem_link_recycle_later(lk);
        }
    }
}


static void
ngx_http_idem_link_del(ngx_http_idem_link_t *lk, ngx_uint_t write)
{
    ngx_event_t  *ev;

    if (lk->conn == NULL) {
        return;
    }

    ev = write ? lk->conn->write : lk->conn->read;

    if (ev->active) {
        ngx_del_event(ev, write ? NGX_WRITE_EVENT : NGX_READ_EVENT, 0);
    }
}


static void
ngx_http_idem_link_add_read(void *privdata)
{
    ngx_http_idem_link_add(privdata, 0);
}


static void
ngx_http_idem_link_del_read(void *privdata)
{
    ngx_http_idem_link_del(privdata, 0);
}


static void
ngx_http_idem_link_add_write(void *privdata)
{
    ngx_http_idem_link_add(privdata, 1);
}


static void
ngx_http_idem_link_del_write(void *privdata)
{
    ngx_http_idem_link_del(privdata, 1);
}


/*
 * hiredis closes the fd itself (redisFree), so the nginx connection is
 * only unhooked and returned, never closed: one fd, one close.
 */
static void
ngx_http_idem_link_cleanup(void *privdata)
{
    ngx_http_idem_link_t  *lk = privdata;

    ngx_connection_t  *c;

    c = lk->conn;
    if (c == NULL) {
        return;
    }

    ngx_http_idem_link_del(lk, 0);
    ngx_http_idem_link_del(lk, 1);

    lk->conn = NULL;

    if (c->read->posted) {
        ngx_delete_posted_event(c->read);
    }

    if (c->write->posted) {
        ngx_delete_posted_event(c->write);
    }

    ngx_free_connection(c);
    c->fd = (ngx_socket_t) -1;
}


static void
ngx_http_idem_link_read_handler(ngx_event_t *ev)
{
    ngx_connection_t      *c = ev->data;
    ngx_http_idem_link_t  *lk = c->data;

    if (lk->ac) {
        redisAsyncHandleRead(lk->ac);
    }
}


static void
ngx_http_idem_link_write_handler(ngx_event_t *ev)
{
    ngx_connection_t      *c = ev->data;
    ngx_http_idem_link_t  *lk = c->data;

    if (lk->ac) {
        redisAsyncHandleWrite(lk->ac);
    }
}


static const char *
ngx_http_idem_link_name(ngx_http_idem_link_t *lk)
{
    return lk->subscriber ? " (subscriber)" : "";
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
    lk->ac = NULL;
    ngx_http_idem_link_down(lk);
    ngx_http_idem_link_schedule(lk);
}


static void
ngx_http_idem_link_on_disconnect(const redisAsyncContext *ac, int status)
{
    ngx_http_idem_link_t   *lk = ac->data;
    ngx_http_idem_redis_t  *rd = lk->redis;

    if (lk->ac == ac) {
        lk->ac = NULL;
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

    if (reply == NULL || lk->ac != ac) {
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

    if (reply == NULL || lk->ac != ac || reply->type == REDIS_REPLY_ERROR) {
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

    if (redisvAsyncCommand(lk->ac, fn, what, format, ap) == REDIS_OK
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

    if (rd->locate) {
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


static ngx_int_t
ngx_http_idem_link_attach(ngx_http_idem_link_t *lk, redisAsyncContext *ac)
{
    ngx_connection_t       *c;
    ngx_http_idem_redis_t  *rd = lk->redis;

    c = ngx_get_connection(ac->c.fd, rd->log);
    if (c == NULL) {
        return NGX_ERROR;
    }

    c->data = lk;
    c->read->handler = ngx_http_idem_link_read_handler;
    c->write->handler = ngx_http_idem_link_write_handler;
    c->read->log = rd->log;
    c->write->log = rd->log;

    ac->data = lk;
    ac->ev.data = lk;
    ac->ev.addRead = ngx_http_idem_link_add_read;
    ac->ev.delRead = ngx_http_idem_link_del_read;
    ac->ev.addWrite = ngx_http_idem_link_add_write;
    ac->ev.delWrite = ngx_http_idem_link_del_write;
    ac->ev.cleanup = ngx_http_idem_link_cleanup;

    redisAsyncSetConnectCallback(ac, ngx_http_idem_link_on_connect);
    redisAsyncSetDisconnectCallback(ac, ngx_http_idem_link_on_disconnect);

    lk->ac = ac;
    lk->conn = c;

    return NGX_OK;
}


static void
ngx_http_idem_link_connect(ngx_http_idem_link_t *lk)
{
    redisAsyncContext      *ac;
    ngx_http_idem_redis_t  *rd = lk->redis;

    /* every loss of a located server asks where the master is now */
    if (rd->locate && lk->gen == rd->gen) {
        rd->locate(rd);
        return;
    }

    lk->gen = rd->gen;

    if (rd->port) {
        ac = redisAsyncConnect((char *) rd->host.data, rd->port);

    } else {
        ac = redisAsyncConnectUnix((char *) rd->host.data);
    }

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

    /* the first writable event tells hiredis the connect finished */
    ngx_http_idem_link_add_write(lk);
}


ngx_msec_t
ngx_http_idem_backoff_step(ngx_msec_t backoff)
{
    return backoff ? ngx_min(backoff * 2, NGX_HTTP_IDEM_BACKOFF_MAX)
                   : NGX_HTTP_IDEM_BACKOFF_MIN;
}


/* jitter, so that the workers of a host do not reconnect in step */
ngx_msec_t
ngx_http_idem_backoff_jitter(ngx_msec_t backoff)
{
    return backoff - (ngx_msec_t) ngx_random() % (backoff / 4 + 1);
}


static void
ngx_http_idem_link_schedule(ngx_http_idem_link_t *lk)
{
    if (lk->redis->exiting || lk->reconnect.timer_set) {
        return;
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

    if (lk->ac == NULL && !lk->redis->exiting) {
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
    if (lk->ac == NULL) {
        return;
    }

    ngx_http_idem_link_down(lk);
    lk->recycle_ac = lk->ac;

    if (!lk->recycle.posted) {
        ngx_post_event(&lk->recycle, &ngx_posted_events);
    }
}


static void
ngx_http_idem_link_recycle_handler(ngx_event_t *ev)
{
    ngx_http_idem_link_t  *lk = ev->data;

    redisAsyncContext  *ac;

    ac = lk->ac;

    if (ac == NULL || ac != lk->recycle_ac) {
        return;
    }

    lk->ac = NULL;
    lk->recycle_ac = NULL;
    ngx_http_idem_link_down(lk);

    if (lk->connect_timer.timer_set) {
        ngx_del_timer(&lk->connect_timer);
    }

    ngx_log_error(NGX_LOG_WARN, lk->redis->log, 0,
                  "idempotency: closing redis %V%s connection",
                  &lk->redis->name, ngx_http_idem_link_name(lk));

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


static void
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

    ac = lk->ac;
    lk->ac = NULL;

    if (ac) {
        redisAsyncFree(ac);
    }
}


static void
ngx_http_idem_link_follow(ngx_http_idem_link_t *lk, ngx_uint_t moved)
{
    if (lk->redis == NULL) {
        return;                        /* no such link in this worker */
    }

    if (lk->ac) {
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

    if (host == NULL) {
        if (rd->cmd.redis && rd->cmd.ac == NULL) {
            ngx_http_idem_link_schedule(&rd->cmd);
        }

        if (rd->sub.redis && rd->sub.ac == NULL) {
            ngx_http_idem_link_schedule(&rd->sub);
        }

        return;
    }

    moved = (rd->port != port || rd->host.len != host->len
             || ngx_strncmp(rd->host.data, host->data, host->len) != 0);

    if (moved) {
        ngx_log_error(NGX_LOG_NOTICE, rd->log, 0,
                      "idempotency: redis %V: master at %V:%i",
                      &rd->name, host, port);
    }

    rd->host.len = ngx_min(host->len, NGX_SOCKADDR_STRLEN);
    rd->host.data = rd->addr;
    *ngx_cpymem(rd->addr, host->data, rd->host.len) = '\0';
    rd->port = (int) port;
    rd->gen++;

    ngx_http_idem_link_follow(&rd->cmd, moved);
    ngx_http_idem_link_follow(&rd->sub, moved);
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

        ngx_http_idem_link_init(&rd->cmd, rd, 0);

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


/* waiters */

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


/* key NULL wakes every waiter */
static void
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


/*
 * Commands: a script, EVALSHA <sha1> 1 <key> <args...> (resent as EVAL on
 * NOSCRIPT), or a native command, <name> <key> <args...>.  Either way the
 * arguments after the key are set by name: index 0 is the first one.
 */

static ngx_http_idem_cmd_t *
ngx_http_idem_cmd_alloc(ngx_http_idem_redis_t *rd, ngx_uint_t argc,
    const u_char *key, size_t size, ngx_log_t *log)
{
    ngx_http_idem_cmd_t  *cmd;

    size += key ? IDEM_RECORD_KEY_LEN : 0;

    cmd = ngx_alloc(sizeof(ngx_http_idem_cmd_t)
                    + argc * (sizeof(char *) + sizeof(size_t)) + size, log);
    if (cmd == NULL) {
        return NULL;
    }

    ngx_memzero(cmd, sizeof(ngx_http_idem_cmd_t));

    cmd->size = size;
    cmd->redis = rd;
    cmd->argc = argc;
    cmd->argv = (const char **) (cmd + 1);
    cmd->argvlen = (size_t *) (cmd->argv + argc);
    cmd->pos = (u_char *) (cmd->argvlen + argc);

    ngx_memzero(cmd->argv, argc * sizeof(char *));
    ngx_memzero(cmd->argvlen, argc * sizeof(size_t));

    if (key) {
        cmd->key = cmd->pos;
        cmd->pos = ngx_cpymem(cmd->pos, key, IDEM_RECORD_KEY_LEN);
    }

    return cmd;
}


ngx_http_idem_cmd_t *
ngx_http_idem_cmd_create(ngx_http_idem_redis_t *rd,
    ngx_http_idem_script_e script, const u_char *key, size_t size,
    ngx_log_t *log)
{
    return ngx_http_idem_cmd_create_keys(rd, script, key, NULL, 0, size,
                                         log);
}


/*
 * A script of the record key and n more keys (the unique and lock keys of
 * idempotency_unique and idempotency_lock, the audit stream): they are the
 * script's KEYS[2..n+1], an empty string for one a request lacks.
 */
ngx_http_idem_cmd_t *
ngx_http_idem_cmd_create_keys(ngx_http_idem_redis_t *rd,
    ngx_http_idem_script_e script, const u_char *key, u_char **keys,
    ngx_uint_t n, size_t size, ngx_log_t *log)
{
    return ngx_http_idem_cmd_create_more(rd, script, key, keys, n, 0, size,
                                         log);
}


/* the same with "more" arguments after the script's named ones */
ngx_http_idem_cmd_t *
ngx_http_idem_cmd_create_more(ngx_http_idem_redis_t *rd,
    ngx_http_idem_script_e script, const u_char *key, u_char **keys,
    ngx_uint_t n, ngx_uint_t more, size_t size, ngx_log_t *log)
{
    ngx_uint_t            i;
    ngx_http_idem_cmd_t  *cmd;

    static const char    *numkeys[] = { "1", "2", "3", "4" };

    for (i = 0; i < n; i++) {
        size += ngx_strlen(keys[i]);
    }

    cmd = ngx_http_idem_cmd_alloc(rd, 4 + n + rd->scripts[script].nargs + more,
                                  key, size, log);
    if (cmd == NULL) {
        return NULL;
    }

    cmd->script = script;
    cmd->arg0 = 4 + n;

    cmd->argv[0] = "EVALSHA";
    cmd->argvlen[0] = sizeof("EVALSHA") - 1;
    cmd->argv[1] = (const char *) rd->scripts[script].sha1;
    cmd->argvlen[1] = NGX_HTTP_IDEM_SHA1_HEX;
    cmd->argv[2] = numkeys[n];
    cmd->argvlen[2] = 1;
    cmd->argv[3] = (const char *) cmd->key;
    cmd->argvlen[3] = IDEM_RECORD_KEY_LEN;

    for (i = 0; i < n; i++) {
        cmd->argv[4 + i] = (const char *) cmd->pos;
        cmd->argvlen[4 + i] = ngx_strlen(keys[i]);
        cmd->pos = ngx_cpymem(cmd->pos, keys[i], cmd->argvlen[4 + i]);
    }

    return cmd;
}


ngx_http_idem_cmd_t *
ngx_http_idem_cmd_native(ngx_http_idem_redis_t *rd, ngx_str_t *name,
    ngx_uint_t nargs, const u_char *key, size_t size, ngx_log_t *log)
{
    ngx_http_idem_cmd_t  *cmd;

    cmd = ngx_http_idem_cmd_alloc(rd, 2 + nargs, key, size, log);
    if (cmd == NULL) {
        return NULL;
    }

    cmd->script = NGX_HTTP_IDEM_NSCRIPTS;
    cmd->arg0 = 2;

    cmd->argv[0] = (const char *) name->data;
    cmd->argvlen[0] = name->len;
    cmd->argv[1] = (const char *) cmd->key;
    cmd->argvlen[1] = IDEM_RECORD_KEY_LEN;

    return cmd;
}


/*
 * A copy of a command to send again (its handler changes it first): the
 * same arguments, in a block of its own.
 */
ngx_http_idem_cmd_t *
ngx_http_idem_cmd_copy(ngx_http_idem_cmd_t *cmd)
{
    u_char               *old, *end;
    size_t                n;
    ngx_uint_t            i;
    ngx_http_idem_cmd_t  *copy;

    n = sizeof(ngx_http_idem_cmd_t)
        + cmd->argc * (sizeof(char *) + sizeof(size_t)) + cmd->size;

    copy = ngx_alloc(n, cmd->redis->log);
    if (copy == NULL) {
        return NULL;
    }

    ngx_memcpy(copy, cmd, n);

    old = (u_char *) cmd;
    end = old + n;

    copy->argv = (const char **) (copy + 1);
    copy->argvlen = (size_t *) (copy->argv + copy->argc);

    /* the arguments in the block move with it; "EVALSHA" and the like not */
    for (i = 0; i < copy->argc; i++) {
        if ((u_char *) copy->argv[i] >= old && (u_char *) copy->argv[i] < end) {
            copy->argv[i] = (const char *) copy
                            + ((u_char *) copy->argv[i] - old);
        }
    }

    copy->pos = (u_char *) copy + (cmd->pos - old);
    copy->key = cmd->key ? (u_char *) copy + (cmd->key - old) : NULL;

    ngx_memzero(&copy->timer, sizeof(ngx_event_t));
    copy->told = 0;
    copy->resent = 0;
    copy->handler = NULL;
    copy->data = NULL;

    return copy;
}


/* room for the argument named arg (an NGX_HTTP_IDEM_<SCRIPT>_<NAME>) */
u_char *
ngx_http_idem_cmd_reserve(ngx_http_idem_cmd_t *cmd, ngx_uint_t arg, size_t len)
{
    u_char  *p;

    p = cmd->pos;
    cmd->argv[cmd->arg0 + arg] = (const char *) p;
    cmd->argvlen[cmd->arg0 + arg] = len;
    cmd->pos += len;

    return p;
}


void
ngx_http_idem_cmd_set(ngx_http_idem_cmd_t *cmd, ngx_uint_t arg,
    const void *data, size_t len)
{
    ngx_memcpy(ngx_http_idem_cmd_reserve(cmd, arg, len), data, len);
}


/* a decimal argument; the command's size counted NGX_INT64_LEN for it */
void
ngx_http_idem_cmd_set_num(ngx_http_idem_cmd_t *cmd, ngx_uint_t arg,
    int64_t n)
{
    u_char  *p;

    p = cmd->pos;
    cmd->pos = ngx_sprintf(p, "%L", n);
    cmd->argv[cmd->arg0 + arg] = (const char *) p;
    cmd->argvlen[cmd->arg0 + arg] = cmd->pos - p;
}


/* an argument the caller writes at the returned place, then ends with _end */
u_char *
ngx_http_idem_cmd_start(ngx_http_idem_cmd_t *cmd, ngx_uint_t arg)
{
    cmd->argv[cmd->arg0 + arg] = (const char *) cmd->pos;

    return cmd->pos;
}


void
ngx_http_idem_cmd_end(ngx_http_idem_cmd_t *cmd, ngx_uint_t arg, u_char *end)
{
    cmd->argvlen[cmd->arg0 + arg] = end - cmd->pos;
    cmd->pos = end;
}


ngx_str_t
ngx_http_idem_cmd_get(ngx_http_idem_cmd_t *cmd, ngx_uint_t arg)
{
    ngx_str_t  s;

    s.data = (u_char *) cmd->argv[cmd->arg0 + arg];
    s.len = cmd->argvlen[cmd->arg0 + arg];

    return s;
}


ngx_str_t
ngx_http_idem_cmd_key(ngx_http_idem_cmd_t *cmd)
{
    ngx_str_t  s;

    s.data = cmd->key;
    s.len = IDEM_RECORD_KEY_LEN;

    return s;
}


/* keeps a durable command for the next connection; NGX_DECLINED: full */
static ngx_int_t
ngx_http_idem_resend_later(ngx_http_idem_cmd_t *cmd)
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
    if (rd->cmd.reconnect.timer_set
        && rd->cmd.backoff > NGX_HTTP_IDEM_BACKOFF_MIN)
    {
        ngx_del_timer(&rd->cmd.reconnect);
        rd->cmd.backoff = 0;
        ngx_http_idem_link_schedule(&rd->cmd);
    }

    return NGX_OK;
}


static void
ngx_http_idem_resend(ngx_http_idem_redis_t *rd)
{
    ngx_queue_t          *q;
    ngx_http_idem_cmd_t  *cmd;

    if (rd->resend_n) {
        ngx_log_error(NGX_LOG_NOTICE, rd->log, 0,
                      "idempotency: sending %ui unrecorded results again",
                      rd->resend_n);
    }

    while (!ngx_queue_empty(&rd->resend)) {
        q = ngx_queue_head(&rd->resend);
        ngx_queue_remove(q);

        cmd = ngx_queue_data(q, ngx_http_idem_cmd_t, queue);
        rd->resend_n--;
        rd->resend_size -= cmd->size;

        cmd->resent = 1;
        (void) ngx_http_idem_cmd_send(cmd, cmd->handler, cmd->data);
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
    int         n;
    ngx_uint_t  i;

    rd->timing_out = cmd;

    for (i = 0; i < 256 && rd->timing_out == cmd; i++) {
        if (rd->cmd.ac == NULL || rd->cmd.conn == NULL
            || ioctl(rd->cmd.conn->fd, FIONREAD, &n) == -1 || n <= 0)
        {
            break;
        }

        redisAsyncHandleRead(rd->cmd.ac);
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

    ngx_http_idem_redis_t  *rd;

    rd = cmd->redis;

    if (ngx_http_idem_cmd_drain(rd, cmd) == NGX_OK) {
        return;
    }

    ngx_log_error(NGX_LOG_ERR, rd->log, 0,
                  "idempotency: redis %V command timed out", &rd->name);
    ngx_http_idem_metrics_redis_error(NGX_HTTP_IDEM_RERR_TIMEOUT);

    if (!cmd->durable) {
        cmd->told = 1;

        if (cmd->handler) {
            cmd->handler(cmd, NULL);
        }
    }

    ngx_http_idem_link_recycle_later(&rd->cmd);
}


/*
 * The command in the Redis protocol, formatted here: hiredis's formatter
 * (sdscatfmt() per argument) was a seventh of a first write's instructions
 * in the worker (bench/RESULTS.md).  Short commands are built on the stack;
 * hiredis copies them into its output buffer either way.
 */
#define NGX_HTTP_IDEM_CMD_STACK  2048

static int
ngx_http_idem_cmd_write(redisAsyncContext *ac, ngx_http_idem_cmd_t *cmd)
{
    u_char      stack[NGX_HTTP_IDEM_CMD_STACK], *buf, *p;
    size_t      len;
    ngx_uint_t  i;
    int         rc;

    len = sizeof("*\r\n") - 1 + NGX_SIZE_T_LEN;

    for (i = 0; i < cmd->argc; i++) {
        len += sizeof("$\r\n\r\n") - 1 + NGX_SIZE_T_LEN + cmd->argvlen[i];
    }

    buf = (len <= sizeof(stack)) ? stack : ngx_alloc(len, cmd->redis->log);
    if (buf == NULL) {
        return REDIS_ERR;
    }

    p = ngx_sprintf(buf, "*%ui\r\n", cmd->argc);

    for (i = 0; i < cmd->argc; i++) {
        p = ngx_sprintf(p, "$%uz\r\n", cmd->argvlen[i]);
        p = ngx_cpymem(p, cmd->argv[i], cmd->argvlen[i]);
        *p++ = CR;
        *p++ = LF;
    }

    rc = redisAsyncFormattedCommand(ac, ngx_http_idem_redis_reply, cmd,
                                    (const char *) buf, p - buf);

    if (buf != stack) {
        ngx_free(buf);
    }

    return rc;
}


ngx_int_t
ngx_http_idem_cmd_send(ngx_http_idem_cmd_t *cmd,
    ngx_http_idem_reply_pt handler, void *data)
{
    ngx_http_idem_redis_t  *rd;

    rd = cmd->redis;

    cmd->handler = handler;
    cmd->data = data;

    if (rd->cmd.ac == NULL || rd->cmd.state == NGX_HTTP_IDEM_REDIS_DOWN
        || ngx_http_idem_cmd_write(rd->cmd.ac, cmd) != REDIS_OK)
    {
        /* not written: no callback will ever come for this one */
        if (ngx_http_idem_resend_later(cmd) == NGX_OK) {
            return NGX_AGAIN;
        }

        if (cmd->resent && !cmd->told && cmd->handler) {
            /* its sender is long gone: the handler is the one to know */
            cmd->told = 1;
            cmd->handler(cmd, NULL);
        }

        ngx_free(cmd);
        return NGX_ERROR;
    }

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
ngx_http_idem_cmd_eval(redisAsyncContext *ac, ngx_http_idem_cmd_t *cmd)
{
    ngx_http_idem_script_t  *s;

    s = &cmd->redis->scripts[cmd->script];

    cmd->eval = 1;
    cmd->argv[0] = "EVAL";
    cmd->argvlen[0] = sizeof("EVAL") - 1;
    cmd->argv[1] = (const char *) s->text.data;
    cmd->argvlen[1] = s->text.len;

    return ngx_http_idem_cmd_write(ac, cmd) == REDIS_OK ? NGX_OK : NGX_ERROR;
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

    if (reply == NULL || rd->locate == NULL
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
    ngx_http_idem_link_recycle_later(&rd->cmd);

    return NULL;
}


static void
ngx_http_idem_redis_reply(redisAsyncContext *ac, void *r, void *privdata)
{
    redisReply           *reply = r;
    ngx_http_idem_cmd_t  *cmd = privdata;

    reply = ngx_http_idem_cmd_unwritable(cmd, reply);

    if (reply && !cmd->eval && cmd->script != NGX_HTTP_IDEM_NSCRIPTS
        && ngx_http_idem_is_noscript(reply))
    {
        if (ngx_http_idem_cmd_eval(ac, cmd) == NGX_OK) {
            return;
        }

        reply = NULL;
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

    if (reply == NULL && ngx_http_idem_resend_later(cmd) == NGX_OK) {
        return;
    }

    if (!cmd->told && cmd->handler) {
        cmd->told = 1;
        cmd->redis->replying = ac;
        cmd->handler(cmd, reply);
        cmd->redis->replying = NULL;
    }

    ngx_free(cmd);
}


/* reply helpers */

ngx_int_t
ngx_http_idem_reply_str(redisReply *e, ngx_str_t *s)
{
    if (e->type != REDIS_REPLY_STRING && e->type != REDIS_REPLY_STATUS) {
        return NGX_ERROR;
    }

    s->data = (u_char *) e->str;
    s->len = e->len;

    return NGX_OK;
}


/*
 * An error reply that is about the data under the module's key (our own
 * script's complaint, or a foreign value), not about reaching Redis:
 * store-error rather than store-unavailable.
 */
ngx_uint_t
ngx_http_idem_reply_corrupt(redisReply *reply)
{
    return reply->type == REDIS_REPLY_ERROR
           && (ngx_strstr(reply->str, "IDEMCORRUPT")
               || ngx_strstr(reply->str, "WRONGTYPE"));
}


/*
 * The elements of an array reply as the pure-C decoders take them: the
 * first max of them in el, the reply's element count returned.
 */
size_t
ngx_http_idem_reply_elements(redisReply *reply, idem_rv_t *el, size_t max)
{
    size_t       i, n;
    redisReply  *e;

    n = ngx_min(reply->elements, max);

    for (i = 0; i < n; i++) {
        e = reply->element[i];
        el[i].is_str = (e->type == REDIS_REPLY_STRING
                        || e->type == REDIS_REPLY_STATUS);
        el[i].data = el[i].is_str ? e->str : NULL;
        el[i].len = el[i].is_str ? e->len : 0;
    }

    return reply->elements;
}


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

    if (rd->wait_last == wt) {
        rd->wait_last = NULL;
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
ngx_http_idem_replicas_send(ngx_http_idem_redis_t *rd, ngx_uint_t replicas,
    ngx_msec_t timeout)
{
    ngx_http_idem_cmd_t   *cmd;
    ngx_http_idem_wait_t  *wt;

    wt = ngx_alloc(sizeof(ngx_http_idem_wait_t), rd->log);
    if (wt == NULL) {
        return NULL;
    }

    cmd = ngx_http_idem_cmd_alloc(rd, 3, NULL, 2 * NGX_INT64_LEN, rd->log);
    if (cmd == NULL) {
        ngx_free(wt);
        return NULL;
    }

    ngx_queue_init(&wt->waiters);
    wt->replicas = replicas;
    wt->timeout = timeout;

    cmd->script = NGX_HTTP_IDEM_NSCRIPTS;
    cmd->arg0 = 1;
    cmd->argv[0] = (const char *) ngx_http_idem_wait_cmd.data;
    cmd->argvlen[0] = ngx_http_idem_wait_cmd.len;
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

    rd->wait_last = wt;

    return wt;
}


ngx_int_t
ngx_http_idem_replicas_wait(ngx_http_idem_redis_t *rd,
    ngx_http_idem_replicas_t *w, ngx_uint_t replicas, ngx_msec_t timeout)
{
    ngx_http_idem_wait_t  *wt;

    /*
     * WAIT counts the writes of the connection it is sent on: the reply
     * being handled must have come on the connection WAIT would go to.
     */
    if (rd->replying == NULL || rd->replying != rd->cmd.ac
        || rd->cmd.state != NGX_HTTP_IDEM_REDIS_READY)
    {
        return NGX_ERROR;
    }

    wt = rd->wait_last;

    if (wt == NULL || wt->replicas != replicas || wt->timeout != timeout) {
        wt = ngx_http_idem_replicas_send(rd, replicas, timeout);
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
