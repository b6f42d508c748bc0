/*
 * libFuzzer target: approvals (idem_jws_verify, idem_b64url_decode and
 * _encode).  The input is the Idempotency-Confirmation value, checked
 * against one HS256 key (kid "h") and one Ed25519 key (kid "e", the public
 * key of RFC 8037 A.1, whose private half is published there, so seeds
 * can be validly signed), for a fixed key and fingerprint.
 *
 * Properties, for every input:
 *  - deterministic: the same token gives the same rc and claims twice;
 *  - never accepts a token whose signature does not verify: whenever the
 *    answer is one that is only given past the signature (ok, wrong_key,
 *    wrong_fingerprint, expired), the signature is checked again here,
 *    with HMAC and EVP_DigestVerify directly, over the exact bytes before
 *    the last dot, and must hold for the key its kid names;
 *  - ok only for a token of exactly three parts that names the expected
 *    key and fingerprint (checked by re-signing nothing: by reading the
 *    claims the verifier returned against the constants);
 *  - base64url: every input the strict decoder accepts re-encodes to
 *    itself (one spelling per byte string).
 */

#define _GNU_SOURCE   /* memrchr */

#include <string.h>

#include <openssl/hmac.h>
#include <openssl/crypto.h>

#include "idem_jws.h"

#include "fuzz_common.h"


#define FUZZ_IDK  "order-42"
#define FUZZ_FP   "0123456789abcdef0123456789abcdef" \
                  "0123456789abcdef0123456789abcdef"
#define FUZZ_NOW  1800000000LL

static const char  fuzz_secret[] = "fuzz-secret-fuzz-secret-fuzz-secret!";
static const char  fuzz_ed_x[] = "11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo";

static idem_jws_key_t  fuzz_keys[2];


static void
fuzz_jws_init(void)
{
    unsigned char  raw[32];

    if (fuzz_keys[0].alg) {
        return;
    }

    fuzz_keys[0].alg = IDEM_JWS_HS256;
    strcpy(fuzz_keys[0].kid, "h");
    fuzz_keys[0].secret = (unsigned char *) fuzz_secret;
    fuzz_keys[0].secret_len = sizeof(fuzz_secret) - 1;

    if (idem_b64url_decode(fuzz_ed_x, 43, raw) != 32) {
        abort();
    }

    fuzz_keys[1].alg = IDEM_JWS_ED25519;
    strcpy(fuzz_keys[1].kid, "e");
    fuzz_keys[1].pkey = EVP_PKEY_new_raw_public_key(EVP_PKEY_ED25519, NULL,
                                                    raw, 32);
    if (fuzz_keys[1].pkey == NULL) {
        abort();
    }
}


/* the signature checked here, without idem_jws.c's signature code */
static int
fuzz_jws_signed(const char *tok, size_t len, const char *kid)
{
    long            n;
    int             good;
    size_t          d2;
    EVP_MD_CTX     *md;
    const char     *dot;
    unsigned int    mac_len;
    unsigned char   sig[IDEM_JWS_MAX], mac[32];

    dot = memrchr(tok, '.', len);
    if (dot == NULL) {
        return 0;
    }

    d2 = (size_t) (dot - tok);
    n = idem_b64url_decode(dot + 1, len - d2 - 1, sig);

    if (strcmp(kid, "h") == 0) {
        HMAC(EVP_sha256(), fuzz_secret, sizeof(fuzz_secret) - 1,
             (const unsigned char *) tok, d2, mac, &mac_len);
        return n == 32 && CRYPTO_memcmp(mac, sig, 32) == 0;
    }

    if (strcmp(kid, "e") != 0 || n != 64) {
        return 0;
    }

    md = EVP_MD_CTX_new();
    good = md && EVP_DigestVerifyInit(md, NULL, NULL, NULL,
                                      fuzz_keys[1].pkey) == 1
           && EVP_DigestVerify(md, sig, 64, (const unsigned char *) tok, d2)
              == 1;
    EVP_MD_CTX_free(md);

    return good;
}


static void
fuzz_b64url(const char *in, size_t len)
{
    long            n;
    char           *again;
    unsigned char  *out;

    out = malloc(len + 1);
    n = idem_b64url_decode(in, len, out);

    if (n >= 0) {
        again = malloc(idem_b64url_len((size_t) n) + 1);
        FUZZ_CHECK(idem_b64url_encode(out, (size_t) n, again) == len
                   && memcmp(again, in, len) == 0,
                   "\"%s\" decodes but is not the encoding of its bytes",
                   fuzz_show(in, len));
        free(again);
    }

    free(out);
}


int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char               *tok;
    idem_jws_rc_t       rc, rc2;
    idem_jws_claims_t   c, c2;

    fuzz_jws_init();
    tok = fuzz_dup(data, size);

    rc = idem_jws_verify(tok, size, fuzz_keys, 2, FUZZ_IDK,
                         sizeof(FUZZ_IDK) - 1, FUZZ_FP, FUZZ_NOW, &c);
    rc2 = idem_jws_verify(tok, size, fuzz_keys, 2, FUZZ_IDK,
                          sizeof(FUZZ_IDK) - 1, FUZZ_FP, FUZZ_NOW, &c2);

    FUZZ_CHECK(rc == rc2 && memcmp(&c, &c2, sizeof(c)) == 0,
               "two answers for \"%s\": %s, %s", fuzz_show(tok, size),
               idem_jws_reason(rc), idem_jws_reason(rc2));

    if (rc == IDEM_JWS_OK || rc == IDEM_JWS_WRONG_KEY
        || rc == IDEM_JWS_WRONG_FINGERPRINT || rc == IDEM_JWS_EXPIRED)
    {
        FUZZ_CHECK(fuzz_jws_signed(tok, size, c.kid),
                   "\"%s\" is %s but its signature does not verify",
                   fuzz_show(tok, size), idem_jws_reason(rc));
    }

    if (rc == IDEM_JWS_OK) {
        FUZZ_CHECK(c.exp > FUZZ_NOW && c.sub[0] != '\0',
                   "accepted \"%s\" without a future exp and a sub",
                   fuzz_show(tok, size));
    }

    fuzz_b64url(tok, size);
    free(tok);

    return 0;
}
