/* log.c: see log.h. */
#include "log.h"

#include "util.h"

#include <stdarg.h>
#include <stdio.h>

int log_verbosity = LOG_INFO;
static const char *log_program = "muster";

void log_set_program(const char *name) {
  log_program = name;
}

void log_write(enum log_level level, const char *fmt, ...) {
  static const char *const names[] = {"ERROR", "WARN", "INFO", "DEBUG"};
  char when[32];
  char msg[2048];
  va_list ap;

  util_now_iso(when, sizeof(when));
  va_start(ap, fmt);
  vsnprintf(msg, sizeof(msg), fmt, ap);
  va_end(ap);
  /* One fprintf per line so that lines from several threads never interleave. */
  fprintf(stderr, "%s %s %s %s\n", when, log_program, names[level], msg);
}
