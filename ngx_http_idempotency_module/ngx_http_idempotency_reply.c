/*
 * Responses the module makes itself: replays of stored responses and the
 * application/problem+json answers of DESIGN.md section 4.
 */

#include "ngx_http_idempotency.h"


#define NGX_HTTP_IDEM_PROBLEM_TYPE  "urn:ngx-idempotency:problem:"


typedef struct {
    const char  *slug;
    const char  *title;
} ngx_http_idem_problem_t;


static ngx_http_idem_problem_t  ngx_http_idem_problems[] = {
    { "key-missing", "Idempotency key required" },
    { "key-malformed", "Malformed idempotency key" },
    { "fingerprint-mismatch", "Idempotency key reused for another request" },
    { "in-progress", "Request with this idempotency key is in progress" },
    { "outcome-unknown", "Outcome of the original request is unknown" },
    { "response-not-stored", "Original response was too large to store" },
    { "store-unavailable", "Idempotency store unavailable" },
    { "store-error", "Idempotency store returned an unexpected record" },
    { NULL, NULL }
};


static const char *
ngx_http_idem_problem_title(const char *slug)
{
    ngx_http_idem_problem_t  *p;

    for (p = ngx_http_idem_problems; p->slug; p++) {
        if (ngx_strcmp(p->slug, slug) == 0) {
            return p->title;
        }
    }

    return "Idempotency error";
}


static ngx_table_elt_t *
ngx_http_idem_add_header(ngx_http_request_t *r, const char *name,
    size_t name_len, u_char *value, size_t value_len)
{
    ngx_table_elt_t  *h;

    h = ngx_list_push(&r->headers_out.headers);
    if (h == NULL) {
        return NULL;
    }

    h->hash = 1;
    h->key.data = (u_char *) name;
    h->key.len = name_len;
    h->value.data = value;
    h->value.len = value_len;

    h->lowcase_key = ngx_pnalloc(r->pool, name_len);
    if (h->lowcase_key == NULL) {
        return NULL;
    }

    ngx_strlow(h->lowcase_key, (u_char *) name, name_len);

    return h;
}


static ngx_int_t
ngx_http_idem_send_body(ngx_http_request_t *r, u_char *data, size_t len)
{
    ngx_int_t     rc;
    ngx_buf_t    *b;
    ngx_chain_t   out;

    r->headers_out.content_length_n = len;

    rc = ngx_http_send_header(r);

    if (rc == NGX_ERROR || rc > NGX_OK || r->header_only) {
        return rc;
    }

    b = ngx_calloc_buf(r->pool);
    if (b == NULL) {
        return NGX_ERROR;
    }

    b->pos = data;
    b->last = data + len;
    b->memory = len ? 1 : 0;
    b->last_buf = 1;
    b->last_in_chain = 1;

    out.buf = b;
    out.next = NULL;

    return ngx_http_output_filter(r, &out);
}


/* JSON text: escapes what JSON requires; non-UTF-8 becomes null */
u_char *
ngx_http_idem_json_str(u_char *p, u_char *end, u_char *s, size_t len)
{
    size_t  i;

    if (s == NULL || !idem_utf8_valid((const char *) s, len)) {
        return ngx_slprintf(p, end, "null");
    }

    if (p < end) {
        *p++ = '"';
    }

    for (i = 0; i < len && p < end; i++) {
        if (s[i] == '"' || s[i] == '\\') {
            p = ngx_slprintf(p, end, "\\%c", s[i]);

        } else if (s[i] < 0x20) {
            p = ngx_slprintf(p, end, "\\u%04xd", (int) s[i]);

        } else {
            *p++ = s[i];
        }
    }

    return ngx_slprintf(p, end, "\"");
}


static ngx_str_t *
ngx_http_idem_stored_location(ngx_http_request_t *r, ngx_http_idem_ctx_t *ctx)
{
    size_t             name_len, value_len;
    ngx_str_t         *v;
    const char        *name, *value;
    idem_hdrs_iter_t   it;

    it.pos = (const char *) ctx->stored_headers.data;
    it.end = it.pos + ctx->stored_headers.len;

    while (idem_hdrs_next(&it, &name, &name_len, &value, &value_len) == 1) {
        if (name_len == 8 && ngx_strncasecmp((u_char *) name,
                                             (u_char *) "location", 8) == 0)
        {
            v = ngx_palloc(r->pool, sizeof(ngx_str_t));
            if (v == NULL) {
                return NULL;
            }

            v->data = (u_char *) value;
            v->len = value_len;
            return v;
        }
    }

    return NULL;
}


ngx_int_t
ngx_http_idem_send_problem(ngx_http_request_t *r, ngx_http_idem_ctx_t *ctx,
    ngx_uint_t status, const char *slug, const char *title,
    const char *detail)
{
    size_t      len;
    u_char     *body, *p, *end;
    ngx_str_t  *location;

    location = NULL;
    len = 512 + ngx_strlen(detail) * 6 + ctx->key.len * 6;

    if (ngx_strcmp(slug, "response-not-stored") == 0) {
        location = ngx_http_idem_stored_location(r, ctx);
        len += location ? location->len * 6 : 0;
    }

    body = ngx_pnalloc(r->pool, len);
    if (body == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    end = body + len;

    p = ngx_slprintf(body, end,
                     "{\"type\":\"" NGX_HTTP_IDEM_PROBLEM_TYPE "%s\","
                     "\"title\":\"%s\",\"status\":%ui,\"detail\":",
                     slug, title ? title : ngx_http_idem_problem_title(slug),
                     status);
    p = ngx_http_idem_json_str(p, end, (u_char *) detail, ngx_strlen(detail));

    p = ngx_slprintf(p, end, ",\"idempotency_key\":");
    p = ngx_http_idem_json_str(p, end, ctx->key.data, ctx->key.len);

    if (ctx->op_id.len) {
        p = ngx_slprintf(p, end, ",\"operation_id\":\"%V\"", &ctx->op_id);
    }

    if (ctx->state.len) {
        p = ngx_slprintf(p, end, ",\"state\":\"%V\"", &ctx->state);
    }

    if (ngx_strcmp(slug, "response-not-stored") == 0) {
        p = ngx_slprintf(p, end, ",\"response_status\":%ui",
                         ctx->stored_status);

        if (location) {
            p = ngx_slprintf(p, end, ",\"location\":");
            p = ngx_http_idem_json_str(p, end, location->data, location->len);
        }
    }

    p = ngx_slprintf(p, end, "}\n");

    if ((ngx_strcmp(slug, "in-progress") == 0
         || ngx_strcmp(slug, "store-unavailable") == 0)
        && ngx_http_idem_add_header(r, "Retry-After", 11,
                                    (u_char *) "1", 1) == NULL)
    {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    ngx_str_set(&r->headers_out.content_type, "application/problem+json");

    return ngx_http_idem_send_json(r, status, body, p - body);
}


/* status and content type are the caller's when it set one */
ngx_int_t
ngx_http_idem_send_json(ngx_http_request_t *r, ngx_uint_t status,
    u_char *body, size_t len)
{
    r->headers_out.status = status;

    if (r->headers_out.content_type.len == 0) {
        ngx_str_set(&r->headers_out.content_type, "application/json");
    }

    r->headers_out.content_type_len = r->headers_out.content_type.len;
    r->headers_out.content_type_lowcase = NULL;

    if (ngx_http_idem_add_header(r, "Cache-Control", 13,
                                 (u_char *) "no-store", 8) == NULL)
    {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    return ngx_http_idem_send_body(r, body, len);
}


/*
 * What comes back from Redis goes onto the wire: a stored name must be a
 * token and a value must hold no CR, LF or other control byte, so that a
 * tampered record cannot inject header lines.
 */
static ngx_uint_t
ngx_http_idem_header_ok(const u_char *name, size_t name_len,
    const u_char *value, size_t value_len)
{
    size_t  i;

    static const char  *tchar = "!#$%&'*+-.^_`|~";

    if (name_len == 0) {
        return 0;
    }

    for (i = 0; i < name_len; i++) {
        if (!((name[i] >= 'a' && name[i] <= 'z')
              || (name[i] >= 'A' && name[i] <= 'Z')
              || (name[i] >= '0' && name[i] <= '9')
              || (name[i] != '\0' && ngx_strchr(tchar, name[i]) != NULL)))
        {
            return 0;
        }
    }

    for (i = 0; i < value_len; i++) {
        if ((value[i] < 0x20 && value[i] != '\t') || value[i] == 0x7f) {
            return 0;
        }
    }

    return 1;
}


static ngx_uint_t
ngx_http_idem_name_is(const char *name, size_t len, const char *lit,
    size_t lit_len)
{
    return len == lit_len
           && ngx_strncasecmp((u_char *) name, (u_char *) lit, len) == 0;
}


ngx_int_t
ngx_http_idem_send_replay(ngx_http_request_t *r, ngx_http_idem_ctx_t *ctx)
{
    int                rc;
    size_t             name_len, value_len;
    const char        *name, *value;
    ngx_table_elt_t   *h;
    idem_hdrs_iter_t   it;

    r->headers_out.status = ctx->stored_status;

    it.pos = (const char *) ctx->stored_headers.data;
    it.end = it.pos + ctx->stored_headers.len;

    while ((rc = idem_hdrs_next(&it, &name, &name_len, &value, &value_len))
           == 1)
    {
        if (!ngx_http_idem_header_ok((u_char *) name, name_len,
                                     (u_char *) value, value_len))
        {
            rc = -1;
            break;
        }

        if (ngx_http_idem_name_is(name, name_len, "Content-Type", 12)) {
            r->headers_out.content_type.data = (u_char *) value;
            r->headers_out.content_type.len = value_len;
            r->headers_out.content_type_len = value_len;
            r->headers_out.content_type_lowcase = NULL;
            continue;
        }

        h = ngx_http_idem_add_header(r, name, name_len, (u_char *) value,
                                     value_len);
        if (h == NULL) {
            return NGX_HTTP_INTERNAL_SERVER_ERROR;
        }

        /*
         * The header filters treat these specially; like the upstream
         * module, a relative Location is left alone so that it is replayed
         * as it was sent the first time.
         */
        if (ngx_http_idem_name_is(name, name_len, "Location", 8)) {
            if (value_len && value[0] != '/') {
                r->headers_out.location = h;
            }

        } else if (ngx_http_idem_name_is(name, name_len,
                                         "Content-Encoding", 16))
        {
            r->headers_out.content_encoding = h;
        }
    }

    if (rc != 0) {
        ngx_log_error(NGX_LOG_ERR, r->connection->log, 0,
                      "idempotency: stored headers of key \"%V\" are "
                      "malformed", &ctx->key);

        ngx_http_clean_header(r);
        ctx->outcome = NGX_HTTP_IDEM_OUT_REJECTED;

        return ngx_http_idem_send_problem(r, ctx,
                                          NGX_HTTP_INTERNAL_SERVER_ERROR,
                                          "store-error", NULL,
                                          "the stored response cannot be "
                                          "decoded");
    }

    if (ngx_http_idem_add_header(r, "Idempotent-Replayed", 19,
                                 (u_char *) "true", 4) == NULL)
    {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    return ngx_http_idem_send_body(r, ctx->stored_body.data,
                                   ctx->stored_body.len);
}


ngx_int_t
ngx_http_idem_send_answer(ngx_http_request_t *r, ngx_http_idem_ctx_t *ctx)
{
    ngx_uint_t  conflict;

    conflict = ctx->conf->conflict_status;

    if (ctx->answer == NGX_HTTP_IDEM_ANS_STORE_DOWN
        || ctx->answer == NGX_HTTP_IDEM_ANS_STORE_ERROR)
    {
        /* the operation id drawn for the claim never reached a record */
        ngx_str_null(&ctx->op_id);
    }

    switch (ctx->answer) {

    case NGX_HTTP_IDEM_ANS_COMPLETED:
        if (ctx->body_stored) {
            ctx->outcome = NGX_HTTP_IDEM_OUT_REPLAYED;
            return ngx_http_idem_send_replay(r, ctx);
        }

        ctx->outcome = NGX_HTTP_IDEM_OUT_CONFLICT;
        return ngx_http_idem_send_problem(r, ctx, NGX_HTTP_CONFLICT,
                   "response-not-stored", NULL,
                   "the request was executed, but its response was larger "
                   "than idempotency_store_max and cannot be replayed");

    case NGX_HTTP_IDEM_ANS_MISMATCH:
        ctx->outcome = NGX_HTTP_IDEM_OUT_CONFLICT;
        return ngx_http_idem_send_problem(r, ctx, conflict,
                   "fingerprint-mismatch", NULL,
                   "this idempotency key was used for a different request; "
                   "use a new key for a new request");

    case NGX_HTTP_IDEM_ANS_IN_PROGRESS:
        ctx->outcome = NGX_HTTP_IDEM_OUT_IN_PROGRESS;
        return ngx_http_idem_send_problem(r, ctx, NGX_HTTP_CONFLICT,
                   "in-progress", NULL,
                   "a request with this idempotency key is being processed; "
                   "retry later with the same key");

    case NGX_HTTP_IDEM_ANS_UNKNOWN:
        ctx->outcome = NGX_HTTP_IDEM_OUT_UNKNOWN;
        return ngx_http_idem_send_problem(r, ctx, NGX_HTTP_CONFLICT,
                   "outcome-unknown", NULL,
                   "the original request may or may not have been executed; "
                   "it is not retried automatically: check the operation's "
                   "status before acting");

    case NGX_HTTP_IDEM_ANS_STORE_DOWN:
        ctx->outcome = NGX_HTTP_IDEM_OUT_REJECTED;
        return ngx_http_idem_send_problem(r, ctx,
                   NGX_HTTP_SERVICE_UNAVAILABLE, "store-unavailable", NULL,
                   "the idempotency store cannot be reached; nothing was "
                   "executed, retry with the same key");

    default:
        ctx->outcome = NGX_HTTP_IDEM_OUT_REJECTED;
        return ngx_http_idem_send_problem(r, ctx,
                   NGX_HTTP_INTERNAL_SERVER_ERROR, "store-error", NULL,
                   "the idempotency store holds a record this module cannot "
                   "read; nothing was executed");
    }
}
