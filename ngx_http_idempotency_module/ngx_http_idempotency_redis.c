/*
 * hiredis' asynchronous API inside nginx's event loop: one connection per
 * worker and configured server, pipelined, with nginx timers for connect
 * and command timeouts (hiredis 0.14 has none) and reconnect with backoff.
 */

#include <openssl/evp.h>

#include "ngx_http_idempotency.h"
#include "ngx_http_idempotency_scripts.h"


#define NGX_HTTP_IDEM_BACKOFF_MIN  100
#define NGX_HTTP_IDEM_BACKOFF_MAX  2000


static void ngx_http_idem_link_schedule(ngx_http_idem_link_t *lk);
static void ngx_http_idem_link_recycle_later(ngx_http_idem_link_t *lk);
static void ngx_http_idem_waiters_wake(ngx_http_idem_redis_t *rd,
    u_char *key);
static void ngx_http_idem_redis_reply(redisAsyncContext *ac, void *r,
    void *privdata);
static void ngx_http_idem_orphans_release(ngx_http_idem_redis_t *rd);
static void ngx_http_idem_resend(ngx_http_idem_redis_t *rd);


/* indexed by ngx_http_idem_script_e */
static const char  *ngx_http_idem_script_texts[NGX_HTTP_IDEM_NSCRIPTS][2] = {
    { "claim", ngx_http_idem_script_claim },
    { "complete", ngx_http_idem_script_complete },
    { "release", ngx_http_idem_script_release },
    { "fail", ngx_http_idem_script_fail },
    { "renew", ngx_http_idem_script_renew },
    { "status", ngx_http_idem_script_status },
    { "admin", ngx_http_idem_script_admin }
};


ngx_int_t
ngx_http_idem_scripts_init(ngx_conf_t *cf, ngx_http_idem_main_conf_t *mcf)
{
    u_char                   md[EVP_MAX_MD_SIZE];
    ngx_uint_t               i;
    unsigned int             n;
    ngx_http_idem_script_t  *s;

    s = ngx_pcalloc(cf->pool, NGX_HTTP_IDEM_NSCRIPTS * sizeof(*s));
    if (s == NULL) {
        return NGX_ERROR;
    }

    for (i = 0; i < NGX_HTTP_IDEM_NSCRIPTS; i++) {
        s[i].name = ngx_http_idem_script_texts[i][0];
        s[i].text.data = (u_char *) ngx_http_idem_script_texts[i][1];
        s[i].text.len = ngx_strlen(s[i].text.data);

        /* EVALSHA names a script by the SHA-1 of its text */
        if (!EVP_Digest(s[i].text.data, s[i].text.len, md, &n, EVP_sha1(),
                        NULL))
        {
            return NGX_ERROR;
        }

        ngx_hex_dump(s[i].sha1, md, n);
    }

    mcf->scripts = s;

    return NGX_OK;
}


/* event hooks hiredis calls; level-triggered so replies > 16 KiB flow */

static void
ngx_http_idem_link_add(ngx_http_idem_link_t *lk, ngx_uint_t write)
{
    ngx_event_t  *ev;

    if (lk->conn == NULL) {
        return;
    }

    ev = write ? lk->conn->write : lk->conn->read;

    if (!ev->active) {
        if (ngx_add_event(ev, write ? NGX_WRITE_EVENT : NGX_READ_EVENT,
                          NGX_LEVEL_EVENT)
            != NGX_OK)
        {
            ngx_http_idem_link_recycle_later(lk);
        }
    }
}


static void
ngx_http_idem_link_del(ngx_http_idem_link_t *lk, ngx_uint_t write)
{
    ngx_event_t  *ev;

    if (lk->conn == NULL) {
        return;
    }

    ev = write ? lk->conn->write : lk->conn->read;

    if (ev->active) {
        ngx_del_event(ev, write ? NGX_WRITE_EVENT : NGX_READ_EVENT, 0);
    }
}


static void
ngx_http_idem_link_add_read(void *privdata)
{
    ngx_http_idem_link_add(privdata, 0);
}


static void
ngx_http_idem_link_del_read(void *privdata)
{
    ngx_http_idem_link_del(privdata, 0);
}


static void
ngx_http_idem_link_add_write(void *privdata)
{
    ngx_http_idem_link_add(privdata, 1);
}


static void
ngx_http_idem_link_del_write(void *privdata)
{
    ngx_http_idem_link_del(privdata, 1);
}


/*
 * hiredis closes the fd itself (redisFree), so the nginx connection is
 * only unhooked and returned, never closed: one fd, one close.
 */
static void
ngx_http_idem_link_cleanup(void *privdata)
{
    ngx_http_idem_link_t  *lk = privdata;

    ngx_connection_t  *c;

    c = lk->conn;
    if (c == NULL) {
        return;
    }

    ngx_http_idem_link_del(lk, 0);
    ngx_http_idem_link_del(lk, 1);

    lk->conn = NULL;

    if (c->read->posted) {
        ngx_delete_posted_event(c->read);
    }

    if (c->write->posted) {
        ngx_delete_posted_event(c->write);
    }

    ngx_free_connection(c);
    c->fd = (ngx_socket_t) -1;
}


static void
ngx_http_idem_link_read_handler(ngx_event_t *ev)
{
    ngx_connection_t      *c = ev->data;
    ngx_http_idem_link_t  *lk = c->data;

    if (lk->ac) {
        redisAsyncHandleRead(lk->ac);
    }
}


static void
ngx_http_idem_link_write_handler(ngx_event_t *ev)
{
    ngx_connection_t      *c = ev->data;
    ngx_http_idem_link_t  *lk = c->data;

    if (lk->ac) {
        redisAsyncHandleWrite(lk->ac);
    }
}


static const char *
ngx_http_idem_link_name(ngx_http_idem_link_t *lk)
{
    return lk->subscriber ? " (subscriber)" : "";
}


static void
ngx_http_idem_link_on_connect(const redisAsyncContext *ac, int status)
{
    ngx_http_idem_link_t   *lk = ac->data;
    ngx_http_idem_redis_t  *rd = lk->redis;

    if (lk->connect_timer.timer_set) {
        ngx_del_timer(&lk->connect_timer);
    }

    if (status != REDIS_OK) {
        ngx_log_error(NGX_LOG_ERR, rd->log, 0,
                      "idempotency: connect to redis %V%s failed: %s",
                      &rd->name, ngx_http_idem_link_name(lk), ac->errstr);

        /* hiredis frees the context right after this callback */
        lk->ac = NULL;
        lk->state = NGX_HTTP_IDEM_REDIS_DOWN;
        ngx_http_idem_link_schedule(lk);
        return;
    }

    ngx_log_error(NGX_LOG_INFO, rd->log, 0,
                  "idempotency: connected to redis %V%s",
                  &rd->name, ngx_http_idem_link_name(lk));

    lk->state = NGX_HTTP_IDEM_REDIS_READY;
    lk->backoff = 0;

    if (!lk->subscriber) {
        ngx_http_idem_orphans_release(rd);
        ngx_http_idem_resend(rd);
    }
}


static void
ngx_http_idem_link_on_disconnect(const redisAsyncContext *ac, int status)
{
    ngx_http_idem_link_t   *lk = ac->data;
    ngx_http_idem_redis_t  *rd = lk->redis;

    if (lk->ac == ac) {
        lk->ac = NULL;
    }

    lk->state = NGX_HTTP_IDEM_REDIS_DOWN;

    if (status != REDIS_OK && !rd->exiting) {
        ngx_log_error(NGX_LOG_ERR, rd->log, 0,
                      "idempotency: redis %V%s connection lost: %s",
                      &rd->name, ngx_http_idem_link_name(lk),
                      ac->errstr ? ac->errstr : "closed");
    }

    if (lk->subscriber && lk->subscribed) {
        lk->subscribed = 0;
        /* a completion may be missed now: let every waiter look again */
        ngx_http_idem_waiters_wake(rd, NULL);
    }

    ngx_http_idem_link_schedule(lk);
}


static void
ngx_http_idem_link_handshake(redisAsyncContext *ac, void *r, void *privdata)
{
    redisReply            *reply = r;
    ngx_http_idem_link_t  *lk = ac->data;

    if (reply == NULL || reply->type != REDIS_REPLY_ERROR) {
        return;
    }

    ngx_log_error(NGX_LOG_ERR, lk->redis->log, 0,
                  "idempotency: redis %V%s: %s failed: %*s", &lk->redis->name,
                  ngx_http_idem_link_name(lk), (char *) privdata,
                  (size_t) reply->len, reply->str);

    ngx_http_idem_link_recycle_later(lk);
}


/*
 * Every message names a record key; the waiters for that key look at the
 * record again.  The confirmation of the subscription itself wakes every
 * waiter, since a completion may have come while there was none.
 */
static void
ngx_http_idem_link_message(redisAsyncContext *ac, void *r, void *privdata)
{
    redisReply            *reply = r;
    ngx_http_idem_link_t  *lk = ac->data;

    ngx_str_t  type, key;

    if (reply == NULL || reply->type != REDIS_REPLY_ARRAY
        || reply->elements != 3
        || ngx_http_idem_reply_str(reply->element[0], &type) != NGX_OK)
    {
        return;
    }

    if (ngx_http_idem_is(&type, "subscribe")) {
        lk->subscribed = 1;
        ngx_http_idem_waiters_wake(lk->redis, NULL);
        return;
    }

    if (ngx_http_idem_is(&type, "message")
        && ngx_http_idem_reply_str(reply->element[2], &key) == NGX_OK
        && key.len == IDEM_RECORD_KEY_LEN)
    {
        ngx_http_idem_waiters_wake(lk->redis, key.data);
    }
}


static void
ngx_http_idem_link_handshake_send(ngx_http_idem_link_t *lk)
{
    char                    db[NGX_INT_T_LEN + 1];
    ngx_uint_t              i;
    ngx_http_idem_redis_t  *rd = lk->redis;

    if (rd->password.len && rd->user.len) {
        redisAsyncCommand(lk->ac, ngx_http_idem_link_handshake, "AUTH",
                          "AUTH %b %b", rd->user.data, rd->user.len,
                          rd->password.data, rd->password.len);

    } else if (rd->password.len) {
        redisAsyncCommand(lk->ac, ngx_http_idem_link_handshake, "AUTH",
                          "AUTH %b", rd->password.data, rd->password.len);
    }

    if (lk->subscriber) {
        /* channels are not per database: no SELECT */
        redisAsyncCommand(lk->ac, ngx_http_idem_link_message, NULL,
                          "SUBSCRIBE " NGX_HTTP_IDEM_CHANNEL);
        return;
    }

    if (rd->db) {
        *ngx_sprintf((u_char *) db, "%i", rd->db) = '\0';
        redisAsyncCommand(lk->ac, ngx_http_idem_link_handshake, "SELECT",
                          "SELECT %s", db);
    }

    for (i = 0; i < NGX_HTTP_IDEM_NSCRIPTS; i++) {
        redisAsyncCommand(lk->ac, ngx_http_idem_link_handshake,
                          "SCRIPT LOAD", "SCRIPT LOAD %b",
                          rd->scripts[i].text.data, rd->scripts[i].text.len);
    }
}


static void
ngx_http_idem_link_connect(ngx_http_idem_link_t *lk)
{
    ngx_connection_t       *c;
    redisAsyncContext      *ac;
    ngx_http_idem_redis_t  *rd = lk->redis;

    if (rd->port) {
        ac = redisAsyncConnect((char *) rd->host.data, rd->port);

    } else {
        ac = redisAsyncConnectUnix((char *) rd->host.data);
    }

    if (ac == NULL) {
        ngx_log_error(NGX_LOG_ALERT, rd->log, 0,
                      "idempotency: cannot allocate a redis context");
        ngx_http_idem_link_schedule(lk);
        return;
    }

    if (ac->err) {
        ngx_log_error(NGX_LOG_ERR, rd->log, 0,
                      "idempotency: connect to redis %V%s failed: %s",
                      &rd->name, ngx_http_idem_link_name(lk), ac->errstr);
        redisAsyncFree(ac);
        ngx_http_idem_link_schedule(lk);
        return;
    }

    c = ngx_get_connection(ac->c.fd, rd->log);
    if (c == NULL) {
        redisAsyncFree(ac);
        ngx_http_idem_link_schedule(lk);
        return;
    }

    c->data = lk;
    c->read->handler = ngx_http_idem_link_read_handler;
    c->write->handler = ngx_http_idem_link_write_handler;
    c->read->log = rd->log;
    c->write->log = rd->log;

    ac->data = lk;
    ac->ev.data = lk;
    ac->ev.addRead = ngx_http_idem_link_add_read;
    ac->ev.delRead = ngx_http_idem_link_del_read;
    ac->ev.addWrite = ngx_http_idem_link_add_write;
    ac->ev.delWrite = ngx_http_idem_link_del_write;
    ac->ev.cleanup = ngx_http_idem_link_cleanup;

    redisAsyncSetConnectCallback(ac, ngx_http_idem_link_on_connect);
    redisAsyncSetDisconnectCallback(ac, ngx_http_idem_link_on_disconnect);

    lk->ac = ac;
    lk->conn = c;
    lk->state = NGX_HTTP_IDEM_REDIS_CONNECTING;

    ngx_add_timer(&lk->connect_timer, rd->connect_timeout);

    ngx_http_idem_link_handshake_send(lk);

    /* the first writable event tells hiredis the connect finished */
    ngx_http_idem_link_add_write(lk);
}


static void
ngx_http_idem_link_schedule(ngx_http_idem_link_t *lk)
{
    if (lk->redis->exiting || lk->reconnect.timer_set) {
        return;
    }

    lk->backoff = lk->backoff ? ngx_min(lk->backoff * 2,
                                        NGX_HTTP_IDEM_BACKOFF_MAX)
                              : NGX_HTTP_IDEM_BACKOFF_MIN;

    ngx_add_timer(&lk->reconnect, lk->backoff);
}


static void
ngx_http_idem_link_reconnect_handler(ngx_event_t *ev)
{
    ngx_http_idem_link_t  *lk = ev->data;

    if (lk->ac == NULL && !lk->redis->exiting) {
        ngx_http_idem_link_connect(lk);
    }
}


/*
 * Freeing a context from inside one of its callbacks is not allowed, and
 * most recycles are decided there, so they run as a posted event.
 */
static void
ngx_http_idem_link_recycle_later(ngx_http_idem_link_t *lk)
{
    if (lk->ac == NULL) {
        return;
    }

    lk->state = NGX_HTTP_IDEM_REDIS_DOWN;
    lk->recycle_ac = lk->ac;

    if (!lk->recycle.posted) {
        ngx_post_event(&lk->recycle, &ngx_posted_events);
    }
}


static void
ngx_http_idem_link_recycle_handler(ngx_event_t *ev)
{
    ngx_http_idem_link_t  *lk = ev->data;

    redisAsyncContext  *ac;

    ac = lk->ac;

    if (ac == NULL || ac != lk->recycle_ac) {
        return;
    }

    lk->ac = NULL;
    lk->recycle_ac = NULL;
    lk->state = NGX_HTTP_IDEM_REDIS_DOWN;

    ngx_log_error(NGX_LOG_WARN, lk->redis->log, 0,
                  "idempotency: closing redis %V%s connection",
                  &lk->redis->name, ngx_http_idem_link_name(lk));

    /* fails every pending command (NULL replies), then closes the fd */
    redisAsyncFree(ac);

    ngx_http_idem_link_schedule(lk);
}


static void
ngx_http_idem_link_connect_timeout(ngx_event_t *ev)
{
    ngx_http_idem_link_t  *lk = ev->data;

    ngx_log_error(NGX_LOG_ERR, lk->redis->log, 0,
                  "idempotency: connect to redis %V%s timed out",
                  &lk->redis->name, ngx_http_idem_link_name(lk));

    ngx_http_idem_link_recycle_later(lk);
}


static void
ngx_http_idem_event_init(ngx_event_t *ev, ngx_event_handler_pt handler,
    void *data, ngx_log_t *log, ngx_uint_t cancelable)
{
    ngx_memzero(ev, sizeof(ngx_event_t));
    ev->handler = handler;
    ev->data = data;
    ev->log = log;
    ev->cancelable = cancelable;
}


static void
ngx_http_idem_link_init(ngx_http_idem_link_t *lk, ngx_http_idem_redis_t *rd,
    ngx_uint_t subscriber)
{
    lk->redis = rd;
    lk->subscriber = subscriber;

    ngx_http_idem_event_init(&lk->reconnect,
                             ngx_http_idem_link_reconnect_handler,
                             lk, rd->log, 1);
    ngx_http_idem_event_init(&lk->connect_timer,
                             ngx_http_idem_link_connect_timeout,
                             lk, rd->log, 1);
    ngx_http_idem_event_init(&lk->recycle,
                             ngx_http_idem_link_recycle_handler,
                             lk, rd->log, 1);

    ngx_http_idem_link_connect(lk);
}


static void
ngx_http_idem_link_close(ngx_http_idem_link_t *lk)
{
    redisAsyncContext  *ac;

    if (lk->redis == NULL) {
        return;                        /* never started */
    }

    if (lk->reconnect.timer_set) {
        ngx_del_timer(&lk->reconnect);
    }

    if (lk->connect_timer.timer_set) {
        ngx_del_timer(&lk->connect_timer);
    }

    if (lk->recycle.posted) {
        ngx_delete_posted_event(&lk->recycle);
    }

    ac = lk->ac;
    lk->ac = NULL;

    if (ac) {
        redisAsyncFree(ac);
    }
}


ngx_int_t
ngx_http_idem_redis_init_process(ngx_cycle_t *cycle)
{
    ngx_uint_t                  i;
    ngx_http_idem_redis_t     **servers, *rd;
    ngx_http_idem_main_conf_t  *mcf;

    mcf = ngx_http_cycle_get_module_main_conf(cycle,
                                              ngx_http_idempotency_module);
    if (mcf == NULL) {
        return NGX_OK;
    }

    servers = mcf->servers.elts;

    for (i = 0; i < mcf->servers.nelts; i++) {
        rd = servers[i];
        rd->log = cycle->log;
        rd->scripts = mcf->scripts;
        ngx_queue_init(&rd->waiters);
        ngx_queue_init(&rd->resend);

        ngx_http_idem_link_init(&rd->cmd, rd, 0);

        if (rd->subscribe) {
            ngx_http_idem_link_init(&rd->sub, rd, 1);
        }
    }

    return NGX_OK;
}


void
ngx_http_idem_redis_exit_process(ngx_cycle_t *cycle)
{
    ngx_uint_t                  i;
    ngx_http_idem_redis_t     **servers, *rd;
    ngx_http_idem_main_conf_t  *mcf;

    mcf = ngx_http_cycle_get_module_main_conf(cycle,
                                              ngx_http_idempotency_module);
    if (mcf == NULL) {
        return;
    }

    servers = mcf->servers.elts;

    for (i = 0; i < mcf->servers.nelts; i++) {
        rd = servers[i];
        rd->exiting = 1;

        ngx_http_idem_link_close(&rd->cmd);
        ngx_http_idem_link_close(&rd->sub);

        if (rd->resend_n) {
            ngx_log_error(NGX_LOG_WARN, rd->log, 0,
                          "idempotency: %ui results not recorded in redis "
                          "%V at exit; those records turn unknown",
                          rd->resend_n, &rd->name);
        }

        while (rd->resend.next && !ngx_queue_empty(&rd->resend)) {
            ngx_http_idem_cmd_t  *cmd;

            cmd = ngx_queue_data(ngx_queue_head(&rd->resend),
                                 ngx_http_idem_cmd_t, queue);
            ngx_queue_remove(&cmd->queue);
            ngx_free(cmd);
        }
    }
}


/* waiters: requests held back by idempotency_wait */

ngx_int_t
ngx_http_idem_wait_add(ngx_http_idem_redis_t *rd, ngx_http_idem_ctx_t *ctx)
{
    if (!rd->sub.subscribed) {
        /* nobody would tell us about the completion */
        return NGX_DECLINED;
    }

    ngx_queue_insert_tail(&rd->waiters, &ctx->wait_queue);
    ctx->waiting = 1;

    return NGX_OK;
}


void
ngx_http_idem_wait_remove(ngx_http_idem_ctx_t *ctx)
{
    if (ctx->waiting) {
        ngx_queue_remove(&ctx->wait_queue);
        ctx->waiting = 0;
    }
}


/* key NULL wakes every waiter */
static void
ngx_http_idem_waiters_wake(ngx_http_idem_redis_t *rd, u_char *key)
{
    ngx_queue_t          *q, *next;
    ngx_http_idem_ctx_t  *ctx;

    for (q = ngx_queue_head(&rd->waiters);
         q != ngx_queue_sentinel(&rd->waiters);
         q = next)
    {
        /* a woken request may finish, and leave the queue, at once */
        next = ngx_queue_next(q);
        ctx = ngx_queue_data(q, ngx_http_idem_ctx_t, wait_queue);

        if (key == NULL
            || ngx_memcmp(ctx->rkey, key, IDEM_RECORD_KEY_LEN) == 0)
        {
            ngx_http_idem_wake(ctx);
        }
    }
}


/* commands: EVALSHA <sha1> 1 <key> <args...>, resent as EVAL on NOSCRIPT */

ngx_http_idem_cmd_t *
ngx_http_idem_cmd_create(ngx_http_idem_redis_t *rd,
    ngx_http_idem_script_e script, ngx_uint_t argc, size_t size,
    ngx_log_t *log)
{
    size_t                n;
    ngx_http_idem_cmd_t  *cmd;

    n = argc + 3;

    cmd = ngx_alloc(sizeof(ngx_http_idem_cmd_t)
                    + n * (sizeof(char *) + sizeof(size_t)) + size, log);
    if (cmd == NULL) {
        return NULL;
    }

    ngx_memzero(cmd, sizeof(ngx_http_idem_cmd_t));
    cmd->size = size;

    cmd->redis = rd;
    cmd->script = script;
    cmd->argv = (const char **) (cmd + 1);
    cmd->argvlen = (size_t *) (cmd->argv + n);
    cmd->pos = (u_char *) (cmd->argvlen + n);

    cmd->argv[0] = "EVALSHA";
    cmd->argvlen[0] = sizeof("EVALSHA") - 1;
    cmd->argv[1] = (const char *) rd->scripts[script].sha1;
    cmd->argvlen[1] = NGX_HTTP_IDEM_SHA1_HEX;
    cmd->argv[2] = "1";
    cmd->argvlen[2] = 1;
    cmd->argc = 3;

    return cmd;
}


u_char *
ngx_http_idem_cmd_arg_reserve(ngx_http_idem_cmd_t *cmd, size_t len)
{
    u_char  *p;

    p = cmd->pos;
    cmd->argv[cmd->argc] = (const char *) p;
    cmd->argvlen[cmd->argc] = len;
    cmd->argc++;
    cmd->pos += len;

    return p;
}


void
ngx_http_idem_cmd_arg(ngx_http_idem_cmd_t *cmd, const void *data, size_t len)
{
    ngx_memcpy(ngx_http_idem_cmd_arg_reserve(cmd, len), data, len);
}


static void
ngx_http_idem_orphan_add(ngx_http_idem_cmd_t *cmd)
{
    ngx_http_idem_redis_t   *rd;
    ngx_http_idem_orphan_t  *o;

    rd = cmd->redis;

    if (cmd->script != NGX_HTTP_IDEM_SCRIPT_CLAIM || rd->exiting) {
        return;
    }

    if (rd->orphans == NULL) {
        rd->orphans = ngx_array_create(ngx_cycle->pool, 16,
                                       sizeof(ngx_http_idem_orphan_t));
        if (rd->orphans == NULL) {
            return;
        }
    }

    if (rd->orphans->nelts >= NGX_HTTP_IDEM_ORPHANS_MAX) {
        ngx_log_error(NGX_LOG_WARN, rd->log, 0,
                      "idempotency: too many unanswered claims, one will "
                      "turn unknown when its lease lapses");
        return;
    }

    o = ngx_array_push(rd->orphans);
    if (o == NULL) {
        return;
    }

    /* argv: EVALSHA sha 1 key fingerprint owner ... */
    ngx_memcpy(o->key, cmd->argv[3], IDEM_RECORD_KEY_LEN);
    ngx_memcpy(o->owner, cmd->argv[5], NGX_HTTP_IDEM_TOKEN_HEX);
}


static void
ngx_http_idem_orphans_release(ngx_http_idem_redis_t *rd)
{
    ngx_uint_t               i;
    ngx_http_idem_cmd_t     *cmd;
    ngx_http_idem_orphan_t  *o;

    if (rd->orphans == NULL || rd->orphans->nelts == 0) {
        return;
    }

    ngx_log_error(NGX_LOG_NOTICE, rd->log, 0,
                  "idempotency: releasing %ui unanswered claims",
                  rd->orphans->nelts);

    o = rd->orphans->elts;

    for (i = 0; i < rd->orphans->nelts; i++) {
        cmd = ngx_http_idem_cmd_create(rd, NGX_HTTP_IDEM_SCRIPT_RELEASE, 2,
                                       IDEM_RECORD_KEY_LEN
                                       + NGX_HTTP_IDEM_TOKEN_HEX, rd->log);
        if (cmd == NULL) {
            break;
        }

        ngx_http_idem_cmd_arg(cmd, o[i].key, IDEM_RECORD_KEY_LEN);
        ngx_http_idem_cmd_arg(cmd, o[i].owner, NGX_HTTP_IDEM_TOKEN_HEX);

        (void) ngx_http_idem_cmd_send(cmd, NULL, NULL);
    }

    rd->orphans->nelts = 0;
}


static ngx_int_t
ngx_http_idem_resend_later(ngx_http_idem_cmd_t *cmd)
{
    ngx_http_idem_redis_t  *rd;

    rd = cmd->redis;

    if (rd->exiting
        || (cmd->script != NGX_HTTP_IDEM_SCRIPT_COMPLETE
            && cmd->script != NGX_HTTP_IDEM_SCRIPT_RELEASE
            && cmd->script != NGX_HTTP_IDEM_SCRIPT_FAIL))
    {
        return NGX_DECLINED;
    }

    if (rd->resend_n >= NGX_HTTP_IDEM_RESEND_MAX
        || rd->resend_size + cmd->size > NGX_HTTP_IDEM_RESEND_BYTES)
    {
        ngx_log_error(NGX_LOG_WARN, rd->log, 0,
                      "idempotency: too many unrecorded results kept for "
                      "redis %V, one record turns unknown when its lease "
                      "lapses", &rd->name);
        return NGX_DECLINED;
    }

    cmd->failed = 0;
    rd->resend_n++;
    rd->resend_size += cmd->size;
    ngx_queue_insert_tail(&rd->resend, &cmd->queue);

    return NGX_OK;
}


static void
ngx_http_idem_resend(ngx_http_idem_redis_t *rd)
{
    ngx_queue_t          *q;
    ngx_http_idem_cmd_t  *cmd;

    if (rd->resend_n) {
        ngx_log_error(NGX_LOG_NOTICE, rd->log, 0,
                      "idempotency: sending %ui unrecorded results again",
                      rd->resend_n);
    }

    while (!ngx_queue_empty(&rd->resend)) {
        q = ngx_queue_head(&rd->resend);
        ngx_queue_remove(q);

        cmd = ngx_queue_data(q, ngx_http_idem_cmd_t, queue);
        rd->resend_n--;
        rd->resend_size -= cmd->size;

        (void) ngx_http_idem_cmd_send(cmd, cmd->handler, NULL);
    }
}


/*
 * A worker busy with other requests (large bodies to canonicalize) may
 * reach the timer before the read event of an answer already waiting on
 * the socket: read what is there first.  NGX_OK when the command's
 * callback ran meanwhile (the command is gone then).
 */
static ngx_int_t
ngx_http_idem_cmd_drain(ngx_http_idem_redis_t *rd, ngx_http_idem_cmd_t *cmd)
{
    int         n;
    ngx_uint_t  i;

    rd->timing_out = cmd;

    for (i = 0; i < 256 && rd->timing_out == cmd; i++) {
        if (rd->cmd.ac == NULL || rd->cmd.conn == NULL
            || ioctl(rd->cmd.conn->fd, FIONREAD, &n) == -1 || n <= 0)
        {
            break;
        }

        redisAsyncHandleRead(rd->cmd.ac);
    }

    if (rd->timing_out != cmd) {
        return NGX_OK;
    }

    rd->timing_out = NULL;

    return NGX_DECLINED;
}


static void
ngx_http_idem_cmd_timeout(ngx_event_t *ev)
{
    ngx_http_idem_cmd_t  *cmd = ev->data;

    ngx_http_idem_redis_t  *rd;

    rd = cmd->redis;

    if (ngx_http_idem_cmd_drain(rd, cmd) == NGX_OK) {
        return;
    }

    ngx_log_error(NGX_LOG_ERR, rd->log, 0,
                  "idempotency: redis %V command timed out", &rd->name);

    /* the command stays allocated until hiredis lets go of it */
    cmd->failed = 1;
    ngx_http_idem_orphan_add(cmd);

    if (cmd->handler && cmd->data) {
        cmd->handler(cmd, NULL);
    }

    ngx_http_idem_link_recycle_later(&rd->cmd);
}


/*
 * The command in the Redis protocol, formatted here: hiredis's formatter
 * (sdscatfmt() per argument) was a seventh of a first write's instructions
 * in the worker (bench/RESULTS.md).  Short commands are built on the stack;
 * hiredis copies them into its output buffer either way.
 */
#define NGX_HTTP_IDEM_CMD_STACK  2048

static int
ngx_http_idem_cmd_write(redisAsyncContext *ac, ngx_http_idem_cmd_t *cmd)
{
    u_char      stack[NGX_HTTP_IDEM_CMD_STACK], *buf, *p;
    size_t      len;
    ngx_uint_t  i;
    int         rc;

    len = sizeof("*\r\n") - 1 + NGX_SIZE_T_LEN;

    for (i = 0; i < cmd->argc; i++) {
        len += sizeof("$\r\n\r\n") - 1 + NGX_SIZE_T_LEN + cmd->argvlen[i];
    }

    buf = (len <= sizeof(stack)) ? stack : ngx_alloc(len, cmd->redis->log);
    if (buf == NULL) {
        return REDIS_ERR;
    }

    p = ngx_sprintf(buf, "*%ui\r\n", cmd->argc);

    for (i = 0; i < cmd->argc; i++) {
        p = ngx_sprintf(p, "$%uz\r\n", cmd->argvlen[i]);
        p = ngx_cpymem(p, cmd->argv[i], cmd->argvlen[i]);
        *p++ = CR;
        *p++ = LF;
    }

    rc = redisAsyncFormattedCommand(ac, ngx_http_idem_redis_reply, cmd,
                                    (const char *) buf, p - buf);

    if (buf != stack) {
        ngx_free(buf);
    }

    return rc;
}


ngx_int_t
ngx_http_idem_cmd_send(ngx_http_idem_cmd_t *cmd,
    ngx_http_idem_reply_pt handler, void *data)
{
    ngx_http_idem_redis_t  *rd;

    rd = cmd->redis;

    if (rd->cmd.ac == NULL || rd->cmd.state == NGX_HTTP_IDEM_REDIS_DOWN) {
        ngx_free(cmd);
        return NGX_ERROR;
    }

    cmd->handler = handler;
    cmd->data = data;

    if (ngx_http_idem_cmd_write(rd->cmd.ac, cmd) != REDIS_OK) {
        /* disconnecting: no callback will ever come for this one */
        ngx_free(cmd);
        return NGX_ERROR;
    }

    ngx_http_idem_event_init(&cmd->timer, ngx_http_idem_cmd_timeout, cmd,
                             rd->log, 0);
    ngx_add_timer(&cmd->timer, rd->timeout);

    return NGX_OK;
}


static ngx_uint_t
ngx_http_idem_is_noscript(redisReply *reply)
{
    return reply->type == REDIS_REPLY_ERROR
           && reply->len >= 8
           && ngx_strncmp(reply->str, "NOSCRIPT", 8) == 0;
}


static void
ngx_http_idem_redis_reply(redisAsyncContext *ac, void *r, void *privdata)
{
    redisReply           *reply = r;
    ngx_http_idem_cmd_t  *cmd = privdata;

    ngx_http_idem_script_t  *s;

    if (reply && !cmd->eval && ngx_http_idem_is_noscript(reply)) {
        /* Redis restarted or failed over: its script cache is empty */
        s = &cmd->redis->scripts[cmd->script];

        cmd->eval = 1;
        cmd->argv[0] = "EVAL";
        cmd->argvlen[0] = sizeof("EVAL") - 1;
        cmd->argv[1] = (const char *) s->text.data;
        cmd->argvlen[1] = s->text.len;

        if (ngx_http_idem_cmd_write(ac, cmd) == REDIS_OK) {
            return;
        }

        reply = NULL;
    }

    if (cmd->timer.timer_set) {
        ngx_del_timer(&cmd->timer);
    }

    if (cmd->redis->timing_out == cmd) {
        cmd->redis->timing_out = NULL;
    }

    if (reply == NULL && !cmd->failed) {
        /* written, maybe executed, never answered: the connection went */
        ngx_http_idem_orphan_add(cmd);
    }

    if (reply == NULL && ngx_http_idem_resend_later(cmd) == NGX_OK) {
        return;
    }

    if (!cmd->failed && cmd->handler) {
        cmd->handler(cmd, reply);
    }

    ngx_free(cmd);
}
