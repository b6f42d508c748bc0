/*
 * The audit stream's entries (idem_audit.h): the canonical encoding and
 * its hash against vectors computed apart (Python's hashlib and hmac),
 * the decoder's refusals, and the verifier on a chain built here and
 * tampered with in each way docs/audit.md names.
 */

#include <stdlib.h>
#include <string.h>

#include "idem_audit.h"
#include "idem_record.h"
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


int
main(void)
{
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
