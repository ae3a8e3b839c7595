/*
 * local_spawn.c: starting a batch of workers on the backend's thread: each
 * one's cgroup (cgroup.h) and settings, its workerd (local_zygote.c), and
 * the report of its start (STARTED, with its backend_ref "PID:START") or of
 * why it could not start (REFUSED).
 */
#include "local_internal.h"

#include "cgroup.h"
#include "fault.h"
#include "muster_errors.h"
#include "network.h"
#include "zygote_proto.h"

#include <errno.h>
#include <pwd.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void wvars_fill(struct wvars *w, const struct job *j) {
  snprintf(w->url, sizeof(w->url), "MUSTER_CONTROLLER_URL=%s", j->controller_url);
  snprintf(w->id, sizeof(w->id), "MUSTER_WORKER_ID=%s", j->id);
  snprintf(w->token, sizeof(w->token), "MUSTER_WORKER_TOKEN=%s", j->token);
  snprintf(w->ip, sizeof(w->ip), "MUSTER_BIND_IP=%s", j->where.bind_ip);
  snprintf(w->attempt, sizeof(w->attempt), "MUSTER_WORKER_ATTEMPT=%d", j->attempt);
  snprintf(w->logpath, sizeof(w->logpath), "%s/workers/%s.log", lb.cfg.state_dir, j->id);
  snprintf(w->log, sizeof(w->log), ZYGOTE_LOG_FILE "=%s", w->logpath);
  w->v[0] = w->url;
  w->v[1] = w->id;
  w->v[2] = w->token;
  w->v[3] = w->ip;
  w->v[4] = w->attempt;
  w->v[5] = w->log; /* the fork server's only: where the output goes */
  snprintf(w->cgroup, sizeof(w->cgroup), "MUSTER_CGROUP=");
  w->v[6] = w->cgroup;
  /* Isolated workers' commands get namespaces of their own, in which the
   * state directory (the API token, every worker's token in muster.db) is
   * out of sight. */
  snprintf(w->confine, sizeof(w->confine), "MUSTER_CONFINE=%s",
           cg_confined() ? lb.cfg.state_dir : "");
  w->v[7] = w->confine;
  snprintf(w->run_as, sizeof(w->run_as), "MUSTER_RUN_AS=%s",
           j->account[0] ? j->account : lb.cfg.run_as);
  w->v[8] = w->run_as;
  /* Bridge mode: workerd makes its own network namespace on the bridge. */
  snprintf(w->netns, sizeof(w->netns), "MUSTER_NETNS=%s", net_workerd_setting());
  w->v[9] = w->netns;
}

/* Whether j's user's account (--unix-user) can run its commands here.
 * Returns 0, or -1 with why (the worker fails saying it). */
static int account_ok(const struct job *j, char *why, size_t whylen) {
  struct passwd pwbuf, *pw = NULL;
  char buf[4096];
  int e;

  if (!j->account[0])
    return 0;
  if (geteuid() != 0) {
    snprintf(why, whylen,
             "its user's unix account %s needs a controller run as root, which this one is not",
             j->account);
    return -1;
  }
  /* (getpwnam_r: API threads look accounts up meanwhile) */
  e = getpwnam_r(j->account, &pwbuf, buf, sizeof(buf), &pw);
  if (!pw) {
    snprintf(why, whylen, "its user's unix account %s %s", j->account,
             e ? strerror(e) : "does not exist on this host");
    return -1;
  }
  if (pw->pw_uid == 0 || pw->pw_gid == 0) {
    snprintf(why, whylen,
             "its user's unix account %s is root or in root's group; a worker's code never runs "
             "so",
             j->account);
    return -1;
  }
  return 0;
}

/* Records that j's workerd runs as pid (and reports it), or, if the worker
 * was released meanwhile, ends it again. */
static void start_done(const struct job *j, pid_t pid) {
  char ref[64], detail[160];
  unsigned long long start = 0;
  struct lproc *p;
  int zombie, wanted;

  /* The start time is read while the process cannot have been reaped yet:
   * only this thread reaps. */
  if (util_proc_stat(pid, &start, &zombie) != 0)
    start = 0;
  pthread_mutex_lock(&lb.mu);
  p = lp_find(j->id);
  if (p && p->attempt == j->attempt) {
    p->pid = pid;
    p->start = start;
  }
  wanted = p && p->live && p->attempt == j->attempt;
  pthread_mutex_unlock(&lb.mu);
  if (!wanted) {
    local_signal_worker(pid, start, SIG_CHILD, SIGKILL); /* not reaped: only this thread reaps */
    return;
  }
  snprintf(ref, sizeof(ref), "%d:%llu", (int)pid, start);
  snprintf(detail, sizeof(detail), "local backend: pid %d, address %s", (int)pid, j->where.bind_ip);
  {
    struct backend_report r = {
        .event = BACKEND_STARTED, .id = j->id, .attempt = j->attempt, .ref = ref, .detail = detail};
    backend_report(&r);
  }
}

/* Starts the workerds of n start jobs. Requests go to the fork server all
 * at once and the answers are read after, so that its forks overlap with
 * the rest; a worker it cannot fork is spawned directly. A request whose
 * answer is lost (the fork server broke) is not tried again: that workerd
 * may exist, and a second one of the same attempt must not. */
void local_start_batch(struct job **jobs, int n) {
  struct wvars *w = calloc((size_t)n, sizeof(*w));
  unsigned char *sent = calloc((size_t)n, 1);
  char err[1200];

  if (!w || !sent) {
    for (int i = 0; i < n; i++)
      report_fail(BACKEND_REFUSED, jobs[i]->id, jobs[i]->attempt, "out of memory");
    goto out;
  }
  local_zygote_ensure();
  for (int i = 0; i < n; i++) {
    struct cg_limits lim = {0};
    struct lproc *p;
    char name[32];
    int wanted;

    pthread_mutex_lock(&lb.mu);
    p = lp_find(jobs[i]->id);
    wanted = p && p->live && p->attempt == jobs[i]->attempt && p->pid == 0;
    if (wanted) {
      lim.cpu = p->req.cpu;
      lim.memory = p->req.memory;
      lim.gpus = p->gpu_mask;
    }
    pthread_mutex_unlock(&lb.mu);
    if (!wanted) {
      jobs[i] = NULL; /* stopped before it could start: it never will */
      continue;
    }
    if (account_ok(jobs[i], err, sizeof(err)) != 0) {
      report_fail(BACKEND_REFUSED, jobs[i]->id, jobs[i]->attempt, err);
      jobs[i] = NULL;
      continue;
    }
    wvars_fill(&w[i], jobs[i]);
    local_cg_name(jobs[i]->id, jobs[i]->attempt, name, sizeof(name));
    if (cg_create(name, &lim, w[i].cgroup + strlen("MUSTER_CGROUP="),
                  sizeof(w[i].cgroup) - strlen("MUSTER_CGROUP="), err, sizeof(err)) != 0) {
      report_fail(BACKEND_REFUSED, jobs[i]->id, jobs[i]->attempt, err);
      jobs[i] = NULL;
      continue;
    }
    sent[i] = local_zygote_send(&w[i]) == 0;
  }
  /* The workerds exist (or are being forked) and nothing records them yet:
   * the window a crash must not turn into a second run. */
  FAULT_POINT("local_spawned");
  for (int i = 0; i < n; i++) {
    pid_t pid = 0;
    int rc = MUSTER_E_BACKEND;

    if (!jobs[i])
      continue;
    if (sent[i]) {
      rc = local_zygote_recv(&pid);
      if (rc == MUSTER_E_PROTOCOL) {
        report_fail(BACKEND_REFUSED, jobs[i]->id, jobs[i]->attempt,
                    "the workerd fork server broke while starting it");
        continue;
      }
    }
    if (rc != 0 && local_spawn_direct(&w[i], &pid, err, sizeof(err)) != 0) {
      report_fail(BACKEND_REFUSED, jobs[i]->id, jobs[i]->attempt, err);
      continue;
    }
    start_done(jobs[i], pid);
  }
  /* (one that can no longer fork is closed now, not at the next batch) */
  local_zygote_ensure();
out:
  if (w)
    explicit_bzero(w, (size_t)n * sizeof(*w)); /* the tokens */
  free(w);
  free(sent);
}
