/*
 * JSON-RPC framing and dispatch of idempotency-mcp (mcp_rpc.h).  Bad input
 * of any kind is answered (-32700, -32600, -32601, -32602) and the server
 * goes on: only the end of stdin ends it.
 */

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "mcp_tools.h"
#include "mcp_rpc.h"

#define RPC_PARSE_ERROR       -32700
#define RPC_INVALID_REQUEST   -32600
#define RPC_METHOD_NOT_FOUND  -32601
#define RPC_INVALID_PARAMS    -32602

static const char  *rpc_versions[] = {
    "2025-11-25", "2025-06-18", "2025-03-26", NULL
};


void
mcp_log(const char *fmt, ...)
{
    va_list  ap;
    char     line[1024];

    va_start(ap, fmt);
    vsnprintf(line, sizeof(line), fmt, ap);
    va_end(ap);
    fprintf(stderr, "idempotency-mcp: %s\n", line);
}


void
mcp_server_init(mcp_server_t *s, const mcp_config_t *cf)
{
    memset(s, 0, sizeof(mcp_server_t));
    s->cf = cf;
    pthread_mutex_init(&s->out_lock, NULL);
    pthread_mutex_init(&s->calls_lock, NULL);
    pthread_cond_init(&s->calls_done, NULL);
}


/* one message, one line, never interleaved with another thread's */
static void
rpc_send(mcp_server_t *s, cJSON *msg)
{
    char  *text = cJSON_PrintUnformatted(msg);

    cJSON_Delete(msg);
    if (text == NULL) {
        mcp_log("out of memory: a message was not sent");
        return;
    }

    pthread_mutex_lock(&s->out_lock);
    fputs(text, stdout);
    fputc('\n', stdout);
    fflush(stdout);
    pthread_mutex_unlock(&s->out_lock);
    free(text);
}


static cJSON *
rpc_envelope(const cJSON *id)
{
    cJSON  *m = cJSON_CreateObject();

    cJSON_AddStringToObject(m, "jsonrpc", "2.0");
    cJSON_AddItemToObject(m, "id", id ? cJSON_Duplicate(id, 1)
                                      : cJSON_CreateNull());
    return m;
}


static void
rpc_result(mcp_server_t *s, const cJSON *id, cJSON *result)
{
    cJSON  *m = rpc_envelope(id);

    cJSON_AddItemToObject(m, "result", result);
    rpc_send(s, m);
}


static void
rpc_error(mcp_server_t *s, const cJSON *id, int code, const char *fmt, ...)
{
    cJSON    *m = rpc_envelope(id), *e = cJSON_CreateObject();
    char      text[512];
    va_list   ap;

    va_start(ap, fmt);
    vsnprintf(text, sizeof(text), fmt, ap);
    va_end(ap);

    cJSON_AddNumberToObject(e, "code", code);
    cJSON_AddStringToObject(e, "message", text);
    cJSON_AddItemToObject(m, "error", e);
    rpc_send(s, m);
    mcp_log("answered error %d: %s", code, text);
}


static void
rpc_initialize(mcp_server_t *s, const cJSON *id, cJSON *params)
{
    cJSON       *v = cJSON_GetObjectItemCaseSensitive(params, "protocolVersion");
    cJSON       *r, *caps, *tools, *info;
    const char  *ver = rpc_versions[0];
    int          i;

    if (!cJSON_IsString(v)) {
        rpc_error(s, id, RPC_INVALID_PARAMS,
                  "initialize: params.protocolVersion must be a string");
        return;
    }

    for (i = 0; rpc_versions[i] != NULL; i++) {
        if (strcmp(rpc_versions[i], v->valuestring) == 0) {
            ver = rpc_versions[i];
        }
    }

    r = cJSON_CreateObject();
    cJSON_AddStringToObject(r, "protocolVersion", ver);
    caps = cJSON_AddObjectToObject(r, "capabilities");
    tools = cJSON_AddObjectToObject(caps, "tools");
    cJSON_AddBoolToObject(tools, "listChanged", 0);
    info = cJSON_AddObjectToObject(r, "serverInfo");
    cJSON_AddStringToObject(info, "name", "idempotency-mcp");
    cJSON_AddStringToObject(info, "version", "1.0");
    cJSON_AddStringToObject(r, "instructions", mcp_tools_instructions());

    s->initialized = 1;
    mcp_log("initialize: protocol %s (client asked %s)", ver, v->valuestring);
    rpc_result(s, id, r);
}


static void
calls_remove(mcp_server_t *s, mcp_call_t *c)
{
    mcp_call_t  **p;

    for (p = &s->calls; *p != NULL; p = &(*p)->next) {
        if (*p == c) {
            *p = c->next;
            s->ncalls--;
            break;
        }
    }

    pthread_cond_broadcast(&s->calls_done);
}


static void *
call_thread(void *data)
{
    mcp_call_t    *c = data;
    mcp_server_t  *s = c->srv;
    cJSON         *result;

    result = mcp_tools_call(s->cf, c->tool, c->args, &c->cancel);

    pthread_mutex_lock(&s->calls_lock);

    /* a cancelled request gets no answer (the protocol's rule) */
    if (c->unanswered) {
        cJSON_Delete(result);
    } else {
        rpc_result(s, c->id, result);
    }

    calls_remove(s, c);
    pthread_mutex_unlock(&s->calls_lock);

    cJSON_Delete(c->id);
    cJSON_Delete(c->args);
    free(c->tool);
    free(c);
    return NULL;
}


static void
rpc_tools_call(mcp_server_t *s, const cJSON *id, cJSON *params)
{
    cJSON           *name = cJSON_GetObjectItemCaseSensitive(params, "name");
    cJSON           *args = cJSON_GetObjectItemCaseSensitive(params, "arguments");
    mcp_call_t      *c;
    pthread_t        th;
    pthread_attr_t   attr;
    int              busy;

    if (!cJSON_IsString(name) || (args != NULL && !cJSON_IsObject(args))) {
        rpc_error(s, id, RPC_INVALID_PARAMS, "tools/call: params.name must be"
                  " a string and params.arguments an object");
        return;
    }

    if (!mcp_tools_known(name->valuestring)) {
        rpc_error(s, id, RPC_INVALID_PARAMS, "tools/call: unknown tool \"%.64s\"",
                  name->valuestring);
        return;
    }

    pthread_mutex_lock(&s->calls_lock);
    busy = (s->ncalls >= MCP_CALLS_MAX);
    pthread_mutex_unlock(&s->calls_lock);

    if (busy) {
        rpc_error(s, id, -32603, "%d calls in flight already: call again"
                  " when one has ended", MCP_CALLS_MAX);
        return;
    }

    c = calloc(1, sizeof(mcp_call_t));
    if (c == NULL) {
        rpc_error(s, id, -32603, "out of memory");
        return;
    }

    c->id = cJSON_Duplicate(id, 1);
    c->tool = strdup(name->valuestring);
    c->args = args ? cJSON_Duplicate(args, 1) : cJSON_CreateObject();
    c->srv = s;

    pthread_mutex_lock(&s->calls_lock);
    c->next = s->calls;
    s->calls = c;
    s->ncalls++;

    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);

    if (pthread_create(&th, &attr, call_thread, c) != 0) {
        calls_remove(s, c);
        pthread_mutex_unlock(&s->calls_lock);
        rpc_error(s, id, -32603, "cannot start a thread for the call");
        cJSON_Delete(c->id);
        cJSON_Delete(c->args);
        free(c->tool);
        free(c);
    } else {
        pthread_mutex_unlock(&s->calls_lock);
    }

    pthread_attr_destroy(&attr);
}


/* the waits stop; the key stays on disk, the same call resumes it */
static void
rpc_cancelled(mcp_server_t *s, cJSON *params)
{
    cJSON       *rid = cJSON_GetObjectItemCaseSensitive(params, "requestId");
    mcp_call_t  *c;

    pthread_mutex_lock(&s->calls_lock);

    for (c = s->calls; rid != NULL && c != NULL; c = c->next) {
        if (cJSON_Compare(c->id, rid, 1)) {
            __atomic_store_n(&c->cancel, 1, __ATOMIC_RELAXED);
            c->unanswered = 1;
            mcp_log("call cancelled by the client; its key is kept");
        }
    }

    pthread_mutex_unlock(&s->calls_lock);
}


static void
rpc_notification(mcp_server_t *s, const char *method, cJSON *params)
{
    if (strcmp(method, "notifications/cancelled") == 0) {
        rpc_cancelled(s, params);
    }

    /* notifications/initialized and any other: nothing to answer */
}


static void
rpc_request(mcp_server_t *s, const cJSON *id, const char *method,
    cJSON *params)
{
    if (strcmp(method, "initialize") == 0) {
        rpc_initialize(s, id, params);

    } else if (strcmp(method, "ping") == 0) {
        rpc_result(s, id, cJSON_CreateObject());

    } else if (strcmp(method, "tools/list") == 0) {
        rpc_result(s, id, mcp_tools_list());

    } else if (strcmp(method, "tools/call") == 0) {
        rpc_tools_call(s, id, params);

    } else {
        rpc_error(s, id, RPC_METHOD_NOT_FOUND, "method not found: \"%.64s\"",
                  method);
    }
}


static void
rpc_message(mcp_server_t *s, cJSON *m)
{
    cJSON  *v = cJSON_GetObjectItemCaseSensitive(m, "jsonrpc");
    cJSON  *id = cJSON_GetObjectItemCaseSensitive(m, "id");
    cJSON  *method = cJSON_GetObjectItemCaseSensitive(m, "method");
    cJSON  *params = cJSON_GetObjectItemCaseSensitive(m, "params");

    if (id != NULL && !cJSON_IsString(id) && !cJSON_IsNumber(id)) {
        rpc_error(s, NULL, RPC_INVALID_REQUEST,
                  "invalid request: id must be a string or a number");
        return;
    }

    if (!cJSON_IsString(v) || strcmp(v->valuestring, "2.0") != 0) {
        rpc_error(s, id, RPC_INVALID_REQUEST,
                  "invalid request: jsonrpc must be \"2.0\"");
        return;
    }

    if (method == NULL && id != NULL
        && (cJSON_HasObjectItem(m, "result") || cJSON_HasObjectItem(m, "error")))
    {
        return;     /* a response: this server sends no requests */
    }

    if (!cJSON_IsString(method)) {
        rpc_error(s, id, RPC_INVALID_REQUEST,
                  "invalid request: method must be a string");
        return;
    }

    if (params != NULL && !cJSON_IsObject(params)) {
        if (id != NULL) {
            rpc_error(s, id, RPC_INVALID_PARAMS,
                      "invalid params: params must be an object");
        }
        return;
    }

    if (id == NULL) {
        rpc_notification(s, method->valuestring, params);
    } else {
        rpc_request(s, id, method->valuestring, params);
    }
}


void
mcp_handle_line(mcp_server_t *s, const char *line, size_t len)
{
    cJSON  *m;

    while (len > 0 && (line[len - 1] == '\r' || line[len - 1] == ' ')) {
        len--;
    }

    if (len == 0) {
        return;
    }

    m = cJSON_ParseWithLength(line, len);

    if (m == NULL) {
        rpc_error(s, NULL, RPC_PARSE_ERROR, "parse error: not JSON");
        return;
    }

    if (!cJSON_IsObject(m)) {
        rpc_error(s, NULL, RPC_INVALID_REQUEST, "invalid request: a message"
                  " is one JSON object (batches are not supported)");
    } else {
        rpc_message(s, m);
    }

    cJSON_Delete(m);
}


/*
 * The end of stdin: stop every wait, let the calls record and answer (the
 * client may still read), then return.
 */
static void
serve_end(mcp_server_t *s)
{
    mcp_call_t  *c;

    pthread_mutex_lock(&s->calls_lock);

    for (c = s->calls; c != NULL; c = c->next) {
        __atomic_store_n(&c->cancel, 1, __ATOMIC_RELAXED);
    }

    while (s->calls != NULL) {
        pthread_cond_wait(&s->calls_done, &s->calls_lock);
    }

    pthread_mutex_unlock(&s->calls_lock);
}


typedef struct {
    char    *buf;
    size_t   len;
    int      skipping;      /* inside a line over MCP_LINE_MAX */
} serve_line_t;


/* the bytes p[0..n) of the input: complete lines are handled */
static int
serve_bytes(mcp_server_t *s, serve_line_t *l, const char *p, size_t n)
{
    const char  *nl;
    size_t       k;

    while (n > 0) {
        nl = memchr(p, '\n', n);
        k = nl ? (size_t) (nl - p) : n;

        if (!l->skipping && l->len + k > MCP_LINE_MAX) {
            l->skipping = 1;
            l->len = 0;
        }

        if (!l->skipping) {
            memcpy(l->buf + l->len, p, k);
            l->len += k;
        }

        if (nl == NULL) {
            return 0;
        }

        if (l->skipping) {
            rpc_error(s, NULL, RPC_INVALID_REQUEST, "invalid request: a"
                      " message over %d bytes", MCP_LINE_MAX);
        } else {
            mcp_handle_line(s, l->buf, l->len);
        }

        l->skipping = 0;
        l->len = 0;
        p += k + 1;
        n -= k + 1;
    }

    return 0;
}


int
mcp_serve(mcp_server_t *s, int fd)
{
    serve_line_t  l = { malloc(MCP_LINE_MAX), 0, 0 };
    char          chunk[65536];
    ssize_t       n;

    if (l.buf == NULL) {
        return -1;
    }

    for ( ;; ) {
        n = read(fd, chunk, sizeof(chunk));
        if (n < 0 && errno == EINTR) {
            continue;
        }
        if (n <= 0) {
            break;
        }
        serve_bytes(s, &l, chunk, (size_t) n);
    }

    if (l.len > 0 && !l.skipping) {
        mcp_handle_line(s, l.buf, l.len);
    }

    free(l.buf);
    serve_end(s);
    return 0;
}
