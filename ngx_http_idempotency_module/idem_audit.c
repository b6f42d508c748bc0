/*
 * Entries of the audit stream: encoding, hash, decoding and the checks of
 * idempotency-audit verify (idem_audit.h, docs/audit.md).
 */

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <openssl/evp.h>
#include <openssl/hmac.h>

#include "idem_audit.h"
#include "idem_record.h"
#include "idem_text.h"


const char  idem_audit_genesis[IDEM_AUDIT_HASH_LEN + 1] =
    "0000000000000000000000000000000000000000000000000000000000000000";

static const char  *idem_audit_events[IDEM_AUDIT_NEVENTS] = {
    "attempted", "confirmation_required", "approved", "sent", "accepted",
    "completed", "replayed", "reused", "conflict", "in_progress", "unknown",
    "released", "resolved", "declined"
};


const char *
idem_audit_event_name(idem_audit_event_e event)
{
    return (unsigned) event < IDEM_AUDIT_NEVENTS ? idem_audit_events[event]
                                                  : NULL;
}


int
idem_audit_event_parse(const char *name, size_t len)
{
    int  i;

    for (i = 0; i < IDEM_AUDIT_NEVENTS; i++) {
        if (strlen(idem_audit_events[i]) == len
            && memcmp(idem_audit_events[i], name, len) == 0)
        {
            return i;
        }
    }

    return -1;
}


/* n in decimal into buf (at least 21 bytes); its length */
static size_t
idem_audit_dec(uint64_t n, char *buf)
{
    return (size_t) snprintf(buf, 21, "%llu", (unsigned long long) n);
}


static size_t
idem_audit_status(int status, char *buf)
{
    return status > 0 ? (size_t) snprintf(buf, 4, "%03d", status % 1000) : 0;
}


/* the fields after seq, time and prev, in encoding order */
static void
idem_audit_strings(const idem_audit_entry_t *e, idem_str_t s[9])
{
    s[0] = e->op;
    s[1] = e->key;
    s[2] = e->fp;
    s[3] = e->route;
    s[4] = e->identity;
    s[5] = e->approver;
    s[6] = e->response;
    s[7] = e->ref;
    s[8] = e->request;
}


/* the encoding's length with seq and time of these many digits */
static size_t
idem_audit_len_with(const idem_audit_entry_t *e, size_t seq_digits,
    size_t time_digits, size_t prev_len)
{
    size_t       len, i;
    char         st[4];
    idem_str_t   s[9];

    idem_audit_strings(e, s);

    len = idem_netstring_len(sizeof(IDEM_AUDIT_VERSION) - 1)
          + idem_netstring_len(seq_digits) + idem_netstring_len(time_digits)
          + idem_netstring_len(prev_len)
          + idem_netstring_len(strlen(idem_audit_event_name(e->event)))
          + idem_netstring_len(idem_audit_status(e->status, st));

    for (i = 0; i < 9; i++) {
        len += idem_netstring_len(s[i].len);
    }

    return len;
}


size_t
idem_audit_encoded_len(const idem_audit_entry_t *e)
{
    char  buf[24];

    return idem_audit_len_with(e, idem_audit_dec(e->seq, buf),
                               idem_audit_dec((uint64_t) e->time, buf),
                               e->prev.len);
}


size_t
idem_audit_encoded_max(const idem_audit_entry_t *e)
{
    return idem_audit_len_with(e, IDEM_AUDIT_NUM_MAX + 1,
                               IDEM_AUDIT_NUM_MAX + 1, IDEM_AUDIT_PREV_MAX);
}


char *
idem_audit_encode(char *p, const idem_audit_entry_t *e)
{
    char         buf[24];
    size_t       i;
    const char  *name;
    idem_str_t   s[9];

    name = idem_audit_event_name(e->event);
    idem_audit_strings(e, s);

    p = idem_netstring_put(p, IDEM_AUDIT_VERSION,
                           sizeof(IDEM_AUDIT_VERSION) - 1);
    p = idem_netstring_put(p, buf, idem_audit_dec(e->seq, buf));
    p = idem_netstring_put(p, buf, idem_audit_dec((uint64_t) e->time, buf));
    p = idem_netstring_put(p, e->prev.data, e->prev.len);
    p = idem_netstring_put(p, name, strlen(name));

    for (i = 0; i < 4; i++) {
        p = idem_netstring_put(p, s[i].data, s[i].len);
    }

    p = idem_netstring_put(p, buf, idem_audit_status(e->status, buf));

    for (i = 4; i < 9; i++) {
        p = idem_netstring_put(p, s[i].data, s[i].len);
    }

    return p;
}


/* decimal without leading zeros, at most IDEM_AUDIT_NUM_MAX digits */
static int
idem_audit_num(const char *p, size_t len, uint64_t *n)
{
    size_t  i;

    if (len == 0 || len > IDEM_AUDIT_NUM_MAX || (p[0] == '0' && len > 1)) {
        return -1;
    }

    *n = 0;

    for (i = 0; i < len; i++) {
        if (p[i] < '0' || p[i] > '9') {
            return -1;
        }

        *n = *n * 10 + (uint64_t) (p[i] - '0');
    }

    return 0;
}


/* "" or exactly len lowercase hex */
static int
idem_audit_hex_or_empty(const idem_str_t *s, size_t len)
{
    return s->len == 0 || (s->len == len && idem_is_hex(s->data, s->len));
}


static int
idem_audit_status_parse(const idem_str_t *s, int *status)
{
    uint64_t  n;

    *status = 0;

    if (s->len == 0) {
        return 0;
    }

    if (s->len != 3 || s->data[0] == '0'
        || idem_audit_num(s->data, s->len, &n) != 0)
    {
        return -1;
    }

    *status = (int) n;

    return 0;
}


/* the fifteen netstrings, each at most IDEM_AUDIT_FIELD_MAX */
static int
idem_audit_split(const char *p, size_t len, idem_str_t f[IDEM_AUDIT_FIELDS])
{
    size_t            i;
    idem_hdrs_iter_t  it;

    it.pos = p;
    it.end = p + len;

    for (i = 0; i < IDEM_AUDIT_FIELDS; i++) {
        if (idem_netstring_get(&it, &f[i].data, &f[i].len,
                               IDEM_AUDIT_FIELD_MAX) != 0)
        {
            return -1;
        }
    }

    return it.pos == it.end ? 0 : -1;
}


int
idem_audit_decode(const char *p, size_t len, idem_audit_entry_t *e)
{
    int         ev;
    uint64_t    time;
    idem_str_t  f[IDEM_AUDIT_FIELDS], status;

    memset(e, 0, sizeof(idem_audit_entry_t));

    if (idem_audit_split(p, len, f) != 0
        || f[0].len != sizeof(IDEM_AUDIT_VERSION) - 1
        || memcmp(f[0].data, IDEM_AUDIT_VERSION, f[0].len) != 0
        || idem_audit_num(f[1].data, f[1].len, &e->seq) != 0 || e->seq == 0
        || idem_audit_num(f[2].data, f[2].len, &time) != 0
        || f[3].len > IDEM_AUDIT_PREV_MAX
        || (ev = idem_audit_event_parse(f[4].data, f[4].len)) < 0)
    {
        return -1;
    }

    e->time = (int64_t) time;
    e->prev = f[3];
    e->event = (idem_audit_event_e) ev;
    e->op = f[5];
    e->key = f[6];
    e->fp = f[7];
    e->route = f[8];
    status = f[9];
    e->identity = f[10];
    e->approver = f[11];
    e->response = f[12];
    e->ref = f[13];
    e->request = f[14];

    if (!idem_audit_hex_or_empty(&e->op, IDEM_TOKEN_LEN)
        || !idem_audit_hex_or_empty(&e->fp, IDEM_FP_LEN)
        || !idem_audit_hex_or_empty(&e->response, IDEM_AUDIT_HASH_LEN)
        || !idem_audit_hex_or_empty(&e->request, IDEM_TOKEN_LEN)
        || idem_audit_status_parse(&status, &e->status) != 0)
    {
        return -1;
    }

    return 0;
}


int
idem_audit_hash(const char *enc, size_t len, const unsigned char *key,
    size_t key_len, char hex[IDEM_AUDIT_HASH_LEN + 1])
{
    unsigned int    n;
    unsigned char   md[EVP_MAX_MD_SIZE];

    if (key) {
        if (HMAC(EVP_sha256(), key, (int) key_len, (const unsigned char *) enc,
                 len, md, &n) == NULL)
        {
            return -1;
        }

    } else if (EVP_Digest(enc, len, md, &n, idem_sha256(), NULL) != 1) {
        return -1;
    }

    if (n != IDEM_AUDIT_HASH_LEN / 2) {
        return -1;
    }

    idem_hex(md, n, hex);

    return 0;
}


/* ---------------------------------------------------------- verify */

static const char  *idem_audit_faults[] = {
    "intact", "modified", "missing", "inserted", "reordered", "wrong HMAC"
};


const char *
idem_audit_fault_name(idem_audit_fault_e fault)
{
    return (unsigned) fault <= IDEM_AUDIT_WRONG_HMAC ? idem_audit_faults[fault]
                                                     : "?";
}


uint64_t
idem_audit_id_seq(const char *id, size_t len)
{
    uint64_t  n;

    if (len < 3 || id[len - 2] != '-' || id[len - 1] != '0'
        || idem_audit_num(id, len - 2, &n) != 0)
    {
        return 0;
    }

    return n;
}


void
idem_audit_verify_init(idem_audit_verify_t *v, const unsigned char *key,
    size_t key_len)
{
    memset(v, 0, sizeof(idem_audit_verify_t));

    v->key = key;
    v->key_len = key_len;

    /* the head of no entry, as verify --allow-empty prints it */
    memcpy(v->hex, idem_audit_genesis, IDEM_AUDIT_HASH_LEN + 1);
}


__attribute__((format(printf, 4, 5)))
static int
idem_audit_fault(idem_audit_verify_t *v, idem_audit_fault_e fault,
    uint64_t seq, const char *fmt, ...)
{
    va_list  ap;

    v->fault = fault;
    v->fault_seq = seq;

    va_start(ap, fmt);
    vsnprintf(v->why, sizeof(v->why), fmt, ap);
    va_end(ap);

    return -1;
}


static int
idem_audit_same(const char *a, size_t a_len, const idem_str_t *b)
{
    return a_len == b->len && memcmp(a, b->data, a_len) == 0;
}


/* the first entry's prev: 64 '0' (version 1) or 32 zero bytes (2) */
static int
idem_audit_genesis_of(const idem_str_t *prev, int version)
{
    static const char  zeros[IDEM_AUDIT_DIGEST_LEN];

    return version == 1
           ? idem_audit_same(idem_audit_genesis, IDEM_AUDIT_HASH_LEN, prev)
           : idem_audit_same(zeros, IDEM_AUDIT_DIGEST_LEN, prev);
}


/*
 * The entry's place: written as the entry its ID names, right after the
 * last one read, chained on it.  An entry chained on the one before the
 * last shows that the last was put in between.
 */
static int
idem_audit_verify_place(idem_audit_verify_t *v, uint64_t seq,
    const idem_audit_entry_t *e, int version)
{
    if (e->seq != seq) {
        if (e->seq + 1 == seq && v->count > 0
            && idem_audit_same(v->before, v->before_len, &e->prev))
        {
            return idem_audit_fault(v, IDEM_AUDIT_INSERTED, v->seq,
                       "entry %s was put before entry %llu, which was "
                       "written right after entry %llu", v->id,
                       (unsigned long long) e->seq,
                       (unsigned long long) (e->seq - 1));
        }

        return idem_audit_fault(v, IDEM_AUDIT_REORDERED, seq,
                   "written as entry %llu, found in the place of entry %llu",
                   (unsigned long long) e->seq, (unsigned long long) seq);
    }

    if (seq > v->seq + 1) {
        if (seq == v->seq + 2) {
            return idem_audit_fault(v, IDEM_AUDIT_MISSING, v->seq + 1,
                       "it is not in the stream (the next one there is %llu)",
                       (unsigned long long) seq);
        }

        return idem_audit_fault(v, IDEM_AUDIT_MISSING, v->seq + 1,
                   "entries %llu to %llu are not in the stream (the next "
                   "one there is %llu)", (unsigned long long) v->seq + 1,
                   (unsigned long long) seq - 1, (unsigned long long) seq);
    }

    if (v->count == 0 ? idem_audit_genesis_of(&e->prev, version)
                      : idem_audit_same(v->hash, v->hash_len, &e->prev))
    {
        return 0;
    }

    if (v->count > 0 && idem_audit_same(v->before, v->before_len, &e->prev))
    {
        return idem_audit_fault(v, IDEM_AUDIT_INSERTED, v->seq,
                   "entry %llu was chained on entry %llu, not on entry %llu",
                   (unsigned long long) seq, (unsigned long long) v->seq - 1,
                   (unsigned long long) v->seq);
    }

    if (v->count == 0) {
        return idem_audit_fault(v, IDEM_AUDIT_MODIFIED, seq,
                   "the first entry is not chained on the genesis hash");
    }

    return idem_audit_fault(v, IDEM_AUDIT_MODIFIED, v->seq,
               "entry %llu was chained on another hash than this entry's: "
               "this entry was replaced", (unsigned long long) seq);
}


/*
 * The hash of e, with the key and without it, as its version stores it:
 * hex (1), the raw digest (2).  0, or -1 when it cannot be computed.
 */
static int
idem_audit_hashes(idem_audit_verify_t *v, const char *e, size_t e_len,
    int version, char *want, char *plain, size_t *len)
{
    if (version == 1) {
        *len = IDEM_AUDIT_HASH_LEN;
        return idem_audit_hash(e, e_len, v->key, v->key_len, want) == 0
               && idem_audit_hash(e, e_len, NULL, 0, plain) == 0 ? 0 : -1;
    }

    *len = IDEM_AUDIT_DIGEST_LEN;
    return idem_audit_digest(e, e_len, v->key, v->key_len,
                             (unsigned char *) want) == 0
           && idem_audit_digest(e, e_len, NULL, 0, (unsigned char *) plain)
              == 0 ? 0 : -1;
}


/* the entry's own hash, with the key when there is one */
static int
idem_audit_verify_hash(idem_audit_verify_t *v, uint64_t seq, const char *h,
    size_t h_len, const char *e, size_t e_len, int version)
{
    size_t      len;
    idem_str_t  got;
    char        want[IDEM_AUDIT_HASH_LEN + 1], plain[IDEM_AUDIT_HASH_LEN + 1];

    if (idem_audit_hashes(v, e, e_len, version, want, plain, &len) != 0) {
        return idem_audit_fault(v, IDEM_AUDIT_MODIFIED, seq,
                                "its hash cannot be computed");
    }

    got.data = h;
    got.len = h_len;

    if (idem_audit_same(want, len, &got)) {
        return 0;
    }

    if (v->key && idem_audit_same(plain, len, &got)) {
        return idem_audit_fault(v, IDEM_AUDIT_WRONG_HMAC, seq,
                   "its hash is a plain SHA-256: written without the key");
    }

    return idem_audit_fault(v, IDEM_AUDIT_MODIFIED, seq,
               "its %s does not match its fields%s",
               v->key ? "HMAC" : "hash",
               (v->key == NULL && v->count == 0)
               ? " (a stream written with idempotency_audit_key needs "
                 "--key-file)" : "");
}


int
idem_audit_verify_next(idem_audit_verify_t *v, const char *id, size_t id_len,
    const char *h, size_t h_len, const char *e, size_t e_len)
{
    uint64_t             seq;
    idem_audit_events_t  ev;

    seq = idem_audit_id_seq(id, id_len);

    if (seq == 0 || h == NULL || e == NULL) {
        return idem_audit_fault(v, IDEM_AUDIT_INSERTED, v->seq + 1,
                   "entry %.*s after entry %llu was not written by the "
                   "module (%s)", (int) (id_len < 40 ? id_len : 40), id,
                   (unsigned long long) v->seq,
                   seq == 0 ? "its ID is not <seq>-0" : "no h and e fields");
    }

    if (h_len > IDEM_AUDIT_PREV_MAX
        || idem_audit_events_decode(e, e_len, &ev) != 0)
    {
        return idem_audit_fault(v, IDEM_AUDIT_MODIFIED, seq,
                   "its fields are not an encoding the module writes");
    }

    if (idem_audit_verify_place(v, seq, &ev.e[0], ev.version) != 0
        || idem_audit_verify_hash(v, seq, h, h_len, e, e_len, ev.version)
           != 0)
    {
        return -1;
    }

    memcpy(v->before, v->hash, v->hash_len);
    v->before_len = v->hash_len;
    memcpy(v->hash, h, h_len);
    v->hash_len = h_len;
    idem_audit_hash_text(h, h_len, v->hex);
    snprintf(v->id, sizeof(v->id), "%.*s", (int) id_len, id);
    v->seq = seq;
    v->count++;
    v->events += ev.n;

    return 0;
}


/* ---------------------------------------------------------- entries v2 */

/*
 * A v2 entry's fields, in the order of their bits in an event's mask
 * (docs/audit.md): what kind each is, and where it is in an entry.
 */
enum {
    IDEM_AUDIT_F_TIME = 0,
    IDEM_AUDIT_F_STATUS,
    IDEM_AUDIT_F_TEXT,
    IDEM_AUDIT_F_DIGEST
};

typedef struct {
    int      kind;
    size_t   raw;       /* a digest's bytes */
    size_t   offset;    /* of its idem_str_t in idem_audit_entry_t */
} idem_audit_field_t;

#define idem_audit_str_at(e, f)                                               \
    ((idem_str_t *) ((char *) (e) + (f)->offset))

static const idem_audit_field_t  idem_audit_fields2[IDEM_AUDIT_MASK_BITS] = {
    { IDEM_AUDIT_F_TIME, 0, 0 },
    { IDEM_AUDIT_F_DIGEST, 16, offsetof(idem_audit_entry_t, op) },
    { IDEM_AUDIT_F_TEXT, 0, offsetof(idem_audit_entry_t, key) },
    { IDEM_AUDIT_F_DIGEST, 32, offsetof(idem_audit_entry_t, fp) },
    { IDEM_AUDIT_F_TEXT, 0, offsetof(idem_audit_entry_t, route) },
    { IDEM_AUDIT_F_STATUS, 0, 0 },
    { IDEM_AUDIT_F_TEXT, 0, offsetof(idem_audit_entry_t, identity) },
    { IDEM_AUDIT_F_TEXT, 0, offsetof(idem_audit_entry_t, approver) },
    { IDEM_AUDIT_F_DIGEST, 32, offsetof(idem_audit_entry_t, response) },
    { IDEM_AUDIT_F_TEXT, 0, offsetof(idem_audit_entry_t, ref) },
    { IDEM_AUDIT_F_DIGEST, 16, offsetof(idem_audit_entry_t, request) }
};


/* a text field has a 2-byte length: a longer one (a route) is cut */
static size_t
idem_audit_text_len(const idem_str_t *s)
{
    return s->len > 0xffff ? 0xffff : s->len;
}


static int
idem_audit_str_eq(const idem_str_t *a, const idem_str_t *b)
{
    size_t  len = idem_audit_text_len(a);

    return len == idem_audit_text_len(b)
           && (len == 0 || memcmp(a->data, b->data, len) == 0);
}


/* field i of event e differs from the event before it (or from nothing) */
static int
idem_audit_differs(const idem_audit_entry_t *e, const idem_audit_entry_t *was,
    size_t i)
{
    static const idem_str_t        none = { NULL, 0 };
    const idem_audit_field_t      *f = &idem_audit_fields2[i];

    switch (f->kind) {

    case IDEM_AUDIT_F_TIME:
        return was == NULL || e->time != was->time;

    case IDEM_AUDIT_F_STATUS:
        return e->status != (was ? was->status : 0);

    default:
        return !idem_audit_str_eq(idem_audit_str_at(e, f),
                                  was ? idem_audit_str_at(was, f) : &none);
    }
}


/* the bytes field i of e takes after its mask bit */
static size_t
idem_audit_field_len(const idem_audit_entry_t *e, size_t i)
{
    const idem_audit_field_t  *f = &idem_audit_fields2[i];

    switch (f->kind) {

    case IDEM_AUDIT_F_TIME:
        return 8;

    case IDEM_AUDIT_F_STATUS:
        return 2;

    case IDEM_AUDIT_F_DIGEST:
        return 2 + idem_audit_str_at(e, f)->len / 2;

    default:
        return 2 + idem_audit_text_len(idem_audit_str_at(e, f));
    }
}


static size_t
idem_audit_batch_body(const idem_audit_entry_t *e, size_t n)
{
    size_t  len, k, i;

    len = 1;      /* the count */

    for (k = 0; k < n; k++) {
        len += 3;     /* the event, the mask */

        for (i = 0; i < IDEM_AUDIT_MASK_BITS; i++) {
            if (idem_audit_differs(&e[k], k ? &e[k - 1] : NULL, i)) {
                len += idem_audit_field_len(&e[k], i);
            }
        }
    }

    return len;
}


size_t
idem_audit_batch_len(const idem_audit_entry_t *e, size_t n)
{
    return 1 + 8 + 1 + e[0].prev.len + idem_audit_batch_body(e, n);
}


size_t
idem_audit_batch_max(const idem_audit_entry_t *e, size_t n)
{
    /* every time may differ from the one before, the prev be the longest */
    return 1 + 8 + 1 + IDEM_AUDIT_PREV_MAX + idem_audit_batch_body(e, n)
           + 8 * n;
}


static char *
idem_audit_be(char *p, uint64_t v, size_t bytes)
{
    while (bytes--) {
        *p++ = (char) ((v >> (8 * bytes)) & 0xff);
    }

    return p;
}


static int
idem_audit_hexval(char c)
{
    return c <= '9' ? c - '0' : (c | 0x20) - 'a' + 10;
}


static char *
idem_audit_put_field(char *p, const idem_audit_entry_t *e, size_t i)
{
    size_t                     k, len;
    const idem_str_t          *s;
    const idem_audit_field_t  *f = &idem_audit_fields2[i];

    switch (f->kind) {

    case IDEM_AUDIT_F_TIME:
        return idem_audit_be(p, (uint64_t) e->time, 8);

    case IDEM_AUDIT_F_STATUS:
        return idem_audit_be(p, (uint64_t) e->status, 2);

    case IDEM_AUDIT_F_DIGEST:
        s = idem_audit_str_at(e, f);
        len = s->len / 2;
        p = idem_audit_be(p, len, 2);

        for (k = 0; k < len; k++) {
            *p++ = (char) (idem_audit_hexval(s->data[2 * k]) << 4
                           | idem_audit_hexval(s->data[2 * k + 1]));
        }

        return p;

    default:
        s = idem_audit_str_at(e, f);
        len = idem_audit_text_len(s);
        p = idem_audit_be(p, len, 2);

        if (len) {
            memcpy(p, s->data, len);
        }

        return p + len;
    }
}


char *
idem_audit_batch_encode(char *p, const idem_audit_entry_t *e, size_t n)
{
    size_t    k, i;
    uint32_t  mask;

    *p++ = IDEM_AUDIT_V2;
    p = idem_audit_be(p, e[0].seq, 8);
    *p++ = (char) e[0].prev.len;
    memcpy(p, e[0].prev.data, e[0].prev.len);
    p += e[0].prev.len;
    *p++ = (char) n;

    for (k = 0; k < n; k++) {
        mask = 0;

        for (i = 0; i < IDEM_AUDIT_MASK_BITS; i++) {
            if (idem_audit_differs(&e[k], k ? &e[k - 1] : NULL, i)) {
                mask |= 1u << i;
            }
        }

        *p++ = (char) e[k].event;
        p = idem_audit_be(p, mask, 2);

        for (i = 0; i < IDEM_AUDIT_MASK_BITS; i++) {
            if (mask & (1u << i)) {
                p = idem_audit_put_field(p, &e[k], i);
            }
        }
    }

    return p;
}


/* reading a v2 entry: the bytes left, and the place of the next */
typedef struct {
    const unsigned char  *p;
    const unsigned char  *end;
} idem_audit_rd_t;


static int
idem_audit_get(idem_audit_rd_t *rd, size_t bytes, uint64_t *v)
{
    if ((size_t) (rd->end - rd->p) < bytes) {
        return -1;
    }

    *v = 0;

    while (bytes--) {
        *v = *v << 8 | *rd->p++;
    }

    return 0;
}


/* field i of event e, read into its place; hex of a digest into hex */
static int
idem_audit_get_field(idem_audit_rd_t *rd, idem_audit_entry_t *e, size_t i,
    char *hex)
{
    uint64_t                   v, len;
    idem_str_t                *s;
    const idem_audit_field_t  *f = &idem_audit_fields2[i];

    switch (f->kind) {

    case IDEM_AUDIT_F_TIME:
        if (idem_audit_get(rd, 8, &v) != 0 || v > (uint64_t) INT64_MAX) {
            return -1;
        }

        e->time = (int64_t) v;
        return 0;

    case IDEM_AUDIT_F_STATUS:
        if (idem_audit_get(rd, 2, &v) != 0 || (v != 0 && (v < 100 || v > 999)))
        {
            return -1;
        }

        e->status = (int) v;
        return 0;
    }

    s = idem_audit_str_at(e, f);

    if (idem_audit_get(rd, 2, &len) != 0
        || (uint64_t) (rd->end - rd->p) < len
        || (f->kind == IDEM_AUDIT_F_DIGEST && len != 0 && len != f->raw)
        || (f->kind == IDEM_AUDIT_F_TEXT && len > IDEM_AUDIT_TEXT_MAX
            && i != 2 && i != 4))
    {
        return -1;
    }

    if (f->kind == IDEM_AUDIT_F_DIGEST) {
        idem_hex(rd->p, len, hex);
        s->data = hex;
        s->len = 2 * len;

    } else {
        s->data = (const char *) rd->p;
        s->len = len;
    }

    rd->p += len;

    return 0;
}


/* the hex of each digest field an event reads, by its bit */
static char *
idem_audit_hex_of(idem_audit_events_t *ev, size_t k, size_t i)
{
    switch (i) {
    case 1: return ev->hex[k][0];
    case 3: return ev->hex[k][1];
    case 8: return ev->hex[k][2];
    default: return ev->hex[k][3];
    }
}


static int
idem_audit_event_read(idem_audit_rd_t *rd, idem_audit_events_t *ev, size_t k)
{
    size_t               i;
    uint64_t             code, mask;
    idem_audit_entry_t  *e = &ev->e[k];

    if (idem_audit_get(rd, 1, &code) != 0 || code >= IDEM_AUDIT_NEVENTS
        || idem_audit_get(rd, 2, &mask) != 0
        || mask >> IDEM_AUDIT_MASK_BITS
        || (k == 0 && !(mask & 1)))
    {
        return -1;
    }

    if (k) {
        *e = ev->e[k - 1];
    }

    e->event = (idem_audit_event_e) code;
    e->index = (unsigned) k + 1;

    for (i = 0; i < IDEM_AUDIT_MASK_BITS; i++) {
        if ((mask & (1u << i))
            && idem_audit_get_field(rd, e, i, idem_audit_hex_of(ev, k, i))
               != 0)
        {
            return -1;
        }
    }

    /* as the encoder writes it: a field only where it changes */
    for (i = 0; i < IDEM_AUDIT_MASK_BITS; i++) {
        if (!!(mask & (1u << i))
            != idem_audit_differs(e, k ? &ev->e[k - 1] : NULL, i))
        {
            return -1;
        }
    }

    return 0;
}


static int
idem_audit_decode2(const char *p, size_t len, idem_audit_events_t *ev)
{
    size_t            k;
    uint64_t          seq, plen, n;
    idem_audit_rd_t   rd;

    rd.p = (const unsigned char *) p + 1;
    rd.end = (const unsigned char *) p + len;

    if (idem_audit_get(&rd, 8, &seq) != 0 || seq == 0
        || idem_audit_get(&rd, 1, &plen) != 0 || plen > IDEM_AUDIT_PREV_MAX
        || (uint64_t) (rd.end - rd.p) < plen)
    {
        return -1;
    }

    ev->e[0].seq = seq;
    ev->e[0].prev.data = (const char *) rd.p;
    ev->e[0].prev.len = plen;
    rd.p += plen;

    if (idem_audit_get(&rd, 1, &n) != 0 || n == 0
        || n > IDEM_AUDIT_BATCH_MAX)
    {
        return -1;
    }

    for (k = 0; k < n; k++) {
        if (idem_audit_event_read(&rd, ev, k) != 0) {
            return -1;
        }
    }

    ev->n = n;
    ev->version = 2;

    return rd.p == rd.end ? 0 : -1;
}


int
idem_audit_events_decode(const char *p, size_t len, idem_audit_events_t *ev)
{
    memset(ev, 0, sizeof(idem_audit_events_t));

    if (len > 0 && p[0] == IDEM_AUDIT_V2) {
        return idem_audit_decode2(p, len, ev);
    }

    if (idem_audit_decode(p, len, &ev->e[0]) != 0) {
        return -1;
    }

    ev->e[0].index = 1;
    ev->n = 1;
    ev->version = 1;

    return 0;
}


int
idem_audit_digest(const char *enc, size_t len, const unsigned char *key,
    size_t key_len, unsigned char out[IDEM_AUDIT_DIGEST_LEN])
{
    unsigned int  n;

    if (key) {
        if (HMAC(EVP_sha256(), key, (int) key_len, (const unsigned char *) enc,
                 len, out, &n) == NULL)
        {
            return -1;
        }

    } else if (EVP_Digest(enc, len, out, &n, idem_sha256(), NULL) != 1) {
        return -1;
    }

    return n == IDEM_AUDIT_DIGEST_LEN ? 0 : -1;
}


void
idem_audit_hash_text(const char *h, size_t len, char *out)
{
    if (len == IDEM_AUDIT_DIGEST_LEN) {
        idem_hex((const unsigned char *) h, len, out);
        return;
    }

    memcpy(out, h, len);
    out[len] = '\0';
}
