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
