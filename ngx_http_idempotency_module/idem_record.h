/*
 * What the module keeps in Redis, in a form the fuzzers and tools can
 * read without nginx: the record key derived from (scope, key) and the
 * encoding of stored response headers.  Pure C.
 */

#ifndef IDEM_RECORD_H
#define IDEM_RECORD_H

#include <stddef.h>

/*
 * The one definition of each Redis name the module uses: record keys are
 * IDEM_RECORD_PREFIX + 32 hex + IDEM_RECORD_SUFFIX, and completions of
 * records somebody waits for are announced on IDEM_CHANNEL (the build
 * reads this line into the scripts, see config).
 */
#define IDEM_RECORD_PREFIX   "idem:{"
#define IDEM_RECORD_SUFFIX   "}:r"
#define IDEM_CHANNEL  "idem:done"

#define IDEM_RECORD_KEY_LEN  (sizeof(IDEM_RECORD_PREFIX) - 1 + 32          \
                              + sizeof(IDEM_RECORD_SUFFIX) - 1)

/*
 * The digest is SHA-256 over a length-prefixed scope and the key, so that
 * neither value appears in Redis and no (scope, key) pair can collide
 * with another by moving bytes across the boundary.  The hash tag keeps
 * every key of one record on one Cluster slot.
 */
int idem_record_key(const char *scope, size_t scope_len, const char *key,
    size_t key_len, char out[IDEM_RECORD_KEY_LEN + 1]);

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

/* Returns 1 with a pair, 0 at the end, -1 when the blob is malformed. */
int idem_hdrs_next(idem_hdrs_iter_t *it, const char **name, size_t *name_len,
    const char **value, size_t *value_len);

/* Largest header name or value accepted when decoding. */
#define IDEM_HDRS_FIELD_MAX  (64 * 1024)


/*
 * The claim script's answer (redis-scripts/claim.lua), decoded from the
 * elements of its array reply without hiredis or nginx types, so that the
 * fuzzer checks exactly what the module accepts from Redis.  An element is
 * a bulk or status string (is_str) or anything else (nil, integer, array).
 */
typedef struct {
    const char  *data;
    size_t       len;
    int          is_str;
} idem_rv_t;

/* 1 when p is 1..64 lowercase hex digits (operation ids, fingerprints) */
int idem_is_hex(const char *p, size_t len);

/* No decision reads an element past the sixth. */
#define IDEM_CLAIM_ELEMS  6

typedef enum {
    IDEM_CLAIM_INVALID = 0,    /* not an answer claim.lua gives */
    IDEM_CLAIM_CORRUPT,        /* "completed" with bad fields; op is set */
    IDEM_CLAIM_CLAIMED,        /* {"claimed", op} */
    IDEM_CLAIM_COMPLETED,      /* {"completed", op, status, hdr, body, stored} */
    IDEM_CLAIM_IN_PROGRESS,    /* {"in_progress", op, lease ms left} */
    IDEM_CLAIM_UNKNOWN,        /* {"unknown", op} */
    IDEM_CLAIM_MISMATCH        /* {"mismatch", op, state} */
} idem_claim_kind_e;

typedef struct {
    idem_claim_kind_e    kind;
    const char          *state;   /* "in_progress", "completed", "unknown"
                                     (static strings), or NULL */
    idem_rv_t            op;      /* 1..64 lowercase hex */
    int                  status;  /* COMPLETED: 200..599 */
    idem_rv_t            hdr;     /* COMPLETED: stored headers (netstrings) */
    idem_rv_t            body;    /* COMPLETED */
    int                  body_stored;
    unsigned long long   lease_left;   /* IN_PROGRESS, milliseconds */
} idem_claim_t;

/*
 * el holds the first min(n, IDEM_CLAIM_ELEMS) elements of a reply of n;
 * the pointers in *c point into them.  Returns c->kind.
 */
idem_claim_kind_e idem_claim_decode(const idem_rv_t *el, size_t n,
    idem_claim_t *c);


/* the latest time a record may name: 9999-12-31T23:59:59.999Z */
#define IDEM_TIME_MS_MAX  253402300799999LL

/*
 * The status script's answer (redis-scripts/status.lua): no elements when
 * there is no record, else {state, fingerprint, op, created, completed,
 * status}, the last three empty when the record has none.
 */
#define IDEM_STATUS_ELEMS  6

typedef enum {
    IDEM_STATUS_INVALID = 0,
    IDEM_STATUS_NONE,
    IDEM_STATUS_RECORD
} idem_status_kind_e;

typedef struct {
    idem_status_kind_e   kind;
    const char          *state;       /* static, as in idem_claim_t */
    idem_rv_t            fp;          /* 64 lowercase hex */
    idem_rv_t            op;          /* 1..64 lowercase hex */
    long long            created;     /* ms since the epoch, or -1 */
    long long            completed;   /* ms since the epoch, or -1 */
    int                  status;      /* 200..599 (always when completed),
                                         or 0 */
} idem_status_t;

/* el holds the first min(n, IDEM_STATUS_ELEMS) elements of a reply of n */
idem_status_kind_e idem_status_decode(const idem_rv_t *el, size_t n,
    idem_status_t *s);

/* admin.lua: {"released"} | {"completed"} | {"none"} | {"refused", state} */
#define IDEM_ADMIN_ELEMS  2

typedef enum {
    IDEM_ADMIN_INVALID = 0,
    IDEM_ADMIN_NONE,
    IDEM_ADMIN_REFUSED,
    IDEM_ADMIN_RELEASED,
    IDEM_ADMIN_COMPLETED
} idem_admin_kind_e;

/*
 * *state is set for REFUSED only: "in_progress" or "completed" (static),
 * the states an operator may not resolve; NULL otherwise.
 */
idem_admin_kind_e idem_admin_decode(const idem_rv_t *el, size_t n,
    const char **state);

#endif /* IDEM_RECORD_H */
