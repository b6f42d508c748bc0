/*
 * The memory sink of the unit tests, the fuzzers and fpbench: an
 * idem_sink_t that collects output in a growing, NUL-terminated string.
 * It can be told to fail after so many writes, to test error paths, or
 * to keep nothing and only count, so that a benchmark of the writer does
 * not also time a copy of its output.
 */

#ifndef MEM_SINK_H
#define MEM_SINK_H

#include <stdlib.h>
#include <string.h>

#include "idem_jcs.h"

/* not every user needs every helper: no unused-function warnings */
#define MEM_FN  static __attribute__((unused))


typedef struct {
    char    *data;      /* NULL until something is kept */
    size_t   len;
    size_t   size;
    int      fail_after;    /* > 0: the sink fails after so many writes */
    int      discard;       /* count the bytes in len, keep none */
} mem_t;


MEM_FN int
mem_write(idem_sink_t *sink, const char *p, size_t n)
{
    mem_t   *m;
    char    *d;
    size_t   size;

    m = sink->data;

    if (m->fail_after > 0 && --m->fail_after == 0) {
        return -1;
    }

    if (m->discard) {
        m->len += n;
        return 0;
    }

    if (m->len + n + 1 > m->size) {
        size = (m->len + n + 1) * 2;
        d = realloc(m->data, size);
        if (d == NULL) {
            return -1;
        }
        m->data = d;
        m->size = size;
    }

    memcpy(m->data + m->len, p, n);
    m->len += n;
    m->data[m->len] = '\0';

    return 0;
}


/* an empty collector, and sink pointed at it */
MEM_FN void
mem_sink(mem_t *m, idem_sink_t *sink)
{
    memset(m, 0, sizeof(mem_t));
    sink->write = mem_write;
    sink->data = m;
}


MEM_FN void
mem_free(mem_t *m)
{
    free(m->data);
    memset(m, 0, sizeof(mem_t));
}


/* the same bytes were written to both */
MEM_FN int
mem_same(const mem_t *a, const mem_t *b)
{
    return a->len == b->len
           && (a->len == 0 || memcmp(a->data, b->data, a->len) == 0);
}

#endif /* MEM_SINK_H */
