/*
 * The module's Lua scripts (the .lua files of redis-scripts, compiled in
 * by config): one enum value per script and one named index per script
 * argument, both generated from the scripts' own "--: args" lines.
 */

#ifndef NGX_HTTP_IDEMPOTENCY_SCRIPT_H
#define NGX_HTTP_IDEMPOTENCY_SCRIPT_H

#include <ngx_config.h>
#include <ngx_core.h>

#include "ngx_http_idempotency_script_args.h"


#define NGX_HTTP_IDEM_SHA1_HEX  40


typedef struct {
    const char                  *name;      /* for logs */
    ngx_str_t                    text;
    ngx_uint_t                   nargs;     /* ARGV, KEYS[1] not counted */
    u_char                       sha1[NGX_HTTP_IDEM_SHA1_HEX];
} ngx_http_idem_script_t;


/* the scripts and their SHA-1 digests (what EVALSHA names them by) */
ngx_http_idem_script_t *ngx_http_idem_scripts_init(ngx_pool_t *pool);

#endif /* NGX_HTTP_IDEMPOTENCY_SCRIPT_H */
