/*
 * RFC 8785 (JCS) canonical JSON.
 *
 * Parsing: the input is read by our own strict, iterative parser, which
 * builds the cJSON tree with cJSON's constructors.  cJSON's own parser is
 * not used, because it cannot be made strict enough: it keeps duplicate
 * names, accepts invalid UTF-8, truncates strings at \u0000, turns 1e400
 * into infinity, recurses (stack depth) and, in upstream 1.7.15, copies at
 * most 63 characters of a number into its strtod buffer, so a valid long
 * number (70 digits) is misread or rejected depending on the build.  Doing
 * grammar, UTF-8, escapes, depth and numbers in one pass over the bytes
 * means every rejection is decided here, identically on every cJSON build.
 *
 * Numbers are converted with strtod() on the complete token (any length),
 * which glibc rounds correctly.  The result must be finite (else ENUMBER);
 * underflow to zero is accepted, as in ECMAScript's JSON.parse.
 *
 * Object members are sorted into canonical order (UTF-16 code units of
 * the names) when each object is closed, which is also where duplicate
 * names are found, so a tree returned by idem_jcs_parse() is already
 * canonical and writing it cannot fail except in the sink.
 */

#ifndef _GNU_SOURCE
#define _GNU_SOURCE             /* qsort_r() */
#endif

#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "idem_jcs.h"


typedef struct {
    char      *data;
    size_t     len;
    size_t     size;
    unsigned   text:1;      /* no NUL after the data: the writer's output */
    unsigned   borrowed:1;  /* data is the caller's: copy it out to grow */
} jcs_buf_t;

/*
 * Offsets into the direct writer's output are 32-bit, and a name's length
 * keeps a flag in its top bit: so buffers stay under 2 GiB.
 */
#define JCS_BUF_MAX  ((size_t) 0x7fffffff)

typedef struct {
    const unsigned char  *p;
    const unsigned char  *end;
} jcs_in_t;

typedef struct {
    jcs_in_t              in;
    jcs_buf_t             str;      /* decoded string or number text */
    jcs_buf_t             key;      /* pending member name */
    cJSON                *root;
    int                   depth;
    cJSON                *stack[IDEM_JCS_MAX_DEPTH];
} jcs_parser_t;

typedef struct {
    const char  *name;
    size_t       len;
    cJSON       *item;
} jcs_member_t;


static const char  jcs_hex_digits[] = "0123456789abcdef";


const char *
idem_jcs_strerror(idem_jcs_rc_t rc)
{
    switch (rc) {
    case IDEM_JCS_OK:          return "ok";
    case IDEM_JCS_ESYNTAX:     return "not valid JSON";
    case IDEM_JCS_EUTF8:       return "invalid UTF-8";
    case IDEM_JCS_ESURROGATE:  return "lone surrogate in a \\u escape";
    case IDEM_JCS_ENUL:        return "\\u0000 in a string";
    case IDEM_JCS_EDUP:        return "duplicate member name";
    case IDEM_JCS_ENUMBER:     return "number is not a finite double";
    case IDEM_JCS_EDEPTH:      return "nesting too deep";
    case IDEM_JCS_ENOMEM:      return "out of memory";
    case IDEM_JCS_ESINK:       return "output failed";
    }

    return "unknown error";
}


/* UTF-8 */

/*
 * Length (1-4) of the well-formed UTF-8 sequence at p, 0 if there is none.
 * Follows the table of RFC 3629 section 4: no overlongs, no surrogates
 * (ED A0..BF), nothing above U+10FFFF (F4 90.. and F5..FF).
 */
static size_t
jcs_utf8_seq(const unsigned char *p, size_t avail, uint32_t *cp)
{
    unsigned char  c, lo, hi;
    size_t         n, i;
    uint32_t       v;

    c = p[0];

    if (c < 0x80) {
        *cp = c;
        return 1;
    }

    lo = 0x80;
    hi = 0xbf;

    if (c >= 0xc2 && c <= 0xdf) {
        n = 2;
        v = c & 0x1f;

    } else if (c >= 0xe0 && c <= 0xef) {
        n = 3;
        v = c & 0x0f;
        if (c == 0xe0) {
            lo = 0xa0;
        } else if (c == 0xed) {
            hi = 0x9f;
        }

    } else if (c >= 0xf0 && c <= 0xf4) {
        n = 4;
        v = c & 0x07;
        if (c == 0xf0) {
            lo = 0x90;
        } else if (c == 0xf4) {
            hi = 0x8f;
        }

    } else {
        return 0;
    }

    if (avail < n || p[1] < lo || p[1] > hi) {
        return 0;
    }

    for (i = 1; i < n; i++) {
        if ((p[i] & 0xc0) != 0x80) {
            return 0;
        }
        v = (v << 6) | (p[i] & 0x3f);
    }

    *cp = v;
    return n;
}


int
idem_utf8_valid(const char *s, size_t len)
{
    const unsigned char  *p, *end;
    size_t                n;
    uint32_t              cp;

    p = (const unsigned char *) s;
    end = p + len;

    while (p < end) {
        if (*p < 0x80) {
            p++;
            continue;
        }

        n = jcs_utf8_seq(p, end - p, &cp);
        if (n == 0) {
            return 0;
        }
        p += n;
    }

    return 1;
}


static size_t
jcs_utf8_encode(uint32_t cp, unsigned char *out)
{
    if (cp < 0x80) {
        out[0] = (unsigned char) cp;
        return 1;
    }

    if (cp < 0x800) {
        out[0] = (unsigned char) (0xc0 | (cp >> 6));
        out[1] = (unsigned char) (0x80 | (cp & 0x3f));
        return 2;
    }

    if (cp < 0x10000) {
        out[0] = (unsigned char) (0xe0 | (cp >> 12));
        out[1] = (unsigned char) (0x80 | ((cp >> 6) & 0x3f));
        out[2] = (unsigned char) (0x80 | (cp & 0x3f));
        return 3;
    }

    out[0] = (unsigned char) (0xf0 | (cp >> 18));
    out[1] = (unsigned char) (0x80 | ((cp >> 12) & 0x3f));
    out[2] = (unsigned char) (0x80 | ((cp >> 6) & 0x3f));
    out[3] = (unsigned char) (0x80 | (cp & 0x3f));
    return 4;
}


/*
 * The first UTF-16 code unit of a code point: supplementary characters
 * begin with a high surrogate (D800-DBFF), so they sort before
 * U+E000..U+FFFF although their UTF-8 (and code point) order is higher.
 */
static uint32_t
jcs_utf16_lead(uint32_t cp)
{
    if (cp >= 0x10000) {
        return 0xd800 + ((cp - 0x10000) >> 10);
    }

    return cp;
}


int
idem_jcs_utf16_cmp(const char *a, size_t alen, const char *b, size_t blen)
{
    const unsigned char  *ua, *ub;
    size_t                i, n;
    uint32_t              ca, cb, ka, kb;

    ua = (const unsigned char *) a;
    ub = (const unsigned char *) b;
    n = (alen < blen) ? alen : blen;

    for (i = 0; i < n && ua[i] == ub[i]; i++) {
        /* void */
    }

    if (i == n) {
        return (alen < blen) ? -1 : (alen > blen);
    }

    /*
     * Up to i the strings are equal, so they differ inside one code
     * point of each: go back to its first byte and decode both.  Code
     * point order equals UTF-16 order except across the surrogate range.
     */
    while (i > 0 && (ua[i] & 0xc0) == 0x80) {
        i--;
    }

    if (jcs_utf8_seq(ua + i, alen - i, &ca) == 0) {
        ca = ua[i];
    }

    if (jcs_utf8_seq(ub + i, blen - i, &cb) == 0) {
        cb = ub[i];
    }

    ka = jcs_utf16_lead(ca);
    kb = jcs_utf16_lead(cb);

    if (ka == kb) {
        ka = ca;
        kb = cb;
    }

    return (ka < kb) ? -1 : (ka > kb);
}


/* output */

static int
jcs_put(idem_sink_t *out, const char *p, size_t n)
{
    if (n == 0) {
        return 0;
    }

    return out->write(out, p, n);
}


/*
 * RFC 8785 3.2.2.2: the short escapes, else \u00xx in lowercase, for a
 * control character, '"' or '\\'.  Returns the length written to esc.
 */
static size_t
jcs_escape(uint32_t c, char esc[6])
{
    esc[0] = '\\';

    switch (c) {
    case '"':  esc[1] = '"';  return 2;
    case '\\': esc[1] = '\\'; return 2;
    case '\b': esc[1] = 'b';  return 2;
    case '\f': esc[1] = 'f';  return 2;
    case '\n': esc[1] = 'n';  return 2;
    case '\r': esc[1] = 'r';  return 2;
    case '\t': esc[1] = 't';  return 2;
    }

    esc[1] = 'u';
    esc[2] = '0';
    esc[3] = '0';
    esc[4] = jcs_hex_digits[(c >> 4) & 0x0f];
    esc[5] = jcs_hex_digits[c & 0x0f];

    return 6;
}


int
idem_jcs_write_string(idem_sink_t *out, const char *s, size_t len)
{
    const unsigned char  *p, *end, *run;
    char                  esc[6];
    size_t                n;

    p = (const unsigned char *) s;
    end = p + len;

    if (jcs_put(out, "\"", 1) != 0) {
        return -1;
    }

    while (p < end) {
        run = p;

        while (p < end && *p >= 0x20 && *p != '"' && *p != '\\') {
            p++;
        }

        if (jcs_put(out, (const char *) run, p - run) != 0) {
            return -1;
        }

        if (p == end) {
            break;
        }

        n = jcs_escape(*p, esc);

        if (jcs_put(out, esc, n) != 0) {
            return -1;
        }

        p++;
    }

    return jcs_put(out, "\"", 1);
}


/* numbers */

/*
 * Reads the output of printf("%.*e"): sign, digits (the decimal point,
 * whatever the locale makes it, is skipped) and the decimal exponent.
 */
static size_t
jcs_read_e_format(const char *s, char *digits, int *exp10)
{
    size_t  n;
    int     sign, e;

    n = 0;

    if (*s == '-') {
        s++;
    }

    while (*s != '\0' && *s != 'e') {
        if (*s >= '0' && *s <= '9') {
            digits[n++] = *s;
        }
        s++;
    }

    e = 0;
    sign = 1;

    if (*s == 'e') {
        s++;
        if (*s == '-') {
            sign = -1;
            s++;
        } else if (*s == '+') {
            s++;
        }

        while (*s >= '0' && *s <= '9') {
            e = e * 10 + (*s++ - '0');
        }
    }

    *exp10 = sign * e;
    return n;
}


/*
 * Reads digits d[0..p) times 10^(e - p + 1) back as a double.  Written
 * as an integer mantissa with an exponent, so no decimal point is
 * involved and the locale does not matter.
 */
static double
jcs_read_back(const char *d, int p, int e)
{
    char  tmp[48];

    snprintf(tmp, sizeof(tmp), "%.*se%d", p, d, e - p + 1);

    return strtod(tmp, NULL);
}


/* the next p-digit decimal above (dir > 0) or below (dir < 0) d x 10^e */
static void
jcs_step_digits(char *d, int p, int *e, int dir)
{
    int  i;

    if (dir > 0) {
        for (i = p - 1; i >= 0 && d[i] == '9'; i--) {
            d[i] = '0';
        }

        if (i >= 0) {
            d[i]++;
            return;
        }

        /* 99..9 -> 100..0 one decade up */
        d[0] = '1';
        (*e)++;
        return;
    }

    for (i = p - 1; i >= 0 && d[i] == '0'; i--) {
        d[i] = '9';
    }

    d[i]--;     /* i >= 0: the leading digit is never 0 */

    if (i == 0 && d[0] == '0') {
        /* 100..0 -> 99..9 one decade down */
        memset(d, '9', p);
        (*e)--;
    }
}


/*
 * Is there a p-digit decimal that reads back as v?  If so, put the one
 * closest to v into d (p digits) and its exponent into e.
 *
 * printf gives the correctly rounded p-digit decimal c (glibc rounds
 * exactly, ties to even), the closest of all p-digit decimals.  If c
 * does not read back as v, it lies outside v's rounding interval on
 * one side; that can happen while the nearest p-digit decimal on the
 * other side is inside, because at a power of two the interval below v
 * is half as wide as the one above.  No farther decimal can be inside,
 * so c and that one neighbour are the only candidates.  Whether c is
 * below or above v is told by strtod(c), since rounding is monotonic.
 */
static int
jcs_try_precision(double v, int p, char *d, int *e)
{
    char    tmp[48];
    double  back;

    snprintf(tmp, sizeof(tmp), "%.*e", p - 1, v);

    if ((int) jcs_read_e_format(tmp, d, e) != p) {
        return 0;
    }

    back = jcs_read_back(d, p, *e);

    if (back == v) {
        return 1;
    }

    jcs_step_digits(d, p, e, (back < v) ? 1 : -1);

    return jcs_read_back(d, p, *e) == v;
}


/*
 * Shortest digits of v > 0: the smallest p with a p-digit decimal that
 * reads back as v.  Such a p exists for p = 17, and if one exists for p
 * it does for p + 1 (the same decimal, with a trailing zero), so a binary
 * search over 1..17 finds the smallest.  Returns the number of digits
 * (the caller strips trailing zeros); *n is the ECMAScript exponent
 * (v = 0.d1d2... x 10^n).
 *
 * Shortcut for normal numbers: their rounding interval is narrower than
 * 2.3e-16 v while 15-digit decimals are at least 1e-15 v apart, so at
 * most one 15-digit decimal reads back as v.  If there is one, every
 * shorter candidate is that same number, and its digits without the
 * trailing zeros are the answer: one printf instead of about five for
 * typical values.  Subnormals have wide intervals and take the search.
 */
static int
jcs_shortest(double v, char *digits, int *n)
{
    char  d[24];
    int   lo, hi, mid, e, best_p, best_e;

    lo = 1;
    hi = 17;

    if (v >= DBL_MIN) {
        if (jcs_try_precision(v, 15, digits, &e)) {
            *n = e + 1;
            return 15;
        }

        lo = 16;
    }

    best_p = 0;
    best_e = 0;

    while (lo < hi) {
        mid = (lo + hi) / 2;

        if (jcs_try_precision(v, mid, d, &e)) {
            hi = mid;
            best_p = mid;
            best_e = e;
            memcpy(digits, d, mid);
        } else {
            lo = mid + 1;
        }
    }

    if (best_p != lo) {
        /* lo was never tried; for lo = 17 it always succeeds */
        if (!jcs_try_precision(v, lo, digits, &best_e)) {
            snprintf(d, sizeof(d), "%.16e", v);
            lo = (int) jcs_read_e_format(d, digits, &best_e);
        }
    }

    *n = best_e + 1;
    return lo;
}


/*
 * Integers below 2^53 are exact and their rounding interval is at most
 * one unit wide, so the only decimal inside it is the integer itself:
 * its digits are the shortest.  This skips printf for the common case.
 */
static int
jcs_integer_digits(double v, char *digits, int *n)
{
    uint64_t  u;
    char      tmp[24];
    int       len, i;

    u = (uint64_t) v;
    len = 0;

    do {
        tmp[len++] = (char) ('0' + u % 10);
        u /= 10;
    } while (u != 0);

    for (i = 0; i < len; i++) {
        digits[i] = tmp[len - 1 - i];
    }

    *n = len;
    return len;
}


/*
 * Short decimals (prices, rates: 123.45, 0.5, 1e-7) without printf.  For
 * the fewest fractional digits f (1..8) such that m = round(v * 10^f)
 * gives back v as m / 10^f, the digits of m are the shortest: m and 10^f
 * are exact doubles, so the division is the correctly rounded value of
 * the decimal m * 10^-f; with v * 10^f < 2^50 the decimals of f digits are
 * more than two ulps of v apart, so no other one of f digits, nor of fewer
 * (each f' < f was tried with its nearest candidate), rounds to v.  A miss
 * (a rounded product landing off the nearest integer) only means the slow
 * path.  Returns the digit count, 0 when the fast path does not apply.
 */
static int
jcs_short_decimal(double v, char *digits, int *n)
{
    int     f, k;
    double  scaled, m;

    static const double  pow10[] = {
        1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8
    };

    for (f = 1; f <= 8; f++) {
        scaled = v * pow10[f];

        if (scaled >= 1125899906842624.0) {           /* 2^50 */
            return 0;
        }

        m = nearbyint(scaled);

        if (m >= 1 && m / pow10[f] == v) {
            k = jcs_integer_digits(m, digits, n);
            *n -= f;
            return k;
        }
    }

    return 0;
}


/* Number::toString layout (ECMA-262 7.1.12.1) of digits k, exponent n */
static size_t
jcs_layout(int neg, const char *s, int k, int n, char *buf)
{
    char  *p;
    int    i, e;

    p = buf;

    if (neg) {
        *p++ = '-';
    }

    if (k <= n && n <= 21) {
        memcpy(p, s, k);
        p += k;
        for (i = k; i < n; i++) {
            *p++ = '0';
        }

    } else if (n > 0 && n <= 21) {
        memcpy(p, s, n);
        p += n;
        *p++ = '.';
        memcpy(p, s + n, k - n);
        p += k - n;

    } else if (n > -6 && n <= 0) {
        *p++ = '0';
        *p++ = '.';
        for (i = n; i < 0; i++) {
            *p++ = '0';
        }
        memcpy(p, s, k);
        p += k;

    } else {
        *p++ = s[0];
        if (k > 1) {
            *p++ = '.';
            memcpy(p, s + 1, k - 1);
            p += k - 1;
        }

        e = n - 1;
        p += sprintf(p, "e%c%d", (e < 0) ? '-' : '+', (e < 0) ? -e : e);
    }

    *p = '\0';
    return p - buf;
}


size_t
idem_jcs_format_number(double d, char buf[IDEM_JCS_NUMBER_MAX])
{
    char  digits[24];
    int   k, n, neg;

    buf[0] = '\0';

    if (!isfinite(d)) {
        return 0;
    }

    if (d == 0) {
        /* +0 and -0 both print as "0" */
        buf[0] = '0';
        buf[1] = '\0';
        return 1;
    }

    neg = (d < 0);
    if (neg) {
        d = -d;
    }

    if (d < 9007199254740992.0 && d == floor(d)) {
        k = jcs_integer_digits(d, digits, &n);

    } else if ((k = jcs_short_decimal(d, digits, &n)) == 0) {
        k = jcs_shortest(d, digits, &n);
    }

    while (k > 1 && digits[k - 1] == '0') {
        k--;
    }

    return jcs_layout(neg, digits, k, n, buf);
}


/* member ordering */

static int
jcs_member_cmp(const void *a, const void *b)
{
    const jcs_member_t  *ma, *mb;

    ma = a;
    mb = b;

    return idem_jcs_utf16_cmp(ma->name, ma->len, mb->name, mb->len);
}


/*
 * Collects the n members of obj sorted by name; equal neighbours after
 * the sort are duplicates.  *out is malloc()ed, caller frees.
 */
static idem_jcs_rc_t
jcs_sorted_members(const cJSON *obj, size_t n, jcs_member_t **out)
{
    jcs_member_t  *m;
    cJSON         *c;
    size_t         i;

    m = malloc(n * sizeof(jcs_member_t));
    if (m == NULL) {
        return IDEM_JCS_ENOMEM;
    }

    i = 0;
    for (c = obj->child; c != NULL; c = c->next) {
        m[i].name = c->string;
        m[i].len = strlen(c->string);
        m[i].item = c;
        i++;
    }

    qsort(m, n, sizeof(jcs_member_t), jcs_member_cmp);

    for (i = 1; i < n; i++) {
        if (m[i].len == m[i - 1].len
            && memcmp(m[i].name, m[i - 1].name, m[i].len) == 0)
        {
            free(m);
            return IDEM_JCS_EDUP;
        }
    }

    *out = m;
    return IDEM_JCS_OK;
}


/*
 * Checks that every member has a UTF-8 name and counts them; *sorted
 * tells whether they already are in strictly increasing order (which
 * also means no duplicates), the usual case for trees from our parser.
 */
static idem_jcs_rc_t
jcs_scan_members(const cJSON *obj, size_t *count, int *sorted)
{
    const cJSON  *c, *prev;
    size_t        n, len, plen;

    n = 0;
    plen = 0;
    prev = NULL;
    *sorted = 1;

    for (c = obj->child; c != NULL; c = c->next) {
        if (c->string == NULL) {
            return IDEM_JCS_ESYNTAX;
        }

        len = strlen(c->string);
        if (!idem_utf8_valid(c->string, len)) {
            return IDEM_JCS_EUTF8;
        }

        if (prev != NULL && *sorted
            && idem_jcs_utf16_cmp(prev->string, plen, c->string, len) >= 0)
        {
            *sorted = 0;
        }

        prev = c;
        plen = len;
        n++;
    }

    *count = n;
    return IDEM_JCS_OK;
}


/* Puts the members of a freshly parsed object into canonical order. */
static idem_jcs_rc_t
jcs_sort_object(cJSON *obj)
{
    jcs_member_t   *m;
    idem_jcs_rc_t   rc;
    size_t          n, i;
    int             sorted;

    rc = jcs_scan_members(obj, &n, &sorted);
    if (rc != IDEM_JCS_OK || sorted) {
        return rc;
    }

    rc = jcs_sorted_members(obj, n, &m);
    if (rc != IDEM_JCS_OK) {
        return rc;
    }

    /* cJSON lists: next is NULL-terminated, the head's prev is the tail */
    for (i = 0; i < n; i++) {
        m[i].item->prev = m[(i == 0) ? n - 1 : i - 1].item;
        m[i].item->next = (i + 1 < n) ? m[i + 1].item : NULL;
    }

    obj->child = m[0].item;
    free(m);

    return IDEM_JCS_OK;
}


/* parser: the pieces both the tree builder and the direct writer use */

/* room for n more bytes, and the NUL unless b holds text */
static int
jcs_buf_grow(jcs_buf_t *b, size_t n)
{
    size_t   size, need;
    char    *data;

    need = n + !b->text;

    if (b->size - b->len >= need) {
        return 0;
    }

    size = b->size ? b->size : 256;

    if (b->borrowed) {
        /* moving out of the input: what is written, and n more */
        size = b->len + need + 64;
    }

    while (size - b->len < need) {
        size *= 2;
    }

    /* the direct writer keeps 32-bit offsets into its buffer */
    if (size > JCS_BUF_MAX) {
        size = JCS_BUF_MAX;
        if (size - b->len < need) {
            return -1;
        }
    }

    if (b->borrowed) {
        data = malloc(size);
        if (data != NULL) {
            memcpy(data, b->data, b->len);
            b->borrowed = 0;
        }

    } else {
        data = realloc(b->data, size);
    }

    if (data == NULL) {
        return -1;
    }

    b->data = data;
    b->size = size;

    return 0;
}


static int
jcs_buf_add(jcs_buf_t *b, const void *p, size_t n)
{
    if (jcs_buf_grow(b, n) != 0) {
        return -1;
    }

    /* in place, the source is input further on in the same buffer */
    memmove(b->data + b->len, p, n);
    b->len += n;

    if (!b->text) {
        b->data[b->len] = '\0';     /* there is always room for it */
    }

    return 0;
}


static void
jcs_skip_ws(jcs_in_t *in)
{
    while (in->p < in->end
           && (*in->p == ' ' || *in->p == '\t' || *in->p == '\n'
               || *in->p == '\r'))
    {
        in->p++;
    }
}


/* An unexpected byte: say EUTF8 if it does not even start valid UTF-8. */
static idem_jcs_rc_t
jcs_unexpected(jcs_in_t *in)
{
    uint32_t  cp;

    if (in->p < in->end && *in->p >= 0x80
        && jcs_utf8_seq(in->p, in->end - in->p, &cp) == 0)
    {
        return IDEM_JCS_EUTF8;
    }

    return IDEM_JCS_ESYNTAX;
}


static int
jcs_hex4(const unsigned char *p, const unsigned char *end, uint32_t *v)
{
    int  i, c;

    if (end - p < 4) {
        return -1;
    }

    *v = 0;

    for (i = 0; i < 4; i++) {
        c = p[i];

        if (c >= '0' && c <= '9') {
            c -= '0';
        } else if ((c | 0x20) >= 'a' && (c | 0x20) <= 'f') {
            c = (c | 0x20) - 'a' + 10;
        } else {
            return -1;
        }

        *v = (*v << 4) | (uint32_t) c;
    }

    return 0;
}


/* *pp points after the backslash; a surrogate pair is one code point */
static idem_jcs_rc_t
jcs_parse_escape(const unsigned char **pp, const unsigned char *end,
    uint32_t *cp)
{
    const unsigned char  *p;
    uint32_t              lo;

    p = *pp;

    if (p == end) {
        return IDEM_JCS_ESYNTAX;
    }

    switch (*p++) {
    case '"':  *cp = '"';  break;
    case '\\': *cp = '\\'; break;
    case '/':  *cp = '/';  break;
    case 'b':  *cp = '\b'; break;
    case 'f':  *cp = '\f'; break;
    case 'n':  *cp = '\n'; break;
    case 'r':  *cp = '\r'; break;
    case 't':  *cp = '\t'; break;

    case 'u':
        if (jcs_hex4(p, end, cp) != 0) {
            return IDEM_JCS_ESYNTAX;
        }
        p += 4;

        if (*cp == 0) {
            return IDEM_JCS_ENUL;
        }

        if (*cp >= 0xdc00 && *cp <= 0xdfff) {
            return IDEM_JCS_ESURROGATE;
        }

        if (*cp >= 0xd800 && *cp <= 0xdbff) {
            if (end - p < 2 || p[0] != '\\' || p[1] != 'u') {
                return IDEM_JCS_ESURROGATE;
            }

            if (jcs_hex4(p + 2, end, &lo) != 0) {
                return IDEM_JCS_ESYNTAX;
            }

            if (lo < 0xdc00 || lo > 0xdfff) {
                return IDEM_JCS_ESURROGATE;
            }

            p += 6;
            *cp = 0x10000 + ((*cp - 0xd800) << 10) + (lo - 0xdc00);
        }
        break;

    default:
        return IDEM_JCS_ESYNTAX;
    }

    *pp = p;
    return IDEM_JCS_OK;
}


/*
 * in->p is at the opening quote.  Appends the string to b: unescaped
 * (canon == 0, for the tree), or as its JCS literal without the quotes
 * (canon == 1).  *plain is cleared when the literal holds an escape or a
 * supplementary character, the names a byte comparison cannot order.
 */
static idem_jcs_rc_t
jcs_parse_string(jcs_in_t *in, jcs_buf_t *b, int canon, int *plain)
{
    const unsigned char  *p, *end, *run;
    unsigned char         utf8[6];
    idem_jcs_rc_t         rc;
    uint32_t              cp;
    size_t                n;

    p = in->p + 1;
    end = in->end;

    for ( ;; ) {
        run = p;

        while (p < end && *p >= 0x20 && *p < 0x80 && *p != '"'
               && *p != '\\')
        {
            p++;
        }

        if (p > run && jcs_buf_add(b, run, p - run) != 0) {
            return IDEM_JCS_ENOMEM;
        }

        if (p == end || *p < 0x20) {
            /* unterminated, or a raw control character */
            return IDEM_JCS_ESYNTAX;
        }

        if (*p == '"') {
            break;
        }

        if (*p == '\\') {
            p++;
            rc = jcs_parse_escape(&p, end, &cp);
            if (rc != IDEM_JCS_OK) {
                return rc;
            }

            if (canon && (cp < 0x20 || cp == '"' || cp == '\\')) {
                n = jcs_escape(cp, (char *) utf8);
                *plain = 0;

            } else {
                n = jcs_utf8_encode(cp, utf8);
                if (n == 4) {
                    *plain = 0;
                }
            }

            if (jcs_buf_add(b, utf8, n) != 0) {
                return IDEM_JCS_ENOMEM;
            }
            continue;
        }

        n = jcs_utf8_seq(p, end - p, &cp);
        if (n == 0) {
            return IDEM_JCS_EUTF8;
        }

        if (n == 4) {
            *plain = 0;
        }

        if (jcs_buf_add(b, p, n) != 0) {
            return IDEM_JCS_ENOMEM;
        }
        p += n;
    }

    in->p = p + 1;
    return IDEM_JCS_OK;
}


static int
jcs_digits(jcs_in_t *in)
{
    const unsigned char  *start;

    start = in->p;

    while (in->p < in->end && *in->p >= '0' && *in->p <= '9') {
        in->p++;
    }

    return in->p > start;
}


/* RFC 8259 section 6 grammar: steps over one number token */
static idem_jcs_rc_t
jcs_scan_number(jcs_in_t *in)
{
    if (*in->p == '-') {
        in->p++;
    }

    if (in->p < in->end && *in->p == '0') {
        in->p++;            /* a leading zero stands alone */

    } else if (!jcs_digits(in)) {
        return IDEM_JCS_ESYNTAX;
    }

    if (in->p < in->end && *in->p == '.') {
        in->p++;
        if (!jcs_digits(in)) {
            return IDEM_JCS_ESYNTAX;
        }
    }

    if (in->p < in->end && (*in->p == 'e' || *in->p == 'E')) {
        in->p++;
        if (in->p < in->end && (*in->p == '+' || *in->p == '-')) {
            in->p++;
        }
        if (!jcs_digits(in)) {
            return IDEM_JCS_ESYNTAX;
        }
    }

    return IDEM_JCS_OK;
}


/* strtod() on the whole token [s, e), through the NUL-terminated tmp */
static idem_jcs_rc_t
jcs_number_value(const unsigned char *s, const unsigned char *e,
    jcs_buf_t *tmp, double *d)
{
    char  *endp;

    tmp->len = 0;
    if (jcs_buf_add(tmp, s, e - s) != 0) {
        return IDEM_JCS_ENOMEM;
    }

    *d = strtod(tmp->data, &endp);

    /*
     * strtod() stopping early can only mean a locale whose decimal
     * point is not '.'; refuse rather than read a different number.
     */
    if (endp != tmp->data + tmp->len || !isfinite(*d)) {
        return IDEM_JCS_ENUMBER;
    }

    return IDEM_JCS_OK;
}


/* the literal word at in->p, or ESYNTAX */
static idem_jcs_rc_t
jcs_literal(jcs_in_t *in, const char **word, size_t *len)
{
    switch (*in->p) {
    case 't':  *word = "true";  *len = 4; break;
    case 'f':  *word = "false"; *len = 5; break;
    default:   *word = "null";  *len = 4; break;
    }

    if ((size_t) (in->end - in->p) < *len
        || memcmp(in->p, *word, *len) != 0)
    {
        return IDEM_JCS_ESYNTAX;
    }

    in->p += *len;
    return IDEM_JCS_OK;
}


/*
 * After a value, before what follows it: 1 (and *rc) when the text ends
 * here, at depth 0, or cannot, inside a container.
 */
static int
jcs_value_end(jcs_in_t *in, int depth, int *more, idem_jcs_rc_t *rc)
{
    jcs_skip_ws(in);

    if (depth == 0) {
        *more = 0;
        *rc = (in->p == in->end) ? IDEM_JCS_OK : jcs_unexpected(in);
        return 1;
    }

    if (in->p == in->end) {
        *rc = IDEM_JCS_ESYNTAX;
        return 1;
    }

    return 0;
}


/*
 * The whole text, iteratively (the only stack is the consumer's): values,
 * and after each one the containers it closes.  The tree builder and the
 * direct writer differ only in what they do at each step.  jcs_drive() is
 * inline, so each caller gets its own copy with direct calls.
 */
typedef struct {
    idem_jcs_rc_t  (*open)(void *st, int *done);        /* '{' or '[' */
    idem_jcs_rc_t  (*scalar)(void *st);
    idem_jcs_rc_t  (*after_value)(void *st, int *more);
} jcs_grammar_t;


static inline idem_jcs_rc_t
jcs_drive(jcs_in_t *in, void *st, const jcs_grammar_t *g)
{
    idem_jcs_rc_t  rc;
    int            more, done;

    do {
        jcs_skip_ws(in);

        if (in->p == in->end) {
            return IDEM_JCS_ESYNTAX;
        }

        if (*in->p == '{' || *in->p == '[') {
            rc = g->open(st, &done);
            if (rc != IDEM_JCS_OK) {
                return rc;
            }

            if (!done) {
                more = 1;
                continue;       /* the first element */
            }

        } else {
            rc = g->scalar(st);
            if (rc != IDEM_JCS_OK) {
                return rc;
            }
        }

        rc = g->after_value(st, &more);
        if (rc != IDEM_JCS_OK) {
            return rc;
        }

    } while (more);

    return IDEM_JCS_OK;
}


/* tree builder: idem_jcs_parse() */

static idem_jcs_rc_t
jcs_parse_scalar(jcs_parser_t *ps, cJSON **item)
{
    const unsigned char  *start;
    const char           *word;
    idem_jcs_rc_t         rc;
    double                d;
    size_t                n;
    int                   plain;

    start = ps->in.p;
    *item = NULL;

    switch (*start) {
    case '"':
        ps->str.len = 0;
        if (jcs_buf_add(&ps->str, "", 0) != 0) {
            return IDEM_JCS_ENOMEM;
        }

        rc = jcs_parse_string(&ps->in, &ps->str, 0, &plain);
        if (rc != IDEM_JCS_OK) {
            return rc;
        }

        *item = cJSON_CreateString(ps->str.data);
        break;

    case 't':
    case 'f':
    case 'n':
        rc = jcs_literal(&ps->in, &word, &n);
        if (rc != IDEM_JCS_OK) {
            return rc;
        }

        *item = (*start == 'n') ? cJSON_CreateNull()
                                : cJSON_CreateBool(*start == 't');
        break;

    default:
        if (*start != '-' && (*start < '0' || *start > '9')) {
            return jcs_unexpected(&ps->in);
        }

        rc = jcs_scan_number(&ps->in);
        if (rc == IDEM_JCS_OK) {
            rc = jcs_number_value(start, ps->in.p, &ps->str, &d);
        }

        if (rc != IDEM_JCS_OK) {
            return rc;
        }

        *item = cJSON_CreateNumber(d);
    }

    return (*item == NULL) ? IDEM_JCS_ENOMEM : IDEM_JCS_OK;
}


/* A member name and its colon; the name waits in ps->key for its value. */
static idem_jcs_rc_t
jcs_parse_key(jcs_parser_t *ps)
{
    idem_jcs_rc_t  rc;
    int            plain;

    jcs_skip_ws(&ps->in);

    if (ps->in.p == ps->in.end || *ps->in.p != '"') {
        return jcs_unexpected(&ps->in);
    }

    ps->key.len = 0;
    if (jcs_buf_add(&ps->key, "", 0) != 0) {
        return IDEM_JCS_ENOMEM;
    }

    rc = jcs_parse_string(&ps->in, &ps->key, 0, &plain);
    if (rc != IDEM_JCS_OK) {
        return rc;
    }

    jcs_skip_ws(&ps->in);

    if (ps->in.p == ps->in.end || *ps->in.p != ':') {
        return jcs_unexpected(&ps->in);
    }

    ps->in.p++;
    return IDEM_JCS_OK;
}


/* Links a new value into the tree (or makes it the root); owns item. */
static idem_jcs_rc_t
jcs_attach(jcs_parser_t *ps, cJSON *item)
{
    cJSON        *parent;
    cJSON_bool    ok;

    if (ps->depth == 0) {
        ps->root = item;
        return IDEM_JCS_OK;
    }

    parent = ps->stack[ps->depth - 1];

    if (cJSON_IsObject(parent)) {
        ok = cJSON_AddItemToObject(parent, ps->key.data, item);
    } else {
        ok = cJSON_AddItemToArray(parent, item);
    }

    if (!ok) {
        cJSON_Delete(item);
        return IDEM_JCS_ENOMEM;
    }

    return IDEM_JCS_OK;
}


/* '[' or '{' at ps->in.p; *done is set when the container was empty */
static idem_jcs_rc_t
jcs_open(void *st, int *done)
{
    jcs_parser_t   *ps = st;
    idem_jcs_rc_t   rc;
    cJSON          *item;
    int             object;

    if (ps->depth == IDEM_JCS_MAX_DEPTH) {
        return IDEM_JCS_EDEPTH;
    }

    object = (*ps->in.p++ == '{');
    item = object ? cJSON_CreateObject() : cJSON_CreateArray();
    if (item == NULL) {
        return IDEM_JCS_ENOMEM;
    }

    rc = jcs_attach(ps, item);
    if (rc != IDEM_JCS_OK) {
        return rc;
    }

    jcs_skip_ws(&ps->in);

    if (ps->in.p < ps->in.end && *ps->in.p == (object ? '}' : ']')) {
        ps->in.p++;
        *done = 1;
        return IDEM_JCS_OK;
    }

    ps->stack[ps->depth++] = item;
    *done = 0;

    return object ? jcs_parse_key(ps) : IDEM_JCS_OK;
}


/*
 * After a complete value: close the containers that end here, then
 * either step over a comma (*more = 1, another value follows) or reach
 * the end of the text (*more = 0).
 */
static idem_jcs_rc_t
jcs_after_value(void *st, int *more)
{
    jcs_parser_t   *ps = st;
    idem_jcs_rc_t   rc;
    cJSON          *top;
    int             object;

    for ( ;; ) {
        if (jcs_value_end(&ps->in, ps->depth, more, &rc)) {
            return rc;
        }

        top = ps->stack[ps->depth - 1];
        object = cJSON_IsObject(top);

        if (*ps->in.p == ',') {
            ps->in.p++;
            *more = 1;
            return object ? jcs_parse_key(ps) : IDEM_JCS_OK;
        }

        if (*ps->in.p != (object ? '}' : ']')) {
            return jcs_unexpected(&ps->in);
        }

        ps->in.p++;
        ps->depth--;

        if (object) {
            rc = jcs_sort_object(top);
            if (rc != IDEM_JCS_OK) {
                return rc;
            }
        }
    }
}


static idem_jcs_rc_t
jcs_tree_scalar(void *st)
{
    idem_jcs_rc_t  rc;
    cJSON         *item;

    rc = jcs_parse_scalar(st, &item);

    return (rc == IDEM_JCS_OK) ? jcs_attach(st, item) : rc;
}


static const jcs_grammar_t  jcs_tree_grammar = {
    jcs_open, jcs_tree_scalar, jcs_after_value
};


idem_jcs_rc_t
idem_jcs_parse(const char *in, size_t len, struct cJSON **tree)
{
    jcs_parser_t   ps;
    idem_jcs_rc_t  rc;

    memset(&ps, 0, sizeof(jcs_parser_t));
    ps.in.p = (const unsigned char *) in;
    ps.in.end = ps.in.p + len;

    rc = jcs_drive(&ps.in, &ps, &jcs_tree_grammar);

    free(ps.str.data);
    free(ps.key.data);

    if (rc != IDEM_JCS_OK || tree == NULL) {
        cJSON_Delete(ps.root);
        ps.root = NULL;
    }

    if (tree != NULL) {
        *tree = ps.root;
    }

    return rc;
}


/* writer: recursion is bounded by IDEM_JCS_MAX_DEPTH */

static idem_jcs_rc_t jcs_write(const cJSON *v, idem_sink_t *out, int depth);


static idem_jcs_rc_t
jcs_write_member(const char *name, size_t len, const cJSON *v,
    idem_sink_t *out, int depth, int first)
{
    if ((!first && jcs_put(out, ",", 1) != 0)
        || idem_jcs_write_string(out, name, len) != 0
        || jcs_put(out, ":", 1) != 0)
    {
        return IDEM_JCS_ESINK;
    }

    return jcs_write(v, out, depth);
}


static idem_jcs_rc_t
jcs_write_object(const cJSON *obj, idem_sink_t *out, int depth)
{
    jcs_member_t   *m;
    const cJSON    *c;
    idem_jcs_rc_t   rc;
    size_t          n, i;
    int             sorted;

    rc = jcs_scan_members(obj, &n, &sorted);
    if (rc != IDEM_JCS_OK) {
        return rc;
    }

    if (jcs_put(out, "{", 1) != 0) {
        return IDEM_JCS_ESINK;
    }

    if (sorted) {
        for (c = obj->child; c != NULL && rc == IDEM_JCS_OK; c = c->next) {
            rc = jcs_write_member(c->string, strlen(c->string), c, out,
                                  depth, c == obj->child);
        }

    } else {
        /* a tree built elsewhere, not in canonical order */
        rc = jcs_sorted_members(obj, n, &m);
        if (rc != IDEM_JCS_OK) {
            return rc;
        }

        for (i = 0; i < n && rc == IDEM_JCS_OK; i++) {
            rc = jcs_write_member(m[i].name, m[i].len, m[i].item, out,
                                  depth, i == 0);
        }

        free(m);
    }

    if (rc != IDEM_JCS_OK) {
        return rc;
    }

    return (jcs_put(out, "}", 1) != 0) ? IDEM_JCS_ESINK : IDEM_JCS_OK;
}


static idem_jcs_rc_t
jcs_write_array(const cJSON *arr, idem_sink_t *out, int depth)
{
    const cJSON    *c;
    idem_jcs_rc_t   rc;

    if (jcs_put(out, "[", 1) != 0) {
        return IDEM_JCS_ESINK;
    }

    for (c = arr->child; c != NULL; c = c->next) {
        if (c != arr->child && jcs_put(out, ",", 1) != 0) {
            return IDEM_JCS_ESINK;
        }

        rc = jcs_write(c, out, depth);
        if (rc != IDEM_JCS_OK) {
            return rc;
        }
    }

    return (jcs_put(out, "]", 1) != 0) ? IDEM_JCS_ESINK : IDEM_JCS_OK;
}


static idem_jcs_rc_t
jcs_write_scalar(const cJSON *v, idem_sink_t *out)
{
    char    num[IDEM_JCS_NUMBER_MAX];
    size_t  n;
    int     rc;

    switch (v->type & 0xff) {
    case cJSON_False:
        rc = jcs_put(out, "false", 5);
        break;

    case cJSON_True:
        rc = jcs_put(out, "true", 4);
        break;

    case cJSON_NULL:
        rc = jcs_put(out, "null", 4);
        break;

    case cJSON_Number:
        n = idem_jcs_format_number(v->valuedouble, num);
        if (n == 0) {
            return IDEM_JCS_ENUMBER;
        }
        rc = jcs_put(out, num, n);
        break;

    case cJSON_String:
        if (v->valuestring == NULL) {
            return IDEM_JCS_ESYNTAX;
        }

        n = strlen(v->valuestring);
        if (!idem_utf8_valid(v->valuestring, n)) {
            return IDEM_JCS_EUTF8;
        }
        rc = idem_jcs_write_string(out, v->valuestring, n);
        break;

    default:
        /* cJSON_Raw and cJSON_Invalid have no canonical form */
        return IDEM_JCS_ESYNTAX;
    }

    return (rc != 0) ? IDEM_JCS_ESINK : IDEM_JCS_OK;
}


/* depth: how many containers enclose v */
static idem_jcs_rc_t
jcs_write(const cJSON *v, idem_sink_t *out, int depth)
{
    switch (v->type & 0xff) {
    case cJSON_Object:
    case cJSON_Array:
        if (depth >= IDEM_JCS_MAX_DEPTH) {
            return IDEM_JCS_EDEPTH;
        }

        if ((v->type & 0xff) == cJSON_Object) {
            return jcs_write_object(v, out, depth + 1);
        }

        return jcs_write_array(v, out, depth + 1);

    default:
        return jcs_write_scalar(v, out);
    }
}


idem_jcs_rc_t
idem_jcs_write_value(const struct cJSON *v, idem_sink_t *out)
{
    if (v == NULL) {
        return IDEM_JCS_ESYNTAX;
    }

    return jcs_write(v, out, 0);
}


/*
 * Direct writer: idem_jcs_canonicalize().  The same grammar as the tree
 * builder, but every token goes straight into one output buffer in its
 * canonical form, and an object's members are put in order when it
 * closes by moving their bytes, so no tree is built: the memory is the
 * canonical text, one record per member of the objects still open, and
 * a scratch copy of the largest object that was out of order.
 */

#define JCS_NAME_COMPLEX  0x80000000u   /* escapes or supplementary chars */

typedef struct {
    uint32_t   name;        /* offset of the name's opening quote */
    uint32_t   name_len;    /* with the quotes; | JCS_NAME_COMPLEX */
    uint32_t   end;         /* offset just past the member's value */
} jcs_rec_t;

typedef struct {
    uint32_t   start;       /* offset of the '{' or '[' */
    uint32_t   first;       /* the object's first member record */
    int        object;
    int        sorted;      /* names so far in strictly increasing order */
} jcs_frame_t;

typedef struct {
    jcs_in_t      in;
    const unsigned char  *in_start;
    jcs_buf_t     out;      /* the canonical text so far */
    jcs_buf_t     tmp;      /* number tokens; a reordered object */
    jcs_rec_t    *recs;
    size_t        nrecs;
    size_t        recs_size;
    int           depth;
    jcs_frame_t   frames[IDEM_JCS_MAX_DEPTH];
} jcs_canon_t;


static int
jcs_put1(jcs_buf_t *b, char c)
{
    if (b->size == b->len && jcs_buf_grow(b, 1) != 0) {
        return -1;
    }

    b->data[b->len++] = c;
    return 0;
}


/* One code point of a canonical string literal (escapes decoded). */
static size_t
jcs_canon_cp(const unsigned char *p, const unsigned char *end, uint32_t *cp)
{
    size_t    n;
    uint32_t  v;

    if (*p != '\\') {
        n = jcs_utf8_seq(p, end - p, cp);      /* validated when parsed */
        if (n == 0) {
            *cp = *p;
            n = 1;
        }
        return n;
    }

    switch (p[1]) {
    case 'b':  *cp = '\b'; return 2;
    case 'f':  *cp = '\f'; return 2;
    case 'n':  *cp = '\n'; return 2;
    case 'r':  *cp = '\r'; return 2;
    case 't':  *cp = '\t'; return 2;
    case 'u':
        (void) jcs_hex4(p + 2, end, &v);
        *cp = v;
        return 6;
    default:
        *cp = p[1];     /* '"' or '\\' */
        return 2;
    }
}


/* RFC 8785 3.2.3 order of two member names, given as canonical literals */
static int
jcs_name_cmp(const char *base, const jcs_rec_t *a, const jcs_rec_t *b)
{
    const unsigned char  *pa, *pb, *ea, *eb;
    uint32_t              la, lb, ca, cb, ka, kb;
    size_t                na, nb;
    int                   rc;

    la = (a->name_len & ~JCS_NAME_COMPLEX) - 2;
    lb = (b->name_len & ~JCS_NAME_COMPLEX) - 2;
    pa = (const unsigned char *) base + a->name + 1;
    pb = (const unsigned char *) base + b->name + 1;

    if (!((a->name_len | b->name_len) & JCS_NAME_COMPLEX)) {
        /* BMP text without escapes: byte order is UTF-16 order */
        rc = memcmp(pa, pb, la < lb ? la : lb);
        return rc ? rc : (la < lb) ? -1 : (la > lb);
    }

    ea = pa + la;
    eb = pb + lb;

    while (pa < ea && pb < eb) {
        na = jcs_canon_cp(pa, ea, &ca);
        nb = jcs_canon_cp(pb, eb, &cb);

        if (ca != cb) {
            ka = jcs_utf16_lead(ca);
            kb = jcs_utf16_lead(cb);

            if (ka == kb) {
                ka = ca;
                kb = cb;
            }

            return (ka < kb) ? -1 : 1;
        }

        pa += na;
        pb += nb;
    }

    return (pa < ea) - (pb < eb);
}


static int
jcs_rec_cmp(const void *a, const void *b, void *base)
{
    return jcs_name_cmp(base, a, b);
}


/* A name and its colon; its record waits on the stack for the value. */
static idem_jcs_rc_t
jcs_canon_name(jcs_canon_t *c)
{
    jcs_rec_t      *r;
    idem_jcs_rc_t   rc;
    size_t          start, size;
    int             plain;

    jcs_skip_ws(&c->in);

    if (c->in.p == c->in.end || *c->in.p != '"') {
        return jcs_unexpected(&c->in);
    }

    if (c->nrecs == c->recs_size) {
        size = c->recs_size ? 2 * c->recs_size : 64;
        r = realloc(c->recs, size * sizeof(jcs_rec_t));
        if (r == NULL) {
            return IDEM_JCS_ENOMEM;
        }

        c->recs = r;
        c->recs_size = size;
    }

    start = c->out.len;
    plain = 1;

    if (jcs_put1(&c->out, '"') != 0) {
        return IDEM_JCS_ENOMEM;
    }

    rc = jcs_parse_string(&c->in, &c->out, 1, &plain);
    if (rc != IDEM_JCS_OK) {
        return rc;
    }

    if (jcs_put1(&c->out, '"') != 0) {
        return IDEM_JCS_ENOMEM;
    }

    r = &c->recs[c->nrecs++];
    r->name = (uint32_t) start;
    r->name_len = (uint32_t) (c->out.len - start)
                  | (plain ? 0 : JCS_NAME_COMPLEX);

    jcs_skip_ws(&c->in);

    if (c->in.p == c->in.end || *c->in.p != ':') {
        return jcs_unexpected(&c->in);
    }

    c->in.p++;

    return (jcs_put1(&c->out, ':') != 0) ? IDEM_JCS_ENOMEM : IDEM_JCS_OK;
}


/*
 * Canonical text of a number token without strtod() when it already is
 * one: no exponent, at most 15 significant digits (so it is the shortest
 * form of its double, DBL_DIG), and a magnitude ECMAScript prints without
 * an exponent (1e-6 <= |x| < 1e21).  Returns 0 when the token does not
 * qualify.  Trailing fraction zeros go, and -0 is 0.
 */
static int
jcs_number_copy(const unsigned char *s, const unsigned char *e,
    jcs_buf_t *out)
{
    const unsigned char  *p, *ip, *ie, *fp, *fe;
    size_t                z;

    p = s + (*s == '-');
    ip = p;

    while (p < e && *p >= '0' && *p <= '9') {
        p++;
    }

    ie = p;
    fp = fe = p;

    if (p < e && *p == '.') {
        fp = ++p;
        while (p < e && *p >= '0' && *p <= '9') {
            p++;
        }
        fe = p;
    }

    if (p != e) {
        return 0;               /* an exponent */
    }

    while (fe > fp && fe[-1] == '0') {
        fe--;
    }

    z = 0;

    if (*ip == '0') {
        if (fe == fp) {
            return (jcs_put1(out, '0') == 0) ? 1 : -1;
        }

        while (fp + z < fe && fp[z] == '0') {
            z++;
        }

        if (z > 5 || (fe - fp) - z > 15) {
            return 0;
        }

    } else if ((ie - ip) + (fe - fp) > 15) {
        return 0;
    }

    if (jcs_buf_grow(out, e - s) != 0) {
        return -1;
    }

    if (*s == '-') {
        out->data[out->len++] = '-';
    }

    /* memmove: in place, the token itself lies at or after the output */
    memmove(out->data + out->len, ip, ie - ip);
    out->len += ie - ip;

    if (fe > fp) {
        out->data[out->len++] = '.';
        memmove(out->data + out->len, fp, fe - fp);
        out->len += fe - fp;
    }

    return 1;
}


static idem_jcs_rc_t
jcs_canon_number(jcs_canon_t *c)
{
    const unsigned char  *start;
    char                  num[IDEM_JCS_NUMBER_MAX];
    idem_jcs_rc_t         rc;
    double                d;
    size_t                n;
    int                   done;

    start = c->in.p;

    rc = jcs_scan_number(&c->in);
    if (rc != IDEM_JCS_OK) {
        return rc;
    }

    done = jcs_number_copy(start, c->in.p, &c->out);
    if (done != 0) {
        return (done < 0) ? IDEM_JCS_ENOMEM : IDEM_JCS_OK;
    }

    rc = jcs_number_value(start, c->in.p, &c->tmp, &d);
    if (rc != IDEM_JCS_OK) {
        return rc;
    }

    n = idem_jcs_format_number(d, num);

    /*
     * The one token whose canonical form can be longer than its text
     * (1e20): in place, it must not run into input not read yet, so the
     * output moves to a buffer of its own first.
     */
    if (c->out.borrowed
        && c->out.len + n > (size_t) (c->in.p - c->in_start))
    {
        /* room for the rest of the input, as in a buffer of its own */
        if (jcs_buf_grow(&c->out, c->out.size - c->out.len + 1) != 0) {
            return IDEM_JCS_ENOMEM;
        }
    }

    return (jcs_buf_add(&c->out, num, n) != 0) ? IDEM_JCS_ENOMEM
                                                : IDEM_JCS_OK;
}


static idem_jcs_rc_t
jcs_canon_scalar(void *st)
{
    jcs_canon_t    *c = st;
    const char     *word;
    idem_jcs_rc_t   rc;
    size_t          n;
    int             plain;

    switch (*c->in.p) {
    case '"':
        if (jcs_put1(&c->out, '"') != 0) {
            return IDEM_JCS_ENOMEM;
        }

        rc = jcs_parse_string(&c->in, &c->out, 1, &plain);
        if (rc != IDEM_JCS_OK) {
            return rc;
        }

        return (jcs_put1(&c->out, '"') != 0) ? IDEM_JCS_ENOMEM
                                              : IDEM_JCS_OK;

    case 't':
    case 'f':
    case 'n':
        rc = jcs_literal(&c->in, &word, &n);
        if (rc != IDEM_JCS_OK) {
            return rc;
        }

        return (jcs_buf_add(&c->out, word, n) != 0) ? IDEM_JCS_ENOMEM
                                                     : IDEM_JCS_OK;

    default:
        if (*c->in.p == '-' || (*c->in.p >= '0' && *c->in.p <= '9')) {
            return jcs_canon_number(c);
        }

        return jcs_unexpected(&c->in);
    }
}


/* '[' or '{' at c->in.p; *done is set when the container was empty */
static idem_jcs_rc_t
jcs_canon_open(void *st, int *done)
{
    jcs_canon_t  *c = st;
    jcs_frame_t  *f;
    int           object;

    if (c->depth == IDEM_JCS_MAX_DEPTH) {
        return IDEM_JCS_EDEPTH;
    }

    object = (*c->in.p == '{');
    f = &c->frames[c->depth];
    f->start = (uint32_t) c->out.len;

    if (jcs_put1(&c->out, (char) *c->in.p++) != 0) {
        return IDEM_JCS_ENOMEM;
    }

    jcs_skip_ws(&c->in);

    if (c->in.p < c->in.end && *c->in.p == (object ? '}' : ']')) {
        *done = 1;
        return (jcs_put1(&c->out, (char) *c->in.p++) != 0)
               ? IDEM_JCS_ENOMEM : IDEM_JCS_OK;
    }

    f->first = (uint32_t) c->nrecs;
    f->object = object;
    f->sorted = 1;
    c->depth++;
    *done = 0;

    return object ? jcs_canon_name(c) : IDEM_JCS_OK;
}


/* The value of the object's newest member ended at the current offset. */
static void
jcs_canon_member_end(jcs_canon_t *c, jcs_frame_t *f)
{
    jcs_rec_t  *r;

    r = &c->recs[c->nrecs - 1];
    r->end = (uint32_t) c->out.len;

    /* equal names are left for the sort, so EDUP comes when it closes */
    if (f->sorted && c->nrecs - 1 > f->first
        && jcs_name_cmp(c->out.data, r - 1, r) >= 0)
    {
        f->sorted = 0;
    }
}


/*
 * Puts the members of a closing object in order: sorts their records,
 * finds duplicates as equal neighbours, and, unless it is the root (whose
 * records idem_jcs_canonicalize() writes out in order), rewrites the
 * object's bytes in place through a scratch copy.
 */
static idem_jcs_rc_t
jcs_canon_sort(jcs_canon_t *c, jcs_frame_t *f)
{
    jcs_rec_t  *r;
    size_t      n, i, len, from;
    char       *p;

    r = &c->recs[f->first];
    n = c->nrecs - f->first;

    qsort_r(r, n, sizeof(jcs_rec_t), jcs_rec_cmp, c->out.data);

    for (i = 1; i < n; i++) {
        if (jcs_name_cmp(c->out.data, &r[i - 1], &r[i]) == 0) {
            return IDEM_JCS_EDUP;
        }
    }

    if (c->depth == 0) {
        return IDEM_JCS_OK;
    }

    from = f->start + 1;
    len = c->out.len - from;

    c->tmp.len = 0;
    if (jcs_buf_grow(&c->tmp, len) != 0) {
        return IDEM_JCS_ENOMEM;
    }

    p = c->tmp.data;

    for (i = 0; i < n; i++) {
        if (i > 0) {
            *p++ = ',';
        }

        memcpy(p, c->out.data + r[i].name, r[i].end - r[i].name);
        p += r[i].end - r[i].name;
    }

    memcpy(c->out.data + from, c->tmp.data, len);

    return IDEM_JCS_OK;
}


/*
 * After a complete value: close the containers that end here, then
 * either step over a comma (*more = 1) or reach the end (*more = 0).
 */
static idem_jcs_rc_t
jcs_canon_after_value(void *st, int *more)
{
    jcs_canon_t    *c = st;
    jcs_frame_t    *f;
    idem_jcs_rc_t   rc;

    for ( ;; ) {
        if (jcs_value_end(&c->in, c->depth, more, &rc)) {
            return rc;
        }

        f = &c->frames[c->depth - 1];

        if (f->object) {
            jcs_canon_member_end(c, f);
        }

        if (*c->in.p == ',') {
            c->in.p++;
            *more = 1;

            if (jcs_put1(&c->out, ',') != 0) {
                return IDEM_JCS_ENOMEM;
            }

            return f->object ? jcs_canon_name(c) : IDEM_JCS_OK;
        }

        if (*c->in.p != (f->object ? '}' : ']')) {
            return jcs_unexpected(&c->in);
        }

        c->in.p++;
        c->depth--;

        if (f->object && !f->sorted) {
            rc = jcs_canon_sort(c, f);
            if (rc != IDEM_JCS_OK) {
                return rc;
            }
        }

        if (f->object && c->depth > 0) {
            c->nrecs = f->first;
        }

        if (jcs_put1(&c->out, f->object ? '}' : ']') != 0) {
            return IDEM_JCS_ENOMEM;
        }
    }
}


static const jcs_grammar_t  jcs_canon_grammar = {
    jcs_canon_open, jcs_canon_scalar, jcs_canon_after_value
};


/* A root object out of order goes out member by member, never copied. */
static int
jcs_canon_write_root(jcs_canon_t *c, idem_sink_t *out)
{
    jcs_rec_t  *r;
    size_t      i;

    if (jcs_put(out, "{", 1) != 0) {
        return -1;
    }

    for (i = 0; i < c->nrecs; i++) {
        r = &c->recs[i];

        if ((i > 0 && jcs_put(out, ",", 1) != 0)
            || jcs_put(out, c->out.data + r->name, r->end - r->name) != 0)
        {
            return -1;
        }
    }

    return jcs_put(out, "}", 1);
}


/* in[0..len) to out; in place when borrow (== in) may be overwritten */
static idem_jcs_rc_t
jcs_canon_run(const char *in, size_t len, char *borrow, idem_sink_t *out)
{
    jcs_canon_t     c;
    idem_jcs_rc_t   rc;
    int             root_sorted;

    if (len >= JCS_BUF_MAX - 64) {
        return IDEM_JCS_ENOMEM;
    }

    memset(&c, 0, sizeof(jcs_canon_t));
    c.in.p = (const unsigned char *) in;
    c.in.end = c.in.p + len;
    c.in_start = c.in.p;
    c.out.text = 1;

    if (borrow) {
        c.out.borrowed = 1;
        c.out.data = borrow;
        c.out.size = len;

    } else {
        /* the canonical text is rarely longer than the input */
        c.out.size = len + 64;
        c.out.data = malloc(c.out.size);
        if (c.out.data == NULL) {
            return IDEM_JCS_ENOMEM;
        }
    }

    rc = jcs_drive(&c.in, &c, &jcs_canon_grammar);

    if (rc == IDEM_JCS_OK) {
        root_sorted = (c.out.data[0] != '{' || c.frames[0].sorted
                       || c.nrecs == 0);

        if ((root_sorted ? jcs_put(out, c.out.data, c.out.len)
                         : jcs_canon_write_root(&c, out)) != 0)
        {
            rc = IDEM_JCS_ESINK;
        }
    }

    if (!c.out.borrowed) {
        free(c.out.data);
    }

    free(c.tmp.data);
    free(c.recs);

    return rc;
}


idem_jcs_rc_t
idem_jcs_canonicalize(const char *in, size_t len, idem_sink_t *out)
{
    return jcs_canon_run(in, len, NULL, out);
}


/*
 * The canonical text is never longer than the input read so far, except
 * after a number like 1e20, so it can overwrite the input it came from.
 * Every write keeps out.len <= the offset of the next input byte; a
 * number that would not is written after the output moved out.
 */
idem_jcs_rc_t
idem_jcs_canonicalize_in_place(char *buf, size_t len, idem_sink_t *out)
{
    return jcs_canon_run(buf, len, buf, out);
}
