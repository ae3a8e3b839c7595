/* await_progress.c: muster await's live progress line on a terminal. */
#include "await_progress.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void progress_draw(struct progress *p) {
  size_t counts[MUSTER_STATUS_UNKNOWN + 1] = {0};
  char line[256];
  size_t len = 0;

  for (size_t i = 0; i < p->n; i++)
    counts[p->st[i]]++;
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
  fprintf(stderr, "\r\033[K%s", line);
  fflush(stderr);
}

static int progress_event(void *arg, const muster_event *e) {
  struct progress *p = arg;

  for (size_t i = 0; i < p->n; i++)
    if (strcmp(p->ids[i], e->worker_id) == 0) {
      p->st[i] = e->to;
      progress_draw(p);
    }
  return 0;
}

static void *progress_main(void *arg) {
  struct progress *p = arg;

  progress_draw(p);
  if (muster_events(p->c, p->since, progress_event, p) != 0)
    return NULL;
  return NULL;
}

/* Starts the progress line: reads the workers' current statuses and the
 * event seq of that moment, then follows from there. Best effort. */
int progress_start(struct progress *p, const char *const *ids, size_t n, int wfc) {
  muster_worker_list all = {0};

  memset(p, 0, sizeof(*p));
  p->ids = ids;
  p->n = n;
  p->wfc = wfc;
  p->st = calloc(n + 1, sizeof(*p->st));
  if (!p->st || muster_client_new_default(&p->c) != 0 ||
      muster_list(p->c, 1u << MUSTER_SCHEDULING | 1u << MUSTER_STARTING | 1u << MUSTER_RUNNING,
                  NULL, NULL, &all, &p->since) != 0)
    goto fail;
  for (size_t i = 0; i < n; i++) {
    p->st[i] = MUSTER_STATUS_UNKNOWN;
    for (size_t k = 0; k < all.count; k++)
      if (strcmp(all.items[k].id, ids[i]) == 0)
        p->st[i] = all.items[k].status;
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
  p->c = NULL;
  p->st = NULL;
  return -1;
}

void progress_stop(struct progress *p) {
  if (!p->c)
    return;
  muster_client_cancel(p->c);
  pthread_join(p->thread, NULL);
  fprintf(stderr, "\r\033[K");
  muster_client_free(p->c);
  free(p->st);
}
