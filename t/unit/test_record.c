/*
 * Unit tests of idem_record.c: the Redis record key derived from (scope,
 * key) and the netstring encoding of stored response headers.
 */

#include <stdlib.h>

#include "tap.h"
#include "idem_record.h"


static void
test_record_key(void)
{
    char  a[IDEM_RECORD_KEY_LEN + 1], b[IDEM_RECORD_KEY_LEN + 1];

    /* known answer, computed independently (docs/states.md one-liner) */
    ok(idem_record_key("acct_42", 7, "k1", 2, a) == 0, "record key computed");
    is_str(a, "idem:{4c4956d53a6e3ac52fac885e843aceb2}:r",
           "record key known answer");
    ok(strlen(a) == IDEM_RECORD_KEY_LEN, "record key length");
    ok(strstr(a, "acct_42") == NULL && strstr(a, "k1}") == NULL,
       "neither scope nor key in clear");

    /* moving a byte across the scope/key boundary changes the record */
    idem_record_key("ab", 2, "c", 1, a);
    idem_record_key("a", 1, "bc", 2, b);
    ok(strcmp(a, b) != 0, "scope/key boundary is part of the digest");

    idem_record_key("", 0, "k", 1, a);
    idem_record_key("", 0, "K", 1, b);
    ok(strcmp(a, b) != 0, "keys are case-sensitive");
}


static void
test_hdrs_roundtrip(void)
{
    char               buf[256], *p;
    size_t             nl, vl, len;
    const char        *n, *v;
    idem_hdrs_iter_t   it;

    len = idem_hdrs_pair_len(12, 16) + idem_hdrs_pair_len(8, 0);
    p = idem_hdrs_put(buf, "Content-Type", 12, "application/json", 16);
    p = idem_hdrs_put(p, "X-Empty!", 8, "", 0);

    ok((size_t) (p - buf) == len, "encoded length matches pair_len");
    ok(memcmp(buf, "12:Content-Type,16:application/json,8:X-Empty!,0:,", len)
       == 0, "encoding is netstrings, name then value");

    it.pos = buf;
    it.end = p;

    ok(idem_hdrs_next(&it, &n, &nl, &v, &vl) == 1
       && nl == 12 && memcmp(n, "Content-Type", 12) == 0
       && vl == 16 && memcmp(v, "application/json", 16) == 0,
       "first pair decodes");
    ok(idem_hdrs_next(&it, &n, &nl, &v, &vl) == 1 && nl == 8 && vl == 0,
       "empty value decodes");
    ok(idem_hdrs_next(&it, &n, &nl, &v, &vl) == 0, "end of blob");
}


static int
decode_all(const char *blob)
{
    int                rc;
    size_t             nl, vl;
    const char        *n, *v;
    idem_hdrs_iter_t   it;

    it.pos = blob;
    it.end = blob + strlen(blob);

    while ((rc = idem_hdrs_next(&it, &n, &nl, &v, &vl)) == 1) {
        /* void */
    }

    return rc;
}


static void
test_hdrs_malformed(void)
{
    char  *big;

    ok(decode_all("") == 0, "empty blob is no headers");
    ok(decode_all("1:a,1:b,") == 0, "minimal pair");
    ok(decode_all("01:a,1:b,") == -1, "leading zero refused");
    ok(decode_all("1:a,1:b") == -1, "missing comma refused");
    ok(decode_all("1:a,") == -1, "name without value refused");
    ok(decode_all("0:,1:b,") == -1, "empty name refused");
    ok(decode_all("5:a,1:b,") == -1, "length beyond the blob refused");
    ok(decode_all(":a,1:b,") == -1, "missing length refused");
    ok(decode_all("1a,1:b,") == -1, "missing colon refused");
    ok(decode_all("99999999999999999999:a,") == -1, "huge length refused");

    big = malloc(IDEM_HDRS_FIELD_MAX + 32);
    if (big) {
        sprintf(big, "%d:", IDEM_HDRS_FIELD_MAX + 1);
        ok(decode_all(big) == -1, "field over IDEM_HDRS_FIELD_MAX refused");
        free(big);
    }
}


int
main(void)
{
    test_record_key();
    test_hdrs_roundtrip();
    test_hdrs_malformed();

    return done_testing();
}
