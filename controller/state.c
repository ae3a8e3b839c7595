/* state.c: see state.h. */
#include "state.h"

#include "backend.h"
#include "log.h"
#include "muster_errors.h"
#include "util.h"

#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

struct ctl g = {.lock = PTHREAD_MUTEX_INITIALIZER};

static const char *const status_names[WS_COUNT_] = {
    "scheduling", "starting", "running", "succeeded", "failed", "stopped"};

const char *ws_name(enum wstatus s) { return s < WS_COUNT_ ? status_names[s] : "?"; }

int ws_parse(const char *name, enum wstatus *out) {
  for (int i = 0; i < WS_COUNT_; i++)
    if (name && strcmp(name, status_names[i]) == 0) {
      *out = (enum wstatus)i;
      return 0;
    }
  return MUSTER_E_INVALID;
}

int ws_terminal(enum wstatus s) { return s >= WS_SUCCEEDED; }

int sm_legal(enum wstatus from, enum wstatus to) {
  switch (from) {
  case WS_SCHEDULING:
    return to == WS_STARTING || to == WS_FAILED || to == WS_STOPPED;
  case WS_STARTING:
    return to == WS_RUNNING || to == WS_FAILED || to == WS_STOPPED;
  case WS_RUNNING:
    return to == WS_SUCCEEDED || to == WS_FAILED || to == WS_STOPPED;
  case WS_SUCCEEDED:
  case WS_FAILED:
  case WS_STOPPED:
  case WS_COUNT_:
    return 0;
  }
  return 0;
}

void state_lock(void) {
  pthread_mutex_lock(&g.lock);
  g.lock_held = 1;
}

void state_unlock(void) {
  g.lock_held = 0;
  pthread_mutex_unlock(&g.lock);
}

void state_kick_locked(void) {
  ASSERT_LOCKED();
  g.schedule_needed = 1;
  pthread_cond_signal(&g.kick);
}

/* ---- the live-worker table ---- */

static unsigned hash_id(const char *id) {
  unsigned h = 2166136261u;

  for (; *id; id++)
    h = (h ^ (unsigned char)*id) * 16777619u;
  return h % (sizeof(g.hash) / sizeof(g.hash[0]));
}

struct lw *lw_find_locked(const char *id) {
  ASSERT_LOCKED();
  for (struct lw *w = g.hash[hash_id(id)]; w; w = w->hnext)
    if (strcmp(w->id, id) == 0)
      return w;
  return NULL;
}

static struct lw *lw_new_locked(const char *id, const char *token, const char *session,
                                double cpu, double memory, int ngpu) {
  struct lw *w = calloc(1, sizeof(*w));
  unsigned h;

  if (!w)
    return NULL;
  snprintf(w->id, sizeof(w->id), "%s", id);
  snprintf(w->token, sizeof(w->token), "%s", token);
  snprintf(w->session, sizeof(w->session), "%s", session);
  w->cpu = cpu;
  w->memory = memory;
  w->ngpu = ngpu;
  w->ip_slot = -1;
  w->status = WS_SCHEDULING;
  w->since_ms = util_mono_ms();
  w->last_hb_ms = w->since_ms;
  h = hash_id(id);
  w->hnext = g.hash[h];
  g.hash[h] = w;
  w->prev = g.tail;
  if (g.tail)
    g.tail->next = w;
  else
    g.head = w;
  g.tail = w;
  g.live_count++;
  return w;
}

int lw_add_locked(const char *id, const char *token, const char *session, double cpu,
                  double memory, int ngpu) {
  ASSERT_LOCKED();
  return lw_new_locked(id, token, session, cpu, memory, ngpu) ? 0 : MUSTER_E_NOMEM;
}

static void lw_remove_locked(struct lw *w) {
  struct lw **pp = &g.hash[hash_id(w->id)];

  while (*pp && *pp != w)
    pp = &(*pp)->hnext;
  if (*pp)
    *pp = w->hnext;
  if (w->prev)
    w->prev->next = w->next;
  else
    g.head = w->next;
  if (w->next)
    w->next->prev = w->prev;
  else
    g.tail = w->prev;
  g.live_count--;
  free(w);
}

/* ---- waiters and streams ---- */

void waiter_add_locked(struct waiter *wt) {
  ASSERT_LOCKED();
  wt->prev = NULL;
  wt->next = g.waiters;
  if (g.waiters)
    g.waiters->prev = wt;
  g.waiters = wt;
}

void waiter_remove_locked(struct waiter *wt) {
  ASSERT_LOCKED();
  if (wt->prev)
    wt->prev->next = wt->next;
  else if (g.waiters == wt)
    g.waiters = wt->next;
  if (wt->next)
    wt->next->prev = wt->prev;
  wt->next = wt->prev = NULL;
}

static void waiter_wake_locked(struct waiter *wt) {
  if (wt->ready)
    return;
  wt->ready = 1;
  MHD_resume_connection(wt->conn);
}

/* Counts worker id's move to status to in every waiting await. */
static void waiters_notify_locked(const char *id, enum wstatus to) {
  for (struct waiter *wt = g.waiters; wt; wt = wt->next) {
    int reached = ws_terminal(to) || (!wt->wait_for_completion && to == WS_RUNNING);

    if (wt->ready || !reached)
      continue;
    for (int i = 0; i < wt->n; i++)
      if (!wt->done[i] && strcmp(wt->ids[i], id) == 0) {
        wt->done[i] = 1;
        wt->pending--;
      }
    if (wt->pending == 0)
      waiter_wake_locked(wt);
  }
}

void stream_suspend_locked(struct stream *s) {
  ASSERT_LOCKED();
  if (s->suspended)
    return;
  s->suspended = 1;
  s->prev = NULL;
  s->next = g.streams;
  if (g.streams)
    g.streams->prev = s;
  g.streams = s;
  MHD_suspend_connection(s->conn);
}

static void stream_resume_locked(struct stream *s) {
  stream_remove_locked(s);
  MHD_resume_connection(s->conn);
}

void stream_remove_locked(struct stream *s) {
  ASSERT_LOCKED();
  if (!s->suspended)
    return;
  if (s->prev)
    s->prev->next = s->next;
  else
    g.streams = s->next;
  if (s->next)
    s->next->prev = s->prev;
  s->next = s->prev = NULL;
  s->suspended = 0;
}

static void streams_wake_locked(enum stream_kind kind, const char *id) {
  struct stream *s = g.streams, *next;

  for (; s; s = next) {
    next = s->next;
    if (s->kind == kind && (!id || strcmp(s->worker_id, id) == 0))
      stream_resume_locked(s);
  }
}

void streams_wake_logs_locked(const char *id) { streams_wake_locked(STREAM_LOG, id); }

void streams_wake_events_locked(void) { streams_wake_locked(STREAM_EVENTS, NULL); }

/* ---- the state machine ---- */

int sm_begin(void) {
  ASSERT_LOCKED();
  assert(g.npending == 0);
  return db_begin(g.db);
}

int sm_transition(struct lw *w, enum wstatus to, const struct db_fields *f,
                  const char *detail) {
  struct db_fields none = DB_FIELDS_INIT;
  int rc;

  ASSERT_LOCKED();
  if (!sm_legal(w->status, to))
    return MUSTER_E_CONFLICT;
  if (g.npending == g.cap_pending) {
    int cap = g.cap_pending ? 2 * g.cap_pending : 64;
    struct pending *p = realloc(g.pending, (size_t)cap * sizeof(*p));
    if (!p)
      return MUSTER_E_NOMEM;
    g.pending = p;
    g.cap_pending = cap;
  }
  rc = db_worker_transition(g.db, w->id, ws_name(w->status), ws_name(to), f ? f : &none,
                            detail);
  if (rc)
    return rc;
  /* Remember the old status: a rollback puts it back. */
  g.pending[g.npending].w = w;
  g.pending[g.npending].to = w->status;
  g.npending++;
  w->status = to;
  w->since_ms = util_mono_ms();
  return 0;
}

void sm_rollback(void) {
  ASSERT_LOCKED();
  db_rollback(g.db);
  for (int i = g.npending - 1; i >= 0; i--)
    g.pending[i].w->status = g.pending[i].to;
  g.npending = 0;
}

int sm_commit(void) {
  int rc, n;

  ASSERT_LOCKED();
  rc = db_commit(g.db);
  if (rc) {
    LOG(LOG_ERROR, "commit failed: %s", db_errmsg(g.db));
    sm_rollback();
    return rc;
  }
  n = g.npending;
  g.npending = 0;
  g.transitions += (uint64_t)n;
  /* The changes are durable: now let everyone see them. */
  for (int i = 0; i < n; i++) {
    struct lw *w = g.pending[i].w;

    waiters_notify_locked(w->id, w->status);
    if (ws_terminal(w->status)) {
      streams_wake_locked(STREAM_LOG, w->id);
      backend_release_locked(w);
      g.schedule_needed = 1;
    }
  }
  /* Terminal workers leave the live table only after every notification,
   * since a worker may appear more than once in the pending list. */
  for (int i = 0; i < n; i++) {
    struct lw *w = g.pending[i].w;
    if (w && ws_terminal(w->status)) {
      for (int k = i + 1; k < n; k++)
        if (g.pending[k].w == w)
          g.pending[k].w = NULL;
      lw_remove_locked(w);
    }
  }
  if (n)
    streams_wake_locked(STREAM_EVENTS, NULL);
  if (g.schedule_needed)
    pthread_cond_signal(&g.kick);
  return 0;
}

static void kill_later_locked(pid_t pgid, int64_t at_ms) {
  if (g.nkills == g.cap_kills) {
    int cap = g.cap_kills ? 2 * g.cap_kills : 32;
    struct kill_later *k = realloc(g.kills, (size_t)cap * sizeof(*k));
    if (!k) {
      backend_signal(pgid, SIGKILL); /* no memory to wait: kill now */
      return;
    }
    g.kills = k;
    g.cap_kills = cap;
  }
  g.kills[g.nkills].pgid = pgid;
  g.kills[g.nkills].at_ms = at_ms;
  g.nkills++;
}

int sm_finish_locked(struct lw *w, enum wstatus to, struct db_fields *f, const char *detail,
                     enum finish_kill how) {
  struct db_fields none = DB_FIELDS_INIT;
  pid_t pgid = w->pid;
  int rc;

  ASSERT_LOCKED();
  if (!f)
    f = &none;
  f->set_finished_at = 1;
  rc = sm_begin();
  if (rc)
    return rc;
  rc = sm_transition(w, to, f, detail ? detail : f->failure);
  if (rc) {
    sm_rollback();
    return rc;
  }
  rc = sm_commit();
  if (rc)
    return rc;
  /* w is freed now; its process group is still to be ended. */
  if (pgid > 0) {
    int64_t now = util_mono_ms();
    switch (how) {
    case FINISH_KILL_NOW:
      backend_signal(pgid, SIGKILL);
      break;
    case FINISH_TERM_THEN_KILL:
      backend_signal(pgid, SIGTERM);
      kill_later_locked(pgid, now + (int64_t)(g.cfg.stop_grace_s * 1000));
      break;
    case FINISH_KILL_LATER:
      kill_later_locked(pgid, now + 2000);
      break;
    }
  }
  return 0;
}

int sm_fail_locked(struct lw *w, const char *why) {
  struct db_fields f = DB_FIELDS_INIT;

  f.failure = why;
  return sm_finish_locked(w, WS_FAILED, &f, NULL, FINISH_KILL_NOW);
}

/* ---- start-up ---- */

static int mkdir_p(const char *path, mode_t mode) {
  if (mkdir(path, mode) == 0 || errno == EEXIST)
    return 0;
  return -errno;
}

static int read_or_create_token(char *err, size_t errlen) {
  char path[600];
  FILE *f;
  int fd;

  snprintf(path, sizeof(path), "%s/token", g.cfg.state_dir);
  f = fopen(path, "r");
  if (f) {
    int ok = fgets(g.api_token, sizeof(g.api_token), f) != NULL;
    fclose(f);
    g.api_token[strcspn(g.api_token, "\r\n")] = '\0';
    if (!ok || strlen(g.api_token) < 16) {
      snprintf(err, errlen, "%s is empty or too short; delete it to get a new token", path);
      return MUSTER_E_IO;
    }
    return 0;
  }
  if (util_random_hex(g.api_token, 24) != 0) {
    snprintf(err, errlen, "could not get random bytes for the API token");
    return MUSTER_E_IO;
  }
  fd = open(path, O_WRONLY | O_CREAT | O_EXCL, 0600);
  if (fd < 0 || write(fd, g.api_token, strlen(g.api_token)) < 0 || write(fd, "\n", 1) < 0) {
    snprintf(err, errlen, "could not write %s: %s", path, strerror(errno));
    if (fd >= 0)
      close(fd);
    return MUSTER_E_IO;
  }
  close(fd);
  /* Printed once (main prints it with the sign-in link once the address is
   * known), like Jupyter's; the log never shows it. */
  g.token_new = 1;
  return 0;
}

/* Re-creates the live table from the rows an earlier controller left. */
static void restore_one(void *arg, const struct db_worker_info *info) {
  struct lw *w;
  enum wstatus st;

  (void)arg;
  if (ws_parse(info->status, &st) != 0)
    return;
  w = lw_new_locked(info->id, info->token, info->session, info->cpu, info->memory,
                    info->nvidia_gpu);
  if (!w)
    return;
  w->status = st;
  if (st != WS_SCHEDULING) {
    w->pid = info->pid > 0 ? (pid_t)info->pid : 0;
    w->adopted = 1;
    backend_adopt_locked(w, info->bind_ip, info->gpu_indices);
  }
}

static void restore_live_locked(void) {
  struct lw *w, *next;
  int adopted = 0, lost = 0, waiting = 0;

  if (db_live_workers(g.db, restore_one, NULL) != 0)
    LOG(LOG_ERROR, "could not read live workers: %s", db_errmsg(g.db));
  for (w = g.head; w; w = next) {
    next = w->next;
    if (w->status == WS_SCHEDULING) {
      waiting++;
    } else if (w->pid > 0 && backend_alive(w->pid)) {
      adopted++;
    } else {
      char why[160];
      snprintf(why, sizeof(why),
               "lost: its muster-workerd (pid %d) was gone when the controller restarted",
               (int)w->pid);
      if (sm_fail_locked(w, why) != 0)
        LOG(LOG_ERROR, "could not mark a lost worker failed: %s", db_errmsg(g.db));
      lost++;
    }
  }
  if (adopted || lost || waiting)
    LOG(LOG_INFO, "restart: %d live workers re-attached, %d lost, %d waiting to be scheduled",
        adopted, lost, waiting);
}

int state_init(const struct ctl_config *cfg, char *err, size_t errlen) {
  char path[600];
  pthread_condattr_t ca;
  const char *host;
  int rc;

  g.cfg = *cfg;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_cond_init(&g.kick, &ca);
  pthread_condattr_destroy(&ca);

  rc = mkdir_p(g.cfg.state_dir, 0700);
  snprintf(path, sizeof(path), "%s/workers", g.cfg.state_dir);
  if (!rc)
    rc = mkdir_p(path, 0700);
  snprintf(path, sizeof(path), "%s/logs", g.cfg.state_dir);
  if (!rc)
    rc = mkdir_p(path, 0700);
  if (rc) {
    snprintf(err, errlen, "could not create the state directory %s: %s", g.cfg.state_dir,
             strerror(-rc));
    return MUSTER_E_IO;
  }
  rc = read_or_create_token(err, errlen);
  if (rc)
    return rc;
  snprintf(path, sizeof(path), "%s/muster.db", g.cfg.state_dir);
  rc = db_open(path, &g.db, err, errlen);
  if (rc)
    return rc;
  rc = backend_init();
  if (rc) {
    snprintf(err, errlen, "could not set up the local backend");
    return rc;
  }
  host = g.cfg.listen_host;
  if (strcmp(host, "0.0.0.0") == 0 || strcmp(host, "*") == 0 || host[0] == '\0')
    host = "127.0.0.1";
  snprintf(g.controller_url, sizeof(g.controller_url), "http://%s:%d", host, g.cfg.port);

  state_lock();
  restore_live_locked();
  g.schedule_needed = 1;
  state_unlock();
  return 0;
}

/* ---- the monitor thread ---- */

/* Reaps exited workerd children and fails the workers they leave behind. */
static void reap_children_locked(void) {
  int st;
  pid_t pid;

  while ((pid = waitpid(-1, &st, WNOHANG)) > 0) {
    char why[200];

    if (backend_reaped_locked(pid))
      continue;
    for (struct lw *w = g.head; w; w = w->next) {
      if (w->pid != pid)
        continue;
      if (WIFSIGNALED(st))
        snprintf(why, sizeof(why), "muster-workerd (pid %d) was killed by signal %d (%s)",
                 (int)pid, WTERMSIG(st), strsignal(WTERMSIG(st)));
      else
        snprintf(why, sizeof(why),
                 "muster-workerd (pid %d) exited with code %d before reporting the "
                 "worker's end",
                 (int)pid, WEXITSTATUS(st));
      if (sm_fail_locked(w, why) != 0)
        LOG(LOG_ERROR, "could not record the end of %s", w->id);
      break;
    }
  }
}

/* Fails workers that never registered, that stopped heartbeating, or (for
 * workers adopted after a restart, which are not our children) whose
 * workerd vanished. */
static void check_timeouts_locked(int64_t now) {
  static int64_t last_probe_ms;
  /* Adopted workers are probed through /proc once a second, not on every
   * tick: heartbeat loss catches them anyway, this only makes it sooner. */
  int probe = now - last_probe_ms >= 1000;
  struct lw *w, *next;
  int64_t start_ms = (int64_t)(g.cfg.start_timeout_s * 1000);
  int64_t hb_ms = (int64_t)(g.cfg.heartbeat_timeout_s * 1000);
  char why[200];

  for (w = g.head; w; w = next) {
    next = w->next;
    why[0] = '\0';
    if (w->status == WS_STARTING && now - w->since_ms > start_ms)
      snprintf(why, sizeof(why), "did not register within the start timeout of %g s",
               g.cfg.start_timeout_s);
    else if (w->status == WS_RUNNING && now - w->last_hb_ms > hb_ms)
      snprintf(why, sizeof(why), "lost: no heartbeat for %g s (the heartbeat timeout)",
               g.cfg.heartbeat_timeout_s);
    else if (probe && w->adopted && w->status != WS_SCHEDULING && !backend_alive(w->pid))
      snprintf(why, sizeof(why), "lost: its muster-workerd (pid %d) is gone", (int)w->pid);
    if (why[0] && sm_fail_locked(w, why) != 0)
      LOG(LOG_ERROR, "could not fail %s: %s", w->id, db_errmsg(g.db));
  }
  if (probe)
    last_probe_ms = now;
}

/* Admits scheduling workers, oldest first, while they fit; a worker too big
 * for what is free now does not hold back smaller ones behind it. Spawns
 * and their transitions are committed in batches. */
static void schedule_locked(void) {
  struct lw *w = g.head;

  g.schedule_needed = 0;
  while (w) {
    int in_batch = 0;

    if (sm_begin() != 0) {
      LOG(LOG_ERROR, "could not begin a transaction: %s", db_errmsg(g.db));
      return;
    }
    for (; w && in_batch < 64; w = w->next) {
      struct db_fields f = DB_FIELDS_INIT;
      char ip[48], gpus[256], err[300], ref[24], detail[128];

      if (w->status != WS_SCHEDULING || !backend_fits_locked(w->cpu, w->memory, w->ngpu))
        continue;
      if (backend_start_locked(w, ip, sizeof(ip), gpus, sizeof(gpus), err, sizeof(err)) != 0) {
        char why[400];
        snprintf(why, sizeof(why), "the backend refused it: %s", err);
        f.failure = why;
        f.set_finished_at = 1;
        if (sm_transition(w, WS_FAILED, &f, why) != 0)
          LOG(LOG_ERROR, "could not fail %s: %s", w->id, db_errmsg(g.db));
        in_batch++;
        continue;
      }
      snprintf(ref, sizeof(ref), "%d", (int)w->pid);
      snprintf(detail, sizeof(detail), "local backend: pid %d, address %s", (int)w->pid, ip);
      f.backend_ref = ref;
      f.bind_ip = ip;
      f.gpu_indices = gpus[0] ? gpus : NULL;
      if (sm_transition(w, WS_STARTING, &f, detail) != 0) {
        LOG(LOG_ERROR, "could not record the start of %s: %s", w->id, db_errmsg(g.db));
        backend_signal(w->pid, SIGKILL);
        backend_release_locked(w);
        w->pid = 0;
      }
      in_batch++;
    }
    if (sm_commit() != 0)
      return;
  }
}

static void run_kills_locked(int64_t now) {
  int k = 0;

  for (int i = 0; i < g.nkills; i++) {
    if (g.kills[i].at_ms <= now)
      backend_signal(g.kills[i].pgid, SIGKILL);
    else
      g.kills[k++] = g.kills[i];
  }
  g.nkills = k;
}

static void expire_waiters_locked(int64_t now) {
  for (struct waiter *wt = g.waiters; wt; wt = wt->next)
    if (!wt->ready && wt->deadline_ms && wt->deadline_ms <= now) {
      wt->timed_out = 1;
      waiter_wake_locked(wt);
    }
}

/* The earliest moment the monitor must look again, at most 100 ms away so
 * that reaping and timeouts stay prompt. */
static int64_t next_wakeup_locked(int64_t now) {
  int64_t at = now + 100;

  for (struct waiter *wt = g.waiters; wt; wt = wt->next)
    if (!wt->ready && wt->deadline_ms && wt->deadline_ms < at)
      at = wt->deadline_ms;
  return at;
}

static void *monitor_main(void *arg) {
  (void)arg;
  state_lock();
  while (!g.stopping_monitor) {
    int64_t now = util_mono_ms(), at;
    struct timespec ts;

    reap_children_locked();
    check_timeouts_locked(now);
    if (g.schedule_needed && !g.shutting_down)
      schedule_locked();
    expire_waiters_locked(now);
    run_kills_locked(now);
    if (now - g.last_keepalive_ms >= 15000) {
      g.last_keepalive_ms = now;
      for (struct stream *s = g.streams; s; s = s->next)
        s->keepalive_due = 1;
      streams_wake_locked(STREAM_EVENTS, NULL);
    }
    at = next_wakeup_locked(util_mono_ms());
    if (g.schedule_needed && !g.shutting_down)
      continue;
    ts.tv_sec = at / 1000;
    ts.tv_nsec = (at % 1000) * 1000000L;
    g.lock_held = 0;
    pthread_cond_timedwait(&g.kick, &g.lock, &ts);
    g.lock_held = 1;
  }
  state_unlock();
  return NULL;
}

int state_start_monitor(void) {
  g.last_keepalive_ms = util_mono_ms();
  return pthread_create(&g.monitor, NULL, monitor_main, NULL) == 0 ? 0 : MUSTER_E_INTERNAL;
}

void state_stop_monitor(void) {
  state_lock();
  /* Stopped workers still in their grace period are ended now: nobody
   * would be left to do it. */
  run_kills_locked(INT64_MAX);
  g.stopping_monitor = 1;
  pthread_cond_signal(&g.kick);
  state_unlock();
  pthread_join(g.monitor, NULL);
}

void state_begin_shutdown(void) {
  state_lock();
  g.shutting_down = 1;
  for (struct waiter *wt = g.waiters; wt; wt = wt->next)
    waiter_wake_locked(wt);
  streams_wake_locked(STREAM_EVENTS, NULL);
  streams_wake_locked(STREAM_LOG, NULL);
  state_unlock();
}

void state_cleanup(void) {
  struct lw *w = g.head, *next;

  /* Live workers keep running: a restarted controller re-attaches them. */
  for (; w; w = next) {
    next = w->next;
    free(w);
  }
  g.head = g.tail = NULL;
  memset(g.hash, 0, sizeof(g.hash));
  free(g.pending);
  free(g.kills);
  g.pending = NULL;
  g.kills = NULL;
  backend_cleanup();
  db_close(g.db);
  g.db = NULL;
}
