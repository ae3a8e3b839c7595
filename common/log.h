/*
 * log.h: the daemons' one logging macro.
 *
 * LOG(LOG_INFO, "fmt", ...) checks the level before formatting anything.
 * Lines go to stderr as "2026-11-21T14:00:00.123Z muster-controller INFO msg".
 * Never pass a secret (API token, worker token, secret_env value) to it.
 */
#ifndef MUSTER_LOG_H
#define MUSTER_LOG_H

enum log_level { LOG_ERROR = 0, LOG_WARN = 1, LOG_INFO = 2, LOG_DEBUG = 3 };

extern int log_verbosity;

/* Sets the program name shown on every line (a static string). */
void log_set_program(const char *name);

void log_write(enum log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#define LOG(level, ...)                                                                            \
  do {                                                                                             \
    if ((int)(level) <= log_verbosity)                                                             \
      log_write((level), __VA_ARGS__);                                                             \
  } while (0)

#endif
