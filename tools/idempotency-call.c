/*
 * idempotency-call: sends one intended action through the idempotency
 * module and applies the retry rule of docs/agents.md, so that an agent
 * or a script does not have to.
 *
 *   idempotency-call --op NAME [--state-dir DIR] [--new] [--status-url URL]
 *       [--max-time S] [--deadline S] -X METHOD URL [-H 'Name: value']...
 *       [-d @file | -d data]
 *
 * The key of an operation is created once, and written to the state dir
 * (fsync'ed) before the first byte is sent: a crash at any point leaves
 * the next run with the same key, so the module replays instead of
 * executing again.  One JSON object on stdout, an exit code per outcome.
 */

#include <errno.h>
#include <getopt.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include <cjson/cJSON.h>
#include <curl/curl.h>

#include "idem_text.h"
#include "call_state.h"
#include "call_http.h"
#include "call_policy.h"
#include "call_run.h"


/* exit codes: below 20 the action took effect exactly once */
#define EX_CREATED      0
#define EX_REPLAYED     10
#define EX_REUSED       11
#define EX_IN_PROGRESS  20
#define EX_CONFLICT     30
#define EX_UNKNOWN      31
#define EX_CONFIRM      32
#define EX_FAILED       40
#define EX_GAVE_UP      41
#define EX_BAD_INPUT    64
#define EX_INTERNAL     70
#define EX_STATE        73

#define CALL_BODY_INLINE    65536


typedef struct {
    const char         *op;
    const char         *state_dir;
    const char         *status_url;
    const char         *method;
    const char         *url;
    struct curl_slist  *headers;
    char               *body;
    size_t              body_len;
    char                body_sha[65];
    long                max_time_ms;
    long                deadline_ms;
    const char         *replaces;
} call_opts_t;


static void
fail_msg(const char *fmt, ...)
{
    va_list  ap;

    fputs("idempotency-call: ", stderr);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
}


/*
 * Test-only (docs/agents.md): IDEMPOTENCY_CALL_TEST_PAUSE=before_send or
 * after_answer stops the process there, so that a test can kill -9 it at
 * exactly that point.
 */
static void
test_pause(const char *point)
{
    const char  *v = getenv("IDEMPOTENCY_CALL_TEST_PAUSE");

    if (v != NULL && strcmp(v, point) == 0) {
        raise(SIGSTOP);
    }
}


static void
usage(FILE *f)
{
    fputs("usage: idempotency-call --op NAME [--state-dir DIR]\n"
          "         [--replaces KEY | --new]\n"
          "         [--status-url URL] [--max-time S] [--deadline S]\n"
          "         -X METHOD URL [-H 'Name: value']... [-d @file | -d data]\n"
          "\n"
          "  --op NAME         the intended action; its key is created once and\n"
          "                    kept in the state dir ([A-Za-z0-9._-], 1-128)\n"
          "  --state-dir DIR   default $IDEMPOTENCY_STATE_DIR, else\n"
          "                    $XDG_STATE_HOME/idempotency-call, else\n"
          "                    ~/.local/state/idempotency-call\n"
          "  --replaces KEY    a new action under this name, replacing the one\n"
          "                    with KEY; run again, it resumes the new one\n"
          "  --new             a new action under this name, whatever it holds\n"
          "  --status-url URL  the module's idempotency_status location, asked\n"
          "                    after a timeout or a lost connection\n"
          "  --max-time S      bound of one attempt (default 30)\n"
          "  --deadline S      bound of the whole call, waits included\n"
          "                    (default 60)\n"
          "  -X METHOD         POST, PUT, PATCH or DELETE (default POST)\n"
          "  -H 'Name: value'  a request header (repeatable)\n"
          "  -d data, -d @F    the body, or the file F holding it\n"
          "\n"
          "Prints one JSON object; outcome and exit code:\n"
          "   0 created       executed now          10 replayed (done earlier)\n"
          "  11 reused (another key's operation)   20 in_progress at deadline\n"
          "  30 conflict      31 unknown            32 confirmation_required\n"
          "  40 failed: a final answer that is not 2xx/3xx\n"
          "  41 failed: no final answer before the deadline (run it again)\n"
          "  64 bad input, 73 state dir or file unusable, 70 internal error\n"
          "     (nothing sent for 64 and 73)\n", f);
}


static int
parse_seconds(const char *s, long *ms)
{
    char    *end;
    double   v;

    errno = 0;
    v = strtod(s, &end);

    if (errno != 0 || end == s || *end != '\0' || v <= 0 || v > 86400) {
        return -1;
    }

    *ms = (long) (v * 1000);
    return (*ms > 0) ? 0 : -1;
}


static int
url_valid(const char *url)
{
    return strncasecmp(url, "http://", 7) == 0
           || strncasecmp(url, "https://", 8) == 0;
}


static int
header_add(call_opts_t *o, const char *h)
{
    const char         *colon = strchr(h, ':');
    struct curl_slist  *l;

    if (colon == NULL || colon == h) {
        /* the argument is not shown: without a colon it may be a token */
        fail_msg("-H wants 'Name: value' (the argument is not shown: it"
                 " may hold a secret)");
        return -1;
    }

    if ((size_t) (colon - h) == 15
        && strncasecmp(h, "Idempotency-Key", 15) == 0)
    {
        fail_msg("-H Idempotency-Key: the key belongs to --op, not to -H");
        return -1;
    }

    l = curl_slist_append(o->headers, h);
    if (l == NULL) {
        return -1;
    }

    o->headers = l;
    return 0;
}


static int
body_set(call_opts_t *o, const char *arg)
{
    char  err[512];

    free(o->body);

    if (arg[0] == '@') {
        o->body = call_read_file(arg + 1, &o->body_len, err, sizeof(err));
        if (o->body == NULL) {
            fail_msg("-d @%s", err);
            return -1;
        }

    } else {
        o->body_len = strlen(arg);
        o->body = malloc(o->body_len + 1);
        if (o->body == NULL) {
            return -1;
        }
        memcpy(o->body, arg, o->body_len + 1);
    }

    call_body_sha(o->body, o->body_len, o->body_sha);
    return 0;
}


static int
parse_option(call_opts_t *o, int c)
{
    switch (c) {
    case 'o': o->op = optarg; return 0;
    case 's': o->state_dir = optarg; return 0;
    case 'n': o->replaces = ""; return 0;

    case 'r':
        if (!call_key_valid(optarg)) {
            fail_msg("--replaces wants a key this tool printed (32 lowercase"
                     " hex digits), got \"%s\"", optarg);
            return -1;
        }
        o->replaces = optarg;
        return 0;
    case 'u': o->status_url = optarg; return 0;
    case 'X': o->method = optarg; return 0;
    case 'H': return header_add(o, optarg);
    case 'd': return body_set(o, optarg);

    case 'm':
        if (parse_seconds(optarg, &o->max_time_ms) != 0) {
            fail_msg("--max-time wants seconds > 0, got \"%s\"", optarg);
            return -1;
        }
        return 0;

    case 'D':
        if (parse_seconds(optarg, &o->deadline_ms) != 0) {
            fail_msg("--deadline wants seconds > 0, got \"%s\"", optarg);
            return -1;
        }
        return 0;

    default:
        usage(stderr);
        return -1;
    }
}


static int
check_opts(call_opts_t *o)
{
    static const char  *methods[] = { "POST", "PUT", "PATCH", "DELETE" };
    size_t              i;

    if (o->op == NULL || o->url == NULL) {
        fail_msg("--op NAME and a URL are required (--help)");
        return -1;
    }

    if (!call_op_name_valid(o->op)) {
        fail_msg("--op \"%s\": 1 to %d of A-Z a-z 0-9 . _ -, not starting"
                 " with a dot", o->op, CALL_OP_MAX);
        return -1;
    }

    if (!url_valid(o->url)) {
        fail_msg("URL \"%s\" has no http:// or https:// scheme", o->url);
        return -1;
    }

    if (o->status_url != NULL && !url_valid(o->status_url)) {
        fail_msg("--status-url \"%s\" has no http:// or https:// scheme",
                 o->status_url);
        return -1;
    }

    for (i = 0; i < sizeof(methods) / sizeof(methods[0]); i++) {
        if (strcmp(o->method, methods[i]) == 0) {
            return 0;
        }
    }

    fail_msg("-X %s: the module protects POST, PUT, PATCH and DELETE",
             o->method);
    return -1;
}


/* 0 to go on, 1 when --help was answered, -1 on bad input */
static int
parse_args(int argc, char **argv, call_opts_t *o)
{
    static const struct option  opts[] = {
        { "op",         required_argument, NULL, 'o' },
        { "state-dir",  required_argument, NULL, 's' },
        { "new",        no_argument,       NULL, 'n' },
        { "replaces",   required_argument, NULL, 'r' },
        { "status-url", required_argument, NULL, 'u' },
        { "max-time",   required_argument, NULL, 'm' },
        { "deadline",   required_argument, NULL, 'D' },
        { "request",    required_argument, NULL, 'X' },
        { "header",     required_argument, NULL, 'H' },
        { "data",       required_argument, NULL, 'd' },
        { "help",       no_argument,       NULL, 'h' },
        { NULL, 0, NULL, 0 }
    };

    int  c;

    while ((c = getopt_long(argc, argv, "X:H:d:h", opts, NULL)) != -1) {
        if (c == 'h') {
            usage(stdout);
            return 1;
        }

        if (parse_option(o, c) != 0) {
            return -1;
        }
    }

    if (optind + 1 != argc) {
        fail_msg("exactly one URL expected (--help)");
        return -1;
    }

    o->url = argv[optind];

    if (o->body == NULL && body_set(o, "") != 0) {
        return -1;
    }

    return check_opts(o);
}

/* ---------------------------------------------------------------- result */


typedef struct {
    call_opts_t   *o;
    call_state_t  *st;
    call_run_t    *run;
} call_ctx_t;


/* idempotency-call's outcomes: the rule's, with every other final "failed" */
static const char *
outcome_name(call_run_t *run)
{
    switch (run->outcome) {
    case CALL_OUT_CREATED:
    case CALL_OUT_REPLAYED:
    case CALL_OUT_REUSED:
    case CALL_OUT_IN_PROGRESS:
    case CALL_OUT_CONFLICT:
    case CALL_OUT_UNKNOWN:
    case CALL_OUT_CONFIRM:
        return call_outcome_name(run->outcome);
    default:
        return "failed";
    }
}


static int
exit_code(call_run_t *run)
{
    switch (run->outcome) {
    case CALL_OUT_CREATED:      return EX_CREATED;
    case CALL_OUT_REPLAYED:     return EX_REPLAYED;
    case CALL_OUT_REUSED:       return EX_REUSED;
    case CALL_OUT_IN_PROGRESS:  return EX_IN_PROGRESS;
    case CALL_OUT_CONFLICT:     return EX_CONFLICT;
    case CALL_OUT_UNKNOWN:      return EX_UNKNOWN;
    case CALL_OUT_CONFIRM:      return EX_CONFIRM;
    default:
        /* no final answer before the deadline: nothing is lost, rerun */
        return run->gave_up ? EX_GAVE_UP : EX_FAILED;
    }
}


/* the body as JSON when it is JSON, as text when it is short UTF-8 */
static int
add_body(cJSON *out, call_ctx_t *cx, call_resp_t *r)
{
    char    path[4300];
    cJSON  *v = NULL;

    if (r->len > 0 && call_is_json_type(r->ctype)) {
        v = cJSON_ParseWithLength(r->body, r->len);
    }

    if (v == NULL && r->len <= CALL_BODY_INLINE
        && idem_utf8_valid(r->body ? r->body : "", r->len)
        && memchr(r->body ? r->body : "", '\0', r->len) == NULL)
    {
        v = cJSON_CreateString(r->body ? r->body : "");
    }

    if (v != NULL) {
        return cJSON_AddItemToObject(out, "body", v) ? 0 : -1;
    }

    snprintf(path, sizeof(path), "%.4095s/%.128s.body", cx->st->dir,
             cx->o->op);

    if (call_state_write(cx->st, path, r->body, r->len) != 0) {
        fail_msg("%s", cx->st->err);
        return -1;
    }

    return (cJSON_AddStringToObject(out, "body_file", path)
            && cJSON_AddNumberToObject(out, "body_bytes", (double) r->len))
           ? 0 : -1;
}


static void
add_problem(cJSON *out, call_resp_t *r, call_run_t *run)
{
    const char  *v;
    cJSON       *n;

    /* r is run->resp */
    call_run_problem(out, run);

    if (strcmp(r->slug, "response-not-stored") == 0) {
        n = cJSON_GetObjectItemCaseSensitive(r->problem, "response_status");
        if (cJSON_IsNumber(n)) {
            r->status = (long) n->valuedouble;
        }
        cJSON_AddBoolToObject(out, "response_not_stored", 1);
        if ((v = call_json_str(r->problem, "location")) != NULL) {
            cJSON_AddStringToObject(out, "location", v);
        }
    }

    if (run->outcome == CALL_OUT_CONFIRM) {
        cJSON_AddItemToObject(out, "proposal",
                              cJSON_Duplicate(r->problem, 1));
    }
}


static cJSON *
result_json(call_ctx_t *cx)
{
    cJSON        *out = cJSON_CreateObject();
    call_run_t   *run = cx->run;
    call_resp_t  *r = &run->resp;

    if (out == NULL) {
        return NULL;
    }

    cJSON_AddStringToObject(out, "outcome", outcome_name(run));
    cJSON_AddStringToObject(out, "op", cx->o->op);
    cJSON_AddStringToObject(out, "key", cx->st->key);

    if (run->final && r->problem != NULL) {
        add_problem(out, r, run);
    }

    if (run->final) {
        cJSON_AddNumberToObject(out, "status", (double) r->status);
        if (add_body(out, cx, r) != 0) {
            cJSON_Delete(out);
            return NULL;
        }

    } else {
        cJSON_AddNullToObject(out, "status");
    }

    cJSON_AddNumberToObject(out, "attempts", run->attempts);

    if (run->error != NULL) {
        cJSON_AddStringToObject(out, "error", run->error);
    }

    if (run->final == 0 && r->curl_rc != CURLE_OK) {
        cJSON_AddStringToObject(out, "transport_error", r->curl_err);
    }

    cJSON_AddStringToObject(out, "state_file", cx->st->file);
    return out;
}


/* operation_id last: the status endpoint may be asked for it */
static int
result_print(call_ctx_t *cx)
{
    call_run_t  *run = cx->run;
    cJSON       *out;
    char        *text;

    out = result_json(cx);
    if (out == NULL) {
        return -1;
    }

    if (run->operation_id[0] == '\0' && run->resp.operation[0] != '\0'
        && strlen(run->resp.operation) == 32)
    {
        memcpy(run->operation_id, run->resp.operation, 33);
    }

    if (run->operation_id[0] == '\0' && run->final
        && run->outcome != CALL_OUT_CONFLICT)
    {
        call_run_status(run);
    }

    if (run->operation_id[0] != '\0') {
        cJSON_AddStringToObject(out, "operation_id", run->operation_id);
    } else {
        cJSON_AddNullToObject(out, "operation_id");
    }

    text = cJSON_PrintUnformatted(out);
    cJSON_Delete(out);

    if (text == NULL || printf("%s\n", text) < 0 || fflush(stdout) != 0) {
        free(text);
        return -1;
    }

    free(text);
    return 0;
}


/* ---------------------------------------------------------------- main */


static int
local_conflict(call_ctx_t *cx)
{
    cJSON  *out = cJSON_CreateObject();
    char   *text;

    fail_msg("%s", cx->st->err);

    cJSON_AddStringToObject(out, "outcome", "conflict");
    cJSON_AddStringToObject(out, "op", cx->o->op);
    cJSON_AddStringToObject(out, "key", cx->st->key);
    cJSON_AddNullToObject(out, "operation_id");
    cJSON_AddNullToObject(out, "status");
    cJSON_AddNumberToObject(out, "attempts", 0);
    cJSON_AddStringToObject(out, "detail", cx->st->err);
    cJSON_AddStringToObject(out, "state_file", cx->st->file);

    text = cJSON_PrintUnformatted(out);
    cJSON_Delete(out);
    if (text != NULL) {
        printf("%s\n", text);
        free(text);
    }

    return EX_CONFLICT;
}


static int
state_prepare(call_ctx_t *cx)
{
    call_opts_t    *o = cx->o;
    call_action_t   a = { o->op, o->method, o->url, o->body_sha };
    int             rc;

    if (call_state_dir(cx->st, o->state_dir, o->op) != 0) {
        fail_msg("%s", cx->st->err);
        return EX_BAD_INPUT;
    }

    rc = call_state_prepare(cx->st, &a, o->replaces);

    if (rc == CALL_STATE_CONFLICT) {
        return local_conflict(cx);
    }

    if (rc != 0) {
        fail_msg("%s", cx->st->err);
        return EX_STATE;
    }

    return 0;
}


static int
call_main(call_ctx_t *cx)
{
    call_opts_t  *o = cx->o;
    call_run_t   *run = cx->run;
    int           rc;

    rc = state_prepare(cx);
    if (rc != 0) {
        return rc;
    }

    run->headers = call_headers_with_key(o->headers, cx->st->key);
    if (run->headers == NULL) {
        return EX_INTERNAL;
    }

    test_pause("before_send");

    run->method = o->method;
    run->url = o->url;
    run->status_url = o->status_url;
    run->body = o->body;
    run->body_len = o->body_len;
    run->max_time_ms = o->max_time_ms;
    run->deadline = call_now_ms() + o->deadline_ms;

    if (call_run_loop(run) != 0) {
        fail_msg("cannot send: out of memory or libcurl failed");
        return EX_INTERNAL;
    }

    test_pause("after_answer");

    call_state_record(cx->st, o->op, outcome_name(run),
                      run->final ? run->resp.status : 0);

    if (result_print(cx) != 0) {
        fail_msg("cannot write the result");
        return EX_INTERNAL;
    }

    return exit_code(run);
}


int
main(int argc, char **argv)
{
    call_opts_t   o;
    call_state_t  st;
    call_run_t    run;
    call_ctx_t    cx = { &o, &st, &run };
    int           rc;

    memset(&o, 0, sizeof(call_opts_t));
    call_state_init(&st);
    call_run_init(&run);
    o.method = "POST";
    o.max_time_ms = 30000;
    o.deadline_ms = 60000;

    rc = parse_args(argc, argv, &o);
    if (rc != 0) {
        return (rc > 0) ? 0 : EX_BAD_INPUT;
    }

    if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK) {
        return EX_INTERNAL;
    }

    srandom((unsigned) (call_now_ms() ^ getpid()));

    rc = call_main(&cx);

    call_run_free(&run);
    curl_slist_free_all(run.headers);
    curl_slist_free_all(o.headers);
    call_state_free(&st);
    free(o.body);
    curl_global_cleanup();

    return rc;
}
