/*
 * What names a request's record and what enters its fingerprint from the
 * request line and headers: the key header, the scope, the record key,
 * and the values of idempotency_fingerprint_headers.  The status and admin
 * endpoints name records the same way.
 */

#include <ngx_config.h>
#include <ngx_core.h>
#include "ngx_http_idempotency.h"
#include "ngx_http_idempotency_request.h"


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


/* the first request header named name, and how many there are */
ngx_table_elt_t *
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


/*
 * The record key: a digest of the evaluated scope and the key.  The scope
 * is kept: what else names keys of this request (idempotency_unique) must
 * use the very value the record was named with, not a second evaluation.
 */
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

    ctx->scope = *scope;

    if (idem_record_key((const char *) scope->data, scope->len,
                        (const char *) ctx->key.data, ctx->key.len,
                        (char *) ctx->rkey)
        != 0)
    {
        return NGX_ERROR;
    }

    return NGX_OK;
}


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


ngx_int_t
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
 * The key that names a proposal's record key by its operation id
 * (IDEM_OPERATION_PREFIX + op + IDEM_OPERATION_SUFFIX), NUL-terminated;
 * NULL when out of memory.  op is an id of 32 characters.
 */
u_char *
ngx_http_idem_operation_key(ngx_pool_t *pool, ngx_str_t *op)
{
    u_char  *key, *p;

    key = ngx_pnalloc(pool, IDEM_OPERATION_KEY_LEN + 1);
    if (key == NULL) {
        return NULL;
    }

    p = ngx_cpymem(key, IDEM_OPERATION_PREFIX,
                   sizeof(IDEM_OPERATION_PREFIX) - 1);
    p = ngx_cpymem(p, op->data, op->len);
    ngx_memcpy(p, IDEM_OPERATION_SUFFIX, sizeof(IDEM_OPERATION_SUFFIX));

    return key;
}


/* a header of the response (r->headers_out) by name, or NULL */
ngx_table_elt_t *
ngx_http_idem_header_out(ngx_http_request_t *r, u_char *name, size_t len)
{
    ngx_uint_t        i;
    ngx_list_part_t  *part;
    ngx_table_elt_t  *h;

    part = &r->headers_out.headers.part;
    h = part->elts;

    for (i = 0; /* void */; i++) {

        if (i >= part->nelts) {
            if (part->next == NULL) {
                return NULL;
            }

            part = part->next;
            h = part->elts;
            i = 0;
        }

        if (h[i].hash && h[i].key.len == len
            && ngx_strncasecmp(h[i].key.data, name, len) == 0)
        {
            return &h[i];
        }
    }
}


/*
 * Tracing, connection and the key header itself never count toward the
 * fingerprint (docs/fingerprint.md), and a name listed twice would make
 * the headers object ambiguous.
 */
char *
ngx_http_idem_check_fp_headers(ngx_conf_t *cf, ngx_http_idem_loc_conf_t *conf)
{
    ngx_str_t   *names;
    ngx_uint_t   i, j;

    static ngx_str_t  never[] = {
        ngx_string("connection"), ngx_string("keep-alive"),
        ngx_string("te"), ngx_string("trailer"),
        ngx_string("transfer-encoding"), ngx_string("upgrade"),
        ngx_string("proxy-connection"), ngx_string("content-length"),
        ngx_string("traceparent"), ngx_string("tracestate"),
        ngx_string("baggage"), ngx_string("x-request-id"),
        ngx_string("x-b3-traceid"), ngx_string("x-b3-spanid"),
        ngx_string("x-b3-parentspanid"), ngx_string("x-b3-sampled"),
        ngx_string("b3"), ngx_string("uber-trace-id"),
        ngx_string("x-amzn-trace-id"), ngx_string("x-cloud-trace-context"),
        ngx_null_string
    };

    if (conf->fp_headers == NULL) {
        return NGX_CONF_OK;
    }

    names = conf->fp_headers->elts;

    for (i = 0; i < conf->fp_headers->nelts; i++) {

        for (j = 0; never[j].len; j++) {
            if (names[i].len == never[j].len
                && ngx_strncmp(names[i].data, never[j].data, never[j].len)
                   == 0)
            {
                goto excluded;
            }
        }

        if (names[i].len == conf->key_header.len
            && ngx_strncasecmp(names[i].data, conf->key_header.data,
                               names[i].len) == 0)
        {
            goto excluded;
        }

        for (j = 0; j < i; j++) {
            if (names[i].len == names[j].len
                && ngx_strncmp(names[i].data, names[j].data, names[i].len)
                   == 0)
            {
                ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                                   "header \"%V\" is listed twice in "
                                   "\"idempotency_fingerprint_headers\"",
                                   &names[i]);
                return NGX_CONF_ERROR;
            }
        }
    }

    return NGX_CONF_OK;

excluded:

    ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                       "header \"%V\" in \"idempotency_fingerprint_headers\" "
                       "never counts toward the fingerprint (connection, "
                       "tracing or the key header itself)", &names[i]);
    return NGX_CONF_ERROR;
}
