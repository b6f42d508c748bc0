/*
 * The strict parser's pieces.  cJSON's own parser cannot be made strict
 * enough: it keeps duplicate names, accepts invalid UTF-8, truncates
 * strings at \u0000, turns 1e400 into infinity, recurses (stack depth)
 * and, in upstream 1.7.15, copies at most 63 characters of a number into
 * its strtod buffer, so a valid long number (70 digits) is misread or
 * rejected depending on the build.  Doing grammar, UTF-8, escapes, depth
 * and numbers in one pass over the bytes means every rejection is
 * decided here, identically on every build.
 */

#include <stdlib.h>
#include <string.h>

#include "idem_jcs_parse.h"


int
idem_jcs_buf_grow(jcs_buf_t *b, size_t n)
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

    /* the canonicalizer keeps 32-bit offsets into its buffer */
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


int
idem_jcs_buf_add(jcs_buf_t *b, const void *p, size_t n)
{
    if (idem_jcs_buf_grow(b, n) != 0) {
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


idem_jcs_rc_t
idem_jcs_unexpected(jcs_in_t *in)
{
    uint32_t  cp;

    if (in->p < in->end && *in->p >= 0x80
        && idem_utf8_decode(in->p, in->end - in->p, &cp) == 0)
    {
        return IDEM_JCS_EUTF8;
    }

    return IDEM_JCS_ESYNTAX;
}


/* strings */

static int
jcs_hex4(const unsigned char *p, const unsigned char *end, uint32_t *v)
{
    if (end - p < 4) {
        return -1;
    }

    return idem_hex4(p, v);
}


/* \u escapes of a surrogate pair are one code point; *pp is after 'u' */
static idem_jcs_rc_t
jcs_parse_u_escape(const unsigned char **pp, const unsigned char *end,
    uint32_t *cp)
{
    const unsigned char  *p;
    uint32_t              lo;

    p = *pp;

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

    *pp = p;
    return IDEM_JCS_OK;
}


/* *pp points after the backslash */
static idem_jcs_rc_t
jcs_parse_escape(const unsigned char **pp, const unsigned char *end,
    uint32_t *cp)
{
    if (*pp == end) {
        return IDEM_JCS_ESYNTAX;
    }

    switch (*(*pp)++) {
    case '"':  *cp = '"';  break;
    case '\\': *cp = '\\'; break;
    case '/':  *cp = '/';  break;
    case 'b':  *cp = '\b'; break;
    case 'f':  *cp = '\f'; break;
    case 'n':  *cp = '\n'; break;
    case 'r':  *cp = '\r'; break;
    case 't':  *cp = '\t'; break;

    case 'u':
        return jcs_parse_u_escape(pp, end, cp);

    default:
        return IDEM_JCS_ESYNTAX;
    }

    return IDEM_JCS_OK;
}


/* An escape at p (the backslash), appended decoded or as its JCS form. */
static idem_jcs_rc_t
jcs_add_escape(const unsigned char **pp, const unsigned char *end,
    jcs_buf_t *b, int canon, int *plain)
{
    unsigned char   out[6];
    idem_jcs_rc_t   rc;
    uint32_t        cp;
    size_t          n;

    (*pp)++;

    rc = jcs_parse_escape(pp, end, &cp);
    if (rc != IDEM_JCS_OK) {
        return rc;
    }

    if (canon && (cp < 0x20 || cp == '"' || cp == '\\')) {
        n = idem_json_escape(cp, (char *) out);
        *plain = 0;

    } else {
        n = idem_utf8_encode(cp, out);
    }

    return (idem_jcs_buf_add(b, out, n) != 0) ? IDEM_JCS_ENOMEM : IDEM_JCS_OK;
}


idem_jcs_rc_t
idem_jcs_read_string(jcs_in_t *in, jcs_buf_t *b, int canon, int *plain)
{
    const unsigned char  *p, *end, *run;
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

        if (p > run && idem_jcs_buf_add(b, run, p - run) != 0) {
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
            rc = jcs_add_escape(&p, end, b, canon, plain);
            if (rc != IDEM_JCS_OK) {
                return rc;
            }
            continue;
        }

        n = idem_utf8_decode(p, end - p, &cp);
        if (n == 0) {
            return IDEM_JCS_EUTF8;
        }

        if (idem_jcs_buf_add(b, p, n) != 0) {
            return IDEM_JCS_ENOMEM;
        }
        p += n;
    }

    in->p = p + 1;
    return IDEM_JCS_OK;
}


/* numbers and literals */

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


idem_jcs_rc_t
idem_jcs_scan_number(jcs_in_t *in)
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


idem_jcs_rc_t
idem_jcs_literal(jcs_in_t *in, const char **word, size_t *len)
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
