/*
 * local_sample.c: what workers use, read from their cgroups on the
 * backend's thread and reported to the state machine in batches.
 */
#include "local_internal.h"

#include "cgroup.h"

#include <stdio.h>

/* Fills u (id and attempt set) from its cgroup. Returns 0, or -1. */
int local_usage_read(struct backend_usage *u) {
  struct cg_usage cu;
  char name[32];

  local_cg_name(u->id, u->attempt, name, sizeof(name));
  if (cg_usage_of(name, &cu) != 0)
    return -1;
  u->cpu_seconds = cu.cpu_seconds;
  u->memory_bytes = cu.memory_bytes;
  u->memory_peak_bytes = cu.memory_peak_bytes;
  return 0;
}

/* Samples what running workers use (their cgroups) and reports them in one
 * batch: once a second, SAMPLE_MAX of them at a time, in turn, so that
 * each worker is sampled at most once a second and thousands of them cost
 * the backend's thread (and the database) little. */
#define SAMPLE_MAX 200
void local_sample_usage(int64_t now) {
  static int64_t last;
  static unsigned long turn; /* where this round starts among the running */
  struct backend_usage u[SAMPLE_MAX];
  char ids[SAMPLE_MAX][16];
  unsigned long k = 0, running = 0;
  int n = 0, got = 0;

  if (!cg_enabled() || now - last < 1000)
    return;
  last = now;
  pthread_mutex_lock(&lb.mu);
  for (struct lproc *p = lb.head; p; p = p->next)
    running += p->live && p->pid > 0 && !p->exited;
  if (turn >= running)
    turn = 0;
  for (struct lproc *p = lb.head; p && n < SAMPLE_MAX; p = p->next) {
    if (!p->live || p->pid <= 0 || p->exited || k++ < turn)
      continue;
    snprintf(ids[n], sizeof(ids[n]), "%s", p->id);
    u[n] = (struct backend_usage){.id = ids[n], .attempt = p->attempt};
    n++;
  }
  turn += (unsigned long)n;
  pthread_mutex_unlock(&lb.mu);
  for (int i = 0; i < n; i++)
    if (local_usage_read(&u[i]) == 0)
      u[got++] = u[i];
  if (got)
    backend_report_usage(u, got);
}
