/*
 * What a person reads must be what the request holds.  Values shown on
 * the approval page (HTML) and by the tools (a terminal) are written so
 * that no byte of them can change how the rest looks: markup is escaped,
 * and every character that is invisible or reorders text (controls, DEL,
 * C1 controls, bidirectional overrides and isolates, zero-width
 * characters) and every byte that is not UTF-8 is written as a visible
 * escape.  "1000" with a U+202E in front cannot pass for "0001".  Pure C.
 */

#ifndef IDEM_HTML_H
#define IDEM_HTML_H

#include <stddef.h>
#include <stdint.h>

/* 1 for a code point shown as an escape rather than itself */
int idem_char_hidden(uint32_t cp);

/*
 * HTML: & < > " ' as character references; a hidden character as
 * "⟨U+202E⟩", a byte that is not UTF-8 as "⟨0xFF⟩".  _len is the exact
 * size _put writes (no NUL).
 */
size_t idem_html_len(const char *s, size_t len);
char *idem_html_put(char *out, const char *s, size_t len);

/*
 * A terminal: a control byte, DEL and a byte that is not UTF-8 as
 * "\xNN"; a hidden character above U+007F as "\u{202E}"; a backslash as
 * "\\" (so an escape cannot be faked).  _len is exact.
 */
size_t idem_term_len(const char *s, size_t len);
char *idem_term_put(char *out, const char *s, size_t len);

#endif /* IDEM_HTML_H */
