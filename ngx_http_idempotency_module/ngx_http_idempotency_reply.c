/*
 * Responses the module makes itself: replays of stored responses, and the
 * application/problem+json answers (RFC 9457), all from one table.
 */

#include <ngx_config.h>
#include <ngx_core.h>
#include "ngx_http_idempotency.h"
#include "ngx_http_idempotency_reply.h"


/*
 * The table is the core's (idem_answer.c); the enum is its index.  A value
 * added to ngx_http_idem_problem_e past the table's end fails here.
 */
typedef char  ngx_http_idem_problems_complete_t[
    (int) NGX_HTTP_IDEM_NPROBLEMS == (int) IDEM_ANS_N ? 1 : -1];


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

    /*
     * A 204 or 304 has no body and was sent without Content-Length: a
     * replay must not add one (the header filter writes one for any
     * length it is given).  A status line of its own keeps the header
     * filter from dropping the stored Content-Type of a 204, which it
     * does not do for the proxied original either.
     */
    if (r->headers_out.status == NGX_HTTP_NO_CONTENT
        || r->headers_out.status == NGX_HTTP_NOT_MODIFIED)
    {
        if (r->headers_out.status == NGX_HTTP_NO_CONTENT) {
            ngx_str_set(&r->headers_out.status_line, "204 No Content");

        } else {
            ngx_str_set(&r->headers_out.status_line, "304 Not Modified");
        }

        r->header_only = 1;
        r->headers_out.content_length_n = -1;

    } else {
        r->headers_out.content_length_n = len;
    }

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


/* ms since the epoch (at most IDEM_TIME_MS_MAX) as RFC 3339 UTC; -1: null */
u_char *
ngx_http_idem_json_time(u_char *p, u_char *end, long long ms)
{
    ngx_tm_t  tm;

    if (ms < 0) {
        return ngx_slprintf(p, end, "null");
    }

    ngx_gmtime((time_t) (ms / 1000), &tm);

    return ngx_slprintf(p, end, "\"%4d-%02d-%02dT%02d:%02d:%02d.%03dZ\"",
                        tm.ngx_tm_year, tm.ngx_tm_mon, tm.ngx_tm_mday,
                        tm.ngx_tm_hour, tm.ngx_tm_min, tm.ngx_tm_sec,
                        (int) (ms % 1000));
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


/* Retry-After: seconds, 1 when the upstream gave none (< 0) */
static ngx_int_t
ngx_http_idem_retry_header(ngx_http_request_t *r, ngx_int_t seconds)
{
    u_char  *p;

    p = ngx_pnalloc(r->pool, NGX_INT_T_LEN);
    if (p == NULL) {
        return NGX_ERROR;
    }

    return ngx_http_idem_add_header(r, "Retry-After", 11, p,
                                    ngx_sprintf(p, "%i", seconds < 0 ? 1
                                                         : seconds) - p)
           ? NGX_OK : NGX_ERROR;
}


/* the members of a problem after type, title, status and detail */
static u_char *
ngx_http_idem_problem_members(u_char *p, u_char *end,
    ngx_http_idem_ctx_t *ctx, const idem_answer_t *pt,
    ngx_str_t *location)
{
    p = ngx_slprintf(p, end, ",\"idempotency_key\":");
    p = ngx_http_idem_json_str(p, end, ctx->key.data, ctx->key.len);

    if (ctx->op_id.len) {
        p = ngx_slprintf(p, end, ",\"operation_id\":\"%V\"", &ctx->op_id);
    }

    if (ctx->state.len) {
        p = ngx_slprintf(p, end, ",\"state\":\"%V\"", &ctx->state);
    }

    if (pt->stored || pt->upstream) {
        p = ngx_slprintf(p, end, ",\"response_status\":%ui",
                         ctx->stored_status);

        if (location) {
            p = ngx_slprintf(p, end, ",\"location\":");
            p = ngx_http_idem_json_str(p, end, location->data, location->len);
        }
    }

    /* members of one answer only, already JSON (the confirmation's) */
    if (ctx->problem_extra.len) {
        p = ngx_slprintf(p, end, "%V", &ctx->problem_extra);
    }

    return ngx_slprintf(p, end, "}\n");
}


/* the problem's JSON text, in the request's pool */
static ngx_int_t
ngx_http_idem_problem_text(ngx_http_request_t *r, ngx_http_idem_ctx_t *ctx,
    const idem_answer_t *pt, ngx_uint_t status, const char *detail,
    ngx_str_t *location, ngx_str_t *text)
{
    size_t   len;
    u_char  *body, *p, *end;

    len = 512 + ngx_strlen(detail) * 6 + ctx->key.len * 6
          + (location ? location->len * 6 : 0) + ctx->problem_extra.len;

    body = ngx_pnalloc(r->pool, len);
    if (body == NULL) {
        return NGX_ERROR;
    }

    end = body + len;

    p = ngx_slprintf(body, end,
                     "{\"type\":\"" IDEM_PROBLEM_TYPE_PREFIX "%s\","
                     "\"title\":\"%s\",\"status\":%ui,\"detail\":",
                     pt->slug, pt->title, status);
    p = ngx_http_idem_json_str(p, end, (u_char *) detail, ngx_strlen(detail));
    p = ngx_http_idem_problem_members(p, end, ctx, pt, location);

    text->data = body;
    text->len = p - body;

    return NGX_OK;
}


/* detail NULL: the table's */
ngx_int_t
ngx_http_idem_send_problem(ngx_http_request_t *r, ngx_http_idem_ctx_t *ctx,
    ngx_http_idem_problem_e problem, const char *detail)
{
    ngx_str_t                *location, text;
    ngx_uint_t                status;
    const idem_answer_t      *pt;

    pt = &idem_answers[problem];
    status = pt->upstream ? ctx->stored_status
             : pt->status ? (ngx_uint_t) pt->status
             : ctx->conf->conflict_status;
    detail = detail ? detail : pt->detail;
    location = pt->stored ? ngx_http_idem_stored_location(r, ctx) : NULL;

    if (ngx_http_idem_problem_text(r, ctx, pt, status, detail, location,
                                   &text)
        != NGX_OK)
    {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    if (pt->retry_after
        && ngx_http_idem_retry_header(r, pt->upstream
                                         || problem == NGX_HTTP_IDEM_P_LOCK_HELD
                                         ? ctx->retry_after : 1)
           != NGX_OK)
    {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    ngx_str_set(&r->headers_out.content_type, "application/problem+json");

    return ngx_http_idem_send_json(r, status, text.data, text.len);
}


/*
 * nginx's own answer in an endpoint's location (its 413 for a body over
 * client_max_body_size, a 500) as the problem the endpoint's other answers
 * are, for the filters of _ops.c that replace nginx's HTML page: the text
 * (of no key and no record: a zeroed context, as for the 405) and, with
 * "headers", the answer's headers in place of the page's.
 */
ngx_int_t
ngx_http_idem_problem_page(ngx_http_request_t *r,
    ngx_http_idem_problem_e problem, ngx_uint_t headers, ngx_str_t *text)
{
    ngx_http_idem_ctx_t   ctx;
    const idem_answer_t  *pt;

    ngx_memzero(&ctx, sizeof(ngx_http_idem_ctx_t));
    pt = &idem_answers[problem];

    if (ngx_http_idem_problem_text(r, &ctx, pt, (ngx_uint_t) pt->status,
                                   pt->detail, NULL, text)
        != NGX_OK)
    {
        return NGX_ERROR;
    }

    if (!headers) {
        return NGX_OK;
    }

    ngx_str_set(&r->headers_out.content_type, "application/problem+json");
    r->headers_out.content_type_len = r->headers_out.content_type.len;
    r->headers_out.content_type_lowcase = NULL;
    r->headers_out.content_length_n = text->len;

    if (r->headers_out.content_length) {
        r->headers_out.content_length->hash = 0;
        r->headers_out.content_length = NULL;
    }

    if (ngx_http_idem_add_header(r, "Cache-Control", 13,
                                 (u_char *) "no-store", 8) == NULL)
    {
        return NGX_ERROR;
    }

    return NGX_OK;
}


/*
 * The 405 of the module's own endpoints (status, admin, approve, metrics):
 * a problem like their other answers, where nginx's own would be an HTML
 * page.  Called before the endpoint made its context: the answer is of no
 * key and no record, so a zeroed context that the filters never see (it
 * is not the request's module context) is all the problem needs.
 */
ngx_int_t
ngx_http_idem_send_not_allowed(ngx_http_request_t *r, const char *allow)
{
    ngx_int_t             rc;
    ngx_http_idem_ctx_t  *ctx;

    rc = ngx_http_discard_request_body(r);
    if (rc != NGX_OK) {
        return rc;
    }

    ctx = ngx_pcalloc(r->pool, sizeof(ngx_http_idem_ctx_t));
    if (ctx == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    ctx->conf = ngx_http_get_module_loc_conf(r, ngx_http_idempotency_module);

    if (ngx_http_idem_add_header(r, "Allow", 5, (u_char *) allow,
                                 ngx_strlen(allow))
        == NULL)
    {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    return ngx_http_idem_send_problem(r, ctx,
                                      NGX_HTTP_IDEM_P_METHOD_NOT_ALLOWED,
                                      NULL);
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


/*
 * The stored headers onto r->headers_out: NGX_OK, NGX_DECLINED when they
 * are malformed or unsafe, NGX_ERROR.
 */
static ngx_int_t
ngx_http_idem_replay_headers(ngx_http_request_t *r, ngx_http_idem_ctx_t *ctx)
{
    int                rc;
    size_t             name_len, value_len;
    const char        *name, *value;
    ngx_table_elt_t   *h;
    idem_hdrs_iter_t   it;

    it.pos = (const char *) ctx->stored_headers.data;
    it.end = it.pos + ctx->stored_headers.len;

    while ((rc = idem_hdrs_next(&it, &name, &name_len, &value, &value_len))
           == 1)
    {
        if (!ngx_http_idem_header_ok((u_char *) name, name_len,
                                     (u_char *) value, value_len))
        {
            return NGX_DECLINED;
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
            return NGX_ERROR;
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

    return rc == 0 ? NGX_OK : NGX_DECLINED;
}


static ngx_int_t
ngx_http_idem_send_replay(ngx_http_request_t *r, ngx_http_idem_ctx_t *ctx)
{
    ngx_int_t  rc;

    r->headers_out.status = ctx->stored_status;

    rc = ngx_http_idem_replay_headers(r, ctx);

    if (rc == NGX_ERROR) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    if (rc == NGX_DECLINED) {
        ngx_log_error(NGX_LOG_ERR, r->connection->log, 0,
                      "idempotency: stored headers of key \"%V\" are "
                      "malformed", ngx_http_idem_log_key(ctx));

        ngx_http_clean_header(r);
        ctx->outcome = NGX_HTTP_IDEM_OUT_REJECTED;

        return ngx_http_idem_send_problem(r, ctx, NGX_HTTP_IDEM_P_STORE_ERROR,
                                          "the stored response cannot be "
                                          "decoded");
    }

    /* another key's operation: the client learns which one it got */
    if ((ctx->reused
         ? ngx_http_idem_add_header(r, "Idempotent-Reused", 17,
                                    (u_char *) "true", 4) == NULL
           || ngx_http_idem_add_header(r, "Idempotency-Operation", 21,
                                       ctx->op_id.data, ctx->op_id.len)
              == NULL
         : ngx_http_idem_add_header(r, "Idempotent-Replayed", 19,
                                    (u_char *) "true", 4) == NULL))
    {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    return ngx_http_idem_send_body(r, ctx->stored_body.data,
                                   ctx->stored_body.len);
}


/* the outcome and the problem of an answer that is not a replay */
static ngx_http_idem_problem_e
ngx_http_idem_answer_problem(ngx_http_idem_ctx_t *ctx)
{
    ngx_http_idem_problem_e  problem;

    switch (ctx->answer) {

    case NGX_HTTP_IDEM_ANS_MISMATCH:
        ctx->outcome = NGX_HTTP_IDEM_OUT_CONFLICT;
        problem = NGX_HTTP_IDEM_P_MISMATCH;
        break;

    case NGX_HTTP_IDEM_ANS_IN_PROGRESS:
        ctx->outcome = NGX_HTTP_IDEM_OUT_IN_PROGRESS;
        problem = NGX_HTTP_IDEM_P_IN_PROGRESS;
        break;

    case NGX_HTTP_IDEM_ANS_UNKNOWN:
        ctx->outcome = NGX_HTTP_IDEM_OUT_UNKNOWN;
        problem = NGX_HTTP_IDEM_P_UNKNOWN;
        break;

    case NGX_HTTP_IDEM_ANS_RELEASED:
        ctx->outcome = NGX_HTTP_IDEM_OUT_REJECTED;
        problem = NGX_HTTP_IDEM_P_RETRY_LATER;
        break;

    case NGX_HTTP_IDEM_ANS_LOCKED:
        ctx->outcome = NGX_HTTP_IDEM_OUT_LOCKED;
        problem = NGX_HTTP_IDEM_P_LOCK_HELD;
        break;

    case NGX_HTTP_IDEM_ANS_DECLINED:
        ctx->outcome = NGX_HTTP_IDEM_OUT_REJECTED;
        problem = NGX_HTTP_IDEM_P_CONFIRM_DECLINED;
        break;

    case NGX_HTTP_IDEM_ANS_ELSEWHERE:
        ctx->outcome = NGX_HTTP_IDEM_OUT_CONFLICT;
        problem = NGX_HTTP_IDEM_P_IDENTITY_ELSEWHERE;
        break;

    case NGX_HTTP_IDEM_ANS_STORE_DOWN:
        ctx->outcome = NGX_HTTP_IDEM_OUT_REJECTED;
        problem = NGX_HTTP_IDEM_P_STORE_DOWN;
        break;

    case NGX_HTTP_IDEM_ANS_NOT_REPLICATED:
        ctx->outcome = NGX_HTTP_IDEM_OUT_REJECTED;
        problem = NGX_HTTP_IDEM_P_NOT_REPLICATED;
        break;

    case NGX_HTTP_IDEM_ANS_AUDIT_DOWN:
        ctx->outcome = NGX_HTTP_IDEM_OUT_REJECTED;
        problem = NGX_HTTP_IDEM_P_AUDIT_UNAVAILABLE;
        break;

    default:
        ctx->outcome = NGX_HTTP_IDEM_OUT_REJECTED;
        problem = NGX_HTTP_IDEM_P_STORE_ERROR;
        break;
    }

    return problem;
}


/* what a claim's answer means for the client, and what it is told */
ngx_int_t
ngx_http_idem_send_answer(ngx_http_request_t *r, ngx_http_idem_ctx_t *ctx)
{
    ngx_http_idem_problem_e  problem;

    if (ctx->answer == NGX_HTTP_IDEM_ANS_COMPLETED
        || ctx->answer == NGX_HTTP_IDEM_ANS_REUSED)
    {
        if (ctx->body_stored) {
            ctx->outcome = ctx->reused ? NGX_HTTP_IDEM_OUT_REUSED
                                       : NGX_HTTP_IDEM_OUT_REPLAYED;
            return ngx_http_idem_send_replay(r, ctx);
        }

        ctx->outcome = NGX_HTTP_IDEM_OUT_CONFLICT;
        problem = NGX_HTTP_IDEM_P_NOT_STORED;

    } else {
        problem = ngx_http_idem_answer_problem(ctx);
    }

    if (ctx->answer == NGX_HTTP_IDEM_ANS_STORE_DOWN
        || ctx->answer == NGX_HTTP_IDEM_ANS_STORE_ERROR
        || ctx->answer == NGX_HTTP_IDEM_ANS_NOT_REPLICATED
        || ctx->answer == NGX_HTTP_IDEM_ANS_AUDIT_DOWN)
    {
        /* the operation id drawn for the claim never reached a record */
        ngx_str_null(&ctx->op_id);
    }

    return ngx_http_idem_send_problem(r, ctx, problem, NULL);
}


char *
ngx_http_idem_conflict_status(ngx_conf_t *cf, ngx_command_t *cmd, void *conf)
{
    ngx_http_idem_loc_conf_t  *lcf = conf;

    ngx_str_t  *value;

    if (lcf->conflict_status != NGX_CONF_UNSET_UINT) {
        return "is duplicate";
    }

    value = cf->args->elts;

    if (ngx_strcmp(value[1].data, "409") == 0) {
        lcf->conflict_status = NGX_HTTP_CONFLICT;

    } else if (ngx_strcmp(value[1].data, "422") == 0) {
        lcf->conflict_status = 422;

    } else {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "invalid value \"%V\" in \"%V\" directive, "
                           "it must be 409 or 422", &value[1], &cmd->name);
        return NGX_CONF_ERROR;
    }

    return NGX_CONF_OK;
}
