/*
 * The one adapter between hiredis' asynchronous API and nginx's event
 * loop, for every hiredis connection of the module (the transport's links,
 * the sentinel connections): the fd as an nginx connection, the event
 * hooks hiredis calls, and hiredis's own close of the fd; and what those
 * connections share: the reconnect backoff, the check of an address that
 * connects without a name lookup.
 */

#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_event.h>

#include "ngx_http_idempotency_io.h"


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
    ngx_log_t *log, void *data, redisConnectCallback *on_connect,
    redisDisconnectCallback *on_disconnect)
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
    io->data = data;
    io->failed = NULL;
    io->freed = NULL;

    ac->data = data;

    redisAsyncSetConnectCallback(ac, on_connect);
    redisAsyncSetDisconnectCallback(ac, on_disconnect);

    return NGX_OK;
}


/* the first writable event tells hiredis that the connect finished */
void
ngx_http_idem_io_connect(ngx_http_idem_io_t *io)
{
    ngx_http_idem_io_add_write(io);
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
