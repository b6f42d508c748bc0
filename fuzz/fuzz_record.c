/*
 * libFuzzer target: the record value (layout 2, idem_record.h), i.e. what
 * the module accepts from Redis as a record before it replays, refuses or
 * reports anything (idem_value_decode), its encoder, the stored-header
 * netstrings and the record key.
 *
 * Properties, for every input (decoded from an exact-size heap copy, so
 * ASan sees any read past it):
 *  - idem_value_decode returns 0 or -1, the same every time;
 *  - when it accepts: idem_state_name(state) is not NULL; op, fp and
 *    owner point at their offsets, op and fp lowercase hex; the owner is
 *    there on in_progress, absent on completed and unknown; every number
 *    is within its documented range; headers and body lie inside the
 *    input, in that order; idem_value_len is the input's length and
 *    idem_value_encode writes exactly the input back (decode->encode is
 *    the identity), also when the body is left NULL and copied in after;
 *    an alias's target is the record key ("idem:{" 32 hex "}:r") that
 *    ends the value;
 *    the stored headers iterate with idem_hdrs_next without leaving them
 *    and end;
 *  - a value built from the input's bytes (value_from_input: the state,
 *    the numbers, the head's hex, the headers and body from the input)
 *    encodes into idem_value_len bytes and decodes back to the same
 *    fields (encode->decode), so a decoder that refuses good records
 *    fails; and one near miss of it (a byte of the head out of its
 *    alphabet, an owner where none may be, a number out of its range, a
 *    byte more or less, an alias whose target is not a record key or
 *    that has a field less or more) is refused;
 *  - the input as a stored-header blob: decoding terminates, returns only
 *    pairs inside the blob with a non-empty name, and a blob that decodes
 *    completely re-encodes (idem_hdrs_put) to the same bytes; pairs built
 *    from the input (split_pairs) encode into idem_hdrs_pair_len bytes and
 *    decode back;
 *  - idem_record_key gives "idem:{" 32 lowercase hex "}:r", is
 *    deterministic, and moving one byte across the scope/key boundary
 *    gives another record key.
 */

#include "idem_record.h"

#include "fuzz_common.h"
#include "fuzz_value.h"


/* ------------------------------------------------------ stored headers */

#define FUZZ_MAX_PAIRS  64

typedef struct {
    const char  *name;
    size_t       name_len;
    const char  *value;
    size_t       value_len;
} fuzz_pair_t;


/* 1 when blob decodes completely, 0 when it is malformed */
static int
decode_all(const char *blob, size_t size, fuzz_pair_t *pairs, size_t max,
    size_t *npairs)
{
    idem_hdrs_iter_t   it;
    const char        *name, *value;
    size_t             name_len, value_len, n, steps;
    int                rc;

    it.pos = blob;
    it.end = blob + size;
    n = 0;

    for (steps = 0; ; steps++) {
        /* every pair takes at least "1:x,0:," (7 bytes) */
        FUZZ_CHECK(steps <= size / 7 + 1, "decoder does not advance");

        rc = idem_hdrs_next(&it, &name, &name_len, &value, &value_len);

        FUZZ_CHECK(rc >= -1 && rc <= 1, "rc %d", rc);
        FUZZ_CHECK(it.pos >= blob && it.pos <= blob + size,
                   "iterator left the blob");

        if (rc != 1) {
            *npairs = n;
            return rc == 0;
        }

        FUZZ_CHECK(name_len >= 1, "empty name returned");
        FUZZ_CHECK(name_len <= IDEM_HDRS_FIELD_MAX
                   && value_len <= IDEM_HDRS_FIELD_MAX, "field too long");
        FUZZ_CHECK(name >= blob && name + name_len <= blob + size,
                   "name outside the blob");
        FUZZ_CHECK(value >= blob && value + value_len <= blob + size,
                   "value outside the blob");
        FUZZ_CHECK(value > name + name_len, "value overlaps the name");

        if (n < max) {
            pairs[n].name = name;
            pairs[n].name_len = name_len;
            pairs[n].value = value;
            pairs[n].value_len = value_len;
        }
        n++;
    }
}


static char *
encode_all(const fuzz_pair_t *pairs, size_t n, size_t *len)
{
    size_t   i, total;
    char    *buf, *p;

    total = 0;
    for (i = 0; i < n; i++) {
        total += idem_hdrs_pair_len(pairs[i].name_len, pairs[i].value_len);
    }

    /* exactly total bytes: ASan sees a write past idem_hdrs_pair_len */
    buf = malloc(total ? total : 1);
    if (buf == NULL) {
        abort();
    }

    p = buf;
    for (i = 0; i < n; i++) {
        p = idem_hdrs_put(p, pairs[i].name, pairs[i].name_len,
                          pairs[i].value, pairs[i].value_len);
        FUZZ_CHECK(p <= buf + total, "idem_hdrs_put wrote past pair_len");
    }

    FUZZ_CHECK((size_t) (p - buf) == total,
               "encoded %zu bytes, idem_hdrs_pair_len said %zu",
               (size_t) (p - buf), total);

    *len = total;
    return buf;
}


/*
 * Pairs from arbitrary bytes: the input is cut at every 0x00 byte; pieces
 * alternate name, value; an empty name becomes "x".
 */
static size_t
split_pairs(const char *in, size_t size, fuzz_pair_t *pairs, size_t max)
{
    const char  *z;
    size_t       off, len, n;
    int          want_name, more;

    n = 0;
    off = 0;
    want_name = 1;
    more = 1;

    while (more && n < max) {
        z = memchr(in + off, '\0', size - off);
        len = z ? (size_t) (z - (in + off)) : size - off;
        more = (z != NULL);

        if (want_name) {
            pairs[n].name = len ? in + off : "x";
            pairs[n].name_len = len ? len : 1;
            pairs[n].value = "";
            pairs[n].value_len = 0;
        } else {
            pairs[n].value = in + off;
            pairs[n].value_len = len;
            n++;
        }

        want_name = !want_name;
        off += len + (more ? 1 : 0);
    }

    if (!want_name && n < max) {
        n++;                                    /* a name without a value */
    }

    return n;
}


static void
check_hdrs(const char *blob, size_t size)
{
    fuzz_pair_t   pairs[FUZZ_MAX_PAIRS], again[FUZZ_MAX_PAIRS];
    char         *enc, *exact;
    size_t        n, n2, i, enc_len;
    int           whole, whole2;

    /* the input as a stored blob */
    whole = decode_all(blob, size, pairs, FUZZ_MAX_PAIRS, &n);
    whole2 = decode_all(blob, size, again, FUZZ_MAX_PAIRS, &n2);
    FUZZ_CHECK(whole == whole2 && n == n2, "decoding is not deterministic");

    if (whole && n <= FUZZ_MAX_PAIRS) {
        enc = encode_all(pairs, n, &enc_len);
        FUZZ_CHECK(enc_len == size && memcmp(enc, blob, size) == 0,
                   "decoded blob re-encodes differently: \"%s\"",
                   fuzz_show(blob, size));
        free(enc);
    }

    /* pairs from the input: encode, then decode */
    n = split_pairs(blob, size, pairs, FUZZ_MAX_PAIRS);
    for (i = 0; i < n; i++) {
        if (pairs[i].name_len > IDEM_HDRS_FIELD_MAX) {
            pairs[i].name_len = IDEM_HDRS_FIELD_MAX;
        }
        if (pairs[i].value_len > IDEM_HDRS_FIELD_MAX) {
            pairs[i].value_len = IDEM_HDRS_FIELD_MAX;
        }
    }

    enc = encode_all(pairs, n, &enc_len);
    exact = fuzz_dup((const uint8_t *) enc, enc_len);

    whole = decode_all(exact, enc_len, again, FUZZ_MAX_PAIRS, &n2);
    FUZZ_CHECK(whole, "encoded pairs do not decode: \"%s\"",
               fuzz_show(exact, enc_len));
    FUZZ_CHECK(n2 == n, "%zu pairs encoded, %zu decoded", n, n2);

    for (i = 0; i < n; i++) {
        FUZZ_CHECK(again[i].name_len == pairs[i].name_len
                   && memcmp(again[i].name, pairs[i].name,
                             pairs[i].name_len) == 0,
                   "name %zu differs after the round trip", i);
        FUZZ_CHECK(again[i].value_len == pairs[i].value_len
                   && (pairs[i].value_len == 0
                       || memcmp(again[i].value, pairs[i].value,
                                 pairs[i].value_len) == 0),
                   "value %zu differs after the round trip", i);
    }

    free(exact);
    free(enc);
}


/* ---------------------------------------------------------- record key */

static void
check_record_key(const char *in, size_t size)
{
    char    k1[IDEM_RECORD_KEY_LEN + 1], k2[IDEM_RECORD_KEY_LEN + 1];
    size_t  cut, i;

    cut = size ? (unsigned char) in[0] % (size + 1) : 0;

    FUZZ_CHECK(idem_record_key(in, cut, in + cut, size - cut, k1) == 0,
               "idem_record_key failed");
    FUZZ_CHECK(idem_record_key(in, cut, in + cut, size - cut, k2) == 0
               && memcmp(k1, k2, sizeof(k1)) == 0, "record key not stable");

    FUZZ_CHECK(strlen(k1) == IDEM_RECORD_KEY_LEN, "record key length %zu",
               strlen(k1));
    FUZZ_CHECK(memcmp(k1, "idem:{", 6) == 0
               && memcmp(k1 + 38, "}:r", 4) == 0, "record key shape: %s", k1);

    for (i = 6; i < 38; i++) {
        FUZZ_CHECK((k1[i] >= '0' && k1[i] <= '9')
                   || (k1[i] >= 'a' && k1[i] <= 'f'),
                   "record key not hex: %s", k1);
    }

    if (cut < size) {
        FUZZ_CHECK(idem_record_key(in, cut + 1, in + cut + 1, size - cut - 1,
                                   k2) == 0, "idem_record_key failed");
        FUZZ_CHECK(memcmp(k1, k2, sizeof(k1)) != 0,
                   "scope/key boundary does not count: %s", k1);
    }
}


/* ------------------------------------------------------- record values */

static int
in_range(long long n, long long min, long long max)
{
    return n >= min && n <= max;
}


/* "idem:{" 32 lowercase hex "}:r", IDEM_RECORD_KEY_LEN bytes at p */
static int
is_record_key(const char *p)
{
    return memcmp(p, "idem:{", 6) == 0 && fuzz_lower_hex(p + 6, 32)
           && memcmp(p + 38, "}:r", 3) == 0;
}


static int
same_bytes(const char *a, size_t alen, const char *b, size_t blen)
{
    return alen == blen && (alen == 0 || memcmp(a, b, alen) == 0);
}


/* the first field of out that is not in's (for in's state), or NULL */
static const char *
value_diff(const idem_value_t *in, const idem_value_t *out)
{
    if (out->state != in->state) {
        return "state";
    }
    if (out->waiters != (in->waiters ? 1 : 0)) {
        return "waiters";
    }
    if (memcmp(out->op, in->op, IDEM_TOKEN_LEN) != 0) {
        return "op";
    }
    if (memcmp(out->fp, in->fp, IDEM_FP_LEN) != 0) {
        return "fp";
    }
    if ((in->owner == NULL) != (out->owner == NULL)
        || (in->owner && memcmp(in->owner, out->owner, IDEM_TOKEN_LEN) != 0))
    {
        return "owner";
    }

    switch (in->state) {

    case 'i':
        if (out->created != in->created || out->lease_ms != in->lease_ms
            || out->ttl_ms != in->ttl_ms)
        {
            return "in_progress numbers";
        }
        return NULL;

    case 'c':
        if (out->created != in->created || out->completed != in->completed
            || out->status != in->status
            || out->stored != (in->stored ? 1 : 0)
            || out->resolved != (in->resolved ? 1 : 0))
        {
            return "completed numbers";
        }
        if (!same_bytes(out->hdr, out->hdr_len, in->hdr, in->hdr_len)) {
            return "hdr";
        }
        if (!same_bytes(out->body, out->body_len, in->body, in->body_len)) {
            return "body";
        }
        return NULL;

    case 'u':
        if (out->created != in->created || out->unknown_at != in->unknown_at)
        {
            return "unknown numbers";
        }
        return NULL;

    case 'a':
    case 'p':
    case 'd':
        if (out->created != in->created || out->expires != in->expires
            || (in->state != 'a'
                && out->approved_until != in->approved_until))
        {
            return "proposal numbers";
        }
        if (in->state != 'a'
            && !same_bytes(out->approver, out->approver_len, in->approver,
                           in->approver_len))
        {
            return "approver";
        }
        return NULL;

    case 's':
        if (out->created != in->created) {
            return "alias created";
        }
        if (out->target == NULL
            || memcmp(out->target, in->target, IDEM_RECORD_KEY_LEN) != 0)
        {
            return "target";
        }
        return NULL;

    default:
        if (out->status != in->status || out->retry_after != in->retry_after)
        {
            return "released numbers";
        }
        return NULL;
    }
}


/* v as idem_value_encode writes it, in an exact-size buffer */
static char *
encode_exact(const idem_value_t *v, size_t *len)
{
    char  *buf, *end;

    *len = idem_value_len(v);
    buf = malloc(*len ? *len : 1);
    if (buf == NULL) {
        abort();
    }

    end = idem_value_encode(buf, v);

    FUZZ_CHECK((size_t) (end - buf) == *len,
               "idem_value_encode wrote %zu bytes, idem_value_len said %zu",
               (size_t) (end - buf), *len);

    return buf;
}


/* a completed value encoded with body NULL, the body copied in after */
static void
check_body_null(const idem_value_t *v, const char *want, size_t want_len)
{
    char          *buf, *end;
    size_t         i;
    idem_value_t   w;

    w = *v;
    w.body = NULL;

    FUZZ_CHECK(idem_value_len(&w) == want_len,
               "body NULL: idem_value_len %zu, not %zu", idem_value_len(&w),
               want_len);

    buf = malloc(want_len);
    if (buf == NULL) {
        abort();
    }

    memset(buf, 0xa5, want_len);
    end = idem_value_encode(buf, &w);

    FUZZ_CHECK((size_t) (end - buf) == want_len && want_len > v->body_len
               && end[-1] == ',', "body NULL: wrote %zu bytes of %zu",
               (size_t) (end - buf), want_len);

    for (i = 0; i < v->body_len; i++) {
        FUZZ_CHECK((unsigned char) end[-1 - (long) v->body_len + (long) i]
                   == 0xa5, "body NULL: byte %zu of the body written", i);
    }

    if (v->body_len) {
        memcpy(end - 1 - v->body_len, v->body, v->body_len);
    }

    FUZZ_CHECK(memcmp(buf, want, want_len) == 0,
               "body NULL, body copied in: another value than \"%s\"",
               fuzz_show(want, want_len));

    free(buf);
}


/* the input was accepted as v: what that promises */
static void
check_accepted(const char *in, size_t size, const idem_value_t *v)
{
    char         *enc;
    size_t        len, n;
    fuzz_pair_t   pairs[FUZZ_MAX_PAIRS];

    FUZZ_CHECK(idem_state_name(v->state) != NULL && v->state == in[1],
               "accepted state '%c' has no name", v->state);
    FUZZ_CHECK(v->waiters == (in[2] == '1'), "waiters %d", v->waiters);
    FUZZ_CHECK(v->op == in + IDEM_OP_OFF
               && fuzz_lower_hex(v->op, IDEM_TOKEN_LEN)
               && v->fp == in + IDEM_FP_OFF
               && fuzz_lower_hex(v->fp, IDEM_FP_LEN),
               "op or fp not at their offsets in hex");
    FUZZ_CHECK(v->owner == NULL
               || (v->owner == in + IDEM_OWNER_OFF
                   && fuzz_lower_hex(v->owner, IDEM_TOKEN_LEN)),
               "owner not at its offset in hex");
    FUZZ_CHECK(v->state == 'r' || (v->owner != NULL) == (v->state == 'i'),
               "state '%c' %s an owner", v->state,
               v->owner ? "with" : "without");

    switch (v->state) {

    case 'i':
        FUZZ_CHECK(in_range(v->created, 0, IDEM_TIME_MS_MAX)
                   && in_range(v->lease_ms, 1, IDEM_TIME_MS_MAX)
                   && in_range(v->ttl_ms, 1, IDEM_TIME_MS_MAX),
                   "in_progress numbers %lld %lld %lld", v->created,
                   v->lease_ms, v->ttl_ms);
        break;

    case 'c':
        FUZZ_CHECK(in_range(v->created, 0, IDEM_TIME_MS_MAX)
                   && in_range(v->completed, 0, IDEM_TIME_MS_MAX)
                   && in_range(v->status, 200, 599)
                   && in_range(v->stored, 0, 1)
                   && in_range(v->resolved, 0, 1),
                   "completed numbers %lld %lld %d %d %d", v->created,
                   v->completed, v->status, v->stored, v->resolved);
        FUZZ_CHECK(v->hdr != NULL && v->body != NULL
                   && v->hdr >= in + IDEM_HEAD_LEN
                   && v->hdr_len <= size
                   && v->hdr + v->hdr_len < v->body
                   && v->body_len < size
                   && v->body + v->body_len < in + size,
                   "headers or body outside the value");

        /* the stored headers, as the replay reads them */
        decode_all(v->hdr, v->hdr_len, pairs, FUZZ_MAX_PAIRS, &n);
        break;

    case 'u':
        FUZZ_CHECK(in_range(v->created, 0, IDEM_TIME_MS_MAX)
                   && in_range(v->unknown_at, 0, IDEM_TIME_MS_MAX),
                   "unknown numbers %lld %lld", v->created, v->unknown_at);
        break;

    case 'a':
    case 'p':
    case 'd':
        FUZZ_CHECK(in_range(v->created, 0, IDEM_TIME_MS_MAX)
                   && in_range(v->expires, 0, IDEM_TIME_MS_MAX)
                   && (v->state == 'a'
                       || in_range(v->approved_until, 0, IDEM_TIME_MS_MAX)),
                   "proposal numbers %lld %lld %lld", v->created, v->expires,
                   v->approved_until);
        FUZZ_CHECK(v->state == 'a'
                   || (v->approver != NULL && v->approver_len >= 1
                       && v->approver_len <= IDEM_APPROVER_MAX
                       && v->approver >= in + IDEM_HEAD_LEN
                       && v->approver + v->approver_len < in + size),
                   "approver outside the value or of a bad length");
        break;

    case 's':
        FUZZ_CHECK(in_range(v->created, 0, IDEM_TIME_MS_MAX)
                   && v->target == in + size - 1 - IDEM_RECORD_KEY_LEN
                   && is_record_key(v->target),
                   "alias: created %lld, or a target that is not the record "
                   "key at the end of the value", v->created);
        break;

    default:
        FUZZ_CHECK((v->status == 0 || in_range(v->status, 200, 599))
                   && in_range(v->retry_after, -1, IDEM_TIME_MS_MAX),
                   "released numbers %d %lld", v->status, v->retry_after);
        break;
    }

    /* decode -> encode is the identity */
    FUZZ_CHECK(idem_value_len(v) == size,
               "idem_value_len %zu for an accepted value of %zu: \"%s\"",
               idem_value_len(v), size, fuzz_show(in, size));

    enc = encode_exact(v, &len);

    FUZZ_CHECK(memcmp(enc, in, size) == 0,
               "accepted value re-encodes otherwise: \"%s\"",
               fuzz_show(in, size));

    free(enc);

    if (v->state == 'c') {
        check_body_null(v, in, size);
    }
}


/* ------------------------------------------------ values from the input */

/* more bytes than an approver may have */
static const char *
fuzz_long_name(void)
{
    static char  name[IDEM_APPROVER_MAX + 1];

    memset(name, 'n', sizeof(name));

    return name;
}


/* a valid value (as far as its fields go) from the input's bytes */
static void
value_from_input(fuzz_reader_t *r, fuzz_value_t *fv)
{
    static const char   states[] = "icurapsdi";
    unsigned            b;

    b = rd8(r);
    fuzz_value_from_input(r, states[b % 9], b / 9, fv);
}


static void
expect_refused(const char *p, size_t len, const char *what)
{
    char          *copy;
    idem_value_t   v;

    copy = fuzz_dup((const uint8_t *) p, len);

    FUZZ_CHECK(idem_value_decode(copy, len, &v) == -1,
               "near miss accepted (%s): \"%s\"", what, fuzz_show(p, len));

    free(copy);
}


/* a byte outside "0123456789abcdef" (and not '-' when dash is 0) */
static char
not_hex(unsigned b, int dash)
{
    static const char  bad[] = "ABCDEFGgz:,- \x00\xff";
    char               c;

    c = bad[b % (sizeof(bad) - 1)];

    return (c == '-' && !dash) ? 'G' : c;
}


/*
 * A near miss of an alias (encoded as enc, len; its target netstring,
 * "41:" and the record key and ",", is the last 45 bytes): a byte of the
 * target changed (its hex out of the alphabet, its prefix or suffix
 * another byte, such as another key's suffix), the target a byte shorter
 * or longer, or a field less or more.
 */
static void
check_alias_miss(const char *enc, size_t len, unsigned at)
{
    char      *m;
    size_t     ns, p, pos;
    unsigned   sub;

    ns = len - (IDEM_RECORD_KEY_LEN + 4);
    sub = at % 4;
    pos = at / 4;

    m = malloc(len + 8);
    if (m == NULL) {
        abort();
    }

    memcpy(m, enc, len);

    if (sub == 1) {
        p = ns + 3 + pos % IDEM_RECORD_KEY_LEN;
        if (p >= ns + 3 + 6 && p < ns + 3 + 38) {
            m[p] = not_hex((unsigned) pos, 1);

        } else if (p == len - 2) {
            m[p] = "ulosR"[pos % 5];           /* "}:r" becomes "}:u" ... */

        } else {
            m[p] = (char) (m[p] ^ (0x20 | pos));
        }

        expect_refused(m, len, "alias: a byte of the target");

    } else if (sub == 2 && (pos & 1)) {
        /* 40 bytes: the first or the last one left out */
        memcpy(m + ns, "40:", 3);
        memcpy(m + ns + 3, enc + ns + 3 + ((pos & 2) ? 1 : 0), 40);
        m[ns + 43] = ',';
        expect_refused(m, ns + 44, "alias: a target of 40 bytes");

    } else if (sub == 2) {
        /* 42 bytes: one more before or after */
        memcpy(m + ns, "42:", 3);
        p = (pos & 2) ? 1 : 0;
        memcpy(m + ns + 3 + p, enc + ns + 3, IDEM_RECORD_KEY_LEN);
        m[(pos & 2) ? ns + 3 : ns + 3 + IDEM_RECORD_KEY_LEN] = 'a';
        m[ns + 45] = ',';
        expect_refused(m, ns + 46, "alias: a target of 42 bytes");

    } else if (pos & 1) {
        expect_refused(m, ns, "alias: no target");

    } else {
        memcpy(m + len, "0:,", 3);
        expect_refused(m, len + 3, "alias: a third field");
    }

    free(m);
}


/* one near miss of the valid value fv (encoded as enc, len): refused */
static void
check_near_miss(fuzz_reader_t *r, const fuzz_value_t *fv, const char *enc,
    size_t len)
{
    char           *m;
    size_t          at, mlen;
    unsigned        b, kind;
    idem_value_t    w;

    b = rd8(r);
    kind = b % 9;
    at = rd8(r);

    m = malloc(len + 1);
    if (m == NULL) {
        abort();
    }

    memcpy(m, enc, len);
    mlen = len;

    switch (kind) {

    case 0:
        m[0] = "13\x00" "a-"[at % 5];
        expect_refused(m, mlen, "layout byte");
        break;

    case 1:
        m[1] = "xIRCUS\x00" "e2"[at % 9];
        expect_refused(m, mlen, "state byte");
        break;

    case 2:
        m[2] = "2x-\x00 9"[at % 6];
        expect_refused(m, mlen, "waiters byte");
        break;

    case 3:
        m[IDEM_OP_OFF + at % IDEM_TOKEN_LEN] = not_hex(b / 9, 1);
        expect_refused(m, mlen, "operation id not hex");
        break;

    case 4:
        m[IDEM_FP_OFF + at % IDEM_FP_LEN] = not_hex(b / 9, 1);
        expect_refused(m, mlen, "fingerprint not hex");
        break;

    case 5:
        if (fv->v.owner == NULL) {
            /* one owner byte in hex: neither an owner nor none */
            m[IDEM_OWNER_OFF + at % IDEM_TOKEN_LEN] = 'a';

            expect_refused(m, mlen, "owner half dashes");

            if (fv->v.state != 'r') {
                memcpy(m + IDEM_OWNER_OFF, fv->owner, IDEM_TOKEN_LEN);
                expect_refused(m, mlen, "an owner on a closed record");
            }

        } else {
            m[IDEM_OWNER_OFF + at % IDEM_TOKEN_LEN] = not_hex(b / 9, 1);
            expect_refused(m, mlen, "owner not hex");

            if (fv->v.state == 'i') {
                memset(m + IDEM_OWNER_OFF, '-', IDEM_TOKEN_LEN);
                expect_refused(m, mlen, "a claim without an owner");
            }
        }
        break;

    case 6:
        m[mlen++] = (char) at;
        expect_refused(m, mlen, "a trailing byte");
        break;

    case 7:
        expect_refused(m, at % (len + 1) < len ? at % (len + 1) : len - 1,
                       "a value cut short");
        break;

    default:
        if (fv->v.state == 's' && at % 4 != 0) {
            check_alias_miss(enc, len, at);
            break;
        }

        /* a number out of its range, written by the encoder */
        w = fv->v;

        switch (w.state) {
        case 'i':
            if (at % 3 == 0) {
                w.lease_ms = 0;
            } else if (at % 3 == 1) {
                w.ttl_ms = 0;
            } else {
                w.created = IDEM_TIME_MS_MAX + 1 + at;
            }
            break;
        case 'c':
            w.status = (at & 1) ? 199 - (int) (at >> 1) : 600 + (int) at;
            break;
        case 'u':
            w.unknown_at = IDEM_TIME_MS_MAX + 1 + at;
            break;
        case 'a':
            w.expires = IDEM_TIME_MS_MAX + 1 + at;
            break;
        case 's':
            w.created = IDEM_TIME_MS_MAX + 1 + at;
            break;
        case 'p':
        case 'd':
            if (at & 1) {
                w.approved_until = IDEM_TIME_MS_MAX + 1 + at;
            } else {
                /* the approver's length is its range */
                w.approver_len = (at & 2) ? 0 : IDEM_APPROVER_MAX + 1;
                w.approver = fuzz_long_name();
            }
            break;
        default:
            if (at & 1) {
                w.status = (at & 2) ? 199 - (int) (at >> 2) : 600 + (int) at;
            } else {
                w.retry_after = IDEM_TIME_MS_MAX + 1 + at;
            }
            break;
        }

        free(m);
        m = encode_exact(&w, &mlen);
        expect_refused(m, mlen, "a number out of range");
        break;
    }

    free(m);
}


static void
check_built(const uint8_t *data, size_t size)
{
    char            *enc;
    size_t           len;
    const char      *diff;
    fuzz_value_t     fv;
    idem_value_t     out;
    fuzz_reader_t    r = { data, size, 0 };
    fuzz_reader_t    r2;

    /* the near miss takes its two bytes from the start, the value after */
    r.i = size >= 2 ? 2 : size;
    value_from_input(&r, &fv);

    enc = encode_exact(&fv.v, &len);

    FUZZ_CHECK(idem_value_decode(enc, len, &out) == 0,
               "a valid value was refused: \"%s\"", fuzz_show(enc, len));

    diff = value_diff(&fv.v, &out);
    FUZZ_CHECK(diff == NULL, "%s differs after encode->decode: \"%s\"", diff,
               fuzz_show(enc, len));

    if (fv.v.state == 'c') {
        check_body_null(&fv.v, enc, len);
    }

    r2.p = data;
    r2.n = size < 2 ? size : 2;
    r2.i = 0;
    check_near_miss(&r2, &fv, enc, len);

    free(enc);
}


static void
check_value(const char *in, size_t size)
{
    int            rc, rc2;
    idem_value_t   v, v2;

    rc = idem_value_decode(in, size, &v);
    rc2 = idem_value_decode(in, size, &v2);

    FUZZ_CHECK(rc == 0 || rc == -1, "idem_value_decode returned %d", rc);
    FUZZ_CHECK(rc == rc2 && (rc != 0 || value_diff(&v, &v2) == NULL),
               "idem_value_decode is not deterministic");

    if (rc == 0) {
        check_accepted(in, size, &v);
    }
}


int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char  *blob;

    blob = fuzz_dup(data, size);

    check_value(blob, size);
    check_built(data, size);
    check_hdrs(blob, size);
    check_record_key(blob, size);

    free(blob);

    return 0;
}
