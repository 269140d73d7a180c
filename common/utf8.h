/* UTF-8 validity of bytes that arrive from clients (strings in requests). */
#ifndef BATON_COMMON_UTF8_H
#define BATON_COMMON_UTF8_H

#include <stdbool.h>
#include <stddef.h>

/* Whether S[0, LEN) is well-formed UTF-8 (RFC 3629: no overlong forms, no
 * surrogates, nothing past U+10FFFF).  NUL bytes are valid characters. */
bool bt_utf8_valid(const char *s, size_t len);

/* S[0, LEN) as well-formed UTF-8 into OUT (room for 3 * LEN bytes): each
 * maximal invalid subpart replaced by U+FFFD, as Unicode recommends and
 * Rust's String::from_utf8_lossy (so Hugging Face's tokenizers) does.
 * Returns the bytes written. */
size_t bt_utf8_lossy(const char *s, size_t len, char *out);

/* The length of the longest prefix of S[0, LEN) that does not end inside a
 * multi-byte character: LEN, or less when the last character was cut (by
 * a fixed-size buffer, say).  Only the tail is looked at, so a prefix of
 * valid UTF-8 stays valid. */
size_t bt_utf8_cut(const char *s, size_t len);

/* For "%.*s": the bytes of the C string S to print when at most MAX may
 * be, cut on a character boundary. */
int bt_utf8_prefix(const char *s, size_t max);

#endif
