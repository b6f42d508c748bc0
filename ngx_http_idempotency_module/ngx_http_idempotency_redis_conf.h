/*
 * The parsers of the directives that name a Redis server (one topology per
 * scope) and of idempotency_redis_wait, for the command table of
 * ngx_http_idempotency_module.c.
 */

#ifndef NGX_HTTP_IDEMPOTENCY_REDIS_CONF_H
#define NGX_HTTP_IDEMPOTENCY_REDIS_CONF_H

#include <ngx_config.h>
#include <ngx_core.h>
#include "ngx_http_idempotency.h"


/* idempotency_redis address [db=] [user=] [password=] [timeouts] */
char *ngx_http_idem_redis(ngx_conf_t *cf, ngx_command_t *cmd, void *conf);

/* idempotency_redis_sentinel master host:port ... [options] */
char *ngx_http_idem_redis_sentinel(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf);

/* idempotency_redis_cluster host:port ... [user=] [password=] [timeouts] */
char *ngx_http_idem_redis_cluster(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf);

/* idempotency_redis_wait off | replicas [timeout], and its merge */
char *ngx_http_idem_redis_wait(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf);
char *ngx_http_idem_merge_redis_wait(ngx_conf_t *cf,
    ngx_http_idem_loc_conf_t *prev, ngx_http_idem_loc_conf_t *conf);

#endif /* NGX_HTTP_IDEMPOTENCY_REDIS_CONF_H */
