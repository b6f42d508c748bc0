/*
 * libFuzzer target: the fingerprint input builder (idem_fingerprint,
 * idem_fingerprint_preimage) with fuzzed request fields.
 *
 * Input layout: one flags byte (bit 0: JSON media type, bits 1-2: number
 * of fingerprinted headers), then method, route, query, scope and each
 * header's name and value as fields of one length byte followed by that
 * many bytes; the rest is the body.  Header names are lowercased and made
 * unique as the module's configuration guarantees.
 *
 * Properties:
 *  - both calls succeed and agree on the body form; the fingerprint is the
 *    SHA-256 of the preimage, in lowercase hex;
 *  - the preimage is canonical JSON: idem_jcs_canonicalize(preimage) ==
 *    preimage (when a field holds a NUL byte, the preimage holds \u0000,
 *    which the canonicalizer refuses by policy: then rc must be ENUL);
 *  - the preimage is exactly {"body","headers","method","query","route",
 *    "scope","v":1}; each field is the string of its bytes when they are
 *    UTF-8, else {"hex":"<hex of the bytes>"}; the headers are the given
 *    pairs; the body is canonicalize(body) for accepted JSON, else
 *    {"sha256":"<hex of the raw bytes>"}, with the body form and json_rc
 *    saying why;
 *  - the order of the headers does not matter; a digest passed in
 *    body_sha256 gives the same fingerprint as the raw bytes; changing the
 *    scope changes the fingerprint.
 */

#include <cjson/cJSON.h>

#include "idem_fingerprint.h"
#include "jcs_tree.h"

#include "fuzz_common.h"


#define FUZZ_MAX_HEADERS  3


typedef struct {
    const uint8_t  *p;
    size_t          left;
} fuzz_reader_t;


static idem_str_t
take_field(fuzz_reader_t *r)
{
    idem_str_t  s;
    size_t      n;

    s.data = "";
    s.len = 0;

    if (r->left == 0) {
        return s;
    }

    n = r->p[0];
    r->p++;
    r->left--;

    if (n > r->left) {
        n = r->left;
    }

    s.data = (const char *) r->p;
    s.len = n;
    r->p += n;
    r->left -= n;

    return s;
}


/* the field as it must appear in the preimage's parsed tree */
static void
check_str_member(const cJSON *v, const idem_str_t *s, const char *what)
{
    char          hex[2 * 256 + 1];
    const cJSON  *h;
    size_t        i;

    if (idem_utf8_valid(s->data, s->len)) {
        FUZZ_CHECK(cJSON_IsString(v), "%s is not a string", what);
        FUZZ_CHECK(strlen(v->valuestring) == s->len
                   && memcmp(v->valuestring, s->data, s->len) == 0,
                   "%s is not its bytes", what);
        return;
    }

    for (i = 0; i < s->len; i++) {
        sprintf(hex + 2 * i, "%02x", (unsigned char) s->data[i]);
    }
    hex[2 * s->len] = '\0';

    FUZZ_CHECK(cJSON_IsObject(v) && cJSON_GetArraySize(v) == 1,
               "%s (not UTF-8) is not a one-member object", what);
    h = cJSON_GetObjectItemCaseSensitive(v, "hex");
    FUZZ_CHECK(cJSON_IsString(h) && strcmp(h->valuestring, hex) == 0,
               "%s (not UTF-8) is not {\"hex\":\"%s\"}", what, hex);
}


/* a NUL byte in a field written as a JSON string (UTF-8): \u0000 */
static int
str_nul(const idem_str_t *s)
{
    return s->len > 0 && memchr(s->data, '\0', s->len) != NULL
           && idem_utf8_valid(s->data, s->len);
}


/* one input, decoded into a request, and what the fingerprint made of it */
typedef struct {
    idem_fp_input_t    in;
    idem_str_t         names[FUZZ_MAX_HEADERS];
    idem_str_t         values[FUZZ_MAX_HEADERS];
    char               namebuf[FUZZ_MAX_HEADERS][256];
    char              *body;        /* exact-size copy */
    idem_jcs_rc_t      body_rc;     /* the body canonicalized alone */
    mem_t              body_canon;
    idem_fp_result_t   res;
    mem_t              pre;         /* the preimage */
} fuzz_fp_t;


/* a name as the configuration makes it: lowercase UTF-8 without NUL */
static void
fuzz_header_name(char *buf, idem_str_t n)
{
    unsigned char  ch;
    size_t         k;

    memcpy(buf, n.data, n.len);

    for (k = 0; k < n.len; k++) {
        ch = (unsigned char) buf[k];

        if (ch >= 'A' && ch <= 'Z') {
            buf[k] = (char) (ch + 32);
        }
    }

    if (!idem_utf8_valid(buf, n.len) || memchr(buf, '\0', n.len) != NULL) {
        for (k = 0; k < n.len; k++) {
            buf[k] = (char) ('a' + (unsigned char) n.data[k] % 26);
        }
    }
}


/* up to nh name/value fields; a repeated name is dropped, as config does */
static void
take_headers(fuzz_fp_t *c, fuzz_reader_t *r, size_t nh)
{
    idem_str_t  n, v;
    size_t      i, j, k;
    int         dup;

    j = 0;

    for (i = 0; i < nh; i++) {
        n = take_field(r);
        v = take_field(r);

        if (n.len == 0) {
            n.data = "h";
            n.len = 1;
        }

        fuzz_header_name(c->namebuf[j], n);

        dup = 0;
        for (k = 0; k < j; k++) {
            if (c->names[k].len == n.len
                && memcmp(c->names[k].data, c->namebuf[j], n.len) == 0)
            {
                dup = 1;
            }
        }

        if (dup) {
            continue;
        }

        c->names[j].data = c->namebuf[j];
        c->names[j].len = n.len;
        c->values[j] = v;
        j++;
    }

    c->in.header_names = c->names;
    c->in.header_values = c->values;
    c->in.nheaders = j;
}


/* the layout at the top of this file */
static void
fuzz_decode(fuzz_fp_t *c, const uint8_t *data, size_t size)
{
    fuzz_reader_t  r;
    idem_sink_t    sink;
    size_t         nh;

    memset(c, 0, sizeof(fuzz_fp_t));
    r.p = data + 1;
    r.left = size - 1;

    c->in.body_json = data[0] & 1;
    nh = (data[0] >> 1) & 3;
    if (nh > FUZZ_MAX_HEADERS) {
        nh = FUZZ_MAX_HEADERS;
    }

    c->in.method = take_field(&r);
    c->in.route = take_field(&r);
    c->in.query = take_field(&r);
    c->in.scope = take_field(&r);

    take_headers(c, &r, nh);

    c->body = fuzz_dup(r.p, r.left);
    c->in.body = c->body;
    c->in.body_len = r.left;

    mem_sink(&c->body_canon, &sink);
    c->body_rc = idem_jcs_canonicalize(c->body, c->in.body_len, &sink);
}


/* 1. both calls succeed; fingerprint = sha256(preimage) */
static void
check_fingerprint(fuzz_fp_t *c)
{
    idem_fp_result_t   res2;
    idem_sink_t        sink;
    char               hex[65];

    FUZZ_CHECK(idem_fingerprint(&c->in, &c->res) == 0,
               "idem_fingerprint failed");

    mem_sink(&c->pre, &sink);
    FUZZ_CHECK(idem_fingerprint_preimage(&c->in, &sink, &res2) == 0,
               "idem_fingerprint_preimage failed");
    FUZZ_CHECK(c->res.body_form == res2.body_form
               && c->res.json_rc == res2.json_rc,
               "body form differs between the two calls");

    fuzz_sha256_hex(c->pre.data ? c->pre.data : "", c->pre.len, hex);
    FUZZ_CHECK(strlen(c->res.hex) == 64 && strcmp(c->res.hex, hex) == 0,
               "fingerprint %s is not sha256(preimage) %s", c->res.hex, hex);

    FUZZ_CHECK(c->pre.len > 20 && memcmp(c->pre.data, "{\"body\":", 8) == 0
               && memcmp(c->pre.data + c->pre.len - 7, ",\"v\":1}", 7) == 0,
               "preimage shape: \"%s\"", fuzz_show(c->pre.data, c->pre.len));
}


/* 2. the body form, and why JSON fell back */
static void
check_body_form(fuzz_fp_t *c)
{
    if (!c->in.body_json) {
        FUZZ_CHECK(c->res.body_form == IDEM_BODY_RAW, "not JSON but form %d",
                   c->res.body_form);

    } else if (c->body_rc == IDEM_JCS_OK) {
        FUZZ_CHECK(c->res.body_form == IDEM_BODY_JSON,
                   "canonical JSON body, form %d", c->res.body_form);

    } else {
        FUZZ_CHECK(c->res.body_form == IDEM_BODY_RAW_INVALID_JSON
                   && c->res.json_rc == c->body_rc,
                   "rejected JSON body (%s): form %d, json_rc %s",
                   idem_jcs_strerror(c->body_rc), c->res.body_form,
                   idem_jcs_strerror(c->res.json_rc));
    }
}


/*
 * 3. the preimage is canonical JSON; with a NUL byte in a field it holds
 * \u0000, which the canonicalizer refuses by policy.  Returns 1 when its
 * members can be checked.
 */
static int
check_preimage_canonical(fuzz_fp_t *c)
{
    mem_t           canon;
    idem_sink_t     sink;
    idem_jcs_rc_t   rc;
    size_t          i;
    int             nul;

    nul = str_nul(&c->in.method) || str_nul(&c->in.route)
          || str_nul(&c->in.query) || str_nul(&c->in.scope);
    for (i = 0; i < c->in.nheaders; i++) {
        nul = nul || str_nul(&c->values[i]);
    }

    mem_sink(&canon, &sink);
    rc = idem_jcs_canonicalize(c->pre.data, c->pre.len, &sink);

    if (nul) {
        FUZZ_CHECK(rc == IDEM_JCS_ENUL, "preimage with \\u0000: rc %s",
                   idem_jcs_strerror(rc));

    } else {
        FUZZ_CHECK(rc == IDEM_JCS_OK,
                   "preimage is not canonicalizable (%s): \"%s\"",
                   idem_jcs_strerror(rc), fuzz_show(c->pre.data, c->pre.len));
        FUZZ_CHECK(mem_same(&c->pre, &canon),
                   "preimage is not canonical: \"%s\"",
                   fuzz_show(c->pre.data, c->pre.len));
    }

    mem_free(&canon);

    return !nul;
}


/* 4a. v, and method, query, route, scope as strings or {"hex":...} */
static void
check_field_members(fuzz_fp_t *c, const cJSON *tree)
{
    static const char  *fnames[4] = { "method", "query", "route", "scope" };
    const idem_str_t   *fields[4];
    const cJSON        *m;
    size_t              i;

    m = cJSON_GetObjectItemCaseSensitive(tree, "v");
    FUZZ_CHECK(cJSON_IsNumber(m) && m->valuedouble == 1, "v is not 1");

    fields[0] = &c->in.method;
    fields[1] = &c->in.query;
    fields[2] = &c->in.route;
    fields[3] = &c->in.scope;

    for (i = 0; i < 4; i++) {
        m = cJSON_GetObjectItemCaseSensitive(tree, fnames[i]);
        FUZZ_CHECK(m != NULL, "no member %s", fnames[i]);
        check_str_member(m, fields[i], fnames[i]);
    }
}


/* 4b. the headers are the given pairs */
static void
check_header_members(fuzz_fp_t *c, const cJSON *tree)
{
    const cJSON  *m, *h;
    char          name[257];
    size_t        i, nh;

    nh = c->in.nheaders;
    m = cJSON_GetObjectItemCaseSensitive(tree, "headers");
    FUZZ_CHECK(cJSON_IsObject(m) && (size_t) cJSON_GetArraySize(m) == nh,
               "headers is not an object of %zu members", nh);

    for (i = 0; i < nh; i++) {
        memcpy(name, c->names[i].data, c->names[i].len);
        name[c->names[i].len] = '\0';

        h = cJSON_GetObjectItemCaseSensitive(m, name);
        FUZZ_CHECK(h != NULL, "header %zu missing", i);
        check_str_member(h, &c->values[i], "header value");
    }
}


/* 4c. the canonical body, else {"sha256":"<hex of the raw bytes>"} */
static void
check_body_member(fuzz_fp_t *c, const cJSON *tree)
{
    const cJSON  *m;
    mem_t         member;
    idem_sink_t   sink;
    char          hex[65], want[80];

    m = cJSON_GetObjectItemCaseSensitive(tree, "body");
    FUZZ_CHECK(m != NULL, "no body member");

    mem_sink(&member, &sink);
    FUZZ_CHECK(jcs_tree_write(m, &sink) == IDEM_JCS_OK, "body rewrite");

    if (c->res.body_form == IDEM_BODY_JSON) {
        FUZZ_CHECK(mem_same(&member, &c->body_canon),
                   "body member is not the canonical body");

    } else {
        fuzz_sha256_hex(c->body, c->in.body_len, hex);
        snprintf(want, sizeof(want), "{\"sha256\":\"%s\"}", hex);
        FUZZ_CHECK(member.len == strlen(want)
                   && memcmp(member.data, want, member.len) == 0,
                   "raw body member is not %s", want);
    }

    mem_free(&member);
}


/* 4. exactly the seven members, each as documented */
static void
check_members(fuzz_fp_t *c)
{
    cJSON  *tree;

    tree = NULL;
    FUZZ_CHECK(jcs_tree_parse(c->pre.data, c->pre.len, &tree) == IDEM_JCS_OK
               && cJSON_IsObject(tree), "preimage does not parse as an object");
    FUZZ_CHECK(cJSON_GetArraySize(tree) == 7, "preimage has %d members",
               cJSON_GetArraySize(tree));

    check_field_members(c, tree);
    check_header_members(c, tree);
    check_body_member(c, tree);

    cJSON_Delete(tree);
}


/* 5. header order does not matter */
static void
check_header_order(fuzz_fp_t *c)
{
    idem_fp_input_t    alt;
    idem_fp_result_t   res;
    idem_str_t         names[FUZZ_MAX_HEADERS], values[FUZZ_MAX_HEADERS];
    size_t             i, nh;

    nh = c->in.nheaders;
    if (nh < 2) {
        return;
    }

    for (i = 0; i < nh; i++) {
        names[i] = c->names[nh - 1 - i];
        values[i] = c->values[nh - 1 - i];
    }

    alt = c->in;
    alt.header_names = names;
    alt.header_values = values;

    FUZZ_CHECK(idem_fingerprint(&alt, &res) == 0
               && strcmp(res.hex, c->res.hex) == 0,
               "header order changes the fingerprint");
}


/* 6. a precomputed digest of a non-JSON body */
static void
check_precomputed_digest(fuzz_fp_t *c)
{
    idem_fp_input_t    alt;
    idem_fp_result_t   res;
    unsigned char      md[32];
    unsigned int       mdlen;

    if (c->in.body_json) {
        return;
    }

    FUZZ_CHECK(EVP_Digest(c->body, c->in.body_len, md, &mdlen, EVP_sha256(),
                          NULL) == 1, "sha256");

    alt = c->in;
    alt.body = NULL;
    alt.body_len = 0;
    alt.body_sha256 = md;

    FUZZ_CHECK(idem_fingerprint(&alt, &res) == 0
               && strcmp(res.hex, c->res.hex) == 0
               && res.body_form == IDEM_BODY_RAW,
               "body_sha256 gives another fingerprint");
}


/* 7. the scope counts */
static void
check_scope_counts(fuzz_fp_t *c)
{
    idem_fp_input_t    alt;
    idem_fp_result_t   res;
    char              *scope;

    scope = malloc(c->in.scope.len + 1);
    if (scope == NULL) {
        abort();
    }

    if (c->in.scope.len) {
        memcpy(scope, c->in.scope.data, c->in.scope.len);
    }
    scope[c->in.scope.len] = 'x';

    alt = c->in;
    alt.scope.data = scope;
    alt.scope.len = c->in.scope.len + 1;

    FUZZ_CHECK(idem_fingerprint(&alt, &res) == 0
               && strcmp(res.hex, c->res.hex) != 0,
               "another scope gives the same fingerprint");

    free(scope);
}


int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fuzz_fp_t  c;

    if (size < 1) {
        return 0;
    }

    fuzz_decode(&c, data, size);

    check_fingerprint(&c);
    check_body_form(&c);

    if (check_preimage_canonical(&c)) {
        check_members(&c);
    }

    check_header_order(&c);
    check_precomputed_digest(&c);
    check_scope_counts(&c);

    mem_free(&c.pre);
    mem_free(&c.body_canon);
    free(c.body);

    return 0;
}
