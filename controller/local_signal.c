/*
 * local_signal.c: signals to workers' processes. A worker's process is
 * identified by its pid and its start time (backend_local.c); a pid whose
 * start time differs belongs to someone else and is never signalled. Runs
 * on the backend's thread (or in reconcile, before it runs); takes no lock.
 */
#include "local_internal.h"

#include "log.h"

#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* 1 if the process recorded as (pid, start) still runs. */
int local_proc_same(pid_t pid, unsigned long long start) {
  unsigned long long now;
  int zombie;

  return pid > 1 && util_proc_stat(pid, &now, &zombie) == 0 && now == start && !zombie;
}

static int sid_cmp(const void *a, const void *b) {
  pid_t x = ((const struct sigjob *)a)->pid, y = ((const struct sigjob *)b)->pid;

  return (x > y) - (x < y);
}

/* Signals each worker of jobs (n of them): its process group and its whole
 * session, but only while its workerd's pid is still the same process, or is
 * gone altogether (then the session's leftovers are signalled: a pid number
 * is not handed out again while processes of its session remain). A pid
 * that now belongs to another process is left alone. A workerd leads its own
 * session; the commands it runs for the exec channel have process groups of
 * their own but stay in the session, so the session is "the whole worker".
 * /proc is read once for the whole batch: a stop of 1,000 workers is one
 * pass, not 1,000. */
void local_signal_workers(struct sigjob *jobs, int n) {
  struct dirent *e;
  int k = 0;
  DIR *d;

  for (int i = 0; i < n; i++) {
    unsigned long long now;
    int zombie;

    if (jobs[i].pid <= 1)
      continue;
    if (util_proc_stat(jobs[i].pid, &now, &zombie) == 0 && now != jobs[i].start) {
      LOG(LOG_DEBUG, "pid %d is another process now; not signalled", (int)jobs[i].pid);
      continue;
    }
    /* The process itself (a fork server's child may not lead its session
     * yet), its group, then (below) its session. */
    kill(jobs[i].pid, jobs[i].sig);
    if (kill(-jobs[i].pid, jobs[i].sig) != 0 && errno != ESRCH)
      LOG(LOG_WARN, "could not signal process group %d: %s", (int)jobs[i].pid, strerror(errno));
    jobs[k++] = jobs[i];
  }
  if (!k)
    return;
  qsort(jobs, (size_t)k, sizeof(*jobs), sid_cmp);
  d = opendir("/proc");
  if (!d)
    return;
  while ((e = readdir(d)) != NULL) {
    char path[300], buf[512], *p;
    struct sigjob key, *hit;
    long pid, session;
    FILE *f;
    size_t len;

    if (e->d_name[0] < '1' || e->d_name[0] > '9')
      continue;
    snprintf(path, sizeof(path), "/proc/%s/stat", e->d_name);
    f = fopen(path, "re");
    if (!f)
      continue;
    len = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[len] = '\0';
    /* pid (comm) state ppid pgrp session ...; comm may hold spaces. */
    p = strrchr(buf, ')');
    if (!p || sscanf(p + 1, " %*c %*d %*d %ld", &session) != 1)
      continue;
    key.pid = (pid_t)session;
    hit = bsearch(&key, jobs, (size_t)k, sizeof(*jobs), sid_cmp);
    pid = strtol(e->d_name, &p, 10);
    if (hit && pid > 1 && *p == '\0')
      kill((pid_t)pid, hit->sig);
  }
  closedir(d);
}

void local_signal_worker(pid_t pid, unsigned long long start, int sig) {
  struct sigjob j = {pid, start, sig};

  local_signal_workers(&j, 1);
}
