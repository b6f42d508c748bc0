/*
 * What ngx_http_idempotency_command.c exports: a command's arguments
 * (script or native, set by name, copied for a resend) and the parts of a
 * reply; part of the transport.
 */

#ifndef NGX_HTTP_IDEMPOTENCY_COMMAND_H
#define NGX_HTTP_IDEMPOTENCY_COMMAND_H

#include <ngx_config.h>
#include <ngx_core.h>
#include "ngx_http_idempotency_transport.h"


/*
 * A script command, EVALSHA <sha1> 1 <key> followed by the script's
 * arguments, or a native one, <name> <key> followed by nargs arguments;
 * the arguments are set by name with ngx_http_idem_cmd_set() and the like
 * into "size" bytes.
 */
ngx_http_idem_cmd_t *ngx_http_idem_cmd_create(ngx_http_idem_redis_t *rd,
    ngx_http_idem_script_e script, const u_char *key, size_t size,
    ngx_log_t *log);
ngx_http_idem_cmd_t *ngx_http_idem_cmd_create_keys(ngx_http_idem_redis_t *rd,
    ngx_http_idem_script_e script, const u_char *key, u_char **keys,
    ngx_uint_t n, size_t size, ngx_log_t *log);
ngx_http_idem_cmd_t *ngx_http_idem_cmd_create_more(ngx_http_idem_redis_t *rd,
    ngx_http_idem_script_e script, const u_char *key, u_char **keys,
    ngx_uint_t n, ngx_uint_t more, size_t size, ngx_log_t *log);
ngx_http_idem_cmd_t *ngx_http_idem_cmd_copy(ngx_http_idem_cmd_t *cmd);
ngx_http_idem_cmd_t *ngx_http_idem_cmd_native(ngx_http_idem_redis_t *rd,
    ngx_str_t *name, ngx_uint_t nargs, const u_char *key, size_t size,
    ngx_log_t *log);

/*
 * The native command names the sibling <key><sub> of its key instead (the
 * same hash tag: routed by the key); called before any argument is set,
 * with sublen bytes counted in its size.
 */
void ngx_http_idem_cmd_sibling(ngx_http_idem_cmd_t *cmd, const u_char *sub,
    size_t sublen);

/* words (static text) then nargs arguments set by name, on one link */
ngx_http_idem_cmd_t *ngx_http_idem_cmd_pinned(ngx_http_idem_link_t *lk,
    ngx_str_t *words, ngx_uint_t n, ngx_uint_t nargs, size_t size);

/* a command of no key (CLUSTER SLOTS), sent on one link: not routed */
ngx_http_idem_cmd_t *ngx_http_idem_cmd_on_link(ngx_http_idem_link_t *lk,
    ngx_str_t *words, ngx_uint_t n);
void ngx_http_idem_cmd_set(ngx_http_idem_cmd_t *cmd, ngx_uint_t arg,
    const void *data, size_t len);
u_char *ngx_http_idem_cmd_start(ngx_http_idem_cmd_t *cmd, ngx_uint_t arg);
void ngx_http_idem_cmd_end(ngx_http_idem_cmd_t *cmd, ngx_uint_t arg,
    u_char *end);
u_char *ngx_http_idem_cmd_reserve(ngx_http_idem_cmd_t *cmd, ngx_uint_t arg,
    size_t len);
void ngx_http_idem_cmd_set_num(ngx_http_idem_cmd_t *cmd, ngx_uint_t arg,
    int64_t n);
ngx_str_t ngx_http_idem_cmd_get(ngx_http_idem_cmd_t *cmd, ngx_uint_t arg);
ngx_str_t ngx_http_idem_cmd_key(ngx_http_idem_cmd_t *cmd);

/* reply helpers */
ngx_int_t ngx_http_idem_reply_str(redisReply *e, ngx_str_t *s);
ngx_uint_t ngx_http_idem_reply_corrupt(redisReply *reply);
ngx_uint_t ngx_http_idem_reply_tagged(redisReply *reply, const char *word);
size_t ngx_http_idem_reply_elements(redisReply *reply, idem_rv_t *el,
    size_t max);

#endif /* NGX_HTTP_IDEMPOTENCY_COMMAND_H */
