/*
 * Request fingerprint v1 (docs/fingerprint.md): what changes it, what does
 * not, the body forms, the hex form, and one vector checked by hand.
 */

#include <stdlib.h>
#include <string.h>

#include <openssl/evp.h>

#include "idem_fingerprint.h"
#include "tap.h"
#include "mem_sink.h"


#define S(lit)  { lit, sizeof(lit) - 1 }



/* the preimage as a string (free it), NULL on failure */
static char *
preimage(const idem_fp_input_t *in, idem_fp_result_t *res, size_t *len)
{
    mem_t        m;
    idem_sink_t  sink;

    mem_sink(&m, &sink);

    if (idem_fingerprint_preimage(in, &sink, res) != 0) {
        free(m.data);
        return NULL;
    }

    if (len != NULL) {
        *len = m.len;
    }

    return m.data;
}


static void
sha256_hex(const char *p, size_t n, char *hex)
{
    unsigned char  md[EVP_MAX_MD_SIZE];
    unsigned int   mdlen;

    EVP_Digest(p, n, md, &mdlen, EVP_sha256(), NULL);
    idem_hex(md, mdlen, hex);
}


static idem_str_t  names[4];
static idem_str_t  values[4];


/* the base request the tests vary */
static void
base(idem_fp_input_t *in)
{
    static const idem_str_t  method = S("POST");
    static const idem_str_t  route = S("/orders");
    static const idem_str_t  query = S("a=1");
    static const idem_str_t  scope = S("alice");
    static const char        body[] = "{ \"b\": 2, \"a\": [1, \"x\"] }";

    memset(in, 0, sizeof(idem_fp_input_t));
    in->method = method;
    in->route = route;
    in->query = query;
    in->scope = scope;

    names[0].data = "x-tenant";
    names[0].len = 8;
    values[0].data = "t1";
    values[0].len = 2;

    in->header_names = names;
    in->header_values = values;
    in->nheaders = 1;

    in->body_json = 1;
    in->body = body;
    in->body_len = sizeof(body) - 1;
}


/* fingerprint of in into hex (65 bytes); "" on failure */
static void
fp(const idem_fp_input_t *in, char *hex)
{
    idem_fp_result_t  res;

    if (idem_fingerprint(in, &res) != 0) {
        hex[0] = '\0';
        return;
    }

    memcpy(hex, res.hex, IDEM_FP_HEX_LEN + 1);
}


static void
test_known_answer(void)
{
    static const char  expected[] =
        "{\"body\":{\"a\":[1,\"x\"],\"b\":2},\"headers\":{\"x-tenant\":\"t1\"},"
        "\"method\":\"POST\",\"query\":\"a=1\",\"route\":\"/orders\","
        "\"scope\":\"alice\",\"v\":1}";

    idem_fp_input_t   in;
    idem_fp_result_t  res;
    char              hex[IDEM_FP_HEX_LEN + 1], *pre;
    size_t            len;

    base(&in);

    pre = preimage(&in, &res, &len);
    is_str(pre, expected, "known answer: exact preimage bytes");
    is_str(idem_body_form_name(res.body_form), "json", "known answer: json");

    if (pre != NULL) {
        sha256_hex(pre, len, hex);
        is_str(hex,
               "19124248040c5ca702f45e220b8c0f7fea3044b0ce33f00859a6868b44c97e2d",
               "known answer: sha256 of the preimage");
    } else {
        ok(0, "known answer: sha256 of the preimage");
    }

    free(pre);

    ok(idem_fingerprint(&in, &res) == 0, "idem_fingerprint succeeds");
    is_str(res.hex,
           "19124248040c5ca702f45e220b8c0f7fea3044b0ce33f00859a6868b44c97e2d",
           "known answer: idem_fingerprint streams the same bytes");
    ok(res.body_form == IDEM_BODY_JSON && res.json_rc == IDEM_JCS_OK,
       "known answer: body form json, rc ok");
}


static void
test_invariance(void)
{
    static const char  reordered[] = "{\"a\":[1,\"x\"],\n\t\"b\":2.0}";
    static const char  swapped[] = "{\"a\":[\"x\",1],\"b\":2}";

    idem_fp_input_t   in;
    char              h0[IDEM_FP_HEX_LEN + 1], h1[IDEM_FP_HEX_LEN + 1];

    base(&in);
    fp(&in, h0);

    in.body = reordered;
    in.body_len = sizeof(reordered) - 1;
    fp(&in, h1);
    ok(h0[0] && strcmp(h0, h1) == 0,
       "member order, whitespace, 2.0 vs 2: same fingerprint");

    in.body = swapped;
    in.body_len = sizeof(swapped) - 1;
    fp(&in, h1);
    ok(h1[0] && strcmp(h0, h1) != 0, "array order matters");
}


typedef void (*mutate_pt)(idem_fp_input_t *in);

static void m_method(idem_fp_input_t *in) { in->method.data = "PATCH";
    in->method.len = 5; }
static void m_route(idem_fp_input_t *in) { in->route.len = 6; }
static void m_query(idem_fp_input_t *in) { in->query.len = 0; }
static void m_scope(idem_fp_input_t *in) { in->scope.data = "alicf"; }
static void m_hval(idem_fp_input_t *in) { values[0].data = "t2"; }
static void m_hname(idem_fp_input_t *in) { names[0].data = "x-tenanu"; }
static void m_hnone(idem_fp_input_t *in) { in->nheaders = 0; }
static void m_body(idem_fp_input_t *in) { in->body = "{\"a\":[1,\"x\"],\"b\":3}";
    in->body_len = strlen(in->body); }
static void m_raw(idem_fp_input_t *in) { in->body_json = 0; }

static void
test_changes(void)
{
    static const struct {
        mutate_pt    fn;
        const char  *what;
    } cases[] = {
        { m_method, "method" },
        { m_route, "route" },
        { m_query, "query" },
        { m_scope, "scope" },
        { m_hval, "header value" },
        { m_hname, "header name" },
        { m_hnone, "header absent" },
        { m_body, "body value" },
        { m_raw, "same bytes, not a JSON media type" },
    };

    idem_fp_input_t   in;
    char              h0[IDEM_FP_HEX_LEN + 1], h1[IDEM_FP_HEX_LEN + 1];
    size_t            i;

    base(&in);
    fp(&in, h0);

    for (i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        base(&in);
        cases[i].fn(&in);
        fp(&in, h1);
        ok(h1[0] && strcmp(h0, h1) != 0, "different %s changes it",
           cases[i].what);
    }

    base(&in);
}


static void
test_headers(void)
{
    static const char  expected[] =
        "{\"body\":{\"sha256\":\"e3b0c44298fc1c149afbf4c8996fb92427ae41e4"
        "649b934ca495991b7852b855\"},\"headers\":{\"a\":\"\",\"b-c\":"
        "\"q\\\"\\u0001\",\"z\":\"1\"},\"method\":\"POST\",\"query\":\"\","
        "\"route\":\"/\",\"scope\":\"\",\"v\":1}";

    idem_fp_input_t   in;
    idem_fp_result_t  res;
    idem_str_t        n[3], v[3];
    char              h0[IDEM_FP_HEX_LEN + 1], h1[IDEM_FP_HEX_LEN + 1], *pre;

    memset(&in, 0, sizeof(in));
    in.method.data = "POST";
    in.method.len = 4;
    in.route.data = "/";
    in.route.len = 1;

    n[0].data = "z";    n[0].len = 1;  v[0].data = "1";       v[0].len = 1;
    n[1].data = "b-c";  n[1].len = 3;  v[1].data = "q\"\x01"; v[1].len = 3;
    n[2].data = "a";    n[2].len = 1;  v[2].data = "";        v[2].len = 0;

    in.header_names = n;
    in.header_values = v;
    in.nheaders = 3;

    pre = preimage(&in, &res, NULL);
    is_str(pre, expected,
           "headers sorted, escaped; empty raw body; empty query/scope");
    ok(res.body_form == IDEM_BODY_RAW, "no body_json: raw form");
    free(pre);

    fp(&in, h0);
    n[0] = n[2];
    v[0] = v[2];
    n[2].data = "z";
    v[2].data = "1";
    v[2].len = 1;
    fp(&in, h1);
    ok(h0[0] && strcmp(h0, h1) == 0, "header input order does not matter");

    n[1].data = "a";
    n[1].len = 1;
    ok(idem_fingerprint(&in, &res) == -1, "duplicate header names: -1");
}


static void
test_raw_bodies(void)
{
    static const unsigned char  hello_md[IDEM_SHA256_LEN] = {
        0x2c, 0xf2, 0x4d, 0xba, 0x5f, 0xb0, 0xa3, 0x0e,
        0x26, 0xe8, 0x3b, 0x2a, 0xc5, 0xb9, 0xe2, 0x9e,
        0x1b, 0x16, 0x1e, 0x5c, 0x1f, 0xa7, 0x42, 0x5e,
        0x73, 0x04, 0x33, 0x62, 0x93, 0x8b, 0x98, 0x24
    };
    static const char  hello_form[] =
        "{\"body\":{\"sha256\":\"2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7"
        "425e73043362938b9824\"},";

    idem_fp_input_t   in;
    idem_fp_result_t  res;
    char              h0[IDEM_FP_HEX_LEN + 1], h1[IDEM_FP_HEX_LEN + 1], *pre;

    /* not JSON: the caller's digest is used */
    base(&in);
    in.body_json = 0;
    in.body = NULL;
    in.body_len = 0;
    in.body_sha256 = hello_md;
    pre = preimage(&in, &res, NULL);
    ok(pre != NULL && strncmp(pre, hello_form, sizeof(hello_form) - 1) == 0
       && res.body_form == IDEM_BODY_RAW,
       "non-JSON body: {\"sha256\":digest given by the caller}");
    free(pre);
    fp(&in, h0);

    /* no digest given: hashed from body/body_len */
    in.body_sha256 = NULL;
    in.body = "hello";
    in.body_len = 5;
    fp(&in, h1);
    ok(h0[0] && strcmp(h0, h1) == 0, "non-JSON body hashed from memory");

    /* JSON media type, not canonicalizable: raw hash of the bytes */
    in.body_json = 1;
    pre = preimage(&in, &res, NULL);
    ok(pre != NULL && strncmp(pre, hello_form, sizeof(hello_form) - 1) == 0,
       "invalid JSON: raw sha256 of the bytes");
    ok(res.body_form == IDEM_BODY_RAW_INVALID_JSON
       && res.json_rc == IDEM_JCS_ESYNTAX, "invalid JSON: form and rc");
    is_str(idem_body_form_name(res.body_form), "raw-invalid-json",
           "form name raw-invalid-json");
    free(pre);

    in.body = "{\"a\":1,\"a\":2}";
    in.body_len = strlen(in.body);
    ok(idem_fingerprint(&in, &res) == 0
       && res.body_form == IDEM_BODY_RAW_INVALID_JSON
       && res.json_rc == IDEM_JCS_EDUP, "duplicate names: raw-invalid-json");

    in.body = "[1e400]";
    in.body_len = 7;
    fp(&in, h0);
    in.body = "[1e401]";
    fp(&in, h1);
    ok(h0[0] && h1[0] && strcmp(h0, h1) != 0,
       "two overflowing bodies differ (raw bytes, never altered)");

    in.body = "";
    in.body_len = 0;
    ok(idem_fingerprint(&in, &res) == 0
       && res.body_form == IDEM_BODY_RAW_INVALID_JSON,
       "empty body with a JSON type: raw-invalid-json");

    is_str(idem_body_form_name(IDEM_BODY_RAW), "raw", "form name raw");
    is_str(idem_body_form_name(IDEM_BODY_JSON), "json", "form name json");
}


static void
test_hex_form(void)
{
    idem_fp_input_t   in;
    idem_fp_result_t  res;
    char             *pre;

    base(&in);
    in.route.data = "/a\xff";
    in.route.len = 3;
    in.scope.data = "\xc3\xa9";     /* valid UTF-8 stays a string */
    in.scope.len = 2;
    values[0].data = "\xed\xa0\x80z";
    values[0].len = 4;

    pre = preimage(&in, &res, NULL);
    ok(pre != NULL && strstr(pre, "\"route\":{\"hex\":\"2f61ff\"}") != NULL,
       "non-UTF-8 route written as {\"hex\":...}");
    ok(pre != NULL && strstr(pre, "\"scope\":\"\xc3\xa9\"") != NULL,
       "UTF-8 scope stays a string");
    ok(pre != NULL
       && strstr(pre, "\"x-tenant\":{\"hex\":\"eda0807a\"}") != NULL,
       "header value with an encoded surrogate as hex");
    free(pre);

    /* a NUL byte is valid UTF-8: escaped, not hex */
    in.route.data = "/a\0b";
    in.route.len = 4;
    pre = preimage(&in, &res, NULL);
    ok(pre != NULL && strstr(pre, "\"route\":\"/a\\u0000b\"") != NULL,
       "NUL byte in the route written as \\u0000");
    free(pre);

    base(&in);
}


/*
 * body_in_place: the same fingerprint as from an untouched body, and when
 * the copy is not JSON after all, the raw digest comes from the callback
 * (the copy is partly overwritten by then), never from the copy.
 */
static const char  *orig_body;


static int
orig_sha256(void *data, unsigned char *md)
{
    unsigned int  n;

    (*(int *) data)++;
    return EVP_Digest(orig_body, strlen(orig_body), md, &n, EVP_sha256(),
                      NULL) == 1 ? 0 : -1;
}


static void
test_in_place(void)
{
    static const char  *bodies[] = {
        "{ \"b\": 2, \"a\": [1, \"x\"] }",        /* JSON, reordered */
        "{\"z\":[1,2,3],  \"a\":1, \"a\":2}",      /* EDUP at the end */
        "[1e20, 2, 3, 1e21, 4]",                     /* output moves out */
        "[1, 2, 3, 1e400]",                          /* ENUMBER at the end */
    };
    idem_fp_input_t   in;
    idem_fp_result_t  res, want;
    char             *copy;
    size_t            i;
    int               calls, bad;

    bad = 0;

    for (i = 0; i < sizeof(bodies) / sizeof(bodies[0]); i++) {
        base(&in);
        in.body = bodies[i];
        in.body_len = strlen(bodies[i]);
        if (idem_fingerprint(&in, &want) != 0) {
            bad++;
            continue;
        }

        copy = strdup(bodies[i]);
        orig_body = bodies[i];
        calls = 0;
        in.body = copy;
        in.body_in_place = 1;
        in.raw_sha256 = orig_sha256;
        in.raw_data = &calls;

        if (idem_fingerprint(&in, &res) != 0
            || strcmp(res.hex, want.hex) != 0
            || res.body_form != want.body_form
            || res.json_rc != want.json_rc
            || calls != (want.body_form == IDEM_BODY_RAW_INVALID_JSON))
        {
            diag("in place differs for %s", bodies[i]);
            bad++;
        }

        free(copy);
    }

    ok(bad == 0, "in place: the same fingerprint, form and rc; the raw "
       "digest of invalid JSON comes from the callback");

    base(&in);
    copy = strdup("{\"a\":1,\"a\":2}");
    in.body = copy;
    in.body_len = strlen(copy);
    in.body_in_place = 1;
    ok(idem_fingerprint(&in, &res) == -1,
       "in place, invalid JSON and no raw_sha256 callback: -1");
    free(copy);
}


static void
test_large_body(void)
{
    idem_fp_input_t   in;
    idem_fp_result_t  res;
    char             *body, *p, *pre, hex[IDEM_FP_HEX_LEN + 1];
    size_t            i, len;

    /* long strings and many values: both paths of the SHA-256 buffer */
    body = malloc(1 << 21);
    p = body;
    *p++ = '[';
    for (i = 0; i < 20000; i++) {
        p += sprintf(p, "%s{\"n\":%zu.5,\"s\":\"", i ? "," : "", i);
        memset(p, 'a' + i % 26, i % 97);
        p += i % 97;
        *p++ = '"';
        *p++ = '}';
    }
    memcpy(p, ",\"", 2);
    p += 2;
    memset(p, 'z', 10000);
    p += 10000;
    memcpy(p, "\"]", 2);
    p += 2;

    base(&in);
    in.body = body;
    in.body_len = p - body;

    pre = preimage(&in, &res, &len);
    ok(pre != NULL && idem_fingerprint(&in, &res) == 0, "1 MiB JSON body");

    if (pre != NULL) {
        sha256_hex(pre, len, hex);
        is_str(res.hex, hex, "streamed digest equals digest of the preimage");
    } else {
        ok(0, "streamed digest equals digest of the preimage");
    }

    free(pre);
    free(body);
}


static void
test_media_types(void)
{
    static const struct {
        const char  *ct;
        int          json;
    } cases[] = {
        { "application/json", 1 },
        { "Application/JSON", 1 },
        { "application/json; charset=utf-8", 1 },
        { "  application/json  ;charset=utf-8", 1 },
        { "\tapplication/json\t", 1 },
        { "application/problem+json", 1 },
        { "application/vnd.api+json; ext=x", 1 },
        { "text/foo+JSON", 1 },
        { "application/json-patch+json", 1 },
        { "application/jsonx", 0 },
        { "application/x-json", 0 },
        { "text/json", 0 },
        { "text/plain", 0 },
        { "application/+json", 0 },
        { "+json", 0 },
        { "/x+json", 0 },
        { "application/json/x", 0 },
        { "application /json", 0 },
        { "application/ json", 0 },
        { "multipart/form-data; boundary=a+json", 0 },
        { "", 0 },
        { "json", 0 },
    };

    size_t  i;

    for (i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        is_int(idem_media_type_is_json(cases[i].ct, strlen(cases[i].ct)),
               cases[i].json, "media type '%s'", cases[i].ct);
    }

    is_int(idem_media_type_is_json("application/json", 12), 0,
           "length is honoured (application/)");
    is_int(idem_media_type_is_json(NULL, 0), 0, "NULL");
}


static void
test_hex(void)
{
    static const unsigned char  in[] = { 0x00, 0x0f, 0xa5, 0xff };
    char                        out[9];

    idem_hex(in, 4, out);
    is_str(out, "000fa5ff", "idem_hex lowercase, NUL-terminated");
}


int
main(void)
{
    test_known_answer();
    test_invariance();
    test_changes();
    test_headers();
    test_raw_bodies();
    test_hex_form();
    test_large_body();
    test_in_place();
    test_media_types();
    test_hex();

    return done_testing();
}
