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


static void ngx_http_idem_redis_connect(ngx_http_idem_redis_t *rd);
static void ngx_http_idem_redis_schedule(ngx_http_idem_redis_t *rd);
static void ngx_http_idem_redis_recycle_later(ngx_http_idem_redis_t *rd);
static void ngx_http_idem_redis_reply(redisAsyncContext *ac, void *r,
    void *privdata);
static void ngx_http_idem_orphans_release(ngx_http_idem_redis_t *rd);


static const char  *ngx_http_idem_script_texts[NGX_HTTP_IDEM_NSCRIPTS] = {
    ngx_http_idem_script_claim,
    ngx_http_idem_script_complete,
    ngx_http_idem_script_release,
    ngx_http_idem_script_fail,
    ngx_http_idem_script_renew,
    ngx_http_idem_script_status,
    ngx_http_idem_script_admin
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
        s[i].text.data = (u_char *) ngx_http_idem_script_texts[i];
        s[i].text.len = ngx_strlen(ngx_http_idem_script_texts[i]);

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
ngx_http_idem_redis_add(ngx_http_idem_redis_t *rd, ngx_uint_t write)
{
    ngx_event_t  *ev;

    if (rd->conn == NULL) {
        return;
    }

    ev = write ? rd->conn->write : rd->conn->read;

    if (!ev->active) {
        if (ngx_add_event(ev, write ? NGX_WRITE_EVENT : NGX_READ_EVENT,
                          NGX_LEVEL_EVENT)
            != NGX_OK)
        {
            ngx_http_idem_redis_recycle_later(rd);
        }
    }
}


static void
ngx_http_idem_redis_del(ngx_http_idem_redis_t *rd, ngx_uint_t write)
{
    ngx_event_t  *ev;

    if (rd->conn == NULL) {
        return;
    }

    ev = write ? rd->conn->write : rd->conn->read;

    if (ev->active) {
        ngx_del_event(ev, write ? NGX_WRITE_EVENT : NGX_READ_EVENT, 0);
    }
}


static void
ngx_http_idem_redis_add_read(void *privdata)
{
    ngx_http_idem_redis_add(privdata, 0);
}


static void
ngx_http_idem_redis_del_read(void *privdata)
{
    ngx_http_idem_redis_del(privdata, 0);
}


static void
ngx_http_idem_redis_add_write(void *privdata)
{
    ngx_http_idem_redis_add(privdata, 1);
}


static void
ngx_http_idem_redis_del_write(void *privdata)
{
    ngx_http_idem_redis_del(privdata, 1);
}


/*
 * hiredis closes the fd itself (redisFree), so the nginx connection is
 * only unhooked and returned, never closed: one fd, one close.
 */
static void
ngx_http_idem_redis_cleanup(void *privdata)
{
    ngx_http_idem_redis_t  *rd = privdata;

    ngx_connection_t  *c;

    c = rd->conn;
    if (c == NULL) {
        return;
    }

    rd->conn = NULL;

    ngx_http_idem_redis_del(rd, 0);
    ngx_http_idem_redis_del(rd, 1);

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
ngx_http_idem_redis_read_handler(ngx_event_t *ev)
{
    ngx_connection_t       *c = ev->data;
    ngx_http_idem_redis_t  *rd = c->data;

    if (rd->ac) {
        redisAsyncHandleRead(rd->ac);
    }
}


static void
ngx_http_idem_redis_write_handler(ngx_event_t *ev)
{
    ngx_connection_t       *c = ev->data;
    ngx_http_idem_redis_t  *rd = c->data;

    if (rd->ac) {
        redisAsyncHandleWrite(rd->ac);
    }
}


static void
ngx_http_idem_redis_on_connect(const redisAsyncContext *ac, int status)
{
    ngx_http_idem_redis_t  *rd = ac->data;

    if (rd->connect_timer.timer_set) {
        ngx_del_timer(&rd->connect_timer);
    }

    if (status != REDIS_OK) {
        ngx_log_error(NGX_LOG_ERR, rd->log, 0,
                      "idempotency: connect to redis %V failed: %s",
                      &rd->name, ac->errstr);

        /* hiredis frees the context right after this callback */
        rd->ac = NULL;
        rd->state = NGX_HTTP_IDEM_REDIS_DOWN;
        ngx_http_idem_redis_schedule(rd);
        return;
    }

    ngx_log_error(NGX_LOG_INFO, rd->log, 0,
                  "idempotency: connected to redis %V", &rd->name);

    rd->state = NGX_HTTP_IDEM_REDIS_READY;
    rd->backoff = 0;

    ngx_http_idem_orphans_release(rd);
}


static void
ngx_http_idem_redis_on_disconnect(const redisAsyncContext *ac, int status)
{
    ngx_http_idem_redis_t  *rd = ac->data;

    if (rd->ac == ac) {
        rd->ac = NULL;
    }

    rd->state = NGX_HTTP_IDEM_REDIS_DOWN;

    if (status != REDIS_OK && !rd->exiting) {
        ngx_log_error(NGX_LOG_ERR, rd->log, 0,
                      "idempotency: redis %V connection lost: %s",
                      &rd->name, ac->errstr ? ac->errstr : "closed");
    }

    ngx_http_idem_redis_schedule(rd);
}


static void
ngx_http_idem_redis_handshake(redisAsyncContext *ac, void *r, void *privdata)
{
    redisReply             *reply = r;
    ngx_http_idem_redis_t  *rd = ac->data;

    if (reply == NULL || reply->type != REDIS_REPLY_ERROR) {
        return;
    }

    ngx_log_error(NGX_LOG_ERR, rd->log, 0,
                  "idempotency: redis %V: %s failed: %*s", &rd->name,
                  (char *) privdata, (int) reply->len, reply->str);

    ngx_http_idem_redis_recycle_later(rd);
}


static void
ngx_http_idem_redis_handshake_send(ngx_http_idem_redis_t *rd)
{
    char        db[NGX_INT_T_LEN + 1];
    ngx_uint_t  i;

    if (rd->password.len && rd->user.len) {
        redisAsyncCommand(rd->ac, ngx_http_idem_redis_handshake, "AUTH",
                          "AUTH %b %b", rd->user.data, rd->user.len,
                          rd->password.data, rd->password.len);

    } else if (rd->password.len) {
        redisAsyncCommand(rd->ac, ngx_http_idem_redis_handshake, "AUTH",
                          "AUTH %b", rd->password.data, rd->password.len);
    }

    if (rd->db) {
        *ngx_sprintf((u_char *) db, "%i", rd->db) = '\0';
        redisAsyncCommand(rd->ac, ngx_http_idem_redis_handshake, "SELECT",
                          "SELECT %s", db);
    }

    for (i = 0; i < NGX_HTTP_IDEM_NSCRIPTS; i++) {
        redisAsyncCommand(rd->ac, ngx_http_idem_redis_handshake,
                          "SCRIPT LOAD", "SCRIPT LOAD %b",
                          rd->scripts[i].text.data, rd->scripts[i].text.len);
    }
}


static void
ngx_http_idem_redis_connect(ngx_http_idem_redis_t *rd)
{
    ngx_connection_t   *c;
    redisAsyncContext  *ac;

    if (rd->port) {
        ac = redisAsyncConnect((char *) rd->host.data, rd->port);

    } else {
        ac = redisAsyncConnectUnix((char *) rd->host.data);
    }

    if (ac == NULL) {
        ngx_log_error(NGX_LOG_ALERT, rd->log, 0,
                      "idempotency: cannot allocate a redis context");
        ngx_http_idem_redis_schedule(rd);
        return;
    }

    if (ac->err) {
        ngx_log_error(NGX_LOG_ERR, rd->log, 0,
                      "idempotency: connect to redis %V failed: %s",
                      &rd->name, ac->errstr);
        redisAsyncFree(ac);
        ngx_http_idem_redis_schedule(rd);
        return;
    }

    c = ngx_get_connection(ac->c.fd, rd->log);
    if (c == NULL) {
        redisAsyncFree(ac);
        ngx_http_idem_redis_schedule(rd);
        return;
    }

    c->data = rd;
    c->read->handler = ngx_http_idem_redis_read_handler;
    c->write->handler = ngx_http_idem_redis_write_handler;
    c->read->log = rd->log;
    c->write->log = rd->log;

    ac->data = rd;
    ac->ev.data = rd;
    ac->ev.addRead = ngx_http_idem_redis_add_read;
    ac->ev.delRead = ngx_http_idem_redis_del_read;
    ac->ev.addWrite = ngx_http_idem_redis_add_write;
    ac->ev.delWrite = ngx_http_idem_redis_del_write;
    ac->ev.cleanup = ngx_http_idem_redis_cleanup;

    redisAsyncSetConnectCallback(ac, ngx_http_idem_redis_on_connect);
    redisAsyncSetDisconnectCallback(ac, ngx_http_idem_redis_on_disconnect);

    rd->ac = ac;
    rd->conn = c;
    rd->state = NGX_HTTP_IDEM_REDIS_CONNECTING;

    ngx_add_timer(&rd->connect_timer, rd->connect_timeout);

    ngx_http_idem_redis_handshake_send(rd);

    /* the first writable event tells hiredis the connect finished */
    ngx_http_idem_redis_add_write(rd);
}


static void
ngx_http_idem_redis_schedule(ngx_http_idem_redis_t *rd)
{
    if (rd->exiting || rd->reconnect.timer_set) {
        return;
    }

    rd->backoff = rd->backoff ? ngx_min(rd->backoff * 2,
                                        NGX_HTTP_IDEM_BACKOFF_MAX)
                              : NGX_HTTP_IDEM_BACKOFF_MIN;

    ngx_add_timer(&rd->reconnect, rd->backoff);
}


static void
ngx_http_idem_redis_reconnect_handler(ngx_event_t *ev)
{
    ngx_http_idem_redis_t  *rd = ev->data;

    if (rd->ac == NULL && !rd->exiting) {
        ngx_http_idem_redis_connect(rd);
    }
}


/*
 * Freeing a context from inside one of its callbacks is not allowed, and
 * most recycles are decided there, so they run as a posted event.
 */
static void
ngx_http_idem_redis_recycle_later(ngx_http_idem_redis_t *rd)
{
    if (rd->ac == NULL) {
        return;
    }

    rd->state = NGX_HTTP_IDEM_REDIS_DOWN;
    rd->recycle_ac = rd->ac;

    if (!rd->recycle.posted) {
        ngx_post_event(&rd->recycle, &ngx_posted_events);
    }
}


static void
ngx_http_idem_redis_recycle_handler(ngx_event_t *ev)
{
    ngx_http_idem_redis_t  *rd = ev->data;

    redisAsyncContext  *ac;

    ac = rd->ac;

    if (ac == NULL || ac != rd->recycle_ac) {
        return;
    }

    rd->ac = NULL;
    rd->recycle_ac = NULL;
    rd->state = NGX_HTTP_IDEM_REDIS_DOWN;

    ngx_log_error(NGX_LOG_WARN, rd->log, 0,
                  "idempotency: closing redis %V connection", &rd->name);

    /* fails every pending command (NULL replies), then closes the fd */
    redisAsyncFree(ac);

    ngx_http_idem_redis_schedule(rd);
}


static void
ngx_http_idem_redis_connect_timeout(ngx_event_t *ev)
{
    ngx_http_idem_redis_t  *rd = ev->data;

    ngx_log_error(NGX_LOG_ERR, rd->log, 0,
                  "idempotency: connect to redis %V timed out", &rd->name);

    ngx_http_idem_redis_recycle_later(rd);
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

        ngx_http_idem_event_init(&rd->reconnect,
                                 ngx_http_idem_redis_reconnect_handler,
                                 rd, rd->log, 1);
        ngx_http_idem_event_init(&rd->connect_timer,
                                 ngx_http_idem_redis_connect_timeout,
                                 rd, rd->log, 1);
        ngx_http_idem_event_init(&rd->recycle,
                                 ngx_http_idem_redis_recycle_handler,
                                 rd, rd->log, 1);

        ngx_http_idem_redis_connect(rd);
    }

    return NGX_OK;
}


void
ngx_http_idem_redis_exit_process(ngx_cycle_t *cycle)
{
    ngx_uint_t                  i;
    redisAsyncContext          *ac;
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

        if (rd->reconnect.timer_set) {
            ngx_del_timer(&rd->reconnect);
        }

        if (rd->connect_timer.timer_set) {
            ngx_del_timer(&rd->connect_timer);
        }

        if (rd->recycle.posted) {
            ngx_delete_posted_event(&rd->recycle);
        }

        ac = rd->ac;
        rd->ac = NULL;

        if (ac) {
            redisAsyncFree(ac);
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


static void
ngx_http_idem_cmd_timeout(ngx_event_t *ev)
{
    ngx_http_idem_cmd_t  *cmd = ev->data;

    ngx_http_idem_redis_t  *rd;

    rd = cmd->redis;

    ngx_log_error(NGX_LOG_ERR, rd->log, 0,
                  "idempotency: redis %V command timed out", &rd->name);

    /* the command stays allocated until hiredis lets go of it */
    cmd->failed = 1;
    ngx_http_idem_orphan_add(cmd);

    if (cmd->handler) {
        cmd->handler(cmd, NULL);
    }

    ngx_http_idem_redis_recycle_later(rd);
}


ngx_int_t
ngx_http_idem_cmd_send(ngx_http_idem_cmd_t *cmd,
    ngx_http_idem_reply_pt handler, void *data)
{
    ngx_http_idem_redis_t  *rd;

    rd = cmd->redis;

    if (rd->ac == NULL || rd->state == NGX_HTTP_IDEM_REDIS_DOWN) {
        ngx_free(cmd);
        return NGX_ERROR;
    }

    cmd->handler = handler;
    cmd->data = data;

    if (redisAsyncCommandArgv(rd->ac, ngx_http_idem_redis_reply, cmd,
                              (int) cmd->argc, cmd->argv, cmd->argvlen)
        != REDIS_OK)
    {
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

        if (redisAsyncCommandArgv(ac, ngx_http_idem_redis_reply, cmd,
                                  (int) cmd->argc, cmd->argv, cmd->argvlen)
            == REDIS_OK)
        {
            return;
        }

        reply = NULL;
    }

    if (cmd->timer.timer_set) {
        ngx_del_timer(&cmd->timer);
    }

    if (reply == NULL && !cmd->failed) {
        /* written, maybe executed, never answered: the connection went */
        ngx_http_idem_orphan_add(cmd);
    }

    if (!cmd->failed && cmd->handler) {
        cmd->handler(cmd, reply);
    }

    ngx_free(cmd);
}
