/*
 * RFC 8785 (JCS) canonical JSON.  Pure C: no nginx types, so unit tests,
 * fuzzers and command line tools link it directly.
 */

#ifndef IDEM_JCS_H
#define IDEM_JCS_H

#include <stddef.h>

#include "idem_text.h"          /* idem_utf8_valid(), idem_utf16_cmp() */
#include "idem_pointer.h"       /* idem_ptr_set_t */

/* Output goes through a sink so the fingerprint can stream into SHA-256. */
typedef struct idem_sink_s  idem_sink_t;
typedef int (*idem_sink_write_pt)(idem_sink_t *sink, const char *p, size_t n);

struct idem_sink_s {
    idem_sink_write_pt   write;     /* returns 0 on success, -1 on error */
    void                *data;
};

/*
 * A sink that gathers what it is given in memory: write is
 * idem_sink_buf_write, data an idem_sink_buf_t that starts zeroed; the
 * caller frees its data (malloc'd, not NUL-terminated).
 */
typedef struct {
    char    *data;
    size_t   len;
    size_t   size;
} idem_sink_buf_t;

int idem_sink_buf_write(idem_sink_t *sink, const char *p, size_t n);

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
 * Both, with the members and elements named by excl left out
 * (docs/fingerprint.md section 3.1); excl may be NULL or empty.  What is
 * left out is still read and checked: the same input is refused for the
 * same reason with or without excl.
 */
idem_jcs_rc_t idem_jcs_canonicalize_excluding(const char *in, size_t len,
    const idem_ptr_set_t *excl, idem_sink_t *out);
idem_jcs_rc_t idem_jcs_canonicalize_in_place_excluding(char *buf, size_t len,
    const idem_ptr_set_t *excl, idem_sink_t *out);

/* Writes s (valid UTF-8, may hold NUL bytes) as a JCS string literal. */
int idem_jcs_write_string(idem_sink_t *out, const char *s, size_t len);

/*
 * ECMAScript Number::toString of d, shortest round-trip digits.
 * Returns the length written (without NUL), 0 if d is not finite.
 */
size_t idem_jcs_format_number(double d, char buf[IDEM_JCS_NUMBER_MAX]);

#endif /* IDEM_JCS_H */
