/*
 * jwsbench: what checking one approval of idempotency_confirm costs, per
 * algorithm: idem_jws_verify() of a valid token (header and payload
 * parsed with cJSON, the signature checked, the claims read), the whole
 * of the module's work for an approval before Redis is asked.  For
 * scale, the raw signature check alone (EVP_DigestVerify, HMAC).
 *
 *   cc -O2 -Ingx_http_idempotency_module -o build/jwsbench bench/jwsbench.c \
 *       ngx_http_idempotency_module/idem_jws.c -lcjson -lcrypto -lm
 *   build/jwsbench [ITERATIONS]
 *
 * Prints one "JWSBENCH op=... us_per_op=..." line per op: the median of 5
 * repeats of ITERATIONS (default 20000).
 */

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <openssl/hmac.h>

#include "idem_jws.h"


#define IDK  "order-42"
#define FP   "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
#define REPEATS  5


static double
now_us(void)
{
    struct timespec  ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);

    return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}


static int
cmp(const void *a, const void *b)
{
    double  x = *(const double *) a, y = *(const double *) b;

    return (x > y) - (x < y);
}


static void
bench(const char *op, const idem_jws_key_t *key, const char *tok, int raw,
    long iters)
{
    int                 r;
    long                i;
    double              t[REPEATS], t0;
    size_t              len, d2;
    EVP_MD_CTX         *md;
    unsigned char       sig[64], mac[32];
    unsigned int        mac_len;
    idem_jws_claims_t   c;

    len = strlen(tok);
    d2 = (size_t) (strrchr(tok, '.') - tok);
    idem_b64url_decode(tok + d2 + 1, len - d2 - 1, sig);

    for (r = 0; r < REPEATS; r++) {
        t0 = now_us();

        for (i = 0; i < iters; i++) {
            if (!raw) {
                if (idem_jws_verify(tok, len, key, 1, IDK, sizeof(IDK) - 1,
                                    FP, 1800000000, &c) != IDEM_JWS_OK)
                {
                    abort();
                }

            } else if (key->alg == IDEM_JWS_HS256) {
                HMAC(EVP_sha256(), key->secret, (int) key->secret_len,
                     (unsigned char *) tok, d2, mac, &mac_len);

            } else {
                md = EVP_MD_CTX_new();
                if (EVP_DigestVerifyInit(md, NULL, NULL, NULL, key->pkey) != 1
                    || EVP_DigestVerify(md, sig, 64, (unsigned char *) tok,
                                        d2) != 1)
                {
                    abort();
                }
                EVP_MD_CTX_free(md);
            }
        }

        t[r] = (now_us() - t0) / iters;
    }

    qsort(t, REPEATS, sizeof(double), cmp);
    printf("JWSBENCH op=%s us_per_op=%.2f best=%.2f\n", op, t[REPEATS / 2],
           t[0]);
}


int
main(int argc, char **argv)
{
    long             iters;
    char            *payload, *ed_tok, *hs_tok;
    idem_jws_key_t   ed, hs;
    static unsigned char  secret[32] = "jwsbench-secret-jwsbench-secret";

    iters = argc > 1 ? atol(argv[1]) : 20000;

    memset(&ed, 0, sizeof(ed));
    ed.alg = IDEM_JWS_ED25519;
    ed.pkey = EVP_PKEY_Q_keygen(NULL, NULL, "ED25519");
    strcpy(ed.kid, "e");

    memset(&hs, 0, sizeof(hs));
    hs.alg = IDEM_JWS_HS256;
    hs.secret = secret;
    hs.secret_len = sizeof(secret);
    strcpy(hs.kid, "h");

    payload = idem_jws_approval(IDK, FP, "alice@example.com", 1799999000,
                                1800000300, NULL);
    ed_tok = idem_jws_sign(&ed, payload, strlen(payload));
    hs_tok = idem_jws_sign(&hs, payload, strlen(payload));

    if (ed_tok == NULL || hs_tok == NULL) {
        return 1;
    }

    bench("verify_ed25519", &ed, ed_tok, 0, iters);
    bench("raw_ed25519", &ed, ed_tok, 1, iters);
    bench("verify_hs256", &hs, hs_tok, 0, iters);
    bench("raw_hs256", &hs, hs_tok, 1, iters);

    return 0;
}
