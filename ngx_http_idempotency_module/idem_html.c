/*
 * Visible escapes for people: the approval page's HTML and the tools'
 * terminal output (idem_html.h).  Pure C.
 */

#include <stdio.h>
#include <string.h>

#include "idem_html.h"
#include "idem_text.h"


/* the brackets of a visible escape: U+27E8, U+27E9 */
#define IDEM_HTML_OPEN   "\xe2\x9f\xa8"
#define IDEM_HTML_CLOSE  "\xe2\x9f\xa9"


int
idem_char_hidden(uint32_t cp)
{
    return cp < 0x20 || (cp >= 0x7f && cp <= 0x9f)
           || cp == 0xad                        /* soft hyphen */
           || cp == 0x061c                      /* Arabic letter mark */
           || (cp >= 0x200b && cp <= 0x200f)    /* zero-width, LRM, RLM */
           || (cp >= 0x2028 && cp <= 0x202e)    /* separators, embeddings,
                                                   overrides */
           || (cp >= 0x2060 && cp <= 0x2064)    /* word joiner, invisibles */
           || (cp >= 0x2066 && cp <= 0x2069)    /* isolates */
           || cp == 0xfeff;                     /* zero-width no-break */
}


/* one piece of s at p: its length, its code point (-1: a bad byte) */
static size_t
html_next(const unsigned char *p, size_t avail, int64_t *cp)
{
    size_t    n;
    uint32_t  c;

    n = idem_utf8_decode(p, avail, &c);

    if (n == 0) {
        *cp = -1;
        return 1;
    }

    *cp = c;

    return n;
}


/* the HTML of one piece into buf (at most 16 bytes); its length */
static size_t
html_piece(const unsigned char *p, size_t n, int64_t cp, char *buf)
{
    const char  *ref;

    if (cp < 0) {
        return (size_t) sprintf(buf, IDEM_HTML_OPEN "0x%02X" IDEM_HTML_CLOSE,
                                p[0]);
    }

    if (idem_char_hidden((uint32_t) cp)) {
        return (size_t) sprintf(buf, IDEM_HTML_OPEN "U+%04X" IDEM_HTML_CLOSE,
                                (unsigned) cp);
    }

    switch (cp) {
    case '&': ref = "&amp;"; break;
    case '<': ref = "&lt;"; break;
    case '>': ref = "&gt;"; break;
    case '"': ref = "&quot;"; break;
    case '\'': ref = "&#39;"; break;
    default:
        memcpy(buf, p, n);
        return n;
    }

    memcpy(buf, ref, strlen(ref));

    return strlen(ref);
}


/* one piece's escaped form into buf; returns its length */
typedef size_t (*idem_piece_pt)(const unsigned char *p, size_t n, int64_t cp,
    char *buf);


/*
 * The one walk both forms share: with out NULL it only counts (the _len
 * functions), else it writes.  Through buf: sprintf's NUL must not land
 * past the caller's end.
 */
static size_t
escape_walk(char *out, const char *s, size_t len, idem_piece_pt piece)
{
    char                  buf[32];
    size_t                i, n, k, total;
    int64_t               cp;
    const unsigned char  *p;

    p = (const unsigned char *) s;
    total = 0;

    for (i = 0; i < len; i += n) {
        n = html_next(p + i, len - i, &cp);
        k = piece(p + i, n, cp, buf);

        if (out != NULL) {
            memcpy(out + total, buf, k);
        }

        total += k;
    }

    return total;
}


size_t
idem_html_len(const char *s, size_t len)
{
    return escape_walk(NULL, s, len, html_piece);
}


char *
idem_html_put(char *out, const char *s, size_t len)
{
    return out + escape_walk(out, s, len, html_piece);
}


/* the terminal form of one piece into buf (at most 16 bytes) */
static size_t
term_piece(const unsigned char *p, size_t n, int64_t cp, char *buf)
{
    if (cp < 0 || (cp < 0x80 && idem_char_hidden((uint32_t) cp))) {
        return (size_t) sprintf(buf, "\\x%02X", p[0]);
    }

    if (idem_char_hidden((uint32_t) cp)) {
        return (size_t) sprintf(buf, "\\u{%04X}", (unsigned) cp);
    }

    if (cp == '\\') {
        memcpy(buf, "\\\\", 2);
        return 2;
    }

    memcpy(buf, p, n);

    return n;
}


size_t
idem_term_len(const char *s, size_t len)
{
    return escape_walk(NULL, s, len, term_piece);
}


char *
idem_term_put(char *out, const char *s, size_t len)
{
    return out + escape_walk(out, s, len, term_piece);
}
