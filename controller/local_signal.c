/*
 * local_signal.c: signals to workers' processes. A worker's process is
 * identified by its pid and its start time (backend_local.c); a pid whose
 * start time differs belongs to someone else and is never signalled. Runs
 * on the backend's thread (or in reconcile); takes no lock.
 */
#include "local_internal.h"

#include "fault.h"
#include "log.h"
#include "muster_errors.h"

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

/* The start time of pid and whether it is a zombie, as util_proc_stat();
 * tests make /proc unreadable here (local_proc_unreadable). */
static int leader_stat(pid_t pid, unsigned long long *start, int *zombie) {
  if (FAULT_FAILS("local_proc_unreadable"))
    return MUSTER_E_NOT_FOUND;
  return util_proc_stat(pid, start, zombie);
}

/* One process of a session to signal, found by the pass over /proc. */
struct hit {
  pid_t pid;
  int job;
};

/* Signals each worker of jobs (n of them): its process group and its whole
 * session, but only while its workerd's pid is still the same process, or is
 * gone altogether (then the session's leftovers are signalled: a pid number
 * is not handed out again while processes of its session remain). A pid
 * that now belongs to another process is left alone. A workerd leads its own
 * session; the commands it runs for the exec channel have process groups of
 * their own but stay in the session, so the session is "the whole worker".
 *
 * The pid itself is signalled only while it is surely the workerd: our
 * child not reaped yet (a zombie keeps its pid), or an adopted process
 * whose /proc entry shows its start time. A reaped workerd's pid, or one
 * whose /proc entry cannot be read, may belong to anyone now: only its
 * session's leftovers are signalled, and none if a process has that pid
 * (a new process holds the number: the session is not the worker's).
 * /proc is read once for the whole batch: a stop of 1,000 workers is one
 * pass, not 1,000. */
void local_signal_workers(struct sigjob *jobs, int n) {
  struct hit *hits = NULL;
  struct dirent *e;
  int k = 0, nh = 0, cap = 0, partial = 0;
  DIR *d;

  for (int i = 0; i < n; i++) {
    unsigned long long now;
    int zombie, rc;

    if (jobs[i].pid <= 1)
      continue;
    rc = jobs[i].whose == SIG_REAPED ? MUSTER_E_NOT_FOUND : leader_stat(jobs[i].pid, &now, &zombie);
    if (rc == 0 && now != jobs[i].start) {
      LOG(LOG_DEBUG, "pid %d is another process now; not signalled", (int)jobs[i].pid);
      continue;
    }
    jobs[i].leader_gone = rc != 0 && jobs[i].whose != SIG_CHILD;
    /* A stop's SIGTERM goes to the live workerd alone, which hands it to
     * its command and its exec'd commands once each: signalled here too,
     * through the group or the session, a command got it twice, and a TERM
     * handler (a checkpoint) ran twice. SIGKILL, and a TERM after
     * workerd's end, still sweep the group and the session. */
    if (!jobs[i].leader_gone && jobs[i].sig == SIGTERM) {
      kill(jobs[i].pid, SIGTERM);
      continue;
    }
    if (!jobs[i].leader_gone) {
      /* The process itself (a fork server's child may not lead its session
       * yet), its group, then (below) its session. */
      kill(jobs[i].pid, jobs[i].sig);
      if (kill(-jobs[i].pid, jobs[i].sig) != 0 && errno != ESRCH)
        LOG(LOG_WARN, "could not signal process group %d: %s", (int)jobs[i].pid, strerror(errno));
    }
    jobs[k++] = jobs[i];
  }
  if (!k)
    return;
  qsort(jobs, (size_t)k, sizeof(*jobs), sid_cmp);
  d = opendir("/proc");
  if (!d)
    return;
  /* First the processes of each session, and whether a gone leader's pid
   * is held by a process again; then the signals. */
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
    pid = strtol(e->d_name, &p, 10);
    if (pid <= 1 || *p != '\0')
      continue;
    key.pid = (pid_t)pid;
    hit = bsearch(&key, jobs, (size_t)k, sizeof(*jobs), sid_cmp);
    if (hit && hit->leader_gone)
      hit->leader_gone = 2; /* a process has the number: not the worker's session */
    /* pid (comm) state ppid pgrp session ...; comm may hold spaces. */
    p = strrchr(buf, ')');
    if (!p || sscanf(p + 1, " %*c %*d %*d %ld", &session) != 1)
      continue;
    key.pid = (pid_t)session;
    hit = bsearch(&key, jobs, (size_t)k, sizeof(*jobs), sid_cmp);
    if (!hit)
      continue;
    if (nh == cap) {
      int c2 = cap ? 2 * cap : 64;
      struct hit *grown = realloc(hits, (size_t)c2 * sizeof(*grown));
      if (!grown) {
        partial = 1; /* out of memory: those found so far */
        break;
      }
      hits = grown;
      cap = c2;
    }
    hits[nh].pid = (pid_t)pid;
    hits[nh++].job = (int)(hit - jobs);
  }
  closedir(d);
  /* (after a pass cut short, a gone leader's pid may be held by a process
   * not seen: its session is left alone) */
  for (int i = 0; i < nh; i++)
    if (jobs[hits[i].job].leader_gone != 2 && !(partial && jobs[hits[i].job].leader_gone))
      kill(hits[i].pid, jobs[hits[i].job].sig);
  free(hits);
}

void local_signal_worker(pid_t pid, unsigned long long start, enum sig_whose whose, int sig) {
  struct sigjob j = {.pid = pid, .start = start, .sig = sig, .whose = whose};

  local_signal_workers(&j, 1);
}
