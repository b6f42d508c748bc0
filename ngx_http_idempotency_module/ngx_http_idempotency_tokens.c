/*
 * The random names of an attempt: its operation id (shown to clients and
 * approvers) and its owner token (which fences every write of its record);
 * and $request_id, when the audit is the first to ask for it.
 */

#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_http.h>
#include <openssl/rand.h>

#include "ngx_http_idempotency.h"
#include "ngx_http_idempotency_tokens.h"


/*
 * Random bytes from a per-worker reserve filled by RAND_bytes() 4 KiB at
 * a time: every RAND_bytes() call runs OpenSSL's DRBG set-up and a getpid()
 * fork check, 7k instructions for 32 bytes (bench/RESULTS.md).  The reserve
 * is refilled when it runs out or when the process is not the one that
 * filled it (ngx_pid is set after fork), and used bytes are wiped.
 */
#define NGX_HTTP_IDEM_RANDOM_RESERVE  4096

static u_char *
ngx_http_idem_random(size_t n)
{
    static u_char     reserve[NGX_HTTP_IDEM_RANDOM_RESERVE];
    static size_t     left;
    static ngx_pid_t  filled_by;

    if (left < n || filled_by != ngx_pid) {
        if (RAND_bytes(reserve, sizeof(reserve)) != 1) {
            left = 0;
            return NULL;
        }

        left = sizeof(reserve);
        filled_by = ngx_pid;
    }

    left -= n;

    return reserve + left;
}


/* the operation id and the owner token */
ngx_int_t
ngx_http_idem_tokens(ngx_http_request_t *r, ngx_http_idem_ctx_t *ctx)
{
    u_char  *raw;

    ctx->op_id.data = ngx_pnalloc(r->pool, NGX_HTTP_IDEM_TOKEN_HEX);
    if (ctx->op_id.data == NULL) {
        return NGX_ERROR;
    }

    raw = ngx_http_idem_random(NGX_HTTP_IDEM_TOKEN_HEX);
    if (raw == NULL) {
        return NGX_ERROR;
    }

    ngx_hex_dump(ctx->op_id.data, raw, NGX_HTTP_IDEM_TOKEN_HEX / 2);
    ngx_hex_dump(ctx->owner, raw + NGX_HTTP_IDEM_TOKEN_HEX / 2,
                 NGX_HTTP_IDEM_TOKEN_HEX / 2);
    ngx_explicit_memzero(raw, NGX_HTTP_IDEM_TOKEN_HEX);
    ctx->op_id.len = NGX_HTTP_IDEM_TOKEN_HEX;

    return NGX_OK;
}


/*
 * $request_id as nginx makes it (16 random bytes in hex), the bytes taken
 * from the reserve instead of a RAND_bytes() call per request (about a
 * microsecond); given to the variable, so that the access log and a
 * proxy_set_header of $request_id print the id the audit entries carry.
 */
ngx_int_t
ngx_http_idem_request_id(ngx_http_request_t *r, ngx_http_variable_value_t *vv)
{
    u_char  *p, *raw;

    p = ngx_pnalloc(r->pool, NGX_HTTP_IDEM_TOKEN_HEX);
    raw = ngx_http_idem_random(NGX_HTTP_IDEM_TOKEN_HEX / 2);

    if (p == NULL || raw == NULL) {
        return NGX_ERROR;   /* nginx makes it then */
    }

    ngx_hex_dump(p, raw, NGX_HTTP_IDEM_TOKEN_HEX / 2);
    ngx_explicit_memzero(raw, NGX_HTTP_IDEM_TOKEN_HEX / 2);

    vv->len = NGX_HTTP_IDEM_TOKEN_HEX;
    vv->valid = 1;
    vv->no_cacheable = 0;
    vv->not_found = 0;
    vv->data = p;

    return NGX_OK;
}
