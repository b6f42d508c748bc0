/*
 * libFuzzer target: what a person reads (idem_html.c), the approval page's
 * HTML and idempotency-approve's terminal text.
 *
 * Properties, for every input:
 *  - deterministic, and _len is exactly what _put writes;
 *  - the HTML is UTF-8, has no '<', '>', '"' or '\'' at all, an '&' only
 *    as one of the five references it writes, and no character that
 *    idem_char_hidden() names (controls, DEL, C1, bidi, zero-width);
 *  - the terminal text is UTF-8 with no control byte, DEL or hidden
 *    character, and a backslash only in "\\", "\xNN" or "\u{XXXX}";
 *  - input of visible UTF-8 without markup or backslash is its own output.
 */

#include "idem_html.h"
#include "idem_text.h"

#include "fuzz_common.h"


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


static const char  *fuzz_html_refs[] = {
    "&amp;", "&lt;", "&gt;", "&quot;", "&#39;", NULL
};


/* every character of out[0..n) is UTF-8 and not hidden */
static void
check_visible(const char *out, size_t n, const char *what)
{
    size_t    i, k;
    uint32_t  cp;

    for (i = 0; i < n; i += k) {
        k = idem_utf8_decode((const unsigned char *) out + i, n - i, &cp);

        FUZZ_CHECK(k > 0, "%s: not UTF-8 at %zu", what, i);
        FUZZ_CHECK(!idem_char_hidden(cp), "%s: U+%04X shown as itself", what,
                   (unsigned) cp);
    }
}


static void
check_html(const char *in, size_t size)
{
    char    *out, *again;
    size_t   n, i, r;
    int      ok;

    n = idem_html_len(in, size);
    out = fuzz_alloc(n ? n : 1);
    again = fuzz_alloc(n ? n : 1);

    FUZZ_CHECK((size_t) (idem_html_put(out, in, size) - out) == n,
               "html: _len is not what _put writes");
    idem_html_put(again, in, size);
    FUZZ_CHECK(memcmp(out, again, n) == 0, "html: not deterministic");

    check_visible(out, n, "html");

    for (i = 0; i < n; i++) {
        FUZZ_CHECK(out[i] != '<' && out[i] != '>' && out[i] != '"'
                   && out[i] != '\'', "html: markup byte at %zu", i);

        if (out[i] == '&') {
            for (ok = 0, r = 0; fuzz_html_refs[r]; r++) {
                ok |= (n - i >= strlen(fuzz_html_refs[r])
                       && memcmp(out + i, fuzz_html_refs[r],
                                 strlen(fuzz_html_refs[r])) == 0);
            }

            FUZZ_CHECK(ok, "html: a bare '&' at %zu", i);
        }
    }

    free(out);
    free(again);
}


/* a backslash starts one of the three escapes the terminal text has */
static int
term_escape_ok(const char *p, size_t left)
{
    size_t  i;

    if (left >= 2 && p[1] == '\\') {
        return 2;
    }

    if (left >= 4 && p[1] == 'x' && strchr("0123456789ABCDEF", p[2])
        && p[2] && strchr("0123456789ABCDEF", p[3]) && p[3])
    {
        return 4;
    }

    if (left >= 5 && p[1] == 'u' && p[2] == '{') {
        for (i = 3; i < left && p[i] != '}'; i++) {
            if (!strchr("0123456789ABCDEF", p[i]) || p[i] == '\0') {
                return 0;
            }
        }

        return (i < left && i >= 7) ? (int) i + 1 : 0;
    }

    return 0;
}


static void
check_term(const char *in, size_t size)
{
    int      k;
    char    *out;
    size_t   n, i;

    n = idem_term_len(in, size);
    out = fuzz_alloc(n ? n : 1);

    FUZZ_CHECK((size_t) (idem_term_put(out, in, size) - out) == n,
               "term: _len is not what _put writes");

    check_visible(out, n, "term");

    for (i = 0; i < n; i++) {
        FUZZ_CHECK((unsigned char) out[i] >= 0x20 && out[i] != 0x7f,
                   "term: control byte 0x%02x at %zu", (unsigned char) out[i],
                   i);

        if (out[i] == '\\') {
            k = term_escape_ok(out + i, n - i);
            FUZZ_CHECK(k > 0, "term: a backslash that is no escape at %zu", i);
            i += k - 1;
        }
    }

    free(out);
}


/* plain visible text without markup is shown as itself */
static void
check_plain(const char *in, size_t size)
{
    char      *out;
    size_t     i, k, n;
    uint32_t   cp;

    for (i = 0; i < size; i += k) {
        k = idem_utf8_decode((const unsigned char *) in + i, size - i, &cp);

        if (k == 0 || idem_char_hidden(cp) || strchr("<>\"'&\\", (int) cp)) {
            return;
        }
    }

    n = idem_html_len(in, size);
    FUZZ_CHECK(n == size && idem_term_len(in, size) == size,
               "plain text \"%s\" changed", fuzz_show(in, size));

    out = fuzz_alloc(size ? size : 1);
    idem_html_put(out, in, size);
    FUZZ_CHECK(memcmp(out, in, size) == 0, "plain text changed in HTML");
    free(out);
}


int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char  *in;

    in = fuzz_dup(data, size);

    check_html(in, size);
    check_term(in, size);
    check_plain(in, size);

    free(in);

    return 0;
}
