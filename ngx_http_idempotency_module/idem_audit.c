/*
 * Entries of the audit stream: encoding, hash, decoding and the checks of
 * idempotency-audit verify (idem_audit.h, docs/audit.md).
 */

#include <stdarg.h>
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
    memcpy(v->hash, idem_audit_genesis, IDEM_AUDIT_HASH_LEN + 1);
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
idem_audit_same(const char *a, const char *b, size_t b_len)
{
    return strlen(a) == b_len && memcmp(a, b, b_len) == 0;
}


/*
 * The entry's place: written as the entry its ID names, right after the
 * last one read, chained on it.  An entry chained on the one before the
 * last shows that the last was put in between.
 */
static int
idem_audit_verify_place(idem_audit_verify_t *v, uint64_t seq,
    const idem_audit_entry_t *e)
{
    if (e->seq != seq) {
        if (e->seq + 1 == seq && v->count > 0
            && idem_audit_same(v->before, e->prev.data, e->prev.len))
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

    if (idem_audit_same(v->hash, e->prev.data, e->prev.len)) {
        return 0;
    }

    if (v->count > 0 && idem_audit_same(v->before, e->prev.data, e->prev.len))
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


/* the entry's own hash, with the key when there is one */
static int
idem_audit_verify_hash(idem_audit_verify_t *v, uint64_t seq, const char *h,
    size_t h_len, const char *e, size_t e_len)
{
    char  want[IDEM_AUDIT_HASH_LEN + 1], plain[IDEM_AUDIT_HASH_LEN + 1];

    if (idem_audit_hash(e, e_len, v->key, v->key_len, want) != 0
        || idem_audit_hash(e, e_len, NULL, 0, plain) != 0)
    {
        return idem_audit_fault(v, IDEM_AUDIT_MODIFIED, seq,
                                "its hash cannot be computed");
    }

    if (idem_audit_same(want, h, h_len)) {
        return 0;
    }

    if (v->key && idem_audit_same(plain, h, h_len)) {
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
    uint64_t            seq;
    idem_audit_entry_t  entry;

    seq = idem_audit_id_seq(id, id_len);

    if (seq == 0 || h == NULL || e == NULL) {
        return idem_audit_fault(v, IDEM_AUDIT_INSERTED, v->seq + 1,
                   "entry %.*s after entry %llu was not written by the "
                   "module (%s)", (int) (id_len < 40 ? id_len : 40), id,
                   (unsigned long long) v->seq,
                   seq == 0 ? "its ID is not <seq>-0" : "no h and e fields");
    }

    if (h_len > IDEM_AUDIT_PREV_MAX
        || idem_audit_decode(e, e_len, &entry) != 0)
    {
        return idem_audit_fault(v, IDEM_AUDIT_MODIFIED, seq,
                   "its fields are not an encoding the module writes");
    }

    if (idem_audit_verify_place(v, seq, &entry) != 0
        || idem_audit_verify_hash(v, seq, h, h_len, e, e_len) != 0)
    {
        return -1;
    }

    memcpy(v->before, v->hash, sizeof(v->before));
    memcpy(v->hash, h, h_len);
    v->hash[h_len] = '\0';
    snprintf(v->id, sizeof(v->id), "%.*s", (int) id_len, id);
    v->seq = seq;
    v->count++;

    return 0;
}
