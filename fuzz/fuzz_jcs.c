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


int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char           *in, *copy;
    cJSON          *tree, *tree2;
    mem_t           o1, o2, o3, o4, o5;
    idem_sink_t     s1, s2, s3, s4, s5;
    idem_jcs_rc_t   rc1, rc2, rc3, rcp;

    fuzz_number(data, size);

    in = fuzz_dup(data, size);

    mem_sink(&o1, &s1);
    mem_sink(&o2, &s2);
    mem_sink(&o3, &s3);
    mem_sink(&o4, &s4);
    mem_sink(&o5, &s5);

    rc1 = idem_jcs_canonicalize(in, size, &s1);
    rc2 = idem_jcs_canonicalize(in, size, &s2);

    FUZZ_CHECK(rc1 == rc2, "rc %d then %d for \"%s\"", rc1, rc2,
               fuzz_show(in, size));

    /* over a copy of itself: the same rc and bytes */
    copy = fuzz_dup(data, size);
    rc3 = idem_jcs_canonicalize_in_place(copy, size, &s5);
    free(copy);
    FUZZ_CHECK(rc1 == rc3, "rc %d, in place %d for \"%s\"", rc1, rc3,
               fuzz_show(in, size));
    FUZZ_CHECK(rc1 != IDEM_JCS_OK || mem_same(&o1, &o5),
               "in place differs for \"%s\"", fuzz_show(in, size));
    FUZZ_CHECK(rc1 >= IDEM_JCS_OK && rc1 <= IDEM_JCS_EDEPTH,
               "unexpected rc %d (%s) for \"%s\"", rc1,
               idem_jcs_strerror(rc1), fuzz_show(in, size));

    tree = NULL;
    rcp = jcs_tree_parse(in, size, &tree);
    FUZZ_CHECK(rcp == rc1,
               "jcs_tree_parse says %s, canonicalize %s for \"%s\"",
               idem_jcs_strerror(rcp), idem_jcs_strerror(rc1),
               fuzz_show(in, size));

    if (rc1 != IDEM_JCS_OK) {
        FUZZ_CHECK(rcp != IDEM_JCS_OK || tree != NULL, "rc OK without a tree");
        goto done;
    }

    FUZZ_CHECK(mem_same(&o1, &o2), "two canonical forms of \"%s\"",
               fuzz_show(in, size));
    FUZZ_CHECK(tree != NULL, "parse OK without a tree");
    FUZZ_CHECK(o1.len > 0, "empty canonical form");
    FUZZ_CHECK(idem_utf8_valid(o1.data, o1.len),
               "canonical form is not UTF-8: \"%s\"", fuzz_show(o1.data, o1.len));
    FUZZ_CHECK(fuzz_depth(tree) <= IDEM_JCS_MAX_DEPTH, "accepted depth %d",
               fuzz_depth(tree));

    /* writing the parsed tree gives the same bytes */
    rc3 = jcs_tree_write(tree, &s4);
    FUZZ_CHECK(rc3 == IDEM_JCS_OK && mem_same(&o1, &o4),
               "write_value(parse(x)) differs from canonicalize(x) (rc %d)",
               rc3);

    /* fixed point */
    rc3 = idem_jcs_canonicalize(o1.data, o1.len, &s3);
    FUZZ_CHECK(rc3 == IDEM_JCS_OK, "canonical form rejected (%s): \"%s\"",
               idem_jcs_strerror(rc3), fuzz_show(o1.data, o1.len));
    FUZZ_CHECK(mem_same(&o1, &o3), "canonical form is not a fixed point: \"%s\"",
               fuzz_show(o1.data, o1.len));

    /* the canonical form denotes the same value */
    tree2 = NULL;
    rcp = jcs_tree_parse(o1.data, o1.len, &tree2);
    FUZZ_CHECK(rcp == IDEM_JCS_OK && tree2 != NULL, "canonical form does not parse");
    FUZZ_CHECK(fuzz_equal(tree, tree2),
               "canonical form \"%s\" is not the input's value",
               fuzz_show(o1.data, o1.len));
    cJSON_Delete(tree2);

done:

    cJSON_Delete(tree);
    mem_free(&o1);
    mem_free(&o2);
    mem_free(&o3);
    mem_free(&o4);
    mem_free(&o5);
    free(in);

    return 0;
}
