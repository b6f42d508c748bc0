/*
 * idempotency_approve: a person's recorded approval of one proposal.
 *
 * POST {"operation_id", "fingerprint", "approved_by", "expires_in"}.  The
 * endpoint is given the operation id of a 428 proposal, not its key and
 * scope (the approver is not the caller and must not need the caller's
 * credentials): the proposal's operation id names its record key (see
 * IDEM_OPERATION_PREFIX), written when the proposal was made.  Then
 * approve.lua checks, in one step, that the record is still that
 * operation's proposal and has the fingerprint the person saw, and turns
 * it approved; the caller's next attempt claims it.  Or the person
 * declines it ("decision": "decline"): the record becomes declined and
 * every attempt with its key is refused.
 *
 * With idempotency_approve_identity, the approver is who nginx
 * authenticated, never a name in the body.  The endpoint takes
 * application/json only and refuses a request that says it comes from
 * another site: a form of another origin, posted with the approver's
 * browser credentials, must not record anything.
 */

#include <ngx_config.h>
#include <ngx_core.h>
#include <cjson/cJSON.h>

#include "ngx_http_idempotency.h"
#include "ngx_http_idempotency_approve.h"
#include "ngx_http_idempotency_audit.h"
#include "ngx_http_idempotency_command.h"
#include "ngx_http_idempotency_ctx.h"
#include "ngx_http_idempotency_ops.h"
#include "ngx_http_idempotency_redis.h"
#include "ngx_http_idempotency_reply.h"
#include "ngx_http_idempotency_request.h"


#define NGX_HTTP_IDEM_APPROVE_BODY_MAX   8192
#define NGX_HTTP_IDEM_APPROVE_TTL_MAX    (30 * 86400)   /* s */


static void ngx_http_idem_approve_found(ngx_http_idem_cmd_t *cmd,
    redisReply *reply);
static ngx_int_t ngx_http_idem_approve_answer(ngx_http_request_t *r,
    ngx_http_idem_ctx_t *ctx, idem_approve_kind_e kind, const char *state,
    long long at);
static void ngx_http_idem_approve_done(ngx_http_idem_cmd_t *cmd,
    redisReply *reply);
static ngx_http_idem_cmd_t *ngx_http_idem_approve_cmd(
    ngx_http_idem_ctx_t *ctx, ngx_http_idem_approval_t *a);
static ngx_int_t ngx_http_idem_approve_send(ngx_http_request_t *r,
    ngx_http_idem_ctx_t *ctx, ngx_http_idem_cmd_t *cmd,
    ngx_http_idem_reply_pt handler);


static ngx_str_t  ngx_http_idem_get = ngx_string("GET");


/* the body in one piece, NULL (with *detail) when it cannot be read */
static u_char *
ngx_http_idem_approve_text(ngx_http_request_t *r, size_t *len,
    const char **detail)
{
    u_char       *p, *text;
    size_t        size;
    ngx_chain_t  *cl;

    *detail = NULL;
    size = 0;

    if (r->request_body == NULL) {
        return NULL;
    }

    for (cl = r->request_body->bufs; cl; cl = cl->next) {
        if (cl->buf->in_file || size > NGX_HTTP_IDEM_APPROVE_BODY_MAX) {
            *detail = "the approval is larger than 8 KiB";
            return NULL;
        }

        size += cl->buf->last - cl->buf->pos;
    }

    if (size > NGX_HTTP_IDEM_APPROVE_BODY_MAX) {
        *detail = "the approval is larger than 8 KiB";
        return NULL;
    }

    text = ngx_pnalloc(r->pool, size + 1);
    if (text == NULL) {
        return NULL;
    }

    p = text;

    /* an empty buffer may carry a NULL pos, which memcpy must not see */
    for (cl = r->request_body->bufs; cl; cl = cl->next) {
        if (cl->buf->last != cl->buf->pos) {
            p = ngx_cpymem(p, cl->buf->pos, cl->buf->last - cl->buf->pos);
        }
    }

    *p = '\0';
    *len = size;

    return text;
}


/* member "name" of o, once: NULL when absent or given twice */
static cJSON *
ngx_http_idem_approve_member(cJSON *o, const char *name)
{
    cJSON  *m, *found;

    found = NULL;

    cJSON_ArrayForEach(m, o) {
        if (m->string && ngx_strcmp(m->string, name) == 0) {
            if (found) {
                return NULL;
            }

            found = m;
        }
    }

    return found;
}


/* a string member of len bytes (hex: lowercase hex), or NULL */
static const char *
ngx_http_idem_approve_str(cJSON *o, const char *name, size_t min, size_t max,
    ngx_uint_t hex, size_t *len)
{
    size_t       i;
    const char  *s;

    s = cJSON_GetStringValue(ngx_http_idem_approve_member(o, name));
    if (s == NULL) {
        return NULL;
    }

    *len = ngx_strlen(s);

    if (*len < min || *len > max
        || (hex && !idem_is_hex(s, *len)))
    {
        return NULL;
    }

    /* it goes into logs and JSON: no control bytes */
    for (i = 0; i < *len; i++) {
        if ((u_char) s[i] < 0x20 || s[i] == 0x7f) {
            return NULL;
        }
    }

    return s;
}


static ngx_int_t
ngx_http_idem_approve_copy(ngx_http_request_t *r, ngx_str_t *dst,
    const char *s, size_t len)
{
    dst->data = ngx_pnalloc(r->pool, len);
    if (dst->data == NULL) {
        return NGX_ERROR;
    }

    ngx_memcpy(dst->data, s, len);
    dst->len = len;

    return NGX_OK;
}


/* "decision": absent or "approve" (0), "decline" (1); else -1 */
static ngx_int_t
ngx_http_idem_approve_decision(cJSON *o)
{
    cJSON       *m;
    const char  *s;

    m = ngx_http_idem_approve_member(o, "decision");

    if (m == NULL) {
        /* given twice is as bad as a wrong value */
        return cJSON_GetObjectItemCaseSensitive(o, "decision") ? -1 : 0;
    }

    s = cJSON_GetStringValue(m);

    if (s && ngx_strcmp(s, "approve") == 0) {
        return 0;
    }

    return (s && ngx_strcmp(s, "decline") == 0) ? 1 : -1;
}


/*
 * approved_by: with idempotency_approve_identity (a->approver set), the
 * body may only repeat it (NGX_ABORT otherwise); without, it is required
 */
static ngx_int_t
ngx_http_idem_approve_by(cJSON *o, ngx_http_idem_approval_t *a,
    const char **who, size_t *len, const char **detail)
{
    *who = ngx_http_idem_approve_str(o, "approved_by", 1, IDEM_APPROVER_MAX,
                                     0, len);

    if (a->approver.data == NULL) {
        if (*who == NULL) {
            *detail = "approved_by must be a string of 1 to 256 bytes "
                      "without control characters";
            return NGX_DECLINED;
        }

        return NGX_OK;
    }

    if (cJSON_GetObjectItemCaseSensitive(o, "approved_by") != NULL
        && (*who == NULL || *len != a->approver.len
            || ngx_memcmp(*who, a->approver.data, *len) != 0))
    {
        *detail = "approved_by names someone other than the authenticated "
                  "approver";
        return NGX_ABORT;
    }

    *who = (const char *) a->approver.data;
    *len = a->approver.len;

    return NGX_OK;
}


/* expires_in: required to approve, ignored when declining */
static ngx_int_t
ngx_http_idem_approve_expires(cJSON *o, ngx_http_idem_approval_t *a,
    const char **detail)
{
    cJSON  *n;

    n = ngx_http_idem_approve_member(o, "expires_in");

    if (a->decline && n == NULL
        && cJSON_GetObjectItemCaseSensitive(o, "expires_in") == NULL)
    {
        a->expires_in = 1;
        return NGX_OK;
    }

    if (!cJSON_IsNumber(n) || n->valuedouble < 1
        || n->valuedouble > NGX_HTTP_IDEM_APPROVE_TTL_MAX
        || n->valuedouble != (double) (ngx_int_t) n->valuedouble)
    {
        *detail = "expires_in must be a whole number of seconds, "
                  "1 to 2592000 (30 days)";
        return NGX_DECLINED;
    }

    a->expires_in = (ngx_int_t) n->valuedouble;

    return NGX_OK;
}


/* NGX_OK, NGX_DECLINED (with *detail) for a malformed approval */
static ngx_int_t
ngx_http_idem_approve_fields(ngx_http_request_t *r, cJSON *o,
    ngx_http_idem_approval_t *a, const char **detail)
{
    size_t       len[3];
    ngx_int_t    decision, rc;
    const char  *op, *fp, *who;

    op = ngx_http_idem_approve_str(o, "operation_id", IDEM_TOKEN_LEN,
                                   IDEM_TOKEN_LEN, 1, &len[0]);
    fp = ngx_http_idem_approve_str(o, "fingerprint", IDEM_FP_LEN, IDEM_FP_LEN,
                                   1, &len[1]);
    decision = ngx_http_idem_approve_decision(o);

    if (op == NULL) {
        *detail = "operation_id must be the proposal's: 32 lowercase hex";
        return NGX_DECLINED;
    }

    if (fp == NULL) {
        *detail = "fingerprint must be the proposal's: 64 lowercase hex";
        return NGX_DECLINED;
    }

    if (decision < 0) {
        *detail = "decision must be \"approve\" or \"decline\"";
        return NGX_DECLINED;
    }

    a->decline = decision;

    rc = ngx_http_idem_approve_by(o, a, &who, &len[2], detail);

    if (rc == NGX_OK) {
        rc = ngx_http_idem_approve_expires(o, a, detail);
    }

    if (rc != NGX_OK) {
        return rc;
    }

    if (ngx_http_idem_approve_copy(r, &a->op, op, len[0]) != NGX_OK
        || ngx_http_idem_approve_copy(r, &a->fp, fp, len[1]) != NGX_OK
        || ngx_http_idem_approve_copy(r, &a->approver, who, len[2]) != NGX_OK)
    {
        return NGX_ERROR;
    }

    return NGX_OK;
}


static ngx_int_t
ngx_http_idem_approve_parse(ngx_http_request_t *r,
    ngx_http_idem_approval_t *a, const char **detail)
{
    u_char     *text;
    size_t      len;
    cJSON      *o;
    ngx_int_t   rc;

    text = ngx_http_idem_approve_text(r, &len, detail);
    if (text == NULL) {
        return *detail ? NGX_DECLINED : NGX_ERROR;
    }

    /* with its NUL: cJSON checks that the text ends there */
    o = cJSON_ParseWithLengthOpts((const char *) text, len + 1, NULL, 1);

    if (!cJSON_IsObject(o)) {
        cJSON_Delete(o);
        *detail = "the approval is not a JSON object";
        return NGX_DECLINED;
    }

    rc = ngx_http_idem_approve_fields(r, o, a, detail);
    cJSON_Delete(o);

    return rc;
}


static void
ngx_http_idem_approve_finish(ngx_http_request_t *r, ngx_int_t rc)
{
    ngx_connection_t  *c;

    c = r->connection;

    ngx_http_finalize_request(r, rc);
    ngx_http_run_posted_requests(c);
}


static ngx_int_t
ngx_http_idem_approve_send(ngx_http_request_t *r, ngx_http_idem_ctx_t *ctx,
    ngx_http_idem_cmd_t *cmd, ngx_http_idem_reply_pt handler)
{
    if (cmd == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    if (ngx_http_idem_cmd_send(cmd, handler, ctx) != NGX_OK) {
        return ngx_http_idem_send_problem(r, ctx, NGX_HTTP_IDEM_P_STORE_DOWN,
                                          NULL);
    }

    ctx->cmd = cmd;

    return NGX_DONE;
}


/*
 * Look the operation's record up by its id, then record the decision;
 * a->decided answers.  NGX_DONE while Redis works, else the status the
 * caller finalizes with.
 */
ngx_int_t
ngx_http_idem_approve_record(ngx_http_request_t *r, ngx_http_idem_ctx_t *ctx,
    ngx_http_idem_approval_t *a)
{
    u_char  *key;

    key = ngx_http_idem_operation_key(r->pool, &a->op);
    if (key == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    ctx->approval = a;
    ctx->op_id = a->op;

    return ngx_http_idem_approve_send(r, ctx,
               ngx_http_idem_cmd_native(ctx->conf->redis, &ngx_http_idem_get,
                                        0, key, 0, r->connection->log),
               ngx_http_idem_approve_found);
}


/* the body is read: look the operation's record up */
static void
ngx_http_idem_approve_body(ngx_http_request_t *r)
{
    ngx_int_t                  rc;
    const char                *detail;
    ngx_http_idem_ctx_t       *ctx;
    ngx_http_idem_approval_t  *a;

    ctx = ngx_http_idem_get_ctx(r);
    a = ngx_pcalloc(r->pool, sizeof(ngx_http_idem_approval_t));

    if (ctx == NULL || a == NULL) {
        ngx_http_idem_approve_finish(r, NGX_HTTP_INTERNAL_SERVER_ERROR);
        return;
    }

    a->decided = ngx_http_idem_approve_answer;
    ctx->approval = a;
    detail = NULL;

    rc = ngx_http_idem_approve_who(r, ctx->conf, &a->approver);

    if (rc == NGX_OK) {
        rc = ngx_http_idem_approve_parse(r, a, &detail);

    } else if (rc == NGX_DECLINED) {
        rc = NGX_ABORT;
        detail = "no authenticated approver "
                 "(idempotency_approve_identity is empty)";
    }

    if (rc == NGX_OK) {
        rc = ngx_http_idem_approve_record(r, ctx, a);

    } else if (rc == NGX_DECLINED || rc == NGX_ABORT) {
        rc = ngx_http_idem_send_problem(r, ctx, rc == NGX_DECLINED
                                        ? NGX_HTTP_IDEM_P_BAD_APPROVAL
                                        : NGX_HTTP_IDEM_P_APPROVER_MISMATCH,
                                        detail);

    } else {
        rc = NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    if (rc != NGX_DONE) {
        ngx_http_idem_approve_finish(r, rc);
    }
}


/* NGX_OK: a reply arrived; else the answer is finished here */
static ngx_int_t
ngx_http_idem_approve_reply(ngx_http_idem_cmd_t *cmd, redisReply *reply,
    int type)
{
    ngx_http_idem_ctx_t  *ctx;

    ctx = cmd->data;
    ctx->cmd = NULL;

    if (reply == NULL
        || (reply->type == REDIS_REPLY_ERROR
            && !ngx_http_idem_reply_corrupt(reply)))
    {
        ngx_http_idem_approve_finish(ctx->request,
            ngx_http_idem_send_problem(ctx->request, ctx,
                                       NGX_HTTP_IDEM_P_STORE_DOWN, NULL));
        return NGX_ERROR;
    }

    if (reply->type != type && reply->type != REDIS_REPLY_NIL) {
        ngx_log_error(NGX_LOG_ERR, ctx->request->connection->log, 0,
                      "idempotency: unexpected reply from redis");
        ngx_http_idem_approve_finish(ctx->request,
            ngx_http_idem_send_problem(ctx->request, ctx,
                                       NGX_HTTP_IDEM_P_STORE_ERROR, NULL));
        return NGX_ERROR;
    }

    return NGX_OK;
}


/*
 * approve.lua; with idempotency_audit it appends "approved" or "declined"
 * (the operation, the fingerprint the person saw, who decided) when it
 * changes the record
 */
static ngx_http_idem_cmd_t *
ngx_http_idem_approve_cmd(ngx_http_idem_ctx_t *ctx,
    ngx_http_idem_approval_t *a)
{
    size_t               size;
    ngx_str_t            fenced = ngx_null_string;
    ngx_http_request_t  *r;
    idem_audit_entry_t   e;

    r = ctx->request;
    size = a->op.len + a->fp.len + a->approver.len + 2 * NGX_INT64_LEN + 16;

    if (ctx->conf->audit == NULL) {
        return ngx_http_idem_cmd_create(ctx->conf->redis,
                                        NGX_HTTP_IDEM_SCRIPT_APPROVE,
                                        ctx->rkey, size, r->connection->log);
    }

    if (ngx_http_idem_audit_prepare(r, ctx) != NGX_OK) {
        return NULL;
    }

    ctx->approver = a->approver;
    ngx_str_null(&ctx->route);
    ngx_http_idem_audit_entry(ctx, a->decline ? IDEM_AUDIT_DECLINED
                                              : IDEM_AUDIT_APPROVED, 0, &e);
    e.fp.data = (const char *) a->fp.data;
    e.fp.len = a->fp.len;

    return ngx_http_idem_audit_cmd(ctx->conf->audit,
                                   NGX_HTTP_IDEM_SCRIPT_APPROVE, ctx->rkey,
                                   NULL, 0, size, &fenced, &e, 1,
                                   r->connection->log);
}


static void
ngx_http_idem_approve_found(ngx_http_idem_cmd_t *cmd, redisReply *reply)
{
    ngx_int_t                  rc;
    const char                *decision;
    ngx_http_idem_cmd_t       *sc;
    ngx_http_idem_ctx_t       *ctx;
    ngx_http_idem_approval_t  *a;

    ctx = cmd->data;

    if (ctx == NULL
        || ngx_http_idem_approve_reply(cmd, reply, REDIS_REPLY_STRING)
           != NGX_OK)
    {
        return;
    }

    a = ctx->approval;

    /* the record key, then the proposal as it was shown (if kept) */
    if (reply->type == REDIS_REPLY_NIL
        || reply->len < IDEM_RECORD_KEY_LEN
        || !idem_is_key(reply->str, IDEM_RECORD_KEY_LEN, IDEM_RECORD_SUFFIX))
    {
        rc = a->decided(ctx->request, ctx, IDEM_APPROVE_NONE, NULL, -1);
        goto done;
    }

    ngx_memcpy(ctx->rkey, reply->str, IDEM_RECORD_KEY_LEN);
    ctx->rkey[IDEM_RECORD_KEY_LEN] = '\0';

    /* the page's decisions are once: a replayed form changes nothing */
    decision = a->decline ? (a->once ? "decline_once" : "decline")
                          : (a->once ? "approve_once" : "approve");

    sc = ngx_http_idem_approve_cmd(ctx, a);
    if (sc) {
        ngx_http_idem_cmd_set(sc, NGX_HTTP_IDEM_APPROVE_OP, a->op.data,
                              a->op.len);
        ngx_http_idem_cmd_set(sc, NGX_HTTP_IDEM_APPROVE_FP, a->fp.data,
                              a->fp.len);
        ngx_http_idem_cmd_set(sc, NGX_HTTP_IDEM_APPROVE_APPROVER,
                              a->approver.data, a->approver.len);
        ngx_http_idem_cmd_set_num(sc, NGX_HTTP_IDEM_APPROVE_EXPIRES_IN,
                                  (int64_t) a->expires_in * 1000);
        ngx_http_idem_cmd_set(sc, NGX_HTTP_IDEM_APPROVE_DECISION,
                              (u_char *) decision, ngx_strlen(decision));
        ngx_http_idem_cmd_set_num(sc, NGX_HTTP_IDEM_APPROVE_KEEP,
                                  (int64_t) ctx->conf->ttl * 1000);
    }

    rc = ngx_http_idem_approve_send(ctx->request, ctx, sc,
                                    ngx_http_idem_approve_done);

done:

    if (rc != NGX_DONE) {
        ngx_http_idem_approve_finish(ctx->request, rc);
    }
}


static ngx_int_t
ngx_http_idem_approve_ok(ngx_http_request_t *r, ngx_http_idem_ctx_t *ctx,
    long long at)
{
    u_char                    *body, *p, *end;
    size_t                     size;
    ngx_http_idem_approval_t  *a;

    a = ctx->approval;

    ngx_log_error(NGX_LOG_NOTICE, r->connection->log, 0,
                  "idempotency: operation %V %s by \"%V\"", &a->op,
                  a->decline ? "declined" : "approved",
                  ngx_http_idem_log_str(r->pool, &a->approver));

    size = 256 + a->approver.len * 6;

    body = ngx_pnalloc(r->pool, size);
    if (body == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    end = body + size;

    p = ngx_slprintf(body, end, "{\"operation_id\":\"%V\",\"fingerprint\":"
                     "\"%V\",\"state\":\"%s\",\"%s\":", &a->op, &a->fp,
                     a->decline ? "declined" : "approved",
                     a->decline ? "declined_by" : "approved_by");
    p = ngx_http_idem_json_str(p, end, a->approver.data, a->approver.len);
    p = ngx_slprintf(p, end, a->decline ? ",\"declined_at\":"
                                        : ",\"approval_expires_at\":");
    p = ngx_http_idem_json_time(p, end, at);
    p = ngx_slprintf(p, end, "}\n");

    return ngx_http_idem_send_json(r, NGX_HTTP_OK, body, p - body);
}


/* the JSON endpoint's answer to what approve.lua said */
static ngx_int_t
ngx_http_idem_approve_answer(ngx_http_request_t *r, ngx_http_idem_ctx_t *ctx,
    idem_approve_kind_e kind, const char *state, long long at)
{
    switch (kind) {

    case IDEM_APPROVE_APPROVED:
    case IDEM_APPROVE_DECLINED:
        return ngx_http_idem_approve_ok(r, ctx, at);

    case IDEM_APPROVE_NONE:
        return ngx_http_idem_send_problem(r, ctx, NGX_HTTP_IDEM_P_NOT_FOUND,
                                          "no proposal with this operation "
                                          "id is known (it may have "
                                          "expired)");

    case IDEM_APPROVE_MISMATCH:
        return ngx_http_idem_send_problem(r, ctx,
                                          NGX_HTTP_IDEM_P_APPROVAL_MISMATCH,
                                          NULL);

    case IDEM_APPROVE_REFUSED:
        ctx->state.data = (u_char *) state;
        ctx->state.len = ngx_strlen(state);
        return ngx_http_idem_send_problem(r, ctx,
                                          NGX_HTTP_IDEM_P_NOT_APPROVABLE,
                                          NULL);

    default:
        return ngx_http_idem_send_problem(r, ctx, NGX_HTTP_IDEM_P_STORE_ERROR,
                                          NULL);
    }
}


static void
ngx_http_idem_approve_done(ngx_http_idem_cmd_t *cmd, redisReply *reply)
{
    size_t                 n;
    ngx_int_t              rc;
    idem_rv_t              el[IDEM_APPROVE_ELEMS];
    long long              at;
    ngx_uint_t             appended;
    const char                 *state;
    idem_approve_kind_e         kind;
    ngx_http_idem_ctx_t        *ctx;
    ngx_http_idem_approval_t   *a;

    ctx = cmd->data;

    if (ngx_http_idem_audit_ctx_reply(cmd, &reply, &appended) == NGX_DONE
        || ngx_http_idem_approve_reply(cmd, reply, REDIS_REPLY_ARRAY)
           != NGX_OK)
    {
        return;
    }

    kind = IDEM_APPROVE_INVALID;
    state = NULL;
    at = -1;

    if (reply->type != REDIS_REPLY_NIL) {
        n = ngx_http_idem_reply_elements(reply, el, IDEM_APPROVE_ELEMS);
        kind = idem_approve_decode(el, n, &state, &at);
    }

    if (kind == IDEM_APPROVE_INVALID) {
        ngx_log_error(NGX_LOG_ERR, ctx->request->connection->log, 0,
                      "idempotency: unexpected reply from redis");
    }

    a = ctx->approval;
    rc = a->decided(ctx->request, ctx, kind, state, at);

    if (rc != NGX_DONE) {
        ngx_http_idem_approve_finish(ctx->request, rc);
    }
}


/* idempotency_approve_identity's value: NGX_DECLINED when empty */
ngx_int_t
ngx_http_idem_approve_who(ngx_http_request_t *r,
    ngx_http_idem_loc_conf_t *conf, ngx_str_t *who)
{
    size_t  i;

    ngx_str_null(who);

    if (conf->approve_identity == NULL) {
        return NGX_OK;
    }

    if (ngx_http_complex_value(r, conf->approve_identity, who) != NGX_OK) {
        return NGX_ERROR;
    }

    if (who->len == 0 || who->len > IDEM_APPROVER_MAX) {
        return NGX_DECLINED;
    }

    /* it goes into logs, records and pages: no control bytes */
    for (i = 0; i < who->len; i++) {
        if (who->data[i] < 0x20 || who->data[i] == 0x7f) {
            return NGX_DECLINED;
        }
    }

    return NGX_OK;
}


/* the first such header's value, NULL when absent */
static ngx_str_t *
ngx_http_idem_approve_header(ngx_http_request_t *r, const char *name,
    size_t len)
{
    ngx_str_t         n;
    ngx_uint_t        count;
    ngx_table_elt_t  *h;

    n.data = (u_char *) name;
    n.len = len;

    h = ngx_http_idem_find_header(r, &n, &count);

    return h ? &h->value : NULL;
}


/*
 * NGX_OK unless the browser says the request comes from another site:
 * Sec-Fetch-Site other than same-origin or none (a person typing); or,
 * from a browser that does not send it, an Origin other than this
 * request's own scheme and Host.  Sec-Fetch-Site decides when present: a
 * page with Referrer-Policy no-referrer (the approval page) makes the
 * browser send "Origin: null" with its own form.  A client that sends
 * neither (curl, the tools) is no browser with someone's cookies.
 */
ngx_int_t
ngx_http_idem_same_site(ngx_http_request_t *r)
{
    u_char     *p, buf[16];
    ngx_str_t  *v, *host;

    v = ngx_http_idem_approve_header(r, "Sec-Fetch-Site", 14);

    if (v) {
        return ((v->len == 11 && ngx_strncmp(v->data, "same-origin", 11) == 0)
                || (v->len == 4 && ngx_strncmp(v->data, "none", 4) == 0))
               ? NGX_OK : NGX_DECLINED;
    }

    v = ngx_http_idem_approve_header(r, "Origin", 6);
    host = r->headers_in.host ? &r->headers_in.host->value : NULL;

    if (v == NULL) {
        return NGX_OK;
    }

#if (NGX_HTTP_SSL)
    p = ngx_cpymem(buf, r->connection->ssl ? "https://" : "http://",
                   r->connection->ssl ? 8 : 7);
#else
    p = ngx_cpymem(buf, "http://", 7);
#endif

    if (host == NULL || v->len != (size_t) (p - buf) + host->len
        || ngx_strncasecmp(v->data, buf, p - buf) != 0
        || ngx_strncasecmp(v->data + (p - buf), host->data, host->len) != 0)
    {
        return NGX_DECLINED;
    }

    return NGX_OK;
}


/* application/json, with parameters (charset) or not */
static ngx_int_t
ngx_http_idem_approve_json(ngx_http_request_t *r)
{
    ngx_str_t  *ct;

    if (r->headers_in.content_type == NULL) {
        return NGX_DECLINED;
    }

    ct = &r->headers_in.content_type->value;

    if (ct->len < 16
        || ngx_strncasecmp(ct->data, (u_char *) "application/json", 16) != 0
        || (ct->len > 16 && ct->data[16] != ';' && ct->data[16] != ' '))
    {
        return NGX_DECLINED;
    }

    return NGX_OK;
}


static ngx_int_t
ngx_http_idem_approve_handler(ngx_http_request_t *r)
{
    ngx_int_t             rc;
    ngx_http_idem_ctx_t  *ctx;

    if (!(r->method & NGX_HTTP_POST)) {
        return ngx_http_idem_send_not_allowed(r, "POST");
    }

    ctx = ngx_http_idem_create_ctx(r);
    if (ctx == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    ctx->conf = ngx_http_get_module_loc_conf(r, ngx_http_idempotency_module);
    ctx->phase = NGX_HTTP_IDEM_DONE;

    /* refused before the body is read: nothing of it is believed */
    if (ngx_http_idem_same_site(r) != NGX_OK
        || ngx_http_idem_approve_json(r) != NGX_OK)
    {
        rc = ngx_http_discard_request_body(r);

        if (rc != NGX_OK) {
            return rc;
        }

        return ngx_http_idem_send_problem(r, ctx,
                   ngx_http_idem_same_site(r) != NGX_OK
                   ? NGX_HTTP_IDEM_P_CROSS_SITE
                   : NGX_HTTP_IDEM_P_UNSUPPORTED_MEDIA, NULL);
    }

    r->request_body_in_single_buf = 1;

    rc = ngx_http_read_client_request_body(r, ngx_http_idem_approve_body);

    if (rc >= NGX_HTTP_SPECIAL_RESPONSE) {
        return rc;
    }

    return NGX_DONE;
}


/* idempotency_approve: recorded approvals, protected by the operator */
char *
ngx_http_idem_approve_conf(ngx_conf_t *cf, ngx_command_t *cmd, void *conf)
{
    ngx_http_idem_loc_conf_t  *lcf = conf;

    lcf->ops = 1;

    return ngx_http_idem_ops_location(cf, ngx_http_idem_approve_handler);
}
