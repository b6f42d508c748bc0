/*
 * libFuzzer target: the audit stream's entries (idem_audit.h).
 *
 * The input is read three ways.
 *
 *  1. As an encoding: idem_audit_decode() is deterministic, and what it
 *     accepts it writes back byte for byte (idem_audit_encode of the
 *     decoded fields), idem_audit_encoded_len() is its length and
 *     idem_audit_encoded_max() at least that; its hash is the SHA-256
 *     (and HMAC-SHA256) that OpenSSL computes directly.
 *  2. As fields: the input split at NUL bytes fills an entry's text
 *     fields; its encoding decodes back to the same fields.
 *  2b. As a version-2 entry (and with 0x02 before it): what
 *     idem_audit_events_decode() accepts it writes back byte for byte.
 *  3. As a tamperer: a chain of four entries is built from the input's
 *     fields, with and without a key; it verifies, with its head; then one
 *     byte of one entry's ID, hash or encoding, chosen by the input, is
 *     changed: verify then names a fault, at or before the entry changed
 *     (or the one after it), never past it.  verify_next on the input as
 *     an ID, hash and encoding does not crash and is deterministic.
 */

#include <openssl/hmac.h>

#include "idem_audit.h"
#include "idem_record.h"

#include "fuzz_common.h"


#define FUZZ_CHAIN  4

static const unsigned char  fuzz_key[] = "fuzz-audit-chain-key-of-32-bytes";


static void
fuzz_hmac_hex(const void *p, size_t n, char hex[65])
{
    unsigned int   len, i;
    unsigned char  md[EVP_MAX_MD_SIZE];

    if (HMAC(EVP_sha256(), fuzz_key, 32, p, n, md, &len) == NULL
        || len != 32)
    {
        abort();
    }

    for (i = 0; i < 32; i++) {
        snprintf(hex + 2 * i, 3, "%02x", md[i]);
    }
}


static void
fuzz_as_encoding(const char *in, size_t size)
{
    char                 *out, hex[IDEM_AUDIT_HASH_LEN + 1], want[65];
    size_t                len;
    idem_audit_entry_t    e, e2;

    int rc = idem_audit_decode(in, size, &e);

    FUZZ_CHECK(idem_audit_decode(in, size, &e2) == rc, "decode not deterministic");

    if (rc != 0) {
        return;
    }

    len = idem_audit_encoded_len(&e);
    FUZZ_CHECK(len == size, "encoded_len %zu of an input of %zu", len, size);
    FUZZ_CHECK(idem_audit_encoded_max(&e) >= len, "encoded_max below the length");

    out = malloc(len);
    FUZZ_CHECK(out != NULL, "out of memory");
    FUZZ_CHECK(idem_audit_encode(out, &e) == out + len, "encode wrote another length");
    FUZZ_CHECK(memcmp(out, in, len) == 0, "decode then encode changed \"%s\"",
               fuzz_show(in, size));
    free(out);

    FUZZ_CHECK(idem_audit_hash(in, size, NULL, 0, hex) == 0, "hash failed");
    fuzz_sha256_hex(in, size, want);
    FUZZ_CHECK(strcmp(hex, want) == 0, "hash is not SHA-256");

    FUZZ_CHECK(idem_audit_hash(in, size, fuzz_key, 32, hex) == 0, "hmac failed");
    fuzz_hmac_hex(in, size, want);
    FUZZ_CHECK(strcmp(hex, want) == 0, "keyed hash is not HMAC-SHA256");
}


/* the text fields of an entry from the input's NUL-separated parts */
static void
fuzz_fields(const char *in, size_t size, idem_audit_entry_t *e)
{
    size_t       i, start, part;
    idem_str_t  *f[7];

    f[0] = &e->key;
    f[1] = &e->route;
    f[2] = &e->identity;
    f[3] = &e->approver;
    f[4] = &e->ref;
    f[5] = &e->prev;
    f[6] = NULL;

    memset(e, 0, sizeof(*e));
    e->seq = 1 + (size % 1000);
    e->time = (int64_t) size * 7919;
    e->event = (idem_audit_event_e) (size % IDEM_AUDIT_NEVENTS);
    e->status = size % 3 ? 0 : 100 + (int) (size % 900);

    for (i = 0, start = 0, part = 0; i <= size && f[part]; i++) {
        if (i == size || in[i] == '\0') {
            f[part]->data = in + start;
            f[part]->len = i - start;
            part++;
            start = i + 1;
        }
    }

    if (e->prev.len > IDEM_AUDIT_PREV_MAX) {
        e->prev.len = IDEM_AUDIT_PREV_MAX;
    }
}


static int
fuzz_same(idem_str_t *a, idem_str_t *b)
{
    return a->len == b->len && (a->len == 0 || memcmp(a->data, b->data, a->len) == 0);
}


static void
fuzz_as_fields(const char *in, size_t size)
{
    char                *out;
    size_t               len;
    idem_audit_entry_t   e, d;

    fuzz_fields(in, size, &e);
    len = idem_audit_encoded_len(&e);
    out = malloc(len);
    FUZZ_CHECK(out != NULL, "out of memory");
    FUZZ_CHECK(idem_audit_encode(out, &e) == out + len, "encode length");
    FUZZ_CHECK(idem_audit_decode(out, len, &d) == 0, "an encoded entry does not decode: \"%s\"",
               fuzz_show(out, len));
    FUZZ_CHECK(d.seq == e.seq && d.time == e.time && d.event == e.event && d.status == e.status
               && fuzz_same(&d.key, &e.key) && fuzz_same(&d.route, &e.route)
               && fuzz_same(&d.identity, &e.identity) && fuzz_same(&d.approver, &e.approver)
               && fuzz_same(&d.ref, &e.ref) && fuzz_same(&d.prev, &e.prev),
               "decoded fields differ");
    free(out);
}


typedef struct {
    char    id[32];
    char    h[IDEM_AUDIT_HASH_LEN + 1];
    char   *e;
    size_t  len;
} fuzz_stored_t;


static void
fuzz_chain(const char *in, size_t size, const unsigned char *key, fuzz_stored_t *s)
{
    int                  i;
    char                 prev[IDEM_AUDIT_HASH_LEN + 1];
    idem_audit_entry_t   e;

    memcpy(prev, idem_audit_genesis, sizeof(prev));

    for (i = 0; i < FUZZ_CHAIN; i++) {
        fuzz_fields(in + (size_t) i * size / FUZZ_CHAIN, size / FUZZ_CHAIN, &e);
        e.seq = (uint64_t) i + 1;
        e.prev.data = prev;
        e.prev.len = IDEM_AUDIT_HASH_LEN;

        s[i].len = idem_audit_encoded_len(&e);
        s[i].e = malloc(s[i].len);
        FUZZ_CHECK(s[i].e != NULL, "out of memory");
        idem_audit_encode(s[i].e, &e);
        FUZZ_CHECK(idem_audit_hash(s[i].e, s[i].len, key, key ? 32 : 0, s[i].h) == 0, "hash");
        snprintf(s[i].id, sizeof(s[i].id), "%d-0", i + 1);
        memcpy(prev, s[i].h, sizeof(prev));
    }
}


/* 0 intact, else the fault, with the entry it names in *seq */
static int
fuzz_verify(fuzz_stored_t *s, const unsigned char *key, uint64_t *seq)
{
    int                  i;
    idem_audit_verify_t  v;

    idem_audit_verify_init(&v, key, key ? 32 : 0);

    for (i = 0; i < FUZZ_CHAIN; i++) {
        if (idem_audit_verify_next(&v, s[i].id, strlen(s[i].id), s[i].h, strlen(s[i].h), s[i].e,
                                   s[i].len) != 0)
        {
            FUZZ_CHECK(v.fault != IDEM_AUDIT_INTACT && v.why[0], "a fault without a name");
            *seq = v.fault_seq;
            return (int) v.fault;
        }
    }

    *seq = v.seq;
    return 0;
}


static void
fuzz_as_tamperer(const char *in, size_t size, const unsigned char *key)
{
    int             i, fault;
    char           *p, old;
    size_t          n, pos;
    uint64_t        seq, allowed, moved;
    fuzz_stored_t   s[FUZZ_CHAIN];

    fuzz_chain(in, size, key, s);
    FUZZ_CHECK(fuzz_verify(s, key, &seq) == 0 && seq == FUZZ_CHAIN, "a built chain does not verify");

    /* one byte of entry i: its ID, its hash or its encoding */
    i = size ? (unsigned char) in[0] % FUZZ_CHAIN : 0;
    pos = size > 1 ? (unsigned char) in[1] : 0;
    n = strlen(s[i].id) + IDEM_AUDIT_HASH_LEN + s[i].len;
    pos %= n;

    p = pos < strlen(s[i].id) ? &s[i].id[pos]
        : pos < strlen(s[i].id) + IDEM_AUDIT_HASH_LEN ? &s[i].h[pos - strlen(s[i].id)]
        : &s[i].e[pos - strlen(s[i].id) - IDEM_AUDIT_HASH_LEN];
    old = *p;
    *p = size > 2 && in[2] != old ? in[2] : (char) (old ^ 1);

    /* an ID changed names the place it now gives */
    allowed = (uint64_t) i + 2;
    moved = idem_audit_id_seq(s[i].id, strlen(s[i].id));
    allowed = moved > allowed ? moved : allowed;

    fault = fuzz_verify(s, key, &seq);
    FUZZ_CHECK(fault != 0, "entry %d changed at byte %zu, and the chain verifies", i + 1, pos);
    FUZZ_CHECK(seq >= 1 && seq <= allowed, "entry %d changed, fault named at %llu", i + 1,
               (unsigned long long) seq);

    for (i = 0; i < FUZZ_CHAIN; i++) {
        free(s[i].e);
    }
}


/*
 * Version 2 (one entry, its events): what idem_audit_events_decode()
 * accepts it writes back byte for byte, at idem_audit_batch_len(), within
 * idem_audit_batch_max(); the input with 0x02 before it is read too, so
 * that most inputs reach the event decoder.
 */
static void
fuzz_as_entry(const char *in, size_t size)
{
    char                 *v2, *out;
    size_t                len, n;
    idem_audit_events_t   ev;

    v2 = malloc(size + 1);
    if (v2 == NULL) {
        abort();
    }

    v2[0] = IDEM_AUDIT_V2;
    memcpy(v2 + 1, in, size);

    for (n = 0; n < 2; n++) {
        const char  *p = n ? v2 : in;
        size_t       plen = n ? size + 1 : size;

        if (idem_audit_events_decode(p, plen, &ev) != 0 || ev.version != 2) {
            continue;
        }

        len = idem_audit_batch_len(ev.e, ev.n);
        FUZZ_CHECK(len == plen, "batch_len %zu of an entry of %zu bytes",
                   len, plen);
        FUZZ_CHECK(idem_audit_batch_max(ev.e, ev.n) >= len, "batch_max");
        out = malloc(len);
        if (out == NULL) {
            abort();
        }
        FUZZ_CHECK(idem_audit_batch_encode(out, ev.e, ev.n) == out + len,
                   "batch_encode wrote another length");
        FUZZ_CHECK(memcmp(out, p, len) == 0,
                   "a decoded entry is not written back byte for byte");
        free(out);
    }

    free(v2);
}


int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char                 *in, h[IDEM_AUDIT_PREV_MAX + 1];
    size_t                hl;
    idem_audit_verify_t   v1, v2;

    in = fuzz_dup(data, size);

    fuzz_as_encoding(in, size);
    fuzz_as_entry(in, size);
    fuzz_as_fields(in, size);
    fuzz_as_tamperer(in, size, NULL);
    fuzz_as_tamperer(in, size, fuzz_key);

    /* the input as an ID, a hash and an encoding, twice the same answer */
    hl = size < sizeof(h) - 1 ? size : sizeof(h) - 1;
    memcpy(h, in, hl);
    idem_audit_verify_init(&v1, NULL, 0);
    idem_audit_verify_init(&v2, NULL, 0);
    FUZZ_CHECK(idem_audit_verify_next(&v1, in, size, h, hl, in, size)
               == idem_audit_verify_next(&v2, in, size, h, hl, in, size)
               && v1.fault == v2.fault && v1.fault_seq == v2.fault_seq,
               "verify_next not deterministic");

    free(in);

    return 0;
}
