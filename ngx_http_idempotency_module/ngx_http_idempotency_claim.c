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
 * The features that take part in a claim (business keys, confirmation,
 * the audit) do so through their parts (ngx_http_idem_claim_part_t,
 * ngx_http_idempotency_claim.h): their keys and arguments of claim.lua,
 * the record written instead of a claim, their reading of the reply.
 * This file names none of them.
 */

#include <ngx_config.h>
#include <ngx_core.h>

#include "ngx_http_idempotency.h"
#include "ngx_http_idempotency_claim.h"
#include "ngx_http_idempotency_close.h"
#include "ngx_http_idempotency_command.h"
#include "ngx_http_idempotency_redis.h"
#include "ngx_http_idempotency_replicas.h"
#include "ngx_http_idempotency_tokens.h"
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

typedef char  ngx_http_idem_claim_set_nargs_check[
    NGX_HTTP_IDEM_SET_NARGS == NGX_HTTP_IDEM_CLAIM_SET_NARGS ? 1 : -1];


/* the parts, in the order they were added (once: a reload adds them again) */
#define NGX_HTTP_IDEM_CLAIM_PARTS  8

static ngx_http_idem_claim_part_t  *ngx_http_idem_claim_parts[
                                        NGX_HTTP_IDEM_CLAIM_PARTS];
static ngx_uint_t                   ngx_http_idem_claim_nparts;

#define ngx_http_idem_each_part(p, i)                                        \
    for (i = 0; i < ngx_http_idem_claim_nparts                               \
                && (p = ngx_http_idem_claim_parts[i]) != NULL; i++)


ngx_int_t
ngx_http_idem_claim_add_part(ngx_http_idem_claim_part_t *part)
{
    ngx_uint_t  i;

    for (i = 0; i < ngx_http_idem_claim_nparts; i++) {
        if (ngx_http_idem_claim_parts[i] == part) {
            return NGX_OK;
        }
    }

    if (ngx_http_idem_claim_nparts == NGX_HTTP_IDEM_CLAIM_PARTS) {
        return NGX_ERROR;
    }

    ngx_http_idem_claim_parts[ngx_http_idem_claim_nparts++] = part;

    return NGX_OK;
}


/*
 * The in_progress record of this attempt; or, as a part would have it,
 * what it writes instead (a proposal, which has no owner: nothing runs).
 */
static void
ngx_http_idem_claim_fill(ngx_http_idem_ctx_t *ctx, idem_value_t *v)
{
    ngx_uint_t                   i;
    ngx_http_idem_claim_part_t  *part;

    ngx_memzero(v, sizeof(idem_value_t));

    v->state = 'i';
    v->op = (const char *) ctx->op_id.data;
    v->fp = (const char *) ctx->fingerprint;
    v->owner = (const char *) ctx->owner;
    v->created = ctx->created;
    v->lease_ms = ctx->conf->lease;
    v->ttl_ms = (int64_t) ctx->conf->ttl * 1000;

    ngx_http_idem_each_part(part, i) {
        if (part->value) {
            part->value(ctx, v);
        }
    }
}


/* the TTL of the record this attempt writes, in ms */
int64_t
ngx_http_idem_claim_record_ttl(ngx_http_idem_ctx_t *ctx)
{
    idem_value_t  v;

    ngx_http_idem_claim_fill(ctx, &v);

    return v.ttl_ms;
}


/* the record this attempt writes, at p */
static u_char *
ngx_http_idem_claim_value(u_char *p, ngx_http_idem_ctx_t *ctx)
{
    idem_value_t  v;

    ngx_http_idem_claim_fill(ctx, &v);

    return (u_char *) idem_value_encode((char *) p, &v);
}


/* the in_progress value is at most this long: its head and 3 numbers */
#define NGX_HTTP_IDEM_CLAIM_VALUE_MAX  (IDEM_HEAD_LEN + 3 * (2 + 2 * 19))


/* the first look's SET, and room for a part's commands pipelined after it */
ngx_http_idem_cmd_t *
ngx_http_idem_claim_set_more(ngx_http_request_t *r, ngx_http_idem_ctx_t *ctx,
    ngx_uint_t more, size_t size)
{
    u_char               *p;
    ngx_http_idem_cmd_t  *cmd;

    cmd = ngx_http_idem_cmd_native(ctx->conf->redis, &ngx_http_idem_set,
                                   NGX_HTTP_IDEM_SET_NARGS + more, ctx->rkey,
                                   NGX_HTTP_IDEM_CLAIM_VALUE_MAX
                                   + NGX_INT64_LEN + 8 + size,
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
                              ngx_http_idem_claim_record_ttl(ctx));
    ngx_http_idem_cmd_set(cmd, NGX_HTTP_IDEM_SET_GET, "GET", 3);

    return cmd;
}


/* claim.lua with the parts' keys; a part may build the command itself */
static ngx_http_idem_cmd_t *
ngx_http_idem_claim_create(ngx_http_request_t *r, ngx_http_idem_ctx_t *ctx,
    size_t size)
{
    u_char                      *keys[NGX_HTTP_IDEM_CLAIM_KEYS];
    ngx_uint_t                   i, n;
    ngx_http_idem_cmd_t         *cmd;
    ngx_http_idem_claim_part_t  *part;

    n = 0;

    ngx_http_idem_each_part(part, i) {
        if (part->keys) {
            n += part->keys(ctx, &keys[n]);
        }
    }

    ngx_http_idem_each_part(part, i) {
        if (part->create
            && part->create(r, ctx, keys, n, size, &cmd) != NGX_DECLINED)
        {
            return cmd;
        }
    }

    return ngx_http_idem_cmd_create_keys(ctx->conf->redis,
                                         NGX_HTTP_IDEM_SCRIPT_CLAIM,
                                         ctx->rkey, keys, n, size,
                                         r->connection->log);
}


static ngx_http_idem_cmd_t *
ngx_http_idem_claim_script_cmd(ngx_http_request_t *r,
    ngx_http_idem_ctx_t *ctx)
{
    u_char                      *p;
    ngx_uint_t                   i;
    ngx_http_idem_cmd_t         *cmd;
    ngx_http_idem_loc_conf_t    *lcf;
    ngx_http_idem_claim_part_t  *part;

    lcf = ctx->conf;

    cmd = ngx_http_idem_claim_create(r, ctx, IDEM_FP_HEX_LEN
                                             + 2 * NGX_HTTP_IDEM_TOKEN_HEX
                                             + NGX_HTTP_IDEM_CLAIM_VALUE_MAX
                                             + NGX_INT64_LEN + 2
                                             + 2 * IDEM_RECORD_KEY_LEN
                                             + 1 /* a part's flag */);
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
                              ngx_http_idem_claim_record_ttl(ctx));
    ngx_http_idem_cmd_set(cmd, NGX_HTTP_IDEM_CLAIM_WAIT,
                          lcf->wait ? "1" : "0", 1);
    ngx_http_idem_cmd_set(cmd, NGX_HTTP_IDEM_CLAIM_WAITED, ctx->waited_op,
                          ctx->waited ? NGX_HTTP_IDEM_TOKEN_HEX : 0);
    ngx_http_idem_cmd_set(cmd, NGX_HTTP_IDEM_CLAIM_SCOPE, ctx->stag,
                          ngx_strlen(ctx->stag));

    ngx_http_idem_each_part(part, i) {
        if (part->args) {
            part->args(ctx, cmd);
        }
    }

    return cmd;
}


/*
 * The first look: a part's (the audit's GET), else SET NX GET, or
 * claim.lua when SET NX cannot look at all it must (a duplicate that
 * waits, a part's keys)
 */
static ngx_http_idem_cmd_t *
ngx_http_idem_claim_look(ngx_http_request_t *r, ngx_http_idem_ctx_t *ctx)
{
    ngx_uint_t                   i;
    ngx_http_idem_cmd_t         *cmd;
    ngx_http_idem_claim_part_t  *part;

    ngx_http_idem_each_part(part, i) {
        if (part->look && part->look(r, ctx, &cmd) != NGX_DECLINED) {
            return cmd;
        }
    }

    ngx_http_idem_each_part(part, i) {
        if (part->scripted && part->scripted(ctx)) {
            return ngx_http_idem_claim_script_cmd(r, ctx);
        }
    }

    return ctx->waiting ? ngx_http_idem_claim_script_cmd(r, ctx)
                        : ngx_http_idem_claim_set_more(r, ctx, 0, 0);
}


static ngx_int_t
ngx_http_idem_claim_go(ngx_http_request_t *r, ngx_http_idem_ctx_t *ctx,
    ngx_uint_t script)
{
    ngx_http_idem_cmd_t  *cmd;

    cmd = script ? ngx_http_idem_claim_script_cmd(r, ctx)
                 : ngx_http_idem_claim_look(r, ctx);

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
    ngx_uint_t                   i;
    ngx_http_idem_claim_part_t  *part;

    ctx->phase = NGX_HTTP_IDEM_CLAIMING;

    if (ngx_http_idem_tokens(r, ctx) != NGX_OK) {
        goto down;
    }

    ngx_http_idem_each_part(part, i) {
        if (part->prepare && part->prepare(r, ctx) != NGX_OK) {
            goto down;
        }
    }

    ctx->created = ngx_http_idem_now_ms();

    if (ngx_http_idem_claim_go(r, ctx, 0) == NGX_OK) {
        return NGX_OK;
    }

down:

    ctx->answer = NGX_HTTP_IDEM_ANS_STORE_DOWN;
    ctx->phase = NGX_HTTP_IDEM_ANSWERED;

    return NGX_ERROR;
}


void
ngx_http_idem_set_state(ngx_http_idem_ctx_t *ctx, char state)
{
    const char  *name;

    name = idem_state_name(state);
    ctx->state.data = (u_char *) name;
    ctx->state.len = ngx_strlen(name);
}


/* the operation the request met, copied out of the reply */
ngx_int_t
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
ngx_int_t
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


/*
 * What a record that holds the key means for this request: NONE when only
 * claim.lua can tell (a claim in flight, a marker), which claim.lua itself
 * never answers ("look": the first look's record, not claim.lua's).  A
 * claim seen by the first look may have its completion beside it
 * (idempotency_complete_beside), which only claim.lua reads: a changed
 * request is then told the state the key is really in.  A part may know
 * the record's state better (a proposal, a declined one).
 */
ngx_http_idem_answer_e
ngx_http_idem_claim_held(ngx_http_request_t *r, ngx_http_idem_ctx_t *ctx,
    idem_value_t *v, ngx_uint_t look)
{
    ngx_uint_t                   i, same;
    ngx_http_idem_answer_e       answer;
    ngx_http_idem_claim_part_t  *part;

    same = ngx_memcmp(v->fp, ctx->fingerprint, IDEM_FP_HEX_LEN) == 0;

    /* an alias (idempotency_unique) answers what the operation it names does */
    if (v->state == 'r' || (v->state == 's' && same)
        || (v->state == 'i' && (same || look)))
    {
        return look ? NGX_HTTP_IDEM_ANS_NONE : NGX_HTTP_IDEM_ANS_STORE_ERROR;
    }

    if (ngx_http_idem_claim_record(r, ctx, v) != NGX_OK) {
        return NGX_HTTP_IDEM_ANS_STORE_ERROR;
    }

    ngx_http_idem_each_part(part, i) {
        if (part->held
            && part->held(r, ctx, v, same, look, &answer) != NGX_DECLINED)
        {
            return answer;
        }
    }

    if (!same) {
        return NGX_HTTP_IDEM_ANS_MISMATCH;
    }

    return v->state == 'c' ? NGX_HTTP_IDEM_ANS_COMPLETED
                           : NGX_HTTP_IDEM_ANS_UNKNOWN;
}


/* what claim.lua said, when no part reads it */
static ngx_http_idem_answer_e
ngx_http_idem_claim_decoded(ngx_http_request_t *r, ngx_http_idem_ctx_t *ctx,
    idem_claim_t *c, ngx_uint_t script)
{
    ngx_uint_t                   i;
    ngx_http_idem_answer_e       answer;
    ngx_http_idem_claim_part_t  *part;

    ngx_http_idem_each_part(part, i) {
        if (part->decoded
            && part->decoded(r, ctx, c, &answer) != NGX_DECLINED)
        {
            return answer;
        }
    }

    switch (c->kind) {

    case IDEM_CLAIM_CLAIMED:
        ngx_http_idem_set_state(ctx, 'i');
        return NGX_HTTP_IDEM_ANS_CLAIMED;

    case IDEM_CLAIM_RECORD:
        return ngx_http_idem_claim_held(r, ctx, &c->rec, !script);

    case IDEM_CLAIM_IN_PROGRESS:
        if (ngx_http_idem_claim_record(r, ctx, &c->rec) != NGX_OK) {
            return NGX_HTTP_IDEM_ANS_STORE_ERROR;
        }

        ngx_memcpy(ctx->waited_op, c->rec.op, NGX_HTTP_IDEM_TOKEN_HEX);
        ctx->waited = 1;
        ctx->lease_left = (ngx_msec_t) c->lease_left;
        return NGX_HTTP_IDEM_ANS_IN_PROGRESS;

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


/* the first look's SET NX GET, not a part's look nor claim.lua */
ngx_uint_t
ngx_http_idem_claim_native(ngx_http_idem_cmd_t *cmd)
{
    return cmd->script != NGX_HTTP_IDEM_SCRIPT_CLAIM
           && cmd->argc == cmd->arg0 + NGX_HTTP_IDEM_SET_NARGS;
}


/* the reply of SET NX GET or of claim.lua: NONE when claim.lua must look */
ngx_http_idem_answer_e
ngx_http_idem_claim_decode(ngx_http_request_t *r, ngx_http_idem_ctx_t *ctx,
    ngx_http_idem_cmd_t *cmd, redisReply *reply)
{
    size_t        n;
    ngx_uint_t    script;
    idem_rv_t     el[IDEM_CLAIM_ELEMS];
    idem_claim_t  c;

    script = (cmd->script == NGX_HTTP_IDEM_SCRIPT_CLAIM);

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

    return ngx_http_idem_claim_decoded(r, ctx, &c, script);
}


/* the claim's reply, read by a part or as it is */
static ngx_http_idem_answer_e
ngx_http_idem_claim_parse(ngx_http_request_t *r, ngx_http_idem_ctx_t *ctx,
    ngx_http_idem_cmd_t *cmd, redisReply *reply)
{
    ngx_uint_t                   i;
    ngx_http_idem_answer_e       answer;
    ngx_http_idem_claim_part_t  *part;

    if (reply == NULL) {
        return NGX_HTTP_IDEM_ANS_STORE_DOWN;
    }

    ngx_http_idem_each_part(part, i) {
        if (part->parse
            && part->parse(r, ctx, cmd, reply, &answer) != NGX_DECLINED)
        {
            return answer;
        }
    }

    return ngx_http_idem_claim_decode(r, ctx, cmd, reply);
}


/*
 * A reply in claim.lua's words, from the second step on a cluster
 * (redis-scripts/business_holder.lua): the answer it gives the request.
 */
static ngx_http_idem_answer_e
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

    if (cmd->batch) {       /* the record's SET; no reply: its part's */
        return reply != NULL && (cmd->nil & 1);
    }

    if (cmd->script != NGX_HTTP_IDEM_SCRIPT_CLAIM
        && !ngx_http_idem_claim_native(cmd))
    {
        return 0;   /* a part's first look (the audit's GET) */
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


/* on a cluster, every business key taken: the parts' last word */
static ngx_int_t
ngx_http_idem_claim_let(ngx_http_idem_ctx_t *ctx)
{
    ngx_uint_t                   i;
    ngx_http_idem_claim_part_t  *part;

    ngx_http_idem_each_part(part, i) {
        if (part->let && part->let(ctx->request, ctx) != NGX_OK) {
            return NGX_ERROR;
        }
    }

    return NGX_OK;
}


/* the request goes on with the claim's answer */
void
ngx_http_idem_claim_answered(ngx_http_idem_ctx_t *ctx)
{
    /*
     * THE dispatch to the second step of a claim on a Redis Cluster: the
     * business keys (idempotency_unique, _lock), each in its own slot,
     * once the record is claimed (ngx_http_idempotency_bkeys.c).  One
     * server and Sentinel took them inside claim.lua and go on.
     */
    if (ngx_http_idem_bkeys_start(ctx, ngx_http_idem_claim_reply_answer,
                                  ngx_http_idem_claim_resumed,
                                  ngx_http_idem_claim_let)
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
                      "it is released and answered 503",
                      ngx_http_idem_log_key(ctx));
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


/* NGX_DONE: a part has dealt with the reply, or the answer, itself */
static ngx_int_t
ngx_http_idem_claim_parts_reply(ngx_http_idem_cmd_t *cmd, redisReply **reply)
{
    ngx_uint_t                   i;
    ngx_http_idem_claim_part_t  *part;

    ngx_http_idem_each_part(part, i) {
        if (part->reply && part->reply(cmd, reply) == NGX_DONE) {
            return NGX_DONE;
        }
    }

    return NGX_OK;
}


static ngx_int_t
ngx_http_idem_claim_parts_answered(ngx_http_request_t *r,
    ngx_http_idem_ctx_t *ctx, ngx_http_idem_cmd_t *cmd)
{
    ngx_uint_t                   i;
    ngx_http_idem_claim_part_t  *part;

    ngx_http_idem_each_part(part, i) {
        if (part->answered && part->answered(r, ctx, cmd) == NGX_DONE) {
            return NGX_DONE;
        }
    }

    return NGX_OK;
}


static void
ngx_http_idem_claim_done(ngx_http_idem_cmd_t *cmd, redisReply *reply)
{
    ngx_http_request_t   *r;
    ngx_http_idem_ctx_t  *ctx;

    if (ngx_http_idem_claim_parts_reply(cmd, &reply) == NGX_DONE) {
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

    if (ngx_http_idem_claim_parts_answered(r, ctx, cmd) == NGX_DONE) {
        return;
    }

    if (ctx->answer == NGX_HTTP_IDEM_ANS_NONE) {
        if (ngx_http_idem_claim_go(r, ctx, 1) == NGX_OK) {
            return;
        }

        /* what a native batch took, which claim.lua was to undo */
        ngx_http_idem_claim_orphan(cmd, reply);
        ctx->answer = NGX_HTTP_IDEM_ANS_STORE_DOWN;
    }

    ngx_http_idem_claim_made_on(ctx);
}


/* a claim made (the parts have had their say): replicas, then on */
void
ngx_http_idem_claim_made_on(ngx_http_idem_ctx_t *ctx)
{
    if (ngx_http_idem_claim_replicate(ctx->request, ctx) == NGX_OK) {
        return;
    }

    ngx_http_idem_claim_answered(ctx);
}
