/* idem_html.c: what the approval page and the tools show a person */

#include <stdlib.h>
#include <string.h>

#include "tap.h"
#include "idem_html.h"


static int
html_is(const char *in, size_t len, const char *want)
{
    char    out[512];
    size_t  n;

    n = idem_html_len(in, len);

    if (n >= sizeof(out) || (size_t) (idem_html_put(out, in, len) - out) != n) {
        return 0;
    }

    out[n] = '\0';

    if (strcmp(out, want) != 0) {
        diag("got \"%s\", wanted \"%s\"", out, want);
        return 0;
    }

    return 1;
}


static int
term_is(const char *in, size_t len, const char *want)
{
    char    out[512];
    size_t  n;

    n = idem_term_len(in, len);

    if (n >= sizeof(out) || (size_t) (idem_term_put(out, in, len) - out) != n) {
        return 0;
    }

    out[n] = '\0';

    if (strcmp(out, want) != 0) {
        diag("got \"%s\", wanted \"%s\"", out, want);
        return 0;
    }

    return 1;
}

#define S(x)  x, sizeof(x) - 1


int
main(int argc, char **argv)
{
    ok(html_is(S("ACME Ltd"), "ACME Ltd"), "plain text is itself");
    ok(html_is(S("<img src=x onerror=\"document.title='pwned'\">"),
               "&lt;img src=x onerror=&quot;document.title=&#39;pwned&#39;"
               "&quot;&gt;"), "markup is escaped");
    ok(html_is(S("a&b"), "a&amp;b"), "an ampersand");
    ok(html_is(S("\xe2\x80\xae" "0001"),
               "\xe2\x9f\xa8U+202E\xe2\x9f\xa9" "0001"),
       "U+202E (right-to-left override) is shown, not applied");
    ok(html_is(S("\xe2\x81\xa6x\xe2\x81\xa9"),
               "\xe2\x9f\xa8U+2066\xe2\x9f\xa9x\xe2\x9f\xa8U+2069\xe2\x9f\xa9"),
       "bidi isolates are shown");
    ok(html_is(S("a\xe2\x80\x8b" "b\xef\xbb\xbf"),
               "a\xe2\x9f\xa8U+200B\xe2\x9f\xa9" "b\xe2\x9f\xa8U+FEFF\xe2\x9f\xa9"),
       "zero-width characters are shown");
    ok(html_is(S("a\nb\x1b[2K\x7f"),
               "a\xe2\x9f\xa8U+000A\xe2\x9f\xa9" "b\xe2\x9f\xa8U+001B\xe2\x9f\xa9"
               "[2K\xe2\x9f\xa8U+007F\xe2\x9f\xa9"),
       "control characters and DEL are shown");
    ok(html_is(S("\xc2\x85"), "\xe2\x9f\xa8U+0085\xe2\x9f\xa9"),
       "a C1 control is shown");
    ok(html_is(S("x\xff\xc3"), "x\xe2\x9f\xa8" "0xFF\xe2\x9f\xa9\xe2\x9f\xa8"
               "0xC3\xe2\x9f\xa9"), "bytes that are not UTF-8 are shown");
    ok(html_is(S("caf\xc3\xa9 \xe2\x82\xac"), "caf\xc3\xa9 \xe2\x82\xac"),
       "other UTF-8 is itself");
    ok(html_is("a\0b", 3, "a\xe2\x9f\xa8U+0000\xe2\x9f\xa9" "b"),
       "a NUL is shown");

    ok(term_is(S("ACME"), "ACME"), "terminal: plain text is itself");
    ok(term_is(S("\x1b[2K\x1b[8mhidden"), "\\x1B[2K\\x1B[8mhidden"),
       "terminal: ESC sequences are shown, not sent");
    ok(term_is(S("a\nb\r\x7f"), "a\\x0Ab\\x0D\\x7F"),
       "terminal: newline, CR and DEL");
    ok(term_is(S("\xff\xfe"), "\\xFF\\xFE"), "terminal: invalid UTF-8");
    ok(term_is(S("\xe2\x80\xae" "1"), "\\u{202E}1"), "terminal: bidi override");
    ok(term_is(S("a\\x1B"), "a\\\\x1B"), "terminal: a backslash cannot fake an escape");
    ok(term_is(S("\xc3\xa9"), "\xc3\xa9"), "terminal: UTF-8 is itself");

    return done_testing();
}
