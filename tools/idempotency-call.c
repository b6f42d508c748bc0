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

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>
#include <curl/curl.h>
#include <openssl/rand.h>
#include <openssl/sha.h>

#include "idem_text.h"


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

#define CALL_KEY_BYTES      16
#define CALL_OP_MAX         128
#define CALL_BODY_INLINE    65536
#define CALL_PROBLEM_URN    "urn:ngx-idempotency:problem:"


typedef enum {
    OUT_CREATED = 0,
    OUT_REPLAYED,
    OUT_REUSED,
    OUT_IN_PROGRESS,
    OUT_CONFLICT,
    OUT_UNKNOWN,
    OUT_CONFIRM,
    OUT_FAILED
} call_outcome_e;

static const char  *outcome_names[] = {
    "created", "replayed", "reused", "in_progress", "conflict", "unknown",
    "confirmation_required", "failed"
};


typedef struct {
    const char         *op;
    const char         *state_dir;
    const char         *status_url;
    const char         *method;
    const char         *url;
    struct curl_slist  *headers;
    char               *body;
    size_t              body_len;
    char                body_sha[SHA256_DIGEST_LENGTH * 2 + 1];
    long                max_time_ms;
    long                deadline_ms;
    int                 new_op;
} call_opts_t;


typedef struct {
    CURLcode   curl_rc;
    char       curl_err[CURL_ERROR_SIZE];
    long       status;
    char      *body;
    size_t     len;
    size_t     size;
    char       ctype[128];
    long       retry_after;
    int        replayed;
    cJSON     *problem;     /* the module's own problem+json, or NULL */
    char       slug[64];
} call_resp_t;


typedef struct {
    char             dir[4096];
    char             file[4200];
    char             key[CALL_KEY_BYTES * 2 + 1];
    int              lock_fd;
    int              fresh;
    cJSON           *doc;
} call_state_t;


typedef struct {
    call_outcome_e   outcome;
    int              code;
    int              attempts;
    int              final;     /* resp holds the answer to report */
    const char      *error;
    char             operation_id[33];
    char             errbuf[512];
} call_result_t;


static long long
now_ms(void)
{
    struct timespec  ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long) ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}


static void
sleep_ms(long ms)
{
    struct timespec  ts;

    if (ms <= 0) {
        return;
    }

    ts.tv_sec = ms / 1000;
    ts.tv_nsec = (ms % 1000) * 1000000L;

    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
        /* the rest of the wait */
    }
}


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
    fputs("usage: idempotency-call --op NAME [--state-dir DIR] [--new]\n"
          "         [--status-url URL] [--max-time S] [--deadline S]\n"
          "         -X METHOD URL [-H 'Name: value']... [-d @file | -d data]\n"
          "\n"
          "  --op NAME         the intended action; its key is created once and\n"
          "                    kept in the state dir ([A-Za-z0-9._-], 1-128)\n"
          "  --state-dir DIR   default $IDEMPOTENCY_STATE_DIR, else\n"
          "                    $XDG_STATE_HOME/idempotency-call, else\n"
          "                    ~/.local/state/idempotency-call\n"
          "  --new             a new action under this name: a new key\n"
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
          "  11 reused        (not produced yet)    20 in_progress at deadline\n"
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
op_name_valid(const char *op)
{
    size_t  i, n = strlen(op);

    if (n == 0 || n > CALL_OP_MAX || op[0] == '.') {
        return 0;
    }

    for (i = 0; i < n; i++) {
        if (!isalnum((unsigned char) op[i]) && strchr("._-", op[i]) == NULL) {
            return 0;
        }
    }

    return 1;
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
        fail_msg("-H wants 'Name: value', got \"%s\"", h);
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


static char *
read_file(const char *path, size_t *len)
{
    FILE    *f;
    char    *buf, *p;
    size_t   size = 65536, n;

    f = (strcmp(path, "-") == 0) ? stdin : fopen(path, "rb");
    if (f == NULL) {
        fail_msg("-d @%s: %s", path, strerror(errno));
        return NULL;
    }

    *len = 0;
    buf = malloc(size);

    while (buf != NULL) {
        n = fread(buf + *len, 1, size - *len, f);
        *len += n;

        if (n == 0) {
            if (ferror(f)) {
                fail_msg("-d @%s: read error", path);
                free(buf);
                buf = NULL;
            }
            break;
        }

        if (*len == size) {
            size *= 2;
            p = realloc(buf, size);
            if (p == NULL) {
                free(buf);
            }
            buf = p;
        }
    }

    if (f != stdin) {
        fclose(f);
    }

    return buf;
}


static int
body_set(call_opts_t *o, const char *arg)
{
    unsigned char  md[SHA256_DIGEST_LENGTH];

    free(o->body);

    if (arg[0] == '@') {
        o->body = read_file(arg + 1, &o->body_len);
        if (o->body == NULL) {
            return -1;
        }

    } else {
        o->body_len = strlen(arg);
        o->body = malloc(o->body_len + 1);
        if (o->body == NULL) {
            return -1;
        }
        memcpy(o->body, arg, o->body_len);
    }

    SHA256((const unsigned char *) o->body, o->body_len, md);
    idem_hex(md, sizeof(md), o->body_sha);
    return 0;
}


static int
parse_option(call_opts_t *o, int c)
{
    switch (c) {
    case 'o': o->op = optarg; return 0;
    case 's': o->state_dir = optarg; return 0;
    case 'n': o->new_op = 1; return 0;
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

    if (!op_name_valid(o->op)) {
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


/* ---------------------------------------------------------------- state */


static int
state_dir_resolve(call_opts_t *o, call_state_t *st)
{
    const char  *env;
    int          n;

    if (o->state_dir != NULL) {
        n = snprintf(st->dir, sizeof(st->dir), "%s", o->state_dir);

    } else if ((env = getenv("IDEMPOTENCY_STATE_DIR")) != NULL && *env) {
        n = snprintf(st->dir, sizeof(st->dir), "%s", env);

    } else if ((env = getenv("XDG_STATE_HOME")) != NULL && *env == '/') {
        n = snprintf(st->dir, sizeof(st->dir), "%s/idempotency-call", env);

    } else if ((env = getenv("HOME")) != NULL && *env) {
        n = snprintf(st->dir, sizeof(st->dir),
                     "%s/.local/state/idempotency-call", env);

    } else {
        fail_msg("no state dir: set --state-dir, IDEMPOTENCY_STATE_DIR"
                 " or HOME");
        return -1;
    }

    if (n <= 0 || (size_t) n >= sizeof(st->dir)) {
        fail_msg("state dir path too long");
        return -1;
    }

    snprintf(st->file, sizeof(st->file), "%s/%s.json", st->dir, o->op);
    return 0;
}


/* mkdir -p, private: the keys are capabilities of their operations */
static int
mkdir_p(const char *dir)
{
    char         path[4096];
    char        *p, c;
    struct stat  sb;

    snprintf(path, sizeof(path), "%s", dir);

    for (p = path + 1; ; p++) {
        if (*p != '/' && *p != '\0') {
            continue;
        }

        c = *p;
        *p = '\0';
        if (mkdir(path, 0700) != 0 && errno != EEXIST) {
            fail_msg("state dir %s: cannot create %s: %s", dir, path,
                     strerror(errno));
            return -1;
        }
        *p = c;

        if (c == '\0') {
            break;
        }
    }

    if (stat(dir, &sb) != 0 || !S_ISDIR(sb.st_mode)) {
        fail_msg("state dir %s: not a directory", dir);
        return -1;
    }

    if (access(dir, W_OK | X_OK) != 0) {
        fail_msg("state dir %s: not writable: %s", dir, strerror(errno));
        return -1;
    }

    return 0;
}


/*
 * One lock per operation name, held while the key is read or created and
 * while the outcome is written: two runs of one --op never create two keys.
 */
static int
state_lock(const char *op, call_state_t *st)
{
    char  path[4300];

    snprintf(path, sizeof(path), "%s/%s.lock", st->dir, op);

    st->lock_fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (st->lock_fd == -1) {
        fail_msg("lock %s: %s", path, strerror(errno));
        return -1;
    }

    while (flock(st->lock_fd, LOCK_EX) != 0) {
        if (errno != EINTR) {
            fail_msg("flock %s: %s", path, strerror(errno));
            return -1;
        }
    }

    return 0;
}


static void
state_unlock(call_state_t *st)
{
    if (st->lock_fd != -1) {
        close(st->lock_fd);
        st->lock_fd = -1;
    }
}


/* write a temp file, fsync, rename over path, fsync the dir */
static int
write_atomic(const char *dir, const char *path, const char *data, size_t n)
{
    char     tmp[4400];
    int      fd, rc;
    ssize_t  w;
    size_t   off = 0;

    snprintf(tmp, sizeof(tmp), "%s.tmp.%ld", path, (long) getpid());

    fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd == -1) {
        fail_msg("%s: %s", tmp, strerror(errno));
        return -1;
    }

    while (off < n) {
        w = write(fd, data + off, n - off);
        if (w <= 0) {
            if (w < 0 && errno == EINTR) {
                continue;
            }
            break;
        }
        off += w;
    }

    rc = (off == n && fsync(fd) == 0) ? 0 : -1;
    rc = (close(fd) == 0) ? rc : -1;

    if (rc != 0 || rename(tmp, path) != 0) {
        fail_msg("%s: cannot write: %s", path, strerror(errno));
        unlink(tmp);
        return -1;
    }

    fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd == -1 || fsync(fd) != 0) {
        fail_msg("%s: cannot fsync: %s", dir, strerror(errno));
        if (fd != -1) {
            close(fd);
        }
        return -1;
    }

    close(fd);
    return 0;
}


static int
state_save(call_state_t *st)
{
    char  *text;
    int    rc;

    text = cJSON_Print(st->doc);
    if (text == NULL) {
        return -1;
    }

    rc = write_atomic(st->dir, st->file, text, strlen(text));
    free(text);
    return rc;
}


static const char *
json_str(cJSON *obj, const char *name)
{
    cJSON  *v = cJSON_GetObjectItemCaseSensitive(obj, name);

    return cJSON_IsString(v) ? v->valuestring : NULL;
}


static void
utc_now(char *buf, size_t n)
{
    time_t     t = time(NULL);
    struct tm  tm;

    gmtime_r(&t, &tm);
    strftime(buf, n, "%Y-%m-%dT%H:%M:%SZ", &tm);
}


static int
key_valid(const char *k)
{
    size_t  i;

    if (k == NULL || strlen(k) != CALL_KEY_BYTES * 2) {
        return 0;
    }

    for (i = 0; i < CALL_KEY_BYTES * 2; i++) {
        if (!isxdigit((unsigned char) k[i]) || isupper((unsigned char) k[i])) {
            return 0;
        }
    }

    return 1;
}


/* 0 loaded, 1 no state file, -1 unusable (reported) */
static int
state_load(call_opts_t *o, call_state_t *st)
{
    size_t       len;
    char        *text;
    const char  *key, *op;
    FILE        *f;

    f = fopen(st->file, "rb");
    if (f == NULL) {
        if (errno == ENOENT) {
            return 1;
        }
        fail_msg("state file %s: %s", st->file, strerror(errno));
        return -1;
    }
    fclose(f);

    text = read_file(st->file, &len);
    if (text == NULL) {
        return -1;
    }

    st->doc = cJSON_ParseWithLength(text, len);
    free(text);

    key = json_str(st->doc, "key");
    op = json_str(st->doc, "op");

    if (!cJSON_IsObject(st->doc) || !key_valid(key) || op == NULL
        || strcmp(op, o->op) != 0 || json_str(st->doc, "method") == NULL
        || json_str(st->doc, "url") == NULL
        || json_str(st->doc, "body_sha256") == NULL)
    {
        fail_msg("state file %s is corrupt (not the JSON this tool writes);"
                 " nothing was sent. Move it away only if you know its"
                 " action never ran; --new starts a new action", st->file);
        return -1;
    }

    memcpy(st->key, key, sizeof(st->key));
    return 0;
}


static int
state_create(call_opts_t *o, call_state_t *st)
{
    unsigned char  raw[CALL_KEY_BYTES];
    char           at[32];

    if (RAND_bytes(raw, sizeof(raw)) != 1) {
        fail_msg("RAND_bytes failed");
        return -1;
    }

    idem_hex(raw, sizeof(raw), st->key);
    utc_now(at, sizeof(at));

    cJSON_Delete(st->doc);
    st->doc = cJSON_CreateObject();

    if (st->doc == NULL
        || !cJSON_AddNumberToObject(st->doc, "v", 1)
        || !cJSON_AddStringToObject(st->doc, "op", o->op)
        || !cJSON_AddStringToObject(st->doc, "key", st->key)
        || !cJSON_AddStringToObject(st->doc, "method", o->method)
        || !cJSON_AddStringToObject(st->doc, "url", o->url)
        || !cJSON_AddStringToObject(st->doc, "body_sha256", o->body_sha)
        || !cJSON_AddStringToObject(st->doc, "created_at", at))
    {
        return -1;
    }

    st->fresh = 1;
    return state_save(st);
}


/* the first of method, url, body that differs from the recorded action */
static const char *
state_differs(call_opts_t *o, call_state_t *st)
{
    if (strcmp(json_str(st->doc, "method"), o->method) != 0) {
        return "method";
    }

    if (strcmp(json_str(st->doc, "url"), o->url) != 0) {
        return "URL";
    }

    if (strcmp(json_str(st->doc, "body_sha256"), o->body_sha) != 0) {
        return "body";
    }

    return NULL;
}


/* ---------------------------------------------------------------- HTTP */


static size_t
resp_body_cb(char *p, size_t size, size_t nmemb, void *data)
{
    call_resp_t  *r = data;
    size_t        n = size * nmemb, want;
    char         *b;

    if (r->len + n + 1 > r->size) {
        want = (r->size ? r->size * 2 : 16384);
        while (want < r->len + n + 1) {
            want *= 2;
        }
        b = realloc(r->body, want);
        if (b == NULL) {
            return 0;
        }
        r->body = b;
        r->size = want;
    }

    memcpy(r->body + r->len, p, n);
    r->len += n;
    r->body[r->len] = '\0';
    return n;
}


/* value of header "name" in the line p[0..n), trimmed, or NULL */
static const char *
header_value(char *p, size_t n, const char *name, size_t *vlen)
{
    size_t  nl = strlen(name);
    char   *v, *end = p + n;

    if (n <= nl || strncasecmp(p, name, nl) != 0 || p[nl] != ':') {
        return NULL;
    }

    v = p + nl + 1;
    while (v < end && (*v == ' ' || *v == '\t')) {
        v++;
    }
    while (end > v && (end[-1] == '\r' || end[-1] == '\n' || end[-1] == ' ')) {
        end--;
    }

    *vlen = end - v;
    return v;
}


static size_t
resp_header_cb(char *p, size_t size, size_t nmemb, void *data)
{
    call_resp_t  *r = data;
    size_t        n = size * nmemb, vl;
    const char   *v;

    if (n >= 5 && strncmp(p, "HTTP/", 5) == 0) {
        /* a new head (after 100 Continue): forget the last one's fields */
        r->ctype[0] = '\0';
        r->retry_after = -1;
        r->replayed = 0;

    } else if ((v = header_value(p, n, "content-type", &vl)) != NULL) {
        snprintf(r->ctype, sizeof(r->ctype), "%.*s", (int) vl, v);

    } else if ((v = header_value(p, n, "retry-after", &vl)) != NULL) {
        r->retry_after = (vl > 0 && vl < 7 && isdigit((unsigned char) *v))
                         ? atol(v) : -1;

    } else if ((v = header_value(p, n, "idempotent-replayed", &vl)) != NULL) {
        r->replayed = (vl == 4 && strncasecmp(v, "true", 4) == 0);
    }

    return n;
}


static void
resp_reset(call_resp_t *r)
{
    free(r->body);
    cJSON_Delete(r->problem);
    memset(r, 0, sizeof(call_resp_t));
    r->retry_after = -1;
}


static int
is_json_type(const char *ct)
{
    size_t  n = strcspn(ct, "; ");

    return (n == 16 && strncasecmp(ct, "application/json", 16) == 0)
           || (n > 5 && strncasecmp(ct + n - 5, "+json", 5) == 0);
}


/* the module's own problem answers carry its URN in "type" */
static void
resp_problem(call_resp_t *r)
{
    const char  *type;
    size_t       n = sizeof(CALL_PROBLEM_URN) - 1;

    if (strncasecmp(r->ctype, "application/problem+json", 24) != 0
        || r->body == NULL)
    {
        return;
    }

    r->problem = cJSON_ParseWithLength(r->body, r->len);
    type = json_str(r->problem, "type");

    if (type == NULL || strncmp(type, CALL_PROBLEM_URN, n) != 0) {
        cJSON_Delete(r->problem);
        r->problem = NULL;
        return;
    }

    snprintf(r->slug, sizeof(r->slug), "%s", type + n);
}


/* one request; a transport failure is left in r->curl_rc */
static int
http_do(const char *method, const char *url, struct curl_slist *headers,
    const char *body, size_t len, long timeout_ms, call_resp_t *r)
{
    CURL  *c;

    resp_reset(r);

    c = curl_easy_init();
    if (c == NULL) {
        return -1;
    }

    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, headers);
    curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, timeout_ms);
    curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS, timeout_ms);
    curl_easy_setopt(c, CURLOPT_ERRORBUFFER, r->curl_err);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, resp_body_cb);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, r);
    curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, resp_header_cb);
    curl_easy_setopt(c, CURLOPT_HEADERDATA, r);

    if (body != NULL) {
        curl_easy_setopt(c, CURLOPT_POSTFIELDS, body);
        curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t) len);
        curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, method);
    }

    r->curl_rc = curl_easy_perform(c);

    if (r->curl_rc == CURLE_OK) {
        curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &r->status);
        resp_problem(r);

    } else if (r->curl_err[0] == '\0') {
        snprintf(r->curl_err, sizeof(r->curl_err), "%s",
                 curl_easy_strerror(r->curl_rc));
    }

    curl_easy_cleanup(c);
    return 0;
}


/* the user's headers plus the key */
static struct curl_slist *
headers_with_key(call_opts_t *o, const char *key)
{
    struct curl_slist  *l = NULL, *h, *n;
    char                line[128];

    for (h = o->headers; h != NULL; h = h->next) {
        n = curl_slist_append(l, h->data);
        if (n == NULL) {
            curl_slist_free_all(l);
            return NULL;
        }
        l = n;
    }

    snprintf(line, sizeof(line), "Idempotency-Key: %s", key);

    /* "Expect:" so a large body is not held back for a 100 Continue */
    n = curl_slist_append(l, line);
    n = (n != NULL) ? curl_slist_append(n, "Expect:") : NULL;
    if (n == NULL) {
        curl_slist_free_all(l);
    }

    return n;
}


/* ---------------------------------------------------------------- rule */


typedef enum {
    ACT_FINAL,      /* report it */
    ACT_AMBIGUOUS,  /* may or may not have run: ask, then resend */
    ACT_WAIT,       /* not done yet: wait Retry-After, resend */
} call_act_e;


static call_act_e
classify_problem(call_resp_t *r, call_result_t *res)
{
    const char  *s = r->slug;

    if (strcmp(s, "in-progress") == 0) {
        res->outcome = OUT_IN_PROGRESS;
        return ACT_WAIT;
    }

    if (strcmp(s, "store-unavailable") == 0 || strcmp(s, "retry-later") == 0) {
        res->outcome = OUT_FAILED;
        return ACT_WAIT;
    }

    if (strcmp(s, "fingerprint-mismatch") == 0) {
        res->outcome = OUT_CONFLICT;

    } else if (strcmp(s, "outcome-unknown") == 0) {
        res->outcome = OUT_UNKNOWN;

    } else if (strncmp(s, "confirmation-", 13) == 0 || r->status == 428) {
        res->outcome = OUT_CONFIRM;

    } else if (strcmp(s, "response-not-stored") == 0) {
        /* done earlier, only the body was too large to keep */
        res->outcome = OUT_REPLAYED;

    } else {
        res->outcome = OUT_FAILED;
    }

    return ACT_FINAL;
}


static call_act_e
classify(call_resp_t *r, call_result_t *res)
{
    if (r->curl_rc != CURLE_OK) {
        return ACT_AMBIGUOUS;
    }

    if (r->problem != NULL) {
        return classify_problem(r, res);
    }

    if (r->replayed) {
        res->outcome = (r->status < 400) ? OUT_REPLAYED : OUT_FAILED;
        return ACT_FINAL;
    }

    if (r->status == 429 || r->status == 503) {
        /* the upstream's "not done, try later": the module released it */
        res->outcome = OUT_FAILED;
        return ACT_WAIT;
    }

    if (r->status == 502 || r->status == 504) {
        /* nginx's own: not connected (released) or no answer (unknown) */
        return ACT_AMBIGUOUS;
    }

    if (r->status == 428) {
        res->outcome = OUT_CONFIRM;
        return ACT_FINAL;
    }

    res->outcome = (r->status >= 200 && r->status < 400) ? OUT_CREATED
                                                          : OUT_FAILED;
    return ACT_FINAL;
}


typedef struct {
    call_opts_t         *o;
    call_state_t        *st;
    struct curl_slist   *headers;
    long long            deadline;
    call_resp_t          resp;
    call_resp_t          status;
    char                 state_seen[32];
} call_run_t;


static long
time_left(call_run_t *run)
{
    long long  left = run->deadline - now_ms();

    return (left > 0) ? (long) left : 0;
}


/*
 * Asks the status endpoint for the key; the record's state goes to
 * run->state_seen ("" when there is no answer, "none" for 404).
 */
static void
status_ask(call_run_t *run, call_result_t *res)
{
    call_resp_t  *s = &run->status;
    cJSON        *doc;
    const char   *v;
    long          t = time_left(run);

    run->state_seen[0] = '\0';

    if (run->o->status_url == NULL || t == 0) {
        return;
    }

    t = (t < 5000) ? t : 5000;

    if (http_do("GET", run->o->status_url, run->headers, NULL, 0, t, s) != 0
        || s->curl_rc != CURLE_OK)
    {
        return;
    }

    if (s->status == 404 && strcmp(s->slug, "not-found") == 0) {
        strcpy(run->state_seen, "none");
        return;
    }

    doc = (s->status == 200) ? cJSON_ParseWithLength(s->body, s->len) : NULL;

    if ((v = json_str(doc, "state")) != NULL) {
        snprintf(run->state_seen, sizeof(run->state_seen), "%s", v);
    }

    if ((v = json_str(doc, "operation_id")) != NULL && strlen(v) == 32) {
        memcpy(res->operation_id, v, 33);
    }

    cJSON_Delete(doc);
}


static long
backoff_ms(int attempt)
{
    long  b = 250L << (attempt < 5 ? attempt - 1 : 4);

    return b / 2 + random() % (b / 2 + 1);
}


/* sleeps ms unless that passes the deadline: 0 slept, -1 out of time */
static int
wait_within(call_run_t *run, long ms)
{
    if (ms >= time_left(run)) {
        return -1;
    }

    sleep_ms(ms);
    return 0;
}


/* after a lost answer: 1 to resend, 0 stop (res set) */
static int
after_ambiguous(call_run_t *run, call_result_t *res)
{
    status_ask(run, res);

    if (strcmp(run->state_seen, "unknown") == 0) {
        res->outcome = OUT_UNKNOWN;
        res->error = "the status endpoint reports the outcome unknown";
        return 0;
    }

    /* in_progress: the first attempt still runs; completed: will replay */
    if (wait_within(run, strcmp(run->state_seen, "in_progress") == 0
                         ? 1000 : backoff_ms(res->attempts)) == 0)
    {
        return 1;
    }

    res->outcome = (strcmp(run->state_seen, "in_progress") == 0)
                   ? OUT_IN_PROGRESS : OUT_FAILED;
    res->code = (res->outcome == OUT_FAILED) ? EX_GAVE_UP : 0;
    res->error = "no final answer before --deadline";
    return 0;
}


static int
after_wait(call_run_t *run, call_result_t *res)
{
    long  ra = run->resp.retry_after;

    if (wait_within(run, (ra >= 0 ? ra : 1) * 1000) == 0) {
        return 1;
    }

    res->final = 1;
    res->code = (res->outcome == OUT_FAILED) ? EX_GAVE_UP : 0;
    res->error = "Retry-After passes --deadline";
    return 0;
}


static int
call_loop(call_run_t *run, call_result_t *res)
{
    call_opts_t  *o = run->o;
    call_act_e    act;
    long          t;

    for ( ;; ) {
        t = time_left(run);
        if (t == 0) {
            res->outcome = OUT_FAILED;
            res->code = EX_GAVE_UP;
            res->error = "no final answer before --deadline";
            return 0;
        }

        res->attempts++;
        res->final = 0;

        if (http_do(o->method, o->url, run->headers, o->body, o->body_len,
                    t < o->max_time_ms ? t : o->max_time_ms, &run->resp)
            != 0)
        {
            return -1;
        }

        act = classify(&run->resp, res);

        if (act == ACT_FINAL) {
            res->final = 1;
            return 0;
        }

        if (act == ACT_WAIT ? !after_wait(run, res)
                            : !after_ambiguous(run, res))
        {
            return 0;
        }
    }
}


/* ---------------------------------------------------------------- result */


static int
exit_code(call_result_t *res)
{
    static const int  codes[] = {
        EX_CREATED, EX_REPLAYED, EX_REUSED, EX_IN_PROGRESS, EX_CONFLICT,
        EX_UNKNOWN, EX_CONFIRM, EX_FAILED
    };

    return res->code ? res->code : codes[res->outcome];
}


/* the body as JSON when it is JSON, as text when it is short UTF-8 */
static int
add_body(cJSON *out, call_run_t *run, call_resp_t *r)
{
    char    path[4300];
    cJSON  *v = NULL;

    if (r->len > 0 && is_json_type(r->ctype)) {
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

    snprintf(path, sizeof(path), "%s/%s.body", run->st->dir, run->o->op);

    if (write_atomic(run->st->dir, path, r->body, r->len) != 0) {
        return -1;
    }

    return (cJSON_AddStringToObject(out, "body_file", path)
            && cJSON_AddNumberToObject(out, "body_bytes", (double) r->len))
           ? 0 : -1;
}


static void
add_problem(cJSON *out, call_resp_t *r, call_result_t *res)
{
    const char  *v;
    cJSON       *n;

    cJSON_AddStringToObject(out, "problem", r->slug);

    if ((v = json_str(r->problem, "detail")) != NULL) {
        cJSON_AddStringToObject(out, "detail", v);
    }

    if ((v = json_str(r->problem, "operation_id")) != NULL
        && strlen(v) == 32)
    {
        memcpy(res->operation_id, v, 33);
    }

    if (strcmp(r->slug, "response-not-stored") == 0) {
        n = cJSON_GetObjectItemCaseSensitive(r->problem, "response_status");
        if (cJSON_IsNumber(n)) {
            r->status = (long) n->valuedouble;
        }
        cJSON_AddBoolToObject(out, "response_not_stored", 1);
        if ((v = json_str(r->problem, "location")) != NULL) {
            cJSON_AddStringToObject(out, "location", v);
        }
    }

    if (res->outcome == OUT_CONFIRM) {
        cJSON_AddItemToObject(out, "proposal",
                              cJSON_Duplicate(r->problem, 1));
    }
}


static cJSON *
result_json(call_run_t *run, call_result_t *res)
{
    cJSON        *out = cJSON_CreateObject();
    call_resp_t  *r = &run->resp;

    if (out == NULL) {
        return NULL;
    }

    cJSON_AddStringToObject(out, "outcome", outcome_names[res->outcome]);
    cJSON_AddStringToObject(out, "op", run->o->op);
    cJSON_AddStringToObject(out, "key", run->st->key);

    if (res->final && r->problem != NULL) {
        add_problem(out, r, res);
    }

    if (res->final) {
        cJSON_AddNumberToObject(out, "status", (double) r->status);
        if (add_body(out, run, r) != 0) {
            cJSON_Delete(out);
            return NULL;
        }

    } else {
        cJSON_AddNullToObject(out, "status");
    }

    cJSON_AddNumberToObject(out, "attempts", res->attempts);

    if (res->error != NULL) {
        cJSON_AddStringToObject(out, "error", res->error);
    }

    if (res->final == 0 && r->curl_rc != CURLE_OK) {
        cJSON_AddStringToObject(out, "transport_error", r->curl_err);
    }

    cJSON_AddStringToObject(out, "state_file", run->st->file);
    return out;
}


/* operation_id last: the status endpoint may be asked for it */
static int
result_print(call_run_t *run, call_result_t *res)
{
    cJSON  *out;
    char   *text;

    out = result_json(run, res);
    if (out == NULL) {
        return -1;
    }

    if (res->operation_id[0] == '\0' && res->final
        && res->outcome != OUT_CONFLICT)
    {
        status_ask(run, res);
    }

    if (res->operation_id[0] != '\0') {
        cJSON_AddStringToObject(out, "operation_id", res->operation_id);
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


/* what the state file keeps of the last run: a hint for people, not used */
static void
state_record(call_run_t *run, call_result_t *res)
{
    cJSON  *last;
    char    at[32];

    utc_now(at, sizeof(at));

    last = cJSON_CreateObject();
    if (last == NULL) {
        return;
    }

    cJSON_AddStringToObject(last, "outcome", outcome_names[res->outcome]);
    cJSON_AddNumberToObject(last, "status", res->final ? run->resp.status : 0);
    cJSON_AddStringToObject(last, "at", at);
    cJSON_DeleteItemFromObjectCaseSensitive(run->st->doc, "last");
    cJSON_AddItemToObject(run->st->doc, "last", last);

    if (state_lock(run->o->op, run->st) == 0) {
        (void) state_save(run->st);
    }

    state_unlock(run->st);
}


/* ---------------------------------------------------------------- main */


static int
local_conflict(call_run_t *run, const char *what)
{
    cJSON  *out = cJSON_CreateObject();
    char   *text, detail[512];

    snprintf(detail, sizeof(detail), "the %s differs from the action recorded"
             " for --op %s; nothing was sent (--new for a new action)", what,
             run->o->op);
    fail_msg("%s", detail);

    cJSON_AddStringToObject(out, "outcome", "conflict");
    cJSON_AddStringToObject(out, "op", run->o->op);
    cJSON_AddStringToObject(out, "key", run->st->key);
    cJSON_AddNullToObject(out, "operation_id");
    cJSON_AddNullToObject(out, "status");
    cJSON_AddNumberToObject(out, "attempts", 0);
    cJSON_AddStringToObject(out, "detail", detail);
    cJSON_AddStringToObject(out, "state_file", run->st->file);

    text = cJSON_PrintUnformatted(out);
    cJSON_Delete(out);
    if (text != NULL) {
        printf("%s\n", text);
        free(text);
    }

    return EX_CONFLICT;
}


/* the key of this operation, read or created and persisted, under lock */
static int
state_prepare(call_run_t *run)
{
    call_opts_t   *o = run->o;
    call_state_t  *st = run->st;
    const char    *what;
    int            rc;

    if (state_dir_resolve(o, st) != 0) {
        return EX_BAD_INPUT;
    }

    if (mkdir_p(st->dir) != 0 || state_lock(o->op, st) != 0) {
        return EX_STATE;
    }

    rc = o->new_op ? 1 : state_load(o, st);

    if (rc == 1) {
        rc = state_create(o, st);
    } else if (rc == 0 && (what = state_differs(o, st)) != NULL) {
        state_unlock(st);
        return local_conflict(run, what);
    }

    state_unlock(st);
    return (rc == 0) ? 0 : EX_STATE;
}


static int
call_run(call_run_t *run)
{
    call_result_t  res;
    int            rc;

    rc = state_prepare(run);
    if (rc != 0) {
        return rc;
    }

    run->headers = headers_with_key(run->o, run->st->key);
    if (run->headers == NULL) {
        return EX_INTERNAL;
    }

    test_pause("before_send");

    memset(&res, 0, sizeof(call_result_t));
    run->deadline = now_ms() + run->o->deadline_ms;

    if (call_loop(run, &res) != 0) {
        fail_msg("cannot send: out of memory or libcurl failed");
        return EX_INTERNAL;
    }

    test_pause("after_answer");

    state_record(run, &res);

    if (result_print(run, &res) != 0) {
        fail_msg("cannot write the result");
        return EX_INTERNAL;
    }

    return exit_code(&res);
}


int
main(int argc, char **argv)
{
    call_opts_t   o;
    call_state_t  st;
    call_run_t    run;
    int           rc;

    memset(&o, 0, sizeof(call_opts_t));
    memset(&st, 0, sizeof(call_state_t));
    memset(&run, 0, sizeof(call_run_t));
    o.method = "POST";
    o.max_time_ms = 30000;
    o.deadline_ms = 60000;
    st.lock_fd = -1;
    run.o = &o;
    run.st = &st;

    rc = parse_args(argc, argv, &o);
    if (rc != 0) {
        return (rc > 0) ? 0 : EX_BAD_INPUT;
    }

    if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK) {
        return EX_INTERNAL;
    }

    srandom((unsigned) (now_ms() ^ getpid()));

    rc = call_run(&run);

    resp_reset(&run.resp);
    resp_reset(&run.status);
    curl_slist_free_all(run.headers);
    curl_slist_free_all(o.headers);
    cJSON_Delete(st.doc);
    free(o.body);
    curl_global_cleanup();

    return rc;
}
