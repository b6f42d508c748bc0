/*
 * Lines of the audit file device: writer, reader and the checks of
 * idempotency-audit verify --file (idem_audit_file.h, docs/audit.md).
 */

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>

#include "idem_audit_file.h"
#include "idem_fingerprint.h"
#include "idem_jcs.h"
#include "idem_pointer.h"
#include "idem_record.h"
#include "idem_text.h"


/* the members in RFC 8785 order (all ASCII), "hash" apart */
enum {
    F_APPROVER = 0, F_EVENT, F_FP, F_IDENTITY, F_KEY, F_OP, F_PREV, F_REF,
    F_REQUEST, F_RESPONSE, F_ROUTE, F_SEQ, F_STATUS, F_TIME, F_V, F_HASH,
    F_N
};

static const char  *idem_audit_file_names[F_N] = {
    "approver", "event", "fingerprint", "identity", "key", "operation_id",
    "prev", "ref", "request_id", "response_sha256", "route", "seq",
    "status", "time", "v", "hash"
};


size_t
idem_audit_file_line_max(const idem_audit_entry_t *e)
{
    return 400 + 2 * IDEM_AUDIT_HASH_LEN
           + 6 * (e->approver.len + e->identity.len + e->key.len
                  + e->ref.len + e->route.len + e->op.len + e->fp.len
                  + e->request.len + e->response.len);
}


/*
 * The length of the run at d (at most len) of bytes written as they are:
 * printable ASCII but '"' and '\\'.  Eight bytes at a time while they
 * all are (most of a line: hex digests, ids, paths).
 */
static size_t
idem_audit_file_plain(const unsigned char *d, size_t len)
{
    size_t    i;
    uint64_t  x, bad;

    const uint64_t  ones = 0x0101010101010101ULL;
    const uint64_t  high = 0x8080808080808080ULL;

    for (i = 0; i + 8 <= len; i += 8) {
        memcpy(&x, d + i, 8);

        /* a byte < 0x20, >= 0x80, '"' or '\\' sets its high bit here */
        bad = ((x - ones * 0x20) | x
               | ((x ^ (ones * '"')) - ones)
               | ((x ^ (ones * '\\')) - ones)) & high;

        if (bad) {
            break;
        }
    }

    for ( /* void */ ; i < len && d[i] >= 0x20 && d[i] < 0x80
                       && d[i] != '"' && d[i] != '\\'; i++)
    {
        /* void */
    }

    return i;
}


/* s as a canonical JSON string; a byte that is not UTF-8 as U+00XX */
static char *
idem_audit_file_str(char *p, const char *name, size_t name_len,
    const idem_str_t *s)
{
    char                  esc[6];
    size_t                i, n, k, run;
    uint32_t              cp;
    const unsigned char  *d;

    *p++ = '"';
    p = (char *) memcpy(p, name, name_len) + name_len;
    *p++ = '"';
    *p++ = ':';
    *p++ = '"';
    d = (const unsigned char *) s->data;

    for (i = 0; i < s->len; i += n) {
        /* most bytes are printable ASCII: copied in runs */
        run = i + idem_audit_file_plain(d + i, s->len - i);

        if (run > i) {
            p = (char *) memcpy(p, d + i, run - i) + (run - i);
            n = run - i;
            continue;
        }

        n = idem_utf8_decode(d + i, s->len - i, &cp);

        if (n == 0) {
            p += idem_utf8_encode(d[i], (unsigned char *) p);
            n = 1;

        } else if (cp < 0x20 || cp == '"' || cp == '\\') {
            k = idem_json_escape(cp, esc);
            p = (char *) memcpy(p, esc, k) + k;

        } else {
            p = (char *) memcpy(p, d + i, n) + n;
        }
    }

    *p++ = '"';
    *p++ = ',';

    return p;
}


/* the decimal digits of n at p */
static char *
idem_audit_file_num(char *p, uint64_t n)
{
    char    tmp[24];
    size_t  len;

    len = 0;

    do {
        tmp[len++] = (char) ('0' + n % 10);
        n /= 10;
    } while (n);

    while (len) {
        *p++ = tmp[--len];
    }

    return p;
}


#define idem_audit_file_put(p, lit)                                          \
    ((char *) memcpy(p, lit, sizeof(lit) - 1) + sizeof(lit) - 1)

#define idem_audit_file_field(p, name, s)                                    \
    idem_audit_file_str(p, name, sizeof(name) - 1, s)


/* the canonical form without "hash" at p; returns its end */
static char *
idem_audit_file_body(char *p, const idem_audit_entry_t *e)
{
    idem_str_t  ev;

    ev.data = idem_audit_event_name(e->event);
    ev.len = strlen(ev.data);

    *p++ = '{';
    p = idem_audit_file_field(p, "approver", &e->approver);
    p = idem_audit_file_field(p, "event", &ev);
    p = idem_audit_file_field(p, "fingerprint", &e->fp);
    p = idem_audit_file_field(p, "identity", &e->identity);
    p = idem_audit_file_field(p, "key", &e->key);
    p = idem_audit_file_field(p, "operation_id", &e->op);
    p = idem_audit_file_field(p, "prev", &e->prev);
    p = idem_audit_file_field(p, "ref", &e->ref);
    p = idem_audit_file_field(p, "request_id", &e->request);
    p = idem_audit_file_field(p, "response_sha256", &e->response);
    p = idem_audit_file_field(p, "route", &e->route);
    p = idem_audit_file_put(p, "\"seq\":");
    p = idem_audit_file_num(p, e->seq);
    p = idem_audit_file_put(p, ",\"status\":");

    if (e->status) {
        p = idem_audit_file_num(p, (uint64_t) e->status);
    } else {
        p = idem_audit_file_put(p, "null");
    }

    p = idem_audit_file_put(p, ",\"time\":");
    p = idem_audit_file_num(p, (uint64_t) e->time);
    p = idem_audit_file_put(p, ",\"v\":1}");

    return p;
}


/* the body's closing brace replaced: "hash" goes last */
static char *
idem_audit_file_end(char *p, const char hash[IDEM_AUDIT_HASH_LEN + 1])
{
    p--;
    p = idem_audit_file_put(p, ",\"hash\":\"");
    p = (char *) memcpy(p, hash, IDEM_AUDIT_HASH_LEN) + IDEM_AUDIT_HASH_LEN;
    p = idem_audit_file_put(p, "\"}\n");

    return p;
}


char *
idem_audit_file_line(char *p, const idem_audit_entry_t *e,
    const unsigned char *key, size_t key_len,
    char hash[IDEM_AUDIT_HASH_LEN + 1])
{
    char  *start;

    start = p;
    p = idem_audit_file_body(p, e);

    if (idem_audit_hash(start, p - start, key, key_len, hash) != 0) {
        return NULL;
    }

    return idem_audit_file_end(p, hash);
}


char *
idem_audit_file_line_h(char *p, const idem_audit_entry_t *e,
    idem_audit_file_hasher_t *h, char hash[IDEM_AUDIT_HASH_LEN + 1])
{
    char  *start;

    start = p;
    p = idem_audit_file_body(p, e);

    if (idem_audit_file_hash(h, start, p - start, hash) != 0) {
        return NULL;
    }

    return idem_audit_file_end(p, hash);
}


/* ------------------------------------------------------------ hash */

#define IDEM_SHA256_BLOCK  64

struct idem_audit_file_hasher_s {
    EVP_MD_CTX  *work;
    EVP_MD_CTX  *inner;     /* NULL: plain SHA-256 */
    EVP_MD_CTX  *outer;
};


/* a context that has absorbed the key padded and XORed with pad */
static EVP_MD_CTX *
idem_audit_file_pad(const unsigned char k[IDEM_SHA256_BLOCK], unsigned char pad)
{
    int            ok;
    size_t         i;
    EVP_MD_CTX    *c;
    unsigned char  b[IDEM_SHA256_BLOCK];

    for (i = 0; i < IDEM_SHA256_BLOCK; i++) {
        b[i] = k[i] ^ pad;
    }

    c = EVP_MD_CTX_new();
    ok = c && EVP_DigestInit_ex(c, idem_sha256(), NULL)
         && EVP_DigestUpdate(c, b, sizeof(b));
    OPENSSL_cleanse(b, sizeof(b));

    if (!ok) {
        EVP_MD_CTX_free(c);
        return NULL;
    }

    return c;
}


idem_audit_file_hasher_t *
idem_audit_file_hasher(const unsigned char *key, size_t key_len)
{
    unsigned int               n;
    unsigned char              k[IDEM_SHA256_BLOCK];
    idem_audit_file_hasher_t  *h;

    h = calloc(1, sizeof(idem_audit_file_hasher_t));
    if (h == NULL || (h->work = EVP_MD_CTX_new()) == NULL) {
        idem_audit_file_hasher_free(h);
        return NULL;
    }

    if (key == NULL) {
        return h;
    }

    /* RFC 2104: a key longer than a block is its digest */
    memset(k, 0, sizeof(k));

    if (key_len > IDEM_SHA256_BLOCK) {
        if (EVP_Digest(key, key_len, k, &n, idem_sha256(), NULL) != 1) {
            idem_audit_file_hasher_free(h);
            return NULL;
        }

    } else if (key_len) {
        memcpy(k, key, key_len);
    }

    h->inner = idem_audit_file_pad(k, 0x36);
    h->outer = idem_audit_file_pad(k, 0x5c);
    OPENSSL_cleanse(k, sizeof(k));

    if (h->inner == NULL || h->outer == NULL) {
        idem_audit_file_hasher_free(h);
        return NULL;
    }

    return h;
}


void
idem_audit_file_hasher_free(idem_audit_file_hasher_t *h)
{
    if (h) {
        EVP_MD_CTX_free(h->work);
        EVP_MD_CTX_free(h->inner);
        EVP_MD_CTX_free(h->outer);
        free(h);
    }
}


int
idem_audit_file_hash(idem_audit_file_hasher_t *h, const char *p, size_t len,
    char hash[IDEM_AUDIT_HASH_LEN + 1])
{
    int            ok;
    unsigned int   n;
    unsigned char  md[EVP_MAX_MD_SIZE];

    ok = h->inner ? EVP_MD_CTX_copy_ex(h->work, h->inner)
                  : EVP_DigestInit_ex(h->work, idem_sha256(), NULL);

    ok = ok && EVP_DigestUpdate(h->work, p, len)
         && EVP_DigestFinal_ex(h->work, md, &n);

    if (ok && h->outer) {
        ok = EVP_MD_CTX_copy_ex(h->work, h->outer)
             && EVP_DigestUpdate(h->work, md, n)
             && EVP_DigestFinal_ex(h->work, md, &n);
    }

    if (!ok || n != IDEM_AUDIT_HASH_LEN / 2) {
        return -1;
    }

    idem_hex(md, n, hash);

    return 0;
}


/* ------------------------------------------------------------ read */

__attribute__((format(printf, 3, 4)))
static int
idem_audit_file_why(char *why, size_t len, const char *fmt, ...)
{
    va_list  ap;

    va_start(ap, fmt);
    vsnprintf(why, len, fmt, ap);
    va_end(ap);

    return -1;
}


static int
idem_audit_file_member(const char *name)
{
    int  i;

    for (i = 0; i < F_N; i++) {
        if (strcmp(idem_audit_file_names[i], name) == 0) {
            return i;
        }
    }

    return -1;
}


/* an integer member in [min, 2^53] */
static int
idem_audit_file_int(cJSON *m, double min, uint64_t *n)
{
    double  d;

    if (!cJSON_IsNumber(m)) {
        return -1;
    }

    d = m->valuedouble;

    if (d < min || d > 9007199254740992.0 || d != (double) (uint64_t) d) {
        return -1;
    }

    *n = (uint64_t) d;

    return 0;
}


static void
idem_audit_file_set(idem_str_t *s, cJSON *m)
{
    s->data = m->valuestring;
    s->len = strlen(m->valuestring);
}


/* the members, each once, of the right type */
static int
idem_audit_file_members(cJSON *o, cJSON *f[F_N], char *why, size_t len)
{
    int     i;
    cJSON  *m;

    memset(f, 0, F_N * sizeof(cJSON *));

    for (m = o->child; m; m = m->next) {
        i = idem_audit_file_member(m->string);

        if (i < 0) {
            return idem_audit_file_why(why, len, "a member the format does "
                                       "not define: \"%.64s\"", m->string);
        }

        if (f[i]) {
            return idem_audit_file_why(why, len, "\"%s\" twice", m->string);
        }

        f[i] = m;
    }

    for (i = 0; i < F_N; i++) {
        if (f[i] == NULL) {
            return idem_audit_file_why(why, len, "no \"%s\"",
                                       idem_audit_file_names[i]);
        }

        if (i != F_SEQ && i != F_STATUS && i != F_TIME && i != F_V
            && !cJSON_IsString(f[i]))
        {
            return idem_audit_file_why(why, len, "\"%s\" is not a string",
                                       idem_audit_file_names[i]);
        }
    }

    return 0;
}


static int
idem_audit_file_hex(const idem_str_t *s, size_t len, int empty)
{
    return (empty && s->len == 0)
           || (s->len == len && idem_is_hex(s->data, s->len));
}


static int
idem_audit_file_values(cJSON *f[F_N], idem_audit_entry_t *e, char *why,
    size_t len)
{
    int       ev;
    uint64_t  n;

    if (idem_audit_file_int(f[F_V], 0, &n) != 0
        || n != IDEM_AUDIT_FILE_VERSION)
    {
        return idem_audit_file_why(why, len, "\"v\" is not %d",
                                   IDEM_AUDIT_FILE_VERSION);
    }

    if (idem_audit_file_int(f[F_SEQ], 1, &e->seq) != 0
        || idem_audit_file_int(f[F_TIME], 0, &n) != 0)
    {
        return idem_audit_file_why(why, len, "\"seq\" or \"time\" is not a "
                                   "whole number");
    }

    e->time = (int64_t) n;

    if (!cJSON_IsNull(f[F_STATUS])) {
        if (idem_audit_file_int(f[F_STATUS], 100, &n) != 0 || n > 999) {
            return idem_audit_file_why(why, len, "\"status\" is neither "
                                       "null nor a status");
        }

        e->status = (int) n;
    }

    ev = idem_audit_event_parse(f[F_EVENT]->valuestring,
                                strlen(f[F_EVENT]->valuestring));
    if (ev < 0) {
        return idem_audit_file_why(why, len, "\"event\" is not an event");
    }

    e->event = (idem_audit_event_e) ev;

    idem_audit_file_set(&e->approver, f[F_APPROVER]);
    idem_audit_file_set(&e->fp, f[F_FP]);
    idem_audit_file_set(&e->identity, f[F_IDENTITY]);
    idem_audit_file_set(&e->key, f[F_KEY]);
    idem_audit_file_set(&e->op, f[F_OP]);
    idem_audit_file_set(&e->prev, f[F_PREV]);
    idem_audit_file_set(&e->ref, f[F_REF]);
    idem_audit_file_set(&e->request, f[F_REQUEST]);
    idem_audit_file_set(&e->response, f[F_RESPONSE]);
    idem_audit_file_set(&e->route, f[F_ROUTE]);

    if (!idem_audit_file_hex(&e->prev, IDEM_AUDIT_HASH_LEN, 0)
        || !idem_audit_file_hex(&e->op, IDEM_TOKEN_LEN, 1)
        || !idem_audit_file_hex(&e->request, IDEM_TOKEN_LEN, 1)
        || !idem_audit_file_hex(&e->fp, IDEM_FP_LEN, 1)
        || !idem_audit_file_hex(&e->response, IDEM_AUDIT_HASH_LEN, 1))
    {
        return idem_audit_file_why(why, len, "a digest or id that is not "
                                   "lowercase hex of its length");
    }

    return 0;
}


int
idem_audit_file_parse(const char *line, size_t len, idem_audit_entry_t *e,
    char hash[IDEM_AUDIT_HASH_LEN + 1], void **tree, char *why,
    size_t why_len)
{
    cJSON       *o, *f[F_N];
    idem_str_t   h;

    memset(e, 0, sizeof(idem_audit_entry_t));

    o = cJSON_ParseWithLength(line, len);
    *tree = o;

    if (!cJSON_IsObject(o)) {
        return idem_audit_file_why(why, why_len, "not a JSON object");
    }

    if (idem_audit_file_members(o, f, why, why_len) != 0
        || idem_audit_file_values(f, e, why, why_len) != 0)
    {
        return -1;
    }

    idem_audit_file_set(&h, f[F_HASH]);

    if (!idem_audit_file_hex(&h, IDEM_AUDIT_HASH_LEN, 0)) {
        return idem_audit_file_why(why, why_len, "\"hash\" is not 64 "
                                   "lowercase hex");
    }

    memcpy(hash, h.data, IDEM_AUDIT_HASH_LEN + 1);

    return 0;
}


void
idem_audit_file_free(void *tree)
{
    cJSON_Delete(tree);
}


/* ------------------------------------------------------------ verify */

void
idem_audit_file_verify_init(idem_audit_file_verify_t *v,
    const unsigned char *key, size_t key_len, int partial)
{
    memset(v, 0, sizeof(idem_audit_file_verify_t));

    v->key = key;
    v->key_len = key_len;
    v->partial = partial;
    memcpy(v->hash, idem_audit_genesis, IDEM_AUDIT_HASH_LEN + 1);
}


__attribute__((format(printf, 3, 4)))
static int
idem_audit_file_fault(idem_audit_file_verify_t *v, idem_audit_fault_e fault,
    const char *fmt, ...)
{
    va_list  ap;

    v->fault = fault;

    va_start(ap, fmt);
    vsnprintf(v->why, sizeof(v->why), fmt, ap);
    va_end(ap);

    return -1;
}


/* the line's canonical form without "hash", hashed as the writer did */
static int
idem_audit_file_rehash(const char *line, size_t len, const unsigned char *key,
    size_t key_len, char want[IDEM_AUDIT_HASH_LEN + 1],
    char plain[IDEM_AUDIT_HASH_LEN + 1])
{
    int                     rc;
    idem_sink_t             sink;
    idem_ptr_set_t         *excl;
    idem_sink_buf_t         b;

    memset(&b, 0, sizeof(b));
    sink.write = idem_sink_buf_write;
    sink.data = &b;

    excl = idem_ptr_set_create();
    rc = -1;

    if (excl && idem_ptr_set_add(excl, "/hash", 5) == IDEM_PTR_OK
        && idem_jcs_canonicalize_excluding(line, len, excl, &sink)
           == IDEM_JCS_OK
        && idem_audit_hash(b.data, b.len, key, key_len, want) == 0
        && idem_audit_hash(b.data, b.len, NULL, 0, plain) == 0)
    {
        rc = 0;
    }

    idem_ptr_set_free(excl);
    free(b.data);

    return rc;
}


static int
idem_audit_file_place(idem_audit_file_verify_t *v, idem_audit_entry_t *e)
{
    unsigned long long  seq = e->seq, last = v->seq;

    if (v->count == 0) {
        if (seq != 1 && !v->partial) {
            return idem_audit_file_fault(v, IDEM_AUDIT_MISSING,
                       "the first line is entry %llu: entries 1 to %llu are "
                       "not in the files given (give the older files too, "
                       "or --partial)", seq, seq - 1);
        }

        if (seq == 1 && memcmp(e->prev.data, idem_audit_genesis,
                               IDEM_AUDIT_HASH_LEN) != 0)
        {
            return idem_audit_file_fault(v, IDEM_AUDIT_MODIFIED,
                       "entry 1 is not chained on the genesis hash");
        }

        v->first = seq;
        return 0;
    }

    if (seq > last + 1) {
        return idem_audit_file_fault(v, IDEM_AUDIT_MISSING,
                   "entry %llu follows entry %llu: entries %llu to %llu are "
                   "not there", seq, last, last + 1, seq - 1);
    }

    if (seq <= last) {
        return idem_audit_file_fault(v, IDEM_AUDIT_REORDERED,
                   "entry %llu follows entry %llu: a line was moved, copied "
                   "or put in", seq, last);
    }

    if (memcmp(e->prev.data, v->hash, IDEM_AUDIT_HASH_LEN) == 0) {
        return 0;
    }

    if (v->count > 1
        && memcmp(e->prev.data, v->before, IDEM_AUDIT_HASH_LEN) == 0)
    {
        return idem_audit_file_fault(v, IDEM_AUDIT_INSERTED,
                   "entry %llu is chained on the line before the previous "
                   "one: the previous line was put in", seq);
    }

    return idem_audit_file_fault(v, IDEM_AUDIT_MODIFIED,
               "entry %llu is chained on another hash than the previous "
               "line's: that line was replaced", seq);
}


int
idem_audit_file_verify_next(idem_audit_file_verify_t *v, const char *line,
    size_t len)
{
    int                  rc;
    char                 hash[IDEM_AUDIT_HASH_LEN + 1], why[200];
    char                 want[IDEM_AUDIT_HASH_LEN + 1];
    char                 plain[IDEM_AUDIT_HASH_LEN + 1];
    void                *tree;
    idem_audit_entry_t   e;

    rc = idem_audit_file_parse(line, len, &e, hash, &tree, why, sizeof(why));

    if (rc != 0) {
        idem_audit_file_free(tree);
        return idem_audit_file_fault(v, IDEM_AUDIT_MODIFIED,
                   "not an entry the module writes: %s", why);
    }

    if (idem_audit_file_rehash(line, len, v->key, v->key_len, want, plain)
        != 0)
    {
        rc = idem_audit_file_fault(v, IDEM_AUDIT_MODIFIED,
                                   "its canonical form cannot be made");

    } else if (strcmp(hash, want) != 0) {
        rc = (v->key && strcmp(hash, plain) == 0)
             ? idem_audit_file_fault(v, IDEM_AUDIT_WRONG_HMAC,
                   "its hash is a plain SHA-256: written without the key")
             : idem_audit_file_fault(v, IDEM_AUDIT_MODIFIED,
                   "its %s does not match its fields%s",
                   v->key ? "HMAC" : "hash",
                   v->key ? "" : " (a file written with "
                                 "idempotency_audit_key needs --key-file)");

    } else {
        rc = idem_audit_file_place(v, &e);
    }

    idem_audit_file_free(tree);

    if (rc != 0) {
        return -1;
    }

    memcpy(v->before, v->hash, sizeof(v->before));
    memcpy(v->hash, hash, sizeof(v->hash));
    v->seq = e.seq;
    v->count++;

    return 0;
}
