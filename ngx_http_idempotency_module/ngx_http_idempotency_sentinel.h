/*
 * Redis Sentinel as a topology of the transport: each worker asks the
 * sentinels where the master is, and hears +switch-master from one of
 * them.  It drives ngx_http_idem_redis_t through its locate hook and
 * ngx_http_idem_redis_located(); the transport does not know it exists.
 */

#ifndef NGX_HTTP_IDEMPOTENCY_SENTINEL_H
#define NGX_HTTP_IDEMPOTENCY_SENTINEL_H

#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_event.h>

#include "ngx_http_idempotency_transport.h"


typedef struct ngx_http_idem_sentinel_s  ngx_http_idem_sentinel_t;


/* one connection to a sentinel; its hiredis context outlives it */
typedef struct ngx_http_idem_sn_conn_s  ngx_http_idem_sn_conn_t;

typedef struct {
    ngx_http_idem_sentinel_t    *sn;
    ngx_http_idem_sn_conn_t     *sc;        /* the current connection */
    ngx_event_t                  timer;     /* connect, then the answer */
    ngx_event_t                  retry;     /* subscriber: after backoff */
    ngx_msec_t                   backoff;
    ngx_uint_t                   seed;      /* the sentinel in use */
    unsigned                     subscriber:1;
    unsigned                     subscribed:1;
} ngx_http_idem_sn_link_t;


struct ngx_http_idem_sentinel_s {
    ngx_str_t                    master;    /* the master's name */
    ngx_array_t                  seeds;     /* ngx_http_idem_addr_t */
    ngx_str_t                    password;  /* AUTH to the sentinels */

    ngx_http_idem_redis_t       *redis;
    ngx_log_t                   *log;
    ngx_http_idem_sn_link_t      ask;       /* get-master-addr-by-name */
    ngx_http_idem_sn_link_t      sub;       /* +switch-master */
    ngx_event_t                  start;
    unsigned                     asking:1;
    unsigned                     exiting:1;
};


void ngx_http_idem_sentinel_locate(ngx_http_idem_redis_t *rd);
void ngx_http_idem_sentinel_init_process(ngx_cycle_t *cycle,
    ngx_array_t *servers);
void ngx_http_idem_sentinel_exit_process(ngx_array_t *servers);

#endif /* NGX_HTTP_IDEMPOTENCY_SENTINEL_H */
