/*
 * The audit stream (idempotency_audit, docs/audit.md): the canonical
 * encoding of an entry, its hash (SHA-256, or HMAC-SHA256 with the chain
 * key), the decoder, and the checks idempotency-audit verify makes of a
 * stream entry by entry.  Pure C: the module writes entries with this
 * code and the tool reads them with it, so the two cannot disagree.
 *
 * An entry is one Redis Stream entry of ID "<seq>-0" with two fields:
 * "h", its hash in lowercase hex, and "e", the bytes that were hashed:
 * fifteen netstrings ("len:bytes,"), in this order
 *
 *   "idem-audit-1", seq, time, prev, event, op, key, fp, route, status,
 *   identity, approver, response, ref, request
 *
 * seq and time (ms since the epoch) in decimal without leading zeros,
 * prev the previous entry's "h" (64 '0' for the first), status "" or
 * three digits, op and request 32 lowercase hex or "", fp and response
 * 64 lowercase hex or "".
 *
 * That is version 1.  The module writes version 2 (docs/audit.md): one
 * stream entry per script, carrying the events of that step (up to
 * IDEM_AUDIT_BATCH_MAX, each with its own time), "h" the raw 32-byte
 * digest and "e" binary:
 *
 *   0x02, seq (8 bytes big-endian), prev (1 byte length, its bytes),
 *   the number of events (1 byte), then each event: its code (1 byte,
 *   idem_audit_event_e), a mask (2 bytes big-endian) of the fields that
 *   follow, in bit order: 0 time (8 bytes), 1 op, 2 key, 3 fp, 4 route,
 *   5 status (2 bytes), 6 identity, 7 approver, 8 response, 9 ref,
 *   10 request (each a 2-byte length and its bytes; the digests raw: op
 *   and request 16 bytes, fp and response 32, or none).  A field not in
 *   the mask is the event before's (the first event's: empty, and its
 *   time is always there); a field is in the mask exactly when it
 *   differs.  Verify reads both versions; a chain may go from one to the
 *   other (a version-2 entry's prev is then the version-1 "h", in hex).
 */

#ifndef IDEM_AUDIT_H
#define IDEM_AUDIT_H

#include <stddef.h>
#include <stdint.h>

#include "idem_fingerprint.h"


#define IDEM_AUDIT_VERSION     "idem-audit-1"
#define IDEM_AUDIT_HASH_LEN    64
#define IDEM_AUDIT_FIELDS      15

/*
 * The head the module chains on is whatever Redis reports as the last
 * entry's "h"; a forged one may be longer than a hash, up to this.
 */
#define IDEM_AUDIT_PREV_MAX    128

/* digits of a sequence number or a time */
#define IDEM_AUDIT_NUM_MAX     19

/* identity, approver and upstream reference are cut to this many bytes */
#define IDEM_AUDIT_TEXT_MAX    256

/* any other field: what the decoder accepts at most */
#define IDEM_AUDIT_FIELD_MAX   (64 * 1024)

extern const char  idem_audit_genesis[IDEM_AUDIT_HASH_LEN + 1];


typedef enum {
    IDEM_AUDIT_ATTEMPTED = 0,
    IDEM_AUDIT_CONFIRMATION_REQUIRED,
    IDEM_AUDIT_APPROVED,
    IDEM_AUDIT_SENT,
    IDEM_AUDIT_ACCEPTED,
    IDEM_AUDIT_COMPLETED,
    IDEM_AUDIT_REPLAYED,
    IDEM_AUDIT_REUSED,
    IDEM_AUDIT_CONFLICT,
    IDEM_AUDIT_IN_PROGRESS,
    IDEM_AUDIT_UNKNOWN,
    IDEM_AUDIT_RELEASED,
    IDEM_AUDIT_RESOLVED,
    IDEM_AUDIT_DECLINED,
    IDEM_AUDIT_NEVENTS
} idem_audit_event_e;


/* an entry's fields (an event's, in version 2); the strings point into
 * the caller's memory */
typedef struct {
    uint64_t             seq;       /* 1, 2, ... */
    unsigned             index;     /* the event's place in its entry: 1... */
    int64_t              time;      /* ms since the epoch, >= 0 */
    idem_str_t           prev;
    idem_audit_event_e   event;
    idem_str_t           op;
    idem_str_t           key;
    idem_str_t           fp;
    idem_str_t           route;
    int                  status;    /* 0: none, else 100..999 */
    idem_str_t           identity;
    idem_str_t           approver;
    idem_str_t           response;
    idem_str_t           ref;
    idem_str_t           request;
} idem_audit_entry_t;


#define IDEM_AUDIT_V2          '\x02'
#define IDEM_AUDIT_DIGEST_LEN  32      /* a version-2 "h": the raw digest */
/*
 * events of one version-2 entry: a step has at most 4; the completions of
 * one turn of a worker (at most 16, two events each) share one
 */
#define IDEM_AUDIT_BATCH_MAX   32
#define IDEM_AUDIT_MASK_BITS   11

/* the events of one stream entry, either version, decoded */
typedef struct {
    idem_audit_entry_t   e[IDEM_AUDIT_BATCH_MAX];
    size_t               n;
    int                  version;    /* 1 or 2 */
    /* the hex of each event's digests: op, fp, response, request */
    char                 hex[IDEM_AUDIT_BATCH_MAX][4][IDEM_AUDIT_HASH_LEN + 1];
} idem_audit_events_t;


/* "attempted", ...; NULL out of range */
const char *idem_audit_event_name(idem_audit_event_e event);

/* the event of a name, or -1 */
int idem_audit_event_parse(const char *name, size_t len);

/*
 * The encoding: its exact length, the most it may take for e's other
 * fields whatever seq, time and prev are, and the writer (returns the
 * end).
 */
size_t idem_audit_encoded_len(const idem_audit_entry_t *e);
size_t idem_audit_encoded_max(const idem_audit_entry_t *e);
char *idem_audit_encode(char *p, const idem_audit_entry_t *e);

/*
 * 0 with *e filled (pointers into p), -1 when p[0..len) is not an
 * encoding as idem_audit_encode() writes them.
 */
int idem_audit_decode(const char *p, size_t len, idem_audit_entry_t *e);

/*
 * Version 2: the entry of events e[0..n) (n at most IDEM_AUDIT_BATCH_MAX,
 * each with its own time; e[0]'s seq and prev are the entry's, prev at
 * most IDEM_AUDIT_PREV_MAX bytes; op, fp, response and request empty or
 * lowercase hex of their size): its exact length, the most it may take
 * whatever seq, times and prev are, and the writer (returns the end).
 */
size_t idem_audit_batch_len(const idem_audit_entry_t *e, size_t n);
size_t idem_audit_batch_max(const idem_audit_entry_t *e, size_t n);
char *idem_audit_batch_encode(char *p, const idem_audit_entry_t *e, size_t n);

/*
 * The events of an entry of either version (one for version 1), their
 * strings pointing into p or ev: 0, or -1 when p[0..len) is not an
 * encoding the module writes.
 */
int idem_audit_events_decode(const char *p, size_t len,
    idem_audit_events_t *ev);

/* a version-2 "h": the raw SHA-256 or HMAC-SHA256 of an encoding */
int idem_audit_digest(const char *enc, size_t len, const unsigned char *key,
    size_t key_len, unsigned char out[IDEM_AUDIT_DIGEST_LEN]);

/*
 * An "h" as people read it (the head verify prints, anchors): the hex of a
 * raw digest, the bytes of any other (a version-1 hash is hex already);
 * out has room for 2 * IDEM_AUDIT_PREV_MAX + 1.
 */
void idem_audit_hash_text(const char *h, size_t len, char *out);

/*
 * The hash of an encoding in lowercase hex (and a NUL): SHA-256, or with
 * key HMAC-SHA256.  0, or -1 when OpenSSL fails.
 */
int idem_audit_hash(const char *enc, size_t len, const unsigned char *key,
    size_t key_len, char hex[IDEM_AUDIT_HASH_LEN + 1]);


/* what idempotency-audit verify finds wrong first */
typedef enum {
    IDEM_AUDIT_INTACT = 0,
    IDEM_AUDIT_MODIFIED,       /* its fields are not what was hashed */
    IDEM_AUDIT_MISSING,        /* entries were removed before it */
    IDEM_AUDIT_INSERTED,       /* not written by the module in that place */
    IDEM_AUDIT_REORDERED,      /* written as another entry of the chain */
    IDEM_AUDIT_WRONG_HMAC      /* hashed without the chain key */
} idem_audit_fault_e;

/* "modified", "missing", "inserted", "reordered", "wrong HMAC" */
const char *idem_audit_fault_name(idem_audit_fault_e fault);

typedef struct {
    const unsigned char  *key;        /* NULL: a plain SHA-256 chain */
    size_t                key_len;
    uint64_t              seq;        /* of the last entry read, 0: none */
    uint64_t              count;      /* entries read */
    uint64_t              events;     /* their events */
    char                  hash[IDEM_AUDIT_PREV_MAX];       /* its "h" */
    size_t                hash_len;
    char                  before[IDEM_AUDIT_PREV_MAX];     /* the one before */
    size_t                before_len;
    char                  hex[2 * IDEM_AUDIT_PREV_MAX + 1]; /* "h" as text */
    char                  id[48];     /* its stream ID */

    /* the first fault: the entry it names (by sequence number) and why */
    idem_audit_fault_e    fault;
    uint64_t              fault_seq;
    char                  why[320];
} idem_audit_verify_t;

void idem_audit_verify_init(idem_audit_verify_t *v, const unsigned char *key,
    size_t key_len);

/*
 * The next entry of the stream, in stream order, of either version: its
 * ID and its "h" and "e" fields (NULL when the entry lacks one).  0 when the chain holds so
 * far; -1 at the first fault, then v->fault, v->fault_seq and v->why say
 * which entry and what is wrong.
 */
int idem_audit_verify_next(idem_audit_verify_t *v, const char *id,
    size_t id_len, const char *h, size_t h_len, const char *e,
    size_t e_len);

/* the sequence number of a stream ID "<seq>-0", or 0 when it is not one */
uint64_t idem_audit_id_seq(const char *id, size_t len);

#endif /* IDEM_AUDIT_H */
