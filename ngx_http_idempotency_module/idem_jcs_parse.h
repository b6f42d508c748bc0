/*
 * The strict JSON parser's pieces (internal to the core and its test
 * support): whoever consumes the grammar, the canonicalizer here or a
 * tree builder in a test, reads exactly the same language with the same
 * rejections, because the bytes are only ever read by these functions.
 */

#ifndef IDEM_JCS_PARSE_H
#define IDEM_JCS_PARSE_H

#include <stddef.h>

#include "idem_jcs.h"
#include "idem_text.h"


typedef struct {
    char      *data;
    size_t     len;
    size_t     size;
    unsigned   text:1;      /* no NUL after the data: the writer's output */
    unsigned   borrowed:1;  /* data is the caller's: copy it out to grow */
} jcs_buf_t;

/*
 * Offsets into the canonicalizer's output are 32-bit, and a name's
 * length keeps a flag in its top bit: so buffers stay under 2 GiB.
 */
#define JCS_BUF_MAX  ((size_t) 0x7fffffff)

typedef struct {
    const unsigned char  *p;
    const unsigned char  *end;
} jcs_in_t;


/* room for n more bytes, and the NUL unless b holds text; 0 or -1 */
int idem_jcs_buf_grow(jcs_buf_t *b, size_t n);
int idem_jcs_buf_add(jcs_buf_t *b, const void *p, size_t n);

/* An unexpected byte: EUTF8 if it does not even start valid UTF-8. */
idem_jcs_rc_t idem_jcs_unexpected(jcs_in_t *in);

/*
 * in->p is at the opening quote.  Appends the string to b: unescaped
 * (canon == 0), or as its JCS literal without the quotes (canon == 1).
 * *plain is cleared when the literal holds an escape: then it is not
 * plain UTF-8 (idem_utf16_cmp() is told so).
 */
idem_jcs_rc_t idem_jcs_read_string(jcs_in_t *in, jcs_buf_t *b, int canon,
    int *plain);

/* RFC 8259 section 6 grammar: steps over one number token */
idem_jcs_rc_t idem_jcs_scan_number(jcs_in_t *in);

/* the literal word (true, false, null) at in->p, or ESYNTAX */
idem_jcs_rc_t idem_jcs_literal(jcs_in_t *in, const char **word, size_t *len);


static inline int
jcs_put(idem_sink_t *out, const char *p, size_t n)
{
    if (n == 0) {
        return 0;
    }

    return out->write(out, p, n);
}


static inline void
jcs_skip_ws(jcs_in_t *in)
{
    while (in->p < in->end
           && (*in->p == ' ' || *in->p == '\t' || *in->p == '\n'
               || *in->p == '\r'))
    {
        in->p++;
    }
}


/*
 * After a value, before what follows it: 1 (and *rc) when the text ends
 * here, at depth 0, or cannot, inside a container.
 */
static inline int
jcs_value_end(jcs_in_t *in, int depth, int *more, idem_jcs_rc_t *rc)
{
    jcs_skip_ws(in);

    if (depth == 0) {
        *more = 0;
        *rc = (in->p == in->end) ? IDEM_JCS_OK : idem_jcs_unexpected(in);
        return 1;
    }

    if (in->p == in->end) {
        *rc = IDEM_JCS_ESYNTAX;
        return 1;
    }

    return 0;
}


/*
 * The whole text, iteratively (the only stack is the consumer's): values,
 * and after each one the containers it closes.  Consumers differ only in
 * what they do at each step.  jcs_drive() is inline, so each consumer
 * gets its own copy with direct calls.
 */
typedef struct {
    idem_jcs_rc_t  (*open)(void *st, int *done);        /* '{' or '[' */
    idem_jcs_rc_t  (*scalar)(void *st);
    idem_jcs_rc_t  (*after_value)(void *st, int *more);
} jcs_grammar_t;


static inline idem_jcs_rc_t
jcs_drive(jcs_in_t *in, void *st, const jcs_grammar_t *g)
{
    idem_jcs_rc_t  rc;
    int            more, done;

    do {
        jcs_skip_ws(in);

        if (in->p == in->end) {
            return IDEM_JCS_ESYNTAX;
        }

        if (*in->p == '{' || *in->p == '[') {
            rc = g->open(st, &done);
            if (rc != IDEM_JCS_OK) {
                return rc;
            }

            if (!done) {
                more = 1;
                continue;       /* the first element */
            }

        } else {
            rc = g->scalar(st);
            if (rc != IDEM_JCS_OK) {
                return rc;
            }
        }

        rc = g->after_value(st, &more);
        if (rc != IDEM_JCS_OK) {
            return rc;
        }

    } while (more);

    return IDEM_JCS_OK;
}

#endif /* IDEM_JCS_PARSE_H */
