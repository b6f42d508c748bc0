/*
 * Unit tests of idem_record.c and idem_reply.c: the Redis record key
 * derived from (scope, key), the netstring encoding of stored response
 * headers, the layout-2 record value (what the encoder writes, what the
 * decoder gives back, and every way the decoder refuses a value), and the
 * decoders of the replies of SET and of the claim, status and admin
 * scripts.
 *
 * Expected encodings are written out by hand from the layout in
 * idem_record.h, not computed with the code under test.  Every refusal
 * has an accepted value next to it that differs only in what is tested,
 * so that a decoder refusing everything fails too.
 */

#include <stdlib.h>
#include <string.h>

#include "tap.h"
#include "idem_record.h"
#include "idem_reply.h"


#define OP      "0123456789abcdef0123456789abcdef"
#define FP      "00112233445566778899aabbccddeeff" \
                "fedcba9876543210fedcba9876543210"
#define OWNER   "a0b1c2d3e4f5a6b7c8d9e0f1a2b3c4d5"
#define DASHES  "--------------------------------"

/* the fields of one valid record of each state */
#define I_F     "13:1796222500440,4:5000,8:86400000,"
#define HDRS    "12:Content-Type,16:application/json,"
#define C_F     "13:1796222500440,13:1796222501000,3:201,1:1,1:0," \
                "36:" HDRS ",9:{\"id\":42},"
#define U_F     "13:1796222500440,13:1796222560000,"
#define R_F     "3:503,2:30,"
/* an alias (idempotency_unique) names the record key of the operation */
#define TARGET  "idem:{fedcba9876543210fedcba9876543210}:r"
#define S_F     "13:1796222500440,41:" TARGET ","


/* every buffer the tests make, freed at the end (ASan leak checks) */
#define KEEP_MAX  2048

static void    *kept[KEEP_MAX];
static size_t   nkept;


static void *
keep_alloc(size_t size)
{
    void  *p;

    p = malloc(size ? size : 1);

    if (p == NULL || nkept == KEEP_MAX) {
        printf("Bail out! out of memory\n");
        exit(255);
    }

    kept[nkept++] = p;

    return p;
}


/* an exact-size copy: under ASan, any read past the end is reported */
static char *
keep(const char *p, size_t len)
{
    char  *c;

    c = keep_alloc(len);
    memcpy(c, p, len);

    return c;
}


static void
free_all(void)
{
    while (nkept) {
        free(kept[--nkept]);
    }
}


/* ---------------------------------------------------------- record key */

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


/*
 * the lock key (idempotency_lock, docs/business-keys.md: no scope) and the
 * key beside a record that names the lock its operation took
 */
static void
test_lock_keys(void)
{
    char  a[IDEM_RECORD_KEY_LEN + 1], h[IDEM_RECORD_KEY_LEN + 1];

    /* known answer, computed independently (Digest::SHA, business-keys.md) */
    ok(idem_derived_key("idem-lock-v1", "", 0, "deploy:production", 17,
                        IDEM_LOCK_SUFFIX, a) == 0, "lock key computed");
    is_str(a, "idem:{3e0a00b658e86a41c98f52d07313a479}:l",
           "lock key known answer");
    ok(idem_is_key(a, strlen(a), IDEM_LOCK_SUFFIX), "a lock key is one");
    ok(!idem_is_key(a, strlen(a), IDEM_RECORD_SUFFIX),
       "a lock key is no record key");

    memset(h, 'x', sizeof(h));
    idem_sibling_key("idem:{4c4956d53a6e3ac52fac885e843aceb2}:r",
                     IDEM_HOLDS_SUFFIX, h);
    is_str(h, "idem:{4c4956d53a6e3ac52fac885e843aceb2}:h",
           "the key beside a record: its tag, suffix h, NUL-terminated");
    ok(idem_is_key(h, strlen(h), IDEM_HOLDS_SUFFIX)
       && !idem_is_key(h, strlen(h), IDEM_LOCK_SUFFIX), "h is not l");

    ok(!idem_is_key("idem:{3E0A00B658E86A41C98F52D07313A479}:l", 41,
                    IDEM_LOCK_SUFFIX), "upper-case hex: no key");
    ok(!idem_is_key("idem:{3e0a00b658e86a41c98f52d07313a47}:l", 40,
                    IDEM_LOCK_SUFFIX), "31 hex digits: no key");
    ok(!idem_is_key("idem:{3e0a00b658e86a41c98f52d07313a479}:l", 40,
                    IDEM_LOCK_SUFFIX), "a length short of the key: no key");
    ok(!idem_is_key("idem:[3e0a00b658e86a41c98f52d07313a479]:l", 41,
                    IDEM_LOCK_SUFFIX), "another prefix: no key");
}


/* ------------------------------------------------------ stored headers */

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
    ok(len == 50
       && memcmp(buf, "12:Content-Type,16:application/json,8:X-Empty!,0:,",
                 len) == 0, "encoding is netstrings, name then value");

    it.pos = buf;
    it.end = p;

    ok(idem_hdrs_next(&it, &n, &nl, &v, &vl) == 1
       && nl == 12 && memcmp(n, "Content-Type", 12) == 0
       && vl == 16 && memcmp(v, "application/json", 16) == 0,
       "first pair decodes");
    ok(idem_hdrs_next(&it, &n, &nl, &v, &vl) == 1 && nl == 8 && vl == 0
       && memcmp(n, "X-Empty!", 8) == 0, "empty value decodes");
    ok(idem_hdrs_next(&it, &n, &nl, &v, &vl) == 0, "end of blob");
    ok(idem_hdrs_next(&it, &n, &nl, &v, &vl) == 0, "still the end");
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
    ok(decode_all("10:abcdefghij,0:,") == 0, "two-digit length");
    ok(decode_all("01:a,1:b,") == -1, "leading zero refused");
    ok(decode_all("1:a,01:b,") == -1, "leading zero in a value refused");
    ok(decode_all("1:a,1:b") == -1, "missing comma refused");
    ok(decode_all("1:a,") == -1, "name without value refused");
    ok(decode_all("0:,1:b,") == -1, "empty name refused");
    ok(decode_all("5:a,1:b,") == -1, "length beyond the blob refused");
    ok(decode_all(":a,1:b,") == -1, "missing length refused");
    ok(decode_all("1a,1:b,") == -1, "missing colon refused");
    ok(decode_all("99999999999999999999:a,") == -1, "huge length refused");
    ok(decode_all("18446744073709551617:a,1:b,") == -1,
       "length 2^64 + 1 refused (not read as 1)");

    big = keep_alloc(IDEM_HDRS_FIELD_MAX + 32);
    sprintf(big, "%d:", IDEM_HDRS_FIELD_MAX + 1);
    ok(decode_all(big) == -1, "field over IDEM_HDRS_FIELD_MAX refused");
}


/* ------------------------------------------------------- record values */

typedef struct {
    const char  *p;
    size_t       len;
} rec_t;


/* the value head3 op fp owner fields, in an exact-size buffer */
static rec_t
mk(const char *head3, const char *op, const char *fp, const char *owner,
    const char *fields)
{
    char    buf[4096];
    size_t  len, n;
    rec_t   r;

    len = 0;

#define mk_add(s)                                                            \
    n = strlen(s);                                                           \
    memcpy(buf + len, s, n);                                                 \
    len += n

    mk_add(head3);
    mk_add(op);
    mk_add(fp);
    mk_add(owner);
    mk_add(fields);

#undef mk_add

    r.p = keep(buf, len);
    r.len = len;

    return r;
}


/* the first len bytes of r, in an exact-size buffer */
static rec_t
cut(rec_t r, size_t len)
{
    r.p = keep(r.p, len);
    r.len = len;

    return r;
}


static void
accepts(rec_t r, const char *name)
{
    idem_value_t  v;

    is_int(idem_value_decode(r.p, r.len, &v), 0, "accepted: %s", name);
}


static void
refuses(rec_t r, const char *name)
{
    idem_value_t  v;

    is_int(idem_value_decode(r.p, r.len, &v), -1, "refused: %s", name);
}


static int
bytes_at(const char *got, size_t got_len, const char *want, size_t want_len)
{
    return got != NULL && got_len == want_len
           && (want_len == 0 || memcmp(got, want, want_len) == 0);
}


/* pointer p..p+n lies within base..base+len */
static int
inside(const char *p, size_t n, const char *base, size_t len)
{
    return p != NULL && p >= base && n <= len && p <= base + len - n;
}


/* a proposal, or its recorded approval */
static const char *
proposal_diff(const idem_value_t *in, const idem_value_t *out,
    const char *base, size_t len)
{
    if (out->created != in->created) {
        return "created";
    }
    if (out->expires != in->expires) {
        return "expires";
    }
    if (in->state == 'p' && out->approved_until != in->approved_until) {
        return "approved_until";
    }
    if (in->state == 'p'
        && (!inside(out->approver, out->approver_len, base, len)
            || !bytes_at(out->approver, out->approver_len, in->approver,
                         in->approver_len)))
    {
        return "approver";
    }
    return NULL;
}

/*
 * The first field of in's state that out gets wrong, or NULL: only the
 * head is common to all states, the rest depends on the state.
 */
static const char *
state_diff(const idem_value_t *in, const idem_value_t *out, const char *base,
    size_t len)
{
    switch (in->state) {

    case 'i':
        if (out->created != in->created) {
            return "created";
        }
        if (out->lease_ms != in->lease_ms) {
            return "lease_ms";
        }
        if (out->ttl_ms != in->ttl_ms) {
            return "ttl_ms";
        }
        break;

    case 'c':
        if (out->created != in->created) {
            return "created";
        }
        if (out->completed != in->completed) {
            return "completed";
        }
        if (out->status != in->status) {
            return "status";
        }
        if (out->stored != (in->stored ? 1 : 0)) {
            return "stored";
        }
        if (out->resolved != (in->resolved ? 1 : 0)) {
            return "resolved";
        }
        if (!inside(out->hdr, out->hdr_len, base, len)
            || !bytes_at(out->hdr, out->hdr_len, in->hdr, in->hdr_len))
        {
            return "hdr";
        }
        if (!inside(out->body, out->body_len, base, len)
            || !bytes_at(out->body, out->body_len, in->body, in->body_len))
        {
            return "body";
        }
        break;

    case 'u':
        if (out->created != in->created) {
            return "created";
        }
        if (out->unknown_at != in->unknown_at) {
            return "unknown_at";
        }
        break;

    case 'a':
    case 'p':
        return proposal_diff(in, out, base, len);

    case 's':
        if (out->created != in->created) {
            return "created";
        }
        if (!inside(out->target, IDEM_RECORD_KEY_LEN, base, len)
            || memcmp(out->target, in->target, IDEM_RECORD_KEY_LEN) != 0)
        {
            return "target";
        }
        break;

    default:
        if (out->status != in->status) {
            return "status";
        }
        if (out->retry_after != in->retry_after) {
            return "retry_after";
        }
        break;
    }

    return NULL;
}


/*
 * The first field of out that is not what in says (decoded from base,
 * len bytes), or NULL: the head, and the fields of in's state.
 */
static const char *
value_diff(const idem_value_t *in, const idem_value_t *out, const char *base,
    size_t len)
{
    if (out->state != in->state) {
        return "state";
    }

    if (out->waiters != (in->waiters ? 1 : 0)) {
        return "waiters";
    }

    if (out->op != base + IDEM_OP_OFF
        || memcmp(out->op, in->op, IDEM_TOKEN_LEN) != 0)
    {
        return "op";
    }

    if (out->fp != base + IDEM_FP_OFF
        || memcmp(out->fp, in->fp, IDEM_FP_LEN) != 0)
    {
        return "fp";
    }

    if (in->owner == NULL ? out->owner != NULL
        : (out->owner != base + IDEM_OWNER_OFF
           || memcmp(out->owner, in->owner, IDEM_TOKEN_LEN) != 0))
    {
        return "owner";
    }

    return state_diff(in, out, base, len);
}


/* encode in, compare with the bytes want, decode them back: 4 tests */
static void
roundtrip(const char *name, const idem_value_t *in, const char *want,
    size_t want_len)
{
    char          *buf, *end, *copy;
    size_t         len;
    const char    *diff;
    idem_value_t   out;

    len = idem_value_len(in);
    is_int((long) len, (long) want_len, "%s: idem_value_len", name);

    /* room to spare, to see a write past idem_value_len */
    buf = keep_alloc(len + 16);
    memset(buf, '#', len + 16);
    end = idem_value_encode(buf, in);

    is_int((long) (end - buf), (long) len,
           "%s: idem_value_encode writes idem_value_len bytes", name);

    if (!ok(bytes_at(buf, (size_t) (end - buf), want, want_len)
            && buf[len] == '#', "%s: the bytes of layout 2", name))
    {
        diag("       got: '%.*s'", (int) (end - buf), buf);
        diag("  expected: '%.*s'", (int) want_len, want);
    }

    copy = keep(want, want_len);
    diff = "(not decoded)";

    if (idem_value_decode(copy, want_len, &out) == 0) {
        diff = value_diff(in, &out, copy, want_len);
    }

    if (!ok(diff == NULL, "%s: decodes to every field", name)) {
        diag("  field: %s", diff);
    }
}


#define ROUNDTRIP(name, v, lit)  roundtrip(name, v, lit, sizeof(lit) - 1)


static idem_value_t
value(char state, int waiters, const char *owner)
{
    idem_value_t  v;

    memset(&v, 0, sizeof(v));
    v.state = state;
    v.waiters = waiters;
    v.op = OP;
    v.fp = FP;
    v.owner = owner;
    v.created = v.completed = v.unknown_at = v.retry_after = -1;

    return v;
}


static void
test_roundtrip_in_progress(void)
{
    idem_value_t  v;

    v = value('i', 0, OWNER);
    v.created = 1796222500440LL;
    v.lease_ms = 5000;
    v.ttl_ms = 86400000;
    ROUNDTRIP("in_progress", &v, "2i0" OP FP OWNER I_F);

    v = value('i', 1, OWNER);
    v.created = 0;
    v.lease_ms = 1;
    v.ttl_ms = 1;
    ROUNDTRIP("in_progress, waiters, smallest numbers", &v,
              "2i1" OP FP OWNER "1:0,1:1,1:1,");

    v = value('i', 0, OWNER);
    v.created = IDEM_TIME_MS_MAX;
    v.lease_ms = IDEM_TIME_MS_MAX;
    v.ttl_ms = IDEM_TIME_MS_MAX;
    ROUNDTRIP("in_progress, largest numbers", &v, "2i0" OP FP OWNER
              "15:253402300799999,15:253402300799999,15:253402300799999,");
}


static void
test_roundtrip_completed(void)
{
    idem_value_t  v;

    v = value('c', 0, NULL);
    v.created = 1796222500440LL;
    v.completed = 1796222501000LL;
    v.status = 201;
    v.stored = 1;
    v.resolved = 0;
    v.hdr = HDRS;
    v.hdr_len = sizeof(HDRS) - 1;
    v.body = "{\"id\":42}";
    v.body_len = 9;
    ROUNDTRIP("completed", &v, "2c0" OP FP DASHES C_F);

    v = value('c', 1, NULL);
    v.created = 5;
    v.completed = 6;
    v.status = 599;
    v.stored = 0;
    v.resolved = 1;
    v.hdr = "";
    v.hdr_len = 0;
    v.body = "";
    v.body_len = 0;
    ROUNDTRIP("completed, empty headers and body", &v,
              "2c1" OP FP DASHES "1:5,1:6,3:599,1:0,1:1,0:,0:,");

    /* netstring syntax inside the body: only the length counts */
    v = value('c', 0, NULL);
    v.created = 10;
    v.completed = 10;
    v.status = 200;
    v.stored = 1;
    v.resolved = 1;
    v.hdr = "1:a,0:,";
    v.hdr_len = 7;
    v.body = "1:\0,\xff,";
    v.body_len = 6;
    ROUNDTRIP("completed, binary body", &v,
              "2c0" OP FP DASHES "2:10,2:10,3:200,1:1,1:1,7:1:a,0:,,"
              "6:1:\0,\xff,,");
}


static void
test_roundtrip_unknown_released(void)
{
    idem_value_t  v;

    v = value('u', 0, NULL);
    v.created = 1796222500440LL;
    v.unknown_at = 1796222560000LL;
    ROUNDTRIP("unknown", &v, "2u0" OP FP DASHES U_F);

    v = value('r', 1, OWNER);
    v.status = 503;
    v.retry_after = 30;
    ROUNDTRIP("released, with owner, status and Retry-After", &v,
              "2r1" OP FP OWNER R_F);

    v = value('r', 0, NULL);
    v.status = 0;
    v.retry_after = -1;
    ROUNDTRIP("released, no owner, empty status and Retry-After", &v,
              "2r0" OP FP DASHES "0:,0:,");

    v = value('r', 0, OWNER);
    v.status = 429;
    v.retry_after = -1;
    ROUNDTRIP("released, status without Retry-After", &v,
              "2r0" OP FP OWNER "3:429,0:,");

    v = value('r', 0, NULL);
    v.status = 0;
    v.retry_after = 0;
    ROUNDTRIP("released, Retry-After 0 without status", &v,
              "2r0" OP FP DASHES "0:,1:0,");
}


/* idempotency_confirm's proposal: no owner, nothing runs yet */
static void
test_roundtrip_awaiting(void)
{
    idem_value_t  v, out;

    v = value('a', 0, NULL);
    v.created = 1796222500440LL;
    v.expires = 1796226100440LL;
    ROUNDTRIP("awaiting_confirmation", &v,
              "2a0" OP FP DASHES "13:1796222500440,13:1796226100440,");

    ok(idem_value_decode("2a0" OP FP OWNER "1:1,1:2,", 131 + 8, &out) == -1,
       "awaiting_confirmation with an owner refused");
    ok(idem_value_decode("2a0" OP FP DASHES "1:1,", 131 + 4, &out) == -1,
       "awaiting_confirmation without expiry refused");
    ok(idem_value_decode("2a0" OP FP DASHES "1:1,0:,", 131 + 7, &out) == -1,
       "awaiting_confirmation with an empty expiry refused");
    is_str(idem_state_name('a'), "awaiting_confirmation", "state name a");
}


/* a recorded approval (idempotency_approve): no owner, an approver */
static void
test_roundtrip_approved(void)
{
    char          big[IDEM_HEAD_LEN + 64 + IDEM_APPROVER_MAX + 8], *e;
    char          name[IDEM_APPROVER_MAX + 1];
    idem_value_t  v, out;

    v = value('p', 0, NULL);
    v.created = 1796222500440LL;
    v.expires = 1796226100440LL;
    v.approved_until = 1796223100000LL;
    v.approver = "alice@example.com";
    v.approver_len = 17;
    ROUNDTRIP("approved", &v,
              "2p0" OP FP DASHES "13:1796222500440,13:1796226100440,"
              "13:1796223100000,17:alice@example.com,");

    ok(idem_value_decode("2p0" OP FP OWNER "1:1,1:2,1:3,1:a,", 131 + 16,
                         &out) == -1, "approved with an owner refused");
    ok(idem_value_decode("2p0" OP FP DASHES "1:1,1:2,1:3,0:,", 131 + 15,
                         &out) == -1, "approved without approver refused");
    ok(idem_value_decode("2p0" OP FP DASHES "1:1,1:2,1:a,", 131 + 12, &out)
       == -1, "approved without approval expiry refused");

    memset(name, 'x', sizeof(name));
    v.approver = name;
    v.approver_len = IDEM_APPROVER_MAX + 1;
    e = idem_value_encode(big, &v);
    ok(idem_value_decode(big, e - big, &out) == -1,
       "approver longer than IDEM_APPROVER_MAX refused");
    is_str(idem_state_name('p'), "approved", "state name p");
}


/* an alias (idempotency_unique): no owner, the record key it reuses */
static void
test_roundtrip_alias(void)
{
    idem_value_t  v;

    v = value('s', 0, NULL);
    v.created = 1796222500440LL;
    v.target = TARGET;
    ROUNDTRIP("alias", &v, "2s0" OP FP DASHES S_F);

    v = value('s', 1, NULL);
    v.created = 0;
    v.target = "idem:{00000000000000000000000000000000}:r";
    ROUNDTRIP("alias, waiters, created 0", &v, "2s1" OP FP DASHES
              "1:0,41:idem:{00000000000000000000000000000000}:r,");

    v = value('s', 0, NULL);
    v.created = IDEM_TIME_MS_MAX;
    v.target = "idem:{ffffffffffffffffffffffffffffffff}:r";
    ROUNDTRIP("alias, the last millisecond of year 9999", &v, "2s0" OP FP
              DASHES "15:253402300799999,"
              "41:idem:{ffffffffffffffffffffffffffffffff}:r,");

    is_str(idem_state_name('s'), "alias", "state name s");
}


static void
test_value_roundtrip(void)
{
    test_roundtrip_awaiting();
    test_roundtrip_approved();
    test_roundtrip_alias();
    test_roundtrip_in_progress();
    test_roundtrip_completed();
    test_roundtrip_unknown_released();
}


/* a completed record whose body the caller writes into its place */
static void
test_value_body_null(void)
{
    static const char  want[] = "2c0" OP FP DASHES C_F;
    static const char  want0[] = "2c0" OP FP DASHES "13:1796222500440,"
                                 "13:1796222501000,3:201,1:1,1:0,36:" HDRS
                                 ",0:,";
    char              *buf, *end, *hole;
    size_t             len, i;
    int                untouched;
    idem_value_t       v, out;

    v = value('c', 0, NULL);
    v.created = 1796222500440LL;
    v.completed = 1796222501000LL;
    v.status = 201;
    v.stored = 1;
    v.hdr = HDRS;
    v.hdr_len = sizeof(HDRS) - 1;
    v.body = NULL;
    v.body_len = 9;

    len = idem_value_len(&v);
    is_int((long) len, (long) sizeof(want) - 1,
           "body NULL: the same idem_value_len as with the body");

    buf = keep_alloc(len);
    memset(buf, '#', len);
    end = idem_value_encode(buf, &v);

    is_int((long) (end - buf), (long) len,
           "body NULL: idem_value_encode writes idem_value_len bytes");

    hole = buf + len - 1 - 9;
    untouched = 1;

    for (i = 0; i < 9; i++) {
        untouched &= (hole[i] == '#');
    }

    ok(untouched, "body NULL: the body_len bytes before the last are left");
    ok(memcmp(buf, want, len - 1 - 9) == 0 && buf[len - 1] == ',',
       "body NULL: every other byte is written");

    memcpy(hole, "{\"id\":42}", 9);

    ok(memcmp(buf, want, len) == 0,
       "body NULL: with the body copied in, the same value");
    ok(idem_value_decode(buf, len, &out) == 0
       && bytes_at(out.body, out.body_len, "{\"id\":42}", 9)
       && out.body == hole, "body NULL: decodes with the caller's body");

    /* an empty body, NULL: "0:," */
    v.body_len = 0;
    len = idem_value_len(&v);
    buf = keep_alloc(len);
    end = idem_value_encode(buf, &v);
    ok(bytes_at(buf, (size_t) (end - buf), want0, sizeof(want0) - 1)
       && len == sizeof(want0) - 1,
       "body NULL with body_len 0: an empty netstring");
}


static void
test_state_name(void)
{
    is_str(idem_state_name('i'), "in_progress", "state name i");
    is_str(idem_state_name('c'), "completed", "state name c");
    is_str(idem_state_name('u'), "unknown", "state name u");
    is_str(idem_state_name('r'), "released", "state name r");
    ok(idem_state_name('x') == NULL, "no state name for x");
    ok(idem_state_name('I') == NULL, "no state name for I");
    ok(idem_state_name('\0') == NULL, "no state name for NUL");
}


static void
test_is_hex(void)
{
    ok(idem_is_hex("0123456789abcdef", 16), "is_hex: lowercase hex");
    ok(idem_is_hex(FP, 64), "is_hex: 64 digits");
    ok(!idem_is_hex(FP "0", 65), "is_hex: not 65 digits");
    ok(!idem_is_hex("", 0), "is_hex: not empty");
    ok(!idem_is_hex("0123456789ABCDEF", 16), "is_hex: not uppercase");
    ok(!idem_is_hex("012g", 4), "is_hex: not g");
}


static void
test_value_head(void)
{
    rec_t  r;

    accepts(mk("2i0", OP, FP, OWNER, I_F), "in_progress");
    accepts(mk("2i1", OP, FP, OWNER, I_F), "in_progress, waiters 1");
    accepts(mk("2c0", OP, FP, DASHES, C_F), "completed");
    accepts(mk("2u0", OP, FP, DASHES, U_F), "unknown");
    accepts(mk("2r0", OP, FP, OWNER, R_F), "released, with an owner");
    accepts(mk("2r0", OP, FP, DASHES, R_F), "released, without one");

    /* the head */
    r = mk("2r0", OP, FP, DASHES, "0:,0:,");
    accepts(r, "the shortest value (137 bytes)");
    refuses(cut(r, 0), "empty");
    refuses(cut(r, 1), "the layout byte only");
    refuses(cut(r, IDEM_HEAD_LEN - 1), "a head of 130 bytes");
    refuses(cut(r, IDEM_HEAD_LEN), "the head without fields");

    refuses(mk("1i0", OP, FP, OWNER, I_F), "layout 1");
    refuses(mk("3i0", OP, FP, OWNER, I_F), "layout 3");
    refuses(mk("2x0", OP, FP, OWNER, I_F), "state x");
    refuses(mk("2I0", OP, FP, OWNER, I_F), "state I (uppercase)");
    refuses(mk("2R0", OP, FP, DASHES, R_F), "state R (uppercase)");
    refuses(mk("2d0", OP, FP, DASHES, U_F), "state d");
    refuses(mk("2i2", OP, FP, OWNER, I_F), "waiters 2");
    refuses(mk("2ix", OP, FP, OWNER, I_F), "waiters x");
    refuses(mk("2c-", OP, FP, DASHES, C_F), "waiters -");

    refuses(mk("2i0", "0123456789Abcdef0123456789abcdef", FP, OWNER, I_F),
            "op with an uppercase digit");
    refuses(mk("2i0", "0123456789ABCDEF0123456789ABCDEF", FP, OWNER, I_F),
            "op all uppercase");
    refuses(mk("2i0", "0123456789abcdeg0123456789abcdef", FP, OWNER, I_F),
            "op with g");
    refuses(mk("2u0", "0123456789abcdef0123456789abcde-", FP, DASHES, U_F),
            "op with a dash");
    refuses(mk("2u0", DASHES, FP, DASHES, U_F), "op all dashes");
    refuses(mk("2i0", OP, "00112233445566778899aabbccddeeff"
                          "fedcba9876543210fedcba987654321F", OWNER, I_F),
            "fp with an uppercase digit");
    refuses(mk("2c0", OP, "00112233445566778899AABBCCDDEEFF"
                          "FEDCBA9876543210FEDCBA9876543210", DASHES, C_F),
            "fp all uppercase");
    refuses(mk("2c0", OP, "00112233445566778899aabbccddeeff"
                          "fedcba9876543210 edcba9876543210", DASHES, C_F),
            "fp with a space");

    refuses(mk("2i0", OP, FP, "----------------a0b1c2d3e4f5a6b7", I_F),
            "owner half dashes");
    refuses(mk("2r0", OP, FP, "a0b1c2d3e4f5a6b7----------------", R_F),
            "owner half dashes (released)");
    refuses(mk("2r0", OP, FP, "-------------------------------0", R_F),
            "owner of 31 dashes");
    refuses(mk("2i0", OP, FP, "A0B1C2D3E4F5A6B7C8D9E0F1A2B3C4D5", I_F),
            "owner in uppercase");
    refuses(mk("2c0", OP, FP, OWNER, C_F), "owner on a completed record");
    refuses(mk("2u0", OP, FP, OWNER, U_F), "owner on an unknown record");
    refuses(mk("2i0", OP, FP, DASHES, I_F), "in_progress without an owner");
}


static void
test_value_netstrings(void)
{
    accepts(mk("2r0", OP, FP, DASHES, "0:,0:,"), "r: two empty fields");
    refuses(mk("2r0", OP, FP, DASHES, "00:,0:,"), "length 00");
    refuses(mk("2i0", OP, FP, OWNER, "013:1796222500440,4:5000,8:86400000,"),
            "length 013");
    refuses(mk("2i0", OP, FP, OWNER, "13:1796222500440,04:5000,8:86400000,"),
            "length 04");
    refuses(mk("2c0", OP, FP, DASHES,
               "13:1796222500440,13:1796222501000,3:201,1:1,1:0,"
               "036:" HDRS ",9:{\"id\":42},"), "headers' length 036");

    refuses(mk("2i0", OP, FP, OWNER, "13:1796222500440,4:5000,9:86400000,"),
            "length beyond the end");
    refuses(mk("2i0", OP, FP, OWNER, "13:1796222500440,4:5000,7:86400000,"),
            "length short of the comma");
    refuses(mk("2c0", OP, FP, DASHES,
               "13:1796222500440,13:1796222501000,3:201,1:1,1:0,"
               "36:" HDRS ",99999999999999999999:x,"), "a huge length");
    refuses(mk("2c0", OP, FP, DASHES,
               "13:1796222500440,13:1796222501000,3:201,1:1,1:0,"
               "36:" HDRS ",10:{\"id\":42},"), "body length past the end");
    refuses(mk("2c0", OP, FP, DASHES,
               "13:1796222500440,13:1796222501000,3:201,1:1,1:0,"
               "36:" HDRS ",18446744073709551625:{\"id\":42},"),
            "body length 2^64 + 9 (not read as 9)");

    refuses(mk("2i0", OP, FP, OWNER, "13:1796222500440,4:5000,8:86400000"),
            "no comma after the last field");
    refuses(mk("2i0", OP, FP, OWNER, "13:1796222500440;4:5000,8:86400000,"),
            "a semicolon for a comma");
    refuses(mk("2i0", OP, FP, OWNER, "13:1796222500440,4;5000,8:86400000,"),
            "a semicolon for a colon");
    refuses(mk("2i0", OP, FP, OWNER, "13:1796222500440,45000,8:86400000,"),
            "no colon");
    refuses(mk("2i0", OP, FP, OWNER, "13:1796222500440,:5000,8:86400000,"),
            "no length");
    refuses(mk("2i0", OP, FP, OWNER, "13:1796222500440,4x:5000,8:86400000,"),
            "a letter in the length");
    refuses(mk("2i0", OP, FP, OWNER, "13:1796222500440,+4:5000,8:86400000,"),
            "a signed length");

    refuses(mk("2i0", OP, FP, OWNER, I_F "x"), "a trailing byte");
    refuses(mk("2i0", OP, FP, OWNER, I_F ","), "a trailing comma");
    refuses(mk("2u0", OP, FP, DASHES, U_F "\n"), "a trailing newline");

    refuses(mk("2i0", OP, FP, OWNER, "13:1796222500440,4:5000,"),
            "in_progress without its ttl");
    refuses(mk("2c0", OP, FP, DASHES,
               "13:1796222500440,13:1796222501000,3:201,1:1,1:0,36:" HDRS ","),
            "completed without its body");
    refuses(mk("2u0", OP, FP, DASHES, "13:1796222500440,"),
            "unknown without its time");
    refuses(mk("2r0", OP, FP, DASHES, "3:503,"),
            "released without Retry-After");
    refuses(mk("2i0", OP, FP, OWNER, I_F "0:,"), "in_progress, a 4th field");
    refuses(mk("2i0", OP, FP, OWNER, I_F "1:1,"),
            "in_progress, a 4th number");
    refuses(mk("2c0", OP, FP, DASHES, C_F "0:,"), "completed, an 8th field");
    refuses(mk("2u0", OP, FP, DASHES, U_F "1:1,"), "unknown, a 3rd field");
    refuses(mk("2r0", OP, FP, DASHES, R_F "0:,"), "released, a 3rd field");
}


static void
test_value_numbers(void)
{
#define C_HEAD  "13:1796222500440,13:1796222501000,"
#define C_TAIL  "1:1,1:0,0:,0:,"

    accepts(mk("2c0", OP, FP, DASHES, C_HEAD "3:200," C_TAIL), "status 200");
    accepts(mk("2c0", OP, FP, DASHES, C_HEAD "3:599," C_TAIL), "status 599");
    refuses(mk("2c0", OP, FP, DASHES, C_HEAD "3:199," C_TAIL), "status 199");
    refuses(mk("2c0", OP, FP, DASHES, C_HEAD "3:600," C_TAIL), "status 600");
    refuses(mk("2c0", OP, FP, DASHES, C_HEAD "1:0," C_TAIL), "status 0");
    refuses(mk("2c0", OP, FP, DASHES, C_HEAD "0:," C_TAIL),
            "completed without a status");
    refuses(mk("2c0", OP, FP, DASHES, C_HEAD "4:0201," C_TAIL),
            "status 0201");
    refuses(mk("2c0", OP, FP, DASHES, C_HEAD "3:20x," C_TAIL), "status 20x");
    refuses(mk("2c0", OP, FP, DASHES, C_HEAD "3:201,1:2,1:0,0:,0:,"),
            "stored 2");
    refuses(mk("2c0", OP, FP, DASHES, C_HEAD "3:201,1:1,1:2,0:,0:,"),
            "resolved 2");
    refuses(mk("2c0", OP, FP, DASHES, C_HEAD "3:201,0:,1:0,0:,0:,"),
            "stored empty");
    refuses(mk("2c0", OP, FP, DASHES, C_HEAD "3:201,1:1,2:00,0:,0:,"),
            "resolved 00");

    accepts(mk("2r0", OP, FP, DASHES, "3:200,0:,"), "released, status 200");
    refuses(mk("2r0", OP, FP, DASHES, "3:199,0:,"), "released, status 199");
    refuses(mk("2r0", OP, FP, DASHES, "3:600,0:,"), "released, status 600");
    refuses(mk("2r0", OP, FP, DASHES, "1:0,0:,"), "released, status 0");

    /* times: up to the last millisecond of year 9999 */
    accepts(mk("2u0", OP, FP, DASHES, "15:253402300799999,1:0,"),
            "created at the last millisecond of year 9999");
    refuses(mk("2u0", OP, FP, DASHES, "15:253402300800000,1:0,"),
            "created after year 9999");
    refuses(mk("2u0", OP, FP, DASHES, "1:0,15:253402300800000,"),
            "unknown_at after year 9999");
    refuses(mk("2c0", OP, FP, DASHES,
               "1:0,15:253402300800000,3:201," C_TAIL),
            "completed after year 9999");
    refuses(mk("2i0", OP, FP, OWNER, "1:0,15:253402300800000,1:1,"),
            "lease_ms after year 9999");
    refuses(mk("2i0", OP, FP, OWNER, "1:0,1:1,15:253402300800000,"),
            "ttl_ms after year 9999");
    accepts(mk("2r0", OP, FP, DASHES, "0:,15:253402300799999,"),
            "Retry-After at the limit");
    refuses(mk("2r0", OP, FP, DASHES, "0:,15:253402300800000,"),
            "Retry-After past the limit");

    refuses(mk("2i0", OP, FP, OWNER, "1:0,1:0,1:1,"), "lease_ms 0");
    refuses(mk("2i0", OP, FP, OWNER, "1:0,1:1,1:0,"), "ttl_ms 0");
    refuses(mk("2i0", OP, FP, OWNER, "1:0,0:,1:1,"), "lease_ms empty");
    refuses(mk("2i0", OP, FP, OWNER, "0:,1:1,1:1,"), "created empty");
    refuses(mk("2u0", OP, FP, DASHES, "1:0,0:,"), "unknown_at empty");

    refuses(mk("2i0", OP, FP, OWNER, "13:1796222500440,4:50a0,8:86400000,"),
            "a letter in a number");
    refuses(mk("2i0", OP, FP, OWNER, "13:1796222500440,2:-1,8:86400000,"),
            "a negative number");
    refuses(mk("2i0", OP, FP, OWNER, "13:1796222500440,5:+5000,8:86400000,"),
            "a signed number");
    refuses(mk("2i0", OP, FP, OWNER, "13:1796222500440,5: 5000,8:86400000,"),
            "a number after a space");
    refuses(mk("2i0", OP, FP, OWNER, "13:1796222500440,6:5000.0,8:86400000,"),
            "a decimal point");
    refuses(mk("2i0", OP, FP, OWNER, "13:1796222500440,5:05000,8:86400000,"),
            "a number with a leading zero");
    refuses(mk("2u0", OP, FP, DASHES, "2:00,1:0,"), "the number 00");

    refuses(mk("2r0", OP, FP, DASHES, "0:,18:100000000000000000,"),
            "18 digits, past the limit");
    refuses(mk("2r0", OP, FP, DASHES, "0:,19:1000000000000000000,"),
            "19 digits");
    refuses(mk("2r0", OP, FP, DASHES, "0:,19:9999999999999999999,"),
            "19 digits, more than a long long");
    refuses(mk("2u0", OP, FP, DASHES, "1:0,20:00000000000000000001,"),
            "20 digits");

#undef C_HEAD
#undef C_TAIL
}


/*
 * An alias's target is a record key exactly as idem_record_key() writes
 * it ("idem:{" 32 lowercase hex "}:r"), and an alias has exactly two
 * fields and no owner: anything else is refused.
 */
#define S_TGT(t)  "13:1796222500440," t ","

static void
test_value_alias_target(void)
{
    accepts(mk("2s0", OP, FP, DASHES, S_F), "alias");
    accepts(mk("2s1", OP, FP, DASHES, S_F), "alias, waiters 1");

    refuses(mk("2s0", OP, FP, DASHES,
               S_TGT("40:idem:{fedcba9876543210fedcba987654321}:r")),
            "alias: target of 31 hex (40 bytes)");
    refuses(mk("2s0", OP, FP, DASHES,
               S_TGT("42:idem:{fedcba9876543210fedcba98765432100}:r")),
            "alias: target of 33 hex (42 bytes)");
    refuses(mk("2s0", OP, FP, DASHES, S_TGT("42:" TARGET "x")),
            "alias: target with a trailing byte");
    refuses(mk("2s0", OP, FP, DASHES, S_TGT("42:x" TARGET)),
            "alias: target with a leading byte");
    refuses(mk("2s0", OP, FP, DASHES, S_TGT("0:")), "alias: empty target");
    refuses(mk("2s0", OP, FP, DASHES,
               S_TGT("38:fedcba9876543210fedcba9876543210abcdef")),
            "alias: target without prefix or suffix");
    refuses(mk("2s0", OP, FP, DASHES,
               S_TGT("41:idem:{FEDCBA9876543210FEDCBA9876543210}:r")),
            "alias: target in uppercase hex");
    refuses(mk("2s0", OP, FP, DASHES,
               S_TGT("41:idem:{fedcba9876543210fedcba987654321g}:r")),
            "alias: target with g");
    refuses(mk("2s0", OP, FP, DASHES,
               S_TGT("41:idem:{fedcba9876543210-edcba9876543210}:r")),
            "alias: target with a dash");
    refuses(mk("2s0", OP, FP, DASHES,
               S_TGT("41:idem:[fedcba9876543210fedcba9876543210}:r")),
            "alias: target prefix idem:[");
    refuses(mk("2s0", OP, FP, DASHES,
               S_TGT("41:IDEM:{fedcba9876543210fedcba9876543210}:r")),
            "alias: target prefix IDEM:{");
    refuses(mk("2s0", OP, FP, DASHES,
               S_TGT("41:xdem:{fedcba9876543210fedcba9876543210}:r")),
            "alias: target prefix xdem:{");
}


static void
test_value_alias_suffix(void)
{
    refuses(mk("2s0", OP, FP, DASHES,
               S_TGT("41:idem:{fedcba9876543210fedcba9876543210}:u")),
            "alias: target a unique key (}:u)");
    refuses(mk("2s0", OP, FP, DASHES,
               S_TGT("41:idem:{fedcba9876543210fedcba9876543210}:l")),
            "alias: target a lock key (}:l)");
    refuses(mk("2s0", OP, FP, DASHES,
               S_TGT("41:idem:{fedcba9876543210fedcba9876543210}:o")),
            "alias: target an operation key (}:o)");
    refuses(mk("2s0", OP, FP, DASHES,
               S_TGT("41:idem:{fedcba9876543210fedcba9876543210}:s")),
            "alias: target a scope tag (}:s)");
    refuses(mk("2s0", OP, FP, DASHES,
               S_TGT("41:idem:{fedcba9876543210fedcba9876543210]:r")),
            "alias: target suffix ]:r");
    refuses(mk("2s0", OP, FP, DASHES,
               S_TGT("41:idem:{fedcba9876543210fedcba9876543210}-r")),
            "alias: target suffix }-r");
    refuses(mk("2s0", OP, FP, DASHES,
               S_TGT("41:idem:{fedcba9876543210fedcba9876543210}:R")),
            "alias: target suffix }:R");
}


static void
test_value_alias_fields(void)
{
    refuses(mk("2s0", OP, FP, OWNER, S_F), "alias with an owner");
    refuses(mk("2s0", OP, FP, DASHES, "13:1796222500440,"),
            "alias: one field (no target)");
    refuses(mk("2s0", OP, FP, DASHES, "41:" TARGET ","),
            "alias: the target alone (no created)");
    refuses(mk("2s0", OP, FP, DASHES, S_F "0:,"), "alias: a 3rd field");
    refuses(mk("2s0", OP, FP, DASHES, S_F "41:" TARGET ","),
            "alias: a second target");
    refuses(mk("2s0", OP, FP, DASHES, "41:" TARGET ",13:1796222500440,"),
            "alias: the fields swapped");
    refuses(mk("2s0", OP, FP, DASHES, "0:,41:" TARGET ","),
            "alias: created empty");
    refuses(mk("2s0", OP, FP, DASHES, "15:253402300800000,41:" TARGET ","),
            "alias: created after year 9999");
    refuses(mk("2s0", OP, FP, DASHES, "2:01,41:" TARGET ","),
            "alias: created with a leading zero");
    refuses(mk("2s0", OP, FP, DASHES, S_F "x"), "alias: a trailing byte");
    refuses(mk("2S0", OP, FP, DASHES, S_F), "alias: state S (uppercase)");
    refuses(mk("2s0", OP, FP, DASHES, U_F), "alias with unknown's fields");
}

#undef S_TGT


/* ------------------------------------------------------------- replies */

static const idem_rv_t  NIL = { NULL, 0, 0 };


static idem_rv_t
S(const char *s)
{
    idem_rv_t  v = { s, strlen(s), 1 };

    return v;
}


/* a value as a bulk string */
static idem_rv_t
V(rec_t r)
{
    idem_rv_t  v = { r.p, r.len, 1 };

    return v;
}


/*
 * Not a string (an integer or an array), though with the bytes of s: no
 * decoder may read them as a string.
 */
static idem_rv_t
T(const char *s)
{
    idem_rv_t  v = { s, strlen(s), 0 };

    return v;
}


/* a value, but not as a string */
static idem_rv_t
TV(rec_t r)
{
    idem_rv_t  v = { r.p, r.len, 0 };

    return v;
}


/*
 * The elements a decoder is given for a reply of n: the first min(n, max)
 * (the ones given, then nils), in an exact-size array.
 */
static const idem_rv_t *
elems(const idem_rv_t *given, size_t ngiven, size_t n, size_t max)
{
    size_t      i, m;
    idem_rv_t  *el;

    m = n < max ? n : max;
    el = keep_alloc(m * sizeof(idem_rv_t));

    for (i = 0; i < m; i++) {
        el[i] = i < ngiven ? given[i] : NIL;
    }

    return el;
}

#define RV(...)                                                              \
    (const idem_rv_t []) { __VA_ARGS__ },                                    \
    sizeof((const idem_rv_t []) { __VA_ARGS__ }) / sizeof(idem_rv_t)

#define CLAIM(c, n, ...)                                                     \
    idem_claim_decode(elems(RV(__VA_ARGS__), n, IDEM_CLAIM_ELEMS), n, c)
#define STATUS(s, n, ...)                                                    \
    idem_status_decode(elems(RV(__VA_ARGS__), n, IDEM_STATUS_ELEMS), n, s)
#define ADMIN(st, n, ...)                                                    \
    idem_admin_decode(elems(RV(__VA_ARGS__), n, IDEM_ADMIN_ELEMS), n, st)


static void
test_claim_set_decode(void)
{
    rec_t         ri, rc, rr;
    idem_claim_t  c;

    ri = mk("2i0", OP, FP, OWNER, I_F);
    rc = mk("2c0", OP, FP, DASHES, C_F);
    rr = mk("2r0", OP, FP, OWNER, R_F);

    ok(idem_claim_set_decode(NULL, 0, &c) == IDEM_CLAIM_CLAIMED
       && c.kind == IDEM_CLAIM_CLAIMED, "SET: nil is the claim made");
    ok(idem_claim_set_decode(ri.p, ri.len, &c) == IDEM_CLAIM_RECORD
       && c.kind == IDEM_CLAIM_RECORD && c.rec.state == 'i'
       && c.rec.op == ri.p + IDEM_OP_OFF && c.rec.owner == ri.p + IDEM_OWNER_OFF
       && c.rec.lease_ms == 5000 && c.rec.ttl_ms == 86400000,
       "SET: another attempt's claim");
    ok(idem_claim_set_decode(rc.p, rc.len, &c) == IDEM_CLAIM_RECORD
       && c.rec.state == 'c' && c.rec.status == 201 && c.rec.stored == 1
       && c.rec.body == rc.p + rc.len - 10
       && bytes_at(c.rec.body, c.rec.body_len, "{\"id\":42}", 9)
       && inside(c.rec.hdr, c.rec.hdr_len, rc.p, rc.len)
       && bytes_at(c.rec.hdr, c.rec.hdr_len, HDRS, sizeof(HDRS) - 1),
       "SET: a completed record, body and headers inside the value");
    ok(idem_claim_set_decode(rr.p, rr.len, &c) == IDEM_CLAIM_RECORD
       && c.rec.state == 'r' && c.rec.status == 503 && c.rec.retry_after == 30,
       "SET: a marker is the value that holds the key");
    ok(idem_claim_set_decode("", 0, &c) == IDEM_CLAIM_CORRUPT
       && c.kind == IDEM_CLAIM_CORRUPT, "SET: an empty string is corrupt");
    ok(idem_claim_set_decode("x", 1, &c) == IDEM_CLAIM_CORRUPT,
       "SET: a foreign value is corrupt");
    rc = mk("2c0", OP, FP, OWNER, C_F);
    ok(idem_claim_set_decode(rc.p, rc.len, &c) == IDEM_CLAIM_CORRUPT,
       "SET: a completed record with an owner is corrupt");
    ri = cut(ri, ri.len - 1);
    ok(idem_claim_set_decode(ri.p, ri.len, &c) == IDEM_CLAIM_CORRUPT,
       "SET: a truncated record is corrupt");
}


/* {"claimed"} */
static void
test_claim_claimed(rec_t ri)
{
    idem_claim_t  c;

    ok(CLAIM(&c, 1, S("claimed")) == IDEM_CLAIM_CLAIMED
       && c.kind == IDEM_CLAIM_CLAIMED, "claimed");
    ok(CLAIM(&c, 1, T("claimed")) == IDEM_CLAIM_INVALID
       && c.kind == IDEM_CLAIM_INVALID, "claimed, not a string: invalid");
    ok(CLAIM(&c, 1, S("Claimed")) == IDEM_CLAIM_INVALID,
       "Claimed: invalid");
    ok(CLAIM(&c, 1, S("claimed ")) == IDEM_CLAIM_INVALID,
       "claimed with a space: invalid");
    ok(CLAIM(&c, 2, S("claimed"), V(ri)) == IDEM_CLAIM_INVALID,
       "claimed with a record as second element: invalid");
    ok(CLAIM(&c, 0, NIL) == IDEM_CLAIM_INVALID, "no elements: invalid");
    ok(CLAIM(&c, 1, NIL) == IDEM_CLAIM_INVALID, "one nil: invalid");
    ok(CLAIM(&c, 1, S("claimed")) == IDEM_CLAIM_CLAIMED && c.op == NULL
       && c.approver == NULL, "claimed: no proposal's id, no approver");

    /* a proposal claimed by claim.lua: its id, and a recorded approver */
    ok(CLAIM(&c, 2, S("claimed"), S(OP)) == IDEM_CLAIM_CLAIMED
       && c.op != NULL && memcmp(c.op, OP, 32) == 0 && c.approver == NULL,
       "claimed, a proposal's id");
    ok(CLAIM(&c, 3, S("claimed"), S(OP), S("alice@example.com"))
       == IDEM_CLAIM_CLAIMED && c.op != NULL && c.approver_len == 17
       && memcmp(c.approver, "alice@example.com", 17) == 0,
       "claimed, a proposal's id and its recorded approver");
    ok(CLAIM(&c, 2, S("claimed"), S("0123")) == IDEM_CLAIM_INVALID
       && c.op == NULL, "claimed, an id that is not 32 hex: invalid");
    ok(CLAIM(&c, 2, S("claimed"), S("0123456789ABCDEF0123456789abcdef"))
       == IDEM_CLAIM_INVALID, "claimed, an id in upper case: invalid");
    ok(CLAIM(&c, 2, S("claimed"), T(OP)) == IDEM_CLAIM_INVALID,
       "claimed, an id not a string: invalid");
    ok(CLAIM(&c, 3, S("claimed"), S(OP), S("")) == IDEM_CLAIM_INVALID,
       "claimed, an empty approver: invalid");
    ok(CLAIM(&c, 4, S("claimed"), S(OP), S("a"), S("b"))
       == IDEM_CLAIM_INVALID, "claimed, four elements: invalid");
}


/* {"record", value} */
static void
test_claim_record(rec_t ri, rec_t rc, rec_t ru, rec_t rr, rec_t bad)
{
    idem_claim_t  c;

    ok(CLAIM(&c, 2, S("record"), V(rc)) == IDEM_CLAIM_RECORD
       && c.kind == IDEM_CLAIM_RECORD && c.rec.state == 'c'
       && c.rec.status == 201 && c.rec.completed == 1796222501000LL
       && c.rec.op == rc.p + IDEM_OP_OFF && c.rec.fp == rc.p + IDEM_FP_OFF
       && c.rec.owner == NULL && c.rec.body == rc.p + rc.len - 10
       && c.rec.body_len == 9, "record: completed, fields into the value");
    ok(CLAIM(&c, 2, S("record"), V(ru)) == IDEM_CLAIM_RECORD
       && c.rec.state == 'u' && c.rec.unknown_at == 1796222560000LL,
       "record: unknown");
    ok(CLAIM(&c, 2, S("record"), V(ri)) == IDEM_CLAIM_RECORD
       && c.rec.state == 'i' && c.rec.owner == ri.p + IDEM_OWNER_OFF,
       "record: a claim of another fingerprint");
    ok(CLAIM(&c, 2, S("record"), V(rr)) == IDEM_CLAIM_INVALID,
       "record holding a marker: invalid (markers come as released)");
    ok(CLAIM(&c, 2, S("record"), V(bad)) == IDEM_CLAIM_INVALID
       && c.kind == IDEM_CLAIM_INVALID,
       "record with a value that does not decode: invalid");
    ok(CLAIM(&c, 2, S("record"), S("")) == IDEM_CLAIM_INVALID,
       "record with an empty value: invalid");
    ok(CLAIM(&c, 2, S("record"), NIL) == IDEM_CLAIM_INVALID,
       "record with nil: invalid");
    ok(CLAIM(&c, 2, S("record"), TV(rc)) == IDEM_CLAIM_INVALID,
       "record with a value that is not a string: invalid");
    ok(CLAIM(&c, 2, T("record"), V(rc)) == IDEM_CLAIM_INVALID,
       "record, the kind not a string: invalid");
    ok(CLAIM(&c, 1, S("record")) == IDEM_CLAIM_INVALID,
       "record without a value: invalid");
    ok(CLAIM(&c, 3, S("record"), V(rc), S("1")) == IDEM_CLAIM_INVALID,
       "record with a third element: invalid");
    ok(CLAIM(&c, 2, S("completed"), V(rc)) == IDEM_CLAIM_INVALID,
       "an unknown kind (completed): invalid");
    ok(CLAIM(&c, 2, S("records"), V(rc)) == IDEM_CLAIM_INVALID,
       "an unknown kind (records): invalid");
    ok(CLAIM(&c, 2, NIL, V(rc)) == IDEM_CLAIM_INVALID, "a nil kind: invalid");
}


/* {"in_progress", value, lease ms left} */
static void
test_claim_in_progress(rec_t ri, rec_t rc, rec_t rr, rec_t bad)
{
    idem_claim_t  c;

    ok(CLAIM(&c, 3, S("in_progress"), V(ri), S("1500"))
       == IDEM_CLAIM_IN_PROGRESS && c.kind == IDEM_CLAIM_IN_PROGRESS
       && c.lease_left == 1500 && c.rec.state == 'i' && c.rec.lease_ms == 5000
       && c.rec.owner == ri.p + IDEM_OWNER_OFF, "in_progress, 1500 ms left");
    ok(CLAIM(&c, 3, S("in_progress"), V(ri), S("1")) == IDEM_CLAIM_IN_PROGRESS
       && c.lease_left == 1, "in_progress, 1 ms left");
    ok(CLAIM(&c, 3, S("in_progress"), V(ri), S("5000"))
       == IDEM_CLAIM_IN_PROGRESS && c.lease_left == 5000,
       "in_progress, the whole lease left");
    ok(CLAIM(&c, 3, S("in_progress"), V(ri), S("5001")) == IDEM_CLAIM_INVALID,
       "in_progress, more left than the lease: invalid");
    ok(CLAIM(&c, 3, S("in_progress"), V(ri), S("0")) == IDEM_CLAIM_INVALID,
       "in_progress, nothing left: invalid");
    ok(CLAIM(&c, 3, S("in_progress"), V(ri), S("-1")) == IDEM_CLAIM_INVALID,
       "in_progress, -1 left: invalid");
    ok(CLAIM(&c, 3, S("in_progress"), V(ri), S("")) == IDEM_CLAIM_INVALID,
       "in_progress, empty lease: invalid");
    ok(CLAIM(&c, 3, S("in_progress"), V(ri), S("15x0")) == IDEM_CLAIM_INVALID,
       "in_progress, lease not a number: invalid");
    ok(CLAIM(&c, 3, S("in_progress"), V(ri), S("1234567890123456789"))
       == IDEM_CLAIM_INVALID, "in_progress, 19-digit lease: invalid");
    ok(CLAIM(&c, 3, S("in_progress"), V(ri), S("18446744073709553116"))
       == IDEM_CLAIM_INVALID,
       "in_progress, lease 2^64 + 1500 (not read as 1500): invalid");
    ok(CLAIM(&c, 3, S("in_progress"), V(ri), NIL) == IDEM_CLAIM_INVALID,
       "in_progress, nil lease: invalid");
    ok(CLAIM(&c, 3, S("in_progress"), V(ri), T("1500")) == IDEM_CLAIM_INVALID,
       "in_progress, lease not a string: invalid");
    ok(CLAIM(&c, 3, S("in_progress"), V(rc), S("1500")) == IDEM_CLAIM_INVALID,
       "in_progress with a completed record: invalid");
    ok(CLAIM(&c, 3, S("in_progress"), V(rr), S("1")) == IDEM_CLAIM_INVALID,
       "in_progress with a marker: invalid");
    ok(CLAIM(&c, 3, S("in_progress"), V(bad), S("1")) == IDEM_CLAIM_INVALID,
       "in_progress with a value that does not decode: invalid");
    ok(CLAIM(&c, 2, S("in_progress"), V(ri)) == IDEM_CLAIM_INVALID,
       "in_progress without the lease: invalid");
    ok(CLAIM(&c, 4, S("in_progress"), V(ri), S("1500")) == IDEM_CLAIM_INVALID,
       "in_progress in a reply of 4: invalid");
}


/* {"released", marker} */
static void
test_claim_released(rec_t rc, rec_t rr, rec_t r0)
{
    idem_claim_t  c;

    ok(CLAIM(&c, 2, S("released"), V(rr)) == IDEM_CLAIM_RELEASED
       && c.kind == IDEM_CLAIM_RELEASED && c.rec.state == 'r'
       && c.rec.status == 503 && c.rec.retry_after == 30 && c.rec.waiters == 1
       && c.rec.op == rr.p + IDEM_OP_OFF,
       "released: the marker's status and Retry-After");
    ok(CLAIM(&c, 2, S("released"), V(r0)) == IDEM_CLAIM_RELEASED
       && c.rec.status == 0 && c.rec.retry_after == -1 && c.rec.owner == NULL,
       "released: a marker without status");
    ok(CLAIM(&c, 2, S("released"), V(rc)) == IDEM_CLAIM_INVALID,
       "released with a completed record: invalid");
    ok(CLAIM(&c, 1, S("released")) == IDEM_CLAIM_INVALID,
       "released without a marker: invalid");
    ok(CLAIM(&c, 3, S("released"), V(rr), S("x")) == IDEM_CLAIM_INVALID,
       "released with a third element: invalid");
    ok(CLAIM(&c, 2, S("released"), TV(rr)) == IDEM_CLAIM_INVALID,
       "released, the marker not a string: invalid");
}


/* {"elsewhere"}: another location's operation holds the identity */
static void
test_claim_elsewhere(void)
{
    idem_claim_t  c;

    ok(CLAIM(&c, 1, S("elsewhere")) == IDEM_CLAIM_ELSEWHERE
       && c.kind == IDEM_CLAIM_ELSEWHERE && c.op == NULL
       && c.rec.state == 0, "elsewhere: alone, nothing set");
    ok(CLAIM(&c, 2, S("elsewhere"), S("x")) == IDEM_CLAIM_INVALID,
       "elsewhere with an element more: invalid");
}


/* {"locked", lease ms left | "", the holder's op id | ""} */
static void
test_claim_locked(void)
{
    idem_rv_t     op;
    idem_claim_t  c;

    op = S(OP);

    ok(CLAIM(&c, 3, S("locked"), S("1500"), op) == IDEM_CLAIM_LOCKED
       && c.kind == IDEM_CLAIM_LOCKED && c.lease_left == 1500
       && c.op != NULL && memcmp(c.op, OP, IDEM_TOKEN_LEN) == 0
       && c.rec.state == 0 && c.rec.op == NULL,
       "locked: in flight, 1500 ms left, the holder's id; no record");
    ok(CLAIM(&c, 3, S("locked"), S(""), op) == IDEM_CLAIM_LOCKED
       && c.lease_left == 0 && c.op != NULL
       && memcmp(c.op, OP, IDEM_TOKEN_LEN) == 0,
       "locked: an empty lease (an unknown holder), the holder's id");
    ok(CLAIM(&c, 3, S("locked"), S("1"), S("")) == IDEM_CLAIM_LOCKED
       && c.lease_left == 1 && c.op == NULL,
       "locked: an empty id (a holder of another scope)");
    ok(CLAIM(&c, 3, S("locked"), S(""), S("")) == IDEM_CLAIM_LOCKED
       && c.lease_left == 0 && c.op == NULL,
       "locked: both empty");

    ok(CLAIM(&c, 2, S("locked"), S("1500")) == IDEM_CLAIM_INVALID
       && c.kind == IDEM_CLAIM_INVALID && c.lease_left == 0
       && c.op == NULL, "locked without the id: invalid, nothing set");
    ok(CLAIM(&c, 1, S("locked")) == IDEM_CLAIM_INVALID,
       "locked alone: invalid");
    ok(CLAIM(&c, 4, S("locked"), S("1500"), op) == IDEM_CLAIM_INVALID,
       "locked in a reply of 4: invalid");
    ok(CLAIM(&c, 3, S("locked"), S("-1"), op) == IDEM_CLAIM_INVALID,
       "locked, lease -1: invalid");
    ok(CLAIM(&c, 3, S("locked"), S("15x0"), op) == IDEM_CLAIM_INVALID,
       "locked, lease not a number: invalid");
    ok(CLAIM(&c, 3, S("locked"), S("+15"), op) == IDEM_CLAIM_INVALID,
       "locked, a signed lease: invalid");
    ok(CLAIM(&c, 3, S("locked"), S(" 15"), op) == IDEM_CLAIM_INVALID,
       "locked, a lease after a space: invalid");
    ok(CLAIM(&c, 3, S("locked"), S("1.5"), op) == IDEM_CLAIM_INVALID,
       "locked, a decimal point: invalid");
    ok(CLAIM(&c, 3, S("locked"), S("1234567890123456789"), op)
       == IDEM_CLAIM_INVALID, "locked, a 19-digit lease: invalid");
    ok(CLAIM(&c, 3, S("locked"), S("18446744073709553116"), op)
       == IDEM_CLAIM_INVALID, "locked, lease 2^64 + 1500: invalid");
    ok(CLAIM(&c, 3, S("locked"), NIL, op) == IDEM_CLAIM_INVALID,
       "locked, a nil lease: invalid");
    ok(CLAIM(&c, 3, S("locked"), T("1500"), op) == IDEM_CLAIM_INVALID,
       "locked, the lease not a string: invalid");
    ok(CLAIM(&c, 3, S("locked"), S("1500"), NIL) == IDEM_CLAIM_INVALID,
       "locked, a nil id: invalid");
    ok(CLAIM(&c, 3, S("locked"), S("1500"), T(OP)) == IDEM_CLAIM_INVALID,
       "locked, the id not a string: invalid");
    ok(CLAIM(&c, 3, S("Locked"), S("1500"), op) == IDEM_CLAIM_INVALID,
       "Locked: invalid");
}


/* the holder's id: 32 lowercase hex or nothing */
static void
test_claim_locked_op(void)
{
    idem_claim_t  c;

    ok(CLAIM(&c, 3, S("locked"), S("1"), S("0123456789abcdef0123456789abcde"))
       == IDEM_CLAIM_INVALID, "locked, an id of 31 hex: invalid");
    ok(CLAIM(&c, 3, S("locked"), S("1"),
             S("0123456789abcdef0123456789abcdef0")) == IDEM_CLAIM_INVALID,
       "locked, an id of 33 hex: invalid");
    ok(CLAIM(&c, 3, S("locked"), S("1"),
             S("0123456789ABCDEF0123456789ABCDEF")) == IDEM_CLAIM_INVALID,
       "locked, an id in uppercase: invalid");
    ok(CLAIM(&c, 3, S("locked"), S("1"),
             S("0123456789abcdeg0123456789abcdef")) == IDEM_CLAIM_INVALID,
       "locked, an id with g: invalid");
    ok(CLAIM(&c, 3, S("locked"), S("1"), S(DASHES)) == IDEM_CLAIM_INVALID,
       "locked, an id of dashes: invalid");
    ok(CLAIM(&c, 3, S("locked"), S(""), S(FP)) == IDEM_CLAIM_INVALID,
       "locked, a fingerprint for an id: invalid");
}


/* {"reused", value}: a completed 2xx or an unknown operation */
static void
test_claim_reused(rec_t ri, rec_t rc, rec_t ru, rec_t rr)
{
    rec_t         r;
    idem_claim_t  c;

    ok(CLAIM(&c, 2, S("reused"), V(rc)) == IDEM_CLAIM_REUSED
       && c.kind == IDEM_CLAIM_REUSED && c.rec.state == 'c'
       && c.rec.status == 201 && c.rec.op == rc.p + IDEM_OP_OFF
       && c.rec.body == rc.p + rc.len - 10 && c.rec.body_len == 9
       && c.lease_left == 0 && c.op == NULL,
       "reused: a completed 201, fields into the value");
    ok(CLAIM(&c, 2, S("reused"), V(ru)) == IDEM_CLAIM_REUSED
       && c.rec.state == 'u' && c.rec.unknown_at == 1796222560000LL,
       "reused: an unknown operation");

    r = mk("2c0", OP, FP, DASHES, "1:1,1:2,3:200,1:1,1:0,0:,0:,");
    ok(CLAIM(&c, 2, S("reused"), V(r)) == IDEM_CLAIM_REUSED
       && c.rec.status == 200, "reused: a completed 200");
    r = mk("2c0", OP, FP, DASHES, "1:1,1:2,3:299,1:1,1:0,0:,0:,");
    ok(CLAIM(&c, 2, S("reused"), V(r)) == IDEM_CLAIM_REUSED
       && c.rec.status == 299, "reused: a completed 299");
    r = mk("2c0", OP, FP, DASHES, "1:1,1:2,3:300,1:1,1:0,0:,0:,");
    ok(CLAIM(&c, 2, S("reused"), V(r)) == IDEM_CLAIM_INVALID
       && c.kind == IDEM_CLAIM_INVALID && c.rec.state == 0
       && c.rec.op == NULL, "reused: a completed 300: invalid, nothing set");
    r = mk("2c0", OP, FP, DASHES, "1:1,1:2,3:404,1:1,1:0,0:,0:,");
    ok(CLAIM(&c, 2, S("reused"), V(r)) == IDEM_CLAIM_INVALID,
       "reused: a completed 404: invalid (holds nothing)");
    r = mk("2c0", OP, FP, DASHES, "1:1,1:2,3:500,1:1,1:1,0:,0:,");
    ok(CLAIM(&c, 2, S("reused"), V(r)) == IDEM_CLAIM_INVALID,
       "reused: a completed 500: invalid (holds nothing)");

    ok(CLAIM(&c, 3, S("reused"), V(rc), S("1500")) == IDEM_CLAIM_INVALID,
       "reused: a completed record with a lease: invalid");
    ok(CLAIM(&c, 3, S("reused"), V(ru), S("1500")) == IDEM_CLAIM_INVALID,
       "reused: an unknown record with a lease: invalid");
    ok(CLAIM(&c, 2, S("reused"), V(rr)) == IDEM_CLAIM_INVALID,
       "reused: a marker: invalid");
    ok(CLAIM(&c, 2, S("reused"), S("2u0")) == IDEM_CLAIM_INVALID,
       "reused: a value that does not decode: invalid");
    ok(CLAIM(&c, 2, S("reused"), NIL) == IDEM_CLAIM_INVALID,
       "reused: nil: invalid");
    ok(CLAIM(&c, 2, S("reused"), TV(rc)) == IDEM_CLAIM_INVALID,
       "reused: the value not a string: invalid");
    ok(CLAIM(&c, 1, S("reused")) == IDEM_CLAIM_INVALID,
       "reused without a value: invalid");
    ok(CLAIM(&c, 2, T("reused"), V(rc)) == IDEM_CLAIM_INVALID,
       "reused, the kind not a string: invalid");
    ok(CLAIM(&c, 2, S("reused"), V(ri)) == IDEM_CLAIM_INVALID,
       "reused: a claim without its lease: invalid");
}


/* {"reused", claim, lease ms left}, and the states that hold nothing */
static void
test_claim_reused_claim(rec_t ri, rec_t rs)
{
    rec_t         ra, rp;
    idem_claim_t  c;

    ok(CLAIM(&c, 3, S("reused"), V(ri), S("1500")) == IDEM_CLAIM_REUSED
       && c.kind == IDEM_CLAIM_REUSED && c.rec.state == 'i'
       && c.lease_left == 1500 && c.rec.owner == ri.p + IDEM_OWNER_OFF,
       "reused: a claim in flight, 1500 ms left");
    ok(CLAIM(&c, 3, S("reused"), V(ri), S("1")) == IDEM_CLAIM_REUSED
       && c.lease_left == 1, "reused: a claim, 1 ms left");
    ok(CLAIM(&c, 3, S("reused"), V(ri), S("5000")) == IDEM_CLAIM_REUSED
       && c.lease_left == 5000, "reused: a claim, the whole lease left");
    ok(CLAIM(&c, 3, S("reused"), V(ri), S("5001")) == IDEM_CLAIM_INVALID
       && c.lease_left == 0 && c.rec.state == 0,
       "reused: a claim, more left than its lease: invalid, nothing set");
    ok(CLAIM(&c, 3, S("reused"), V(ri), S("0")) == IDEM_CLAIM_INVALID,
       "reused: a claim, nothing left: invalid");
    ok(CLAIM(&c, 3, S("reused"), V(ri), S("-1")) == IDEM_CLAIM_INVALID,
       "reused: a claim, -1 left: invalid");
    ok(CLAIM(&c, 3, S("reused"), V(ri), S("")) == IDEM_CLAIM_INVALID,
       "reused: a claim, an empty lease: invalid");
    ok(CLAIM(&c, 3, S("reused"), V(ri), S("5x")) == IDEM_CLAIM_INVALID,
       "reused: a claim, a lease not a number: invalid");
    ok(CLAIM(&c, 3, S("reused"), V(ri), T("1500")) == IDEM_CLAIM_INVALID,
       "reused: a claim, the lease not a string: invalid");
    ok(CLAIM(&c, 4, S("reused"), V(ri), S("1500")) == IDEM_CLAIM_INVALID,
       "reused in a reply of 4: invalid");

    ra = mk("2a0", OP, FP, DASHES, "1:1,1:2,");
    rp = mk("2p0", OP, FP, DASHES, "1:1,1:2,1:3,1:a,");
    ok(CLAIM(&c, 2, S("reused"), V(rs)) == IDEM_CLAIM_INVALID,
       "reused: an alias: invalid (an alias holds nothing)");
    ok(CLAIM(&c, 2, S("reused"), V(ra)) == IDEM_CLAIM_INVALID,
       "reused: a proposal: invalid");
    ok(CLAIM(&c, 2, S("reused"), V(rp)) == IDEM_CLAIM_INVALID,
       "reused: an approved proposal: invalid");
    ok(CLAIM(&c, 2, S("record"), V(rs)) == IDEM_CLAIM_RECORD
       && c.rec.state == 's' && c.rec.target == rs.p + rs.len - 42,
       "record: an alias (of another fingerprint), its target inside");
}


/* the values made once: each kind's tests see the same bytes */
static void
test_claim_decode(void)
{
    rec_t  ri, rc, ru, rr, r0, rs, bad;

    ri = mk("2i0", OP, FP, OWNER, I_F);
    rc = mk("2c0", OP, FP, DASHES, C_F);
    ru = mk("2u0", OP, FP, DASHES, U_F);
    rr = mk("2r1", OP, FP, OWNER, R_F);
    r0 = mk("2r0", OP, FP, DASHES, "0:,0:,");
    rs = mk("2s0", OP, FP, DASHES, S_F);
    bad = mk("2u0", OP, FP, OWNER, U_F);

    test_claim_claimed(ri);
    test_claim_record(ri, rc, ru, rr, bad);
    test_claim_in_progress(ri, rc, rr, bad);
    test_claim_released(rc, rr, r0);
    test_claim_locked();
    test_claim_elsewhere();
    test_claim_locked_op();
    test_claim_reused(ri, rc, ru, rr);
    test_claim_reused_claim(ri, rs);
}


static void
test_status_decode(void)
{
    rec_t          ri, rc, ru, rr;
    idem_status_t  s;

    ri = mk("2i0", OP, FP, OWNER, I_F);
    rc = mk("2c0", OP, FP, DASHES,
            "13:1796222500440,13:1796222501000,3:201,1:1,1:0,0:,0:,");
    ru = mk("2u0", OP, FP, DASHES, U_F);
    rr = mk("2r0", OP, FP, DASHES, R_F);

    ok(STATUS(&s, 0, NIL) == IDEM_STATUS_NONE && s.kind == IDEM_STATUS_NONE
       && s.state == NULL, "no elements: no record");
    ok(STATUS(&s, 2, V(ri), S("0")) == IDEM_STATUS_RECORD
       && s.kind == IDEM_STATUS_RECORD && s.rec.state == 'i'
       && s.rec.op == ri.p + IDEM_OP_OFF && s.rec.created == 1796222500440LL,
       "a live claim: decoded");
    is_str(s.state, "in_progress", "a live claim is in_progress");
    ok(STATUS(&s, 2, V(ri), S("1")) == IDEM_STATUS_RECORD
       && s.rec.state == 'i', "a lapsed claim: decoded");
    is_str(s.state, "unknown", "a lapsed claim is shown as unknown");
    ok(STATUS(&s, 2, V(rc), S("0")) == IDEM_STATUS_RECORD
       && s.rec.state == 'c' && s.rec.status == 201
       && s.rec.completed == 1796222501000LL, "a completed record: decoded");
    is_str(s.state, "completed", "a completed record is completed");
    ok(STATUS(&s, 2, V(ru), S("0")) == IDEM_STATUS_RECORD
       && s.rec.unknown_at == 1796222560000LL, "an unknown record: decoded");
    is_str(s.state, "unknown", "an unknown record is unknown");

    ok(STATUS(&s, 2, V(rc), S("1")) == IDEM_STATUS_INVALID
       && s.kind == IDEM_STATUS_INVALID && s.state == NULL,
       "a lapsed completed record: invalid (only a claim lapses)");
    ok(STATUS(&s, 2, V(ru), S("1")) == IDEM_STATUS_INVALID,
       "a lapsed unknown record: invalid");
    ok(STATUS(&s, 2, V(rr), S("0")) == IDEM_STATUS_INVALID,
       "a marker: invalid (status.lua answers {} for it)");
    ok(STATUS(&s, 2, S("2u0"), S("0")) == IDEM_STATUS_INVALID,
       "a value that does not decode: invalid");
    ok(STATUS(&s, 2, V(ri), S("2")) == IDEM_STATUS_INVALID,
       "lapsed 2: invalid");
    ok(STATUS(&s, 2, V(ri), S("")) == IDEM_STATUS_INVALID,
       "lapsed empty: invalid");
    ok(STATUS(&s, 2, V(ri), S("00")) == IDEM_STATUS_INVALID,
       "lapsed 00: invalid");
    ok(STATUS(&s, 2, V(ri), NIL) == IDEM_STATUS_INVALID,
       "lapsed nil: invalid");
    ok(STATUS(&s, 2, V(ri), T("0")) == IDEM_STATUS_INVALID,
       "lapsed not a string: invalid");
    ok(STATUS(&s, 2, NIL, S("0")) == IDEM_STATUS_INVALID,
       "a nil value: invalid");
    ok(STATUS(&s, 2, TV(ri), S("0")) == IDEM_STATUS_INVALID,
       "a value that is not a string: invalid");
    ok(STATUS(&s, 1, V(ri)) == IDEM_STATUS_INVALID, "one element: invalid");
    ok(STATUS(&s, 3, V(ri), S("0"), S("0")) == IDEM_STATUS_INVALID,
       "three elements: invalid");
}


/* an alias comes with the state of the operation it reuses, or "" */
static void
test_status_alias(void)
{
    rec_t          rs, rc;
    idem_rv_t      nul = { "\0", 1, 1 };
    idem_status_t  s;

    rs = mk("2s0", OP, FP, DASHES, S_F);
    rc = mk("2c0", OP, FP, DASHES, C_F);

    ok(STATUS(&s, 3, V(rs), S("0"), S("c")) == IDEM_STATUS_RECORD
       && s.kind == IDEM_STATUS_RECORD && s.rec.state == 's'
       && s.rec.op == rs.p + IDEM_OP_OFF && s.rec.target == rs.p + rs.len - 42
       && s.rec.created == 1796222500440LL, "alias: decoded, target inside");
    is_str(s.state, "alias", "alias: shown as alias");
    is_str(s.alias_state, "completed", "alias of a completed operation");
    ok(STATUS(&s, 3, V(rs), S("0"), S("i")) == IDEM_STATUS_RECORD, "alias: i");
    is_str(s.alias_state, "in_progress", "alias of an operation in flight");
    ok(STATUS(&s, 3, V(rs), S("0"), S("u")) == IDEM_STATUS_RECORD, "alias: u");
    is_str(s.alias_state, "unknown", "alias of an unknown operation");
    ok(STATUS(&s, 3, V(rs), S("0"), S("a")) == IDEM_STATUS_RECORD, "alias: a");
    is_str(s.alias_state, "awaiting_confirmation",
           "alias whose target key now holds a proposal");
    ok(STATUS(&s, 3, V(rs), S("0"), S("p")) == IDEM_STATUS_RECORD, "alias: p");
    is_str(s.alias_state, "approved", "alias whose target is approved");
    ok(STATUS(&s, 3, V(rs), S("0"), S("")) == IDEM_STATUS_RECORD
       && s.alias_state == NULL && s.state != NULL,
       "alias whose operation holds nothing any more: no alias state");

    ok(STATUS(&s, 3, V(rs), S("0"), S("s")) == IDEM_STATUS_INVALID
       && s.kind == IDEM_STATUS_INVALID && s.state == NULL
       && s.alias_state == NULL && s.rec.state == 0,
       "alias of an alias: invalid, nothing set");
    ok(STATUS(&s, 3, V(rs), S("0"), S("r")) == IDEM_STATUS_INVALID,
       "alias state r: invalid (status.lua gives \"\" for a marker)");
    ok(STATUS(&s, 3, V(rs), S("0"), nul) == IDEM_STATUS_INVALID,
       "alias state NUL: invalid");
    ok(STATUS(&s, 3, V(rs), S("0"), S("x")) == IDEM_STATUS_INVALID,
       "alias state x: invalid");
    ok(STATUS(&s, 3, V(rs), S("0"), S("C")) == IDEM_STATUS_INVALID,
       "alias state C: invalid");
    ok(STATUS(&s, 3, V(rs), S("0"), S("cc")) == IDEM_STATUS_INVALID,
       "alias state of two letters: invalid");
    ok(STATUS(&s, 3, V(rs), S("0"), S("completed")) == IDEM_STATUS_INVALID,
       "alias state spelled out: invalid");
    ok(STATUS(&s, 3, V(rs), S("0"), NIL) == IDEM_STATUS_INVALID,
       "alias state nil: invalid");
    ok(STATUS(&s, 3, V(rs), S("0"), T("c")) == IDEM_STATUS_INVALID,
       "alias state not a string: invalid");
    ok(STATUS(&s, 3, V(rs), S("1"), S("c")) == IDEM_STATUS_INVALID,
       "a lapsed alias: invalid (only a claim lapses)");
    ok(STATUS(&s, 2, V(rs), S("0")) == IDEM_STATUS_INVALID
       && s.alias_state == NULL,
       "an alias without its third element: invalid");
    ok(STATUS(&s, 3, V(rc), S("0"), S("c")) == IDEM_STATUS_INVALID,
       "a completed record with a third element: invalid");
    ok(STATUS(&s, 3, V(rc), S("0"), S("")) == IDEM_STATUS_INVALID,
       "a completed record with an empty third element: invalid");
    ok(STATUS(&s, 4, V(rs), S("0"), S("c")) == IDEM_STATUS_INVALID,
       "an alias in a reply of 4: invalid");
}


/*
 * idempotency_lock: an operation in progress (live or lapsed) or unknown
 * comes with the name of the lock key it holds; nothing else does, and a
 * record without one is answered as before
 */
#define LOCK_HEX  "3e0a00b658e86a41c98f52d07313a479"
#define LOCK      "idem:{" LOCK_HEX "}:l"

static void
test_status_lock(void)
{
    rec_t          ri, ru, rc, rs, ra;
    idem_status_t  s;

    ri = mk("2i0", OP, FP, OWNER, I_F);
    ru = mk("2u0", OP, FP, DASHES, U_F);
    rc = mk("2c0", OP, FP, DASHES, C_F);
    rs = mk("2s0", OP, FP, DASHES, S_F);
    ra = mk("2a0", OP, FP, DASHES, "13:1796222500440,13:1796222560000,");

    ok(STATUS(&s, 3, V(ri), S("0"), S(LOCK)) == IDEM_STATUS_RECORD
       && s.lock != NULL && memcmp(s.lock, LOCK, IDEM_RECORD_KEY_LEN) == 0
       && s.alias_state == NULL, "in progress, holding a lock: its name");
    is_str(s.state, "in_progress", "... and in_progress");
    ok(STATUS(&s, 3, V(ri), S("1"), S(LOCK)) == IDEM_STATUS_RECORD
       && s.lock != NULL, "a lapsed claim holding a lock: its name");
    is_str(s.state, "unknown", "... shown as unknown");
    ok(STATUS(&s, 3, V(ru), S("0"), S(LOCK)) == IDEM_STATUS_RECORD
       && s.lock != NULL, "unknown, holding a lock: its name");
    ok(STATUS(&s, 2, V(ri), S("0")) == IDEM_STATUS_RECORD && s.lock == NULL,
       "in progress without a lock: no lock (the reply as before)");
    ok(STATUS(&s, 2, V(ru), S("0")) == IDEM_STATUS_RECORD && s.lock == NULL,
       "unknown without a lock: no lock");
    ok(STATUS(&s, 3, V(rs), S("0"), S("c")) == IDEM_STATUS_RECORD
       && s.lock == NULL, "an alias's third element is no lock");

    ok(STATUS(&s, 3, V(rc), S("0"), S(LOCK)) == IDEM_STATUS_INVALID
       && s.lock == NULL && s.state == NULL,
       "a completed record with a lock: invalid, nothing set");
    ok(STATUS(&s, 3, V(ra), S("0"), S(LOCK)) == IDEM_STATUS_INVALID,
       "a proposal with a lock: invalid");
    ok(STATUS(&s, 3, V(rs), S("0"), S(LOCK)) == IDEM_STATUS_INVALID,
       "an alias with a lock for its state: invalid");
    ok(STATUS(&s, 3, V(ri), S("0"), S("")) == IDEM_STATUS_INVALID,
       "in progress, an empty lock: invalid");
    ok(STATUS(&s, 3, V(ri), S("0"), S("idem:{" LOCK_HEX "}:r"))
       == IDEM_STATUS_INVALID, "a record key for the lock: invalid");
    ok(STATUS(&s, 3, V(ri), S("0"), S("idem:{" LOCK_HEX "}:h"))
       == IDEM_STATUS_INVALID, "the h key for the lock: invalid");
    ok(STATUS(&s, 3, V(ri), S("0"),
              S("idem:{3E0A00B658E86A41C98F52D07313A479}:l"))
       == IDEM_STATUS_INVALID, "a lock name in upper case: invalid");
    ok(STATUS(&s, 3, V(ri), S("0"), S(LOCK "x")) == IDEM_STATUS_INVALID,
       "a lock name with a byte more: invalid");
    ok(STATUS(&s, 3, V(ri), S("0"), T(LOCK)) == IDEM_STATUS_INVALID,
       "a lock name that is not a string: invalid");
    ok(STATUS(&s, 3, V(ri), S("0"), NIL) == IDEM_STATUS_INVALID,
       "a nil lock: invalid");
    ok(STATUS(&s, 4, V(ri), S("0"), S(LOCK)) == IDEM_STATUS_INVALID,
       "in progress in a reply of 4: invalid");
}


static void
test_admin_decode(void)
{
    const char  *state;

    ok(ADMIN(&state, 1, S("none")) == IDEM_ADMIN_NONE && state == NULL,
       "none");
    ok(ADMIN(&state, 1, S("released")) == IDEM_ADMIN_RELEASED
       && state == NULL, "released");
    ok(ADMIN(&state, 1, S("completed")) == IDEM_ADMIN_COMPLETED
       && state == NULL, "completed");
    ok(ADMIN(&state, 2, S("refused"), S("in_progress")) == IDEM_ADMIN_REFUSED
       && state != NULL && strcmp(state, "in_progress") == 0,
       "refused, in progress");
    ok(ADMIN(&state, 2, S("refused"), S("completed")) == IDEM_ADMIN_REFUSED
       && state != NULL && strcmp(state, "completed") == 0,
       "refused, completed");
    ok(ADMIN(&state, 2, S("refused"), S("awaiting_confirmation"))
       == IDEM_ADMIN_REFUSED && state != NULL
       && strcmp(state, "awaiting_confirmation") == 0,
       "refused, a proposal");
    ok(ADMIN(&state, 2, S("refused"), S("approved")) == IDEM_ADMIN_REFUSED
       && state != NULL && strcmp(state, "approved") == 0,
       "refused, an approved proposal");
    ok(ADMIN(&state, 2, S("refused"), S("alias")) == IDEM_ADMIN_REFUSED
       && state != NULL && strcmp(state, "alias") == 0,
       "refused, an alias (resolve the operation it reuses)");
    ok(ADMIN(&state, 2, S("refused"), S("Alias")) == IDEM_ADMIN_INVALID
       && state == NULL, "refused, Alias: invalid");
    ok(ADMIN(&state, 2, S("refused"), S("s")) == IDEM_ADMIN_INVALID,
       "refused, the letter s: invalid");
    ok(ADMIN(&state, 2, S("refused"), S("unknown")) == IDEM_ADMIN_INVALID
       && state == NULL,
       "refused an unknown record: not an answer admin.lua gives");
    ok(ADMIN(&state, 2, S("refused"), S("released")) == IDEM_ADMIN_INVALID,
       "refused a marker: invalid");
    ok(ADMIN(&state, 2, S("refused"), T("completed")) == IDEM_ADMIN_INVALID
       && state == NULL, "refused, the state not a string: invalid");
    ok(ADMIN(&state, 2, S("refused"), NIL) == IDEM_ADMIN_INVALID,
       "refused, a nil state: invalid");
    ok(ADMIN(&state, 1, S("refused")) == IDEM_ADMIN_INVALID,
       "refused without a state");
    ok(ADMIN(&state, 3, S("refused"), S("completed")) == IDEM_ADMIN_INVALID,
       "refused in a reply of 3: invalid");
    ok(ADMIN(&state, 2, S("released"), S("x")) == IDEM_ADMIN_INVALID,
       "released with an extra element: invalid");
    ok(ADMIN(&state, 2, S("none"), NIL) == IDEM_ADMIN_INVALID,
       "none with an extra element: invalid");
    ok(ADMIN(&state, 1, T("none")) == IDEM_ADMIN_INVALID,
       "none, not a string: invalid");
    ok(ADMIN(&state, 1, S("nonE")) == IDEM_ADMIN_INVALID, "nonE: invalid");
    ok(ADMIN(&state, 0, NIL) == IDEM_ADMIN_INVALID, "no elements: invalid");
    ok(ADMIN(&state, 1, NIL) == IDEM_ADMIN_INVALID, "nil: invalid");
}


#define APPROVE(st, u, n, ...)                                               \
    idem_approve_decode(elems(RV(__VA_ARGS__), n, IDEM_APPROVE_ELEMS), n,    \
                        st, u)

static void
test_approve_decode(void)
{
    long long    until;
    const char  *state;

    ok(APPROVE(&state, &until, 2, S("approved"), S("1796223100000"))
       == IDEM_APPROVE_APPROVED && until == 1796223100000LL && state == NULL,
       "approve: approved, with its end");
    ok(APPROVE(&state, &until, 1, S("none")) == IDEM_APPROVE_NONE
       && until == -1, "approve: none");
    ok(APPROVE(&state, &until, 1, S("mismatch")) == IDEM_APPROVE_MISMATCH,
       "approve: mismatch");
    ok(APPROVE(&state, &until, 2, S("refused"), S("completed"))
       == IDEM_APPROVE_REFUSED && state && strcmp(state, "completed") == 0,
       "approve: refused, completed");
    ok(APPROVE(&state, &until, 2, S("refused"), S("unknown"))
       == IDEM_APPROVE_REFUSED && state && strcmp(state, "unknown") == 0,
       "approve: refused, unknown");
    ok(APPROVE(&state, &until, 2, S("refused"), S("approved"))
       == IDEM_APPROVE_REFUSED && state && strcmp(state, "approved") == 0,
       "approve: refused, approved (the page's approve_once)");
    ok(APPROVE(&state, &until, 2, S("refused"), S("declined"))
       == IDEM_APPROVE_REFUSED && state && strcmp(state, "declined") == 0,
       "approve: refused, declined");
    ok(APPROVE(&state, &until, 2, S("refused"), S("awaiting_confirmation"))
       == IDEM_APPROVE_INVALID && state == NULL,
       "approve: refused a proposal is not an answer it gives");
    ok(APPROVE(&state, &until, 2, S("declined"), S("1700000000000"))
       == IDEM_APPROVE_DECLINED && until == 1700000000000LL,
       "approve: declined, with its time");
    ok(APPROVE(&state, &until, 2, S("approved"), S("-1"))
       == IDEM_APPROVE_INVALID && until == -1, "approve: a negative end");
    ok(APPROVE(&state, &until, 2, S("approved"), S("253402300800000"))
       == IDEM_APPROVE_INVALID, "approve: an end after 9999");
    ok(APPROVE(&state, &until, 2, S("approved"), T("1"))
       == IDEM_APPROVE_INVALID, "approve: the end not a string");
    ok(APPROVE(&state, &until, 1, S("approved")) == IDEM_APPROVE_INVALID,
       "approve: approved without its end");
    ok(APPROVE(&state, &until, 2, S("none"), NIL) == IDEM_APPROVE_INVALID,
       "approve: none with an extra element");
    ok(APPROVE(&state, &until, 0, NIL) == IDEM_APPROVE_INVALID,
       "approve: no elements");
}


static void
test_close_decode(void)
{
    is_int(idem_close_decode(0), IDEM_CLOSE_NOT_HELD, "close: 0 not held");
    is_int(idem_close_decode(1), IDEM_CLOSE_DONE, "close: 1 done");
    is_int(idem_close_decode(2), IDEM_CLOSE_MARKED, "close: 2 marked");
    is_int(idem_close_decode(3), IDEM_CLOSE_INVALID, "close: 3 invalid");
    is_int(idem_close_decode(-1), IDEM_CLOSE_INVALID, "close: -1 invalid");
}


int
main(void)
{
    test_record_key();
    test_lock_keys();
    test_hdrs_roundtrip();
    test_hdrs_malformed();
    test_state_name();
    test_is_hex();
    test_value_roundtrip();
    test_value_body_null();
    test_value_head();
    test_value_netstrings();
    test_value_numbers();
    test_value_alias_target();
    test_value_alias_suffix();
    test_value_alias_fields();
    test_claim_set_decode();
    test_claim_decode();
    test_status_decode();
    test_status_alias();
    test_status_lock();
    test_admin_decode();
    test_approve_decode();
    test_close_decode();

    free_all();

    return done_testing();
}
