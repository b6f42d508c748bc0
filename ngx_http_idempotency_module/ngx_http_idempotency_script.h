/*
 * The module's Lua scripts (the .lua files of redis-scripts, compiled in
 * by config): one enum value per script and one named index per script
 * argument, both generated from the scripts' own "--: args" lines.
 */

#ifndef NGX_HTTP_IDEMPOTENCY_SCRIPT_H
#define NGX_HTTP_IDEMPOTENCY_SCRIPT_H

#include <ngx_config.h>
#include <ngx_core.h>

#include "ngx_http_idempotency_transport.h"


/* the scripts and their SHA-1 digests (what EVALSHA names them by) */
ngx_http_idem_script_t *ngx_http_idem_scripts_init(ngx_pool_t *pool);

#endif /* NGX_HTTP_IDEMPOTENCY_SCRIPT_H */
