/*
 * Counters for idempotency_metrics, in one shared memory zone that every
 * worker adds to with atomic operations (no lock on the request path).
 * Without idempotency_metrics_zone every update is a test of one pointer.
 *
 * The transport reports Redis timings, errors and its connections; the
 * request flow reports outcomes and stored bytes.  Nothing here knows an
 * HTTP request, so both may call it.
 */

#ifndef NGX_HTTP_IDEMPOTENCY_METRICS_H
#define NGX_HTTP_IDEMPOTENCY_METRICS_H

#include <ngx_config.h>
#include <ngx_core.h>


typedef enum {
    NGX_HTTP_IDEM_RERR_CONNECT = 0,   /* a connect or set-up failed */
    NGX_HTTP_IDEM_RERR_LOST,          /* an open connection went */
    NGX_HTTP_IDEM_RERR_TIMEOUT,       /* no reply within timeout= */
    NGX_HTTP_IDEM_RERR_REPLY,         /* an error reply (OOM, NOPERM, ...) */
    NGX_HTTP_IDEM_RERR_KINDS
} ngx_http_idem_redis_error_e;


/* outcomes counted: ngx_http_idem_outcome_e without "none" (checked there) */
#define NGX_HTTP_IDEM_METRICS_OUTCOMES  10


typedef struct ngx_http_idem_metrics_s  ngx_http_idem_metrics_t;

/* the worker's counters, NULL without idempotency_metrics_zone */
extern ngx_http_idem_metrics_t  *ngx_http_idem_metrics;


/* a monotonic clock in microseconds, read only when metrics are on */
uint64_t ngx_http_idem_metrics_now(void);

void ngx_http_idem_metrics_redis_reply(uint64_t sent);
void ngx_http_idem_metrics_redis_error(ngx_http_idem_redis_error_e kind);
void ngx_http_idem_metrics_redis_link(ngx_int_t delta);

/* outcome: an ngx_http_idem_outcome_e; label: an index from _label_add */
void ngx_http_idem_metrics_request(ngx_uint_t label, ngx_uint_t outcome);
void ngx_http_idem_metrics_stored(size_t bytes);
void ngx_http_idem_metrics_audit(ngx_uint_t entries, ngx_uint_t lost);
void ngx_http_idem_metrics_audit_error(void);

/* configuration */
ngx_int_t ngx_http_idem_metrics_label_add(ngx_conf_t *cf, ngx_array_t *labels,
    ngx_str_t *name, ngx_uint_t *index);
ngx_shm_zone_t *ngx_http_idem_metrics_zone(ngx_conf_t *cf, ngx_str_t *name,
    size_t size, ngx_array_t *labels, void *tag);
void ngx_http_idem_metrics_init_process(ngx_shm_zone_t *zone);

/* the text of a scrape: Prometheus text format 0.0.4 */
ngx_int_t ngx_http_idem_metrics_text(ngx_pool_t *pool, ngx_shm_zone_t *zone,
    ngx_str_t *outcomes, ngx_uint_t noutcomes, ngx_str_t *text);

#endif /* NGX_HTTP_IDEMPOTENCY_METRICS_H */
