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


/* one input and what idem_key_parse() made of it */
typedef struct {
    char           *in;         /* exact-size copy of the input */
    size_t          size;
    idem_key_rc_t   rc;
    char           *out;        /* exactly size bytes: the documented room */
    size_t          out_len;
    size_t          b, e;       /* the value without surrounding SP/HTAB */
    int             bare;       /* a token, not a quoted string */
} fuzz_key_t;


static char *
fuzz_alloc(size_t n)
{
    char  *p;

    p = malloc(n ? n : 1);
    if (p == NULL) {
        abort();
    }

    return p;
}


/* the same input again: the same rc, and the same key */
static void
check_deterministic(fuzz_key_t *c)
{
    char           *out;
    size_t          out_len;
    idem_key_rc_t   rc;

    out = fuzz_alloc(c->size);
    rc = idem_key_parse(c->in, c->size, out, &out_len);

    FUZZ_CHECK(rc == c->rc, "rc %d then %d for \"%s\"", c->rc, rc,
               fuzz_show(c->in, c->size));
    FUZZ_CHECK(rc != IDEM_KEY_OK
               || (out_len == c->out_len
                   && memcmp(out, c->out, out_len) == 0),
               "two keys for \"%s\"", fuzz_show(c->in, c->size));

    free(out);
}


static void
check_rc(fuzz_key_t *c)
{
    FUZZ_CHECK(c->rc >= IDEM_KEY_OK && c->rc <= IDEM_KEY_BAD_STRING,
               "unexpected rc %d for \"%s\"", c->rc,
               fuzz_show(c->in, c->size));
}


/* a bare token is accepted exactly when it is 1..255 bytes of 0x21-0x7e */
static void
check_bare_rule(fuzz_key_t *c)
{
    size_t  i;
    int     ok;

    if (!c->bare) {
        return;
    }

    ok = (c->e - c->b >= 1 && c->e - c->b <= IDEM_KEY_MAX);

    for (i = c->b; ok && i < c->e; i++) {
        ok = ((unsigned char) c->in[i] >= 0x21
              && (unsigned char) c->in[i] <= 0x7e);
    }

    FUZZ_CHECK(ok == (c->rc == IDEM_KEY_OK),
               "bare token \"%s\": rc %s, expected %s",
               fuzz_show(c->in, c->size), idem_key_strerror(c->rc),
               ok ? "ok" : "a rejection");
}


static void
check_blank(fuzz_key_t *c)
{
    FUZZ_CHECK(c->e != c->b || c->rc == IDEM_KEY_EMPTY,
               "blank value: rc %s", idem_key_strerror(c->rc));
}


/* surrounding SP/HTAB do not change the answer */
static void
check_padding(fuzz_key_t *c)
{
    char           *w, *out;
    size_t          out_len;
    idem_key_rc_t   rc;

    w = fuzz_alloc(c->size + 4);
    out = fuzz_alloc(c->size + 4);

    memcpy(w, " \t", 2);
    if (c->size) {
        memcpy(w + 2, c->in, c->size);
    }
    memcpy(w + 2 + c->size, "\t ", 2);

    rc = idem_key_parse(w, c->size + 4, out, &out_len);

    FUZZ_CHECK(rc == c->rc, "padding changes rc %d -> %d for \"%s\"", c->rc,
               rc, fuzz_show(c->in, c->size));
    FUZZ_CHECK(rc != IDEM_KEY_OK
               || (out_len == c->out_len
                   && memcmp(out, c->out, out_len) == 0),
               "padding changes the key of \"%s\"",
               fuzz_show(c->in, c->size));

    free(out);
    free(w);
}


/* an accepted key: 1..255 printable ASCII, a bare token unchanged */
static void
check_key_bytes(fuzz_key_t *c)
{
    unsigned char  ch;
    size_t         i;

    FUZZ_CHECK(c->out_len >= 1 && c->out_len <= IDEM_KEY_MAX,
               "key length %zu", c->out_len);
    FUZZ_CHECK(c->out_len <= c->size, "key longer than the input");

    for (i = 0; i < c->out_len; i++) {
        ch = (unsigned char) c->out[i];

        FUZZ_CHECK(ch >= 0x20 && ch <= 0x7e, "byte 0x%02x in key of \"%s\"",
                   ch, fuzz_show(c->in, c->size));
        FUZZ_CHECK(!c->bare || ch != 0x20, "space in a bare key");
    }

    if (c->bare) {
        FUZZ_CHECK(c->out_len == c->e - c->b
                   && memcmp(c->out, c->in + c->b, c->out_len) == 0,
                   "bare token changed: \"%s\"", fuzz_show(c->in, c->size));
    }
}


/* the key re-quoted as an RFC 8941 String parses back to itself */
static void
check_requoted(fuzz_key_t *c)
{
    char    *q;
    size_t   i, n;

    q = fuzz_alloc(2 * c->out_len + 2);

    n = 0;
    q[n++] = '"';
    for (i = 0; i < c->out_len; i++) {
        if (c->out[i] == '"' || c->out[i] == '\\') {
            q[n++] = '\\';
        }
        q[n++] = c->out[i];
    }
    q[n++] = '"';

    fuzz_key_expect(q, n, c->out, c->out_len, "re-quoted key");
    free(q);
}


/* and bare, where a bare token can carry it */
static void
check_sent_bare(fuzz_key_t *c)
{
    if (c->out[0] != '"' && memchr(c->out, ' ', c->out_len) == NULL) {
        fuzz_key_expect(c->out, c->out_len, c->out, c->out_len,
                        "key sent bare");
    }
}


int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fuzz_key_t  c;

    c.in = fuzz_dup(data, size);
    c.size = size;
    c.out = fuzz_alloc(size);
    c.rc = idem_key_parse(c.in, size, c.out, &c.out_len);

    for (c.b = 0; c.b < size && (c.in[c.b] == ' ' || c.in[c.b] == '\t');
         c.b++)
    {
        /* void */
    }

    for (c.e = size;
         c.e > c.b && (c.in[c.e - 1] == ' ' || c.in[c.e - 1] == '\t');
         c.e--)
    {
        /* void */
    }

    c.bare = (c.e > c.b && c.in[c.b] != '"');

    check_deterministic(&c);
    check_rc(&c);
    check_bare_rule(&c);
    check_blank(&c);
    check_padding(&c);

    if (c.rc == IDEM_KEY_OK) {
        check_key_bytes(&c);
        check_requoted(&c);
        check_sent_bare(&c);
    }

    free(c.in);
    free(c.out);

    return 0;
}
