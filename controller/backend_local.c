/*
 * backend_local.c: the local backend (see backend.h).
 *
 * Workers run as muster-workerd processes on the controller's host, each in
 * its own session, each with its own address: in its own network namespace
 * on the controller's bridge (network.h), or a loopback one (127.0.1.1 on)
 * on the host's network. The
 * backend owns those processes: it spawns them (through the workerd fork
 * server), signals them with TERM -> KILL escalation, reaps them and probes
 * the ones an earlier controller left. All of that happens on the backend's
 * own thread; the operations called under the state lock only record what
 * to do (lb.mu, a leaf lock: nothing else is taken while it is held).
 *
 * A worker's process is identified by its pid and its start time (field 22
 * of /proc/PID/stat), written as backend_ref "PID:START". A pid whose start
 * time differs belongs to someone else and is never signalled.
 *
 * Where the host allows it, each worker is a container (cgroup.h): its
 * workerd joins a cgroup of its own, "ID.ATTEMPT", before it does anything
 * else, with the worker's memory as a hard limit and its cpu as a quota;
 * when the workerd ends (or its SIGKILL is due), every process left in the
 * cgroup is killed and the cgroup removed.
 *
 * This file is the backend's thread (its loop hands work to the parts and
 * gets results back) and its operations table; the parts are listed in
 * local_internal.h.
 */
#include "backend.h"
#include "cgroup.h"
#include "envlists.h"
#include "local_internal.h"

#include "fault.h"
#include "log.h"
#include "muster_errors.h"
#include "state.h"
#include "util.h"

#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

extern char **environ;

#define KILL_LATER_MS 2000

/* ---- the backend thread ---- */

/* Records worker j->id's cancellation; fills *out with the signal it needs
 * now (out->pid 0: none). */
static void job_cancel(const struct job *j, struct sigjob *out) {
  struct lproc *p;

  out->pid = 0;
  out->sig = SIGKILL;
  pthread_mutex_lock(&lb.mu);
  p = lp_find(j->id);
  if (p && p->pid > 0) {
    out->pid = p->pid;
    out->start = p->start;
    out->whose = lp_whose(p);
    switch (j->how) {
    case BACKEND_KILL_NOW:
      p->kill_at_ms = 0;
      break;
    case BACKEND_TERM_THEN_KILL:
      out->sig = SIGTERM;
      p->kill_at_ms = util_mono_ms() + (int64_t)(lb.cfg.stop_grace_s * 1000);
      if (p->kill_at_ms == 0)
        p->kill_at_ms = 1;
      break;
    case BACKEND_KILL_LATER:
      out->pid = 0; /* nothing now */
      p->kill_at_ms = util_mono_ms() + KILL_LATER_MS;
      break;
    }
    p->reported = 1; /* its end is the state machine's already */
  }
  if (p)
    lp_maybe_free(p);
  pthread_mutex_unlock(&lb.mu);
}

static int64_t next_kill_ms(void) {
  int64_t at = INT64_MAX;

  for (struct lproc *p = lb.head; p; p = p->next)
    if (p->kill_at_ms && p->kill_at_ms < at)
      at = p->kill_at_ms;
  return at;
}

/* Runs (and frees) a list of jobs in order: runs of starts go out as one
 * batch each, and the signals of its cancellations as one batch at the end. */
static void run_jobs(struct job *jobs) {
  struct sigjob *sigs = NULL;
  struct job *starts[64], *owned[64];
  int n = 0, cap = 0, ns = 0;

  while (jobs) {
    struct job *next = jobs->next;

    if (jobs->kind == JOB_START) {
      owned[ns] = jobs;
      starts[ns++] = jobs;
      if (ns == 64 || !next || next->kind != JOB_START) {
        local_start_batch(starts, ns);
        for (int i = 0; i < ns; i++) {
          explicit_bzero(owned[i]->token, sizeof(owned[i]->token));
          free(owned[i]);
        }
        ns = 0;
      }
      jobs = next;
      continue;
    }
    {
      struct sigjob sj;
      job_cancel(jobs, &sj);
      if (sj.pid > 0 && n == cap) {
        int c2 = cap ? 2 * cap : 64;
        struct sigjob *grown = realloc(sigs, (size_t)c2 * sizeof(*grown));
        if (grown) {
          sigs = grown;
          cap = c2;
        } else {
          local_signal_worker(sj.pid, sj.start, sj.whose, sj.sig); /* no room to batch it */
          sj.pid = 0;
        }
      }
      if (sj.pid > 0)
        sigs[n++] = sj;
    }
    free(jobs);
    jobs = next;
  }
  local_signal_workers(sigs, n);
  free(sigs);
}

static void *backend_main(void *arg) {
  (void)arg;
  pthread_mutex_lock(&lb.mu);
  while (!lb.stop) {
    struct job *jobs = lb.jobs;
    int64_t now, at;

    lb.jobs = lb.jobs_tail = NULL;
    pthread_mutex_unlock(&lb.mu);
    run_jobs(jobs);
    now = util_mono_ms();
    local_reap();
    local_kills_due(util_mono_ms(), 0);
    local_probe_adopted(now);
    local_sweep_cgroups(now);
    local_sample_usage(now);
    pthread_mutex_lock(&lb.mu);
    if (lb.room_freed) {
      struct backend_report r = {.event = BACKEND_ROOM};
      lb.room_freed = 0;
      pthread_mutex_unlock(&lb.mu);
      backend_report(&r);
      pthread_mutex_lock(&lb.mu);
    }
    if (lb.jobs || lb.stop)
      continue;
    /* Children are reaped within 50 ms; nothing else needs a tick. */
    at = util_mono_ms() + 50;
    if (next_kill_ms() < at)
      at = next_kill_ms();
    util_cond_wait_until(&lb.cv, &lb.mu, at);
  }
  pthread_mutex_unlock(&lb.mu);
  return NULL;
}

/* ---- the operations ---- */

static int local_init(const struct ctl_config *cfg, char *err, size_t errlen) {
  char why[600];
  size_t n = 0;

  char abs[PATH_MAX];

  lb.cfg = *cfg;
  /* absolute: the cgroups' tag comes from it, and workers hide it */
  if (realpath(cfg->state_dir, abs) && strlen(abs) < sizeof(lb.cfg.state_dir))
    memcpy(lb.cfg.state_dir, abs, strlen(abs) + 1);
  if (cg_setup(cfg->isolation, lb.cfg.state_dir, why, sizeof(why)) != 0) {
    snprintf(err, errlen, "--isolation cgroup: workers cannot be put in cgroups here: %s", why);
    return MUSTER_E_BACKEND;
  }
  if (cg_enabled())
    LOG(LOG_INFO, "isolation: each worker runs in a cgroup of its own (%s): memory, cpu, pids",
        cg_mode());
  else if (cfg->isolation != CG_OFF && cg_confined())
    LOG(LOG_WARN,
        "isolation: no cgroups, so workers run without limits (%s); their commands still get "
        "namespaces of their own, the state directory out of their sight",
        why);
  else if (cfg->isolation != CG_OFF)
    LOG(LOG_WARN,
        "isolation: none; workers run without limits (%s), and their commands can see the state "
        "directory (namespaces: %s)",
        why, cg_confine_why());
  for (char **e = environ; *e; e++)
    n++;
  lb.base_env = calloc(n + 2, sizeof(*lb.base_env));
  if (!lb.base_env) {
    snprintf(err, errlen, "out of memory");
    return MUSTER_E_NOMEM;
  }
  /* The controller's own muster/CML variables (its API token above all)
   * must not leak into workers; everything else is the worker's "image"
   * environment: PATH, HOME, LANG. The settings meant for workerd itself
   * pass through. */
  for (char **e = environ; *e; e++)
    if (env_to_worker(*e) && strncmp(*e, "MUSTER_HOST_DIR=", 16) != 0)
      lb.base_env[lb.base_env_len++] = *e;
  /* This controller's workerds beat together (hostbeat.c) in a directory
   * of its state directory, out of their commands' sight. */
  snprintf(lb.host_dir_env, sizeof(lb.host_dir_env), "MUSTER_HOST_DIR=%s/host", lb.cfg.state_dir);
  lb.base_env[lb.base_env_len++] = lb.host_dir_env;
  util_cond_init_monotonic(&lb.cv);
  lb.zygote_retry_ms = 0;
  lb.zygote_spent = 0;
  lb.stop = 0;
  if (pthread_create(&lb.thread, NULL, backend_main, NULL) != 0) {
    snprintf(err, errlen, "could not start the local backend's thread");
    return MUSTER_E_INTERNAL;
  }
  lb.running = 1;
  return 0;
}

static void local_shutdown(void) {
  if (lb.running) {
    pthread_mutex_lock(&lb.mu);
    lb.stop = 1;
    pthread_cond_signal(&lb.cv);
    pthread_mutex_unlock(&lb.mu);
    pthread_join(lb.thread, NULL);
    lb.running = 0;
  }
  /* Stopped workers still in their grace period are ended now: nobody would
   * be left to do it. */
  local_kills_due(0, 1);
  local_zygote_close();
  cg_teardown();
  pthread_mutex_lock(&lb.mu);
  while (lb.jobs) {
    struct job *j = lb.jobs;
    lb.jobs = j->next;
    free(j);
  }
  while (lb.head)
    lp_free(lb.head);
  memset(lb.ip_used, 0, sizeof(lb.ip_used));
  lb.cpu_used = lb.memory_used = 0;
  lb.gpu_used = 0;
  pthread_mutex_unlock(&lb.mu);
  free(lb.base_env);
  lb.base_env = NULL;
  lb.base_env_len = 0;
}

/* Queues j for the backend's thread (lb.mu held). */
static void job_push(struct job *j) {
  if (lb.jobs_tail)
    lb.jobs_tail->next = j;
  else
    lb.jobs = j;
  lb.jobs_tail = j;
}

static int local_submit(const struct backend_start *ws, int n, char *why, size_t whylen) {
  struct job **jobs = calloc((size_t)n, sizeof(*jobs));
  int ok = jobs != NULL;

  /* All or none: the jobs are made first, so that a failure leaves nothing
   * queued and the caller fails the whole batch with why. */
  for (int i = 0; ok && i < n; i++) {
    /* (tests: an allocation that fails) */
    jobs[i] = FAULT_FAILS("local_submit_nomem") ? NULL : calloc(1, sizeof(*jobs[i]));
    ok = jobs[i] != NULL;
  }
  if (!ok) {
    for (int i = 0; jobs && i < n; i++)
      free(jobs[i]);
    free(jobs);
    LOG(LOG_ERROR, "out of memory queueing the start of %d workers", n);
    snprintf(why, whylen, "out of memory in the controller queueing its start");
    return -1;
  }
  pthread_mutex_lock(&lb.mu);
  for (int i = 0; i < n; i++) {
    struct lproc *p = lp_find(ws[i].id);
    struct job *j = jobs[i];

    if (!p) { /* placed a moment ago, under the same state lock: never */
      free(j);
      continue;
    }
    p->attempt = ws[i].attempt;
    j->kind = JOB_START;
    snprintf(j->id, sizeof(j->id), "%s", ws[i].id);
    snprintf(j->token, sizeof(j->token), "%s", ws[i].token);
    snprintf(j->controller_url, sizeof(j->controller_url), "%s", ws[i].controller_url);
    snprintf(j->account, sizeof(j->account), "%s", ws[i].account ? ws[i].account : "");
    j->attempt = ws[i].attempt;
    j->where = *ws[i].where;
    job_push(j);
  }
  pthread_cond_signal(&lb.cv);
  pthread_mutex_unlock(&lb.mu);
  free(jobs);
  return 0;
}

static void local_cancel(const char *id, enum backend_cancel how) {
  struct job *j = calloc(1, sizeof(*j));

  pthread_mutex_lock(&lb.mu);
  if (!j) {
    /* No memory to queue it: at least nothing more will be started. */
    struct lproc *p = lp_find(id);
    if (p)
      p->kill_at_ms = 1;
  } else {
    j->kind = JOB_CANCEL;
    snprintf(j->id, sizeof(j->id), "%s", id);
    j->how = how;
    job_push(j);
  }
  pthread_cond_signal(&lb.cv);
  pthread_mutex_unlock(&lb.mu);
}

static int local_ref_from_register(long pid, unsigned long long start_time, char *ref, size_t len) {
  if (pid <= 1 || start_time == 0)
    return -1;
  snprintf(ref, len, "%ld:%llu", pid, start_time);
  return 0;
}

static const char *local_isolation(void) {
  return cg_enabled() ? "cgroup" : cg_confined() ? "namespaces" : "none";
}

const struct backend_ops backend_local_ops = {
    .name = "local",
    .init = local_init,
    .shutdown = local_shutdown,
    .could_ever_fit = local_could_ever_fit,
    .capacity = local_capacity,
    .place = local_place,
    .submit = local_submit,
    .cancel = local_cancel,
    .release = local_release,
    .reconcile = local_reconcile,
    .ref_from_register = local_ref_from_register,
    .usage = local_usage,
    .isolation = local_isolation,
};
