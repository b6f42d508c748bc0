/*
 * libFuzzer target: the stored-record decoder, i.e. what the module reads
 * back from Redis (the `hdr` field: netstrings name then value), and the
 * record key derivation.
 *
 * Properties, for every input:
 *  - decoding the input as a stored blob (an exact-size heap copy, so ASan
 *    sees any read past it) terminates, returns only pairs that lie inside
 *    the blob with a non-empty name and lengths <= IDEM_HDRS_FIELD_MAX, and
 *    is deterministic;
 *  - a blob that decodes completely re-encodes (idem_hdrs_put) to exactly
 *    the same bytes: the encoding is unique;
 *  - pairs built from the input (see split_pairs) encode into exactly
 *    idem_hdrs_pair_len bytes and decode back to the same pairs, then end;
 *  - idem_record_key gives "idem:{" 32 lowercase hex "}:r", is
 *    deterministic, and moving one byte across the scope/key boundary
 *    gives another record key.
 */

#include "idem_record.h"

#include "fuzz_common.h"


#define FUZZ_MAX_PAIRS  64

typedef struct {
    const char  *name;
    size_t       name_len;
    const char  *value;
    size_t       value_len;
} fuzz_pair_t;


static size_t
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
            return (size_t) (rc == 0);
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

    /*
     * exactly total bytes: idem_hdrs_put's sprintf writes a NUL after the
     * digits, which must land inside the pair (on ':'-following data)
     */
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
        FUZZ_CHECK((k1[i] >= '0' && k1[i] <= '9') || (k1[i] >= 'a' && k1[i] <= 'f'),
                   "record key not hex: %s", k1);
    }

    if (cut < size) {
        FUZZ_CHECK(idem_record_key(in, cut + 1, in + cut + 1, size - cut - 1,
                                   k2) == 0, "idem_record_key failed");
        FUZZ_CHECK(memcmp(k1, k2, sizeof(k1)) != 0,
                   "scope/key boundary does not count: %s", k1);
    }
}


int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fuzz_pair_t   pairs[FUZZ_MAX_PAIRS], again[FUZZ_MAX_PAIRS];
    char         *blob, *enc;
    size_t        n, n2, i, enc_len;
    int           whole, whole2;

    blob = fuzz_dup(data, size);

    /* 1. the input as a stored blob */
    whole = (int) decode_all(blob, size, pairs, FUZZ_MAX_PAIRS, &n);
    whole2 = (int) decode_all(blob, size, again, FUZZ_MAX_PAIRS, &n2);
    FUZZ_CHECK(whole == whole2 && n == n2, "decoding is not deterministic");

    if (whole && n <= FUZZ_MAX_PAIRS) {
        enc = encode_all(pairs, n, &enc_len);
        FUZZ_CHECK(enc_len == size && memcmp(enc, blob, size) == 0,
                   "decoded blob re-encodes differently: \"%s\"",
                   fuzz_show(blob, size));
        free(enc);
    }

    /* 2. pairs from the input: encode, then decode */
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
    {
        char  *exact = fuzz_dup((const uint8_t *) enc, enc_len);

        whole = (int) decode_all(exact, enc_len, again, FUZZ_MAX_PAIRS, &n2);
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
    }
    free(enc);

    /* 3. record keys */
    check_record_key(blob, size);

    free(blob);

    return 0;
}
