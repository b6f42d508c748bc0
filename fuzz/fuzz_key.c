/*
 * libFuzzer target: the Idempotency-Key field value parser (idem_key_parse).
 *
 * Properties, for every input:
 *  - deterministic: the same input gives the same rc and key every time;
 *  - rc is a documented code; the output buffer is exactly as long as the
 *    input (the documented minimum), so ASan reports any write past it;
 *  - an accepted key is 1..255 bytes of printable ASCII (0x20-0x7e), and
 *    0x21-0x7e when the value was a bare token;
 *  - surrounding SP/HTAB do not change the answer;
 *  - bare <-> quoted equivalence: the key re-quoted as an RFC 8941 String
 *    ("..." with \" and \\ escaped) parses back to the same key, and a key
 *    without spaces that does not start with DQUOTE, sent bare, too;
 *  - a bare token is accepted exactly when it is 1..255 bytes of 0x21-0x7e.
 */

#include "idem_key.h"

#include "fuzz_common.h"


static void
fuzz_key_expect(const char *in, size_t len, const char *key, size_t key_len,
    const char *what)
{
    char           *out;
    size_t          out_len;
    idem_key_rc_t   rc;

    out = malloc(len ? len : 1);
    if (out == NULL) {
        abort();
    }

    rc = idem_key_parse(in, len, out, &out_len);

    FUZZ_CHECK(rc == IDEM_KEY_OK, "%s \"%s\" rejected: %s", what,
               fuzz_show(in, len), idem_key_strerror(rc));
    FUZZ_CHECK(out_len == key_len && memcmp(out, key, key_len) == 0,
               "%s gives another key (%zu bytes instead of %zu)", what,
               out_len, key_len);
    free(out);
}


int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char           *in, *out, *out2, *q, *w;
    size_t          out_len, out2_len, i, n, b, e;
    idem_key_rc_t   rc, rc2;
    int             bare, ok;

    in = fuzz_dup(data, size);
    out = malloc(size ? size : 1);
    out2 = malloc(size ? size : 1);
    if (out == NULL || out2 == NULL) {
        abort();
    }

    rc = idem_key_parse(in, size, out, &out_len);
    rc2 = idem_key_parse(in, size, out2, &out2_len);

    FUZZ_CHECK(rc == rc2, "rc %d then %d for \"%s\"", rc, rc2,
               fuzz_show(in, size));
    FUZZ_CHECK(rc >= IDEM_KEY_OK && rc <= IDEM_KEY_BAD_STRING,
               "unexpected rc %d for \"%s\"", rc, fuzz_show(in, size));

    /* the value without surrounding SP/HTAB */
    for (b = 0; b < size && (in[b] == ' ' || in[b] == '\t'); b++) { }
    for (e = size; e > b && (in[e - 1] == ' ' || in[e - 1] == '\t'); e--) { }

    bare = (e > b && in[b] != '"');

    if (bare) {
        ok = (e - b >= 1 && e - b <= IDEM_KEY_MAX);
        for (i = b; ok && i < e; i++) {
            ok = ((unsigned char) in[i] >= 0x21 && (unsigned char) in[i] <= 0x7e);
        }

        FUZZ_CHECK(ok == (rc == IDEM_KEY_OK),
                   "bare token \"%s\": rc %s, expected %s", fuzz_show(in, size),
                   idem_key_strerror(rc), ok ? "ok" : "a rejection");
    }

    if (e == b) {
        FUZZ_CHECK(rc == IDEM_KEY_EMPTY, "blank value: rc %s",
                   idem_key_strerror(rc));
    }

    /* padding does not change the answer */
    w = malloc(size + 4);
    if (w == NULL) {
        abort();
    }
    memcpy(w, " \t", 2);
    if (size) {
        memcpy(w + 2, in, size);
    }
    memcpy(w + 2 + size, "\t ", 2);

    {
        char    *o = malloc(size + 4);
        size_t   ol;

        if (o == NULL) {
            abort();
        }
        rc2 = idem_key_parse(w, size + 4, o, &ol);
        FUZZ_CHECK(rc2 == rc, "padding changes rc %d -> %d for \"%s\"", rc, rc2,
                   fuzz_show(in, size));
        if (rc == IDEM_KEY_OK) {
            FUZZ_CHECK(ol == out_len && memcmp(o, out, ol) == 0,
                       "padding changes the key of \"%s\"", fuzz_show(in, size));
        }
        free(o);
    }
    free(w);

    if (rc != IDEM_KEY_OK) {
        goto done;
    }

    FUZZ_CHECK(out2_len == out_len && memcmp(out, out2, out_len) == 0,
               "two keys for \"%s\"", fuzz_show(in, size));
    FUZZ_CHECK(out_len >= 1 && out_len <= IDEM_KEY_MAX, "key length %zu",
               out_len);
    FUZZ_CHECK(out_len <= size, "key longer than the input");

    for (i = 0; i < out_len; i++) {
        unsigned char  c = (unsigned char) out[i];

        FUZZ_CHECK(c >= 0x20 && c <= 0x7e, "byte 0x%02x in key of \"%s\"", c,
                   fuzz_show(in, size));
        FUZZ_CHECK(!bare || c != 0x20, "space in a bare key");
    }

    if (bare) {
        FUZZ_CHECK(out_len == e - b && memcmp(out, in + b, out_len) == 0,
                   "bare token changed: \"%s\"", fuzz_show(in, size));
    }

    /* re-quote as an sf-string */
    q = malloc(2 * out_len + 2);
    if (q == NULL) {
        abort();
    }

    n = 0;
    q[n++] = '"';
    for (i = 0; i < out_len; i++) {
        if (out[i] == '"' || out[i] == '\\') {
            q[n++] = '\\';
        }
        q[n++] = out[i];
    }
    q[n++] = '"';

    fuzz_key_expect(q, n, out, out_len, "re-quoted key");
    free(q);

    /* and bare, where a bare token can carry it */
    if (out[0] != '"' && memchr(out, ' ', out_len) == NULL) {
        fuzz_key_expect(out, out_len, out, out_len, "key sent bare");
    }

done:

    free(in);
    free(out);
    free(out2);

    return 0;
}
