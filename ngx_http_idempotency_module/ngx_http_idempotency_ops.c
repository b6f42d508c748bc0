/*
 * The operations endpoints: the status of one record, looked up with the
 * key header in the caller's own scope, and the operator's resolution of a
 * record whose outcome is unknown.  Each runs one read-mostly script and
 * turns its reply into JSON or a problem from the common table.
 *
 * With idempotency_audit, a resolution is appended ("resolved") by the
 * admin script that makes it; the entry names the record's operation,
 * which only the script knows: it says which first, and is called again
 * with the entry (redis-scripts/audit.lua).
 *
 * The directives of these endpoints (idempotency_status, _admin, _metrics)
 * and of the counters the metrics endpoint shows are parsed here too.
 */

#include <ngx_config.h>
#include <ngx_core.h>
#include "ngx_http_idempotency.h"
#include "ngx_http_idempotency_ops.h"
#include "ngx_http_idempotency_audit.h"
#include "ngx_http_idempotency_command.h"
#include "ngx_http_idempotency_ctx.h"
#include "ngx_http_idempotency_metrics.h"
#include "ngx_http_idempotency_proposal.h"
#include "ngx_http_idempotency_redis.h"
#include "ngx_http_idempotency_reply.h"
#include "ngx_http_idempotency_request.h"
#include "ngx_http_idempotency_variables.h"


static ngx_http_output_header_filter_pt  ngx_http_idem_ops_next_header;
static ngx_http_output_body_filter_pt    ngx_http_idem_ops_next_body;


/* what a reply says, before anything is sent */
typedef enum {
    NGX_HTTP_IDEM_OPS_OK = 0,      /* body built */
    NGX_HTTP_IDEM_OPS_PROBLEM,     /* problem set */
    NGX_HTTP_IDEM_OPS_CORRUPT      /* a reply this module cannot read */
} ngx_http_idem_ops_rc_e;


/*
 * On a Redis Cluster the lock key is in another slot than the record:
 * status.lua gives the one the "h" key names, and the body shows it only
 * once a GET of it, on its own node, says it names this record and
 * operation (business_gate.lua names it there when the gate opens).
 */
typedef struct {
    ngx_http_idem_ctx_t      *ctx;
    u_char                   *body;
    size_t                    len;
    size_t                    at;          /* ,"lock":"..." in the body */
    u_char                    op[IDEM_TOKEN_LEN];
    u_char                    lock[IDEM_RECORD_KEY_LEN];
} ngx_http_idem_status_lock_t;


typedef struct {
    ngx_http_idem_problem_e   problem;
    u_char                   *body;
    size_t                    len;
    ngx_http_idem_status_lock_t  *check;   /* cluster: a lock to check */
} ngx_http_idem_ops_out_t;


#define NGX_HTTP_IDEM_LOCK_MEMBER_LEN                                         \
    (sizeof(",\"lock\":\"\"") - 1 + IDEM_RECORD_KEY_LEN)


/* the "lock" member; on a cluster, noted to be checked on its own node */
static u_char *
ngx_http_idem_status_lock(ngx_http_request_t *r, ngx_http_idem_ctx_t *ctx,
    idem_status_t *st, ngx_http_idem_ops_out_t *out, u_char *p, u_char *end)
{
    if (ctx->conf->redis->topology == NGX_HTTP_IDEM_TOPO_CLUSTER) {
        out->check = ngx_palloc(r->pool, sizeof(ngx_http_idem_status_lock_t));
        if (out->check == NULL) {
            return NULL;
        }

        out->check->ctx = ctx;
        out->check->at = p - out->body;
        ngx_memcpy(out->check->op, st->rec.op, IDEM_TOKEN_LEN);
        ngx_memcpy(out->check->lock, st->lock, IDEM_RECORD_KEY_LEN);
    }

    return ngx_slprintf(p, end, ",\"lock\":\"%*s\"",
                        (size_t) IDEM_RECORD_KEY_LEN, st->lock);
}


static ngx_http_idem_ops_rc_e
ngx_http_idem_status_body(ngx_http_request_t *r, ngx_http_idem_ctx_t *ctx,
    idem_status_t *st, ngx_http_idem_ops_out_t *out)
{
    u_char  *p, *end;
    size_t   size;

    size = 640 + ctx->key.len * 6 + st->rec.approver_len * 6
           + sizeof(",\"lock\":\"\"") - 1 + IDEM_RECORD_KEY_LEN;

    out->body = ngx_pnalloc(r->pool, size);
    if (out->body == NULL) {
        return NGX_HTTP_IDEM_OPS_CORRUPT;
    }

    end = out->body + size;

    p = ngx_slprintf(out->body, end, "{\"idempotency_key\":");
    p = ngx_http_idem_json_str(p, end, ctx->key.data, ctx->key.len);
    p = ngx_slprintf(p, end, ",\"operation_id\":\"%*s\",\"state\":\"%s\","
                     "\"created_at\":", (size_t) IDEM_TOKEN_LEN, st->rec.op,
                     st->state);
    p = ngx_http_idem_json_time(p, end, st->rec.created);
    p = ngx_slprintf(p, end, ",\"completed_at\":");
    p = ngx_http_idem_json_time(p, end, st->rec.completed);

    if (st->rec.state == 'a' || st->rec.state == 'p' || st->rec.state == 'd')
    {
        p = ngx_slprintf(p, end, ",\"expires_at\":");
        p = ngx_http_idem_json_time(p, end, st->rec.expires);
    }

    if (st->rec.state == 'd') {
        p = ngx_slprintf(p, end, ",\"declined_by\":");
        p = ngx_http_idem_json_str(p, end, (u_char *) st->rec.approver,
                                   st->rec.approver_len);
        p = ngx_slprintf(p, end, ",\"declined_at\":");
        p = ngx_http_idem_json_time(p, end, st->rec.approved_until);
    }

    if (st->rec.state == 'p') {
        p = ngx_slprintf(p, end, ",\"approved_by\":");
        p = ngx_http_idem_json_str(p, end, (u_char *) st->rec.approver,
                                   st->rec.approver_len);
        p = ngx_slprintf(p, end, ",\"approval_expires_at\":");
        p = ngx_http_idem_json_time(p, end, st->rec.approved_until);
    }

    if (st->rec.state == 's') {
        p = ngx_slprintf(p, end, ",\"alias_state\":");
        p = st->alias_state
            ? ngx_slprintf(p, end, "\"%s\"", st->alias_state)
            : ngx_slprintf(p, end, "null");
    }

    /* idempotency_lock: only while the operation holds it */
    if (st->lock) {
        p = ngx_http_idem_status_lock(r, ctx, st, out, p, end);
        if (p == NULL) {
            return NGX_HTTP_IDEM_OPS_CORRUPT;
        }
    }

    if (st->rec.state == 'c') {
        p = ngx_slprintf(p, end, ",\"response_status\":%d", st->rec.status);

    } else {
        p = ngx_slprintf(p, end, ",\"response_status\":null");
    }

    p = ngx_slprintf(p, end, ",\"fingerprint\":\"%*s\"}\n",
                     (size_t) IDEM_FP_LEN, st->rec.fp);

    out->len = p - out->body;

    return NGX_HTTP_IDEM_OPS_OK;
}


static ngx_http_idem_ops_rc_e
ngx_http_idem_status_decode(ngx_http_request_t *r, ngx_http_idem_ctx_t *ctx,
    redisReply *reply, ngx_http_idem_ops_out_t *out)
{
    size_t         n;
    idem_rv_t      el[IDEM_STATUS_ELEMS];
    idem_status_t  st;

    n = ngx_http_idem_reply_elements(reply, el, IDEM_STATUS_ELEMS);

    switch (idem_status_decode(el, n, &st)) {

    case IDEM_STATUS_NONE:
        out->problem = NGX_HTTP_IDEM_P_NOT_FOUND;
        return NGX_HTTP_IDEM_OPS_PROBLEM;

    case IDEM_STATUS_RECORD:
        return ngx_http_idem_status_body(r, ctx, &st, out);

    default:
        return NGX_HTTP_IDEM_OPS_CORRUPT;
    }
}


static ngx_http_idem_ops_rc_e
ngx_http_idem_admin_body(ngx_http_request_t *r, ngx_http_idem_ctx_t *ctx,
    const char *what, ngx_http_idem_ops_out_t *out)
{
    u_char  *p, *end;
    size_t   size;

    ngx_log_error(NGX_LOG_NOTICE, r->connection->log, 0,
                  "idempotency: admin %s key \"%V\"", what,
                  ngx_http_idem_log_key(ctx));

    size = 128 + ctx->key.len * 6;

    out->body = ngx_pnalloc(r->pool, size);
    if (out->body == NULL) {
        return NGX_HTTP_IDEM_OPS_CORRUPT;
    }

    end = out->body + size;

    p = ngx_slprintf(out->body, end, "{\"idempotency_key\":");
    p = ngx_http_idem_json_str(p, end, ctx->key.data, ctx->key.len);
    p = ngx_slprintf(p, end, ",\"result\":\"%s\"}\n", what);

    out->len = p - out->body;

    return NGX_HTTP_IDEM_OPS_OK;
}


static ngx_http_idem_ops_rc_e
ngx_http_idem_admin_decode(ngx_http_request_t *r, ngx_http_idem_ctx_t *ctx,
    redisReply *reply, ngx_http_idem_ops_out_t *out)
{
    size_t       n;
    idem_rv_t    el[IDEM_ADMIN_ELEMS];
    const char  *state;

    n = ngx_http_idem_reply_elements(reply, el, IDEM_ADMIN_ELEMS);

    switch (idem_admin_decode(el, n, &state)) {

    case IDEM_ADMIN_NONE:
        out->problem = NGX_HTTP_IDEM_P_NOT_FOUND;
        return NGX_HTTP_IDEM_OPS_PROBLEM;

    case IDEM_ADMIN_REFUSED:
        ctx->state.data = (u_char *) state;
        ctx->state.len = ngx_strlen(state);
        out->problem = NGX_HTTP_IDEM_P_NOT_RESOLVABLE;
        return NGX_HTTP_IDEM_OPS_PROBLEM;

    case IDEM_ADMIN_RELEASED:
        return ngx_http_idem_admin_body(r, ctx, "released", out);

    case IDEM_ADMIN_COMPLETED:
        return ngx_http_idem_admin_body(r, ctx, "completed", out);

    default:
        return NGX_HTTP_IDEM_OPS_CORRUPT;
    }
}


static ngx_http_idem_ops_rc_e
ngx_http_idem_ops_decode(ngx_http_request_t *r, ngx_http_idem_ctx_t *ctx,
    ngx_http_idem_cmd_t *cmd, redisReply *reply, ngx_http_idem_ops_out_t *out)
{
    if (reply == NULL
        || (reply->type == REDIS_REPLY_ERROR
            && !ngx_http_idem_reply_corrupt(reply)))
    {
        out->problem = NGX_HTTP_IDEM_P_STORE_DOWN;
        return NGX_HTTP_IDEM_OPS_PROBLEM;
    }

    if (reply->type != REDIS_REPLY_ARRAY) {
        return NGX_HTTP_IDEM_OPS_CORRUPT;
    }

    return cmd->script == NGX_HTTP_IDEM_SCRIPT_STATUS
           ? ngx_http_idem_status_decode(r, ctx, reply, out)
           : ngx_http_idem_admin_decode(r, ctx, reply, out);
}


static ngx_http_idem_cmd_t *ngx_http_idem_admin_cmd(ngx_http_request_t *r,
    ngx_http_idem_ctx_t *ctx, ngx_uint_t *bad, idem_audit_entry_t *e,
    ngx_uint_t ne);
static ngx_int_t ngx_http_idem_arg_once(ngx_http_request_t *r,
    const char *name, size_t len, ngx_str_t *value);
static void ngx_http_idem_ops_done(ngx_http_idem_cmd_t *cmd,
    redisReply *reply);


/*
 * idempotency_audit: {"audit-decide", want, "resolve", record, reply}:
 * the admin script is sent again with the "resolved" entry of that
 * record's operation.  NGX_DONE when it is on its way, NGX_DECLINED when
 * the reply is another, NGX_ERROR when it cannot be sent.
 */
static ngx_int_t
ngx_http_idem_admin_resolve(ngx_http_request_t *r, ngx_http_idem_ctx_t *ctx,
    redisReply *reply)
{
    ngx_str_t             want, basis, status;
    ngx_uint_t            bad;
    idem_value_t          v;
    idem_audit_entry_t    e;
    ngx_http_idem_cmd_t  *cmd;

    if (reply == NULL || reply->type != REDIS_REPLY_ARRAY
        || reply->elements != 5
        || ngx_http_idem_reply_str(reply->element[0], &want) != NGX_OK
        || want.len != 12
        || ngx_strncmp(want.data, "audit-decide", 12) != 0
        || ngx_http_idem_reply_str(reply->element[1], &want) != NGX_OK
        || ngx_http_idem_reply_str(reply->element[3], &basis) != NGX_OK
        || idem_value_decode((char *) basis.data, basis.len, &v) != 0)
    {
        return NGX_DECLINED;
    }

    ctx->audit_expect.data = ngx_pstrdup(r->pool, &want);
    ctx->audit_expect.len = want.len;
    ctx->op_id.data = ngx_pnalloc(r->pool, IDEM_TOKEN_LEN);

    if (ctx->audit_expect.data == NULL || ctx->op_id.data == NULL
        || ngx_http_idem_audit_prepare(r, ctx) != NGX_OK)
    {
        return NGX_ERROR;
    }

    ngx_memcpy(ctx->op_id.data, v.op, IDEM_TOKEN_LEN);
    ctx->op_id.len = IDEM_TOKEN_LEN;
    ngx_str_null(&ctx->route);

    ngx_http_idem_audit_entry(ctx, IDEM_AUDIT_RESOLVED, 0, &e);
    e.fp.data = v.fp;
    e.fp.len = IDEM_FP_LEN;

    if (ngx_http_idem_arg_once(r, "status", 6, &status) == NGX_OK) {
        e.status = (int) ngx_atoi(status.data, status.len);
    }

    cmd = ngx_http_idem_admin_cmd(r, ctx, &bad, &e, 1);

    if (cmd == NULL
        || ngx_http_idem_cmd_send(cmd, ngx_http_idem_ops_done, ctx) != NGX_OK)
    {
        return NGX_ERROR;
    }

    ctx->cmd = cmd;

    return NGX_DONE;
}


static ngx_str_t  ngx_http_idem_status_get = ngx_string("GET");


/* the GET of the lock key: the member stays if it names this operation */
static void
ngx_http_idem_status_checked(ngx_http_idem_cmd_t *cmd, redisReply *reply)
{
    ngx_int_t                     rc;
    ngx_connection_t             *c;
    ngx_http_request_t           *r;
    ngx_http_idem_status_lock_t  *sl;

    sl = cmd->data;
    r = sl->ctx->request;
    c = r->connection;

    if (reply == NULL || reply->type == REDIS_REPLY_ERROR) {
        rc = ngx_http_idem_send_problem(r, sl->ctx,
                                        NGX_HTTP_IDEM_P_STORE_DOWN, NULL);

    } else {
        if (reply->type != REDIS_REPLY_STRING
            || reply->len < IDEM_RECORD_KEY_LEN + IDEM_TOKEN_LEN
            || ngx_memcmp(reply->str, sl->ctx->rkey, IDEM_RECORD_KEY_LEN) != 0
            || ngx_memcmp(reply->str + IDEM_RECORD_KEY_LEN, sl->op,
                          IDEM_TOKEN_LEN) != 0)
        {
            /* another operation's, or free: not this one's lock */
            ngx_memmove(sl->body + sl->at,
                        sl->body + sl->at + NGX_HTTP_IDEM_LOCK_MEMBER_LEN,
                        sl->len - sl->at - NGX_HTTP_IDEM_LOCK_MEMBER_LEN);
            sl->len -= NGX_HTTP_IDEM_LOCK_MEMBER_LEN;
        }

        rc = ngx_http_idem_send_json(r, NGX_HTTP_OK, sl->body, sl->len);
    }

    ngx_http_finalize_request(r, rc);
    ngx_http_run_posted_requests(c);
}


static ngx_int_t
ngx_http_idem_status_check(ngx_http_idem_status_lock_t *sl)
{
    ngx_http_idem_cmd_t  *cmd;

    cmd = ngx_http_idem_cmd_native(sl->ctx->conf->redis,
                                   &ngx_http_idem_status_get, 0, sl->lock, 0,
                                   sl->ctx->request->connection->log);

    if (cmd == NULL
        || ngx_http_idem_cmd_send(cmd, ngx_http_idem_status_checked, sl)
           != NGX_OK)
    {
        return NGX_ERROR;
    }

    sl->ctx->cmd = cmd;

    return NGX_OK;
}


static void
ngx_http_idem_ops_done(ngx_http_idem_cmd_t *cmd, redisReply *reply)
{
    ngx_int_t                 rc;
    ngx_uint_t                appended;
    ngx_connection_t         *c;
    ngx_http_request_t       *r;
    ngx_http_idem_ctx_t      *ctx;
    ngx_http_idem_ops_out_t   out;

    ctx = cmd->data;
    out.check = NULL;

    if (ngx_http_idem_audit_ctx_reply(cmd, &reply, &appended) == NGX_DONE) {
        return;
    }

    if (cmd->script == NGX_HTTP_IDEM_SCRIPT_ADMIN && ctx->conf->audit) {
        rc = ngx_http_idem_admin_resolve(ctx->request, ctx, reply);

        if (rc == NGX_DONE) {
            return;
        }

        if (rc == NGX_ERROR) {
            reply = NULL;
        }
    }

    r = ctx->request;
    c = r->connection;

    switch (ngx_http_idem_ops_decode(r, ctx, cmd, reply, &out)) {

    case NGX_HTTP_IDEM_OPS_OK:
        if (out.check) {
            out.check->body = out.body;
            out.check->len = out.len;

            if (ngx_http_idem_status_check(out.check) == NGX_OK) {
                return;
            }

            rc = ngx_http_idem_send_problem(r, ctx,
                                            NGX_HTTP_IDEM_P_STORE_DOWN, NULL);
            break;
        }

        rc = ngx_http_idem_send_json(r, NGX_HTTP_OK, out.body, out.len);
        break;

    case NGX_HTTP_IDEM_OPS_PROBLEM:
        rc = ngx_http_idem_send_problem(r, ctx, out.problem, NULL);
        break;

    default:
        ngx_log_error(NGX_LOG_ERR, c->log, 0,
                      "idempotency: unexpected reply from redis");

        ngx_str_null(&ctx->state);
        rc = ngx_http_idem_send_problem(r, ctx, NGX_HTTP_IDEM_P_STORE_ERROR,
                                        NULL);
        break;
    }

    /* a failed send (the client went away) is the request's end, no more */
    ngx_http_finalize_request(r, rc);
    ngx_http_run_posted_requests(c);
}


/*
 * The context of an operations request, with its key and record key:
 * NGX_OK, or NGX_DONE when the request was answered already (*rc then is
 * what the content handler returns).
 */
static ngx_int_t
ngx_http_idem_ops_ctx(ngx_http_request_t *r, ngx_http_idem_ctx_t **ctxp,
    ngx_int_t *rc)
{
    ngx_int_t             krc;
    ngx_str_t             scope;
    const char           *detail;
    ngx_http_idem_ctx_t  *ctx;

    *rc = ngx_http_discard_request_body(r);
    if (*rc != NGX_OK) {
        return NGX_DONE;
    }

    ctx = ngx_http_idem_create_ctx(r);
    if (ctx == NULL) {
        *rc = NGX_HTTP_INTERNAL_SERVER_ERROR;
        return NGX_DONE;
    }

    ctx->conf = ngx_http_get_module_loc_conf(r, ngx_http_idempotency_module);
    ctx->phase = NGX_HTTP_IDEM_DONE;
    *ctxp = ctx;

    krc = ngx_http_idem_parse_key(r, ctx, &ctx->conf->key_header, &detail);

    if (krc != NGX_OK) {
        *rc = ngx_http_idem_send_problem(r, ctx,
                                         krc == NGX_DECLINED
                                         ? NGX_HTTP_IDEM_P_KEY_MISSING
                                         : NGX_HTTP_IDEM_P_KEY_MALFORMED,
                                         krc == NGX_DECLINED ? NULL : detail);
        return NGX_DONE;
    }

    if (ngx_http_idem_record_key(r, ctx, &scope) != NGX_OK) {
        *rc = NGX_HTTP_INTERNAL_SERVER_ERROR;
        return NGX_DONE;
    }

    return NGX_OK;
}


static ngx_int_t
ngx_http_idem_ops_send(ngx_http_request_t *r, ngx_http_idem_ctx_t *ctx,
    ngx_http_idem_cmd_t *cmd)
{
    if (cmd == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    if (ngx_http_idem_cmd_send(cmd, ngx_http_idem_ops_done, ctx) != NGX_OK) {
        return ngx_http_idem_send_problem(r, ctx, NGX_HTTP_IDEM_P_STORE_DOWN,
                                          NULL);
    }

    ctx->cmd = cmd;
    r->main->count++;

    return NGX_DONE;
}


/*
 * ?op=ID: the proposal as it was shown, and its operation's state now
 * (for idempotency-approve and anyone who has the id but not the key)
 */
static ngx_int_t
ngx_http_idem_status_op_done(ngx_http_request_t *r, ngx_http_idem_ctx_t *ctx,
    ngx_http_idem_lookup_t *lk)
{
    u_char  *body, *p, *end;
    size_t   size;

    if (lk->failed || !lk->found) {
        return ngx_http_idem_send_problem(r, ctx, lk->failed ? lk->problem
                                          : NGX_HTTP_IDEM_P_NOT_FOUND,
                                          lk->failed ? NULL
                                          : "no proposal with this operation "
                                            "id is known (it may have "
                                            "expired)");
    }

    size = 256 + lk->proposal.len + lk->rec.approver_len * 6;
    body = ngx_pnalloc(r->pool, size);
    if (body == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    end = body + size;
    p = ngx_slprintf(body, end, "{\"operation_id\":\"%V\",\"state\":\"%s\"",
                     &lk->op, lk->has_rec ? idem_state_name(lk->rec.state)
                                          : "expired");

    if (lk->has_rec && (lk->rec.state == 'p' || lk->rec.state == 'd')) {
        p = ngx_slprintf(p, end, lk->rec.state == 'p' ? ",\"approved_by\":"
                                                      : ",\"declined_by\":");
        p = ngx_http_idem_json_str(p, end, (u_char *) lk->rec.approver,
                                   lk->rec.approver_len);
    }

    p = ngx_slprintf(p, end, ",\"proposal\":%s}\n",
                     lk->proposal.len ? (char *) lk->proposal.data : "null");

    return ngx_http_idem_send_json(r, NGX_HTTP_OK, body, p - body);
}


static ngx_int_t
ngx_http_idem_status_op(ngx_http_request_t *r, ngx_str_t *op, ngx_int_t arg)
{
    ngx_int_t                rc;
    ngx_http_idem_ctx_t     *ctx;
    ngx_http_idem_lookup_t  *lk;

    rc = ngx_http_discard_request_body(r);
    if (rc != NGX_OK) {
        return rc;
    }

    ctx = ngx_http_idem_create_ctx(r);
    lk = ngx_pcalloc(r->pool, sizeof(ngx_http_idem_lookup_t));
    if (ctx == NULL || lk == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    ctx->conf = ngx_http_get_module_loc_conf(r, ngx_http_idempotency_module);
    ctx->phase = NGX_HTTP_IDEM_DONE;

    if (arg != NGX_OK) {
        return ngx_http_idem_send_problem(r, ctx, NGX_HTTP_IDEM_P_NOT_FOUND,
                                          "op must be an operation id: 32 "
                                          "lowercase hex");
    }

    lk->op = *op;
    lk->done = ngx_http_idem_status_op_done;

    return ngx_http_idem_lookup(r, ctx, lk);
}


/*
 * status.lua gets the record and the key beside it that names the lock
 * its operation took (idempotency_lock): the request has the key, not the
 * body the lock key is derived from.  Not named on a cluster: while a slot
 * migrates, Redis refuses (TRYAGAIN) a script of two keys when one of them
 * is missing, as that key is for every operation without a lock; the
 * script reads it by its name there, and the lock key, in another slot, is
 * checked by a GET of its own (ngx_http_idem_status_check).
 */
ngx_int_t
ngx_http_idem_status_handler(ngx_http_request_t *r)
{
    u_char               *keys[1], hkey[IDEM_RECORD_KEY_LEN + 1];
    ngx_int_t             rc;
    ngx_str_t             op;
    ngx_uint_t            n;
    ngx_http_idem_ctx_t  *ctx;

    if (!(r->method & (NGX_HTTP_GET|NGX_HTTP_HEAD))) {
        return ngx_http_idem_send_not_allowed(r, "GET, HEAD");
    }

    rc = ngx_http_idem_op_arg(r, &op);

    if (rc != NGX_DECLINED) {
        return ngx_http_idem_status_op(r, &op, rc);
    }

    if (ngx_http_idem_ops_ctx(r, &ctx, &rc) != NGX_OK) {
        return rc;
    }

    n = 0;

    if (ctx->conf->redis->topology != NGX_HTTP_IDEM_TOPO_CLUSTER) {
        idem_sibling_key((const char *) ctx->rkey, IDEM_HOLDS_SUFFIX,
                         (char *) hkey);
        keys[n++] = hkey;
    }

    return ngx_http_idem_ops_send(r, ctx,
               ngx_http_idem_cmd_create_keys(ctx->conf->redis,
                                             NGX_HTTP_IDEM_SCRIPT_STATUS,
                                             ctx->rkey, keys, n, 0,
                                             r->connection->log));
}


/*
 * The value of argument "name", NGX_DECLINED when it is absent, NGX_ERROR
 * when it is given twice: "status=201&status=500" is refused rather than
 * read as either.
 */
static ngx_int_t
ngx_http_idem_arg_once(ngx_http_request_t *r, const char *name, size_t len,
    ngx_str_t *value)
{
    u_char  *p, *end, *amp;

    value->len = 0;
    value->data = NULL;

    p = r->args.data;
    end = p + r->args.len;

    while (p < end) {
        amp = ngx_strlchr(p, end, '&');

        if (amp == NULL) {
            amp = end;
        }

        if ((size_t) (amp - p) > len && p[len] == '='
            && ngx_strncmp(p, name, len) == 0)
        {
            if (value->data) {
                return NGX_ERROR;
            }

            value->data = p + len + 1;
            value->len = amp - value->data;
        }

        p = amp + 1;
    }

    return value->data ? NGX_OK : NGX_DECLINED;
}


/*
 * ?action=release, or ?action=complete&status=NNN: the command, NULL with
 * *bad set when the arguments are not one of these.
 */
static ngx_http_idem_cmd_t *
ngx_http_idem_admin_cmd(ngx_http_request_t *r, ngx_http_idem_ctx_t *ctx,
    ngx_uint_t *bad, idem_audit_entry_t *e, ngx_uint_t ne)
{
    size_t                size;
    ngx_str_t             first = ngx_string("-");
    ngx_int_t             n;
    ngx_str_t             action, status;
    ngx_http_idem_cmd_t  *cmd;

    *bad = 1;

    if (ngx_http_idem_arg_once(r, "action", 6, &action) != NGX_OK) {
        return NULL;
    }

    n = 0;

    if (action.len == 8 && ngx_strncmp(action.data, "complete", 8) == 0) {
        if (ngx_http_idem_arg_once(r, "status", 6, &status) != NGX_OK
            || status.len != 3
            || (n = ngx_atoi(status.data, status.len)) < 200 || n > 599)
        {
            return NULL;
        }

    } else if (action.len != 7
               || ngx_strncmp(action.data, "release", 7) != 0)
    {
        return NULL;
    }

    *bad = 0;
    size = action.len + 2 * NGX_INT64_LEN;

    /* audited: first the script says which record it resolves ("-") */
    cmd = ctx->conf->audit
          ? ngx_http_idem_audit_cmd(ctx->conf->audit,
                                    NGX_HTTP_IDEM_SCRIPT_ADMIN, ctx->rkey,
                                    NULL, 0, size,
                                    ne ? &ctx->audit_expect : &first, e, ne,
                                    r->connection->log)
          : ngx_http_idem_cmd_create(ctx->conf->redis,
                                     NGX_HTTP_IDEM_SCRIPT_ADMIN, ctx->rkey,
                                     size, r->connection->log);
    if (cmd == NULL) {
        return NULL;
    }

    ngx_http_idem_cmd_set(cmd, NGX_HTTP_IDEM_ADMIN_ACTION, action.data,
                          action.len);
    ngx_http_idem_cmd_set_num(cmd, NGX_HTTP_IDEM_ADMIN_STATUS, n);
    ngx_http_idem_cmd_set_num(cmd, NGX_HTTP_IDEM_ADMIN_TTL,
                              (int64_t) ctx->conf->ttl * 1000);

    return cmd;
}


ngx_int_t
ngx_http_idem_admin_handler(ngx_http_request_t *r)
{
    ngx_int_t             rc;
    ngx_uint_t            bad;
    ngx_http_idem_cmd_t  *cmd;
    ngx_http_idem_ctx_t  *ctx;

    if (!(r->method & NGX_HTTP_POST)) {
        return ngx_http_idem_send_not_allowed(r, "POST");
    }

    if (ngx_http_idem_ops_ctx(r, &ctx, &rc) != NGX_OK) {
        return rc;
    }

    cmd = ngx_http_idem_admin_cmd(r, ctx, &bad, NULL, 0);

    if (bad) {
        return ngx_http_idem_send_problem(r, ctx, NGX_HTTP_IDEM_P_BAD_ADMIN,
                                          NULL);
    }

    return ngx_http_idem_ops_send(r, ctx, cmd);
}


/* idempotency_metrics: every worker's counters, from the shared zone */
ngx_int_t
ngx_http_idem_metrics_handler(ngx_http_request_t *r)
{
    ngx_int_t                   rc;
    ngx_str_t                   text;
    ngx_http_idem_main_conf_t  *mcf;

    if (!(r->method & (NGX_HTTP_GET|NGX_HTTP_HEAD))) {
        return ngx_http_idem_send_not_allowed(r, "GET, HEAD");
    }

    rc = ngx_http_discard_request_body(r);
    if (rc != NGX_OK) {
        return rc;
    }

    mcf = ngx_http_get_module_main_conf(r, ngx_http_idempotency_module);

    if (ngx_http_idem_metrics_text(r->pool, mcf->metrics_zone,
                                   ngx_http_idem_outcome_names,
                                   NGX_HTTP_IDEM_NOUTCOME_NAMES, &text)
        != NGX_OK)
    {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    ngx_str_set(&r->headers_out.content_type,
                "text/plain; version=0.0.4; charset=utf-8");

    return ngx_http_idem_send_json(r, NGX_HTTP_OK, text.data, text.len);
}


/* the directives of these endpoints, and of the counters they show */

/*
 * The module's content handler for this location.  A directive of another
 * module that comes later (proxy_pass, return...) would replace it without
 * a word, so the merge checks that it is still the location's handler.
 */
static char *
ngx_http_idem_set_content(ngx_conf_t *cf, ngx_http_handler_pt handler)
{
    ngx_http_idem_loc_conf_t  *lcf;
    ngx_http_core_loc_conf_t  *clcf;

    clcf = ngx_http_conf_get_module_loc_conf(cf, ngx_http_core_module);

    if (clcf->handler) {
        return NGX_CONF_ERROR;
    }

    clcf->handler = handler;

    lcf = ngx_http_conf_get_module_loc_conf(cf, ngx_http_idempotency_module);
    lcf->content = handler;

    return NGX_CONF_OK;
}


char *
ngx_http_idem_ops_location(ngx_conf_t *cf, ngx_http_handler_pt handler)
{
    ngx_http_idem_main_conf_t  *mcf;

    if (ngx_http_idem_set_content(cf, handler) != NGX_CONF_OK) {
        return "is duplicate: the location already has a content handler";
    }

    mcf = ngx_http_conf_get_module_main_conf(cf, ngx_http_idempotency_module);
    mcf->used = 1;

    return NGX_CONF_OK;
}


char *
ngx_http_idem_status(ngx_conf_t *cf, ngx_command_t *cmd, void *conf)
{
    ngx_http_idem_loc_conf_t  *lcf = conf;

    lcf->ops = 1;

    return ngx_http_idem_ops_location(cf, ngx_http_idem_status_handler);
}


char *
ngx_http_idem_admin(ngx_conf_t *cf, ngx_command_t *cmd, void *conf)
{
    ngx_http_idem_loc_conf_t  *lcf = conf;

    ngx_str_t  *value;

    value = cf->args->elts;

    if (ngx_strcasecmp(value[1].data, (u_char *) "off") == 0) {
        return NGX_CONF_OK;
    }

    if (ngx_strcasecmp(value[1].data, (u_char *) "on") != 0) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "invalid value \"%V\" in \"%V\" directive, "
                           "it must be \"on\" or \"off\"",
                           &value[1], &cmd->name);
        return NGX_CONF_ERROR;
    }

    lcf->ops = 1;

    return ngx_http_idem_ops_location(cf, ngx_http_idem_admin_handler);
}


char *
ngx_http_idem_metrics_conf(ngx_conf_t *cf, ngx_command_t *cmd, void *conf)
{
    ngx_http_idem_main_conf_t  *mcf;

    mcf = ngx_http_conf_get_module_main_conf(cf, ngx_http_idempotency_module);

    if (mcf->metrics_zone == NULL) {
        return "needs \"idempotency_metrics_zone\" before it in http{}";
    }

    if (ngx_http_idem_set_content(cf, ngx_http_idem_metrics_handler)
        != NGX_CONF_OK)
    {
        return "is duplicate: the location already has a content handler";
    }

    return NGX_CONF_OK;
}


char *
ngx_http_idem_metrics_zone_conf(ngx_conf_t *cf, ngx_command_t *cmd,
    void *conf)
{
    ngx_http_idem_main_conf_t *mcf = conf;

    ssize_t     size;
    ngx_str_t  *value;

    if (mcf->metrics_zone) {
        return "is duplicate";
    }

    value = cf->args->elts;

    size = ngx_parse_size(&value[2]);

    if (value[1].len == 0 || size == NGX_ERROR
        || size < (ssize_t) (8 * ngx_pagesize))
    {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "\"%V\": a zone name and a size of at least "
                           "%uzk, not \"%V %V\"", &cmd->name,
                           8 * ngx_pagesize / 1024, &value[1], &value[2]);
        return NGX_CONF_ERROR;
    }

    mcf->metrics_zone = ngx_http_idem_metrics_zone(cf, &value[1], size,
                                                   &mcf->metrics_labels,
                                                   &ngx_http_idempotency_module);
    if (mcf->metrics_zone == NULL) {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "\"%V\": zone \"%V\" is already in use",
                           &cmd->name, &value[1]);
        return NGX_CONF_ERROR;
    }

    return NGX_CONF_OK;
}


char *
ngx_http_idem_metrics_label(ngx_conf_t *cf, ngx_command_t *cmd, void *conf)
{
    ngx_http_idem_loc_conf_t  *lcf = conf;

    ngx_str_t                  *value;
    ngx_http_idem_main_conf_t  *mcf;

    if (lcf->metrics_label != NGX_CONF_UNSET_UINT) {
        return "is duplicate";
    }

    value = cf->args->elts;
    mcf = ngx_http_conf_get_module_main_conf(cf, ngx_http_idempotency_module);

    if (ngx_http_idem_metrics_label_add(cf, &mcf->metrics_labels, &value[1],
                                        &lcf->metrics_label)
        != NGX_OK)
    {
        ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                           "\"%V\": invalid label \"%V\": 1 to 64 of "
                           "A-Z a-z 0-9 _ - . : /", &cmd->name, &value[1]);
        return NGX_CONF_ERROR;
    }

    return NGX_CONF_OK;
}


/* a later directive took the location from the module's content handler */
char *
ngx_http_idem_check_content(ngx_conf_t *cf, ngx_http_idem_loc_conf_t *conf)
{
    ngx_http_core_loc_conf_t  *clcf;

    if (conf->content == NULL) {
        return NGX_CONF_OK;
    }

    clcf = ngx_http_conf_get_module_loc_conf(cf, ngx_http_core_module);

    if (clcf->handler == conf->content) {
        return NGX_CONF_OK;
    }

    ngx_conf_log_error(NGX_LOG_EMERG, cf, 0,
                       "location \"%V\" has \"idempotency_status\", "
                       "\"idempotency_admin\", \"idempotency_approve\" or "
                       "\"idempotency_metrics\" and another content "
                       "handler (proxy_pass, return...)",
                       &clcf->name);

    return NGX_CONF_ERROR;
}


/*
 * nginx answers some requests to an endpoint itself: a body over
 * client_max_body_size (413, before the endpoint runs when Content-Length
 * tells, or while it reads a chunked body), a 500.  Its special response
 * sets err_status and an HTML page; the endpoint's answers are problems,
 * so these are too.  The page's headers are replaced here, its body below.
 */
static ngx_int_t
ngx_http_idem_ops_page(ngx_http_request_t *r, ngx_http_idem_problem_e *p)
{
    ngx_http_idem_loc_conf_t  *lcf;

    lcf = ngx_http_get_module_loc_conf(r, ngx_http_idempotency_module);

    if (lcf == NULL || lcf->content == NULL || r != r->main) {
        return 0;
    }

    switch (r->err_status) {

    case NGX_HTTP_REQUEST_ENTITY_TOO_LARGE:
        *p = NGX_HTTP_IDEM_P_BODY_TOO_LARGE;
        return 1;

    case NGX_HTTP_INTERNAL_SERVER_ERROR:
        *p = NGX_HTTP_IDEM_P_INTERNAL_ERROR;
        return 1;

    default:
        return 0;
    }
}


static ngx_int_t
ngx_http_idem_ops_header_filter(ngx_http_request_t *r)
{
    ngx_str_t                 text;
    ngx_http_idem_problem_e   problem;

    if (!ngx_http_idem_ops_page(r, &problem)
        || r->headers_out.status != r->err_status)
    {
        return ngx_http_idem_ops_next_header(r);
    }

    if (ngx_http_idem_problem_page(r, problem, 1, &text) != NGX_OK) {
        return NGX_ERROR;
    }

    return ngx_http_idem_ops_next_header(r);
}


/* the page's buffers are dropped; the problem goes with the last one */
static ngx_int_t
ngx_http_idem_ops_body_filter(ngx_http_request_t *r, ngx_chain_t *in)
{
    ngx_buf_t                *b;
    ngx_str_t                 text;
    ngx_uint_t                last;
    ngx_chain_t               out, *cl;
    ngx_http_idem_problem_e   problem;

    if (in == NULL || !ngx_http_idem_ops_page(r, &problem)) {
        return ngx_http_idem_ops_next_body(r, in);
    }

    last = 0;

    for (cl = in; cl; cl = cl->next) {
        cl->buf->pos = cl->buf->last;
        cl->buf->file_pos = cl->buf->file_last;
        last |= cl->buf->last_buf;
    }

    if (!last) {
        return NGX_OK;
    }

    if (ngx_http_idem_problem_page(r, problem, 0, &text) != NGX_OK) {
        return NGX_ERROR;
    }

    b = ngx_calloc_buf(r->pool);
    if (b == NULL) {
        return NGX_ERROR;
    }

    b->pos = text.data;
    b->last = text.data + text.len;
    b->memory = 1;
    b->last_buf = 1;
    b->last_in_chain = 1;

    out.buf = b;
    out.next = NULL;

    return ngx_http_idem_ops_next_body(r, &out);
}


ngx_int_t
ngx_http_idem_ops_filter_init(ngx_conf_t *cf)
{
    ngx_http_idem_ops_next_header = ngx_http_top_header_filter;
    ngx_http_top_header_filter = ngx_http_idem_ops_header_filter;

    ngx_http_idem_ops_next_body = ngx_http_top_body_filter;
    ngx_http_top_body_filter = ngx_http_idem_ops_body_filter;

    return NGX_OK;
}
