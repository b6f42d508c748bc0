/*
 * A parsed JSON body (cJSON's tree) as the module reads it: the member an
 * RFC 6901 pointer names, and a member's exact RFC 8785 text.  cJSON's own
 * printer is not used for anything a person or an identity depends on: it
 * writes 15 digits whenever they read back within a relative DBL_EPSILON,
 * so 0.30000000000000004 prints as 0.3, another number.  Pure C.
 */

#ifndef IDEM_JSON_H
#define IDEM_JSON_H

#include <stddef.h>

#include "idem_jcs.h"
#include "idem_pointer.h"

struct cJSON;

/*
 * The value at ptr[0..len) in root, or NULL (a syntax error, a missing
 * member, an index past the end); idem_json_pointer_walk() is the same
 * for a pointer parsed once (idem_ptr_parse()), as the module's
 * idempotency_json_var and idempotency_confirm_show do.
 */
const struct cJSON *idem_json_pointer(const struct cJSON *root,
    const char *ptr, size_t len);
const struct cJSON *idem_json_pointer_walk(const struct cJSON *root,
    const idem_ptr_t *p);

/*
 * node's RFC 8785 text into out: members sorted, numbers as ECMAScript
 * prints them, a string as a JSON string.  0, or -1 when out fails, memory
 * runs out or the tree holds what RFC 8785 cannot write (a number that is
 * not finite).  The tree must be at most IDEM_JCS_MAX_DEPTH deep, as a
 * body the fingerprint read as JSON is.
 */
int idem_json_canonical(const struct cJSON *node, idem_sink_t *out);

#endif /* IDEM_JSON_H */
