/*
 * Valid layout-2 record values built from a fuzzer's input, shared by
 * fuzz_record (which checks the codec on them) and fuzz_claim (which
 * wraps them in the scripts' answers): one generator, so both targets
 * agree on what a valid value is.
 */

#ifndef FUZZ_VALUE_H
#define FUZZ_VALUE_H

#include "idem_record.h"


typedef struct {
    const uint8_t  *p;
    size_t          n;
    size_t          i;
} fuzz_reader_t;


/* past the end of the input every byte reads as 0 */
static unsigned
rd8(fuzz_reader_t *r)
{
    return r->i < r->n ? r->p[r->i++] : 0;
}


static unsigned long long
rd64(fuzz_reader_t *r)
{
    unsigned long long  x;
    int                 i;

    x = 0;
    for (i = 0; i < 8; i++) {
        x = (x << 8) | rd8(r);
    }

    return x;
}


/* min..max, often at either end */
static long long
rd_num(fuzz_reader_t *r, long long min, long long max)
{
    unsigned            mode;
    unsigned long long  x, span;

    mode = rd8(r) & 3;
    x = rd64(r);
    span = (unsigned long long) (max - min);

    switch (mode) {
    case 0:
        return min + (long long) (x % 10 > span ? span : x % 10);
    case 1:
        return max - (long long) (x % 10 > span ? span : x % 10);
    default:
        return min + (long long) (x % (span + 1));
    }
}


/* n lowercase hex digits from 8 bytes of the input */
static void
rd_hex(fuzz_reader_t *r, char *out, size_t n)
{
    static const char   hex[] = "0123456789abcdef";
    size_t              i;
    unsigned long long  x;

    x = rd64(r);

    for (i = 0; i < n; i++) {
        x = x * 6364136223846793005ULL + 1442695040888963407ULL;
        out[i] = hex[x >> 60];
    }
}


typedef struct {
    idem_value_t   v;
    char           op[IDEM_TOKEN_LEN];
    char           fp[IDEM_FP_LEN];
    char           owner[IDEM_TOKEN_LEN];
    char           target[IDEM_RECORD_KEY_LEN];     /* an alias's */
} fuzz_value_t;


/* a record key as idem_record_key() writes it, its hex from the input */
static void
rd_record_key(fuzz_reader_t *r, char *out)
{
    size_t  pre;

    pre = sizeof(IDEM_RECORD_PREFIX) - 1;

    memcpy(out, IDEM_RECORD_PREFIX, pre);
    rd_hex(r, out + pre, 32);
    memcpy(out + pre + 32, IDEM_RECORD_SUFFIX, sizeof(IDEM_RECORD_SUFFIX) - 1);
}


/*
 * A value of the given state, its fields from the input.  The low bits
 * of "b" (one input byte the caller has read) decide: 1 waiters, 2 an
 * owner on a release marker, 4 stored and 8 resolved on a completion,
 * 4 no status and 8 no retry-after on a marker.  A completion takes what
 * is left of the input as its headers and body; an alias names a record
 * key whose hex comes from the input.
 */
static void
fuzz_value_from_input(fuzz_reader_t *r, char state, unsigned b,
    fuzz_value_t *fv)
{
    size_t         rest, hlen;
    idem_value_t  *v;

    memset(fv, 0, sizeof(*fv));
    v = &fv->v;

    rd_hex(r, fv->op, IDEM_TOKEN_LEN);
    rd_hex(r, fv->fp, IDEM_FP_LEN);
    rd_hex(r, fv->owner, IDEM_TOKEN_LEN);

    v->state = state;
    v->waiters = b & 1;
    v->op = fv->op;
    v->fp = fv->fp;
    v->owner = (state == 'i' || (state == 'r' && (b & 2))) ? fv->owner : NULL;
    v->created = v->completed = v->unknown_at = v->retry_after = -1;
    v->expires = v->approved_until = -1;

    switch (state) {

    case 'i':
        v->created = rd_num(r, 0, IDEM_TIME_MS_MAX);
        v->lease_ms = rd_num(r, 1, IDEM_TIME_MS_MAX);
        v->ttl_ms = rd_num(r, 1, IDEM_TIME_MS_MAX);
        break;

    case 'c':
        v->created = rd_num(r, 0, IDEM_TIME_MS_MAX);
        v->completed = rd_num(r, 0, IDEM_TIME_MS_MAX);
        v->status = (int) rd_num(r, 200, 599);
        v->stored = (b >> 2) & 1;
        v->resolved = (b >> 3) & 1;

        rest = r->n - r->i;
        hlen = rest ? rd8(r) % (rest + 1) : 0;
        rest = r->n - r->i;
        hlen = hlen > rest ? rest : hlen;
        v->hdr = (const char *) r->p + r->i;
        v->hdr_len = hlen;
        v->body = v->hdr + hlen;
        v->body_len = rest - hlen;
        r->i = r->n;
        break;

    case 'u':
        v->created = rd_num(r, 0, IDEM_TIME_MS_MAX);
        v->unknown_at = rd_num(r, 0, IDEM_TIME_MS_MAX);
        break;

    case 'a':
    case 'p':
    case 'd':
        v->created = rd_num(r, 0, IDEM_TIME_MS_MAX);
        v->expires = rd_num(r, 0, IDEM_TIME_MS_MAX);

        if (state != 'a') {
            v->approved_until = rd_num(r, 0, IDEM_TIME_MS_MAX);
            rest = r->n - r->i;
            hlen = rest ? 1 + rd8(r) % IDEM_APPROVER_MAX : 1;
            rest = r->n - r->i;
            v->approver = rest >= hlen ? (const char *) r->p + r->i : "x";
            v->approver_len = rest >= hlen ? hlen : 1;
            r->i += rest >= hlen ? hlen : 0;
        }
        break;

    case 's':
        v->created = rd_num(r, 0, IDEM_TIME_MS_MAX);
        rd_record_key(r, fv->target);
        v->target = fv->target;
        break;

    default:
        v->status = (b & 4) ? 0 : (int) rd_num(r, 200, 599);
        v->retry_after = (b & 8) ? -1 : rd_num(r, 0, IDEM_TIME_MS_MAX);
        break;
    }
}

#endif /* FUZZ_VALUE_H */
