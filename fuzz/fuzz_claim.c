/*
 * libFuzzer target: the decoder of the claim script's reply
 * (idem_claim_decode), i.e. what the module accepts from Redis before it
 * replays a stored response or answers in-progress, unknown or mismatch.
 *
 * The input is split at 0x00 bytes into up to 8 elements; an element whose
 * first byte is 0x01 is a non-string (nil, integer, array) and the rest of
 * it is ignored; the others are strings, each in its own exact-size heap
 * copy so that ASan sees any read past one.  The reply's element count is
 * the number of elements, plus the value of a trailing 0x02 0xNN marker
 * (elements beyond the sixth are never given to the decoder).
 *
 * Properties, for every input:
 *  - deterministic: decoding twice gives the same kind and fields;
 *  - invalid answers set nothing; every other kind has an operation id of
 *    1..64 lowercase hex that is element 1, and a state that is one of
 *    "in_progress", "completed", "unknown" exactly when the kind has one;
 *  - completed: status 200..599 (element 2, in decimal), headers
 *    and body are elements 3 and 4, the stored flag is element 5 == "1",
 *    and the reply had exactly 6 elements;
 *  - the accepted answer, written back as claim.lua would write it,
 *    decodes to the same result (the decoder and the script agree);
 *  - a completed answer's headers are then decoded as netstrings without
 *    reading outside them.
 */

#include "idem_record.h"

#include "fuzz_common.h"


#define FUZZ_MAX_ELEMS  8


typedef struct {
    idem_rv_t   el[FUZZ_MAX_ELEMS];
    char       *copy[FUZZ_MAX_ELEMS];
    size_t      n;          /* elements built */
    size_t      count;      /* the reply's element count */
} fuzz_reply_t;


static void
reply_build(fuzz_reply_t *rp, const uint8_t *data, size_t size)
{
    size_t          i, len;
    const uint8_t  *p, *end, *z;

    memset(rp, 0, sizeof(*rp));

    end = data + size;
    rp->count = 0;

    if (size >= 2 && end[-2] == 0x02) {
        rp->count = end[-1];
        end -= 2;
    }

    for (p = data; p <= end && rp->n < FUZZ_MAX_ELEMS; p = z + 1) {
        z = memchr(p, 0, end - p);
        if (z == NULL) {
            z = end;
        }

        i = rp->n++;
        len = z - p;

        if (len > 0 && p[0] == 0x01) {
            rp->el[i].is_str = 0;

        } else {
            rp->copy[i] = malloc(len ? len : 1);
            if (rp->copy[i] == NULL) {
                abort();
            }
            memcpy(rp->copy[i], p, len);
            rp->el[i].data = rp->copy[i];
            rp->el[i].len = len;
            rp->el[i].is_str = 1;
        }

        if (z == end) {
            break;
        }
    }

    rp->count += rp->n;
}


static void
reply_free(fuzz_reply_t *rp)
{
    size_t  i;

    for (i = 0; i < rp->n; i++) {
        free(rp->copy[i]);
    }
}


static int
rv_eq(const idem_rv_t *a, const idem_rv_t *b)
{
    return a->len == b->len && a->is_str == b->is_str
           && (a->len == 0 || memcmp(a->data, b->data, a->len) == 0);
}


static int
rv_is(const idem_rv_t *v, const char *lit)
{
    return v->is_str && v->len == strlen(lit)
           && memcmp(v->data, lit, v->len) == 0;
}


static int
claim_eq(const idem_claim_t *a, const idem_claim_t *b)
{
    if (a->kind != b->kind || (a->state == NULL) != (b->state == NULL)
        || (a->state && strcmp(a->state, b->state) != 0))
    {
        return 0;
    }

    if (a->kind == IDEM_CLAIM_INVALID) {
        return 1;
    }

    return rv_eq(&a->op, &b->op)
           && a->status == b->status && rv_eq(&a->hdr, &b->hdr)
           && rv_eq(&a->body, &b->body) && a->body_stored == b->body_stored
           && a->lease_left == b->lease_left;
}


static idem_rv_t
rv_str(const char *s, size_t len)
{
    idem_rv_t  v = { s, len, 1 };

    return v;
}


/* the answer as claim.lua writes it, decoded again */
static void
check_rewrite(const idem_claim_t *c)
{
    char          status[16], lease[32];
    size_t        n;
    idem_rv_t     el[IDEM_CLAIM_ELEMS];
    idem_claim_t  again;

    el[1] = c->op;

    switch (c->kind) {

    case IDEM_CLAIM_CLAIMED:
        el[0] = rv_str("claimed", 7);
        n = 2;
        break;

    case IDEM_CLAIM_COMPLETED:
        el[0] = rv_str("completed", 9);
        el[2] = rv_str(status, snprintf(status, sizeof(status), "%d",
                                        c->status));
        el[3] = c->hdr;
        el[4] = c->body;
        el[5] = rv_str(c->body_stored ? "1" : "0", 1);
        n = 6;
        break;

    case IDEM_CLAIM_IN_PROGRESS:
        el[0] = rv_str("in_progress", 11);
        el[2] = rv_str(lease, snprintf(lease, sizeof(lease), "%llu",
                                       c->lease_left));
        n = 3;
        break;

    case IDEM_CLAIM_UNKNOWN:
        el[0] = rv_str("unknown", 7);
        n = 2;
        break;

    case IDEM_CLAIM_MISMATCH:
        el[0] = rv_str("mismatch", 8);
        el[2] = rv_str(c->state, strlen(c->state));
        n = 3;
        break;

    default:
        return;
    }

    idem_claim_decode(el, n, &again);

    FUZZ_CHECK(claim_eq(c, &again), "kind %d rewritten decodes as %d",
               c->kind, again.kind);
}


static void
check_fields(const fuzz_reply_t *rp, const idem_claim_t *c)
{
    idem_hdrs_iter_t   it;
    const char        *name, *value;
    size_t             name_len, value_len, guard;
    int                rc;

    if (c->kind == IDEM_CLAIM_INVALID) {
        FUZZ_CHECK(c->op.data == NULL && c->state == NULL && c->status == 0,
                   "an invalid answer set fields");
        return;
    }

    FUZZ_CHECK(rp->count >= 2 && rv_eq(&c->op, &rp->el[1])
               && idem_is_hex(c->op.data, c->op.len),
               "operation id is not element 1 in hex");

    switch (c->kind) {

    case IDEM_CLAIM_CORRUPT:
        FUZZ_CHECK(c->state == NULL && rv_is(&rp->el[0], "completed"),
                   "corrupt answer is not a completed one");
        return;

    case IDEM_CLAIM_COMPLETED:
        FUZZ_CHECK(rp->count == 6 && c->status >= 200 && c->status <= 599
                   && rv_eq(&c->hdr, &rp->el[3]) && rv_eq(&c->body, &rp->el[4])
                   && c->body_stored == rv_is(&rp->el[5], "1")
                   && strcmp(c->state, "completed") == 0,
                   "completed fields do not match the reply");

        it.pos = c->hdr.data;
        it.end = c->hdr.data + c->hdr.len;

        for (guard = 0; guard <= c->hdr.len; guard++) {
            rc = idem_hdrs_next(&it, &name, &name_len, &value, &value_len);
            if (rc != 1) {
                break;
            }
            FUZZ_CHECK(name >= c->hdr.data && value + value_len <= it.end,
                       "a header pair lies outside the stored headers");
        }
        break;

    case IDEM_CLAIM_MISMATCH:
        FUZZ_CHECK(rp->count == 3 && c->state && rv_is(&rp->el[2], c->state),
                   "mismatch state is not element 2");
        break;

    case IDEM_CLAIM_IN_PROGRESS:
        FUZZ_CHECK(rp->count == 3 && strcmp(c->state, "in_progress") == 0,
                   "in_progress shape");
        break;

    default:
        FUZZ_CHECK(c->state != NULL, "kind %d without a state", c->kind);
        break;
    }

    check_rewrite(c);
}


int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fuzz_reply_t  rp;
    idem_claim_t  a, b;

    reply_build(&rp, data, size);

    idem_claim_decode(rp.el, rp.count, &a);
    idem_claim_decode(rp.el, rp.count, &b);

    FUZZ_CHECK(claim_eq(&a, &b), "not deterministic: %d then %d",
               a.kind, b.kind);

    check_fields(&rp, &a);

    reply_free(&rp);

    return 0;
}
