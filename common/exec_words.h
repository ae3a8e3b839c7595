/*
 * exec_words.h: what muster-workerd said about a command it did not run
 * (a program not found, a directory that is not there, a stopping worker),
 * without the "worker ID: " that muster_exec_at() puts before it, for the
 * callers that name the worker themselves (muster run's "worker 1 (w-…):",
 * "rank 1 (w-…):").
 *
 * Header only: libmuster, the CLI and muster-launcher use it.
 */
#ifndef MUSTER_EXEC_WORDS_H
#define MUSTER_EXEC_WORDS_H

#include <string.h>

static inline const char *exec_words(const char *err) {
  const char *colon = strstr(err, ": ");

  return strncmp(err, "worker ", 7) == 0 && colon ? colon + 2 : err;
}

#endif
