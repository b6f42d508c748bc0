/*
 * The claim: take (scope, key) for this attempt, or learn what holds it.
 *
 * The first look is one native command, SET key value NX PX ttl GET: it
 * claims a free key, or returns the record that holds it, which answers a
 * replay, a conflict or an unknown outcome by itself.  Only what needs a
 * decision inside Redis goes on to claim.lua: a claim in flight (its lease
 * is measured by Redis's clock), a marker left by a released attempt, a
 * record of layout 1, or an error of the first look.  Duplicates that
 * wait look through claim.lua at once.
 *
 * A claim whose answer never came, or came for a request that has gone,
 * is given back so that the key is not blocked.
 *
 * With idempotency_audit every change of the record is made by claim.lua
 * together with its entries (redis-scripts/audit.lua), so the first look
 * is a plain GET: a free key is then claimed by claim.lua with the
 * entries of this attempt's claim; a record that answers by itself (a
 * replay, a conflict) is answered, after its entries are appended
 * (append.lua); anything else goes to claim.lua, which says what it would
 * do, and is called again with the entries of that.
 */

#include <ngx_config.h>
#include <ngx_core.h>
#include <openssl/rand.h>

#include "ngx_http_idempotency.h"
#include "ngx_http_idempotency_bkeys.h"


static void ngx_http_idem_claim_done(ngx_http_idem_cmd_t *cmd,
    redisReply *reply);


/* SET key value NX PX ttl GET: its arguments after the key, by name */
enum {
    NGX_HTTP_IDEM_SET_VALUE = 0,
    NGX_HTTP_IDEM_SET_NX,
    NGX_HTTP_IDEM_SET_PX,
    NGX_HTTP_IDEM_SET_TTL,
    NGX_HTTP_IDEM_SET_GET,
    NGX_HTTP_IDEM_SET_NARGS
};

static ngx_str_t  ngx_http_idem_set = ngx_string("SET");
static ngx_str_t  ngx_http_idem_get = ngx_string("GET");


/*
 * Random bytes from a per-worker reserve filled by RAND_bytes() 4 KiB at
 * a time: every RAND_bytes() call runs OpenSSL's DRBG set-up and a getpid()
 * fork check, 7k instructions for 32 bytes (bench/RESULTS.md).  The reserve
 * is refilled when it runs out or when the process is not the one that
 * filled it (ngx_pid is set after fork), and used bytes are wiped.
 */
#define NGX_HTTP_IDEM_RANDOM_RESERVE  4096

static u_char *
ngx_http_idem_random(size_t n)
{
    static u_char     reserve[NGX_HTTP_IDEM_RANDOM_RESERVE];
    static size_t     left;
    static ngx_pid_t  filled_by;

    if (left < n || filled_by != ngx_pid) {
        if (RAND_bytes(reserve, sizeof(reserve)) != 1) {
            left = 0;
            return NULL;
        }

        left = sizeof(reserve);
        filled_by = ngx_pid;
    }

    left -= n;

    return reserve + left;
}


/* the operation id and the owner token */
ngx_int_t
ngx_http_idem_tokens(ngx_http_request_t *r, ngx_http_idem_ctx_t *ctx)
{
    u_char  *raw;

    ctx->op_id.data = ngx_pnalloc(r->pool, NGX_HTTP_IDEM_TOKEN_HEX);
    if (ctx->op_id.data == NULL) {
        return NGX_ERROR;
    }

    raw = ngx_http_idem_random(NGX_HTTP_IDEM_TOKEN_HEX);
    if (raw == NULL) {
        return NGX_ERROR;
    }

    ngx_hex_dump(ctx->op_id.data, raw, NGX_HTTP_IDEM_TOKEN_HEX / 2);
    ngx_hex_dump(ctx->owner, raw + NGX_HTTP_IDEM_TOKEN_HEX / 2,
                 NGX_HTTP_IDEM_TOKEN_HEX / 2);
    ngx_explicit_memzero(raw, NGX_HTTP_IDEM_TOKEN_HEX);
    ctx->op_id.len = NGX_HTTP_IDEM_TOKEN_HEX;

    return NGX_OK;
}


static void ngx_http_idem_claim_index(ngx_http_request_t *r,
    ngx_http_idem_ctx_t *ctx, int64_t ttl);


/* the record's TTL: a proposal lives for idempotency_confirm_ttl */
static int64_t
ngx_http_idem_claim_ttl(ngx_http_idem_ctx_t *ctx)
{
    return (int64_t) (ctx->confirm == NGX_HTTP_IDEM_CONFIRM_PROPOSE
                      ? ctx->conf->confirm_ttl : ctx->conf->ttl) * 1000;
}


/*
 * The in_progress record of this attempt, written at p; or, when the
 * request needs an approval it does not carry, its proposal: a record
 * awaiting confirmation, which has no owner since nothing runs.
 */
static u_char *
ngx_http_idem_claim_value(u_char *p, ngx_http_idem_ctx_t *ctx)
{
    idem_value_t  v;

    ngx_memzero(&v, sizeof(idem_value_t));

    v.state = 'i';
    v.op = (const char *) ctx->op_id.data;
    v.fp = (const char *) ctx->fingerprint;
    v.owner = (const char *) ctx->owner;
    v.created = ctx->created;
    v.lease_ms = ctx->conf->lease;
    v.ttl_ms = ngx_http_idem_claim_ttl(ctx);

    if (ctx->confirm == NGX_HTTP_IDEM_CONFIRM_PROPOSE) {
        v.state = 'a';
        v.owner = NULL;
        v.expires = ctx->created + v.ttl_ms;
    }

    return (u_char *) idem_value_encode((char *) p, &v);
}


/* the in_progress value is at most this long: its head and 3 numbers */
#define NGX_HTTP_IDEM_CLAIM_VALUE_MAX  (IDEM_HEAD_LEN + 3 * (2 + 2 * 19))


static ngx_http_idem_cmd_t *
ngx_http_idem_claim_set_cmd(ngx_http_request_t *r, ngx_http_idem_ctx_t *ctx)
{
    u_char               *p;
    ngx_http_idem_cmd_t  *cmd;

    cmd = ngx_http_idem_cmd_native(ctx->conf->redis, &ngx_http_idem_set,
                                   NGX_HTTP_IDEM_SET_NARGS, ctx->rkey,
                                   NGX_HTTP_IDEM_CLAIM_VALUE_MAX
                                   + NGX_INT64_LEN + 8,
                                   r->connection->log);
    if (cmd == NULL) {
        return NULL;
    }

    p = ngx_http_idem_cmd_start(cmd, NGX_HTTP_IDEM_SET_VALUE);
    ngx_http_idem_cmd_end(cmd, NGX_HTTP_IDEM_SET_VALUE,
                          ngx_http_idem_claim_value(p, ctx));
    ngx_http_idem_cmd_set(cmd, NGX_HTTP_IDEM_SET_NX, "NX", 2);
    ngx_http_idem_cmd_set(cmd, NGX_HTTP_IDEM_SET_PX, "PX", 2);
    ngx_http_idem_cmd_set_num(cmd, NGX_HTTP_IDEM_SET_TTL,
                              ngx_http_idem_claim_ttl(ctx));
    ngx_http_idem_cmd_set(cmd, NGX_HTTP_IDEM_SET_GET, "GET", 3);

    return cmd;
}


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


/* with idempotency_audit: the command carries the entries of ctx->audit_kind */
static ngx_http_idem_cmd_t *
ngx_http_idem_claim_create(ngx_http_request_t *r, ngx_http_idem_ctx_t *ctx,
    size_t size)
{
    u_char               *keys[NGX_HTTP_IDEM_BUSINESS_KEYS];
    ngx_uint_t            n;
    idem_audit_entry_t    e[4];

    n = ngx_http_idem_business_args(ctx, keys);

    if (ctx->conf->audit == NULL) {
        return ngx_http_idem_cmd_create_keys(ctx->conf->redis,
                                             NGX_HTTP_IDEM_SCRIPT_CLAIM,
                                             ctx->rkey, keys, n, size,
                                             r->connection->log);
    }

    return ngx_http_idem_audit_cmd(ctx->conf->audit,
                                   NGX_HTTP_IDEM_SCRIPT_CLAIM, ctx->rkey,
                                   keys, n, size, &ctx->audit_expect, e,
                                   ngx_http_idem_claim_entries(r, ctx, e),
                                   r->connection->log);
}


static ngx_http_idem_cmd_t *
ngx_http_idem_claim_script_cmd(ngx_http_request_t *r,
    ngx_http_idem_ctx_t *ctx)
{
    u_char                    *p;
    ngx_http_idem_cmd_t       *cmd;
    ngx_http_idem_loc_conf_t  *lcf;

    lcf = ctx->conf;

    cmd = ngx_http_idem_claim_create(r, ctx, IDEM_FP_HEX_LEN
                                             + 2 * NGX_HTTP_IDEM_TOKEN_HEX
                                             + NGX_HTTP_IDEM_CLAIM_VALUE_MAX
                                             + NGX_INT64_LEN + 2
                                             + 2 * IDEM_RECORD_KEY_LEN);
    if (cmd == NULL) {
        return NULL;
    }

    ngx_http_idem_cmd_set(cmd, NGX_HTTP_IDEM_CLAIM_FP, ctx->fingerprint,
                          IDEM_FP_HEX_LEN);
    ngx_http_idem_cmd_set(cmd, NGX_HTTP_IDEM_CLAIM_OWNER, ctx->owner,
                          NGX_HTTP_IDEM_TOKEN_HEX);
    p = ngx_http_idem_cmd_start(cmd, NGX_HTTP_IDEM_CLAIM_VALUE);
    ngx_http_idem_cmd_end(cmd, NGX_HTTP_IDEM_CLAIM_VALUE,
                          ngx_http_idem_claim_value(p, ctx));
    ngx_http_idem_cmd_set_num(cmd, NGX_HTTP_IDEM_CLAIM_TTL,
                              ngx_http_idem_claim_ttl(ctx));
    ngx_http_idem_cmd_set(cmd, NGX_HTTP_IDEM_CLAIM_WAIT,
                          lcf->wait ? "1" : "0", 1);
    ngx_http_idem_cmd_set(cmd, NGX_HTTP_IDEM_CLAIM_WAITED, ctx->waited_op,
                          ctx->waited ? NGX_HTTP_IDEM_TOKEN_HEX : 0);
    ngx_http_idem_cmd_set(cmd, NGX_HTTP_IDEM_CLAIM_APPROVED,
                          ctx->confirm == NGX_HTTP_IDEM_CONFIRM_APPROVED
                          ? "1" : "0", 1);
    ngx_http_idem_cmd_set(cmd, NGX_HTTP_IDEM_CLAIM_SCOPE, ctx->stag,
                          ngx_strlen(ctx->stag));
    ngx_http_idem_cmd_set(cmd, NGX_HTTP_IDEM_CLAIM_LOC, lcf->loc_tag,
                          ctx->ukey[0] ? ngx_strlen(lcf->loc_tag) : 0);

    return cmd;
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


static ngx_int_t
ngx_http_idem_claim_go(ngx_http_request_t *r, ngx_http_idem_ctx_t *ctx,
    ngx_uint_t script)
{
    ngx_http_idem_cmd_t  *cmd;

    if (script) {
        cmd = ngx_http_idem_claim_script_cmd(r, ctx);

    } else if (ctx->conf->audit && !ngx_http_idem_claim_native_file(ctx)) {
        /* the first look changes nothing: claim.lua does, with entries */
        cmd = ngx_http_idem_cmd_native(ctx->conf->redis, &ngx_http_idem_get,
                                       0, ctx->rkey, 0, r->connection->log);

    } else {
        cmd = ngx_http_idem_claim_set_cmd(r, ctx);
    }

    if (cmd == NULL
        || ngx_http_idem_cmd_send(cmd, ngx_http_idem_claim_done, ctx)
           != NGX_OK)
    {
        return NGX_ERROR;
    }

    ctx->cmd = cmd;

    return NGX_OK;
}


/*
 * NGX_OK: the claim is on its way and its answer resumes the request.
 * NGX_ERROR: Redis cannot be reached; the answer is "store down" already.
 * Every attempt has tokens of its own, so a claim given up on can never
 * be mistaken for a later one.
 */
ngx_int_t
ngx_http_idem_claim_send(ngx_http_request_t *r, ngx_http_idem_ctx_t *ctx)
{
    ctx->phase = NGX_HTTP_IDEM_CLAIMING;

    if (ngx_http_idem_tokens(r, ctx) == NGX_OK
        && ngx_http_idem_business_keys(r, ctx) == NGX_OK
        && (ctx->conf->audit == NULL
            || ngx_http_idem_audit_prepare(r, ctx) == NGX_OK))
    {
        ctx->created = ngx_http_idem_now_ms();

        /*
         * SET NX cannot look at a business identity or a lock: with one
         * of them the first look is claim.lua's (with the audit it is a
         * GET, which looks at nothing else)
         */
        if (ngx_http_idem_claim_go(r, ctx, ctx->conf->audit == NULL
                                           && (ctx->waiting || ctx->ukey[0]
                                               || ctx->lkey[0]))
            == NGX_OK)
        {
            return NGX_OK;
        }
    }

    ctx->answer = NGX_HTTP_IDEM_ANS_STORE_DOWN;
    ctx->phase = NGX_HTTP_IDEM_ANSWERED;

    return NGX_ERROR;
}


static void
ngx_http_idem_set_state(ngx_http_idem_ctx_t *ctx, char state)
{
    const char  *name;

    name = idem_state_name(state);
    ctx->state.data = (u_char *) name;
    ctx->state.len = ngx_strlen(name);
}


/* the operation the request met, copied out of the reply */
static ngx_int_t
ngx_http_idem_claim_op(ngx_http_request_t *r, ngx_http_idem_ctx_t *ctx,
    const char *id)
{
    u_char  *op;

    op = ngx_pnalloc(r->pool, NGX_HTTP_IDEM_TOKEN_HEX);
    if (op == NULL) {
        return NGX_ERROR;
    }

    ngx_memcpy(op, id, NGX_HTTP_IDEM_TOKEN_HEX);
    ctx->op_id.data = op;
    ctx->op_id.len = NGX_HTTP_IDEM_TOKEN_HEX;

    return NGX_OK;
}


/* the record that holds the key, copied out of the reply */
static ngx_int_t
ngx_http_idem_claim_record(ngx_http_request_t *r, ngx_http_idem_ctx_t *ctx,
    idem_value_t *v)
{
    if (ngx_http_idem_claim_op(r, ctx, v->op) != NGX_OK) {
        return NGX_ERROR;
    }

    ngx_http_idem_set_state(ctx, v->state);

    if (v->state != 'c') {
        return NGX_OK;
    }

    ctx->stored_status = v->status;
    ctx->body_stored = v->stored;

    /* the replay sends them from the pool: the reply is freed after this */
    ctx->stored_headers.data = ngx_pnalloc(r->pool, v->hdr_len + v->body_len
                                                    + 1);
    if (ctx->stored_headers.data == NULL) {
        return NGX_ERROR;
    }

    ctx->stored_headers.len = v->hdr_len;
    ctx->stored_body.data = ngx_cpymem(ctx->stored_headers.data, v->hdr,
                                       v->hdr_len);
    ctx->stored_body.len = v->body_len;
    ngx_memcpy(ctx->stored_body.data, v->body, v->body_len);

    return NGX_OK;
}


/* a recorded approval: the request is claimed as its approver's */
static ngx_int_t
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
    int64_t  left;

    ctx->proposal_expires = v->expires;

    if (ctx->confirm == NGX_HTTP_IDEM_CONFIRM_APPROVED) {
        return NGX_HTTP_IDEM_ANS_NONE;
    }

    if (v->state == 'a') {
        /*
         * The proposal sent again: its operation-id index may have been
         * evicted, and without it the approval endpoint cannot find the
         * operation until the proposal expires.  Written again, for the
         * proposal's life left.
         */
        left = v->expires - ngx_http_idem_now_ms();

        if (left > 0) {
            ngx_http_idem_claim_index(r, ctx, left);
        }

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
 * What a record that holds the key means for this request: NONE when only
 * claim.lua can tell (a claim in flight, a marker, an approved proposal).
 * A claim seen by the first look ("look") may have its completion beside
 * it (idempotency_complete_beside), which only claim.lua reads: a changed
 * request is then told the state the key is really in.
 */
static ngx_http_idem_answer_e
ngx_http_idem_claim_held(ngx_http_request_t *r, ngx_http_idem_ctx_t *ctx,
    idem_value_t *v, ngx_uint_t look)
{
    ngx_uint_t  same;

    if (v->state == 'r') {
        return NGX_HTTP_IDEM_ANS_NONE;
    }

    /* an alias (idempotency_unique) answers what the operation it names does */
    if (v->state == 's'
        && ngx_memcmp(v->fp, ctx->fingerprint, IDEM_FP_HEX_LEN) == 0)
    {
        return NGX_HTTP_IDEM_ANS_NONE;
    }

    same = ngx_memcmp(v->fp, ctx->fingerprint, IDEM_FP_HEX_LEN) == 0;

    if (v->state == 'i' && (same || look)) {
        return NGX_HTTP_IDEM_ANS_NONE;
    }

    if (ngx_http_idem_claim_record(r, ctx, v) != NGX_OK) {
        return NGX_HTTP_IDEM_ANS_STORE_ERROR;
    }

    /* a person said no to what this key proposed: no request of it runs */
    if (v->state == 'd') {
        return NGX_HTTP_IDEM_ANS_DECLINED;
    }

    if (!same) {
        return NGX_HTTP_IDEM_ANS_MISMATCH;
    }

    if (v->state == 'a' || v->state == 'p') {
        return ngx_http_idem_claim_proposal(r, ctx, v);
    }

    return v->state == 'c' ? NGX_HTTP_IDEM_ANS_COMPLETED
                           : NGX_HTTP_IDEM_ANS_UNKNOWN;
}


/*
 * The operation id of a new proposal names its record for the approval
 * endpoint (idempotency_approve), which is given the id and not the key:
 * SET <IDEM_OPERATION_PREFIX><op id>} <record key><proposal> PX <proposal
 * TTL>, the proposal as the 428 shows it (JSON, at most
 * NGX_HTTP_IDEM_PROPOSAL_MAX bytes; a larger one is not kept, and the
 * approval page and idempotency-approve then refuse to show it).  It is
 * sent before the 428 leaves, so Redis has it before anybody can read the
 * id; if it fails, the approval endpoint answers 404 and a signed
 * approval still works.
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


static void
ngx_http_idem_claim_index(ngx_http_request_t *r, ngx_http_idem_ctx_t *ctx,
    int64_t ttl)
{
    u_char               *key, *p;
    size_t                len;
    ngx_http_idem_cmd_t  *cmd;

    key = ngx_http_idem_operation_key(r->pool, &ctx->op_id);
    if (key == NULL) {
        return;
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
        return;
    }

    p = ngx_http_idem_cmd_start(cmd, NGX_HTTP_IDEM_INDEX_VALUE);
    p = ngx_cpymem(p, ctx->rkey, len);

    if (ctx->proposal.len) {
        p = ngx_cpymem(p, ctx->proposal.data, ctx->proposal.len);
    }

    ngx_http_idem_cmd_end(cmd, NGX_HTTP_IDEM_INDEX_VALUE, p);
    ngx_http_idem_cmd_set(cmd, NGX_HTTP_IDEM_INDEX_PX, "PX", 2);
    ngx_http_idem_cmd_set_num(cmd, NGX_HTTP_IDEM_INDEX_TTL, ttl);

    (void) ngx_http_idem_cmd_send(cmd, NULL, NULL);
}


/*
 * idempotency_unique: the operation of another key holds the request's
 * business identity; its answer is this request's, under its id.
 */
static ngx_http_idem_answer_e
ngx_http_idem_claim_reused(ngx_http_request_t *r, ngx_http_idem_ctx_t *ctx,
    idem_claim_t *c)
{
    if (ngx_http_idem_claim_record(r, ctx, &c->rec) != NGX_OK) {
        return NGX_HTTP_IDEM_ANS_STORE_ERROR;
    }

    ctx->reused = 1;
    ngx_str_set(&ctx->problem_extra, ",\"reused\":true");

    switch (c->rec.state) {

    case 'c':
        return NGX_HTTP_IDEM_ANS_REUSED;

    case 'i':
        ctx->lease_left = (ngx_msec_t) c->lease_left;
        return NGX_HTTP_IDEM_ANS_IN_PROGRESS;

    default: /* 'u' */
        return NGX_HTTP_IDEM_ANS_UNKNOWN;
    }
}


/*
 * idempotency_lock: another operation holds the lock; nothing was
 * written.  Its id is told only to a request of its own scope.
 */
static ngx_http_idem_answer_e
ngx_http_idem_claim_locked(ngx_http_request_t *r, ngx_http_idem_ctx_t *ctx,
    idem_claim_t *c)
{
    ngx_str_null(&ctx->op_id);

    /* in flight: as soon as it may end; unknown: an operator resolves it */
    ctx->retry_after = c->lease_left ? 1 : 60;

    if (c->op && ngx_http_idem_claim_op(r, ctx, c->op) != NGX_OK) {
        return NGX_HTTP_IDEM_ANS_STORE_ERROR;
    }

    return NGX_HTTP_IDEM_ANS_LOCKED;
}


/* the key was free: this request's claim, or its proposal's record */
static ngx_http_idem_answer_e
ngx_http_idem_claim_claimed(ngx_http_request_t *r, ngx_http_idem_ctx_t *ctx,
    idem_claim_t *c)
{
    if (ctx->confirm == NGX_HTTP_IDEM_CONFIRM_PROPOSE) {
        /* what was written is the proposal: nothing may run */
        ngx_http_idem_set_state(ctx, 'a');
        ctx->proposal_expires = ctx->created + ngx_http_idem_claim_ttl(ctx);
        ngx_http_idem_claim_index(r, ctx, ngx_http_idem_claim_ttl(ctx));
        ngx_http_idem_claim_pending(r, ctx);
        return NGX_HTTP_IDEM_ANS_CONFIRM;
    }

    /* a proposal claimed by claim.lua first: its operation now */
    if (c->op && ngx_http_idem_claim_took(r, ctx, c) != NGX_OK) {
        return NGX_HTTP_IDEM_ANS_STORE_ERROR;
    }

    ngx_http_idem_set_state(ctx, 'i');
    return NGX_HTTP_IDEM_ANS_CLAIMED;
}


static ngx_http_idem_answer_e
ngx_http_idem_claim_decoded(ngx_http_request_t *r, ngx_http_idem_ctx_t *ctx,
    idem_claim_t *c, ngx_uint_t script)
{
    ngx_http_idem_answer_e  answer;

    switch (c->kind) {

    case IDEM_CLAIM_CLAIMED:
        return ngx_http_idem_claim_claimed(r, ctx, c);

    case IDEM_CLAIM_RECORD:
        answer = ngx_http_idem_claim_held(r, ctx, &c->rec, !script);

        /*
         * claim.lua decides in flight claims and markers itself; only a
         * recorded approval it found for a caller that sent a proposal
         * (a duplicate that waited) is claimed once more, with a claim.
         */
        if (answer == NGX_HTTP_IDEM_ANS_NONE && script) {
            if (c->rec.state != 'p' || ctx->reclaimed) {
                return NGX_HTTP_IDEM_ANS_STORE_ERROR;
            }

            ctx->reclaimed = 1;
        }

        return answer;

    case IDEM_CLAIM_IN_PROGRESS:
        if (ngx_http_idem_claim_record(r, ctx, &c->rec) != NGX_OK) {
            return NGX_HTTP_IDEM_ANS_STORE_ERROR;
        }

        ngx_memcpy(ctx->waited_op, c->rec.op, NGX_HTTP_IDEM_TOKEN_HEX);
        ctx->waited = 1;
        ctx->lease_left = (ngx_msec_t) c->lease_left;
        return NGX_HTTP_IDEM_ANS_IN_PROGRESS;

    case IDEM_CLAIM_REUSED:
        return ngx_http_idem_claim_reused(r, ctx, c);

    case IDEM_CLAIM_LOCKED:
        return ngx_http_idem_claim_locked(r, ctx, c);

    case IDEM_CLAIM_ELSEWHERE:
        /* the holder is another location's: its id is not this request's */
        ngx_str_null(&ctx->op_id);
        return NGX_HTTP_IDEM_ANS_ELSEWHERE;

    case IDEM_CLAIM_RELEASED:
        if (ngx_http_idem_claim_record(r, ctx, &c->rec) != NGX_OK) {
            return NGX_HTTP_IDEM_ANS_STORE_ERROR;
        }

        ctx->stored_status = c->rec.status;
        ctx->retry_after = c->rec.retry_after;
        return NGX_HTTP_IDEM_ANS_RELEASED;

    default:
        ngx_log_error(NGX_LOG_ERR, r->connection->log, 0,
                      "idempotency: redis holds a value under key \"%V\"'s "
                      "record that is not a record of this module",
                      ngx_http_idem_log_key(ctx));
        return NGX_HTTP_IDEM_ANS_STORE_ERROR;
    }
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


/* the claim's reply: NONE when claim.lua must look next */
static ngx_http_idem_answer_e
ngx_http_idem_claim_parse(ngx_http_request_t *r, ngx_http_idem_ctx_t *ctx,
    ngx_http_idem_cmd_t *cmd, redisReply *reply)
{
    size_t                  n;
    ngx_uint_t              script;
    idem_rv_t               el[IDEM_CLAIM_ELEMS];
    idem_claim_t            c;
    ngx_http_idem_answer_e  answer;

    script = (cmd->script == NGX_HTTP_IDEM_SCRIPT_CLAIM);

    if (reply == NULL) {
        return NGX_HTTP_IDEM_ANS_STORE_DOWN;
    }

    /* a native claim made (the audit file alone) is decoded as without */
    if (ctx->conf->audit && !script
        && !(reply->type == REDIS_REPLY_NIL
             && cmd->argc == cmd->arg0 + NGX_HTTP_IDEM_SET_NARGS))
    {
        return ngx_http_idem_claim_looked(r, ctx, reply);
    }

    if (ctx->conf->audit && reply->type == REDIS_REPLY_ARRAY
        && reply->elements > 0
        && reply->element[0]->type == REDIS_REPLY_STRING
        && reply->element[0]->len == 12
        && ngx_strncmp(reply->element[0]->str, "audit-decide", 12) == 0)
    {
        return ngx_http_idem_claim_decide(r, ctx, reply);
    }

    if (reply->type == REDIS_REPLY_ERROR) {
        if (!script) {
            return NGX_HTTP_IDEM_ANS_NONE;  /* layout 1, OOM: claim.lua */
        }

        ngx_log_error(NGX_LOG_ERR, r->connection->log, 0,
                      "idempotency: claim failed: %*s",
                      (size_t) reply->len, reply->str);

        return ngx_http_idem_reply_corrupt(reply)
               ? NGX_HTTP_IDEM_ANS_STORE_ERROR
               : NGX_HTTP_IDEM_ANS_STORE_DOWN;
    }

    if (!script && (reply->type == REDIS_REPLY_NIL
                    || reply->type == REDIS_REPLY_STRING))
    {
        idem_claim_set_decode(reply->type == REDIS_REPLY_NIL
                              ? NULL : reply->str, reply->len, &c);

    } else if (script && reply->type == REDIS_REPLY_ARRAY) {
        n = ngx_http_idem_reply_elements(reply, el, IDEM_CLAIM_ELEMS);
        idem_claim_decode(el, n, &c);

    } else {
        c.kind = IDEM_CLAIM_INVALID;
    }

    answer = ngx_http_idem_claim_decoded(r, ctx, &c, script);

    if (answer == NGX_HTTP_IDEM_ANS_NONE && ctx->conf->audit) {
        /* a recorded approval to claim again: claim.lua decides first */
        ngx_str_set(&ctx->audit_expect, "-");
        ctx->audit_kind = NGX_HTTP_IDEM_AUDIT_DECIDE;
    }

    return answer;
}


/*
 * A reply in claim.lua's words, from the second step on a cluster
 * (redis-scripts/business_holder.lua): the answer it gives the request.
 */
ngx_http_idem_answer_e
ngx_http_idem_claim_reply_answer(ngx_http_request_t *r,
    ngx_http_idem_ctx_t *ctx, redisReply *reply)
{
    size_t        n;
    idem_rv_t     el[IDEM_CLAIM_ELEMS];
    idem_claim_t  c;

    n = ngx_http_idem_reply_elements(reply, el, IDEM_CLAIM_ELEMS);
    idem_claim_decode(el, n, &c);

    return ngx_http_idem_claim_decoded(r, ctx, &c, 1);
}


/* whether the claim may have taken the key: no reply, or "claimed" */
static ngx_uint_t
ngx_http_idem_claim_made(ngx_http_idem_cmd_t *cmd, redisReply *reply)
{
    size_t        n;
    idem_rv_t     el[IDEM_CLAIM_ELEMS];
    idem_claim_t  c;

    if (cmd->script != NGX_HTTP_IDEM_SCRIPT_CLAIM
        && cmd->argc != cmd->arg0 + NGX_HTTP_IDEM_SET_NARGS)
    {
        return 0;   /* idempotency_audit's first look: a GET */
    }

    if (reply == NULL) {
        return 1;
    }

    if (cmd->script != NGX_HTTP_IDEM_SCRIPT_CLAIM) {
        return reply->type == REDIS_REPLY_NIL;
    }

    if (reply->type != REDIS_REPLY_ARRAY) {
        return 0;
    }

    n = ngx_http_idem_reply_elements(reply, el, IDEM_CLAIM_ELEMS);

    return idem_claim_decode(el, n, &c) == IDEM_CLAIM_CLAIMED;
}


/*
 * A claim that may have been made for nobody: no answer came (it may have
 * run, or may run yet), or it was made after its request had gone.  Either
 * way the key is given back, fenced by the claim's owner token.
 */
static void
ngx_http_idem_claim_orphan(ngx_http_idem_cmd_t *cmd, redisReply *reply)
{
    ngx_str_t  key, value;

    if (!ngx_http_idem_claim_made(cmd, reply)) {
        return;
    }

    key = ngx_http_idem_cmd_key(cmd);
    value = ngx_http_idem_cmd_get(cmd,
                                  cmd->script == NGX_HTTP_IDEM_SCRIPT_CLAIM
                                  ? NGX_HTTP_IDEM_CLAIM_VALUE
                                  : NGX_HTTP_IDEM_SET_VALUE);

    /* a proposal blocks nothing that an approval does not unblock */
    if (value.len > 1 && value.data[1] == 'a') {
        return;
    }

    ngx_http_idem_give_back(cmd, &key, &value);
}


/*
 * Resume a request that waited for Redis, from outside the phase engine
 * (r may be freed inside).
 */
void
ngx_http_idem_resume(ngx_http_idem_ctx_t *ctx)
{
    ngx_connection_t    *c;
    ngx_http_request_t  *r;

    r = ctx->request;
    c = r->connection;

    ngx_http_core_run_phases(r);
    ngx_http_run_posted_requests(c);
}


static void
ngx_http_idem_claim_resumed(ngx_http_idem_ctx_t *ctx)
{
    ctx->phase = NGX_HTTP_IDEM_ANSWERED;
    ngx_http_idem_resume(ctx);
}


/* the request goes on with the claim's answer */
static void
ngx_http_idem_claim_answered(ngx_http_idem_ctx_t *ctx)
{
    /*
     * THE dispatch to the second step of a claim on a Redis Cluster: the
     * business keys (idempotency_unique, _lock), each in its own slot,
     * once the record is claimed (ngx_http_idempotency_bkeys.c).  One
     * server and Sentinel took them inside claim.lua and go on.
     */
    if (ngx_http_idem_bkeys_start(ctx, ngx_http_idem_claim_reply_answer,
                                  ngx_http_idem_claim_resumed)
        == NGX_OK)
    {
        return;
    }

    ngx_http_idem_claim_resumed(ctx);
}


/*
 * A claim that the replicas did not have in time is given up before the
 * upstream sees anything: after a failover it could be lost, and the key
 * executed twice.  Released, the key is free for the client's retry.
 */
static void
ngx_http_idem_claim_unreplicated(ngx_http_request_t *r,
    ngx_http_idem_ctx_t *ctx, ngx_int_t acked)
{
    if (acked < 0) {
        ngx_log_error(NGX_LOG_WARN, r->connection->log, 0,
                      "idempotency: no WAIT answer for the claim of key "
                      "\"%V\" (the redis connection failed or changed); "
                      "it is released and answered 503", &ctx->key);
    } else {
        ngx_log_error(NGX_LOG_WARN, r->connection->log, 0,
                      "idempotency: the claim of key \"%V\" reached %i of "
                      "%ui replicas within %Mms; it is released and "
                      "answered 503", ngx_http_idem_log_key(ctx), acked,
                      ctx->conf->wait_replicas,
                      ctx->conf->wait_replicas_timeout);
    }

    ctx->answer = NGX_HTTP_IDEM_ANS_NOT_REPLICATED;
    (void) ngx_http_idem_finish(r, ctx, NGX_HTTP_IDEM_END_RELEASE);
}


/* a native claim made with the audit file alone: its entries, now */
static void
ngx_http_idem_claim_native_entries(ngx_http_request_t *r,
    ngx_http_idem_ctx_t *ctx)
{
    ngx_uint_t          n;
    idem_audit_entry_t  e[4];

    ctx->audit_kind = NGX_HTTP_IDEM_AUDIT_CLAIM;
    n = ngx_http_idem_claim_entries(r, ctx, e);

    if (ngx_http_idem_audit_direct(ctx->conf->audit, e, n,
                                   r->connection->log)
        == NGX_ERROR)
    {
        ctx->audit_unrecorded = 1;
    }

    ctx->audit_attempted = 1;
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
                  &ctx->key);

    ctx->answer = NGX_HTTP_IDEM_ANS_AUDIT_DOWN;
    (void) ngx_http_idem_finish(r, ctx, NGX_HTTP_IDEM_END_RELEASE);
}


static void
ngx_http_idem_claim_replicated(ngx_http_idem_replicas_t *w, ngx_int_t acked)
{
    ngx_http_idem_ctx_t  *ctx = w->data;

    if (acked < (ngx_int_t) ctx->conf->wait_replicas) {
        ngx_http_idem_claim_unreplicated(ctx->request, ctx, acked);
    }

    ngx_http_idem_claim_answered(ctx);
}


/* NGX_OK: the answer waits for WAIT (idempotency_redis_wait) */
static ngx_int_t
ngx_http_idem_claim_replicate(ngx_http_request_t *r, ngx_http_idem_ctx_t *ctx)
{
    if (ctx->answer != NGX_HTTP_IDEM_ANS_CLAIMED
        || ctx->conf->wait_replicas == 0)
    {
        return NGX_DECLINED;
    }

    ctx->replicas.handler = ngx_http_idem_claim_replicated;
    ctx->replicas.data = ctx;

    if (ngx_http_idem_replicas_wait(ctx->conf->redis, &ctx->replicas,
                                    ctx->conf->wait_replicas,
                                    ctx->conf->wait_replicas_timeout)
        == NGX_OK)
    {
        return NGX_OK;
    }

    ngx_http_idem_claim_unreplicated(r, ctx, -1);

    return NGX_DECLINED;
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
            ctx->audit_attempted = 1;
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
ngx_http_idem_claim_done(ngx_http_idem_cmd_t *cmd, redisReply *reply)
{
    ngx_http_request_t   *r;
    ngx_http_idem_ctx_t  *ctx;

    if (ngx_http_idem_claim_audited(cmd, &reply) == NGX_DONE) {
        return;
    }

    ctx = cmd->data;

    if (ctx == NULL || reply == NULL) {
        ngx_http_idem_claim_orphan(cmd, reply);

        if (ctx == NULL) {
            return;
        }
    }

    ctx->cmd = NULL;
    r = ctx->request;

    ngx_str_null(&ctx->state);

    ctx->answer = ngx_http_idem_claim_parse(r, ctx, cmd, reply);

    if (ctx->answer == NGX_HTTP_IDEM_ANS_CLAIMED && ctx->conf->audit
        && !ctx->conf->audit->on_stream
        && cmd->script != NGX_HTTP_IDEM_SCRIPT_CLAIM)
    {
        ngx_http_idem_claim_native_entries(r, ctx);
    }

    if (ctx->answer == NGX_HTTP_IDEM_ANS_CLAIMED && ctx->audit_unrecorded) {
        ngx_http_idem_claim_unrecorded(r, ctx);
        ngx_http_idem_claim_answered(ctx);
        return;
    }

    if (ctx->answer == NGX_HTTP_IDEM_ANS_NONE) {
        if (ngx_http_idem_claim_go(r, ctx, 1) == NGX_OK) {
            return;
        }

        ctx->answer = NGX_HTTP_IDEM_ANS_STORE_DOWN;
    }

    if (ngx_http_idem_claim_replicate(r, ctx) == NGX_OK) {
        return;
    }

    ngx_http_idem_claim_answered(ctx);
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
