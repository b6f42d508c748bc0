/*
 * A second opinion on every JSON input the project keeps: Debian's
 * jansson, a parser that shares no code with ours, reads each one with
 * JSON_REJECT_DUPLICATES | JSON_DECODE_ANY | JSON_DECODE_INT_AS_REAL (and
 * without JSON_ALLOW_NUL, so \u0000 is refused as we refuse it).  Both
 * must accept or both refuse, and for an accepted input the canonical
 * form written here from jansson's tree must equal idem_jcs_canonicalize()
 * byte for byte.
 *
 * The inputs (argv[1] is t/data/jcs; argv[2], if given, the fuzz corpus
 * directory, else t/data/jcs/../../../fuzz/corpus; more arguments are
 * further directories of JSON files): the RFC 8785 vectors, input and
 * output, every number of numbers.txt and numbers-pow2.txt, every seed
 * of fuzz/corpus/jcs, and the body of every seed of fuzz/corpus/fingerprint
 * (the layout at the top of fuzz/fuzz_fingerprint.c).
 *
 * The writer here shares nothing with the core but the number formatter:
 * member names are sorted by UTF-16 code units computed here, strings are
 * escaped here.  Numbers go through idem_jcs_format_number() because the
 * formatting has its own vectors (test_jcs.c runs the number files); for
 * numbers this test checks the reading: both parsers must arrive at the
 * same double, or the formatted texts differ.
 *
 * Where the two part for a documented reason, the rule is checked, and
 * inputs of their own hold each rule to its edges:
 *  - depth: we refuse more than IDEM_JCS_MAX_DEPTH (128) nested containers
 *    with EDEPTH; jansson counts every value, scalars too, and refuses
 *    beyond JSON_PARSER_MAX_DEPTH (2048) with json_error_stack_overflow.
 *    So EDEPTH while jansson accepts is right only if jansson's tree nests
 *    deeper than 128, and jansson's stack overflow must be EDEPTH here;
 *  - a NUL byte after a number or a literal, which jansson loses and RFC
 *    8259 does not allow (judge_nul() below).
 */

#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "idem_jcs.h"
#include "tap.h"
#include "mem_sink.h"


#define JANSSON_FLAGS  (JSON_REJECT_DUPLICATES | JSON_DECODE_ANY           \
                        | JSON_DECODE_INT_AS_REAL)

typedef enum {
    BOTH_ACCEPT = 0,
    BOTH_REJECT,
    DEPTH_RULE,         /* they part as their depth limits say */
    NUL_RULE,           /* jansson loses a NUL byte, as documented */
    DIVERGE,
    NVERDICTS
} verdict_t;

static const char  *verdict_names[NVERDICTS] = {
    "both accept, same bytes", "both reject", "depth limits, as documented",
    "jansson loses a NUL byte, as documented", "DIVERGE"
};

static long  totals[NVERDICTS];


/* the canonical form of jansson's tree */

typedef struct {
    const char  *key;
    size_t       len;
    uint16_t    *units;     /* the name in UTF-16 */
    size_t       nunits;
    json_t      *value;
} member_t;


static int write_value(mem_t *m, json_t *v);


static int
put(mem_t *m, const char *p, size_t n)
{
    idem_sink_t  sink;

    sink.write = mem_write;
    sink.data = m;

    return mem_write(&sink, p, n);
}


/* RFC 8785 3.2.2.2, from the bytes jansson decoded (valid UTF-8) */
static int
write_string(mem_t *m, const char *s, size_t len)
{
    static const char  hex[] = "0123456789abcdef";
    unsigned char      c;
    char               esc[7];
    size_t             i;
    int                rc;

    rc = put(m, "\"", 1);

    for (i = 0; rc == 0 && i < len; i++) {
        c = (unsigned char) s[i];

        switch (c) {
        case '"':  rc = put(m, "\\\"", 2); break;
        case '\\': rc = put(m, "\\\\", 2); break;
        case '\b': rc = put(m, "\\b", 2); break;
        case '\f': rc = put(m, "\\f", 2); break;
        case '\n': rc = put(m, "\\n", 2); break;
        case '\r': rc = put(m, "\\r", 2); break;
        case '\t': rc = put(m, "\\t", 2); break;

        default:
            if (c >= 0x20) {
                rc = put(m, (const char *) &c, 1);
                break;
            }

            memcpy(esc, "\\u00", 4);
            esc[4] = hex[c >> 4];
            esc[5] = hex[c & 0x0f];
            rc = put(m, esc, 6);
        }
    }

    return (rc == 0) ? put(m, "\"", 1) : -1;
}


/* UTF-8 (checked by jansson) to UTF-16 code units; u has len slots */
static size_t
to_utf16(const unsigned char *s, size_t len, uint16_t *u)
{
    size_t    i, n;
    uint32_t  cp;

    for (i = 0, n = 0; i < len; /* void */) {
        if (s[i] < 0x80) {
            cp = s[i];
            i += 1;
        } else if (s[i] < 0xe0) {
            cp = (uint32_t) (s[i] & 0x1f) << 6 | (s[i + 1] & 0x3f);
            i += 2;
        } else if (s[i] < 0xf0) {
            cp = (uint32_t) (s[i] & 0x0f) << 12
                 | (uint32_t) (s[i + 1] & 0x3f) << 6 | (s[i + 2] & 0x3f);
            i += 3;
        } else {
            cp = (uint32_t) (s[i] & 0x07) << 18
                 | (uint32_t) (s[i + 1] & 0x3f) << 12
                 | (uint32_t) (s[i + 2] & 0x3f) << 6 | (s[i + 3] & 0x3f);
            i += 4;
        }

        if (cp >= 0x10000) {
            cp -= 0x10000;
            u[n++] = (uint16_t) (0xd800 + (cp >> 10));
            u[n++] = (uint16_t) (0xdc00 + (cp & 0x3ff));
        } else {
            u[n++] = (uint16_t) cp;
        }
    }

    return n;
}


static int
member_cmp(const void *a, const void *b)
{
    const member_t  *ma = a, *mb = b;
    size_t           i, n;

    n = (ma->nunits < mb->nunits) ? ma->nunits : mb->nunits;

    for (i = 0; i < n; i++) {
        if (ma->units[i] != mb->units[i]) {
            return (ma->units[i] < mb->units[i]) ? -1 : 1;
        }
    }

    return (ma->nunits > mb->nunits) - (ma->nunits < mb->nunits);
}


static int
write_members(mem_t *m, member_t *mb, size_t n)
{
    size_t  i;

    qsort(mb, n, sizeof(member_t), member_cmp);

    for (i = 0; i < n; i++) {
        if ((i > 0 && put(m, ",", 1) != 0)
            || write_string(m, mb[i].key, mb[i].len) != 0
            || put(m, ":", 1) != 0
            || write_value(m, mb[i].value) != 0)
        {
            return -1;
        }
    }

    return 0;
}


static int
write_object(mem_t *m, json_t *obj)
{
    member_t    *mb;
    const char  *key;
    json_t      *v;
    size_t       n, i;
    int          rc;

    n = json_object_size(obj);
    mb = calloc(n + 1, sizeof(member_t));
    i = 0;

    json_object_foreach(obj, key, v) {
        mb[i].key = key;
        mb[i].len = strlen(key);        /* no NUL: no JSON_ALLOW_NUL */
        mb[i].units = malloc((mb[i].len + 1) * sizeof(uint16_t));
        mb[i].nunits = to_utf16((const unsigned char *) key, mb[i].len,
                                mb[i].units);
        mb[i].value = v;
        i++;
    }

    rc = (put(m, "{", 1) == 0 && write_members(m, mb, n) == 0
          && put(m, "}", 1) == 0) ? 0 : -1;

    for (i = 0; i < n; i++) {
        free(mb[i].units);
    }
    free(mb);

    return rc;
}


static int
write_value(mem_t *m, json_t *v)
{
    char     num[IDEM_JCS_NUMBER_MAX];
    json_t  *el;
    size_t   i, n;

    switch (json_typeof(v)) {
    case JSON_OBJECT:
        return write_object(m, v);

    case JSON_ARRAY:
        if (put(m, "[", 1) != 0) {
            return -1;
        }
        json_array_foreach(v, i, el) {
            if ((i > 0 && put(m, ",", 1) != 0) || write_value(m, el) != 0) {
                return -1;
            }
        }
        return put(m, "]", 1);

    case JSON_STRING:
        return write_string(m, json_string_value(v), json_string_length(v));

    case JSON_REAL:
        n = idem_jcs_format_number(json_real_value(v), num);
        return (n == 0) ? -1 : put(m, num, n);

    case JSON_TRUE:
        return put(m, "true", 4);

    case JSON_FALSE:
        return put(m, "false", 5);

    case JSON_NULL:
        return put(m, "null", 4);

    default:
        return -1;      /* JSON_INTEGER: not with JSON_DECODE_INT_AS_REAL */
    }
}


/* containers nested in v, v included */
static int
tree_depth(json_t *v)
{
    const char  *key;
    json_t      *el;
    size_t       i;
    int          d, max;

    max = 0;

    if (json_is_object(v)) {
        json_object_foreach(v, key, el) {
            d = tree_depth(el);
            max = (d > max) ? d : max;
        }

    } else if (json_is_array(v)) {
        json_array_foreach(v, i, el) {
            d = tree_depth(el);
            max = (d > max) ? d : max;
        }

    } else {
        return 0;
    }

    return max + 1;
}


/* one input */

/*
 * jansson's input stream marks an empty buffer with a NUL, so a NUL byte
 * it puts back after a number or a literal is lost: it accepts "1\0" and
 * "[true\0]" (akheron/jansson#331, JSONTestSuite's
 * n_multidigit_number_then_00).  RFC 8259 has no NUL outside strings, and
 * we refuse it.  That is the difference only if the input without its NUL
 * bytes is accepted here and canonicalizes to jansson's reading of it.
 */
static verdict_t
judge_nul(const char *in, size_t len, json_t *j, char *why, size_t size)
{
    mem_t           ours, theirs;
    idem_sink_t     sink;
    idem_jcs_rc_t   rc;
    char           *stripped;
    size_t          i, n;
    verdict_t       v;

    stripped = malloc(len + 1);
    for (i = 0, n = 0; i < len; i++) {
        if (in[i] != '\0') {
            stripped[n++] = in[i];
        }
    }

    mem_sink(&ours, &sink);
    rc = idem_jcs_canonicalize(stripped, n, &sink);
    mem_sink(&theirs, &sink);

    v = (rc == IDEM_JCS_OK && write_value(&theirs, j) == 0
         && mem_same(&ours, &theirs)) ? NUL_RULE : DIVERGE;

    snprintf(why, size, "jansson accepts a NUL byte; without it we say %s",
             idem_jcs_strerror(rc));

    mem_free(&ours);
    mem_free(&theirs);
    free(stripped);

    return v;
}


/* at least one refuses: agreement, or one of the documented differences */
static verdict_t
judge_refusal(const char *in, size_t len, idem_jcs_rc_t rc, json_t *j,
    const json_error_t *err, char *why, size_t size)
{
    if (j == NULL && json_error_code(err) == json_error_stack_overflow) {
        snprintf(why, size, "jansson: %s; we say %s", err->text,
                 idem_jcs_strerror(rc));
        return (rc == IDEM_JCS_EDEPTH) ? DEPTH_RULE : DIVERGE;
    }

    if (j != NULL && rc == IDEM_JCS_EDEPTH) {
        snprintf(why, size, "jansson accepts %d levels; we say %s",
                 tree_depth(j), idem_jcs_strerror(rc));
        return (tree_depth(j) > IDEM_JCS_MAX_DEPTH) ? DEPTH_RULE : DIVERGE;
    }

    if (j != NULL && rc == IDEM_JCS_ESYNTAX && memchr(in, '\0', len) != NULL) {
        return judge_nul(in, len, j, why, size);
    }

    if (j != NULL) {
        snprintf(why, size, "jansson accepts; we say %s",
                 idem_jcs_strerror(rc));
        return DIVERGE;
    }

    snprintf(why, size, "jansson: %s; we say %s", err->text,
             idem_jcs_strerror(rc));

    return (rc != IDEM_JCS_OK) ? BOTH_REJECT : DIVERGE;
}


static verdict_t
crosscheck(const char *in, size_t len, char *why, size_t size)
{
    json_error_t    err;
    json_t         *j;
    mem_t           ours, theirs;
    idem_sink_t     sink;
    idem_jcs_rc_t   rc;
    verdict_t       v;

    mem_sink(&ours, &sink);
    rc = idem_jcs_canonicalize(in, len, &sink);
    j = json_loadb(in, len, JANSSON_FLAGS, &err);

    if (rc != IDEM_JCS_OK || j == NULL) {
        v = judge_refusal(in, len, rc, j, &err, why, size);

    } else {
        mem_sink(&theirs, &sink);
        v = (write_value(&theirs, j) == 0 && mem_same(&ours, &theirs))
            ? BOTH_ACCEPT : DIVERGE;
        snprintf(why, size, "ours %.*s | jansson's %.*s",
                 (int) (ours.len < 200 ? ours.len : 200),
                 ours.data ? ours.data : "",
                 (int) (theirs.len < 200 ? theirs.len : 200),
                 theirs.data ? theirs.data : "");
        mem_free(&theirs);
    }

    json_decref(j);
    mem_free(&ours);
    totals[v]++;

    return v;
}


/* inputs */

static char *
read_file(const char *path, size_t *len)
{
    FILE  *f;
    char  *buf;
    long   n;

    n = 0;
    f = fopen(path, "rb");
    if (f == NULL) {
        return NULL;
    }

    buf = NULL;

    if (fseek(f, 0, SEEK_END) == 0 && (n = ftell(f)) >= 0
        && fseek(f, 0, SEEK_SET) == 0 && (buf = malloc(n + 1)) != NULL
        && fread(buf, 1, n, f) != (size_t) n)
    {
        free(buf);
        buf = NULL;
    }

    fclose(f);

    if (buf != NULL) {
        *len = (size_t) n;
    }

    return buf;
}


/* a fingerprint seed: the body after flags, 4 fields and the headers */
static const char *
fingerprint_body(const char *p, size_t *len)
{
    size_t  left, nfields, i, n;

    if (*len == 0) {
        return p;
    }

    nfields = 4 + 2 * (((unsigned char) p[0] >> 1) & 3);
    p++;
    left = *len - 1;

    for (i = 0; i < nfields && left > 0; i++) {
        n = (unsigned char) p[0];
        n = (n > left - 1) ? left - 1 : n;
        p += 1 + n;
        left -= 1 + n;
    }

    *len = left;
    return p;
}


static int
name_cmp(const void *a, const void *b)
{
    return strcmp(*(char * const *) a, *(char * const *) b);
}


/* the regular files of dir, sorted; NULL-terminated, caller frees */
static char **
list_dir(const char *dir, size_t *n)
{
    DIR            *d;
    struct dirent  *e;
    char          **names;

    *n = 0;
    names = calloc(1, sizeof(char *));

    d = opendir(dir);
    if (d == NULL) {
        return names;
    }

    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.' || strcmp(e->d_name, "LICENSE") == 0) {
            continue;
        }

        names = realloc(names, (*n + 2) * sizeof(char *));
        names[(*n)++] = strdup(e->d_name);
        names[*n] = NULL;
    }

    closedir(d);
    qsort(names, *n, sizeof(char *), name_cmp);

    return names;
}


/* one TAP line per file; an empty or missing directory fails */
static void
check_dir(const char *dir, int fingerprint_seeds)
{
    char         path[4096], why[512], **names;
    const char  *body;
    size_t       n, i, len;
    char        *buf;
    verdict_t    v;

    names = list_dir(dir, &n);
    ok(n > 0, "%s: %zu inputs", dir, n);

    for (i = 0; i < n; i++) {
        snprintf(path, sizeof(path), "%s/%s", dir, names[i]);
        buf = read_file(path, &len);

        if (buf == NULL) {
            ok(0, "%s: cannot read", path);
            continue;
        }

        body = fingerprint_seeds ? fingerprint_body(buf, &len) : buf;
        v = crosscheck(body, len, why, sizeof(why));

        if (!ok(v != DIVERGE, "%s/%s: %s", dir, names[i], verdict_names[v])) {
            diag("  %s", why);
        }

        free(buf);
    }

    for (i = 0; i < n; i++) {
        free(names[i]);
    }
    free(names);
}


/* every expected text of a number file ("bits,text"); one TAP line */
static void
check_numbers(const char *dir, const char *file)
{
    char       path[4096], line[128], why[512], *comma, *nl;
    FILE      *f;
    long       lines, bad;
    verdict_t  v;

    snprintf(path, sizeof(path), "%s/%s", dir, file);
    f = fopen(path, "r");
    lines = bad = 0;

    while (f != NULL && fgets(line, sizeof(line), f) != NULL) {
        nl = strchr(line, '\n');
        if (nl != NULL) {
            *nl = '\0';
        }

        comma = strchr(line, ',');
        if (comma == NULL) {
            continue;
        }

        lines++;
        v = crosscheck(comma + 1, strlen(comma + 1), why, sizeof(why));

        if (v != BOTH_ACCEPT && ++bad <= 5) {
            diag("%s: %s: %s: %s", file, line, verdict_names[v], why);
        }
    }

    if (f != NULL) {
        fclose(f);
    }

    ok(lines > 0 && bad == 0, "%s: %ld numbers, %ld not read alike",
       file, lines, bad);
}


/*
 * Both limits at and beyond their edges, with n arrays around a scalar
 * (n containers for us, n + 1 values for jansson): the depth rule must
 * hold on each side of each limit, not only where a seed happens to be.
 */
static void
check_depth_limits(void)
{
    static const int  depths[] = {
        IDEM_JCS_MAX_DEPTH, IDEM_JCS_MAX_DEPTH + 1,
        JSON_PARSER_MAX_DEPTH - 1, JSON_PARSER_MAX_DEPTH,
        4 * JSON_PARSER_MAX_DEPTH
    };

    json_error_t   err;
    json_t        *j;
    verdict_t      v;
    char          *s, why[512];
    size_t         i, n;
    int            jansson_ok;

    for (i = 0; i < sizeof(depths) / sizeof(depths[0]); i++) {
        n = (size_t) depths[i];
        s = malloc(2 * n + 2);
        memset(s, '[', n);
        s[n] = '1';
        memset(s + n + 1, ']', n);

        v = crosscheck(s, 2 * n + 1, why, sizeof(why));
        j = json_loadb(s, 2 * n + 1, JANSSON_FLAGS, &err);
        jansson_ok = (j != NULL);
        json_decref(j);
        free(s);

        ok(v == ((n <= IDEM_JCS_MAX_DEPTH) ? BOTH_ACCEPT : DEPTH_RULE)
           && jansson_ok == (n + 1 <= JSON_PARSER_MAX_DEPTH),
           "%zu arrays around a scalar: %s (jansson %s)", n,
           verdict_names[v], jansson_ok ? "accepts" : "refuses");
    }
}


/* the NUL rule on inputs of its own; a jansson that is fixed refuses */
static void
check_nul_rule(void)
{
    static const struct {
        const char  *text;
        size_t       len;
    } inputs[] = {
#define LIT(s)  { s, sizeof(s) - 1 }
        LIT("1\0"), LIT("[true\0,2]"), LIT("{\"a\":-0.5\0}"), LIT("[null\0]"),
#undef LIT
    };

    verdict_t  v;
    char       why[512];
    size_t     i;

    for (i = 0; i < sizeof(inputs) / sizeof(inputs[0]); i++) {
        v = crosscheck(inputs[i].text, inputs[i].len, why, sizeof(why));

        if (!ok(v == NUL_RULE || v == BOTH_REJECT,
                "a NUL byte after a token (%zu): %s", i, verdict_names[v]))
        {
            diag("  %s", why);
        }
    }
}


int
main(int argc, char **argv)
{
    char  corpus[4096], dir[sizeof(corpus) + 16];
    int   i;

    if (argc < 2) {
        fprintf(stderr, "usage: %s DATA_DIR (t/data/jcs) [CORPUS_DIR "
                        "[JSON_DIR...]]\n", argv[0]);
        return 2;
    }

    if (argc > 2) {
        snprintf(corpus, sizeof(corpus), "%s", argv[2]);
    } else {
        snprintf(corpus, sizeof(corpus), "%s/../../../fuzz/corpus", argv[1]);
    }

    snprintf(dir, sizeof(dir), "%s/input", argv[1]);
    check_dir(dir, 0);
    snprintf(dir, sizeof(dir), "%s/output", argv[1]);
    check_dir(dir, 0);

    check_numbers(argv[1], "numbers.txt");
    check_numbers(argv[1], "numbers-pow2.txt");

    snprintf(dir, sizeof(dir), "%s/jcs", corpus);
    check_dir(dir, 0);
    snprintf(dir, sizeof(dir), "%s/fingerprint", corpus);
    check_dir(dir, 1);

    for (i = 3; i < argc; i++) {
        check_dir(argv[i], 0);
    }

    check_depth_limits();
    check_nul_rule();

    /* a TAP comment: prove shows it with -v */
    printf("# compared: %ld both accept (same bytes), %ld both reject, "
           "%ld part by the depth limits, %ld by jansson's NUL loss, "
           "%ld diverge\n",
           totals[BOTH_ACCEPT], totals[BOTH_REJECT], totals[DEPTH_RULE],
           totals[NUL_RULE], totals[DIVERGE]);

    ok(totals[BOTH_ACCEPT] > 0 && totals[BOTH_REJECT] > 0,
       "both verdicts were exercised");

    return done_testing();
}
