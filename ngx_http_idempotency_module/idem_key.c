/*
 * Idempotency-Key field value: a bare token or an RFC 8941 sf-string
 * (section 3.3.3).  "abc" and abc name the same key.
 */

#include "idem_key.h"


const char *
idem_key_strerror(idem_key_rc_t rc)
{
    switch (rc) {
    case IDEM_KEY_OK:          return "ok";
    case IDEM_KEY_EMPTY:       return "empty key";
    case IDEM_KEY_TOO_LONG:    return "key longer than 255 bytes";
    case IDEM_KEY_BAD_CHAR:    return "key has a byte outside printable ASCII";
    case IDEM_KEY_BAD_STRING:  return "malformed quoted key";
    }

    return "unknown error";
}


/*
 * Inside the quotes: printable ASCII 0x20-0x7e, "\" only before DQUOTE
 * or "\", and the closing DQUOTE must end the value (sf-string has no
 * parameters, and a parameterised Item is not what a key is).
 */
static idem_key_rc_t
idem_key_unquote(const unsigned char *p, const unsigned char *end,
    char *out, size_t *out_len)
{
    size_t  n;

    n = 0;

    for (p++; p < end; p++) {
        if (*p < 0x20 || *p > 0x7e) {
            return IDEM_KEY_BAD_CHAR;
        }

        if (*p == '"') {
            if (p + 1 != end) {
                return IDEM_KEY_BAD_STRING;
            }

            if (n == 0) {
                return IDEM_KEY_EMPTY;
            }

            if (n > IDEM_KEY_MAX) {
                return IDEM_KEY_TOO_LONG;
            }

            *out_len = n;
            return IDEM_KEY_OK;
        }

        if (*p == '\\') {
            p++;
            if (p == end || (*p != '"' && *p != '\\')) {
                return IDEM_KEY_BAD_STRING;
            }
        }

        out[n++] = (char) *p;
    }

    /* no closing quote */
    return IDEM_KEY_BAD_STRING;
}


idem_key_rc_t
idem_key_parse(const char *in, size_t len, char *out, size_t *out_len)
{
    const unsigned char  *p, *end;
    size_t                n;

    *out_len = 0;

    p = (const unsigned char *) in;
    end = p + len;

    while (p < end && (*p == ' ' || *p == '\t')) {
        p++;
    }

    while (end > p && (end[-1] == ' ' || end[-1] == '\t')) {
        end--;
    }

    if (p == end) {
        return IDEM_KEY_EMPTY;
    }

    if (*p == '"') {
        return idem_key_unquote(p, end, out, out_len);
    }

    for (n = 0; p + n < end; n++) {
        if (p[n] < 0x21 || p[n] > 0x7e) {
            return IDEM_KEY_BAD_CHAR;
        }

        out[n] = (char) p[n];
    }

    if (n > IDEM_KEY_MAX) {
        return IDEM_KEY_TOO_LONG;
    }

    *out_len = n;
    return IDEM_KEY_OK;
}
