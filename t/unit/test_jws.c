/*
 * Signed approvals: base64url, key files, and every answer of
 * idem_jws_verify().  Keys are made here at run time (nothing private is
 * in the tree); the published vectors of RFC 7515 A.1 (HS256) and RFC
 * 8037 A.4 (Ed25519) check the signatures against another signer.  The
 * tokens of the other cases are signed by this file's own signer, not by
 * idem_jws_sign(), so that a header or a payload can be anything.
 */

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <openssl/hmac.h>
#include <openssl/pem.h>
#include <openssl/rand.h>

#include <cjson/cJSON.h>

#include "idem_json.h"
#include "idem_jws.h"
#include "tap.h"


#define NOW   1800000000LL
#define IDK   "order-42"
#define FP    "0123456789abcdef0123456789abcdef" \
              "0123456789abcdef0123456789abcdef"
#define FP2   "f123456789abcdef0123456789abcdef" \
              "0123456789abcdef0123456789abcdef"

static char  dir[] = "/tmp/test_jws.XXXXXX";


static char *
b64(const void *in, size_t len)
{
    char  *out;

    out = malloc(idem_b64url_len(len) + 1);
    out[idem_b64url_encode(in, len, out)] = '\0';

    return out;
}


/* header.payload signed with key as the header claims: the test's signer */
static char *
token(const idem_jws_key_t *key, const char *hdr, const char *payload)
{
    char            *h, *p, *s, *tok;
    size_t           sig_len;
    EVP_MD_CTX      *md;
    unsigned int     mac_len;
    unsigned char    sig[64];

    h = b64(hdr, strlen(hdr));
    p = b64(payload, strlen(payload));
    tok = malloc(strlen(h) + strlen(p) + 100);
    sprintf(tok, "%s.%s", h, p);

    sig_len = 0;

    if (key && key->alg == IDEM_JWS_HS256) {
        HMAC(EVP_sha256(), key->secret, (int) key->secret_len,
             (unsigned char *) tok, strlen(tok), sig, &mac_len);
        sig_len = mac_len;

    } else if (key) {
        md = EVP_MD_CTX_new();
        sig_len = sizeof(sig);
        EVP_DigestSignInit(md, NULL, NULL, NULL, key->pkey);
        EVP_DigestSign(md, sig, &sig_len, (unsigned char *) tok, strlen(tok));
        EVP_MD_CTX_free(md);
    }

    s = b64(sig, sig_len);
    strcat(tok, ".");
    strcat(tok, s);

    free(h);
    free(p);
    free(s);

    return tok;
}


static const char *
claims_ok(void)
{
    return "{\"idk\":\"" IDK "\",\"fp\":\"" FP "\",\"sub\":\"alice\","
           "\"iat\":1799999000,\"exp\":1800000600,\"jti\":\"j-1\"}";
}


static idem_jws_rc_t
verify(const char *tok, const idem_jws_key_t *keys, size_t n,
    idem_jws_claims_t *c)
{
    return idem_jws_verify(tok, strlen(tok), keys, n, IDK, strlen(IDK), FP,
                           NOW, c);
}


static void
expect(const char *tok, const idem_jws_key_t *keys, size_t n,
    idem_jws_rc_t want, const char *name)
{
    idem_jws_rc_t      rc;
    idem_jws_claims_t  c;

    rc = verify(tok, keys, n, &c);

    if (!is_str(idem_jws_reason(rc), idem_jws_reason(want), "%s", name)) {
        diag("  token: %s", tok);
    }
}


static void
write_file(const char *name, const void *data, size_t len)
{
    char   path[256];
    FILE  *f;

    snprintf(path, sizeof(path), "%s/%s", dir, name);
    f = fopen(path, "wb");
    fwrite(data, 1, len, f);
    fclose(f);
}


static char *
path_of(const char *name)
{
    static char  path[256];

    snprintf(path, sizeof(path), "%s/%s", dir, name);

    return path;
}


static void
write_pem(const char *name, EVP_PKEY *pk, int private)
{
    FILE  *f;

    f = fopen(path_of(name), "wb");

    if (private) {
        PEM_write_PrivateKey(f, pk, NULL, NULL, 0, NULL, NULL);
    } else {
        PEM_write_PUBKEY(f, pk);
    }

    fclose(f);
}


static void
test_b64url(void)
{
    unsigned char  out[16];
    char          *e;

    e = b64("\xfb\xff", 2);
    is_str(e, "-_8", "encode uses - and _, no padding");
    free(e);

    is_int(idem_b64url_decode("-_8", 3, out), 2, "decode -_8");
    ok(out[0] == 0xfb && out[1] == 0xff, "decode -_8 bytes");
    is_int(idem_b64url_decode("QQ", 2, out), 1, "QQ is A");
    is_int(idem_b64url_decode("QR", 2, out), -1, "QR: unused bits set");
    is_int(idem_b64url_decode("QQ==", 4, out), -1, "padding refused");
    is_int(idem_b64url_decode("+/8", 3, out), -1, "+ and / refused");
    is_int(idem_b64url_decode("QUJDR", 5, out), -1, "length 1 mod 4");
    is_int(idem_b64url_decode("QU JD", 5, out), -1, "space refused");
    is_int(idem_b64url_decode("", 0, out), 0, "empty is empty");
}


static void
test_key_files(EVP_PKEY *ed, EVP_PKEY *x)
{
    char             err[512];
    idem_jws_key_t   k;
    unsigned char    s[40];

    memset(s, 'k', sizeof(s));

    ok(idem_jws_key_load(&k, IDEM_JWS_HS256, path_of("missing"), NULL, 0,
                         err, sizeof(err)) == -1 && strstr(err, "cannot be"),
       "missing file: %s", err);

    write_file("empty", "", 0);
    ok(idem_jws_key_load(&k, IDEM_JWS_HS256, path_of("empty"), NULL, 0, err,
                         sizeof(err)) == -1 && strstr(err, "empty"),
       "empty HS256 file: %s", err);
    ok(idem_jws_key_load(&k, IDEM_JWS_ED25519, path_of("empty"), NULL, 0,
                         err, sizeof(err)) == -1 && strstr(err, "empty"),
       "empty Ed25519 file: %s", err);

    write_file("short", "0123456789012345678901234567890\n", 32);
    ok(idem_jws_key_load(&k, IDEM_JWS_HS256, path_of("short"), NULL, 0, err,
                         sizeof(err)) == -1 && strstr(err, "31 bytes"),
       "31 bytes and a newline: %s", err);

    s[32] = '\n';
    write_file("hs", s, 33);
    ok(idem_jws_key_load(&k, IDEM_JWS_HS256, path_of("hs"), "k1", 0, err,
                         sizeof(err)) == 0 && k.secret_len == 32,
       "32 bytes and one newline: a 32-byte secret");
    is_str(k.kid, "k1", "kid kept");
    idem_jws_key_free(&k);

    write_file("hs2", s, 34);   /* 32 'k', '\n', 'k': the newline is inside */
    ok(idem_jws_key_load(&k, IDEM_JWS_HS256, path_of("hs2"), NULL, 0, err,
                         sizeof(err)) == 0 && k.secret_len == 34,
       "only one trailing newline is taken off");
    idem_jws_key_free(&k);

    ok(idem_jws_key_load(&k, IDEM_JWS_HS256, path_of("hs"), "a b", 0, err,
                         sizeof(err)) == -1, "kid with a space: %s", err);

    write_pem("ed.pub", ed, 0);
    write_pem("ed.key", ed, 1);
    write_pem("x.pub", x, 0);

    ok(idem_jws_key_load(&k, IDEM_JWS_ED25519, path_of("ed.pub"), NULL, 0,
                         err, sizeof(err)) == 0 && k.pkey, "Ed25519 public");
    idem_jws_key_free(&k);

    ok(idem_jws_key_load(&k, IDEM_JWS_ED25519, path_of("ed.key"), NULL, 1,
                         err, sizeof(err)) == 0 && k.pkey, "Ed25519 private");
    idem_jws_key_free(&k);

    ok(idem_jws_key_load(&k, IDEM_JWS_ED25519, path_of("ed.key"), NULL, 0,
                         err, sizeof(err)) == -1
       && strstr(err, "private key"), "private PEM as public: %s", err);

    ok(idem_jws_key_load(&k, IDEM_JWS_ED25519, path_of("x.pub"), NULL, 0,
                         err, sizeof(err)) == -1 && strstr(err, "X25519"),
       "X25519 public key: %s", err);

    ok(idem_jws_key_load(&k, IDEM_JWS_ED25519, path_of("hs"), NULL, 0,
                         err, sizeof(err)) == -1 && strstr(err, "not a PEM"),
       "HS256 secret as Ed25519: %s", err);

    ok(idem_jws_key_load(&k, IDEM_JWS_HS256, path_of("ed.pub"), NULL, 0,
                         err, sizeof(err)) == -1 && strstr(err, "PEM file"),
       "Ed25519 PEM as HS256 secret: %s", err);

    chmod(path_of("hs"), 0);

    if (geteuid() != 0) {
        ok(idem_jws_key_load(&k, IDEM_JWS_HS256, path_of("hs"), NULL, 0, err,
                             sizeof(err)) == -1 && strstr(err, "cannot be"),
           "unreadable file: %s", err);
    } else {
        ok(1, "unreadable file: skipped as root # SKIP root reads it");
    }
}


/* RFC 7515 A.1 and RFC 8037 A.4: signatures made by someone else */
static void
test_vectors(void)
{
    long             n;
    char             tok[512];
    idem_jws_key_t   k;
    unsigned char    raw[64];
    static const char  *hs =
        "eyJ0eXAiOiJKV1QiLA0KICJhbGciOiJIUzI1NiJ9."
        "eyJpc3MiOiJqb2UiLA0KICJleHAiOjEzMDA4MTkzODAsDQogImh0dHA6Ly9leGFt"
        "cGxlLmNvbS9pc19yb290Ijp0cnVlfQ."
        "dBjftJeZ4CVP-mB92K27uhbUJU1p1r_wW1gFWFOEjXk";
    static const char  *ed =
        "eyJhbGciOiJFZERTQSJ9.RXhhbXBsZSBvZiBFZDI1NTE5IHNpZ25pbmc."
        "hgyY0il_MGCjP0JzlnLWG1PPOt7-09PGcvMg3AIbQR6dWbhijcNR4ki4iylGjg5Bh"
        "VsPt9g7sVvpAr_MuM0KAg";

    memset(&k, 0, sizeof(k));
    k.alg = IDEM_JWS_HS256;
    k.secret = raw;
    n = idem_b64url_decode("AyM1SysPpbyDfgZld3umj1qzKObwVMkoqQ-EstJQLr_T-1qS"
                           "0gZH75aKtMN3Yj0iPS4hcgUuTwjAzZr1Z9CAow", 86, raw);
    k.secret_len = (size_t) n;

    /* the signature holds; the claims are not an approval's */
    expect(hs, &k, 1, IDEM_JWS_MALFORMED, "RFC 7515 A.1: signature holds");
    snprintf(tok, sizeof(tok), "%s", hs);
    tok[strlen(tok) - 10] ^= 1;
    expect(tok, &k, 1, IDEM_JWS_BAD_SIGNATURE, "RFC 7515 A.1 tampered");

    memset(&k, 0, sizeof(k));
    k.alg = IDEM_JWS_ED25519;
    idem_b64url_decode("11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo", 43, raw);
    k.pkey = EVP_PKEY_new_raw_public_key(EVP_PKEY_ED25519, NULL, raw, 32);

    expect(ed, &k, 1, IDEM_JWS_MALFORMED, "RFC 8037 A.4: signature holds");
    snprintf(tok, sizeof(tok), "%s", ed);
    tok[25] ^= 1;
    expect(tok, &k, 1, IDEM_JWS_BAD_SIGNATURE, "RFC 8037 A.4 tampered");

    EVP_PKEY_free(k.pkey);
}


static void
test_good(idem_jws_key_t *hs, idem_jws_key_t *ed)
{
    char               *tok, *payload;
    idem_jws_rc_t       rc;
    idem_jws_claims_t   c;

    tok = token(hs, "{\"alg\":\"HS256\",\"typ\":\"JWT\",\"kid\":\"h1\"}",
                claims_ok());
    rc = verify(tok, hs, 1, &c);
    is_str(idem_jws_reason(rc), "ok", "HS256 approval");
    is_str(c.sub, "alice", "sub is the approver");
    is_str(c.jti, "j-1", "jti");
    is_str(c.kid, "h1", "kid");
    ok(c.exp == 1800000600 && c.iat == 1799999000, "exp and iat");
    free(tok);

    tok = token(ed, "{\"alg\":\"EdDSA\",\"kid\":\"e1\"}", claims_ok());
    expect(tok, ed, 1, IDEM_JWS_OK, "Ed25519 approval, no typ");
    free(tok);

    /* idem_jws_sign() and idem_jws_approval(), as the tool uses them */
    payload = idem_jws_approval(IDK, FP, "bob", NOW, NOW + 60, NULL);
    tok = idem_jws_sign(ed, payload, strlen(payload));
    rc = verify(tok, ed, 1, &c);
    is_str(idem_jws_reason(rc), "ok", "idem_jws_sign Ed25519");
    is_str(c.sub, "bob", "its sub");
    is_str(c.jti, "", "no jti");
    free(tok);

    tok = idem_jws_sign(hs, payload, strlen(payload));
    expect(tok, hs, 1, IDEM_JWS_OK, "idem_jws_sign HS256");
    free(tok);
    free(payload);

    payload = idem_jws_approval(IDK, FP, "bob", NOW - 120, NOW - 60, NULL);
    tok = idem_jws_sign(hs, payload, strlen(payload));
    expect(tok, hs, 1, IDEM_JWS_EXPIRED, "idem_jws_sign, past exp");
    free(tok);
    free(payload);
}


static void
test_claims(idem_jws_key_t *hs)
{
    size_t       i;
    char        *tok;
    static const struct {
        const char     *payload;
        idem_jws_rc_t   rc;
        const char     *name;
    } cases[] = {
        { "{\"idk\":\"order-43\",\"fp\":\"" FP "\",\"sub\":\"a\","
          "\"iat\":1,\"exp\":1800000600}", IDEM_JWS_WRONG_KEY, "other idk" },
        { "{\"idk\":\"order-4\",\"fp\":\"" FP "\",\"sub\":\"a\","
          "\"iat\":1,\"exp\":1800000600}", IDEM_JWS_WRONG_KEY,
          "idk a prefix of the key" },
        { "{\"idk\":\"" IDK "\",\"fp\":\"" FP2 "\",\"sub\":\"a\","
          "\"iat\":1,\"exp\":1800000600}", IDEM_JWS_WRONG_FINGERPRINT,
          "other fp" },
        { "{\"idk\":\"" IDK "\",\"fp\":\"0123\",\"sub\":\"a\","
          "\"iat\":1,\"exp\":1800000600}", IDEM_JWS_WRONG_FINGERPRINT,
          "fp a prefix" },
        { "{\"idk\":\"" IDK "\",\"fp\":\"" FP "\",\"sub\":\"a\","
          "\"iat\":1,\"exp\":1799999999}", IDEM_JWS_EXPIRED, "exp past" },
        { "{\"idk\":\"" IDK "\",\"fp\":\"" FP "\",\"sub\":\"a\","
          "\"iat\":1,\"exp\":1800000000}", IDEM_JWS_EXPIRED, "exp is now" },
        { "{\"fp\":\"" FP "\",\"sub\":\"a\",\"iat\":1,\"exp\":1800000600}",
          IDEM_JWS_MALFORMED, "no idk" },
        { "{\"idk\":\"" IDK "\",\"sub\":\"a\",\"iat\":1,\"exp\":1800000600}",
          IDEM_JWS_MALFORMED, "no fp" },
        { "{\"idk\":\"" IDK "\",\"fp\":\"" FP "\",\"iat\":1,"
          "\"exp\":1800000600}", IDEM_JWS_MALFORMED, "no sub" },
        { "{\"idk\":\"" IDK "\",\"fp\":\"" FP "\",\"sub\":\"\",\"iat\":1,"
          "\"exp\":1800000600}", IDEM_JWS_MALFORMED, "empty sub" },
        { "{\"idk\":\"" IDK "\",\"fp\":\"" FP "\",\"sub\":\"a\","
          "\"exp\":1800000600}", IDEM_JWS_MALFORMED, "no iat" },
        { "{\"idk\":\"" IDK "\",\"fp\":\"" FP "\",\"sub\":\"a\",\"iat\":1}",
          IDEM_JWS_MALFORMED, "no exp" },
        { "{\"idk\":\"" IDK "\",\"fp\":\"" FP "\",\"sub\":\"a\",\"iat\":1,"
          "\"exp\":\"1800000600\"}", IDEM_JWS_MALFORMED, "exp a string" },
        { "{\"idk\":\"" IDK "\",\"fp\":\"" FP "\",\"sub\":\"a\",\"iat\":1,"
          "\"exp\":1800000600.5}", IDEM_JWS_MALFORMED, "exp a fraction" },
        { "{\"idk\":\"" IDK "\",\"fp\":\"" FP "\",\"sub\":\"a\",\"iat\":1,"
          "\"exp\":1e300}", IDEM_JWS_MALFORMED, "exp too large" },
        { "{\"idk\":\"" IDK "\",\"fp\":\"" FP "\",\"sub\":\"a\",\"iat\":1,"
          "\"exp\":1800000600,\"jti\":7}", IDEM_JWS_MALFORMED,
          "jti a number" },
        { "{\"idk\":[\"" IDK "\"],\"fp\":\"" FP "\",\"sub\":\"a\",\"iat\":1,"
          "\"exp\":1800000600}", IDEM_JWS_MALFORMED, "idk an array" },
        { "{\"idk\":\"" IDK "\\u0000x\",\"fp\":\"" FP "\",\"sub\":\"a\","
          "\"iat\":1,\"exp\":1800000600}", IDEM_JWS_MALFORMED,
          "idk with \\u0000" },
        { "{\"idk\":\"x\",\"idk\":\"" IDK "\",\"fp\":\"" FP "\","
          "\"sub\":\"a\",\"iat\":1,\"exp\":1800000600}", IDEM_JWS_MALFORMED,
          "idk twice" },
        { "{\"idk\":\"" IDK "\",\"fp\":\"" FP "\",\"sub\":\"a\",\"iat\":1,"
          "\"exp\":1800000600} x", IDEM_JWS_MALFORMED, "text after JSON" },
        { "[1]", IDEM_JWS_MALFORMED, "payload an array" },
        { "not json", IDEM_JWS_MALFORMED, "payload not JSON" },
    };

    for (i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        tok = token(hs, "{\"alg\":\"HS256\",\"kid\":\"h1\"}",
                    cases[i].payload);
        expect(tok, hs, 1, cases[i].rc, cases[i].name);
        free(tok);
    }
}


static void
test_headers(idem_jws_key_t *keys)
{
    size_t       i;
    char        *tok;
    static const struct {
        const char     *hdr;
        int             sign_with;   /* index in keys, -1: none */
        idem_jws_rc_t   rc;
        const char     *name;
    } cases[] = {
        { "{\"alg\":\"none\",\"kid\":\"h1\"}", -1, IDEM_JWS_REFUSED_ALG,
          "alg none, empty signature" },
        { "{\"alg\":\"none\",\"kid\":\"h1\"}", 0, IDEM_JWS_REFUSED_ALG,
          "alg none, with a signature" },
        { "{\"alg\":\"RS256\",\"kid\":\"h1\"}", 0, IDEM_JWS_REFUSED_ALG,
          "alg RS256" },
        { "{\"alg\":\"hs256\",\"kid\":\"h1\"}", 0, IDEM_JWS_REFUSED_ALG,
          "alg in lowercase" },
        { "{\"kid\":\"h1\"}", 0, IDEM_JWS_MALFORMED, "no alg" },
        { "{\"alg\":\"HS256\",\"alg\":\"none\",\"kid\":\"h1\"}", 0,
          IDEM_JWS_MALFORMED, "alg twice" },
        { "{\"alg\":\"HS256\",\"typ\":\"JOSE\",\"kid\":\"h1\"}", 0,
          IDEM_JWS_MALFORMED, "typ JOSE" },
        { "{\"alg\":\"HS256\",\"typ\":1,\"kid\":\"h1\"}", 0,
          IDEM_JWS_MALFORMED, "typ a number" },
        { "{\"alg\":\"HS256\",\"crit\":[\"x\"],\"x\":1,\"kid\":\"h1\"}", 0,
          IDEM_JWS_MALFORMED, "crit" },
        { "{\"alg\":\"HS256\",\"kid\":7}", 0, IDEM_JWS_MALFORMED,
          "kid a number" },
        { "{\"alg\":\"HS256\",\"kid\":\"h9\"}", 0, IDEM_JWS_UNKNOWN_KID,
          "unknown kid" },
        { "{\"alg\":\"HS256\"}", 0, IDEM_JWS_UNKNOWN_KID,
          "no kid, every key has one" },
        /* confusion: the token names a key of the other type */
        { "{\"alg\":\"HS256\",\"kid\":\"e1\"}", 0, IDEM_JWS_REFUSED_ALG,
          "HS256 token, Ed25519 key's kid" },
        { "{\"alg\":\"EdDSA\",\"kid\":\"h1\"}", 1, IDEM_JWS_REFUSED_ALG,
          "EdDSA token, HS256 key's kid" },
        /* rotation: e1 and e2 are both Ed25519 */
        { "{\"alg\":\"EdDSA\",\"kid\":\"e1\"}", 1, IDEM_JWS_OK, "kid e1" },
        { "{\"alg\":\"EdDSA\",\"kid\":\"e2\"}", 2, IDEM_JWS_OK, "kid e2" },
        { "{\"alg\":\"EdDSA\",\"kid\":\"e2\"}", 1, IDEM_JWS_BAD_SIGNATURE,
          "kid e2, signed by e1" },
        { "{\"alg\":\"HS256\",\"typ\":\"JWT\",\"kid\":\"h1\"}", 0,
          IDEM_JWS_OK, "typ JWT" },
        { "[\"HS256\"]", 0, IDEM_JWS_MALFORMED, "header an array" },
        { "{\"alg\":\"HS256\",\"kid\":\"h1\"", 0, IDEM_JWS_MALFORMED,
          "header cut" },
    };

    for (i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        tok = token(cases[i].sign_with < 0 ? NULL : &keys[cases[i].sign_with],
                    cases[i].hdr, claims_ok());
        expect(tok, keys, 3, cases[i].rc, cases[i].name);
        free(tok);
    }
}


/* the HS256 secret is the Ed25519 public key's PEM: the classic confusion */
static void
test_confusion(idem_jws_key_t *ed)
{
    char            *tok, *pem;
    long             n;
    BIO             *bio;
    idem_jws_key_t   fake;

    bio = BIO_new(BIO_s_mem());
    PEM_write_bio_PUBKEY(bio, ed->pkey);
    n = BIO_get_mem_data(bio, &pem);

    memset(&fake, 0, sizeof(fake));
    fake.alg = IDEM_JWS_HS256;
    fake.secret = (unsigned char *) pem;
    fake.secret_len = (size_t) n;

    tok = token(&fake, "{\"alg\":\"HS256\",\"kid\":\"e1\"}", claims_ok());
    expect(tok, ed, 1, IDEM_JWS_REFUSED_ALG,
           "HS256 keyed with the Ed25519 public PEM");
    free(tok);

    tok = token(&fake, "{\"alg\":\"HS256\"}", claims_ok());
    expect(tok, ed, 1, IDEM_JWS_UNKNOWN_KID, "the same without kid");
    free(tok);

    BIO_free(bio);
}


/* keys configured without kid: a token without kid tries each of them */
static void
test_no_kid(EVP_PKEY *ed1, EVP_PKEY *ed2)
{
    char            *tok;
    idem_jws_key_t   k[2];

    memset(k, 0, sizeof(k));
    k[0].alg = IDEM_JWS_ED25519;
    k[0].pkey = ed1;
    k[1].alg = IDEM_JWS_ED25519;
    k[1].pkey = ed2;

    tok = token(&k[1], "{\"alg\":\"EdDSA\"}", claims_ok());
    expect(tok, k, 2, IDEM_JWS_OK, "no kid: the second kid-less key");
    expect(tok, k, 1, IDEM_JWS_BAD_SIGNATURE, "no kid: only the other key");
    free(tok);

    tok = token(&k[0], "{\"alg\":\"EdDSA\",\"kid\":\"e1\"}", claims_ok());
    expect(tok, k, 2, IDEM_JWS_UNKNOWN_KID, "kid e1, only kid-less keys");
    free(tok);
}


static void
test_encoding(idem_jws_key_t *hs)
{
    size_t   len;
    char    *good, *tok, *dot;

    good = token(hs, "{\"alg\":\"HS256\",\"kid\":\"h1\"}", claims_ok());
    expect(good, hs, 1, IDEM_JWS_OK, "the token the others change");

    len = strlen(good);
    tok = malloc(len + 16 + IDEM_JWS_MAX);

    /* one byte of the payload, one of the signature */
    dot = strchr(good, '.');
    strcpy(tok, good);
    tok[dot - good + 5] = tok[dot - good + 5] == 'a' ? 'b' : 'a';
    expect(tok, hs, 1, IDEM_JWS_BAD_SIGNATURE, "payload byte changed");

    strcpy(tok, good);
    tok[len - 10] = tok[len - 10] == 'a' ? 'b' : 'a';
    expect(tok, hs, 1, IDEM_JWS_BAD_SIGNATURE, "signature byte changed");

    strcpy(tok, good);
    tok[len - 3] = '\0';
    expect(tok, hs, 1, IDEM_JWS_BAD_SIGNATURE, "signature cut short");

    sprintf(tok, "%s=", good);
    expect(tok, hs, 1, IDEM_JWS_MALFORMED, "padding on the signature");

    strcpy(tok, good);
    tok[dot - good + 3] = '+';
    expect(tok, hs, 1, IDEM_JWS_MALFORMED, "+ in the payload");

    sprintf(tok, "%s.", good);
    expect(tok, hs, 1, IDEM_JWS_MALFORMED, "four parts");

    strcpy(tok, good);
    *strrchr(tok, '.') = '\0';
    expect(tok, hs, 1, IDEM_JWS_MALFORMED, "two parts");

    sprintf(tok, " %s", good);
    expect(tok, hs, 1, IDEM_JWS_MALFORMED, "leading space");

    expect("", hs, 1, IDEM_JWS_MALFORMED, "empty");
    expect("..", hs, 1, IDEM_JWS_MALFORMED, "dots only");

    memset(tok, 'A', IDEM_JWS_MAX + 1);
    tok[IDEM_JWS_MAX + 1] = '\0';
    memcpy(tok, good, len);
    expect(tok, hs, 1, IDEM_JWS_MALFORMED, "over 8 KiB");

    free(tok);
    free(good);
}


static void
pointer_is(const cJSON *root, const char *ptr, const char *want)
{
    char         *got;
    const cJSON  *v;

    v = idem_json_pointer(root, ptr, strlen(ptr));
    got = v ? cJSON_PrintUnformatted(v) : NULL;
    is_str(got, want, "pointer \"%s\"", ptr);
    free(got);
}


/* RFC 6901 section 5's document and a few refusals */
static void
test_pointer(void)
{
    cJSON  *doc;

    doc = cJSON_Parse("{\"foo\":[\"bar\",\"baz\"],\"\":0,\"a/b\":1,"
                      "\"c%d\":2,\"e^f\":3,\"g|h\":4,\"i\\\\j\":5,"
                      "\"k\\\"l\":6,\" \":7,\"m~n\":8,"
                      "\"pay\":{\"amount\":100,\"to\":\"x\"}}");

    pointer_is(doc, "/foo", "[\"bar\",\"baz\"]");
    pointer_is(doc, "/foo/0", "\"bar\"");
    pointer_is(doc, "/foo/1", "\"baz\"");
    pointer_is(doc, "/", "0");
    pointer_is(doc, "/a~1b", "1");
    pointer_is(doc, "/c%d", "2");
    pointer_is(doc, "/i\\j", "5");
    pointer_is(doc, "/ ", "7");
    pointer_is(doc, "/m~0n", "8");
    pointer_is(doc, "/pay/amount", "100");
    pointer_is(doc, "/pay/missing", NULL);
    pointer_is(doc, "/foo/2", NULL);
    pointer_is(doc, "/foo/01", NULL);
    pointer_is(doc, "/foo/-", NULL);
    pointer_is(doc, "/m~2n", NULL);
    pointer_is(doc, "pay", NULL);
    ok(idem_json_pointer(doc, "", 0) == doc, "pointer \"\" is the document");

    cJSON_Delete(doc);
}


int
main(void)
{
    char             cmd[300];
    EVP_PKEY        *ed1, *ed2, *x;
    idem_jws_key_t   keys[3];
    unsigned char    secret[32];

    if (mkdtemp(dir) == NULL) {
        printf("Bail out! mkdtemp\n");
        return 1;
    }

    ed1 = EVP_PKEY_Q_keygen(NULL, NULL, "ED25519");
    ed2 = EVP_PKEY_Q_keygen(NULL, NULL, "ED25519");
    x = EVP_PKEY_Q_keygen(NULL, NULL, "X25519");
    RAND_bytes(secret, sizeof(secret));

    memset(keys, 0, sizeof(keys));
    keys[0].alg = IDEM_JWS_HS256;
    strcpy(keys[0].kid, "h1");
    keys[0].secret = secret;
    keys[0].secret_len = sizeof(secret);
    keys[1].alg = IDEM_JWS_ED25519;
    strcpy(keys[1].kid, "e1");
    keys[1].pkey = ed1;
    keys[2].alg = IDEM_JWS_ED25519;
    strcpy(keys[2].kid, "e2");
    keys[2].pkey = ed2;

    test_b64url();
    test_key_files(ed1, x);
    test_vectors();
    test_good(&keys[0], &keys[1]);
    test_claims(&keys[0]);
    test_headers(keys);
    test_confusion(&keys[1]);
    test_no_kid(ed1, ed2);
    test_encoding(&keys[0]);
    test_pointer();

    EVP_PKEY_free(ed1);
    EVP_PKEY_free(ed2);
    EVP_PKEY_free(x);

    snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
    if (system(cmd) != 0) {
        diag("could not remove %s", dir);
    }

    return done_testing();
}
