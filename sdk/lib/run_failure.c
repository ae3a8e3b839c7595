/* run_failure.c: the first failure of a run's attempt, recorded once and
 * waited for, and a failure shortened to fit a buffer without losing its
 * last line. */
#include "muster.h"
#include "run_internal.h"
#include "utf8.h"

#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

/* Writes the len bytes of s (valid UTF-8) at out, in at most room bytes
 * (room >= 4): whole, or its start cut at a character and "...". Returns
 * the bytes written (no NUL). */
static size_t put_head(char *out, size_t room, const char *s, size_t len) {
  size_t k;

  if (len <= room) {
    memcpy(out, s, len);
    return len;
  }
  k = room - 3;
  while (k > 0 && ((unsigned char)s[k] & 0xC0) == 0x80)
    k--;
  memcpy(out, s, k);
  memcpy(out + k, "...", 3);
  return k + 3;
}

/* The same for the end of s: whole, or "..." and its end, cut at a
 * character. */
static size_t put_tail(char *out, size_t room, const char *s, size_t len) {
  size_t from;

  if (len <= room) {
    memcpy(out, s, len);
    return len;
  }
  from = len - (room - 3);
  while (from < len && ((unsigned char)s[from] & 0xC0) == 0x80)
    from++;
  memcpy(out, "...", 3);
  memcpy(out + 3, s + from, len - from);
  return 3 + len - from;
}

void muster_run_failure_fit_(const char *in, char *out, size_t size) {
  size_t n = strlen(in), room = size - 1, head, o, rest;
  const char *nl = strchr(in, '\n'), *lines, *from;

  if (n <= room) {
    memcpy(out, in, n + 1);
    return;
  }
  if (!nl) {
    o = put_head(out, room, in, n);
    out[o] = '\0';
    return;
  }
  head = (size_t)(nl - in);
  o = put_head(out, head + 1 <= room / 2 ? head : room / 2, in, head);
  out[o++] = '\n';
  /* The quoted lines: from the first one that starts within the room left. */
  lines = nl + 1;
  rest = room - o;
  from = in + n - rest;
  if (from > lines && from[-1] != '\n') {
    const char *next = memchr(from, '\n', (size_t)(in + n - from));
    from = next ? next + 1 : from;
  }
  if (from < lines)
    from = lines;
  o += put_tail(out + o, rest, from, (size_t)(in + n - from));
  out[o] = '\0';
}

void muster_run_failure_line_(const char *in, char *out, size_t size) {
  const char *nl = strchr(in, '\n'), *last = strrchr(in, '\n');
  size_t room = size - 1, head, tail, o;

  if (!nl) {
    muster_run_failure_fit_(in, out, size);
    return;
  }
  head = (size_t)(nl - in);
  tail = strlen(last + 1);
  /* The last line gets what the sentence leaves, and at least half. */
  o = put_head(out,
               head + 1 + tail <= room ? head
               : tail < room / 2       ? room - tail - 1
                                       : room / 2,
               in, head);
  out[o++] = ' ';
  o += put_tail(out + o, room - o, last + 1, tail);
  out[o] = '\0';
}

/* Records text as the first failure (of worker), under the run's lock. */
static void record_locked(struct run *run, const char *worker, char *all) {
  if (!run->r->failure[0]) {
    /* A worker's failure quotes its stderr: too long, its last line stays. */
    all[utf8_trim(all, strlen(all))] = '\0';
    muster_run_failure_fit_(all, run->r->failure, sizeof(run->r->failure));
    snprintf(run->r->failed_worker, sizeof(run->r->failed_worker), "%s", worker ? worker : "");
    pthread_cond_broadcast(&run->failed);
  }
  run->cancel = 1;
  if (run->mpirun > 0)
    kill(run->mpirun, SIGTERM);
}

/* Records the first failure only. */
void muster_run_fail_(struct run *run, const char *worker, const char *fmt, ...) {
  char all[2 * sizeof(run->r->failure)];
  va_list ap;

  va_start(ap, fmt);
  vsnprintf(all, sizeof(all), fmt, ap);
  va_end(ap);
  pthread_mutex_lock(&run->lock);
  record_locked(run, worker, all);
  pthread_mutex_unlock(&run->lock);
}

int muster_run_fail_live_(struct run *run, const char *worker, const char *text) {
  char all[2 * sizeof(run->r->failure)];
  int live;

  snprintf(all, sizeof(all), "%s", text);
  pthread_mutex_lock(&run->lock);
  live = !run->cancel;
  if (live)
    record_locked(run, worker, all);
  pthread_mutex_unlock(&run->lock);
  return live;
}

/* A rank or daemon that lost its worker's exec connection makes mpirun exit
 * with 255 (what muster rank and muster rsh then say, as ssh does). The
 * controller tells the monitor which worker failed, and why, moments later:
 * wait a little for that, so that the run names the worker. */
void muster_run_await_worker_failure_(struct run *run, int seconds) {
  struct timespec end;

  clock_gettime(CLOCK_MONOTONIC, &end);
  end.tv_sec += seconds;
  pthread_mutex_lock(&run->lock);
  while (!run->r->failure[0] && pthread_cond_timedwait(&run->failed, &run->lock, &end) == 0)
    ;
  pthread_mutex_unlock(&run->lock);
}
