/*
 * libFuzzer target: the decoders of Redis's replies (idem_reply.h), i.e.
 * what the module accepts from Redis before it replays a stored response,
 * answers in-progress or retry-later, or takes the key (idem_claim_decode
 * for claim.lua, idem_claim_set_decode for SET ... NX GET), and what the
 * status and admin endpoints print (idem_status_decode, idem_admin_decode).
 *
 * The input is split at 0x00 bytes into up to 8 elements.  An element's
 * first byte picks its kind: 0x01 nil (the rest is ignored), 0x04 an
 * integer and 0x05 an array (both not strings, though the rest of the
 * element is kept as their bytes, so that a decoder reading a non-string
 * as a string is seen); any other element is a string of all its bytes.
 * The reply's element count is the number of elements, plus the value of
 * a trailing 0x02 0xNN marker; a single 0x03 byte is the empty reply.
 * Each decoder is given what the module gives it: the first min(count,
 * IDEM_*_ELEMS) elements (nil past the ones built), in an exact-size
 * array, each string in its own exact-size heap copy, so that ASan sees
 * any read past either.  SET's reply is the whole input, or nil when the
 * input is the single byte 0x01.
 *
 * Properties, for every input:
 *  - every decoder is deterministic, and gives the same answer when the
 *    non-string elements carry no bytes (it never reads them);
 *  - claim.lua: an answer that is not one of {"claimed"}, {"claimed", op
 *    (32 lowercase hex)[, approver (1..256 bytes)]}, {"record", v},
 *    {"in_progress", v, left}, {"released", v}, {"reused", v[, left]},
 *    {"locked", left | "", op | ""} sets nothing; "record" is a value that
 *    is not a marker, "released" one that is, "in_progress" a claim with
 *    1..lease ms left (element 2 in decimal), "reused" a completed 2xx or
 *    an unknown record without a lease or a claim with 1..lease ms left,
 *    "locked" no record, its lease element 1 in decimal (0 when empty)
 *    and its holder's id element 2 itself, 32 lowercase hex, or none when
 *    empty; the exact element count; the record is element 1 decoded
 *    (idem_value_decode), its pointers inside element 1 (an alias's target
 *    at its end), and it re-encodes to element 1 byte for byte; the answer
 *    written back as claim.lua writes it decodes the same; a completed
 *    record's headers iterate inside element 1;
 *  - SET: nil is "claimed", a value that decodes is "record" with that
 *    value, anything else "corrupt";
 *  - status.lua: "no record" exactly for the empty reply; a record is
 *    exactly {value, "0"|"1"}, {value, "0", state} for an alias, or
 *    {value, "0"|"1", lock} for a claim or an unknown record, the value a
 *    record that is not a marker, lapsed ("1") only for a claim, the
 *    state shown its state's name or "unknown" when lapsed; an alias's
 *    state is "" (none shown) or one of i c u a p (its name shown), and
 *    no other record has one; a lock is element 2 itself, a lock key's
 *    name (idem_is_key), and no other record has one; anything else
 *    sets nothing;
 *  - admin.lua: "refused" exactly with 2 elements and a state of
 *    in_progress, completed, awaiting_confirmation, approved or alias
 *    (element 1), the other answers with 1 element, the state set for
 *    "refused" only;
 *  - idem_close_decode maps 0, 1, 2 and nothing else;
 *  - idem_redirect (idem_slot.h: a cluster node's MOVED or ASK error,
 *    the whole input as its text): deterministic; an accepted answer has
 *    its word at the start, a slot below 16384, a port of 1..65535, an
 *    endpoint inside the text of printable bytes without a space, and the
 *    same fields come back when the answer is written again from them;
 *  - well-formed answers of each script built from the input's first
 *    bytes (a record of the right state, the lease left within it; reused
 *    of a 2xx, an unknown or a claim, locked with or without its lease
 *    and id, an alias's status with each state, the status of a claim,
 *    lapsed or not, or of an unknown record with its lock, admin refusing
 *    each state) are accepted with exactly their fields, so a decoder
 *    that refuses good answers fails too; reused of a completed 300..599
 *    is refused, and so is a lock's name a byte short or with the
 *    suffix of a record or of the key that names a lock.
 */

#include "idem_reply.h"
#include "idem_slot.h"

#include "fuzz_common.h"
#include "fuzz_value.h"


#define FUZZ_MAX_ELEMS  8


typedef struct {
    idem_rv_t   el[FUZZ_MAX_ELEMS];
    char       *copy[FUZZ_MAX_ELEMS];
    size_t      n;          /* elements built */
    size_t      count;      /* the reply's element count */
} fuzz_reply_t;


static const idem_rv_t  fuzz_nil = { NULL, 0, 0 };


static void
reply_build(fuzz_reply_t *rp, const uint8_t *data, size_t size)
{
    size_t          i, len, skip;
    const uint8_t  *p, *end, *z;

    memset(rp, 0, sizeof(*rp));

    end = data + size;

    if (size >= 2 && end[-2] == 0x02) {
        rp->count = end[-1];
        end -= 2;
    }

    for (p = data; p <= end && rp->n < FUZZ_MAX_ELEMS; p = z + 1) {
        z = memchr(p, 0, (size_t) (end - p));
        if (z == NULL) {
            z = end;
        }

        i = rp->n++;
        len = (size_t) (z - p);

        if (len > 0 && p[0] == 0x01) {
            rp->el[i] = fuzz_nil;

        } else {
            /* an integer or an array keeps the bytes after its kind */
            skip = (len > 0 && (p[0] == 0x04 || p[0] == 0x05)) ? 1 : 0;

            rp->copy[i] = fuzz_dup(p + skip, len - skip);
            rp->el[i].data = rp->copy[i];
            rp->el[i].len = len - skip;
            rp->el[i].is_str = !skip;
        }

        if (z == end) {
            break;
        }
    }

    rp->count += rp->n;

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


/*
 * The elements a decoder with room for max is given: the first
 * min(count, max), in an exact-size array; bare: non-strings without bytes.
 */
static idem_rv_t *
reply_elems(const fuzz_reply_t *rp, size_t max, int bare)
{
    size_t      i, m;
    idem_rv_t  *el;

    m = rp->count < max ? rp->count : max;

    el = malloc(m ? m * sizeof(idem_rv_t) : 1);
    if (el == NULL) {
        abort();
    }

    for (i = 0; i < m; i++) {
        el[i] = i < rp->n ? rp->el[i] : fuzz_nil;

        if (bare && !el[i].is_str) {
            el[i] = fuzz_nil;
        }
    }

    return el;
}


static int
rv_is(const idem_rv_t *v, const char *lit)
{
    return v->is_str && v->len == strlen(lit)
           && memcmp(v->data, lit, v->len) == 0;
}


static idem_rv_t
rv_str(const char *s, size_t len)
{
    idem_rv_t  v = { s, len, 1 };

    return v;
}


/* -------------------------------------------------------------- values */

static int
same_bytes(const char *a, size_t alen, const char *b, size_t blen)
{
    if (alen != blen || (a == NULL) != (b == NULL)) {
        return 0;
    }

    return alen == 0 || memcmp(a, b, alen) == 0;
}


/* the same record, by content (pointers may differ) */
static int
value_same(const idem_value_t *a, const idem_value_t *b)
{
    return a->state == b->state && a->waiters == b->waiters
           && same_bytes(a->op, a->op ? IDEM_TOKEN_LEN : 0,
                         b->op, b->op ? IDEM_TOKEN_LEN : 0)
           && same_bytes(a->fp, a->fp ? IDEM_FP_LEN : 0,
                         b->fp, b->fp ? IDEM_FP_LEN : 0)
           && same_bytes(a->owner, a->owner ? IDEM_TOKEN_LEN : 0,
                         b->owner, b->owner ? IDEM_TOKEN_LEN : 0)
           && a->created == b->created && a->completed == b->completed
           && a->unknown_at == b->unknown_at && a->lease_ms == b->lease_ms
           && a->ttl_ms == b->ttl_ms && a->status == b->status
           && a->stored == b->stored && a->resolved == b->resolved
           && a->retry_after == b->retry_after
           && a->expires == b->expires
           && a->approved_until == b->approved_until
           && same_bytes(a->approver, a->approver_len, b->approver,
                         b->approver_len)
           && same_bytes(a->hdr, a->hdr_len, b->hdr, b->hdr_len)
           && same_bytes(a->body, a->body_len, b->body, b->body_len)
           && same_bytes(a->target, a->target ? IDEM_RECORD_KEY_LEN : 0,
                         b->target, b->target ? IDEM_RECORD_KEY_LEN : 0);
}


/* the same record, at the same addresses */
static int
value_identical(const idem_value_t *a, const idem_value_t *b)
{
    return value_same(a, b) && a->op == b->op && a->fp == b->fp
           && a->owner == b->owner && a->hdr == b->hdr && a->body == b->body
           && a->approver == b->approver && a->target == b->target;
}


static int
value_unset(const idem_value_t *v)
{
    return v->state == 0 && v->op == NULL && v->fp == NULL
           && v->owner == NULL && v->hdr == NULL && v->body == NULL
           && v->approver == NULL && v->target == NULL && v->status == 0;
}


/* v in an exact-size buffer, as idem_value_encode writes it */
static char *
encode_exact(const idem_value_t *v, size_t *len)
{
    char  *buf, *end;

    *len = idem_value_len(v);
    buf = malloc(*len ? *len : 1);
    if (buf == NULL) {
        abort();
    }

    end = idem_value_encode(buf, v);

    FUZZ_CHECK((size_t) (end - buf) == *len,
               "idem_value_encode wrote %zu bytes, idem_value_len said %zu",
               (size_t) (end - buf), *len);

    return buf;
}


/* rec is what the decoder made of the string element e */
static void
check_rec_from(const idem_value_t *rec, const idem_rv_t *e, const char *what)
{
    char                *enc;
    size_t               len, name_len, value_len, steps;
    const char          *name, *value;
    idem_value_t         v;
    idem_hdrs_iter_t     it;

    FUZZ_CHECK(e->is_str && idem_value_decode(e->data, e->len, &v) == 0
               && value_identical(rec, &v),
               "%s: the record is not its element decoded", what);

    FUZZ_CHECK(idem_state_name(rec->state) != NULL
               && rec->op == e->data + IDEM_OP_OFF
               && rec->fp == e->data + IDEM_FP_OFF
               && (rec->owner == NULL
                   || rec->owner == e->data + IDEM_OWNER_OFF),
               "%s: the record's head is not in its element", what);

    FUZZ_CHECK((rec->state == 's')
               == (rec->target == e->data + e->len - 1 - IDEM_RECORD_KEY_LEN),
               "%s: an alias's target is not the end of its element", what);

    enc = encode_exact(rec, &len);

    FUZZ_CHECK(len == e->len && memcmp(enc, e->data, len) == 0,
               "%s: the record re-encodes otherwise: \"%s\"", what,
               fuzz_show(e->data, e->len));

    free(enc);

    if (rec->state != 'c') {
        return;
    }

    FUZZ_CHECK(rec->hdr >= e->data && rec->hdr_len < e->len
               && rec->hdr + rec->hdr_len <= e->data + e->len
               && rec->body >= e->data && rec->body_len < e->len
               && rec->body + rec->body_len <= e->data + e->len,
               "%s: headers or body outside the element", what);

    it.pos = rec->hdr;
    it.end = rec->hdr + rec->hdr_len;

    for (steps = 0; steps <= rec->hdr_len; steps++) {
        if (idem_hdrs_next(&it, &name, &name_len, &value, &value_len) != 1) {
            break;
        }

        FUZZ_CHECK(name >= rec->hdr && value + value_len <= it.end
                   && it.pos <= it.end,
                   "%s: a header pair lies outside the stored headers", what);
    }

    FUZZ_CHECK(steps <= rec->hdr_len, "%s: headers do not end", what);
}


/* a decimal string of 1..18 digits, or -1 */
static long long
rv_decimal(const idem_rv_t *v)
{
    size_t     i;
    long long  n;

    if (!v->is_str || v->len == 0 || v->len > 18) {
        return -1;
    }

    for (i = 0, n = 0; i < v->len; i++) {
        if (v->data[i] < '0' || v->data[i] > '9') {
            return -1;
        }
        n = n * 10 + (v->data[i] - '0');
    }

    return n;
}


/* ------------------------------------------------------------ claim.lua */

static int
claim_identical(const idem_claim_t *a, const idem_claim_t *b)
{
    return a->kind == b->kind && a->lease_left == b->lease_left
           && a->op == b->op && a->approver == b->approver
           && a->approver_len == b->approver_len
           && value_identical(&a->rec, &b->rec);
}


/* the lease ms left as claim.lua writes it: decimal, or "" for none */
static idem_rv_t
rv_lease(char *buf, size_t size, unsigned long long left, int empty)
{
    return rv_str(buf, empty ? 0 : (size_t) snprintf(buf, size, "%llu", left));
}


/* the answer as claim.lua writes it, from what was decoded */
static void
check_claim_rewrite(const idem_claim_t *c)
{
    char          *enc, lease[32];
    size_t         len, n;
    idem_rv_t      el[IDEM_CLAIM_ELEMS];
    idem_claim_t   again;

    enc = NULL;
    len = 0;

    if (c->kind != IDEM_CLAIM_CLAIMED && c->kind != IDEM_CLAIM_LOCKED
        && c->kind != IDEM_CLAIM_ELSEWHERE)
    {
        enc = encode_exact(&c->rec, &len);
        el[1] = rv_str(enc, len);
    }

    switch (c->kind) {

    case IDEM_CLAIM_LOCKED:
        el[0] = rv_str("locked", 6);
        el[1] = rv_lease(lease, sizeof(lease), c->lease_left,
                         c->lease_left == 0);
        el[2] = rv_str(c->op ? c->op : "",
                       c->op ? IDEM_TOKEN_LEN : 0);
        n = 3;
        break;

    case IDEM_CLAIM_REUSED:
        el[0] = rv_str("reused", 6);
        el[2] = rv_lease(lease, sizeof(lease), c->lease_left, 0);
        n = c->rec.state == 'i' ? 3 : 2;
        break;

    case IDEM_CLAIM_CLAIMED:
        el[0] = rv_str("claimed", 7);
        el[1] = rv_str(c->op ? c->op : "", c->op ? IDEM_TOKEN_LEN : 0);
        el[2] = rv_str(c->approver ? c->approver : "", c->approver_len);
        n = c->approver ? 3 : c->op ? 2 : 1;
        break;

    case IDEM_CLAIM_RECORD:
        el[0] = rv_str("record", 6);
        n = 2;
        break;

    case IDEM_CLAIM_ELSEWHERE:
        el[0] = rv_str("elsewhere", 9);
        n = 1;
        break;

    case IDEM_CLAIM_RELEASED:
        el[0] = rv_str("released", 8);
        n = 2;
        break;

    default:
        el[0] = rv_str("in_progress", 11);
        el[2] = rv_str(lease, (size_t) snprintf(lease, sizeof(lease), "%llu",
                                                c->lease_left));
        n = 3;
        break;
    }

    FUZZ_CHECK(idem_claim_decode(el, n, &again) == c->kind
               && again.lease_left == c->lease_left
               && value_same(&again.rec, &c->rec)
               && same_bytes(again.op, again.op ? IDEM_TOKEN_LEN : 0,
                             c->op, c->op ? IDEM_TOKEN_LEN : 0),
               "claim: kind %d written back decodes as %d", c->kind,
               again.kind);

    free(enc);
}


/*
 * {"reused", value}: a completed 2xx or an unknown operation; {"reused",
 * claim, left}: one in flight with 1..lease ms left
 */
static void
check_reused(const fuzz_reply_t *rp, const idem_rv_t *el,
    const idem_claim_t *a)
{
    FUZZ_CHECK(rv_is(&el[0], "reused") && a->op == NULL
               && ((rp->count == 2 && a->lease_left == 0
                    && (a->rec.state == 'u'
                        || (a->rec.state == 'c' && a->rec.status >= 200
                            && a->rec.status <= 299)))
                   || (rp->count == 3 && a->rec.state == 'i'
                       && a->lease_left >= 1
                       && a->lease_left
                          <= (unsigned long long) a->rec.lease_ms
                       && (long long) a->lease_left == rv_decimal(&el[2]))),
               "claim: reused is not {\"reused\", 2xx|unknown} or "
               "{\"reused\", claim, 1..lease_ms}");
    check_rec_from(&a->rec, &el[1], "claim reused");
}


/* {"locked", left | "", op | ""}: no record, the id inside element 2 */
static void
check_locked(const fuzz_reply_t *rp, const idem_rv_t *el,
    const idem_claim_t *a)
{
    FUZZ_CHECK(rp->count == 3 && rv_is(&el[0], "locked")
               && el[1].is_str && el[2].is_str && value_unset(&a->rec),
               "claim: locked is not {\"locked\", lease, op}");
    FUZZ_CHECK(el[1].len == 0 ? a->lease_left == 0
               : (long long) a->lease_left == rv_decimal(&el[1]),
               "claim: locked with lease \"%s\" gives %llu",
               fuzz_show(el[1].data, el[1].len), a->lease_left);
    FUZZ_CHECK(el[2].len == 0 ? a->op == NULL
               : (a->op == el[2].data && el[2].len == IDEM_TOKEN_LEN
                  && fuzz_lower_hex(a->op, IDEM_TOKEN_LEN)),
               "claim: locked with the id \"%s\"",
               fuzz_show(el[2].data, el[2].len));
}


static void
check_claim(const fuzz_reply_t *rp)
{
    idem_rv_t          *el, *bare;
    idem_claim_t        a, b;
    idem_claim_kind_e   kind;

    el = reply_elems(rp, IDEM_CLAIM_ELEMS, 0);
    bare = reply_elems(rp, IDEM_CLAIM_ELEMS, 1);

    kind = idem_claim_decode(el, rp->count, &a);
    idem_claim_decode(el, rp->count, &b);

    FUZZ_CHECK(kind == a.kind, "claim: returned %d, kind %d", kind, a.kind);
    FUZZ_CHECK(claim_identical(&a, &b), "claim: not deterministic");

    idem_claim_decode(bare, rp->count, &b);
    FUZZ_CHECK(claim_identical(&a, &b),
               "claim: the bytes of a non-string changed the answer");

    switch (kind) {

    case IDEM_CLAIM_CLAIMED:
        FUZZ_CHECK(rp->count >= 1 && rp->count <= 3
                   && rv_is(&el[0], "claimed")
                   && value_unset(&a.rec) && a.lease_left == 0
                   && (rp->count == 1) == (a.op == NULL)
                   && (rp->count == 3) == (a.approver != NULL),
                   "claim: claimed is not {\"claimed\"[, op[, approver]]}");
        if (a.op) {
            FUZZ_CHECK(a.op == el[1].data && el[1].len == IDEM_TOKEN_LEN
                       && idem_is_hex(a.op, IDEM_TOKEN_LEN),
                       "claim: a claimed proposal's id is not 32 hex");
        }
        if (a.approver) {
            FUZZ_CHECK(a.approver == el[2].data
                       && a.approver_len == el[2].len && a.approver_len > 0
                       && a.approver_len <= IDEM_APPROVER_MAX,
                       "claim: a claimed proposal's approver is off");
        }
        break;

    case IDEM_CLAIM_RECORD:
        FUZZ_CHECK(rp->count == 2 && rv_is(&el[0], "record")
                   && a.rec.state != 'r' && a.lease_left == 0,
                   "claim: record is not {\"record\", value}");
        check_rec_from(&a.rec, &el[1], "claim record");
        break;

    case IDEM_CLAIM_IN_PROGRESS:
        FUZZ_CHECK(rp->count == 3 && rv_is(&el[0], "in_progress")
                   && a.rec.state == 'i' && a.lease_left >= 1
                   && a.lease_left <= (unsigned long long) a.rec.lease_ms
                   && (long long) a.lease_left == rv_decimal(&el[2]),
                   "claim: in_progress is not {\"in_progress\", claim, "
                   "1..lease_ms}");
        check_rec_from(&a.rec, &el[1], "claim in_progress");
        break;

    case IDEM_CLAIM_RELEASED:
        FUZZ_CHECK(rp->count == 2 && rv_is(&el[0], "released")
                   && a.rec.state == 'r' && a.lease_left == 0,
                   "claim: released is not {\"released\", marker}");
        check_rec_from(&a.rec, &el[1], "claim released");
        break;

    case IDEM_CLAIM_REUSED:
        check_reused(rp, el, &a);
        break;

    case IDEM_CLAIM_LOCKED:
        check_locked(rp, el, &a);
        break;

    case IDEM_CLAIM_ELSEWHERE:
        FUZZ_CHECK(rp->count == 1 && rv_is(&el[0], "elsewhere")
                   && value_unset(&a.rec) && a.op == NULL,
                   "claim: elsewhere is not {\"elsewhere\"} alone");
        break;

    default:
        FUZZ_CHECK(kind == IDEM_CLAIM_INVALID || kind == IDEM_CLAIM_CORRUPT,
                   "claim: kind %d", kind);
        FUZZ_CHECK(value_unset(&a.rec) && a.lease_left == 0
                   && a.op == NULL,
                   "claim: a refused answer set fields");
        free(bare);
        free(el);
        return;
    }

    check_claim_rewrite(&a);

    free(bare);
    free(el);
}


/* SET key value NX PX ttl GET: nil, or the value that holds the key */
static void
check_set(const uint8_t *data, size_t size)
{
    char               *copy;
    idem_rv_t           e;
    idem_claim_t        a, b;
    idem_claim_kind_e   kind;
    idem_value_t        v;

    copy = (size == 1 && data[0] == 0x01) ? NULL : fuzz_dup(data, size);

    kind = idem_claim_set_decode(copy, size, &a);
    idem_claim_set_decode(copy, size, &b);

    FUZZ_CHECK(kind == a.kind && claim_identical(&a, &b),
               "SET: not deterministic");

    if (copy == NULL) {
        FUZZ_CHECK(kind == IDEM_CLAIM_CLAIMED && value_unset(&a.rec),
                   "SET: nil is not the claim made");
        return;
    }

    if (idem_value_decode(copy, size, &v) == 0) {
        FUZZ_CHECK(kind == IDEM_CLAIM_RECORD,
                   "SET: a record gives kind %d", kind);
        e = rv_str(copy, size);
        check_rec_from(&a.rec, &e, "SET");

    } else {
        FUZZ_CHECK(kind == IDEM_CLAIM_CORRUPT && value_unset(&a.rec),
                   "SET: a value that is no record gives kind %d", kind);
    }

    free(copy);
}


/* ----------------------------------------------------------- status.lua */

static int
status_identical(const idem_status_t *a, const idem_status_t *b)
{
    return a->kind == b->kind && a->state == b->state
           && a->alias_state == b->alias_state && a->lock == b->lock
           && value_identical(&a->rec, &b->rec);
}


/*
 * An alias's third element: "" (its operation holds nothing any more) or
 * the letter of a state that operation's key can hold: not a marker, not
 * an alias.
 */
static const char *
alias_state_of(const idem_rv_t *e)
{
    if (!e->is_str || e->len > 1) {
        return "(refused)";
    }

    if (e->len == 0) {
        return NULL;
    }

    return memchr("icuap", e->data[0], 5) ? idem_state_name(e->data[0])
                                          : "(refused)";
}


static void
check_status(const fuzz_reply_t *rp)
{
    int                  lapsed;
    idem_rv_t           *el, *bare;
    idem_status_t        a, b;
    idem_status_kind_e   kind;

    el = reply_elems(rp, IDEM_STATUS_ELEMS, 0);
    bare = reply_elems(rp, IDEM_STATUS_ELEMS, 1);

    kind = idem_status_decode(el, rp->count, &a);
    idem_status_decode(el, rp->count, &b);

    FUZZ_CHECK(kind == a.kind && status_identical(&a, &b),
               "status: not deterministic");

    idem_status_decode(bare, rp->count, &b);
    FUZZ_CHECK(status_identical(&a, &b),
               "status: the bytes of a non-string changed the answer");

    FUZZ_CHECK((kind == IDEM_STATUS_NONE) == (rp->count == 0),
               "status: 'no record' is not exactly the empty reply");

    if (kind != IDEM_STATUS_RECORD) {
        FUZZ_CHECK((kind == IDEM_STATUS_NONE || kind == IDEM_STATUS_INVALID)
                   && a.state == NULL && a.alias_state == NULL
                   && a.lock == NULL && value_unset(&a.rec),
                   "status: a reply that is no record set fields");
        free(bare);
        free(el);
        return;
    }

    lapsed = rv_is(&el[1], "1");

    FUZZ_CHECK(rp->count == (a.rec.state == 's' || a.lock ? 3 : 2)
               && (lapsed || rv_is(&el[1], "0"))
               && a.rec.state != 'r' && (!lapsed || a.rec.state == 'i'),
               "status: a record is not {value, \"0\"|\"1\"[, alias "
               "| lock]}");
    FUZZ_CHECK(a.lock == NULL
               || ((a.rec.state == 'i' || a.rec.state == 'u')
                   && a.lock == el[2].data && el[2].is_str
                   && idem_is_key(el[2].data, el[2].len, IDEM_LOCK_SUFFIX)),
               "status: a lock for '%c' that is not element 2, a lock key",
               a.rec.state);
    FUZZ_CHECK(a.rec.state == 's'
               ? (a.alias_state == NULL ? el[2].is_str && el[2].len == 0
                  : alias_state_of(&el[2]) != NULL
                    && strcmp(a.alias_state, alias_state_of(&el[2])) == 0)
               : a.alias_state == NULL,
               "status: alias state \"%s\" for '%c'",
               a.alias_state ? a.alias_state : "(null)", a.rec.state);
    FUZZ_CHECK(a.state != NULL
               && strcmp(a.state, idem_state_name(lapsed ? 'u'
                                                  : a.rec.state)) == 0,
               "status: state shown \"%s\" for '%c' (lapsed %d)",
               a.state ? a.state : "(null)", a.rec.state, lapsed);

    check_rec_from(&a.rec, &el[0], "status");

    free(bare);
    free(el);
}


/* ------------------------------------------------------------ admin.lua */

static void
check_admin(const fuzz_reply_t *rp)
{
    idem_rv_t          *el, *bare;
    const char         *sa, *sb;
    idem_admin_kind_e   a, b;

    el = reply_elems(rp, IDEM_ADMIN_ELEMS, 0);
    bare = reply_elems(rp, IDEM_ADMIN_ELEMS, 1);

    a = idem_admin_decode(el, rp->count, &sa);
    b = idem_admin_decode(el, rp->count, &sb);

    FUZZ_CHECK(a == b && sa == sb, "admin: not deterministic");

    b = idem_admin_decode(bare, rp->count, &sb);
    FUZZ_CHECK(a == b && sa == sb,
               "admin: the bytes of a non-string changed the answer");

    switch (a) {

    case IDEM_ADMIN_REFUSED:
        FUZZ_CHECK(rp->count == 2 && sa && rv_is(&el[1], sa)
                   && (strcmp(sa, "in_progress") == 0
                       || strcmp(sa, "completed") == 0
                       || strcmp(sa, "awaiting_confirmation") == 0
                       || strcmp(sa, "approved") == 0
                       || strcmp(sa, "alias") == 0)
                   && rv_is(&el[0], "refused"),
                   "admin: refused shape");
        break;

    case IDEM_ADMIN_NONE:
    case IDEM_ADMIN_RELEASED:
    case IDEM_ADMIN_COMPLETED:
        FUZZ_CHECK(rp->count == 1 && sa == NULL
                   && rv_is(&el[0], a == IDEM_ADMIN_NONE ? "none"
                            : a == IDEM_ADMIN_RELEASED ? "released"
                            : "completed"),
                   "admin: kind %d shape", a);
        break;

    default:
        FUZZ_CHECK(a == IDEM_ADMIN_INVALID && sa == NULL,
                   "admin: an invalid answer set a state");
        break;
    }

    free(bare);
    free(el);
}


static void
check_close(const uint8_t *data, size_t size)
{
    long long          n;
    size_t             i;
    idem_close_kind_e  k;

    n = 0;
    for (i = 0; i < size && i < 8; i++) {
        n = (long long) (((unsigned long long) n << 8) | data[i]);
    }

    /* the small numbers, too */
    n = (size && data[0] < 8) ? (long long) data[0] - 2 : n;

    k = idem_close_decode(n);

    FUZZ_CHECK(k == (n == 0 ? IDEM_CLOSE_NOT_HELD : n == 1 ? IDEM_CLOSE_DONE
                     : n == 2 ? IDEM_CLOSE_MARKED : IDEM_CLOSE_INVALID),
               "close: %lld gives %d", n, k);
}


static int
fuzz_printable(const char *p, size_t len)
{
    size_t  i;

    for (i = 0; i < len; i++) {
        if ((unsigned char) p[i] <= 0x20 || (unsigned char) p[i] >= 0x7f) {
            return 0;
        }
    }

    return 1;
}


static void
check_redirect(const uint8_t *data, size_t size)
{
    int               ok1, ok2;
    char             *text, again[64 + 64];
    size_t            n;
    idem_redirect_t   r, r2;

    text = fuzz_dup(data, size);
    ok1 = idem_redirect(text, size, &r);
    ok2 = idem_redirect(text, size, &r2);

    FUZZ_CHECK(ok1 == ok2
               && (!ok1 || (r.ask == r2.ask && r.slot == r2.slot
                            && r.host == r2.host && r.host_len == r2.host_len
                            && r.port == r2.port)),
               "redirect: not deterministic");

    if (ok1) {
        FUZZ_CHECK(r.slot < IDEM_SLOTS && r.port >= 1 && r.port <= 65535
                   && r.host >= text && r.host + r.host_len <= text + size
                   && fuzz_printable(r.host, r.host_len)
                   && memcmp(text, r.ask ? "ASK " : "MOVED ",
                             r.ask ? 4 : 6) == 0,
                   "redirect: accepted fields out of shape");

        if (r.host_len <= 64) {
            n = (size_t) snprintf(again, sizeof(again), "%s %u %.*s:%d",
                                  r.ask ? "ASK" : "MOVED", r.slot,
                                  (int) r.host_len, r.host, r.port);
            FUZZ_CHECK(idem_redirect(again, n, &r2) && r2.ask == r.ask
                       && r2.slot == r.slot && r2.port == r.port
                       && r2.host_len == r.host_len
                       && memcmp(r2.host, r.host, r.host_len) == 0,
                       "redirect: written again, \"%s\" reads otherwise",
                       again);
        }
    }

    free(text);
}


/* ----------------------------------------- good answers, from the input */


static void
check_accepts(const uint8_t *data, size_t size)
{
    static const char   states[] = "icur", held[] = "icu";
    char               *enc, lease[32];
    size_t              len;
    unsigned            b;
    long long           left;
    const char         *sstate;
    idem_rv_t           el[IDEM_CLAIM_ELEMS];
    fuzz_value_t        fv;
    idem_claim_t        c;
    idem_status_t       s;
    fuzz_reader_t       r = { data, size, 0 };

    b = rd8(&r);

    /* claim.lua */
    fuzz_value_from_input(&r, states[b & 3], rd8(&r), &fv);
    enc = encode_exact(&fv.v, &len);
    el[1] = rv_str(enc, len);

    switch (b & 3) {

    case 0:
        left = rd_num(&r, 1, fv.v.lease_ms);
        el[0] = rv_str("in_progress", 11);
        el[2] = rv_str(lease, (size_t) snprintf(lease, sizeof(lease), "%lld",
                                                left));
        FUZZ_CHECK(idem_claim_decode(el, 3, &c) == IDEM_CLAIM_IN_PROGRESS
                   && (long long) c.lease_left == left
                   && value_same(&c.rec, &fv.v),
                   "claim: a good in_progress answer was not accepted: %s",
                   fuzz_show(enc, len));

        /* the same claim as "record" (another fingerprint) */
        el[0] = rv_str("record", 6);
        FUZZ_CHECK(idem_claim_decode(el, 2, &c) == IDEM_CLAIM_RECORD
                   && value_same(&c.rec, &fv.v),
                   "claim: a good record answer (a claim) was not accepted");
        break;

    case 3:
        el[0] = rv_str("released", 8);
        FUZZ_CHECK(idem_claim_decode(el, 2, &c) == IDEM_CLAIM_RELEASED
                   && value_same(&c.rec, &fv.v),
                   "claim: a good released answer was not accepted: %s",
                   fuzz_show(enc, len));
        break;

    default:
        el[0] = rv_str("record", 6);
        FUZZ_CHECK(idem_claim_decode(el, 2, &c) == IDEM_CLAIM_RECORD
                   && value_same(&c.rec, &fv.v),
                   "claim: a good record answer was not accepted: %s",
                   fuzz_show(enc, len));
        break;
    }

    FUZZ_CHECK(idem_claim_set_decode(enc, len, &c) == IDEM_CLAIM_RECORD
               && value_same(&c.rec, &fv.v),
               "SET: a good value was not accepted: %s", fuzz_show(enc, len));

    el[0] = rv_str("claimed", 7);
    FUZZ_CHECK(idem_claim_decode(el, 1, &c) == IDEM_CLAIM_CLAIMED,
               "claim: {\"claimed\"} was not accepted");

    free(enc);

    /* status.lua: a record that is no marker, lapsed only when a claim */
    r.i = 1;
    fuzz_value_from_input(&r, held[(b >> 2) % 3], rd8(&r), &fv);
    enc = encode_exact(&fv.v, &len);
    el[0] = rv_str(enc, len);
    el[1] = rv_str((fv.v.state == 'i' && (b & 0x40)) ? "1" : "0", 1);
    sstate = idem_state_name(rv_is(&el[1], "1") ? 'u' : fv.v.state);

    FUZZ_CHECK(idem_status_decode(el, 2, &s) == IDEM_STATUS_RECORD
               && value_same(&s.rec, &fv.v) && s.state != NULL
               && strcmp(s.state, sstate) == 0,
               "status: a good answer was not accepted: %s",
               fuzz_show(enc, len));

    free(enc);
}


/*
 * idempotency_lock at the status endpoint: an operation in progress
 * (live or lapsed) or unknown with the name of the lock key it holds is
 * accepted with exactly that name; the same name with another suffix
 * (the record's, its sibling h's) or a byte short is refused
 */
static void
check_accepts_lock(const uint8_t *data, size_t size)
{
    static const char   states[] = "iu";
    char               *enc, name[IDEM_RECORD_KEY_LEN + 1];
    size_t              len;
    unsigned            b;
    const char         *shown;
    idem_rv_t           el[IDEM_STATUS_ELEMS];
    fuzz_value_t        fv;
    idem_status_t       s;
    fuzz_reader_t       r = { data, size, 0 };

    b = rd8(&r);

    fuzz_value_from_input(&r, states[b & 1], rd8(&r), &fv);
    enc = encode_exact(&fv.v, &len);

    memcpy(name, IDEM_RECORD_PREFIX, sizeof(IDEM_RECORD_PREFIX) - 1);
    rd_hex(&r, name + sizeof(IDEM_RECORD_PREFIX) - 1, 32);
    memcpy(name + sizeof(IDEM_RECORD_PREFIX) - 1 + 32, IDEM_LOCK_SUFFIX,
           sizeof(IDEM_LOCK_SUFFIX));

    el[0] = rv_str(enc, len);
    el[1] = rv_str((fv.v.state == 'i' && (b & 2)) ? "1" : "0", 1);
    el[2] = rv_str(name, IDEM_RECORD_KEY_LEN);
    shown = idem_state_name(rv_is(&el[1], "1") ? 'u' : fv.v.state);

    FUZZ_CHECK(idem_status_decode(el, 3, &s) == IDEM_STATUS_RECORD
               && value_same(&s.rec, &fv.v) && s.lock == name
               && s.alias_state == NULL && s.state != NULL
               && strcmp(s.state, shown) == 0,
               "status: a good answer with a lock was not accepted: %s %s",
               fuzz_show(enc, len), name);

    el[2] = rv_str(name, IDEM_RECORD_KEY_LEN - 1);
    FUZZ_CHECK(idem_status_decode(el, 3, &s) == IDEM_STATUS_INVALID
               && s.lock == NULL,
               "status: a lock name a byte short was accepted");

    el[2] = rv_str(name, IDEM_RECORD_KEY_LEN);
    name[IDEM_RECORD_KEY_LEN - 1] = (b & 4) ? 'r' : 'h';
    FUZZ_CHECK(idem_status_decode(el, 3, &s) == IDEM_STATUS_INVALID
               && s.lock == NULL,
               "status: %s was accepted as a lock", name);

    free(enc);
}


/*
 * idempotency_unique and idempotency_lock: {"reused", ...} of each state
 * that holds an identity (and not of a completed non-2xx), {"locked", ...}
 * with and without its lease and id, status.lua's answer for an alias
 * (and the alias as "record", of another fingerprint), admin.lua refusing
 * each state it refuses
 */
static void
check_accepts_business(const uint8_t *data, size_t size)
{
    static const char   holds[] = "cui", letters[] = "icuap";
    static const char  *refused[] = { "in_progress", "completed",
                                      "awaiting_confirmation", "approved",
                                      "alias" };
    char               *enc, lease[32], op[IDEM_TOKEN_LEN];
    size_t              len, pick;
    unsigned            b;
    long long           left;
    const char         *st;
    idem_rv_t           el[IDEM_CLAIM_ELEMS];
    fuzz_value_t        fv;
    idem_claim_t        c;
    idem_status_t       s;
    fuzz_reader_t       r = { data, size, 0 };

    b = rd8(&r);

    fuzz_value_from_input(&r, holds[b % 3], rd8(&r), &fv);
    fv.v.status = fv.v.state == 'c' ? 200 + fv.v.status % 100 : 0;
    left = fv.v.state == 'i' ? rd_num(&r, 1, fv.v.lease_ms) : 0;
    enc = encode_exact(&fv.v, &len);
    el[0] = rv_str("reused", 6);
    el[1] = rv_str(enc, len);
    el[2] = rv_lease(lease, sizeof(lease), (unsigned long long) left, 0);

    FUZZ_CHECK(idem_claim_decode(el, fv.v.state == 'i' ? 3 : 2, &c)
               == IDEM_CLAIM_REUSED && (long long) c.lease_left == left
               && c.op == NULL && value_same(&c.rec, &fv.v),
               "claim: a good reused answer was not accepted: %s",
               fuzz_show(enc, len));
    free(enc);

    if (fv.v.state == 'c') {
        fv.v.status = 300 + (int) (b % 300);
        enc = encode_exact(&fv.v, &len);
        el[1] = rv_str(enc, len);
        FUZZ_CHECK(idem_claim_decode(el, 2, &c) == IDEM_CLAIM_INVALID,
                   "claim: reused with a completed %d", fv.v.status);
        free(enc);
    }

    rd_hex(&r, op, IDEM_TOKEN_LEN);
    left = (b & 8) ? 0 : rd_num(&r, 1, IDEM_TIME_MS_MAX);
    el[0] = rv_str("locked", 6);
    el[1] = rv_lease(lease, sizeof(lease), (unsigned long long) left,
                     left == 0);
    el[2] = rv_str(op, (b & 16) ? 0 : IDEM_TOKEN_LEN);

    FUZZ_CHECK(idem_claim_decode(el, 3, &c) == IDEM_CLAIM_LOCKED
               && (long long) c.lease_left == left
               && c.op == ((b & 16) ? NULL : op) && value_unset(&c.rec),
               "claim: a good locked answer was not accepted (lease %lld, "
               "id %s)", left, (b & 16) ? "none" : "given");

    fuzz_value_from_input(&r, 's', rd8(&r), &fv);
    enc = encode_exact(&fv.v, &len);
    pick = (b >> 5) % 6;
    el[0] = rv_str(enc, len);
    el[1] = rv_str("0", 1);
    el[2] = rv_str(letters + pick, pick < 5 ? 1 : 0);

    FUZZ_CHECK(idem_status_decode(el, 3, &s) == IDEM_STATUS_RECORD
               && value_same(&s.rec, &fv.v) && s.state != NULL
               && strcmp(s.state, "alias") == 0
               && (pick == 5 ? s.alias_state == NULL
                   : s.alias_state != NULL
                     && strcmp(s.alias_state, alias_state_of(&el[2])) == 0),
               "status: a good answer for an alias was not accepted: %s",
               fuzz_show(enc, len));

    el[0] = rv_str("record", 6);
    el[1] = rv_str(enc, len);
    FUZZ_CHECK(idem_claim_decode(el, 2, &c) == IDEM_CLAIM_RECORD
               && value_same(&c.rec, &fv.v),
               "claim: an alias as record was not accepted: %s",
               fuzz_show(enc, len));
    free(enc);

    el[0] = rv_str("refused", 7);
    el[1] = rv_str(refused[b % 5], strlen(refused[b % 5]));
    FUZZ_CHECK(idem_admin_decode(el, 2, &st) == IDEM_ADMIN_REFUSED
               && st != NULL && strcmp(st, refused[b % 5]) == 0,
               "admin: refused %s was not accepted", refused[b % 5]);
}


int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fuzz_reply_t  rp;

    reply_build(&rp, data, size);

    check_claim(&rp);
    check_status(&rp);
    check_admin(&rp);
    check_set(data, size);
    check_close(data, size);
    check_redirect(data, size);
    check_accepts(data, size);
    check_accepts_business(data, size);
    check_accepts_lock(data, size);

    reply_free(&rp);

    return 0;
}
