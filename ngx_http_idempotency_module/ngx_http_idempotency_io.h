/*
 * The adapter between hiredis' asynchronous API and nginx's event loop
 * that every hiredis connection of the module goes through.
 */

#ifndef NGX_HTTP_IDEMPOTENCY_IO_H
#define NGX_HTTP_IDEMPOTENCY_IO_H

#include <ngx_config.h>
#include <ngx_core.h>

#include <hiredis/hiredis.h>
#include <hiredis/async.h>


/*
 * A hiredis context inside nginx's event loop, as every connection of the
 * module has it (the transport's links, the sentinel connections): its fd
 * wrapped in an nginx connection, level-triggered events so that replies
 * over 16 KiB keep flowing, and one close of the fd, hiredis's own.  The
 * owner keeps ac->data for itself; "freed" is told when hiredis frees the
 * context (its cleanup hook, before the disconnect callback), "failed"
 * when an event could not be added.
 */
typedef struct ngx_http_idem_io_s  ngx_http_idem_io_t;

typedef void (*ngx_http_idem_io_pt)(ngx_http_idem_io_t *io);

struct ngx_http_idem_io_s {
    redisAsyncContext           *ac;
    ngx_connection_t            *conn;
    ngx_http_idem_io_pt          failed;        /* may be NULL */
    ngx_http_idem_io_pt          freed;         /* may be NULL */
    void                        *data;
};


/*
 * ac becomes io's: its events are nginx's from now on.  ac->data and
 * io->data are the owner's data, the callbacks hiredis's connect and
 * disconnect callbacks; "failed" and "freed" are NULL until the owner sets
 * them.  Then ngx_http_idem_io_connect() waits for the connect to finish
 * (the first writable event).
 */
ngx_int_t ngx_http_idem_io_attach(ngx_http_idem_io_t *io,
    redisAsyncContext *ac, ngx_log_t *log, void *data,
    redisConnectCallback *on_connect, redisDisconnectCallback *on_disconnect);
void ngx_http_idem_io_connect(ngx_http_idem_io_t *io);

/* an IPv4 or IPv6 address: connecting to a name would block in getaddrinfo */
ngx_uint_t ngx_http_idem_numeric_host(ngx_str_t *host);

/* the reconnect backoff: 100 ms doubling up to 2 s, less up to a quarter */
#define NGX_HTTP_IDEM_BACKOFF_MIN  100
#define NGX_HTTP_IDEM_BACKOFF_MAX  2000

ngx_msec_t ngx_http_idem_backoff_step(ngx_msec_t backoff);
ngx_msec_t ngx_http_idem_backoff_jitter(ngx_msec_t backoff);

#endif /* NGX_HTTP_IDEMPOTENCY_IO_H */
