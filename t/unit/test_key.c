/* Idempotency-Key field values: bare tokens and RFC 8941 sf-strings. */

#include <stdlib.h>
#include <string.h>

#include "idem_key.h"
#include "tap.h"


/* parses in[0..len); on success checks the key, else the rc */
static void
check(const char *in, size_t len, idem_key_rc_t want_rc, const char *want,
    const char *name)
{
    idem_key_rc_t   rc;
    char           *out, *got;
    size_t          out_len;

    out = malloc(len + 1);
    rc = idem_key_parse(in, len, out, &out_len);

    if (want_rc != IDEM_KEY_OK) {
        if (!ok(rc == want_rc, "%s -> %s", name, idem_key_strerror(want_rc))) {
            diag("  got: %s", idem_key_strerror(rc));
        }
        free(out);
        return;
    }

    got = NULL;
    if (rc == IDEM_KEY_OK) {
        got = malloc(out_len + 1);
        memcpy(got, out, out_len);
        got[out_len] = '\0';
    } else {
        diag("  rc: %s", idem_key_strerror(rc));
    }

    is_str(got, want, "%s", name);

    free(got);
    free(out);
}

#define CHECK(lit, rc, want, name)  check(lit, sizeof(lit) - 1, rc, want, name)


static void
test_lengths(void)
{
    char  in[300], want[300];

    memset(in, 'k', 256);
    memset(want, 'k', 255);
    want[255] = '\0';

    check(in, 255, IDEM_KEY_OK, want, "255 bytes bare ok");
    check(in, 256, IDEM_KEY_TOO_LONG, NULL, "256 bytes bare");

    in[0] = '"';
    memset(in + 1, 'k', 255);
    in[256] = '"';
    check(in, 257, IDEM_KEY_OK, want, "255 bytes quoted ok");

    memset(in + 1, 'k', 256);
    in[257] = '"';
    check(in, 258, IDEM_KEY_TOO_LONG, NULL, "256 bytes quoted");

    /* 256 bytes between the quotes, 255 after unescaping */
    in[1] = '\\';
    in[2] = '\\';
    want[0] = '\\';
    check(in, 258, IDEM_KEY_OK, want, "an escape counts once: 255 ok");
}


int
main(void)
{
    CHECK("81b5b0c2-1f4e-4c3a-9b1e-2b7f0e7f5a11", IDEM_KEY_OK,
          "81b5b0c2-1f4e-4c3a-9b1e-2b7f0e7f5a11", "bare uuid");
    CHECK("\"81b5b0c2-1f4e\"", IDEM_KEY_OK, "81b5b0c2-1f4e",
          "quoted equals bare");
    CHECK("  abc\t", IDEM_KEY_OK, "abc", "surrounding SP/HTAB ignored");
    CHECK(" \"abc\" ", IDEM_KEY_OK, "abc", "quoted with surrounding SP");
    CHECK("\"a b\"", IDEM_KEY_OK, "a b", "space inside quotes ok");
    CHECK("\"a\\\"b\\\\c\"", IDEM_KEY_OK, "a\"b\\c", "escapes \\\" and \\\\");
    CHECK("a\"b", IDEM_KEY_OK, "a\"b", "bare may hold a quote after 1st");
    CHECK("!~", IDEM_KEY_OK, "!~", "bare 0x21 and 0x7e");
    CHECK("k", IDEM_KEY_OK, "k", "one byte");

    CHECK("", IDEM_KEY_EMPTY, NULL, "empty");
    CHECK("   ", IDEM_KEY_EMPTY, NULL, "blanks only");
    CHECK("\"\"", IDEM_KEY_EMPTY, NULL, "empty sf-string");

    CHECK("a b", IDEM_KEY_BAD_CHAR, NULL, "space inside bare");
    CHECK("a\x01" "b", IDEM_KEY_BAD_CHAR, NULL, "control char bare");
    CHECK("\"a\x01" "b\"", IDEM_KEY_BAD_CHAR, NULL, "control char quoted");
    CHECK("a\x7f", IDEM_KEY_BAD_CHAR, NULL, "DEL");
    CHECK("caf\xc3\xa9", IDEM_KEY_BAD_CHAR, NULL, "non-ASCII bare");
    CHECK("\"caf\xc3\xa9\"", IDEM_KEY_BAD_CHAR, NULL, "non-ASCII quoted");
    CHECK("abc\r\n", IDEM_KEY_BAD_CHAR, NULL, "CRLF");
    CHECK("ab\0c", IDEM_KEY_BAD_CHAR, NULL, "NUL byte");
    CHECK("a\tb", IDEM_KEY_BAD_CHAR, NULL, "tab inside bare");

    CHECK("\"abc", IDEM_KEY_BAD_STRING, NULL, "no closing quote");
    CHECK("\"", IDEM_KEY_BAD_STRING, NULL, "lone quote");
    CHECK("\"abc\"x", IDEM_KEY_BAD_STRING, NULL, "garbage after quote");
    CHECK("\"abc\"\"", IDEM_KEY_BAD_STRING, NULL, "two closing quotes");
    CHECK("\"abc\";a=1", IDEM_KEY_BAD_STRING, NULL, "params after quote");
    CHECK("\"abc\" ;a=1", IDEM_KEY_BAD_STRING, NULL, "params after SP");
    CHECK("\"a\\nb\"", IDEM_KEY_BAD_STRING, NULL, "unknown escape \\n");
    CHECK("\"abc\\\"", IDEM_KEY_BAD_STRING, NULL, "escaped closing quote");
    CHECK("\"abc\\", IDEM_KEY_BAD_STRING, NULL, "backslash at the end");

    test_lengths();

    ok(strcmp(idem_key_strerror(IDEM_KEY_BAD_STRING), "unknown error") != 0,
       "strerror");

    return done_testing();
}
