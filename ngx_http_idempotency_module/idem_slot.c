/*
 * Redis Cluster key slots.  The CRC is computed bit by bit rather than with
 * a table: a record key is 40 bytes, and the cost is far below the
 * command's own formatting.
 */

#include <string.h>

#include "idem_slot.h"


uint16_t
idem_crc16(const void *data, size_t len)
{
    const unsigned char  *p = data;
    uint16_t              crc = 0;
    size_t                i;
    int                   b;

    for (i = 0; i < len; i++) {
        crc ^= (uint16_t) (p[i] << 8);

        for (b = 0; b < 8; b++) {
            crc = (crc & 0x8000) ? (uint16_t) ((crc << 1) ^ 0x1021)
                                 : (uint16_t) (crc << 1);
        }
    }

    return crc;
}


unsigned
idem_slot(const void *key, size_t len)
{
    const char  *k = key, *open, *close;

    open = memchr(k, '{', len);

    if (open != NULL) {
        close = memchr(open + 1, '}', len - (size_t) (open + 1 - k));

        /* "{}" is no tag: the whole key is hashed */
        if (close != NULL && close > open + 1) {
            k = open + 1;
            len = (size_t) (close - k);
        }
    }

    return idem_crc16(k, len) & (IDEM_SLOTS - 1);
}


/* digits only, at most max; -1 when there are none or it is too large */
static long
idem_slot_number(const char *p, size_t len, long max)
{
    long    n;
    size_t  i;

    if (len == 0 || len > 5) {
        return -1;
    }

    n = 0;

    for (i = 0; i < len; i++) {
        if (p[i] < '0' || p[i] > '9') {
            return -1;
        }

        n = n * 10 + (p[i] - '0');
    }

    return n <= max ? n : -1;
}


int
idem_redirect(const char *err, size_t len, idem_redirect_t *r)
{
    const char  *p, *last, *sp, *colon;
    long         slot, port;

    last = err + len;

    if (len > 6 && memcmp(err, "MOVED ", 6) == 0) {
        r->ask = 0;
        p = err + 6;

    } else if (len > 4 && memcmp(err, "ASK ", 4) == 0) {
        r->ask = 1;
        p = err + 4;

    } else {
        return 0;
    }

    sp = memchr(p, ' ', (size_t) (last - p));
    if (sp == NULL) {
        return 0;
    }

    slot = idem_slot_number(p, (size_t) (sp - p), IDEM_SLOTS - 1);

    /* the port follows the last ":": an IPv6 address has some of its own */
    for (colon = last - 1; colon > sp && *colon != ':'; colon--) {
        /* void */
    }

    if (slot < 0 || colon == sp) {
        return 0;
    }

    port = idem_slot_number(colon + 1, (size_t) (last - colon - 1), 65535);

    if (port < 1) {
        return 0;
    }

    /* an address or a name: printable, no space */
    for (p = sp + 1; p < colon; p++) {
        if (*p <= 0x20 || *p >= 0x7f) {
            return 0;
        }
    }

    r->slot = (unsigned) slot;
    r->host = sp + 1;
    r->host_len = (size_t) (colon - sp - 1);
    r->port = (int) port;

    return 1;
}
