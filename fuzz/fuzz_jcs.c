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
 * And for the first 8 bytes read as a double: a finite value is written
 * by idem_jcs_format_number as text that strtod reads back to the same
 * double (-0 as 0) and that is its own canonical form.
 */

#include <math.h>

#include <cjson/cJSON.h>

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

    check_deterministic(&c);
    check_in_place(&c);
    check_rc(&c);
    check_tree_parse(&c);

    if (c.rc == IDEM_JCS_OK) {
        check_output(&c);
        check_tree_write(&c);
        check_fixed_point(&c);
        check_same_value(&c);
    }

    cJSON_Delete(c.tree);
    mem_free(&c.out);
    free(c.in);

    return 0;
}
