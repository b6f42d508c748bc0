/*
 * Redis Cluster key slots: the CRC16/XMODEM check value, the hash-tag
 * rule, and every key of t/data/slots/keyslot.txt ("slot<TAB>key" lines,
 * as a real redis-server 7.0 answered CLUSTER KEYSLOT for them).
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


int
main(int argc, char **argv)
{
    char  path[4096];

    plan(12);

    test_rules();

    /* argv[1] is t/data/jcs; the slots are beside it */
    snprintf(path, sizeof(path), "%s/../slots/keyslot.txt",
             argc > 1 ? argv[1] : "t/data/jcs");
    test_redis(path);

    return done_testing();
}
