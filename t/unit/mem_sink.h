/*
 * An idem_sink_t that collects output in a growing, NUL-terminated string,
 * for the unit tests; it can be told to fail, to test error paths.
 */

#ifndef MEM_SINK_H
#define MEM_SINK_H

#include <stdlib.h>
#include <string.h>

#include "idem_jcs.h"


typedef struct {
    char    *data;
    size_t   len;
    size_t   size;
    int      fail_after;    /* > 0: the sink fails after so many writes */
} mem_t;


static __attribute__((unused)) int
mem_write(idem_sink_t *sink, const char *p, size_t n)
{
    mem_t  *m;
    char   *d;

    m = sink->data;

    if (m->fail_after > 0 && --m->fail_after == 0) {
        return -1;
    }

    if (m->len + n + 1 > m->size) {
        m->size = (m->len + n + 1) * 2;
        d = realloc(m->data, m->size);
        if (d == NULL) {
            return -1;
        }
        m->data = d;
    }

    memcpy(m->data + m->len, p, n);
    m->len += n;
    m->data[m->len] = '\0';

    return 0;
}

#endif /* MEM_SINK_H */
