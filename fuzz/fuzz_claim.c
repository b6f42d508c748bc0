/*
 * libFuzzer target: the decoders of the scripts' replies, i.e. what the
 * module accepts from Redis before it replays a stored response or answers
 * in-progress, unknown or mismatch (idem_claim_decode), and what the status
 * and admin endpoints print (idem_status_decode, idem_admin_decode).
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
 *
 * The same reply is also decoded as the status script's answer
 * (idem_status_decode) and the admin script's (idem_admin_decode):
 *  - both deterministic, and anything but an accepted answer sets nothing;
 *  - status: no record exactly for 0 elements; a record has exactly 6,
 *    a known state (element 0), a 64-hex fingerprint (1) and a hex
 *    operation id (2), times that are element 3 and 4 in decimal up to
 *    year 9999 or -1 for an empty element, a status 200..599 (element 5)
 *    or 0 for an empty one, never 0 when completed; written back as
 *    status.lua writes it, it decodes the same;
 *  - a well-formed status reply built from the input's first bytes is
 *    accepted, with exactly its fields (so rejecting good records fails);
 *  - admin: "refused" exactly with 2 elements and a state of in_progress
 *    or completed (element 1), the other answers with 1 element.
 * A single 0x03 byte is the empty reply.
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

    /* a single 0x03 byte is the empty reply (status.lua's "no record") */
    if (size == 1 && data[0] == 0x03) {
        rp->count = 0;
    }
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


static int
status_eq(const idem_status_t *a, const idem_status_t *b)
{
    return a->kind == b->kind && a->state == b->state
           && rv_eq(&a->fp, &b->fp) && rv_eq(&a->op, &b->op)
           && a->created == b->created && a->completed == b->completed
           && a->status == b->status;
}


/* a decimal element as the status answer's time fields read it, or -2 */
static long long
rv_time(const idem_rv_t *v)
{
    size_t     i;
    long long  n = 0;

    if (!v->is_str) {
        return -2;
    }

    if (v->len == 0) {
        return -1;
    }

    for (i = 0; i < v->len; i++) {
        if (v->data[i] < '0' || v->data[i] > '9' || n > IDEM_TIME_MS_MAX) {
            return -2;
        }
        n = n * 10 + (v->data[i] - '0');
    }

    return n <= IDEM_TIME_MS_MAX ? n : -2;
}


static idem_rv_t
rv_num(char *buf, size_t size, long long n)
{
    return n < 0 ? rv_str("", 0)
                 : rv_str(buf, (size_t) snprintf(buf, size, "%lld", n));
}


static void
check_status(const fuzz_reply_t *rp)
{
    char           t1[32], t2[32], st[16];
    idem_rv_t      el[IDEM_STATUS_ELEMS];
    idem_status_t  a, b;

    idem_status_decode(rp->el, rp->count, &a);
    idem_status_decode(rp->el, rp->count, &b);

    FUZZ_CHECK(status_eq(&a, &b), "status: not deterministic");
    FUZZ_CHECK((a.kind == IDEM_STATUS_NONE) == (rp->count == 0),
               "status: 'no record' is not exactly the empty reply");

    if (a.kind != IDEM_STATUS_RECORD) {
        FUZZ_CHECK(a.state == NULL && a.fp.data == NULL && a.op.data == NULL
                   && a.created == 0 && a.completed == 0 && a.status == 0,
                   "status: a reply that is no record set fields");
        return;
    }

    FUZZ_CHECK(rp->count == 6 && a.state && rv_is(&rp->el[0], a.state)
               && rv_eq(&a.fp, &rp->el[1]) && a.fp.len == 64
               && idem_is_hex(a.fp.data, 64)
               && rv_eq(&a.op, &rp->el[2]) && idem_is_hex(a.op.data, a.op.len),
               "status: state, fingerprint or operation id");
    FUZZ_CHECK(a.created == rv_time(&rp->el[3])
               && a.completed == rv_time(&rp->el[4]),
               "status: times are not elements 3 and 4");
    FUZZ_CHECK((a.status == 0 && rv_is(&rp->el[5], ""))
               || (a.status >= 200 && a.status <= 599
                   && a.status == rv_time(&rp->el[5])),
               "status: response status %d is not element 5", a.status);
    FUZZ_CHECK(a.status != 0 || strcmp(a.state, "completed") != 0,
               "status: completed without a response status");

    el[0] = rv_str(a.state, strlen(a.state));
    el[1] = a.fp;
    el[2] = a.op;
    el[3] = rv_num(t1, sizeof(t1), a.created);
    el[4] = rv_num(t2, sizeof(t2), a.completed);
    el[5] = a.status ? rv_num(st, sizeof(st), a.status) : rv_str("", 0);

    idem_status_decode(el, 6, &b);

    FUZZ_CHECK(status_eq(&a, &b), "status: rewritten answer decodes otherwise");
}


/*
 * Acceptance: a reply status.lua could give, built from the input (its
 * bytes pick the state, the times, the status, the operation id's length),
 * must decode as that record; the other properties only check what was
 * accepted.
 */
static void
check_status_accepts(const uint8_t *data, size_t size)
{
    static const char  *states[] = { "in_progress", "completed", "unknown" };
    static const char   hex[] = "0123456789abcdef";
    char                fp[64], op[64], t1[32], t2[32], st[16];
    size_t              i, oplen;
    long long           c, d;
    int                 status, none;
    idem_rv_t           el[IDEM_STATUS_ELEMS];
    idem_status_t       s;
    uint8_t             b[8] = { 0 };

    memcpy(b, data, size < sizeof(b) ? size : sizeof(b));

    for (i = 0; i < 64; i++) {
        fp[i] = hex[(b[i % 8] + i) & 15];
        op[i] = hex[(b[(i + 3) % 8] ^ i) & 15];
    }

    oplen = 1 + b[0] % 64;
    c = (b[1] & 1) ? -1 : (long long) (b[2] | (b[3] << 8)) * 1000003LL;
    d = (b[1] & 2) ? -1 : IDEM_TIME_MS_MAX - b[4];
    status = 200 + (b[5] | (b[6] << 8)) % 400;
    none = (b[1] & 4) && b[7] % 3 != 1;    /* no status, unless completed */

    el[0] = rv_str(states[b[7] % 3], strlen(states[b[7] % 3]));
    el[1] = rv_str(fp, 64);
    el[2] = rv_str(op, oplen);
    el[3] = rv_num(t1, sizeof(t1), c);
    el[4] = rv_num(t2, sizeof(t2), d);
    el[5] = none ? rv_str("", 0) : rv_num(st, sizeof(st), status);

    FUZZ_CHECK(idem_status_decode(el, 6, &s) == IDEM_STATUS_RECORD
               && s.created == c && s.completed == d
               && s.status == (none ? 0 : status)
               && s.op.len == oplen && strcmp(s.state, states[b[7] % 3]) == 0,
               "status: a well-formed record was not accepted as it is");
}


static void
check_admin(const fuzz_reply_t *rp)
{
    const char         *sa, *sb;
    idem_admin_kind_e   a, b;

    a = idem_admin_decode(rp->el, rp->count, &sa);
    b = idem_admin_decode(rp->el, rp->count, &sb);

    FUZZ_CHECK(a == b && sa == sb, "admin: not deterministic");

    switch (a) {

    case IDEM_ADMIN_REFUSED:
        FUZZ_CHECK(rp->count == 2 && sa && rv_is(&rp->el[1], sa)
                   && (strcmp(sa, "in_progress") == 0
                       || strcmp(sa, "completed") == 0)
                   && rv_is(&rp->el[0], "refused"),
                   "admin: refused shape");
        break;

    case IDEM_ADMIN_NONE:
    case IDEM_ADMIN_RELEASED:
    case IDEM_ADMIN_COMPLETED:
        FUZZ_CHECK(rp->count == 1 && sa == NULL
                   && rv_is(&rp->el[0], a == IDEM_ADMIN_NONE ? "none"
                            : a == IDEM_ADMIN_RELEASED ? "released"
                            : "completed"),
                   "admin: kind %d shape", a);
        break;

    default:
        FUZZ_CHECK(sa == NULL, "admin: an invalid answer set a state");
        break;
    }
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
    check_status(&rp);
    check_status_accepts(data, size);
    check_admin(&rp);

    reply_free(&rp);

    return 0;
}
