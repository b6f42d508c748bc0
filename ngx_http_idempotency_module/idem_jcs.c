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

#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "idem_jcs.h"


typedef struct {
    char    *data;
    size_t   len;
    size_t   size;
} jcs_buf_t;

typedef struct {
    const unsigned char  *p;
    const unsigned char  *end;
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

        /* RFC 8785 3.2.2.2: the short escapes, else \u00xx in lowercase */
        esc[0] = '\\';
        n = 2;

        switch (*p) {
        case '"':  esc[1] = '"';  break;
        case '\\': esc[1] = '\\'; break;
        case '\b': esc[1] = 'b';  break;
        case '\f': esc[1] = 'f';  break;
        case '\n': esc[1] = 'n';  break;
        case '\r': esc[1] = 'r';  break;
        case '\t': esc[1] = 't';  break;
        default:
            esc[1] = 'u';
            esc[2] = '0';
            esc[3] = '0';
            esc[4] = jcs_hex_digits[*p >> 4];
            esc[5] = jcs_hex_digits[*p & 0x0f];
            n = 6;
        }

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


/* parser */

static int
jcs_buf_add(jcs_buf_t *b, const void *p, size_t n)
{
    size_t   size;
    char    *data;

    if (b->size - b->len <= n) {
        size = b->size ? b->size : 256;

        while (size - b->len <= n) {
            size *= 2;
        }

        data = realloc(b->data, size);
        if (data == NULL) {
            return -1;
        }

        b->data = data;
        b->size = size;
    }

    memcpy(b->data + b->len, p, n);
    b->len += n;
    b->data[b->len] = '\0';     /* there is always room for it */

    return 0;
}


static void
jcs_skip_ws(jcs_parser_t *ps)
{
    while (ps->p < ps->end
           && (*ps->p == ' ' || *ps->p == '\t' || *ps->p == '\n'
               || *ps->p == '\r'))
    {
        ps->p++;
    }
}


/* An unexpected byte: say EUTF8 if it does not even start valid UTF-8. */
static idem_jcs_rc_t
jcs_unexpected(jcs_parser_t *ps)
{
    uint32_t  cp;

    if (ps->p < ps->end && *ps->p >= 0x80
        && jcs_utf8_seq(ps->p, ps->end - ps->p, &cp) == 0)
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


/* ps->p is at the opening quote; the unescaped text goes into b */
static idem_jcs_rc_t
jcs_parse_string(jcs_parser_t *ps, jcs_buf_t *b)
{
    const unsigned char  *p, *end, *run;
    unsigned char         utf8[4];
    idem_jcs_rc_t         rc;
    uint32_t              cp;
    size_t                n;

    p = ps->p + 1;
    end = ps->end;
    b->len = 0;

    if (jcs_buf_add(b, "", 0) != 0) {
        return IDEM_JCS_ENOMEM;
    }

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

            n = jcs_utf8_encode(cp, utf8);
            if (jcs_buf_add(b, utf8, n) != 0) {
                return IDEM_JCS_ENOMEM;
            }
            continue;
        }

        n = jcs_utf8_seq(p, end - p, &cp);
        if (n == 0) {
            return IDEM_JCS_EUTF8;
        }

        if (jcs_buf_add(b, p, n) != 0) {
            return IDEM_JCS_ENOMEM;
        }
        p += n;
    }

    ps->p = p + 1;
    return IDEM_JCS_OK;
}


static int
jcs_digits(jcs_parser_t *ps)
{
    const unsigned char  *start;

    start = ps->p;

    while (ps->p < ps->end && *ps->p >= '0' && *ps->p <= '9') {
        ps->p++;
    }

    return ps->p > start;
}


/* RFC 8259 section 6 grammar, then strtod() on the whole token */
static idem_jcs_rc_t
jcs_parse_number(jcs_parser_t *ps, cJSON **item)
{
    const unsigned char  *start;
    char                 *endp;
    double                d;

    start = ps->p;

    if (*ps->p == '-') {
        ps->p++;
    }

    if (ps->p < ps->end && *ps->p == '0') {
        ps->p++;            /* a leading zero stands alone */

    } else if (!jcs_digits(ps)) {
        return IDEM_JCS_ESYNTAX;
    }

    if (ps->p < ps->end && *ps->p == '.') {
        ps->p++;
        if (!jcs_digits(ps)) {
            return IDEM_JCS_ESYNTAX;
        }
    }

    if (ps->p < ps->end && (*ps->p == 'e' || *ps->p == 'E')) {
        ps->p++;
        if (ps->p < ps->end && (*ps->p == '+' || *ps->p == '-')) {
            ps->p++;
        }
        if (!jcs_digits(ps)) {
            return IDEM_JCS_ESYNTAX;
        }
    }

    ps->str.len = 0;
    if (jcs_buf_add(&ps->str, start, ps->p - start) != 0) {
        return IDEM_JCS_ENOMEM;
    }

    d = strtod(ps->str.data, &endp);

    /*
     * strtod() stopping early can only mean a locale whose decimal
     * point is not '.'; refuse rather than read a different number.
     */
    if (endp != ps->str.data + ps->str.len || !isfinite(d)) {
        return IDEM_JCS_ENUMBER;
    }

    *item = cJSON_CreateNumber(d);

    return (*item == NULL) ? IDEM_JCS_ENOMEM : IDEM_JCS_OK;
}


static idem_jcs_rc_t
jcs_parse_literal(jcs_parser_t *ps, const char *word, cJSON **item)
{
    size_t  n;

    n = strlen(word);

    if ((size_t) (ps->end - ps->p) < n || memcmp(ps->p, word, n) != 0) {
        return IDEM_JCS_ESYNTAX;
    }

    ps->p += n;

    switch (word[0]) {
    case 't':  *item = cJSON_CreateTrue();  break;
    case 'f':  *item = cJSON_CreateFalse(); break;
    default:   *item = cJSON_CreateNull();  break;
    }

    return (*item == NULL) ? IDEM_JCS_ENOMEM : IDEM_JCS_OK;
}


static idem_jcs_rc_t
jcs_parse_scalar(jcs_parser_t *ps, cJSON **item)
{
    idem_jcs_rc_t  rc;

    switch (*ps->p) {
    case '"':
        rc = jcs_parse_string(ps, &ps->str);
        if (rc != IDEM_JCS_OK) {
            return rc;
        }

        *item = cJSON_CreateString(ps->str.data);
        return (*item == NULL) ? IDEM_JCS_ENOMEM : IDEM_JCS_OK;

    case 't':
        return jcs_parse_literal(ps, "true", item);

    case 'f':
        return jcs_parse_literal(ps, "false", item);

    case 'n':
        return jcs_parse_literal(ps, "null", item);

    default:
        if (*ps->p == '-' || (*ps->p >= '0' && *ps->p <= '9')) {
            return jcs_parse_number(ps, item);
        }

        return jcs_unexpected(ps);
    }
}


/* A member name and its colon; the name waits in ps->key for its value. */
static idem_jcs_rc_t
jcs_parse_key(jcs_parser_t *ps)
{
    idem_jcs_rc_t  rc;

    jcs_skip_ws(ps);

    if (ps->p == ps->end || *ps->p != '"') {
        return jcs_unexpected(ps);
    }

    rc = jcs_parse_string(ps, &ps->key);
    if (rc != IDEM_JCS_OK) {
        return rc;
    }

    jcs_skip_ws(ps);

    if (ps->p == ps->end || *ps->p != ':') {
        return jcs_unexpected(ps);
    }

    ps->p++;
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


/* '[' or '{' at ps->p; *done is set when the container was empty */
static idem_jcs_rc_t
jcs_open(jcs_parser_t *ps, int *done)
{
    idem_jcs_rc_t   rc;
    cJSON          *item;
    int             object;

    if (ps->depth == IDEM_JCS_MAX_DEPTH) {
        return IDEM_JCS_EDEPTH;
    }

    object = (*ps->p++ == '{');
    item = object ? cJSON_CreateObject() : cJSON_CreateArray();
    if (item == NULL) {
        return IDEM_JCS_ENOMEM;
    }

    rc = jcs_attach(ps, item);
    if (rc != IDEM_JCS_OK) {
        return rc;
    }

    jcs_skip_ws(ps);

    if (ps->p < ps->end && *ps->p == (object ? '}' : ']')) {
        ps->p++;
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
jcs_after_value(jcs_parser_t *ps, int *more)
{
    idem_jcs_rc_t   rc;
    cJSON          *top;
    int             object;

    for ( ;; ) {
        jcs_skip_ws(ps);

        if (ps->depth == 0) {
            *more = 0;
            return (ps->p == ps->end) ? IDEM_JCS_OK : jcs_unexpected(ps);
        }

        if (ps->p == ps->end) {
            return IDEM_JCS_ESYNTAX;
        }

        top = ps->stack[ps->depth - 1];
        object = cJSON_IsObject(top);

        if (*ps->p == ',') {
            ps->p++;
            *more = 1;
            return object ? jcs_parse_key(ps) : IDEM_JCS_OK;
        }

        if (*ps->p != (object ? '}' : ']')) {
            return jcs_unexpected(ps);
        }

        ps->p++;
        ps->depth--;

        if (object) {
            rc = jcs_sort_object(top);
            if (rc != IDEM_JCS_OK) {
                return rc;
            }
        }
    }
}


/* The whole text; iterative, the only stack is ps->stack. */
static idem_jcs_rc_t
jcs_parse_text(jcs_parser_t *ps)
{
    idem_jcs_rc_t   rc;
    cJSON          *item;
    int             more, done;

    do {
        jcs_skip_ws(ps);

        if (ps->p == ps->end) {
            return IDEM_JCS_ESYNTAX;
        }

        if (*ps->p == '{' || *ps->p == '[') {
            rc = jcs_open(ps, &done);
            if (rc != IDEM_JCS_OK) {
                return rc;
            }

            if (!done) {
                more = 1;
                continue;       /* the first element */
            }

        } else {
            rc = jcs_parse_scalar(ps, &item);
            if (rc != IDEM_JCS_OK) {
                return rc;
            }

            rc = jcs_attach(ps, item);
            if (rc != IDEM_JCS_OK) {
                return rc;
            }
        }

        rc = jcs_after_value(ps, &more);
        if (rc != IDEM_JCS_OK) {
            return rc;
        }

    } while (more);

    return IDEM_JCS_OK;
}


idem_jcs_rc_t
idem_jcs_parse(const char *in, size_t len, struct cJSON **tree)
{
    jcs_parser_t   ps;
    idem_jcs_rc_t  rc;

    memset(&ps, 0, sizeof(jcs_parser_t));
    ps.p = (const unsigned char *) in;
    ps.end = ps.p + len;

    rc = jcs_parse_text(&ps);

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


idem_jcs_rc_t
idem_jcs_canonicalize(const char *in, size_t len, idem_sink_t *out)
{
    cJSON          *tree;
    idem_jcs_rc_t   rc;

    rc = idem_jcs_parse(in, len, &tree);
    if (rc != IDEM_JCS_OK) {
        return rc;
    }

    rc = idem_jcs_write_value(tree, out);
    cJSON_Delete(tree);

    return rc;
}
