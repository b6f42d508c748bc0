/*
 * The durable state shared by idempotency-call and idempotency-mcp
 * (call_state.h): where it lives, who may write it, and how a key gets on
 * disk before anything is sent.
 */

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <openssl/rand.h>
#include <openssl/sha.h>

#include "idem_text.h"
#include "call_state.h"


static void
st_err(call_state_t *st, const char *fmt, ...)
{
    va_list  ap;

    va_start(ap, fmt);
    vsnprintf(st->err, sizeof(st->err), fmt, ap);
    va_end(ap);
}


void
call_state_init(call_state_t *st)
{
    memset(st, 0, sizeof(call_state_t));
    st->lock_fd = -1;
}


void
call_state_free(call_state_t *st)
{
    if (st->lock_fd != -1) {
        close(st->lock_fd);
        st->lock_fd = -1;
    }

    cJSON_Delete(st->doc);
    st->doc = NULL;
}


int
call_op_name_valid(const char *op)
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


void
call_body_sha(const char *body, size_t len, char out[65])
{
    unsigned char  md[SHA256_DIGEST_LENGTH];

    SHA256((const unsigned char *) (body ? body : ""), len, md);
    idem_hex(md, sizeof(md), out);
}


const char *
call_json_str(cJSON *obj, const char *name)
{
    cJSON  *v = cJSON_GetObjectItemCaseSensitive(obj, name);

    return cJSON_IsString(v) ? v->valuestring : NULL;
}


void
call_utc_now(char *buf, size_t n)
{
    time_t     t = time(NULL);
    struct tm  tm;

    gmtime_r(&t, &tm);
    strftime(buf, n, "%Y-%m-%dT%H:%M:%SZ", &tm);
}


char *
call_read_file(const char *path, size_t *len, char *err, size_t errlen)
{
    FILE    *f;
    char    *buf, *p;
    size_t   size = 65536, n;

    f = (strcmp(path, "-") == 0) ? stdin : fopen(path, "rb");
    if (f == NULL) {
        int  e = errno;

        snprintf(err, errlen, "%s: %s", path, strerror(e));
        errno = e;
        return NULL;
    }

    *len = 0;
    buf = malloc(size + 1);

    while (buf != NULL) {
        n = fread(buf + *len, 1, size - *len, f);
        *len += n;

        if (n == 0) {
            if (ferror(f)) {
                snprintf(err, errlen, "%s: read error", path);
                free(buf);
                buf = NULL;
            }
            break;
        }

        if (*len == size) {
            size *= 2;
            p = realloc(buf, size + 1);
            if (p == NULL) {
                free(buf);
            }
            buf = p;
        }
    }

    if (f != stdin) {
        fclose(f);
    }

    if (buf != NULL) {
        buf[*len] = '\0';
    }

    return buf;
}


int
call_state_dir(call_state_t *st, const char *dir, const char *op)
{
    const char  *env;
    int          n;

    if (dir != NULL) {
        n = snprintf(st->dir, sizeof(st->dir), "%s", dir);

    } else if ((env = getenv("IDEMPOTENCY_STATE_DIR")) != NULL && *env) {
        n = snprintf(st->dir, sizeof(st->dir), "%s", env);

    } else if ((env = getenv("XDG_STATE_HOME")) != NULL && *env == '/') {
        n = snprintf(st->dir, sizeof(st->dir), "%s/idempotency-call", env);

    } else if ((env = getenv("HOME")) != NULL && *env) {
        n = snprintf(st->dir, sizeof(st->dir),
                     "%s/.local/state/idempotency-call", env);

    } else {
        st_err(st, "no state dir: set --state-dir, IDEMPOTENCY_STATE_DIR"
               " or HOME");
        return -1;
    }

    if (n <= 0 || (size_t) n >= sizeof(st->dir)) {
        st_err(st, "state dir path too long");
        return -1;
    }

    snprintf(st->file, sizeof(st->file), "%s/%s.json", st->dir,
             op ? op : "");
    return 0;
}


/*
 * mkdir -p, private: the keys are capabilities of their operations, so a
 * directory others may write (where they could swap a state file, and
 * with it the key a retry sends) is refused, not used.
 */
static int
state_mkdir(call_state_t *st)
{
    char         path[4096];
    char        *p, c;
    struct stat  sb;

    snprintf(path, sizeof(path), "%s", st->dir);

    for (p = path + 1; ; p++) {
        if (*p != '/' && *p != '\0') {
            continue;
        }

        c = *p;
        *p = '\0';
        if (mkdir(path, 0700) != 0 && errno != EEXIST) {
            st_err(st, "state dir %s: cannot create %s: %s", st->dir, path,
                   strerror(errno));
            return -1;
        }
        *p = c;

        if (c == '\0') {
            break;
        }
    }

    if (stat(st->dir, &sb) != 0 || !S_ISDIR(sb.st_mode)) {
        st_err(st, "state dir %s: not a directory", st->dir);
        return -1;
    }

    if (sb.st_mode & (S_IWGRP | S_IWOTH)) {
        st_err(st, "state dir %s: writable by group or others (mode %04o);"
               " chmod go-w it, nothing was sent", st->dir,
               (unsigned) (sb.st_mode & 07777));
        return -1;
    }

    if (access(st->dir, W_OK | X_OK) != 0) {
        st_err(st, "state dir %s: not writable: %s", st->dir, strerror(errno));
        return -1;
    }

    return 0;
}


/*
 * One lock per operation name, held while the key is read or created and
 * while the outcome is written: two runs of one op never create two keys.
 * flock, not fcntl: two threads of one process (idempotency-mcp) exclude
 * each other too, each with its own open file.
 */
static int
state_lock(call_state_t *st, const char *op)
{
    char  path[4300];

    snprintf(path, sizeof(path), "%s/%s.lock", st->dir, op);

    st->lock_fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (st->lock_fd == -1) {
        st_err(st, "lock %s: %s", path, strerror(errno));
        return -1;
    }

    while (flock(st->lock_fd, LOCK_EX) != 0) {
        if (errno != EINTR) {
            st_err(st, "flock %s: %s", path, strerror(errno));
            close(st->lock_fd);
            st->lock_fd = -1;
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
int
call_state_write(call_state_t *st, const char *path, const char *data,
    size_t n)
{
    static int  seq;
    char        tmp[4400];
    int         fd, rc;
    ssize_t     w;
    size_t      off = 0;

    snprintf(tmp, sizeof(tmp), "%s.tmp.%ld.%d", path, (long) getpid(),
             __atomic_add_fetch(&seq, 1, __ATOMIC_RELAXED));

    fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd == -1) {
        st_err(st, "%s: %s", tmp, strerror(errno));
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
        st_err(st, "%s: cannot write: %s", path, strerror(errno));
        unlink(tmp);
        return -1;
    }

    fd = open(st->dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd == -1 || fsync(fd) != 0) {
        st_err(st, "%s: cannot fsync: %s", st->dir, strerror(errno));
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
        st_err(st, "out of memory");
        return -1;
    }

    rc = call_state_write(st, st->file, text, strlen(text));
    free(text);
    return rc;
}


int
call_key_valid(const char *k)
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


/* 0 loaded, 1 no state file, -1 unusable (st->err) */
static int
state_load(call_state_t *st, const char *op)
{
    size_t       len;
    char        *text;
    const char  *key, *name;

    text = call_read_file(st->file, &len, st->err, sizeof(st->err));
    if (text == NULL) {
        if (errno == ENOENT) {
            st->err[0] = '\0';
            return 1;
        }
        return -1;
    }

    cJSON_Delete(st->doc);
    st->doc = cJSON_ParseWithLength(text, len);
    free(text);

    key = call_json_str(st->doc, "key");
    name = call_json_str(st->doc, "op");

    if (!cJSON_IsObject(st->doc) || !call_key_valid(key) || name == NULL
        || strcmp(name, op) != 0 || call_json_str(st->doc, "method") == NULL
        || call_json_str(st->doc, "url") == NULL
        || call_json_str(st->doc, "body_sha256") == NULL)
    {
        st_err(st, "state file %s is corrupt (not the JSON this tool"
               " writes); nothing was sent. Move it away only if you know"
               " its action never ran; a new operation starts a new action",
               st->file);
        return -1;
    }

    memcpy(st->key, key, sizeof(st->key));
    return 0;
}


static int
state_create(call_state_t *st, const call_action_t *a)
{
    unsigned char  raw[CALL_KEY_BYTES];
    char           at[32];

    if (RAND_bytes(raw, sizeof(raw)) != 1) {
        st_err(st, "RAND_bytes failed");
        return -1;
    }

    idem_hex(raw, sizeof(raw), st->key);
    call_utc_now(at, sizeof(at));

    cJSON_Delete(st->doc);
    st->doc = cJSON_CreateObject();

    if (st->doc == NULL
        || !cJSON_AddNumberToObject(st->doc, "v", 1)
        || !cJSON_AddStringToObject(st->doc, "op", a->op)
        || !cJSON_AddStringToObject(st->doc, "key", st->key)
        || !cJSON_AddStringToObject(st->doc, "method", a->method)
        || !cJSON_AddStringToObject(st->doc, "url", a->url)
        || !cJSON_AddStringToObject(st->doc, "body_sha256", a->body_sha)
        || !cJSON_AddStringToObject(st->doc, "created_at", at))
    {
        st_err(st, "out of memory");
        return -1;
    }

    st->fresh = 1;
    return state_save(st);
}


/* the first of method, url, body that differs from the recorded action */
static const char *
state_differs(call_state_t *st, const call_action_t *a)
{
    if (strcmp(call_json_str(st->doc, "method"), a->method) != 0) {
        return "method";
    }

    if (strcmp(call_json_str(st->doc, "url"), a->url) != 0) {
        return "URL";
    }

    if (strcmp(call_json_str(st->doc, "body_sha256"), a->body_sha) != 0) {
        return "body";
    }

    return NULL;
}


/* the key of this action, read or created and persisted, under lock */
int
call_state_prepare(call_state_t *st, const call_action_t *a,
    const char *replaces)
{
    const char  *what;
    int          rc;

    if (state_mkdir(st) != 0 || state_lock(st, a->op) != 0) {
        return CALL_STATE_UNUSABLE;
    }

    rc = (replaces != NULL && replaces[0] == '\0') ? 1 : state_load(st, a->op);

    if (rc == 0 && replaces != NULL && strcmp(st->key, replaces) == 0) {
        rc = 1;
    }

    if (rc == 1) {
        rc = state_create(st, a);

    } else if (rc == 0 && (what = state_differs(st, a)) != NULL) {
        st_err(st, "the %s differs from the action recorded for operation"
               " %s; nothing was sent (a new action needs a new key: --new,"
               " or new_operation in idempotency-mcp)",
               what, a->op);
        rc = CALL_STATE_CONFLICT;
    }

    state_unlock(st);
    return (rc >= 0) ? rc : CALL_STATE_UNUSABLE;
}


/*
 * The last outcome, a hint for people and list_operations.  Written only
 * while the file still holds our key: a concurrent new action under the
 * same name must not lose its key to our late write.
 */
void
call_state_record(call_state_t *st, const char *op, const char *outcome,
    long status)
{
    char    at[32], key[sizeof(st->key)];
    cJSON  *last;

    memcpy(key, st->key, sizeof(key));

    if (state_lock(st, op) != 0) {
        return;
    }

    if (state_load(st, op) == 0 && strcmp(st->key, key) == 0
        && (last = cJSON_CreateObject()) != NULL)
    {
        call_utc_now(at, sizeof(at));
        cJSON_AddStringToObject(last, "outcome", outcome);
        cJSON_AddNumberToObject(last, "status", (double) status);
        cJSON_AddStringToObject(last, "at", at);
        cJSON_DeleteItemFromObjectCaseSensitive(st->doc, "last");
        cJSON_AddItemToObject(st->doc, "last", last);
        (void) state_save(st);
    }

    memcpy(st->key, key, sizeof(key));
    state_unlock(st);
}
