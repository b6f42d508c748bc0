/*
 * idempotency_approve_page: a person approves or declines the exact
 * operation in a browser.
 *
 *   GET ?op=ID   the proposal as it was shown to the client (kept with the
 *                operation id, ngx_http_idempotency_proposal.c) and the
 *                operation's state, with Approve and Decline;
 *   GET          the operations awaiting approval (the pending index);
 *   POST         records the decision (approve.lua, as the JSON endpoint
 *                does) and shows the result.
 *
 * The approver is idempotency_approve_identity (nginx -t refuses the page
 * without it).  A page that approves payments is an attack target: every
 * value is escaped and invisible or reordering characters are shown
 * (idem_html.c); a post must come from this origin (Origin,
 * Sec-Fetch-Site) and carry a token, HMAC-SHA-256 over the operation id,
 * the fingerprint, the approver and the token's expiry with the page's
 * secret; the answer forbids framing, caching, referrers and every
 * resource but its own style (CSP with a nonce).
 */

#include <ngx_config.h>
#include <ngx_core.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>
#include <cjson/cJSON.h>

#include "ngx_http_idempotency.h"
#include "ngx_http_idempotency_page.h"
#include "ngx_http_idempotency_approve.h"
#include "ngx_http_idempotency_command.h"
#include "ngx_http_idempotency_conf.h"
#include "ngx_http_idempotency_ctx.h"
#include "ngx_http_idempotency_ops.h"
#include "ngx_http_idempotency_proposal.h"
#include "ngx_http_idempotency_redis.h"
#include "ngx_http_idempotency_reply.h"
#include "idem_html.h"


#define NGX_HTTP_IDEM_PAGE_BODY_MAX   4096
#define NGX_HTTP_IDEM_PAGE_FORM_TTL   600        /* s: a form's token */
#define NGX_HTTP_IDEM_PAGE_TOKEN_LEN  64         /* hex */


/* the page being written: grows in the request's pool */
typedef struct {
    ngx_http_request_t  *r;
    u_char              *start;
    u_char              *pos;
    u_char              *end;
    ngx_uint_t           failed;
} ngx_http_idem_page_t;


/* the approval lifetimes a person may choose, in seconds */
static ngx_int_t  ngx_http_idem_page_ttls[] = { 300, 900, 3600, 14400,
                                                86400, 0 };


static const char  ngx_http_idem_page_style[] =
    "body{font:16px/1.5 system-ui,sans-serif;margin:0;background:#f4f5f7;"
    "color:#1d1f23}"
    "main{max-width:46rem;margin:0 auto;padding:1rem;background:#fff;"
    "min-height:100vh;box-sizing:border-box}"
    "h1{font-size:1.4rem;margin:.2rem 0 1rem}"
    ".describe{font-size:1.15rem;font-weight:600;padding:.75rem;"
    "border-left:4px solid #b4451a;background:#fff6f0}"
    "main,p,td{overflow-wrap:anywhere}"
    "dl{display:grid;grid-template-columns:minmax(7rem,max-content) "
    "minmax(0,1fr);"
    "gap:.4rem 1rem;margin:1rem 0}"
    "dt{font-weight:600;color:#444}"
    "dd{margin:0;overflow-wrap:anywhere;word-break:break-word;"
    "white-space:pre-wrap;font-family:ui-monospace,monospace}"
    "@media (max-width:30rem){dl{grid-template-columns:minmax(0,1fr)}"
    "dd{margin-bottom:.5rem}}"
    ".state{font-weight:600}.why{padding:.75rem;background:#fdecea;"
    "border-left:4px solid #b00020}"
    ".ok{padding:.75rem;background:#e8f5e9;border-left:4px solid #2e7d32}"
    "form{display:flex;flex-wrap:wrap;gap:.75rem;align-items:center;"
    "margin-top:1rem}"
    "button{font:inherit;padding:.6rem 1.4rem;border-radius:.3rem;"
    "border:2px solid #1d1f23;cursor:pointer}"
    "button:focus-visible,select:focus-visible,summary:focus-visible,"
    "a:focus-visible{outline:3px solid #1a73e8;outline-offset:2px}"
    ".approve{background:#2e7d32;color:#fff;border-color:#2e7d32}"
    ".decline{background:#fff;color:#b00020;border-color:#b00020}"
    "select{font:inherit;padding:.4rem}"
    "table{border-collapse:collapse;width:100%}"
    "td,th{text-align:left;padding:.4rem;border-bottom:1px solid #ddd;"
    "overflow-wrap:anywhere}";


/* ------------------------------------------------------------ writing */

static void
ngx_http_idem_page_grow(ngx_http_idem_page_t *pg, size_t len)
{
    u_char  *p;
    size_t   size;

    size = (pg->end - pg->start) * 2 + len;

    p = ngx_pnalloc(pg->r->pool, size);
    if (p == NULL) {
        pg->failed = 1;
        return;
    }

    /* the first growth has nothing to keep (and memcpy no NULL source) */
    pg->pos = pg->start ? ngx_cpymem(p, pg->start, pg->pos - pg->start) : p;
    pg->start = p;
    pg->end = p + size;
}


static void
ngx_http_idem_page_raw(ngx_http_idem_page_t *pg, const char *s, size_t len)
{
    if ((size_t) (pg->end - pg->pos) < len) {
        ngx_http_idem_page_grow(pg, len);
    }

    if (!pg->failed && len) {
        pg->pos = ngx_cpymem(pg->pos, s, len);
    }
}


#define ngx_http_idem_page_lit(pg, s)                                        \
    ngx_http_idem_page_raw(pg, s, sizeof(s) - 1)


/* a value from the request or Redis: escaped, hidden characters shown */
static void
ngx_http_idem_page_text(ngx_http_idem_page_t *pg, const u_char *s,
    size_t len)
{
    size_t  n;

    n = idem_html_len((const char *) s, len);

    if ((size_t) (pg->end - pg->pos) < n) {
        ngx_http_idem_page_grow(pg, n);
    }

    if (!pg->failed) {
        pg->pos = (u_char *) idem_html_put((char *) pg->pos,
                                           (const char *) s, len);
    }
}


static void
ngx_http_idem_page_cstr(ngx_http_idem_page_t *pg, const char *s)
{
    ngx_http_idem_page_text(pg, (const u_char *) (s ? s : ""),
                            s ? ngx_strlen(s) : 0);
}


static void
ngx_http_idem_page_time(ngx_http_idem_page_t *pg, time_t t)
{
    u_char    buf[32], *p;
    ngx_tm_t  tm;

    ngx_gmtime(t, &tm);
    p = ngx_sprintf(buf, "%4d-%02d-%02d %02d:%02d:%02d UTC", tm.ngx_tm_year,
                    tm.ngx_tm_mon, tm.ngx_tm_mday, tm.ngx_tm_hour,
                    tm.ngx_tm_min, tm.ngx_tm_sec);
    ngx_http_idem_page_raw(pg, (char *) buf, p - buf);
}


/* a random nonce for the page's one style element */
static ngx_int_t
ngx_http_idem_page_nonce(u_char nonce[33])
{
    u_char  raw[16];

    if (RAND_bytes(raw, sizeof(raw)) != 1) {
        return NGX_ERROR;
    }

    ngx_hex_dump(nonce, raw, sizeof(raw));
    nonce[32] = '\0';

    return NGX_OK;
}


static void
ngx_http_idem_page_head(ngx_http_idem_page_t *pg, const char *title,
    u_char *nonce)
{
    ngx_http_idem_page_lit(pg, "<!DOCTYPE html>\n<html lang=\"en\"><head>"
                           "<meta charset=\"utf-8\"><meta name=\"viewport\" "
                           "content=\"width=device-width,initial-scale=1\">"
                           "<title>");
    ngx_http_idem_page_cstr(pg, title);
    ngx_http_idem_page_lit(pg, "</title><style nonce=\"");
    ngx_http_idem_page_raw(pg, (char *) nonce, 32);
    ngx_http_idem_page_lit(pg, "\">");
    ngx_http_idem_page_lit(pg, ngx_http_idem_page_style);
    ngx_http_idem_page_lit(pg, "</style></head><body><main><h1>");
    ngx_http_idem_page_cstr(pg, title);
    ngx_http_idem_page_lit(pg, "</h1>\n");
}


static ngx_int_t
ngx_http_idem_page_header(ngx_http_request_t *r, const char *name,
    u_char *value, size_t len)
{
    ngx_table_elt_t  *h;

    h = ngx_list_push(&r->headers_out.headers);
    if (h == NULL) {
        return NGX_ERROR;
    }

    h->hash = 1;
    h->key.data = (u_char *) name;
    h->key.len = ngx_strlen(name);
    h->value.data = value;
    h->value.len = len;
    h->lowcase_key = ngx_pnalloc(r->pool, h->key.len);

    if (h->lowcase_key == NULL) {
        return NGX_ERROR;
    }

    ngx_strlow(h->lowcase_key, h->key.data, h->key.len);

    return NGX_OK;
}


/* the page's headers: nothing but its own style, no frame, no cache */
static ngx_int_t
ngx_http_idem_page_headers(ngx_http_request_t *r, u_char *nonce)
{
    u_char  *csp, *p;

    csp = ngx_pnalloc(r->pool, 256);
    if (csp == NULL) {
        return NGX_ERROR;
    }

    p = ngx_sprintf(csp, "default-src 'none'; style-src 'nonce-%s'; "
                    "form-action 'self'; frame-ancestors 'none'; "
                    "base-uri 'none'", nonce);

#define H(n, v)  ngx_http_idem_page_header(r, n, (u_char *) v, sizeof(v) - 1)

    if (ngx_http_idem_page_header(r, "Content-Security-Policy", csp, p - csp)
        != NGX_OK
        || H("X-Frame-Options", "DENY") != NGX_OK
        || H("Cache-Control", "no-store") != NGX_OK
        || H("Referrer-Policy", "no-referrer") != NGX_OK
        || H("X-Content-Type-Options", "nosniff") != NGX_OK)
    {
        return NGX_ERROR;
    }

#undef H

    ngx_str_set(&r->headers_out.content_type, "text/html; charset=utf-8");
    r->headers_out.content_type_len = r->headers_out.content_type.len;

    return NGX_OK;
}


static ngx_int_t
ngx_http_idem_page_send(ngx_http_idem_page_t *pg, ngx_uint_t status,
    u_char *nonce)
{
    ngx_int_t            rc;
    ngx_buf_t           *b;
    ngx_chain_t          out;
    ngx_http_request_t  *r;

    r = pg->r;
    ngx_http_idem_page_lit(pg, "</main></body></html>\n");

    if (pg->failed || ngx_http_idem_page_headers(r, nonce) != NGX_OK) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    r->headers_out.status = status;
    r->headers_out.content_length_n = pg->pos - pg->start;

    rc = ngx_http_send_header(r);

    if (rc == NGX_ERROR || rc > NGX_OK || r->header_only) {
        return rc;
    }

    b = ngx_calloc_buf(r->pool);
    if (b == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    b->pos = pg->start;
    b->last = pg->pos;
    b->memory = 1;
    b->last_buf = (r == r->main);
    b->last_in_chain = 1;

    out.buf = b;
    out.next = NULL;

    return ngx_http_output_filter(r, &out);
}


/* a page that only says something: why nothing was done, or what was */
static ngx_int_t
ngx_http_idem_page_say(ngx_http_request_t *r, ngx_uint_t status,
    const char *title, const char *cls, const char *text, ngx_str_t *who)
{
    u_char                nonce[33];
    ngx_http_idem_page_t  pg;

    ngx_memzero(&pg, sizeof(ngx_http_idem_page_t));
    pg.r = r;

    if (ngx_http_idem_page_nonce(nonce) != NGX_OK) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    ngx_http_idem_page_head(&pg, title, nonce);
    ngx_http_idem_page_lit(&pg, "<p class=\"");
    ngx_http_idem_page_cstr(&pg, cls);
    ngx_http_idem_page_lit(&pg, "\" id=\"result\">");
    ngx_http_idem_page_cstr(&pg, text);

    if (who && who->len) {
        ngx_http_idem_page_lit(&pg, " (");
        ngx_http_idem_page_text(&pg, who->data, who->len);
        ngx_http_idem_page_lit(&pg, ")");
    }

    ngx_http_idem_page_lit(&pg, "</p><p><a href=\"?\">Operations awaiting "
                           "approval</a></p>");

    return ngx_http_idem_page_send(&pg, status, nonce);
}


/* -------------------------------------------------------------- token */

/*
 * HMAC-SHA-256 with the page's secret over the operation id, the
 * fingerprint, the approver and the expiry, each length-prefixed: a
 * token of one operation, person or time fits no other.
 */
static ngx_int_t
ngx_http_idem_page_token(ngx_http_idem_loc_conf_t *conf, ngx_str_t *op,
    ngx_str_t *fp, ngx_str_t *who, time_t exp, u_char out[65])
{
    u_char        msg[IDEM_TOKEN_LEN + IDEM_FP_LEN + IDEM_APPROVER_MAX + 96];
    u_char        mac[EVP_MAX_MD_SIZE], *p;
    unsigned int  n;

    if (op->len != IDEM_TOKEN_LEN || fp->len != IDEM_FP_LEN
        || who->len > IDEM_APPROVER_MAX)
    {
        return NGX_ERROR;
    }

    p = ngx_sprintf(msg, "idem-page-v1\n%uz:%V%uz:%V%uz:%V%T", op->len, op,
                    fp->len, fp, who->len, who, exp);

    if (HMAC(EVP_sha256(), conf->page_secret->secret,
             (int) conf->page_secret->secret_len, msg, p - msg, mac, &n)
        == NULL || n != 32)
    {
        return NGX_ERROR;
    }

    ngx_hex_dump(out, mac, 32);
    out[64] = '\0';

    return NGX_OK;
}


/* ------------------------------------------------------------ one view */

static void
ngx_http_idem_page_row(ngx_http_idem_page_t *pg, const char *label,
    size_t llen, const char *value, size_t vlen, const char *id)
{
    ngx_http_idem_page_lit(pg, "<dt>");
    ngx_http_idem_page_text(pg, (const u_char *) label, llen);
    ngx_http_idem_page_lit(pg, "</dt><dd");

    if (id) {
        ngx_http_idem_page_lit(pg, " id=\"");
        ngx_http_idem_page_cstr(pg, id);
        ngx_http_idem_page_lit(pg, "\"");
    }

    ngx_http_idem_page_lit(pg, ">");
    ngx_http_idem_page_text(pg, (const u_char *) value, vlen);
    ngx_http_idem_page_lit(pg, "</dd>\n");
}


static const char *
ngx_http_idem_page_member(cJSON *o, const char *name)
{
    const char  *s;

    s = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(o, name));

    return s ? s : "";
}


/* each shown value with its label: a string as itself, else its JSON */
static void
ngx_http_idem_page_values(ngx_http_idem_page_t *pg, cJSON *prop)
{
    char         *text;
    cJSON        *show, *labels, *v;
    const char   *label;

    show = cJSON_GetObjectItemCaseSensitive(prop, "show");
    labels = cJSON_GetObjectItemCaseSensitive(prop, "labels");

    cJSON_ArrayForEach(v, show) {
        label = cJSON_GetStringValue(
                    cJSON_GetObjectItemCaseSensitive(labels, v->string));
        label = label ? label : v->string;

        if (cJSON_IsString(v)) {
            ngx_http_idem_page_row(pg, label, ngx_strlen(label),
                                   v->valuestring, ngx_strlen(v->valuestring),
                                   NULL);
            continue;
        }

        text = cJSON_IsNull(v) ? NULL : cJSON_PrintUnformatted(v);
        ngx_http_idem_page_row(pg, label, ngx_strlen(label),
                               text ? text : "(absent from the body)",
                               text ? ngx_strlen(text) : 22, NULL);
        cJSON_free(text);
    }
}


/* method host route?query, as one line */
static void
ngx_http_idem_page_what(ngx_http_idem_page_t *pg, cJSON *prop)
{
    u_char       *p, *line;
    size_t        len;
    const char   *m, *h, *rt, *q;

    m = ngx_http_idem_page_member(prop, "method");
    h = ngx_http_idem_page_member(prop, "host");
    rt = ngx_http_idem_page_member(prop, "route");
    q = ngx_http_idem_page_member(prop, "query");

    len = ngx_strlen(m) + ngx_strlen(h) + ngx_strlen(rt) + ngx_strlen(q) + 4;
    line = ngx_pnalloc(pg->r->pool, len);
    if (line == NULL) {
        pg->failed = 1;
        return;
    }

    p = ngx_sprintf(line, "%s %s%s%s%s", m, h, rt, *q ? "?" : "", q);
    ngx_http_idem_page_row(pg, "Request", 7, (char *) line, p - line,
                           "request");
}


static void
ngx_http_idem_page_details(ngx_http_idem_page_t *pg, cJSON *prop,
    ngx_http_idem_lookup_t *lk, const char *state)
{
    const char  *fp, *d;

    d = ngx_http_idem_page_member(prop, "describe");

    if (*d) {
        ngx_http_idem_page_lit(pg, "<p class=\"describe\" id=\"describe\">");
        ngx_http_idem_page_cstr(pg, d);
        ngx_http_idem_page_lit(pg, "</p>\n");
    }

    ngx_http_idem_page_lit(pg, "<dl>\n");
    ngx_http_idem_page_what(pg, prop);
    ngx_http_idem_page_values(pg, prop);
    ngx_http_idem_page_row(pg, "Asked by", 8,
        ngx_http_idem_page_member(prop, "requested_by"),
        ngx_strlen(ngx_http_idem_page_member(prop, "requested_by")), NULL);
    ngx_http_idem_page_row(pg, "Operation id", 12, (char *) lk->op.data,
                           lk->op.len, "op");
    d = ngx_http_idem_page_member(prop, "idempotency_key");
    ngx_http_idem_page_row(pg, "Idempotency key", 15, d, ngx_strlen(d), NULL);

    fp = ngx_http_idem_page_member(prop, "fingerprint");
    ngx_http_idem_page_lit(pg, "<dt>Fingerprint</dt><dd><details><summary>");
    ngx_http_idem_page_text(pg, (const u_char *) fp, ngx_min(12,
                                                      ngx_strlen(fp)));
    ngx_http_idem_page_lit(pg, "&hellip;</summary>");
    ngx_http_idem_page_cstr(pg, fp);
    ngx_http_idem_page_lit(pg, "</details></dd>\n<dt>Proposal expires</dt>"
                           "<dd id=\"expires\">");
    ngx_http_idem_page_time(pg, (time_t) cJSON_GetNumberValue(
                  cJSON_GetObjectItemCaseSensitive(prop, "expires")));
    ngx_http_idem_page_lit(pg, "</dd>\n<dt>State</dt><dd class=\"state\" "
                           "id=\"state\">");
    ngx_http_idem_page_cstr(pg, state);
    ngx_http_idem_page_lit(pg, "</dd>\n</dl>\n");
}


static void
ngx_http_idem_page_hidden(ngx_http_idem_page_t *pg, const char *name,
    const u_char *value, size_t len)
{
    ngx_http_idem_page_lit(pg, "<input type=\"hidden\" name=\"");
    ngx_http_idem_page_cstr(pg, name);
    ngx_http_idem_page_lit(pg, "\" value=\"");
    ngx_http_idem_page_text(pg, value, len);
    ngx_http_idem_page_lit(pg, "\">");
}


/* Approve and Decline, with a token for this operation and person */
static void
ngx_http_idem_page_form(ngx_http_idem_page_t *pg, ngx_http_idem_lookup_t *lk,
    ngx_str_t *who, time_t exp)
{
    u_char      token[65], num[64];
    ngx_str_t   fp;
    ngx_uint_t  i;

    fp.data = (u_char *) lk->rec.fp;
    fp.len = IDEM_FP_LEN;

    if (ngx_http_idem_page_token(ngx_http_get_module_loc_conf(pg->r,
                                     ngx_http_idempotency_module),
                                 &lk->op, &fp, who, exp, token) != NGX_OK)
    {
        pg->failed = 1;
        return;
    }

    ngx_http_idem_page_lit(pg, "<form method=\"post\">");
    ngx_http_idem_page_hidden(pg, "op", lk->op.data, lk->op.len);
    ngx_http_idem_page_hidden(pg, "fp", fp.data, fp.len);
    ngx_http_idem_page_hidden(pg, "exp", num, ngx_sprintf(num, "%T", exp)
                                              - num);
    ngx_http_idem_page_hidden(pg, "token", token, 64);
    ngx_http_idem_page_lit(pg, "<label>Approval valid for <select name=\"ttl\">");

    for (i = 0; ngx_http_idem_page_ttls[i]
                && ngx_http_idem_page_ttls[i] <= ((ngx_http_idem_loc_conf_t *)
                       ngx_http_get_module_loc_conf(pg->r,
                           ngx_http_idempotency_module))->page_ttl_max;
         i++)
    {
        ngx_http_idem_page_raw(pg, (char *) num,
            ngx_sprintf(num, "<option value=\"%i\">",
                        ngx_http_idem_page_ttls[i]) - num);
        ngx_http_idem_page_raw(pg, (char *) num,
            ngx_sprintf(num, "%i min</option>",
                        ngx_http_idem_page_ttls[i] / 60) - num);
    }

    ngx_http_idem_page_lit(pg, "</select></label>"
        "<button type=\"submit\" name=\"decision\" value=\"approve\" "
        "class=\"approve\" id=\"approve\">Approve</button>"
        "<button type=\"submit\" name=\"decision\" value=\"decline\" "
        "class=\"decline\" id=\"decline\">Decline</button></form>\n"
        "<p>Signed in as <strong id=\"who\">");
    ngx_http_idem_page_text(pg, who->data, who->len);
    ngx_http_idem_page_lit(pg, "</strong></p>\n");
}


/* why there is nothing to decide, from the record's state */
static void
ngx_http_idem_page_why(ngx_http_idem_page_t *pg, ngx_http_idem_lookup_t *lk,
    const char *state)
{
    ngx_http_idem_page_lit(pg, "<p class=\"why\" id=\"why\">");

    if (!lk->has_rec || ngx_strcmp(state, "expired") == 0) {
        ngx_http_idem_page_lit(pg, "This proposal has expired: nothing can "
                               "be approved. The client must ask again.");

    } else if (lk->rec.state == 'd' || lk->rec.state == 'p') {
        ngx_http_idem_page_lit(pg, "This operation was already ");
        ngx_http_idem_page_cstr(pg, state);
        ngx_http_idem_page_lit(pg, " by ");
        ngx_http_idem_page_text(pg, (const u_char *) lk->rec.approver,
                                lk->rec.approver_len);
        ngx_http_idem_page_lit(pg, ".");

    } else {
        ngx_http_idem_page_lit(pg, "This operation is no longer awaiting "
                               "approval: it has run or is running (");
        ngx_http_idem_page_cstr(pg, state);
        ngx_http_idem_page_lit(pg, ").");
    }

    ngx_http_idem_page_lit(pg, "</p>\n");
}


/* the state a person is told; "expired" once the proposal's time is up */
static const char *
ngx_http_idem_page_state(ngx_http_idem_lookup_t *lk, time_t *until)
{
    *until = 0;

    if (!lk->has_rec) {
        return "expired";
    }

    if (lk->rec.state == 'a') {
        *until = (time_t) (lk->rec.expires / 1000);

        if (lk->rec.expires <= ngx_http_idem_now_ms()) {
            return "expired";
        }
    }

    return idem_state_name(lk->rec.state);
}


static ngx_int_t
ngx_http_idem_page_view(ngx_http_request_t *r, ngx_http_idem_ctx_t *ctx,
    ngx_http_idem_lookup_t *lk)
{
    u_char                nonce[33];
    cJSON                *prop;
    time_t                until;
    ngx_int_t             rc;
    ngx_str_t             who;
    const char           *state;
    ngx_http_idem_page_t  pg;

    if (lk->failed) {
        return ngx_http_idem_page_say(r, NGX_HTTP_SERVICE_UNAVAILABLE,
                   "Try again", "why", "The idempotency store cannot be "
                   "reached; nothing was done.", NULL);
    }

    prop = lk->found ? cJSON_Parse((char *) lk->proposal.data) : NULL;

    if (prop == NULL) {
        return ngx_http_idem_page_say(r, NGX_HTTP_NOT_FOUND,
                   "No such proposal", "why", "No proposal with this "
                   "operation id is known: it has expired, or never "
                   "existed. Nothing can be approved.", NULL);
    }

    if (ngx_http_idem_approve_who(r, ctx->conf, &who) != NGX_OK
        || ngx_http_idem_page_nonce(nonce) != NGX_OK)
    {
        cJSON_Delete(prop);
        return NGX_HTTP_FORBIDDEN;
    }

    ngx_memzero(&pg, sizeof(ngx_http_idem_page_t));
    pg.r = r;
    state = ngx_http_idem_page_state(lk, &until);

    ngx_http_idem_page_head(&pg, "Approve this operation?", nonce);
    ngx_http_idem_page_details(&pg, prop, lk, state);
    cJSON_Delete(prop);

    if (lk->has_rec && lk->rec.state == 'a' && until > ngx_time()) {
        ngx_http_idem_page_form(&pg, lk, &who,
                                ngx_min(until, ngx_time()
                                               + NGX_HTTP_IDEM_PAGE_FORM_TTL));

    } else {
        ngx_http_idem_page_why(&pg, lk, state);
    }

    rc = ngx_http_idem_page_send(&pg, NGX_HTTP_OK, nonce);

    return rc;
}


/* ------------------------------------------------------------ the list */

#define NGX_HTTP_IDEM_PAGE_LIST_MAX  20

static ngx_str_t  ngx_http_idem_page_zrange = ngx_string("ZREVRANGEBYSCORE");


typedef struct {
    ngx_http_idem_page_t     pg;
    u_char                   nonce[33];
    ngx_str_t                ops[NGX_HTTP_IDEM_PAGE_LIST_MAX];
    ngx_uint_t               n;
    ngx_uint_t               next;
    ngx_uint_t               shown;
} ngx_http_idem_page_list_t;


static ngx_int_t ngx_http_idem_page_list_next(ngx_http_request_t *r,
    ngx_http_idem_ctx_t *ctx, ngx_http_idem_page_list_t *ls);


/* one pending operation: its link, what it does, until when */
static void
ngx_http_idem_page_list_row(ngx_http_idem_page_t *pg,
    ngx_http_idem_lookup_t *lk)
{
    cJSON       *prop;
    const char  *d;

    prop = cJSON_Parse((char *) lk->proposal.data);

    ngx_http_idem_page_lit(pg, "<tr><td><a href=\"?op=");
    ngx_http_idem_page_text(pg, lk->op.data, lk->op.len);
    ngx_http_idem_page_lit(pg, "\">");
    ngx_http_idem_page_text(pg, lk->op.data, 12);
    ngx_http_idem_page_lit(pg, "&hellip;</a></td><td>");
    ngx_http_idem_page_cstr(pg, ngx_http_idem_page_member(prop, "method"));
    ngx_http_idem_page_lit(pg, " ");
    ngx_http_idem_page_cstr(pg, ngx_http_idem_page_member(prop, "route"));
    ngx_http_idem_page_lit(pg, "</td><td>");
    d = ngx_http_idem_page_member(prop, "describe");
    ngx_http_idem_page_cstr(pg, d);
    ngx_http_idem_page_lit(pg, "</td><td>");
    ngx_http_idem_page_time(pg, (time_t) (lk->rec.expires / 1000));
    ngx_http_idem_page_lit(pg, "</td></tr>\n");

    cJSON_Delete(prop);
}


static ngx_int_t
ngx_http_idem_page_list_done(ngx_http_request_t *r, ngx_http_idem_ctx_t *ctx,
    ngx_http_idem_lookup_t *lk)
{
    ngx_http_idem_page_list_t  *ls;

    ls = ctx->approval;

    /* only what still waits for a person: not decided, run or ended */
    if (!lk->failed && lk->found && lk->has_rec && lk->rec.state == 'a'
        && lk->rec.expires > ngx_http_idem_now_ms())
    {
        ngx_http_idem_page_list_row(&ls->pg, lk);
        ls->shown++;
    }

    /* the next lookup counts the request again: this one is over */
    r->main->count--;

    return ngx_http_idem_page_list_next(r, ctx, ls);
}


static ngx_int_t
ngx_http_idem_page_list_next(ngx_http_request_t *r, ngx_http_idem_ctx_t *ctx,
    ngx_http_idem_page_list_t *ls)
{
    ngx_http_idem_lookup_t  *lk;

    if (ls->next < ls->n) {
        lk = ngx_pcalloc(r->pool, sizeof(ngx_http_idem_lookup_t));
        if (lk == NULL) {
            return NGX_HTTP_INTERNAL_SERVER_ERROR;
        }

        lk->op = ls->ops[ls->next++];
        lk->done = ngx_http_idem_page_list_done;

        return ngx_http_idem_lookup(r, ctx, lk);
    }

    ngx_http_idem_page_lit(&ls->pg, "</tbody></table>\n");

    if (ls->shown == 0) {
        ngx_http_idem_page_lit(&ls->pg, "<p id=\"none\">No operation is "
                               "awaiting approval.</p>\n");
    }

    return ngx_http_idem_page_send(&ls->pg, NGX_HTTP_OK, ls->nonce);
}


static void
ngx_http_idem_page_list_ids(ngx_http_idem_cmd_t *cmd, redisReply *reply)
{
    size_t                      i;
    ngx_int_t                   rc;
    ngx_connection_t           *c;
    ngx_http_request_t         *r;
    ngx_http_idem_ctx_t        *ctx;
    ngx_http_idem_page_list_t  *ls;

    ctx = cmd->data;

    if (ctx == NULL) {
        return;
    }

    ctx->cmd = NULL;
    r = ctx->request;
    c = r->connection;
    ls = ctx->approval;

    for (i = 0; reply && reply->type == REDIS_REPLY_ARRAY
                && i < reply->elements && ls->n < NGX_HTTP_IDEM_PAGE_LIST_MAX;
         i++)
    {
        if (reply->element[i]->type == REDIS_REPLY_STRING
            && reply->element[i]->len == IDEM_TOKEN_LEN
            && idem_is_hex(reply->element[i]->str, IDEM_TOKEN_LEN))
        {
            ls->ops[ls->n].data = ngx_pnalloc(r->pool, IDEM_TOKEN_LEN);
            if (ls->ops[ls->n].data == NULL) {
                break;
            }

            ngx_memcpy(ls->ops[ls->n].data, reply->element[i]->str,
                       IDEM_TOKEN_LEN);
            ls->ops[ls->n++].len = IDEM_TOKEN_LEN;
        }
    }

    rc = (reply == NULL || reply->type != REDIS_REPLY_ARRAY)
         ? ngx_http_idem_page_say(r, NGX_HTTP_SERVICE_UNAVAILABLE,
               "Try again", "why", "The idempotency store cannot be "
               "reached.", NULL)
         : ngx_http_idem_page_list_next(r, ctx, ls);

    if (rc != NGX_DONE) {
        ngx_http_finalize_request(r, rc);
        ngx_http_run_posted_requests(c);
    }
}


/*
 * GET without op: the latest-ending pending operations (newest first),
 * read from IDEM_PENDING_KEY, each then looked up as ?op= does: one
 * ZREVRANGEBYSCORE and two GETs per listed operation
 */
static ngx_int_t
ngx_http_idem_page_list(ngx_http_request_t *r, ngx_http_idem_ctx_t *ctx)
{
    ngx_http_idem_cmd_t        *cmd;
    ngx_http_idem_page_list_t  *ls;

    ls = ngx_pcalloc(r->pool, sizeof(ngx_http_idem_page_list_t));
    if (ls == NULL || ngx_http_idem_page_nonce(ls->nonce) != NGX_OK) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    ls->pg.r = r;
    ctx->approval = ls;

    ngx_http_idem_page_head(&ls->pg, "Operations awaiting approval",
                            ls->nonce);
    ngx_http_idem_page_lit(&ls->pg, "<table><thead><tr><th>Operation</th>"
                           "<th>Request</th><th>What</th><th>Expires</th>"
                           "</tr></thead><tbody id=\"pending\">\n");

    cmd = ngx_http_idem_cmd_native(ctx->conf->redis,
                                   &ngx_http_idem_page_zrange, 5,
                                   (u_char *) IDEM_PENDING_KEY,
                                   2 * NGX_INT64_LEN + 16,
                                   r->connection->log);
    if (cmd == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    ngx_http_idem_cmd_set(cmd, 0, "+inf", 4);
    ngx_http_idem_cmd_set_num(cmd, 1, ngx_http_idem_now_ms());
    ngx_http_idem_cmd_set(cmd, 2, "LIMIT", 5);
    ngx_http_idem_cmd_set_num(cmd, 3, 0);
    ngx_http_idem_cmd_set_num(cmd, 4, NGX_HTTP_IDEM_PAGE_LIST_MAX);

    if (ngx_http_idem_cmd_send(cmd, ngx_http_idem_page_list_ids, ctx)
        != NGX_OK)
    {
        return ngx_http_idem_page_say(r, NGX_HTTP_SERVICE_UNAVAILABLE,
                   "Try again", "why", "The idempotency store cannot be "
                   "reached.", NULL);
    }

    ctx->cmd = cmd;
    r->main->count++;

    return NGX_DONE;
}


/* ----------------------------------------------------------- the post */

typedef struct {
    ngx_str_t   op;
    ngx_str_t   fp;
    ngx_str_t   exp;
    ngx_str_t   token;
    ngx_str_t   decision;
    ngx_str_t   ttl;
} ngx_http_idem_page_form_t;


/* the form's fields, each at most once: NGX_OK, NGX_DECLINED when bad */
static ngx_int_t
ngx_http_idem_page_fields(u_char *p, u_char *last,
    ngx_http_idem_page_form_t *f)
{
    u_char     *amp, *eq;
    ngx_str_t  *dst;

    while (p < last) {
        amp = ngx_strlchr(p, last, '&');
        amp = amp ? amp : last;
        eq = ngx_strlchr(p, amp, '=');

        if (eq == NULL) {
            return NGX_DECLINED;
        }

#define F(n)  (eq - p == sizeof(n) - 1 && ngx_strncmp(p, n, eq - p) == 0)
        dst = F("op") ? &f->op : F("fp") ? &f->fp : F("exp") ? &f->exp
              : F("token") ? &f->token : F("decision") ? &f->decision
              : F("ttl") ? &f->ttl : NULL;
#undef F

        if (dst && dst->data) {
            return NGX_DECLINED;
        }

        if (dst) {
            dst->data = eq + 1;
            dst->len = amp - eq - 1;
        }

        p = amp + 1;
    }

    return (f->op.data && f->fp.data && f->exp.data && f->token.data
            && f->decision.data) ? NGX_OK : NGX_DECLINED;
}


/* the body in one buffer (a form of a few hundred bytes) */
static ngx_int_t
ngx_http_idem_page_form_read(ngx_http_request_t *r,
    ngx_http_idem_page_form_t *f)
{
    u_char       *text, *p;
    size_t        size;
    ngx_chain_t  *cl;

    ngx_memzero(f, sizeof(ngx_http_idem_page_form_t));
    size = 0;

    for (cl = r->request_body ? r->request_body->bufs : NULL; cl;
         cl = cl->next)
    {
        if (cl->buf->in_file) {
            return NGX_DECLINED;
        }

        size += cl->buf->last - cl->buf->pos;
    }

    if (size == 0 || size > NGX_HTTP_IDEM_PAGE_BODY_MAX) {
        return NGX_DECLINED;
    }

    text = ngx_pnalloc(r->pool, size);
    if (text == NULL) {
        return NGX_ERROR;
    }

    p = text;

    for (cl = r->request_body->bufs; cl; cl = cl->next) {
        if (cl->buf->last != cl->buf->pos) {
            p = ngx_cpymem(p, cl->buf->pos, cl->buf->last - cl->buf->pos);
        }
    }

    return ngx_http_idem_page_fields(text, p, f);
}


/* what the person decided and for how long, once the token holds */
static ngx_int_t
ngx_http_idem_page_decision(ngx_http_request_t *r,
    ngx_http_idem_page_form_t *f, ngx_http_idem_approval_t *a)
{
    ngx_uint_t                 i;
    ngx_int_t                  ttl;
    ngx_http_idem_loc_conf_t  *conf;

    if (f->decision.len == 7
        && ngx_strncmp(f->decision.data, "decline", 7) == 0)
    {
        a->decline = 1;
        a->expires_in = 1;
        a->once = 1;
        return NGX_OK;
    }

    if (f->decision.len != 7
        || ngx_strncmp(f->decision.data, "approve", 7) != 0
        || f->ttl.data == NULL)
    {
        return NGX_DECLINED;
    }

    ttl = ngx_atoi(f->ttl.data, f->ttl.len);

    conf = ngx_http_get_module_loc_conf(r, ngx_http_idempotency_module);

    for (i = 0; ngx_http_idem_page_ttls[i]; i++) {
        if (ttl == ngx_http_idem_page_ttls[i] && ttl <= conf->page_ttl_max) {
            a->expires_in = ttl;
            a->once = 1;
            return NGX_OK;
        }
    }

    return NGX_DECLINED;
}


/*
 * The token must be this page's, for this operation, fingerprint and
 * person, and not expired: NGX_OK, or the reason (static)
 */
static const char *
ngx_http_idem_page_check(ngx_http_request_t *r, ngx_http_idem_ctx_t *ctx,
    ngx_http_idem_page_form_t *f, ngx_http_idem_approval_t *a)
{
    u_char     want[65];
    time_t     exp;

    exp = ngx_atotm(f->exp.data, f->exp.len);

    if (f->op.len != IDEM_TOKEN_LEN
        || !idem_is_hex((const char *) f->op.data, f->op.len)
        || f->fp.len != IDEM_FP_LEN
        || !idem_is_hex((const char *) f->fp.data, f->fp.len)
        || exp == NGX_ERROR
        || f->token.len != NGX_HTTP_IDEM_PAGE_TOKEN_LEN
        || ngx_http_idem_page_token(ctx->conf, &f->op, &f->fp, &a->approver,
                                    exp, want) != NGX_OK
        || CRYPTO_memcmp(want, f->token.data, 64) != 0)
    {
        return "This form is not valid for this operation and this person: "
               "nothing was recorded. Open the operation's page again.";
    }

    if (exp <= ngx_time()) {
        return "This form has expired: nothing was recorded. Open the "
               "operation's page again.";
    }

    if (ngx_http_idem_page_decision(r, f, a) != NGX_OK) {
        return "Choose Approve (with one of the offered lifetimes) or "
               "Decline: nothing was recorded.";
    }

    a->op = f->op;
    a->fp = f->fp;

    return NULL;
}


/* the result page of what approve.lua said */
static ngx_int_t
ngx_http_idem_page_result(ngx_http_request_t *r, ngx_http_idem_ctx_t *ctx,
    idem_approve_kind_e kind, const char *state, long long at)
{
    ngx_http_idem_approval_t  *a;

    a = ctx->approval;

    switch (kind) {

    case IDEM_APPROVE_APPROVED:
        return ngx_http_idem_page_say(r, NGX_HTTP_OK, "Approved", "ok",
                   "You approved this operation. The client's next attempt "
                   "with the same request runs it once.", &a->approver);

    case IDEM_APPROVE_DECLINED:
        return ngx_http_idem_page_say(r, NGX_HTTP_OK, "Declined", "ok",
                   "You declined this operation. It will not run; every "
                   "attempt with its key is refused.", &a->approver);

    case IDEM_APPROVE_NONE:
        return ngx_http_idem_page_say(r, NGX_HTTP_NOT_FOUND, "Not recorded",
                   "why", "This proposal has expired, or is unknown: "
                   "nothing was recorded.", NULL);

    case IDEM_APPROVE_MISMATCH:
        return ngx_http_idem_page_say(r, NGX_HTTP_CONFLICT, "Not recorded",
                   "why", "The operation changed since this page was shown "
                   "(another fingerprint): nothing was recorded.", NULL);

    case IDEM_APPROVE_REFUSED:
        return ngx_http_idem_page_say(r, NGX_HTTP_CONFLICT, "Not recorded",
                   "why", ngx_strcmp(state, "approved") == 0
                          || ngx_strcmp(state, "declined") == 0
                   ? "This operation was already decided: nothing changed."
                   : "This operation is no longer awaiting approval (it has "
                     "run or is running): nothing was recorded.", NULL);

    default:
        return ngx_http_idem_page_say(r, NGX_HTTP_INTERNAL_SERVER_ERROR,
                   "Not recorded", "why", "The idempotency store answered "
                   "something unexpected: nothing is known to be recorded.",
                   NULL);
    }
}


static void
ngx_http_idem_page_post(ngx_http_request_t *r)
{
    ngx_int_t                   rc;
    const char                 *why;
    ngx_http_idem_ctx_t        *ctx;
    ngx_http_idem_approval_t   *a;
    ngx_http_idem_page_form_t   f;

    ctx = ngx_http_idem_get_ctx(r);
    a = ngx_pcalloc(r->pool, sizeof(ngx_http_idem_approval_t));

    if (ctx == NULL || a == NULL) {
        ngx_http_finalize_request(r, NGX_HTTP_INTERNAL_SERVER_ERROR);
        return;
    }

    a->decided = ngx_http_idem_page_result;
    rc = ngx_http_idem_page_form_read(r, &f);

    if (rc == NGX_ERROR
        || ngx_http_idem_approve_who(r, ctx->conf, &a->approver) != NGX_OK)
    {
        ngx_http_finalize_request(r, rc == NGX_ERROR
                                     ? NGX_HTTP_INTERNAL_SERVER_ERROR
                                     : NGX_HTTP_FORBIDDEN);
        return;
    }

    why = (rc == NGX_OK) ? ngx_http_idem_page_check(r, ctx, &f, a)
                         : "This is not the approval page's form: nothing "
                           "was recorded.";

    rc = why ? ngx_http_idem_page_say(r, NGX_HTTP_FORBIDDEN, "Not recorded",
                                      "why", why, NULL)
             : ngx_http_idem_approve_record(r, ctx, a);

    if (rc != NGX_DONE) {
        ngx_http_finalize_request(r, rc);
    }
}


/* ------------------------------------------------------------ handler */

static ngx_int_t
ngx_http_idem_page_form_type(ngx_http_request_t *r)
{
    ngx_str_t  *ct;

    if (r->headers_in.content_type == NULL) {
        return NGX_DECLINED;
    }

    ct = &r->headers_in.content_type->value;

    return (ct->len >= 33
            && ngx_strncasecmp(ct->data, (u_char *)
                               "application/x-www-form-urlencoded", 33) == 0
            && (ct->len == 33 || ct->data[33] == ';'))
           ? NGX_OK : NGX_DECLINED;
}


static ngx_int_t
ngx_http_idem_page_post_start(ngx_http_request_t *r)
{
    ngx_int_t  rc;

    /* refused before the body is read: nothing of it is believed */
    if (ngx_http_idem_same_site(r) != NGX_OK
        || ngx_http_idem_page_form_type(r) != NGX_OK)
    {
        rc = ngx_http_discard_request_body(r);
        if (rc != NGX_OK) {
            return rc;
        }

        return ngx_http_idem_same_site(r) != NGX_OK
               ? ngx_http_idem_page_say(r, NGX_HTTP_FORBIDDEN, "Not recorded",
                     "why", "This form was sent from another site: nothing "
                     "was recorded.", NULL)
               : ngx_http_idem_page_say(r, NGX_HTTP_UNSUPPORTED_MEDIA_TYPE,
                     "Not recorded", "why", "This is not the approval "
                     "page's form: nothing was recorded.", NULL);
    }

    r->request_body_in_single_buf = 1;

    rc = ngx_http_read_client_request_body(r, ngx_http_idem_page_post);

    if (rc >= NGX_HTTP_SPECIAL_RESPONSE) {
        return rc;
    }

    return NGX_DONE;
}


static ngx_int_t
ngx_http_idem_page_handler(ngx_http_request_t *r)
{
    ngx_int_t                rc;
    ngx_str_t                who;
    ngx_http_idem_ctx_t     *ctx;
    ngx_http_idem_lookup_t  *lk;

    if (!(r->method & (NGX_HTTP_GET|NGX_HTTP_HEAD|NGX_HTTP_POST))) {
        return ngx_http_idem_send_not_allowed(r, "GET, HEAD, POST");
    }

    ctx = ngx_http_idem_create_ctx(r);
    if (ctx == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    ctx->conf = ngx_http_get_module_loc_conf(r, ngx_http_idempotency_module);
    ctx->phase = NGX_HTTP_IDEM_DONE;

    /* nobody authenticated: nothing to show, nobody to approve as */
    if (ngx_http_idem_approve_who(r, ctx->conf, &who) != NGX_OK) {
        return NGX_HTTP_FORBIDDEN;
    }

    if (r->method & NGX_HTTP_POST) {
        return ngx_http_idem_page_post_start(r);
    }

    rc = ngx_http_discard_request_body(r);
    if (rc != NGX_OK) {
        return rc;
    }

    lk = ngx_pcalloc(r->pool, sizeof(ngx_http_idem_lookup_t));
    if (lk == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    rc = ngx_http_idem_op_arg(r, &lk->op);

    if (rc == NGX_DECLINED) {
        return ngx_http_idem_page_list(r, ctx);
    }

    if (rc != NGX_OK) {
        return ngx_http_idem_page_say(r, NGX_HTTP_NOT_FOUND,
                   "No such proposal", "why", "op must be an operation id "
                   "(32 lowercase hex).", NULL);
    }

    lk->done = ngx_http_idem_page_view;

    return ngx_http_idem_lookup(r, ctx, lk);
}


/*
 * Without secret=FILE one host is enough: a secret of this configuration's
 * life (several hosts behind one name need the file, so that each accepts
 * the others' forms)
 */
static char *
ngx_http_idem_page_random_secret(ngx_conf_t *cf, ngx_http_idem_loc_conf_t *lcf)
{
    u_char  raw[32];

    lcf->page_secret = ngx_pcalloc(cf->pool, sizeof(idem_jws_key_t));
    if (lcf->page_secret == NULL) {
        return NGX_CONF_ERROR;
    }

    lcf->page_secret->secret = ngx_pnalloc(cf->pool, sizeof(raw));
    if (lcf->page_secret->secret == NULL || RAND_bytes(raw, sizeof(raw)) != 1)
    {
        return NGX_CONF_ERROR;
    }

    ngx_memcpy(lcf->page_secret->secret, raw, sizeof(raw));
    ngx_explicit_memzero(raw, sizeof(raw));
    lcf->page_secret->secret_len = sizeof(raw);

    return NGX_CONF_OK;
}


/* idempotency_approve_page [secret=FILE] [max_ttl=time] */
static char *
ngx_http_idem_page_conf(ngx_conf_t *cf, ngx_http_idem_loc_conf_t *lcf)
{
    ngx_str_t   *value, file, v;
    ngx_uint_t   i;

    value = cf->args->elts;
    lcf->page_ttl_max = 3600;
    ngx_str_null(&file);

    for (i = 1; i < cf->args->nelts; i++) {
        if (ngx_strncmp(value[i].data, "secret=", 7) == 0 && !file.data) {
            file.data = value[i].data + 7;
            file.len = value[i].len - 7;
            continue;
        }

        v.data = value[i].data + 8;
        v.len = value[i].len - 8;

        if (ngx_strncmp(value[i].data, "max_ttl=", 8) != 0
            || (lcf->page_ttl_max = ngx_parse_time(&v, 1)) == NGX_ERROR
            || lcf->page_ttl_max < ngx_http_idem_page_ttls[0])
        {
            ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                               "\"idempotency_approve_page\": invalid "
                               "parameter \"%V\", expected secret=FILE or "
                               "max_ttl=time (at least 5m)", &value[i]);
            return NGX_CONF_ERROR;
        }
    }

    if (file.data == NULL) {
        return ngx_http_idem_page_random_secret(cf, lcf);
    }

    lcf->page_secret = ngx_http_idem_key_file(cf, &file, IDEM_JWS_HS256, NULL,
                                              "idempotency_approve_page");

    return lcf->page_secret ? NGX_CONF_OK : NGX_CONF_ERROR;
}


/* idempotency_approve_page: the approvers' page (_page.c) */
char *
ngx_http_idem_approve_page_conf(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf)
{
    ngx_http_idem_loc_conf_t  *lcf = conf;

    if (lcf->page_secret) {
        return "is duplicate";
    }

    lcf->ops = 1;

    if (ngx_http_idem_page_conf(cf, lcf) != NGX_CONF_OK) {
        return NGX_CONF_ERROR;
    }

    return ngx_http_idem_ops_location(cf, ngx_http_idem_page_handler);
}
