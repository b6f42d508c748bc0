/*
 * Redis Cluster's key slot: CRC16 (XMODEM: polynomial 0x1021, initial 0,
 * no reflection) of the key, or of its hash tag, modulo 16384.  The hash
 * tag is what lies between the first "{" and the first "}" after it, when
 * that is not empty; the module's record keys are "idem:{<32 hex>}:r", so
 * every key of one record is in one slot.  Pure C.
 */

#ifndef IDEM_SLOT_H
#define IDEM_SLOT_H

#include <stddef.h>
#include <stdint.h>

#define IDEM_SLOTS  16384

uint16_t idem_crc16(const void *data, size_t len);
unsigned idem_slot(const void *key, size_t len);


/*
 * A redirection a cluster node answers instead of running a command:
 * "MOVED <slot> <endpoint>:<port>" (the slot has another master now) or
 * "ASK <slot> <endpoint>:<port>" (the slot is being moved there, and this
 * key with it: this command alone goes there, after ASKING).  An empty
 * endpoint (Redis 7: "MOVED 3999 :6380") means the host of the connection
 * that got the answer.  The endpoint is printable ASCII without a space,
 * and not checked further here: it may be an IP address or a host name,
 * which the caller must refuse to resolve.
 */
typedef struct {
    int          ask;           /* 1: ASK, 0: MOVED */
    unsigned     slot;
    const char  *host;          /* inside the error text, not terminated */
    size_t       host_len;      /* 0: the connection's own host */
    int          port;
} idem_redirect_t;

/* 1 when err (an error reply's text) is a redirection, then *r; else 0 */
int idem_redirect(const char *err, size_t len, idem_redirect_t *r);

#endif /* IDEM_SLOT_H */
