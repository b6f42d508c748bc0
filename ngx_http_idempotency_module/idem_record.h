/*
 * What the module keeps in Redis, in a form the fuzzers and tools can
 * read and write without nginx: the record key derived from (scope, key),
 * the netstring encoding of stored response headers, and the record
 * itself, one string value (layout 2, docs/states.md).  Pure C.
 */

#ifndef IDEM_RECORD_H
#define IDEM_RECORD_H

#include <stddef.h>

/*
 * The one definition of each Redis name the module uses: record keys are
 * IDEM_RECORD_PREFIX + 32 hex + IDEM_RECORD_SUFFIX, and changes of records
 * somebody waits for are announced on IDEM_CHANNEL (the build reads this
 * line into the scripts, see config).
 */
#define IDEM_RECORD_PREFIX   "idem:{"
#define IDEM_RECORD_SUFFIX   "}:r"
#define IDEM_CHANNEL  "idem:done"

#define IDEM_RECORD_KEY_LEN  (sizeof(IDEM_RECORD_PREFIX) - 1 + 32          \
                              + sizeof(IDEM_RECORD_SUFFIX) - 1)

/*
 * A claim's completion, written by its owner with a native SET beside
 * the record: record key + IDEM_DONE_INFIX + owner token (same hash tag,
 * same slot).  It counts only while the record is still that owner's
 * claim (redis-scripts/prelude.lua).  Before it, the key may hold
 * IDEM_DONE_WAITED (a duplicate waits: the owner announces its
 * completion) or IDEM_DONE_LOST (the claim was taken from its owner).
 */
#define IDEM_DONE_INFIX      ":c:"
#define IDEM_DONE_WAITED     'w'
#define IDEM_DONE_LOST       'x'

/*
 * A proposal's operation id names its record key for the approval
 * endpoint: IDEM_OPERATION_PREFIX + op id + IDEM_OPERATION_SUFFIX holds
 * the record key while the proposal lives.  It is as long as a record
 * key, which is the length of every key the transport sends.
 */
#define IDEM_OPERATION_PREFIX  "idem:{"
#define IDEM_OPERATION_SUFFIX  "}:o"
#define IDEM_OPERATION_KEY_LEN (sizeof(IDEM_OPERATION_PREFIX) - 1 + 32      \
                                + sizeof(IDEM_OPERATION_SUFFIX) - 1)

/*
 * The operations awaiting approval, for the approval page's list: one
 * sorted set, the operation ids scored by their proposal's end (ms), kept
 * to the IDEM_PENDING_MAX latest-ending and trimmed of the ended ones at
 * each new proposal.  As long as a record key, as every key the
 * transport sends.
 */
#define IDEM_PENDING_KEY  "idem:{00000000000000000000000000000000}:p"
#define IDEM_PENDING_MAX  1000

/*
 * idempotency_unique and idempotency_lock name keys of their own, as long
 * as a record key: IDEM_RECORD_PREFIX + 32 hex + one of these.  A unique
 * key (of a scope and a business identity) holds the record key of the
 * operation that holds the identity; a lock key (of a value, across
 * scopes) holds the record key of the operation that holds the lock and
 * the scope tag of its scope (IDEM_SCOPE_SUFFIX: never a Redis key, only
 * compared).
 */
#define IDEM_UNIQUE_SUFFIX   "}:u"
#define IDEM_LOCK_SUFFIX     "}:l"
#define IDEM_SCOPE_SUFFIX    "}:s"

/*
 * The lock an operation took is named beside its record: the record key
 * with IDEM_HOLDS_SUFFIX (the same hash tag, so the same Cluster slot)
 * holds the record key, the operation id and the lock key's name, so the
 * status endpoint, which has the key but not the body, can show the lock.
 * It grants nothing: the lock key itself says who holds the lock.
 */
#define IDEM_HOLDS_SUFFIX    "}:h"

/*
 * The digest is SHA-256 over a length-prefixed scope and the key, so that
 * neither value appears in Redis and no (scope, key) pair can collide
 * with another by moving bytes across the boundary.  The hash tag keeps
 * every key of one record on one Cluster slot.
 */
int idem_record_key(const char *scope, size_t scope_len, const char *key,
    size_t key_len, char out[IDEM_RECORD_KEY_LEN + 1]);

/*
 * The same derivation for the other names: domain (with its NUL) first,
 * then the length-prefixed scope and the value, and the suffix.
 * idem_record_key() is domain "idem-record-v1"; the unique key is
 * "idem-unique-v1" (scope, value), the lock key "idem-lock-v1" (no scope,
 * value), the scope tag "idem-scope-v1" (scope, no value).
 */
int idem_derived_key(const char *domain, const char *scope, size_t scope_len,
    const char *value, size_t value_len, const char *suffix,
    char out[IDEM_RECORD_KEY_LEN + 1]);

/*
 * The key of the same 32 hex digits as record key rkey (IDEM_RECORD_KEY_LEN
 * bytes) with another suffix (IDEM_HOLDS_SUFFIX), NUL-terminated.
 */
void idem_sibling_key(const char *rkey, const char *suffix,
    char out[IDEM_RECORD_KEY_LEN + 1]);

/* 1 when p is IDEM_RECORD_PREFIX, 32 lowercase hex digits and suffix */
int idem_is_key(const char *p, size_t len, const char *suffix);

/*
 * Stored headers are a sequence of netstrings, name then value:
 * "12:Content-Type,16:application/json,"  Names and values are opaque
 * bytes; lengths are decimal without leading zeros.
 */
size_t idem_hdrs_pair_len(size_t name_len, size_t value_len);
char *idem_hdrs_put(char *p, const char *name, size_t name_len,
    const char *value, size_t value_len);

typedef struct {
    const char  *pos;
    const char  *end;
} idem_hdrs_iter_t;

/*
 * One netstring, "len:bytes," with a decimal length without leading
 * zeros: the record's fields, the stored headers and the audit entries
 * (idem_audit.h) are written and read with these.  _get gives its bytes
 * (at most max) and moves it->pos past it: 0, or -1 when malformed.
 */
size_t idem_netstring_len(size_t len);
char *idem_netstring_put(char *p, const char *s, size_t len);
int idem_netstring_get(idem_hdrs_iter_t *it, const char **s, size_t *len,
    size_t max);

/* Returns 1 with a pair, 0 at the end, -1 when the blob is malformed. */
int idem_hdrs_next(idem_hdrs_iter_t *it, const char **name, size_t *name_len,
    const char **value, size_t *value_len);

/* Largest header name or value accepted when decoding. */
#define IDEM_HDRS_FIELD_MAX  (64 * 1024)


/* the latest time a record may name: 9999-12-31T23:59:59.999Z */
#define IDEM_TIME_MS_MAX  253402300799999LL

/* 1 when p is 1..64 lowercase hex digits (operation ids, fingerprints) */
int idem_is_hex(const char *p, size_t len);


/*
 * The record, layout 2: one string, a fixed head and netstring fields.
 *
 *   offset  size  field
 *   0       1     '2', the layout
 *   1       1     state: i in_progress, c completed, u unknown,
 *                 r released (a marker, see below),
 *                 a awaiting_confirmation (idempotency_confirm),
 *                 p approved (a recorded approval, idempotency_approve),
 *                 d declined (a person said no, idempotency_approve),
 *                 s alias (idempotency_unique: this key's request reused
 *                 the operation of another key)
 *   2       1     waiters: '1' once a duplicate waits (idempotency_wait)
 *   3       32    operation id, lowercase hex
 *   35      64    fingerprint, lowercase hex
 *   99      32    owner token of the claiming attempt, or 32 '-'
 *   131           fields, netstrings "len:bytes,", by state:
 *     i  created, lease ms, ttl ms
 *     c  created, completed, status, stored (0|1), resolved (0|1),
 *        headers, body
 *     u  created, became unknown
 *     r  status, Retry-After (both may be empty)
 *     a  created, proposal expires (ms); no owner: nothing runs yet
 *     p  created, proposal expires, approval expires (ms), approver;
 *        no owner: the next attempt with its fingerprint claims it
 *     d  created, proposal expires, declined at (ms), who declined (in
 *        approved_until and approver); no owner, nothing ever runs
 *     s  created, the record key of the operation it reuses; the head's
 *        operation id is that operation's, the fingerprint this key's
 *
 * Times are milliseconds since the epoch.  An in_progress record lives
 * for "ttl ms" from its claim or its last renewal (PEXPIRE), so Redis's
 * own clock says how long ago the owner last spoke: ttl - PTTL; the lease
 * has lapsed once that reaches "lease ms".
 *
 * "r" is what a released attempt leaves for a short while: for the
 * duplicates that waited on it (the upstream's status and Retry-After),
 * or for a claim that may still arrive from a connection the worker gave
 * up on (no status), which must not take the key then.  Every other
 * claim takes the key over a marker.
 *
 * The Lua scripts read and write the head with these offsets too: config
 * copies them into redis-scripts/head.lua at build time (and refuses a
 * head whose fields are not in the order above, one after the other).
 */
#define IDEM_LAYOUT          '2'
#define IDEM_HEAD_LEN        131
#define IDEM_LAYOUT_OFF      0
#define IDEM_STATE_OFF       1
#define IDEM_WAITERS_OFF     2
#define IDEM_OP_OFF          3
#define IDEM_FP_OFF          35
#define IDEM_OWNER_OFF       99
#define IDEM_TOKEN_LEN       32
#define IDEM_FP_LEN          64
#define IDEM_NUM_MAX         18      /* digits of a decimal field */
#define IDEM_APPROVER_MAX    256     /* bytes of an approver's name */

typedef struct {
    char                 state;       /* 'i', 'c', 'u', 'r', 'a', 'p', 'd', 's' */
    int                  waiters;
    const char          *op;          /* IDEM_TOKEN_LEN hex */
    const char          *fp;          /* IDEM_FP_LEN hex */
    const char          *owner;       /* IDEM_TOKEN_LEN hex, or NULL */
    long long            created;     /* i, c, u, a, p, s */
    long long            completed;   /* c */
    long long            unknown_at;  /* u */
    long long            expires;     /* a, p: the proposal's end */
    long long            approved_until; /* p: the approval's end */
    const char          *approver;    /* p, at most IDEM_APPROVER_MAX */
    size_t               approver_len;
    long long            lease_ms;    /* i */
    long long            ttl_ms;      /* i */
    int                  status;      /* c: 200..599; r: 0 (none) or that */
    int                  stored;      /* c */
    int                  resolved;    /* c */
    long long            retry_after; /* r: seconds, -1 when none */
    const char          *hdr;         /* c */
    size_t               hdr_len;
    const char          *body;        /* c */
    size_t               body_len;
    const char          *target;      /* s: IDEM_RECORD_KEY_LEN bytes */
} idem_value_t;

/*
 * 0 with *v filled (pointers into p), -1 when p is not a layout-2 record
 * exactly as the encoders below write them.
 */
int idem_value_decode(const char *p, size_t len, idem_value_t *v);

/*
 * Encoders: each writes the whole value for v's state from v's fields and
 * returns the end; idem_value_len() is the exact size it will write.  A
 * completed record's body may be NULL: its bytes are then left for the
 * caller to write, in the body_len bytes before the last one.
 */
size_t idem_value_len(const idem_value_t *v);
char *idem_value_encode(char *p, const idem_value_t *v);

/* the state's name as the answers and the status endpoint spell it */
const char *idem_state_name(char state);

#endif /* IDEM_RECORD_H */
