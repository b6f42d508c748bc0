/*
 * Idempotency-Key field value parsing: a bare token (what most clients send)
 * or an RFC 8941 sf-string (what the IETF draft writes).  Both name the
 * same key.  Pure C.
 */

#ifndef IDEM_KEY_H
#define IDEM_KEY_H

#include <stddef.h>

#define IDEM_KEY_MAX  255

typedef enum {
    IDEM_KEY_OK = 0,
    IDEM_KEY_EMPTY,         /* nothing, or "" */
    IDEM_KEY_TOO_LONG,      /* more than IDEM_KEY_MAX bytes after unquoting */
    IDEM_KEY_BAD_CHAR,      /* outside printable ASCII (bare: 0x21-0x7e) */
    IDEM_KEY_BAD_STRING     /* malformed sf-string: quotes, escapes, params */
} idem_key_rc_t;

/*
 * in/len: the field value as received (surrounding SP/HTAB are ignored).
 * out must hold at least len bytes; *out_len receives the key length.
 * Bare form: 1..255 bytes of 0x21-0x7e, not starting with DQUOTE.
 * Quoted form: DQUOTE *( 0x20-0x7e except DQUOTE and "\" / "\" DQUOTE /
 * "\\" ) DQUOTE, nothing after it; 1..255 bytes after unescaping.
 */
idem_key_rc_t idem_key_parse(const char *in, size_t len, char *out,
    size_t *out_len);

const char *idem_key_strerror(idem_key_rc_t rc);

#endif /* IDEM_KEY_H */
