/*
 * Unit tests of idem_record.c: the Redis record key derived from (scope,
 * key), the netstring encoding of stored response headers, and the
 * decoders of the claim, status and admin scripts' replies.
 */

#include <stdarg.h>
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


/*
 * A reply of n string elements; "~" stands for a nil (not a string).  Only
 * the first six are read (no decoder reads more), so n may claim more.
 */
static const idem_rv_t *
reply(size_t n, ...)
{
    static idem_rv_t   el[IDEM_CLAIM_ELEMS];
    size_t             i;
    va_list            ap;
    const char        *s;

    va_start(ap, n);

    for (i = 0; i < n && i < IDEM_CLAIM_ELEMS; i++) {
        s = va_arg(ap, const char *);
        el[i].is_str = strcmp(s, "~") != 0;
        el[i].data = el[i].is_str ? s : NULL;
        el[i].len = el[i].is_str ? strlen(s) : 0;
    }

    va_end(ap);

    return el;
}

#define claim(c, n, ...)   idem_claim_decode(reply(n, ##__VA_ARGS__), n, c)
#define status(s, n, ...)  idem_status_decode(reply(n, ##__VA_ARGS__), n, s)
#define admin(s, n, ...)   idem_admin_decode(reply(n, ##__VA_ARGS__), n, s)


static void
test_claim_decode(void)
{
    idem_claim_t  c;
    const char   *op = "0123456789abcdef0123456789abcdef";

    ok(claim(&c, 2, "claimed", op) == IDEM_CLAIM_CLAIMED
       && strcmp(c.state, "in_progress") == 0 && c.op.len == 32,
       "claimed: in_progress with its operation id");
    ok(claim(&c, 6, "completed", op, "201", "1:a,1:b,", "{}", "1")
       == IDEM_CLAIM_COMPLETED && c.status == 201 && c.body_stored
       && c.hdr.len == 8 && c.body.len == 2 && strcmp(c.state, "completed") == 0,
       "completed: status, headers, body, stored");
    ok(claim(&c, 6, "completed", op, "599", "", "", "0") == IDEM_CLAIM_COMPLETED
       && !c.body_stored, "completed without a stored body");
    ok(claim(&c, 6, "completed", op, "199", "", "", "1") == IDEM_CLAIM_CORRUPT
       && c.op.len == 32 && c.state == NULL,
       "status below 200: corrupt record, operation id kept");
    ok(claim(&c, 6, "completed", op, "600", "", "", "1") == IDEM_CLAIM_CORRUPT,
       "status 600: corrupt");
    ok(claim(&c, 6, "completed", op, "+201", "", "", "1") == IDEM_CLAIM_CORRUPT,
       "signed status: corrupt");
    ok(claim(&c, 6, "completed", op, "201", "~", "", "1") == IDEM_CLAIM_CORRUPT,
       "nil headers: corrupt");
    ok(claim(&c, 5, "completed", op, "201", "", "") == IDEM_CLAIM_CORRUPT,
       "five elements: corrupt");
    ok(claim(&c, 3, "in_progress", op, "1500") == IDEM_CLAIM_IN_PROGRESS
       && c.lease_left == 1500, "in_progress with the lease left");
    ok(claim(&c, 3, "in_progress", op, "-1") == IDEM_CLAIM_INVALID,
       "negative lease: invalid");
    ok(claim(&c, 3, "in_progress", op, "1234567890123456789")
       == IDEM_CLAIM_INVALID, "19-digit lease: invalid");
    ok(claim(&c, 2, "unknown", op) == IDEM_CLAIM_UNKNOWN
       && strcmp(c.state, "unknown") == 0, "unknown");
    ok(claim(&c, 3, "mismatch", op, "completed") == IDEM_CLAIM_MISMATCH
       && strcmp(c.state, "completed") == 0, "mismatch with the record's state");
    ok(claim(&c, 3, "mismatch", op, "gone") == IDEM_CLAIM_INVALID,
       "mismatch with a foreign state: invalid");
    ok(claim(&c, 2, "claimed", "0123ABCD") == IDEM_CLAIM_INVALID
       && c.op.data == NULL && c.state == NULL,
       "uppercase operation id: invalid, nothing set");
    ok(claim(&c, 2, "claimed", "") == IDEM_CLAIM_INVALID, "empty operation id");
    ok(claim(&c, 1, "claimed") == IDEM_CLAIM_INVALID, "one element: invalid");
    ok(claim(&c, 2, "~", op) == IDEM_CLAIM_INVALID, "nil kind: invalid");
    ok(claim(&c, 2, "claimedx", op) == IDEM_CLAIM_INVALID, "unknown kind");
    ok(claim(&c, 9, "claimed", op, "x", "x", "x", "x") == IDEM_CLAIM_CLAIMED,
       "extra elements after a claim are ignored");
}


static void
test_status_decode(void)
{
    idem_status_t  st;
    const char    *op = "0123456789abcdef0123456789abcdef";
    const char    *fp = "00112233445566778899aabbccddeeff"
                        "00112233445566778899aabbccddeeff";

    ok(status(&st, 0) == IDEM_STATUS_NONE && st.state == NULL,
       "no elements: no record");
    ok(status(&st, 6, "completed", fp, op, "1796222500440", "1796222501000",
              "201") == IDEM_STATUS_RECORD
       && strcmp(st.state, "completed") == 0 && st.fp.len == 64
       && st.op.len == 32 && st.created == 1796222500440LL
       && st.completed == 1796222501000LL && st.status == 201,
       "completed record: every field");
    ok(status(&st, 6, "in_progress", fp, op, "1796222500440", "", "")
       == IDEM_STATUS_RECORD && st.completed == -1 && st.status == 0,
       "in progress: no completion time, no status");
    ok(status(&st, 6, "unknown", fp, op, "", "", "") == IDEM_STATUS_RECORD
       && st.created == -1, "no creation time: absent, not invalid");
    ok(status(&st, 6, "completed", fp, op, "1", "2", "0201")
       == IDEM_STATUS_RECORD && st.status == 201,
       "status with a leading zero is read as a number (and printed as one)");
    ok(status(&st, 6, "completed", fp, op, "1", "2", "") == IDEM_STATUS_INVALID,
       "completed without a status: invalid, as the claim finds it corrupt");
    ok(status(&st, 6, "completed", fp, op, "1", "2", "999")
       == IDEM_STATUS_INVALID && st.state == NULL && st.op.data == NULL,
       "status 999: invalid, nothing set");
    ok(status(&st, 6, "completed", fp, op, "1", "2", "20x") == IDEM_STATUS_INVALID,
       "status not a number: invalid");
    ok(status(&st, 6, "completed", fp, op, "253402300799999", "", "201")
       == IDEM_STATUS_RECORD, "the last millisecond of year 9999");
    ok(status(&st, 6, "completed", fp, op, "253402300800000", "", "201")
       == IDEM_STATUS_INVALID, "a time after year 9999: invalid");
    ok(status(&st, 6, "completed", fp, op, "-5", "", "201")
       == IDEM_STATUS_INVALID, "negative time: invalid");
    ok(status(&st, 6, "exploded", fp, op, "", "", "") == IDEM_STATUS_INVALID,
       "foreign state: invalid");
    ok(status(&st, 6, "unknown", "abc", op, "", "", "") == IDEM_STATUS_INVALID,
       "short fingerprint: invalid");
    ok(status(&st, 6, "unknown", fp, "XYZ", "", "", "") == IDEM_STATUS_INVALID,
       "operation id not hex: invalid");
    ok(status(&st, 6, "unknown", fp, op, "~", "", "") == IDEM_STATUS_INVALID,
       "nil time: invalid");
    ok(status(&st, 5, "unknown", fp, op, "", "") == IDEM_STATUS_INVALID,
       "five elements: invalid");
    ok(status(&st, 7, "unknown", fp, op, "", "", "") == IDEM_STATUS_INVALID,
       "seven elements: invalid");
}


static void
test_admin_decode(void)
{
    const char  *state;

    ok(admin(&state, 1, "none") == IDEM_ADMIN_NONE && state == NULL, "none");
    ok(admin(&state, 1, "released") == IDEM_ADMIN_RELEASED, "released");
    ok(admin(&state, 1, "completed") == IDEM_ADMIN_COMPLETED, "completed");
    ok(admin(&state, 2, "refused", "in_progress") == IDEM_ADMIN_REFUSED
       && strcmp(state, "in_progress") == 0, "refused, in progress");
    ok(admin(&state, 2, "refused", "completed") == IDEM_ADMIN_REFUSED
       && strcmp(state, "completed") == 0, "refused, completed");
    ok(admin(&state, 2, "refused", "unknown") == IDEM_ADMIN_INVALID
       && state == NULL, "refused an unknown record: not an answer admin.lua gives");
    ok(admin(&state, 1, "refused") == IDEM_ADMIN_INVALID, "refused without a state");
    ok(admin(&state, 2, "released", "x") == IDEM_ADMIN_INVALID,
       "released with an extra element: invalid");
    ok(admin(&state, 0) == IDEM_ADMIN_INVALID, "no elements: invalid");
    ok(admin(&state, 1, "~") == IDEM_ADMIN_INVALID, "nil: invalid");
}


int
main(void)
{
    test_record_key();
    test_hdrs_roundtrip();
    test_hdrs_malformed();
    test_claim_decode();
    test_status_decode();
    test_admin_decode();

    return done_testing();
}
