/*
 * Shared helpers of the libFuzzer targets in fuzz/: a growable memory
 * sink for the JCS writer, an assertion that aborts (so libFuzzer saves
 * the input as a crash artifact), and SHA-256 in hex.
 *
 * The targets check properties of the pure-C core, not only "no crash";
 * see fuzz/README.md.
 */

#ifndef FUZZ_COMMON_H
#define FUZZ_COMMON_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/evp.h>

#include "idem_jcs.h"


#define FUZZ_CHECK(cond, ...)                                                \
    do {                                                                     \
        if (!(cond)) {                                                       \
            fprintf(stderr, "\nfuzz property violated at %s:%d: %s\n  ",     \
                    __FILE__, __LINE__, #cond);                              \
            fprintf(stderr, __VA_ARGS__);                                    \
            fprintf(stderr, "\n");                                           \
            abort();                                                         \
        }                                                                    \
    } while (0)


typedef struct {
    char    *data;
    size_t   len;
    size_t   size;
} fuzz_buf_t;


static int
fuzz_buf_write(idem_sink_t *sink, const char *p, size_t n)
{
    fuzz_buf_t  *b;
    char        *d;
    size_t       size;

    b = sink->data;

    if (b->len + n + 1 > b->size) {
        size = (b->len + n + 1) * 2;
        d = realloc(b->data, size);
        if (d == NULL) {
            return -1;
        }
        b->data = d;
        b->size = size;
    }

    memcpy(b->data + b->len, p, n);
    b->len += n;
    b->data[b->len] = '\0';

    return 0;
}


static void
fuzz_buf_init(fuzz_buf_t *b, idem_sink_t *sink)
{
    memset(b, 0, sizeof(fuzz_buf_t));
    sink->write = fuzz_buf_write;
    sink->data = b;
}


static void
fuzz_buf_free(fuzz_buf_t *b)
{
    free(b->data);
    memset(b, 0, sizeof(fuzz_buf_t));
}


static int
fuzz_same(const fuzz_buf_t *a, const fuzz_buf_t *b)
{
    return a->len == b->len
           && (a->len == 0 || memcmp(a->data, b->data, a->len) == 0);
}


/*
 * An exact-size heap copy: ASan then reports any read past the end of
 * the input, which a pointer into libFuzzer's own buffer could hide.
 */
static char *
fuzz_dup(const uint8_t *data, size_t size)
{
    char  *p;

    p = malloc(size ? size : 1);
    if (p == NULL) {
        abort();
    }

    if (size) {
        memcpy(p, data, size);
    }

    return p;
}


static void
fuzz_sha256_hex(const void *p, size_t n, char hex[65])
{
    static const char  digits[] = "0123456789abcdef";
    unsigned char      md[EVP_MAX_MD_SIZE];
    unsigned int       mdlen, i;

    if (EVP_Digest(p, n, md, &mdlen, EVP_sha256(), NULL) != 1
        || mdlen != 32)
    {
        abort();
    }

    for (i = 0; i < 32; i++) {
        hex[2 * i] = digits[md[i] >> 4];
        hex[2 * i + 1] = digits[md[i] & 0xf];
    }

    hex[64] = '\0';
}


/* printable escape of (a prefix of) bytes for the failure message */
static const char *
fuzz_show(const char *p, size_t n)
{
    static char  out[4 * 200 + 8];
    size_t       i, o;

    o = 0;

    for (i = 0; i < n && i < 200; i++) {
        unsigned char  c = (unsigned char) p[i];

        if (c >= 0x20 && c < 0x7f && c != '\\') {
            out[o++] = (char) c;
        } else {
            o += (size_t) sprintf(out + o, "\\x%02x", c);
        }
    }

    if (i < n) {
        memcpy(out + o, "...", 3);
        o += 3;
    }

    out[o] = '\0';

    return out;
}

#endif /* FUZZ_COMMON_H */
