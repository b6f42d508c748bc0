/*
 * The audit file's lines (idem_audit_file.h), version 2: one line per
 * step, its events in "events" with only the fields that are not the
 * line's.  The line is the RFC 8785 canonical form of the line without
 * "hash" (checked against the core's canonicalizer), with "hash" last;
 * the example of docs/audit.md is written byte for byte with its hash;
 * bytes that are not UTF-8 and control characters are written as JSON
 * allows; the reader gives back each event, refuses what the module never
 * writes (a field written twice in one line, no event, five, an unknown
 * member) and still reads version 1; the verifier follows a chain across
 * lines of both versions and names each kind of tampering.
 */

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "idem_audit_file.h"
#include "idem_jcs.h"
#include "mem_sink.h"
#include "tap.h"


#define S(lit)  { lit, sizeof(lit) - 1 }
#define N       5

static const unsigned char  key[] = "kkkkkkkkkkkkkkkkkkkkkkkkkkkkkkkk";

static const char  resp[] =
    "36e1a862a8d5d4d11b4cb1a1c5f4f4d0a5b4c3d2e1f00112233445566778899a";


static idem_audit_entry_t
entry(int i)
{
    idem_audit_entry_t  e;
    idem_str_t          op = S("0123456789abcdef0123456789abcdef");
    idem_str_t          k = S("k-1"), route = S("/pay"), who = S("al\"ice\n");
    idem_str_t          bad = S("caf\xc3\xa9 \xff\x01");

    memset(&e, 0, sizeof(e));
    e.time = 1733460000123LL + i;
    e.event = (idem_audit_event_e) (i % IDEM_AUDIT_NEVENTS);
    e.op = op;
    e.key = k;
    e.route = route;
    e.identity = who;
    e.approver = bad;
    e.status = i % 2 ? 201 : 0;

    return e;
}


/*
 * The events of step i (1 + i % 4 of them), as a completion's are: the
 * first with a status and reference of its own, the last with the
 * response's digest; returns how many.
 */
static size_t
step(int i, idem_audit_entry_t e[4])
{
    size_t      j, n;
    idem_str_t  ref = S("tx-1");

    n = 1 + (size_t) i % 4;

    for (j = 0; j < n; j++) {
        e[j] = entry(i + (int) j);
        e[j].status = 201;
    }

    e[0].status = 202;
    e[0].ref = ref;
    e[n - 1].response.data = resp;
    e[n - 1].response.len = sizeof(resp) - 1;

    return n;
}


/* N lines chained from the genesis, into lines[] (each NUL-terminated) */
static void
build(char lines[N][8192], const unsigned char *k)
{
    int                  i;
    char                 prev[IDEM_AUDIT_HASH_LEN + 1], *end;
    size_t               n;
    idem_audit_entry_t   e[4];

    memcpy(prev, idem_audit_genesis, sizeof(prev));

    for (i = 0; i < N; i++) {
        n = step(i, e);
        e[0].seq = (uint64_t) i + 1;
        e[0].prev.data = prev;
        e[0].prev.len = IDEM_AUDIT_HASH_LEN;
        end = idem_audit_file_line(lines[i], e, n, k, k ? 32 : 0, prev);
        end[-1] = '\0';     /* no newline */
    }
}


static int
verify(char lines[N][8192], const unsigned char *k, int *at)
{
    int                        i;
    idem_audit_file_verify_t   v;

    idem_audit_file_verify_init(&v, k, k ? 32 : 0, 0);

    for (i = 0; i < N; i++) {
        if (idem_audit_file_verify_next(&v, lines[i], strlen(lines[i])) != 0) {
            *at = i + 1;
            return v.fault;
        }
    }

    *at = 0;

    return IDEM_AUDIT_INTACT;
}


/* the line without "hash" is its own RFC 8785 form, and hashed to it */
static int
canonical(const char *line, const char *hash)
{
    int          good;
    char        *c, *h, again[IDEM_AUDIT_HASH_LEN + 1];
    mem_t        m;
    idem_sink_t  sink;

    c = strdup(line);
    h = strstr(c, ",\"hash\":\"");
    if (h == NULL) {
        free(c);
        return 0;
    }

    *h = '}';
    memset(&m, 0, sizeof(m));
    mem_sink(&m, &sink);

    good = idem_jcs_canonicalize(c, (size_t) (h + 1 - c), &sink)
               == IDEM_JCS_OK
           && m.len == (size_t) (h + 1 - c) && memcmp(m.data, c, m.len) == 0
           && idem_audit_hash(c, m.len, NULL, 0, again) == 0
           && strcmp(again, hash) == 0;

    mem_free(&m);
    free(c);

    return good;
}


/*
 * docs/audit.md's example, byte for byte: the first line of a file, a
 * claim's attempted and sent; the hashes were checked apart with
 * python3 (hashlib.sha256, hmac.new(b"k" * 32, ..., "sha256")).
 */
static void
test_example(void)
{
    char                 buf[4096], hash[IDEM_AUDIT_HASH_LEN + 1], *end;
    idem_audit_entry_t   e[2];
    idem_str_t           op = S("0123456789abcdef0123456789abcdef");
    idem_str_t           req = S("fedcba9876543210fedcba9876543210");
    idem_str_t           k = S("k-1"), route = S("/pay"), who = S("alice");

    static const char  fp[] =
        "abababababababababababababababababababababababababababababababab";
    static const char  want[] =
        "{\"approver\":\"\",\"events\":[{\"event\":\"attempted\","
        "\"time\":1733460000123},{\"event\":\"sent\",\"time\":1733460000123}"
        "],\"fingerprint\":\"" "abababababababababababababababab"
        "abababababababababababababababab\",\"identity\":\"alice\","
        "\"key\":\"k-1\",\"operation_id\":\"0123456789abcdef0123456789abcdef"
        "\",\"prev\":\"" "00000000000000000000000000000000"
        "00000000000000000000000000000000\",\"ref\":\"\",\"request_id\":"
        "\"fedcba9876543210fedcba9876543210\",\"response_sha256\":\"\","
        "\"route\":\"/pay\",\"seq\":1,\"status\":null,\"v\":2,\"hash\":\"";
    static const char  sha[] =
        "5acaaac60af4de61e833d9057da9b53fcc65632c2f3e6a373c3abd05384203ed";
    static const char  mac[] =
        "e41fa94846cdb803ff5528b4bcd107cde358d8ab577f4bffb95d7f3ed76f8564";

    memset(e, 0, sizeof(e));
    e[0].event = IDEM_AUDIT_ATTEMPTED;
    e[0].time = 1733460000123LL;
    e[0].op = op;
    e[0].key = k;
    e[0].fp.data = fp;
    e[0].fp.len = sizeof(fp) - 1;
    e[0].route = route;
    e[0].identity = who;
    e[0].request = req;
    e[1] = e[0];
    e[1].event = IDEM_AUDIT_SENT;
    e[0].seq = 1;
    e[0].prev.data = idem_audit_genesis;
    e[0].prev.len = IDEM_AUDIT_HASH_LEN;

    end = idem_audit_file_line(buf, e, 2, NULL, 0, hash);
    *end = '\0';
    ok(strncmp(buf, want, sizeof(want) - 1) == 0
       && strcmp(buf + sizeof(want) - 1 + 64, "\"}\n") == 0,
       "the example's line, byte for byte (%zu bytes)", strlen(buf));
    ok(strcmp(hash, sha) == 0, "its SHA-256 %s", hash);

    end = idem_audit_file_line(buf, e, 2, key, 32, hash);
    ok(end && strcmp(hash, mac) == 0, "its HMAC-SHA256 %s", hash);
}


static void
test_line(void)
{
    char                 buf[8192], hash[IDEM_AUDIT_HASH_LEN + 1], *end, *h;
    char                 again[IDEM_AUDIT_HASH_LEN + 1], why[200];
    void                *tree;
    size_t               n;
    idem_audit_entry_t   e[4];
    idem_audit_events_t  ev;

    n = step(3, e);
    e[0].seq = 7;
    e[0].prev.data = idem_audit_genesis;
    e[0].prev.len = IDEM_AUDIT_HASH_LEN;

    end = idem_audit_file_line(buf, e, n, NULL, 0, hash);
    ok(n == 4 && end != NULL && end[-1] == '\n' && (size_t) (end - buf)
       <= idem_audit_file_line_max(e, n), "a line of 4 events, within its "
       "bound (%zu of %zu bytes)", (size_t) (end - buf),
       idem_audit_file_line_max(e, n));
    *end = '\0';

    h = strstr(buf, ",\"hash\":\"");
    ok(h && strcmp(h + 9 + 64, "\"}\n") == 0 && memcmp(h + 9, hash, 64) == 0,
       "\"hash\" is last");
    ok(canonical(buf, hash), "the line without \"hash\" is its own RFC 8785 "
       "form, and its SHA-256 is \"hash\"");
    ok(strstr(buf, "\"identity\":\"al\\\"ice\\n\"") != NULL,
       "a quote and a newline escaped");
    ok(strstr(buf, "\"approver\":\"caf\xc3\xa9 \xc3\xbf\\u0001\"") != NULL,
       "UTF-8 kept, a byte that is not UTF-8 as U+00FF, a control as \\u0001");
    ok(strstr(buf, "{\"event\":\"replayed\",\"time\":1733460000129}],")
       != NULL, "the last event is its name and time: the line's fields are "
       "its");
    ok(strstr(buf, "{\"event\":\"sent\",\"ref\":\"tx-1\","
                   "\"response_sha256\":\"\",\"status\":202,"
                   "\"time\":1733460000126}") != NULL,
       "the first event has what differs: its ref, status and no response");
    ok(strstr(buf, "\"ref\":\"\",\"request_id\"") != NULL
       && strstr(buf, "\"status\":201,\"v\":2,\"hash\"") != NULL,
       "the line's fields are the last event's");

    end = idem_audit_file_line(buf, e, n, NULL, 0, hash);
    ok(idem_audit_file_parse(buf, (size_t) (end - 1 - buf), &ev, again, &tree,
                             why, sizeof(why)) == 0
       && ev.version == 2 && ev.n == 4 && strcmp(again, hash) == 0,
       "read back: 4 events");
    ok(ev.e[0].seq == 7 && ev.e[3].seq == 7 && ev.e[0].index == 1
       && ev.e[3].index == 4 && ev.e[0].prev.len == 64,
       "each with the line's seq and prev, and its place");
    ok(ev.e[0].event == IDEM_AUDIT_SENT && ev.e[0].status == 202
       && ev.e[0].ref.len == 4 && ev.e[0].response.len == 0
       && ev.e[0].time == 1733460000126LL && ev.e[0].route.len == 4,
       "the first event: its own fields, the line's others");
    ok(ev.e[3].event == IDEM_AUDIT_REPLAYED && ev.e[3].status == 201
       && ev.e[3].ref.len == 0 && ev.e[3].response.len == 64
       && ev.e[1].status == 201 && ev.e[1].response.len == 0,
       "the others: the line's fields, but what differs");
    idem_audit_file_free(tree);
}


/* a line as the module writes it, with one change: refused, and why */
static void
refused(const char *line, const char *want, const char *what)
{
    int                  rc;
    char                 hash[IDEM_AUDIT_HASH_LEN + 1], why[200];
    void                *tree;
    idem_audit_events_t  ev;

    why[0] = '\0';
    rc = idem_audit_file_parse(line, strlen(line), &ev, hash, &tree, why,
                               sizeof(why));
    ok(rc == -1 && strstr(why, want) != NULL, "%s: refused (%s)", what, why);
    idem_audit_file_free(tree);
}


/* s with the first "from" replaced by "to", into out */
static char *
edit(char *out, const char *s, const char *from, const char *to)
{
    const char  *at;

    at = strstr(s, from);
    if (at == NULL) {
        strcpy(out, "not found");
        return out;
    }

    sprintf(out, "%.*s%s%s", (int) (at - s), s, to, at + strlen(from));

    return out;
}


static void
test_refused(void)
{
    char                 l[N][8192], t[8192], *p;

    build(l, NULL);

    /* line 2 (index 1): two events, the first with status 202 and ref */
    refused(edit(t, l[1], "\"event\":\"confirmation_required\"",
                 "\"event\":\"confirmation_required\",\"key\":\"k-1\""),
            "\"key\" is the line's", "an event's field equal to the line's");
    refused(edit(t, l[1], ",\"time\":1733460000125}]",
                 ",\"status\":201,\"time\":1733460000125}]"),
            "\"status\" is the line's", "the last event's status, the line's");
    refused(edit(t, l[1], ",\"time\":1733460000125}]",
                 ",\"status\":203,\"time\":1733460000125}]"),
            "event 2 has fields of its own",
            "the last event with a field of its own");
    p = strstr(l[1], "\"events\":[");
    sprintf(t, "%.*s\"events\":[],%s", (int) (p - l[1]), l[1],
            strstr(p, "\"fingerprint\""));
    refused(t, "has 0 events", "no event");
    refused(edit(t, l[3], "\"events\":[",
                 "\"events\":[{\"event\":\"sent\",\"ref\":\"x\","
                 "\"time\":1},"), "has 5 events", "five events");
    refused(edit(t, l[1], "\"v\":2", "\"note\":\"x\",\"v\":2"),
            "a member the format does not define: \"note\"",
            "an unknown member");
    refused(edit(t, l[1], "\"event\":\"confirmation_required\"",
                 "\"event\":\"confirmation_required\",\"note\":1"),
            "event 1: a member the format does not define: \"note\"",
            "an unknown member in an event");
    refused(edit(t, l[1], "\"status\":202", "\"status\":\"202\""),
            "neither null nor a status", "a status that is a string");
    refused(edit(t, l[1], "\"time\":1733460000125}]", "\"time\":-1}]"),
            "\"time\" is not a whole number", "a negative time");
    refused(edit(t, l[1], ",\"time\":1733460000125}]", "}]"),
            "event 2 has no \"time\"", "an event without time");
    refused(edit(t, l[1], "\"events\":[{", "\"events\":[7,{"),
            "event 1 is not an object", "an event that is not an object");
    refused(edit(t, l[1], "\"events\":[", "\"time\":1,\"events\":["),
            "not define in version 2: \"time\"", "a version-1 member");
    refused(edit(t, l[1], "\"v\":2", "\"v\":3"), "\"v\" is neither 1 nor 2",
            "version 3");
    refused(edit(t, l[1], "\"operation_id\":\"0123",
                 "\"operation_id\":\"0A23"), "lowercase hex",
            "an operation id in capitals");
    refused("{\"v\":1}", "no \"", "a line without the members");
    refused("[]", "not a JSON object", "not an object");
}


/*
 * A version-1 line (one event, "event" and "time" at the top) as the
 * module wrote it before, at seq with prev: its hash in hash.
 */
static void
v1_line(char *out, uint64_t seq, const char *prev, const char *event,
    const unsigned char *k, char hash[IDEM_AUDIT_HASH_LEN + 1])
{
    size_t  n;

    n = (size_t) sprintf(out, "{\"approver\":\"\",\"event\":\"%s\","
                         "\"fingerprint\":\"\",\"identity\":\"alice\","
                         "\"key\":\"k-1\",\"operation_id\":"
                         "\"0123456789abcdef0123456789abcdef\",\"prev\":"
                         "\"%s\",\"ref\":\"\",\"request_id\":\"\","
                         "\"response_sha256\":\"\",\"route\":\"/pay\","
                         "\"seq\":%llu,\"status\":null,"
                         "\"time\":1733460000123,\"v\":1}", event, prev,
                         (unsigned long long) seq);

    idem_audit_hash(out, n, k, k ? 32 : 0, hash);
    sprintf(out + n - 1, ",\"hash\":\"%s\"}", hash);
}


/*
 * An upgraded module goes on after the last version-1 line: one chain of
 * both versions verifies, show reads each; a forged version-1 line in it
 * is found as any other.
 */
static void
test_v1(const unsigned char *k, const char *what)
{
    int                        i, rc;
    char                       l[N][8192], h[IDEM_AUDIT_HASH_LEN + 1];
    char                       why[200];
    void                      *tree;
    idem_audit_entry_t         e[4];
    idem_audit_events_t        ev;
    idem_audit_file_verify_t   v;

    memcpy(h, idem_audit_genesis, sizeof(h));
    v1_line(l[0], 1, h, "attempted", k, h);
    v1_line(l[1], 2, h, "sent", k, h);

    rc = idem_audit_file_parse(l[1], strlen(l[1]), &ev, h, &tree, why,
                               sizeof(why));
    ok(rc == 0 && ev.version == 1 && ev.n == 1 && ev.e[0].index == 0
       && ev.e[0].event == IDEM_AUDIT_SENT && ev.e[0].seq == 2
       && ev.e[0].identity.len == 5, "%s: a version-1 line is read (%s)",
       what, rc ? why : "one event, no place");
    idem_audit_file_free(tree);

    for (i = 2; i < N; i++) {
        step(i, e);
        e[0].seq = (uint64_t) i + 1;
        e[0].prev.data = h;
        e[0].prev.len = IDEM_AUDIT_HASH_LEN;
        *idem_audit_file_line(l[i], e, 2, k, k ? 32 : 0, h) = '\0';
        l[i][strlen(l[i]) - 1] = '\0';
    }

    idem_audit_file_verify_init(&v, k, k ? 32 : 0, 0);

    for (rc = 0, i = 0; rc == 0 && i < N; i++) {
        rc = idem_audit_file_verify_next(&v, l[i], strlen(l[i]));
    }

    ok(rc == 0 && v.seq == N && v.count == N && v.events == 2 + 2 * (N - 2),
       "%s: two version-1 lines then version-2 lines: one chain (%s)", what,
       rc ? v.why : "intact");

    memcpy(h, idem_audit_genesis, sizeof(h));
    v1_line(l[0], 1, h, "attempted", k, h);
    v1_line(l[1], 2, h, "conflict", NULL, h);   /* forged, the key unknown */
    ok(verify(l, k, &i) == (k ? IDEM_AUDIT_WRONG_HMAC : IDEM_AUDIT_MODIFIED)
       && i == (k ? 2 : 3), "%s: a version-1 line forged: %s", what,
       k ? "wrong HMAC at 2" : "modified at 3 (chained on another hash)");
}


static void
test_chain(const unsigned char *k, const char *what)
{
    int   at, rc;
    char  l[N][8192], t[N][8192], *p;

    build(l, k);
    ok(verify(l, k, &at) == IDEM_AUDIT_INTACT, "%s: intact", what);

    memcpy(t, l, sizeof(l));
    p = strstr(t[2], "\"/pay\"");
    p[2] = 'q';
    ok(verify(t, k, &at) == IDEM_AUDIT_MODIFIED && at == 3,
       "%s: a changed byte: modified at 3", what);

    memcpy(t, l, sizeof(l));
    p = strstr(t[2], "\"time\":17334600001");
    p[18] = p[18] == '9' ? '8' : p[18] + 1;
    ok(verify(t, k, &at) == IDEM_AUDIT_MODIFIED && at == 3,
       "%s: an event's time changed: modified at 3", what);

    memcpy(t, l, sizeof(l));
    memcpy(t[2], l[3], sizeof(t[2]));
    memcpy(t[3], l[4], sizeof(t[3]));
    ok(verify(t, k, &at) == IDEM_AUDIT_MISSING && at == 3,
       "%s: a deleted line: missing at 3", what);

    memcpy(t, l, sizeof(l));
    memcpy(t[1], l[2], sizeof(t[1]));
    memcpy(t[2], l[1], sizeof(t[2]));
    ok(verify(t, k, &at) == IDEM_AUDIT_MISSING && at == 2,
       "%s: two lines swapped: missing at 2", what);

    memcpy(t, l, sizeof(l));
    memcpy(t[3], l[2], sizeof(t[3]));
    ok(verify(t, k, &at) == IDEM_AUDIT_REORDERED && at == 4,
       "%s: a line copied: reordered at 4", what);

    /* the whole chain rewritten without the key */
    build(t, NULL);
    rc = verify(t, k, &at);
    ok(k ? rc == IDEM_AUDIT_WRONG_HMAC && at == 1 : rc == IDEM_AUDIT_INTACT,
       "%s: rewritten with plain SHA-256: %s", what,
       k ? "wrong HMAC at 1" : "verifies (only an anchor tells)");
}


/*
 * The writer's hasher (contexts set up once, HMAC pads absorbed once)
 * gives the one-shot idem_audit_hash()'s lines: without a key, with a
 * key, with one longer than SHA-256's block, again and again.
 */
static void
test_hasher(void)
{
    int                        i, same;
    char                       a[8192], b[8192];
    char                       ha[IDEM_AUDIT_HASH_LEN + 1];
    char                       hb[IDEM_AUDIT_HASH_LEN + 1];
    char                      *ea, *eb;
    size_t                     n, lens[4] = { 0, 32, 64, 100 };
    unsigned char              k[100];
    idem_audit_entry_t         e[4];
    idem_audit_file_hasher_t  *h;

    for (i = 0; i < (int) sizeof(k); i++) {
        k[i] = (unsigned char) (i * 7 + 1);
    }

    for (i = 0; i < 4; i++) {
        h = idem_audit_file_hasher(lens[i] ? k : NULL, lens[i]);
        ok(h != NULL, "a hasher, key of %zu bytes", lens[i]);
        if (h == NULL) {
            continue;
        }

        same = 1;

        for (int j = 0; j < 4; j++) {
            n = step(j, e);
            e[0].seq = (uint64_t) j + 1;
            e[0].prev.data = idem_audit_genesis;
            e[0].prev.len = IDEM_AUDIT_HASH_LEN;

            ea = idem_audit_file_line(a, e, n, lens[i] ? k : NULL, lens[i],
                                      ha);
            eb = idem_audit_file_line_h(b, e, n, h, hb);

            same &= ea && eb && ea - a == eb - b && memcmp(a, b, ea - a) == 0
                    && strcmp(ha, hb) == 0;
        }

        ok(same, "key of %zu bytes: the same lines as HMAC()/SHA-256 "
           "one-shot", lens[i]);
        idem_audit_file_hasher_free(h);
    }
}


/*
 * Strings long enough for the writer's eight-bytes-at-a-time scan, with
 * each byte it must not copy as is (a control, '"', '\\', DEL and a
 * byte >= 0x80) at every position of an eight-byte block, in the line's
 * fields and in an event's own: the line is still its own RFC 8785 form
 * and reads back to the same strings.
 */
static void
test_runs(void)
{
    int                  pos, c, good, want;
    char                 buf[8192], hash[IDEM_AUDIT_HASH_LEN + 1], *end;
    char                 s[40], why[200];
    void                *tree;
    idem_audit_entry_t   e[2];
    idem_audit_events_t  ev;
    const unsigned char  bad[] = { 0x01, 0x1f, '"', '\\', 0x7f, 0xc3, 0xff };

    good = 1;

    for (pos = 0; pos < 24; pos++) {
        for (c = 0; c < (int) sizeof(bad); c++) {
            memset(s, 'a' + pos % 26, sizeof(s));
            s[pos] = (char) bad[c];
            if (bad[c] == 0xc3) {
                s[pos + 1] = (char) 0xa9;     /* a whole UTF-8 character */
            }

            e[0] = entry(1);
            e[0].seq = 1;
            e[0].prev.data = idem_audit_genesis;
            e[0].prev.len = IDEM_AUDIT_HASH_LEN;
            e[0].identity.data = s;
            e[0].identity.len = sizeof(s);
            e[1] = e[0];
            e[1].identity.len = sizeof(s) - 1;

            end = idem_audit_file_line(buf, e, 2, NULL, 0, hash);
            if (end == NULL) {
                good = 0;
                continue;
            }

            want = bad[c] < 0x80 || bad[c] == 0xc3 ? 0 : 1;

            if (idem_audit_file_parse(buf, (size_t) (end - 1 - buf), &ev,
                                      hash, &tree, why, sizeof(why)) != 0
                || ev.n != 2
                || ev.e[0].identity.len != sizeof(s) + want
                || ev.e[1].identity.len != sizeof(s) - 1 + want
                || (!want && memcmp(ev.e[0].identity.data, s, sizeof(s))))
            {
                good = 0;
            }

            idem_audit_file_free(tree);
            end[-1] = '\0';
            good &= canonical(buf, hash);
        }
    }

    ok(good, "long strings with a byte to escape anywhere, in the line and "
       "in an event: canonical, read back");
}


/* the numbers of a line (seq, time, status) as printf writes them */
static void
test_numbers(void)
{
    int                  good;
    char                 buf[8192], hash[IDEM_AUDIT_HASH_LEN + 1], want[64];
    char                *end;
    size_t               i, n;
    idem_audit_entry_t   e[4];

    static const uint64_t  v[] = {
        0, 1, 9, 10, 11, 99, 100, 101, 999, 1000, 1009, 12345, 99999, 100000,
        1733460000123ULL, 9007199254740991ULL
    };
    static const int       st[] = { 100, 109, 200, 201, 999 };

    good = 1;

    for (i = 0; i < sizeof(v) / sizeof(v[0]); i++) {
        n = step(0, e);
        e[0].seq = v[i];
        e[0].prev.data = idem_audit_genesis;
        e[0].prev.len = IDEM_AUDIT_HASH_LEN;
        e[n - 1].time = (long long) v[i];
        e[n - 1].status = st[i % 5];

        end = idem_audit_file_line(buf, e, n, NULL, 0, hash);
        *end = '\0';

        snprintf(want, sizeof(want), "\"seq\":%llu,", (unsigned long long) v[i]);
        good &= strstr(buf, want) != NULL;
        snprintf(want, sizeof(want), "\"time\":%llu}]",
                 (unsigned long long) v[i]);
        good &= strstr(buf, want) != NULL;
        snprintf(want, sizeof(want), "\"status\":%d,\"v\"", st[i % 5]);
        good &= strstr(buf, want) != NULL;
        good &= canonical(buf, hash);
    }

    ok(good, "seq, time and status from 0 to 2^53 - 1, as printf writes them");
}


int
main(void)
{
    test_example();
    test_line();
    test_numbers();
    test_refused();
    test_hasher();
    test_runs();
    test_chain(NULL, "SHA-256");
    test_chain(key, "HMAC");
    test_v1(NULL, "SHA-256");
    test_v1(key, "HMAC");

    return done_testing();
}
