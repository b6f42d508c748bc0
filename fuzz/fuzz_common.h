/*
 * Shared helpers of the libFuzzer targets in fuzz/: the memory sink of
 * the unit tests (t/unit/mem_sink.h), an assertion that aborts (so
 * libFuzzer saves the input as a crash artifact), and SHA-256 in hex.
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
#include "mem_sink.h"


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


/* printf, not idem_hex(): the expected value must not share the code */
static void
fuzz_sha256_hex(const void *p, size_t n, char hex[65])
{
    unsigned char  md[EVP_MAX_MD_SIZE];
    unsigned int   mdlen, i;

    if (EVP_Digest(p, n, md, &mdlen, EVP_sha256(), NULL) != 1
        || mdlen != 32)
    {
        abort();
    }

    for (i = 0; i < 32; i++) {
        snprintf(hex + 2 * i, 3, "%02x", md[i]);
    }
}


/* 1 when p[0..n) is lowercase hex (written here, not idem_is_hex()) */
static int
fuzz_lower_hex(const char *p, size_t n)
{
    size_t  i;

    for (i = 0; i < n; i++) {
        if (!((p[i] >= '0' && p[i] <= '9') || (p[i] >= 'a' && p[i] <= 'f'))) {
            return 0;
        }
    }

    return 1;
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
