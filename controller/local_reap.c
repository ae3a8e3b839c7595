/*
 * local_reap.c: the ends of workers' processes, on the backend's thread:
 * reaping children (the fork server's end, or a workerd's, reported when
 * its worker's end was not), the SIGKILLs due after a grace period, and
 * the last usage and removal of the cgroup that goes with each end.
 */
#include "local_internal.h"

#include "cgroup.h"
#include "fault.h"
#include "log.h"
#include "scratch.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

/* The end of a worker attempt's processes: its cgroup's last usage goes
 * to the state machine, then whatever is left in it is killed and the
 * cgroup removed. */
void local_cg_finish(const char *id, int attempt) {
  struct backend_usage u = {.id = id, .attempt = attempt, .final = 1};
  char name[32];

  local_cg_name(id, attempt, name, sizeof(name));
  if (local_usage_read(&u) == 0)
    backend_report_usage(&u, 1);
  /* (what will not die within 200 ms is left to the sweep, 5 s on: the
   * backend's thread has other workers to start) */
  if (cg_destroy(name, 200) != 0)
    LOG(LOG_WARN, "the cgroup of %s still holds processes; trying again later", name);
}

/* Sends the SIGKILLs that are due (all of them when all is set), in one
 * batch. */
void local_kills_due(int64_t now, int all) {
  struct sigjob *jobs = NULL;
  struct attempt_of {
    char id[16];
    int attempt;
  } *names = NULL;
  int n = 0, cap = 0;

  pthread_mutex_lock(&lb.mu);
  for (struct lproc *p = lb.head, *next; p; p = next) {
    next = p->next;
    if (!p->kill_at_ms || (!all && p->kill_at_ms > now))
      continue;
    if (n == cap) {
      int c2 = cap ? 2 * cap : 64;
      struct sigjob *grown = realloc(jobs, (size_t)c2 * sizeof(*grown));
      struct attempt_of *more;
      if (!grown)
        break; /* the rest next time */
      jobs = grown;
      more = realloc(names, (size_t)c2 * sizeof(*more));
      if (!more)
        break;
      names = more;
      cap = c2;
    }
    jobs[n].pid = p->pid;
    jobs[n].start = p->start;
    jobs[n].sig = SIGKILL;
    jobs[n].whose = lp_whose(p);
    snprintf(names[n].id, sizeof(names[n].id), "%s", p->id);
    names[n].attempt = p->attempt;
    n++;
    p->kill_at_ms = 0;
    lp_maybe_free(p);
  }
  pthread_mutex_unlock(&lb.mu);
  local_signal_workers(jobs, n);
  /* and whatever of the worker left its session (a daemon that called
   * setsid()): the cgroup holds it still */
  for (int i = 0; i < n; i++)
    local_cg_finish(names[i].id, names[i].attempt);
  free(jobs);
  free(names);
}

/* The end of worker name's workerd (pid, wait status st): if the
 * out-of-memory killer of its cgroup killed it, says so in why. */
static int oom_words(const char *name, int st, char *why, size_t len) {
  long long kills, limit;

  if (!WIFSIGNALED(st) || WTERMSIG(st) != SIGKILL || cg_oom(name, &kills, &limit) != 0 ||
      kills <= 0)
    return 0;
  if (limit > 0)
    snprintf(why, len, "killed: out of memory (limit %.3g GiB)",
             (double)limit / (1024.0 * 1024.0 * 1024.0));
  else
    snprintf(why, len, "killed: out of memory");
  return 1;
}

/* Reaps exited children: the fork server, or workerds (reported if their
 * worker's end was not). */
void local_reap(void) {
  int st;
  pid_t pid;

  while ((pid = waitpid(-1, &st, WNOHANG)) > 0) {
    char why[200], id[16] = "", name[32] = "", cid[16] = "";
    int attempt = 0, catt = 0;

    if (pid == lb.zygote_pid) {
      LOG(LOG_WARN, "the workerd fork server exited; restarting it later");
      lb.zygote_pid = 0;
      local_zygote_close();
      continue;
    }
    pthread_mutex_lock(&lb.mu);
    for (struct lproc *p = lb.head; p; p = p->next)
      if (p->pid == pid && !p->adopted && !p->exited) {
        local_cg_name(p->id, p->attempt, name, sizeof(name));
        snprintf(cid, sizeof(cid), "%s", p->id);
        catt = p->attempt;
        if (p->live && !p->reported) {
          snprintf(id, sizeof(id), "%s", p->id);
          attempt = p->attempt;
          p->reported = 1;
        }
        /* Reaped: the pid and start time stay, for the leftovers of its
         * session (local_signal_workers() checks the start time). A released
         * worker's workerd has finished with its script: whatever is left
         * of its session is killed now, not at the end of the grace period,
         * so that its GPUs come free at once. */
        p->exited = 1;
        if (!p->live && p->kill_at_ms)
          p->kill_at_ms = 1;
        lp_maybe_free(p);
        break;
      }
    pthread_mutex_unlock(&lb.mu);
    if (!name[0])
      continue;
    /* A workerd killed outright could not let its session's /tmp go: if it
     * was the session's last, the tree goes now (common/scratch.h). */
    if (WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL)
      scratch_sweep(lb.cfg.state_dir);
    /* Reaped: its pid is free for anyone from here on (tests hand it to
     * another process before the KILL due for its leftovers). */
    FAULT_POINT("local_reaped");
    if (!id[0]) {
      /* its end was reported (or it was stopped): what is left of it goes */
      local_cg_finish(cid, catt);
      continue;
    }
    if (oom_words(name, st, why, sizeof(why)))
      ;
    else if (WIFSIGNALED(st))
      snprintf(why, sizeof(why), "muster-workerd (pid %d) was killed by signal %d (%s)", (int)pid,
               WTERMSIG(st), strsignal(WTERMSIG(st)));
    else
      snprintf(why, sizeof(why),
               "muster-workerd (pid %d) exited with code %d before reporting the worker's end",
               (int)pid, WEXITSTATUS(st));
    local_cg_finish(id, attempt);
    report_fail(BACKEND_EXITED, id, attempt, why);
  }
}
