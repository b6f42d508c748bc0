/*
 * The configuration file of idempotency-mcp (mcp_config.h).  Strict: an
 * unknown member is refused (a typo must not silently drop a header), and
 * every message names the member, never a value that may be a secret.
 */

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>

#include <cjson/cJSON.h>

#include "call_state.h"
#include "mcp_config.h"


static char  *cf_default_methods[] = { "POST", "PUT", "PATCH", "DELETE" };


typedef struct {
    const char  *file;
    char        *err;
    size_t       errlen;
    int          secret;        /* an inline secret: the file must be private */
} cf_ctx_t;


static int
cf_fail(cf_ctx_t *cx, const char *fmt, ...)
{
    va_list  ap;
    int      n;

    n = snprintf(cx->err, cx->errlen, "config %s: ", cx->file);
    va_start(ap, fmt);
    vsnprintf(cx->err + n, cx->errlen - n, fmt, ap);
    va_end(ap);
    return -1;
}


/* every member of o is one of the names (NULL-terminated) */
static int
cf_members(cf_ctx_t *cx, cJSON *o, const char *where, const char **names)
{
    cJSON        *m;
    const char  **n;

    cJSON_ArrayForEach(m, o) {
        for (n = names; *n != NULL && strcmp(*n, m->string) != 0; n++) {
            /* look further */
        }
        if (*n == NULL) {
            return cf_fail(cx, "%s.%s: unknown member", where, m->string);
        }
    }

    return 0;
}


/*
 * http(s), no user:password@ (a secret in the config's URL would be shown
 * wherever the URL is: results, state files, logs; credentials go in
 * headers), no query or fragment (the path is appended to base_url)
 */
static int
cf_url(const char *s)
{
    size_t  auth;

    if (s == NULL) {
        return 0;
    }

    if (strncasecmp(s, "http://", 7) == 0) {
        s += 7;
    } else if (strncasecmp(s, "https://", 8) == 0) {
        s += 8;
    } else {
        return 0;
    }

    auth = strcspn(s, "/?#");

    return memchr(s, '@', auth) == NULL && strpbrk(s, "?#") == NULL;
}


static int
cf_strings(cf_ctx_t *cx, cJSON *a, const char *where, char ***out, int *n)
{
    cJSON  *v;
    int     i = 0;

    if (!cJSON_IsArray(a) || cJSON_GetArraySize(a) == 0) {
        return cf_fail(cx, "%s: a non-empty array of strings", where);
    }

    *out = calloc(cJSON_GetArraySize(a), sizeof(char *));
    if (*out == NULL) {
        return cf_fail(cx, "out of memory");
    }

    cJSON_ArrayForEach(v, a) {
        if (!cJSON_IsString(v) || v->valuestring[0] == '\0') {
            return cf_fail(cx, "%s[%d]: a non-empty string", where, i);
        }
        (*out)[i++] = strdup(v->valuestring);
    }

    *n = i;
    return 0;
}


/* the value of a secret file: its first line; the file must be private */
static char *
cf_secret_file(cf_ctx_t *cx, const char *path, const char *where)
{
    struct stat  sb;
    char         e[600], *v;
    size_t       len;

    if (stat(path, &sb) != 0) {
        cf_fail(cx, "%s: {\"file\": \"%s\"}: %s", where, path, strerror(errno));
        return NULL;
    }

    if (sb.st_mode & (S_IRGRP | S_IROTH | S_IWGRP | S_IWOTH)) {
        cf_fail(cx, "%s: {\"file\": \"%s\"}: readable or writable by group"
                " or others (mode %04o): chmod 600 it", where, path,
                (unsigned) (sb.st_mode & 07777));
        return NULL;
    }

    v = call_read_file(path, &len, e, sizeof(e));
    if (v == NULL) {
        cf_fail(cx, "%s: {\"file\": \"%s\"}: cannot read it", where, path);
        return NULL;
    }

    v[strcspn(v, "\r\n")] = '\0';
    return v;
}


/* a header value: "string", {"env": NAME} or {"file": PATH} */
static char *
cf_header_value(cf_ctx_t *cx, cJSON *v, const char *where)
{
    cJSON       *e, *f;
    const char  *s;

    if (cJSON_IsString(v)) {
        cx->secret = 1;
        return strdup(v->valuestring);
    }

    e = cJSON_GetObjectItemCaseSensitive(v, "env");
    f = cJSON_GetObjectItemCaseSensitive(v, "file");

    if (!cJSON_IsObject(v) || cJSON_GetArraySize(v) != 1
        || (!cJSON_IsString(e) && !cJSON_IsString(f)))
    {
        cf_fail(cx, "%s: a string, {\"env\": NAME} or {\"file\": PATH}",
                where);
        return NULL;
    }

    if (cJSON_IsString(f)) {
        return cf_secret_file(cx, f->valuestring, where);
    }

    s = getenv(e->valuestring);
    if (s == NULL) {
        cf_fail(cx, "%s: {\"env\": \"%s\"}: the variable is not set", where,
                e->valuestring);
        return NULL;
    }

    return strdup(s);
}


static int
cf_headers(cf_ctx_t *cx, cJSON *h, mcp_target_t *t, const char *where)
{
    cJSON              *m;
    char                w[512], *v, *line;
    struct curl_slist  *l;
    size_t              n;
    int                 i = 0;

    if (h == NULL) {
        return 0;
    }

    if (!cJSON_IsObject(h)) {
        return cf_fail(cx, "%s.headers: an object", where);
    }

    t->header_names = calloc(cJSON_GetArraySize(h) + 1, sizeof(char *));
    if (t->header_names == NULL) {
        return cf_fail(cx, "out of memory");
    }

    cJSON_ArrayForEach(m, h) {
        snprintf(w, sizeof(w), "%s.headers.%s", where, m->string);

        if (m->string[0] == '\0' || strpbrk(m->string, ": \t\r\n") != NULL) {
            return cf_fail(cx, "%s: not a header name", w);
        }

        v = cf_header_value(cx, m, w);
        if (v == NULL) {
            return -1;
        }

        if (strpbrk(v, "\r\n") != NULL || v[0] == '\0') {
            free(v);
            return cf_fail(cx, "%s: the value is empty or has a line break", w);
        }

        n = strlen(m->string) + strlen(v) + 3;
        line = malloc(n);
        if (line == NULL) {
            free(v);
            return cf_fail(cx, "out of memory");
        }
        snprintf(line, n, "%s: %s", m->string, v);
        memset(v, 0, strlen(v));
        free(v);

        l = curl_slist_append(t->headers, line);
        memset(line, 0, n);
        free(line);
        if (l == NULL) {
            return cf_fail(cx, "out of memory");
        }
        t->headers = l;
        t->header_names[i++] = strdup(m->string);
    }

    t->nheaders = i;
    return 0;
}


static int
cf_seconds(cf_ctx_t *cx, cJSON *v, const char *where, long def, long *ms)
{
    if (v == NULL) {
        *ms = def * 1000;
        return 0;
    }

    if (!cJSON_IsNumber(v) || v->valuedouble <= 0 || v->valuedouble > 86400) {
        return cf_fail(cx, "%s: seconds, a number > 0 and <= 86400", where);
    }

    *ms = (long) (v->valuedouble * 1000);
    return 0;
}


static int
cf_check_lists(cf_ctx_t *cx, mcp_target_t *t, const char *where)
{
    static const char  *known[] = { "POST", "PUT", "PATCH", "DELETE" };
    int                 i, k;

    for (i = 0; i < t->nmethods; i++) {
        for (k = 0; k < 4 && strcmp(known[k], t->methods[i]) != 0; k++) {
            /* look further */
        }
        if (k == 4) {
            return cf_fail(cx, "%s.methods[%d]: POST, PUT, PATCH or DELETE",
                           where, i);
        }
    }

    for (i = 0; i < t->npaths; i++) {
        if (t->paths[i][0] != '/' || strstr(t->paths[i], "..") != NULL) {
            return cf_fail(cx, "%s.paths[%d]: a path prefix starting with"
                           " \"/\", without \"..\"", where, i);
        }
    }

    return 0;
}


static int
cf_target(cf_ctx_t *cx, cJSON *o, mcp_target_t *t)
{
    static const char  *names[] = { "base_url", "headers", "methods", "paths",
                                    "status_url", "max_time", "deadline",
                                    NULL };
    char                w[300], sub[400], *s;
    cJSON              *v;

    snprintf(w, sizeof(w), "targets.%.200s", o->string);
    t->name = strdup(o->string);

    if (!cJSON_IsObject(o)) {
        return cf_fail(cx, "%s: an object", w);
    }

    if (cf_members(cx, o, w, names) != 0) {
        return -1;
    }

    v = cJSON_GetObjectItemCaseSensitive(o, "base_url");
    if (!cJSON_IsString(v) || !cf_url(v->valuestring)) {
        return cf_fail(cx, "%s.base_url: an http:// or https:// URL, without"
                       " user:password@, query or fragment", w);
    }
    t->base_url = strdup(v->valuestring);
    for (s = t->base_url + strlen(t->base_url); s > t->base_url && s[-1] == '/'; s--) {
        s[-1] = '\0';
    }

    v = cJSON_GetObjectItemCaseSensitive(o, "status_url");
    if (v != NULL && (!cJSON_IsString(v) || !cf_url(v->valuestring))) {
        return cf_fail(cx, "%s.status_url: an http:// or https:// URL,"
                       " without user:password@, query or fragment", w);
    }
    t->status_url = v ? strdup(v->valuestring) : NULL;

    v = cJSON_GetObjectItemCaseSensitive(o, "methods");
    snprintf(sub, sizeof(sub), "%s.methods", w);
    if (v == NULL) {
        t->methods = cf_default_methods;
        t->nmethods = 4;
    } else if (cf_strings(cx, v, sub, &t->methods, &t->nmethods) != 0) {
        return -1;
    }

    snprintf(sub, sizeof(sub), "%s.paths", w);
    if (cf_strings(cx, cJSON_GetObjectItemCaseSensitive(o, "paths"), sub,
                   &t->paths, &t->npaths) != 0
        || cf_check_lists(cx, t, w) != 0
        || cf_headers(cx, cJSON_GetObjectItemCaseSensitive(o, "headers"), t, w)
           != 0)
    {
        return -1;
    }

    snprintf(sub, sizeof(sub), "%s.max_time", w);
    if (cf_seconds(cx, cJSON_GetObjectItemCaseSensitive(o, "max_time"), sub,
                   30, &t->max_time_ms) != 0)
    {
        return -1;
    }

    snprintf(sub, sizeof(sub), "%s.deadline", w);
    return cf_seconds(cx, cJSON_GetObjectItemCaseSensitive(o, "deadline"),
                      sub, 120, &t->deadline_ms);
}


static int
cf_doc(cf_ctx_t *cx, cJSON *doc, mcp_config_t *cf)
{
    static const char  *names[] = { "state_dir", "targets", NULL };
    cJSON              *v, *m;
    int                 i = 0;

    if (!cJSON_IsObject(doc)) {
        return cf_fail(cx, "not a JSON object (malformed JSON?)");
    }

    if (cf_members(cx, doc, "(top)", names) != 0) {
        return -1;
    }

    v = cJSON_GetObjectItemCaseSensitive(doc, "state_dir");
    if (v != NULL && (!cJSON_IsString(v) || v->valuestring[0] != '/')) {
        return cf_fail(cx, "state_dir: an absolute path");
    }
    cf->state_dir = v ? strdup(v->valuestring) : NULL;

    v = cJSON_GetObjectItemCaseSensitive(doc, "targets");
    if (!cJSON_IsObject(v) || cJSON_GetArraySize(v) == 0) {
        return cf_fail(cx, "targets: an object with at least one target");
    }

    cf->targets = calloc(cJSON_GetArraySize(v), sizeof(mcp_target_t));
    if (cf->targets == NULL) {
        return cf_fail(cx, "out of memory");
    }

    /* all of them, so that mcp_config_free frees a half-read one too */
    cf->ntargets = cJSON_GetArraySize(v);

    cJSON_ArrayForEach(m, v) {
        if (cf_target(cx, m, &cf->targets[i++]) != 0) {
            return -1;
        }
    }

    return 0;
}


int
mcp_config_load(const char *path, mcp_config_t *cf, char *err, size_t errlen)
{
    cf_ctx_t     cx = { path, err, errlen, 0 };
    struct stat  sb;
    char        *text, e[600];
    size_t       len;
    cJSON       *doc;
    int          rc;

    memset(cf, 0, sizeof(mcp_config_t));

    text = call_read_file(path, &len, e, sizeof(e));
    if (text == NULL) {
        return cf_fail(&cx, "cannot read it: %s", strerror(errno));
    }

    doc = cJSON_ParseWithLength(text, len);
    free(text);

    if (doc == NULL) {
        return cf_fail(&cx, "malformed JSON");
    }

    rc = cf_doc(&cx, doc, cf);
    cJSON_Delete(doc);

    if (rc == 0 && cx.secret && stat(path, &sb) == 0
        && (sb.st_mode & (S_IRGRP | S_IROTH)))
    {
        return cf_fail(&cx, "holds a header value (a secret) and is readable"
                       " by group or others (mode %04o): chmod 600 it, or"
                       " use {\"env\": NAME} or {\"file\": PATH}",
                       (unsigned) (sb.st_mode & 07777));
    }

    return rc;
}


const mcp_target_t *
mcp_config_target(const mcp_config_t *cf, const char *name)
{
    int  i;

    for (i = 0; i < cf->ntargets; i++) {
        if (strcmp(cf->targets[i].name, name) == 0) {
            return &cf->targets[i];
        }
    }

    return NULL;
}


static void
cf_free_strings(char **v, int n)
{
    int  i;

    for (i = 0; v != NULL && i < n; i++) {
        free(v[i]);
    }

    free(v);
}


/* the secrets are wiped before their memory goes back */
void
mcp_config_free(mcp_config_t *cf)
{
    struct curl_slist  *h;
    mcp_target_t       *t;
    int                 i;

    for (i = 0; cf->targets != NULL && i < cf->ntargets; i++) {
        t = &cf->targets[i];
        for (h = t->headers; h != NULL; h = h->next) {
            memset(h->data, 0, strlen(h->data));
        }
        curl_slist_free_all(t->headers);
        cf_free_strings(t->header_names, t->nheaders);
        cf_free_strings(t->paths, t->npaths);
        if (t->methods != NULL && t->methods[0] != cf_default_methods[0]) {
            cf_free_strings(t->methods, t->nmethods);
        }
        free(t->name);
        free(t->base_url);
        free(t->status_url);
    }

    free(cf->targets);
    free(cf->state_dir);
    memset(cf, 0, sizeof(mcp_config_t));
}
