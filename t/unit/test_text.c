/*
 * idem_log_escape(): a value a client chose, made safe for a log line or
 * a terminal (control characters, DEL, C1 controls, ill-formed UTF-8 and
 * the backslash as \xNN; printable ASCII and well-formed UTF-8 kept).
 */

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "idem_text.h"
#include "tap.h"


static void
check(const char *in, size_t len, const char *want, const char *name)
{
    char    *out;
    size_t   n, m;

    n = idem_log_escape_len(in, len);
    out = malloc(n + 1);
    m = idem_log_escape(out, in, len);
    out[m] = '\0';

    if (!ok(m == n && m == strlen(want) && memcmp(out, want, m) == 0,
            "%s", name))
    {
        diag("  got: \"%s\" (%zu, len said %zu)", out, m, n);
        diag("  want: \"%s\"", want);
    }

    free(out);
}

#define S(s)  s, sizeof(s) - 1


/* idem_decimal against printf: every digit count, each end of it */
static void
test_decimal(void)
{
    int       good, k;
    char      got[32], want[32], *end;
    uint64_t  v, p;

    good = 1;

    for (v = 0; v < 100000; v++) {
        end = idem_decimal(got, v);
        *end = '\0';
        snprintf(want, sizeof(want), "%" PRIu64, v);
        good &= strcmp(got, want) == 0;
    }

    for (k = 0, p = 1; k < 20; k++, p *= 10) {
        for (v = p - 1; v <= p + 1 && v >= p - 1; v++) {
            end = idem_decimal(got, v);
            *end = '\0';
            snprintf(want, sizeof(want), "%" PRIu64, v);
            good &= strcmp(got, want) == 0;
        }
    }

    end = idem_decimal(got, UINT64_MAX);
    *end = '\0';
    good &= strcmp(got, "18446744073709551615") == 0;

    ok(good, "decimal: 0 to 99999, 10^k - 1 to 10^k + 1, 2^64 - 1 as printf");
}


int
main(void)
{
    char    all[256], *out;
    size_t  i, n;

    check(S("alice@example.com"), "alice@example.com",
          "printable ASCII is kept");
    check(S(""), "", "empty");
    check(S("alice\n2026/12/07 FAKE [notice] forged line\x1b[31m"),
          "alice\\x0A2026/12/07 FAKE [notice] forged line\\x1B[31m",
          "a newline and ESC (the issue's forged line) are \\x0A, \\x1B");
    check(S("a\rb\tc\x7f" "d"), "a\\x0Db\\x09c\\x7Fd", "CR, TAB, DEL");
    check("a\0b", 3, "a\\x00b", "NUL");
    check(S("back\\slash \\x0A"), "back\\x5Cslash \\x5Cx0A",
          "a backslash is escaped: a typed \\x0A is not an escaped newline");
    check(S("caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80"),
          "caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80",
          "well-formed UTF-8 (2, 3, 4 bytes) is kept");
    check(S("\xc2\x9b" "2K"), "\\xC2\\x9B2K",
          "a C1 control (U+009B, CSI) is escaped byte by byte");
    check(S("\xc2\xa0"), "\xc2\xa0", "U+00A0, after the C1 controls, kept");
    check(S("\xff\xfe"), "\\xFF\\xFE", "bytes that never start UTF-8");
    check(S("\xc3"), "\\xC3", "a truncated sequence");
    check(S("\xc3(" ), "\\xC3(", "a lead byte without its continuation");
    check(S("\xc0\xaf"), "\\xC0\\xAF", "an overlong encoding");
    check(S("\xed\xa0\x80"), "\\xED\\xA0\\x80", "a surrogate");
    check(S("\x80x"), "\\x80x", "a lone continuation byte");

    /* every byte alone: the length agrees, the output is printable */
    for (i = 0; i < 256; i++) {
        all[i] = (char) i;
    }

    n = idem_log_escape_len(all, 256);
    out = malloc(n);
    ok(idem_log_escape(out, all, 256) == n && n <= 4 * 256,
       "all 256 bytes: the length said, at most 4 per byte");

    for (i = 0; i < n; i++) {
        if ((unsigned char) out[i] < 0x20 || out[i] == 0x7f) {
            break;
        }
    }

    ok(i == n, "all 256 bytes: no control character is left");
    free(out);

    test_decimal();

    return done_testing();
}
