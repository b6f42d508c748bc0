/*
 * Text: UTF-8 as RFC 3629 defines it, the escapes RFC 8785 writes inside
 * a string, and the UTF-16 order RFC 8785 sorts member names by.  The
 * canonicalizer, the fingerprint and the record code all take their
 * UTF-8 rules and hex digits from here, so they cannot disagree.
 */

#include <string.h>

#include "idem_text.h"


const char  idem_hexdigits[16] = "0123456789abcdef";


void
idem_hex(const unsigned char *in, size_t n, char *out)
{
    size_t  i;

    for (i = 0; i < n; i++) {
        out[2 * i] = idem_hexdigits[in[i] >> 4];
        out[2 * i + 1] = idem_hexdigits[in[i] & 0x0f];
    }

    out[2 * n] = '\0';
}


static const char  idem_decpairs[] =
    "00010203040506070809101112131415161718192021222324252627282930313233"
    "34353637383940414243444546474849505152535455565758596061626364656667"
    "6869707172737475767778798081828384858687888990919293949596979899";


/*
 * Two digits a division: the audit file's 13-digit times, the records'
 * lengths and the canonical form's integers all go through here.
 */
char *
idem_decimal(char *p, uint64_t n)
{
    char    tmp[24], *t;
    size_t  len;

    t = tmp + sizeof(tmp);

    while (n >= 100) {
        t -= 2;
        memcpy(t, &idem_decpairs[2 * (n % 100)], 2);
        n /= 100;
    }

    if (n >= 10) {
        t -= 2;
        memcpy(t, &idem_decpairs[2 * n], 2);

    } else {
        *--t = (char) ('0' + n);
    }

    len = tmp + sizeof(tmp) - t;

    return (char *) memcpy(p, t, len) + len;
}


/* UTF-8 */

/*
 * Follows the table of RFC 3629 section 4: no overlongs, no surrogates
 * (ED A0..BF), nothing above U+10FFFF (F4 90.. and F5..FF).
 */
size_t
idem_utf8_decode(const unsigned char *p, size_t avail, uint32_t *cp)
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

        n = idem_utf8_decode(p, end - p, &cp);
        if (n == 0) {
            return 0;
        }
        p += n;
    }

    return 1;
}


size_t
idem_utf8_encode(uint32_t cp, unsigned char out[4])
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


/* escapes */

size_t
idem_json_escape(uint32_t c, char esc[6])
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
    esc[4] = idem_hexdigits[(c >> 4) & 0x0f];
    esc[5] = idem_hexdigits[c & 0x0f];

    return 6;
}


/*
 * UTF-8 byte order is code point order, and UTF-16 order differs from it
 * only where a supplementary character (lead byte F0..F4) meets one of
 * U+E000..U+FFFF (EE, EF): the former begins with a surrogate, D800..DBFF,
 * so it sorts first.  Only lead bytes can differ in that way: where
 * continuation bytes differ, the leads before them were equal.  On bytes
 * that are not UTF-8 this is still a total order (a reordering of byte
 * values), equal only for equal strings.
 */
static int
text_utf8_order(unsigned char a, unsigned char b)
{
    if (a >= 0xf0 && a <= 0xf4 && (b == 0xee || b == 0xef)) {
        return -1;
    }

    if (b >= 0xf0 && b <= 0xf4 && (a == 0xee || a == 0xef)) {
        return 1;
    }

    return (a < b) ? -1 : 1;
}


/* the length of the code point at p[0..avail) of a canonical literal */
static size_t
text_literal_len(const unsigned char *p, size_t avail)
{
    if (p[0] == '\\') {
        return (avail >= 6 && p[1] == 'u') ? 6 : (avail >= 2) ? 2 : 1;
    }

    return (p[0] < 0xc0) ? 1 : (p[0] < 0xe0) ? 2 : (p[0] < 0xf0) ? 3 : 4;
}


/*
 * What orders the code point at p of a canonical literal against another
 * at the same offset: an escape's code point (all below 0x80), else the
 * first byte, which for a character that is not ASCII exceeds them all.
 */
static uint32_t
text_literal_key(const unsigned char *p, size_t avail)
{
    uint32_t  cp;

    if (p[0] != '\\' || avail < 2) {
        return p[0];
    }

    switch (p[1]) {
    case 'b':  return '\b';
    case 'f':  return '\f';
    case 'n':  return '\n';
    case 'r':  return '\r';
    case 't':  return '\t';

    case 'u':
        if (avail >= 6 && idem_hex4(p + 2, &cp) == 0) {
            return cp;
        }
        return p[1];

    default:
        return p[1];        /* '"' or '\\' */
    }
}


/*
 * Two canonical literals differ first at byte i: an escape can only be
 * told from the start, so walk to the code point holding byte i (it
 * starts at the same offset in both); unless one of the two is an
 * escape, they are UTF-8 characters.
 */
static int
text_literal_order(const unsigned char *a, size_t alen,
    const unsigned char *b, size_t blen, size_t i)
{
    size_t    at, n;
    uint32_t  ka, kb;

    for (at = 0; at + (n = text_literal_len(a + at, alen - at)) <= i; at += n) {
        /* void */
    }

    if (a[at] != '\\' && b[at] != '\\') {
        return text_utf8_order(a[i], b[i]);
    }

    ka = text_literal_key(a + at, alen - at);
    kb = text_literal_key(b + at, blen - at);

    if (ka == kb) {
        /* not canonical literals: any consistent answer will do */
        return (a[i] < b[i]) ? -1 : 1;
    }

    return (ka < kb) ? -1 : 1;
}


int
idem_utf16_cmp(const char *a, size_t alen, const char *b, size_t blen,
    int escaped)
{
    const unsigned char  *ua, *ub;
    size_t                i, n;

    ua = (const unsigned char *) a;
    ub = (const unsigned char *) b;
    n = (alen < blen) ? alen : blen;

    for (i = 0; i < n && ua[i] == ub[i]; i++) {
        /* void */
    }

    if (i == n) {
        return (alen < blen) ? -1 : (alen > blen);
    }

    if (escaped) {
        return text_literal_order(ua, alen, ub, blen, i);
    }

    return text_utf8_order(ua[i], ub[i]);
}


/*
 * Bytes of s[i..] kept as they are (a printable ASCII character or one
 * well-formed UTF-8 sequence that is not a C1 control), or 0: escape s[i]
 */
static size_t
log_kept(const unsigned char *s, size_t avail)
{
    size_t    n;
    uint32_t  cp;

    if (s[0] < 0x80) {
        return (s[0] >= 0x20 && s[0] < 0x7f && s[0] != '\\') ? 1 : 0;
    }

    n = idem_utf8_decode(s, avail, &cp);

    return (n == 0 || cp <= 0x9f) ? 0 : n;
}


size_t
idem_log_escape_len(const char *s, size_t len)
{
    size_t                i, n, out;
    const unsigned char  *p = (const unsigned char *) s;

    out = 0;

    for (i = 0; i < len; i += n) {
        n = log_kept(p + i, len - i);
        out += n ? n : 4;
        n = n ? n : 1;
    }

    return out;
}


size_t
idem_log_escape(char *out, const char *s, size_t len)
{
    char                 *o = out;
    size_t                i, n;
    const unsigned char  *p = (const unsigned char *) s;

    for (i = 0; i < len; i += n) {
        n = log_kept(p + i, len - i);

        if (n) {
            memcpy(o, p + i, n);
            o += n;
            continue;
        }

        *o++ = '\\';
        *o++ = 'x';
        *o++ = "0123456789ABCDEF"[p[i] >> 4];
        *o++ = "0123456789ABCDEF"[p[i] & 0xf];
        n = 1;
    }

    return (size_t) (o - out);
}
