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
 * it approved; the caller's next attempt claims it.
 */

#include <ngx_config.h>
#include <ngx_core.h>
#include <cjson/cJSON.h>

#include "ngx_http_idempotency.h"


#define NGX_HTTP_IDEM_APPROVE_BODY_MAX   8192
#define NGX_HTTP_IDEM_APPROVE_TTL_MAX    (30 * 86400)   /* s */


typedef struct {
    ngx_str_t   op;
    ngx_str_t   fp;
    ngx_str_t   approver;
    ngx_int_t   expires_in;    /* s */
} ngx_http_idem_approval_t;


static void ngx_http_idem_approve_found(ngx_http_idem_cmd_t *cmd,
    redisReply *reply);
static void ngx_http_idem_approve_done(ngx_http_idem_cmd_t *cmd,
    redisReply *reply);
static ngx_http_idem_cmd_t *ngx_http_idem_approve_cmd(
    ngx_http_idem_ctx_t *ctx, ngx_http_idem_approval_t *a);


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


/* NGX_OK, NGX_DECLINED (with *detail) for a malformed approval */
static ngx_int_t
ngx_http_idem_approve_fields(ngx_http_request_t *r, cJSON *o,
    ngx_http_idem_approval_t *a, const char **detail)
{
    size_t       len[3];
    cJSON       *n;
    const char  *op, *fp, *who;

    op = ngx_http_idem_approve_str(o, "operation_id", IDEM_TOKEN_LEN,
                                   IDEM_TOKEN_LEN, 1, &len[0]);
    fp = ngx_http_idem_approve_str(o, "fingerprint", IDEM_FP_LEN, IDEM_FP_LEN,
                                   1, &len[1]);
    who = ngx_http_idem_approve_str(o, "approved_by", 1, IDEM_APPROVER_MAX, 0,
                                    &len[2]);
    n = ngx_http_idem_approve_member(o, "expires_in");

    if (op == NULL) {
        *detail = "operation_id must be the proposal's: 32 lowercase hex";
        return NGX_DECLINED;
    }

    if (fp == NULL) {
        *detail = "fingerprint must be the proposal's: 64 lowercase hex";
        return NGX_DECLINED;
    }

    if (who == NULL) {
        *detail = "approved_by must be a string of 1 to 256 bytes "
                  "without control characters";
        return NGX_DECLINED;
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


/* the body is read: look the operation's record up */
static void
ngx_http_idem_approve_body(ngx_http_request_t *r)
{
    u_char                    *key, *p;
    ngx_int_t                  rc;
    const char                *detail;
    ngx_http_idem_ctx_t       *ctx;
    ngx_http_idem_approval_t  *a;

    ctx = ngx_http_idem_get_ctx(r);
    a = ngx_pcalloc(r->pool, sizeof(ngx_http_idem_approval_t));
    key = ngx_pnalloc(r->pool, IDEM_OPERATION_KEY_LEN + 1);

    if (ctx == NULL || a == NULL || key == NULL) {
        ngx_http_idem_approve_finish(r, NGX_HTTP_INTERNAL_SERVER_ERROR);
        return;
    }

    ctx->approval = a;
    rc = ngx_http_idem_approve_parse(r, a, &detail);

    if (rc != NGX_OK) {
        ngx_http_idem_approve_finish(r, rc == NGX_DECLINED
            ? ngx_http_idem_send_problem(r, ctx, NGX_HTTP_IDEM_P_BAD_APPROVAL,
                                         detail)
            : NGX_HTTP_INTERNAL_SERVER_ERROR);
        return;
    }

    ctx->op_id = a->op;

    p = ngx_cpymem(key, IDEM_OPERATION_PREFIX,
                   sizeof(IDEM_OPERATION_PREFIX) - 1);
    p = ngx_cpymem(p, a->op.data, a->op.len);
    ngx_memcpy(p, IDEM_OPERATION_SUFFIX, sizeof(IDEM_OPERATION_SUFFIX));

    rc = ngx_http_idem_approve_send(r, ctx,
             ngx_http_idem_cmd_native(ctx->conf->redis, &ngx_http_idem_get,
                                      0, key, 0, r->connection->log),
             ngx_http_idem_approve_found);

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


static void
ngx_http_idem_approve_not_found(ngx_http_idem_ctx_t *ctx)
{
    ngx_http_idem_approve_finish(ctx->request,
        ngx_http_idem_send_problem(ctx->request, ctx,
                                   NGX_HTTP_IDEM_P_NOT_FOUND,
                                   "no proposal with this operation id is "
                                   "known (it may have expired)"));
}


/*
 * approve.lua; with idempotency_audit it appends "approved" (the
 * operation, the fingerprint the person saw, who approved) when it turns
 * the proposal approved
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
    size = a->op.len + a->fp.len + a->approver.len + NGX_INT64_LEN;

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
    ngx_http_idem_audit_entry(ctx, IDEM_AUDIT_APPROVED, 0, &e);
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

    if (reply->type == REDIS_REPLY_NIL
        || reply->len != IDEM_RECORD_KEY_LEN
        || ngx_strncmp(reply->str, IDEM_RECORD_PREFIX,
                       sizeof(IDEM_RECORD_PREFIX) - 1) != 0)
    {
        ngx_http_idem_approve_not_found(ctx);
        return;
    }

    ngx_memcpy(ctx->rkey, reply->str, IDEM_RECORD_KEY_LEN);
    ctx->rkey[IDEM_RECORD_KEY_LEN] = '\0';
    a = ctx->approval;

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
    }

    rc = ngx_http_idem_approve_send(ctx->request, ctx, sc,
                                    ngx_http_idem_approve_done);

    if (rc != NGX_DONE) {
        ngx_http_idem_approve_finish(ctx->request, rc);
    }
}


static ngx_int_t
ngx_http_idem_approve_ok(ngx_http_request_t *r, ngx_http_idem_ctx_t *ctx,
    long long until)
{
    u_char                    *body, *p, *end;
    size_t                     size;
    ngx_http_idem_approval_t  *a;

    a = ctx->approval;

    ngx_log_error(NGX_LOG_NOTICE, r->connection->log, 0,
                  "idempotency: operation %V approved by \"%V\" for %is",
                  &a->op, &a->approver, a->expires_in);

    size = 256 + a->approver.len * 6;

    body = ngx_pnalloc(r->pool, size);
    if (body == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    end = body + size;

    p = ngx_slprintf(body, end, "{\"operation_id\":\"%V\",\"fingerprint\":"
                     "\"%V\",\"state\":\"approved\",\"approved_by\":",
                     &a->op, &a->fp);
    p = ngx_http_idem_json_str(p, end, a->approver.data, a->approver.len);
    p = ngx_slprintf(p, end, ",\"approval_expires_at\":");
    p = ngx_http_idem_json_time(p, end, until);
    p = ngx_slprintf(p, end, "}\n");

    return ngx_http_idem_send_json(r, NGX_HTTP_OK, body, p - body);
}


static ngx_int_t
ngx_http_idem_approve_answer(ngx_http_request_t *r, ngx_http_idem_ctx_t *ctx,
    redisReply *reply)
{
    size_t              n;
    idem_rv_t           el[IDEM_APPROVE_ELEMS];
    long long           until;
    const char         *state;

    n = ngx_http_idem_reply_elements(reply, el, IDEM_APPROVE_ELEMS);

    switch (idem_approve_decode(el, n, &state, &until)) {

    case IDEM_APPROVE_APPROVED:
        return ngx_http_idem_approve_ok(r, ctx, until);

    case IDEM_APPROVE_NONE:
        ngx_http_idem_approve_not_found(ctx);
        return NGX_DONE;

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
        ngx_log_error(NGX_LOG_ERR, r->connection->log, 0,
                      "idempotency: unexpected reply from redis");
        return ngx_http_idem_send_problem(r, ctx, NGX_HTTP_IDEM_P_STORE_ERROR,
                                          NULL);
    }
}


static void
ngx_http_idem_approve_done(ngx_http_idem_cmd_t *cmd, redisReply *reply)
{
    ngx_int_t             rc;
    ngx_uint_t            appended;
    ngx_http_idem_ctx_t  *ctx;

    ctx = cmd->data;

    if (ngx_http_idem_audit_ctx_reply(cmd, &reply, &appended) == NGX_DONE
        || ngx_http_idem_approve_reply(cmd, reply, REDIS_REPLY_ARRAY)
           != NGX_OK)
    {
        return;
    }

    rc = (reply->type == REDIS_REPLY_NIL)
         ? ngx_http_idem_send_problem(ctx->request, ctx,
                                      NGX_HTTP_IDEM_P_STORE_ERROR, NULL)
         : ngx_http_idem_approve_answer(ctx->request, ctx, reply);

    if (rc != NGX_DONE) {
        ngx_http_idem_approve_finish(ctx->request, rc);
    }
}


ngx_int_t
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

    r->request_body_in_single_buf = 1;

    rc = ngx_http_read_client_request_body(r, ngx_http_idem_approve_body);

    if (rc >= NGX_HTTP_SPECIAL_RESPONSE) {
        return rc;
    }

    return NGX_DONE;
}
