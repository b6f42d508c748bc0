/*
 * Compact JWS for approvals: strict base64url, cJSON for the two JSON
 * parts, OpenSSL for the signatures (idem_jws.h, docs/confirmation.md).
 *
 * The order of the checks is part of the contract: nothing of the
 * payload is believed before the signature holds, and the key is chosen
 * by the header alone, so a token can never pick the algorithm a key is
 * checked with (an HS256 token is never checked against an Ed25519
 * public key used as an HMAC secret, nor the reverse).
 */

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>
#include <openssl/crypto.h>
#include <openssl/hmac.h>
#include <openssl/pem.h>

#include "idem_jws.h"


#define IDEM_JWS_FILE_MAX   (1024 * 1024)
#define IDEM_JWS_HS_SIG     32
#define IDEM_JWS_ED_SIG     64

/* integers a JSON number holds exactly */
#define IDEM_JWS_INT_MAX    9007199254740991.0


#define IDEM_B64URL                                                         \
    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"

static const char  idem_b64url[] = IDEM_B64URL;


static int
idem_b64url_value(unsigned char c)
{
    if (c >= 'A' && c <= 'Z') {
        return c - 'A';
    }

    if (c >= 'a' && c <= 'z') {
        return c - 'a' + 26;
    }

    if (c >= '0' && c <= '9') {
        return c - '0' + 52;
    }

    if (c == '-') {
        return 62;
    }

    return (c == '_') ? 63 : -1;
}


/*
 * Strict, so that one token has one spelling: a token that decodes the
 * same as a signed one but is written otherwise is refused, not accepted.
 */
long
idem_b64url_decode(const char *in, size_t len, unsigned char *out)
{
    size_t    i, n;
    int       v;
    uint32_t  acc;
    unsigned  bits;

    if (len % 4 == 1) {
        return -1;
    }

    acc = 0;
    bits = 0;
    n = 0;

    for (i = 0; i < len; i++) {
        v = idem_b64url_value((unsigned char) in[i]);
        if (v < 0) {
            return -1;
        }

        acc = (acc << 6) | (uint32_t) v;
        bits += 6;

        if (bits >= 8) {
            bits -= 8;
            out[n++] = (unsigned char) (acc >> bits);
            acc &= (1u << bits) - 1;
        }
    }

    /* the bits after the last byte must be zero */
    if (acc != 0) {
        return -1;
    }

    return (long) n;
}


size_t
idem_b64url_encode(const unsigned char *in, size_t len, char *out)
{
    size_t    i, n;
    uint32_t  acc;
    unsigned  bits;

    acc = 0;
    bits = 0;
    n = 0;

    for (i = 0; i < len; i++) {
        acc = (acc << 8) | in[i];
        bits += 8;

        while (bits >= 6) {
            bits -= 6;
            out[n++] = idem_b64url[(acc >> bits) & 0x3f];
        }

        acc &= (1u << bits) - 1;
    }

    if (bits) {
        out[n++] = idem_b64url[(acc << (6 - bits)) & 0x3f];
    }

    return n;
}


const char *
idem_jws_reason(idem_jws_rc_t rc)
{
    switch (rc) {
    case IDEM_JWS_OK:
        return "ok";
    case IDEM_JWS_REFUSED_ALG:
        return "refused_alg";
    case IDEM_JWS_UNKNOWN_KID:
        return "unknown_kid";
    case IDEM_JWS_BAD_SIGNATURE:
        return "bad_signature";
    case IDEM_JWS_WRONG_KEY:
        return "wrong_key";
    case IDEM_JWS_WRONG_FINGERPRINT:
        return "wrong_fingerprint";
    case IDEM_JWS_EXPIRED:
        return "expired";
    default:
        return "malformed";
    }
}


/* ------------------------------------------------------------ keys */

static unsigned char *
idem_jws_read_file(const char *path, size_t *len, char *err, size_t err_len)
{
    FILE           *f;
    size_t          n;
    unsigned char  *buf;

    f = fopen(path, "rb");
    if (f == NULL) {
        snprintf(err, err_len, "\"%s\" cannot be read: %s", path,
                 strerror(errno));
        return NULL;
    }

    buf = malloc(IDEM_JWS_FILE_MAX + 1);
    if (buf == NULL) {
        fclose(f);
        snprintf(err, err_len, "out of memory");
        return NULL;
    }

    n = fread(buf, 1, IDEM_JWS_FILE_MAX + 1, f);

    if (ferror(f) || n > IDEM_JWS_FILE_MAX) {
        snprintf(err, err_len, "\"%s\" cannot be read: %s", path,
                 ferror(f) ? strerror(errno) : "larger than 1 MiB");
        fclose(f);
        free(buf);
        return NULL;
    }

    fclose(f);
    buf[n] = '\0';
    *len = n;

    return buf;
}


static int
idem_jws_key_secret(idem_jws_key_t *key, unsigned char *buf, size_t len,
    const char *path, char *err, size_t err_len)
{
    if (len > 0 && buf[len - 1] == '\n') {
        len--;
    }

    if (len >= 10 && memcmp(buf, "-----BEGIN", 10) == 0) {
        snprintf(err, err_len, "\"%s\" is a PEM file, not an HS256 secret",
                 path);
        return -1;
    }

    if (len < IDEM_JWS_HS256_MIN) {
        snprintf(err, err_len, "\"%s\" holds %zu bytes, an HS256 secret "
                 "needs at least %d", path, len, IDEM_JWS_HS256_MIN);
        return -1;
    }

    key->secret = buf;
    key->secret_len = len;

    return 0;
}


static int
idem_jws_key_pem(idem_jws_key_t *key, unsigned char *buf, size_t len,
    int private, const char *path, char *err, size_t err_len)
{
    BIO  *bio;

    bio = BIO_new_mem_buf(buf, (int) len);
    if (bio == NULL) {
        snprintf(err, err_len, "out of memory");
        return -1;
    }

    key->pkey = private ? PEM_read_bio_PrivateKey(bio, NULL, NULL, NULL)
                        : PEM_read_bio_PUBKEY(bio, NULL, NULL, NULL);
    BIO_free(bio);

    if (key->pkey == NULL) {
        snprintf(err, err_len, "\"%s\" is not a PEM %s", path,
                 private ? "private key"
                 : strstr((char *) buf, "PRIVATE KEY")
                   ? "public key: it holds a private key, give the output "
                     "of \"openssl pkey -pubout\""
                   : "public key (\"openssl pkey -pubout\")");
        return -1;
    }

    if (EVP_PKEY_id(key->pkey) != EVP_PKEY_ED25519) {
        snprintf(err, err_len, "\"%s\" holds a %s key, not Ed25519", path,
                 OBJ_nid2sn(EVP_PKEY_id(key->pkey)));
        EVP_PKEY_free(key->pkey);
        key->pkey = NULL;
        return -1;
    }

    return 0;
}


int
idem_jws_key_load(idem_jws_key_t *key, idem_jws_alg_e alg, const char *path,
    const char *kid, int private, char *err, size_t err_len)
{
    size_t          len;
    unsigned char  *buf;

    memset(key, 0, sizeof(idem_jws_key_t));
    key->alg = alg;

    /* a kid is written into the header by idem_jws_sign() unescaped */
    if (kid && (strlen(kid) == 0 || strlen(kid) > IDEM_JWS_KID_MAX
                || strspn(kid, IDEM_B64URL ".") != strlen(kid)))
    {
        snprintf(err, err_len, "kid must be 1 to %d of A-Z a-z 0-9 . - _",
                 IDEM_JWS_KID_MAX);
        return -1;
    }

    snprintf(key->kid, sizeof(key->kid), "%s", kid ? kid : "");

    buf = idem_jws_read_file(path, &len, err, err_len);
    if (buf == NULL) {
        return -1;
    }

    if (len == 0 || (len == 1 && buf[0] == '\n')) {
        snprintf(err, err_len, "\"%s\" is empty", path);
        free(buf);
        return -1;
    }

    if (alg == IDEM_JWS_HS256) {
        if (idem_jws_key_secret(key, buf, len, path, err, err_len) != 0) {
            OPENSSL_cleanse(buf, len);
            free(buf);
            return -1;
        }

        return 0;
    }

    if (idem_jws_key_pem(key, buf, len, private, path, err, err_len) != 0) {
        OPENSSL_cleanse(buf, len);
        free(buf);
        return -1;
    }

    OPENSSL_cleanse(buf, len);
    free(buf);

    return 0;
}


void
idem_jws_key_free(idem_jws_key_t *key)
{
    if (key->secret) {
        OPENSSL_cleanse(key->secret, key->secret_len);
        free(key->secret);
        key->secret = NULL;
    }

    EVP_PKEY_free(key->pkey);
    key->pkey = NULL;
}


/* ------------------------------------------------------ signatures */

static int
idem_jws_hs256(const idem_jws_key_t *key, const char *msg, size_t len,
    unsigned char mac[IDEM_JWS_HS_SIG])
{
    unsigned int  mac_len;

    mac_len = 0;

    return HMAC(EVP_sha256(), key->secret, (int) key->secret_len,
                (const unsigned char *) msg, len, mac, &mac_len) != NULL
           && mac_len == IDEM_JWS_HS_SIG;
}


/* 1 when sig is key's signature of msg */
static int
idem_jws_check(const idem_jws_key_t *key, const char *msg, size_t len,
    const unsigned char *sig, size_t sig_len)
{
    int             good;
    EVP_MD_CTX     *md;
    unsigned char   mac[IDEM_JWS_HS_SIG];

    if (key->alg == IDEM_JWS_HS256) {
        if (sig_len != IDEM_JWS_HS_SIG || !idem_jws_hs256(key, msg, len, mac))
        {
            return 0;
        }

        good = CRYPTO_memcmp(mac, sig, IDEM_JWS_HS_SIG) == 0;
        OPENSSL_cleanse(mac, sizeof(mac));
        return good;
    }

    if (sig_len != IDEM_JWS_ED_SIG || key->pkey == NULL) {
        return 0;
    }

    md = EVP_MD_CTX_new();
    if (md == NULL) {
        return 0;
    }

    good = EVP_DigestVerifyInit(md, NULL, NULL, NULL, key->pkey) == 1
           && EVP_DigestVerify(md, sig, sig_len, (const unsigned char *) msg,
                               len) == 1;

    EVP_MD_CTX_free(md);

    return good;
}


/* the signature of msg, sig needs IDEM_JWS_ED_SIG bytes; its length or 0 */
static size_t
idem_jws_sign_raw(const idem_jws_key_t *key, const char *msg, size_t len,
    unsigned char *sig)
{
    size_t       sig_len;
    EVP_MD_CTX  *md;

    if (key->alg == IDEM_JWS_HS256) {
        return idem_jws_hs256(key, msg, len, sig) ? IDEM_JWS_HS_SIG : 0;
    }

    md = EVP_MD_CTX_new();
    if (md == NULL || key->pkey == NULL) {
        EVP_MD_CTX_free(md);
        return 0;
    }

    sig_len = IDEM_JWS_ED_SIG;

    if (EVP_DigestSignInit(md, NULL, NULL, NULL, key->pkey) != 1
        || EVP_DigestSign(md, sig, &sig_len, (const unsigned char *) msg,
                          len) != 1)
    {
        sig_len = 0;
    }

    EVP_MD_CTX_free(md);

    return sig_len;
}


/* --------------------------------------------------------- parsing */

/*
 * A JSON object decoded from one base64url part, or NULL.  Duplicate
 * member names are refused: cJSON would take the first, another reader
 * the last, and both must see the same claims.  So is "\u0000": cJSON's
 * strings end at a NUL, and "ab\u0000cd" would compare equal to "ab".
 */
static cJSON *
idem_jws_object(const char *part, size_t len)
{
    long            n;
    cJSON          *o, *a, *b;
    const char     *end;
    unsigned char  *buf;

    buf = malloc(len + 1);
    if (buf == NULL) {
        return NULL;
    }

    n = idem_b64url_decode(part, len, buf);
    o = NULL;

    if (n > 0 && memchr(buf, '\0', (size_t) n) == NULL) {
        buf[n] = '\0';

        if (strstr((char *) buf, "\\u0000") == NULL) {
            o = cJSON_ParseWithLengthOpts((char *) buf, (size_t) n, &end, 0);
        }

        if (o && (!cJSON_IsObject(o) || end != (char *) buf + n)) {
            cJSON_Delete(o);
            o = NULL;
        }
    }

    free(buf);

    for (a = o ? o->child : NULL; a; a = a->next) {
        for (b = a->next; b; b = b->next) {
            if (strcmp(a->string, b->string) == 0) {
                cJSON_Delete(o);
                return NULL;
            }
        }
    }

    return o;
}


/* the member's string, NULL when absent or not a string */
static const char *
idem_jws_str(const cJSON *o, const char *name)
{
    const cJSON  *m;

    m = cJSON_GetObjectItemCaseSensitive(o, name);

    return cJSON_IsString(m) ? m->valuestring : NULL;
}


/* 0 with an integer in 0..2^53, else -1 */
static int
idem_jws_int(const cJSON *o, const char *name, int64_t *v)
{
    const cJSON  *m;

    m = cJSON_GetObjectItemCaseSensitive(o, name);

    if (!cJSON_IsNumber(m) || !(m->valuedouble >= 0)
        || m->valuedouble > IDEM_JWS_INT_MAX
        || floor(m->valuedouble) != m->valuedouble)
    {
        return -1;
    }

    *v = (int64_t) m->valuedouble;

    return 0;
}


/*
 * The header's algorithm and kid.  Extensions ("crit") are refused: this
 * reader understands none, and RFC 7515 section 4.1.11 says to refuse.
 */
static idem_jws_rc_t
idem_jws_header(const cJSON *h, idem_jws_alg_e *alg, const char **kid)
{
    const char  *a, *typ;

    a = idem_jws_str(h, "alg");
    if (a == NULL) {
        return IDEM_JWS_MALFORMED;
    }

    if (strcmp(a, "HS256") == 0) {
        *alg = IDEM_JWS_HS256;

    } else if (strcmp(a, "EdDSA") == 0) {
        *alg = IDEM_JWS_ED25519;

    } else {
        return IDEM_JWS_REFUSED_ALG;   /* "none" among them */
    }

    typ = idem_jws_str(h, "typ");

    if ((cJSON_GetObjectItemCaseSensitive(h, "typ") && typ == NULL)
        || (typ && strcmp(typ, "JWT") != 0)
        || cJSON_GetObjectItemCaseSensitive(h, "crit"))
    {
        return IDEM_JWS_MALFORMED;
    }

    *kid = idem_jws_str(h, "kid");

    if (cJSON_GetObjectItemCaseSensitive(h, "kid")
        && (*kid == NULL || strlen(*kid) > IDEM_JWS_KID_MAX))
    {
        return IDEM_JWS_MALFORMED;
    }

    return IDEM_JWS_OK;
}


/*
 * The signature checked with the keys the header names: by kid, or
 * without one every key configured without one.  A key of the other
 * type is never tried, so a token cannot choose how a key is used.
 */
static idem_jws_rc_t
idem_jws_signed(const idem_jws_key_t *keys, size_t n, idem_jws_alg_e alg,
    const char *kid, const char *msg, size_t msg_len,
    const unsigned char *sig, size_t sig_len)
{
    size_t  i, named, typed;

    named = 0;
    typed = 0;

    for (i = 0; i < n; i++) {
        if (strcmp(keys[i].kid, kid ? kid : "") != 0) {
            continue;
        }

        named++;

        if (keys[i].alg != alg) {
            continue;
        }

        typed++;

        if (idem_jws_check(&keys[i], msg, msg_len, sig, sig_len)) {
            return IDEM_JWS_OK;
        }
    }

    if (named == 0) {
        return IDEM_JWS_UNKNOWN_KID;
    }

    return typed ? IDEM_JWS_BAD_SIGNATURE : IDEM_JWS_REFUSED_ALG;
}


static int
idem_jws_copy(char *dst, size_t size, const char *src)
{
    size_t  len;

    len = strlen(src);
    if (len >= size) {
        return -1;
    }

    memcpy(dst, src, len + 1);

    return 0;
}


/* the claims of a payload whose signature holds */
static idem_jws_rc_t
idem_jws_claims(const cJSON *p, const char *idk, size_t idk_len,
    const char *fp, int64_t now, idem_jws_claims_t *c)
{
    const char  *k, *f, *sub, *jti;

    k = idem_jws_str(p, "idk");
    f = idem_jws_str(p, "fp");
    sub = idem_jws_str(p, "sub");
    jti = idem_jws_str(p, "jti");

    if (k == NULL || f == NULL || sub == NULL || sub[0] == '\0'
        || idem_jws_int(p, "exp", &c->exp) != 0
        || idem_jws_int(p, "iat", &c->iat) != 0
        || idem_jws_copy(c->sub, sizeof(c->sub), sub) != 0
        || (cJSON_GetObjectItemCaseSensitive(p, "jti")
            && (jti == NULL
                || idem_jws_copy(c->jti, sizeof(c->jti), jti) != 0)))
    {
        return IDEM_JWS_MALFORMED;
    }

    if (strlen(k) != idk_len || memcmp(k, idk, idk_len) != 0) {
        return IDEM_JWS_WRONG_KEY;
    }

    if (strlen(f) != 64 || memcmp(f, fp, 64) != 0) {
        return IDEM_JWS_WRONG_FINGERPRINT;
    }

    return (c->exp > now) ? IDEM_JWS_OK : IDEM_JWS_EXPIRED;
}


/* the three parts: header.payload.signature, the first two not empty */
static int
idem_jws_split(const char *tok, size_t len, size_t *d1, size_t *d2)
{
    const char  *a, *b;

    a = memchr(tok, '.', len);
    if (a == NULL) {
        return -1;
    }

    b = memchr(a + 1, '.', len - (size_t) (a + 1 - tok));
    if (b == NULL || memchr(b + 1, '.', len - (size_t) (b + 1 - tok))) {
        return -1;
    }

    *d1 = (size_t) (a - tok);
    *d2 = (size_t) (b - tok);

    return (*d1 > 0 && *d2 > *d1 + 1) ? 0 : -1;
}


static idem_jws_rc_t
idem_jws_verify_header(const char *tok, size_t d1, idem_jws_alg_e *alg,
    char kid[IDEM_JWS_KID_MAX + 1], int *has_kid)
{
    cJSON          *h;
    const char     *k;
    idem_jws_rc_t   rc;

    h = idem_jws_object(tok, d1);
    if (h == NULL) {
        return IDEM_JWS_MALFORMED;
    }

    k = NULL;
    rc = idem_jws_header(h, alg, &k);

    *has_kid = (k != NULL);
    snprintf(kid, IDEM_JWS_KID_MAX + 1, "%s", k ? k : "");

    cJSON_Delete(h);

    return rc;
}


idem_jws_rc_t
idem_jws_verify(const char *tok, size_t len, const idem_jws_key_t *keys,
    size_t n, const char *idk, size_t idk_len, const char *fp, int64_t now,
    idem_jws_claims_t *claims)
{
    int              has_kid;
    long             sig_len;
    size_t           d1, d2;
    cJSON           *p;
    idem_jws_alg_e   alg;
    idem_jws_rc_t    rc;
    unsigned char    sig[IDEM_JWS_MAX];

    memset(claims, 0, sizeof(idem_jws_claims_t));

    if (len == 0 || len > IDEM_JWS_MAX || idem_jws_split(tok, len, &d1, &d2))
    {
        return IDEM_JWS_MALFORMED;
    }

    rc = idem_jws_verify_header(tok, d1, &alg, claims->kid, &has_kid);
    if (rc != IDEM_JWS_OK) {
        return rc;
    }

    /* both encoded parts must be well formed before anything is checked */
    sig_len = idem_b64url_decode(tok + d2 + 1, len - d2 - 1, sig);

    if (sig_len < 0
        || idem_b64url_decode(tok + d1 + 1, d2 - d1 - 1, sig + sig_len) < 0)
    {
        return IDEM_JWS_MALFORMED;
    }

    rc = idem_jws_signed(keys, n, alg, has_kid ? claims->kid : NULL, tok, d2,
                         sig, (size_t) sig_len);
    if (rc != IDEM_JWS_OK) {
        return rc;
    }

    p = idem_jws_object(tok + d1 + 1, d2 - d1 - 1);
    if (p == NULL) {
        return IDEM_JWS_MALFORMED;
    }

    rc = idem_jws_claims(p, idk, idk_len, fp, now, claims);
    cJSON_Delete(p);

    return rc;
}


/* ------------------------------------------------------- producing */

char *
idem_jws_approval(const char *idk, const char *fp, const char *sub,
    int64_t iat, int64_t exp, const char *jti)
{
    char   *s;
    cJSON  *o;

    o = cJSON_CreateObject();

    if (o == NULL
        || !cJSON_AddStringToObject(o, "idk", idk)
        || !cJSON_AddStringToObject(o, "fp", fp)
        || !cJSON_AddStringToObject(o, "sub", sub)
        || !cJSON_AddNumberToObject(o, "iat", (double) iat)
        || !cJSON_AddNumberToObject(o, "exp", (double) exp)
        || (jti && !cJSON_AddStringToObject(o, "jti", jti)))
    {
        cJSON_Delete(o);
        return NULL;
    }

    s = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);

    return s;
}


char *
idem_jws_sign(const idem_jws_key_t *key, const char *payload,
    size_t payload_len)
{
    char           *tok, *p;
    char            hdr[IDEM_JWS_KID_MAX + 64];
    size_t          hdr_len, sig_len;
    unsigned char   sig[IDEM_JWS_ED_SIG];

    hdr_len = (size_t) snprintf(hdr, sizeof(hdr),
                                "{\"alg\":\"%s\",\"typ\":\"JWT\"%s%s%s}",
                                key->alg == IDEM_JWS_HS256 ? "HS256"
                                                           : "EdDSA",
                                key->kid[0] ? ",\"kid\":\"" : "", key->kid,
                                key->kid[0] ? "\"" : "");

    tok = malloc(idem_b64url_len(hdr_len) + idem_b64url_len(payload_len)
                 + idem_b64url_len(sizeof(sig)) + 3);
    if (tok == NULL) {
        return NULL;
    }

    p = tok + idem_b64url_encode((unsigned char *) hdr, hdr_len, tok);
    *p++ = '.';
    p += idem_b64url_encode((const unsigned char *) payload, payload_len, p);

    sig_len = idem_jws_sign_raw(key, tok, (size_t) (p - tok), sig);
    if (sig_len == 0) {
        free(tok);
        return NULL;
    }

    *p++ = '.';
    p += idem_b64url_encode(sig, sig_len, p);
    *p = '\0';

    return tok;
}
