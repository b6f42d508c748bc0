/*
 * Numbers.  A token is read with strtod() whole (any length), which glibc
 * rounds correctly; the result must be finite, underflow to zero is
 * accepted as in ECMAScript's JSON.parse.  It is written back as
 * ECMAScript's Number::toString does: the shortest digits that read back
 * as the same double, in the layout of ECMA-262 7.1.12.1.
 *
 * Both directions assume the C locale's LC_NUMERIC (nginx never changes
 * it); with another decimal point numbers are refused, not misread.
 */

#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "idem_number.h"
#include "idem_text.h"


/* shortest digits */

/*
 * Reads the output of printf("%.*e"): sign, digits (the decimal point,
 * whatever the locale makes it, is skipped) and the decimal exponent.
 */
static size_t
num_read_e_format(const char *s, char *digits, int *exp10)
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
num_read_back(const char *d, int p, int e)
{
    char  tmp[48];

    snprintf(tmp, sizeof(tmp), "%.*se%d", p, d, e - p + 1);

    return strtod(tmp, NULL);
}


/* the next p-digit decimal above (dir > 0) or below (dir < 0) d x 10^e */
static void
num_step_digits(char *d, int p, int *e, int dir)
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
num_try_precision(double v, int p, char *d, int *e)
{
    char    tmp[48];
    double  back;

    snprintf(tmp, sizeof(tmp), "%.*e", p - 1, v);

    if ((int) num_read_e_format(tmp, d, e) != p) {
        return 0;
    }

    back = num_read_back(d, p, *e);

    if (back == v) {
        return 1;
    }

    num_step_digits(d, p, e, (back < v) ? 1 : -1);

    return num_read_back(d, p, *e) == v;
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
num_shortest(double v, char *digits, int *n)
{
    char  d[24];
    int   lo, hi, mid, e, best_p, best_e;

    lo = 1;
    hi = 17;

    if (v >= DBL_MIN) {
        if (num_try_precision(v, 15, digits, &e)) {
            *n = e + 1;
            return 15;
        }

        lo = 16;
    }

    best_p = 0;
    best_e = 0;

    while (lo < hi) {
        mid = (lo + hi) / 2;

        if (num_try_precision(v, mid, d, &e)) {
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
        if (!num_try_precision(v, lo, digits, &best_e)) {
            snprintf(d, sizeof(d), "%.16e", v);
            lo = (int) num_read_e_format(d, digits, &best_e);
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
num_integer_digits(double v, char *digits, int *n)
{
    int  len;

    len = (int) (idem_decimal(digits, (uint64_t) v) - digits);

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
num_short_decimal(double v, char *digits, int *n)
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
            k = num_integer_digits(m, digits, n);
            *n -= f;
            return k;
        }
    }

    return 0;
}


/* Number::toString layout (ECMA-262 7.1.12.1) of digits k, exponent n */
static size_t
num_layout(int neg, const char *s, int k, int n, char *buf)
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
        k = num_integer_digits(d, digits, &n);

    } else if ((k = num_short_decimal(d, digits, &n)) == 0) {
        k = num_shortest(d, digits, &n);
    }

    while (k > 1 && digits[k - 1] == '0') {
        k--;
    }

    return num_layout(neg, digits, k, n, buf);
}



/* token text */

/*
 * Canonical text of a number token without strtod() when it already is
 * one: no exponent, at most 15 significant digits (so it is the shortest
 * form of its double, DBL_DIG), and a magnitude ECMAScript prints without
 * an exponent (1e-6 <= |x| < 1e21).  Trailing fraction zeros go, and -0
 * is 0, so what is left is a part of the token: in place, it can be
 * moved down over itself.  Returns 0 when the token does not qualify.
 */
static int
num_plain(const unsigned char *s, size_t n, const char **text,
    size_t *len)
{
    const unsigned char  *e, *p, *ip, *ie, *fp, *fe;
    size_t                z;

    e = s + n;
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

    if (*ip == '0' && fe == fp) {
        *text = (const char *) ip;      /* "0" */
        *len = 1;
        return 1;
    }

    if (*ip == '0') {
        for (z = 0; fp + z < fe && fp[z] == '0'; z++) {
            /* void */
        }

        if (z > 5 || (fe - fp) - z > 15) {
            return 0;
        }

    } else if ((ie - ip) + (fe - fp) > 15) {
        return 0;
    }

    *text = (const char *) s;
    *len = ((fe > fp) ? fe : ie) - s;
    return 1;
}


idem_jcs_rc_t
idem_jcs_number_value(const unsigned char *s, size_t n, double *d)
{
    char           small[64], *tmp, *endp;
    idem_jcs_rc_t  rc;

    /* strtod() wants a NUL, the token is followed by more input */
    tmp = (n < sizeof(small)) ? small : malloc(n + 1);
    if (tmp == NULL) {
        return IDEM_JCS_ENOMEM;
    }

    memcpy(tmp, s, n);
    tmp[n] = '\0';

    *d = strtod(tmp, &endp);

    /*
     * strtod() stopping early can only mean a locale whose decimal
     * point is not '.'; refuse rather than read a different number.
     */
    rc = (endp != tmp + n || !isfinite(*d)) ? IDEM_JCS_ENUMBER : IDEM_JCS_OK;

    if (tmp != small) {
        free(tmp);
    }

    return rc;
}


idem_jcs_rc_t
idem_jcs_number_text(const unsigned char *s, size_t n,
    char buf[IDEM_JCS_NUMBER_MAX], const char **text, size_t *len)
{
    idem_jcs_rc_t  rc;
    double         d;

    if (num_plain(s, n, text, len)) {
        return IDEM_JCS_OK;
    }

    rc = idem_jcs_number_value(s, n, &d);
    if (rc != IDEM_JCS_OK) {
        return rc;
    }

    *len = idem_jcs_format_number(d, buf);
    *text = buf;

    return IDEM_JCS_OK;
}
