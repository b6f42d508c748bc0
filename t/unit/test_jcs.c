/*
 * RFC 8785 canonicalization: the upstream vectors (argv[1] is t/data/jcs),
 * every line of the number files, and the rejections the fingerprint
 * relies on (docs/fingerprint.md section 3).
 */

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <float.h>

#include <cjson/cJSON.h>

#include "idem_jcs.h"
#include "jcs_tree.h"
#include "tap.h"
#include "mem_sink.h"




/* canonical form of in[0..len) into a fresh string (free it), or NULL */
static char *
canon_n(const char *in, size_t len, idem_jcs_rc_t *rc, size_t *out_len)
{
    mem_t        m;
    idem_sink_t  sink;

    mem_sink(&m, &sink);

    *rc = idem_jcs_canonicalize(in, len, &sink);

    if (*rc != IDEM_JCS_OK) {
        free(m.data);
        return NULL;
    }

    if (m.data == NULL) {
        m.data = calloc(1, 1);
    }

    if (out_len != NULL) {
        *out_len = m.len;
    }

    return m.data;
}


static void
is_canon(const char *in, const char *expected, const char *name)
{
    idem_jcs_rc_t   rc;
    char           *out;

    out = canon_n(in, strlen(in), &rc, NULL);
    is_str(out, expected, "%s", name);

    if (out == NULL) {
        diag("  rc: %s", idem_jcs_strerror(rc));
    }

    free(out);
}


static void
is_rc(const char *in, size_t len, idem_jcs_rc_t expected, const char *name)
{
    idem_jcs_rc_t   rc;
    char           *out;

    out = canon_n(in, len, &rc, NULL);
    free(out);

    if (!ok(rc == expected, "%s -> %s", name, idem_jcs_strerror(expected))) {
        diag("  got: %s", idem_jcs_strerror(rc));
    }
}

#define IS_RC(lit, expected, name)  is_rc(lit, sizeof(lit) - 1, expected, name)


static char *
read_file(const char *path, size_t *len)
{
    FILE    *f;
    char    *buf;
    long     n;

    f = fopen(path, "rb");
    if (f == NULL) {
        return NULL;
    }

    fseek(f, 0, SEEK_END);
    n = ftell(f);
    fseek(f, 0, SEEK_SET);

    buf = malloc(n + 1);
    if (buf != NULL && fread(buf, 1, n, f) != (size_t) n) {
        free(buf);
        buf = NULL;
    }

    fclose(f);

    if (buf != NULL) {
        buf[n] = '\0';
        *len = n;
    }

    return buf;
}


static void
test_vectors(const char *dir)
{
    static const char  *names[] = {
        "arrays", "french", "structures", "unicode", "values", "weird"
    };

    char            path[1024];
    char           *in, *expected, *out;
    size_t          in_len, exp_len, out_len;
    idem_jcs_rc_t   rc;
    size_t          i;

    for (i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
        snprintf(path, sizeof(path), "%s/input/%s.json", dir, names[i]);
        in = read_file(path, &in_len);

        snprintf(path, sizeof(path), "%s/output/%s.json", dir, names[i]);
        expected = read_file(path, &exp_len);

        if (in == NULL || expected == NULL) {
            ok(0, "vector %s: cannot read %s", names[i], path);
            free(in);
            free(expected);
            continue;
        }

        out = canon_n(in, in_len, &rc, &out_len);

        if (!ok(out != NULL && out_len == exp_len
                && memcmp(out, expected, exp_len) == 0,
                "vector %s: byte-exact canonical form", names[i]))
        {
            diag("  rc: %s", idem_jcs_strerror(rc));
            diag("  got:      %s", out ? out : "(null)");
            diag("  expected: %s", expected);
        }

        free(in);
        free(expected);
        free(out);
    }
}


/* one TAP line per file: formatting, then reading the text back */
static void
test_number_file(const char *dir, const char *file)
{
    char            path[1024], line[128], buf[IDEM_JCS_NUMBER_MAX];
    char           *comma, *nl;
    FILE           *f;
    uint64_t        bits, back_bits;
    double          d;
    cJSON          *tree;
    idem_jcs_rc_t   rc;
    long            lines, fails, read_fails;

    snprintf(path, sizeof(path), "%s/%s", dir, file);
    f = fopen(path, "r");

    if (f == NULL) {
        ok(0, "%s: cannot open %s", file, path);
        ok(0, "%s: parser reads expected strings back", file);
        return;
    }

    lines = 0;
    fails = 0;
    read_fails = 0;

    while (fgets(line, sizeof(line), f) != NULL) {
        nl = strchr(line, '\n');
        if (nl != NULL) {
            *nl = '\0';
        }

        comma = strchr(line, ',');
        if (comma == NULL) {
            continue;
        }

        *comma++ = '\0';
        lines++;

        bits = strtoull(line, NULL, 16);
        memcpy(&d, &bits, sizeof(d));

        idem_jcs_format_number(d, buf);

        if (strcmp(buf, comma) != 0 && ++fails <= 5) {
            diag("%s: %s: got %s, expected %s", file, line, buf, comma);
        }

        /* our parser must read the expected text back to the same bits */
        rc = jcs_tree_parse(comma, strlen(comma), &tree);

        if (rc == IDEM_JCS_OK) {
            memcpy(&back_bits, &tree->valuedouble, sizeof(back_bits));
            cJSON_Delete(tree);
        }

        if ((rc != IDEM_JCS_OK
             || (back_bits != bits && bits != 0x8000000000000000ULL))
            && ++read_fails <= 5)
        {
            diag("%s: %s: '%s' does not parse back", file, line, comma);
        }
    }

    fclose(f);

    ok(lines > 0 && fails == 0, "%s: %ld lines, %ld formatting failures",
       file, lines, fails);
    ok(lines > 0 && read_fails == 0,
       "%s: %ld lines, %ld parse-back failures", file, lines, read_fails);
}


static void
test_numbers(void)
{
    char    buf[IDEM_JCS_NUMBER_MAX];
    double  zero;

    zero = 0.0;

    is_int(idem_jcs_format_number(zero / zero, buf), 0, "NaN not formatted");
    is_int(idem_jcs_format_number(1 / zero, buf), 0, "+Inf not formatted");
    is_int(idem_jcs_format_number(-1 / zero, buf), 0, "-Inf not formatted");

    idem_jcs_format_number(-0.0, buf);
    is_str(buf, "0", "-0 formats as 0");

    idem_jcs_format_number(1e21, buf);
    is_str(buf, "1e+21", "1e21 in exponent form");

    idem_jcs_format_number(1e20, buf);
    is_str(buf, "100000000000000000000", "1e20 in full");

    idem_jcs_format_number(1.5e-7, buf);
    is_str(buf, "1.5e-7", "1.5e-7");

    idem_jcs_format_number(0.000001, buf);
    is_str(buf, "0.000001", "1e-6 in fixed form");

    idem_jcs_format_number(-1.5, buf);
    is_str(buf, "-1.5", "-1.5");

    idem_jcs_format_number(9007199254740991.0, buf);
    is_str(buf, "9007199254740991", "2^53 - 1 (integer fast path)");

    idem_jcs_format_number(-DBL_MAX, buf);
    is_str(buf, "-1.7976931348623157e+308", "-DBL_MAX");
}


static void
test_numbers_in_json(void)
{
    char  buf[200];

    is_canon("-0", "0", "-0 -> 0");
    is_canon("[-0.0,0e10,-0E-3]", "[0,0,0]", "negative zeros in an array");
    is_canon("[1E30,4.50,56.0,1e-7,0.1]", "[1e+30,4.5,56,1e-7,0.1]",
             "number spellings");
    is_canon("1e-400", "0", "underflow reads as 0, like JSON.parse");

    /* long valid numbers: upstream cJSON copies only 63 characters */
    strcpy(buf, "0.");
    memset(buf + 2, '0', 68);
    strcpy(buf + 70, "1");
    is_canon(buf, "1e-69", "0.(68 zeros)1, 71 characters");

    memset(buf, '1', 70);
    buf[70] = '\0';
    is_canon(buf, "1.1111111111111112e+69", "70-digit integer");

    strcpy(buf, "[1.");
    memset(buf + 3, '0', 70);
    strcpy(buf + 73, "1]");
    is_canon(buf, "[1]", "1.(70 zeros)1 rounds to 1");

    strcpy(buf, "-");
    memset(buf + 1, '9', 100);
    strcpy(buf + 101, "e-100");
    is_canon(buf, "-1", "100 nines e-100");

    IS_RC("1e400", IDEM_JCS_ENUMBER, "1e400");
    IS_RC("[-1e400]", IDEM_JCS_ENUMBER, "-1e400");
    IS_RC("1e99999999999999999999", IDEM_JCS_ENUMBER, "huge exponent");
    IS_RC("01", IDEM_JCS_ESYNTAX, "leading zero");
    IS_RC("-01", IDEM_JCS_ESYNTAX, "negative leading zero");
    IS_RC("[00]", IDEM_JCS_ESYNTAX, "double zero");
    IS_RC("1.", IDEM_JCS_ESYNTAX, "no fraction digits");
    IS_RC(".5", IDEM_JCS_ESYNTAX, "no integer digits");
    IS_RC("+1", IDEM_JCS_ESYNTAX, "plus sign");
    IS_RC("1e", IDEM_JCS_ESYNTAX, "no exponent digits");
    IS_RC("1e+", IDEM_JCS_ESYNTAX, "no exponent digits after sign");
    IS_RC("-", IDEM_JCS_ESYNTAX, "lone minus");
    IS_RC("0x10", IDEM_JCS_ESYNTAX, "hex");
    IS_RC("NaN", IDEM_JCS_ESYNTAX, "NaN");
    IS_RC("Infinity", IDEM_JCS_ESYNTAX, "Infinity");
}


static void
test_strings(void)
{
    is_canon("\"\\u001f\\u0001\\b\\f\\n\\r\\t\\\"\\\\\"",
             "\"\\u001f\\u0001\\b\\f\\n\\r\\t\\\"\\\\\"",
             "control characters and short escapes");
    is_canon("\"\\/\\u2028\\u007f\\u00e9\"", "\"/\xe2\x80\xa8\x7f\xc3\xa9\"",
             "'/', U+2028, DEL, e-acute are not escaped");
    is_canon("\"\\uD83D\\uDE00\"", "\"\xf0\x9f\x98\x80\"",
             "surrogate pair decoded");
    is_canon("\"\\u00E9\"", "\"\xc3\xa9\"", "uppercase hex escape");

    IS_RC("\"\\u0000\"", IDEM_JCS_ENUL, "\\u0000");
    IS_RC("{\"a\\u0000b\":1}", IDEM_JCS_ENUL, "\\u0000 in a name");
    IS_RC("\"\\uD800\"", IDEM_JCS_ESURROGATE, "lone high surrogate");
    IS_RC("\"\\uDC00\"", IDEM_JCS_ESURROGATE, "lone low surrogate");
    IS_RC("\"\\uD800\\u0041\"", IDEM_JCS_ESURROGATE, "high + non-low");
    IS_RC("\"\\uDC00\\uD800\"", IDEM_JCS_ESURROGATE, "low before high");
    IS_RC("\"\\uD800\\uD800\"", IDEM_JCS_ESURROGATE, "two highs");
    IS_RC("\"\\uD800x\"", IDEM_JCS_ESURROGATE, "high + plain char");
    IS_RC("\"\x01\"", IDEM_JCS_ESYNTAX, "raw control character");
    IS_RC("\"a\0b\"", IDEM_JCS_ESYNTAX, "raw NUL byte");
    IS_RC("\"\\x\"", IDEM_JCS_ESYNTAX, "unknown escape");
    IS_RC("\"\\u12\"", IDEM_JCS_ESYNTAX, "short \\u escape");
    IS_RC("\"\\u12G4\"", IDEM_JCS_ESYNTAX, "bad hex digit");
    IS_RC("\"abc", IDEM_JCS_ESYNTAX, "unterminated string");
    IS_RC("'a'", IDEM_JCS_ESYNTAX, "single quotes");

    IS_RC("\"\xc0\x80\"", IDEM_JCS_EUTF8, "overlong NUL");
    IS_RC("\"\xe0\x80\xaf\"", IDEM_JCS_EUTF8, "overlong 3-byte");
    IS_RC("\"\xf0\x80\x80\xaf\"", IDEM_JCS_EUTF8, "overlong 4-byte");
    IS_RC("\"\xed\xa0\x80\"", IDEM_JCS_EUTF8, "UTF-8 encoded surrogate");
    IS_RC("\"\xf4\x90\x80\x80\"", IDEM_JCS_EUTF8, "above U+10FFFF");
    IS_RC("\"\xf5\x80\x80\x80\"", IDEM_JCS_EUTF8, "F5 lead byte");
    IS_RC("\"\x80\"", IDEM_JCS_EUTF8, "lone continuation byte");
    IS_RC("\"\xe2\x82\"", IDEM_JCS_EUTF8, "truncated sequence");
    IS_RC("\"\xff\"", IDEM_JCS_EUTF8, "FF byte");
    IS_RC("{\"\xc3\":1}", IDEM_JCS_EUTF8, "invalid UTF-8 in a name");
    IS_RC("[1,\xff]", IDEM_JCS_EUTF8, "invalid UTF-8 outside strings");
    IS_RC("\xef\xbb\xbf{}", IDEM_JCS_ESYNTAX, "byte order mark");
    is_canon("\"\xf4\x8f\xbf\xbf\"", "\"\xf4\x8f\xbf\xbf\"", "U+10FFFF ok");

    ok(idem_utf8_valid("a\0b\xc3\xa9", 5), "utf8_valid: NUL and e-acute");
    ok(!idem_utf8_valid("\xc3", 1), "utf8_valid: truncated");
    ok(!idem_utf8_valid("\xed\xbf\xbf", 3), "utf8_valid: surrogate");
    ok(idem_utf8_valid("", 0), "utf8_valid: empty");
}


/* sign of idem_utf16_cmp(a, b), for NUL-free literals */
static int
utf16_sign(const char *a, const char *b, int escaped)
{
    int  rc;

    rc = idem_utf16_cmp(a, strlen(a), b, strlen(b), escaped);

    return (rc > 0) - (rc < 0);
}


/*
 * The one UTF-16 comparison, on UTF-8 and on canonical literals: where
 * byte order and UTF-16 order part (a supplementary character against
 * U+E000..U+FFFF; an escape against a plain character), and where not.
 */
static void
test_utf16_order(void)
{
    ok(utf16_sign("a", "b", 0) < 0 && utf16_sign("", "a", 0) < 0
       && utf16_sign("ab", "a", 0) > 0 && utf16_sign("ab", "ab", 0) == 0,
       "utf16_cmp: ASCII, prefixes, equal");
    ok(utf16_sign("\xf0\x9f\x98\x80", "\xee\x80\x80", 0) < 0
       && utf16_sign("\xef\xbf\xbf", "\xf0\x90\x80\x80", 0) > 0,
       "utf16_cmp: U+1F600 < U+E000, U+FFFF > U+10000");
    ok(utf16_sign("\xed\x9f\xbf", "\xf0\x90\x80\x80", 0) < 0
       && utf16_sign("\xc3\xa9", "\xee\x80\x80", 0) < 0
       && utf16_sign("\xf0\x9f\x98\x80", "\xf0\x9f\x98\x81", 0) < 0,
       "utf16_cmp: U+D7FF and U+00E9 before U+10000; U+1F600 < U+1F601");

    ok(utf16_sign("\\n", " ", 1) < 0 && utf16_sign("\\\"", "A", 1) < 0
       && utf16_sign("\\\\", "]", 1) < 0,
       "utf16_cmp escaped: \\n < ' ', \\\" < A, \\\\ < ] unlike their bytes");
    ok(utf16_sign("\\u001f", "\\u0010", 1) > 0
       && utf16_sign("\\u001f", " ", 1) < 0
       && utf16_sign("a\\u0001", "a\\n", 1) < 0
       && utf16_sign("\\\\", "\\\"", 1) > 0,
       "utf16_cmp escaped: escapes against escapes and spaces");
    ok(utf16_sign("\\t", "\xc3\xa9", 1) < 0
       && utf16_sign("x\xf0\x9f\x98\x80", "x\xee\x80\x80", 1) < 0
       && utf16_sign("a\\nb", "a\\nb", 1) == 0
       && utf16_sign("a\\n", "a\\nb", 1) < 0,
       "utf16_cmp escaped: UTF-8 characters, equal, prefix");
}


static void
test_structure(void)
{
    is_canon(" \t\r\n{ \"b\" : [ 1 , 2 ] , \"a\" : { } } \n",
             "{\"a\":{},\"b\":[1,2]}", "whitespace removed, members sorted");
    is_canon("[3,1,2]", "[3,1,2]", "array order kept");
    is_canon("[true,false,null,\"\",[],{}]",
             "[true,false,null,\"\",[],{}]", "literals and empties");
    is_canon("{\"b\":{\"d\":1,\"c\":2},\"a\":[{\"z\":1,\"y\":2}]}",
             "{\"a\":[{\"y\":2,\"z\":1}],\"b\":{\"c\":2,\"d\":1}}",
             "nested objects sorted");

    /* U+1F600 is D83D DE00 in UTF-16 and sorts before U+E000 */
    is_canon("{\"\\uE000\":1,\"\\uD83D\\uDE00\":2}",
             "{\"\xf0\x9f\x98\x80\":2,\"\xee\x80\x80\":1}",
             "UTF-16 order: U+1F600 before U+E000");
    is_canon("{\"\xee\x80\x80\":1,\"\xf0\x9f\x98\x80\":2,\"\xef\xbf\xbd\":3,"
             "\"\xed\x9f\xbf\":4}",
             "{\"\xed\x9f\xbf\":4,\"\xf0\x9f\x98\x80\":2,\"\xee\x80\x80\":1,"
             "\"\xef\xbf\xbd\":3}",
             "UTF-16 order with raw UTF-8 names");
    is_canon("{\"ab\":1,\"a\":2,\"\":3}", "{\"\":3,\"a\":2,\"ab\":1}",
             "prefixes sort first");
    is_canon("{\"B\":1,\"a\":2,\"A\":3}", "{\"A\":3,\"B\":1,\"a\":2}",
             "upper case before lower case");

    IS_RC("{\"a\":1,\"a\":2}", IDEM_JCS_EDUP, "duplicate names");
    IS_RC("{\"a\":1,\"b\":2,\"\\u0061\":3}", IDEM_JCS_EDUP,
          "duplicate through an escape");
    IS_RC("[{\"x\":{\"b\":1,\"b\":1}}]", IDEM_JCS_EDUP, "nested duplicate");
    is_canon("[{\"a\":1},{\"a\":2}]", "[{\"a\":1},{\"a\":2}]",
             "same name in sibling objects is fine");

    IS_RC("[1,]", IDEM_JCS_ESYNTAX, "trailing comma in array");
    IS_RC("{\"a\":1,}", IDEM_JCS_ESYNTAX, "trailing comma in object");
    IS_RC("[,1]", IDEM_JCS_ESYNTAX, "leading comma");
    IS_RC("[1 2]", IDEM_JCS_ESYNTAX, "missing comma");
    IS_RC("{\"a\" 1}", IDEM_JCS_ESYNTAX, "missing colon");
    IS_RC("{a:1}", IDEM_JCS_ESYNTAX, "unquoted name");
    IS_RC("{1:1}", IDEM_JCS_ESYNTAX, "number as a name");
    IS_RC("[1}", IDEM_JCS_ESYNTAX, "mismatched close");
    IS_RC("[1", IDEM_JCS_ESYNTAX, "unclosed array");
    IS_RC("{\"a\":", IDEM_JCS_ESYNTAX, "missing value");
    IS_RC("tru", IDEM_JCS_ESYNTAX, "short literal");
    IS_RC("True", IDEM_JCS_ESYNTAX, "capitalized literal");
    IS_RC("nulls", IDEM_JCS_ESYNTAX, "literal with garbage");
    IS_RC("1 x", IDEM_JCS_ESYNTAX, "trailing garbage");
    IS_RC("{} {}", IDEM_JCS_ESYNTAX, "two values");
    IS_RC("[1]]", IDEM_JCS_ESYNTAX, "extra close");
    IS_RC("\"a\"\0", IDEM_JCS_ESYNTAX, "trailing NUL byte");
    IS_RC("", IDEM_JCS_ESYNTAX, "empty input");
    IS_RC(" \n", IDEM_JCS_ESYNTAX, "whitespace only");
    IS_RC("\f1", IDEM_JCS_ESYNTAX, "form feed is not whitespace");
    IS_RC("[1,\v2]", IDEM_JCS_ESYNTAX, "vertical tab is not whitespace");
}


/* depth levels of open, then close; mixes arrays and objects */
static char *
nest(int depth, int objects, size_t *len)
{
    char    *s, *p;
    int      i;

    s = malloc((size_t) depth * 6 + 8);
    p = s;

    for (i = 0; i < depth; i++) {
        if (objects && i % 2) {
            memcpy(p, "{\"k\":", 5);
            p += 5;
        } else {
            *p++ = '[';
        }
    }

    *p++ = '1';

    for (i = depth - 1; i >= 0; i--) {
        *p++ = (objects && i % 2) ? '}' : ']';
    }

    *p = '\0';
    *len = p - s;

    return s;
}


static void
test_depth(void)
{
    idem_jcs_rc_t   rc;
    clock_t         t0;
    double          secs;
    size_t          len;
    char           *s, *out;

    s = nest(IDEM_JCS_MAX_DEPTH, 0, &len);
    out = canon_n(s, len, &rc, NULL);
    ok(out != NULL && strcmp(out, s) == 0, "depth 128 of arrays accepted");
    free(out);
    free(s);

    s = nest(IDEM_JCS_MAX_DEPTH, 1, &len);
    out = canon_n(s, len, &rc, NULL);
    ok(out != NULL && strcmp(out, s) == 0, "depth 128 arrays+objects ok");
    free(out);
    free(s);

    s = nest(IDEM_JCS_MAX_DEPTH + 1, 0, &len);
    is_rc(s, len, IDEM_JCS_EDEPTH, "depth 129 of arrays");
    free(s);

    s = nest(IDEM_JCS_MAX_DEPTH + 1, 1, &len);
    is_rc(s, len, IDEM_JCS_EDEPTH, "depth 129 arrays+objects");
    free(s);

    /* 100000 opening brackets: iterative, rejected at 129 */
    s = malloc(100000);
    memset(s, '[', 100000);
    t0 = clock();
    rc = jcs_tree_parse(s, 100000, NULL);
    secs = (double) (clock() - t0) / CLOCKS_PER_SEC;
    ok(rc == IDEM_JCS_EDEPTH && secs < 0.5,
       "100000-deep nesting rejected with EDEPTH in %.3fs", secs);
    free(s);
}


/* 200k members given in reverse order: qsort, not quadratic */
static void
test_many_members(void)
{
    idem_jcs_rc_t   rc;
    clock_t         t0;
    double          secs;
    size_t          n, i, len, out_len;
    char           *in, *expected, *p, *out;

    n = 200000;
    in = malloc(n * 24 + 4);
    expected = malloc(n * 24 + 4);

    p = in;
    *p++ = '{';
    for (i = 0; i < n; i++) {
        p += sprintf(p, "%s\"k%06zu\":%zu", i ? "," : "", n - 1 - i,
                     n - 1 - i);
    }
    *p++ = '}';
    len = p - in;

    p = expected;
    *p++ = '{';
    for (i = 0; i < n; i++) {
        p += sprintf(p, "%s\"k%06zu\":%zu", i ? "," : "", i, i);
    }
    *p++ = '}';
    *p = '\0';

    t0 = clock();
    out = canon_n(in, len, &rc, &out_len);
    secs = (double) (clock() - t0) / CLOCKS_PER_SEC;

    ok(out != NULL && strcmp(out, expected) == 0,
       "200000 members sorted (%.3fs)", secs);

    free(out);

    /* the same members plus a duplicate at the far end */
    memcpy(in + len - 1, ",\"k000000\":7}", 13);
    is_rc(in, len + 12, IDEM_JCS_EDUP, "200001 members, one duplicate");

    free(in);
    free(expected);
}


/* the tree of the test support, from our parser: already canonical */
static void
test_tree_parsed(void)
{
    mem_t           m;
    idem_sink_t     sink;
    cJSON          *tree;
    idem_jcs_rc_t   rc;

    mem_sink(&m, &sink);

    rc = jcs_tree_parse("{\"b\":1,\"a\":[2]}", 15, &tree);
    ok(rc == IDEM_JCS_OK && tree != NULL
       && strcmp(tree->child->string, "a") == 0
       && strcmp(tree->child->next->string, "b") == 0
       && tree->child->prev == tree->child->next,
       "jcs_tree_parse returns members in canonical order");

    rc = jcs_tree_write(tree, &sink);
    is_str(rc == IDEM_JCS_OK ? m.data : NULL, "{\"a\":[2],\"b\":1}",
           "jcs_tree_write of the parsed tree");
    cJSON_Delete(tree);

    mem_free(&m);
}


/* a tree built by hand: unsorted, then bad contents */
static void
test_tree_foreign(void)
{
    mem_t         m;
    idem_sink_t   sink;
    cJSON        *obj, *tree;
    double        zero;
    int           i;

    mem_sink(&m, &sink);

    obj = cJSON_CreateObject();
    cJSON_AddNumberToObject(obj, "z", 0.1);
    cJSON_AddStringToObject(obj, "y", "\xe2\x82\xac");
    cJSON_AddNullToObject(obj, "x");

    is_str(jcs_tree_write(obj, &sink) == IDEM_JCS_OK ? m.data : NULL,
           "{\"x\":null,\"y\":\"\xe2\x82\xac\",\"z\":0.1}",
           "foreign unsorted tree is written sorted");

    cJSON_AddTrueToObject(obj, "x");
    is_int(jcs_tree_write(obj, &sink), IDEM_JCS_EDUP,
           "foreign tree with duplicate names -> EDUP");
    cJSON_Delete(obj);

    zero = 0.0;
    obj = cJSON_CreateNumber(1 / zero);
    is_int(jcs_tree_write(obj, &sink), IDEM_JCS_ENUMBER,
           "infinite number -> ENUMBER");
    cJSON_Delete(obj);

    obj = cJSON_CreateString("\xc3(");
    is_int(jcs_tree_write(obj, &sink), IDEM_JCS_EUTF8,
           "invalid UTF-8 string -> EUTF8");
    cJSON_Delete(obj);

    obj = cJSON_CreateArray();
    tree = obj;
    for (i = 0; i < IDEM_JCS_MAX_DEPTH; i++) {
        cJSON_AddItemToArray(tree, cJSON_CreateArray());
        tree = tree->child;
    }
    is_int(jcs_tree_write(obj, &sink), IDEM_JCS_EDEPTH,
           "foreign tree deeper than 128 -> EDEPTH");
    cJSON_Delete(obj);

    mem_free(&m);
}


static void
test_sink_failure(void)
{
    mem_t         m;
    idem_sink_t   sink;

    /* the text goes out in one write when in order... */
    mem_sink(&m, &sink);
    m.fail_after = 1;
    is_int(idem_jcs_canonicalize("{\"a\":[1,2,3]}", 13, &sink),
           IDEM_JCS_ESINK, "sink failure -> ESINK");

    /* ...and member by member when the root object was out of order */
    m.fail_after = 3;
    is_int(idem_jcs_canonicalize("{\"b\":1,\"a\":[2]}", 15, &sink),
           IDEM_JCS_ESINK, "sink failure on a reordered root -> ESINK");

    mem_free(&m);
}


static void
test_strerror(void)
{
    int  i;

    for (i = IDEM_JCS_OK; i <= IDEM_JCS_ESINK; i++) {
        if (strcmp(idem_jcs_strerror(i), "unknown error") == 0) {
            break;
        }
    }
    ok(i == IDEM_JCS_ESINK + 1, "every rc has a message");
}


/*
 * The direct writer (idem_jcs_canonicalize) against the tree path
 * (jcs_tree_parse + jcs_tree_write) on generated input: the same
 * rc and the same bytes.  The generator leans on what the direct writer
 * does differently: numbers copied without strtod(), names compared as
 * canonical literals, objects reordered in place, the root written out
 * member by member.
 */

static uint64_t  gen_state = 0x9e3779b97f4a7c15ull;


static unsigned
gen_rand(unsigned n)
{
    gen_state ^= gen_state << 13;
    gen_state ^= gen_state >> 7;
    gen_state ^= gen_state << 17;

    return (unsigned) (gen_state % n);
}


static void
gen_add(mem_t *m, const char *s)
{
    idem_sink_t  sink;

    sink.write = mem_write;
    sink.data = m;              /* appends: m is not reset */
    (void) mem_write(&sink, s, strlen(s));
}


static void
gen_digits(mem_t *m, unsigned n, int lead_nonzero)
{
    char  d[2] = "0";

    while (n--) {
        /* zeros are frequent: trailing and leading zeros matter */
        d[0] = (char) ('0' + (gen_rand(3) == 0 ? 0 : gen_rand(10)));
        if (lead_nonzero && d[0] == '0') {
            d[0] = (char) ('1' + gen_rand(9));
        }
        lead_nonzero = 0;
        gen_add(m, d);
    }
}


static void
gen_number(mem_t *m)
{
    char  e[8];

    if (gen_rand(2)) {
        gen_add(m, "-");
    }

    if (gen_rand(3) == 0) {
        gen_add(m, "0");
    } else {
        gen_digits(m, 1 + gen_rand(gen_rand(4) ? 8 : 22), 1);
    }

    if (gen_rand(2)) {
        gen_add(m, ".");
        gen_digits(m, 1 + gen_rand(gen_rand(3) ? 6 : 20), 0);
    }

    if (gen_rand(6) == 0) {
        snprintf(e, sizeof(e), "%s%s%u", gen_rand(2) ? "e" : "E",
                 gen_rand(2) ? "-" : (gen_rand(2) ? "+" : ""), gen_rand(30));
        gen_add(m, e);
    }
}


static const char  *gen_names[] = {
    "a", "b", "ab", "a!", "", "\\u0001", "\\\"", "\\\\", "\\n", "\\/",
    "\xc3\xa9", "\\u00e9", "\xee\x80\x80", "\\ue000", "\xf0\x9f\x98\x80",
    "\\ud83d\\ude00", "\\uffff", "\xef\xbf\xbf", "a\\u0000b", "zz", "z\\u001f",
    "\xf0\x90\x80\x80", "\\ud800\\udc00", "B", "aa",
};


static void
gen_value(mem_t *m, int depth)
{
    unsigned  i, n, k;

    k = gen_rand(depth > 5 ? 3 : 6);

    switch (k) {
    case 0:
        gen_number(m);
        return;

    case 1:
        gen_add(m, gen_rand(2) ? "true" : (gen_rand(2) ? "false" : "null"));
        return;

    case 2:
        gen_add(m, "\"");
        gen_add(m, gen_names[gen_rand(sizeof(gen_names) / sizeof(char *))]);
        gen_add(m, "\"");
        return;

    case 3:
        n = gen_rand(5);
        gen_add(m, "[");
        for (i = 0; i < n; i++) {
            gen_add(m, i ? (gen_rand(4) ? "," : " ,\n") : "");
            gen_value(m, depth + 1);
        }
        gen_add(m, "]");
        return;

    default:
        /* a name repeats now and then: EDUP, found when the object closes */
        n = gen_rand(7);
        gen_add(m, gen_rand(4) ? "{" : "{ ");
        for (i = 0; i < n; i++) {
            gen_add(m, i ? "," : "");
            gen_add(m, "\"");
            gen_add(m, gen_names[gen_rand(sizeof(gen_names) / sizeof(char *))]);
            gen_add(m, gen_rand(4) ? "\":" : "\" : ");
            gen_value(m, depth + 1);
        }
        gen_add(m, "}");
    }
}


/* 1 if both paths agree on in[0..len) */
static int
same_as_tree(const char *in, size_t len, idem_jcs_rc_t *rc_out)
{
    idem_jcs_rc_t   rc, rct, rci;
    cJSON          *tree;
    mem_t           a, b, c;
    idem_sink_t     sa, sb, sc;
    char           *copy;
    int             same;

    mem_sink(&a, &sa);
    mem_sink(&b, &sb);

    rc = idem_jcs_canonicalize(in, len, &sa);
    rct = jcs_tree_parse(in, len, &tree);
    if (rct == IDEM_JCS_OK) {
        rct = jcs_tree_write(tree, &sb);
        cJSON_Delete(tree);
    }

    same = (rc == rct) && (rc != IDEM_JCS_OK || mem_same(&a, &b));

    /* and in place, over a copy of the input */
    copy = malloc(len + 1);
    memcpy(copy, in, len);
    mem_sink(&c, &sc);
    rci = idem_jcs_canonicalize_in_place(copy, len, &sc);
    same = same && rci == rc && (rc != IDEM_JCS_OK || mem_same(&c, &a));
    free(copy);
    mem_free(&c);

    if (!same) {
        diag("input:  %.*s", (int) len, in);
        diag("direct: rc %d %.*s", rc, (int) a.len, a.data ? a.data : "");
        diag("tree:   rc %d %.*s", rct, (int) b.len, b.data ? b.data : "");
    }

    *rc_out = rc;
    mem_free(&a);
    mem_free(&b);

    return same;
}


static void
test_direct_vs_tree(void)
{
    static const char  *grow[] = {
        "1e20", "[1e20]", "[1e20,1E20,5e+20]", "{\"a\":1e20}",
        "[1e2,1e3,1e4,1e5,1e6,1e7,1e8,1e9,1e10,1e11,1e12,1e13,1e14,1e20]",
        "{\"b\":[1e20,{\"z\":1,\"a\":2e20}],\"a\":\"x\"}",
        "[0.1e1, 12e-1, 1e-7, 123456789012345678901234567890]",
    };
    idem_jcs_rc_t   rc;
    mem_t           m;
    idem_sink_t     sink;
    unsigned        i, bad, okc, dup, num;

    /* numbers whose canonical text is longer: in place moves out */
    bad = 0;
    for (i = 0; i < sizeof(grow) / sizeof(grow[0]); i++) {
        bad += !same_as_tree(grow[i], strlen(grow[i]), &rc) || rc != IDEM_JCS_OK;
    }
    ok(bad == 0, "numbers that grow (1e20): direct, in place and tree agree");

    bad = okc = num = 0;

    for (i = 0; i < 50000; i++) {
        mem_sink(&m, &sink);
        gen_add(&m, "[");
        gen_number(&m);
        gen_add(&m, "]");

        if (!same_as_tree(m.data, m.len, &rc) && bad++ > 5) {
            mem_free(&m);
            break;
        }

        num += (rc == IDEM_JCS_OK);
        mem_free(&m);
    }

    ok(bad == 0 && num > 40000,
       "50000 generated number tokens: direct writer == in place == tree path "
       "(%u accepted)", num);

    bad = okc = dup = 0;

    for (i = 0; i < 20000; i++) {
        mem_sink(&m, &sink);
        gen_value(&m, 0);

        if (!same_as_tree(m.data, m.len, &rc) && bad++ > 5) {
            mem_free(&m);
            break;
        }

        okc += (rc == IDEM_JCS_OK);
        dup += (rc == IDEM_JCS_EDUP);
        mem_free(&m);
    }

    ok(bad == 0 && okc > 5000 && dup > 500,
       "20000 generated documents: direct writer == in place == tree path "
       "(%u accepted, %u duplicate names)", okc, dup);
}


int
main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: %s DATA_DIR (t/data/jcs)\n", argv[0]);
        return 2;
    }

    test_vectors(argv[1]);
    test_number_file(argv[1], "numbers.txt");
    test_number_file(argv[1], "numbers-pow2.txt");
    test_numbers();
    test_numbers_in_json();
    test_strings();
    test_utf16_order();
    test_structure();
    test_depth();
    test_many_members();
    test_tree_parsed();
    test_tree_foreign();
    test_sink_failure();
    test_strerror();
    test_direct_vs_tree();

    return done_testing();
}
