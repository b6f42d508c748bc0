/*
 * libFuzzer target: the RFC 8785 canonicalizer (idem_jcs_canonicalize,
 * idem_jcs_canonicalize_in_place, jcs_tree_parse, jcs_tree_write)
 * and the number formatter.
 *
 * Properties, for every input:
 *  - the answer is deterministic: the same input gives the same rc and
 *    the same bytes every time, and jcs_tree_parse agrees with
 *    idem_jcs_canonicalize about whether (and why) it is rejected;
 *  - rc is one of the documented codes, never ENOMEM/ESINK with a healthy
 *    sink;
 *  - accepted input: the output is well-formed UTF-8, is itself accepted
 *    and canonicalizes to the same bytes (a fixed point), parses back to a
 *    value equal to the input's (same types, same numbers as doubles, same
 *    strings, same members, same array order), and writing the input's
 *    parsed tree gives the same bytes (the tree writer is an independent
 *    implementation of the canonical form: the direct writer builds no
 *    tree), and so does idem_jcs_canonicalize_in_place over a copy;
 *  - the nesting of accepted input is at most IDEM_JCS_MAX_DEPTH.
 * With JSON pointers (idem_pointer.c): the input's first line, as a
 * pointer, parses the same every time, and an accepted one written back
 * from its tokens is the same bytes, its tokens UTF-8 with their literal
 * and index right; and the input canonicalized without what a set of
 * pointers names (paths into the input's own tree chosen by its bytes,
 * paths that miss, that first line, "/a", "/0") is refused exactly when,
 * and why, the input is refused without them, gives the same bytes in
 * place, and is the tree path's result: jcs_tree_exclude() on the parsed
 * tree, then jcs_tree_write().  idempotency_json_var's reading: cJSON
 * (as the module parses a body) reads accepted input as the same value,
 * and idem_json_pointer names in it what it names in the core parser's
 * tree: the node a path into that tree was built to, or nothing.
 * And for the first 8 bytes read as a double: a finite value is written
 * by idem_jcs_format_number as text that strtod reads back to the same
 * double (-0 as 0) and that is its own canonical form.
 */

#include <math.h>

#include <cjson/cJSON.h>

#include "idem_json.h"
#include "idem_jws.h"
#include "jcs_tree.h"

#include "fuzz_common.h"


static int
fuzz_depth(const cJSON *v)
{
    const cJSON  *c;
    int           d, m;

    if (!cJSON_IsArray(v) && !cJSON_IsObject(v)) {
        return 0;
    }

    m = 0;
    for (c = v->child; c != NULL; c = c->next) {
        d = fuzz_depth(c);
        if (d > m) {
            m = d;
        }
    }

    return m + 1;
}


/* exact equality of two parsed values; member order does not matter */
static int
fuzz_equal(const cJSON *a, const cJSON *b)
{
    const cJSON  *c, *d;
    int           na, nb;

    if ((a->type & 0xff) != (b->type & 0xff)) {
        return 0;
    }

    switch (a->type & 0xff) {
    case cJSON_Number:
        /* == : -0 and 0 are one value in JCS */
        return a->valuedouble == b->valuedouble;

    case cJSON_String:
        return a->valuestring != NULL && b->valuestring != NULL
               && strcmp(a->valuestring, b->valuestring) == 0;

    case cJSON_Array:
        for (c = a->child, d = b->child; c != NULL && d != NULL;
             c = c->next, d = d->next)
        {
            if (!fuzz_equal(c, d)) {
                return 0;
            }
        }
        return c == NULL && d == NULL;

    case cJSON_Object:
        na = cJSON_GetArraySize(a);
        nb = cJSON_GetArraySize(b);
        if (na != nb) {
            return 0;
        }

        for (c = a->child; c != NULL; c = c->next) {
            for (d = b->child; d != NULL; d = d->next) {
                if (strcmp(c->string, d->string) == 0) {
                    break;
                }
            }

            if (d == NULL || !fuzz_equal(c, d)) {
                return 0;
            }
        }
        return 1;

    default:
        return 1;       /* true, false, null: the type says it all */
    }
}


static void
fuzz_number(const uint8_t *data, size_t size)
{
    char            buf[IDEM_JCS_NUMBER_MAX], *end;
    double          d, back;
    size_t          n;
    mem_t           out;
    idem_sink_t     sink;
    idem_jcs_rc_t   rc;

    if (size < 8) {
        return;
    }

    memcpy(&d, data, sizeof(double));

    n = idem_jcs_format_number(d, buf);

    if (!isfinite(d)) {
        FUZZ_CHECK(n == 0, "non-finite %g formatted as %.*s", d, (int) n, buf);
        return;
    }

    FUZZ_CHECK(n > 0 && n < IDEM_JCS_NUMBER_MAX, "length %zu for %a", n, d);
    FUZZ_CHECK(buf[n] == '\0', "no NUL after %zu bytes for %a", n, d);

    back = strtod(buf, &end);
    FUZZ_CHECK(end == buf + n, "strtod stopped early in \"%s\" (%a)", buf, d);
    FUZZ_CHECK(back == d, "\"%s\" reads back as %a, not %a", buf, back, d);

    if (d == 0) {
        FUZZ_CHECK(strcmp(buf, "0") == 0, "zero written as \"%s\"", buf);
    }

    mem_sink(&out, &sink);
    rc = idem_jcs_canonicalize(buf, n, &sink);
    FUZZ_CHECK(rc == IDEM_JCS_OK, "formatted number \"%s\" rejected: %s", buf,
               idem_jcs_strerror(rc));
    FUZZ_CHECK(out.len == n && memcmp(out.data, buf, n) == 0,
               "\"%s\" is not its own canonical form", buf);
    mem_free(&out);
}


/* one input and what the canonicalizer made of it */
typedef struct {
    const uint8_t  *data;
    size_t          size;
    char           *in;         /* exact-size copy of data */
    idem_jcs_rc_t   rc;
    mem_t           out;        /* the canonical form when rc is OK */
    idem_sink_t     sink;
    cJSON          *tree;       /* jcs_tree_parse() of the input */
} fuzz_jcs_t;


/* the same input again: the same rc, and the same bytes */
static void
check_deterministic(fuzz_jcs_t *c)
{
    mem_t           again;
    idem_sink_t     sink;
    idem_jcs_rc_t   rc;

    mem_sink(&again, &sink);
    rc = idem_jcs_canonicalize(c->in, c->size, &sink);

    FUZZ_CHECK(rc == c->rc, "rc %d then %d for \"%s\"", c->rc, rc,
               fuzz_show(c->in, c->size));
    FUZZ_CHECK(c->rc != IDEM_JCS_OK || mem_same(&c->out, &again),
               "two canonical forms of \"%s\"", fuzz_show(c->in, c->size));

    mem_free(&again);
}


/* over a copy of itself: the same rc and bytes */
static void
check_in_place(fuzz_jcs_t *c)
{
    mem_t           out;
    idem_sink_t     sink;
    idem_jcs_rc_t   rc;
    char           *copy;

    mem_sink(&out, &sink);
    copy = fuzz_dup(c->data, c->size);
    rc = idem_jcs_canonicalize_in_place(copy, c->size, &sink);
    free(copy);

    FUZZ_CHECK(rc == c->rc, "rc %d, in place %d for \"%s\"", c->rc, rc,
               fuzz_show(c->in, c->size));
    FUZZ_CHECK(c->rc != IDEM_JCS_OK || mem_same(&c->out, &out),
               "in place differs for \"%s\"", fuzz_show(c->in, c->size));

    mem_free(&out);
}


/* a documented code, never ENOMEM or ESINK with a healthy sink */
static void
check_rc(fuzz_jcs_t *c)
{
    FUZZ_CHECK(c->rc >= IDEM_JCS_OK && c->rc <= IDEM_JCS_EDEPTH,
               "unexpected rc %d (%s) for \"%s\"", c->rc,
               idem_jcs_strerror(c->rc), fuzz_show(c->in, c->size));
}


/* the tree parser accepts and rejects alike, for the same reason */
static void
check_tree_parse(fuzz_jcs_t *c)
{
    idem_jcs_rc_t  rc;

    rc = jcs_tree_parse(c->in, c->size, &c->tree);

    FUZZ_CHECK(rc == c->rc,
               "jcs_tree_parse says %s, canonicalize %s for \"%s\"",
               idem_jcs_strerror(rc), idem_jcs_strerror(c->rc),
               fuzz_show(c->in, c->size));
    FUZZ_CHECK(rc != IDEM_JCS_OK || c->tree != NULL, "rc OK without a tree");
}


/* accepted: non-empty UTF-8, nested no deeper than the limit */
static void
check_output(fuzz_jcs_t *c)
{
    FUZZ_CHECK(c->out.len > 0, "empty canonical form");
    FUZZ_CHECK(idem_utf8_valid(c->out.data, c->out.len),
               "canonical form is not UTF-8: \"%s\"",
               fuzz_show(c->out.data, c->out.len));
    FUZZ_CHECK(fuzz_depth(c->tree) <= IDEM_JCS_MAX_DEPTH, "accepted depth %d",
               fuzz_depth(c->tree));
}


/* the independent tree writer gives the same bytes */
static void
check_tree_write(fuzz_jcs_t *c)
{
    mem_t           out;
    idem_sink_t     sink;
    idem_jcs_rc_t   rc;

    mem_sink(&out, &sink);
    rc = jcs_tree_write(c->tree, &sink);

    FUZZ_CHECK(rc == IDEM_JCS_OK && mem_same(&c->out, &out),
               "jcs_tree_write(parse(x)) differs from canonicalize(x) (rc %d)",
               rc);

    mem_free(&out);
}


/* the canonical form is accepted and canonicalizes to itself */
static void
check_fixed_point(fuzz_jcs_t *c)
{
    mem_t           out;
    idem_sink_t     sink;
    idem_jcs_rc_t   rc;

    mem_sink(&out, &sink);
    rc = idem_jcs_canonicalize(c->out.data, c->out.len, &sink);

    FUZZ_CHECK(rc == IDEM_JCS_OK, "canonical form rejected (%s): \"%s\"",
               idem_jcs_strerror(rc), fuzz_show(c->out.data, c->out.len));
    FUZZ_CHECK(mem_same(&c->out, &out),
               "canonical form is not a fixed point: \"%s\"",
               fuzz_show(c->out.data, c->out.len));

    mem_free(&out);
}


/* the canonical form denotes the input's value */
static void
check_same_value(fuzz_jcs_t *c)
{
    idem_jcs_rc_t   rc;
    cJSON          *tree;

    tree = NULL;
    rc = jcs_tree_parse(c->out.data, c->out.len, &tree);

    FUZZ_CHECK(rc == IDEM_JCS_OK && tree != NULL,
               "canonical form does not parse");
    FUZZ_CHECK(fuzz_equal(c->tree, tree),
               "canonical form \"%s\" is not the input's value",
               fuzz_show(c->out.data, c->out.len));

    cJSON_Delete(tree);
}


/* pointers */

typedef struct {
    char    *data;
    size_t   len;
    size_t   size;
} fuzz_str_t;


static void
fuzz_str_add(fuzz_str_t *s, const char *p, size_t n)
{
    if (s->len + n + 1 > s->size) {
        s->size = 2 * (s->len + n + 1);
        s->data = realloc(s->data, s->size);
        if (s->data == NULL) {
            abort();
        }
    }

    memcpy(s->data + s->len, p, n);
    s->len += n;
    s->data[s->len] = '\0';
}


/* "/" and the token with "~" as "~0" and "/" as "~1" (RFC 6901) */
static void
fuzz_str_token(fuzz_str_t *s, const char *t, size_t n)
{
    size_t  i;

    fuzz_str_add(s, "/", 1);

    for (i = 0; i < n; i++) {
        if (t[i] == '~') {
            fuzz_str_add(s, "~0", 2);
        } else if (t[i] == '/') {
            fuzz_str_add(s, "~1", 2);
        } else {
            fuzz_str_add(s, &t[i], 1);
        }
    }
}


/* RFC 6901's array-index, below 2^31, decided here on its own */
static int
fuzz_is_index(const char *t, size_t n)
{
    unsigned long long  v;
    size_t              i;

    if (n == 0 || n > 10 || (n > 1 && t[0] == '0')) {
        return 0;
    }

    for (v = 0, i = 0; i < n; i++) {
        if (t[i] < '0' || t[i] > '9') {
            return 0;
        }
        v = v * 10 + (unsigned) (t[i] - '0');
    }

    return v <= 0x7fffffff;
}


/* the first line of the input (at most 256 bytes) as a pointer */
static void
check_pointer_parse(const uint8_t *data, size_t size)
{
    idem_ptr_t       p, q;
    idem_ptr_rc_t    rc;
    fuzz_str_t       back;
    idem_sink_t      sink;
    mem_t            m;
    const uint8_t   *nl;
    size_t           n, i;
    char            *line, num[24];

    nl = memchr(data, '\n', size < 256 ? size : 256);
    n = nl ? (size_t) (nl - data) : (size < 256 ? size : 256);
    line = fuzz_dup(data, n);

    rc = idem_ptr_parse(line, n, &p);
    FUZZ_CHECK(idem_ptr_parse(line, n, &q) == rc, "pointer rc changes");
    idem_ptr_free(&q);

    if (rc != IDEM_PTR_OK) {
        FUZZ_CHECK(rc > IDEM_PTR_OK && rc <= IDEM_PTR_EDEPTH && p.ntokens == 0,
                   "pointer rc %d for \"%s\"", rc, fuzz_show(line, n));
        free(line);
        return;
    }

    memset(&back, 0, sizeof(fuzz_str_t));
    fuzz_str_add(&back, "", 0);

    for (i = 0; i < p.ntokens; i++) {
        fuzz_str_token(&back, p.tokens[i].data, p.tokens[i].len);

        FUZZ_CHECK(idem_utf8_valid(p.tokens[i].data, p.tokens[i].len)
                   && memchr(p.tokens[i].data, '\0', p.tokens[i].len) == NULL,
                   "token %zu of \"%s\" is not UTF-8", i, fuzz_show(line, n));

        /* the literal is what idem_jcs_write_string() writes */
        mem_sink(&m, &sink);
        FUZZ_CHECK(idem_jcs_write_string(&sink, p.tokens[i].data,
                                         p.tokens[i].len) == 0, "write");
        FUZZ_CHECK(m.len == p.tokens[i].canon_len + 2
                   && memcmp(m.data + 1, p.tokens[i].canon,
                             p.tokens[i].canon_len) == 0,
                   "literal of token %zu of \"%s\"", i, fuzz_show(line, n));
        mem_free(&m);

        /* an index is exactly a decimal without a leading zero */
        if (p.tokens[i].index >= 0) {
            snprintf(num, sizeof(num), "%lld", (long long) p.tokens[i].index);
            FUZZ_CHECK(strlen(num) == p.tokens[i].len
                       && memcmp(num, p.tokens[i].data, p.tokens[i].len) == 0,
                       "index %s of token %zu", num, i);
        } else {
            FUZZ_CHECK(!fuzz_is_index(p.tokens[i].data, p.tokens[i].len),
                       "token %zu of \"%s\" is an index", i,
                       fuzz_show(line, n));
        }
    }

    FUZZ_CHECK(back.len == n && memcmp(back.data, line, n) == 0,
               "\"%s\" is written back as \"%s\"", fuzz_show(line, n),
               back.data);

    free(back.data);
    idem_ptr_free(&p);
    free(line);
}


/*
 * A path into v chosen by the input's bytes; it may miss on purpose.  *at
 * (when at is not NULL) is the node it names, or NULL after such a miss.
 */
static void
fuzz_pick_path(const cJSON *v, fuzz_jcs_t *c, size_t *pos, fuzz_str_t *s,
    const cJSON **at)
{
    const cJSON  *ch;
    char          num[24];
    int           n, i;
    uint8_t       b;

    s->len = 0;
    fuzz_str_add(s, "", 0);

    if (at != NULL) {
        *at = v;
    }

    while ((cJSON_IsArray(v) || cJSON_IsObject(v)) && c->size > 0) {
        b = c->data[(*pos)++ % c->size];
        n = cJSON_GetArraySize(v);

        if (n == 0 || (b & 0xc0) == 0xc0) {
            fuzz_str_add(s, (b & 1) ? "/0" : "/nope", (b & 1) ? 2 : 5);

            if (at != NULL) {
                *at = NULL;
            }

            return;
        }

        i = b % n;
        ch = cJSON_GetArrayItem(v, i);

        if (cJSON_IsObject(v)) {
            fuzz_str_token(s, ch->string, strlen(ch->string));
        } else {
            snprintf(num, sizeof(num), "/%d", i);
            fuzz_str_add(s, num, strlen(num));
        }

        if (at != NULL) {
            *at = ch;
        }

        if ((b & 0xc0) == 0x80 || s->len > 4096) {
            return;
        }

        v = ch;
    }
}


#define FUZZ_MAX_PTRS  8

typedef struct {
    idem_ptr_set_t  *set;
    idem_ptr_t       ptrs[FUZZ_MAX_PTRS];
    size_t           n;
} fuzz_excl_t;


static void
fuzz_excl_add(fuzz_excl_t *e, const char *p, size_t len)
{
    if (e->n < FUZZ_MAX_PTRS
        && idem_ptr_set_add(e->set, p, len) == IDEM_PTR_OK)
    {
        FUZZ_CHECK(idem_ptr_parse(p, len, &e->ptrs[e->n]) == IDEM_PTR_OK,
                   "the set took \"%s\", the parser does not", p);
        e->n++;
    }
}


/* the pointers: paths into the tree, the first line, "/a" and "/0" */
static void
fuzz_excl_build(fuzz_excl_t *e, fuzz_jcs_t *c)
{
    fuzz_str_t       s;
    const uint8_t   *nl;
    size_t           pos, i, n;

    memset(e, 0, sizeof(fuzz_excl_t));
    memset(&s, 0, sizeof(fuzz_str_t));
    e->set = idem_ptr_set_create();
    FUZZ_CHECK(e->set != NULL, "no set");

    pos = c->size / 2;

    for (i = 0; c->tree != NULL && i < 4; i++) {
        fuzz_pick_path(c->tree, c, &pos, &s, NULL);
        if (s.len > 0) {
            fuzz_excl_add(e, s.data, s.len);
        }
    }

    nl = memchr(c->data, '\n', c->size < 256 ? c->size : 256);
    n = nl ? (size_t) (nl - c->data) : (c->size < 256 ? c->size : 256);
    fuzz_excl_add(e, c->in, n);
    fuzz_excl_add(e, "/a", 2);
    fuzz_excl_add(e, "/0", 2);

    free(s.data);
}


/* canonicalized without what the set names: as the tree path says */
static void
check_exclude(fuzz_jcs_t *c)
{
    fuzz_excl_t     e;
    mem_t           out, out2, want;
    idem_sink_t     sink;
    idem_jcs_rc_t   rc, rc2;
    cJSON          *tree;
    char           *copy;
    size_t          i;

    fuzz_excl_build(&e, c);

    mem_sink(&out, &sink);
    rc = idem_jcs_canonicalize_excluding(c->in, c->size, e.set, &sink);

    mem_sink(&out2, &sink);
    copy = fuzz_dup(c->data, c->size);
    rc2 = idem_jcs_canonicalize_in_place_excluding(copy, c->size, e.set,
                                                   &sink);
    free(copy);

    FUZZ_CHECK(rc == c->rc && rc2 == c->rc,
               "rc %d, excluding %d, in place %d for \"%s\"", c->rc, rc, rc2,
               fuzz_show(c->in, c->size));

    if (rc == IDEM_JCS_OK) {
        FUZZ_CHECK(mem_same(&out, &out2), "excluding in place differs");
        FUZZ_CHECK(out.len <= c->out.len, "excluding made it longer");

        tree = cJSON_Duplicate(c->tree, 1);
        FUZZ_CHECK(tree != NULL, "cJSON_Duplicate");
        jcs_tree_exclude(tree, e.ptrs, e.n);

        mem_sink(&want, &sink);
        FUZZ_CHECK(jcs_tree_write(tree, &sink) == IDEM_JCS_OK
                   && mem_same(&out, &want),
                   "excluding: \"%s\", the tree path: \"%s\"",
                   fuzz_show(out.data, out.len),
                   want.data ? want.data : "");

        mem_free(&want);
        cJSON_Delete(tree);
    }

    for (i = 0; i < e.n; i++) {
        idem_ptr_free(&e.ptrs[i]);
    }

    idem_ptr_set_free(e.set);
    mem_free(&out);
    mem_free(&out2);
}


/*
 * idempotency_json_var: the body parsed by cJSON as the module parses it
 * is the input's value, and a pointer (a path into the input's tree
 * chosen by its bytes, or one that misses) names in it, by
 * idem_json_pointer, what it names in the tree of the core's parser: the
 * very node the path was built to, equal values, or nothing in both.
 */
static void
check_json_pointer(fuzz_jcs_t *c)
{
    int            i;
    cJSON         *root;
    size_t         pos;
    fuzz_str_t     s;
    const cJSON   *at, *a, *b;

    root = cJSON_ParseWithLength(c->in, c->size);

    FUZZ_CHECK(root != NULL && fuzz_equal(root, c->tree),
               "cJSON reads canonical JSON otherwise (or not): \"%s\"",
               fuzz_show(c->in, c->size));

    memset(&s, 0, sizeof(fuzz_str_t));
    pos = c->size / 3;

    for (i = 0; i < 4; i++) {
        fuzz_pick_path(c->tree, c, &pos, &s, &at);

        a = idem_json_pointer(root, s.data, s.len);
        b = idem_json_pointer(c->tree, s.data, s.len);

        FUZZ_CHECK(at == NULL || b == at,
                   "the pointer \"%s\" misses the node it was built to",
                   fuzz_show(s.data, s.len));
        FUZZ_CHECK((a == NULL) == (b == NULL)
                   && (a == NULL || fuzz_equal(a, b)),
                   "the pointer \"%s\" names other values in the two trees",
                   fuzz_show(s.data, s.len));
    }

    free(s.data);
    cJSON_Delete(root);
}


int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fuzz_jcs_t  c;

    fuzz_number(data, size);

    c.data = data;
    c.size = size;
    c.in = fuzz_dup(data, size);
    c.tree = NULL;
    mem_sink(&c.out, &c.sink);

    c.rc = idem_jcs_canonicalize(c.in, size, &c.sink);

    check_pointer_parse(data, size);
    check_deterministic(&c);
    check_in_place(&c);
    check_rc(&c);
    check_tree_parse(&c);
    check_exclude(&c);

    if (c.rc == IDEM_JCS_OK) {
        check_output(&c);
        check_tree_write(&c);
        check_fixed_point(&c);
        check_same_value(&c);
        check_json_pointer(&c);
    }

    cJSON_Delete(c.tree);
    mem_free(&c.out);
    free(c.in);

    return 0;
}
