/*
 * What ngx_http_idempotency_redis.c exports: the transport's worker start
 * and exit, the links (a Cluster node's too), a Sentinel's answer, and
 * sending a command.  The transport's types are in
 * ngx_http_idempotency_transport.h.
 */

#ifndef NGX_HTTP_IDEMPOTENCY_REDIS_H
#define NGX_HTTP_IDEMPOTENCY_REDIS_H

#include <ngx_config.h>
#include <ngx_core.h>
#include "ngx_http_idempotency_transport.h"


ngx_int_t ngx_http_idem_redis_init_process(ngx_cycle_t *cycle,
    ngx_array_t *servers, ngx_http_idem_script_t *scripts);
void ngx_http_idem_redis_exit_process(ngx_array_t *servers);

/*
 * The answer to locate: the master's numeric address, or host NULL when
 * nobody could say (the links try again after their backoff).  A new
 * address drops the links to the old one.  Commands sent while a Sentinel
 * topology had no link and was being asked waited for this answer: they go
 * to the master named, or are answered NULL when there is none.
 */
void ngx_http_idem_redis_located(ngx_http_idem_redis_t *rd, ngx_str_t *host,
    ngx_int_t port);

/*
 * A Cluster node's command link, to host (numeric, NUL-terminated) and
 * port: opened (again, after a stop), and stopped when its node has left
 * the slot map.  Its memory must stay until ngx_http_idem_link_close().
 */
void ngx_http_idem_link_open(ngx_http_idem_link_t *lk,
    ngx_http_idem_redis_t *rd, u_char *host, int port, const char *label);
void ngx_http_idem_link_stop(ngx_http_idem_link_t *lk);
void ngx_http_idem_link_close(ngx_http_idem_link_t *lk);

/* PUBLISH IDEM_CHANNEL <key>: a record somebody waits for has changed */
ngx_int_t ngx_http_idem_announce(ngx_http_idem_redis_t *rd,
    const u_char *key, ngx_log_t *log);

/*
 * NGX_OK: the handler will be called once (or, with handler NULL, the
 * command is just sent).  A command that finds no link while a Sentinel
 * topology asks where its master is waits for the answer, at most
 * connect_timeout + timeout, and is NGX_OK too.  NGX_AGAIN: a durable
 * command that could not be written now is kept and sent once Redis is
 * back; its handler is called then.  NGX_ERROR: nothing was sent and the
 * command is freed.
 */
ngx_int_t ngx_http_idem_cmd_send(ngx_http_idem_cmd_t *cmd,
    ngx_http_idem_reply_pt handler, void *data);

#endif /* NGX_HTTP_IDEMPOTENCY_REDIS_H */
