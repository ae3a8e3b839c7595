/* log_tail.c: the last lines of a worker's log, made fit to quote in its
 * failure sentence. See log_tail.h. */
#include "log_tail.h"

#include "utf8.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* How much of the log's end is read: enough for the quoted bytes after
 * the escape sequences and malformed bytes are gone. */
#define LOG_TAIL_READ 8192

/* An OSC, DCS, SOS, PM or APC string (ESC ] ... BEL or ESC \\) that has no
 * end by then is taken to end at this many bytes: a title a program never
 * closed must not swallow the lines after it. */
#define ESCAPE_STRING_MAX 256

/* The number of bytes of the terminal escape sequence at s (s[0] is ESC,
 * n >= 1) to drop. A CSI (ESC [, parameter and intermediate bytes, a final
 * byte) ends at the first byte outside 0x20-0x3F, which is its final byte
 * if in 0x40-0x7E; else only what came before it goes. A string (OSC, DCS,
 * SOS, PM, APC) ends at BEL, ESC \\, a newline (kept) or after
 * ESCAPE_STRING_MAX bytes. Any other ESC drops the byte after it only if
 * printable ASCII (ESC 7, or ESC ( B with its intermediate bytes): a
 * newline or a character after a stray ESC stays. */
static size_t escape_len(const unsigned char *s, size_t n) {
  size_t i;

  if (n < 2)
    return n;
  if (s[1] == '[') {
    for (i = 2; i < n && s[i] >= 0x20 && s[i] <= 0x3F; i++)
      ;
    return i < n && s[i] >= 0x40 && s[i] <= 0x7E ? i + 1 : i;
  }
  if (s[1] == ']' || s[1] == 'P' || s[1] == 'X' || s[1] == '^' || s[1] == '_') {
    for (i = 2; i < n && i < ESCAPE_STRING_MAX; i++) {
      if (s[i] == 0x07)
        return i + 1;
      if (s[i] == '\n' || s[i] == '\r')
        return i;
      if (s[i] == 0x1B)
        return i + 1 < n && s[i + 1] == '\\' ? i + 2 : i;
    }
    return i;
  }
  /* ESC, intermediate bytes, a final byte (ESC ( B, ESC 7). */
  for (i = 1; i < n && s[i] >= 0x20 && s[i] <= 0x2F; i++)
    ;
  return i < n && s[i] >= 0x30 && s[i] <= 0x7E ? i + 1 : i;
}

/* 1 for the invisible characters that change how a terminal shows the text
 * around them (s holds a valid character of len bytes): zero-width ones
 * (U+200B-200F, U+2060-2069 but the unassigned, U+FEFF), the bidirectional
 * embeddings, overrides and isolates (U+202A-202E, U+2066-2069), and the
 * line and paragraph separators (U+2028, U+2029) that some viewers show as
 * a line break. A quote must read as what the script wrote. */
static int format_char(const unsigned char *s, size_t len) {
  if (len != 3)
    return 0;
  if (s[0] == 0xE2 && s[1] == 0x80)
    return (s[2] >= 0x8B && s[2] <= 0x8F) || (s[2] >= 0xA8 && s[2] <= 0xAE);
  if (s[0] == 0xE2 && s[1] == 0x81)
    return s[2] >= 0xA0 && s[2] <= 0xA9;
  return s[0] == 0xEF && s[1] == 0xBB && s[2] == 0xBF;
}

/* Copies in to out (n bytes of room at least) as valid UTF-8 text with no
 * control character but newline. Returns the length written. */
static size_t sanitize(const unsigned char *in, size_t n, char *out) {
  size_t i = 0, o = 0;

  /* The start may be inside a character: its continuation bytes go. */
  while (i < n && i < 3 && (in[i] & 0xC0) == 0x80)
    i++;
  while (i < n) {
    size_t len;

    if (in[i] == 0x1B) {
      i += escape_len(in + i, n - i);
      continue;
    }
    if (in[i] == '\r') {
      /* A carriage return ends a line (a progress bar's steps are lines). */
      out[o++] = '\n';
      i += i + 1 < n && in[i + 1] == '\n' ? 2 : 1;
      continue;
    }
    if (in[i] == '\t') {
      out[o++] = ' ';
      i++;
      continue;
    }
    if ((in[i] < 0x20 && in[i] != '\n') || in[i] == 0x7F) {
      i++;
      continue;
    }
    len = utf8_char_len(in + i, n - i);
    if (len == 0) {
      out[o++] = '?';
      i++;
      continue;
    }
    /* The C1 controls (U+0080..U+009F) are controls too. */
    if ((len == 2 && in[i] == 0xC2 && in[i + 1] < 0xA0) || format_char(in + i, len)) {
      i += len;
      continue;
    }
    memcpy(out + o, in + i, len);
    o += len;
    i += len;
  }
  return o;
}

/* 1 if the line of t from a to b (exclusive) holds only spaces. */
static int blank(const char *t, size_t a, size_t b) {
  for (; a < b; a++)
    if (t[a] != ' ')
      return 0;
  return 1;
}

size_t log_tail_clean(const char *in, size_t n, char *out) {
  char *t;
  size_t len, start, end, lines = 0, k;

  out[0] = '\0';
  if (n == 0)
    return 0;
  t = malloc(n);
  if (!t)
    return 0;
  len = sanitize((const unsigned char *)in, n, t);
  /* No blank lines (nor trailing spaces) at the end. */
  end = len;
  while (end > 0 && (t[end - 1] == '\n' || t[end - 1] == ' '))
    end--;
  /* The last LOG_TAIL_MAX_LINES lines. */
  start = end;
  while (start > 0) {
    if (t[start - 1] == '\n' && ++lines == LOG_TAIL_MAX_LINES)
      break;
    start--;
  }
  /* Whole lines go from the front while too long; a single line too long
   * keeps its end. */
  for (;;) {
    char *nl;

    /* No blank lines at the start. */
    while (start < end) {
      nl = memchr(t + start, '\n', end - start);
      if (!nl || !blank(t, start, (size_t)(nl - t)))
        break;
      start = (size_t)(nl - t) + 1;
    }
    if (end - start <= LOG_TAIL_MAX_BYTES)
      break;
    nl = memchr(t + start, '\n', end - start);
    if (nl) {
      start = (size_t)(nl - t) + 1;
      continue;
    }
    start = end - (LOG_TAIL_MAX_BYTES - 3);
    while (start < end && ((unsigned char)t[start] & 0xC0) == 0x80)
      start++;
    memcpy(out, "...", 3);
    k = end - start;
    memcpy(out + 3, t + start, k);
    out[3 + k] = '\0';
    free(t);
    return 3 + k;
  }
  k = end - start;
  memcpy(out, t + start, k);
  out[k] = '\0';
  free(t);
  return k;
}

size_t log_tail_read(const char *path, long long cap, int *capped, char *out) {
  char buf[LOG_TAIL_READ];
  const char *from = buf;
  struct stat st;
  off_t off;
  ssize_t k;
  size_t got = 0;
  int fd;

  out[0] = '\0';
  *capped = 0;
  fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return 0;
  if (fstat(fd, &st) != 0 || st.st_size <= 0) {
    close(fd);
    return 0;
  }
  /* Cut at the cap (a note follows it): its end was never stored, and the
   * lines at the cap are no end to quote. */
  if ((long long)st.st_size > cap) {
    *capped = 1;
    close(fd);
    return 0;
  }
  off = st.st_size > LOG_TAIL_READ ? st.st_size - LOG_TAIL_READ : 0;
  while (got < sizeof(buf)) {
    k = pread(fd, buf + got, sizeof(buf) - got, off + (off_t)got);
    if (k < 0 && errno == EINTR)
      continue;
    if (k <= 0)
      break;
    got += (size_t)k;
  }
  close(fd);
  /* Read from the middle of the log: its first line is cut, and goes if
   * any other is there. */
  if (off > 0) {
    const char *nl = memchr(buf, '\n', got);
    if (nl && (size_t)(nl - buf) + 1 < got) {
      got -= (size_t)(nl - buf) + 1;
      from = nl + 1;
    }
  }
  return log_tail_clean(from, got, out);
}
