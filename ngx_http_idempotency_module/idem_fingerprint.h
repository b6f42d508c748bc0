/*
 * The request fingerprint, version 1, defined in docs/fingerprint.md: a
 * retry under the same Idempotency-Key must have the fingerprint of the
 * first attempt.  It is
 *
 *   lowercase hex SHA-256 of the JCS form of
 *   {"v":1,"method":M,"route":R,"query":Q,"scope":S,"headers":{...},"body":B}
 *
 * Pure C; the nginx glue fills idem_fp_input_t from the request.
 */

#ifndef IDEM_FINGERPRINT_H
#define IDEM_FINGERPRINT_H

#include <stddef.h>
#include "idem_jcs.h"

#define IDEM_FP_VERSION   1
#define IDEM_SHA256_LEN   32
#define IDEM_FP_HEX_LEN   64

typedef struct {
    const char  *data;
    size_t       len;
} idem_str_t;

typedef enum {
    IDEM_BODY_JSON = 0,         /* parsed, canonical JSON value */
    IDEM_BODY_RAW,              /* not a JSON media type: {"sha256":hex} */
    IDEM_BODY_RAW_INVALID_JSON  /* JSON media type, not canonicalizable */
} idem_body_form_t;

typedef struct {
    idem_str_t            method;
    idem_str_t            route;
    idem_str_t            query;
    idem_str_t            scope;

    /* names already lowercased; order does not matter, duplicates not allowed */
    const idem_str_t     *header_names;
    const idem_str_t     *header_values;
    size_t                nheaders;

    /*
     * Body: when body_json is set, body/body_len hold the whole body in
     * memory and it is canonicalized (falling back to the raw hash).
     * Otherwise body_sha256 holds the digest of the raw bytes, computed
     * by the caller while streaming the body (memory or file buffers).
     */
    int                   body_json;
    const char           *body;
    size_t                body_len;
    const unsigned char  *body_sha256;

    /*
     * body_in_place: body is a copy the caller does not need any more,
     * so the JSON body is canonicalized over itself (no second buffer).
     * If it turns out not to be JSON, its bytes are partly overwritten:
     * raw_sha256(raw_data, md) must then give the digest of the original
     * bytes from where they came from (0 on success).  Such an input is
     * good for one idem_fingerprint() or idem_fingerprint_preimage() call.
     */
    int                   body_in_place;
    int                 (*raw_sha256)(void *raw_data, unsigned char *md);
    void                 *raw_data;

    /*
     * idempotency_fingerprint_exclude: members of a JSON body left out
     * of B (docs/fingerprint.md section 3.1); NULL or empty for none.
     */
    const idem_ptr_set_t *exclude;
} idem_fp_input_t;

typedef struct {
    char               hex[IDEM_FP_HEX_LEN + 1];
    idem_body_form_t   body_form;
    idem_jcs_rc_t      json_rc;     /* why JSON fell back to raw */
} idem_fp_result_t;

/* 0 on success, -1 on allocation or hashing failure. */
int idem_fingerprint(const idem_fp_input_t *in, idem_fp_result_t *out);

/*
 * Writes the canonical preimage (the exact bytes hashed) to sink; used by
 * the offline command and by tests.
 */
int idem_fingerprint_preimage(const idem_fp_input_t *in, idem_sink_t *sink,
    idem_fp_result_t *out);

/* 1 if the Content-Type names application/json or any type/x+json. */
int idem_media_type_is_json(const char *ct, size_t len);

const char *idem_body_form_name(idem_body_form_t form);

/*
 * SHA-256, fetched once per process: with OpenSSL 3 every init through
 * EVP_sha256() looks the implementation up again.  The return value is an
 * EVP_MD pointer (void here so the header needs no OpenSSL include).
 */
const void *idem_sha256(void);

#endif /* IDEM_FINGERPRINT_H */
