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
#include "ngx_http_idempotency_metrics.h"


#define NGX_HTTP_IDEM_BACKOFF_MIN  100
#define NGX_HTTP_IDEM_BACKOFF_MAX  2000


static void ngx_http_idem_link_schedule(ngx_http_idem_link_t *lk);
static void ngx_http_idem_link_recycle_later(ngx_http_idem_link_t *lk);
static void ngx_http_idem_link_init(ngx_http_idem_link_t *lk,
    ngx_http_idem_redis_t *rd, ngx_uint_t subscriber);
static void ngx_http_idem_waiters_wake(ngx_http_idem_redis_t *rd,
    const u_char *key);
static void ngx_http_idem_redis_reply(redisAsyncContext *ac, void *r,
    void *privdata);
static void ngx_http_idem_resend(ngx_http_idem_redis_t *rd);


/*
 * The event hooks hiredis calls, for every connection of the module:
 * level-triggered, so that a reply over 16 KiB (hiredis reads 16 KiB per
 * call) keeps the socket readable until it is all read.
 */

static void
ngx_http_idem_io_event(ngx_http_idem_io_t *io, ngx_uint_t write,
    ngx_uint_t add)
{
    ngx_event_t  *ev;

    if (io->conn == NULL) {
        return;
    }

    ev = write ? io->conn->write : io->conn->read;

    if (add && !ev->active) {
        if (ngx_add_event(ev, write ? NGX_WRITE_EVENT : NGX_READ_EVENT,
                          NGX_LEVEL_EVENT)
            != NGX_OK && io->failed)
        {
            io->failed(io);
        }

    } else if (!add && ev->active) {
        ngx_del_event(ev, write ? NGX_WRITE_EVENT : NGX_READ_EVENT, 0);
    }
}


static void
ngx_http_idem_io_add_read(void *privdata)
{
    ngx_http_idem_io_event(privdata, 0, 1);
}


static void
ngx_http_idem_io_del_read(void *privdata)
{
    ngx_http_idem_io_event(privdata, 0, 0);
}


static void
ngx_http_idem_io_add_write(void *privdata)
{
    ngx_http_idem_io_event(privdata, 1, 1);
}


static void
ngx_http_idem_io_del_write(void *privdata)
{
    ngx_http_idem_io_event(privdata, 1, 0);
}


/*
 * hiredis closes the fd itself (redisFree), so the nginx connection is
 * only unhooked and returned, never closed: one fd, one close.
 */
static void
ngx_http_idem_io_cleanup(void *privdata)
{
    ngx_http_idem_io_t  *io = privdata;

    ngx_connection_t  *c;

    c = io->conn;

    if (c) {
        ngx_http_idem_io_event(io, 0, 0);
        ngx_http_idem_io_event(io, 1, 0);

        io->conn = NULL;

        if (c->read->posted) {
            ngx_delete_posted_event(c->read);
        }

        if (c->write->posted) {
            ngx_delete_posted_event(c->write);
        }

        ngx_free_connection(c);
        c->fd = (ngx_socket_t) -1;
    }

    if (io->freed) {
        io->freed(io);
    }
}


static void
ngx_http_idem_io_read_handler(ngx_event_t *ev)
{
    ngx_connection_t    *c = ev->data;
    ngx_http_idem_io_t  *io = c->data;

    if (io->ac) {
        redisAsyncHandleRead(io->ac);
    }
}


static void
ngx_http_idem_io_write_handler(ngx_event_t *ev)
{
    ngx_connection_t    *c = ev->data;
    ngx_http_idem_io_t  *io = c->data;

    if (io->ac) {
        redisAsyncHandleWrite(io->ac);
    }
}


ngx_int_t
ngx_http_idem_io_attach(ngx_http_idem_io_t *io, redisAsyncContext *ac,
    ngx_log_t *log)
{
    ngx_connection_t  *c;

    c = ngx_get_connection(ac->c.fd, log);
    if (c == NULL) {
        return NGX_ERROR;
    }

    c->data = io;
    c->read->handler = ngx_http_idem_io_read_handler;
    c->write->handler = ngx_http_idem_io_write_handler;
    c->read->log = log;
    c->write->log = log;

    ac->ev.data = io;
    ac->ev.addRead = ngx_http_idem_io_add_read;
    ac->ev.delRead = ngx_http_idem_io_del_read;
    ac->ev.addWrite = ngx_http_idem_io_add_write;
    ac->ev.delWrite = ngx_http_idem_io_del_write;
    ac->ev.cleanup = ngx_http_idem_io_cleanup;

    io->ac = ac;
    io->conn = c;

    return NGX_OK;
}


/* the first writable event tells hiredis that the connect finished */
void
ngx_http_idem_io_connect(ngx_http_idem_io_t *io)
{
    ngx_http_idem_io_add_write(io);
}


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
    if (rd->locate && rd->route == NULL) {
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
    if (ngx_http_idem_io_attach(&lk->io, ac, lk->redis->log) != NGX_OK) {
        return NGX_ERROR;
    }

    lk->io.data = lk;
    lk->io.failed = ngx_http_idem_link_failed;
    lk->io.freed = NULL;
    ac->data = lk;

    redisAsyncSetConnectCallback(ac, ngx_http_idem_link_on_connect);
    redisAsyncSetDisconnectCallback(ac, ngx_http_idem_link_on_disconnect);

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
     */
    if (rd->locate && lk->gen == rd->gen && !lk->node) {
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

    if (host == NULL) {
        if (rd->cmd.redis && rd->cmd.io.ac == NULL) {
            ngx_http_idem_link_schedule(&rd->cmd);
        }

        if (rd->sub.redis && rd->sub.io.ac == NULL) {
            ngx_http_idem_link_schedule(&rd->sub);
        }

        return;
    }

    moved = (rd->port != port || rd->host.len != host->len
             || ngx_strncmp(rd->host.data, host->data, host->len) != 0);

    if (moved) {
        ngx_log_error(NGX_LOG_NOTICE, rd->log, 0,
                      "idempotency: redis %V: %s at %V:%i", &rd->name,
                      rd->route ? "subscriber" : "master", host, port);
    }

    rd->host.len = ngx_min(host->len, NGX_SOCKADDR_STRLEN);
    rd->host.data = rd->addr;
    *ngx_cpymem(rd->addr, host->data, rd->host.len) = '\0';
    rd->port = (int) port;
    rd->gen++;

    ngx_http_idem_link_follow(&rd->cmd, moved);
    ngx_http_idem_link_follow(&rd->sub, moved);

    /* a Cluster's new slot map: what waited for a node may go now */
    if (rd->route) {
        ngx_http_idem_resend(rd);
    }
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

        /* a Cluster's command links are its nodes' */
        if (rd->route == NULL) {
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
 * A script of the record key and n more keys (at most 4: the unique key,
 * the lock key and the key naming the lock of idempotency_unique and
 * idempotency_lock, the audit stream): they are the script's KEYS[2..n+1].
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

    static const char    *numkeys[] = { "1", "2", "3", "4", "5" };

    if (n >= sizeof(numkeys) / sizeof(numkeys[0])) {
        return NULL;
    }

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


void
ngx_http_idem_cmd_sibling(ngx_http_idem_cmd_t *cmd, const u_char *sub,
    size_t sublen)
{
    /* the key is the block's first bytes: the sibling's name goes on */
    cmd->pos = ngx_cpymem(cmd->pos, sub, sublen);
    cmd->argvlen[1] = IDEM_RECORD_KEY_LEN + sublen;
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

    /* sent afresh: routed again, never redirected yet */
    ngx_memzero(&copy->timer, sizeof(ngx_event_t));
    copy->told = 0;
    copy->resent = 0;
    copy->handler = NULL;
    copy->data = NULL;
    copy->link = cmd->pinned ? cmd->link : NULL;
    copy->redirects = 0;
    copy->asking = 0;

    return copy;
}


/* words (static text) then nargs arguments set by name, on one link */
static ngx_http_idem_cmd_t *
ngx_http_idem_cmd_pinned(ngx_http_idem_link_t *lk, ngx_str_t *words,
    ngx_uint_t n, ngx_uint_t nargs, size_t size)
{
    ngx_uint_t            i;
    ngx_http_idem_cmd_t  *cmd;

    cmd = ngx_http_idem_cmd_alloc(lk->redis, n + nargs, NULL, size,
                                  lk->redis->log);
    if (cmd == NULL) {
        return NULL;
    }

    cmd->script = NGX_HTTP_IDEM_NSCRIPTS;
    cmd->arg0 = n;
    cmd->link = lk;
    cmd->pinned = 1;

    for (i = 0; i < n; i++) {
        cmd->argv[i] = (const char *) words[i].data;
        cmd->argvlen[i] = words[i].len;
    }

    return cmd;
}


ngx_http_idem_cmd_t *
ngx_http_idem_cmd_on_link(ngx_http_idem_link_t *lk, ngx_str_t *words,
    ngx_uint_t n)
{
    return ngx_http_idem_cmd_pinned(lk, words, n, 0, 0);
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

    if (rd->route == NULL) {
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

static int
ngx_http_idem_cmd_write(redisAsyncContext *ac, ngx_http_idem_cmd_t *cmd)
{
    u_char      stack[NGX_HTTP_IDEM_CMD_STACK], *buf, *p;
    size_t      len;
    ngx_uint_t  i, argc;
    int         rc;

    /* the audit file's entries ride along for the reply, unsent */
    argc = cmd->argc - cmd->hidden;
    len = sizeof("*\r\n") - 1 + NGX_SIZE_T_LEN;

    for (i = 0; i < argc; i++) {
        len += sizeof("$\r\n\r\n") - 1 + NGX_SIZE_T_LEN + cmd->argvlen[i];
    }

    buf = (len <= sizeof(stack)) ? stack : ngx_alloc(len, cmd->redis->log);
    if (buf == NULL) {
        return REDIS_ERR;
    }

    p = ngx_sprintf(buf, "*%ui\r\n", argc);

    for (i = 0; i < argc; i++) {
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
        if (ngx_http_idem_resend_later(cmd, lk) == NGX_OK) {
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

    cmd->eval = 1;
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

    if (reply == NULL || rd->locate == NULL || rd->route
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

    if (rd->redirect == NULL || reply == NULL || cmd->told || cmd->pinned
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

    if (rd->route == NULL || reply == NULL
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


ngx_uint_t
ngx_http_idem_numeric_host(ngx_str_t *host)
{
#if (NGX_HAVE_INET6)
    u_char  addr[16];
#endif

    if (host->len == 0) {
        return 0;
    }

    if (ngx_inet_addr(host->data, host->len) != INADDR_NONE) {
        return 1;
    }

#if (NGX_HAVE_INET6)
    if (ngx_inet6_addr(host->data, host->len, addr) == NGX_OK) {
        return 1;
    }
#endif

    return 0;
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
