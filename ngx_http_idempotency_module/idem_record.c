/*
 * The record key, the netstrings of stored headers, and the layout-2
 * record value: its decoder is what the module accepts from Redis before
 * it replays or refuses anything, its encoder what it writes.
 */

#include <stdint.h>
#include <string.h>
#include <openssl/evp.h>

#include "idem_record.h"
#include "idem_fingerprint.h"
#include "idem_text.h"


int
idem_record_key(const char *scope, size_t scope_len, const char *key,
    size_t key_len, char out[IDEM_RECORD_KEY_LEN + 1])
{
    return idem_derived_key("idem-record-v1", scope, scope_len, key, key_len,
                            IDEM_RECORD_SUFFIX, out);
}


int
idem_derived_key(const char *domain, const char *scope, size_t scope_len,
    const char *value, size_t value_len, const char *suffix,
    char out[IDEM_RECORD_KEY_LEN + 1])
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
         && EVP_DigestUpdate(md_ctx, domain, strlen(domain) + 1)
         && EVP_DigestUpdate(md_ctx, prefix, sizeof(prefix))
         && EVP_DigestUpdate(md_ctx, scope, scope_len)
         && EVP_DigestUpdate(md_ctx, value, value_len)
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

    memcpy(out + 32, suffix, sizeof(IDEM_RECORD_SUFFIX));

    return 0;
}


void
idem_sibling_key(const char *rkey, const char *suffix,
    char out[IDEM_RECORD_KEY_LEN + 1])
{
    size_t  n;

    n = IDEM_RECORD_KEY_LEN - (sizeof(IDEM_RECORD_SUFFIX) - 1);

    memcpy(out, rkey, n);
    memcpy(out + n, suffix, sizeof(IDEM_RECORD_SUFFIX));
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
    return idem_netstring_len(name_len) + idem_netstring_len(value_len);
}


size_t
idem_netstring_len(size_t len)
{
    return idem_dec_len(len) + 2 + len;
}


char *
idem_netstring_put(char *p, const char *s, size_t len)
{
    p = idem_decimal(p, len);
    *p++ = ':';

    /* an empty field may have no bytes at all (NULL), which memcpy must not see */
    if (len) {
        memcpy(p, s, len);
    }

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


int
idem_netstring_get(idem_hdrs_iter_t *it, const char **s, size_t *len,
    size_t max)
{
    size_t       n, digits;
    const char  *p;

    n = 0;
    digits = 0;

    for (p = it->pos; p < it->end && *p >= '0' && *p <= '9'; p++) {
        if ((digits == 1 && n == 0)                 /* leading zero */
            || n > (max - (size_t) (*p - '0')) / 10)
        {
            return -1;
        }

        n = n * 10 + (size_t) (*p - '0');
        digits++;
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

    if (idem_netstring_get(it, name, name_len, IDEM_HDRS_FIELD_MAX) != 0
        || *name_len == 0
        || idem_netstring_get(it, value, value_len, IDEM_HDRS_FIELD_MAX) != 0)
    {
        return -1;
    }

    return 1;
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


/* the record value, layout 2 */

static const char  idem_no_owner[IDEM_TOKEN_LEN + 1] =
    "--------------------------------";


const char *
idem_state_name(char state)
{
    switch (state) {
    case 'i':
        return "in_progress";
    case 'c':
        return "completed";
    case 'u':
        return "unknown";
    case 'r':
        return "released";
    case 'a':
        return "awaiting_confirmation";
    case 'p':
        return "approved";
    case 'd':
        return "declined";
    case 's':
        return "alias";
    default:
        return NULL;
    }
}


/* a decimal field: 0..10^18-1 without leading zeros, -1 for "" */
static int
idem_field_num(const char *s, size_t len, long long min, long long max,
    int empty_ok, long long *out)
{
    size_t     i;
    long long  n;

    if (len == 0) {
        *out = -1;
        return empty_ok ? 0 : -1;
    }

    if (len > IDEM_NUM_MAX || (len > 1 && s[0] == '0')) {
        return -1;
    }

    n = 0;

    for (i = 0; i < len; i++) {
        if (s[i] < '0' || s[i] > '9') {
            return -1;
        }

        n = n * 10 + (s[i] - '0');
    }

    if (n < min || n > max) {
        return -1;
    }

    *out = n;

    return 0;
}


typedef struct {
    idem_hdrs_iter_t   it;
    int                bad;
} idem_fields_t;


static long long
idem_fields_num(idem_fields_t *f, long long min, long long max, int empty_ok)
{
    size_t       len;
    long long    n;
    const char  *s;

    if (f->bad || idem_netstring_get(&f->it, &s, &len, IDEM_NUM_MAX) != 0
        || idem_field_num(s, len, min, max, empty_ok, &n) != 0)
    {
        f->bad = 1;
        return -1;
    }

    return n;
}


static const char *
idem_fields_str(idem_fields_t *f, size_t *len)
{
    const char  *s;

    if (f->bad || idem_netstring_get(&f->it, &s, len, (size_t) -1 / 2) != 0) {
        f->bad = 1;
        return NULL;
    }

    return s;
}


int
idem_is_key(const char *p, size_t len, const char *suffix)
{
    size_t  pre;

    pre = sizeof(IDEM_RECORD_PREFIX) - 1;

    return len == IDEM_RECORD_KEY_LEN
           && strlen(suffix) == sizeof(IDEM_RECORD_SUFFIX) - 1
           && memcmp(p, IDEM_RECORD_PREFIX, pre) == 0
           && idem_is_hex(p + pre, 32)
           && memcmp(p + pre + 32, suffix, sizeof(IDEM_RECORD_SUFFIX) - 1)
              == 0;
}


/* what idem_record_key() writes */
static int
idem_is_record_key(const char *p, size_t len)
{
    return idem_is_key(p, len, IDEM_RECORD_SUFFIX);
}


static void
idem_value_fields(idem_fields_t *f, idem_value_t *v)
{
    size_t     len;
    long long  n;

    switch (v->state) {

    case 'i':
        v->created = idem_fields_num(f, 0, IDEM_TIME_MS_MAX, 0);
        v->lease_ms = idem_fields_num(f, 1, IDEM_TIME_MS_MAX, 0);
        v->ttl_ms = idem_fields_num(f, 1, IDEM_TIME_MS_MAX, 0);
        break;

    case 'c':
        v->created = idem_fields_num(f, 0, IDEM_TIME_MS_MAX, 0);
        v->completed = idem_fields_num(f, 0, IDEM_TIME_MS_MAX, 0);
        v->status = (int) idem_fields_num(f, 200, 599, 0);
        v->stored = (int) idem_fields_num(f, 0, 1, 0);
        v->resolved = (int) idem_fields_num(f, 0, 1, 0);
        v->hdr = idem_fields_str(f, &v->hdr_len);
        v->body = idem_fields_str(f, &v->body_len);
        break;

    case 'u':
        v->created = idem_fields_num(f, 0, IDEM_TIME_MS_MAX, 0);
        v->unknown_at = idem_fields_num(f, 0, IDEM_TIME_MS_MAX, 0);
        break;

    case 'a':
        v->created = idem_fields_num(f, 0, IDEM_TIME_MS_MAX, 0);
        v->expires = idem_fields_num(f, 0, IDEM_TIME_MS_MAX, 0);
        break;

    case 'p':
    case 'd':
        v->created = idem_fields_num(f, 0, IDEM_TIME_MS_MAX, 0);
        v->expires = idem_fields_num(f, 0, IDEM_TIME_MS_MAX, 0);
        v->approved_until = idem_fields_num(f, 0, IDEM_TIME_MS_MAX, 0);
        v->approver = idem_fields_str(f, &v->approver_len);

        if (v->approver_len == 0 || v->approver_len > IDEM_APPROVER_MAX) {
            f->bad = 1;
        }

        break;

    case 's':
        v->created = idem_fields_num(f, 0, IDEM_TIME_MS_MAX, 0);
        v->target = idem_fields_str(f, &len);

        if (v->target && !idem_is_record_key(v->target, len)) {
            f->bad = 1;
        }

        break;

    default: /* 'r' */
        n = idem_fields_num(f, 200, 599, 1);
        v->status = n < 0 ? 0 : (int) n;
        v->retry_after = idem_fields_num(f, 0, IDEM_TIME_MS_MAX, 1);
        break;
    }
}


static int
idem_value_head(const char *p, size_t len, idem_value_t *v)
{
    const char  *owner;

    if (len < IDEM_HEAD_LEN || p[IDEM_LAYOUT_OFF] != IDEM_LAYOUT
        || idem_state_name(p[IDEM_STATE_OFF]) == NULL
        || (p[IDEM_WAITERS_OFF] != '0' && p[IDEM_WAITERS_OFF] != '1')
        || !idem_is_hex(p + IDEM_OP_OFF, IDEM_TOKEN_LEN)
        || !idem_is_hex(p + IDEM_FP_OFF, IDEM_FP_LEN))
    {
        return -1;
    }

    owner = p + IDEM_OWNER_OFF;

    if (memcmp(owner, idem_no_owner, IDEM_TOKEN_LEN) == 0) {
        owner = NULL;

    } else if (!idem_is_hex(owner, IDEM_TOKEN_LEN)) {
        return -1;
    }

    /* a claim always has its owner; a closed record never has one */
    if ((p[IDEM_STATE_OFF] == 'i') != (owner != NULL)
        && p[IDEM_STATE_OFF] != 'r')
    {
        return -1;
    }

    v->state = p[IDEM_STATE_OFF];
    v->waiters = p[IDEM_WAITERS_OFF] == '1';
    v->op = p + IDEM_OP_OFF;
    v->fp = p + IDEM_FP_OFF;
    v->owner = owner;

    return 0;
}


int
idem_value_decode(const char *p, size_t len, idem_value_t *v)
{
    idem_fields_t  f;

    memset(v, 0, sizeof(*v));
    v->created = v->completed = v->unknown_at = v->expires = -1;
    v->approved_until = -1;
    v->retry_after = -1;

    if (idem_value_head(p, len, v) != 0) {
        goto invalid;
    }

    f.it.pos = p + IDEM_HEAD_LEN;
    f.it.end = p + len;
    f.bad = 0;

    idem_value_fields(&f, v);

    if (f.bad || f.it.pos != f.it.end) {
        goto invalid;
    }

    return 0;

invalid:

    memset(v, 0, sizeof(*v));

    return -1;
}


static size_t
idem_num_len(long long n)
{
    return n < 0 ? 0 : idem_dec_len((size_t) n);
}


/* the netstring of a decimal, or of "" for n < 0 */
static char *
idem_num_put(char *p, long long n)
{
    if (n < 0) {
        return idem_netstring_put(p, "", 0);
    }

    p = idem_decimal(p, idem_dec_len((size_t) n));
    *p++ = ':';
    p = idem_decimal(p, (size_t) n);
    *p++ = ',';

    return p;
}


size_t
idem_value_len(const idem_value_t *v)
{
    size_t  len;

#define idem_ns_len(n)  (idem_dec_len(n) + 2 + (n))

    len = IDEM_HEAD_LEN;

    switch (v->state) {

    case 'i':
        len += idem_ns_len(idem_num_len(v->created))
               + idem_ns_len(idem_num_len(v->lease_ms))
               + idem_ns_len(idem_num_len(v->ttl_ms));
        break;

    case 'c':
        len += idem_ns_len(idem_num_len(v->created))
               + idem_ns_len(idem_num_len(v->completed))
               + idem_ns_len(idem_num_len(v->status))
               + 2 * idem_ns_len(1)
               + idem_ns_len(v->hdr_len) + idem_ns_len(v->body_len);
        break;

    case 'u':
        len += idem_ns_len(idem_num_len(v->created))
               + idem_ns_len(idem_num_len(v->unknown_at));
        break;

    case 'a':
        len += idem_ns_len(idem_num_len(v->created))
               + idem_ns_len(idem_num_len(v->expires));
        break;

    case 'p':
    case 'd':
        len += idem_ns_len(idem_num_len(v->created))
               + idem_ns_len(idem_num_len(v->expires))
               + idem_ns_len(idem_num_len(v->approved_until))
               + idem_ns_len(v->approver_len);
        break;

    case 's':
        len += idem_ns_len(idem_num_len(v->created))
               + idem_ns_len(IDEM_RECORD_KEY_LEN);
        break;

    default: /* 'r' */
        len += idem_ns_len(idem_num_len(v->status ? v->status : -1))
               + idem_ns_len(idem_num_len(v->retry_after));
        break;
    }

#undef idem_ns_len

    return len;
}


char *
idem_value_encode(char *p, const idem_value_t *v)
{
    *p++ = IDEM_LAYOUT;
    *p++ = v->state;
    *p++ = v->waiters ? '1' : '0';
    memcpy(p, v->op, IDEM_TOKEN_LEN);
    memcpy(p + IDEM_TOKEN_LEN, v->fp, IDEM_FP_LEN);
    memcpy(p + IDEM_TOKEN_LEN + IDEM_FP_LEN,
           v->owner ? v->owner : idem_no_owner, IDEM_TOKEN_LEN);
    p += IDEM_HEAD_LEN - 3;

    switch (v->state) {

    case 'i':
        p = idem_num_put(p, v->created);
        p = idem_num_put(p, v->lease_ms);
        return idem_num_put(p, v->ttl_ms);

    case 'c':
        p = idem_num_put(p, v->created);
        p = idem_num_put(p, v->completed);
        p = idem_num_put(p, v->status);
        p = idem_num_put(p, v->stored ? 1 : 0);
        p = idem_num_put(p, v->resolved ? 1 : 0);
        p = idem_netstring_put(p, v->hdr, v->hdr_len);

        if (v->body == NULL) {
            /* the caller copies the body into its place, just before ',' */
            p = idem_decimal(p, v->body_len);
            *p++ = ':';
            p += v->body_len;
            *p++ = ',';
            return p;
        }

        return idem_netstring_put(p, v->body, v->body_len);

    case 'u':
        p = idem_num_put(p, v->created);
        return idem_num_put(p, v->unknown_at);

    case 'a':
        p = idem_num_put(p, v->created);
        return idem_num_put(p, v->expires);

    case 'p':
    case 'd':
        p = idem_num_put(p, v->created);
        p = idem_num_put(p, v->expires);
        p = idem_num_put(p, v->approved_until);
        return idem_netstring_put(p, v->approver, v->approver_len);

    case 's':
        p = idem_num_put(p, v->created);
        return idem_netstring_put(p, v->target, IDEM_RECORD_KEY_LEN);

    default: /* 'r' */
        p = idem_num_put(p, v->status ? v->status : -1);
        return idem_num_put(p, v->retry_after);
    }
}
