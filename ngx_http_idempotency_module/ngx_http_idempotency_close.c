/*
 * Closing a claimed record: complete (the response is recorded), release
 * (the upstream never got the request, so the key is free again) or fail
 * (sent, but no complete response: the outcome is unknown).  Also the
 * lease renewal that keeps the claim while the request is alive, and the
 * giving back of a claim that nobody will use.
 *
 * These scripts are fenced by the owner token, so they are durable: one
 * that cannot reach Redis now is sent again once Redis is back.  With
 * idempotency_audit they carry the entries of the end they make
 * ("accepted" with the upstream's status, then "completed", "unknown" or
 * "released"), appended only when the claim is still theirs.
 */

#include <ngx_config.h>
#include <ngx_core.h>
#include "ngx_http_idempotency.h"
#include "ngx_http_idempotency_close.h"
#include "ngx_http_idempotency_close_batch.h"
#include "ngx_http_idempotency_audit.h"
#include "ngx_http_idempotency_business.h"
#include "ngx_http_idempotency_command.h"
#include "ngx_http_idempotency_metrics.h"
#include "ngx_http_idempotency_redis.h"
#include "ngx_http_idempotency_replicas.h"
#include "ngx_http_idempotency_request.h"


static ngx_str_t  ngx_http_idem_set = ngx_string("SET");


/* every fenced script declares "owner" first, in its "--: args" line */
#define NGX_HTTP_IDEM_FENCED_OWNER  0

typedef char  ngx_http_idem_owner_first_t[
    (NGX_HTTP_IDEM_COMPLETE_OWNER == NGX_HTTP_IDEM_FENCED_OWNER
     && NGX_HTTP_IDEM_RELEASE_OWNER == NGX_HTTP_IDEM_FENCED_OWNER
     && NGX_HTTP_IDEM_FAIL_OWNER == NGX_HTTP_IDEM_FENCED_OWNER
     && NGX_HTTP_IDEM_RENEW_OWNER == NGX_HTTP_IDEM_FENCED_OWNER) ? 1 : -1];


/* a give-back: a release for a claim that may not have run */
static ngx_uint_t
ngx_http_idem_is_give_back(ngx_http_idem_cmd_t *cmd)
{
    ngx_str_t  absent;

    if (cmd->script != NGX_HTTP_IDEM_SCRIPT_RELEASE) {
        return 0;
    }

    absent = ngx_http_idem_cmd_get(cmd, NGX_HTTP_IDEM_RELEASE_ABSENT);

    return absent.len == 1 && absent.data[0] == '1';
}


/*
 * A completion beside its claim (SET <key>:c:<owner> value PX ttl GET)
 * answers with what it replaced: nothing, a waiter's mark (the completion
 * then announces itself, as complete.lua would), or its own completion
 * when it was sent again after its answer was lost: it is recorded.  A
 * resent one also announces itself: its first sending may have replaced
 * the mark.  The mark of a claim taken from its owner: nobody will read
 * the completion, so the mark goes back in its place (a resend of it is
 * then refused too) and the caller logs it.
 */
static idem_close_kind_e
ngx_http_idem_closed_beside(ngx_http_idem_cmd_t *cmd, redisReply *reply)
{
    ngx_str_t             sub;
    ngx_http_idem_cmd_t  *mark;

    static u_char         lost[] = { IDEM_DONE_LOST };

    if (reply->type == REDIS_REPLY_NIL
        || (reply->type == REDIS_REPLY_STRING && reply->len > 1
            && reply->str[0] == '2'))
    {
        if (cmd->resent) {
            (void) ngx_http_idem_announce(cmd->redis, cmd->key,
                                          cmd->redis->log);
        }

        return IDEM_CLOSE_DONE;
    }

    if (reply->type != REDIS_REPLY_STRING || reply->len != 1) {
        return IDEM_CLOSE_INVALID;
    }

    if (reply->str[0] == IDEM_DONE_WAITED) {
        (void) ngx_http_idem_announce(cmd->redis, cmd->key, cmd->redis->log);
        return IDEM_CLOSE_DONE;
    }

    if (reply->str[0] != IDEM_DONE_LOST) {
        return IDEM_CLOSE_INVALID;
    }

    sub.data = (u_char *) cmd->argv[1] + IDEM_RECORD_KEY_LEN;
    sub.len = cmd->argvlen[1] - IDEM_RECORD_KEY_LEN;

    mark = ngx_http_idem_cmd_native(cmd->redis, &ngx_http_idem_set, 2,
                                    cmd->key,
                                    sub.len + 1 + sizeof("KEEPTTL") - 1,
                                    cmd->redis->log);
    if (mark) {
        ngx_http_idem_cmd_sibling(mark, sub.data, sub.len);
        ngx_http_idem_cmd_set(mark, 0, lost, 1);
        ngx_http_idem_cmd_set(mark, 1, "KEEPTTL", sizeof("KEEPTTL") - 1);
        (void) ngx_http_idem_cmd_send(mark, NULL, NULL);
    }

    return IDEM_CLOSE_NOT_HELD;
}


/* what a closing command's answer says */
static idem_close_kind_e
ngx_http_idem_closed_kind(ngx_http_idem_cmd_t *cmd, redisReply *reply)
{
    if (reply == NULL || reply->type == REDIS_REPLY_ERROR) {
        return IDEM_CLOSE_INVALID;
    }

    if (cmd->script == NGX_HTTP_IDEM_NSCRIPTS) {
        return ngx_http_idem_closed_beside(cmd, reply);
    }

    return reply->type == REDIS_REPLY_INTEGER
           ? idem_close_decode(reply->integer) : IDEM_CLOSE_INVALID;
}


static void
ngx_http_idem_closed_log(ngx_http_idem_cmd_t *cmd, redisReply *reply,
    idem_close_kind_e kind)
{
    const char  *what;
    ngx_log_t   *log;

    log = cmd->redis->log;

    /* the one native closing command is a completion's */
    what = cmd->script == NGX_HTTP_IDEM_NSCRIPTS
           ? "complete" : cmd->redis->scripts[cmd->script].name;

    if (reply == NULL) {
        ngx_log_error(NGX_LOG_ERR, log, 0,
                      "idempotency: %s script got no reply; the record "
                      "turns unknown when its lease lapses",
                      what);
        return;
    }

    if (reply->type == REDIS_REPLY_ERROR) {
        ngx_log_error(NGX_LOG_ERR, log, 0,
                      "idempotency: %s script failed: %*s%s",
                      what, (size_t) reply->len, reply->str,
                      cmd->script == NGX_HTTP_IDEM_SCRIPT_RENEW
                      ? "" : "; the record turns unknown when its lease lapses");
        return;
    }

    if (kind == IDEM_CLOSE_INVALID) {
        ngx_log_error(NGX_LOG_ERR, log, 0,
                      "idempotency: unexpected reply to the %s script", what);

    } else if (kind == IDEM_CLOSE_NOT_HELD && !ngx_http_idem_is_give_back(cmd))
    {
        ngx_log_error(NGX_LOG_WARN, log, 0,
                      "idempotency: %s script: the claim was no longer "
                      "held by this request", what);
    }
}


/*
 * A completion the replicas did not have in time is kept: the response
 * was the upstream's and goes out; a failover now may lose the record,
 * and that is what the log line is for.
 */
static void
ngx_http_idem_closed_replicated(ngx_http_idem_replicas_t *w, ngx_int_t acked)
{
    ngx_http_idem_ctx_t  *ctx = w->data;

    if (acked < 0) {
        ngx_log_error(NGX_LOG_WARN, ctx->request->connection->log, 0,
                      "idempotency: no WAIT answer for the record of key "
                      "\"%V\" (the redis connection failed or changed); "
                      "it is kept, and a failover before the replicas have "
                      "it may lose it", ngx_http_idem_log_key(ctx));

    } else if (acked < (ngx_int_t) ctx->conf->wait_replicas) {
        ngx_log_error(NGX_LOG_WARN, ctx->request->connection->log, 0,
                      "idempotency: the record of key \"%V\" reached %i of "
                      "%ui replicas within %Mms; it is kept, and a failover "
                      "before the replicas have it may lose it",
                      ngx_http_idem_log_key(ctx), acked,
                      ctx->conf->wait_replicas,
                      ctx->conf->wait_replicas_timeout);
    }

    ctx->closed(ctx);
}


/* with idempotency_redis_wait, the answer waits for the replicas too */
static void
ngx_http_idem_closed_replicate(ngx_http_idem_ctx_t *ctx,
    idem_close_kind_e kind)
{
    if (ctx->conf->wait_replicas == 0 || kind != IDEM_CLOSE_DONE) {
        ctx->closed(ctx);
        return;
    }

    ctx->replicas.handler = ngx_http_idem_closed_replicated;
    ctx->replicas.data = ctx;

    if (ngx_http_idem_replicas_wait(ctx->conf->redis, &ctx->replicas,
                                    ctx->conf->wait_replicas,
                                    ctx->conf->wait_replicas_timeout)
        != NGX_OK)
    {
        ngx_http_idem_closed_replicated(&ctx->replicas, -1);
    }
}


/* a request that holds its response's end for this answer hears of it */
static void
ngx_http_idem_closed(ngx_http_idem_cmd_t *cmd, redisReply *reply)
{
    ngx_int_t             rc;
    idem_close_kind_e     kind;
    ngx_http_idem_ack_t  *ack;
    ngx_http_idem_ctx_t  *ctx;
    ngx_http_idem_cmd_t  *next;

    /* a lost race for the audit stream's head: sent again, same data */
    rc = ngx_http_idem_audit_reply(cmd, &reply, &next);

    if (rc == NGX_AGAIN || rc == NGX_DECLINED) {
        return;
    }

    if (rc == NGX_ERROR) {
        reply = NULL;
    }

    kind = ngx_http_idem_closed_kind(cmd, reply);
    ngx_http_idem_closed_log(cmd, reply, kind);

    ack = cmd->data;

    if (ack == NULL) {
        return;
    }

    cmd->data = NULL;
    ctx = ack->ctx;
    ngx_free(ack);

    if (ctx) {
        ctx->ack = NULL;
        ngx_http_idem_closed_replicate(ctx, kind);
    }
}


/*
 * A fenced script that names the record, n more keys (renew: the unique
 * and lock keys), and the owner, then its own args; with an audit stream,
 * the entries e[0..ne) go with it
 */
static ngx_http_idem_cmd_t *
ngx_http_idem_fenced_cmd_keys(ngx_http_idem_redis_t *rd,
    ngx_http_idem_audit_t *audit, ngx_http_idem_script_e script,
    const u_char *key, u_char **keys, ngx_uint_t n, const u_char *owner,
    size_t size, idem_audit_entry_t *e, ngx_uint_t ne, ngx_log_t *log)
{
    ngx_str_t             fenced = ngx_null_string;
    ngx_http_idem_cmd_t  *cmd;

    size += NGX_HTTP_IDEM_TOKEN_HEX;

    cmd = audit ? ngx_http_idem_audit_cmd(audit, script, key, keys, n, size,
                                          &fenced, e, ne, log)
                : ngx_http_idem_cmd_create_keys(rd, script, key, keys, n,
                                                size, log);
    if (cmd == NULL) {
        return NULL;
    }

    ngx_http_idem_cmd_set(cmd, NGX_HTTP_IDEM_FENCED_OWNER, owner,
                          NGX_HTTP_IDEM_TOKEN_HEX);
    cmd->durable = (script != NGX_HTTP_IDEM_SCRIPT_RENEW);

    return cmd;
}


/*
 * The same, of the record alone, to end this request's claim: with the
 * audit, its entries are "accepted" when the upstream answered (with its
 * status and reference), then "event" (completed, unknown or released).
 */
static ngx_http_idem_cmd_t *
ngx_http_idem_fenced_cmd(ngx_http_request_t *r, ngx_http_idem_ctx_t *ctx,
    ngx_http_idem_script_e script, size_t size, idem_audit_event_e event)
{
    ngx_uint_t          n;
    idem_audit_entry_t  e[2];

    n = 0;

    if (ctx->audit_later) {
        /* its "sent" was never written (business keys refused it) */
        return ngx_http_idem_fenced_cmd_keys(ctx->conf->redis, NULL, script,
                                             ctx->rkey, NULL, 0, ctx->owner,
                                             size, e, 0, r->connection->log);
    }

    if (ctx->conf->audit && ctx->status) {
        ngx_http_idem_audit_entry(ctx, IDEM_AUDIT_ACCEPTED, ctx->status,
                                  &e[n]);
        e[n].ref.data = (const char *) ctx->audit_ref.data;
        e[n++].ref.len = ctx->audit_ref.len;
    }

    if (ctx->conf->audit) {
        ngx_http_idem_audit_entry(ctx, event, 0, &e[n]);
        e[n].ref = n ? e[0].ref : e[n].ref;

        if (event != IDEM_AUDIT_UNKNOWN) {
            e[n].status = (int) ctx->status;
        }

        if (event == IDEM_AUDIT_COMPLETED && !ctx->too_large
            && ngx_http_idem_audit_digest(r->pool, ctx->body, NULL,
                                          &e[n].response)
               != NGX_OK)
        {
            return NULL;
        }

        n++;
    }

    return ngx_http_idem_fenced_cmd_keys(ctx->conf->redis, ctx->conf->audit,
                                         script, ctx->rkey, NULL, 0,
                                         ctx->owner, size, e, n,
                                         r->connection->log);
}


/* the closed record's head: this attempt's operation and fingerprint */
static void
ngx_http_idem_value_init(idem_value_t *v, ngx_http_idem_ctx_t *ctx,
    char state)
{
    ngx_memzero(v, sizeof(idem_value_t));

    v->state = state;
    v->op = (const char *) ctx->op_id.data;
    v->fp = (const char *) ctx->fingerprint;
    v->created = ctx->created;
    v->completed = -1;
    v->unknown_at = -1;
    v->retry_after = -1;
}


/* SET <key>:c:<owner> value PX ttl GET: its arguments after the key */
enum {
    NGX_HTTP_IDEM_BESIDE_VALUE = 0,
    NGX_HTTP_IDEM_BESIDE_PX,
    NGX_HTTP_IDEM_BESIDE_TTL,
    NGX_HTTP_IDEM_BESIDE_GET,
    NGX_HTTP_IDEM_BESIDE_NARGS
};

#define NGX_HTTP_IDEM_BESIDE_LEN                                              \
    (sizeof(IDEM_DONE_INFIX) - 1 + NGX_HTTP_IDEM_TOKEN_HEX)


/*
 * The completion written beside the claim (idempotency_complete_beside):
 * one native command instead of complete.lua, whose Lua call and owner
 * check cost Redis more than the rest of a first write (bench/RESULTS.md).
 * Its name holds the owner token, and the record still names the claim's
 * token, so a reader trusts it only while that claim holds the key: a
 * late completion of a claim taken away lands where nobody reads.
 */
static ngx_http_idem_cmd_t *
ngx_http_idem_beside_cmd(ngx_http_request_t *r, ngx_http_idem_ctx_t *ctx,
    size_t size)
{
    u_char               *p, sub[NGX_HTTP_IDEM_BESIDE_LEN];
    ngx_http_idem_cmd_t  *cmd;

    cmd = ngx_http_idem_cmd_native(ctx->conf->redis, &ngx_http_idem_set,
                                   NGX_HTTP_IDEM_BESIDE_NARGS, ctx->rkey,
                                   NGX_HTTP_IDEM_BESIDE_LEN + size
                                   + NGX_INT64_LEN + 5,
                                   r->connection->log);
    if (cmd == NULL) {
        return NULL;
    }

    p = ngx_cpymem(sub, IDEM_DONE_INFIX, sizeof(IDEM_DONE_INFIX) - 1);
    ngx_memcpy(p, ctx->owner, NGX_HTTP_IDEM_TOKEN_HEX);
    ngx_http_idem_cmd_sibling(cmd, sub, sizeof(sub));

    ngx_http_idem_cmd_set(cmd, NGX_HTTP_IDEM_BESIDE_PX, "PX", 2);
    ngx_http_idem_cmd_set(cmd, NGX_HTTP_IDEM_BESIDE_GET, "GET", 3);
    cmd->durable = 1;

    return cmd;
}


static ngx_http_idem_cmd_t *
ngx_http_idem_complete_cmd(ngx_http_request_t *r, ngx_http_idem_ctx_t *ctx)
{
    u_char                    *p, *end;
    ngx_uint_t                 value, ttl;
    ngx_chain_t               *cl;
    idem_value_t               v;
    ngx_http_idem_cmd_t       *cmd;
    ngx_http_idem_loc_conf_t  *lcf;

    lcf = ctx->conf;

    ngx_http_idem_value_init(&v, ctx, 'c');
    v.completed = ngx_http_idem_now_ms();
    v.status = (int) ctx->status;
    v.stored = !ctx->too_large;
    v.hdr = (const char *) ctx->headers.data;
    v.hdr_len = ctx->headers.len;
    v.body = NULL;          /* copied from the chain below */
    v.body_len = ctx->too_large ? 0 : ctx->body_size;

    /* the audit's entries are appended in the step that writes */
    if (lcf->complete_beside && lcf->audit == NULL) {
        cmd = ngx_http_idem_beside_cmd(r, ctx, idem_value_len(&v));
        value = NGX_HTTP_IDEM_BESIDE_VALUE;
        ttl = NGX_HTTP_IDEM_BESIDE_TTL;

    } else {
        cmd = ngx_http_idem_fenced_cmd(r, ctx, NGX_HTTP_IDEM_SCRIPT_COMPLETE,
                                       idem_value_len(&v) + NGX_INT64_LEN,
                                       IDEM_AUDIT_COMPLETED);
        value = NGX_HTTP_IDEM_COMPLETE_VALUE;
        ttl = NGX_HTTP_IDEM_COMPLETE_TTL;
    }

    if (cmd == NULL) {
        return NULL;
    }

    p = ngx_http_idem_cmd_start(cmd, value);
    end = (u_char *) idem_value_encode((char *) p, &v);

    /* the body's place is its last bytes, before the closing comma */
    p = end - 1 - v.body_len;
    for (cl = ctx->too_large ? NULL : ctx->body; cl; cl = cl->next) {
        p = ngx_cpymem(p, cl->buf->pos, cl->buf->last - cl->buf->pos);
    }

    ngx_http_idem_cmd_end(cmd, value, end);
    ngx_http_idem_cmd_set_num(cmd, ttl, (int64_t) lcf->ttl * 1000);

    return cmd;
}


static ngx_http_idem_cmd_t *
ngx_http_idem_fail_cmd(ngx_http_request_t *r, ngx_http_idem_ctx_t *ctx)
{
    u_char               *p;
    idem_value_t          v;
    ngx_http_idem_cmd_t  *cmd;

    ngx_http_idem_value_init(&v, ctx, 'u');
    v.unknown_at = ngx_http_idem_now_ms();

    cmd = ngx_http_idem_fenced_cmd(r, ctx, NGX_HTTP_IDEM_SCRIPT_FAIL,
                                   idem_value_len(&v), IDEM_AUDIT_UNKNOWN);
    if (cmd == NULL) {
        return NULL;
    }

    p = ngx_http_idem_cmd_start(cmd, NGX_HTTP_IDEM_FAIL_VALUE);
    ngx_http_idem_cmd_end(cmd, NGX_HTTP_IDEM_FAIL_VALUE,
                          (u_char *) idem_value_encode((char *) p, &v));

    return cmd;
}


/* an upstream's Retry-After in delay-seconds, or -1 */
static ngx_int_t
ngx_http_idem_retry_after(ngx_http_request_t *r)
{
    ngx_table_elt_t  *h;

    h = ngx_http_idem_header_out(r, (u_char *) "Retry-After", 11);

    return h ? ngx_atoi(h->value.data, h->value.len) : -1;
}


/*
 * The upstream never got the request: the record goes.  It answered "not
 * done, try later" (idempotency_release_statuses): a marker with its
 * status and Retry-After stays a little longer than a waiter's look at
 * the lease, for the duplicates that waited on this attempt.
 */
static ngx_http_idem_cmd_t *
ngx_http_idem_release_cmd(ngx_http_request_t *r, ngx_http_idem_ctx_t *ctx)
{
    u_char               *p;
    idem_value_t          v;
    ngx_http_idem_cmd_t  *cmd;

    ngx_http_idem_value_init(&v, ctx, 'r');
    v.owner = (const char *) ctx->owner;
    v.status = (int) ctx->status;
    v.retry_after = ngx_http_idem_retry_after(r);

    cmd = ngx_http_idem_fenced_cmd(r, ctx, NGX_HTTP_IDEM_SCRIPT_RELEASE,
                                   idem_value_len(&v) + NGX_INT64_LEN + 1,
                                   IDEM_AUDIT_RELEASED);
    if (cmd == NULL) {
        return NULL;
    }

    p = ngx_http_idem_cmd_start(cmd, NGX_HTTP_IDEM_RELEASE_MARKER);
    ngx_http_idem_cmd_end(cmd, NGX_HTTP_IDEM_RELEASE_MARKER,
                          ctx->status
                          ? (u_char *) idem_value_encode((char *) p, &v) : p);
    ngx_http_idem_cmd_set_num(cmd, NGX_HTTP_IDEM_RELEASE_TTL,
                              ctx->conf->lease + 1000);
    ngx_http_idem_cmd_set(cmd, NGX_HTTP_IDEM_RELEASE_ABSENT, "0", 1);

    return cmd;
}


/*
 * NGX_OK: the script was sent and its answer will reach ctx->closed, when
 * the caller set it; NGX_DECLINED: no answer is to be awaited (not sent
 * now, or nobody asked).
 */
ngx_int_t
ngx_http_idem_finish(ngx_http_request_t *r, ngx_http_idem_ctx_t *ctx,
    ngx_http_idem_end_e end)
{
    ngx_int_t             rc;
    ngx_http_idem_ack_t  *ack;
    ngx_http_idem_cmd_t  *cmd;

    ctx->end = end;

    if (ctx->renew.timer_set) {
        ngx_del_timer(&ctx->renew);
    }

    switch (end) {

    case NGX_HTTP_IDEM_END_COMPLETE:
        cmd = ngx_http_idem_complete_cmd(r, ctx);
        break;

    case NGX_HTTP_IDEM_END_RELEASE:
        cmd = ngx_http_idem_release_cmd(r, ctx);
        break;

    default:
        cmd = ngx_http_idem_fail_cmd(r, ctx);
        break;
    }

    ack = NULL;

    if (cmd && end == NGX_HTTP_IDEM_END_COMPLETE && ctx->closed) {
        ack = ngx_alloc(sizeof(ngx_http_idem_ack_t), r->connection->log);
        if (ack) {
            ack->ctx = ctx;
        }
    }

    rc = (cmd == NULL) ? NGX_ERROR
                       : ngx_http_idem_close_send(cmd, ngx_http_idem_closed, ack);

    if (rc != NGX_ERROR && end == NGX_HTTP_IDEM_END_COMPLETE) {
        ngx_http_idem_metrics_stored(ctx->headers.len
                                     + (ctx->too_large ? 0 : ctx->body_size));
    }

    if (ack && rc == NGX_OK) {
        ctx->ack = ack;
        return NGX_OK;
    }

    if (ack && rc == NGX_AGAIN) {
        /* kept for the next connection: nobody waits that long */
        ack->ctx = NULL;

    } else if (ack) {
        ngx_free(ack);
    }

    if (rc == NGX_ERROR) {
        ngx_log_error(NGX_LOG_ERR, r->connection->log, 0,
                      "idempotency: cannot close the record of key \"%V\"; "
                      "it turns unknown when its lease lapses",
                      ngx_http_idem_log_key(ctx));
    }

    return NGX_DECLINED;
}


/*
 * The request ends without a complete response having passed the body
 * filter: if nothing reached the upstream the key is free again, otherwise
 * the upstream may have acted.
 */
void
ngx_http_idem_abandon(ngx_http_request_t *r, ngx_http_idem_ctx_t *ctx)
{
    if (ctx->renew.timer_set) {
        ngx_del_timer(&ctx->renew);
    }

    if (!ctx->claimed || ctx->end != NGX_HTTP_IDEM_END_NONE) {
        return;
    }

    if (r->upstream && !r->upstream->request_sent) {
        ngx_http_idem_finish(r, ctx, NGX_HTTP_IDEM_END_RELEASE);
        return;
    }

    ngx_log_error(NGX_LOG_WARN, r->connection->log, 0,
                  "idempotency: no complete response for key "
                  "\"%V\", outcome unknown%s", ngx_http_idem_log_key(ctx),
                  r->connection->error
                  ? " (the client went away first; "
                    "\"proxy_ignore_client_abort on\" lets the "
                    "response be read and recorded)"
                  : "");

    ngx_http_idem_finish(r, ctx, NGX_HTTP_IDEM_END_FAIL);
}


/*
 * A claim made for nobody (its answer never came, or its request had gone)
 * is given back, fenced by its owner token, at once or once Redis is back,
 * so that the key is not blocked until the lease lapses.  It leaves a
 * marker naming that owner for the record's TTL: should the claim itself
 * still be waiting in a connection the worker gave up on, and run after
 * this, it finds the marker and takes nothing (docs/states.md).
 */
void
ngx_http_idem_give_back(ngx_http_idem_cmd_t *claim_cmd, ngx_str_t *key,
    ngx_str_t *claim)
{
    u_char                 *p;
    ngx_uint_t              n;
    idem_value_t            v;
    idem_audit_entry_t      e[4];
    ngx_http_idem_cmd_t    *cmd;
    ngx_http_idem_redis_t  *rd;

    rd = claim_cmd->redis;

    if (rd->exiting || key->len != IDEM_RECORD_KEY_LEN
        || idem_value_decode((char *) claim->data, claim->len, &v) != 0
        || v.state != 'i')
    {
        return;
    }

    v.state = 'r';
    v.status = 0;
    v.retry_after = -1;

    /* with the audit: "released", of the attempt its claim named */
    n = ngx_http_idem_audit_entries(claim_cmd, e, 4);

    if (n) {
        e[0] = e[n - 1];
        e[0].event = IDEM_AUDIT_RELEASED;
        e[0].status = 0;
    }

    cmd = ngx_http_idem_fenced_cmd_keys(rd, n ? ngx_http_idem_audit_of(claim_cmd)
                                              : NULL,
                                        NGX_HTTP_IDEM_SCRIPT_RELEASE,
                                        key->data, NULL, 0,
                                        (u_char *) v.owner,
                                        idem_value_len(&v) + NGX_INT64_LEN + 1,
                                        e, n ? 1 : 0, rd->log);
    if (cmd) {
        p = ngx_http_idem_cmd_start(cmd, NGX_HTTP_IDEM_RELEASE_MARKER);
        ngx_http_idem_cmd_end(cmd, NGX_HTTP_IDEM_RELEASE_MARKER,
                              (u_char *) idem_value_encode((char *) p, &v));
        ngx_http_idem_cmd_set_num(cmd, NGX_HTTP_IDEM_RELEASE_TTL, v.ttl_ms);
        ngx_http_idem_cmd_set(cmd, NGX_HTTP_IDEM_RELEASE_ABSENT, "1", 1);
    }

    if (cmd == NULL
        || ngx_http_idem_cmd_send(cmd, ngx_http_idem_closed, NULL) == NGX_ERROR)
    {
        ngx_log_error(NGX_LOG_WARN, rd->log, 0,
                      "idempotency: an unanswered claim cannot be given "
                      "back; it turns unknown when its lease lapses");
    }
}


/* lease renewal: a third of the lease, so two renewals may be lost */

static void
ngx_http_idem_renew_handler(ngx_event_t *ev)
{
    u_char                *keys[NGX_HTTP_IDEM_BUSINESS_KEYS];
    ngx_uint_t             n;
    ngx_http_request_t    *r;
    ngx_http_idem_cmd_t   *cmd;
    ngx_http_idem_ctx_t   *ctx;

    ctx = ev->data;
    r = ctx->request;

    if (ctx->end != NGX_HTTP_IDEM_END_NONE) {
        return;
    }

    n = ngx_http_idem_business_args(ctx, keys);

    cmd = ngx_http_idem_fenced_cmd_keys(ctx->conf->redis, NULL,
                                        NGX_HTTP_IDEM_SCRIPT_RENEW,
                                        ctx->rkey, keys, n, ctx->owner,
                                        NGX_INT64_LEN, NULL, 0,
                                        r->connection->log);
    if (cmd) {
        ngx_http_idem_cmd_set_num(cmd, NGX_HTTP_IDEM_RENEW_TTL,
                                  (int64_t) ctx->conf->ttl * 1000);
        (void) ngx_http_idem_cmd_send(cmd, ngx_http_idem_closed, NULL);
    }

    ngx_add_timer(ev, ngx_max(ctx->conf->lease / 3, 1));
}


void
ngx_http_idem_start_lease(ngx_http_request_t *r, ngx_http_idem_ctx_t *ctx)
{
    ctx->renew.handler = ngx_http_idem_renew_handler;
    ctx->renew.data = ctx;
    ctx->renew.log = r->connection->log;
    ctx->renew.cancelable = 1;

    ngx_add_timer(&ctx->renew, ngx_max(ctx->conf->lease / 3, 1));
}
