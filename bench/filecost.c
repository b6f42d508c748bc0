/*
 * filecost: where the audit file's CPU per first write goes, outside
 * nginx.  A first write is two lines, its claim's (attempted sent) and its
 * completion's (accepted completed), with the values bench/ab's lines have
 * (a 33-byte key, route /v1/orders, no identity, a 201 with a reference-less
 * answer): about 560 and 650 bytes.
 *
 *   cc -O2 -Ingx_http_idempotency_module -o build/filecost bench/filecost.c \
 *       ngx_http_idempotency_module/idem_*.c -lcjson -lcrypto -lm
 *   build/filecost [DIR]
 *
 * Prints, CPU time (getrusage) per first write, the median of 5 repeats:
 *   FILECOST op=lines   both lines built and hashed (the hasher the
 *                       module keeps per file: no key, SHA-256)
 *   FILECOST op=hash    the same bytes hashed alone
 *   FILECOST op=write-N the two lines of N first writes appended with one
 *                       write() to a file in DIR (default /tmp), as the
 *                       module appends a turn's lines: what the page
 *                       cache costs as a function of the turn's size
 */

#define _GNU_SOURCE

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/resource.h>

#include "idem_audit_file.h"


#define REPEATS  5
#define S(s)     { s, sizeof(s) - 1 }


static double
cpu_us(void)
{
    struct rusage  u;

    getrusage(RUSAGE_SELF, &u);

    return (u.ru_utime.tv_sec + u.ru_stime.tv_sec) * 1e6
           + u.ru_utime.tv_usec + u.ru_stime.tv_usec;
}


static int
cmp(const void *a, const void *b)
{
    double  x = *(const double *) a, y = *(const double *) b;

    return (x > y) - (x < y);
}


static double
median(double *v)
{
    qsort(v, REPEATS, sizeof(double), cmp);
    return v[REPEATS / 2];
}


/* a first write's two steps, as the bench's lines */
static void
steps(idem_audit_entry_t claim[2], idem_audit_entry_t done[2],
    const char *prev)
{
    idem_str_t  op = S("7003021c000c391beca73d14bc901d9c");
    idem_str_t  key = S("ab1796692846-15627-1284-new-0-1-2");
    idem_str_t  fp = S("d1464601a15f90604da5fe8d58dd75e6"
                       "b6418a1431cc13fd42d25ae0650a1a4c");
    idem_str_t  route = S("/v1/orders");
    idem_str_t  req = S("fc859e2c12a68741b67a57048b8ac6ab");
    idem_str_t  resp = S("283dcdcd8a3d8f1b433193de03af13b0"
                         "f8ded743d2dc5d527f9607e2eb781d5e");

    memset(claim, 0, 2 * sizeof(idem_audit_entry_t));

    claim[0].event = IDEM_AUDIT_ATTEMPTED;
    claim[0].time = 1796692852027LL;
    claim[0].op = op;
    claim[0].key = key;
    claim[0].fp = fp;
    claim[0].route = route;
    claim[0].request = req;
    claim[1] = claim[0];
    claim[1].event = IDEM_AUDIT_SENT;
    claim[0].seq = 1234567;
    claim[0].prev.data = prev;
    claim[0].prev.len = IDEM_AUDIT_HASH_LEN;

    done[0] = claim[0];
    done[0].event = IDEM_AUDIT_ACCEPTED;
    done[0].status = 201;
    done[0].seq = 1234568;
    done[1] = done[0];
    done[1].event = IDEM_AUDIT_COMPLETED;
    done[1].response = resp;
}


/* the two lines built and hashed, then the same bytes hashed alone */
static void
bench_lines(idem_audit_entry_t *claim, idem_audit_entry_t *done,
    idem_audit_file_hasher_t *h, char *buf, size_t len1, size_t len2)
{
    int     r, i;
    char    hash[IDEM_AUDIT_HASH_LEN + 1];
    double  t[REPEATS], t0;

    const int  iters = 200000;

    for (r = 0; r < REPEATS; r++) {
        t0 = cpu_us();
        for (i = 0; i < iters; i++) {
            (void) idem_audit_file_line_h(buf, claim, 2, h, hash);
            (void) idem_audit_file_line_h(buf + len1, done, 2, h, hash);
        }
        t[r] = (cpu_us() - t0) / iters;
    }
    printf("FILECOST op=lines us_per_first_write=%.3f\n", median(t));

    /* what is hashed: the line up to ,"hash" and its closing brace */
    for (r = 0; r < REPEATS; r++) {
        t0 = cpu_us();
        for (i = 0; i < iters; i++) {
            (void) idem_audit_file_hash(h, buf, len1 - 75, hash);
            (void) idem_audit_file_hash(h, buf + len1, len2 - 75, hash);
        }
        t[r] = (cpu_us() - t0) / iters;
    }
    printf("FILECOST op=hash us_per_first_write=%.3f\n", median(t));
}


/* a turn's lines appended with one write(), 256 MiB a repeat */
static int
bench_write(const char *path, const char *buf, size_t pair, int turn)
{
    int     fd, r, i, n;
    double  t[REPEATS], t0;
    size_t  len;

    len = pair * turn;
    n = (int) (256 * 1024 * 1024 / len);

    for (r = 0; r < REPEATS; r++) {
        fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_APPEND, 0600);
        if (fd == -1) {
            perror(path);
            return -1;
        }

        t0 = cpu_us();
        for (i = 0; i < n; i++) {
            if (write(fd, buf, len) != (ssize_t) len) {
                perror("write");
                close(fd);
                return -1;
            }
        }
        t[r] = (cpu_us() - t0) / ((double) n * turn);

        close(fd);
        unlink(path);
    }

    printf("FILECOST op=write-%d bytes_per_write=%zu us_per_first_write=%.3f\n",
           turn, len, median(t));

    return 0;
}


int
main(int argc, char **argv)
{
    int                        k, n;
    char                      *buf, *p, hash[IDEM_AUDIT_HASH_LEN + 1];
    char                       path[4096], prev[IDEM_AUDIT_HASH_LEN + 1];
    size_t                     len1, len2, pair;
    idem_audit_entry_t         claim[2], done[2];
    idem_audit_file_hasher_t  *h;

    static const int  turns[] = { 1, 4, 11, 16, 52 };

    memset(prev, 'a', IDEM_AUDIT_HASH_LEN);
    prev[IDEM_AUDIT_HASH_LEN] = '\0';
    steps(claim, done, prev);

    h = idem_audit_file_hasher(NULL, 0);
    buf = malloc(64 * 2048);
    if (h == NULL || buf == NULL) {
        return 1;
    }

    len1 = idem_audit_file_line_h(buf, claim, 2, h, hash) - buf;
    len2 = idem_audit_file_line_h(buf + len1, done, 2, h, hash) - buf - len1;
    pair = len1 + len2;
    printf("FILECOST lines_bytes=%zu+%zu\n", len1, len2);

    bench_lines(claim, done, h, buf, len1, len2);

    for (p = buf + pair, n = 1; n < 64; n++, p += pair) {
        memcpy(p, buf, pair);
    }

    snprintf(path, sizeof(path), "%s/filecost.%d.log",
             argc > 1 ? argv[1] : "/tmp", (int) getpid());

    for (k = 0; k < (int) (sizeof(turns) / sizeof(turns[0])); k++) {
        if (bench_write(path, buf, pair, turns[k]) != 0) {
            return 1;
        }
    }

    idem_audit_file_hasher_free(h);
    free(buf);

    return 0;
}
