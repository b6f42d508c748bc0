/*
 * idempotent_request, the write tool of idempotency-mcp: the arguments
 * are checked against the target (nothing sent on a refusal), the key of
 * the operation is read or created in the state dir (the same files as
 * idempotency-call), and the call follows the retry rule (call_run) until
 * a final answer or the target's deadline.
 */

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "idem_answer.h"
#include "idem_text.h"
#include "call_state.h"
#include "call_http.h"
#include "call_run.h"
#include "mcp_rpc.h"
#include "mcp_tools.h"


typedef struct {
    const char          *op;
    const mcp_target_t  *t;
    const char          *path;
    const char          *method;
    char                *body;
    size_t               body_len;
    char                 body_sha[65];
    char                *url;
    struct curl_slist   *headers;   /* the target's, the agent's, the type */
    const char          *replaces;
    char                 why[512];
} req_t;


/* the headers an agent may never set: the credentials and the key, and
 * those that make a proxy or framework see another method or path than
 * the one checked (X-Forwarded-* too, in req_header_allowed) */
static const char  *req_forbidden[] = {
    "Authorization", "Cookie", "Proxy-Authorization", "Idempotency-Key",
    "Content-Type", "Content-Length", "Transfer-Encoding", "Host",
    "X-HTTP-Method-Override", "X-HTTP-Method", "X-Method-Override",
    "X-Original-URL", "X-Rewrite-URL", "Forwarded", NULL
};


static int
req_refuse(req_t *rq, const char *fmt, const char *what)
{
    snprintf(rq->why, sizeof(rq->why), fmt, what);
    return -1;
}


/* a "." or ".." segment, also with ";params" after it (servlet-style
 * servers drop them, then resolve the dots) */
static int
req_dot_segment(const char *s)
{
    size_t  n = (s[0] == '.') ? ((s[1] == '.') ? 2 : 1) : 0;

    return n > 0 && s[-1] == '/'
           && (s[n] == '/' || s[n] == '\0' || s[n] == '?' || s[n] == ';');
}


/* "%2e", "%2f", "%5c", "%25": an escaped dot, slash, backslash or percent
 * may be decoded by a server behind the target into a segment the check
 * never saw */
static int
req_escaped(const char *s)
{
    return s[0] == '%'
           && (strncasecmp(s + 1, "2e", 2) == 0
               || strncasecmp(s + 1, "2f", 2) == 0
               || strncasecmp(s + 1, "5c", 2) == 0
               || strncmp(s + 1, "25", 2) == 0);
}


/* the path is under the prefix at a segment boundary: "/tickets" is not a
 * prefix of "/tickets-admin"; a prefix ending with "/" needs no boundary */
static int
req_under(const char *p, const char *prefix)
{
    size_t  n = strlen(prefix);

    if (strncmp(p, prefix, n) != 0) {
        return 0;
    }

    return (n > 0 && prefix[n - 1] == '/')
           || p[n] == '\0' || p[n] == '/' || p[n] == '?';
}


/* "..", a scheme or a host, or bytes a URL path does not carry: refused */
static int
req_path(req_t *rq)
{
    const char  *p = rq->path, *s;
    int          i;

    if (p[0] != '/' || p[1] == '/' || strstr(p, "://") != NULL) {
        return req_refuse(rq, "path: \"%.200s\" must be a path starting with"
                          " one \"/\" (no scheme, no host)", p);
    }

    for (s = p; *s; s++) {
        if ((unsigned char) *s <= 0x20 || *s == 0x7f || *s == '\\'
            || *s == '#')
        {
            return req_refuse(rq, "path: \"%.200s\" has a space, a control"
                              " character, a backslash or a fragment", p);
        }
        if (req_escaped(s) || req_dot_segment(s)) {
            return req_refuse(rq, "path: \"%.200s\" has a \".\" or \"..\""
                              " segment (or an escaped dot, slash, backslash"
                              " or percent)", p);
        }
    }

    for (i = 0; i < rq->t->npaths; i++) {
        if (req_under(p, rq->t->paths[i])) {
            return 0;
        }
    }

    return req_refuse(rq, "path: \"%.200s\" is outside the target's paths", p);
}


static int
req_method(req_t *rq)
{
    int  i;

    for (i = 0; i < rq->t->nmethods; i++) {
        if (strcmp(rq->method, rq->t->methods[i]) == 0) {
            return 0;
        }
    }

    return req_refuse(rq, "method: %.16s is not allowed for this target",
                      rq->method);
}


static int
req_header_allowed(req_t *rq, const char *name)
{
    const char  **f;
    const char   *s;
    int           i;

    for (s = name; *s; s++) {
        if (!isalnum((unsigned char) *s) && strchr("!#$%&'*+-.^_`|~", *s)
            == NULL)
        {
            return req_refuse(rq, "headers: \"%.64s\" is not a header name",
                              name);
        }
    }

    for (f = req_forbidden; *f != NULL; f++) {
        if (strcasecmp(*f, name) == 0
            || strncasecmp(name, "X-Forwarded-", 12) == 0)
        {
            return req_refuse(rq, "headers: %.64s may not be set by the"
                              " caller (the server sets it)", name);
        }
    }

    for (i = 0; i < rq->t->nheaders; i++) {
        if (strcasecmp(rq->t->header_names[i], name) == 0) {
            return req_refuse(rq, "headers: %.64s is set by the target's"
                              " configuration", name);
        }
    }

    return 0;
}


static int
req_add(req_t *rq, const char *name, const char *value)
{
    struct curl_slist  *l;
    char               *line;
    size_t              n = strlen(name) + strlen(value) + 3;

    line = malloc(n);
    if (line == NULL) {
        return req_refuse(rq, "%s", "out of memory");
    }

    snprintf(line, n, "%s: %s", name, value);
    l = curl_slist_append(rq->headers, line);
    free(line);

    if (l == NULL) {
        return req_refuse(rq, "%s", "out of memory");
    }

    rq->headers = l;
    return 0;
}


static int
req_headers(req_t *rq, cJSON *h, const char *ctype)
{
    struct curl_slist  *s;
    cJSON              *m;

    for (s = rq->t->headers; s != NULL; s = s->next) {
        struct curl_slist  *l = curl_slist_append(rq->headers, s->data);

        if (l == NULL) {
            return req_refuse(rq, "%s", "out of memory");
        }
        rq->headers = l;
    }

    if (h != NULL && !cJSON_IsObject(h)) {
        return req_refuse(rq, "%s", "headers: an object of strings");
    }

    cJSON_ArrayForEach(m, h) {
        if (!cJSON_IsString(m) || strpbrk(m->valuestring, "\r\n") != NULL) {
            return req_refuse(rq, "headers: %.64s must be a string without"
                              " line breaks", m->string);
        }
        if (req_header_allowed(rq, m->string) != 0
            || req_add(rq, m->string, m->valuestring) != 0)
        {
            return -1;
        }
    }

    return ctype ? req_add(rq, "Content-Type", ctype) : 0;
}


/* body (JSON, sent as application/json) or body_text with content_type */
/*
 * The body's numbers, printed so that they read back as the same double:
 * cJSON's printer accepts a 15-digit form that is only nearly equal
 * (9007199254740991 would be sent as 9.00719925474099e+15), so each
 * number becomes the raw text of its shortest exact form.  Refused (-1)
 * where the parsed double is not the value the caller wrote or cannot be
 * written at all: from 2^53 on a double no longer holds every integer
 * (9007199254740993 parses as 2^53 itself, so 2^53 is refused too), and
 * 1e400 parses as infinity.  -2: out of memory.
 */
static int
req_numbers(cJSON *v)
{
    cJSON   *c;
    double   d;
    char     buf[32];
    int      rc;

    if (cJSON_IsNumber(v)) {
        d = v->valuedouble;
        if (d != d || d >= 9007199254740992.0 || d <= -9007199254740992.0) {
            return -1;
        }
        snprintf(buf, sizeof(buf), "%.15g", d);
        if (strtod(buf, NULL) != d) {
            snprintf(buf, sizeof(buf), "%.17g", d);
        }
        v->valuestring = strdup(buf);
        if (v->valuestring == NULL) {
            return -2;
        }
        v->type = cJSON_Raw;
        return 0;
    }

    for (c = v->child; c != NULL; c = c->next) {
        if ((rc = req_numbers(c)) != 0) {
            return rc;
        }
    }

    return 0;
}


static int
req_body(req_t *rq, cJSON *args, const char **ctype)
{
    cJSON  *b = cJSON_GetObjectItemCaseSensitive(args, "body");
    cJSON  *bt = cJSON_GetObjectItemCaseSensitive(args, "body_text");
    cJSON  *ct = cJSON_GetObjectItemCaseSensitive(args, "content_type");
    int     rc;

    *ctype = NULL;

    if (b != NULL && bt != NULL) {
        return req_refuse(rq, "%s", "body and body_text: give one of them");
    }

    if ((bt != NULL && !cJSON_IsString(bt))
        || (ct != NULL && (!cJSON_IsString(ct) || bt == NULL
                           || strpbrk(ct->valuestring, "\r\n") != NULL)))
    {
        return req_refuse(rq, "%s", "body_text and content_type: strings,"
                          " content_type only with body_text");
    }

    if (b != NULL && (rc = req_numbers(b)) != 0) {
        return req_refuse(rq, "%s", rc == -2 ? "out of memory"
                          : "body: a number of magnitude 2^53"
                          " (9007199254740992) or more, or not finite,"
                          " cannot be sent unchanged as JSON; send it as a"
                          " string, or the whole body as body_text");
    }

    if (b != NULL) {
        rq->body = cJSON_PrintUnformatted(b);
        *ctype = "application/json";
    } else if (bt != NULL) {
        rq->body = strdup(bt->valuestring);
        *ctype = ct ? ct->valuestring : "text/plain; charset=utf-8";
    } else {
        rq->body = strdup("");
    }

    if (rq->body == NULL) {
        return req_refuse(rq, "%s", "out of memory");
    }

    rq->body_len = strlen(rq->body);
    call_body_sha(rq->body, rq->body_len, rq->body_sha);
    return 0;
}


static int
req_parse(req_t *rq, const mcp_config_t *cf, cJSON *args)
{
    static const char  *names[] = { "operation", "target", "path", "method",
                                    "body", "body_text", "content_type",
                                    "headers", "new_operation", NULL };
    const char        **n;
    cJSON              *m, *no;
    const char         *target, *ctype;
    size_t              len;

    cJSON_ArrayForEach(m, args) {
        for (n = names; *n != NULL && strcmp(*n, m->string) != 0; n++) {
            /* look further */
        }
        if (*n == NULL) {
            return req_refuse(rq, "%.64s: not an argument of this tool",
                              m->string);
        }
    }

    rq->op = call_json_str(args, "operation");
    if (rq->op == NULL || !call_op_name_valid(rq->op)) {
        return req_refuse(rq, "%s", "operation: a string of 1 to 128 of"
                          " A-Z a-z 0-9 . _ -, not starting with a dot");
    }

    target = call_json_str(args, "target");
    rq->t = target ? mcp_config_target(cf, target) : NULL;
    if (rq->t == NULL) {
        return req_refuse(rq, "target: \"%.64s\" is not a target of the"
                          " configuration", target ? target : "(none)");
    }

    rq->path = call_json_str(args, "path");
    if (rq->path == NULL) {
        return req_refuse(rq, "%s", "path: a string is required");
    }

    m = cJSON_GetObjectItemCaseSensitive(args, "method");
    no = cJSON_GetObjectItemCaseSensitive(args, "new_operation");
    rq->method = m ? (cJSON_IsString(m) ? m->valuestring : "") : "POST";

    /*
     * true mints a new key on every call, as asked for a deliberately new
     * action; the replaced key makes the host's retry of this call resume
     * the new action instead of starting a third, so it is the one the
     * tool's description recommends.
     */
    if (no != NULL && !cJSON_IsBool(no)
        && !(cJSON_IsString(no) && call_key_valid(no->valuestring)))
    {
        return req_refuse(rq, "%s", "new_operation: true, or the"
                          " idempotency_key of the action it replaces (from"
                          " that call's result or operation_status), so that"
                          " a retry of this call resumes the new action"
                          " instead of starting a third");
    }
    rq->replaces = cJSON_IsString(no) ? no->valuestring
                   : (cJSON_IsTrue(no) ? "" : NULL);

    if (req_path(rq) != 0 || req_method(rq) != 0
        || req_body(rq, args, &ctype) != 0
        || req_headers(rq, cJSON_GetObjectItemCaseSensitive(args, "headers"),
                       ctype) != 0)
    {
        return -1;
    }

    len = strlen(rq->t->base_url) + strlen(rq->path) + 1;
    rq->url = malloc(len);
    if (rq->url == NULL) {
        return req_refuse(rq, "%s", "out of memory");
    }

    snprintf(rq->url, len, "%s%s", rq->t->base_url, rq->path);
    return 0;
}


/* the answer's body: JSON when JSON, else text, cut at MCP_BODY_MAX */
static cJSON *
res_response(call_resp_t *r)
{
    cJSON   *o = cJSON_CreateObject(), *h, *b = NULL;
    size_t   n = r->len, k;
    char    *cut;

    cJSON_AddNumberToObject(o, "status", (double) r->status);
    h = cJSON_AddObjectToObject(o, "headers");
    if (r->location[0]) {
        cJSON_AddStringToObject(h, "Location", r->location);
    }
    if (r->ctype[0]) {
        cJSON_AddStringToObject(h, "Content-Type", r->ctype);
    }
    if (r->replayed) {
        cJSON_AddStringToObject(h, "Idempotent-Replayed", "true");
    }
    if (r->reused) {
        cJSON_AddStringToObject(h, "Idempotent-Reused", "true");
    }
    if (r->operation[0]) {
        cJSON_AddStringToObject(h, "Idempotency-Operation", r->operation);
    }

    if (n > 0 && n <= MCP_BODY_MAX && call_is_json_type(r->ctype)) {
        b = cJSON_ParseWithLength(r->body, n);
    }

    if (b == NULL) {
        n = (n > MCP_BODY_MAX) ? MCP_BODY_MAX : n;
        k = n;
        while (k > 0 && k + 3 >= n && !idem_utf8_valid(r->body, k)) {
            k--;    /* a cut inside a character */
        }
        if (n > 0 && (!idem_utf8_valid(r->body, k)
                      || memchr(r->body, '\0', k) != NULL))
        {
            /* bytes that are not text: the model gets their size only */
            cJSON_AddNullToObject(o, "body");
            cJSON_AddBoolToObject(o, "binary", 1);
            cJSON_AddNumberToObject(o, "body_bytes", (double) r->total);
            cJSON_AddBoolToObject(o, "truncated", r->truncated);
            return o;
        }
        n = k;
        cut = strndup(r->body ? r->body : "", n);
        b = cJSON_CreateString(cut ? cut : "");
        free(cut);
    }

    cJSON_AddItemToObject(o, "body", b);
    cJSON_AddBoolToObject(o, "truncated", n < r->len || r->truncated);
    return o;
}


static void
res_next_step(cJSON *o, call_run_t *run, req_t *rq)
{
    char                  s[768];
    const char           *id = run->operation_id[0] ? run->operation_id
                                                    : "(unknown)";
    const idem_answer_t  *ans;

    switch (run->outcome) {
    case CALL_OUT_CREATED:
        snprintf(s, sizeof(s), "Done: the action was performed once. Do not"
                 " call again for this action."); break;
    case CALL_OUT_REPLAYED:
        snprintf(s, sizeof(s), "Done: the action had been performed before;"
                 " this is its recorded answer. Do not call again."); break;
    case CALL_OUT_REUSED:
        snprintf(s, sizeof(s), "Done: the same business action was already"
                 " performed under another operation; this is its answer.");
        break;
    case CALL_OUT_CONFLICT:
        snprintf(s, sizeof(s), "Stop: operation %s was used for a different"
                 " request. Resend exactly the original request, or use a new"
                 " operation name (or new_operation: this key) only if this is"
                 " deliberately a new action.", rq->op); break;
    case CALL_OUT_UNKNOWN:
        snprintf(s, sizeof(s), "Stop: the outcome is unknown (it may or may"
                 " not have happened). Ask the operator to check the effect"
                 " and resolve operation %s; do not retry under another"
                 " name.", id); break;
    case CALL_OUT_CONFIRM:
        snprintf(s, sizeof(s), "Stop: a person must approve this exact"
                 " request (operation %s, see proposal); then call again with"
                 " the same operation and arguments.", id); break;
    case CALL_OUT_DECLINED:
        snprintf(s, sizeof(s), "Stop: a person declined this request. Do not"
                 " retry it; a different intended action needs a new"
                 " operation name."); break;
    case CALL_OUT_REJECTED:
        ans = (run->resp.problem != NULL)
              ? idem_answer_find(run->resp.slug, strlen(run->resp.slug))
              : NULL;
        if (ans != NULL) {
            /* the gateway's own answer: the answer table's words for it */
            snprintf(s, sizeof(s), "Stop (the gateway's %s): %s.", ans->slug,
                     ans->action_text);
            break;
        }
        snprintf(s, sizeof(s), "Stop: the API gave its final answer %ld (see"
                 " response.body). Calling again only repeats it; a corrected"
                 " request is a new action with a new operation name.",
                 run->resp.status); break;
    default:
        snprintf(s, sizeof(s), "Not done yet, nothing is lost: call again"
                 " later with the same operation and arguments; it will not"
                 " run twice."); break;
    }

    cJSON_AddStringToObject(o, "next_step", s);
}


static void
res_problem(cJSON *o, call_run_t *run)
{
    call_resp_t  *r = &run->resp;
    cJSON        *p;
    const char   *v;

    call_run_problem(o, run);

    if (run->outcome == CALL_OUT_CONFIRM
        && (p = cJSON_GetObjectItemCaseSensitive(r->problem, "proposal"))
           != NULL)
    {
        p = cJSON_Duplicate(p, 1);
        if ((v = call_json_str(r->problem, "approve_url")) != NULL) {
            cJSON_AddStringToObject(p, "approve_url", v);
        }
        cJSON_AddItemToObject(o, "proposal", p);
    }
}


static cJSON *
res_build(call_run_t *run, req_t *rq, call_state_t *st)
{
    cJSON        *o = cJSON_CreateObject();
    call_resp_t  *r = &run->resp;
    int           answered = (r->curl_rc == CURLE_OK && r->status > 0);

    cJSON_AddStringToObject(o, "outcome", call_outcome_name(run->outcome));

    if (answered && r->problem != NULL) {
        res_problem(o, run);
    }
    if (run->operation_id[0] == '\0' && strlen(r->operation) == 32) {
        memcpy(run->operation_id, r->operation, 33);
    }
    if (run->operation_id[0] == '\0' && run->final && !run->cancelled
        && run->outcome != CALL_OUT_CONFLICT)
    {
        call_run_status(run);
    }

    if (answered) {
        cJSON_AddNumberToObject(o, "status", (double) r->status);
    } else {
        cJSON_AddNullToObject(o, "status");
    }
    cJSON_AddStringToObject(o, "operation", rq->op);
    cJSON_AddStringToObject(o, "idempotency_key", st->key);
    if (run->operation_id[0]) {
        cJSON_AddStringToObject(o, "operation_id", run->operation_id);
    } else {
        cJSON_AddNullToObject(o, "operation_id");
    }
    if (answered && r->retry_after >= 0) {
        cJSON_AddNumberToObject(o, "retry_after", (double) r->retry_after);
    } else {
        cJSON_AddNullToObject(o, "retry_after");
    }
    cJSON_AddNumberToObject(o, "attempts", run->attempts);
    if (answered) {
        cJSON_AddItemToObject(o, "response", res_response(r));
    }
    if (run->error != NULL) {
        cJSON_AddStringToObject(o, "error", run->error);
    }
    if (!answered && r->curl_err[0]) {
        cJSON_AddStringToObject(o, "transport_error", r->curl_err);
    }

    res_next_step(o, run, rq);
    return o;
}


static cJSON *
req_conflict(req_t *rq, call_state_t *st)
{
    cJSON  *o = cJSON_CreateObject();
    char    s[768];

    cJSON_AddStringToObject(o, "outcome", "conflict");
    cJSON_AddNullToObject(o, "status");
    cJSON_AddStringToObject(o, "operation", rq->op);
    cJSON_AddStringToObject(o, "idempotency_key", st->key);
    cJSON_AddNullToObject(o, "operation_id");
    cJSON_AddNullToObject(o, "retry_after");
    cJSON_AddNumberToObject(o, "attempts", 0);
    cJSON_AddStringToObject(o, "detail", st->err);
    snprintf(s, sizeof(s), "Stop: operation %s was used for a different"
             " request (nothing was sent). Resend exactly the original"
             " request, or use a new operation name (or new_operation: the"
             " idempotency_key above)"
             " only if this is deliberately a new action.", rq->op);
    cJSON_AddStringToObject(o, "next_step", s);
    mcp_log("call operation=%s outcome=conflict (state file)", rq->op);
    return mcp_tool_result(o, 1);
}


static cJSON *
req_send(req_t *rq, call_state_t *st, volatile int *cancel)
{
    call_run_t   run;
    cJSON       *o;

    call_run_init(&run);
    run.method = rq->method;
    run.url = rq->url;
    run.status_url = rq->t->status_url;
    run.headers = call_headers_with_key(rq->headers, st->key);
    run.body = rq->body;
    run.body_len = rq->body_len;
    run.max_time_ms = rq->t->max_time_ms;
    run.deadline = call_now_ms() + rq->t->deadline_ms;
    run.cancel = cancel;
    run.resp.cap = MCP_STORE_MAX;
    run.status.cap = MCP_STORE_MAX;

    if (run.headers == NULL || call_run_loop(&run) != 0) {
        curl_slist_free_all(run.headers);
        call_run_free(&run);
        return mcp_refused(rq->op, "out of memory or libcurl failed");
    }

    call_state_record(st, rq->op, call_outcome_name(run.outcome),
                      run.final ? run.resp.status : 0);

    o = res_build(&run, rq, st);
    mcp_log("call operation=%s outcome=%s status=%ld attempts=%d%s", rq->op,
            call_outcome_name(run.outcome), run.resp.status, run.attempts,
            run.cancelled ? " (cancelled)" : "");

    curl_slist_free_all(run.headers);
    call_run_free(&run);
    return mcp_tool_result(o, !call_outcome_done(run.outcome));
}


cJSON *
mcp_idempotent_request(const mcp_config_t *cf, cJSON *args,
    volatile int *cancel)
{
    req_t          rq;
    call_state_t   st;
    call_action_t  a;
    cJSON         *res;
    int            rc;

    memset(&rq, 0, sizeof(req_t));
    call_state_init(&st);

    if (req_parse(&rq, cf, args) != 0) {
        mcp_log("call refused: %s", rq.why);
        res = mcp_refused(rq.op, rq.why);

    } else if (mcp_state_dir(cf, &st, rq.op) != 0) {
        res = mcp_refused(rq.op, st.err);

    } else {
        a.op = rq.op;
        a.method = rq.method;
        a.url = rq.url;
        a.body_sha = rq.body_sha;
        rc = call_state_prepare(&st, &a, rq.replaces);

        res = (rc == CALL_STATE_CONFLICT) ? req_conflict(&rq, &st)
              : (rc != 0) ? mcp_refused(rq.op, st.err)
              : req_send(&rq, &st, cancel);
    }

    call_state_free(&st);
    curl_slist_free_all(rq.headers);
    free(rq.body);
    free(rq.url);
    return res;
}
