/*
 * The replies of Redis to the module's commands, decoded without hiredis
 * or nginx types, so that the fuzzers check exactly what the module
 * accepts from Redis before it replays, refuses or reports anything.
 * Pure C.
 */

#ifndef IDEM_REPLY_H
#define IDEM_REPLY_H

#include <stddef.h>

#include "idem_record.h"


/*
 * One element of an array reply: a bulk or status string (is_str), or
 * anything else (nil, integer, array), which no decision here accepts
 * where a string is expected.
 */
typedef struct {
    const char  *data;
    size_t       len;
    int          is_str;
} idem_rv_t;


typedef enum {
    IDEM_CLAIM_INVALID = 0,    /* not an answer SET or claim.lua gives */
    IDEM_CLAIM_CORRUPT,        /* a value that is not a layout-2 record */
    IDEM_CLAIM_CLAIMED,        /* the key is this attempt's */
    IDEM_CLAIM_RECORD,         /* rec holds the key */
    IDEM_CLAIM_IN_PROGRESS,    /* rec is a live claim: lease_left ms */
    IDEM_CLAIM_RELEASED,       /* rec: the marker of the attempt waited on */
    IDEM_CLAIM_REUSED,         /* rec: the operation holding the identity */
    IDEM_CLAIM_LOCKED,         /* another operation holds the lock */
    IDEM_CLAIM_ELSEWHERE       /* another location's operation holds the
                                  identity (idempotency_unique shared=) */
} idem_claim_kind_e;

typedef struct {
    idem_claim_kind_e    kind;
    idem_value_t         rec;
    unsigned long long   lease_left;   /* LOCKED: 0 when not in flight */
    /*
     * LOCKED: the holder's operation id; CLAIMED: the id of the proposal
     * the claim took (the operation's from now on).  IDEM_TOKEN_LEN hex,
     * or NULL.
     */
    const char          *op;
    const char          *approver;     /* CLAIMED: of a recorded approval */
    size_t               approver_len;
} idem_claim_t;

/*
 * The claim by SET key value NX PX ttl GET: nil (data NULL) when the key
 * was free and is now claimed, else the value that holds it.
 */
idem_claim_kind_e idem_claim_set_decode(const char *data, size_t len,
    idem_claim_t *c);

/*
 * claim.lua's answers: {"claimed"}, {"record", value},
 * {"in_progress", value, lease ms left}, {"released", marker},
 * {"reused", value[, lease ms left]} (idempotency_unique: a completed 2xx,
 * an unknown or a live claim of another key), {"locked", lease ms left
 * | "", op id | ""} (idempotency_lock), {"elsewhere"} (an identity held
 * by another location's operation).  el holds
 * the first min(n, IDEM_CLAIM_ELEMS) elements of a reply of n.
 */
#define IDEM_CLAIM_ELEMS  3

idem_claim_kind_e idem_claim_decode(const idem_rv_t *el, size_t n,
    idem_claim_t *c);


/*
 * status.lua: {} when there is no record, else {value, lapsed "0"|"1"},
 * and for an alias the state letter of the operation it reuses ("" when
 * that one holds nothing any more); for an operation in progress or
 * unknown that holds a lock (idempotency_lock), the lock key's name.  A
 * record without either is the reply of two elements it always was.
 */
#define IDEM_STATUS_ELEMS  3

typedef enum {
    IDEM_STATUS_INVALID = 0,
    IDEM_STATUS_NONE,
    IDEM_STATUS_RECORD
} idem_status_kind_e;

typedef struct {
    idem_status_kind_e   kind;
    idem_value_t         rec;
    const char          *state;    /* as shown: a lapsed claim is unknown */
    const char          *alias_state;   /* s: its operation's, or NULL */
    /* i, u: the name of the lock key it holds (IDEM_RECORD_KEY_LEN), or NULL */
    const char          *lock;
} idem_status_t;

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
 * *state is set for REFUSED only: "in_progress", "completed",
 * "awaiting_confirmation" or "approved" (static), the states an operator
 * may not resolve; NULL otherwise.
 */
idem_admin_kind_e idem_admin_decode(const idem_rv_t *el, size_t n,
    const char **state);


/*
 * approve.lua: {"approved", until ms} | {"declined", at ms} | {"none"}
 *              | {"mismatch"} | {"refused", state}
 */
#define IDEM_APPROVE_ELEMS  2

typedef enum {
    IDEM_APPROVE_INVALID = 0,
    IDEM_APPROVE_NONE,
    IDEM_APPROVE_MISMATCH,
    IDEM_APPROVE_REFUSED,
    IDEM_APPROVE_APPROVED,
    IDEM_APPROVE_DECLINED
} idem_approve_kind_e;

/*
 * *state is set for REFUSED only ("in_progress", "completed", "unknown",
 * "alias", "declined", static); *until for APPROVED (the approval's end)
 * and DECLINED (when it was declined) only.
 */
idem_approve_kind_e idem_approve_decode(const idem_rv_t *el, size_t n,
    const char **state, long long *until);


/* what complete, release, fail and renew answer: an integer */
typedef enum {
    IDEM_CLOSE_INVALID = 0,
    IDEM_CLOSE_NOT_HELD,       /* 0: the claim was not this attempt's */
    IDEM_CLOSE_DONE,           /* 1 */
    IDEM_CLOSE_MARKED          /* 2: release left a marker, no claim yet */
} idem_close_kind_e;

idem_close_kind_e idem_close_decode(long long n);

#endif /* IDEM_REPLY_H */
