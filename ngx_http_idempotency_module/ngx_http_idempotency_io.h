/*
 * The adapter between hiredis' asynchronous API and nginx's event loop
 * that every hiredis connection of the module goes through.
 */

#ifndef NGX_HTTP_IDEMPOTENCY_IO_H
#define NGX_HTTP_IDEMPOTENCY_IO_H

#include <ngx_config.h>
#include <ngx_core.h>

#include "ngx_http_idempotency_transport.h"


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
