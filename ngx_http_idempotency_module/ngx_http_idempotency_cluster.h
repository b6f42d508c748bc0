/*
 * Redis Cluster as a topology of the transport: each worker reads the slot
 * map (CLUSTER SLOTS) from the nodes, keeps one command link per node, and
 * tells the transport, through its route and redirect hooks, which link a
 * key's command goes on.  The transport does not know this file exists.
 */

#ifndef NGX_HTTP_IDEMPOTENCY_CLUSTER_H
#define NGX_HTTP_IDEMPOTENCY_CLUSTER_H

#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_event.h>

#include "ngx_http_idempotency_transport.h"


typedef struct ngx_http_idem_cl_node_s  ngx_http_idem_cl_node_t;


typedef struct {
    ngx_array_t                  seeds;     /* ngx_http_idem_addr_t */
    ngx_http_idem_redis_t       *redis;     /* whose topology this is */

    /* each worker's */
    ngx_log_t                   *log;
    ngx_array_t                  nodes;     /* ngx_http_idem_cl_node_t * */
    ngx_http_idem_cl_node_t    **slots;     /* IDEM_SLOTS: each one's master */
    ngx_http_idem_cl_node_t     *sub;       /* where the subscriber goes */
    ngx_event_t                  refresh;   /* the next CLUSTER SLOTS */
    ngx_msec_t                   backoff;
    ngx_msec_t                   last;      /* when the last one was sent */
    ngx_uint_t                   next;      /* the node to ask next */
    ngx_uint_t                   epoch;     /* of the slot map */
    unsigned                     asking:1;  /* a CLUSTER SLOTS in flight */
    unsigned                     again:1;   /* wanted again meanwhile */
    unsigned                     known:1;   /* a slot map was read */
} ngx_http_idem_cluster_t;


/* the transport's hooks (ngx_http_idem_redis_t: locate, route, redirect) */
void ngx_http_idem_cluster_locate(ngx_http_idem_redis_t *rd);
ngx_http_idem_link_t *ngx_http_idem_cluster_route(ngx_http_idem_redis_t *rd,
    const u_char *key);
ngx_http_idem_link_t *ngx_http_idem_cluster_redirect(
    ngx_http_idem_redis_t *rd, ngx_http_idem_link_t *from,
    idem_redirect_t *to);

ngx_int_t ngx_http_idem_cluster_init_process(ngx_cycle_t *cycle,
    ngx_array_t *servers);
void ngx_http_idem_cluster_exit_process(ngx_array_t *servers);

#endif /* NGX_HTTP_IDEMPOTENCY_CLUSTER_H */
