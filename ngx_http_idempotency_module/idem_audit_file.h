/*
 * The audit file device (idempotency_audit file=PATH, docs/audit.md):
 * one JSON object per line, one line per step (version 2): "events", the
 * step's events (1 to 4, each {"event", "time"} and those of the
 * request's fields that are not the line's), the request's fields under
 * the names of idempotency-audit export with the last event's values,
 * plus "seq", "prev", "v" and "hash".  Version 1 (one line per event,
 * "event" and "time" instead of "events") is still read.  "hash" is
 * SHA-256 (or HMAC-SHA256 with the chain key) of the line's RFC 8785
 * canonical form without "hash"; the writer emits that
 * canonical form itself and puts "hash" last, so the line is
 *
 *   <canonical object without hash, its closing brace left out>,"hash":"<64 hex>"}\n
 *
 * Pure C: the module writes lines with this code and idempotency-audit
 * reads them with it.
 */

#ifndef IDEM_AUDIT_FILE_H
#define IDEM_AUDIT_FILE_H

#include <stddef.h>
#include <stdint.h>

#include "idem_audit.h"


/* the value of "v" the module writes; 1 is still read */
#define IDEM_AUDIT_FILE_VERSION  2

/*
 * The events of one line: a step's, at most 4 (a stream entry may carry
 * more, the completions of a turn together; a line never does)
 */
#define IDEM_AUDIT_FILE_EVENTS   4

#if (IDEM_AUDIT_BATCH_MAX < IDEM_AUDIT_FILE_EVENTS)
#error "a line's events are read into idem_audit_events_t"
#endif

/*
 * The most the line of the events e[0..n) takes (seq, times and prev at
 * their longest): a byte of a field is at most 6 in JSON (\u00XX).
 */
size_t idem_audit_file_line_max(const idem_audit_entry_t *e, size_t n);

/*
 * Writes the line of the events e[0..n) of one step (1 <= n <=
 * IDEM_AUDIT_FILE_EVENTS; with e[0].seq and e[0].prev, 64 hex) at p and its
 * hash into hash; returns the end, or NULL when hashing fails.  A byte of
 * a field that is not UTF-8 is written as the character U+00XX of its
 * value.
 */
char *idem_audit_file_line(char *p, const idem_audit_entry_t *e, size_t n,
    const unsigned char *key, size_t key_len,
    char hash[IDEM_AUDIT_HASH_LEN + 1]);

/*
 * The chain's hash, set up once per key: the digest contexts are made
 * once, and with a key the HMAC's inner and outer pads are absorbed once
 * (RFC 2104), so that a line costs its own bytes and no allocation of a
 * one-shot HMAC().  NULL when it cannot be made.  Not shared between
 * threads.
 */
typedef struct idem_audit_file_hasher_s  idem_audit_file_hasher_t;

idem_audit_file_hasher_t *idem_audit_file_hasher(const unsigned char *key,
    size_t key_len);
void idem_audit_file_hasher_free(idem_audit_file_hasher_t *h);
int idem_audit_file_hash(idem_audit_file_hasher_t *h, const char *p,
    size_t len, char hash[IDEM_AUDIT_HASH_LEN + 1]);

/* idem_audit_file_line() with the hash of h: the same line */
char *idem_audit_file_line_h(char *p, const idem_audit_entry_t *e, size_t n,
    idem_audit_file_hasher_t *h, char hash[IDEM_AUDIT_HASH_LEN + 1]);

/*
 * A line of either version read back: 0 with its events in *ev (each
 * with the line's seq and prev; index 1... in a version-2 line, 0 in a
 * version-1 line; strings pointing into the parsed tree *tree, which the
 * caller frees with idem_audit_file_free()) and its hash; -1 with why
 * when the line is not one the module writes (not JSON, a member the
 * format does not define, one missing, a bad value, an event's field
 * equal to the line's).
 */
int idem_audit_file_parse(const char *line, size_t len,
    idem_audit_events_t *ev, char hash[IDEM_AUDIT_HASH_LEN + 1], void **tree,
    char *why, size_t why_len);
void idem_audit_file_free(void *tree);


/* what idempotency-audit verify --file keeps while it reads a series */
typedef struct {
    const unsigned char  *key;        /* NULL: a plain SHA-256 chain */
    size_t                key_len;
    int                   partial;    /* the first entry may follow one
                                         not given (older files gone) */
    uint64_t              seq;        /* of the last entry read, 0: none */
    uint64_t              count;      /* lines */
    uint64_t              events;     /* their events */
    uint64_t              first;      /* seq of the first entry read */
    char                  hash[IDEM_AUDIT_HASH_LEN + 1];
    char                  before[IDEM_AUDIT_HASH_LEN + 1];
    idem_audit_fault_e    fault;
    char                  why[400];
} idem_audit_file_verify_t;

void idem_audit_file_verify_init(idem_audit_file_verify_t *v,
    const unsigned char *key, size_t key_len, int partial);

/*
 * The next line of the series (without its newline): 0 while the chain
 * holds, -1 at the first fault (v->fault, v->why).
 */
int idem_audit_file_verify_next(idem_audit_file_verify_t *v,
    const char *line, size_t len);

#endif /* IDEM_AUDIT_FILE_H */
