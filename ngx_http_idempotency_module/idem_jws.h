/*
 * Signed approvals (idempotency_confirm): a compact JWS (RFC 7515) that
 * binds a person's yes to one Idempotency-Key and one fingerprint until
 * its expiry.  Only HS256 and EdDSA (Ed25519) are accepted, each only
 * against a key of its own type; docs/confirmation.md gives the format.
 * Pure C: OpenSSL and cJSON, no nginx type, so the tool and the unit
 * tests sign and verify with this same code.
 */

#ifndef IDEM_JWS_H
#define IDEM_JWS_H

#include <stddef.h>
#include <stdint.h>

#include <openssl/evp.h>



/* larger Idempotency-Confirmation values are refused unread */
#define IDEM_JWS_MAX         8192
#define IDEM_JWS_KID_MAX     64
#define IDEM_JWS_SUB_MAX     256
#define IDEM_JWS_JTI_MAX     128
#define IDEM_JWS_HS256_MIN   32

typedef enum {
    IDEM_JWS_HS256 = 1,
    IDEM_JWS_ED25519
} idem_jws_alg_e;

/*
 * Why a token is refused; each but OK and EXPIRED is one "reason" of the
 * confirmation-invalid answer (idem_jws_reason()).
 */
typedef enum {
    IDEM_JWS_OK = 0,
    IDEM_JWS_MALFORMED,         /* encoding, JSON, typ, claims missing */
    IDEM_JWS_REFUSED_ALG,       /* none, unknown, or not the key's type */
    IDEM_JWS_UNKNOWN_KID,
    IDEM_JWS_BAD_SIGNATURE,
    IDEM_JWS_WRONG_KEY,         /* idk is another Idempotency-Key */
    IDEM_JWS_WRONG_FINGERPRINT,
    IDEM_JWS_EXPIRED
} idem_jws_rc_t;

typedef struct {
    idem_jws_alg_e   alg;
    char             kid[IDEM_JWS_KID_MAX + 1];   /* "" when none */
    unsigned char   *secret;     /* HS256, malloc'ed */
    size_t           secret_len;
    EVP_PKEY        *pkey;       /* Ed25519: public (verify) or private */
} idem_jws_key_t;

/* what a verified token says, for the log and the answer */
typedef struct {
    char             sub[IDEM_JWS_SUB_MAX + 1];
    char             jti[IDEM_JWS_JTI_MAX + 1];
    char             kid[IDEM_JWS_KID_MAX + 1];
    int64_t          exp;
    int64_t          iat;
} idem_jws_claims_t;


/*
 * Reads a key file: HS256, the file's bytes without one trailing newline
 * (at least IDEM_JWS_HS256_MIN); Ed25519, a PEM SubjectPublicKeyInfo, or
 * with private set a PEM private key (for signing).  0, or -1 with a
 * message in err.
 */
int idem_jws_key_load(idem_jws_key_t *key, idem_jws_alg_e alg,
    const char *path, const char *kid, int private, char *err,
    size_t err_len);
void idem_jws_key_free(idem_jws_key_t *key);

/*
 * Checks a token against keys[0..n): the key is the one whose kid the
 * header names (or, without kid, each key configured without one), the
 * signature, then the claims idk, fp (64 lowercase hex) and exp against
 * now (seconds).  The claims are filled once the signature holds.
 */
idem_jws_rc_t idem_jws_verify(const char *tok, size_t len,
    const idem_jws_key_t *keys, size_t n, const char *idk, size_t idk_len,
    const char *fp, int64_t now, idem_jws_claims_t *claims);

/* the answer's "reason": "malformed", "bad_signature", ... */
const char *idem_jws_reason(idem_jws_rc_t rc);

/*
 * Signs payload (a JSON text) with key (HS256 secret or Ed25519 private
 * key): a malloc'ed NUL-terminated compact JWS, or NULL.
 */
char *idem_jws_sign(const idem_jws_key_t *key, const char *payload,
    size_t payload_len);

/*
 * The payload of an approval, as idempotency-approve writes it: a
 * malloc'ed JSON text, or NULL.  jti may be NULL.
 */
char *idem_jws_approval(const char *idk, const char *fp, const char *sub,
    int64_t iat, int64_t exp, const char *jti);


/*
 * base64url without padding, strictly: only the URL alphabet, no '=',
 * no length of 1 mod 4, unused bits zero.  Decode returns the length,
 * or -1; out needs (len * 3) / 4 bytes.
 */
long idem_b64url_decode(const char *in, size_t len, unsigned char *out);
size_t idem_b64url_encode(const unsigned char *in, size_t len, char *out);
#define idem_b64url_len(n)  (((n) * 4 + 2) / 3)

#endif /* IDEM_JWS_H */
