/*
 * One HTTP attempt (libcurl) of idempotency-call and idempotency-mcp, and
 * what of its answer the retry rule and the results need.
 */

#ifndef CALL_HTTP_H
#define CALL_HTTP_H

#include <stddef.h>

#include <cjson/cJSON.h>
#include <curl/curl.h>

#define CALL_PROBLEM_URN  "urn:ngx-idempotency:problem:"


typedef struct {
    CURLcode      curl_rc;
    char          curl_err[CURL_ERROR_SIZE];
    long          status;
    char         *body;
    size_t        len;
    size_t        size;
    size_t        total;            /* bytes received, stored or not */
    int           truncated;        /* total > len: the cap cut it */
    size_t        cap;              /* 0, or at most this many stored */
    char          ctype[128];
    char          location[512];
    char          operation[64];    /* Idempotency-Operation */
    long          retry_after;
    int           replayed;
    int           reused;
    cJSON        *problem;          /* the module's own problem+json, or NULL */
    char          slug[64];
    volatile int *cancel;           /* set: the attempt is abandoned */
} call_resp_t;


void call_resp_reset(call_resp_t *r);
int call_http_do(const char *method, const char *url,
    struct curl_slist *headers, const char *body, size_t len,
    long timeout_ms, call_resp_t *r);
int call_is_json_type(const char *ct);
struct curl_slist *call_headers_with_key(struct curl_slist *user,
    const char *key);

#endif /* CALL_HTTP_H */
