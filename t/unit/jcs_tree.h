/*
 * Test support: the core's strict parser building a cJSON tree, and the
 * canonical form written from a tree (t/unit/jcs_tree.c).
 */

#ifndef JCS_TREE_H
#define JCS_TREE_H

#include <stddef.h>

#include <cjson/cJSON.h>

#include "idem_jcs.h"
#include "idem_pointer.h"

/*
 * Accepts and rejects exactly as idem_jcs_canonicalize() does, and hands
 * back the tree, members in canonical order, when tree != NULL and rc ==
 * IDEM_JCS_OK (the caller frees it with cJSON_Delete).
 */
idem_jcs_rc_t jcs_tree_parse(const char *in, size_t len, cJSON **tree);

/* The canonical form of any tree; EDUP, EUTF8, ... for one that has none. */
idem_jcs_rc_t jcs_tree_write(const cJSON *v, idem_sink_t *out);

/*
 * Removes from the tree what the pointers name (docs/fingerprint.md
 * section 3.1), independently of the canonicalizer's own way; n <= 64.
 */
void jcs_tree_exclude(cJSON *root, const idem_ptr_t *ptrs, size_t n);

#endif /* JCS_TREE_H */
