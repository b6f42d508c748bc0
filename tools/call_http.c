/*
 * One HTTP attempt (call_http.h).  A transport failure is an answer too
 * (r->curl_rc): the retry rule decides what it means.
 */

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "call_http.h"


static size_t
resp_body_cb(char *p, size_t size, size_t nmemb, void *data)
{
    call_resp_t  *r = data;
    size_t        n = size * nmemb, want, keep = n;
    char         *b;

    /* beyond the cap the answer is only counted, so a large or endless
     * answer cannot take the memory */
    r->total += n;
    if (r->cap > 0 && r->len + n > r->cap) {
        keep = r->cap - r->len;
        r->truncated = 1;
    }
    n = keep;

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
    return size * nmemb;
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


static int
is_true(const char *v, size_t vl)
{
    return vl == 4 && strncasecmp(v, "true", 4) == 0;
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
        r->location[0] = '\0';
        r->operation[0] = '\0';
        r->retry_after = -1;
        r->replayed = 0;
        r->reused = 0;

    } else if ((v = header_value(p, n, "content-type", &vl)) != NULL) {
        snprintf(r->ctype, sizeof(r->ctype), "%.*s", (int) vl, v);

    } else if ((v = header_value(p, n, "location", &vl)) != NULL) {
        snprintf(r->location, sizeof(r->location), "%.*s", (int) vl, v);

    } else if ((v = header_value(p, n, "idempotency-operation", &vl))
               != NULL)
    {
        snprintf(r->operation, sizeof(r->operation), "%.*s", (int) vl, v);

    } else if ((v = header_value(p, n, "retry-after", &vl)) != NULL) {
        r->retry_after = (vl > 0 && vl < 7 && isdigit((unsigned char) *v))
                         ? atol(v) : -1;

    } else if ((v = header_value(p, n, "idempotent-replayed", &vl)) != NULL) {
        r->replayed = is_true(v, vl);

    } else if ((v = header_value(p, n, "idempotent-reused", &vl)) != NULL) {
        r->reused = is_true(v, vl);
    }

    return n;
}


void
call_resp_reset(call_resp_t *r)
{
    volatile int  *cancel = r->cancel;
    size_t         cap = r->cap;

    free(r->body);
    cJSON_Delete(r->problem);
    memset(r, 0, sizeof(call_resp_t));
    r->retry_after = -1;
    r->cancel = cancel;
    r->cap = cap;
}


int
call_is_json_type(const char *ct)
{
    size_t  n = strcspn(ct, "; ");

    return (n == 16 && strncasecmp(ct, "application/json", 16) == 0)
           || (n > 5 && strncasecmp(ct + n - 5, "+json", 5) == 0);
}


/* the module's own problem answers carry its URN in "type" */
static void
resp_problem(call_resp_t *r)
{
    cJSON       *t;
    size_t       n = sizeof(CALL_PROBLEM_URN) - 1;

    if (strncasecmp(r->ctype, "application/problem+json", 24) != 0
        || r->body == NULL)
    {
        return;
    }

    r->problem = cJSON_ParseWithLength(r->body, r->len);
    t = cJSON_GetObjectItemCaseSensitive(r->problem, "type");

    if (!cJSON_IsString(t) || strncmp(t->valuestring, CALL_PROBLEM_URN, n)
        != 0)
    {
        cJSON_Delete(r->problem);
        r->problem = NULL;
        return;
    }

    snprintf(r->slug, sizeof(r->slug), "%s", t->valuestring + n);
}


/* a cancelled call (idempotency-mcp) gives up its attempt at once */
static int
resp_progress_cb(void *data, curl_off_t dt, curl_off_t dn, curl_off_t ut,
    curl_off_t un)
{
    call_resp_t  *r = data;

    return (r->cancel != NULL && __atomic_load_n(r->cancel, __ATOMIC_RELAXED))
           ? 1 : 0;
}


static void
http_setup(CURL *c, const char *url, struct curl_slist *headers,
    long timeout_ms, call_resp_t *r)
{
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

    if (r->cancel != NULL) {
        curl_easy_setopt(c, CURLOPT_XFERINFOFUNCTION, resp_progress_cb);
        curl_easy_setopt(c, CURLOPT_XFERINFODATA, r);
        curl_easy_setopt(c, CURLOPT_NOPROGRESS, 0L);
    }
}


/* one request; a transport failure is left in r->curl_rc */
int
call_http_do(const char *method, const char *url, struct curl_slist *headers,
    const char *body, size_t len, long timeout_ms, call_resp_t *r)
{
    CURL  *c;

    call_resp_reset(r);

    c = curl_easy_init();
    if (c == NULL) {
        return -1;
    }

    http_setup(c, url, headers, timeout_ms, r);

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
struct curl_slist *
call_headers_with_key(struct curl_slist *user, const char *key)
{
    struct curl_slist  *l = NULL, *h, *n;
    char                line[128];

    for (h = user; h != NULL; h = h->next) {
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
