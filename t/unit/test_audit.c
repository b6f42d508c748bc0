/*
 * The audit stream's entries (idem_audit.h): the canonical encoding and
 * its hash against vectors computed apart (Python's hashlib and hmac),
 * the decoder's refusals, and the verifier on a chain built here and
 * tampered with in each way docs/audit.md names.
 */

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "idem_audit.h"
#include "idem_record.h"
#include "idem_text.h"
#include "tap.h"


#define S(lit)  { lit, sizeof(lit) - 1 }

static const char  vector_enc[] =
    "12:idem-audit-1,1:1,13:1733460000123,"
    "64:0000000000000000000000000000000000000000000000000000000000000000,"
    "4:sent,32:0123456789abcdef0123456789abcdef,3:k-1,"
    "64:abababababababababababababababababababababababababababababababab,"
    "4:/pay,0:,5:alice,0:,0:,0:,32:fedcba9876543210fedcba9876543210,";

static const char  vector_sha[] =
    "e46a9206a7bbeea15fb168199f51444edd0526ac0adf33decc4e21fe4700adc7";
static const char  vector_hmac[] =
    "7f0f632bc8c5e39558ce431c660cb1294b50d6c764de2819fa62090dbb5a7e8f";

static const unsigned char  chain_key[] = "kkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkk";


static idem_audit_entry_t
vector_entry(void)
{
    idem_audit_entry_t  e;
    idem_str_t          op = S("0123456789abcdef0123456789abcdef");
    idem_str_t          key = S("k-1"), route = S("/pay"), who = S("alice");
    idem_str_t          fp = S("abababababababababababababababababababababab"
                               "abababababababababab");
    idem_str_t          req = S("fedcba9876543210fedcba9876543210");

    memset(&e, 0, sizeof(e));
    e.seq = 1;
    e.time = 1733460000123LL;
    e.prev.data = idem_audit_genesis;
    e.prev.len = IDEM_AUDIT_HASH_LEN;
    e.event = IDEM_AUDIT_SENT;
    e.op = op;
    e.key = key;
    e.fp = fp;
    e.route = route;
    e.identity = who;
    e.request = req;

    return e;
}


static void
test_vector(void)
{
    char                 buf[1024], hex[IDEM_AUDIT_HASH_LEN + 1], *end;
    idem_audit_entry_t   e, d;

    e = vector_entry();
    end = idem_audit_encode(buf, &e);
    *end = '\0';

    is_str(buf, vector_enc, "the encoding of the documented example");
    is_int((long) (end - buf), (long) idem_audit_encoded_len(&e),
           "encoded_len is the length written");
    ok(idem_audit_encoded_max(&e) >= idem_audit_encoded_len(&e) + 20,
       "encoded_max leaves room for longer seq, time and prev");

    ok(idem_audit_hash(buf, (size_t) (end - buf), NULL, 0, hex) == 0,
       "hash computed");
    is_str(hex, vector_sha, "SHA-256 of the encoding");
    ok(idem_audit_hash(buf, (size_t) (end - buf), chain_key, 32, hex) == 0,
       "HMAC computed");
    is_str(hex, vector_hmac, "HMAC-SHA256 with the key");

    ok(idem_audit_decode(buf, (size_t) (end - buf), &d) == 0, "decoded");
    ok(d.seq == 1 && d.time == 1733460000123LL && d.event == IDEM_AUDIT_SENT
       && d.status == 0 && d.key.len == 3 && memcmp(d.key.data, "k-1", 3) == 0
       && d.identity.len == 5 && d.approver.len == 0
       && d.request.len == 32, "decoded fields");

    e.status = 201;
    e.event = IDEM_AUDIT_COMPLETED;
    e.seq = 12345678901234ULL;
    end = idem_audit_encode(buf, &e);
    ok(idem_audit_decode(buf, (size_t) (end - buf), &d) == 0
       && d.status == 201 && d.event == IDEM_AUDIT_COMPLETED
       && d.seq == 12345678901234ULL, "a status and a long seq round-trip");
}


static void
test_events(void)
{
    int  i, ok_all;

    ok_all = 1;

    for (i = 0; i < IDEM_AUDIT_NEVENTS; i++) {
        const char  *n = idem_audit_event_name((idem_audit_event_e) i);

        ok_all &= n != NULL && idem_audit_event_parse(n, strlen(n)) == i;
    }

    ok(ok_all, "every event name parses back to its event");
    is_int(IDEM_AUDIT_NEVENTS, 14, "fourteen events, as docs/audit.md lists");
    ok(idem_audit_event_parse("sent ", 5) == -1
       && idem_audit_event_parse("", 0) == -1, "other names are refused");
    ok(idem_audit_event_name(IDEM_AUDIT_NEVENTS) == NULL, "out of range");
}


/* the vector with one netstring replaced */
static int
decodes_with(int field, const char *value)
{
    char                 buf[1024], *p;
    size_t               i;
    idem_hdrs_iter_t     it;
    idem_str_t           f;
    idem_audit_entry_t   d;

    it.pos = vector_enc;
    it.end = vector_enc + sizeof(vector_enc) - 1;
    p = buf;

    for (i = 0; i < IDEM_AUDIT_FIELDS; i++) {
        if (idem_netstring_get(&it, &f.data, &f.len, 1024) != 0) {
            return -2;
        }

        if ((int) i == field) {
            f.data = value;
            f.len = strlen(value);
        }

        p = idem_netstring_put(p, f.data, f.len);
    }

    return idem_audit_decode(buf, (size_t) (p - buf), &d);
}


static void
test_decode_refuses(void)
{
    idem_audit_entry_t  d;

    is_int(decodes_with(-1, ""), 0, "the vector itself decodes");
    is_int(decodes_with(0, "idem-audit-2"), -1, "another version");
    is_int(decodes_with(1, "01"), -1, "a seq with a leading zero");
    is_int(decodes_with(1, "0"), -1, "seq 0");
    is_int(decodes_with(2, "x"), -1, "a time that is not decimal");
    is_int(decodes_with(4, "done"), -1, "an unknown event");
    is_int(decodes_with(5, "0123456789ABCDEF0123456789ABCDEF"), -1,
           "an op in uppercase hex");
    is_int(decodes_with(7, "abab"), -1, "a short fingerprint");
    is_int(decodes_with(9, "99"), -1, "a two-digit status");
    is_int(decodes_with(9, "099"), -1, "a status with a leading zero");
    is_int(decodes_with(9, "201"), 0, "a status");
    is_int(decodes_with(12, "zz"), -1, "a response digest not hex");
    is_int(decodes_with(10, "bob \"the\" \x01 builder"), 0,
           "identity: any bytes");
    ok(idem_audit_decode(vector_enc, sizeof(vector_enc) - 2, &d) == -1,
       "a cut encoding");
    ok(idem_audit_decode("12:idem-audit-1,", 16, &d) == -1,
       "too few fields");

    {
        char  more[sizeof(vector_enc) + 4];

        memcpy(more, vector_enc, sizeof(vector_enc) - 1);
        memcpy(more + sizeof(vector_enc) - 1, "0:,", 3);
        ok(idem_audit_decode(more, sizeof(vector_enc) + 2, &d) == -1,
           "a sixteenth field");
    }

    is_int((long) idem_audit_id_seq("17-0", 4), 17, "ID 17-0 is seq 17");
    ok(idem_audit_id_seq("17-1", 4) == 0 && idem_audit_id_seq("017-0", 5) == 0
       && idem_audit_id_seq("-0", 2) == 0 && idem_audit_id_seq("a-0", 3) == 0,
       "other IDs are not the module's");
}


/* ---- a chain of entries, as the stream holds them */

#define CHAIN_N  6

typedef struct {
    char    id[32];
    char    h[IDEM_AUDIT_PREV_MAX + 1];
    char    e[1024];
    size_t  e_len;
} stored_t;


static void
chain_build(stored_t *s, int n, const unsigned char *key)
{
    int                  i;
    char                 prev[IDEM_AUDIT_HASH_LEN + 1], key_text[16];
    idem_audit_entry_t   e;

    memcpy(prev, idem_audit_genesis, sizeof(prev));

    for (i = 0; i < n; i++) {
        e = vector_entry();
        e.seq = (uint64_t) i + 1;
        e.time = 1733460000000LL + i;
        e.prev.data = prev;
        e.prev.len = IDEM_AUDIT_HASH_LEN;
        e.event = (idem_audit_event_e) (i % IDEM_AUDIT_NEVENTS);
        snprintf(key_text, sizeof(key_text), "key-%d", i);
        e.key.data = key_text;
        e.key.len = strlen(key_text);

        s[i].e_len = (size_t) (idem_audit_encode(s[i].e, &e) - s[i].e);
        idem_audit_hash(s[i].e, s[i].e_len, key, key ? 32 : 0, s[i].h);
        snprintf(s[i].id, sizeof(s[i].id), "%d-0", i + 1);
        memcpy(prev, s[i].h, sizeof(prev));
    }
}


/* the first fault of s[0..n), or INTACT; *seq gets the entry it names */
static idem_audit_fault_e
chain_verify(stored_t *s, int n, const unsigned char *key, uint64_t *seq)
{
    int                  i;
    idem_audit_verify_t  v;

    idem_audit_verify_init(&v, key, key ? 32 : 0);

    for (i = 0; i < n; i++) {
        if (idem_audit_verify_next(&v, s[i].id, strlen(s[i].id), s[i].h,
                                   strlen(s[i].h), s[i].e, s[i].e_len) != 0)
        {
            *seq = v.fault_seq;
            return v.fault;
        }
    }

    *seq = v.seq;
    return IDEM_AUDIT_INTACT;
}


/* entry i's fields rewritten with another route, its hash recomputed */
static void
chain_forge(stored_t *s, int i, const unsigned char *key, const char *route)
{
    idem_audit_entry_t  e;
    char                copy[1024];

    memcpy(copy, s[i].e, s[i].e_len);
    idem_audit_decode(copy, s[i].e_len, &e);
    e.route.data = route;
    e.route.len = strlen(route);
    s[i].e_len = (size_t) (idem_audit_encode(s[i].e, &e) - s[i].e);
    idem_audit_hash(s[i].e, s[i].e_len, key, key ? 32 : 0, s[i].h);
}


static void
test_chain(const unsigned char *key, const char *what)
{
    stored_t   s[CHAIN_N + 1], t[CHAIN_N + 1];
    uint64_t   seq;

    chain_build(s, CHAIN_N, key);
    ok(chain_verify(s, CHAIN_N, key, &seq) == IDEM_AUDIT_INTACT && seq == 6,
       "%s: an intact chain verifies, head 6", what);

    /* one field changed, the hash kept */
    memcpy(t, s, sizeof(s));
    memcpy(strstr(t[2].e, "4:/pay"), "4:/pax", 6);
    ok(chain_verify(t, CHAIN_N, key, &seq) == IDEM_AUDIT_MODIFIED && seq == 3,
       "%s: a changed field: entry 3 modified", what);

    /* one entry in the middle removed */
    memcpy(t, s, sizeof(s));
    memmove(&t[3], &t[4], 2 * sizeof(stored_t));
    ok(chain_verify(t, CHAIN_N - 1, key, &seq) == IDEM_AUDIT_MISSING
       && seq == 4, "%s: entry 4 removed: missing 4", what);

    /* two swapped (the stream gives them new IDs in order) */
    memcpy(t, s, sizeof(s));
    t[1] = s[2];
    t[2] = s[1];
    strcpy(t[1].id, "2-0");
    strcpy(t[2].id, "3-0");
    ok(chain_verify(t, CHAIN_N, key, &seq) == IDEM_AUDIT_REORDERED
       && seq == 2, "%s: entries 2 and 3 swapped: reordered at 2", what);

    /* a forged entry put in as entry 3, the rest moved up */
    memcpy(t, s, sizeof(s));
    memmove(&t[3], &t[2], 4 * sizeof(stored_t));
    chain_forge(t, 2, NULL, "/forged");
    strcpy(t[3].id, "4-0");
    strcpy(t[4].id, "5-0");
    strcpy(t[5].id, "6-0");
    strcpy(t[6].id, "7-0");
    ok(chain_verify(t, CHAIN_N + 1, key, &seq)
       == (key ? IDEM_AUDIT_WRONG_HMAC : IDEM_AUDIT_INSERTED) && seq == 3,
       "%s: a forged entry 3 inserted: %s at 3", what,
       key ? "wrong HMAC" : "inserted");

    /* an entry whose ID is not the module's */
    memcpy(t, s, sizeof(s));
    strcpy(t[4].id, "5-1");
    ok(chain_verify(t, CHAIN_N, key, &seq) == IDEM_AUDIT_INSERTED && seq == 5,
       "%s: ID 5-1: inserted", what);

    /* a replaced entry with a hash of its own: the next one tells */
    memcpy(t, s, sizeof(s));
    chain_forge(t, 3, key, "/replaced");
    ok(chain_verify(t, CHAIN_N, key, &seq) == IDEM_AUDIT_MODIFIED && seq == 4,
       "%s: entry 4 replaced with a valid own hash: modified at 4", what);

    /* the whole chain rewritten without the key */
    chain_build(t, CHAIN_N, NULL);
    ok(chain_verify(t, CHAIN_N, key, &seq)
       == (key ? IDEM_AUDIT_WRONG_HMAC : IDEM_AUDIT_INTACT)
       && seq == (key ? 1 : 6),
       "%s: a chain rewritten with plain SHA-256 %s", what,
       key ? "is wrong HMAC at 1" : "verifies (only an anchor tells)");
}


/* ------------------------------------------------------------ version 2 */

/* the documented example: "attempted" then "sent", one entry (Python) */
static const char  v2_hex[] =
    "0200000000000000012000000000000000000000000000000000000000000000000000"
    "000000000000000200045f000001939a447d7b00100123456789abcdef0123456789ab"
    "cdef00036b2d310020abababababababababababababababababababababababababab"
    "abababababab00042f7061790005616c6963650010fedcba9876543210fedcba987654"
    "3210030000";
static const char  v2_sha[] =
    "1e446f22f1202a37be8bc04c8ba6789c85ed0e9134d20c671f2451019ebd1d54";
static const char  v2_hmac[] =
    "a71222fdbea0f1cfa844a93636de2fbeb3f761b51d1dc0c0e76594bd526b8215";

static const char  zeros[IDEM_AUDIT_DIGEST_LEN];


static size_t
v2_pair(idem_audit_entry_t *e, uint64_t seq, const char *prev,
    size_t prev_len, char *buf)
{
    e[0] = vector_entry();
    e[0].event = IDEM_AUDIT_ATTEMPTED;
    e[0].seq = seq;
    e[0].prev.data = prev;
    e[0].prev.len = prev_len;
    e[1] = e[0];
    e[1].event = IDEM_AUDIT_SENT;

    return (size_t) (idem_audit_batch_encode(buf, e, 2) - buf);
}


static void
test_v2_vector(void)
{
    char                 buf[512], hex[2 * sizeof(buf) + 1];
    char                 text[2 * IDEM_AUDIT_PREV_MAX + 1];
    size_t               len;
    unsigned char        md[IDEM_AUDIT_DIGEST_LEN];
    idem_audit_entry_t   e[2];
    idem_audit_events_t  ev;

    len = v2_pair(e, 1, zeros, sizeof(zeros), buf);
    idem_hex((unsigned char *) buf, len, hex);

    is_str(hex, v2_hex, "version 2: the encoding of the documented example");
    is_int((long) len, (long) idem_audit_batch_len(e, 2),
           "batch_len is the length written");
    ok(idem_audit_batch_max(e, 2)
       >= len + IDEM_AUDIT_PREV_MAX - IDEM_AUDIT_DIGEST_LEN + 2 * 8,
       "batch_max leaves room for another prev and times");

    ok(idem_audit_digest(buf, len, NULL, 0, md) == 0, "digest computed");
    idem_audit_hash_text((char *) md, sizeof(md), text);
    is_str(text, v2_sha, "SHA-256 of the encoding");
    ok(idem_audit_digest(buf, len, chain_key, 32, md) == 0, "HMAC computed");
    idem_audit_hash_text((char *) md, sizeof(md), text);
    is_str(text, v2_hmac, "HMAC-SHA256 with the key");

    ok(idem_audit_events_decode(buf, len, &ev) == 0 && ev.version == 2
       && ev.n == 2, "decoded: two events");
    ok(ev.e[0].event == IDEM_AUDIT_ATTEMPTED && ev.e[1].event == IDEM_AUDIT_SENT
       && ev.e[1].index == 2 && ev.e[1].seq == 1
       && ev.e[1].time == 1733460000123LL
       && ev.e[1].op.len == 32
       && memcmp(ev.e[1].op.data, "0123456789abcdef0123456789abcdef", 32) == 0
       && ev.e[1].identity.len == 5 && ev.e[1].status == 0,
       "the second event has the first's fields (written once)");

    e[1].time++;
    e[1].status = 201;
    e[1].op.len = 0;
    len = (size_t) (idem_audit_batch_encode(buf, e, 2) - buf);
    ok(idem_audit_events_decode(buf, len, &ev) == 0
       && ev.e[1].time == e[0].time + 1 && ev.e[1].status == 201
       && ev.e[1].op.len == 0 && ev.e[0].op.len == 32,
       "an event's own time, status, and an empty field where the one "
       "before had one");
    is_int((long) len, (long) idem_audit_batch_len(e, 2),
           "batch_len again");
}


static void
test_v2_refuses(void)
{
    char                 buf[1024], bad[520];
    size_t               len, i, refused;
    idem_audit_entry_t   e[2];
    idem_audit_events_t  ev;

    len = v2_pair(e, 1, zeros, sizeof(zeros), buf);

    ok(idem_audit_events_decode(buf, len - 1, &ev) == -1,
       "version 2: cut short: refused");

    memcpy(bad, buf, len);
    bad[len] = 0;
    ok(idem_audit_events_decode(bad, len + 1, &ev) == -1,
       "a byte after the last event: refused");

    /* the second event's mask names the op, unchanged: not canonical */
    memcpy(bad, buf, len - 2);
    bad[len - 2] = 0x00;
    bad[len - 1] = 0x02;
    memcpy(bad + len, "\x00\x10\x01\x23\x45\x67\x89\xab\xcd\xef"
                      "\x01\x23\x45\x67\x89\xab\xcd\xef", 18);
    ok(idem_audit_events_decode(bad, len + 18, &ev) == -1,
       "a field written where it did not change: refused");

    memcpy(bad, buf, len);
    bad[10 + 32] = 0;
    ok(idem_audit_events_decode(bad, len, &ev) == -1, "no event: refused");

    memcpy(bad, buf, len);
    bad[10 + 32 + 1] = IDEM_AUDIT_NEVENTS;
    ok(idem_audit_events_decode(bad, len, &ev) == -1,
       "an unknown event: refused");

    /* every single byte changed: refused, or an entry written back as is */
    for (i = 0, refused = 0; i < len; i++) {
        memcpy(bad, buf, len);
        bad[i] ^= 0x40;

        if (idem_audit_events_decode(bad, len, &ev) != 0) {
            refused++;

        } else if (idem_audit_batch_len(ev.e, ev.n) != len
                   || idem_audit_batch_encode(buf + len, ev.e, ev.n)
                      != buf + 2 * len
                   || memcmp(buf + len, bad, len) != 0)
        {
            break;
        }
    }

    ok(i == len, "each single-byte change is refused (%zu of %zu) or "
       "decodes to an entry that encodes back to those bytes", refused, len);
}


/* a chain of version-1 entries, then version-2 ones on it, and tampering */
static void
test_v2_chain(const unsigned char *key, const char *what)
{
    char                 enc[6][512], h[6][IDEM_AUDIT_HASH_LEN + 1];
    char                 id[6][24];
    size_t               len[6], hlen[6], i;
    idem_audit_entry_t   e[2];
    idem_audit_verify_t  v;

    for (i = 0; i < 6; i++) {
        snprintf(id[i], sizeof(id[i]), "%zu-0", i + 1);

        if (i < 2) {
            e[0] = vector_entry();
            e[0].seq = i + 1;
            e[0].prev.data = i ? h[i - 1] : idem_audit_genesis;
            e[0].prev.len = IDEM_AUDIT_HASH_LEN;
            len[i] = (size_t) (idem_audit_encode(enc[i], &e[0]) - enc[i]);
            idem_audit_hash(enc[i], len[i], key, key ? 32 : 0, h[i]);
            hlen[i] = IDEM_AUDIT_HASH_LEN;
            continue;
        }

        len[i] = v2_pair(e, i + 1, h[i - 1], hlen[i - 1], enc[i]);
        idem_audit_digest(enc[i], len[i], key, key ? 32 : 0,
                          (unsigned char *) h[i]);
        hlen[i] = IDEM_AUDIT_DIGEST_LEN;
    }

    idem_audit_verify_init(&v, key, key ? 32 : 0);

    for (i = 0; i < 6; i++) {
        if (idem_audit_verify_next(&v, id[i], strlen(id[i]), h[i], hlen[i],
                                   enc[i], len[i]) != 0)
        {
            break;
        }
    }

    ok(i == 6 && v.count == 6 && v.events == 2 + 4 * 2,
       "%s: versions 1 then 2 verify as one chain (6 entries, 10 events)",
       what);
    ok(strlen(v.hex) == IDEM_AUDIT_HASH_LEN, "%s: the head in hex", what);

    /* one byte of entry 4's third field changed, its hash kept */
    enc[3][len[3] - 20] ^= 1;
    idem_audit_verify_init(&v, key, key ? 32 : 0);

    for (i = 0; i < 6; i++) {
        if (idem_audit_verify_next(&v, id[i], strlen(id[i]), h[i], hlen[i],
                                   enc[i], len[i]) != 0)
        {
            break;
        }
    }

    ok(i == 3 && v.fault == IDEM_AUDIT_MODIFIED && v.fault_seq == 4,
       "%s: a byte of a version-2 entry changed: modified at 4", what);
    enc[3][len[3] - 20] ^= 1;

    /* entry 5 deleted */
    idem_audit_verify_init(&v, key, key ? 32 : 0);

    for (i = 0; i < 6; i++) {
        if (i != 4
            && idem_audit_verify_next(&v, id[i], strlen(id[i]), h[i],
                                      hlen[i], enc[i], len[i]) != 0)
        {
            break;
        }
    }

    ok(i == 5 && v.fault == IDEM_AUDIT_MISSING && v.fault_seq == 5,
       "%s: a version-2 entry deleted: missing at 5", what);
}


int
main(void)
{
    test_v2_vector();
    test_v2_refuses();
    test_v2_chain(NULL, "SHA-256");
    test_v2_chain(chain_key, "HMAC");
    test_vector();
    test_events();
    test_decode_refuses();
    test_chain(NULL, "SHA-256");
    test_chain(chain_key, "HMAC");

    {
        stored_t  s[CHAIN_N];
        uint64_t  seq;

        chain_build(s, CHAIN_N, chain_key);
        ok(chain_verify(s, CHAIN_N, NULL, &seq) == IDEM_AUDIT_MODIFIED
           && seq == 1, "an HMAC chain read without the key: modified at 1");
    }

    return done_testing();
}
