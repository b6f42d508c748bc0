/*
 * idempotency_audit's part in a claim: the audited first look.
 *
 * With idempotency_audit every change of the record is made by claim.lua
 * together with its entries (redis-scripts/audit.lua), so the first look
 * is a plain GET: a free key is then claimed by claim.lua with the
 * entries of this attempt's claim; a record that answers by itself (a
 * replay, a conflict) is answered, after its entries are appended
 * (append.lua); anything else goes to claim.lua, which says what it would
 * do, and is called again with the entries of that.  The audit file
 * alone, on a location without a guard or a wait, keeps the native
 * claim, and writes its entries once the claim is made.
 */

#include <ngx_config.h>
#include <ngx_core.h>

#include "ngx_http_idempotency.h"
#include "ngx_http_idempotency_claim.h"
#include "ngx_http_idempotency_claim_audit.h"
#include "ngx_http_idempotency_claim_business.h"
#include "ngx_http_idempotency_claim_confirm.h"
#include "ngx_http_idempotency_audit.h"
#include "ngx_http_idempotency_close.h"
#include "ngx_http_idempotency_command.h"
#include "ngx_http_idempotency_redis.h"


static ngx_str_t  ngx_http_idem_get = ngx_string("GET");


/*
 * idempotency_audit: the entry of the answer the request gets (its
 * event and status, the digest of a replayed response and the upstream's
 * reference kept with it); 0 when the answer has no event (Redis trouble:
 * nothing is known, nothing was done).
 */
static ngx_uint_t
ngx_http_idem_claim_answer_entry(ngx_http_request_t *r,
    ngx_http_idem_ctx_t *ctx, ngx_http_idem_answer_e answer,
    idem_audit_entry_t *e)
{
    ngx_uint_t          status;
    idem_audit_event_e  event;

    switch (answer) {

    case NGX_HTTP_IDEM_ANS_COMPLETED:
    case NGX_HTTP_IDEM_ANS_REUSED:
        event = IDEM_AUDIT_REPLAYED;
        status = ctx->body_stored ? ctx->stored_status : NGX_HTTP_CONFLICT;
        break;

    case NGX_HTTP_IDEM_ANS_MISMATCH:
        event = IDEM_AUDIT_CONFLICT;
        status = ctx->conf->conflict_status;
        break;

    case NGX_HTTP_IDEM_ANS_DECLINED:
        event = IDEM_AUDIT_CONFLICT;
        status = NGX_HTTP_FORBIDDEN;
        break;

    case NGX_HTTP_IDEM_ANS_ELSEWHERE:
        event = IDEM_AUDIT_CONFLICT;
        status = NGX_HTTP_CONFLICT;
        break;

    case NGX_HTTP_IDEM_ANS_IN_PROGRESS:
    case NGX_HTTP_IDEM_ANS_LOCKED:
        event = IDEM_AUDIT_IN_PROGRESS;
        status = NGX_HTTP_CONFLICT;
        break;

    case NGX_HTTP_IDEM_ANS_UNKNOWN:
        event = IDEM_AUDIT_UNKNOWN;
        status = NGX_HTTP_CONFLICT;
        break;

    case NGX_HTTP_IDEM_ANS_RELEASED:
        event = IDEM_AUDIT_RELEASED;
        status = ctx->stored_status;
        break;

    case NGX_HTTP_IDEM_ANS_CONFIRM:
    case NGX_HTTP_IDEM_ANS_APPROVAL_EXPIRED:
        event = IDEM_AUDIT_CONFIRMATION_REQUIRED;
        status = 428;      /* Precondition Required */
        break;

    default:
        return 0;
    }

    ngx_http_idem_audit_entry(ctx, ctx->reused ? IDEM_AUDIT_REUSED : event,
                              status, e);

    if (answer == NGX_HTTP_IDEM_ANS_LOCKED
        || answer == NGX_HTTP_IDEM_ANS_ELSEWHERE)
    {
        /* the operation holding the lock or identity is not this request's */
        e->op.len = 0;
    }

    if (event == IDEM_AUDIT_REPLAYED && ctx->body_stored
        && ngx_http_idem_audit_digest(r->pool, NULL, &ctx->stored_body,
                                      &e->response)
           == NGX_OK)
    {
        ngx_http_idem_audit_stored_ref(ctx, e);
    }

    return 1;
}


/* the answer of the operation whose identity a reuse took, by its state */
static ngx_http_idem_answer_e
ngx_http_idem_claim_reuse_answer(ngx_http_idem_ctx_t *ctx)
{
    switch (ctx->state.len ? ctx->state.data[0] : 'u') {

    case 'c':
        return NGX_HTTP_IDEM_ANS_REUSED;

    case 'i':
        return NGX_HTTP_IDEM_ANS_IN_PROGRESS;

    default:
        return NGX_HTTP_IDEM_ANS_UNKNOWN;
    }
}


/*
 * The entries a claim script appends with the change it makes, as
 * ctx->audit_kind says: "attempted" first (once per request), then this
 * attempt's claim ("sent", after "approved" for a signed approval; or the
 * proposal's "confirmation_required"), a reuse or a lapsed lease.
 */
static ngx_uint_t
ngx_http_idem_claim_entries(ngx_http_request_t *r, ngx_http_idem_ctx_t *ctx,
    idem_audit_entry_t *e)
{
    ngx_uint_t  n;

    if (ctx->audit_kind == NGX_HTTP_IDEM_AUDIT_DECIDE) {
        return 0;
    }

    n = 0;

    if (!ctx->audit_attempted) {
        ngx_http_idem_audit_entry(ctx, IDEM_AUDIT_ATTEMPTED, 0, &e[n++]);
    }

    switch (ctx->audit_kind) {

    case NGX_HTTP_IDEM_AUDIT_REUSE:
        return n + ngx_http_idem_claim_answer_entry(r, ctx,
                       ngx_http_idem_claim_reuse_answer(ctx), &e[n]);

    case NGX_HTTP_IDEM_AUDIT_UNKNOWN:
        return n + ngx_http_idem_claim_answer_entry(r, ctx,
                       NGX_HTTP_IDEM_ANS_UNKNOWN, &e[n]);

    default:
        break;
    }

    if (ctx->confirm == NGX_HTTP_IDEM_CONFIRM_PROPOSE) {
        return n + ngx_http_idem_claim_answer_entry(r, ctx,
                       NGX_HTTP_IDEM_ANS_CONFIRM, &e[n]);
    }

    if (ctx->confirm == NGX_HTTP_IDEM_CONFIRM_APPROVED) {
        ngx_http_idem_audit_entry(ctx, IDEM_AUDIT_APPROVED, 0, &e[n++]);
    }

    ngx_http_idem_audit_entry(ctx, IDEM_AUDIT_SENT, 0, &e[n++]);

    return n;
}


static ngx_int_t
ngx_http_idem_claim_audit_prepare(ngx_http_request_t *r,
    ngx_http_idem_ctx_t *ctx)
{
    return ctx->conf->audit ? ngx_http_idem_audit_prepare(r, ctx) : NGX_OK;
}


/*
 * The entries the claim carries.  On a Redis Cluster with business keys
 * the request is let run by a later step, once its keys are taken and its
 * gate opened (ngx_http_idempotency_bkeys.c): a claim's "sent" (and what
 * comes with it) is written there (ngx_http_idem_claim_audit_let), so
 * that a claim refused by a business key has no "sent" in the file; the
 * claim carries none (ctx->audit_later), and decides as with them.
 */
static ngx_uint_t
ngx_http_idem_claim_carried(ngx_http_request_t *r, ngx_http_idem_ctx_t *ctx,
    idem_audit_entry_t *e)
{
    ngx_uint_t  n;

    n = ngx_http_idem_claim_entries(r, ctx, e);

    ctx->audit_later = n && e[n - 1].event == IDEM_AUDIT_SENT
                       && !ctx->conf->audit->on_stream
                       && ctx->conf->redis->topology
                          == NGX_HTTP_IDEM_TOPO_CLUSTER
                       && (ctx->ukey[0] || ctx->lkey[0]);

    return ctx->audit_later ? 0 : n;
}


/* with idempotency_audit: the command carries the entries of ctx->audit_kind */
static ngx_int_t
ngx_http_idem_claim_audit_create(ngx_http_request_t *r,
    ngx_http_idem_ctx_t *ctx, u_char **keys, ngx_uint_t n, size_t size,
    ngx_http_idem_cmd_t **cmd)
{
    idem_audit_entry_t  e[4];

    if (ctx->conf->audit == NULL) {
        return NGX_DECLINED;
    }

    *cmd = ngx_http_idem_audit_cmd(ctx->conf->audit,
                                   NGX_HTTP_IDEM_SCRIPT_CLAIM, ctx->rkey,
                                   keys, n, size, &ctx->audit_expect, e,
                                   ngx_http_idem_claim_carried(r, ctx, e),
                                   r->connection->log);
    return NGX_OK;
}


/*
 * The audit file alone, on a location without a guard or a wait: the
 * native claim, as without the audit; the claim's entries are written
 * once it is made (a record it meets is read as the audit's GET reads it).
 */
static ngx_uint_t
ngx_http_idem_claim_native_file(ngx_http_idem_ctx_t *ctx)
{
    return ctx->conf->audit && !ctx->conf->audit->on_stream
           && ctx->confirm == NGX_HTTP_IDEM_CONFIRM_NONE && !ctx->waiting
           && ctx->ukey[0] == '\0' && ctx->lkey[0] == '\0';
}


/* the first look changes nothing: claim.lua does, with entries */
static ngx_int_t
ngx_http_idem_claim_audit_look(ngx_http_request_t *r,
    ngx_http_idem_ctx_t *ctx, ngx_http_idem_cmd_t **cmd)
{
    if (ctx->conf->audit == NULL || ngx_http_idem_claim_native_file(ctx)) {
        return NGX_DECLINED;
    }

    *cmd = ngx_http_idem_cmd_native(ctx->conf->redis, &ngx_http_idem_get, 0,
                                    ctx->rkey, 0, r->connection->log);
    return NGX_OK;
}


/*
 * idempotency_audit: claim.lua said what it would do, and did nothing:
 * {"audit-decide", want, kind, basis, reply}.  The request learns what it
 * needs of the record decided on; the next claim.lua carries the entries
 * of that decision, made for "want".
 */
static ngx_http_idem_answer_e
ngx_http_idem_claim_decide(ngx_http_request_t *r, ngx_http_idem_ctx_t *ctx,
    redisReply *reply)
{
    size_t        n;
    ngx_str_t     want, kind, basis;
    idem_rv_t     el[IDEM_CLAIM_ELEMS];
    idem_claim_t  c;

    if (reply->elements != 5
        || ngx_http_idem_reply_str(reply->element[1], &want) != NGX_OK
        || ngx_http_idem_reply_str(reply->element[2], &kind) != NGX_OK
        || ngx_http_idem_reply_str(reply->element[3], &basis) != NGX_OK
        || reply->element[4]->type != REDIS_REPLY_ARRAY)
    {
        return NGX_HTTP_IDEM_ANS_STORE_ERROR;
    }

    ctx->audit_expect.data = ngx_pstrdup(r->pool, &want);
    ctx->audit_expect.len = want.len;

    n = ngx_http_idem_reply_elements(reply->element[4], el, IDEM_CLAIM_ELEMS);
    idem_claim_decode(el, n, &c);

    if (ctx->audit_expect.data == NULL) {
        return NGX_HTTP_IDEM_ANS_STORE_ERROR;
    }

    if (kind.len == 5 && ngx_strncmp(kind.data, "claim", 5) == 0) {
        ctx->audit_kind = NGX_HTTP_IDEM_AUDIT_CLAIM;
        return NGX_HTTP_IDEM_ANS_NONE;
    }

    if (kind.len == 7 && ngx_strncmp(kind.data, "approve", 7) == 0
        && idem_value_decode((char *) basis.data, basis.len, &c.rec) == 0
        && ngx_http_idem_claim_record(r, ctx, &c.rec) == NGX_OK
        && (c.rec.state != 'p'
            || ngx_http_idem_claim_approver(r, ctx, c.rec.approver,
                                            c.rec.approver_len) == NGX_OK))
    {
        ctx->audit_kind = NGX_HTTP_IDEM_AUDIT_APPROVE;
        return NGX_HTTP_IDEM_ANS_NONE;
    }

    if (kind.len == 5 && ngx_strncmp(kind.data, "reuse", 5) == 0
        && c.kind == IDEM_CLAIM_REUSED
        && ngx_http_idem_claim_reused(r, ctx, &c)
           != NGX_HTTP_IDEM_ANS_STORE_ERROR)
    {
        ctx->audit_kind = NGX_HTTP_IDEM_AUDIT_REUSE;
        return NGX_HTTP_IDEM_ANS_NONE;
    }

    if (kind.len == 7 && ngx_strncmp(kind.data, "unknown", 7) == 0
        && c.kind == IDEM_CLAIM_RECORD && c.rec.state == 'u'
        && ngx_http_idem_claim_record(r, ctx, &c.rec) == NGX_OK)
    {
        ctx->audit_kind = NGX_HTTP_IDEM_AUDIT_UNKNOWN;
        return NGX_HTTP_IDEM_ANS_NONE;
    }

    return NGX_HTTP_IDEM_ANS_STORE_ERROR;
}


/*
 * idempotency_audit: the first look is a GET.  A free key is claimed by
 * claim.lua with this attempt's entries; a record is read as SET NX GET's
 * would be, and what only claim.lua can tell it decides first (a marker
 * is most likely taken over: claimed at once).
 */
static ngx_http_idem_answer_e
ngx_http_idem_claim_looked(ngx_http_request_t *r, ngx_http_idem_ctx_t *ctx,
    redisReply *reply)
{
    idem_claim_t            c;
    ngx_http_idem_answer_e  answer;

    ngx_str_set(&ctx->audit_expect, "claim");
    ctx->audit_kind = NGX_HTTP_IDEM_AUDIT_CLAIM;

    if (reply->type == REDIS_REPLY_NIL) {
        return NGX_HTTP_IDEM_ANS_NONE;
    }

    if (reply->type != REDIS_REPLY_STRING
        || idem_claim_set_decode(reply->str, reply->len, &c)
           != IDEM_CLAIM_RECORD)
    {
        /* layout 1, or a value claim.lua refuses in its own words */
        ngx_str_set(&ctx->audit_expect, "-");
        ctx->audit_kind = NGX_HTTP_IDEM_AUDIT_DECIDE;
        return NGX_HTTP_IDEM_ANS_NONE;
    }

    answer = ngx_http_idem_claim_held(r, ctx, &c.rec, 1);

    if (answer == NGX_HTTP_IDEM_ANS_NONE && c.rec.state != 'r') {
        ngx_str_set(&ctx->audit_expect, "-");
        ctx->audit_kind = NGX_HTTP_IDEM_AUDIT_DECIDE;
    }

    return answer;
}


/*
 * The claim's reply with idempotency_audit: the GET of the first look, or
 * claim.lua's decision ("audit-decide"), or a claim as without the audit;
 * a recorded approval to claim again is decided by claim.lua first.
 */
static ngx_int_t
ngx_http_idem_claim_audit_parse(ngx_http_request_t *r,
    ngx_http_idem_ctx_t *ctx, ngx_http_idem_cmd_t *cmd, redisReply *reply,
    ngx_http_idem_answer_e *answer)
{
    if (ctx->conf->audit == NULL) {
        return NGX_DECLINED;
    }

    /* a native claim made (the audit file alone) is decoded as without */
    if (cmd->script != NGX_HTTP_IDEM_SCRIPT_CLAIM
        && !(reply->type == REDIS_REPLY_NIL
             && ngx_http_idem_claim_native(cmd)))
    {
        *answer = ngx_http_idem_claim_looked(r, ctx, reply);
        return NGX_OK;
    }

    if (ngx_http_idem_reply_tagged(reply, "audit-decide")) {
        *answer = ngx_http_idem_claim_decide(r, ctx, reply);
        return NGX_OK;
    }

    *answer = ngx_http_idem_claim_decode(r, ctx, cmd, reply);

    if (*answer == NGX_HTTP_IDEM_ANS_NONE) {
        ngx_str_set(&ctx->audit_expect, "-");
        ctx->audit_kind = NGX_HTTP_IDEM_AUDIT_DECIDE;
    }

    return NGX_OK;
}


static void ngx_http_idem_claim_unrecorded(ngx_http_request_t *r,
    ngx_http_idem_ctx_t *ctx);


/*
 * The claim's lines are in the file (or none is): the request goes on to
 * the upstream, or is answered 503 with the claim given back.
 */
static void
ngx_http_idem_claim_audit_written(ngx_http_idem_audit_wait_t *w)
{
    ngx_http_idem_ctx_t  *ctx = w->data;

    if (w->rc == NGX_OK) {
        ngx_http_idem_claim_made_on(ctx);
        return;
    }

    ctx->audit_unrecorded = 1;
    ngx_http_idem_claim_unrecorded(ctx->request, ctx);
    ngx_http_idem_claim_answered(ctx);
}


/*
 * A native claim made with the audit file alone: its entries go with the
 * turn's others in one write(), and the request waits for it (NGX_OK), or
 * NGX_ERROR when they cannot be written.  With idempotency_redis_wait they
 * are written now (NGX_DECLINED, or NGX_ERROR): the WAIT that follows must
 * go on the connection whose reply this is, which only this reply's
 * handler knows (from the posted event it would never be sent, and every
 * claim would be answered 503).
 */
static ngx_int_t
ngx_http_idem_claim_native_entries(ngx_http_request_t *r,
    ngx_http_idem_ctx_t *ctx)
{
    ngx_uint_t          n;
    idem_audit_entry_t  e[4];

    ctx->audit_kind = NGX_HTTP_IDEM_AUDIT_CLAIM;
    n = ngx_http_idem_claim_entries(r, ctx, e);
    ctx->audit_attempted = 1;

    if (ctx->conf->wait_replicas) {
        if (ngx_http_idem_audit_direct(ctx->conf->audit, e, n,
                                       r->connection->log)
            == NGX_ERROR)
        {
            ctx->audit_unrecorded = 1;
            return NGX_ERROR;
        }

        return NGX_DECLINED;
    }

    ctx->audit_wait.handler = ngx_http_idem_claim_audit_written;
    ctx->audit_wait.data = ctx;

    if (ngx_http_idem_audit_direct_wait(ctx->conf->audit, e, n,
                                        &ctx->audit_wait, r->connection->log)
        != NGX_OK)
    {
        ctx->audit_unrecorded = 1;
        return NGX_ERROR;
    }

    return NGX_OK;
}


/*
 * idempotency_audit file=: the audit file could not record the claim, so
 * the upstream must not see the request (as Vault refuses a request no
 * audit device records); given back, the key is free for the retry.
 */
static void
ngx_http_idem_claim_unrecorded(ngx_http_request_t *r,
    ngx_http_idem_ctx_t *ctx)
{
    ngx_log_error(NGX_LOG_ALERT, r->connection->log, 0,
                  "idempotency: the audit file could not record the claim "
                  "of key \"%V\"; it is released and answered 503",
                  ngx_http_idem_log_key(ctx));

    ctx->answer = NGX_HTTP_IDEM_ANS_AUDIT_DOWN;
    (void) ngx_http_idem_finish(r, ctx, NGX_HTTP_IDEM_END_RELEASE);
}


/* a claim made: its entries written, or the claim given back */
static ngx_int_t
ngx_http_idem_claim_audit_answered(ngx_http_request_t *r,
    ngx_http_idem_ctx_t *ctx, ngx_http_idem_cmd_t *cmd)
{
    if (ctx->answer != NGX_HTTP_IDEM_ANS_CLAIMED || ctx->conf->audit == NULL) {
        return NGX_DECLINED;
    }

    if (!ctx->conf->audit->on_stream
        && cmd->script != NGX_HTTP_IDEM_SCRIPT_CLAIM
        && ngx_http_idem_claim_native_entries(r, ctx) == NGX_OK)
    {
        return NGX_DONE;    /* until the turn's lines are written */
    }

    if (!ctx->audit_unrecorded) {
        return NGX_DECLINED;
    }

    ngx_http_idem_claim_unrecorded(r, ctx);
    ngx_http_idem_claim_answered(ctx);

    return NGX_DONE;
}


/*
 * On a cluster, the business keys taken and the gate opened: the claim's
 * entries it did not carry, written before the request runs; a file that
 * cannot record them refuses it (everything is given back, 503).
 */
static ngx_int_t
ngx_http_idem_claim_audit_let(ngx_http_request_t *r, ngx_http_idem_ctx_t *ctx)
{
    ngx_uint_t          n;
    idem_audit_entry_t  e[4];

    if (!ctx->audit_later) {
        return NGX_OK;
    }

    ctx->audit_later = 0;
    n = ngx_http_idem_claim_entries(r, ctx, e);
    ctx->audit_attempted = 1;

    if (ngx_http_idem_audit_direct(ctx->conf->audit, e, n,
                                   r->connection->log)
        != NGX_ERROR)
    {
        return NGX_OK;
    }

    ngx_log_error(NGX_LOG_ALERT, r->connection->log, 0,
                  "idempotency: the audit file could not record the claim "
                  "of key \"%V\"; it is given back and answered 503",
                  ngx_http_idem_log_key(ctx));

    ctx->answer = NGX_HTTP_IDEM_ANS_AUDIT_DOWN;

    return NGX_ERROR;
}


/*
 * idempotency_audit's part of a claim's reply (ngx_http_idem_audit_reply):
 * NGX_OK to go on with *reply, NGX_DONE when the reply is dealt with.
 */
static ngx_int_t
ngx_http_idem_claim_audited(ngx_http_idem_cmd_t *cmd, redisReply **reply)
{
    ngx_http_idem_cmd_t  *next;
    ngx_http_idem_ctx_t  *ctx;

    ctx = cmd->data;

    switch (ngx_http_idem_audit_reply(cmd, reply, &next)) {

    case NGX_AGAIN:
        ctx->cmd = next;    /* one nobody waits for is not sent again */
        return NGX_DONE;

    case NGX_DECLINED:
        return NGX_DONE;

    case NGX_ERROR:
        if (ctx) {
            /* nothing was written: the request is answered 503 */
            ctx->cmd = NULL;
            ctx->answer = NGX_HTTP_IDEM_ANS_STORE_DOWN;
            ngx_http_idem_claim_answered(ctx);
        }

        return NGX_DONE;

    case NGX_ABORT:
        if (ctx) {
            ctx->audit_unrecorded = 1;
        }

        /* fall through */

    case NGX_DONE:
        if (ctx) {
            ctx->audit_attempted = !ctx->audit_later;
            ctx->audit_answered = ctx->audit_kind == NGX_HTTP_IDEM_AUDIT_REUSE
                                  || ctx->audit_kind
                                     == NGX_HTTP_IDEM_AUDIT_UNKNOWN
                                  || ctx->confirm
                                     == NGX_HTTP_IDEM_CONFIRM_PROPOSE;
        }

        return NGX_OK;

    default:
        return NGX_OK;
    }
}


static void
ngx_http_idem_claim_audit_done(ngx_http_idem_cmd_t *cmd, redisReply *reply)
{
    ngx_uint_t            appended;
    ngx_http_idem_ctx_t  *ctx;

    ctx = cmd->data;

    if (ngx_http_idem_audit_ctx_reply(cmd, &reply, &appended) == NGX_DONE) {
        return;
    }

    ctx->audit_answered = 1;

    if (appended) {
        ctx->audit_attempted = 1;

    } else {
        /* not in the stream, so not given: nothing was done, retry */
        ctx->answer = NGX_HTTP_IDEM_ANS_STORE_DOWN;
    }

    ngx_http_idem_claim_answered(ctx);
}


/*
 * idempotency_audit: an answer that changed no record (a replay, a
 * conflict, "in progress"...) goes into the stream (append.lua) before it
 * leaves.  NGX_DONE while that is on its way (its reply resumes the
 * request), NGX_DECLINED to answer now.
 */
ngx_int_t
ngx_http_idem_claim_audit_answer(ngx_http_request_t *r,
    ngx_http_idem_ctx_t *ctx)
{
    ngx_str_t             none = ngx_null_string;
    ngx_uint_t            n;
    ngx_http_idem_cmd_t  *cmd;
    idem_audit_entry_t    e[2];

    if (ctx->conf->audit == NULL || ctx->audit_answered) {
        return NGX_DECLINED;
    }

    n = 0;

    if (!ctx->audit_attempted) {
        ngx_http_idem_audit_entry(ctx, IDEM_AUDIT_ATTEMPTED, 0, &e[n++]);
    }

    if (ngx_http_idem_claim_answer_entry(r, ctx, ctx->answer, &e[n]) == 0) {
        return NGX_DECLINED;
    }

    /* a request refused by a lock has no operation (the holder's is not it) */
    e[0].op.len = e[n].op.len;

    /* the audit file alone: written here (or counted), no script to run */
    if (ngx_http_idem_audit_direct(ctx->conf->audit, e, n + 1,
                                   r->connection->log)
        != NGX_DECLINED)
    {
        ctx->audit_attempted = 1;
        ctx->audit_answered = 1;
        return NGX_DECLINED;
    }

    cmd = ngx_http_idem_audit_cmd(ctx->conf->audit,
                                  NGX_HTTP_IDEM_SCRIPT_APPEND, ctx->rkey,
                                  NULL, 0, 0, &none, e, n + 1,
                                  r->connection->log);

    if (cmd == NULL
        || ngx_http_idem_cmd_send(cmd, ngx_http_idem_claim_audit_done, ctx)
           != NGX_OK)
    {
        ctx->answer = NGX_HTTP_IDEM_ANS_STORE_DOWN;
        ctx->audit_answered = 1;
        return NGX_DECLINED;
    }

    ctx->cmd = cmd;
    ctx->phase = NGX_HTTP_IDEM_CLAIMING;

    return NGX_DONE;
}


ngx_http_idem_claim_part_t  ngx_http_idem_claim_audit = {
    ngx_http_idem_claim_audit_prepare,      /* prepare */
    ngx_http_idem_claim_audit_look,         /* look */
    NULL,                                   /* scripted */
    NULL,                                   /* keys */
    ngx_http_idem_claim_audit_create,       /* create */
    NULL,                                   /* args */
    NULL,                                   /* value */
    ngx_http_idem_claim_audited,            /* reply */
    ngx_http_idem_claim_audit_parse,        /* parse */
    NULL,                                   /* decoded */
    NULL,                                   /* held */
    ngx_http_idem_claim_audit_answered,     /* answered */
    ngx_http_idem_claim_audit_let           /* let */
};
