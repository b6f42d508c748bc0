/*
 * The text layer of the pure-C core: UTF-8, the RFC 8785 escapes of a
 * JSON string, the UTF-16 order of member names, lowercase hex and
 * decimal.
 * Pure C: no nginx types, no JSON grammar.
 */

#ifndef IDEM_TEXT_H
#define IDEM_TEXT_H

#include <stddef.h>
#include <stdint.h>

/* the one digit table: record keys, digests, \u00xx escapes agree on it */
extern const char  idem_hexdigits[16];

/* out gets 2 * n lowercase hex digits and a NUL */
void idem_hex(const unsigned char *in, size_t n, char *out);

/* n in decimal at p (1 to 20 digits, no NUL); the end */
char *idem_decimal(char *p, uint64_t n);

/*
 * The value of the four hex digits (either case) at p, or -1.  Inline:
 * the parser reads every \u escape through it.
 */
static inline int
idem_hex4(const unsigned char *p, uint32_t *v)
{
    int  i, c;

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

/*
 * Length (1-4) of the well-formed UTF-8 sequence at p[0..avail), 0 if
 * there is none; *cp gets its code point.
 */
size_t idem_utf8_decode(const unsigned char *p, size_t avail, uint32_t *cp);

/* cp < 0x110000 and not a surrogate; returns the length written (1-4) */
size_t idem_utf8_encode(uint32_t cp, unsigned char out[4]);

/* 1 if p[0..len) is well-formed UTF-8 (no surrogates, no overlongs). */
int idem_utf8_valid(const char *p, size_t len);

/*
 * RFC 8785 3.2.2.2: how c (a control character, '"' or '\\') is written
 * inside a canonical string literal.  Returns the length (2 or 6).
 */
size_t idem_json_escape(uint32_t c, char esc[6]);

/*
 * Orders two strings by their UTF-16 code units (RFC 8785 3.2.3): <0, 0,
 * >0 like memcmp.  With escaped == 0 a and b are UTF-8; with escaped == 1
 * they are the insides of canonical string literals (idem_json_escape()
 * escapes, otherwise UTF-8), the form the canonicalizer keeps names in.
 */
int idem_utf16_cmp(const char *a, size_t alen, const char *b, size_t blen,
    int escaped);

/*
 * A value a client or an approver chose (a key, an approval's sub, an
 * approved_by, a route, an identity), made safe for one line of a log or
 * a terminal: printable ASCII and well-formed UTF-8 are kept; a control
 * character (C0, DEL, and the C1 controls U+0080-U+009F), each byte of an
 * ill-formed UTF-8 sequence, and the backslash (so that a "\x0A" the
 * client typed is not read as an escaped newline) are written \xNN, two
 * uppercase hex digits per byte.  idem_log_escape_len() is the length
 * idem_log_escape() writes (at most 4 * len), without a NUL.
 */
size_t idem_log_escape_len(const char *s, size_t len);
size_t idem_log_escape(char *out, const char *s, size_t len);

#endif /* IDEM_TEXT_H */
