/*
 * The tool definitions of idempotency-mcp and the two read-only tools
 * (mcp_tools.h).  The definitions are JSON text, parsed per tools/list:
 * what the model reads is what docs/agents.md shows.
 */

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "call_http.h"
#include "call_run.h"
#include "mcp_tools.h"

#define OP_PATTERN  "^[A-Za-z0-9_-][A-Za-z0-9._-]{0,127}$"


static const char  tools_json[] =
"[{\"name\":\"idempotent_request\","
  "\"title\":\"Perform one intended write action, at most once\","
  "\"description\":\"Send one intended write action (create, pay, deploy,"
  " refund) to a configured target through its idempotency gateway. Name"
  " the action with a stable operation name derived from its business"
  " identity: calling again with the same operation and the same arguments"
  " never performs it twice, it returns the original result. After a"
  " timeout or any doubt, call again with the same operation. Use a new"
  " operation name (or new_operation: the earlier call's idempotency_key)"
  " only for a deliberately new action. Stop and follow next_step on conflict, unknown,"
  " confirmation_required, declined and rejected. Credentials are added by"
  " the server; never pass them.\","
  "\"annotations\":{\"title\":\"Idempotent write\",\"readOnlyHint\":false,"
    "\"destructiveHint\":true,\"idempotentHint\":true,\"openWorldHint\":true},"
  "\"inputSchema\":{\"type\":\"object\",\"properties\":{"
    "\"operation\":{\"type\":\"string\",\"pattern\":\"" OP_PATTERN "\","
      "\"description\":\"The intended action's stable name, e.g."
      " ticket-evt_8841, pay-ord_2026_0042\"},"
    "\"target\":{\"type\":\"string\",\"description\":\"A target of the"
      " server's configuration\"},"
    "\"path\":{\"type\":\"string\",\"description\":\"The path under the"
      " target's base URL, e.g. /tickets; within the target's paths\"},"
    "\"method\":{\"type\":\"string\",\"enum\":[\"POST\",\"PUT\",\"PATCH\","
      "\"DELETE\"],\"default\":\"POST\"},"
    "\"body\":{\"description\":\"The JSON request body, sent as"
      " application/json\"},"
    "\"body_text\":{\"type\":\"string\",\"description\":\"A non-JSON body,"
      " with content_type\"},"
    "\"content_type\":{\"type\":\"string\"},"
    "\"headers\":{\"type\":\"object\",\"additionalProperties\":"
      "{\"type\":\"string\"},\"description\":\"Extra request headers;"
      " credentials, Idempotency-Key, Host, method or URL overrides,"
      " Forwarded, X-Forwarded-* and the target's own headers are"
      " refused\"},"
    "\"new_operation\":{\"oneOf\":[{\"type\":\"boolean\"},"
      "{\"type\":\"string\",\"pattern\":\"^[0-9a-f]{32}$\"}],"
      "\"description\":\"Only to start a new action under an operation"
      " name used before. Prefer the idempotency_key of the action it"
      " replaces (from that call's result or operation_status): calling"
      " again with the same value resumes the new action, never starts a"
      " third. true starts a new action on every call, so a retry of a"
      " timed-out call with true performs it again\"}},"
    "\"required\":[\"operation\",\"target\",\"path\"],"
    "\"additionalProperties\":false},"
  "\"outputSchema\":{\"type\":\"object\",\"properties\":{"
    "\"outcome\":{\"type\":\"string\",\"enum\":[\"created\",\"replayed\","
      "\"reused\",\"in_progress\",\"conflict\",\"unknown\","
      "\"confirmation_required\",\"declined\",\"lock_held\",\"rejected\","
      "\"unavailable\",\"transport_failed\",\"refused\"]},"
    "\"status\":{\"type\":[\"integer\",\"null\"]},"
    "\"operation\":{\"type\":\"string\"},"
    "\"idempotency_key\":{\"type\":[\"string\",\"null\"]},"
    "\"operation_id\":{\"type\":[\"string\",\"null\"]},"
    "\"retry_after\":{\"type\":[\"integer\",\"null\"]},"
    "\"attempts\":{\"type\":\"integer\"},"
    "\"problem\":{\"type\":\"string\"},"
    "\"detail\":{\"type\":\"string\"},"
    "\"response\":{\"type\":\"object\",\"properties\":{"
      "\"status\":{\"type\":\"integer\"},\"headers\":{\"type\":\"object\"},"
      "\"body\":{},\"truncated\":{\"type\":\"boolean\"}}},"
    "\"proposal\":{\"type\":\"object\"},"
    "\"next_step\":{\"type\":\"string\"}},"
    "\"required\":[\"outcome\",\"operation\",\"next_step\"]}},"
 "{\"name\":\"operation_status\","
  "\"title\":\"What became of an operation\","
  "\"description\":\"Ask the target's gateway what it knows of an"
  " operation's key (not_found, in_progress, completed, unknown,"
  " awaiting_confirmation, approved, declined) and what the last call"
  " recorded, without sending the write.\","
  "\"annotations\":{\"title\":\"Operation status\",\"readOnlyHint\":true,"
    "\"destructiveHint\":false,\"idempotentHint\":true,\"openWorldHint\":true},"
  "\"inputSchema\":{\"type\":\"object\",\"properties\":{"
    "\"operation\":{\"type\":\"string\",\"pattern\":\"" OP_PATTERN "\"},"
    "\"target\":{\"type\":\"string\"}},"
    "\"required\":[\"operation\",\"target\"],\"additionalProperties\":false},"
  "\"outputSchema\":{\"type\":\"object\",\"properties\":{"
    "\"operation\":{\"type\":\"string\"},"
    "\"state\":{\"type\":\"string\"},"
    "\"idempotency_key\":{\"type\":[\"string\",\"null\"]},"
    "\"operation_id\":{\"type\":[\"string\",\"null\"]},"
    "\"last\":{\"type\":[\"object\",\"null\"]},"
    "\"next_step\":{\"type\":\"string\"}},"
    "\"required\":[\"operation\",\"state\",\"next_step\"]}},"
 "{\"name\":\"list_operations\","
  "\"title\":\"The operations of this agent\","
  "\"description\":\"The operations in the state directory, newest first"
  " (at most 100), with their last outcome.\","
  "\"annotations\":{\"title\":\"List operations\",\"readOnlyHint\":true,"
    "\"destructiveHint\":false,\"idempotentHint\":true,"
    "\"openWorldHint\":false},"
  "\"inputSchema\":{\"type\":\"object\",\"properties\":{"
    "\"target\":{\"type\":\"string\"}},\"additionalProperties\":false},"
  "\"outputSchema\":{\"type\":\"object\",\"properties\":{"
    "\"operations\":{\"type\":\"array\",\"items\":{\"type\":\"object\"}}},"
    "\"required\":[\"operations\"]}}]";


const char *
mcp_tools_instructions(void)
{
    return "Every write goes through idempotent_request with a stable"
           " operation name per intended action; repeat the same call after"
           " any doubt, it never performs the action twice. Follow"
           " next_step.";
}


cJSON *
mcp_tools_list(void)
{
    cJSON  *r = cJSON_CreateObject();

    cJSON_AddItemToObject(r, "tools", cJSON_Parse(tools_json));
    return r;
}


int
mcp_tools_known(const char *name)
{
    return strcmp(name, "idempotent_request") == 0
           || strcmp(name, "operation_status") == 0
           || strcmp(name, "list_operations") == 0;
}


/* structuredContent and the same JSON as text */
cJSON *
mcp_tool_result(cJSON *structured, int is_error)
{
    cJSON  *r = cJSON_CreateObject(), *content, *item;
    char   *text = cJSON_PrintUnformatted(structured);

    content = cJSON_AddArrayToObject(r, "content");
    item = cJSON_CreateObject();
    cJSON_AddStringToObject(item, "type", "text");
    cJSON_AddStringToObject(item, "text", text ? text : "{}");
    cJSON_AddItemToArray(content, item);
    free(text);

    cJSON_AddItemToObject(r, "structuredContent", structured);
    cJSON_AddBoolToObject(r, "isError", is_error);
    return r;
}


cJSON *
mcp_refused(const char *operation, const char *why)
{
    cJSON  *o = cJSON_CreateObject();
    char    next[768];

    snprintf(next, sizeof(next), "Fix the call: %s. Nothing was sent.", why);
    cJSON_AddStringToObject(o, "outcome", "refused");
    cJSON_AddNullToObject(o, "status");
    cJSON_AddStringToObject(o, "operation", operation ? operation : "");
    cJSON_AddNullToObject(o, "idempotency_key");
    cJSON_AddNullToObject(o, "operation_id");
    cJSON_AddNullToObject(o, "retry_after");
    cJSON_AddNumberToObject(o, "attempts", 0);
    cJSON_AddStringToObject(o, "detail", why);
    cJSON_AddStringToObject(o, "next_step", next);
    return mcp_tool_result(o, 1);
}


int
mcp_state_dir(const mcp_config_t *cf, call_state_t *st, const char *op)
{
    return call_state_dir(st, cf->state_dir, op);
}


static const char *
arg_str(cJSON *args, const char *name)
{
    return call_json_str(args, name);
}


static int
status_url_of(const char *url, const char *base)
{
    size_t  n = strlen(base);

    return url != NULL && strncmp(url, base, n) == 0
           && (url[n] == '\0' || url[n] == '/');
}


/* a refusal of operation_status: its output schema requires "state" */
static cJSON *
status_refused(const char *op, const char *why)
{
    cJSON  *r = mcp_refused(op, why), *sc, *text;
    char   *s;

    sc = cJSON_GetObjectItemCaseSensitive(r, "structuredContent");
    cJSON_AddStringToObject(sc, "state", "refused");
    s = cJSON_PrintUnformatted(sc);
    text = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(r, "content"),
                              0);
    if (s != NULL && text != NULL) {
        cJSON_ReplaceItemInObjectCaseSensitive(text, "text",
                                               cJSON_CreateString(s));
    }
    free(s);
    return r;
}


/* the state file of an operation, or a refusal */
static cJSON *
status_load(const mcp_config_t *cf, cJSON *args, call_state_t *st,
    const mcp_target_t **t)
{
    const char  *op = arg_str(args, "operation");
    const char  *target = arg_str(args, "target");
    char         why[700];
    size_t       len;
    char        *text;

    if (op == NULL || !call_op_name_valid(op)) {
        return status_refused(op, "operation: 1 to 128 of A-Z a-z 0-9 . _ -,"
                           " not starting with a dot");
    }

    if (target == NULL || (*t = mcp_config_target(cf, target)) == NULL) {
        return status_refused(op, "target: not a target of the configuration");
    }

    if (mcp_state_dir(cf, st, op) != 0) {
        return status_refused(op, st->err);
    }

    text = call_read_file(st->file, &len, why, sizeof(why));
    st->doc = text ? cJSON_ParseWithLength(text, len) : NULL;
    free(text);

    /* the key goes with the target's credentials to its status_url: only
     * for an operation that was sent to this target */
    if (call_json_str(st->doc, "key") != NULL
        && !status_url_of(call_json_str(st->doc, "url"), (*t)->base_url))
    {
        return status_refused(op, "target: the operation was not sent to this"
                           " target (its url is not under the target's"
                           " base_url)");
    }

    return NULL;
}


static const char *
status_next(const char *state)
{
    if (strcmp(state, "completed") == 0) {
        return "Done: call idempotent_request again with the same operation"
               " and arguments to get its recorded answer.";
    }
    if (strcmp(state, "unknown") == 0) {
        return "Stop: the outcome is unknown; an operator must check and"
               " resolve it. Do not retry under another name.";
    }
    if (strcmp(state, "not_found") == 0) {
        return "Not on the gateway (never sent, released or expired): the"
               " same idempotent_request call sends it.";
    }
    if (strcmp(state, "awaiting_confirmation") == 0) {
        return "Stop: a person must approve it; then call idempotent_request"
               " again with the same operation.";
    }
    return "Call idempotent_request again with the same operation and"
           " arguments when you need the result; it never runs twice.";
}


static void
status_ask(const mcp_target_t *t, call_state_t *st, cJSON *out,
    volatile int *cancel)
{
    call_run_t  run;
    const char  *state = "not_asked";

    call_run_init(&run);
    run.status_url = t->status_url;
    run.headers = call_headers_with_key(t->headers, st->key);
    run.deadline = call_now_ms() + 5000;
    run.cancel = cancel;
    run.status.cap = MCP_STORE_MAX;

    if (run.headers != NULL && t->status_url != NULL) {
        call_run_status(&run);
        state = (strcmp(run.state_seen, "none") == 0) ? "not_found"
                : run.state_seen[0] ? run.state_seen : "unreachable";
    }

    cJSON_AddStringToObject(out, "state", state);
    if (run.operation_id[0]) {
        cJSON_AddStringToObject(out, "operation_id", run.operation_id);
    } else {
        cJSON_AddNullToObject(out, "operation_id");
    }

    cJSON_AddStringToObject(out, "next_step",
                            strcmp(state, "not_asked") == 0
                            ? "The target has no status_url: only the last"
                              " local outcome is known (last)."
                            : strcmp(state, "unreachable") == 0
                            ? "The status endpoint did not answer; ask again"
                              " later."
                            : status_next(state));

    curl_slist_free_all(run.headers);
    call_run_free(&run);
}


static cJSON *
tool_operation_status(const mcp_config_t *cf, cJSON *args,
    volatile int *cancel)
{
    call_state_t         st;
    const mcp_target_t  *t = NULL;
    cJSON               *out, *refused, *last;
    const char          *key;

    call_state_init(&st);
    refused = status_load(cf, args, &st, &t);
    if (refused != NULL) {
        call_state_free(&st);
        return refused;
    }

    out = cJSON_CreateObject();
    cJSON_AddStringToObject(out, "operation", arg_str(args, "operation"));
    key = call_json_str(st.doc, "key");
    last = cJSON_GetObjectItemCaseSensitive(st.doc, "last");
    cJSON_AddItemToObject(out, "last", last ? cJSON_Duplicate(last, 1)
                                            : cJSON_CreateNull());

    if (key == NULL || strlen(key) != CALL_KEY_BYTES * 2) {
        cJSON_AddNullToObject(out, "idempotency_key");
        cJSON_AddNullToObject(out, "operation_id");
        cJSON_AddStringToObject(out, "state", "not_found");
        cJSON_AddStringToObject(out, "next_step", "No such operation in the"
                                " state directory: nothing was ever sent"
                                " under this name.");
    } else {
        memcpy(st.key, key, sizeof(st.key));
        cJSON_AddStringToObject(out, "idempotency_key", st.key);
        status_ask(t, &st, out, cancel);
    }

    call_state_free(&st);
    return mcp_tool_result(out, 0);
}


typedef struct {
    cJSON   *doc;
    time_t   mtime;
} op_entry_t;


static int
op_newer(const void *a, const void *b)
{
    const op_entry_t  *x = a, *y = b;

    return (x->mtime < y->mtime) - (x->mtime > y->mtime);
}


/* the state files' operations, newest first, at most max */
static int
ops_read(const char *dir, const char *url_prefix, op_entry_t *e, int max)
{
    DIR            *d = opendir(dir);
    struct dirent  *de;
    struct stat     sb;
    char            path[4400], err[600], *text;
    size_t          len, nl;
    int             n = 0;
    cJSON          *doc;
    const char     *url;

    while (d != NULL && (de = readdir(d)) != NULL && n < max) {
        nl = strlen(de->d_name);
        if (nl < 6 || strcmp(de->d_name + nl - 5, ".json") != 0
            || de->d_name[0] == '.')
        {
            continue;
        }

        snprintf(path, sizeof(path), "%.4095s/%s", dir, de->d_name);
        text = call_read_file(path, &len, err, sizeof(err));
        doc = text ? cJSON_ParseWithLength(text, len) : NULL;
        free(text);
        url = call_json_str(doc, "url");

        if (url == NULL || call_json_str(doc, "op") == NULL
            || (url_prefix && strncmp(url, url_prefix, strlen(url_prefix))))
        {
            cJSON_Delete(doc);
            continue;
        }

        e[n].doc = doc;
        e[n++].mtime = (stat(path, &sb) == 0) ? sb.st_mtime : 0;
    }

    if (d != NULL) {
        closedir(d);
    }

    qsort(e, n, sizeof(op_entry_t), op_newer);
    return n;
}


#define OPS_SCAN  4096
#define OPS_MAX   100

static cJSON *
tool_list_operations(const mcp_config_t *cf, cJSON *args)
{
    const char          *target = arg_str(args, "target");
    const mcp_target_t  *t = NULL;
    call_state_t         st;
    op_entry_t          *e;
    cJSON               *out, *list, *o, *v;
    int                  i, n;
    static const char   *keep[] = { "op", "method", "url", "created_at",
                                    "last", NULL };
    const char         **k;

    if (target != NULL && (t = mcp_config_target(cf, target)) == NULL) {
        return mcp_refused("", "target: not a target of the configuration");
    }

    call_state_init(&st);
    e = calloc(OPS_SCAN, sizeof(op_entry_t));
    if (e == NULL || mcp_state_dir(cf, &st, NULL) != 0) {
        free(e);
        return mcp_refused("", st.err[0] ? st.err : "out of memory");
    }

    n = ops_read(st.dir, t ? t->base_url : NULL, e, OPS_SCAN);
    out = cJSON_CreateObject();
    list = cJSON_AddArrayToObject(out, "operations");

    for (i = 0; i < n; i++) {
        if (i < OPS_MAX) {
            o = cJSON_CreateObject();
            for (k = keep; *k != NULL; k++) {
                v = cJSON_GetObjectItemCaseSensitive(e[i].doc, *k);
                if (v != NULL) {
                    cJSON_AddItemToObject(o, strcmp(*k, "op") ? *k
                                          : "operation",
                                          cJSON_Duplicate(v, 1));
                }
            }
            cJSON_AddItemToArray(list, o);
        }
        cJSON_Delete(e[i].doc);
    }

    free(e);
    return mcp_tool_result(out, 0);
}


cJSON *
mcp_tools_call(const mcp_config_t *cf, const char *name, cJSON *args,
    volatile int *cancel)
{
    if (strcmp(name, "idempotent_request") == 0) {
        return mcp_idempotent_request(cf, args, cancel);
    }

    if (strcmp(name, "operation_status") == 0) {
        return tool_operation_status(cf, args, cancel);
    }

    return tool_list_operations(cf, args);
}
