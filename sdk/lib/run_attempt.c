/* run_attempt.c: one attempt of a run: its workers launched as one gang,
 * awaited, their command run (run_allreduce.c, run_exec.c) under the
 * monitor's eye (run_monitor.c), and every one of them stopped. */
#include "internal.h"
#include "muster.h"
#include "run_internal.h"

#include <jansson.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

/* Launches the parameter servers (mode ps) and the workers as one launch,
 * so that a backend places them as one gang; splits them into run->ps and
 * run->workers. */
static int launch_cluster(muster_client *c, struct run *run, const char *session) {
  const muster_run_opts *o = run->o;
  muster_launch_opts lo[2];
  muster_worker_list all = {0};
  size_t ng = 0, nps = o->mode == MUSTER_RUN_PS ? (size_t)o->n_ps : 0;
  int rc;

  memset(&run->ps, 0, sizeof(run->ps));
  memset(&run->workers, 0, sizeof(run->workers));
  if (nps) {
    muster_launch_opts_init(&lo[ng]);
    lo[ng].n = (int)nps;
    lo[ng].cpu = o->ps_cpu > 0 ? o->ps_cpu : o->cpu;
    lo[ng].memory = o->ps_memory > 0 ? o->ps_memory : o->memory;
    lo[ng].role = lo[ng].name = "ps";
    lo[ng].session = session;
    lo[ng].run = run->run_id[0] ? run->run_id : NULL;
    lo[ng].cwd = o->cwd;
    lo[ng].path = o->path;
    ng++;
  }
  muster_launch_opts_init(&lo[ng]);
  lo[ng].n = o->n_workers;
  lo[ng].cpu = o->cpu;
  lo[ng].memory = o->memory;
  lo[ng].nvidia_gpu = o->nvidia_gpu;
  lo[ng].role = lo[ng].name = "worker";
  lo[ng].session = session;
  lo[ng].run = run->run_id[0] ? run->run_id : NULL;
  lo[ng].cwd = o->cwd;
  lo[ng].path = o->path;
  ng++;
  rc = muster_launch_groups(c, lo, ng, &all);
  if (rc)
    return rc;
  /* Group after group: the parameter servers first. */
  run->ps.items = calloc(nps + 1, sizeof(*run->ps.items));
  run->workers.items = calloc(all.count + 1, sizeof(*run->workers.items));
  if (!run->ps.items || !run->workers.items) {
    /* The workers run: they stay in one list, for the stop. */
    free(run->ps.items);
    free(run->workers.items);
    run->ps.items = NULL;
    run->workers = all;
    return MUSTER_E_NOMEM;
  }
  for (size_t i = 0; i < all.count; i++) {
    muster_worker_list *l = i < nps ? &run->ps : &run->workers;
    l->items[l->count++] = all.items[i];
  }
  free(all.items); /* the workers moved into the two lists */
  return 0;
}

/* What the workers of the attempt that are not running yet wait for, in
 * words, into buf: "worker 2 (w-...) waits for 1 core (0 free of 2)", one
 * clause per worker (the first four; then how many more), "" when none
 * waits. Terminal ones are left out: they are failures, not waits. */
static void waiting_words(const struct run *run, const muster_worker_list *pending, char *buf,
                          size_t len) {
  size_t used = 0, named = 0, more = 0;

  buf[0] = '\0';
  for (size_t k = 0; k < pending->count; k++) {
    const muster_worker *w = &pending->items[k];
    const char *role = "worker";
    char why[200];
    long index = -1;
    if (muster_status_terminal(w->status))
      continue;
    if (named == 4) {
      more++;
      continue;
    }
    for (size_t i = 0; i < run->ps.count; i++)
      if (strcmp(run->ps.items[i].id, w->id) == 0) {
        role = "ps";
        index = (long)i;
      }
    for (size_t i = 0; index < 0 && i < run->workers.count; i++)
      if (strcmp(run->workers.items[i].id, w->id) == 0)
        index = (long)i;
    if (!muster_worker_waiting_for(w, why, sizeof(why)))
      snprintf(why, sizeof(why), "%s", w->status == MUSTER_STARTING ? "its start" : "room");
    if (used < len)
      used += (size_t)snprintf(buf + used, len - used, "%s%s %ld (%s) waits for %s",
                               named ? "; " : "", role, index, w->id, why);
    named++;
  }
  if (more && used < len)
    snprintf(buf + used, len - used, "; and %zu more", more);
}

/* The reasons the scheduling workers of pending wait for, without the
 * amounts that come and go ("1 core" of "1 core (0.5 free of 2)"), each
 * once, into buf: what on_waiting is told again only when it changes.
 * Workers only starting wait for nothing a user can change. */
static void waiting_key(const muster_worker_list *pending, char *buf, size_t len) {
  size_t used = 0;

  buf[0] = '\0';
  for (size_t k = 0; k < pending->count && used < len; k++) {
    char why[200], needle[204], *paren;
    if (pending->items[k].status != MUSTER_SCHEDULING ||
        !muster_worker_waiting_for(&pending->items[k], why, sizeof(why)))
      continue;
    paren = strstr(why, " (");
    if (paren)
      *paren = '\0';
    snprintf(needle, sizeof(needle), "|%s|", why);
    if (strstr(buf, needle))
      continue;
    used += (size_t)snprintf(buf + used, len - used, "%s%s|", used ? "" : "|", why);
  }
}

/* Awaits every worker of the attempt running (or one of them ended), up to
 * o->timeout_seconds (0: no limit), into *ar. It waits a second at a time,
 * so that it can tell o->on_waiting what the workers wait for: not in the
 * first 2 s (a start that is only slow says nothing), then once, and again
 * whenever the reasons change (not their counts or free amounts); the
 * words of the last wait go to waiting (len bytes). Returns 0 or the
 * controller's error. */
static int await_start(muster_client *c, struct run *run, const char *const *ids, size_t n,
                       muster_await_result *ar, char *waiting, size_t len) {
  const muster_run_opts *o = run->o;
  double t0 = now_s(), deadline = o->timeout_seconds > 0 ? t0 + o->timeout_seconds : 0;
  char told[1024] = "";
  int rc;

  waiting[0] = '\0';
  for (;;) {
    double slice = 1.0, left = deadline ? deadline - now_s() : slice;
    char words[1024];
    int ended = 0;
    if (left < slice)
      slice = left > 0.01 ? left : 0.01;
    muster_await_result_free(ar);
    rc = muster_await(c, ids, n, 0, slice, ar);
    if (rc || !ar->timed_out)
      return rc;
    for (size_t k = 0; k < ar->failures.count; k++)
      ended |= muster_status_terminal(ar->failures.items[k].status);
    waiting_words(run, &ar->failures, words, sizeof(words));
    snprintf(waiting, len, "%s", words);
    if (o->on_waiting && now_s() - t0 >= 2.0) {
      char key[sizeof(told)];
      waiting_key(&ar->failures, key, sizeof(key));
      if (key[0] && strcmp(key, told) != 0) {
        snprintf(told, sizeof(told), "%s", key);
        o->on_waiting(o->arg, words);
      }
    }
    /* One ended: no need to wait for the rest. */
    if (ended || (deadline && now_s() >= deadline))
      return 0;
  }
}

/* One attempt of the run: launches, awaits, runs the command, stops every
 * worker. Returns 0 when it got as far as running (r->failure says whether
 * the command failed), or the controller's error. */
int muster_run_attempt_(muster_client *c, const muster_run_opts *o, muster_run_result *r,
                        const char *session, const char *const *argv, size_t argc, int attempt,
                        int *final) {
  struct run run;
  struct monitor mon;
  struct stall_watch stall;
  pthread_t mon_thread;
  int mon_started = 0, rc;
  char master[64], waiting[1024];
  const char **ids = NULL;
  muster_await_result ar;
  json_t *cluster = NULL, *ps = json_array(), *wk = json_array();
  double t0 = now_s();

  memset(&run, 0, sizeof(run));
  memset(&ar, 0, sizeof(ar));
  memset(&mon, 0, sizeof(mon));
  memset(&stall, 0, sizeof(stall));
  *final = 0;
  r->exit_code = 1;
  r->failure[0] = r->failed_worker[0] = '\0';
  free(r->summary);
  r->summary = NULL;
  run.o = o;
  run.r = r;
  run.argv = argv;
  run.argc = argc;
  run.attempt = attempt;
  run.run_id = r->run_id;
  pthread_mutex_init(&run.lock, NULL);
  {
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&run.failed, &ca);
    pthread_condattr_destroy(&ca);
  }
  rc = launch_cluster(c, &run, session);
  if (rc && run.workers.count)
    goto stop; /* launched, then out of memory: they go again */
  if (rc)
    goto out;

  /* Await every one running; fail fast with the failures. */
  ids = calloc(run.ps.count + run.workers.count + 1, sizeof(*ids));
  if (!ids) {
    rc = MUSTER_E_NOMEM;
    goto stop;
  }
  for (size_t i = 0; i < run.ps.count; i++)
    ids[i] = run.ps.items[i].id;
  for (size_t i = 0; i < run.workers.count; i++)
    ids[run.ps.count + i] = run.workers.items[i].id;
  rc = await_start(c, &run, ids, run.ps.count + run.workers.count, &ar, waiting, sizeof(waiting));
  if (rc)
    goto stop;
  if (ar.failures.count) {
    const muster_worker *f = &ar.failures.items[0];
    /* Stopped while it started: someone ended the run. */
    for (size_t k = 0; k < ar.failures.count; k++)
      if (ar.failures.items[k].status == MUSTER_STOPPED)
        run.final = 1;
    /* An ended one is the cause; else the timeout, and what they waited for. */
    for (size_t k = 0; k < ar.failures.count; k++)
      if (muster_status_terminal(ar.failures.items[k].status)) {
        f = &ar.failures.items[k];
        break;
      }
    if (!muster_status_terminal(f->status))
      muster_run_fail_(&run, f->id, "did not start in %g s: %s", o->timeout_seconds,
                       waiting[0] ? waiting : "still not running when the timeout passed");
    else
      muster_run_fail_(&run, f->id, "%s %s did not start: %s", f->role ? f->role : "worker", f->id,
                       f->failure ? f->failure : muster_status_name(f->status));
    goto stop;
  }
  /* The running workers, with their addresses, in launch order. */
  for (size_t k = 0; k < ar.workers.count; k++) {
    muster_worker *w = &ar.workers.items[k];
    muster_worker_list *l = w->role && strcmp(w->role, "ps") == 0 ? &run.ps : &run.workers;
    for (size_t i = 0; i < l->count; i++)
      if (strcmp(l->items[i].id, w->id) == 0) {
        muster_worker tmp = l->items[i];
        l->items[i] = *w;
        *w = tmp;
      }
  }
  r->start_s = now_s() - t0;
  if (muster_session_exec_token(c, session, run.exec_token, sizeof(run.exec_token)) != 0) {
    muster_run_fail_(&run, NULL, "could not get the session's exec token: %s",
                     muster_client_errmsg(c));
    goto stop;
  }
  for (size_t i = 0; i < run.ps.count; i++)
    json_array_append_new(ps, json_sprintf("%s:%d", run.ps.items[i].ip_address, o->port));
  for (size_t i = 0; i < run.workers.count; i++)
    json_array_append_new(wk, json_sprintf("%s:%d", run.workers.items[i].ip_address, o->port));
  cluster = json_pack("{s:O, s:O}", "ps", ps, "worker", wk);
  snprintf(master, sizeof(master), "%s", run.workers.items[0].ip_address);

  /* Watch for failures while the command runs. */
  mon.run = &run;
  mon.since = 0;
  if (muster_client_new(muster_client_url(c), muster_client_token_(c), &mon.c) == 0) {
    muster_worker_list none;
    if (muster_list(mon.c, 1u << MUSTER_FAILED, session, NULL, &none, &mon.since) == 0)
      muster_worker_list_free(&none);
    mon_started = pthread_create(&mon_thread, NULL, muster_run_monitor_main_, &mon) == 0;
  }
  /* And for a stall: no rank making progress (run_stall.c). */
  if (muster_run_stall_start_(&stall, &run, c) != 0) {
    muster_run_fail_(&run, NULL, "out of memory for the stall watchdog");
    goto stop;
  }

  t0 = now_s();
  if (o->mode == MUSTER_RUN_ALLREDUCE)
    muster_run_allreduce_(&run, master);
  else
    muster_run_exec_all_(&run, master, cluster);
  r->run_s = now_s() - t0;
  /* The command is over: nothing may fail it from here (a stall report
   * under way records nothing: muster_run_fail_live_()), and the watchdog
   * is gone before its outcome is read. */
  pthread_mutex_lock(&run.lock);
  run.cancel = 1;
  pthread_mutex_unlock(&run.lock);
  muster_run_stall_stop_(&stall);
  pthread_mutex_lock(&run.lock);
  if (!r->failure[0])
    r->exit_code = 0;
  pthread_mutex_unlock(&run.lock);

stop:
  run.cancel = 1;
  muster_run_stall_stop_(&stall);
  if (mon_started) {
    muster_client_cancel(mon.c);
    pthread_join(mon_thread, NULL);
  }
  muster_client_free(mon.c);
  /* Every worker of the run goes, whatever happened; only those: the
   * session may hold the user's other workers. */
  if (run.ps.count || run.workers.count) {
    size_t n = run.ps.count + run.workers.count;
    const char **mine = calloc(n, sizeof(*mine));
    muster_worker_list stopped;
    if (mine) {
      for (size_t i = 0; i < run.ps.count; i++)
        mine[i] = run.ps.items[i].id;
      for (size_t i = 0; i < run.workers.count; i++)
        mine[run.ps.count + i] = run.workers.items[i].id;
      /* Before a restart: stopped from outside meanwhile (the monitor may
       * have ended before its event came, or a failure of the command came
       * first)? */
      if (!run.final && r->failure[0] && attempt < o->max_restarts &&
          muster_list(c, 1u << MUSTER_STOPPED, session, NULL, &stopped, NULL) == 0) {
        for (size_t k = 0; k < stopped.count; k++)
          for (size_t i = 0; i < n; i++)
            if (strcmp(stopped.items[k].id, mine[i]) == 0)
              run.final = 1;
        muster_worker_list_free(&stopped);
      }
      if (muster_stop(c, mine, n, NULL, &stopped) == 0)
        muster_worker_list_free(&stopped);
      else
        run.final = 2; /* still running: a new attempt could run beside them */
      free(mine);
    } else {
      run.final = 2;
    }
  }
  *final = run.final;
  r->summary = run.last_line;
  run.last_line = NULL;
  if (rc == 0 || r->failure[0])
    rc = 0;
out:
  muster_await_result_free(&ar);
  muster_worker_list_free(&run.ps);
  muster_worker_list_free(&run.workers);
  free(ids);
  free(run.last_line);
  json_decref(cluster);
  json_decref(ps);
  json_decref(wk);
  pthread_cond_destroy(&run.failed);
  pthread_mutex_destroy(&run.lock);
  return rc;
}
