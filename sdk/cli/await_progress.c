/* await_progress.c: muster await's live progress line on a terminal. */
#include "await_progress.h"
#include "cli.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <time.h>
#include <unistd.h>

/* The line as composed, before it is cut to the terminal's width. */
#define LINE_MAX_BYTES 512

/* The terminal's width in columns (stderr's), 80 where it says none. */
static int terminal_width(void) {
  struct winsize ws;

  if (ioctl(STDERR_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0)
    return ws.ws_col;
  return 80;
}

size_t progress_fit(const char *line, int width, char *out, size_t outlen) {
  size_t chars = 0, i = 0, keep = 0, total = 0;
  size_t max = width > 1 ? (size_t)width - 1 : 1;

  /* Characters are counted by their first bytes (one column each: the
   * line holds the ASCII and "×" and "…" of muster's own words). */
  for (size_t k = 0; line[k]; k++)
    if (((unsigned char)line[k] & 0xC0) != 0x80)
      total++;
  if (total <= max && strlen(line) < outlen) {
    memcpy(out, line, strlen(line) + 1);
    return total;
  }
  /* Keep max - 1 characters whole, and "…" for the rest. */
  while (line[i]) {
    size_t next = i + 1;
    while (line[next] && ((unsigned char)line[next] & 0xC0) == 0x80)
      next++;
    if (chars + 1 > max - 1 || next + sizeof("…") > outlen)
      break;
    chars++;
    i = next;
  }
  keep = i;
  memcpy(out, line, keep);
  memcpy(out + keep, "…", sizeof("…"));
  return chars + 1;
}

/* Draws the line, cut to the terminal's width minus one so that it never
 * wraps ("\r\033[K" clears one row only, and a wrapped row would stay
 * behind); only when it changed. */
static void progress_draw(struct progress *p) {
  size_t counts[MUSTER_STATUS_UNKNOWN + 1] = {0};
  char line[LINE_MAX_BYTES], fit[sizeof(p->shown)];
  size_t len = 0;
  const char *why = NULL;

  for (size_t i = 0; i < p->n; i++) {
    counts[p->st[i]]++;
    if (!why && p->st[i] == MUSTER_SCHEDULING && p->why[i][0])
      why = p->why[i];
  }
  len += (size_t)snprintf(line + len, sizeof(line) - len, "%zu/%zu %s",
                          p->wfc ? counts[MUSTER_SUCCEEDED] : counts[MUSTER_RUNNING], p->n,
                          p->wfc ? "succeeded" : "running");
  for (int s = 0; s <= MUSTER_STATUS_UNKNOWN && len < sizeof(line); s++) {
    if (!counts[s] || s == (p->wfc ? MUSTER_SUCCEEDED : MUSTER_RUNNING) ||
        s == MUSTER_STATUS_UNKNOWN)
      continue;
    len += (size_t)snprintf(line + len, sizeof(line) - len, ", %zu %s", counts[s],
                            muster_status_name((muster_status)s));
  }
  /* What the first scheduling one waits for (the others mostly the same). */
  if (why && len < sizeof(line)) {
    char *safe = term_safe_dup(why, 0);
    len += (size_t)snprintf(line + len, sizeof(line) - len, " (waiting for %s)", safe ? safe : "?");
    free(safe);
  }
  if (p->unreachable && len < sizeof(line))
    snprintf(line + len, sizeof(line) - len, " (controller unreachable)");
  (void)progress_fit(line, terminal_width(), fit, sizeof(fit));
  if (p->drawn && strcmp(fit, p->shown) == 0)
    return;
  memcpy(p->shown, fit, strlen(fit) + 1);
  p->drawn = 1;
  fprintf(stderr, "\r\033[K%s", fit);
  fflush(stderr);
}

/* Takes the statuses and waiting reasons of the workers of l that are p's. */
static void progress_take(struct progress *p, const muster_worker_list *l) {
  for (size_t k = 0; k < l->count; k++)
    for (size_t i = 0; i < p->n; i++)
      if (strcmp(p->ids[i], l->items[k].id) == 0) {
        p->st[i] = l->items[k].status;
        (void)muster_worker_waiting_for(&l->items[k], p->why[i], sizeof(p->why[i]));
      }
}

/* Sleeps ms milliseconds, a tenth of a second at a time; 1 when
 * progress_stop() asked the thread to end meanwhile. */
static int progress_nap(struct progress *p, int ms) {
  for (int t = 0; t < ms; t += 100) {
    struct timespec ts = {0, 100 * 1000 * 1000};
    if (__atomic_load_n(&p->stopping, __ATOMIC_ACQUIRE))
      return 1;
    nanosleep(&ts, NULL);
  }
  return __atomic_load_n(&p->stopping, __ATOMIC_ACQUIRE);
}

/* Awaits the workers a second at a time, redrawing the line after each
 * (what a worker waits for changes without an event: when others end),
 * until they are there or progress_stop() ends it. A failed poll (the
 * controller restarting, a blip) is tried again after 1, 2, 4, then 8 s,
 * and the line says the controller is unreachable meanwhile. */
static void *progress_main(void *arg) {
  struct progress *p = arg;
  int backoff_ms = 1000;

  progress_draw(p);
  for (;;) {
    muster_await_result r;
    int more;
    if (muster_await(p->c, p->ids, p->n, p->wfc, 1.0, &r) != 0) {
      if (__atomic_load_n(&p->stopping, __ATOMIC_ACQUIRE))
        break;
      p->unreachable = 1;
      progress_draw(p);
      if (progress_nap(p, backoff_ms))
        break;
      backoff_ms = backoff_ms < 8000 ? backoff_ms * 2 : 8000;
      continue;
    }
    backoff_ms = 1000;
    p->unreachable = 0;
    progress_take(p, &r.workers);
    progress_take(p, &r.failures);
    more = r.timed_out;
    muster_await_result_free(&r);
    progress_draw(p);
    if (!more)
      break;
  }
  return NULL;
}

/* Starts the progress line: reads the workers' current statuses, then
 * awaits them on a thread of its own. Best effort. */
int progress_start(struct progress *p, const char *const *ids, size_t n, int wfc) {
  muster_worker_list all = {0};

  memset(p, 0, sizeof(*p));
  p->ids = ids;
  p->n = n;
  p->wfc = wfc;
  p->st = calloc(n + 1, sizeof(*p->st));
  p->why = calloc(n + 1, sizeof(*p->why));
  if (!p->st || !p->why || muster_client_new_default(&p->c) != 0 ||
      muster_list(p->c, 1u << MUSTER_SCHEDULING | 1u << MUSTER_STARTING | 1u << MUSTER_RUNNING,
                  NULL, NULL, &all, NULL) != 0)
    goto fail;
  for (size_t i = 0; i < n; i++)
    p->st[i] = MUSTER_STATUS_UNKNOWN;
  progress_take(p, &all);
  for (size_t i = 0; i < n; i++) {
    /* Not live: it has ended already; ask how (a few at most, usually). */
    if (p->st[i] == MUSTER_STATUS_UNKNOWN && i < 64) {
      muster_worker w;
      if (muster_get(p->c, ids[i], &w) == 0)
        p->st[i] = w.status;
      muster_worker_cleanup(&w);
    }
  }
  muster_worker_list_free(&all);
  if (pthread_create(&p->thread, NULL, progress_main, p) != 0)
    goto fail;
  return 0;
fail:
  muster_worker_list_free(&all);
  muster_client_free(p->c);
  free(p->st);
  free(p->why);
  p->c = NULL;
  p->st = NULL;
  p->why = NULL;
  return -1;
}

void progress_stop(struct progress *p) {
  if (!p->c)
    return;
  __atomic_store_n(&p->stopping, 1, __ATOMIC_RELEASE);
  muster_client_cancel(p->c);
  pthread_join(p->thread, NULL);
  fprintf(stderr, "\r\033[K");
  muster_client_free(p->c);
  free(p->st);
  free(p->why);
}
