/*
 * The request fingerprint, version 1, as docs/fingerprint.md defines it
 * for clients and auditors.  The preimage is the JCS form of
 *
 *   {"body":B,"headers":{...},"method":M,"query":Q,"route":R,"scope":S,"v":1}
 *
 * written directly in canonical member order and streamed into SHA-256.
 *
 * HTTP strings (method, route, query, scope, header values) are arbitrary
 * bytes.  A JSON string can only hold Unicode text, so a value that is not
 * well-formed UTF-8 is written as {"hex":"<lowercase hex of the bytes>"}:
 * still canonical JSON, never equal to any string, and no byte is lost.
 */

#include <stdlib.h>
#include <string.h>

#include <openssl/evp.h>

#include "idem_fingerprint.h"


typedef struct {
    EVP_MD_CTX     *ctx;
    size_t          len;
    unsigned char   buf[4096];
} fp_sha_sink_t;

typedef struct {
    const idem_str_t  *name;
    const idem_str_t  *value;
} fp_header_t;


const char *
idem_body_form_name(idem_body_form_t form)
{
    switch (form) {
    case IDEM_BODY_JSON:              return "json";
    case IDEM_BODY_RAW:               return "raw";
    case IDEM_BODY_RAW_INVALID_JSON:  return "raw-invalid-json";
    }

    return "unknown";
}


static int
fp_lower(int c)
{
    return (c >= 'A' && c <= 'Z') ? c + ('a' - 'A') : c;
}


static int
fp_is_ows(int c)
{
    return c == ' ' || c == '\t';
}


/* case-insensitive: does s[0..n) end with the lowercase word? */
static int
fp_ends_with(const char *s, size_t n, const char *word)
{
    size_t  wn, i;

    wn = strlen(word);
    if (n < wn) {
        return 0;
    }

    s += n - wn;
    for (i = 0; i < wn; i++) {
        if (fp_lower((unsigned char) s[i]) != word[i]) {
            return 0;
        }
    }

    return 1;
}


/*
 * "type/subtype" with optional parameters after ';' and optional
 * whitespace around it.  JSON is "application/json" or any
 * "type/something+json" (application/problem+json, application/vnd.x+json).
 */
int
idem_media_type_is_json(const char *ct, size_t len)
{
    const char  *p, *end, *slash;
    size_t       n, i;

    if (ct == NULL) {
        return 0;
    }

    p = ct;
    end = memchr(ct, ';', len);
    if (end == NULL) {
        end = ct + len;
    }

    while (p < end && fp_is_ows((unsigned char) *p)) {
        p++;
    }

    while (end > p && fp_is_ows((unsigned char) end[-1])) {
        end--;
    }

    n = end - p;
    slash = memchr(p, '/', n);

    /* a type, a slash, a subtype; no blanks or second slash inside */
    if (slash == NULL || slash == p || slash + 1 == end
        || memchr(slash + 1, '/', end - slash - 1) != NULL)
    {
        return 0;
    }

    for (i = 0; i < n; i++) {
        if (fp_is_ows((unsigned char) p[i])) {
            return 0;
        }
    }

    if (n == 16 && fp_ends_with(p, n, "application/json")) {
        return 1;
    }

    /* "+json" must follow at least one subtype character */
    return (size_t) (end - slash - 1) > 5 && fp_ends_with(p, n, "+json");
}


/* sinks */

static int
fp_sha_flush(fp_sha_sink_t *s)
{
    if (s->len > 0 && EVP_DigestUpdate(s->ctx, s->buf, s->len) != 1) {
        return -1;
    }

    s->len = 0;
    return 0;
}


/* buffers the many small writes of the JCS writer */
const void *
idem_sha256(void)
{
    static EVP_MD  *md;

    if (md == NULL) {
        md = EVP_MD_fetch(NULL, "SHA256", NULL);
    }

    return md != NULL ? (const void *) md : (const void *) EVP_sha256();
}


static int
fp_sha_write(idem_sink_t *sink, const char *p, size_t n)
{
    fp_sha_sink_t  *s;

    s = sink->data;

    if (n > sizeof(s->buf) - s->len) {
        if (fp_sha_flush(s) != 0) {
            return -1;
        }

        if (n > sizeof(s->buf)) {
            return (EVP_DigestUpdate(s->ctx, p, n) == 1) ? 0 : -1;
        }
    }

    memcpy(s->buf + s->len, p, n);
    s->len += n;

    return 0;
}


static int
fp_put(idem_sink_t *out, const char *s)
{
    return out->write(out, s, strlen(s));
}


static int
fp_sha256(const char *p, size_t n, unsigned char *md)
{
    unsigned int  mdlen;

    if (EVP_Digest(p, n, md, &mdlen, idem_sha256(), NULL) != 1
        || mdlen != IDEM_SHA256_LEN)
    {
        return -1;
    }

    return 0;
}


/* {"hex":"..."} for bytes that are not UTF-8, in chunks */
static int
fp_write_hex_object(idem_sink_t *out, const idem_str_t *s)
{
    char    hex[2 * 64 + 1];
    size_t  off, n;

    if (fp_put(out, "{\"hex\":\"") != 0) {
        return -1;
    }

    for (off = 0; off < s->len; off += n) {
        n = s->len - off;
        if (n > 64) {
            n = 64;
        }

        idem_hex((const unsigned char *) s->data + off, n, hex);

        if (out->write(out, hex, 2 * n) != 0) {
            return -1;
        }
    }

    return fp_put(out, "\"}");
}


static int
fp_write_str(idem_sink_t *out, const idem_str_t *s)
{
    if (s->len == 0) {
        return fp_put(out, "\"\"");
    }

    if (!idem_utf8_valid(s->data, s->len)) {
        return fp_write_hex_object(out, s);
    }

    return idem_jcs_write_string(out, s->data, s->len);
}


static int
fp_write_digest(idem_sink_t *out, const unsigned char *md)
{
    char  hex[IDEM_FP_HEX_LEN + 1];

    idem_hex(md, IDEM_SHA256_LEN, hex);

    if (fp_put(out, "{\"sha256\":\"") != 0
        || out->write(out, hex, IDEM_FP_HEX_LEN) != 0
        || fp_put(out, "\"}") != 0)
    {
        return -1;
    }

    return 0;
}


/*
 * B: the canonical value of a JSON body, else the digest of the raw
 * bytes.  ENOMEM is not a property of the body: it fails the whole
 * fingerprint instead of falling back, or a retry under less memory
 * pressure would get a different fingerprint.
 */
static int
fp_write_body(const idem_fp_input_t *in, idem_sink_t *out,
    idem_fp_result_t *res)
{
    unsigned char   md[IDEM_SHA256_LEN];
    idem_jcs_rc_t   rc;

    res->body_form = IDEM_BODY_RAW;
    res->json_rc = IDEM_JCS_OK;

    if (in->body_json) {
        /* the caller handed over its copy: body is writable then */
        rc = in->body_in_place
             ? idem_jcs_canonicalize_in_place_excluding((char *) in->body,
                                                        in->body_len,
                                                        in->exclude, out)
             : idem_jcs_canonicalize_excluding(in->body, in->body_len,
                                               in->exclude, out);

        if (rc == IDEM_JCS_OK) {
            res->body_form = IDEM_BODY_JSON;
            return 0;
        }

        if (rc == IDEM_JCS_ENOMEM || rc == IDEM_JCS_ESINK) {
            return -1;
        }

        res->body_form = IDEM_BODY_RAW_INVALID_JSON;
        res->json_rc = rc;
    }

    if (in->body_sha256 != NULL && !in->body_json) {
        return fp_write_digest(out, in->body_sha256);
    }

    if (in->body_json && in->body_in_place) {
        if (in->raw_sha256 == NULL || in->raw_sha256(in->raw_data, md) != 0) {
            return -1;
        }

        return fp_write_digest(out, md);
    }

    if (in->body == NULL && in->body_len != 0) {
        return -1;
    }

    if (fp_sha256(in->body ? in->body : "", in->body_len, md) != 0) {
        return -1;
    }

    return fp_write_digest(out, md);
}


static int
fp_header_cmp(const void *a, const void *b)
{
    const fp_header_t  *ha, *hb;

    ha = a;
    hb = b;

    return idem_utf16_cmp(ha->name->data, ha->name->len,
                          hb->name->data, hb->name->len, 0);
}


/* Sorted by name; a duplicate or non-UTF-8 name is the caller's bug. */
static int
fp_write_headers(const idem_fp_input_t *in, idem_sink_t *out)
{
    fp_header_t  *h;
    size_t        i;
    int           rc;

    if (in->nheaders == 0) {
        return fp_put(out, "{}");
    }

    h = malloc(in->nheaders * sizeof(fp_header_t));
    if (h == NULL) {
        return -1;
    }

    for (i = 0; i < in->nheaders; i++) {
        h[i].name = &in->header_names[i];
        h[i].value = &in->header_values[i];

        if (!idem_utf8_valid(h[i].name->data, h[i].name->len)) {
            free(h);
            return -1;
        }
    }

    qsort(h, in->nheaders, sizeof(fp_header_t), fp_header_cmp);

    rc = fp_put(out, "{");

    for (i = 0; rc == 0 && i < in->nheaders; i++) {
        if (i > 0 && fp_header_cmp(&h[i - 1], &h[i]) == 0) {
            rc = -1;
            break;
        }

        if ((i > 0 && fp_put(out, ",") != 0)
            || idem_jcs_write_string(out, h[i].name->data, h[i].name->len)
               != 0
            || fp_put(out, ":") != 0
            || fp_write_str(out, h[i].value) != 0)
        {
            rc = -1;
        }
    }

    free(h);

    return (rc == 0) ? fp_put(out, "}") : -1;
}


int
idem_fingerprint_preimage(const idem_fp_input_t *in, idem_sink_t *sink,
    idem_fp_result_t *out)
{
    idem_fp_result_t  res;

    memset(&res, 0, sizeof(idem_fp_result_t));

    /* members in JCS order: body, headers, method, query, route, scope, v */
    if (fp_put(sink, "{\"body\":") != 0
        || fp_write_body(in, sink, &res) != 0
        || fp_put(sink, ",\"headers\":") != 0
        || fp_write_headers(in, sink) != 0
        || fp_put(sink, ",\"method\":") != 0
        || fp_write_str(sink, &in->method) != 0
        || fp_put(sink, ",\"query\":") != 0
        || fp_write_str(sink, &in->query) != 0
        || fp_put(sink, ",\"route\":") != 0
        || fp_write_str(sink, &in->route) != 0
        || fp_put(sink, ",\"scope\":") != 0
        || fp_write_str(sink, &in->scope) != 0
        || fp_put(sink, ",\"v\":1}") != 0)
    {
        return -1;
    }

    if (out != NULL) {
        out->hex[0] = '\0';
        out->body_form = res.body_form;
        out->json_rc = res.json_rc;
    }

    return 0;
}


int
idem_fingerprint(const idem_fp_input_t *in, idem_fp_result_t *out)
{
    fp_sha_sink_t   *s;
    idem_sink_t      sink;
    unsigned char    md[EVP_MAX_MD_SIZE];
    unsigned int     mdlen;
    int              rc;

    /* on the heap: the buffer is too big for a comfortable stack frame */
    s = malloc(sizeof(fp_sha_sink_t));
    if (s == NULL) {
        return -1;
    }

    s->len = 0;
    s->ctx = EVP_MD_CTX_new();
    sink.write = fp_sha_write;
    sink.data = s;

    rc = -1;

    if (s->ctx != NULL
        && EVP_DigestInit_ex(s->ctx, idem_sha256(), NULL) == 1
        && idem_fingerprint_preimage(in, &sink, out) == 0
        && fp_sha_flush(s) == 0
        && EVP_DigestFinal_ex(s->ctx, md, &mdlen) == 1
        && mdlen == IDEM_SHA256_LEN)
    {
        idem_hex(md, IDEM_SHA256_LEN, out->hex);
        rc = 0;
    }

    EVP_MD_CTX_free(s->ctx);
    free(s);

    return rc;
}
