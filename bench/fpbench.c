/*
 * fpbench: the fingerprint micro-benchmark of issue 4.
 *
 * For generated JSON documents of 1 KiB, 64 KiB and 1 MiB it times
 *
 *   fp     idem_fingerprint() with body_json: strict parse written
 *          directly in JCS canonical form (no tree), streamed into SHA-256
 *          (what a request costs)
 *   parse  cJSON_Parse() + cJSON_Delete() of the same bytes (the yardstick)
 *
 * and, for the breakdown, jcsparse (jcs_tree_parse + cJSON_Delete: the
 * strict parser building a cJSON tree, test support in t/unit/jcs_tree.c,
 * not in the module), canon (idem_jcs_canonicalize into a sink that
 * discards: parse + sort + write, no hashing) and sha (SHA-256 of the raw
 * bytes).
 *
 * Usage:
 *   fpbench [--quick] [--sizes 1024,65536,1048576]
 *       wall clock: per op and size, the median and the best of REPEATS
 *       repeats of a calibrated number of iterations; the ops alternate
 *       inside every repeat so that a noisy neighbour hits all of them.
 *       Prints one "FPBENCH ..." line per size and op, one "FPRATIO ..."
 *       line per size and one "FPMEM ..." line per size (heap bytes the
 *       tree needs, counted through cJSON's allocation hooks).
 *   fpbench --op OP --size N --iters K
 *       runs OP K times on the document of N bytes, collecting callgrind
 *       events only around the loop (run it under
 *       valgrind --tool=callgrind --collect-atstart=no); prints nothing.
 *   fpbench --dump N
 *       writes the generated document of N bytes to stdout.
 */

#define _GNU_SOURCE

#include <errno.h>
#include <malloc.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cjson/cJSON.h>
#include <openssl/evp.h>
#include <valgrind/callgrind.h>

#include "idem_fingerprint.h"
#include "idem_jcs.h"
#include "jcs_tree.h"
#include "mem_sink.h"


typedef enum {
    OP_FP = 0,
    OP_PARSE,
    OP_JCSPARSE,
    OP_CANON,
    OP_SHA,
    OP_N
} op_e;

static const char  *op_names[OP_N] = {
    "fp", "parse", "jcsparse", "canon", "sha"
};


/* the same document as bench/lua/common.lua json_body() */

typedef struct {
    char    *p;
    size_t   len;
    size_t   size;
} buf_t;


static void
buf_add(buf_t *b, const char *s, size_t n)
{
    if (b->len + n + 1 > b->size) {
        while (b->len + n + 1 > b->size) {
            b->size = b->size ? 2 * b->size : 4096;
        }

        b->p = realloc(b->p, b->size);
        if (b->p == NULL) {
            perror("realloc");
            exit(2);
        }
    }

    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = '\0';
}


static char *
json_doc(size_t size)
{
    static const char  head[] = "{\"batch_id\":\"b-0001\",\"items\":[";
    static const char  tail[] = "],\"note\":\"";
    static const char  close[] = "\"}";
    char               rec[256];
    size_t             cur, add, i;
    int                n;
    buf_t              b = { NULL, 0, 0 };

    buf_add(&b, head, sizeof(head) - 1);
    cur = (sizeof(head) - 1) + (sizeof(tail) - 1) + (sizeof(close) - 1);

    for (i = 1; /* void */; i++) {
        n = snprintf(rec, sizeof(rec),
                     "%s{\"sku\":\"SKU-%06zu\",\"qty\":%zu,\"price\":%zu.%02zu,"
                     "\"active\":%s,\"tags\":[\"red\",\"large\"],"
                     "\"name\":\"Item %zu \\u00e9t\\u00e9\"}",
                     i > 1 ? "," : "", i, i % 7 + 1, i % 500, i % 100,
                     (i % 2 == 0) ? "true" : "false", i);
        add = (size_t) n;

        if (cur + add > size) {
            break;
        }

        buf_add(&b, rec, add);
        cur += add;
    }

    buf_add(&b, tail, sizeof(tail) - 1);

    for (i = cur; i < size; i++) {
        buf_add(&b, "x", 1);
    }

    buf_add(&b, close, sizeof(close) - 1);

    if (b.len != size) {
        fprintf(stderr, "fpbench: generated %zu bytes, wanted %zu\n",
                b.len, size);
        exit(2);
    }

    return b.p;
}


/* the ops */

static volatile size_t  sink_hole;


static int
run_op(op_e op, const char *doc, size_t len)
{
    cJSON             *tree;
    idem_sink_t        sink;
    mem_t              out;
    unsigned char      md[EVP_MAX_MD_SIZE];
    unsigned int       mdlen;
    idem_fp_input_t    in;
    idem_fp_result_t   res;

    switch (op) {

    case OP_FP:
        memset(&in, 0, sizeof(in));
        in.method.data = "POST";
        in.method.len = 4;
        in.route.data = "/v1/orders";
        in.route.len = 10;
        in.query.data = "";
        in.query.len = 0;
        in.scope.data = "Bearer agent-7";
        in.scope.len = 14;
        in.body_json = 1;
        in.body = doc;
        in.body_len = len;

        if (idem_fingerprint(&in, &res) != 0
            || res.body_form != IDEM_BODY_JSON)
        {
            return -1;
        }

        sink_hole += (unsigned char) res.hex[0];
        return 0;

    case OP_PARSE:
        tree = cJSON_Parse(doc);
        if (tree == NULL) {
            return -1;
        }

        cJSON_Delete(tree);
        return 0;

    case OP_JCSPARSE:
        if (jcs_tree_parse(doc, len, &tree) != IDEM_JCS_OK) {
            return -1;
        }

        cJSON_Delete(tree);
        return 0;

    case OP_CANON:
        mem_sink(&out, &sink);
        out.discard = 1;

        if (idem_jcs_canonicalize(doc, len, &sink) != IDEM_JCS_OK) {
            return -1;
        }

        sink_hole += out.len;
        return 0;

    case OP_SHA:
        if (EVP_Digest(doc, len, md, &mdlen, EVP_sha256(), NULL) != 1) {
            return -1;
        }

        sink_hole += md[0];
        return 0;

    default:
        return -1;
    }
}


/* bench/heapmeter.c, linked in */
void heapmeter_window(long *cur, long *peak);


static double
now_ns(void)
{
    struct timespec  ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);

    return (double) ts.tv_sec * 1e9 + (double) ts.tv_nsec;
}


static int
cmp_double(const void *a, const void *b)
{
    double  x = *(const double *) a, y = *(const double *) b;

    return (x > y) - (x < y);
}


static void
die_op(op_e op, size_t size)
{
    fprintf(stderr, "fpbench: op %s failed on the %zu-byte document\n",
            op_names[op], size);
    exit(1);
}


/* iterations of op for about target_ns, after a warm-up */
static long
calibrate(op_e op, const char *doc, size_t size, double target_ns)
{
    double  t0, t;
    long    n, i, iters;

    /* warm up: first-touch page faults, lazy binding, malloc arenas */
    for (i = 0; i < 3; i++) {
        if (run_op(op, doc, size) != 0) {
            die_op(op, size);
        }
    }

    for (n = 1; /* void */; n *= 2) {
        t0 = now_ns();
        for (i = 0; i < n; i++) {
            if (run_op(op, doc, size) != 0) {
                die_op(op, size);
            }
        }
        t = now_ns() - t0;

        if (t >= target_ns / 4 || n >= (1L << 30)) {
            break;
        }
    }

    iters = (long) (n * (target_ns / t));

    return (iters < 1) ? 1 : iters;
}


/* the FPBENCH lines, and the FPRATIO line of fp against cJSON_Parse */
static void
print_times(size_t size, int repeats, long *iters, double **samples)
{
    double  med[OP_N], best[OP_N];
    int     op;

    for (op = 0; op < OP_N; op++) {
        qsort(samples[op], repeats, sizeof(double), cmp_double);
        best[op] = samples[op][0];
        med[op] = samples[op][repeats / 2];

        printf("FPBENCH size=%zu op=%s iters=%ld repeats=%d "
               "median_ns=%.0f best_ns=%.0f ns_per_byte=%.3f "
               "mb_per_s=%.1f\n",
               size, op_names[op], iters[op], repeats, med[op], best[op],
               med[op] / size, size / med[op] * 1e3);
    }

    printf("FPRATIO size=%zu fp_over_parse_median=%.3f "
           "fp_over_parse_best=%.3f fp_ns_per_byte=%.3f "
           "parse_ns_per_byte=%.3f\n",
           size, med[OP_FP] / med[OP_PARSE], best[OP_FP] / best[OP_PARSE],
           med[OP_FP] / size, med[OP_PARSE] / size);
}


/*
 * FPMEM: the peak heap of one fingerprint and of one cJSON_Parse over
 * what was in use before (bench/heapmeter.c is linked in, so it sees
 * every allocation: the writer's buffers, OpenSSL, cJSON)
 */
static void
print_memory(const char *doc, size_t size)
{
    long  cur, cur2, peak, fp_peak, parse_peak;

    heapmeter_window(&cur, &peak);
    if (run_op(OP_FP, doc, size) != 0) {
        die_op(OP_FP, size);
    }
    heapmeter_window(&cur2, &peak);
    fp_peak = peak - cur;

    if (run_op(OP_PARSE, doc, size) != 0) {
        die_op(OP_PARSE, size);
    }
    heapmeter_window(&cur, &peak);
    parse_peak = peak - cur2;

    printf("FPMEM size=%zu fp_heap_bytes=%ld fp_heap_per_body_byte=%.2f "
           "parse_heap_bytes=%ld parse_heap_per_body_byte=%.2f\n",
           size, fp_peak, (double) fp_peak / size,
           parse_peak, (double) parse_peak / size);
}


static void
bench_size(size_t size, int repeats, double target_ns)
{
    char    *doc;
    double   t0, *samples[OP_N];
    long     iters[OP_N], i;
    int      op, r;

    doc = json_doc(size);

    /* calibrate: iterations for about target_ns per op and repeat */
    for (op = 0; op < OP_N; op++) {
        iters[op] = calibrate(op, doc, size, target_ns);
        samples[op] = calloc(repeats, sizeof(double));
    }

    /* the ops take turns in every repeat: a noisy neighbour hits all */
    for (r = 0; r < repeats; r++) {
        for (op = 0; op < OP_N; op++) {
            t0 = now_ns();
            for (i = 0; i < iters[op]; i++) {
                (void) run_op(op, doc, size);
            }
            samples[op][r] = (now_ns() - t0) / iters[op];
        }
    }

    print_times(size, repeats, iters, samples);
    print_memory(doc, size);

    for (op = 0; op < OP_N; op++) {
        free(samples[op]);
    }

    free(doc);
    fflush(stdout);
}


static op_e
op_by_name(const char *name)
{
    int  op;

    for (op = 0; op < OP_N; op++) {
        if (strcmp(name, op_names[op]) == 0) {
            return op;
        }
    }

    fprintf(stderr, "fpbench: unknown op \"%s\"\n", name);
    exit(2);
}


typedef struct {
    int          quick;
    const char  *opname;
    size_t       size;
    long         iters;
    const char  *sizelist;
} args_t;


/* 0 to go on, else the exit status; --dump is answered here */
static int
parse_args(int argc, char **argv, args_t *a)
{
    char  *doc;
    int    i;

    for (i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--quick") == 0) {
            a->quick = 1;

        } else if (strcmp(argv[i], "--op") == 0 && i + 1 < argc) {
            a->opname = argv[++i];

        } else if (strcmp(argv[i], "--size") == 0 && i + 1 < argc) {
            a->size = strtoul(argv[++i], NULL, 10);

        } else if (strcmp(argv[i], "--iters") == 0 && i + 1 < argc) {
            a->iters = strtol(argv[++i], NULL, 10);

        } else if (strcmp(argv[i], "--sizes") == 0 && i + 1 < argc) {
            a->sizelist = argv[++i];

        } else if (strcmp(argv[i], "--dump") == 0 && i + 1 < argc) {
            a->size = strtoul(argv[++i], NULL, 10);
            doc = json_doc(a->size);
            fwrite(doc, 1, a->size, stdout);
            free(doc);
            return -1;

        } else {
            fprintf(stderr, "usage: fpbench [--quick] [--sizes N,N,...] | "
                            "--op OP --size N --iters K | --dump N\n");
            return 2;
        }
    }

    return 0;
}


/* --op: callgrind events only around the loop */
static int
run_callgrind(const char *opname, size_t size, long iters)
{
    char  *doc;
    long   k;
    op_e   op;

    if (size < 64) {
        fprintf(stderr, "fpbench: --op needs --size >= 64\n");
        return 2;
    }

    op = op_by_name(opname);
    doc = json_doc(size);

    /* warm up outside the collection: first-touch, lazy binding */
    if (run_op(op, doc, size) != 0) {
        die_op(op, size);
    }

    CALLGRIND_TOGGLE_COLLECT;
    for (k = 0; k < iters; k++) {
        (void) run_op(op, doc, size);
    }
    CALLGRIND_TOGGLE_COLLECT;

    free(doc);
    return 0;
}


/* "1024,65536": at most 16 sizes of at least 64 bytes; -1 if malformed */
static int
parse_sizes(const char *list, size_t *sizes, size_t *n)
{
    char  *s, *end;

    *n = 0;

    for (s = (char *) list; *s && *n < 16; s = end) {
        errno = 0;
        sizes[*n] = strtoul(s, &end, 10);
        if (end == s || errno || sizes[*n] < 64) {
            fprintf(stderr, "fpbench: bad --sizes \"%s\"\n", list);
            return -1;
        }
        (*n)++;
        if (*end == ',') {
            end++;
        }
    }

    return 0;
}


int
main(int argc, char **argv)
{
    args_t   a;
    size_t   sizes[16], nsizes, i;
    int      rc;

    a.quick = 0;
    a.opname = NULL;
    a.size = 0;
    a.iters = 1;
    a.sizelist = "1024,65536,1048576";

    rc = parse_args(argc, argv, &a);
    if (rc != 0) {
        return (rc < 0) ? 0 : rc;
    }

    if (a.opname != NULL) {
        return run_callgrind(a.opname, a.size, a.iters);
    }

    if (parse_sizes(a.sizelist, sizes, &nsizes) != 0) {
        return 2;
    }

    for (i = 0; i < nsizes; i++) {
        bench_size(sizes[i], a.quick ? 5 : 15, a.quick ? 10e6 : 40e6);
    }

    return 0;
}
