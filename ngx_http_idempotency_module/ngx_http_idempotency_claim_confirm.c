/*
 * idempotency_confirm's part in a claim: a request that needs an approval
 * it does not carry writes a proposal instead of a claim (a record
 * awaiting confirmation, for idempotency_confirm_ttl, which has no owner
 * since nothing runs); a recorded approval is claimed as its approver's;
 * a declined proposal refuses every request of its key.  Before the 428
 * leaves, the proposal's operation id is indexed for the approval
 * endpoint and the page, and the page's pending list is told.
 */

#include <ngx_config.h>
#include <ngx_core.h>

#include "ngx_http_idempotency.h"
#include "ngx_http_idempotency_claim.h"
#include "ngx_http_idempotency_claim_confirm.h"
#include "ngx_http_idempotency_command.h"
#include "ngx_http_idempotency_redis.h"
#include "ngx_http_idempotency_request.h"


static ngx_str_t  ngx_http_idem_set = ngx_string("SET");


/* a proposal instead of a claim: no owner, for idempotency_confirm_ttl */
static void
ngx_http_idem_claim_confirm_value(ngx_http_idem_ctx_t *ctx, idem_value_t *v)
{
    if (ctx->confirm != NGX_HTTP_IDEM_CONFIRM_PROPOSE) {
        return;
    }

    v->ttl_ms = (int64_t) ctx->conf->confirm_ttl * 1000;
    v->state = 'a';
    v->owner = NULL;
    v->expires = ctx->created + v->ttl_ms;
}


static void
ngx_http_idem_claim_confirm_args(ngx_http_idem_ctx_t *ctx,
    ngx_http_idem_cmd_t *cmd)
{
    ngx_http_idem_cmd_set(cmd, NGX_HTTP_IDEM_CLAIM_APPROVED,
                          ctx->confirm == NGX_HTTP_IDEM_CONFIRM_APPROVED
                          ? "1" : "0", 1);
}


/* a recorded approval: the request is claimed as its approver's */
ngx_int_t
ngx_http_idem_claim_approver(ngx_http_request_t *r, ngx_http_idem_ctx_t *ctx,
    const char *approver, size_t len)
{
    ctx->approver.data = ngx_pnalloc(r->pool, len);
    if (ctx->approver.data == NULL) {
        return NGX_ERROR;
    }

    ngx_memcpy(ctx->approver.data, approver, len);
    ctx->approver.len = len;
    ctx->confirm = NGX_HTTP_IDEM_CONFIRM_RECORDED;

    return NGX_OK;
}


/*
 * claim.lua claimed a proposal of this request without the module's
 * first look (a waiter, a business value): the operation is the
 * proposal's, as the person approved it, and its approver the recorded
 * one when it was claimed with that
 */
static ngx_int_t
ngx_http_idem_claim_took(ngx_http_request_t *r, ngx_http_idem_ctx_t *ctx,
    idem_claim_t *c)
{
    if (ngx_http_idem_claim_op(r, ctx, c->op) != NGX_OK) {
        return NGX_ERROR;
    }

    return c->approver
           ? ngx_http_idem_claim_approver(r, ctx, c->approver,
                                          c->approver_len)
           : NGX_OK;
}


/*
 * A proposal of this request's fingerprint, or its recorded approval:
 * only claim.lua may turn it into a claim, with the approval the request
 * carries or the one the record holds (ctx->op_id, the proposal's, is then
 * the operation's).
 */
static ngx_http_idem_answer_e
ngx_http_idem_claim_proposal(ngx_http_request_t *r, ngx_http_idem_ctx_t *ctx,
    idem_value_t *v)
{
    ctx->proposal_expires = v->expires;

    if (ctx->confirm == NGX_HTTP_IDEM_CONFIRM_APPROVED) {
        return NGX_HTTP_IDEM_ANS_NONE;
    }

    if (v->state == 'a') {
        /*
         * The proposal sent again: its operation-id index may have been
         * evicted (or its write failed), and without it the approval
         * endpoint cannot find the operation until the proposal expires.
         * Written again (ngx_http_idem_claim_index), for its life left.
         */
        return NGX_HTTP_IDEM_ANS_CONFIRM;
    }

    /* RECORDED: claim.lua has refused it already, by Redis's clock */
    if (ctx->confirm == NGX_HTTP_IDEM_CONFIRM_RECORDED
        || v->approved_until <= ngx_http_idem_now_ms())
    {
        return NGX_HTTP_IDEM_ANS_APPROVAL_EXPIRED;
    }

    return ngx_http_idem_claim_approver(r, ctx, v->approver, v->approver_len)
           == NGX_OK
           ? NGX_HTTP_IDEM_ANS_NONE : NGX_HTTP_IDEM_ANS_STORE_ERROR;
}


/*
 * A record of a proposal (awaiting confirmation, approved, declined) that
 * holds the key.  claim.lua decides in flight claims and markers itself;
 * only a recorded approval it found for a caller that sent a proposal (a
 * duplicate that waited) is claimed once more, with a claim.
 */
static ngx_int_t
ngx_http_idem_claim_confirm_held(ngx_http_request_t *r,
    ngx_http_idem_ctx_t *ctx, idem_value_t *v, ngx_uint_t same,
    ngx_uint_t look, ngx_http_idem_answer_e *answer)
{
    /* a person said no to what this key proposed: no request of it runs */
    if (v->state == 'd') {
        *answer = NGX_HTTP_IDEM_ANS_DECLINED;
        return NGX_OK;
    }

    if (!same || (v->state != 'a' && v->state != 'p')) {
        return NGX_DECLINED;
    }

    *answer = ngx_http_idem_claim_proposal(r, ctx, v);

    if (*answer == NGX_HTTP_IDEM_ANS_NONE && !look) {
        if (v->state != 'p' || ctx->reclaimed) {
            *answer = NGX_HTTP_IDEM_ANS_STORE_ERROR;
            return NGX_OK;
        }

        ctx->reclaimed = 1;
    }

    return NGX_OK;
}


/* the key was free: the proposal's record, or a proposal claimed first */
static ngx_int_t
ngx_http_idem_claim_confirm_decoded(ngx_http_request_t *r,
    ngx_http_idem_ctx_t *ctx, idem_claim_t *c, ngx_http_idem_answer_e *answer)
{
    if (c->kind != IDEM_CLAIM_CLAIMED) {
        return NGX_DECLINED;
    }

    if (ctx->confirm == NGX_HTTP_IDEM_CONFIRM_PROPOSE) {
        /* what was written is the proposal: nothing may run */
        ngx_http_idem_set_state(ctx, 'a');
        ctx->proposal_expires = ctx->created
                                + (int64_t) ctx->conf->confirm_ttl * 1000;
        *answer = NGX_HTTP_IDEM_ANS_CONFIRM;
        return NGX_OK;
    }

    /* a proposal claimed by claim.lua first: its operation now */
    if (c->op && ngx_http_idem_claim_took(r, ctx, c) != NGX_OK) {
        *answer = NGX_HTTP_IDEM_ANS_STORE_ERROR;
        return NGX_OK;
    }

    return NGX_DECLINED;
}


/*
 * The operation id of a new proposal names its record for the approval
 * endpoint (idempotency_approve), which is given the id and not the key:
 * SET <IDEM_OPERATION_PREFIX><op id>} <record key><proposal> PX <proposal
 * TTL left>, the proposal as the 428 shows it (JSON, at most
 * NGX_HTTP_IDEM_PROPOSAL_MAX bytes; a larger one is not kept, and the
 * approval page and idempotency-approve then refuse to show it).  The 428
 * waits for Redis's "OK": sent and not awaited, an approver's look-up on
 * another worker or another cluster node's link could reach Redis first
 * and be told 404.  If it fails, the answer is 503 store-unavailable;
 * the client's retry finds the proposal and writes the index again.
 */
#define NGX_HTTP_IDEM_PROPOSAL_MAX  (64 * 1024)

typedef char  ngx_http_idem_index_len_check[
    IDEM_OPERATION_KEY_LEN == IDEM_RECORD_KEY_LEN ? 1 : -1];

enum {
    NGX_HTTP_IDEM_INDEX_VALUE = 0,
    NGX_HTTP_IDEM_INDEX_PX,
    NGX_HTTP_IDEM_INDEX_TTL,
    NGX_HTTP_IDEM_INDEX_NARGS
};

static ngx_str_t  ngx_http_idem_zadd = ngx_string("ZADD");
static ngx_str_t  ngx_http_idem_zrem_score = ngx_string("ZREMRANGEBYSCORE");
static ngx_str_t  ngx_http_idem_zrem_rank = ngx_string("ZREMRANGEBYRANK");

typedef char  ngx_http_idem_pending_len_check[
    sizeof(IDEM_PENDING_KEY) - 1 == IDEM_RECORD_KEY_LEN ? 1 : -1];


/*
 * The approval page's list of pending operations (IDEM_PENDING_KEY):
 * this one added with its end, the ended ones and those beyond
 * IDEM_PENDING_MAX removed.  Three commands of O(log N) (plus what they
 * remove); nobody waits for them, and a lost one only shortens the list.
 */
static void
ngx_http_idem_claim_pending(ngx_http_request_t *r, ngx_http_idem_ctx_t *ctx)
{
    ngx_uint_t            i;
    ngx_http_idem_cmd_t  *cmd[3];
    ngx_http_idem_redis_t  *rd;

    rd = ctx->conf->redis;

    cmd[0] = ngx_http_idem_cmd_native(rd, &ngx_http_idem_zadd, 2,
                                      (u_char *) IDEM_PENDING_KEY,
                                      ctx->op_id.len + NGX_INT64_LEN,
                                      r->connection->log);
    cmd[1] = ngx_http_idem_cmd_native(rd, &ngx_http_idem_zrem_score, 2,
                                      (u_char *) IDEM_PENDING_KEY,
                                      NGX_INT64_LEN + 8, r->connection->log);
    cmd[2] = ngx_http_idem_cmd_native(rd, &ngx_http_idem_zrem_rank, 2,
                                      (u_char *) IDEM_PENDING_KEY,
                                      NGX_INT64_LEN + 8, r->connection->log);

    if (cmd[0] == NULL || cmd[1] == NULL || cmd[2] == NULL) {
        return;
    }

    ngx_http_idem_cmd_set_num(cmd[0], 0, ctx->proposal_expires);
    ngx_http_idem_cmd_set(cmd[0], 1, ctx->op_id.data, ctx->op_id.len);
    ngx_http_idem_cmd_set(cmd[1], 0, "-inf", 4);
    ngx_http_idem_cmd_set_num(cmd[1], 1, ngx_http_idem_now_ms());
    ngx_http_idem_cmd_set_num(cmd[2], 0, 0);
    ngx_http_idem_cmd_set_num(cmd[2], 1, -(IDEM_PENDING_MAX + 1));

    for (i = 0; i < 3; i++) {
        (void) ngx_http_idem_cmd_send(cmd[i], NULL, NULL);
    }
}


/* the 428 may leave: its index is in Redis; the pending list follows */
static void
ngx_http_idem_claim_indexed(ngx_http_idem_cmd_t *cmd, redisReply *reply)
{
    ngx_http_idem_ctx_t  *ctx;

    ctx = cmd->data;

    if (ctx == NULL) {
        return;     /* the request has gone; the index names a proposal */
    }

    ctx->cmd = NULL;

    if (reply == NULL || reply->type != REDIS_REPLY_STATUS) {
        ngx_log_error(NGX_LOG_WARN, ctx->request->connection->log, 0,
                      "idempotency: the operation index of key \"%V\"'s "
                      "proposal was not written (%s); answered 503",
                      ngx_http_idem_log_key(ctx),
                      reply ? "error reply" : "no reply");

        ctx->answer = NGX_HTTP_IDEM_ANS_STORE_DOWN;

    } else {
        ngx_http_idem_claim_pending(ctx->request, ctx);
    }

    ngx_http_idem_claim_answered(ctx);
}


/*
 * NGX_OK: the index is on its way and its reply resumes the request;
 * NGX_DECLINED: the proposal has no life left, nothing to write;
 * NGX_ERROR: it could not be sent.
 */
static ngx_int_t
ngx_http_idem_claim_index(ngx_http_request_t *r, ngx_http_idem_ctx_t *ctx)
{
    u_char               *key, *p;
    size_t                len;
    int64_t               ttl;
    ngx_http_idem_cmd_t  *cmd;

    ttl = ctx->proposal_expires - ngx_http_idem_now_ms();
    if (ttl <= 0) {
        return NGX_DECLINED;
    }

    key = ngx_http_idem_operation_key(r->pool, &ctx->op_id);
    if (key == NULL) {
        return NGX_ERROR;
    }

    len = ngx_strlen(ctx->rkey);

    /* made by idempotency_confirm's code, which the claim does not call */
    if (ctx->propose == NULL || ctx->propose(r, ctx) != NGX_OK
        || ctx->proposal.len > NGX_HTTP_IDEM_PROPOSAL_MAX)
    {
        ngx_str_null(&ctx->proposal);
    }

    cmd = ngx_http_idem_cmd_native(ctx->conf->redis, &ngx_http_idem_set,
                                   NGX_HTTP_IDEM_INDEX_NARGS, key,
                                   len + ctx->proposal.len + NGX_INT64_LEN
                                   + 2, r->connection->log);
    if (cmd == NULL) {
        return NGX_ERROR;
    }

    p = ngx_http_idem_cmd_start(cmd, NGX_HTTP_IDEM_INDEX_VALUE);
    p = ngx_cpymem(p, ctx->rkey, len);

    if (ctx->proposal.len) {
        p = ngx_cpymem(p, ctx->proposal.data, ctx->proposal.len);
    }

    ngx_http_idem_cmd_end(cmd, NGX_HTTP_IDEM_INDEX_VALUE, p);
    ngx_http_idem_cmd_set(cmd, NGX_HTTP_IDEM_INDEX_PX, "PX", 2);
    ngx_http_idem_cmd_set_num(cmd, NGX_HTTP_IDEM_INDEX_TTL, ttl);

    if (ngx_http_idem_cmd_send(cmd, ngx_http_idem_claim_indexed, ctx)
        != NGX_OK)
    {
        return NGX_ERROR;
    }

    ctx->cmd = cmd;

    return NGX_OK;
}


/* a 428 to answer: its index first */
static ngx_int_t
ngx_http_idem_claim_confirm_answered(ngx_http_request_t *r,
    ngx_http_idem_ctx_t *ctx, ngx_http_idem_cmd_t *cmd)
{
    if (ctx->answer != NGX_HTTP_IDEM_ANS_CONFIRM) {
        return NGX_DECLINED;
    }

    switch (ngx_http_idem_claim_index(r, ctx)) {

    case NGX_OK:
        return NGX_DONE;

    case NGX_ERROR:
        ctx->answer = NGX_HTTP_IDEM_ANS_STORE_DOWN;
        return NGX_DECLINED;

    default:
        return NGX_DECLINED;
    }
}


ngx_http_idem_claim_part_t  ngx_http_idem_claim_confirm = {
    NULL,                                   /* prepare */
    NULL,                                   /* look */
    NULL,                                   /* scripted */
    NULL,                                   /* keys */
    NULL,                                   /* create */
    ngx_http_idem_claim_confirm_args,       /* args */
    ngx_http_idem_claim_confirm_value,      /* value */
    NULL,                                   /* reply */
    NULL,                                   /* parse */
    ngx_http_idem_claim_confirm_decoded,    /* decoded */
    ngx_http_idem_claim_confirm_held,       /* held */
    ngx_http_idem_claim_confirm_answered,   /* answered */
    NULL                                    /* let */
};
