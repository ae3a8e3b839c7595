/* log_tail.h: the last lines of a worker's log, made fit to quote in its
 * failure sentence (a traceback's last lines, say). */
#ifndef MUSTER_LOG_TAIL_H
#define MUSTER_LOG_TAIL_H

#include <stddef.h>

/* At most this many lines and bytes (not counting the terminating NUL) are
 * quoted. */
#define LOG_TAIL_MAX_LINES 10
#define LOG_TAIL_MAX_BYTES 2048

/* Makes the n bytes of in (the end of a log, possibly starting inside a
 * character) fit to quote: valid UTF-8 (a malformed byte becomes '?'), no
 * control character other than newline (a tab becomes a space, a carriage
 * return ends a line, terminal escape sequences are dropped), none of the
 * invisible characters that reorder or break what a terminal shows (bidi
 * controls, zero-width characters, U+2028, U+2029), no blank lines
 * at either end, at most LOG_TAIL_MAX_LINES lines and LOG_TAIL_MAX_BYTES
 * bytes, taken from the end. A last line longer than that keeps its end,
 * cut at a character boundary after "...". Writes the NUL-terminated
 * result to out, which must hold LOG_TAIL_MAX_BYTES + 1 bytes, and returns
 * its length (0: nothing worth quoting). */
size_t log_tail_clean(const char *in, size_t n, char *out);

/* Reads the end of the log at path and cleans it as log_tail_clean() does
 * into out (LOG_TAIL_MAX_BYTES + 1 bytes). A log longer than cap bytes was
 * cut at cap (its end is not stored): *capped is then 1 and nothing is
 * read; else 0. Returns the length, 0 when the log is missing, empty,
 * unreadable, capped or only blank. */
size_t log_tail_read(const char *path, long long cap, int *capped, char *out);

#endif
