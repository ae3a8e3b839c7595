/*
 * await_progress.h: muster await's live progress line (await_progress.c),
 * drawn on stderr while cmd_await waits.
 */
#ifndef MUSTER_CLI_AWAIT_PROGRESS_H
#define MUSTER_CLI_AWAIT_PROGRESS_H

#include "muster.h"

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

/* Live progress of an await, on a terminal: a thread awaits the workers a
 * second at a time and redraws one line, e.g. "3/4 running, 1 failed" or
 * "1/2 running, 1 scheduling (waiting for 1 core (0 free of 2))". */
struct progress {
  muster_client *c;
  const char *const *ids;
  size_t n;
  muster_status *st;
  char (*why)[160]; /* what each scheduling one waits for, or "" */
  int wfc;
  int unreachable;  /* the last poll failed: the line says so */
  int stopping;     /* set by progress_stop() (atomically) */
  int drawn;        /* shown holds what the terminal shows */
  char shown[1024]; /* the line as last drawn, to draw only changes */
  pthread_t thread;
};

/* Starts the progress line for the n workers ids (borrowed until
 * progress_stop()) on a client of its own to the default controller; wfc:
 * counting those that succeeded (else those running). Best effort: returns
 * 0, or -1 with nothing started (progress_stop() is then a no-op). */
int progress_start(struct progress *p, const char *const *ids, size_t n, int wfc);

/* Cuts line to at most width - 1 characters (a character boundary, "…"
 * for what was cut), into out (outlen bytes); returns the characters kept. */
size_t progress_fit(const char *line, int width, char *out, size_t outlen);

/* Stops the thread, clears the line and frees what progress_start() took. */
void progress_stop(struct progress *p);

#endif
