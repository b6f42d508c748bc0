/*
 * RFC 6901 JSON pointers: parsing (the one place, for every feature that
 * names a part of a JSON body) and the set of pointers whose members the
 * fingerprint leaves out (docs/fingerprint.md section 3.1).  Pure C: no
 * nginx types, no JSON grammar.
 */

#ifndef IDEM_POINTER_H
#define IDEM_POINTER_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

/*
 * A pointer with more reference tokens addresses something deeper than
 * a body may nest (IDEM_JCS_MAX_DEPTH), so it could never match.
 */
#define IDEM_PTR_MAX_TOKENS  128

/* pointers in one exclusion set: one bit each in the canonicalizer */
#define IDEM_PTR_SET_MAX     64

typedef enum {
    IDEM_PTR_OK = 0,
    IDEM_PTR_EEMPTY,        /* "": the whole document */
    IDEM_PTR_ESLASH,        /* does not start with "/" */
    IDEM_PTR_EESCAPE,       /* "~" not followed by "0" or "1" */
    IDEM_PTR_EUTF8,         /* not well-formed UTF-8 */
    IDEM_PTR_ENUL,          /* a NUL byte: no body member can hold one */
    IDEM_PTR_EDEPTH,        /* more than IDEM_PTR_MAX_TOKENS tokens */
    IDEM_PTR_EDUP,          /* the same pointer twice in a set */
    IDEM_PTR_EMANY,         /* more than IDEM_PTR_SET_MAX in a set */
    IDEM_PTR_ENOMEM
} idem_ptr_rc_t;

/* one reference token, "~1" and "~0" decoded */
typedef struct {
    const char  *data;
    size_t       len;
    /*
     * The token as the inside of a canonical JSON string literal
     * (idem_json_escape() for '"', '\\' and controls): the form in which
     * the canonicalizer holds member names, so matching is a memcmp.
     */
    const char  *canon;
    size_t       canon_len;
    /* the array index it names; -1 if none ("-", "01", "x", too big) */
    int64_t      index;
} idem_ptr_token_t;

typedef struct {
    idem_ptr_token_t  *tokens;
    size_t             ntokens;
    char              *mem;         /* the tokens' bytes */
} idem_ptr_t;

const char *idem_ptr_strerror(idem_ptr_rc_t rc);

/* s[0..len) into p (free with idem_ptr_free()); p is empty on error */
idem_ptr_rc_t idem_ptr_parse(const char *s, size_t len, idem_ptr_t *p);
void idem_ptr_free(idem_ptr_t *p);


/*
 * The exclusion set: a tree of tokens.  A node is reached through a
 * member name or an array index equal to its token; a node that ends a
 * pointer (bit != 0) removes what it is reached through, and nothing
 * below it needs matching.
 */
typedef struct idem_ptr_node_s  idem_ptr_node_t;

struct idem_ptr_node_s {
    idem_ptr_token_t   token;
    uint64_t           bit;         /* ends pointer number n: 1 << n */
    idem_ptr_node_t   *child;
    idem_ptr_node_t   *next;        /* the parent's next child */
};

typedef struct {
    idem_ptr_node_t    root;        /* the document; never excluded */
    size_t             n;
} idem_ptr_set_t;

idem_ptr_set_t *idem_ptr_set_create(void);
void idem_ptr_set_free(idem_ptr_set_t *set);

/* parses s[0..len) and adds it; the set is unchanged on error */
idem_ptr_rc_t idem_ptr_set_add(idem_ptr_set_t *set, const char *s,
    size_t len);

/* the child of node reached through member name canon[0..len) */
static inline const idem_ptr_node_t *
idem_ptr_member(const idem_ptr_node_t *node, const char *canon, size_t len)
{
    const idem_ptr_node_t  *c;

    for (c = node->child; c != NULL; c = c->next) {
        if (c->token.canon_len == len
            && (len == 0 || memcmp(c->token.canon, canon, len) == 0))
        {
            return c;
        }
    }

    return NULL;
}

/* the child of node reached through array index i */
static inline const idem_ptr_node_t *
idem_ptr_element(const idem_ptr_node_t *node, int64_t i)
{
    const idem_ptr_node_t  *c;

    for (c = node->child; c != NULL; c = c->next) {
        if (c->token.index == i) {
            return c;
        }
    }

    return NULL;
}

/*
 * 1 when pointer p names what a pointer of the set names, something
 * inside it, or something that contains one (idempotency_confirm_show
 * must never show what the fingerprint leaves out: the person would
 * approve a value the request can change freely); 0 otherwise.
 */
int idem_ptr_set_overlaps(const idem_ptr_set_t *set, const idem_ptr_t *p);

#endif /* IDEM_POINTER_H */
