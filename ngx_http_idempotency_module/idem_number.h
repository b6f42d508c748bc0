/*
 * JSON numbers as RFC 8785 writes them: the ECMAScript Number::toString
 * of the double a token denotes.  idem_jcs_format_number() (idem_jcs.h)
 * is defined here; the token functions serve the parser's users.
 */

#ifndef IDEM_NUMBER_H
#define IDEM_NUMBER_H

#include <stddef.h>

#include "idem_jcs.h"

/*
 * The double of the number token s[0..n), whose grammar the caller has
 * checked: ENUMBER when it is not finite, ENOMEM.
 */
idem_jcs_rc_t idem_jcs_number_value(const unsigned char *s, size_t n,
    double *d);

/*
 * The canonical text of the number token s[0..n): *text points into the
 * token itself when its canonical form is a part of it (then *len <= n),
 * else into buf.
 */
idem_jcs_rc_t idem_jcs_number_text(const unsigned char *s, size_t n,
    char buf[IDEM_JCS_NUMBER_MAX], const char **text, size_t *len);

#endif /* IDEM_NUMBER_H */
