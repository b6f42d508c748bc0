/*
 * The request flow of DESIGN.md section 2: read the body, fingerprint it,
 * claim (scope, key) in Redis with one script, then act on the answer.
 */

#include <openssl/evp.h>
#include <openssl/rand.h>

#include "ngx_http_idempotency.h"


/* bodies above this may take long enough to hash that time must be read */
#define NGX_HTTP_IDEM_BIG_BODY    (256 * 1024)

/* how often a waiter looks again while Redis cannot be reached */
#define NGX_HTTP_IDEM_RECHECK     500


static ngx_int_t ngx_http_idem_start(ngx_http_request_t *r,
    ngx_http_idem_ctx_t *ctx);
static void ngx_http_idem_body_handler(ngx_http_request_t *r);
static ngx_int_t ngx_http_idem_claim(ngx_http_request_t *r,
    ngx_http_idem_ctx_t *ctx);
static ngx_int_t ngx_http_idem_claim_fingerprinted(ngx_http_request_t *r,
    ngx_http_idem_ctx_t *ctx);
static ngx_int_t ngx_http_idem_claim_send(ngx_http_request_t *r,
    ngx_http_idem_ctx_t *ctx);
static void ngx_http_idem_claim_done(ngx_http_idem_cmd_t *cmd,
    redisReply *reply);
static ngx_int_t ngx_http_idem_act(ngx_http_request_t *r,
    ngx_http_idem_ctx_t *ctx);


static void
ngx_http_idem_cleanup(void *data)
{
    ngx_http_idem_ctx_t  *ctx = data;

    ngx_http_request_t  *r;

    r = ctx->request;

    if (ctx->cmd) {
        /* the reply finds no request and releases a claim it made */
        ctx->cmd->data = NULL;
        ctx->cmd = NULL;
    }

    if (ctx->renew.timer_set) {
        ngx_del_timer(&ctx->renew);
    }

    ngx_http_idem_wait_remove(ctx);

    if (ctx->wait_timer.timer_set) {
        ngx_del_timer(&ctx->wait_timer);
    }

    if (ctx->claimed && ctx->end == NGX_HTTP_IDEM_END_NONE) {
        /*
         * The request ends without a complete response having passed the
         * body filter: if nothing reached the upstream the key is free
         * again, otherwise the upstream may have acted.
         */
        if (r->upstream && !r->upstream->request_sent) {
            ngx_http_idem_finish(r, ctx, NGX_HTTP_IDEM_END_RELEASE);

        } else {
            ngx_log_error(NGX_LOG_WARN, r->connection->log, 0,
                          "idempotency: no complete response for key "
                          "\"%V\", outcome unknown%s", &ctx->key,
                          r->connection->error
                          ? " (the client went away first; "
                            "\"proxy_ignore_client_abort on\" lets the "
                            "response be read and recorded)"
                          : "");
            ngx_http_idem_finish(r, ctx, NGX_HTTP_IDEM_END_FAIL);
        }
    }
}


/*
 * Internal redirects (error_page, named locations) wipe r->ctx; the pool
 * cleanup still holds the context, so it is found again there.
 */
ngx_http_idem_ctx_t *
ngx_http_idem_get_ctx(ngx_http_request_t *r)
{
    ngx_pool_cleanup_t   *cln;
    ngx_http_idem_ctx_t  *ctx;

    ctx = ngx_http_get_module_ctx(r, ngx_http_idempotency_module);
    if (ctx) {
        return ctx;
    }

    for (cln = r->pool->cleanup; cln; cln = cln->next) {
        if (cln->handler == ngx_http_idem_cleanup) {
            ctx = cln->data;
            ngx_http_set_ctx(r, ctx, ngx_http_idempotency_module);
            return ctx;
        }
    }

    return NULL;
}


ngx_http_idem_ctx_t *
ngx_http_idem_create_ctx(ngx_http_request_t *r)
{
    ngx_pool_cleanup_t   *cln;
    ngx_http_idem_ctx_t  *ctx;

    ctx = ngx_pcalloc(r->pool, sizeof(ngx_http_idem_ctx_t));
    if (ctx == NULL) {
        return NULL;
    }

    cln = ngx_pool_cleanup_add(r->pool, 0);
    if (cln == NULL) {
        return NULL;
    }

    cln->handler = ngx_http_idem_cleanup;
    cln->data = ctx;

    ctx->request = r;
    ctx->route = r->uri;

    ngx_http_set_ctx(r, ctx, ngx_http_idempotency_module);

    return ctx;
}


/* status and admin locations name a record, they are not operations */
static ngx_uint_t
ngx_http_idem_wants(ngx_http_request_t *r, ngx_http_idem_loc_conf_t *lcf)
{
    return r == r->main && lcf->enable && !lcf->ops
           && (r->method & lcf->methods);
}


ngx_int_t
ngx_http_idem_rewrite_handler(ngx_http_request_t *r)
{
    ngx_http_idem_loc_conf_t  *lcf;

    lcf = ngx_http_get_module_loc_conf(r, ngx_http_idempotency_module);

    if (ngx_http_idem_wants(r, lcf) && ngx_http_idem_get_ctx(r) == NULL) {
        if (ngx_http_idem_create_ctx(r) == NULL) {
            return NGX_HTTP_INTERNAL_SERVER_ERROR;
        }
    }

    return NGX_DECLINED;
}


ngx_int_t
ngx_http_idem_precontent_handler(ngx_http_request_t *r)
{
    ngx_http_idem_ctx_t       *ctx;
    ngx_http_idem_loc_conf_t  *lcf;

    if (r != r->main) {
        return NGX_DECLINED;
    }

    ctx = ngx_http_idem_get_ctx(r);

    if (ctx == NULL || ctx->phase == NGX_HTTP_IDEM_NEW) {
        lcf = ngx_http_get_module_loc_conf(r, ngx_http_idempotency_module);

        if (!ngx_http_idem_wants(r, lcf)) {
            return NGX_DECLINED;
        }

        if (ctx == NULL) {
            ctx = ngx_http_idem_create_ctx(r);
            if (ctx == NULL) {
                return NGX_HTTP_INTERNAL_SERVER_ERROR;
            }
        }

        ctx->conf = lcf;

        return ngx_http_idem_start(r, ctx);
    }

    switch (ctx->phase) {

    case NGX_HTTP_IDEM_READING_BODY:
    case NGX_HTTP_IDEM_FINGERPRINTING:
    case NGX_HTTP_IDEM_CLAIMING:
    case NGX_HTTP_IDEM_WAITING:
        return NGX_DONE;

    case NGX_HTTP_IDEM_BODY_READ:
        return ngx_http_idem_claim(r, ctx);

    case NGX_HTTP_IDEM_FINGERPRINTED:
        return ngx_http_idem_claim_fingerprinted(r, ctx);

    case NGX_HTTP_IDEM_ANSWERED:
        return ngx_http_idem_act(r, ctx);

    default:
        return NGX_DECLINED;
    }
}


/* the phase handler has answered itself: the phases stop here */
static ngx_int_t
ngx_http_idem_finalize(ngx_http_request_t *r, ngx_int_t rc)
{
    ngx_http_finalize_request(r, rc);
    return NGX_DONE;
}


static ngx_int_t
ngx_http_idem_reject(ngx_http_request_t *r, ngx_http_idem_ctx_t *ctx,
    const char *slug, const char *detail)
{
    ngx_int_t  rc;

    ctx->phase = NGX_HTTP_IDEM_DONE;
    ctx->outcome = NGX_HTTP_IDEM_OUT_REJECTED;
    ngx_str_null(&ctx->key);

    rc = ngx_http_discard_request_body(r);
    if (rc != NGX_OK) {
        return rc;
    }

    return ngx_http_idem_finalize(r,
               ngx_http_idem_send_problem(r, ctx, NGX_HTTP_BAD_REQUEST, slug,
                                          NULL, detail));
}


/*
 * The request headers named name, one after the other: start with
 * it->part = NULL; NULL at the end.
 */
typedef struct {
    ngx_list_part_t  *part;
    ngx_uint_t        i;
} ngx_http_idem_hiter_t;


static ngx_table_elt_t *
ngx_http_idem_next_header(ngx_http_request_t *r, ngx_str_t *name,
    ngx_http_idem_hiter_t *it)
{
    ngx_table_elt_t  *h;

    if (it->part == NULL) {
        it->part = &r->headers_in.headers.part;
        it->i = 0;
    }

    for ( ;; ) {
        if (it->i >= it->part->nelts) {
            if (it->part->next == NULL) {
                return NULL;
            }

            it->part = it->part->next;
            it->i = 0;
            continue;
        }

        h = (ngx_table_elt_t *) it->part->elts + it->i++;

        if (h->key.len == name->len
            && ngx_strncasecmp(h->key.data, name->data, name->len) == 0)
        {
            return h;
        }
    }
}


/* the first header named name, and how many there are */
static ngx_table_elt_t *
ngx_http_idem_find_header(ngx_http_request_t *r, ngx_str_t *name,
    ngx_uint_t *count)
{
    ngx_table_elt_t        *h, *first;
    ngx_http_idem_hiter_t   it;

    it.part = NULL;
    first = ngx_http_idem_next_header(r, name, &it);
    *count = 0;

    for (h = first; h; h = ngx_http_idem_next_header(r, name, &it)) {
        (*count)++;
    }

    return first;
}


/*
 * NGX_OK with ctx->key set, NGX_DECLINED when there is no key header,
 * NGX_ERROR with *detail when it is malformed.
 */
ngx_int_t
ngx_http_idem_parse_key(ngx_http_request_t *r, ngx_http_idem_ctx_t *ctx,
    ngx_str_t *name, const char **detail)
{
    size_t            len;
    ngx_uint_t        count;
    idem_key_rc_t     krc;
    ngx_table_elt_t  *h;

    h = ngx_http_idem_find_header(r, name, &count);

    if (h == NULL) {
        return NGX_DECLINED;
    }

    if (count > 1) {
        *detail = "more than one idempotency key header";
        return NGX_ERROR;
    }

    ctx->key.data = ngx_pnalloc(r->pool, h->value.len + 1);
    if (ctx->key.data == NULL) {
        *detail = "out of memory";
        return NGX_ERROR;
    }

    krc = idem_key_parse((char *) h->value.data, h->value.len,
                         (char *) ctx->key.data, &len);
    if (krc != IDEM_KEY_OK) {
        ngx_str_null(&ctx->key);
        *detail = idem_key_strerror(krc);
        return NGX_ERROR;
    }

    ctx->key.len = len;

    return NGX_OK;
}


/* the record key: a digest of the evaluated scope and the key */
ngx_int_t
ngx_http_idem_record_key(ngx_http_request_t *r, ngx_http_idem_ctx_t *ctx,
    ngx_str_t *scope)
{
    ngx_str_null(scope);

    if (ctx->conf->scope
        && ngx_http_complex_value(r, ctx->conf->scope, scope) != NGX_OK)
    {
        return NGX_ERROR;
    }

    if (idem_record_key((const char *) scope->data, scope->len,
                        (const char *) ctx->key.data, ctx->key.len,
                        (char *) ctx->rkey)
        != 0)
    {
        return NGX_ERROR;
    }

    return NGX_OK;
}


static ngx_int_t
ngx_http_idem_start(ngx_http_request_t *r, ngx_http_idem_ctx_t *ctx)
{
    ngx_int_t                  rc;
    const char                *detail;
    ngx_http_idem_loc_conf_t  *lcf;

    lcf = ctx->conf;

    rc = ngx_http_idem_parse_key(r, ctx, &lcf->key_header, &detail);

    if (rc == NGX_DECLINED) {
        if (lcf->required) {
            return ngx_http_idem_reject(r, ctx, "key-missing",
                                        "this endpoint requires an "
                                        "idempotency key header");
        }

        ctx->phase = NGX_HTTP_IDEM_DONE;
        ctx->outcome = NGX_HTTP_IDEM_OUT_BYPASSED;
        return NGX_DECLINED;
    }

    if (rc != NGX_OK) {
        return ngx_http_idem_reject(r, ctx, "key-malformed", detail);
    }

    ctx->phase = NGX_HTTP_IDEM_READING_BODY;

    rc = ngx_http_read_client_request_body(r, ngx_http_idem_body_handler);

    if (rc >= NGX_HTTP_SPECIAL_RESPONSE) {
        return rc;
    }

    ngx_http_finalize_request(r, NGX_DONE);
    return NGX_DONE;
}


static void
ngx_http_idem_body_handler(ngx_http_request_t *r)
{
    ngx_http_idem_ctx_t  *ctx;

    ctx = ngx_http_idem_get_ctx(r);
    ctx->phase = NGX_HTTP_IDEM_BODY_READ;

    r->write_event_handler = ngx_http_core_run_phases;
    ngx_http_core_run_phases(r);
}


/* fingerprint */

static ngx_str_t *
ngx_http_idem_header_values(ngx_http_request_t *r, ngx_str_t *name)
{
    u_char                 *p;
    size_t                  len;
    ngx_str_t              *v;
    ngx_uint_t              n;
    ngx_table_elt_t        *h, *first;
    ngx_http_idem_hiter_t   it;

    first = ngx_http_idem_find_header(r, name, &n);
    if (first == NULL) {
        return NULL;
    }

    v = ngx_palloc(r->pool, sizeof(ngx_str_t));
    if (v == NULL) {
        return NULL;
    }

    if (n == 1) {
        *v = first->value;
        return v;
    }

    /* repeated fields are one list, as HTTP combines them */
    len = 0;
    it.part = NULL;

    while ((h = ngx_http_idem_next_header(r, name, &it))) {
        len += h->value.len + 2;
    }

    v->data = ngx_pnalloc(r->pool, len);
    if (v->data == NULL) {
        return NULL;
    }

    p = v->data;
    it.part = NULL;

    for (n = 0; (h = ngx_http_idem_next_header(r, name, &it)); n++) {
        if (n) {
            *p++ = ',';
            *p++ = ' ';
        }

        p = ngx_cpymem(p, h->value.data, h->value.len);
    }

    v->len = p - v->data;

    return v;
}


static ngx_int_t
ngx_http_idem_fp_headers(ngx_http_request_t *r, ngx_http_idem_ctx_t *ctx,
    idem_fp_input_t *in)
{
    ngx_str_t    *names, *value;
    ngx_uint_t    i, n;
    idem_str_t   *in_names, *in_values;
    ngx_array_t  *conf;

    conf = ctx->conf->fp_headers;
    if (conf == NULL || conf->nelts == 0) {
        return NGX_OK;
    }

    in_names = ngx_palloc(r->pool, conf->nelts * sizeof(idem_str_t));
    in_values = ngx_palloc(r->pool, conf->nelts * sizeof(idem_str_t));
    if (in_names == NULL || in_values == NULL) {
        return NGX_ERROR;
    }

    names = conf->elts;
    n = 0;

    for (i = 0; i < conf->nelts; i++) {
        value = ngx_http_idem_header_values(r, &names[i]);
        if (value == NULL) {
            continue;
        }

        in_names[n].data = (const char *) names[i].data;
        in_names[n].len = names[i].len;
        in_values[n].data = (const char *) value->data;
        in_values[n].len = value->len;
        n++;
    }

    in->header_names = in_names;
    in->header_values = in_values;
    in->nheaders = n;

    return NGX_OK;
}


/*
 * NGX_OK with ctx->fingerprint set, NGX_AGAIN while a thread computes it,
 * NGX_ERROR.
 */
static ngx_int_t
ngx_http_idem_fingerprint(ngx_http_request_t *r, ngx_http_idem_ctx_t *ctx)
{
    ngx_str_t         scope, *ct;
    idem_fp_input_t   in;

    if (ngx_http_idem_record_key(r, ctx, &scope) != NGX_OK) {
        return NGX_ERROR;
    }

    ngx_memzero(&in, sizeof(idem_fp_input_t));

    in.method.data = (const char *) r->method_name.data;
    in.method.len = r->method_name.len;
    in.route.data = (const char *) ctx->route.data;
    in.route.len = ctx->route.len;
    in.query.data = (const char *) r->args.data;
    in.query.len = r->args.len;
    in.scope.data = (const char *) scope.data;
    in.scope.len = scope.len;

    if (ngx_http_idem_fp_headers(r, ctx, &in) != NGX_OK) {
        return NGX_ERROR;
    }

    ct = r->headers_in.content_type ? &r->headers_in.content_type->value
                                    : NULL;

    in.body_json = ct && idem_media_type_is_json((const char *) ct->data,
                                                 ct->len);

    return ngx_http_idem_body_fingerprint(r, ctx, &in);
}


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
static ngx_int_t
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


/* claim */

static ngx_int_t
ngx_http_idem_claim(ngx_http_request_t *r, ngx_http_idem_ctx_t *ctx)
{
    switch (ngx_http_idem_fingerprint(r, ctx)) {

    case NGX_OK:
        break;

    case NGX_AGAIN:
        return NGX_DONE;

    default:
        return ngx_http_idem_finalize(r, NGX_HTTP_INTERNAL_SERVER_ERROR);
    }

    if (r->headers_in.content_length_n > NGX_HTTP_IDEM_BIG_BODY
        || r->headers_in.content_length_n < 0)
    {
        /*
         * A large body can take a while to canonicalize: the command
         * timer must count from now, not from when this event began.
         */
        ngx_time_update();
    }

    return ngx_http_idem_claim_fingerprinted(r, ctx);
}


static ngx_int_t
ngx_http_idem_claim_fingerprinted(ngx_http_request_t *r,
    ngx_http_idem_ctx_t *ctx)
{
    if (!ctx->fingerprinted || ngx_http_idem_tokens(r, ctx) != NGX_OK) {
        return ngx_http_idem_finalize(r, NGX_HTTP_INTERNAL_SERVER_ERROR);
    }

    if (ngx_http_idem_claim_send(r, ctx) == NGX_OK) {
        return NGX_DONE;
    }

    return ngx_http_idem_act(r, ctx);
}


static ngx_int_t
ngx_http_idem_claim_send(ngx_http_request_t *r, ngx_http_idem_ctx_t *ctx)
{
    u_char                    *p, lease[NGX_INT_T_LEN], ttl[NGX_TIME_T_LEN];
    ngx_http_idem_cmd_t       *cmd;
    ngx_http_idem_loc_conf_t  *lcf;

    lcf = ctx->conf;
    ctx->phase = NGX_HTTP_IDEM_CLAIMING;

    cmd = ngx_http_idem_cmd_create(lcf->redis, NGX_HTTP_IDEM_SCRIPT_CLAIM, 7,
                                   IDEM_RECORD_KEY_LEN + IDEM_FP_HEX_LEN
                                   + 2 * NGX_HTTP_IDEM_TOKEN_HEX
                                   + sizeof(lease) + sizeof(ttl) + 1,
                                   r->connection->log);
    if (cmd) {
        ngx_http_idem_cmd_arg(cmd, ctx->rkey, IDEM_RECORD_KEY_LEN);
        ngx_http_idem_cmd_arg(cmd, ctx->fingerprint, IDEM_FP_HEX_LEN);
        ngx_http_idem_cmd_arg(cmd, ctx->owner, NGX_HTTP_IDEM_TOKEN_HEX);
        ngx_http_idem_cmd_arg(cmd, ctx->op_id.data, NGX_HTTP_IDEM_TOKEN_HEX);
        p = ngx_sprintf(lease, "%M", lcf->lease);
        ngx_http_idem_cmd_arg(cmd, lease, p - lease);
        p = ngx_sprintf(ttl, "%T", lcf->ttl);
        ngx_http_idem_cmd_arg(cmd, ttl, p - ttl);
        ngx_http_idem_cmd_arg(cmd, lcf->wait ? "1" : "0", 1);

        if (ngx_http_idem_cmd_send(cmd, ngx_http_idem_claim_done, ctx)
            == NGX_OK)
        {
            ctx->cmd = cmd;
            return NGX_OK;
        }
    }

    ctx->answer = NGX_HTTP_IDEM_ANS_STORE_DOWN;
    ctx->phase = NGX_HTTP_IDEM_ANSWERED;

    return NGX_ERROR;
}


ngx_int_t
ngx_http_idem_reply_str(redisReply *e, ngx_str_t *s)
{
    if (e->type != REDIS_REPLY_STRING && e->type != REDIS_REPLY_STATUS) {
        return NGX_ERROR;
    }

    s->data = (u_char *) e->str;
    s->len = e->len;

    return NGX_OK;
}


/*
 * An error reply that is about the data under the module's key (our own
 * script's complaint, or a foreign value), not about reaching Redis:
 * store-error rather than store-unavailable.
 */
ngx_uint_t
ngx_http_idem_reply_corrupt(redisReply *reply)
{
    return reply->type == REDIS_REPLY_ERROR
           && (ngx_strstr(reply->str, "IDEMCORRUPT")
               || ngx_strstr(reply->str, "WRONGTYPE"));
}


/*
 * The elements of an array reply as the pure-C decoders take them: the
 * first max of them in el, the reply's element count returned.
 */
size_t
ngx_http_idem_reply_elements(redisReply *reply, idem_rv_t *el, size_t max)
{
    size_t       i, n;
    redisReply  *e;

    n = ngx_min(reply->elements, max);

    for (i = 0; i < n; i++) {
        e = reply->element[i];
        el[i].is_str = (e->type == REDIS_REPLY_STRING
                        || e->type == REDIS_REPLY_STATUS);
        el[i].data = el[i].is_str ? e->str : NULL;
        el[i].len = el[i].is_str ? e->len : 0;
    }

    return reply->elements;
}


ngx_uint_t
ngx_http_idem_is(ngx_str_t *s, const char *lit)
{
    size_t  len = ngx_strlen(lit);

    return s->len == len && ngx_strncmp(s->data, lit, len) == 0;
}


static ngx_int_t
ngx_http_idem_copy_rv(ngx_pool_t *pool, idem_rv_t *v, ngx_str_t *dst)
{
    dst->len = v->len;
    dst->data = ngx_pnalloc(pool, v->len + 1);
    if (dst->data == NULL) {
        return NGX_ERROR;
    }

    ngx_memcpy(dst->data, v->data, v->len);

    return NGX_OK;
}


static ngx_http_idem_answer_e
ngx_http_idem_parse_claim(ngx_http_request_t *r, ngx_http_idem_ctx_t *ctx,
    redisReply *reply)
{
    size_t         n;
    idem_rv_t      el[IDEM_CLAIM_ELEMS];
    idem_claim_t   c;

    if (reply == NULL) {
        return NGX_HTTP_IDEM_ANS_STORE_DOWN;
    }

    if (reply->type == REDIS_REPLY_ERROR) {
        ngx_log_error(NGX_LOG_ERR, r->connection->log, 0,
                      "idempotency: claim failed: %*s",
                      (size_t) reply->len, reply->str);

        if (ngx_http_idem_reply_corrupt(reply)) {
            return NGX_HTTP_IDEM_ANS_STORE_ERROR;
        }

        return NGX_HTTP_IDEM_ANS_STORE_DOWN;
    }

    if (reply->type != REDIS_REPLY_ARRAY) {
        goto invalid;
    }

    n = ngx_http_idem_reply_elements(reply, el, IDEM_CLAIM_ELEMS);

    if (idem_claim_decode(el, n, &c) == IDEM_CLAIM_INVALID) {
        goto invalid;
    }

    if (ngx_http_idem_copy_rv(r->pool, &c.op, &ctx->op_id) != NGX_OK) {
        return NGX_HTTP_IDEM_ANS_STORE_ERROR;
    }

    if (c.state) {
        ctx->state.data = (u_char *) c.state;
        ctx->state.len = ngx_strlen(c.state);
    }

    switch (c.kind) {

    case IDEM_CLAIM_CLAIMED:
        return NGX_HTTP_IDEM_ANS_CLAIMED;

    case IDEM_CLAIM_COMPLETED:
        if (ngx_http_idem_copy_rv(r->pool, &c.hdr, &ctx->stored_headers)
            != NGX_OK
            || ngx_http_idem_copy_rv(r->pool, &c.body, &ctx->stored_body)
               != NGX_OK)
        {
            return NGX_HTTP_IDEM_ANS_STORE_ERROR;
        }

        ctx->stored_status = c.status;
        ctx->body_stored = c.body_stored;
        return NGX_HTTP_IDEM_ANS_COMPLETED;

    case IDEM_CLAIM_IN_PROGRESS:
        ctx->lease_left = (ngx_msec_t) c.lease_left;
        return NGX_HTTP_IDEM_ANS_IN_PROGRESS;

    case IDEM_CLAIM_UNKNOWN:
        return NGX_HTTP_IDEM_ANS_UNKNOWN;

    case IDEM_CLAIM_MISMATCH:
        return NGX_HTTP_IDEM_ANS_MISMATCH;

    default: /* IDEM_CLAIM_CORRUPT: a completed record with bad fields */
        return NGX_HTTP_IDEM_ANS_STORE_ERROR;
    }

invalid:

    ngx_log_error(NGX_LOG_ERR, r->connection->log, 0,
                  "idempotency: unexpected reply to the claim script");

    ngx_str_null(&ctx->state);
    ngx_str_null(&ctx->op_id);

    return NGX_HTTP_IDEM_ANS_STORE_ERROR;
}


/* a claim whose request has gone: give the key back at once */
static void
ngx_http_idem_claim_orphan(ngx_http_idem_cmd_t *cmd, redisReply *reply)
{
    ngx_http_idem_cmd_t  *rel;

    if (reply == NULL || reply->type != REDIS_REPLY_ARRAY
        || reply->elements < 1 || reply->element[0]->type != REDIS_REPLY_STRING
        || ngx_strcmp(reply->element[0]->str, "claimed") != 0)
    {
        return;
    }

    rel = ngx_http_idem_cmd_create(cmd->redis, NGX_HTTP_IDEM_SCRIPT_RELEASE,
                                   2, cmd->argvlen[3] + cmd->argvlen[5],
                                   cmd->redis->log);
    if (rel == NULL) {
        return;
    }

    ngx_http_idem_cmd_arg(rel, cmd->argv[3], cmd->argvlen[3]);   /* key */
    ngx_http_idem_cmd_arg(rel, cmd->argv[5], cmd->argvlen[5]);   /* owner */

    (void) ngx_http_idem_cmd_send(rel, NULL, NULL);
}


static void
ngx_http_idem_claim_done(ngx_http_idem_cmd_t *cmd, redisReply *reply)
{
    ngx_connection_t     *c;
    ngx_http_request_t   *r;
    ngx_http_idem_ctx_t  *ctx;

    ctx = cmd->data;

    if (ctx == NULL) {
        ngx_http_idem_claim_orphan(cmd, reply);
        return;
    }

    ctx->cmd = NULL;
    r = ctx->request;
    c = r->connection;

    ctx->answer = ngx_http_idem_parse_claim(r, ctx, reply);
    ctx->phase = NGX_HTTP_IDEM_ANSWERED;

    /* r may be freed inside: only c is touched afterwards */
    ngx_http_core_run_phases(r);
    ngx_http_run_posted_requests(c);
}


/* resume a request that was waiting, from outside the phase engine */
static void
ngx_http_idem_resume(ngx_http_idem_ctx_t *ctx)
{
    ngx_connection_t    *c;
    ngx_http_request_t  *r;

    r = ctx->request;
    c = r->connection;

    ngx_http_core_run_phases(r);
    ngx_http_run_posted_requests(c);
}


static ngx_uint_t
ngx_http_idem_wait_over(ngx_http_idem_ctx_t *ctx)
{
    return (ngx_msec_int_t) (ctx->wait_deadline - ngx_current_msec) <= 0;
}


/*
 * The record may have changed: claim again, which replays, executes (the
 * first attempt was released) or finds it still in progress.
 */
static void
ngx_http_idem_recheck(ngx_http_idem_ctx_t *ctx)
{
    if (ngx_http_idem_wait_over(ctx)) {
        ctx->wait_expired = 1;
    }

    if (ngx_http_idem_claim_send(ctx->request, ctx) == NGX_OK) {
        return;
    }

    if (!ctx->wait_expired) {
        /* Redis is away: keep waiting, and look again in a while */
        ctx->answer = NGX_HTTP_IDEM_ANS_NONE;
        ctx->phase = NGX_HTTP_IDEM_WAITING;

        if (!ctx->wait_timer.timer_set) {
            ngx_add_timer(&ctx->wait_timer,
                          ngx_min(ctx->wait_deadline - ngx_current_msec,
                                  NGX_HTTP_IDEM_RECHECK));
        }

        return;
    }

    ngx_http_idem_resume(ctx);
}


/*
 * The timer fires when the wait runs out, or when the owner's lease would
 * lapse: a live owner has renewed it by then, a dead one has not, and the
 * look at the record then turns it unknown instead of waiting in vain.
 */
static void
ngx_http_idem_wait_timeout(ngx_event_t *ev)
{
    ngx_http_idem_ctx_t  *ctx = ev->data;

    if (ctx->phase != NGX_HTTP_IDEM_WAITING) {
        /* a look at the record is on its way; its answer decides */
        if (ngx_http_idem_wait_over(ctx)) {
            ctx->wait_expired = 1;
        }

        return;
    }

    ngx_http_idem_recheck(ctx);
}


void
ngx_http_idem_wake(ngx_http_idem_ctx_t *ctx)
{
    if (ctx->phase == NGX_HTTP_IDEM_WAITING) {
        ngx_http_idem_recheck(ctx);
    }
}


/*
 * NGX_DONE while the request waits for the first attempt to finish,
 * NGX_DECLINED when it cannot or may not wait any longer.
 */
static ngx_int_t
ngx_http_idem_wait(ngx_http_request_t *r, ngx_http_idem_ctx_t *ctx)
{
    ngx_msec_t                 left;
    ngx_http_idem_loc_conf_t  *lcf;

    lcf = ctx->conf;

    if (lcf->wait == 0 || ctx->wait_expired) {
        return NGX_DECLINED;
    }

    if (!ctx->waiting) {
        if (ngx_http_idem_wait_add(lcf->redis, ctx) != NGX_OK) {
            return NGX_DECLINED;
        }

        ctx->wait_deadline = ngx_current_msec + lcf->wait;
        ctx->wait_timer.handler = ngx_http_idem_wait_timeout;
        ctx->wait_timer.data = ctx;
        ctx->wait_timer.log = r->connection->log;
    }

    if (ngx_http_idem_wait_over(ctx)) {
        return NGX_DECLINED;
    }

    left = ctx->wait_deadline - ngx_current_msec;

    /* a little after the lease would lapse, so the owner's renewal is in */
    ngx_add_timer(&ctx->wait_timer, ngx_min(left, ctx->lease_left + 100));

    ctx->phase = NGX_HTTP_IDEM_WAITING;

    return NGX_DONE;
}


static ngx_int_t
ngx_http_idem_act(ngx_http_request_t *r, ngx_http_idem_ctx_t *ctx)
{
    ngx_http_idem_loc_conf_t  *lcf;

    lcf = ctx->conf;

    if (ctx->answer == NGX_HTTP_IDEM_ANS_IN_PROGRESS
        && ngx_http_idem_wait(r, ctx) == NGX_DONE)
    {
        return NGX_DONE;
    }

    ngx_http_idem_wait_remove(ctx);

    if (ctx->wait_timer.timer_set) {
        ngx_del_timer(&ctx->wait_timer);
    }

    switch (ctx->answer) {

    case NGX_HTTP_IDEM_ANS_CLAIMED:
        ctx->phase = NGX_HTTP_IDEM_PASSED;
        ctx->outcome = NGX_HTTP_IDEM_OUT_EXECUTED;
        ctx->claimed = 1;
        ngx_http_idem_start_lease(r, ctx);
        return NGX_DECLINED;

    case NGX_HTTP_IDEM_ANS_STORE_DOWN:
        if (lcf->store_failure == NGX_HTTP_IDEM_FAILURE_OPEN) {
            ngx_log_error(NGX_LOG_WARN, r->connection->log, 0,
                          "idempotency: redis unavailable, passing key "
                          "\"%V\" through unprotected", &ctx->key);
            ctx->phase = NGX_HTTP_IDEM_DONE;
            ctx->outcome = NGX_HTTP_IDEM_OUT_BYPASSED;
            ngx_str_null(&ctx->op_id);
            return NGX_DECLINED;
        }

        break;

    default:
        break;
    }

    ctx->phase = NGX_HTTP_IDEM_DONE;

    return ngx_http_idem_finalize(r, ngx_http_idem_send_answer(r, ctx));
}
