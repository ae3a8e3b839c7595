/* utf8.h: UTF-8 text cut and checked at character boundaries, shared by
 * the controller and libmuster (hidden there: not part of its API). */
#ifndef MUSTER_UTF8_H
#define MUSTER_UTF8_H

#include <stddef.h>

#define UTF8_API __attribute__((visibility("hidden")))

/* The length of the valid UTF-8 character at s (at most n bytes, n >= 1),
 * or 0 if s starts no valid character (an overlong form, a surrogate, a
 * code point past U+10FFFF, a stray or missing continuation byte). */
UTF8_API size_t utf8_char_len(const unsigned char *s, size_t n);

/* The length of the longest start of the NUL-terminated UTF-8 text s that
 * is at most max bytes and ends between two characters: where a cut at max
 * would fall inside a character, it backs off to that character's first
 * byte. */
UTF8_API size_t utf8_fit(const char *s, size_t max);

/* The length of the n bytes of UTF-8 text at s without the character cut
 * at their end, if one is (what a bounded snprintf leaves). */
UTF8_API size_t utf8_trim(const char *s, size_t n);

/* 1 if s (NUL-terminated) is valid UTF-8, else 0. */
UTF8_API int utf8_valid(const char *s);

#endif
