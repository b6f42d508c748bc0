/*
 * Redis Cluster key slots: the CRC16/XMODEM check value, the hash-tag
 * rule, and every key of t/data/slots/keyslot.txt ("slot<TAB>key" lines,
 * as a real redis-server 7.0 answered CLUSTER KEYSLOT for them), and the
 * MOVED and ASK redirections a node answers, as Redis 7.0 writes them.
 */

#include <stdlib.h>
#include <string.h>

#include "idem_slot.h"
#include "tap.h"


#define SLOT(lit)  idem_slot(lit, sizeof(lit) - 1)


static void
test_rules(void)
{
    ok(idem_crc16("123456789", 9) == 0x31c3, "CRC16/XMODEM check value");
    ok(idem_crc16("", 0) == 0, "CRC16 of nothing");
    ok(SLOT("{user1000}.following") == SLOT("{user1000}.followers"),
       "one tag, one slot");
    ok(SLOT("{user1000}.following") == SLOT("user1000"), "the tag is hashed");
    ok(SLOT("foo{}{bar}") == idem_crc16("foo{}{bar}", 10) % IDEM_SLOTS,
       "an empty first tag: the whole key");
    ok(SLOT("foo{{bar}}zap") == SLOT("{bar"), "the tag ends at the first }");
    ok(SLOT("foo{bar}{zap}") == SLOT("bar"), "only the first tag counts");
    ok(SLOT("a{b") == idem_crc16("a{b", 3) % IDEM_SLOTS, "an open tag");
    ok(SLOT("idem:{0123456789abcdef0123456789abcdef}:r")
       == SLOT("0123456789abcdef0123456789abcdef"),
       "a record key's slot is its digest's");
}


static void
test_redis(const char *path)
{
    FILE      *f;
    char       line[512], *tab, *end;
    unsigned   want, bad, n, records;
    size_t     len;

    f = fopen(path, "r");
    if (!ok(f != NULL, "open %s", path)) {
        return;
    }

    n = bad = records = 0;

    while (fgets(line, sizeof(line), f)) {
        len = strlen(line);
        if (len && line[len - 1] == '\n') {
            line[--len] = '\0';
        }

        tab = strchr(line, '\t');
        if (tab == NULL) {
            bad++;
            diag("  malformed line: %s", line);
            continue;
        }

        want = (unsigned) strtoul(line, &end, 10);
        n++;
        records += (strncmp(tab + 1, "idem:{", 6) == 0);

        if (end != tab || idem_slot(tab + 1, strlen(tab + 1)) != want) {
            bad++;
            diag("  %s: redis says %u, idem_slot %u", tab + 1, want,
                 idem_slot(tab + 1, strlen(tab + 1)));
        }
    }

    fclose(f);

    ok(n > 1000 && records >= 1000, "%u keys, %u of them record keys",
       n, records);
    ok(bad == 0, "every key in the slot redis-server gave it (%u wrong)",
       bad);
}


#define REDIRECT(lit, r)  idem_redirect(lit, sizeof(lit) - 1, r)


static int
redirect_is(idem_redirect_t *r, int ask, unsigned slot, const char *host,
    int port)
{
    return r->ask == ask && r->slot == slot && r->port == port
           && r->host_len == strlen(host)
           && memcmp(r->host, host, r->host_len) == 0;
}


static void
test_redirect(void)
{
    idem_redirect_t  r;

    ok(REDIRECT("MOVED 3999 127.0.0.1:6381", &r)
       && redirect_is(&r, 0, 3999, "127.0.0.1", 6381), "MOVED");
    ok(REDIRECT("ASK 16383 10.0.0.2:7000", &r)
       && redirect_is(&r, 1, 16383, "10.0.0.2", 7000), "ASK, the last slot");
    ok(REDIRECT("MOVED 0 :6380", &r) && redirect_is(&r, 0, 0, "", 6380),
       "an empty endpoint: the connection's host");
    ok(REDIRECT("MOVED 12 ::1:7001", &r) && redirect_is(&r, 0, 12, "::1", 7001),
       "IPv6: the port after the last colon");
    ok(REDIRECT("MOVED 12 redis-3.example:7001", &r)
       && redirect_is(&r, 0, 12, "redis-3.example", 7001),
       "a host name is parsed (the caller refuses it)");

    ok(!REDIRECT("MOVED 16384 127.0.0.1:6381", &r), "slot out of range");
    ok(!REDIRECT("MOVED 3999 127.0.0.1:0", &r), "port 0");
    ok(!REDIRECT("MOVED 3999 127.0.0.1:65536", &r), "port out of range");
    ok(!REDIRECT("MOVED 3999 127.0.0.1", &r), "no port");
    ok(!REDIRECT("MOVED 3999 127.0.0.1:", &r), "an empty port");
    ok(!REDIRECT("MOVED -1 127.0.0.1:6381", &r), "a negative slot");
    ok(!REDIRECT("MOVED 3999", &r), "no endpoint");
    ok(!REDIRECT("MOVED 3999 a b:1", &r), "a space in the endpoint");
    ok(!idem_redirect("MOVED 1 a\0b:1", 13, &r)
       && !REDIRECT("MOVED 1 a\tb:1", &r) && !REDIRECT("MOVED 1 \x80:1", &r),
       "a control or non-ASCII byte in the endpoint");
    ok(!REDIRECT("MOVEDX 1 127.0.0.1:1", &r), "another word");
    ok(!REDIRECT("moved 1 127.0.0.1:1", &r), "lower case");
    ok(!REDIRECT("CLUSTERDOWN The cluster is down", &r), "CLUSTERDOWN");
    ok(!REDIRECT("TRYAGAIN Multiple keys request during rehashing of slot",
                 &r), "TRYAGAIN");
    ok(!REDIRECT("ASK ", &r) && !REDIRECT("", &r), "nothing after the word");
}


int
main(int argc, char **argv)
{
    char  path[4096];

    plan(31);

    test_rules();
    test_redirect();

    /* argv[1] is t/data/jcs; the slots are beside it */
    snprintf(path, sizeof(path), "%s/../slots/keyslot.txt",
             argc > 1 ? argv[1] : "t/data/jcs");
    test_redis(path);

    return done_testing();
}
