/*
 * RFC 6901 pointers (idem_pointer.c) and the exclusion they drive in the
 * canonicalizer (idem_jcs_canonicalize_excluding and its in-place twin):
 * what is removed, what is not, that a body is refused for the same
 * reason with or without exclusions, and that the direct writer agrees
 * with an independent removal from a tree (jcs_tree_exclude).
 */

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include <openssl/evp.h>

#include "idem_fingerprint.h"
#include "idem_jcs.h"
#include "idem_pointer.h"
#include "jcs_tree.h"
#include "tap.h"
#include "mem_sink.h"


#define MAX_PTRS  8


/* parsing */

static void
test_parse_valid(void)
{
    static const struct {
        const char  *in;
        size_t       ntokens;
        const char  *last;          /* the last token, unescaped */
        const char  *last_canon;
        long         index;         /* of the last token */
    } v[] = {
        { "/a", 1, "a", "a", -1 },
        { "/a~1b", 1, "a/b", "a/b", -1 },
        { "/~0c", 1, "~c", "~c", -1 },
        { "/~01", 1, "~1", "~1", -1 },          /* "~0" then "1", not "/" */
        { "/~10", 1, "/0", "/0", -1 },
        { "/", 1, "", "", -1 },
        { "//", 2, "", "", -1 },
        { "/a/", 2, "", "", -1 },
        { "/meta/sent_at", 2, "sent_at", "sent_at", -1 },
        { "/0", 1, "0", "0", 0 },
        { "/items/10", 2, "10", "10", 10 },
        { "/01", 1, "01", "01", -1 },           /* a name, never an index */
        { "/00", 1, "00", "00", -1 },
        { "/-", 1, "-", "-", -1 },
        { "/1e2", 1, "1e2", "1e2", -1 },
        { "/+1", 1, "+1", "+1", -1 },
        { "/2147483647", 1, "2147483647", "2147483647", 2147483647L },
        { "/2147483648", 1, "2147483648", "2147483648", -1 },
        { "/99999999999", 1, "99999999999", "99999999999", -1 },
        { "/\"q\\", 1, "\"q\\", "\\\"q\\\\", -1 },
        { "/a\tb", 1, "a\tb", "a\\tb", -1 },
        { "/a\x01", 1, "a\x01", "a\\u0001", -1 },
        { "/caf\xc3\xa9", 1, "caf\xc3\xa9", "caf\xc3\xa9", -1 },
        { "/a b/c%20d", 2, "c%20d", "c%20d", -1 },
    };

    idem_ptr_t      p;
    idem_ptr_rc_t   rc;
    size_t          i;
    char            last[64], canon[64];
    int             pass;

    for (i = 0; i < sizeof(v) / sizeof(v[0]); i++) {
        rc = idem_ptr_parse(v[i].in, strlen(v[i].in), &p);
        pass = (rc == IDEM_PTR_OK && p.ntokens == v[i].ntokens);

        if (pass) {
            snprintf(last, sizeof(last), "%.*s",
                     (int) p.tokens[p.ntokens - 1].len,
                     p.tokens[p.ntokens - 1].data);
            snprintf(canon, sizeof(canon), "%.*s",
                     (int) p.tokens[p.ntokens - 1].canon_len,
                     p.tokens[p.ntokens - 1].canon);
            pass = strcmp(last, v[i].last) == 0
                   && strcmp(canon, v[i].last_canon) == 0
                   && p.tokens[p.ntokens - 1].index == v[i].index;
        }

        ok(pass, "pointer \"%s\": %zu tokens, last \"%s\" (literal %s), "
           "index %ld", v[i].in, v[i].ntokens, v[i].last, v[i].last_canon,
           v[i].index);

        idem_ptr_free(&p);
    }

    rc = idem_ptr_parse("/a~1b/~0/c", 10, &p);
    ok(rc == IDEM_PTR_OK && p.ntokens == 3
       && p.tokens[0].len == 3 && memcmp(p.tokens[0].data, "a/b", 3) == 0
       && p.tokens[1].len == 1 && p.tokens[1].data[0] == '~'
       && p.tokens[2].len == 1 && p.tokens[2].data[0] == 'c',
       "\"/a~1b/~0/c\" is a/b, ~, c");
    idem_ptr_free(&p);
}


static void
test_parse_invalid(void)
{
    static const struct {
        const char     *in;
        size_t          len;
        idem_ptr_rc_t   rc;
    } v[] = {
        { "", 0, IDEM_PTR_EEMPTY },
        { "a", 1, IDEM_PTR_ESLASH },
        { "a/b", 3, IDEM_PTR_ESLASH },
        { "#/a", 3, IDEM_PTR_ESLASH },          /* no URI fragment form */
        { " /a", 3, IDEM_PTR_ESLASH },
        { "/~2", 3, IDEM_PTR_EESCAPE },
        { "/~", 2, IDEM_PTR_EESCAPE },
        { "/a~", 3, IDEM_PTR_EESCAPE },
        { "/a~/b", 5, IDEM_PTR_EESCAPE },
        { "/~a", 3, IDEM_PTR_EESCAPE },
        { "/ok/~~", 6, IDEM_PTR_EESCAPE },
        { "/\xff", 2, IDEM_PTR_EUTF8 },
        { "/\xc0\x80", 3, IDEM_PTR_EUTF8 },
        { "/\xed\xa0\x80", 4, IDEM_PTR_EUTF8 },
        { "/a\0b", 4, IDEM_PTR_ENUL },
    };

    idem_ptr_t      p;
    idem_ptr_rc_t   rc;
    size_t          i;
    char            deep[2 * 129 + 1];

    for (i = 0; i < sizeof(v) / sizeof(v[0]); i++) {
        rc = idem_ptr_parse(v[i].in, v[i].len, &p);
        ok(rc == v[i].rc && p.tokens == NULL && p.ntokens == 0,
           "pointer \"%s\" refused: %s", v[i].in, idem_ptr_strerror(v[i].rc));
        idem_ptr_free(&p);
    }

    for (i = 0; i < 129; i++) {
        deep[2 * i] = '/';
        deep[2 * i + 1] = 'a';
    }

    rc = idem_ptr_parse(deep, 2 * 128, &p);
    ok(rc == IDEM_PTR_OK && p.ntokens == 128, "128 tokens accepted");
    idem_ptr_free(&p);

    rc = idem_ptr_parse(deep, 2 * 129, &p);
    ok(rc == IDEM_PTR_EDEPTH, "129 tokens refused (deeper than a body nests)");
    idem_ptr_free(&p);

    ok(strcmp(idem_ptr_strerror(IDEM_PTR_EESCAPE), "unknown error") != 0
       && strcmp(idem_ptr_strerror((idem_ptr_rc_t) 99), "unknown error") == 0,
       "idem_ptr_strerror names the codes");
}


static void
test_set(void)
{
    idem_ptr_set_t  *set;
    char             buf[16];
    int              i, n;

    set = idem_ptr_set_create();

    ok(set != NULL && set->n == 0 && set->root.child == NULL, "empty set");
    ok(idem_ptr_set_add(set, "/a", 2) == IDEM_PTR_OK
       && idem_ptr_set_add(set, "/a/b", 4) == IDEM_PTR_OK
       && idem_ptr_set_add(set, "/c/0", 4) == IDEM_PTR_OK
       && set->n == 3, "a pointer and one below it are both accepted");
    ok(idem_ptr_set_add(set, "/a", 2) == IDEM_PTR_EDUP
       && idem_ptr_set_add(set, "/c/0", 4) == IDEM_PTR_EDUP && set->n == 3,
       "the same pointer twice is refused");
    ok(idem_ptr_set_add(set, "/c", 2) == IDEM_PTR_OK && set->n == 4,
       "a pointer above an existing one is accepted");
    ok(idem_ptr_set_add(set, "", 0) == IDEM_PTR_EEMPTY
       && idem_ptr_set_add(set, "x", 1) == IDEM_PTR_ESLASH
       && idem_ptr_set_add(set, "/~2", 3) == IDEM_PTR_EESCAPE && set->n == 4,
       "a bad pointer leaves the set as it was");

    n = 0;
    for (i = 0; set->n < IDEM_PTR_SET_MAX; i++) {
        snprintf(buf, sizeof(buf), "/m%d", i);
        n += (idem_ptr_set_add(set, buf, strlen(buf)) == IDEM_PTR_OK);
    }

    ok(n == IDEM_PTR_SET_MAX - 4
       && idem_ptr_set_add(set, "/one-more", 9) == IDEM_PTR_EMANY,
       "at most %d pointers", IDEM_PTR_SET_MAX);

    idem_ptr_set_free(set);
    idem_ptr_set_free(NULL);
}


/* idempotency_confirm_show against idempotency_fingerprint_exclude */
static int
overlaps(idem_ptr_set_t *set, const char *s)
{
    int         r;
    idem_ptr_t  p;

    if (idem_ptr_parse(s, strlen(s), &p) != IDEM_PTR_OK) {
        return -1;
    }

    r = idem_ptr_set_overlaps(set, &p);
    idem_ptr_free(&p);

    return r;
}


static void
test_overlaps(void)
{
    idem_ptr_set_t  *set;

    set = idem_ptr_set_create();

    ok(set != NULL && idem_ptr_set_add(set, "/memo", 5) == IDEM_PTR_OK
       && idem_ptr_set_add(set, "/meta/trace", 11) == IDEM_PTR_OK
       && idem_ptr_set_add(set, "/items/0", 8) == IDEM_PTR_OK,
       "an exclusion set");
    ok(overlaps(set, "/memo") == 1, "a shown pointer equal to an excluded one");
    ok(overlaps(set, "/memo/text") == 1 && overlaps(set, "/meta/trace/id") == 1,
       "a shown pointer inside an excluded one");
    ok(overlaps(set, "/meta") == 1 && overlaps(set, "/items") == 1,
       "a shown pointer containing an excluded one");
    ok(overlaps(set, "/amount") == 0 && overlaps(set, "/meta/to") == 0
       && overlaps(set, "/items/1") == 0 && overlaps(set, "/mem") == 0
       && overlaps(set, "/memo2") == 0,
       "a shown pointer beside the excluded ones");
    ok(idem_ptr_set_overlaps(NULL, NULL) == 0, "no exclusion set");

    idem_ptr_set_free(set);
}


/* exclusion */

typedef struct {
    idem_ptr_set_t  *set;
    idem_ptr_t       ptrs[MAX_PTRS];
    size_t           n;
} excl_t;


static int
excl_init(excl_t *e, const char *const *list)
{
    size_t  i;

    memset(e, 0, sizeof(excl_t));
    e->set = idem_ptr_set_create();

    /* e->n counts what excl_free() must free, also on failure */
    for (i = 0; list[i] != NULL && i < MAX_PTRS; i++) {
        if (idem_ptr_set_add(e->set, list[i], strlen(list[i])) != IDEM_PTR_OK
            || idem_ptr_parse(list[i], strlen(list[i]), &e->ptrs[i])
               != IDEM_PTR_OK)
        {
            return -1;
        }

        e->n = i + 1;
    }

    return 0;
}


static void
excl_free(excl_t *e)
{
    size_t  i;

    for (i = 0; i < e->n; i++) {
        idem_ptr_free(&e->ptrs[i]);
    }

    idem_ptr_set_free(e->set);
}


/* copy mode into m; in place into m2 over a copy of the input */
static idem_jcs_rc_t
excl_run(const excl_t *e, const char *in, size_t len, mem_t *m, mem_t *m2,
    idem_jcs_rc_t *rc2)
{
    idem_sink_t     sink;
    idem_jcs_rc_t   rc;
    char           *copy;

    mem_sink(m, &sink);
    rc = idem_jcs_canonicalize_excluding(in, len, e->set, &sink);

    copy = malloc(len + 1);
    memcpy(copy, in, len);
    mem_sink(m2, &sink);
    *rc2 = idem_jcs_canonicalize_in_place_excluding(copy, len, e->set, &sink);
    free(copy);

    return rc;
}


/* the tree path: parse, remove, write */
static char *
excl_oracle(const excl_t *e, const char *in, size_t len)
{
    mem_t         m;
    idem_sink_t   sink;
    cJSON        *tree;

    if (jcs_tree_parse(in, len, &tree) != IDEM_JCS_OK) {
        return NULL;
    }

    jcs_tree_exclude(tree, e->ptrs, e->n);

    mem_sink(&m, &sink);
    if (jcs_tree_write(tree, &sink) != IDEM_JCS_OK) {
        mem_free(&m);
    }

    cJSON_Delete(tree);
    return m.data;
}


/* documents excl_check() saw shrink: the exclusion did something */
static unsigned  excl_changed;


/*
 * One document: the copy and in-place results agree, the rc is the one
 * without exclusions, and an accepted result is the tree path's.
 */
static int
excl_check(const excl_t *e, const char *in, size_t len, mem_t *m,
    idem_jcs_rc_t *rc)
{
    mem_t           m2, plain;
    idem_sink_t     sink;
    idem_jcs_rc_t   rc2, rc0;
    char           *want;
    int             pass;

    *rc = excl_run(e, in, len, m, &m2, &rc2);

    mem_sink(&plain, &sink);
    rc0 = idem_jcs_canonicalize(in, len, &sink);
    excl_changed += (rc0 == IDEM_JCS_OK && *rc == IDEM_JCS_OK
                     && m->len < plain.len);
    mem_free(&plain);

    pass = (*rc == rc2 && *rc == rc0 && (*rc != IDEM_JCS_OK
                                         || mem_same(m, &m2)));

    if (pass && *rc == IDEM_JCS_OK) {
        want = excl_oracle(e, in, len);
        pass = want != NULL && m->data != NULL && strcmp(want, m->data) == 0;
        if (!pass) {
            diag("tree path: %s", want ? want : "(null)");
        }
        free(want);
    }

    if (!pass) {
        diag("input %.*s: rc %d, in place %d, without exclusions %d; "
             "got %s, in place %s", (int) len, in, *rc, rc2, rc0,
             m->data ? m->data : "", m2.data ? m2.data : "");
    }

    mem_free(&m2);
    return pass;
}


#define P(...)  (const char *const []) { __VA_ARGS__, NULL }

typedef struct {
    const char *const  *ptrs;
    const char         *in;
    const char         *want;       /* NULL: refused with rc */
    idem_jcs_rc_t       rc;
    const char         *what;
} excl_case_t;

static const excl_case_t  excl_cases[] = {
    { P("/request_id"), "{\"request_id\":\"r-1\",\"amount\":12.50}",
      "{\"amount\":12.5}", 0, "a top-level member" },
    { P("/request_id", "/meta/sent_at"),
      "{\"meta\":{\"sent_at\":\"t\",\"z\":2},\"request_id\":1,\"a\":[1]}",
      "{\"a\":[1],\"meta\":{\"z\":2}}", 0, "the task's two pointers" },
    { P("/meta/sent_at"), "{\"meta\":{\"sent_at\":1}}",
      "{\"meta\":{}}", 0, "the only member: an empty object stays" },
    { P("/a"), "{\"a\":1}", "{}", 0, "the root's only member" },
    { P("/nope", "/a/b/c", "/a/0"), "{\"a\":1,\"b\":[1]}",
      "{\"a\":1,\"b\":[1]}", 0, "absent, and through a scalar" },
    { P("/x"), "[{\"x\":1}]", "[{\"x\":1}]", 0,
      "a name is not looked for inside an array" },
    { P("/a"), "5", "5", 0, "a scalar body" },
    { P("/a"), "{}", "{}", 0, "an empty object" },
    { P("/0"), "[]", "[]", 0, "an empty array" },
    { P("/b"), "{ \"b\" : 1 , \"a\" : 2 , \"c\" : 3 }",
      "{\"a\":2,\"c\":3}", 0, "the first member, with blanks" },
    { P("/a"), "{ \"b\" : 1 , \"a\" : 2 , \"c\" : 3 }",
      "{\"b\":1,\"c\":3}", 0, "a middle member" },
    { P("/c"), "{\"b\":1,\"a\":2,\"c\":3}", "{\"a\":2,\"b\":1}", 0,
      "the last member" },
    { P("/a"), "{\"z\":1,\"a\":2,\"m\":3}", "{\"m\":3,\"z\":1}", 0,
      "a root out of order" },
    { P("/o/z"), "{\"o\":{\"z\":1,\"a\":2,\"m\":3},\"b\":0}",
      "{\"b\":0,\"o\":{\"a\":2,\"m\":3}}", 0, "a nested object out of order" },
    { P("/meta"), "{\"meta\":{\"z\":[1,{\"q\":2}],\"a\":{}},\"a\":1}",
      "{\"a\":1}", 0, "a whole object" },
    { P("/meta", "/meta/sent_at"), "{\"meta\":{\"sent_at\":1},\"a\":1}",
      "{\"a\":1}", 0, "a pointer below an excluded one" },
    { P("/items/1"), "{\"items\":[0,1,2]}", "{\"items\":[0,2]}", 0,
      "an array element" },
    { P("/items/0"), "{\"items\":[0,1,2]}", "{\"items\":[1,2]}", 0,
      "the first element" },
    { P("/items/2"), "{\"items\":[0,1,2]}", "{\"items\":[0,1]}", 0,
      "the last element" },
    { P("/items/3"), "{\"items\":[0,1,2]}", "{\"items\":[0,1,2]}", 0,
      "an element past the end" },
    { P("/items/0", "/items/1"), "{\"items\":[\"a\",\"b\",\"c\"]}",
      "{\"items\":[\"c\"]}", 0, "indexes of the body as received" },
    { P("/0"), "[[1],2]", "[2]", 0, "an array in a root array" },
    { P("/0", "/1"), "[1,2]", "[]", 0, "every element" },
    { P("/items/0/sku"),
      "{\"items\":[{\"sku\":1,\"q\":2},{\"sku\":3}]}",
      "{\"items\":[{\"q\":2},{\"sku\":3}]}", 0, "a member of an element" },
    { P("/0"), "{\"0\":1,\"1\":2}", "{\"1\":2}", 0,
      "a digit token names a member of an object" },
    { P("/01"), "[1,2]", "[1,2]", 0, "\"01\" is no index" },
    { P("/01"), "{\"01\":1,\"1\":2}", "{\"1\":2}", 0,
      "... but the name \"01\"" },
    { P("/-"), "[1,2]", "[1,2]", 0, "\"-\" names no element" },
    { P("/-"), "{\"-\":1}", "{}", 0, "... but the name \"-\"" },
    { P("/"), "{\"\":1,\"a\":2}", "{\"a\":2}", 0, "the empty name" },
    { P("/a~1b"), "{\"a\\/b\":1,\"x\":2}", "{\"x\":2}", 0,
      "~1 against an escaped slash" },
    { P("/~0"), "{\"~\":1,\"x\":2}", "{\"x\":2}", 0, "~0" },
    { P("/\""), "{\"\\\"\":1,\"b\":2}", "{\"b\":2}", 0, "a quote" },
    { P("/caf\xc3\xa9"), "{\"caf\\u00e9\":1,\"b\":2}", "{\"b\":2}", 0,
      "an escaped name against UTF-8" },
    { P("/a\tb"), "{\"a\\tb\":1,\"b\":2}", "{\"b\":2}", 0,
      "a control character" },
    { P("/A"), "{\"a\":1}", "{\"a\":1}", 0, "names are case-sensitive" },
    { P("/a"), "{\"a\":1e20,\"b\":1e21}", "{\"b\":1e+21}", 0,
      "a number that grows, cut" },
    { P("/1/b"), "[1e20,{\"b\":1e20,\"c\":1e20}]",
      "[100000000000000000000,{\"c\":100000000000000000000}]", 0,
      "numbers that grow, in place" },

    { P("/request_id"), "{\"request_id\":01,\"a\":1}", NULL,
      IDEM_JCS_ESYNTAX, "an excluded bad number" },
    { P("/request_id"), "{\"request_id\":\"\\ud800\"}", NULL,
      IDEM_JCS_ESURROGATE, "an excluded lone surrogate" },
    { P("/request_id"), "{\"request_id\":\"\xc0\x80\"}", NULL,
      IDEM_JCS_EUTF8, "excluded invalid UTF-8" },
    { P("/request_id"), "{\"request_id\":\"\\u0000\"}", NULL,
      IDEM_JCS_ENUL, "an excluded \\u0000" },
    { P("/request_id"), "{\"request_id\":1e400}", NULL,
      IDEM_JCS_ENUMBER, "an excluded infinite number" },
    { P("/request_id"), "{\"request_id\":{\"x\":1,\"x\":2}}", NULL,
      IDEM_JCS_EDUP, "duplicates inside an excluded value" },
    { P("/request_id"), "{\"request_id\":1,\"request_id\":2}", NULL,
      IDEM_JCS_EDUP, "an excluded name twice" },
    { P("/request_id"), "{\"request_id\":1,\"a\":0,\"request_\\u0069d\":2}",
      NULL, IDEM_JCS_EDUP, "an excluded name twice, spelled apart" },
    { P("/b"), "{\"a\":1,\"b\":0,\"a\":2}", NULL, IDEM_JCS_EDUP,
      "a kept name twice" },
    { P("/r"), "{\"r\":1,\"r\":2,", NULL, IDEM_JCS_ESYNTAX,
      "a cut-off body stays a syntax error" },
    { P("/r"), "{\"r\":[1,]}", NULL, IDEM_JCS_ESYNTAX,
      "an excluded trailing comma" },
    { P("/r"), "{\"r\":1}x", NULL, IDEM_JCS_ESYNTAX, "trailing garbage" },
    { P("/0"), "[1,]", NULL, IDEM_JCS_ESYNTAX,
      "a trailing comma after an excluded element" },
};


static void
test_exclude_table(void)
{
    const excl_case_t  *v;
    excl_t              e;
    mem_t           m;
    idem_jcs_rc_t   rc;
    size_t          i;
    int             pass;

    for (i = 0; i < sizeof(excl_cases) / sizeof(excl_cases[0]); i++) {
        v = &excl_cases[i];

        if (excl_init(&e, v->ptrs) != 0) {
            ok(0, "%s: pointers", v->what);
            excl_free(&e);
            continue;
        }

        pass = excl_check(&e, v->in, strlen(v->in), &m, &rc);

        if (v->want) {
            is_str(rc == IDEM_JCS_OK && pass ? m.data : NULL, v->want,
                   "exclude: %s", v->what);

        } else {
            ok(pass && rc == v->rc, "still refused (%s): %s",
               idem_jcs_strerror(v->rc), v->what);
        }

        mem_free(&m);
        excl_free(&e);
    }
}


/* depth: the limit holds under an excluded member, and at it */
static void
test_exclude_depth(void)
{
    excl_t          e;
    mem_t           m;
    idem_jcs_rc_t   rc;
    char           *doc;
    size_t          n, i;

    excl_init(&e, P("/r"));

    /* {"r": 127 arrays}: depth 128, accepted and removed */
    doc = malloc(4096);
    n = sprintf(doc, "{\"r\":");
    for (i = 0; i < 127; i++) {
        doc[n++] = '[';
    }
    for (i = 0; i < 127; i++) {
        doc[n++] = ']';
    }
    n += sprintf(doc + n, ",\"a\":1}");

    ok(excl_check(&e, doc, n, &m, &rc) && rc == IDEM_JCS_OK
       && strcmp(m.data, "{\"a\":1}") == 0,
       "depth 128 under an excluded member: removed");
    mem_free(&m);

    /* one more: depth 129, refused as without exclusions */
    n = sprintf(doc, "{\"r\":");
    for (i = 0; i < 128; i++) {
        doc[n++] = '[';
    }
    for (i = 0; i < 128; i++) {
        doc[n++] = ']';
    }
    n += sprintf(doc + n, "}");

    ok(excl_check(&e, doc, n, &m, &rc) && rc == IDEM_JCS_EDEPTH,
       "depth 129 under an excluded member: still refused");
    mem_free(&m);

    free(doc);
    excl_free(&e);
}


/* generated documents and pointers */

static uint64_t  gen_state = 0x2545f4914f6cdd1dull;

static unsigned
gen_rand(unsigned n)
{
    gen_state ^= gen_state << 13;
    gen_state ^= gen_state >> 7;
    gen_state ^= gen_state << 17;

    return (unsigned) (gen_state % n);
}


static const char  *gen_names[] = { "a", "b", "id", "0", "1", "~", "a/b", "z" };
static const char  *gen_ptr_names[] = { "a", "b", "id", "0", "1", "~0", "a~1b",
                                        "z", "2", "-", "01" };


static void
gen_value(char *buf, size_t *n, int depth)
{
    unsigned  i, k, kind;

    kind = (depth > 4) ? 0 : (depth == 0) ? 2 + gen_rand(2) : gen_rand(4);

    if (kind < 2) {
        *n += sprintf(buf + *n, kind ? "\"s%u\"" : "%u.50", gen_rand(100));
        return;
    }

    buf[(*n)++] = (kind == 2) ? '{' : '[';
    k = gen_rand(5);

    for (i = 0; i < k; i++) {
        if (i > 0) {
            buf[(*n)++] = ',';
        }

        if (kind == 2) {
            *n += sprintf(buf + *n, "\"%s\":",
                          gen_names[gen_rand(sizeof(gen_names)
                                             / sizeof(gen_names[0]))]);
        }

        gen_value(buf, n, depth + 1);
    }

    buf[(*n)++] = (kind == 2) ? '}' : ']';
}


static void
test_exclude_generated(void)
{
    const char     *list[MAX_PTRS + 1];
    char            ptrs[MAX_PTRS][64], doc[65536];
    excl_t          e;
    mem_t           m;
    idem_jcs_rc_t   rc;
    unsigned        round, np, i, j, d, bad, accepted, dup;
    size_t          n, pn;

    bad = accepted = dup = 0;
    excl_changed = 0;

    for (round = 0; round < 20000; round++) {
        np = 1 + gen_rand(4);

        for (i = 0; i < np; i++) {
            d = 1 + gen_rand(3);
            pn = 0;
            for (j = 0; j < d; j++) {
                pn += sprintf(ptrs[i] + pn, "/%s",
                              gen_ptr_names[gen_rand(sizeof(gen_ptr_names)
                                                / sizeof(gen_ptr_names[0]))]);
            }
            list[i] = ptrs[i];
        }

        list[np] = NULL;

        n = 0;
        gen_value(doc, &n, 0);

        if (excl_init(&e, list) != 0) {
            excl_free(&e);
            continue;       /* the same pointer twice */
        }

        if (!excl_check(&e, doc, n, &m, &rc)) {
            bad++;
        }

        accepted += (rc == IDEM_JCS_OK);
        dup += (rc == IDEM_JCS_EDUP);
        mem_free(&m);
        excl_free(&e);
    }

    ok(bad == 0 && accepted > 5000 && dup > 500 && excl_changed > 1000,
       "20000 generated documents and pointer sets: copy == in place == "
       "tree path, refusals unchanged (%u accepted, %u with something "
       "removed, %u duplicate names)", accepted, excl_changed, dup);
}


/* no pointer: the same bytes as the plain canonicalizer */
static void
test_exclude_none(void)
{
    idem_ptr_set_t  *empty;
    mem_t            a, b, c;
    idem_sink_t      sa, sb, sc;
    const char      *doc = "{\"z\":[1e20,{\"b\":1,\"a\":2}],\"a\":\"x\"}";

    empty = idem_ptr_set_create();
    mem_sink(&a, &sa);
    mem_sink(&b, &sb);
    mem_sink(&c, &sc);

    idem_jcs_canonicalize(doc, strlen(doc), &sa);
    idem_jcs_canonicalize_excluding(doc, strlen(doc), NULL, &sb);
    idem_jcs_canonicalize_excluding(doc, strlen(doc), empty, &sc);

    ok(a.len > 0 && mem_same(&a, &b) && mem_same(&a, &c),
       "a NULL or empty set excludes nothing");

    mem_free(&a);
    mem_free(&b);
    mem_free(&c);
    idem_ptr_set_free(empty);
}


/* the fingerprint */

typedef struct {
    const char  *orig;
    size_t       len;
} raw_src_t;


/* what the module's body reader does: digest the original bytes again */
static int
raw_again(void *data, unsigned char *md)
{
    raw_src_t     *src = data;
    unsigned int   n;

    return EVP_Digest(src->orig, src->len, md, &n, EVP_sha256(), NULL) == 1
           ? 0 : -1;
}


/* the fingerprint of a POST /v1/orders; in_place over a copy */
static int
fp_of(const char *body, const idem_ptr_set_t *excl, int in_place,
    idem_fp_result_t *res)
{
    idem_fp_input_t   in;
    raw_src_t         src;
    char             *copy;
    int               rc;

    memset(&in, 0, sizeof(idem_fp_input_t));
    in.method.data = "POST";
    in.method.len = 4;
    in.route.data = "/v1/orders";
    in.route.len = 10;
    in.query.data = "";
    in.scope.data = "";
    in.body_json = 1;
    in.body_len = strlen(body);
    in.exclude = excl;

    copy = strdup(body);
    in.body = in_place ? copy : body;

    if (in_place) {
        src.orig = body;
        src.len = in.body_len;
        in.body_in_place = 1;
        in.raw_sha256 = raw_again;
        in.raw_data = &src;
    }

    rc = idem_fingerprint(&in, res);
    free(copy);

    return rc;
}


static void
test_fingerprint(void)
{
    static const char  *doc =
        "{\n  \"amount\": 12.50,\n  \"request_id\": \"3f1c-77\",\n"
        "  \"meta\": {\"sent_at\": \"2026-12-04T21:00:00Z\", \"src\": \"web\"},\n"
        "  \"items\": [ {\"sku\": \"A-1\", \"qty\": 2} ]\n}\n";
    static const char  *bad = "{\"a\":1,\"request_id\":01}";

    idem_fp_result_t   a, b, c, d;
    excl_t             e;
    int                mode;

    excl_init(&e, P("/request_id", "/meta/sent_at"));

    for (mode = 0; mode < 2; mode++) {
        ok(fp_of(doc, e.set, mode, &a) == 0 && a.body_form == IDEM_BODY_JSON
           && strcmp(a.hex, "122f3859ddb4c7cb00601b5c854a1c6ad884a50881abeff4"
                            "456a1985fdebcc32") == 0,
           "docs/fingerprint.md 3.1 example%s", mode ? ", in place" : "");

        ok(fp_of("{\"items\":[{\"qty\":2,\"sku\":\"A-1\"}],"
                 "\"meta\":{\"src\":\"web\"},\"amount\":12.5}", NULL, mode,
                 &b) == 0 && strcmp(a.hex, b.hex) == 0,
           "... the same as the body without those members%s",
           mode ? ", in place" : "");

        ok(fp_of(doc, NULL, mode, &c) == 0
           && strcmp(c.hex, "81726290cffd733e860ea7b8432771fcb4a117c0179ee8334"
                            "cc4cc466b0dc587") == 0,
           "... and without the directive, its documented fingerprint%s",
           mode ? ", in place" : "");

        ok(fp_of(bad, e.set, mode, &c) == 0 && fp_of(bad, NULL, 0, &d) == 0
           && c.body_form == IDEM_BODY_RAW_INVALID_JSON
           && c.json_rc == IDEM_JCS_ESYNTAX && strcmp(c.hex, d.hex) == 0,
           "invalid under an excluded member: raw, as without pointers%s",
           mode ? ", in place" : "");
    }

    excl_free(&e);
}


int
main(int argc, char **argv)
{
    test_parse_valid();
    test_parse_invalid();
    test_set();
    test_overlaps();
    test_exclude_table();
    test_exclude_depth();
    test_exclude_none();
    test_exclude_generated();
    test_fingerprint();

    return done_testing();
}
