/*
 * The request flow: after every access check, read the body, fingerprint
 * the request, claim (scope, key) in Redis, then act on the answer: pass
 * to the content handler, replay, wait, or refuse.  Each step that waits
 * (the body, a thread, Redis) resumes the phases, which come back here.
 */

#include <ngx_config.h>
#include <ngx_core.h>
#include "ngx_http_idempotency.h"
#include "ngx_http_idempotency_handler.h"
#include "ngx_http_idempotency_body.h"
#include "ngx_http_idempotency_business.h"
#include "ngx_http_idempotency_claim.h"
#include "ngx_http_idempotency_tokens.h"
#include "ngx_http_idempotency_close.h"
#include "ngx_http_idempotency_confirm.h"
#include "ngx_http_idempotency_ctx.h"
#include "ngx_http_idempotency_metrics.h"
#include "ngx_http_idempotency_reply.h"
#include "ngx_http_idempotency_request.h"
#include "ngx_http_idempotency_wait.h"
#include "ngx_http_idempotency_claim_audit.h"


/* bodies above this may take long enough to hash that time must be read */
#define NGX_HTTP_IDEM_BIG_BODY    (256 * 1024)


static ngx_int_t ngx_http_idem_start(ngx_http_request_t *r,
    ngx_http_idem_ctx_t *ctx);
static ngx_int_t ngx_http_idem_claim(ngx_http_request_t *r,
    ngx_http_idem_ctx_t *ctx);
static ngx_int_t ngx_http_idem_claim_fingerprinted(ngx_http_request_t *r,
    ngx_http_idem_ctx_t *ctx);
static ngx_int_t ngx_http_idem_act(ngx_http_request_t *r,
    ngx_http_idem_ctx_t *ctx);
static ngx_int_t ngx_http_idem_reject(ngx_http_request_t *r,
    ngx_http_idem_ctx_t *ctx, ngx_http_idem_problem_e problem,
    const char *detail);


/* status and admin locations name a record, they are not operations */
static ngx_uint_t
ngx_http_idem_wants(ngx_http_request_t *r, ngx_http_idem_loc_conf_t *lcf)
{
    return r == r->main && lcf->enable && !lcf->ops
           && (r->method & lcf->methods);
}


/* remembers the route before this location's rewrites */
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


/*
 * A guarded location handles a write, or refuses it: a method the module
 * does not claim would reach the upstream unconfirmed, with no identity or
 * lock.  GET, HEAD and OPTIONS change nothing by definition (RFC 9110).
 */
static ngx_int_t
ngx_http_idem_not_allowed(ngx_http_request_t *r, ngx_http_idem_loc_conf_t *lcf,
    ngx_http_idem_ctx_t *ctx)
{
    ngx_table_elt_t  *h;

    if (r != r->main || !lcf->guarded
        || (r->method & (NGX_HTTP_GET|NGX_HTTP_HEAD|NGX_HTTP_OPTIONS)))
    {
        return NGX_DECLINED;
    }

    if (ctx == NULL) {
        ctx = ngx_http_idem_create_ctx(r);
        if (ctx == NULL) {
            return NGX_HTTP_INTERNAL_SERVER_ERROR;
        }
    }

    ctx->conf = lcf;

    h = ngx_list_push(&r->headers_out.headers);
    if (h == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    h->hash = 1;
    ngx_str_set(&h->key, "Allow");
    h->value = lcf->allow;
    h->lowcase_key = (u_char *) "allow";

    return ngx_http_idem_reject(r, ctx, NGX_HTTP_IDEM_P_METHOD_NOT_ALLOWED,
                                NULL);
}


static ngx_int_t
ngx_http_idem_first_look(ngx_http_request_t *r, ngx_http_idem_ctx_t *ctx)
{
    ngx_http_idem_loc_conf_t  *lcf;

    lcf = ngx_http_get_module_loc_conf(r, ngx_http_idempotency_module);

    if (!ngx_http_idem_wants(r, lcf)) {
        return ngx_http_idem_not_allowed(r, lcf, ctx);
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


/*
 * An internal redirect (try_files, error_page, X-Accel-Redirect, a named
 * location) into a guarded location, of a request another location's
 * settings already handled: it was let through there without a key, or
 * claimed there under the other location's confirmation, identity and
 * lock.  Either way this location's guards never looked at it, and they
 * cannot now (the body may be gone, the claim is the other's): it is
 * refused, never passed on.  A claim the first location made is given back
 * unless its upstream was reached.
 */
static ngx_int_t
ngx_http_idem_redirected(ngx_http_request_t *r, ngx_http_idem_ctx_t *ctx,
    ngx_http_idem_loc_conf_t *lcf)
{
    static ngx_str_t  none = ngx_string("?");

    ngx_log_error(NGX_LOG_ERR, r->connection->log, 0,
                  "idempotency: request redirected internally from location "
                  "\"%V\" into guarded location \"%V\" is refused: it was "
                  "handled under the first location's settings, which the "
                  "guards of \"%V\" are not; give the guards to the "
                  "location the request first reaches",
                  ctx->conf ? &ctx->conf->loc_name : &none, &lcf->loc_name,
                  &lcf->loc_name);

    if (ctx->claimed && ctx->end == NGX_HTTP_IDEM_END_NONE) {
        (void) ngx_http_idem_finish(r, ctx,
                                    (r->upstream && r->upstream->request_sent)
                                    ? NGX_HTTP_IDEM_END_FAIL
                                    : NGX_HTTP_IDEM_END_RELEASE);
    }

    ctx->phase = NGX_HTTP_IDEM_DONE;
    ctx->outcome = NGX_HTTP_IDEM_OUT_REJECTED;

    return NGX_HTTP_INTERNAL_SERVER_ERROR;
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
        return ngx_http_idem_first_look(r, ctx);
    }

    lcf = ngx_http_get_module_loc_conf(r, ngx_http_idempotency_module);

    if (lcf->guarded && ctx->conf != lcf) {
        return ngx_http_idem_redirected(r, ctx, lcf);
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
    ngx_http_idem_problem_e problem, const char *detail)
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
               ngx_http_idem_send_problem(r, ctx, problem, detail));
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


static ngx_int_t
ngx_http_idem_start(ngx_http_request_t *r, ngx_http_idem_ctx_t *ctx)
{
    ngx_int_t                  rc;
    const char                *detail;
    ngx_http_idem_loc_conf_t  *lcf;

    lcf = ctx->conf;

    rc = ngx_http_idem_parse_key(r, ctx, &lcf->key_header, &detail);

    if (rc == NGX_DECLINED) {
        /* a guard is not turned off by leaving the key out */
        if (lcf->required == 1 || lcf->guarded) {
            return ngx_http_idem_reject(r, ctx, NGX_HTTP_IDEM_P_KEY_MISSING,
                                        NULL);
        }

        ctx->phase = NGX_HTTP_IDEM_DONE;
        ctx->outcome = NGX_HTTP_IDEM_OUT_BYPASSED;
        return NGX_DECLINED;
    }

    if (rc != NGX_OK) {
        return ngx_http_idem_reject(r, ctx, NGX_HTTP_IDEM_P_KEY_MALFORMED,
                                    detail);
    }

    ctx->phase = NGX_HTTP_IDEM_READING_BODY;

    rc = ngx_http_read_client_request_body(r, ngx_http_idem_body_handler);

    if (rc >= NGX_HTTP_SPECIAL_RESPONSE) {
        return rc;
    }

    ngx_http_finalize_request(r, NGX_DONE);
    return NGX_DONE;
}


/*
 * Whether a body of this Content-Type is read as JSON: a JSON media type
 * (application/json, any +json), or one idempotency_json_types lists
 */
static ngx_uint_t
ngx_http_idem_json_type(ngx_http_idem_loc_conf_t *lcf, ngx_str_t *ct)
{
    u_char      *p, *end;
    ngx_str_t   *t;
    ngx_uint_t   i;

    if (ct == NULL) {
        return 0;
    }

    if (idem_media_type_is_json((const char *) ct->data, ct->len)) {
        return 1;
    }

    if (lcf->json_types == NULL) {
        return 0;
    }

    p = ct->data;
    end = ngx_strlchr(p, ct->data + ct->len, ';');
    end = end ? end : ct->data + ct->len;

    while (p < end && (*p == ' ' || *p == '\t')) {
        p++;
    }

    while (end > p && (end[-1] == ' ' || end[-1] == '\t')) {
        end--;
    }

    t = lcf->json_types->elts;

    for (i = 0; i < lcf->json_types->nelts; i++) {
        if (t[i].len == (size_t) (end - p)
            && ngx_strncasecmp(t[i].data, p, t[i].len) == 0)
        {
            return 1;
        }
    }

    return 0;
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
    in.exclude = ctx->conf->fp_exclude;

    if (ngx_http_idem_fp_headers(r, ctx, &in) != NGX_OK) {
        return NGX_ERROR;
    }

    ct = r->headers_in.content_type ? &r->headers_in.content_type->value
                                    : NULL;

    in.body_json = ngx_http_idem_json_type(ctx->conf, ct);

    return ngx_http_idem_body_fingerprint(r, ctx, &in);
}


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


/* whether the request has a body of at least one byte */
static ngx_uint_t
ngx_http_idem_has_body(ngx_http_request_t *r)
{
    ngx_buf_t    *b;
    ngx_chain_t  *cl;

    if (r->request_body == NULL) {
        return 0;
    }

    for (cl = r->request_body->bufs; cl; cl = cl->next) {
        b = cl->buf;

        if ((ngx_buf_in_memory(b) && b->last > b->pos)
            || (b->in_file && b->file_last > b->file_pos))
        {
            return 1;
        }
    }

    return 0;
}


/*
 * Which refusal, if any, the decisions (confirmation, identity, lock)
 * make of the request before anything is claimed
 */
static ngx_int_t
ngx_http_idem_guard_refusal(ngx_http_request_t *r, ngx_http_idem_ctx_t *ctx,
    ngx_http_idem_problem_e *problem)
{
    ngx_str_t  *ct;

    /*
     * A decision read a body member, and the body is not JSON: its
     * variables are empty, while an upstream that parses JSON whatever
     * the label reads the member (an amount, an event id, an environment)
     */
    ct = r->headers_in.content_type ? &r->headers_in.content_type->value
                                    : NULL;

    if (ctx->json_read && ctx->conf->guarded && ngx_http_idem_has_body(r)
        && !ngx_http_idem_json_type(ctx->conf, ct))
    {
        *problem = NGX_HTTP_IDEM_P_UNSUPPORTED_MEDIA;
        return NGX_DECLINED;
    }

    /*
     * A decision read a body member from a JSON body it could not read:
     * an empty value would let the request through unconfirmed, or free
     * of its identity or lock, while the upstream reads the member (the
     * last of two duplicates, say).
     */
    if (ctx->json_unreadable) {
        *problem = NGX_HTTP_IDEM_P_BODY_UNREADABLE;
        return NGX_DECLINED;
    }

    /* a lock the request does not name: "no lock" would run it beside one */
    if (ctx->lock_missing) {
        *problem = NGX_HTTP_IDEM_P_LOCK_VALUE_MISSING;
        return NGX_DECLINED;
    }

    return NGX_OK;
}


static ngx_int_t
ngx_http_idem_claim_fingerprinted(ngx_http_request_t *r,
    ngx_http_idem_ctx_t *ctx)
{
    ngx_http_idem_problem_e  problem;

    ctx->json_unreadable = 0;
    ctx->json_read = 0;

    if (!ctx->fingerprinted || ngx_http_idem_tokens(r, ctx) != NGX_OK
        || ngx_http_idem_confirm_check(r, ctx) != NGX_OK
        || ngx_http_idem_business_keys(r, ctx) != NGX_OK)
    {
        return ngx_http_idem_finalize(r, NGX_HTTP_INTERNAL_SERVER_ERROR);
    }

    if (ngx_http_idem_guard_refusal(r, ctx, &problem) != NGX_OK) {
        ctx->phase = NGX_HTTP_IDEM_DONE;
        ctx->outcome = NGX_HTTP_IDEM_OUT_REJECTED;
        ngx_str_null(&ctx->op_id);
        return ngx_http_idem_finalize(r,
                   ngx_http_idem_send_problem(r, ctx, problem, NULL));
    }

    if (ngx_http_idem_claim_send(r, ctx) == NGX_OK) {
        return NGX_DONE;
    }

    return ngx_http_idem_act(r, ctx);
}


/* fail open: the request goes on unprotected, and that is logged */
static ngx_int_t
ngx_http_idem_bypass(ngx_http_request_t *r, ngx_http_idem_ctx_t *ctx)
{
    ngx_log_error(NGX_LOG_WARN, r->connection->log, 0,
                  "idempotency: redis unavailable, passing key "
                  "\"%V\" through unprotected", ngx_http_idem_log_key(ctx));

    ctx->phase = NGX_HTTP_IDEM_DONE;
    ctx->outcome = NGX_HTTP_IDEM_OUT_BYPASSED;
    ngx_str_null(&ctx->op_id);

    return NGX_DECLINED;
}


static ngx_int_t
ngx_http_idem_act(ngx_http_request_t *r, ngx_http_idem_ctx_t *ctx)
{
    /*
     * another key's claim announces on its own record: no waiting there;
     * nor once the answer is in the audit stream
     */
    if (ctx->answer == NGX_HTTP_IDEM_ANS_IN_PROGRESS && !ctx->reused
        && !ctx->audit_answered && ngx_http_idem_wait(r, ctx) == NGX_DONE)
    {
        return NGX_DONE;
    }

    ngx_http_idem_wait_stop(ctx);

    if (ctx->answer == NGX_HTTP_IDEM_ANS_CLAIMED) {
        ctx->phase = NGX_HTTP_IDEM_PASSED;
        ctx->outcome = NGX_HTTP_IDEM_OUT_EXECUTED;
        ctx->claimed = 1;
        ngx_http_idem_start_lease(r, ctx);
        return NGX_DECLINED;
    }

    /*
     * fail-open never runs a request of a guarded location (its
     * approval, identity or lock cannot be checked: a second execution
     * is what they are there to prevent), nor one whose record Redis had
     * answered before it went away (the audit's append failed after the
     * claim's look)
     */
    if (ctx->answer == NGX_HTTP_IDEM_ANS_STORE_DOWN
        && ctx->conf->store_failure == NGX_HTTP_IDEM_FAILURE_OPEN
        && !ctx->conf->guarded
        && ctx->confirm != NGX_HTTP_IDEM_CONFIRM_PROPOSE
        && ctx->lkey[0] == '\0' && !ctx->audit_answered)
    {
        return ngx_http_idem_bypass(r, ctx);
    }

    /* idempotency_audit: the answer goes into the stream before it leaves */
    if (ngx_http_idem_claim_audit_answer(r, ctx) == NGX_DONE) {
        return NGX_DONE;
    }

    ctx->phase = NGX_HTTP_IDEM_DONE;

    if (ctx->answer == NGX_HTTP_IDEM_ANS_CONFIRM
        || ctx->answer == NGX_HTTP_IDEM_ANS_APPROVAL_EXPIRED)
    {
        return ngx_http_idem_finalize(r, ngx_http_idem_confirm_send(r, ctx));
    }

    return ngx_http_idem_finalize(r, ngx_http_idem_send_answer(r, ctx));
}


/* idempotency_metrics: one count per handled request, by its outcome */
ngx_int_t
ngx_http_idem_log_handler(ngx_http_request_t *r)
{
    ngx_http_idem_ctx_t       *ctx;
    ngx_http_idem_loc_conf_t  *conf;

    if (r != r->main) {
        return NGX_OK;
    }

    ctx = ngx_http_idem_get_ctx(r);

    if (ctx == NULL || ctx->outcome == NGX_HTTP_IDEM_OUT_NONE) {
        return NGX_OK;
    }

    conf = ctx->conf ? ctx->conf
                     : ngx_http_get_module_loc_conf(r,
                                                    ngx_http_idempotency_module);

    ngx_http_idem_metrics_request(conf->metrics_label, ctx->outcome);

    return NGX_OK;
}


char *
ngx_http_idem_methods(ngx_conf_t *cf, ngx_command_t *cmd, void *conf)
{
    ngx_http_idem_loc_conf_t  *lcf = conf;

    ngx_str_t   *value;
    ngx_uint_t   i, m;

    static ngx_conf_bitmask_t  methods[] = {
        { ngx_string("POST"), NGX_HTTP_POST },
        { ngx_string("PUT"), NGX_HTTP_PUT },
        { ngx_string("PATCH"), NGX_HTTP_PATCH },
        { ngx_string("DELETE"), NGX_HTTP_DELETE },
        { ngx_null_string, 0 }
    };

    if (lcf->methods) {
        return "is duplicate";
    }

    value = cf->args->elts;

    for (i = 1; i < cf->args->nelts; i++) {
        for (m = 0; methods[m].name.len; m++) {
            if (value[i].len == methods[m].name.len
                && ngx_strcmp(value[i].data, methods[m].name.data) == 0)
            {
                break;
            }
        }

        if (methods[m].name.len == 0) {
            ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                               "invalid method \"%V\" in \"%V\" directive, "
                               "it must be POST, PUT, PATCH or DELETE",
                               &value[i], &cmd->name);
            return NGX_CONF_ERROR;
        }

        lcf->methods |= methods[m].mask;
    }

    lcf->methods |= NGX_CONF_BITMASK_SET;

    return NGX_CONF_OK;
}


/* the Allow of a guarded location's 405: what it answers, and handles */
static char *
ngx_http_idem_guard_allow(ngx_conf_t *cf, ngx_http_idem_loc_conf_t *conf)
{
    u_char      *p;
    ngx_uint_t   i;

    static struct {
        ngx_uint_t   mask;
        const char  *name;
    }  handled[] = {
        { NGX_HTTP_POST, ", POST" }, { NGX_HTTP_PUT, ", PUT" },
        { NGX_HTTP_PATCH, ", PATCH" }, { NGX_HTTP_DELETE, ", DELETE" }
    };

    p = ngx_pnalloc(cf->pool, sizeof("GET, HEAD, OPTIONS, POST, PUT, PATCH, "
                                     "DELETE"));
    if (p == NULL) {
        return NGX_CONF_ERROR;
    }

    conf->allow.data = p;
    p = ngx_cpymem(p, "GET, HEAD, OPTIONS", sizeof("GET, HEAD, OPTIONS") - 1);

    for (i = 0; i < sizeof(handled) / sizeof(handled[0]); i++) {
        if (conf->methods & handled[i].mask) {
            p = ngx_cpymem(p, handled[i].name, ngx_strlen(handled[i].name));
        }
    }

    conf->allow.len = p - conf->allow.data;

    return NGX_CONF_OK;
}


/* idempotency_json_types: "type/subtype", no parameter */
static char *
ngx_http_idem_check_json_types(ngx_conf_t *cf, ngx_http_idem_loc_conf_t *conf)
{
    u_char      *slash;
    ngx_str_t   *t;
    ngx_uint_t   i;

    t = conf->json_types ? conf->json_types->elts : NULL;

    for (i = 0; t && i < conf->json_types->nelts; i++) {
        slash = ngx_strlchr(t[i].data, t[i].data + t[i].len, '/');

        if (slash == NULL || slash == t[i].data
            || slash == t[i].data + t[i].len - 1
            || ngx_strlchr(t[i].data, t[i].data + t[i].len, ';')
            || ngx_strlchr(t[i].data, t[i].data + t[i].len, '*')
            || ngx_strlchr(slash + 1, t[i].data + t[i].len, '/'))
        {
            ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                               "\"idempotency_json_types\": \"%V\" is not "
                               "a media type (type/subtype, without "
                               "parameters or wildcards)", &t[i]);
            return NGX_CONF_ERROR;
        }
    }

    return NGX_CONF_OK;
}


/*
 * A location with idempotency_confirm, _unique or _lock is guarded
 * (docs/directives.md, "Guarded locations"): it refuses a request without
 * a key, so an explicit "idempotency_required off" there says the
 * opposite of what it does; and store_failure open does not apply to it.
 */
char *
ngx_http_idem_guard_merge(ngx_conf_t *cf, ngx_http_idem_loc_conf_t *prev,
    ngx_http_idem_loc_conf_t *conf)
{
    ngx_http_core_loc_conf_t  *clcf;

    if (ngx_http_idem_check_json_types(cf, conf) != NGX_CONF_OK) {
        return NGX_CONF_ERROR;
    }

    clcf = ngx_http_conf_get_module_loc_conf(cf, ngx_http_core_module);
    conf->loc_name = clcf->name;

    conf->guarded = conf->enable && !conf->ops
                    && (conf->confirm || conf->unique || conf->lock);

    if (!conf->guarded) {
        return NGX_CONF_OK;
    }

    if (conf->required == 0) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "\"idempotency_required off\" cannot be used "
                           "where \"%s\" is in effect: a guarded location "
                           "refuses a request without a key",
                           conf->confirm ? "idempotency_confirm"
                           : conf->unique ? "idempotency_unique"
                                          : "idempotency_lock");
        return NGX_CONF_ERROR;
    }

    if (conf->store_failure == NGX_HTTP_IDEM_FAILURE_OPEN) {
        ngx_conf_log_error(NGX_LOG_WARN, cf, 0,
                           "\"idempotency_store_failure open\" does not "
                           "apply where \"%s\" is in effect: a guarded "
                           "request is answered 503 while the store is "
                           "unreachable",
                           conf->confirm ? "idempotency_confirm"
                           : conf->unique ? "idempotency_unique"
                                          : "idempotency_lock");
    }

    if (ngx_http_idem_guard_allow(cf, conf) != NGX_CONF_OK) {
        return NGX_CONF_ERROR;
    }

    return ngx_http_idem_guard_names(cf, conf);
}
