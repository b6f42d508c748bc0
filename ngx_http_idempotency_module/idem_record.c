#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <openssl/evp.h>

#include "idem_record.h"
#include "idem_fingerprint.h"


int
idem_record_key(const char *scope, size_t scope_len, const char *key,
    size_t key_len, char out[IDEM_RECORD_KEY_LEN + 1])
{
    int             i, ok;
    unsigned int    n;
    unsigned char   prefix[8], md[EVP_MAX_MD_SIZE];
    EVP_MD_CTX     *md_ctx;

    for (i = 0; i < 8; i++) {
        prefix[i] = (unsigned char) ((uint64_t) scope_len >> (56 - 8 * i));
    }

    md_ctx = EVP_MD_CTX_new();
    if (md_ctx == NULL) {
        return -1;
    }

    ok = EVP_DigestInit_ex(md_ctx, idem_sha256(), NULL)
         && EVP_DigestUpdate(md_ctx, "idem-record-v1", 15)
         && EVP_DigestUpdate(md_ctx, prefix, sizeof(prefix))
         && EVP_DigestUpdate(md_ctx, scope, scope_len)
         && EVP_DigestUpdate(md_ctx, key, key_len)
         && EVP_DigestFinal_ex(md_ctx, md, &n);

    EVP_MD_CTX_free(md_ctx);

    if (!ok) {
        return -1;
    }

    memcpy(out, IDEM_RECORD_PREFIX, sizeof(IDEM_RECORD_PREFIX) - 1);
    out += sizeof(IDEM_RECORD_PREFIX) - 1;

    for (i = 0; i < 16; i++) {
        out[2 * i] = idem_hexdigits[md[i] >> 4];
        out[2 * i + 1] = idem_hexdigits[md[i] & 0xf];
    }

    memcpy(out + 32, IDEM_RECORD_SUFFIX, sizeof(IDEM_RECORD_SUFFIX));

    return 0;
}


static size_t
idem_dec_len(size_t n)
{
    size_t  len;

    for (len = 1; n >= 10; n /= 10) {
        len++;
    }

    return len;
}


size_t
idem_hdrs_pair_len(size_t name_len, size_t value_len)
{
    return idem_dec_len(name_len) + 2 + name_len
           + idem_dec_len(value_len) + 2 + value_len;
}


static char *
idem_netstring_put(char *p, const char *s, size_t len)
{
    p += sprintf(p, "%zu:", len);
    memcpy(p, s, len);
    p += len;
    *p++ = ',';

    return p;
}


char *
idem_hdrs_put(char *p, const char *name, size_t name_len, const char *value,
    size_t value_len)
{
    p = idem_netstring_put(p, name, name_len);
    return idem_netstring_put(p, value, value_len);
}


static int
idem_netstring_get(idem_hdrs_iter_t *it, const char **s, size_t *len)
{
    size_t       n, digits;
    const char  *p;

    n = 0;
    digits = 0;

    for (p = it->pos; p < it->end && *p >= '0' && *p <= '9'; p++) {
        if (digits == 1 && n == 0) {
            return -1;                      /* leading zero */
        }

        n = n * 10 + (size_t) (*p - '0');
        digits++;

        if (n > IDEM_HDRS_FIELD_MAX) {
            return -1;
        }
    }

    if (digits == 0 || p >= it->end || *p != ':') {
        return -1;
    }

    p++;

    if ((size_t) (it->end - p) < n + 1 || p[n] != ',') {
        return -1;
    }

    *s = p;
    *len = n;
    it->pos = p + n + 1;

    return 0;
}


int
idem_hdrs_next(idem_hdrs_iter_t *it, const char **name, size_t *name_len,
    const char **value, size_t *value_len)
{
    if (it->pos == it->end) {
        return 0;
    }

    if (idem_netstring_get(it, name, name_len) != 0
        || *name_len == 0
        || idem_netstring_get(it, value, value_len) != 0)
    {
        return -1;
    }

    return 1;
}


static int
idem_rv_is(const idem_rv_t *v, const char *lit)
{
    size_t  len = strlen(lit);

    return v->is_str && v->len == len && memcmp(v->data, lit, len) == 0;
}


/* an operation id or fingerprint as the scripts write them: 1..64 hex */
int
idem_is_hex(const char *p, size_t len)
{
    size_t  i;

    if (len == 0 || len > 64) {
        return 0;
    }

    for (i = 0; i < len; i++) {
        if (!((p[i] >= '0' && p[i] <= '9') || (p[i] >= 'a' && p[i] <= 'f'))) {
            return 0;
        }
    }

    return 1;
}


/* 1..18 decimal digits (no sign, no overflow), or -1 */
static long long
idem_rv_decimal(const idem_rv_t *v)
{
    size_t     i;
    long long  n;

    if (!v->is_str || v->len == 0 || v->len > 18) {
        return -1;
    }

    n = 0;

    for (i = 0; i < v->len; i++) {
        if (v->data[i] < '0' || v->data[i] > '9') {
            return -1;
        }

        n = n * 10 + (v->data[i] - '0');
    }

    return n;
}


/* the record state an element names, as a static string, or NULL */
static const char *
idem_rv_state(const idem_rv_t *v)
{
    static const char  *states[] = { "in_progress", "completed", "unknown" };
    size_t              i;

    for (i = 0; i < sizeof(states) / sizeof(states[0]); i++) {
        if (idem_rv_is(v, states[i])) {
            return states[i];
        }
    }

    return NULL;
}


static idem_claim_kind_e
idem_claim_completed(const idem_rv_t *el, size_t n, idem_claim_t *c)
{
    long long  status;

    if (n != 6) {
        return IDEM_CLAIM_CORRUPT;
    }

    status = idem_rv_decimal(&el[2]);

    if (status < 200 || status > 599
        || !el[3].is_str || !el[4].is_str || !el[5].is_str)
    {
        return IDEM_CLAIM_CORRUPT;
    }

    c->status = (int) status;
    c->hdr = el[3];
    c->body = el[4];
    c->body_stored = idem_rv_is(&el[5], "1");
    c->state = "completed";

    return IDEM_CLAIM_COMPLETED;
}


static idem_claim_kind_e
idem_claim_kind(const idem_rv_t *el, size_t n, idem_claim_t *c)
{
    long long  left;

    if (n < 2 || !el[0].is_str || !el[1].is_str || !idem_is_hex(el[1].data, el[1].len)) {
        return IDEM_CLAIM_INVALID;
    }

    c->op = el[1];

    if (idem_rv_is(&el[0], "claimed")) {
        c->state = "in_progress";
        return IDEM_CLAIM_CLAIMED;
    }

    if (idem_rv_is(&el[0], "completed")) {
        return idem_claim_completed(el, n, c);
    }

    if (idem_rv_is(&el[0], "in_progress")) {
        left = (n == 3) ? idem_rv_decimal(&el[2]) : -1;
        if (left < 0) {
            return IDEM_CLAIM_INVALID;
        }

        c->lease_left = (unsigned long long) left;
        c->state = "in_progress";
        return IDEM_CLAIM_IN_PROGRESS;
    }

    if (idem_rv_is(&el[0], "unknown")) {
        c->state = "unknown";
        return IDEM_CLAIM_UNKNOWN;
    }

    if (idem_rv_is(&el[0], "mismatch") && n == 3) {
        c->state = idem_rv_state(&el[2]);
        if (c->state) {
            return IDEM_CLAIM_MISMATCH;
        }
    }

    return IDEM_CLAIM_INVALID;
}


idem_claim_kind_e
idem_claim_decode(const idem_rv_t *el, size_t n, idem_claim_t *c)
{
    memset(c, 0, sizeof(*c));

    c->kind = idem_claim_kind(el, n, c);

    if (c->kind == IDEM_CLAIM_INVALID) {
        memset(c, 0, sizeof(*c));
    }

    return c->kind;
}


/* an optional field: "" is absent (dflt); else a decimal in [min, max] */
static int
idem_rv_optional(const idem_rv_t *v, long long min, long long max,
    long long dflt, long long *out)
{
    long long  n;

    if (v->is_str && v->len == 0) {
        *out = dflt;
        return 0;
    }

    n = idem_rv_decimal(v);

    if (n < min || n > max) {
        return -1;
    }

    *out = n;

    return 0;
}


static idem_status_kind_e
idem_status_kind(const idem_rv_t *el, size_t n, idem_status_t *s)
{
    long long  status;

    if (n == 0) {
        return IDEM_STATUS_NONE;
    }

    if (n != IDEM_STATUS_ELEMS) {
        return IDEM_STATUS_INVALID;
    }

    s->state = idem_rv_state(&el[0]);

    if (s->state == NULL
        || !el[1].is_str || el[1].len != 64 || !idem_is_hex(el[1].data, 64)
        || !el[2].is_str || !idem_is_hex(el[2].data, el[2].len)
        || idem_rv_optional(&el[3], 0, IDEM_TIME_MS_MAX, -1, &s->created)
        || idem_rv_optional(&el[4], 0, IDEM_TIME_MS_MAX, -1, &s->completed)
        || idem_rv_optional(&el[5], 200, 599, 0, &status))
    {
        return IDEM_STATUS_INVALID;
    }

    /* what the claim would refuse to replay, the status does not show */
    if (status == 0 && strcmp(s->state, "completed") == 0) {
        return IDEM_STATUS_INVALID;
    }

    s->fp = el[1];
    s->op = el[2];
    s->status = (int) status;

    return IDEM_STATUS_RECORD;
}


idem_status_kind_e
idem_status_decode(const idem_rv_t *el, size_t n, idem_status_t *s)
{
    idem_status_kind_e  kind;

    memset(s, 0, sizeof(*s));

    kind = idem_status_kind(el, n, s);

    /* no record, or not an answer status.lua gives: nothing is set */
    if (kind != IDEM_STATUS_RECORD) {
        memset(s, 0, sizeof(*s));
    }

    s->kind = kind;

    return kind;
}


idem_admin_kind_e
idem_admin_decode(const idem_rv_t *el, size_t n, const char **state)
{
    *state = NULL;

    if (n == 1 && idem_rv_is(&el[0], "none")) {
        return IDEM_ADMIN_NONE;
    }

    if (n == 1 && idem_rv_is(&el[0], "released")) {
        return IDEM_ADMIN_RELEASED;
    }

    if (n == 1 && idem_rv_is(&el[0], "completed")) {
        return IDEM_ADMIN_COMPLETED;
    }

    if (n == 2 && idem_rv_is(&el[0], "refused")
        && (idem_rv_is(&el[1], "in_progress")
            || idem_rv_is(&el[1], "completed")))
    {
        *state = idem_rv_state(&el[1]);
        return IDEM_ADMIN_REFUSED;
    }

    return IDEM_ADMIN_INVALID;
}
