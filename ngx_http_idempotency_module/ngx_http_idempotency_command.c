/*
 * A command's arguments and a reply's parts: what the senders build and
 * read, apart from any connection.  A command is one block of memory (the
 * struct, argv, argvlen, then the argument bytes), so it is copied, kept
 * for a resend and freed whole.
 */

#include <ngx_config.h>
#include <ngx_core.h>
#include <ngx_event.h>

#include "ngx_http_idempotency_command.h"


/*
 * Commands: a script, EVALSHA <sha1> 1 <key> <args...> (resent as EVAL on
 * NOSCRIPT), or a native command, <name> <key> <args...>.  Either way the
 * arguments after the key are set by name: index 0 is the first one.
 */

static ngx_http_idem_cmd_t *
ngx_http_idem_cmd_alloc(ngx_http_idem_redis_t *rd, ngx_uint_t argc,
    const u_char *key, size_t size, ngx_log_t *log)
{
    ngx_http_idem_cmd_t  *cmd;

    size += key ? IDEM_RECORD_KEY_LEN : 0;

    cmd = ngx_alloc(sizeof(ngx_http_idem_cmd_t)
                    + argc * (sizeof(char *) + sizeof(size_t)) + size, log);
    if (cmd == NULL) {
        return NULL;
    }

    ngx_memzero(cmd, sizeof(ngx_http_idem_cmd_t));

    cmd->size = size;
    cmd->redis = rd;
    cmd->argc = argc;
    cmd->argv = (const char **) (cmd + 1);
    cmd->argvlen = (size_t *) (cmd->argv + argc);
    cmd->pos = (u_char *) (cmd->argvlen + argc);

    ngx_memzero(cmd->argv, argc * sizeof(char *));
    ngx_memzero(cmd->argvlen, argc * sizeof(size_t));

    if (key) {
        cmd->key = cmd->pos;
        cmd->pos = ngx_cpymem(cmd->pos, key, IDEM_RECORD_KEY_LEN);
    }

    return cmd;
}


ngx_http_idem_cmd_t *
ngx_http_idem_cmd_create(ngx_http_idem_redis_t *rd,
    ngx_http_idem_script_e script, const u_char *key, size_t size,
    ngx_log_t *log)
{
    return ngx_http_idem_cmd_create_keys(rd, script, key, NULL, 0, size,
                                         log);
}


/*
 * A script of the record key and n more keys (at most 4: the unique key,
 * the lock key and the key naming the lock of idempotency_unique and
 * idempotency_lock, the audit stream): they are the script's KEYS[2..n+1].
 */
ngx_http_idem_cmd_t *
ngx_http_idem_cmd_create_keys(ngx_http_idem_redis_t *rd,
    ngx_http_idem_script_e script, const u_char *key, u_char **keys,
    ngx_uint_t n, size_t size, ngx_log_t *log)
{
    return ngx_http_idem_cmd_create_more(rd, script, key, keys, n, 0, size,
                                         log);
}


/* the same with "more" arguments after the script's named ones */
ngx_http_idem_cmd_t *
ngx_http_idem_cmd_create_more(ngx_http_idem_redis_t *rd,
    ngx_http_idem_script_e script, const u_char *key, u_char **keys,
    ngx_uint_t n, ngx_uint_t more, size_t size, ngx_log_t *log)
{
    ngx_uint_t            i;
    ngx_http_idem_cmd_t  *cmd;

    /* 18: the records of a batch of completions, the stream, its head */
    static const char    *numkeys[] = { "1", "2", "3", "4", "5", "6", "7",
                                        "8", "9", "10", "11", "12", "13",
                                        "14", "15", "16", "17", "18" };

    if (n >= sizeof(numkeys) / sizeof(numkeys[0])) {
        return NULL;
    }

    for (i = 0; i < n; i++) {
        size += ngx_strlen(keys[i]);
    }

    cmd = ngx_http_idem_cmd_alloc(rd, 4 + n + rd->scripts[script].nargs + more,
                                  key, size, log);
    if (cmd == NULL) {
        return NULL;
    }

    cmd->script = script;
    cmd->arg0 = 4 + n;

    cmd->argv[0] = "EVALSHA";
    cmd->argvlen[0] = sizeof("EVALSHA") - 1;
    cmd->argv[1] = (const char *) rd->scripts[script].sha1;
    cmd->argvlen[1] = NGX_HTTP_IDEM_SHA1_HEX;
    cmd->argv[2] = numkeys[n];
    cmd->argvlen[2] = ngx_strlen(numkeys[n]);
    cmd->argv[3] = (const char *) cmd->key;
    cmd->argvlen[3] = IDEM_RECORD_KEY_LEN;

    for (i = 0; i < n; i++) {
        cmd->argv[4 + i] = (const char *) cmd->pos;
        cmd->argvlen[4 + i] = ngx_strlen(keys[i]);
        cmd->pos = ngx_cpymem(cmd->pos, keys[i], cmd->argvlen[4 + i]);
    }

    return cmd;
}


ngx_http_idem_cmd_t *
ngx_http_idem_cmd_native(ngx_http_idem_redis_t *rd, ngx_str_t *name,
    ngx_uint_t nargs, const u_char *key, size_t size, ngx_log_t *log)
{
    ngx_http_idem_cmd_t  *cmd;

    cmd = ngx_http_idem_cmd_alloc(rd, 2 + nargs, key, size, log);
    if (cmd == NULL) {
        return NULL;
    }

    cmd->script = NGX_HTTP_IDEM_NSCRIPTS;
    cmd->arg0 = 2;

    cmd->argv[0] = (const char *) name->data;
    cmd->argvlen[0] = name->len;
    cmd->argv[1] = (const char *) cmd->key;
    cmd->argvlen[1] = IDEM_RECORD_KEY_LEN;

    return cmd;
}


void
ngx_http_idem_cmd_sibling(ngx_http_idem_cmd_t *cmd, const u_char *sub,
    size_t sublen)
{
    /* the key is the block's first bytes: the sibling's name goes on */
    cmd->pos = ngx_cpymem(cmd->pos, sub, sublen);
    cmd->argvlen[1] = IDEM_RECORD_KEY_LEN + sublen;
}


/*
 * A copy of a command to send again (its handler changes it first): the
 * same arguments, in a block of its own.
 */
ngx_http_idem_cmd_t *
ngx_http_idem_cmd_copy(ngx_http_idem_cmd_t *cmd)
{
    u_char               *old, *end;
    size_t                n;
    ngx_uint_t            i;
    ngx_http_idem_cmd_t  *copy;

    n = sizeof(ngx_http_idem_cmd_t)
        + cmd->argc * (sizeof(char *) + sizeof(size_t)) + cmd->size;

    copy = ngx_alloc(n, cmd->redis->log);
    if (copy == NULL) {
        return NULL;
    }

    ngx_memcpy(copy, cmd, n);

    old = (u_char *) cmd;
    end = old + n;

    copy->argv = (const char **) (copy + 1);
    copy->argvlen = (size_t *) (copy->argv + copy->argc);

    /* the arguments in the block move with it; "EVALSHA" and the like not */
    for (i = 0; i < copy->argc; i++) {
        if ((u_char *) copy->argv[i] >= old && (u_char *) copy->argv[i] < end) {
            copy->argv[i] = (const char *) copy
                            + ((u_char *) copy->argv[i] - old);
        }
    }

    copy->pos = (u_char *) copy + (cmd->pos - old);
    copy->key = cmd->key ? (u_char *) copy + (cmd->key - old) : NULL;

    /* sent afresh: routed again, never redirected yet */
    ngx_memzero(&copy->timer, sizeof(ngx_event_t));
    copy->told = 0;
    copy->resent = 0;
    copy->held = 0;
    copy->handler = NULL;
    copy->data = NULL;
    copy->link = cmd->pinned ? cmd->link : NULL;
    copy->redirects = 0;
    copy->asking = 0;

    return copy;
}


ngx_http_idem_cmd_t *
ngx_http_idem_cmd_pinned(ngx_http_idem_link_t *lk, ngx_str_t *words,
    ngx_uint_t n, ngx_uint_t nargs, size_t size)
{
    ngx_uint_t            i;
    ngx_http_idem_cmd_t  *cmd;

    cmd = ngx_http_idem_cmd_alloc(lk->redis, n + nargs, NULL, size,
                                  lk->redis->log);
    if (cmd == NULL) {
        return NULL;
    }

    cmd->script = NGX_HTTP_IDEM_NSCRIPTS;
    cmd->arg0 = n;
    cmd->link = lk;
    cmd->pinned = 1;

    for (i = 0; i < n; i++) {
        cmd->argv[i] = (const char *) words[i].data;
        cmd->argvlen[i] = words[i].len;
    }

    return cmd;
}


ngx_http_idem_cmd_t *
ngx_http_idem_cmd_on_link(ngx_http_idem_link_t *lk, ngx_str_t *words,
    ngx_uint_t n)
{
    return ngx_http_idem_cmd_pinned(lk, words, n, 0, 0);
}


/* room for the argument named arg (an NGX_HTTP_IDEM_<SCRIPT>_<NAME>) */
u_char *
ngx_http_idem_cmd_reserve(ngx_http_idem_cmd_t *cmd, ngx_uint_t arg, size_t len)
{
    u_char  *p;

    p = cmd->pos;
    cmd->argv[cmd->arg0 + arg] = (const char *) p;
    cmd->argvlen[cmd->arg0 + arg] = len;
    cmd->pos += len;

    return p;
}


void
ngx_http_idem_cmd_set(ngx_http_idem_cmd_t *cmd, ngx_uint_t arg,
    const void *data, size_t len)
{
    u_char  *p;

    p = ngx_http_idem_cmd_reserve(cmd, arg, len);

    /* an empty argument may come as a NULL ngx_str_t: memcpy() must not see it */
    if (len) {
        ngx_memcpy(p, data, len);
    }
}


/* a decimal argument; the command's size counted NGX_INT64_LEN for it */
void
ngx_http_idem_cmd_set_num(ngx_http_idem_cmd_t *cmd, ngx_uint_t arg,
    int64_t n)
{
    u_char  *p;

    p = cmd->pos;
    cmd->pos = ngx_sprintf(p, "%L", n);
    cmd->argv[cmd->arg0 + arg] = (const char *) p;
    cmd->argvlen[cmd->arg0 + arg] = cmd->pos - p;
}


/* an argument the caller writes at the returned place, then ends with _end */
u_char *
ngx_http_idem_cmd_start(ngx_http_idem_cmd_t *cmd, ngx_uint_t arg)
{
    cmd->argv[cmd->arg0 + arg] = (const char *) cmd->pos;

    return cmd->pos;
}


void
ngx_http_idem_cmd_end(ngx_http_idem_cmd_t *cmd, ngx_uint_t arg, u_char *end)
{
    cmd->argvlen[cmd->arg0 + arg] = end - cmd->pos;
    cmd->pos = end;
}


ngx_str_t
ngx_http_idem_cmd_get(ngx_http_idem_cmd_t *cmd, ngx_uint_t arg)
{
    ngx_str_t  s;

    s.data = (u_char *) cmd->argv[cmd->arg0 + arg];
    s.len = cmd->argvlen[cmd->arg0 + arg];

    return s;
}


ngx_str_t
ngx_http_idem_cmd_key(ngx_http_idem_cmd_t *cmd)
{
    ngx_str_t  s;

    s.data = cmd->key;
    s.len = IDEM_RECORD_KEY_LEN;

    return s;
}


/* reply helpers */

ngx_int_t
ngx_http_idem_reply_str(redisReply *e, ngx_str_t *s)
{
    if (e->type != REDIS_REPLY_STRING && e->type != REDIS_REPLY_STATUS) {
        return NGX_ERROR;
    }

    s->data = (u_char *) e->str;
    s->len = e->len;

    return NGX_OK;
}


/*
 * A script's answer of the form {"<word>", ...}: an array whose first
 * element is that string.
 */
ngx_uint_t
ngx_http_idem_reply_tagged(redisReply *reply, const char *word)
{
    size_t  len;

    len = ngx_strlen(word);

    return reply->type == REDIS_REPLY_ARRAY && reply->elements > 0
           && reply->element[0]->type == REDIS_REPLY_STRING
           && reply->element[0]->len == len
           && ngx_strncmp(reply->element[0]->str, word, len) == 0;
}


/*
 * An error reply that is about the data under the module's key (our own
 * script's complaint, or a foreign value), not about reaching Redis:
 * store-error rather than store-unavailable.
 */
ngx_uint_t
ngx_http_idem_reply_corrupt(redisReply *reply)
{
    return reply->type == REDIS_REPLY_ERROR
           && (ngx_strstr(reply->str, "IDEMCORRUPT")
               || ngx_strstr(reply->str, "WRONGTYPE"));
}


/*
 * The elements of an array reply as the pure-C decoders take them: the
 * first max of them in el, the reply's element count returned.
 */
size_t
ngx_http_idem_reply_elements(redisReply *reply, idem_rv_t *el, size_t max)
{
    size_t       i, n;
    redisReply  *e;

    n = ngx_min(reply->elements, max);

    for (i = 0; i < n; i++) {
        e = reply->element[i];
        el[i].is_str = (e->type == REDIS_REPLY_STRING
                        || e->type == REDIS_REPLY_STATUS);
        el[i].data = el[i].is_str ? e->str : NULL;
        el[i].len = el[i].is_str ? e->len : 0;
    }

    return reply->elements;
}
