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


int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    idem_fp_input_t    in, alt;
    idem_fp_result_t   res, res2, res3;
    idem_str_t         names[FUZZ_MAX_HEADERS], values[FUZZ_MAX_HEADERS];
    idem_str_t         rnames[FUZZ_MAX_HEADERS], rvalues[FUZZ_MAX_HEADERS];
    char               namebuf[FUZZ_MAX_HEADERS][256];
    char               hex[65], *body, *scope2;
    unsigned char      md[32];
    unsigned int       mdlen;
    fuzz_reader_t      r;
    mem_t              pre, canon, bodycanon, member;
    idem_sink_t        spre, scanon, sbody, smember;
    idem_jcs_rc_t      rc, brc;
    cJSON             *tree, *m;
    size_t             i, j, nh, want_members;
    int                nul, dup;
    const idem_str_t  *fields[4];
    static const char *fnames[4] = { "method", "query", "route", "scope" };

    if (size < 1) {
        return 0;
    }

    memset(&in, 0, sizeof(in));
    r.p = data + 1;
    r.left = size - 1;

    in.body_json = data[0] & 1;
    nh = (data[0] >> 1) & 3;
    if (nh > FUZZ_MAX_HEADERS) {
        nh = FUZZ_MAX_HEADERS;
    }

    in.method = take_field(&r);
    in.route = take_field(&r);
    in.query = take_field(&r);
    in.scope = take_field(&r);

    /* header names: lowercase UTF-8 without NUL (config tokens), unique */
    j = 0;
    for (i = 0; i < nh; i++) {
        idem_str_t  n = take_field(&r), v = take_field(&r);
        size_t      k;

        if (n.len == 0) {
            n.data = "h";
            n.len = 1;
        }

        memcpy(namebuf[j], n.data, n.len);
        for (k = 0; k < n.len; k++) {
            unsigned char  c = (unsigned char) namebuf[j][k];

            if (c >= 'A' && c <= 'Z') {
                namebuf[j][k] = (char) (c + 32);
            }
        }

        if (!idem_utf8_valid(namebuf[j], n.len)
            || memchr(namebuf[j], '\0', n.len) != NULL)
        {
            for (k = 0; k < n.len; k++) {
                namebuf[j][k] = (char) ('a' + (unsigned char) n.data[k] % 26);
            }
        }

        dup = 0;
        for (k = 0; k < j; k++) {
            if (names[k].len == n.len && memcmp(names[k].data, namebuf[j], n.len) == 0) {
                dup = 1;
            }
        }
        if (dup) {
            continue;
        }

        names[j].data = namebuf[j];
        names[j].len = n.len;
        values[j] = v;
        j++;
    }
    nh = j;

    in.header_names = names;
    in.header_values = values;
    in.nheaders = nh;

    body = fuzz_dup(r.p, r.left);
    in.body = body;
    in.body_len = r.left;

    /* 1. both calls succeed; fingerprint = sha256(preimage) */
    FUZZ_CHECK(idem_fingerprint(&in, &res) == 0, "idem_fingerprint failed");

    mem_sink(&pre, &spre);
    FUZZ_CHECK(idem_fingerprint_preimage(&in, &spre, &res2) == 0,
               "idem_fingerprint_preimage failed");
    FUZZ_CHECK(res.body_form == res2.body_form && res.json_rc == res2.json_rc,
               "body form differs between the two calls");

    fuzz_sha256_hex(pre.data ? pre.data : "", pre.len, hex);
    FUZZ_CHECK(strlen(res.hex) == 64 && strcmp(res.hex, hex) == 0,
               "fingerprint %s is not sha256(preimage) %s", res.hex, hex);

    FUZZ_CHECK(pre.len > 20 && memcmp(pre.data, "{\"body\":", 8) == 0
               && memcmp(pre.data + pre.len - 7, ",\"v\":1}", 7) == 0,
               "preimage shape: \"%s\"", fuzz_show(pre.data, pre.len));

    /* 2. body form */
    mem_sink(&bodycanon, &sbody);
    brc = idem_jcs_canonicalize(body, in.body_len, &sbody);

    if (!in.body_json) {
        FUZZ_CHECK(res.body_form == IDEM_BODY_RAW, "not JSON but form %d",
                   res.body_form);
    } else if (brc == IDEM_JCS_OK) {
        FUZZ_CHECK(res.body_form == IDEM_BODY_JSON, "canonical JSON body, form %d",
                   res.body_form);
    } else {
        FUZZ_CHECK(res.body_form == IDEM_BODY_RAW_INVALID_JSON
                   && res.json_rc == brc,
                   "rejected JSON body (%s): form %d, json_rc %s",
                   idem_jcs_strerror(brc), res.body_form,
                   idem_jcs_strerror(res.json_rc));
    }

    /* 3. the preimage is canonical JSON */
    nul = str_nul(&in.method) || str_nul(&in.route) || str_nul(&in.query)
          || str_nul(&in.scope);
    for (i = 0; i < nh; i++) {
        nul = nul || str_nul(&values[i]);
    }

    mem_sink(&canon, &scanon);
    rc = idem_jcs_canonicalize(pre.data, pre.len, &scanon);

    if (nul) {
        FUZZ_CHECK(rc == IDEM_JCS_ENUL, "preimage with \\u0000: rc %s",
                   idem_jcs_strerror(rc));
        goto more;
    }

    FUZZ_CHECK(rc == IDEM_JCS_OK, "preimage is not canonicalizable (%s): \"%s\"",
               idem_jcs_strerror(rc), fuzz_show(pre.data, pre.len));
    FUZZ_CHECK(mem_same(&pre, &canon), "preimage is not canonical: \"%s\"",
               fuzz_show(pre.data, pre.len));

    /* 4. its members */
    tree = NULL;
    FUZZ_CHECK(jcs_tree_parse(pre.data, pre.len, &tree) == IDEM_JCS_OK
               && cJSON_IsObject(tree), "preimage does not parse as an object");

    want_members = 7;
    FUZZ_CHECK((size_t) cJSON_GetArraySize(tree) == want_members,
               "preimage has %d members", cJSON_GetArraySize(tree));

    m = cJSON_GetObjectItemCaseSensitive(tree, "v");
    FUZZ_CHECK(cJSON_IsNumber(m) && m->valuedouble == 1, "v is not 1");

    fields[0] = &in.method;
    fields[1] = &in.query;
    fields[2] = &in.route;
    fields[3] = &in.scope;
    for (i = 0; i < 4; i++) {
        m = cJSON_GetObjectItemCaseSensitive(tree, fnames[i]);
        FUZZ_CHECK(m != NULL, "no member %s", fnames[i]);
        check_str_member(m, fields[i], fnames[i]);
    }

    m = cJSON_GetObjectItemCaseSensitive(tree, "headers");
    FUZZ_CHECK(cJSON_IsObject(m) && (size_t) cJSON_GetArraySize(m) == nh,
               "headers is not an object of %zu members", nh);
    for (i = 0; i < nh; i++) {
        char          name[257];
        const cJSON  *h;

        memcpy(name, names[i].data, names[i].len);
        name[names[i].len] = '\0';
        h = cJSON_GetObjectItemCaseSensitive(m, name);
        FUZZ_CHECK(h != NULL, "header %zu missing", i);
        check_str_member(h, &values[i], "header value");
    }

    m = cJSON_GetObjectItemCaseSensitive(tree, "body");
    FUZZ_CHECK(m != NULL, "no body member");
    mem_sink(&member, &smember);
    FUZZ_CHECK(jcs_tree_write(m, &smember) == IDEM_JCS_OK, "body rewrite");

    if (res.body_form == IDEM_BODY_JSON) {
        FUZZ_CHECK(mem_same(&member, &bodycanon),
                   "body member is not the canonical body");
    } else {
        char  want[80];

        fuzz_sha256_hex(body, in.body_len, hex);
        snprintf(want, sizeof(want), "{\"sha256\":\"%s\"}", hex);
        FUZZ_CHECK(member.len == strlen(want) && memcmp(member.data, want, member.len) == 0,
                   "raw body member is not %s", want);
    }

    mem_free(&member);
    cJSON_Delete(tree);

more:

    /* 5. header order does not matter */
    if (nh > 1) {
        for (i = 0; i < nh; i++) {
            rnames[i] = names[nh - 1 - i];
            rvalues[i] = values[nh - 1 - i];
        }
        alt = in;
        alt.header_names = rnames;
        alt.header_values = rvalues;
        FUZZ_CHECK(idem_fingerprint(&alt, &res3) == 0
                   && strcmp(res3.hex, res.hex) == 0,
                   "header order changes the fingerprint");
    }

    /* 6. a precomputed digest of a non-JSON body */
    if (!in.body_json) {
        FUZZ_CHECK(EVP_Digest(body, in.body_len, md, &mdlen, EVP_sha256(), NULL) == 1,
                   "sha256");
        alt = in;
        alt.body = NULL;
        alt.body_len = 0;
        alt.body_sha256 = md;
        FUZZ_CHECK(idem_fingerprint(&alt, &res3) == 0
                   && strcmp(res3.hex, res.hex) == 0
                   && res3.body_form == IDEM_BODY_RAW,
                   "body_sha256 gives another fingerprint");
    }

    /* 7. the scope counts */
    scope2 = malloc(in.scope.len + 1);
    if (scope2 == NULL) {
        abort();
    }
    if (in.scope.len) {
        memcpy(scope2, in.scope.data, in.scope.len);
    }
    scope2[in.scope.len] = 'x';
    alt = in;
    alt.scope.data = scope2;
    alt.scope.len = in.scope.len + 1;
    FUZZ_CHECK(idem_fingerprint(&alt, &res3) == 0
               && strcmp(res3.hex, res.hex) != 0,
               "another scope gives the same fingerprint");
    free(scope2);

    mem_free(&pre);
    mem_free(&canon);
    mem_free(&bodycanon);
    free(body);

    return 0;
}
