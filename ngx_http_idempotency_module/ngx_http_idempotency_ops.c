/*
 * Operations endpoints (DESIGN.md section 6): the status of one record,
 * looked up with the key header in the caller's own scope, and the
 * operator's resolution of a record whose outcome is unknown.
 */

#include "ngx_http_idempotency.h"


static void ngx_http_idem_ops_done(ngx_http_idem_cmd_t *cmd,
    redisReply *reply);


/* ms since the epoch (at most IDEM_TIME_MS_MAX) as RFC 3339 UTC; -1: null */
static u_char *
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


static ngx_int_t
ngx_http_idem_status_answer(ngx_http_request_t *r, ngx_http_idem_ctx_t *ctx,
    redisReply *reply)
{
    u_char         *body, *p, *end;
    size_t          n;
    idem_rv_t       el[IDEM_STATUS_ELEMS];
    idem_status_t   st;

    n = ngx_http_idem_reply_elements(reply, el, IDEM_STATUS_ELEMS);

    switch (idem_status_decode(el, n, &st)) {

    case IDEM_STATUS_NONE:
        return ngx_http_idem_send_problem(r, ctx, NGX_HTTP_NOT_FOUND,
                   "not-found", "No record for this idempotency key",
                   "no request with this idempotency key is known in "
                   "this scope");

    case IDEM_STATUS_RECORD:
        break;

    default:
        return NGX_ERROR;
    }

    body = ngx_pnalloc(r->pool, 512 + ctx->key.len * 6);
    if (body == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    end = body + 512 + ctx->key.len * 6;

    p = ngx_slprintf(body, end, "{\"idempotency_key\":");
    p = ngx_http_idem_json_str(p, end, ctx->key.data, ctx->key.len);
    p = ngx_slprintf(p, end, ",\"operation_id\":\"%*s\",\"state\":\"%s\","
                     "\"created_at\":", st.op.len, st.op.data, st.state);
    p = ngx_http_idem_json_time(p, end, st.created);
    p = ngx_slprintf(p, end, ",\"completed_at\":");
    p = ngx_http_idem_json_time(p, end, st.completed);

    if (st.status) {
        p = ngx_slprintf(p, end, ",\"response_status\":%d", st.status);

    } else {
        p = ngx_slprintf(p, end, ",\"response_status\":null");
    }

    p = ngx_slprintf(p, end, ",\"fingerprint\":\"%*s\"}\n",
                     st.fp.len, st.fp.data);

    return ngx_http_idem_send_json(r, NGX_HTTP_OK, body, p - body);
}


static ngx_int_t
ngx_http_idem_admin_answer(ngx_http_request_t *r, ngx_http_idem_ctx_t *ctx,
    redisReply *reply)
{
    u_char             *body, *p, *end;
    size_t              n;
    ngx_str_t           what;
    idem_rv_t           el[IDEM_ADMIN_ELEMS];
    const char         *state;
    idem_admin_kind_e   kind;

    n = ngx_http_idem_reply_elements(reply, el, IDEM_ADMIN_ELEMS);
    kind = idem_admin_decode(el, n, &state);

    switch (kind) {

    case IDEM_ADMIN_NONE:
        return ngx_http_idem_send_problem(r, ctx, NGX_HTTP_NOT_FOUND,
                   "not-found", "No record for this idempotency key",
                   "no request with this idempotency key is known in "
                   "this scope");

    case IDEM_ADMIN_REFUSED:
        ctx->state.data = (u_char *) state;
        ctx->state.len = ngx_strlen(state);

        return ngx_http_idem_send_problem(r, ctx, NGX_HTTP_CONFLICT,
                   "not-resolvable", "Record is not unknown",
                   "only a record whose outcome is unknown, or whose "
                   "owner's lease lapsed, can be resolved");

    case IDEM_ADMIN_RELEASED:
        ngx_str_set(&what, "released");
        break;

    case IDEM_ADMIN_COMPLETED:
        ngx_str_set(&what, "completed");
        break;

    default:
        return NGX_ERROR;
    }

    ngx_log_error(NGX_LOG_NOTICE, r->connection->log, 0,
                  "idempotency: admin %V key \"%V\"", &what, &ctx->key);

    body = ngx_pnalloc(r->pool, 128 + ctx->key.len * 6);
    if (body == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    end = body + 128 + ctx->key.len * 6;

    p = ngx_slprintf(body, end, "{\"idempotency_key\":");
    p = ngx_http_idem_json_str(p, end, ctx->key.data, ctx->key.len);
    p = ngx_slprintf(p, end, ",\"result\":\"%V\"}\n", &what);

    return ngx_http_idem_send_json(r, NGX_HTTP_OK, body, p - body);
}


static void
ngx_http_idem_ops_done(ngx_http_idem_cmd_t *cmd, redisReply *reply)
{
    ngx_int_t             rc;
    ngx_connection_t     *c;
    ngx_http_request_t   *r;
    ngx_http_idem_ctx_t  *ctx;

    ctx = cmd->data;
    if (ctx == NULL) {
        return;
    }

    ctx->cmd = NULL;
    r = ctx->request;
    c = r->connection;

    if (reply == NULL
        || (reply->type == REDIS_REPLY_ERROR
            && !ngx_http_idem_reply_corrupt(reply)))
    {
        rc = ngx_http_idem_send_problem(r, ctx, NGX_HTTP_SERVICE_UNAVAILABLE,
                 "store-unavailable", NULL,
                 "the idempotency store cannot be reached; try again");

    } else if (reply->type != REDIS_REPLY_ARRAY) {
        rc = NGX_ERROR;

    } else {
        rc = ctx->ops_answer(r, ctx, reply);
    }

    if (rc == NGX_ERROR) {
        ngx_log_error(NGX_LOG_ERR, r->connection->log, 0,
                      "idempotency: unexpected reply from redis");

        ngx_http_clean_header(r);
        ngx_str_null(&ctx->state);

        rc = ngx_http_idem_send_problem(r, ctx, NGX_HTTP_INTERNAL_SERVER_ERROR,
                 "store-error", NULL,
                 "the idempotency store holds a record this module cannot "
                 "read");
    }

    ngx_http_finalize_request(r, rc);
    ngx_http_run_posted_requests(c);
}


static ngx_int_t
ngx_http_idem_ops_start(ngx_http_request_t *r, ngx_http_idem_script_e script,
    ngx_http_idem_ops_answer_pt answer, ngx_str_t *args, ngx_uint_t nargs)
{
    size_t                     size;
    ngx_int_t                  rc;
    ngx_str_t                  scope;
    ngx_uint_t                 i;
    const char                *detail;
    ngx_http_idem_cmd_t       *cmd;
    ngx_http_idem_ctx_t       *ctx;
    ngx_http_idem_loc_conf_t  *lcf;

    rc = ngx_http_discard_request_body(r);
    if (rc != NGX_OK) {
        return rc;
    }

    lcf = ngx_http_get_module_loc_conf(r, ngx_http_idempotency_module);

    ctx = ngx_http_idem_create_ctx(r);
    if (ctx == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    ctx->conf = lcf;
    ctx->phase = NGX_HTTP_IDEM_DONE;
    ctx->ops_answer = answer;

    if (answer == NULL) {
        return ngx_http_idem_send_problem(r, ctx, NGX_HTTP_BAD_REQUEST,
                   "bad-admin-request", "Unknown admin action",
                   "use ?action=release or ?action=complete&status=NNN");
    }

    rc = ngx_http_idem_parse_key(r, ctx, &lcf->key_header, &detail);

    if (rc != NGX_OK) {
        return ngx_http_idem_send_problem(r, ctx, NGX_HTTP_BAD_REQUEST,
                   rc == NGX_DECLINED ? "key-missing" : "key-malformed",
                   NULL, rc == NGX_DECLINED ? "send the idempotency key "
                                              "header of the request"
                                            : detail);
    }

    if (ngx_http_idem_record_key(r, ctx, &scope) != NGX_OK) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    size = IDEM_RECORD_KEY_LEN;
    for (i = 0; i < nargs; i++) {
        size += args[i].len;
    }

    cmd = ngx_http_idem_cmd_create(lcf->redis, script, 1 + nargs, size,
                                   r->connection->log);
    if (cmd == NULL) {
        return NGX_HTTP_INTERNAL_SERVER_ERROR;
    }

    ngx_http_idem_cmd_arg(cmd, ctx->rkey, IDEM_RECORD_KEY_LEN);

    for (i = 0; i < nargs; i++) {
        ngx_http_idem_cmd_arg(cmd, args[i].data, args[i].len);
    }

    if (ngx_http_idem_cmd_send(cmd, ngx_http_idem_ops_done, ctx) != NGX_OK) {
        return ngx_http_idem_send_problem(r, ctx, NGX_HTTP_SERVICE_UNAVAILABLE,
                   "store-unavailable", NULL,
                   "the idempotency store cannot be reached; try again");
    }

    ctx->cmd = cmd;

    r->main->count++;

    return NGX_DONE;
}


ngx_int_t
ngx_http_idem_status_handler(ngx_http_request_t *r)
{
    if (!(r->method & (NGX_HTTP_GET|NGX_HTTP_HEAD))) {
        return NGX_HTTP_NOT_ALLOWED;
    }

    return ngx_http_idem_ops_start(r, NGX_HTTP_IDEM_SCRIPT_STATUS,
                                   ngx_http_idem_status_answer, NULL, 0);
}


/* POST ?action=release  or  POST ?action=complete&status=NNN */
ngx_int_t
ngx_http_idem_admin_handler(ngx_http_request_t *r)
{
    u_char                    *p;
    ngx_int_t                  n;
    ngx_str_t                  args[3], action, status;
    ngx_http_idem_loc_conf_t  *lcf;

    if (!(r->method & NGX_HTTP_POST)) {
        return NGX_HTTP_NOT_ALLOWED;
    }

    lcf = ngx_http_get_module_loc_conf(r, ngx_http_idempotency_module);

    if (ngx_http_arg(r, (u_char *) "action", 6, &action) != NGX_OK) {
        ngx_str_null(&action);
    }

    args[0] = action;

    if (ngx_http_idem_is(&action, "release")) {
        return ngx_http_idem_ops_start(r, NGX_HTTP_IDEM_SCRIPT_ADMIN,
                                       ngx_http_idem_admin_answer, args, 1);
    }

    if (ngx_http_idem_is(&action, "complete")
        && ngx_http_arg(r, (u_char *) "status", 6, &status) == NGX_OK
        && (n = ngx_atoi(status.data, status.len)) >= 200 && n <= 599
        && status.len == 3)
    {
        args[1] = status;

        p = ngx_pnalloc(r->pool, NGX_TIME_T_LEN);
        if (p == NULL) {
            return NGX_HTTP_INTERNAL_SERVER_ERROR;
        }

        args[2].data = p;
        args[2].len = ngx_sprintf(p, "%T", lcf->ttl) - p;

        return ngx_http_idem_ops_start(r, NGX_HTTP_IDEM_SCRIPT_ADMIN,
                                       ngx_http_idem_admin_answer, args, 3);
    }

    return ngx_http_idem_ops_start(r, NGX_HTTP_IDEM_SCRIPT_ADMIN, NULL,
                                   NULL, 0);
}
