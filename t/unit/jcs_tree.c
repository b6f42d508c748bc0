/*
 * A cJSON tree from the core's strict parser, and a writer of the
 * canonical form of any cJSON tree: test support, not in the module.
 *
 * The writer is a second, independent implementation of RFC 8785 (the
 * module's canonicalizer builds no tree), so the unit tests, the fuzzers
 * and fpbench can check one against the other.  Both sides share only
 * the parser's pieces (idem_jcs_parse.h), the number formatter and the
 * text layer.
 *
 * Object members are sorted into canonical order when each object is
 * closed, which is also where duplicate names are found, so a parsed
 * tree is already canonical and writing it cannot fail except in the
 * sink.
 */

#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "idem_jcs_parse.h"
#include "idem_number.h"
#include "jcs_tree.h"


typedef struct {
    jcs_in_t              in;
    jcs_buf_t             str;      /* decoded string or number text */
    jcs_buf_t             key;      /* pending member name */
    cJSON                *root;
    int                   depth;
    cJSON                *stack[IDEM_JCS_MAX_DEPTH];
} jcs_parser_t;

typedef struct {
    const char  *name;
    size_t       len;
    cJSON       *item;
} jcs_member_t;


/* member ordering */

static int
jcs_member_cmp(const void *a, const void *b)
{
    const jcs_member_t  *ma, *mb;

    ma = a;
    mb = b;

    return idem_utf16_cmp(ma->name, ma->len, mb->name, mb->len, 0);
}


/*
 * Collects the n members of obj sorted by name; equal neighbours after
 * the sort are duplicates.  *out is malloc()ed, caller frees.
 */
static idem_jcs_rc_t
jcs_sorted_members(const cJSON *obj, size_t n, jcs_member_t **out)
{
    jcs_member_t  *m;
    cJSON         *c;
    size_t         i;

    m = malloc(n * sizeof(jcs_member_t));
    if (m == NULL) {
        return IDEM_JCS_ENOMEM;
    }

    i = 0;
    for (c = obj->child; c != NULL; c = c->next) {
        m[i].name = c->string;
        m[i].len = strlen(c->string);
        m[i].item = c;
        i++;
    }

    qsort(m, n, sizeof(jcs_member_t), jcs_member_cmp);

    for (i = 1; i < n; i++) {
        if (m[i].len == m[i - 1].len
            && memcmp(m[i].name, m[i - 1].name, m[i].len) == 0)
        {
            free(m);
            return IDEM_JCS_EDUP;
        }
    }

    *out = m;
    return IDEM_JCS_OK;
}


/*
 * Checks that every member has a UTF-8 name and counts them; *sorted
 * tells whether they already are in strictly increasing order (which
 * also means no duplicates), the usual case for trees from our parser.
 */
static idem_jcs_rc_t
jcs_scan_members(const cJSON *obj, size_t *count, int *sorted)
{
    const cJSON  *c, *prev;
    size_t        n, len, plen;

    n = 0;
    plen = 0;
    prev = NULL;
    *sorted = 1;

    for (c = obj->child; c != NULL; c = c->next) {
        if (c->string == NULL) {
            return IDEM_JCS_ESYNTAX;
        }

        len = strlen(c->string);
        if (!idem_utf8_valid(c->string, len)) {
            return IDEM_JCS_EUTF8;
        }

        if (prev != NULL && *sorted
            && idem_utf16_cmp(prev->string, plen, c->string, len, 0) >= 0)
        {
            *sorted = 0;
        }

        prev = c;
        plen = len;
        n++;
    }

    *count = n;
    return IDEM_JCS_OK;
}


/* Puts the members of a freshly parsed object into canonical order. */
static idem_jcs_rc_t
jcs_sort_object(cJSON *obj)
{
    jcs_member_t   *m;
    idem_jcs_rc_t   rc;
    size_t          n, i;
    int             sorted;

    rc = jcs_scan_members(obj, &n, &sorted);
    if (rc != IDEM_JCS_OK || sorted) {
        return rc;
    }

    rc = jcs_sorted_members(obj, n, &m);
    if (rc != IDEM_JCS_OK) {
        return rc;
    }

    /* cJSON lists: next is NULL-terminated, the head's prev is the tail */
    for (i = 0; i < n; i++) {
        m[i].item->prev = m[(i == 0) ? n - 1 : i - 1].item;
        m[i].item->next = (i + 1 < n) ? m[i + 1].item : NULL;
    }

    obj->child = m[0].item;
    free(m);

    return IDEM_JCS_OK;
}


/* tree builder */

static idem_jcs_rc_t
jcs_parse_scalar(jcs_parser_t *ps, cJSON **item)
{
    const unsigned char  *start;
    const char           *word;
    idem_jcs_rc_t         rc;
    double                d;
    size_t                n;
    int                   plain;

    start = ps->in.p;
    *item = NULL;

    switch (*start) {
    case '"':
        ps->str.len = 0;
        if (idem_jcs_buf_add(&ps->str, "", 0) != 0) {
            return IDEM_JCS_ENOMEM;
        }

        rc = idem_jcs_read_string(&ps->in, &ps->str, 0, &plain);
        if (rc != IDEM_JCS_OK) {
            return rc;
        }

        *item = cJSON_CreateString(ps->str.data);
        break;

    case 't':
    case 'f':
    case 'n':
        rc = idem_jcs_literal(&ps->in, &word, &n);
        if (rc != IDEM_JCS_OK) {
            return rc;
        }

        *item = (*start == 'n') ? cJSON_CreateNull()
                                : cJSON_CreateBool(*start == 't');
        break;

    default:
        if (*start != '-' && (*start < '0' || *start > '9')) {
            return idem_jcs_unexpected(&ps->in);
        }

        rc = idem_jcs_scan_number(&ps->in);
        if (rc == IDEM_JCS_OK) {
            rc = idem_jcs_number_value(start, ps->in.p - start, &d);
        }

        if (rc != IDEM_JCS_OK) {
            return rc;
        }

        *item = cJSON_CreateNumber(d);
    }

    return (*item == NULL) ? IDEM_JCS_ENOMEM : IDEM_JCS_OK;
}


/* A member name and its colon; the name waits in ps->key for its value. */
static idem_jcs_rc_t
jcs_parse_key(jcs_parser_t *ps)
{
    idem_jcs_rc_t  rc;
    int            plain;

    jcs_skip_ws(&ps->in);

    if (ps->in.p == ps->in.end || *ps->in.p != '"') {
        return idem_jcs_unexpected(&ps->in);
    }

    ps->key.len = 0;
    if (idem_jcs_buf_add(&ps->key, "", 0) != 0) {
        return IDEM_JCS_ENOMEM;
    }

    rc = idem_jcs_read_string(&ps->in, &ps->key, 0, &plain);
    if (rc != IDEM_JCS_OK) {
        return rc;
    }

    jcs_skip_ws(&ps->in);

    if (ps->in.p == ps->in.end || *ps->in.p != ':') {
        return idem_jcs_unexpected(&ps->in);
    }

    ps->in.p++;
    return IDEM_JCS_OK;
}


/* Links a new value into the tree (or makes it the root); owns item. */
static idem_jcs_rc_t
jcs_attach(jcs_parser_t *ps, cJSON *item)
{
    cJSON        *parent;
    cJSON_bool    ok;

    if (ps->depth == 0) {
        ps->root = item;
        return IDEM_JCS_OK;
    }

    parent = ps->stack[ps->depth - 1];

    if (cJSON_IsObject(parent)) {
        ok = cJSON_AddItemToObject(parent, ps->key.data, item);
    } else {
        ok = cJSON_AddItemToArray(parent, item);
    }

    if (!ok) {
        cJSON_Delete(item);
        return IDEM_JCS_ENOMEM;
    }

    return IDEM_JCS_OK;
}


/* '[' or '{' at ps->in.p; *done is set when the container was empty */
static idem_jcs_rc_t
jcs_open(void *st, int *done)
{
    jcs_parser_t   *ps = st;
    idem_jcs_rc_t   rc;
    cJSON          *item;
    int             object;

    if (ps->depth == IDEM_JCS_MAX_DEPTH) {
        return IDEM_JCS_EDEPTH;
    }

    object = (*ps->in.p++ == '{');
    item = object ? cJSON_CreateObject() : cJSON_CreateArray();
    if (item == NULL) {
        return IDEM_JCS_ENOMEM;
    }

    rc = jcs_attach(ps, item);
    if (rc != IDEM_JCS_OK) {
        return rc;
    }

    jcs_skip_ws(&ps->in);

    if (ps->in.p < ps->in.end && *ps->in.p == (object ? '}' : ']')) {
        ps->in.p++;
        *done = 1;
        return IDEM_JCS_OK;
    }

    ps->stack[ps->depth++] = item;
    *done = 0;

    return object ? jcs_parse_key(ps) : IDEM_JCS_OK;
}


/*
 * After a complete value: close the containers that end here, then
 * either step over a comma (*more = 1, another value follows) or reach
 * the end of the text (*more = 0).
 */
static idem_jcs_rc_t
jcs_after_value(void *st, int *more)
{
    jcs_parser_t   *ps = st;
    idem_jcs_rc_t   rc;
    cJSON          *top;
    int             object;

    for ( ;; ) {
        if (jcs_value_end(&ps->in, ps->depth, more, &rc)) {
            return rc;
        }

        top = ps->stack[ps->depth - 1];
        object = cJSON_IsObject(top);

        if (*ps->in.p == ',') {
            ps->in.p++;
            *more = 1;
            return object ? jcs_parse_key(ps) : IDEM_JCS_OK;
        }

        if (*ps->in.p != (object ? '}' : ']')) {
            return idem_jcs_unexpected(&ps->in);
        }

        ps->in.p++;
        ps->depth--;

        if (object) {
            rc = jcs_sort_object(top);
            if (rc != IDEM_JCS_OK) {
                return rc;
            }
        }
    }
}


static idem_jcs_rc_t
jcs_tree_scalar(void *st)
{
    idem_jcs_rc_t  rc;
    cJSON         *item;

    rc = jcs_parse_scalar(st, &item);

    return (rc == IDEM_JCS_OK) ? jcs_attach(st, item) : rc;
}


static const jcs_grammar_t  jcs_tree_grammar = {
    jcs_open, jcs_tree_scalar, jcs_after_value
};


idem_jcs_rc_t
jcs_tree_parse(const char *in, size_t len, cJSON **tree)
{
    jcs_parser_t   ps;
    idem_jcs_rc_t  rc;

    memset(&ps, 0, sizeof(jcs_parser_t));
    ps.in.p = (const unsigned char *) in;
    ps.in.end = ps.in.p + len;

    rc = jcs_drive(&ps.in, &ps, &jcs_tree_grammar);

    free(ps.str.data);
    free(ps.key.data);

    if (rc != IDEM_JCS_OK || tree == NULL) {
        cJSON_Delete(ps.root);
        ps.root = NULL;
    }

    if (tree != NULL) {
        *tree = ps.root;
    }

    return rc;
}


/* writer: recursion is bounded by IDEM_JCS_MAX_DEPTH */

static idem_jcs_rc_t jcs_write(const cJSON *v, idem_sink_t *out, int depth);


static idem_jcs_rc_t
jcs_write_member(const char *name, size_t len, const cJSON *v,
    idem_sink_t *out, int depth, int first)
{
    if ((!first && jcs_put(out, ",", 1) != 0)
        || idem_jcs_write_string(out, name, len) != 0
        || jcs_put(out, ":", 1) != 0)
    {
        return IDEM_JCS_ESINK;
    }

    return jcs_write(v, out, depth);
}


static idem_jcs_rc_t
jcs_write_object(const cJSON *obj, idem_sink_t *out, int depth)
{
    jcs_member_t   *m;
    const cJSON    *c;
    idem_jcs_rc_t   rc;
    size_t          n, i;
    int             sorted;

    rc = jcs_scan_members(obj, &n, &sorted);
    if (rc != IDEM_JCS_OK) {
        return rc;
    }

    if (jcs_put(out, "{", 1) != 0) {
        return IDEM_JCS_ESINK;
    }

    if (sorted) {
        for (c = obj->child; c != NULL && rc == IDEM_JCS_OK; c = c->next) {
            rc = jcs_write_member(c->string, strlen(c->string), c, out,
                                  depth, c == obj->child);
        }

    } else {
        /* a tree built elsewhere, not in canonical order */
        rc = jcs_sorted_members(obj, n, &m);
        if (rc != IDEM_JCS_OK) {
            return rc;
        }

        for (i = 0; i < n && rc == IDEM_JCS_OK; i++) {
            rc = jcs_write_member(m[i].name, m[i].len, m[i].item, out,
                                  depth, i == 0);
        }

        free(m);
    }

    if (rc != IDEM_JCS_OK) {
        return rc;
    }

    return (jcs_put(out, "}", 1) != 0) ? IDEM_JCS_ESINK : IDEM_JCS_OK;
}


static idem_jcs_rc_t
jcs_write_array(const cJSON *arr, idem_sink_t *out, int depth)
{
    const cJSON    *c;
    idem_jcs_rc_t   rc;

    if (jcs_put(out, "[", 1) != 0) {
        return IDEM_JCS_ESINK;
    }

    for (c = arr->child; c != NULL; c = c->next) {
        if (c != arr->child && jcs_put(out, ",", 1) != 0) {
            return IDEM_JCS_ESINK;
        }

        rc = jcs_write(c, out, depth);
        if (rc != IDEM_JCS_OK) {
            return rc;
        }
    }

    return (jcs_put(out, "]", 1) != 0) ? IDEM_JCS_ESINK : IDEM_JCS_OK;
}


static idem_jcs_rc_t
jcs_write_scalar(const cJSON *v, idem_sink_t *out)
{
    char    num[IDEM_JCS_NUMBER_MAX];
    size_t  n;
    int     rc;

    switch (v->type & 0xff) {
    case cJSON_False:
        rc = jcs_put(out, "false", 5);
        break;

    case cJSON_True:
        rc = jcs_put(out, "true", 4);
        break;

    case cJSON_NULL:
        rc = jcs_put(out, "null", 4);
        break;

    case cJSON_Number:
        n = idem_jcs_format_number(v->valuedouble, num);
        if (n == 0) {
            return IDEM_JCS_ENUMBER;
        }
        rc = jcs_put(out, num, n);
        break;

    case cJSON_String:
        if (v->valuestring == NULL) {
            return IDEM_JCS_ESYNTAX;
        }

        n = strlen(v->valuestring);
        if (!idem_utf8_valid(v->valuestring, n)) {
            return IDEM_JCS_EUTF8;
        }
        rc = idem_jcs_write_string(out, v->valuestring, n);
        break;

    default:
        /* cJSON_Raw and cJSON_Invalid have no canonical form */
        return IDEM_JCS_ESYNTAX;
    }

    return (rc != 0) ? IDEM_JCS_ESINK : IDEM_JCS_OK;
}


/* depth: how many containers enclose v */
static idem_jcs_rc_t
jcs_write(const cJSON *v, idem_sink_t *out, int depth)
{
    switch (v->type & 0xff) {
    case cJSON_Object:
    case cJSON_Array:
        if (depth >= IDEM_JCS_MAX_DEPTH) {
            return IDEM_JCS_EDEPTH;
        }

        if ((v->type & 0xff) == cJSON_Object) {
            return jcs_write_object(v, out, depth + 1);
        }

        return jcs_write_array(v, out, depth + 1);

    default:
        return jcs_write_scalar(v, out);
    }
}


idem_jcs_rc_t
jcs_tree_write(const cJSON *v, idem_sink_t *out)
{
    if (v == NULL) {
        return IDEM_JCS_ESYNTAX;
    }

    return jcs_write(v, out, 0);
}


/*
 * The exclusion as docs/fingerprint.md words it, on a tree: every pointer
 * is evaluated against the tree as it was, and what it names is removed.
 * Written apart from the canonicalizer's token tree on purpose: it walks
 * cJSON's unescaped names and counts array positions itself.
 */
static void
jcs_exclude(cJSON *v, const idem_ptr_t *ptrs, size_t n, size_t d,
    uint64_t alive)
{
    cJSON                   *c, *next;
    uint64_t                 go;
    size_t                   k;
    int64_t                  i;
    int                      object, drop;
    const idem_ptr_token_t  *t;

    object = cJSON_IsObject(v);

    if (!object && !cJSON_IsArray(v)) {
        return;
    }

    for (c = v->child, i = 0; c != NULL; c = next, i++) {
        next = c->next;
        go = 0;
        drop = 0;

        for (k = 0; k < n; k++) {
            if (!(alive & ((uint64_t) 1 << k)) || ptrs[k].ntokens <= d) {
                continue;
            }

            t = &ptrs[k].tokens[d];

            if (object ? (strlen(c->string) == t->len
                          && memcmp(c->string, t->data, t->len) == 0)
                       : (t->index == i))
            {
                go |= (uint64_t) 1 << k;
                drop |= (ptrs[k].ntokens == d + 1);
            }
        }

        if (drop) {
            cJSON_Delete(cJSON_DetachItemViaPointer(v, c));

        } else if (go) {
            jcs_exclude(c, ptrs, n, d + 1, go);
        }
    }
}


void
jcs_tree_exclude(cJSON *root, const idem_ptr_t *ptrs, size_t n)
{
    if (root != NULL && n > 0 && n <= 64) {
        jcs_exclude(root, ptrs, n, 0, (n == 64) ? ~(uint64_t) 0
                                                : ((uint64_t) 1 << n) - 1);
    }
}
