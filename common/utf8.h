/* UTF-8 validity of bytes that arrive from clients (strings in requests). */
#ifndef BATON_COMMON_UTF8_H
#define BATON_COMMON_UTF8_H

#include <stdbool.h>
#include <stddef.h>

/* Whether S[0, LEN) is well-formed UTF-8 (RFC 3629: no overlong forms, no
 * surrogates, nothing past U+10FFFF).  NUL bytes are valid characters. */
bool bt_utf8_valid(const char *s, size_t len);

#endif
