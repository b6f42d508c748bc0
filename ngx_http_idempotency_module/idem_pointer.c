/*
 * RFC 6901 JSON pointers.  A pointer is parsed once, at configuration
 * time, into tokens that already hold what matching needs: the member
 * name in the canonicalizer's own form and the array index, so the body
 * is never compared through an unescaping step.
 */

#include <stdlib.h>
#include <string.h>

#include "idem_pointer.h"
#include "idem_text.h"


const char *
idem_ptr_strerror(idem_ptr_rc_t rc)
{
    switch (rc) {
    case IDEM_PTR_OK:       return "ok";
    case IDEM_PTR_EEMPTY:   return "the empty pointer names the whole body";
    case IDEM_PTR_ESLASH:   return "a pointer must start with \"/\"";
    case IDEM_PTR_EESCAPE:  return "\"~\" must be followed by \"0\" or \"1\"";
    case IDEM_PTR_EUTF8:    return "not valid UTF-8";
    case IDEM_PTR_ENUL:     return "a NUL byte";
    case IDEM_PTR_EDEPTH:   return "more than 128 reference tokens";
    case IDEM_PTR_EDUP:     return "the same pointer is listed twice";
    case IDEM_PTR_EMANY:    return "more than 64 pointers";
    case IDEM_PTR_ENOMEM:   return "out of memory";
    }

    return "unknown error";
}


/*
 * RFC 6901 section 4: "0", or digits without a leading zero.  An index
 * past what a body under 2 GiB can hold is none: it could never match.
 */
static int64_t
ptr_index(const char *p, size_t len)
{
    int64_t  v;
    size_t   i;

    if (len == 0 || len > 10 || (p[0] == '0' && len > 1)) {
        return -1;
    }

    v = 0;

    for (i = 0; i < len; i++) {
        if (p[i] < '0' || p[i] > '9') {
            return -1;
        }

        v = v * 10 + (p[i] - '0');
    }

    return (v <= 0x7fffffff) ? v : -1;
}


/* the token's JCS literal, without the quotes, at out; its length */
static size_t
ptr_canon(const char *p, size_t len, char *out)
{
    unsigned char  c;
    size_t         i, n;

    n = 0;

    for (i = 0; i < len; i++) {
        c = (unsigned char) p[i];

        if (c < 0x20 || c == '"' || c == '\\') {
            n += idem_json_escape(c, out + n);

        } else {
            out[n++] = (char) c;
        }
    }

    return n;
}


/* one token s[0..len), unescaped into *dst (which advances) */
static idem_ptr_rc_t
ptr_token(const char *s, size_t len, char **dst, idem_ptr_token_t *t)
{
    char    *d;
    size_t   i;

    d = *dst;
    t->data = d;

    for (i = 0; i < len; i++) {
        if (s[i] != '~') {
            *d++ = s[i];
            continue;
        }

        if (i + 1 == len || (s[i + 1] != '0' && s[i + 1] != '1')) {
            return IDEM_PTR_EESCAPE;
        }

        *d++ = (s[++i] == '0') ? '~' : '/';
    }

    t->len = d - t->data;
    t->index = ptr_index(t->data, t->len);
    t->canon = d;
    t->canon_len = ptr_canon(t->data, t->len, d);
    *dst = d + t->canon_len;

    return IDEM_PTR_OK;
}


idem_ptr_rc_t
idem_ptr_parse(const char *s, size_t len, idem_ptr_t *p)
{
    const char     *tok, *end, *slash;
    char           *dst;
    size_t          n, i;
    idem_ptr_rc_t   rc;

    memset(p, 0, sizeof(idem_ptr_t));

    if (len == 0) {
        return IDEM_PTR_EEMPTY;
    }

    if (s[0] != '/') {
        return IDEM_PTR_ESLASH;
    }

    if (memchr(s, '\0', len) != NULL) {
        return IDEM_PTR_ENUL;
    }

    if (!idem_utf8_valid(s, len)) {
        return IDEM_PTR_EUTF8;
    }

    for (n = 0, i = 0; i < len; i++) {
        n += (s[i] == '/');
    }

    if (n > IDEM_PTR_MAX_TOKENS) {
        return IDEM_PTR_EDEPTH;
    }

    /* a token's bytes unescaped, then as a literal: at most 1 + 6 each */
    p->tokens = malloc(n * sizeof(idem_ptr_token_t));
    p->mem = malloc(7 * len);
    if (p->tokens == NULL || p->mem == NULL) {
        idem_ptr_free(p);
        return IDEM_PTR_ENOMEM;
    }

    dst = p->mem;
    end = s + len;

    for (tok = s + 1; p->ntokens < n; tok = slash + 1) {
        slash = memchr(tok, '/', end - tok);
        if (slash == NULL) {
            slash = end;
        }

        rc = ptr_token(tok, slash - tok, &dst, &p->tokens[p->ntokens]);
        if (rc != IDEM_PTR_OK) {
            idem_ptr_free(p);
            return rc;
        }

        p->ntokens++;
    }

    return IDEM_PTR_OK;
}


void
idem_ptr_free(idem_ptr_t *p)
{
    free(p->tokens);
    free(p->mem);
    memset(p, 0, sizeof(idem_ptr_t));
}


/* the set */

idem_ptr_set_t *
idem_ptr_set_create(void)
{
    idem_ptr_set_t  *set;

    set = calloc(1, sizeof(idem_ptr_set_t));
    if (set != NULL) {
        set->root.token.index = -1;
    }

    return set;
}


static void
ptr_node_free(idem_ptr_node_t *node)
{
    idem_ptr_node_t  *c, *next;

    /* recursion is bounded by IDEM_PTR_MAX_TOKENS */
    for (c = node->child; c != NULL; c = next) {
        next = c->next;
        ptr_node_free(c);
        free(c);
    }
}


void
idem_ptr_set_free(idem_ptr_set_t *set)
{
    if (set != NULL) {
        ptr_node_free(&set->root);
        free(set);
    }
}


/* a new last child of parent for t, with a copy of t's bytes */
static idem_ptr_node_t *
ptr_node_add(idem_ptr_node_t *parent, const idem_ptr_token_t *t)
{
    idem_ptr_node_t  *node, **last;
    char             *d;

    node = calloc(1, sizeof(idem_ptr_node_t) + t->len + t->canon_len + 1);
    if (node == NULL) {
        return NULL;
    }

    d = (char *) (node + 1);
    memcpy(d, t->data, t->len);
    memcpy(d + t->len, t->canon, t->canon_len);

    node->token = *t;
    node->token.data = d;
    node->token.canon = d + t->len;

    for (last = &parent->child; *last != NULL; last = &(*last)->next) {
        /* void */
    }

    *last = node;

    return node;
}


idem_ptr_rc_t
idem_ptr_set_add(idem_ptr_set_t *set, const char *s, size_t len)
{
    idem_ptr_t             p;
    idem_ptr_rc_t          rc;
    idem_ptr_node_t       *node, *c;
    size_t                 i;

    if (set->n == IDEM_PTR_SET_MAX) {
        return IDEM_PTR_EMANY;
    }

    rc = idem_ptr_parse(s, len, &p);
    if (rc != IDEM_PTR_OK) {
        return rc;
    }

    node = &set->root;

    for (i = 0; i < p.ntokens; i++) {
        c = (idem_ptr_node_t *) idem_ptr_member(node, p.tokens[i].canon,
                                                p.tokens[i].canon_len);
        if (c == NULL) {
            c = ptr_node_add(node, &p.tokens[i]);
            if (c == NULL) {
                idem_ptr_free(&p);
                return IDEM_PTR_ENOMEM;
            }
        }

        node = c;
    }

    idem_ptr_free(&p);

    if (node->bit != 0) {
        return IDEM_PTR_EDUP;
    }

    node->bit = (uint64_t) 1 << set->n++;

    return IDEM_PTR_OK;
}


int
idem_ptr_set_overlaps(const idem_ptr_set_t *set, const idem_ptr_t *p)
{
    size_t                  i;
    const idem_ptr_node_t  *node;

    if (set == NULL) {
        return 0;
    }

    node = &set->root;

    for (i = 0; i < p->ntokens; i++) {
        /* tokens are compared as text: "/a/0" names member "0" or index 0 */
        node = idem_ptr_member(node, p->tokens[i].canon,
                               p->tokens[i].canon_len);

        if (node == NULL) {
            return 0;
        }

        if (node->bit != 0) {
            return 1;
        }
    }

    /* p names a value that holds an excluded one */
    return node->child != NULL;
}
