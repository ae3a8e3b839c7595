/* utf8.c: UTF-8 text cut and checked at character boundaries. See utf8.h. */
#include "utf8.h"

#include <string.h>

size_t utf8_char_len(const unsigned char *s, size_t n) {
  unsigned cp;
  size_t len;

  if (s[0] < 0x80)
    return 1;
  if (s[0] >= 0xC2 && s[0] <= 0xDF)
    len = 2, cp = s[0] & 0x1Fu;
  else if (s[0] >= 0xE0 && s[0] <= 0xEF)
    len = 3, cp = s[0] & 0x0Fu;
  else if (s[0] >= 0xF0 && s[0] <= 0xF4)
    len = 4, cp = s[0] & 0x07u;
  else
    return 0;
  if (len > n)
    return 0;
  for (size_t i = 1; i < len; i++) {
    if ((s[i] & 0xC0) != 0x80)
      return 0;
    cp = (cp << 6) | (s[i] & 0x3Fu);
  }
  if ((len == 3 && cp < 0x800) || (len == 4 && (cp < 0x10000 || cp > 0x10FFFF)) ||
      (cp >= 0xD800 && cp <= 0xDFFF))
    return 0;
  return len;
}

size_t utf8_fit(const char *s, size_t max) {
  size_t n = strnlen(s, max + 1), k;

  if (n <= max)
    return n;
  /* s[max] is the first byte left out: while it continues a character,
   * that character goes too (at most 3 bytes back). */
  k = max;
  while (k > 0 && max - k < 3 && ((unsigned char)s[k] & 0xC0) == 0x80)
    k--;
  return k;
}

size_t utf8_trim(const char *s, size_t n) {
  const unsigned char *p = (const unsigned char *)s;
  size_t j = n, want;

  while (j > 0 && n - j < 4 && (p[j - 1] & 0xC0) == 0x80)
    j--;
  if (j == 0 || p[j - 1] < 0xC0)
    return n; /* ends after ASCII or a whole character (or is no UTF-8) */
  want = p[j - 1] >= 0xF0 ? 4 : p[j - 1] >= 0xE0 ? 3 : 2;
  return n - (j - 1) < want ? j - 1 : n;
}

int utf8_valid(const char *s) {
  const unsigned char *p = (const unsigned char *)s;
  size_t n = strlen(s);

  while (n > 0) {
    size_t len = utf8_char_len(p, n);
    if (len == 0)
      return 0;
    p += len;
    n -= len;
  }
  return 1;
}
