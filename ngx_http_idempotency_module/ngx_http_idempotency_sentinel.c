/*
 * Redis Sentinel: where the master is.  Each worker asks the configured
 * sentinels in order (SENTINEL get-master-addr-by-name, one connection per
 * question) whenever the transport has lost its master, and keeps one
 * subscription to +switch-master so that a failover moves its links at
 * once instead of at the next lost command.  All on hiredis' asynchronous
 * API in nginx's event loop: the answers are numeric addresses, the seeds
 * were resolved when the configuration was read, so nothing here blocks.
 */

#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_event.h>

#include "ngx_http_idempotency_sentinel.h"
#include "ngx_http_idempotency_command.h"
#include "ngx_http_idempotency_io.h"
#include "ngx_http_idempotency_redis.h"


struct ngx_http_idem_sn_conn_s {
    ngx_http_idem_sn_link_t     *lk;
    ngx_http_idem_io_t           io;
    ngx_event_t                  close;     /* free ac, then sc itself */
    unsigned                     dead:1;    /* hiredis freed ac */
};


static void ngx_http_idem_sn_failed(ngx_http_idem_sn_link_t *lk);
static void ngx_http_idem_sn_ask_next(ngx_http_idem_sentinel_t *sn);


static ngx_http_idem_addr_t *
ngx_http_idem_sn_seed(ngx_http_idem_sn_link_t *lk)
{
    ngx_http_idem_addr_t  *seeds = lk->sn->seeds.elts;

    return &seeds[lk->seed];
}


static const char *
ngx_http_idem_sn_what(ngx_http_idem_sn_link_t *lk)
{
    return lk->subscriber ? " (+switch-master)" : "";
}


/*
 * hiredis frees the context before its disconnect callback, which still
 * reads ac->data: the connection's own state is freed later, as a posted
 * event.
 */
static void
ngx_http_idem_sn_freed(ngx_http_idem_io_t *io)
{
    ngx_http_idem_sn_conn_t  *sc = io->data;

    sc->io.ac = NULL;
    sc->dead = 1;

    if (!sc->close.posted) {
        ngx_post_event(&sc->close, &ngx_posted_events);
    }
}


static void
ngx_http_idem_sn_close_handler(ngx_event_t *ev)
{
    ngx_http_idem_sn_conn_t  *sc = ev->data;

    if (sc->dead) {
        ngx_free(sc);
        return;
    }

    redisAsyncFree(sc->io.ac);            /* its cleanup posts us again */
}


/* the link lets go of its connection; safe inside hiredis' callbacks */
static void
ngx_http_idem_sn_drop(ngx_http_idem_sn_link_t *lk)
{
    ngx_http_idem_sn_conn_t  *sc = lk->sc;

    if (lk->timer.timer_set) {
        ngx_del_timer(&lk->timer);
    }

    if (sc == NULL) {
        return;
    }

    lk->sc = NULL;

    if (!sc->close.posted) {
        ngx_post_event(&sc->close, &ngx_posted_events);
    }
}


static void
ngx_http_idem_sn_on_connect(const redisAsyncContext *ac, int status)
{
    ngx_http_idem_sn_conn_t  *sc = ac->data;
    ngx_http_idem_sn_link_t  *lk = sc->lk;

    if (lk->sc != sc) {
        return;
    }

    if (status == REDIS_OK) {
        if (!lk->subscriber) {
            /*
             * connected: from now on the command timeout; deleted first,
             * or nginx keeps a timer that moves by less than 300 ms
             * (NGX_TIMER_LAZY_DELAY), and the answer had connect_timeout
             */
            if (lk->timer.timer_set) {
                ngx_del_timer(&lk->timer);
            }

            ngx_add_timer(&lk->timer, lk->sn->redis->timeout);
        }

        return;
    }

    ngx_log_error(NGX_LOG_ERR, lk->sn->log, 0,
                  "idempotency: connect to sentinel %V%s failed: %s",
                  &ngx_http_idem_sn_seed(lk)->name, ngx_http_idem_sn_what(lk),
                  ac->errstr);

    lk->sc = NULL;                     /* hiredis frees the context now */
    ngx_http_idem_sn_failed(lk);
}


static void
ngx_http_idem_sn_on_disconnect(const redisAsyncContext *ac, int status)
{
    ngx_http_idem_sn_conn_t  *sc = ac->data;
    ngx_http_idem_sn_link_t  *lk = sc->lk;

    if (lk->sc != sc) {
        return;                        /* dropped on purpose */
    }

    lk->sc = NULL;

    if (!lk->sn->exiting) {
        ngx_log_error(NGX_LOG_ERR, lk->sn->log, 0,
                      "idempotency: sentinel %V%s connection lost: %s",
                      &ngx_http_idem_sn_seed(lk)->name,
                      ngx_http_idem_sn_what(lk),
                      ac->errstr ? ac->errstr : "closed");
    }

    ngx_http_idem_sn_failed(lk);
}


static ngx_http_idem_sn_conn_t *
ngx_http_idem_sn_attach(ngx_http_idem_sn_link_t *lk, redisAsyncContext *ac)
{
    ngx_log_t                *log = lk->sn->log;
    ngx_http_idem_sn_conn_t  *sc;

    sc = ngx_calloc(sizeof(ngx_http_idem_sn_conn_t), log);
    if (sc == NULL) {
        return NULL;
    }

    if (ngx_http_idem_io_attach(&sc->io, ac, log, sc,
                                ngx_http_idem_sn_on_connect,
                                ngx_http_idem_sn_on_disconnect)
        != NGX_OK)
    {
        ngx_free(sc);
        return NULL;
    }

    sc->lk = lk;
    sc->io.freed = ngx_http_idem_sn_freed;
    sc->close.handler = ngx_http_idem_sn_close_handler;
    sc->close.data = sc;
    sc->close.log = log;

    return sc;
}


/* an error answer to AUTH: this sentinel is no use */
static void
ngx_http_idem_sn_auth(redisAsyncContext *ac, void *r, void *privdata)
{
    redisReply               *reply = r;
    ngx_http_idem_sn_conn_t  *sc = ac->data;
    ngx_http_idem_sn_link_t  *lk = sc->lk;

    if (reply == NULL || lk->sc != sc || reply->type != REDIS_REPLY_ERROR) {
        return;
    }

    ngx_log_error(NGX_LOG_ERR, lk->sn->log, 0,
                  "idempotency: sentinel %V%s: AUTH failed: %*s",
                  &ngx_http_idem_sn_seed(lk)->name, ngx_http_idem_sn_what(lk),
                  (size_t) reply->len, reply->str);

    ngx_http_idem_sn_drop(lk);
    ngx_http_idem_sn_failed(lk);
}


static void ngx_http_idem_sn_answer(redisAsyncContext *ac, void *r,
    void *privdata);
static void ngx_http_idem_sn_message(redisAsyncContext *ac, void *r,
    void *privdata);


static ngx_int_t
ngx_http_idem_sn_open(ngx_http_idem_sn_link_t *lk)
{
    redisAsyncContext         *ac;
    ngx_http_idem_addr_t      *a;
    ngx_http_idem_sentinel_t  *sn = lk->sn;

    a = ngx_http_idem_sn_seed(lk);

    ac = redisAsyncConnect((char *) a->host, a->port);
    if (ac == NULL || ac->err) {
        ngx_log_error(NGX_LOG_ERR, sn->log, 0,
                      "idempotency: connect to sentinel %V%s failed: %s",
                      &a->name, ngx_http_idem_sn_what(lk),
                      ac ? ac->errstr : "no memory");
        goto failed;
    }

    lk->sc = ngx_http_idem_sn_attach(lk, ac);
    if (lk->sc == NULL) {
        goto failed;
    }

    if (sn->password.len) {
        (void) redisAsyncCommand(ac, ngx_http_idem_sn_auth, NULL, "AUTH %b",
                                 sn->password.data, sn->password.len);
    }

    if (lk->subscriber) {
        (void) redisAsyncCommand(ac, ngx_http_idem_sn_message, NULL,
                                 "SUBSCRIBE +switch-master");
    } else {
        (void) redisAsyncCommand(ac, ngx_http_idem_sn_answer, NULL,
                                 "SENTINEL get-master-addr-by-name %b",
                                 sn->master.data, sn->master.len);
    }

    /* until connected (the subscriber: until subscribed) */
    ngx_add_timer(&lk->timer, sn->redis->connect_timeout);
    ngx_http_idem_io_connect(&lk->sc->io);

    return NGX_OK;

failed:

    if (ac) {
        redisAsyncFree(ac);
    }

    return NGX_ERROR;
}


static void
ngx_http_idem_sn_timeout(ngx_event_t *ev)
{
    ngx_http_idem_sn_link_t  *lk = ev->data;

    ngx_log_error(NGX_LOG_ERR, lk->sn->log, 0,
                  "idempotency: sentinel %V%s timed out",
                  &ngx_http_idem_sn_seed(lk)->name, ngx_http_idem_sn_what(lk));

    ngx_http_idem_sn_drop(lk);
    ngx_http_idem_sn_failed(lk);
}


/*
 * The subscriber moves on to the next sentinel after a backoff; the
 * question goes to the next sentinel at once, and when none is left the
 * transport's links wait their own backoff before asking again.
 */
static void
ngx_http_idem_sn_failed(ngx_http_idem_sn_link_t *lk)
{
    ngx_http_idem_sentinel_t  *sn = lk->sn;

    if (lk->timer.timer_set) {
        ngx_del_timer(&lk->timer);
    }

    if (sn->exiting) {
        return;
    }

    lk->seed++;

    if (!lk->subscriber) {
        ngx_http_idem_sn_ask_next(sn);
        return;
    }

    lk->subscribed = 0;
    lk->seed %= sn->seeds.nelts;
    lk->backoff = ngx_http_idem_backoff_step(lk->backoff);

    if (!lk->retry.timer_set) {
        ngx_add_timer(&lk->retry, ngx_http_idem_backoff_jitter(lk->backoff));
    }
}


static void
ngx_http_idem_sn_retry_handler(ngx_event_t *ev)
{
    ngx_http_idem_sn_link_t  *lk = ev->data;

    if (lk->sc == NULL && !lk->sn->exiting
        && ngx_http_idem_sn_open(lk) != NGX_OK)
    {
        ngx_http_idem_sn_failed(lk);
    }
}


static void
ngx_http_idem_sn_ask_next(ngx_http_idem_sentinel_t *sn)
{
    ngx_http_idem_sn_link_t  *lk = &sn->ask;

    for ( /* void */ ; lk->seed < sn->seeds.nelts; lk->seed++) {
        if (ngx_http_idem_sn_open(lk) == NGX_OK) {
            return;
        }
    }

    sn->asking = 0;

    ngx_log_error(NGX_LOG_ERR, sn->log, 0,
                  "idempotency: no sentinel named the master \"%V\"",
                  &sn->master);

    ngx_http_idem_redis_located(sn->redis, NULL, 0);
}


/*
 * Only a numeric address is taken: a host name would make hiredis call
 * getaddrinfo(), which blocks the worker.
 */
static ngx_int_t
ngx_http_idem_sn_address(ngx_str_t *host, ngx_str_t *port, ngx_int_t *n)
{
    *n = ngx_atoi(port->data, port->len);

    if (*n < 1 || *n > 65535 || !ngx_http_idem_numeric_host(host)) {
        return NGX_ERROR;
    }

    return NGX_OK;
}


static void
ngx_http_idem_sn_answer(redisAsyncContext *ac, void *r, void *privdata)
{
    redisReply                *reply = r;
    ngx_http_idem_sn_conn_t   *sc = ac->data;
    ngx_http_idem_sn_link_t   *lk = sc->lk;
    ngx_http_idem_sentinel_t  *sn = lk->sn;

    ngx_int_t  port;
    ngx_str_t  host, p;

    if (reply == NULL || lk->sc != sc) {
        return;
    }

    ngx_http_idem_sn_drop(lk);

    if (reply->type != REDIS_REPLY_ARRAY || reply->elements != 2
        || ngx_http_idem_reply_str(reply->element[0], &host) != NGX_OK
        || ngx_http_idem_reply_str(reply->element[1], &p) != NGX_OK
        || ngx_http_idem_sn_address(&host, &p, &port) != NGX_OK)
    {
        ngx_log_error(NGX_LOG_ERR, sn->log, 0,
                      "idempotency: sentinel %V does not name a numeric "
                      "address for the master \"%V\"%s%*s",
                      &ngx_http_idem_sn_seed(lk)->name, &sn->master,
                      reply->type == REDIS_REPLY_ERROR ? ": " : "",
                      reply->type == REDIS_REPLY_ERROR ? (size_t) reply->len
                                                       : 0,
                      reply->str);
        ngx_http_idem_sn_failed(lk);
        return;
    }

    sn->asking = 0;
    ngx_http_idem_redis_located(sn->redis, &host, port);
}


static void
ngx_http_idem_sn_start_handler(ngx_event_t *ev)
{
    ngx_http_idem_sentinel_t  *sn = ev->data;

    sn->ask.seed = 0;
    ngx_http_idem_sn_ask_next(sn);
}


/*
 * The transport's locate hook.  The question starts from a posted event:
 * the caller is in the middle of setting up its own links.
 */
void
ngx_http_idem_sentinel_locate(ngx_http_idem_redis_t *rd)
{
    ngx_http_idem_sentinel_t  *sn = rd->locate_data;

    if (sn->asking || sn->exiting) {
        return;
    }

    sn->asking = 1;
    ngx_post_event(&sn->start, &ngx_posted_events);
}


/* "<name> <old ip> <old port> <new ip> <new port>" */
static void
ngx_http_idem_sn_switch(ngx_http_idem_sentinel_t *sn, ngx_str_t *msg)
{
    u_char     *p, *last;
    ngx_str_t   f[5];
    ngx_int_t   port;
    ngx_uint_t  i;

    p = msg->data;
    last = msg->data + msg->len;

    for (i = 0; i < 5; i++) {
        f[i].data = p;

        while (p < last && *p != ' ') {
            p++;
        }

        f[i].len = p - f[i].data;

        if (p < last) {
            p++;
        }
    }

    if (f[0].len != sn->master.len
        || ngx_strncmp(f[0].data, sn->master.data, f[0].len) != 0)
    {
        return;                        /* another master of the sentinels */
    }

    if (ngx_http_idem_sn_address(&f[3], &f[4], &port) != NGX_OK) {
        ngx_log_error(NGX_LOG_ERR, sn->log, 0,
                      "idempotency: +switch-master \"%V\" without a numeric "
                      "address, asking the sentinels", msg);
        ngx_http_idem_sentinel_locate(sn->redis);
        return;
    }

    ngx_log_error(NGX_LOG_NOTICE, sn->log, 0,
                  "idempotency: sentinel: +switch-master %V", msg);

    ngx_http_idem_redis_located(sn->redis, &f[3], port);
}


static void
ngx_http_idem_sn_message(redisAsyncContext *ac, void *r, void *privdata)
{
    redisReply               *reply = r;
    ngx_http_idem_sn_conn_t  *sc = ac->data;
    ngx_http_idem_sn_link_t  *lk = sc->lk;

    ngx_str_t  type, msg;

    if (reply == NULL || lk->sc != sc || reply->type != REDIS_REPLY_ARRAY
        || reply->elements != 3
        || ngx_http_idem_reply_str(reply->element[0], &type) != NGX_OK)
    {
        return;
    }

    if (type.len == 9 && ngx_strncmp(type.data, "subscribe", 9) == 0) {
        if (lk->timer.timer_set) {
            ngx_del_timer(&lk->timer);
        }

        lk->subscribed = 1;
        lk->backoff = 0;

        ngx_log_error(NGX_LOG_INFO, lk->sn->log, 0,
                      "idempotency: sentinel %V: subscribed to "
                      "+switch-master", &ngx_http_idem_sn_seed(lk)->name);

        /* a switch may have gone unheard while nobody listened */
        ngx_http_idem_sentinel_locate(lk->sn->redis);
        return;
    }

    if (type.len == 7 && ngx_strncmp(type.data, "message", 7) == 0
        && ngx_http_idem_reply_str(reply->element[2], &msg) == NGX_OK)
    {
        ngx_http_idem_sn_switch(lk->sn, &msg);
    }
}


static void
ngx_http_idem_sn_link_init(ngx_http_idem_sn_link_t *lk,
    ngx_http_idem_sentinel_t *sn, ngx_uint_t subscriber)
{
    lk->sn = sn;
    lk->subscriber = subscriber;

    lk->timer.handler = ngx_http_idem_sn_timeout;
    lk->timer.data = lk;
    lk->timer.log = sn->log;
    lk->timer.cancelable = 1;

    lk->retry.handler = ngx_http_idem_sn_retry_handler;
    lk->retry.data = lk;
    lk->retry.log = sn->log;
    lk->retry.cancelable = 1;
}


void
ngx_http_idem_sentinel_init_process(ngx_cycle_t *cycle, ngx_array_t *servers)
{
    ngx_uint_t                 i;
    ngx_http_idem_redis_t    **rds;
    ngx_http_idem_sentinel_t  *sn;

    rds = servers->elts;

    for (i = 0; i < servers->nelts; i++) {
        if (rds[i]->topology != NGX_HTTP_IDEM_TOPO_SENTINEL) {
            continue;
        }

        sn = rds[i]->locate_data;
        sn->redis = rds[i];
        sn->log = cycle->log;

        sn->start.handler = ngx_http_idem_sn_start_handler;
        sn->start.data = sn;
        sn->start.log = cycle->log;

        ngx_http_idem_sn_link_init(&sn->ask, sn, 0);
        ngx_http_idem_sn_link_init(&sn->sub, sn, 1);

        if (ngx_http_idem_sn_open(&sn->sub) != NGX_OK) {
            ngx_http_idem_sn_failed(&sn->sub);
        }
    }
}


static void
ngx_http_idem_sn_link_close(ngx_http_idem_sn_link_t *lk)
{
    ngx_http_idem_sn_conn_t  *sc = lk->sc;

    if (lk->timer.timer_set) {
        ngx_del_timer(&lk->timer);
    }

    if (lk->retry.timer_set) {
        ngx_del_timer(&lk->retry);
    }

    lk->sc = NULL;

    if (sc && !sc->dead) {
        if (sc->close.posted) {
            ngx_delete_posted_event(&sc->close);
        }

        redisAsyncFree(sc->io.ac);
    }
}


void
ngx_http_idem_sentinel_exit_process(ngx_array_t *servers)
{
    ngx_uint_t                 i;
    ngx_http_idem_redis_t    **rds;
    ngx_http_idem_sentinel_t  *sn;

    rds = servers->elts;

    for (i = 0; i < servers->nelts; i++) {
        if (rds[i]->topology != NGX_HTTP_IDEM_TOPO_SENTINEL) {
            continue;
        }

        sn = rds[i]->locate_data;
        sn->exiting = 1;

        if (sn->start.posted) {
            ngx_delete_posted_event(&sn->start);
        }

        ngx_http_idem_sn_link_close(&sn->ask);
        ngx_http_idem_sn_link_close(&sn->sub);
    }
}
