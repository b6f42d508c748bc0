/*
 * RFC 8785 (JCS) canonical JSON, written directly: the strict parser's
 * grammar (idem_jcs_parse.h) drives a writer that puts every token into
 * one output buffer in its canonical form, and an object's members are
 * put in order when it closes by moving their bytes, so no tree is
 * built: the memory is the canonical text, one record per member of the
 * objects still open, and a scratch copy of the largest object that was
 * out of order.  Sorting is also where duplicate names are found.
 *
 * Members named by idempotency_fingerprint_exclude are read, checked and
 * written like any other, and their bytes are cut off the output when
 * their value ends: so a body is accepted or refused for the same reason
 * with or without exclusions, by the same code.
 */

#ifndef _GNU_SOURCE
#define _GNU_SOURCE             /* qsort_r() */
#endif

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "idem_jcs_parse.h"
#include "idem_number.h"
#include "idem_pointer.h"


const char *
idem_jcs_strerror(idem_jcs_rc_t rc)
{
    switch (rc) {
    case IDEM_JCS_OK:          return "ok";
    case IDEM_JCS_ESYNTAX:     return "not valid JSON";
    case IDEM_JCS_EUTF8:       return "invalid UTF-8";
    case IDEM_JCS_ESURROGATE:  return "lone surrogate in a \\u escape";
    case IDEM_JCS_ENUL:        return "\\u0000 in a string";
    case IDEM_JCS_EDUP:        return "duplicate member name";
    case IDEM_JCS_ENUMBER:     return "number is not a finite double";
    case IDEM_JCS_EDEPTH:      return "nesting too deep";
    case IDEM_JCS_ENOMEM:      return "out of memory";
    case IDEM_JCS_ESINK:       return "output failed";
    }

    return "unknown error";
}


/* strings */

int
idem_jcs_write_string(idem_sink_t *out, const char *s, size_t len)
{
    const unsigned char  *p, *end, *run;
    char                  esc[6];
    size_t                n;

    p = (const unsigned char *) s;
    end = p + len;

    if (jcs_put(out, "\"", 1) != 0) {
        return -1;
    }

    while (p < end) {
        run = p;

        while (p < end && *p >= 0x20 && *p != '"' && *p != '\\') {
            p++;
        }

        if (jcs_put(out, (const char *) run, p - run) != 0) {
            return -1;
        }

        if (p == end) {
            break;
        }

        n = idem_json_escape(*p, esc);

        if (jcs_put(out, esc, n) != 0) {
            return -1;
        }

        p++;
    }

    return jcs_put(out, "\"", 1);
}


/* the canonicalizer */

#define JCS_NAME_COMPLEX  0x80000000u   /* the literal holds escapes */

typedef struct {
    uint32_t   name;        /* offset of the name's opening quote */
    uint32_t   name_len;    /* with the quotes; | JCS_NAME_COMPLEX */
    uint32_t   end;         /* offset just past the member's value */
} jcs_rec_t;

typedef struct {
    uint32_t   start;       /* offset of the '{' or '[' */
    uint32_t   first;       /* the object's first member record */
    int        object;
    int        sorted;      /* names so far in strictly increasing order */
} jcs_frame_t;

/* a container's part in the exclusion, kept only when there is one */
typedef struct {
    const idem_ptr_node_t  *node;   /* pointers going on here, or NULL */
    const idem_ptr_node_t  *child;  /* ... and into the current value */
    uint64_t                seen;   /* the excluded names met so far */
    uint32_t                index;  /* the current element's */
    uint32_t                cut;    /* the output offset it began at */
    unsigned                skip:1; /* the current value is excluded */
    unsigned                dup:1;  /* an excluded name came twice */
} jcs_xframe_t;

typedef struct {
    jcs_in_t              in;
    const unsigned char  *in_start;
    jcs_buf_t             out;      /* the canonical text so far */
    jcs_buf_t             tmp;      /* scratch copy of a reordered object */
    jcs_rec_t            *recs;
    size_t                nrecs;
    size_t                recs_size;
    int                   depth;
    jcs_frame_t           frames[IDEM_JCS_MAX_DEPTH];
    const idem_ptr_set_t *excl;
    jcs_xframe_t         *x;        /* NULL: nothing is excluded */
} jcs_canon_t;


static int
jcs_put1(jcs_buf_t *b, char c)
{
    if (b->size == b->len && idem_jcs_buf_grow(b, 1) != 0) {
        return -1;
    }

    b->data[b->len++] = c;
    return 0;
}


/*
 * RFC 8785 3.2.3 order of two member names, kept as canonical literals:
 * a name without escapes is plain UTF-8, which compares faster.
 */
static int
jcs_name_cmp(const char *base, const jcs_rec_t *a, const jcs_rec_t *b)
{
    return idem_utf16_cmp(base + a->name + 1,
                          (a->name_len & ~JCS_NAME_COMPLEX) - 2,
                          base + b->name + 1,
                          (b->name_len & ~JCS_NAME_COMPLEX) - 2,
                          ((a->name_len | b->name_len) & JCS_NAME_COMPLEX)
                          != 0);
}


static int
jcs_rec_cmp(const void *a, const void *b, void *base)
{
    return jcs_name_cmp(base, a, b);
}


/* exclusion */

/*
 * A name was read in an object that pointers go through.  Equal names
 * reach the same node, so a name excluded twice is a duplicate: it is
 * kept for the object's end, where duplicates are reported anyway.
 */
static void
jcs_excl_name(jcs_canon_t *c, jcs_xframe_t *x, const jcs_rec_t *r)
{
    const idem_ptr_node_t  *n;

    n = idem_ptr_member(x->node, c->out.data + r->name + 1,
                        (r->name_len & ~JCS_NAME_COMPLEX) - 2);

    x->skip = (n != NULL && n->bit != 0);
    x->child = x->skip ? NULL : n;

    if (x->skip) {
        x->dup |= ((x->seen & n->bit) != 0);
        x->seen |= n->bit;
    }
}


/* an element of an array that pointers go through */
static void
jcs_excl_element(jcs_xframe_t *x)
{
    const idem_ptr_node_t  *n;

    n = idem_ptr_element(x->node, x->index);

    x->skip = (n != NULL && n->bit != 0);
    x->child = x->skip ? NULL : n;
}


/* a container opened (c->depth already counts it), after its bracket */
static void
jcs_excl_open(jcs_canon_t *c, int object)
{
    jcs_xframe_t  *x, *up;

    x = &c->x[c->depth - 1];

    if (c->depth == 1) {
        x->node = &c->excl->root;

    } else {
        up = x - 1;
        x->node = up->node ? up->child : NULL;
    }

    x->child = NULL;
    x->seen = 0;
    x->index = 0;
    x->cut = (uint32_t) c->out.len;
    x->skip = 0;
    x->dup = 0;

    if (!object && x->node != NULL) {
        jcs_excl_element(x);
    }
}


/*
 * The comma before the next member or element: written unless nothing
 * was kept yet, and where an excluded one would be cut back to.
 */
static idem_jcs_rc_t
jcs_excl_comma(jcs_canon_t *c, jcs_frame_t *f)
{
    jcs_xframe_t  *x;

    x = &c->x[c->depth - 1];
    x->cut = (uint32_t) c->out.len;

    if (!f->object && x->node != NULL) {
        x->index++;
        jcs_excl_element(x);
    }

    if (c->out.len == f->start + 1) {
        return IDEM_JCS_OK;
    }

    return (jcs_put1(&c->out, ',') != 0) ? IDEM_JCS_ENOMEM : IDEM_JCS_OK;
}


/* the excluded value ended: its bytes, comma and record go */
static void
jcs_excl_cut(jcs_canon_t *c, jcs_frame_t *f, jcs_xframe_t *x)
{
    c->out.len = x->cut;
    x->skip = 0;

    if (f->object) {
        c->nrecs--;
    }
}


/* A name and its colon; its record waits on the stack for the value. */
static idem_jcs_rc_t
jcs_canon_name(jcs_canon_t *c)
{
    jcs_rec_t      *r;
    idem_jcs_rc_t   rc;
    size_t          start, size;
    int             plain;

    jcs_skip_ws(&c->in);

    if (c->in.p == c->in.end || *c->in.p != '"') {
        return idem_jcs_unexpected(&c->in);
    }

    if (c->nrecs == c->recs_size) {
        size = c->recs_size ? 2 * c->recs_size : 64;
        r = realloc(c->recs, size * sizeof(jcs_rec_t));
        if (r == NULL) {
            return IDEM_JCS_ENOMEM;
        }

        c->recs = r;
        c->recs_size = size;
    }

    start = c->out.len;
    plain = 1;

    if (jcs_put1(&c->out, '"') != 0) {
        return IDEM_JCS_ENOMEM;
    }

    rc = idem_jcs_read_string(&c->in, &c->out, 1, &plain);
    if (rc != IDEM_JCS_OK) {
        return rc;
    }

    if (jcs_put1(&c->out, '"') != 0) {
        return IDEM_JCS_ENOMEM;
    }

    r = &c->recs[c->nrecs++];
    r->name = (uint32_t) start;
    r->name_len = (uint32_t) (c->out.len - start)
                  | (plain ? 0 : JCS_NAME_COMPLEX);

    jcs_skip_ws(&c->in);

    if (c->in.p == c->in.end || *c->in.p != ':') {
        return idem_jcs_unexpected(&c->in);
    }

    c->in.p++;

    return (jcs_put1(&c->out, ':') != 0) ? IDEM_JCS_ENOMEM : IDEM_JCS_OK;
}


/* the next name, and whether a pointer names its member */
static idem_jcs_rc_t
jcs_excl_next_name(jcs_canon_t *c)
{
    jcs_xframe_t   *x;
    idem_jcs_rc_t   rc;

    rc = jcs_canon_name(c);

    x = &c->x[c->depth - 1];

    if (rc == IDEM_JCS_OK && x->node != NULL) {
        jcs_excl_name(c, x, &c->recs[c->nrecs - 1]);
    }

    return rc;
}


static idem_jcs_rc_t
jcs_canon_number(jcs_canon_t *c)
{
    const unsigned char  *start;
    const char           *text;
    char                  num[IDEM_JCS_NUMBER_MAX];
    idem_jcs_rc_t         rc;
    size_t                n;

    start = c->in.p;

    rc = idem_jcs_scan_number(&c->in);
    if (rc == IDEM_JCS_OK) {
        rc = idem_jcs_number_text(start, c->in.p - start, num, &text, &n);
    }

    if (rc != IDEM_JCS_OK) {
        return rc;
    }

    /*
     * The one token whose canonical form can be longer than its text
     * (1e20): in place, it must not run into input not read yet, so the
     * output moves to a buffer of its own first.
     */
    if (c->out.borrowed
        && c->out.len + n > (size_t) (c->in.p - c->in_start))
    {
        /* room for the rest of the input, as in a buffer of its own */
        if (idem_jcs_buf_grow(&c->out, c->out.size - c->out.len + 1) != 0) {
            return IDEM_JCS_ENOMEM;
        }
    }

    return (idem_jcs_buf_add(&c->out, text, n) != 0) ? IDEM_JCS_ENOMEM
                                                      : IDEM_JCS_OK;
}


static idem_jcs_rc_t
jcs_canon_scalar(void *st)
{
    jcs_canon_t    *c = st;
    const char     *word;
    idem_jcs_rc_t   rc;
    size_t          n;
    int             plain;

    switch (*c->in.p) {
    case '"':
        if (jcs_put1(&c->out, '"') != 0) {
            return IDEM_JCS_ENOMEM;
        }

        rc = idem_jcs_read_string(&c->in, &c->out, 1, &plain);
        if (rc != IDEM_JCS_OK) {
            return rc;
        }

        return (jcs_put1(&c->out, '"') != 0) ? IDEM_JCS_ENOMEM
                                              : IDEM_JCS_OK;

    case 't':
    case 'f':
    case 'n':
        rc = idem_jcs_literal(&c->in, &word, &n);
        if (rc != IDEM_JCS_OK) {
            return rc;
        }

        return (idem_jcs_buf_add(&c->out, word, n) != 0) ? IDEM_JCS_ENOMEM
                                                          : IDEM_JCS_OK;

    default:
        if (*c->in.p == '-' || (*c->in.p >= '0' && *c->in.p <= '9')) {
            return jcs_canon_number(c);
        }

        return idem_jcs_unexpected(&c->in);
    }
}


/* '[' or '{' at c->in.p; *done is set when the container was empty */
static idem_jcs_rc_t
jcs_canon_open(void *st, int *done)
{
    jcs_canon_t  *c = st;
    jcs_frame_t  *f;
    int           object;

    if (c->depth == IDEM_JCS_MAX_DEPTH) {
        return IDEM_JCS_EDEPTH;
    }

    object = (*c->in.p == '{');
    f = &c->frames[c->depth];
    f->start = (uint32_t) c->out.len;

    if (jcs_put1(&c->out, (char) *c->in.p++) != 0) {
        return IDEM_JCS_ENOMEM;
    }

    jcs_skip_ws(&c->in);

    if (c->in.p < c->in.end && *c->in.p == (object ? '}' : ']')) {
        *done = 1;
        return (jcs_put1(&c->out, (char) *c->in.p++) != 0)
               ? IDEM_JCS_ENOMEM : IDEM_JCS_OK;
    }

    f->first = (uint32_t) c->nrecs;
    f->object = object;
    f->sorted = 1;
    c->depth++;
    *done = 0;

    if (c->x == NULL) {
        return object ? jcs_canon_name(c) : IDEM_JCS_OK;
    }

    jcs_excl_open(c, object);

    return object ? jcs_excl_next_name(c) : IDEM_JCS_OK;
}


/* The value of the object's newest member ended at the current offset. */
static inline void
jcs_canon_member_end(jcs_canon_t *c, jcs_frame_t *f)
{
    jcs_rec_t  *r;

    r = &c->recs[c->nrecs - 1];
    r->end = (uint32_t) c->out.len;

    /* equal names are left for the sort, so EDUP comes when it closes */
    if (f->sorted && c->nrecs - 1 > f->first
        && jcs_name_cmp(c->out.data, r - 1, r) >= 0)
    {
        f->sorted = 0;
    }
}


/*
 * Puts the members of a closing object in order: sorts their records,
 * finds duplicates as equal neighbours, and, unless it is the root (whose
 * records idem_jcs_canonicalize() writes out in order), rewrites the
 * object's bytes in place through a scratch copy.
 */
static idem_jcs_rc_t
jcs_canon_sort(jcs_canon_t *c, jcs_frame_t *f)
{
    jcs_rec_t  *r;
    size_t      n, i, len, from;
    char       *p;

    r = &c->recs[f->first];
    n = c->nrecs - f->first;

    qsort_r(r, n, sizeof(jcs_rec_t), jcs_rec_cmp, c->out.data);

    for (i = 1; i < n; i++) {
        if (jcs_name_cmp(c->out.data, &r[i - 1], &r[i]) == 0) {
            return IDEM_JCS_EDUP;
        }
    }

    if (c->depth == 0) {
        return IDEM_JCS_OK;
    }

    from = f->start + 1;
    len = c->out.len - from;

    c->tmp.len = 0;
    if (idem_jcs_buf_grow(&c->tmp, len) != 0) {
        return IDEM_JCS_ENOMEM;
    }

    p = c->tmp.data;

    for (i = 0; i < n; i++) {
        if (i > 0) {
            *p++ = ',';
        }

        memcpy(p, c->out.data + r[i].name, r[i].end - r[i].name);
        p += r[i].end - r[i].name;
    }

    memcpy(c->out.data + from, c->tmp.data, len);

    return IDEM_JCS_OK;
}


/* the closing bracket of f at c->in.p: its members in order, then it */
static inline idem_jcs_rc_t
jcs_canon_close(jcs_canon_t *c, jcs_frame_t *f)
{
    idem_jcs_rc_t  rc;

    c->in.p++;
    c->depth--;

    if (f->object && !f->sorted) {
        rc = jcs_canon_sort(c, f);
        if (rc != IDEM_JCS_OK) {
            return rc;
        }
    }

    if (f->object && c->depth > 0) {
        c->nrecs = f->first;
    }

    return (jcs_put1(&c->out, f->object ? '}' : ']') != 0) ? IDEM_JCS_ENOMEM
                                                           : IDEM_JCS_OK;
}


/*
 * After a complete value: close the containers that end here, then
 * either step over a comma (*more = 1) or reach the end (*more = 0).
 */
static idem_jcs_rc_t
jcs_canon_after_value(void *st, int *more)
{
    jcs_canon_t    *c = st;
    jcs_frame_t    *f;
    idem_jcs_rc_t   rc;

    for ( ;; ) {
        if (jcs_value_end(&c->in, c->depth, more, &rc)) {
            return rc;
        }

        f = &c->frames[c->depth - 1];

        if (f->object) {
            jcs_canon_member_end(c, f);
        }

        if (*c->in.p == ',') {
            c->in.p++;
            *more = 1;

            if (jcs_put1(&c->out, ',') != 0) {
                return IDEM_JCS_ENOMEM;
            }

            return f->object ? jcs_canon_name(c) : IDEM_JCS_OK;
        }

        if (*c->in.p != (f->object ? '}' : ']')) {
            return idem_jcs_unexpected(&c->in);
        }

        rc = jcs_canon_close(c, f);
        if (rc != IDEM_JCS_OK) {
            return rc;
        }
    }
}


/*
 * The same with pointers: an excluded value is cut when it ends, and a
 * comma is written only after something kept.  A grammar of its own, so
 * a body canonicalized without pointers does not test for them at every
 * value.
 */
static idem_jcs_rc_t
jcs_excl_after_value(void *st, int *more)
{
    jcs_canon_t    *c = st;
    jcs_frame_t    *f;
    jcs_xframe_t   *x;
    idem_jcs_rc_t   rc;

    for ( ;; ) {
        if (jcs_value_end(&c->in, c->depth, more, &rc)) {
            return rc;
        }

        f = &c->frames[c->depth - 1];
        x = &c->x[c->depth - 1];

        if (x->skip) {
            jcs_excl_cut(c, f, x);

        } else if (f->object) {
            jcs_canon_member_end(c, f);
        }

        if (*c->in.p == ',') {
            c->in.p++;
            *more = 1;

            rc = jcs_excl_comma(c, f);
            if (rc != IDEM_JCS_OK) {
                return rc;
            }

            return f->object ? jcs_excl_next_name(c) : IDEM_JCS_OK;
        }

        if (*c->in.p != (f->object ? '}' : ']')) {
            return idem_jcs_unexpected(&c->in);
        }

        /* where the sort would find a duplicate among the kept names */
        if (x->dup) {
            return IDEM_JCS_EDUP;
        }

        rc = jcs_canon_close(c, f);
        if (rc != IDEM_JCS_OK) {
            return rc;
        }
    }
}


static const jcs_grammar_t  jcs_canon_grammar = {
    jcs_canon_open, jcs_canon_scalar, jcs_canon_after_value
};

static const jcs_grammar_t  jcs_excl_grammar = {
    jcs_canon_open, jcs_canon_scalar, jcs_excl_after_value
};


/* A root object out of order goes out member by member, never copied. */
static int
jcs_canon_write_root(jcs_canon_t *c, idem_sink_t *out)
{
    jcs_rec_t  *r;
    size_t      i;

    if (jcs_put(out, "{", 1) != 0) {
        return -1;
    }

    for (i = 0; i < c->nrecs; i++) {
        r = &c->recs[i];

        if ((i > 0 && jcs_put(out, ",", 1) != 0)
            || jcs_put(out, c->out.data + r->name, r->end - r->name) != 0)
        {
            return -1;
        }
    }

    return jcs_put(out, "}", 1);
}


/*
 * in[0..len) to out, without what excl names; in place when borrow
 * (== in) may be overwritten
 */
static idem_jcs_rc_t
jcs_canon_run(const char *in, size_t len, char *borrow,
    const idem_ptr_set_t *excl, idem_sink_t *out)
{
    jcs_canon_t     c;
    idem_jcs_rc_t   rc;
    int             root_sorted;

    if (len >= JCS_BUF_MAX - 64) {
        return IDEM_JCS_ENOMEM;
    }

    memset(&c, 0, sizeof(jcs_canon_t));
    c.in.p = (const unsigned char *) in;
    c.in.end = c.in.p + len;
    c.in_start = c.in.p;
    c.out.text = 1;

    if (excl != NULL && excl->root.child != NULL) {
        c.excl = excl;
        c.x = malloc(IDEM_JCS_MAX_DEPTH * sizeof(jcs_xframe_t));
        if (c.x == NULL) {
            return IDEM_JCS_ENOMEM;
        }
    }

    if (borrow) {
        c.out.borrowed = 1;
        c.out.data = borrow;
        c.out.size = len;

    } else {
        /* the canonical text is rarely longer than the input */
        c.out.size = len + 64;
        c.out.data = malloc(c.out.size);
        if (c.out.data == NULL) {
            free(c.x);
            return IDEM_JCS_ENOMEM;
        }
    }

    rc = (c.x == NULL) ? jcs_drive(&c.in, &c, &jcs_canon_grammar)
                       : jcs_drive(&c.in, &c, &jcs_excl_grammar);

    if (rc == IDEM_JCS_OK) {
        root_sorted = (c.out.data[0] != '{' || c.frames[0].sorted
                       || c.nrecs == 0);

        if ((root_sorted ? jcs_put(out, c.out.data, c.out.len)
                         : jcs_canon_write_root(&c, out)) != 0)
        {
            rc = IDEM_JCS_ESINK;
        }
    }

    if (!c.out.borrowed) {
        free(c.out.data);
    }

    free(c.tmp.data);
    free(c.recs);
    free(c.x);

    return rc;
}


idem_jcs_rc_t
idem_jcs_canonicalize(const char *in, size_t len, idem_sink_t *out)
{
    return jcs_canon_run(in, len, NULL, NULL, out);
}


idem_jcs_rc_t
idem_jcs_canonicalize_excluding(const char *in, size_t len,
    const idem_ptr_set_t *excl, idem_sink_t *out)
{
    return jcs_canon_run(in, len, NULL, excl, out);
}


/*
 * The canonical text is never longer than the input read so far, except
 * after a number like 1e20, so it can overwrite the input it came from.
 * Every write keeps out.len <= the offset of the next input byte; a
 * number that would not is written after the output moved out.
 */
idem_jcs_rc_t
idem_jcs_canonicalize_in_place(char *buf, size_t len, idem_sink_t *out)
{
    return jcs_canon_run(buf, len, buf, NULL, out);
}


idem_jcs_rc_t
idem_jcs_canonicalize_in_place_excluding(char *buf, size_t len,
    const idem_ptr_set_t *excl, idem_sink_t *out)
{
    return jcs_canon_run(buf, len, buf, excl, out);
}


int
idem_sink_buf_write(idem_sink_t *sink, const char *p, size_t n)
{
    char             *d;
    size_t            size;
    idem_sink_buf_t  *b;

    b = sink->data;

    if (b->len + n > b->size) {
        size = (b->len + n) * 2;

        d = realloc(b->data, size);
        if (d == NULL) {
            return -1;
        }

        b->data = d;
        b->size = size;
    }

    memcpy(b->data + b->len, p, n);
    b->len += n;

    return 0;
}
