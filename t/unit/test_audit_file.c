/*
 * The audit file's lines (idem_audit_file.h): the line is the RFC 8785
 * canonical form of the entry without "hash" (checked against the core's
 * canonicalizer), with "hash" last; bytes that are not UTF-8 and control
 * characters are written as JSON allows; the reader refuses what the
 * module never writes; the verifier follows a chain across lines and
 * names each kind of tampering.
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


/* N lines chained from the genesis, into lines[] (each NUL-terminated) */
static void
build(char lines[N][4096], const unsigned char *k)
{
    int                  i;
    char                 prev[IDEM_AUDIT_HASH_LEN + 1], *end;
    idem_audit_entry_t   e;

    memcpy(prev, idem_audit_genesis, sizeof(prev));

    for (i = 0; i < N; i++) {
        e = entry(i);
        e.seq = (uint64_t) i + 1;
        e.prev.data = prev;
        e.prev.len = IDEM_AUDIT_HASH_LEN;
        end = idem_audit_file_line(lines[i], &e, k, k ? 32 : 0, prev);
        end[-1] = '\0';     /* no newline */
    }
}


static int
verify(char lines[N][4096], const unsigned char *k, int *at)
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


static void
test_line(void)
{
    char                 buf[4096], hash[IDEM_AUDIT_HASH_LEN + 1], *end, *h;
    char                 again[IDEM_AUDIT_HASH_LEN + 1], why[200];
    void                *tree;
    mem_t                m;
    idem_sink_t          sink;
    idem_audit_entry_t   e, d;

    e = entry(3);
    e.seq = 7;
    e.prev.data = idem_audit_genesis;
    e.prev.len = IDEM_AUDIT_HASH_LEN;

    end = idem_audit_file_line(buf, &e, NULL, 0, hash);
    ok(end != NULL && end[-1] == '\n' && (size_t) (end - buf)
       <= idem_audit_file_line_max(&e), "a line, within its bound");
    *end = '\0';

    h = strstr(buf, ",\"hash\":\"");
    ok(h && strcmp(h + 9 + 64, "\"}\n") == 0 && memcmp(h + 9, hash, 64) == 0,
       "\"hash\" is last");

    /* what was hashed is the canonical form of the line without "hash" */
    memset(&m, 0, sizeof(m));
    mem_sink(&m, &sink);
    *h = '}';
    ok(idem_jcs_canonicalize(buf, (size_t) (h + 1 - buf), &sink) == IDEM_JCS_OK
       && m.len == (size_t) (h + 1 - buf) && memcmp(m.data, buf, m.len) == 0,
       "the line without \"hash\" is its own RFC 8785 form");
    ok(idem_audit_hash(buf, m.len, NULL, 0, again) == 0
       && strcmp(again, hash) == 0, "and its SHA-256 is \"hash\"");
    mem_free(&m);
    ok(strstr(buf, "\"identity\":\"al\\\"ice\\n\"") != NULL,
       "a quote and a newline escaped");
    ok(strstr(buf, "\"approver\":\"caf\xc3\xa9 \xc3\xbf\\u0001\"") != NULL,
       "UTF-8 kept, a byte that is not UTF-8 as U+00FF, a control as \\u0001");

    end = idem_audit_file_line(buf, &e, NULL, 0, hash);
    ok(idem_audit_file_parse(buf, (size_t) (end - 1 - buf), &d, again, &tree,
                             why, sizeof(why)) == 0
       && d.seq == 7 && d.status == 201 && d.event == e.event
       && d.time == e.time && strcmp(again, hash) == 0
       && d.route.len == 4 && memcmp(d.route.data, "/pay", 4) == 0,
       "read back");
    idem_audit_file_free(tree);

    ok(idem_audit_file_parse("{\"v\":1}", 7, &d, again, &tree, why,
                             sizeof(why)) == -1 && strstr(why, "no \""),
       "a line without the members: refused (%s)", why);
    idem_audit_file_free(tree);
    ok(idem_audit_file_parse("[]", 2, &d, again, &tree, why, sizeof(why))
       == -1, "not an object: refused");
    idem_audit_file_free(tree);
}


static void
test_chain(const unsigned char *k, const char *what)
{
    int   at, rc;
    char  l[N][4096], t[N][4096], *p;

    build(l, k);
    ok(verify(l, k, &at) == IDEM_AUDIT_INTACT, "%s: intact", what);

    memcpy(t, l, sizeof(l));
    p = strstr(t[2], "\"/pay\"");
    p[2] = 'q';
    ok(verify(t, k, &at) == IDEM_AUDIT_MODIFIED && at == 3,
       "%s: a changed byte: modified at 3", what);

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
    char                       a[4096], b[4096];
    char                       ha[IDEM_AUDIT_HASH_LEN + 1];
    char                       hb[IDEM_AUDIT_HASH_LEN + 1];
    char                      *ea, *eb;
    size_t                     lens[4] = { 0, 32, 64, 100 };
    unsigned char              k[100];
    idem_audit_entry_t         e;
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

        for (int j = 0; j < 3; j++) {
            e = entry(j);
            e.seq = (uint64_t) j + 1;
            e.prev.data = idem_audit_genesis;
            e.prev.len = IDEM_AUDIT_HASH_LEN;

            ea = idem_audit_file_line(a, &e, lens[i] ? k : NULL, lens[i], ha);
            eb = idem_audit_file_line_h(b, &e, h, hb);

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
 * byte >= 0x80) at every position of an eight-byte block: the line is
 * still its own RFC 8785 form and reads back to the same string.
 */
static void
test_runs(void)
{
    int                  pos, c, good;
    char                 buf[8192], hash[IDEM_AUDIT_HASH_LEN + 1], *end, *h;
    char                 s[40], why[200];
    void                *tree;
    mem_t                m;
    idem_sink_t          sink;
    idem_audit_entry_t   e, d;
    const unsigned char  bad[] = { 0x01, 0x1f, '"', '\\', 0x7f, 0xc3, 0xff };

    good = 1;

    for (pos = 0; pos < 24; pos++) {
        for (c = 0; c < (int) sizeof(bad); c++) {
            memset(s, 'a' + pos % 26, sizeof(s));
            s[pos] = (char) bad[c];
            if (bad[c] == 0xc3) {
                s[pos + 1] = (char) 0xa9;     /* a whole UTF-8 character */
            }

            e = entry(1);
            e.seq = 1;
            e.prev.data = idem_audit_genesis;
            e.prev.len = IDEM_AUDIT_HASH_LEN;
            e.identity.data = s;
            e.identity.len = sizeof(s);

            end = idem_audit_file_line(buf, &e, NULL, 0, hash);
            if (end == NULL) {
                good = 0;
                continue;
            }

            if (idem_audit_file_parse(buf, (size_t) (end - 1 - buf), &d, hash,
                                      &tree, why, sizeof(why)) != 0
                || (bad[c] < 0x80 || bad[c] == 0xc3
                    ? d.identity.len != sizeof(s)
                      || memcmp(d.identity.data, s, sizeof(s)) != 0
                    : d.identity.len != sizeof(s) + 1))
            {
                good = 0;
            }

            idem_audit_file_free(tree);

            h = strstr(buf, ",\"hash\":\"");
            *h = '}';
            memset(&m, 0, sizeof(m));
            mem_sink(&m, &sink);

            if (idem_jcs_canonicalize(buf, (size_t) (h + 1 - buf), &sink)
                != IDEM_JCS_OK
                || m.len != (size_t) (h + 1 - buf)
                || memcmp(m.data, buf, m.len) != 0)
            {
                good = 0;
            }

            mem_free(&m);
        }
    }

    ok(good, "long strings with a byte to escape anywhere: canonical, read "
       "back");
}


int
main(void)
{
    test_line();
    test_hasher();
    test_runs();
    test_chain(NULL, "SHA-256");
    test_chain(key, "HMAC");

    return done_testing();
}
