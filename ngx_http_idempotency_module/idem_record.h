/*
 * What the module keeps in Redis, in a form the fuzzers and tools can
 * read without nginx: the record key derived from (scope, key) and the
 * encoding of stored response headers.  Pure C.
 */

#ifndef IDEM_RECORD_H
#define IDEM_RECORD_H

#include <stddef.h>

/* "idem:{" + 32 hex + "}:r" */
#define IDEM_RECORD_KEY_LEN  (6 + 32 + 3)

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

#endif /* IDEM_RECORD_H */
