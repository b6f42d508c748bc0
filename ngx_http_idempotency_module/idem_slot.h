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

#endif /* IDEM_SLOT_H */
