/*
 * RFC 8785 (JCS) canonical JSON on top of cJSON.  Pure C: no nginx types,
 * so unit tests, fuzzers and command line tools link it directly.
 */

#ifndef IDEM_JCS_H
#define IDEM_JCS_H

#include <stddef.h>

struct cJSON;

/* Output goes through a sink so the fingerprint can stream into SHA-256. */
typedef struct idem_sink_s  idem_sink_t;
typedef int (*idem_sink_write_pt)(idem_sink_t *sink, const char *p, size_t n);

struct idem_sink_s {
    idem_sink_write_pt   write;     /* returns 0 on success, -1 on error */
    void                *data;
};

typedef enum {
    IDEM_JCS_OK = 0,
    IDEM_JCS_ESYNTAX,       /* not JSON (incl. trailing garbage) */
    IDEM_JCS_EUTF8,         /* invalid UTF-8 in the input */
    IDEM_JCS_ESURROGATE,    /* lone surrogate in a \u escape */
    IDEM_JCS_ENUL,          /* \u0000 in a string */
    IDEM_JCS_EDUP,          /* duplicate member name in one object */
    IDEM_JCS_ENUMBER,       /* number that is not a finite double */
    IDEM_JCS_EDEPTH,        /* nesting deeper than IDEM_JCS_MAX_DEPTH */
    IDEM_JCS_ENOMEM,
    IDEM_JCS_ESINK          /* the sink failed */
} idem_jcs_rc_t;

/* Deepest array/object nesting accepted; documented in docs/fingerprint.md. */
#define IDEM_JCS_MAX_DEPTH   128

/* Longest text idem_jcs_format_number() writes, with the terminating NUL. */
#define IDEM_JCS_NUMBER_MAX  32

const char *idem_jcs_strerror(idem_jcs_rc_t rc);

/* Validate the raw text strictly, then write its canonical form to out. */
idem_jcs_rc_t idem_jcs_canonicalize(const char *in, size_t len,
    idem_sink_t *out);

/*
 * Same, for input the caller no longer needs: buf[0..len) is overwritten
 * (the canonical text is built over it), so no second body-sized buffer
 * is needed unless a number grows (1e20).
 */
idem_jcs_rc_t idem_jcs_canonicalize_in_place(char *buf, size_t len,
    idem_sink_t *out);

/*
 * Same as idem_jcs_canonicalize(), but also hands back the parsed tree
 * (caller frees with cJSON_Delete) when tree != NULL and rc == IDEM_JCS_OK.
 */
idem_jcs_rc_t idem_jcs_parse(const char *in, size_t len, struct cJSON **tree);
idem_jcs_rc_t idem_jcs_write_value(const struct cJSON *v, idem_sink_t *out);

/* Writes s (valid UTF-8, may hold NUL bytes) as a JCS string literal. */
int idem_jcs_write_string(idem_sink_t *out, const char *s, size_t len);

/*
 * ECMAScript Number::toString of d, shortest round-trip digits.
 * Returns the length written (without NUL), 0 if d is not finite.
 */
size_t idem_jcs_format_number(double d, char buf[IDEM_JCS_NUMBER_MAX]);

/* 1 if p[0..len) is well-formed UTF-8 (no surrogates, no overlongs). */
int idem_utf8_valid(const char *p, size_t len);

/*
 * Orders two UTF-8 strings by their UTF-16 code units (RFC 8785 3.2.3):
 * <0, 0, >0 like memcmp.  Used for member names and fingerprint headers.
 */
int idem_jcs_utf16_cmp(const char *a, size_t alen, const char *b,
    size_t blen);

#endif /* IDEM_JCS_H */
