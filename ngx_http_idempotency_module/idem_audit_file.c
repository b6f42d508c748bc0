/*
 * Lines of the audit file device: writer, reader and the checks of
 * idempotency-audit verify --file (idem_audit_file.h, docs/audit.md).
 */

#include <stdarg.h>
#include <stddef.h>
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


/*
 * The ten fields of a request an event carries, by their members' names
 * in RFC 8785 order (all ASCII); "status", a number or null, last.
 */
enum {
    R_APPROVER = 0, R_FP, R_IDENTITY, R_KEY, R_OP, R_REF, R_REQUEST,
    R_RESPONSE, R_ROUTE, R_STATUS, R_N
};

typedef struct {
    const char  *name;
    size_t       len;
    size_t       off;       /* of its idem_str_t in idem_audit_entry_t */
    size_t       hex;       /* a digest: "" or lowercase hex this long */
} idem_audit_file_field_t;

#define idem_audit_file_def(name, member, hex)                               \
    { name, sizeof(name) - 1, offsetof(idem_audit_entry_t, member), hex }

static const idem_audit_file_field_t  idem_audit_file_fields[R_STATUS] = {
    idem_audit_file_def("approver", approver, 0),
    idem_audit_file_def("fingerprint", fp, IDEM_FP_LEN),
    idem_audit_file_def("identity", identity, 0),
    idem_audit_file_def("key", key, 0),
    idem_audit_file_def("operation_id", op, IDEM_TOKEN_LEN),
    idem_audit_file_def("ref", ref, 0),
    idem_audit_file_def("request_id", request, IDEM_TOKEN_LEN),
    idem_audit_file_def("response_sha256", response, IDEM_AUDIT_HASH_LEN),
    idem_audit_file_def("route", route, 0)
};

#define idem_audit_file_cs(e, i)                                             \
    ((const idem_str_t *) ((const char *) (e)                                \
                           + idem_audit_file_fields[i].off))

#define idem_audit_file_s(e, i)                                              \
    ((idem_str_t *) ((char *) (e) + idem_audit_file_fields[i].off))


/*
 * A line's members in RFC 8785 order, "hash" apart, of both versions:
 * version 1 has "event" and "time", version 2 "events" instead.
 */
enum {
    M_APPROVER = 0, M_EVENT, M_EVENTS, M_FP, M_IDENTITY, M_KEY, M_OP,
    M_PREV, M_REF, M_REQUEST, M_RESPONSE, M_ROUTE, M_SEQ, M_STATUS, M_TIME,
    M_V, M_HASH, M_N
};

static const char  *idem_audit_file_names[M_N] = {
    "approver", "event", "events", "fingerprint", "identity", "key",
    "operation_id", "prev", "ref", "request_id", "response_sha256", "route",
    "seq", "status", "time", "v", "hash"
};

/* the versions (bit 1 << v) that have the member */
static const unsigned char  idem_audit_file_in[M_N] = {
    6, 2, 4, 6, 6, 6, 6, 6, 6, 6, 6, 6, 6, 6, 2, 6, 6
};

/* the request's field a member is (R_*), or -1 */
static const signed char  idem_audit_file_field_of[M_N] = {
    R_APPROVER, -1, -1, R_FP, R_IDENTITY, R_KEY, R_OP, -1, R_REF, R_REQUEST,
    R_RESPONSE, R_ROUTE, -1, R_STATUS, -1, -1, -1
};


static size_t
idem_audit_file_strings(const idem_audit_entry_t *e)
{
    int     i;
    size_t  n;

    for (n = 0, i = 0; i < R_STATUS; i++) {
        n += idem_audit_file_cs(e, i)->len;
    }

    return n;
}


size_t
idem_audit_file_line_max(const idem_audit_entry_t *e, size_t n)
{
    size_t  i, max;

    /* the line's own members; each event's names, numbers and strings */
    max = 400 + 2 * IDEM_AUDIT_HASH_LEN
          + 6 * idem_audit_file_strings(&e[n - 1]);

    for (i = 0; i < n; i++) {
        max += 300 + 6 * idem_audit_file_strings(&e[i]);
    }

    return max;
}


/*
 * The run at d (at most len bytes) of bytes written as they are, copied to
 * p; its length.  Printable ASCII but '"' and '\\', eight bytes at a time
 * while they all are (most of a line: hex digests, ids, paths): one pass
 * reads and writes them.
 */
static size_t
idem_audit_file_plain(char *p, const unsigned char *d, size_t len)
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

        memcpy(p + i, &x, 8);
    }

    for ( /* void */ ; i < len && d[i] >= 0x20 && d[i] < 0x80
                       && d[i] != '"' && d[i] != '\\'; i++)
    {
        p[i] = (char) d[i];
    }

    return i;
}


/* s as a canonical JSON string; a byte that is not UTF-8 as U+00XX */
static char *
idem_audit_file_str(char *p, const char *name, size_t name_len,
    const idem_str_t *s)
{
    char                  esc[6];
    size_t                i, n, k;
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
        n = idem_audit_file_plain(p, d + i, s->len - i);

        if (n) {
            p += n;
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


#define idem_audit_file_put(p, lit)                                          \
    ((char *) memcpy(p, lit, sizeof(lit) - 1) + sizeof(lit) - 1)

#define idem_audit_file_field(p, name, s)                                    \
    idem_audit_file_str(p, name, sizeof(name) - 1, s)


static int
idem_audit_file_same(const idem_audit_entry_t *a, const idem_audit_entry_t *b,
    int i)
{
    const idem_str_t  *x, *y;

    if (i == R_STATUS) {
        return a->status == b->status;
    }

    x = idem_audit_file_cs(a, i);
    y = idem_audit_file_cs(b, i);

    /* the steps' events mostly share their request's strings */
    return x->len == y->len
           && (x->data == y->data || x->len == 0
               || memcmp(x->data, y->data, x->len) == 0);
}


/* field i of e as a member, with its comma */
static char *
idem_audit_file_put_field(char *p, const idem_audit_entry_t *e, int i)
{
    if (i != R_STATUS) {
        return idem_audit_file_str(p, idem_audit_file_fields[i].name,
                                   idem_audit_file_fields[i].len,
                                   idem_audit_file_cs(e, i));
    }

    p = idem_audit_file_put(p, "\"status\":");

    if (e->status) {
        p = idem_decimal(p, (uint64_t) e->status);
    } else {
        p = idem_audit_file_put(p, "null");
    }

    *p++ = ',';

    return p;
}


/* an event of the line: its name, time and the fields not the line's */
static char *
idem_audit_file_event(char *p, const idem_audit_entry_t *ev,
    const idem_audit_entry_t *top)
{
    int         i;
    idem_str_t  name;

    *p++ = '{';

    if (!idem_audit_file_same(ev, top, R_APPROVER)) {
        p = idem_audit_file_put_field(p, ev, R_APPROVER);
    }

    name.data = idem_audit_event_name(ev->event);
    name.len = strlen(name.data);
    p = idem_audit_file_field(p, "event", &name);

    for (i = R_FP; i < R_N; i++) {
        if (!idem_audit_file_same(ev, top, i)) {
            p = idem_audit_file_put_field(p, ev, i);
        }
    }

    p = idem_audit_file_put(p, "\"time\":");
    p = idem_decimal(p, (uint64_t) ev->time);
    *p++ = '}';

    return p;
}


/*
 * The canonical form without "hash" of the line of e[0..n) at p (the
 * request's fields the last event's, e[0]'s seq and prev); its end.
 */
static char *
idem_audit_file_body(char *p, const idem_audit_entry_t *e, size_t n)
{
    int                        f;
    size_t                     i;
    const idem_audit_entry_t  *top;

    top = &e[n - 1];

    *p++ = '{';
    p = idem_audit_file_put_field(p, top, R_APPROVER);
    p = idem_audit_file_put(p, "\"events\":[");

    for (i = 0; i < n; i++) {
        p = idem_audit_file_event(p, &e[i], top);
        *p++ = ',';
    }

    p[-1] = ']';
    *p++ = ',';

    for (f = R_FP; f <= R_OP; f++) {
        p = idem_audit_file_put_field(p, top, f);
    }

    p = idem_audit_file_field(p, "prev", &e[0].prev);

    for (f = R_REF; f < R_N; f++) {
        if (f == R_STATUS) {
            p = idem_audit_file_put(p, "\"seq\":");
            p = idem_decimal(p, e[0].seq);
            *p++ = ',';
        }

        p = idem_audit_file_put_field(p, top, f);
    }

    return idem_audit_file_put(p, "\"v\":2}");
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
idem_audit_file_line(char *p, const idem_audit_entry_t *e, size_t n,
    const unsigned char *key, size_t key_len,
    char hash[IDEM_AUDIT_HASH_LEN + 1])
{
    char  *start;

    start = p;
    p = idem_audit_file_body(p, e, n);

    if (idem_audit_hash(start, p - start, key, key_len, hash) != 0) {
        return NULL;
    }

    return idem_audit_file_end(p, hash);
}


char *
idem_audit_file_line_h(char *p, const idem_audit_entry_t *e, size_t n,
    idem_audit_file_hasher_t *h, char hash[IDEM_AUDIT_HASH_LEN + 1])
{
    char  *start;

    start = p;
    p = idem_audit_file_body(p, e, n);

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

    for (i = 0; i < M_N; i++) {
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


static int
idem_audit_file_hex(const idem_str_t *s, size_t len, int empty)
{
    return (empty && s->len == 0)
           || (s->len == len && idem_is_hex(s->data, s->len));
}


/* field i of e from member m: a string (a digest as hex), or the status */
static int
idem_audit_file_value(cJSON *m, int i, idem_audit_entry_t *e, char *why,
    size_t len)
{
    uint64_t     n;
    idem_str_t  *s;

    if (i == R_STATUS) {
        if (cJSON_IsNull(m)) {
            e->status = 0;
            return 0;
        }

        if (idem_audit_file_int(m, 100, &n) != 0 || n > 999) {
            return idem_audit_file_why(why, len, "\"status\" is neither "
                                       "null nor a status");
        }

        e->status = (int) n;
        return 0;
    }

    if (!cJSON_IsString(m)) {
        return idem_audit_file_why(why, len, "\"%s\" is not a string",
                                   idem_audit_file_fields[i].name);
    }

    s = idem_audit_file_s(e, i);
    idem_audit_file_set(s, m);

    if (idem_audit_file_fields[i].hex
        && !idem_audit_file_hex(s, idem_audit_file_fields[i].hex, 1))
    {
        return idem_audit_file_why(why, len, "a digest or id that is not "
                                   "lowercase hex of its length: \"%s\"",
                                   idem_audit_file_fields[i].name);
    }

    return 0;
}


/* the members, each once, and those of the line's version ("v") */
static int
idem_audit_file_members(cJSON *o, cJSON *f[M_N], int *version, char *why,
    size_t len)
{
    int       i, in;
    cJSON    *m;
    uint64_t  v;

    memset(f, 0, M_N * sizeof(cJSON *));

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

    if (f[M_V] == NULL || idem_audit_file_int(f[M_V], 1, &v) != 0
        || v > IDEM_AUDIT_FILE_VERSION)
    {
        return idem_audit_file_why(why, len, "\"v\" is neither 1 nor %d",
                                   IDEM_AUDIT_FILE_VERSION);
    }

    *version = (int) v;

    for (i = 0; i < M_N; i++) {
        in = idem_audit_file_in[i] & (1 << v);

        if (f[i] && !in) {
            return idem_audit_file_why(why, len, "a member the format does "
                                       "not define in version %d: \"%s\"",
                                       (int) v, idem_audit_file_names[i]);
        }

        if (f[i] == NULL && in) {
            return idem_audit_file_why(why, len, "no \"%s\"",
                                       idem_audit_file_names[i]);
        }
    }

    return 0;
}


/* the line's request fields, seq and prev: version 2's last event's */
static int
idem_audit_file_top(cJSON *f[M_N], idem_audit_entry_t *top, char *why,
    size_t len)
{
    int  i, r;

    memset(top, 0, sizeof(idem_audit_entry_t));

    for (i = 0; i < M_N; i++) {
        r = idem_audit_file_field_of[i];

        if (r >= 0 && idem_audit_file_value(f[i], r, top, why, len) != 0) {
            return -1;
        }
    }

    if (idem_audit_file_int(f[M_SEQ], 1, &top->seq) != 0) {
        return idem_audit_file_why(why, len, "\"seq\" is not a whole number "
                                   "from 1");
    }

    if (!cJSON_IsString(f[M_PREV])) {
        return idem_audit_file_why(why, len, "\"prev\" is not a string");
    }

    idem_audit_file_set(&top->prev, f[M_PREV]);

    if (!idem_audit_file_hex(&top->prev, IDEM_AUDIT_HASH_LEN, 0)) {
        return idem_audit_file_why(why, len, "\"prev\" is not 64 lowercase "
                                   "hex");
    }

    return 0;
}


/* an event's name and time */
static int
idem_audit_file_what(cJSON *name, cJSON *time, idem_audit_entry_t *e,
    char *why, size_t len)
{
    int       ev;
    uint64_t  n;

    ev = -1;

    if (cJSON_IsString(name)) {
        ev = idem_audit_event_parse(name->valuestring,
                                    strlen(name->valuestring));
    }

    if (ev < 0) {
        return idem_audit_file_why(why, len, "\"event\" is not an event");
    }

    if (idem_audit_file_int(time, 0, &n) != 0) {
        return idem_audit_file_why(why, len, "\"time\" is not a whole "
                                   "number");
    }

    e->event = (idem_audit_event_e) ev;
    e->time = (int64_t) n;

    return 0;
}


/*
 * Event k (from 0) of a version-2 line: the line's fields but those it
 * has, each of which must differ from the line's (one encoding per line).
 */
static int
idem_audit_file_one(cJSON *o, size_t k, const idem_audit_entry_t *top,
    idem_audit_entry_t *e, char *why, size_t len)
{
    int        i, r;
    cJSON     *m, *at[M_N];

    if (!cJSON_IsObject(o)) {
        return idem_audit_file_why(why, len, "event %zu is not an object",
                                   k + 1);
    }

    *e = *top;
    memset(at, 0, sizeof(at));

    for (m = o->child; m; m = m->next) {
        i = idem_audit_file_member(m->string);
        r = i < 0 ? -1 : idem_audit_file_field_of[i];

        if (r < 0 && i != M_EVENT && i != M_TIME) {
            return idem_audit_file_why(why, len, "event %zu: a member the "
                                       "format does not define: \"%.64s\"",
                                       k + 1, m->string);
        }

        if (at[i]) {
            return idem_audit_file_why(why, len, "event %zu: \"%s\" twice",
                                       k + 1, m->string);
        }

        at[i] = m;

        if (r < 0) {
            continue;       /* "event" and "time": read below */
        }

        if (idem_audit_file_value(m, r, e, why, len) != 0) {
            return -1;
        }

        if (idem_audit_file_same(e, top, r)) {
            return idem_audit_file_why(why, len, "event %zu: \"%s\" is the "
                                       "line's (an event has only the fields "
                                       "that differ)", k + 1, m->string);
        }
    }

    if (at[M_EVENT] == NULL || at[M_TIME] == NULL) {
        return idem_audit_file_why(why, len, "event %zu has no \"%s\"", k + 1,
                                   at[M_EVENT] ? "time" : "event");
    }

    return idem_audit_file_what(at[M_EVENT], at[M_TIME], e, why, len);
}


/* the events of a version-2 line: 1 to 4, the last one the line's own */
static int
idem_audit_file_events(cJSON *f[M_N], const idem_audit_entry_t *top,
    idem_audit_events_t *ev, char *why, size_t len)
{
    int     n;
    cJSON  *m;

    if (!cJSON_IsArray(f[M_EVENTS])) {
        return idem_audit_file_why(why, len, "\"events\" is not an array");
    }

    n = cJSON_GetArraySize(f[M_EVENTS]);

    if (n < 1 || n > IDEM_AUDIT_FILE_EVENTS) {
        return idem_audit_file_why(why, len, "\"events\" has %d events, not "
                                   "1 to %d", n, IDEM_AUDIT_FILE_EVENTS);
    }

    ev->n = 0;

    cJSON_ArrayForEach(m, f[M_EVENTS]) {
        if (idem_audit_file_one(m, ev->n, top, &ev->e[ev->n], why, len)
            != 0)
        {
            return -1;
        }

        ev->e[ev->n].index = (unsigned) ev->n + 1;
        ev->n++;
    }

    /* the line's fields are the last event's: it has no others */
    if (cJSON_GetArraySize(cJSON_GetArrayItem(f[M_EVENTS], n - 1)) != 2) {
        return idem_audit_file_why(why, len, "event %d has fields of its "
                                   "own: the line's are the last event's", n);
    }

    return 0;
}


int
idem_audit_file_parse(const char *line, size_t len, idem_audit_events_t *ev,
    char hash[IDEM_AUDIT_HASH_LEN + 1], void **tree, char *why,
    size_t why_len)
{
    int                  version, rc;
    cJSON               *o, *f[M_N];
    idem_str_t           h;
    idem_audit_entry_t   top;

    ev->n = 0;
    ev->version = 0;
    version = 0;

    o = cJSON_ParseWithLength(line, len);
    *tree = o;

    if (!cJSON_IsObject(o)) {
        return idem_audit_file_why(why, why_len, "not a JSON object");
    }

    if (idem_audit_file_members(o, f, &version, why, why_len) != 0
        || idem_audit_file_top(f, &top, why, why_len) != 0)
    {
        return -1;
    }

    if (version == 1) {
        ev->e[0] = top;
        ev->n = 1;
        rc = idem_audit_file_what(f[M_EVENT], f[M_TIME], &ev->e[0], why,
                                  why_len);

    } else {
        rc = idem_audit_file_events(f, &top, ev, why, why_len);
    }

    if (rc != 0) {
        return -1;
    }

    ev->version = version;

    h.data = cJSON_IsString(f[M_HASH]) ? f[M_HASH]->valuestring : "";
    h.len = strlen(h.data);

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
    idem_audit_events_t  ev;

    rc = idem_audit_file_parse(line, len, &ev, hash, &tree, why, sizeof(why));

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
        rc = idem_audit_file_place(v, &ev.e[0]);
    }

    idem_audit_file_free(tree);

    if (rc != 0) {
        return -1;
    }

    memcpy(v->before, v->hash, sizeof(v->before));
    memcpy(v->hash, hash, sizeof(v->hash));
    v->seq = ev.e[0].seq;
    v->count++;
    v->events += ev.n;

    return 0;
}
