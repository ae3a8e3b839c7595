/* state.c: see state.h. */
#include "state.h"

#include "backend.h"
#include "fault.h"
#include "lease.h"
#include "log.h"
#include "muster_errors.h"
#include "util.h"

#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

struct ctl g = {.lock = PTHREAD_ERRORCHECK_MUTEX_INITIALIZER_NP};

static const char *const status_names[WS_COUNT_] = {
#define MUSTER_X_STATUS(sym, name, terminal) name,
    MUSTER_STATUSES(MUSTER_X_STATUS)
#undef MUSTER_X_STATUS
};

static const unsigned char status_terminal[WS_COUNT_] = {
#define MUSTER_X_STATUS(sym, name, terminal) terminal,
    MUSTER_STATUSES(MUSTER_X_STATUS)
#undef MUSTER_X_STATUS
};

const char *ws_name(enum wstatus s) {
  return s < WS_COUNT_ ? status_names[s] : "?";
}

int ws_parse(const char *name, enum wstatus *out) {
  for (int i = 0; i < WS_COUNT_; i++)
    if (name && strcmp(name, status_names[i]) == 0) {
      *out = (enum wstatus)i;
      return 0;
    }
  return MUSTER_E_INVALID;
}

int ws_terminal(enum wstatus s) {
  return s < WS_COUNT_ && status_terminal[s];
}

int sm_legal(enum wstatus from, enum wstatus to) {
  switch (from) {
  case WS_SCHEDULING:
    /* scheduling -> scheduling: an attempt handed to a backend with a queue
     * of its own, where it waits until that backend starts it. */
    return to == WS_SCHEDULING || to == WS_STARTING || to == WS_FAILED || to == WS_STOPPED;
  case WS_STARTING:
    /* starting -> starting: a new attempt, when a restarted controller
     * finds the recorded one not running (it never registered). */
    return to == WS_STARTING || to == WS_RUNNING || to == WS_FAILED || to == WS_STOPPED;
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
  int rc = pthread_mutex_lock(&g.lock);

  if (rc) {
    /* EDEADLK: this thread holds it already. Say so and stop, rather than
     * hang every thread of the controller. */
    LOG(LOG_ERROR, "internal error: the state lock could not be taken: %s", strerror(rc));
    abort();
  }
  g.lock_owner = pthread_self();
  g.lock_held = 1;
}

void state_unlock(void) {
  int rc;

  g.lock_held = 0;
  rc = pthread_mutex_unlock(&g.lock);
  if (rc) {
    LOG(LOG_ERROR,
        "internal error: the state lock was released by a thread that did not "
        "hold it: %s",
        strerror(rc));
    abort();
  }
}

void state_assert_locked(const char *func) {
  if (!g.lock_held || !pthread_equal(g.lock_owner, pthread_self())) {
    LOG(LOG_ERROR, "internal error: %s needs the state lock and was called without it", func);
    abort();
  }
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
                                const char *launch, const struct backend_req *req) {
  struct lw *w = calloc(1, sizeof(*w));
  unsigned h;

  if (!w)
    return NULL;
  snprintf(w->id, sizeof(w->id), "%s", id);
  snprintf(w->token, sizeof(w->token), "%s", token);
  snprintf(w->session, sizeof(w->session), "%s", session);
  snprintf(w->launch, sizeof(w->launch), "%s", launch ? launch : "");
  w->req = *req;
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

int lw_add_locked(const char *id, const char *token, const char *session, const char *launch,
                  const struct backend_req *req) {
  ASSERT_LOCKED();
  return lw_new_locked(id, token, session, launch, req) ? 0 : MUSTER_E_NOMEM;
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
  memset(w->token, 0, sizeof(w->token));
  free(w->outside_why);
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

void stream_add_locked(struct stream *s) {
  ASSERT_LOCKED();
  s->prev = NULL;
  s->next = g.streams;
  if (g.streams)
    g.streams->prev = s;
  g.streams = s;
  s->listed = 1;
}

void stream_remove_locked(struct stream *s) {
  ASSERT_LOCKED();
  if (!s->listed)
    return;
  if (s->prev)
    s->prev->next = s->next;
  else
    g.streams = s->next;
  if (s->next)
    s->next->prev = s->prev;
  s->next = s->prev = NULL;
  s->listed = 0;
}

int stream_wait_locked(struct stream *s) {
  ASSERT_LOCKED();
  if (s->pending) {
    s->pending = 0;
    return 0;
  }
  s->suspended = 1;
  MHD_suspend_connection(s->conn);
  return 1;
}

static void stream_resume_locked(struct stream *s) {
  if (!s->suspended)
    return;
  s->suspended = 0;
  MHD_resume_connection(s->conn);
}

/* Wakes the streams of kind (of worker id, if given): a suspended one is
 * resumed; one that is busy reading is told to look again before it waits,
 * so that no wake is ever lost between its read and its wait. */
static void streams_wake_locked(enum stream_kind kind, const char *id) {
  for (struct stream *s = g.streams; s; s = s->next)
    if (s->kind == kind && (!id || strcmp(s->worker_id, id) == 0)) {
      if (s->suspended)
        stream_resume_locked(s);
      else
        s->pending = 1;
    }
}

void streams_wake_logs_locked(const char *id) {
  streams_wake_locked(STREAM_LOG, id);
}

void streams_wake_events_locked(void) {
  streams_wake_locked(STREAM_EVENTS, NULL);
}

/* ---- the state machine ---- */

int sm_begin(void) {
  ASSERT_LOCKED();
  assert(g.npending == 0);
  return db_begin(g.db);
}

int sm_transition(struct lw *w, enum wstatus to, const struct db_fields *f, const char *detail) {
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
  rc = db_worker_transition(g.db, w->id, ws_name(w->status), ws_name(to), f ? f : &none, detail);
  if (rc)
    return rc;
  /* Remember the old status: a rollback puts it back. */
  g.pending[g.npending].w = w;
  g.pending[g.npending].to = w->status;
  g.pending[g.npending].attempt = w->attempt;
  g.pending[g.npending].restart = w->restart;
  g.pending[g.npending].ref_known = w->ref_known;
  g.pending[g.npending].since_ms = w->since_ms;
  g.npending++;
  w->status = to;
  if (f && f->attempt >= 0) {
    w->attempt = f->attempt;
    w->restart = 0;
    w->ref_known = 0;
    w->ending = 0; /* about the last attempt's job */
  }
  w->since_ms = util_mono_ms();
  return 0;
}

void sm_rollback(void) {
  ASSERT_LOCKED();
  db_rollback(g.db);
  for (int i = g.npending - 1; i >= 0; i--) {
    struct lw *w = g.pending[i].w;
    w->status = g.pending[i].to;
    w->attempt = g.pending[i].attempt;
    w->restart = g.pending[i].restart;
    w->ref_known = g.pending[i].ref_known;
    w->since_ms = g.pending[i].since_ms;
  }
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
      g.backend->release(w->id);
      g.schedule_needed = 1;
    }
  }
  /* Terminal workers leave the live table only after every notification,
   * since a worker may appear more than once in the pending list; each is
   * removed once (marked, so that this stays linear in n). */
  for (int i = 0; i < n; i++) {
    struct lw *w = g.pending[i].w;
    if (!ws_terminal(w->status) || w->dropping)
      g.pending[i].w = NULL;
    else
      w->dropping = 1;
  }
  for (int i = 0; i < n; i++)
    if (g.pending[i].w)
      lw_remove_locked(g.pending[i].w);
  if (n)
    streams_wake_locked(STREAM_EVENTS, NULL);
  if (g.schedule_needed)
    pthread_cond_signal(&g.kick);
  return 0;
}

int sm_finish_locked(struct lw *w, enum wstatus to, struct db_fields *f, const char *detail,
                     enum backend_cancel how) {
  struct db_fields none = DB_FIELDS_INIT;
  char id[16];
  int rc, started = w->attempt > 0;

  ASSERT_LOCKED();
  if (!f)
    f = &none;
  f->set_finished_at = 1;
  snprintf(id, sizeof(id), "%s", w->id);
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
  /* w is freed now; its processes are still to be ended. */
  if (started)
    g.backend->cancel(id, how);
  return 0;
}

int sm_stop_many_locked(char (*ids)[16], int n, const char *detail, const char *failure) {
  return sm_stop_many_with_locked(ids, n, detail, failure, NULL, NULL);
}

int sm_stop_many_with_locked(char (*ids)[16], int n, const char *detail, const char *failure,
                             int (*also)(void *arg), void *arg) {
  char(*cancel)[16] = calloc((size_t)n + 1, sizeof(*cancel));
  int rc, ncancel = 0;

  ASSERT_LOCKED();
  if (!cancel) {
    rc = MUSTER_E_NOMEM;
    goto out;
  }
  rc = sm_begin();
  if (rc)
    goto out;
  for (int i = 0; i < n; i++) {
    struct db_fields f = DB_FIELDS_INIT;
    struct lw *w = lw_find_locked(ids[i]);

    /* Unknown, terminal, or named twice (stopped a moment ago, in memory). */
    if (!w || ws_terminal(w->status))
      continue;
    f.set_finished_at = 1;
    f.failure = failure;
    if (w->attempt > 0)
      snprintf(cancel[ncancel++], sizeof(cancel[0]), "%s", w->id);
    rc = sm_transition(w, WS_STOPPED, &f, detail);
    if (rc) {
      sm_rollback();
      goto out;
    }
  }
  if (also) {
    rc = also(arg);
    if (rc) {
      sm_rollback();
      goto out;
    }
  }
  rc = sm_commit();
  if (rc)
    goto out;
  for (int i = 0; i < ncancel; i++)
    g.backend->cancel(cancel[i], BACKEND_TERM_THEN_KILL);
out:
  free(cancel);
  return rc;
}

int sm_fail_locked(struct lw *w, const char *why) {
  struct db_fields f = DB_FIELDS_INIT;

  f.failure = why;
  /* Stopped from outside muster: the signal its workerd reported stays. */
  if (w->outside_signal > 0)
    f.signal = w->outside_signal;
  return sm_finish_locked(w, WS_FAILED, &f, NULL, BACKEND_KILL_NOW);
}

/* ---- start-up ---- */

static MUST_CHECK int mkdir_p(const char *path, mode_t mode) {
  if (mkdir(path, mode) == 0 || errno == EEXIST)
    return 0;
  return -errno;
}

/* Makes path's mode exactly mode (when it exists), saying so when it had
 * to: the state directory holds tokens and secret_env, whatever umask or
 * earlier hand created it. Returns 0 or -errno. */
static MUST_CHECK int tighten(const char *path, mode_t mode) {
  struct stat st;

  if (stat(path, &st) != 0)
    return errno == ENOENT ? 0 : -errno;
  if ((st.st_mode & 07777) == mode)
    return 0;
  if (chmod(path, mode) != 0)
    return -errno;
  LOG(LOG_INFO, "%s was mode %04o; made it %04o (it holds secrets)", path,
      (unsigned)(st.st_mode & 07777), (unsigned)mode);
  return 0;
}

static int secure_state_dir(char *err, size_t errlen) {
  static const char *const files[] = {"muster.db", "muster.db-wal", "muster.db-shm", "token"};
  char path[600];
  int rc = tighten(g.cfg.state_dir, 0700);

  for (size_t i = 0; !rc && i < sizeof(files) / sizeof(files[0]); i++) {
    snprintf(path, sizeof(path), "%s/%s", g.cfg.state_dir, files[i]);
    rc = tighten(path, 0600);
  }
  if (rc)
    snprintf(err, errlen, "could not make %s private (%s): it holds tokens and secrets",
             g.cfg.state_dir, strerror(-rc));
  return rc ? MUSTER_E_IO : 0;
}

static MUST_CHECK int read_or_create_token(char *err, size_t errlen) {
  char path[600];
  FILE *f;
  int fd;

  snprintf(path, sizeof(path), "%s/token", g.cfg.state_dir);
  f = fopen(path, "re");
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
  fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0 || write(fd, g.api_token, strlen(g.api_token)) < 0 || write(fd, "\n", 1) < 0) {
    snprintf(err, errlen, "could not write %s: %s", path, strerror(errno));
    if (fd >= 0)
      close(fd);
    return MUSTER_E_IO;
  }
  close(fd);
  /* Shown once, on a terminal only (see main.c); the log never shows it. */
  g.token_new = 1;
  return 0;
}

/* One controller per state directory: a second one would run the same
 * workers twice. The lock (flock on DIR/lock, which holds the owner's pid)
 * lasts as long as the process, however it ends. */
static int lock_state_dir(char *err, size_t errlen) {
  char path[600], pid[32];
  int fd;
  ssize_t n;

  snprintf(path, sizeof(path), "%s/lock", g.cfg.state_dir);
  fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (fd < 0) {
    snprintf(err, errlen, "could not open %s: %s", path, strerror(errno));
    return MUSTER_E_IO;
  }
  if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
    n = read(fd, pid, sizeof(pid) - 1);
    pid[n > 0 ? n : 0] = '\0';
    pid[strcspn(pid, "\n")] = '\0';
    snprintf(err, errlen, "another muster-controller (pid %s) uses the state directory %s",
             pid[0] ? pid : "?", g.cfg.state_dir);
    close(fd);
    return MUSTER_E_CONFLICT;
  }
  n = snprintf(pid, sizeof(pid), "%ld\n", (long)getpid());
  if (ftruncate(fd, 0) != 0 || write(fd, pid, (size_t)n) != n) {
    /* The lock holds all the same; only the pid in the message is lost. */
  }
  /* Kept open (and locked) for the life of the process. */
  return 0;
}

struct restore {
  struct backend_live *live;
  int n, cap;
};

/* Re-creates the live table from the rows an earlier controller left, and
 * lists the ones the backend may still run. */
static void restore_one(void *arg, const struct db_worker_info *info) {
  struct restore *r = arg;
  struct backend_req req = {info->cpu, info->memory, info->nvidia_gpu};
  struct backend_live *l;
  struct lw *w;
  enum wstatus st;

  if (ws_parse(info->status, &st) != 0)
    return;
  w = lw_new_locked(info->id, info->token, info->session, info->launch_id, &req);
  if (!w)
    return;
  w->status = st;
  w->attempt = info->attempt;
  w->reg_pid = st == WS_RUNNING && info->pid > 0 ? info->pid : 0;
  if (st == WS_SCHEDULING && !lw_submitted(w))
    return;
  if (r->n == r->cap) {
    int cap = r->cap ? 2 * r->cap : 64;
    struct backend_live *grown = realloc(r->live, (size_t)cap * sizeof(*grown));
    if (!grown) {
      /* No memory to reconcile it: it stays live, and its heartbeats (or
       * their absence) or the start timeout decide. */
      LOG(LOG_ERROR, "out of memory reconciling %s", w->id);
      return;
    }
    r->live = grown;
    r->cap = cap;
  }
  l = &r->live[r->n++];
  memset(l, 0, sizeof(*l));
  l->id = w->id;
  l->attempt = info->attempt;
  l->registered = st == WS_RUNNING;
  l->ref = info->backend_ref ? strdup(info->backend_ref) : NULL;
  l->req = req;
  snprintf(l->where.bind_ip, sizeof(l->where.bind_ip), "%s", info->bind_ip);
  snprintf(l->where.gpu_indices, sizeof(l->where.gpu_indices), "%s", info->gpu_indices);
}

/* Reconciles what the backend runs with what the database says, before
 * anything is started or served: the recorded attempts that still run are
 * adopted; a starting worker whose attempt does not run gets a new attempt
 * (no workerd of it registered, so its script never ran; the old one, should
 * it appear, is refused); a running one whose workerd is gone failed. */
static void restore_live_locked(void) {
  struct restore r = {NULL, 0, 0};
  int adopted = 0, lost = 0, restarted = 0, waiting = 0;

  if (db_live_workers(g.db, restore_one, &r) != 0)
    LOG(LOG_ERROR, "could not read live workers: %s", db_errmsg(g.db));
  g.backend->reconcile(r.live, r.n);
  for (int i = 0; i < r.n; i++) {
    struct lw *w = lw_find_locked(r.live[i].id);

    if (!w)
      continue;
    w->last_hb_ms = util_mono_ms();
    if (r.live[i].adopted) {
      w->ref_known = 1;
      adopted++;
    } else if (r.live[i].why[0]) {
      if (sm_fail_locked(w, r.live[i].why) != 0)
        LOG(LOG_ERROR, "could not mark %s failed: %s", w->id, db_errmsg(g.db));
      lost++;
    } else if (w->status == WS_STARTING || w->status == WS_SCHEDULING) {
      w->restart = 1;
      restarted++;
    } else {
      char why[200];
      snprintf(why, sizeof(why),
               "lost: its muster-workerd (%s) was gone when the controller restarted",
               r.live[i].ref ? r.live[i].ref : "never seen running");
      if (sm_fail_locked(w, why) != 0)
        LOG(LOG_ERROR, "could not mark a lost worker failed: %s", db_errmsg(g.db));
      lost++;
    }
  }
  for (struct lw *w = g.head; w; w = w->next)
    waiting += w->status == WS_SCHEDULING;
  for (int i = 0; i < r.n; i++)
    free((char *)r.live[i].ref);
  free(r.live);
  if (adopted || lost || waiting || restarted)
    LOG(LOG_INFO,
        "restart: %d live workers re-attached, %d lost, %d to start again (their start "
        "was not running), %d waiting to be scheduled",
        adopted, lost, restarted, waiting);
}

int state_init(const struct ctl_config *cfg, char *err, size_t errlen) {
  char path[600];
  const char *host;
  int rc;

  g.cfg = *cfg;
  g.backend = backend_find(cfg->backend);
  if (!g.backend) {
    snprintf(err, errlen, "there is no backend \"%s\" (this controller has: %s)", cfg->backend,
             backend_names());
    return MUSTER_E_INVALID;
  }
  util_cond_init_monotonic(&g.kick);

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
  rc = secure_state_dir(err, errlen);
  if (rc)
    return rc;
  rc = lock_state_dir(err, errlen);
  if (rc)
    return rc;
  rc = read_or_create_token(err, errlen);
  if (rc)
    return rc;
  snprintf(path, sizeof(path), "%s/muster.db", g.cfg.state_dir);
  rc = db_open(path, &g.db, err, errlen);
  if (rc)
    return rc;
  /* SQLite created the database and its WAL with the umask's mode. */
  rc = secure_state_dir(err, errlen);
  if (rc)
    return rc;
  host = g.cfg.listen_host;
  if (strcmp(host, "0.0.0.0") == 0 || strcmp(host, "*") == 0 || host[0] == '\0')
    host = "127.0.0.1";
  if (g.cfg.advertise_url[0])
    snprintf(g.controller_url, sizeof(g.controller_url), "%s", g.cfg.advertise_url);
  else
    snprintf(g.controller_url, sizeof(g.controller_url), "http://%s:%d", host, g.cfg.port);

  rc = g.backend->init(&g.cfg, err, errlen);
  if (rc)
    return rc;
  g.backend_started = 1;
  state_lock();
  restore_live_locked();
  leases_restore_locked();
  g.schedule_needed = 1;
  state_unlock();
  return 0;
}

/* ---- reports from the backend ---- */

const char *state_controller_url(void) {
  return g.controller_url;
}

int sm_start_submitted_locked(struct lw *w, const char *detail) {
  int rc;

  ASSERT_LOCKED();
  rc = sm_begin();
  if (!rc)
    rc = sm_transition(w, WS_STARTING, NULL, detail ? detail : "the backend started it");
  if (!rc) {
    w->waiting_for[0] = '\0';
    return sm_commit();
  }
  sm_rollback();
  return rc;
}

void backend_report(const struct backend_report *r) {
  struct lw *w;

  state_lock();
  if (r->event == BACKEND_ROOM) {
    state_kick_locked();
    state_unlock();
    return;
  }
  w = lw_find_locked(r->id);
  /* About an attempt that is no longer current, or a worker that already
   * ended: nothing to do. */
  if (!w || w->attempt != r->attempt || ws_terminal(w->status) ||
      (w->status == WS_SCHEDULING && !lw_submitted(w))) {
    state_unlock();
    return;
  }
  switch (r->event) {
  case BACKEND_WAITING:
    if (w->status == WS_STARTING)
      w->queued = 1;
    if (w->status == WS_SCHEDULING && r->detail && strcmp(r->detail, w->waiting_for) != 0) {
      snprintf(w->waiting_for, sizeof(w->waiting_for), "%s", r->detail);
      if (db_worker_set_waiting(g.db, w->id, w->waiting_for) != 0)
        LOG(LOG_WARN, "could not record why %s waits: %s", w->id, db_errmsg(g.db));
    }
    break;
  case BACKEND_ENDING:
    /* Its end is on the way: a stop from outside waits for it longer. */
    if (w->outside_why && !w->ending)
      w->outside_until_ms += OUTSIDE_ENDING_WAIT_MS - OUTSIDE_WAIT_MS;
    w->ending = 1;
    break;
  case BACKEND_STARTED:
    /* A queueing backend started it: it leaves the queue. */
    if (w->status == WS_SCHEDULING && sm_start_submitted_locked(w, r->detail) != 0) {
      LOG(LOG_ERROR, "could not record the start of %s: %s", w->id, db_errmsg(g.db));
      break;
    }
    if (w->queued) {
      /* Out of the queue: the start timeout counts from now. */
      w->queued = 0;
      w->since_ms = util_mono_ms();
    }
    if (db_worker_set_ref(g.db, w->id, w->attempt, r->ref) != 0)
      LOG(LOG_ERROR, "could not record how %s runs: %s", w->id, db_errmsg(g.db));
    else
      w->ref_known = 1;
    LOG(LOG_DEBUG, "%s attempt %d: %s", w->id, w->attempt, r->detail ? r->detail : "started");
    break;
  case BACKEND_REFUSED: {
    char why[400];
    snprintf(why, sizeof(why), "the backend refused it: %s", r->detail);
    if (sm_fail_locked(w, why) != 0)
      LOG(LOG_ERROR, "could not fail %s: %s", r->id, db_errmsg(g.db));
    break;
  }
  case BACKEND_ROOM:
    break;
  case BACKEND_EXITED:
  case BACKEND_LOST: {
    int rc = sm_fail_locked(w, r->detail);
    if (rc != 0)
      LOG(LOG_ERROR, "could not record the end of %s (%s): %s", r->id, muster_error_name(rc),
          rc == MUSTER_E_DB ? db_errmsg(g.db) : r->detail);
    break;
  }
  }
  state_unlock();
}

void backend_report_usage(const struct backend_usage *u, int n) {
  state_lock();
  for (int i = 0; i < n; i++) {
    struct lw *w = lw_find_locked(u[i].id);
    struct db_usage du = {u[i].cpu_seconds, u[i].memory_bytes, u[i].memory_peak_bytes};

    if (w && (w->attempt != u[i].attempt || ws_terminal(w->status)))
      continue; /* another attempt's */
    if (w && !u[i].final) {
      w->usage = du;
      w->usage_dirty = 1;
      continue;
    }
    /* A final sample (its worker ended, or is about to be failed for it)
     * is written at once: the worker may leave the table before a flush.
     * A worker no longer in the table ended: its row takes it. */
    if (!u[i].final)
      continue;
    if (w)
      w->usage_dirty = 0;
    if (db_worker_usage(g.db, u[i].id, &du) != 0)
      LOG(LOG_WARN, "could not record what %s used: %s", u[i].id, db_errmsg(g.db));
  }
  state_unlock();
}

/* ---- the monitor thread ---- */

void sm_heartbeat_locked(struct lw *w) {
  ASSERT_LOCKED();
  w->last_hb_ms = util_mono_ms();
  w->hb_dirty = 1;
}

/* Writes the heartbeats received (and the usage sampled) since the last
 * flush in one transaction:
 * at most one write a second, whatever the number of workers. Loss
 * detection reads last_hb_ms, never the database. */
static void flush_heartbeats_locked(int64_t now) {
  int rc, n = 0;

  if (now - g.last_hb_flush_ms < 1000)
    return;
  g.last_hb_flush_ms = now;
  for (struct lw *w = g.head; w; w = w->next)
    n += w->hb_dirty + w->usage_dirty;
  if (!n)
    return;
  rc = db_begin(g.db);
  for (struct lw *w = g.head; !rc && w; w = w->next) {
    if (w->hb_dirty)
      rc = db_worker_touch_heartbeat(g.db, w->id);
    if (!rc && w->usage_dirty)
      rc = db_worker_usage(g.db, w->id, &w->usage);
  }
  if (!rc)
    rc = db_commit(g.db);
  if (rc) {
    LOG(LOG_WARN, "could not record %d heartbeats and samples: %s", n, db_errmsg(g.db));
    db_rollback(g.db);
    return;
  }
  for (struct lw *w = g.head; w; w = w->next)
    w->hb_dirty = w->usage_dirty = 0;
}

/* Fails workers that never registered or that stopped heartbeating. */
static void check_timeouts_locked(int64_t now) {
  struct lw *w, *next;
  int64_t start_ms = (int64_t)(g.cfg.start_timeout_s * 1000);
  int64_t hb_ms = (int64_t)(g.cfg.heartbeat_timeout_s * 1000);
  char why[600];

  for (w = g.head; w; w = next) {
    next = w->next;
    why[0] = '\0';
    if (w->status == WS_STARTING && !w->queued && now - w->since_ms > start_ms)
      snprintf(why, sizeof(why),
               w->restart ? "could not be started again within the start timeout of %g s "
                            "after the controller restarted"
                          : "did not register within the start timeout of %g s",
               g.cfg.start_timeout_s);
    else if (w->outside_why && now >= w->outside_until_ms)
      snprintf(why, sizeof(why), "%s", w->outside_why);
    else if (w->status == WS_RUNNING && !w->outside_why && now - w->last_hb_ms > hb_ms)
      snprintf(why, sizeof(why), "lost: no heartbeat for %g s (the heartbeat timeout)",
               g.cfg.heartbeat_timeout_s);
    if (why[0] && sm_fail_locked(w, why) != 0)
      LOG(LOG_ERROR, "could not fail %s: %s", w->id, db_errmsg(g.db));
  }
}

/* Whether schedule_locked() has something to do for w. */
static int wants_start(const struct lw *w) {
  if (w->status == WS_STARTING)
    return w->restart;
  if (w->status != WS_SCHEDULING)
    return 0;
  return !lw_submitted(w) || w->restart;
}

/* Hands the backend every worker that waits for a start, oldest first,
 * while it has room: the backend reserves room (place), the new attempts
 * are committed with the `starting` state, and only then is the backend
 * asked to act (submit). A worker that does not fit now does not hold back
 * smaller ones behind it; why it waits is recorded.
 *
 * A queueing backend (Slurm) gets whole launches, however large, and its
 * workers stay `scheduling` with their new attempt committed: they leave
 * the queue when the backend reports them started. */
static void schedule_locked(void) {
  const int queues = g.backend->queues;
  /* Batches of 64 on the stack; a queueing backend's whole launches may be
   * larger: room for every live worker then. */
  struct backend_placement where_s[64];
  struct backend_start starts_s[64];
  struct lw *batch_s[64];
  struct backend_placement *where = where_s;
  struct backend_start *starts = starts_s;
  struct lw **batch = batch_s;
  struct lw *w = g.head;
  int cap = 64;

  g.schedule_needed = 0;
  if (queues) {
    cap = 1;
    for (struct lw *x = g.head; x; x = x->next)
      cap++;
    where = calloc((size_t)cap, sizeof(*where));
    starts = calloc((size_t)cap, sizeof(*starts));
    batch = calloc((size_t)cap, sizeof(*batch));
  }
  if (!where || !starts || !batch) {
    LOG(LOG_ERROR, "out of memory scheduling workers");
    g.schedule_needed = 1;
    goto out;
  }
  while (w) {
    const char *launch = NULL;
    int n = 0, rc;

    rc = sm_begin();
    if (rc) {
      LOG(LOG_ERROR, "could not begin a transaction: %s", db_errmsg(g.db));
      goto out;
    }
    for (; w && n < cap; w = w->next) {
      struct db_fields f = DB_FIELDS_INIT;
      char why[160], detail[256];
      int next_attempt = w->attempt + 1;
      enum wstatus to = WS_STARTING;

      if (!wants_start(w))
        continue;
      /* One launch per submit for a queueing backend: the next launch
       * starts the next batch. */
      if (queues && launch && strcmp(launch, w->launch) != 0)
        break;
      memset(&where[n], 0, sizeof(where[n]));
      if (!g.backend->place(w->id, &w->req, &where[n], why, sizeof(why))) {
        if (w->status == WS_SCHEDULING && strcmp(why, w->waiting_for) != 0) {
          snprintf(w->waiting_for, sizeof(w->waiting_for), "%s", why);
          if (db_worker_set_waiting(g.db, w->id, why) != 0)
            LOG(LOG_WARN, "could not record why %s waits: %s", w->id, db_errmsg(g.db));
        }
        continue;
      }
      launch = w->launch;
      if (queues && w->status == WS_SCHEDULING)
        to = WS_SCHEDULING;
      f.attempt = next_attempt;
      f.bind_ip = where[n].bind_ip[0] ? where[n].bind_ip : NULL;
      f.gpu_indices = where[n].gpu_indices[0] ? where[n].gpu_indices : NULL;
      if (w->restart)
        snprintf(detail, sizeof(detail),
                 "attempt %d on the %s backend: attempt %d was not running when the "
                 "controller restarted",
                 next_attempt, g.backend->name, w->attempt);
      else if (to == WS_SCHEDULING) {
        char shape[160] = "";
        if (g.backend->describe)
          g.backend->describe(&w->req, shape, sizeof(shape));
        snprintf(detail, sizeof(detail), "attempt %d submitted to the %s backend's queue%s%s",
                 next_attempt, g.backend->name, shape[0] ? ": " : "", shape);
      } else
        snprintf(detail, sizeof(detail), "attempt %d on the %s backend%s%s", next_attempt,
                 g.backend->name, where[n].bind_ip[0] ? ", address " : "", where[n].bind_ip);
      if (sm_transition(w, to, &f, detail) != 0) {
        /* The row may be half written: the whole batch goes back, and
         * tries again on the next pass. */
        LOG(LOG_ERROR, "could not record the start of %s: %s", w->id, db_errmsg(g.db));
        g.backend->release(w->id);
        sm_rollback();
        for (int i = 0; i < n; i++)
          g.backend->release(batch[i]->id);
        g.schedule_needed = 1;
        goto out;
      }
      if (to == WS_SCHEDULING) {
        snprintf(w->waiting_for, sizeof(w->waiting_for), "submitted to the %s backend",
                 g.backend->name);
        if (db_worker_set_waiting(g.db, w->id, w->waiting_for) != 0)
          LOG(LOG_WARN, "could not record why %s waits: %s", w->id, db_errmsg(g.db));
      } else {
        w->waiting_for[0] = '\0';
      }
      batch[n++] = w;
    }
    FAULT_POINT("schedule_before_commit");
    if (sm_commit() != 0) {
      for (int i = 0; i < n; i++)
        g.backend->release(batch[i]->id);
      g.schedule_needed = 1; /* the next pass tries again */
      goto out;
    }
    /* Committed: whatever crashes from here on, a workerd of another
     * attempt can never register. */
    for (int i = 0; i < n; i++) {
      starts[i].id = batch[i]->id;
      starts[i].launch = batch[i]->launch;
      starts[i].controller_url = g.controller_url;
      starts[i].token = batch[i]->token;
      starts[i].attempt = batch[i]->attempt;
      starts[i].req = &batch[i]->req;
      starts[i].where = &where[i];
    }
    if (n)
      g.backend->submit(starts, n);
  }
out:
  if (queues) {
    free(where);
    free(starts);
    free(batch);
  }
}

/* Retention: terminal workers past --retain go, with their events, logs and
 * files, in batches, through db_prune(), the one path that deletes. */
static void prune_locked(int64_t now) {
  char(*ids)[16];
  char cutoff[32];
  time_t t;
  struct tm tm;
  int n = 0;
  /* Once a minute, or more often for a short --retain (tests). */
  int64_t every = (int64_t)(g.cfg.retain_s * 500);

  if (every > 60000)
    every = 60000;
  if (every < 500)
    every = 500;
  if (g.cfg.retain_s <= 0 || now - g.last_prune_ms < every)
    return;
  g.last_prune_ms = now;
  t = time(NULL) - (time_t)g.cfg.retain_s;
  gmtime_r(&t, &tm);
  strftime(cutoff, sizeof(cutoff), "%Y-%m-%dT%H:%M:%S.000Z", &tm);
  ids = calloc(500, sizeof(*ids));
  if (!ids)
    return;
  if (db_prune(g.db, cutoff, 500, ids, &n) != 0)
    LOG(LOG_WARN, "could not prune old workers: %s", db_errmsg(g.db));
  if (n == 500)
    g.last_prune_ms = now - every + 100; /* more to do: again soon */
  /* The files go without the lock: nobody looks for a pruned worker's. */
  state_unlock();
  for (int i = 0; i < n; i++) {
    static const char *const kinds[] = {"logs/%s.stdout", "logs/%s.stderr", "workers/%s.log"};
    for (size_t k = 0; k < sizeof(kinds) / sizeof(kinds[0]); k++) {
      char rel[64], path[700];
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wformat-nonliteral"
      snprintf(rel, sizeof(rel), kinds[k], ids[i]);
#pragma GCC diagnostic pop
      snprintf(path, sizeof(path), "%s/%s", g.cfg.state_dir, rel);
      if (unlink(path) != 0 && errno != ENOENT)
        LOG(LOG_WARN, "could not remove %s: %s", path, strerror(errno));
    }
  }
  if (n)
    LOG(LOG_INFO, "retention: pruned %d workers that ended before %s", n, cutoff);
  free(ids);
  state_lock();
}

/* 1 if the client of a suspended connection has hung up. A suspended
 * connection is not watched by libmicrohttpd, so nobody else would notice. */
static int client_gone(struct MHD_Connection *c) {
  const union MHD_ConnectionInfo *ci =
      MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
  struct pollfd p;
  char b;

  if (!ci)
    return 0;
  p.fd = ci->connect_fd;
  p.events = POLLIN | POLLRDHUP;
  p.revents = 0;
  if (poll(&p, 1, 0) != 1)
    return 0;
  if (p.revents & (POLLHUP | POLLERR | POLLRDHUP | POLLNVAL))
    return 1;
  /* Readable: a pipelined request, or the end of the stream. */
  return recv(p.fd, &b, 1, MSG_PEEK | MSG_DONTWAIT) == 0;
}

/* Resumes suspended awaits and streams whose clients left, so that
 * libmicrohttpd finishes them and their completion frees them. Checked once
 * a second. */
static void reap_gone_clients_locked(int64_t now) {
  static int64_t last;
  struct stream *s, *next;

  if (now - last < 1000)
    return;
  last = now;
  for (struct waiter *wt = g.waiters; wt; wt = wt->next)
    if (!wt->ready && client_gone(wt->conn)) {
      wt->client_gone = 1;
      waiter_wake_locked(wt);
    }
  for (s = g.streams; s; s = next) {
    next = s->next;
    if (s->suspended && client_gone(s->conn)) {
      s->client_gone = 1;
      stream_resume_locked(s);
    }
  }
}

static void expire_waiters_locked(int64_t now) {
  for (struct waiter *wt = g.waiters; wt; wt = wt->next)
    if (!wt->ready && wt->deadline_ms && wt->deadline_ms <= now) {
      wt->timed_out = 1;
      waiter_wake_locked(wt);
    }
}

/* The earliest moment the monitor must look again, at most 100 ms away so
 * that timeouts stay prompt. */
static int64_t next_wakeup_locked(int64_t now) {
  int64_t at = now + 100;

  for (struct waiter *wt = g.waiters; wt; wt = wt->next)
    if (!wt->ready && wt->deadline_ms && wt->deadline_ms < at)
      at = wt->deadline_ms;
  return at;
}

static void monitor_wait_locked(int64_t at) {
  g.lock_held = 0;
  util_cond_wait_until(&g.kick, &g.lock, at);
  g.lock_owner = pthread_self();
  g.lock_held = 1;
}

static void *monitor_main(void *arg) {
  (void)arg;
  state_lock();
  while (!g.stopping_monitor) {
    int64_t now = util_mono_ms();

    check_timeouts_locked(now);
    leases_expire_locked(now);
    if (g.schedule_needed && !g.shutting_down)
      schedule_locked();
    expire_waiters_locked(now);
    flush_heartbeats_locked(now);
    reap_gone_clients_locked(now);
    if (now - g.last_keepalive_ms >= 15000) {
      g.last_keepalive_ms = now;
      for (struct stream *s = g.streams; s; s = s->next)
        s->keepalive_due = 1;
      streams_wake_locked(STREAM_EVENTS, NULL);
    }
    prune_locked(now);
    if (g.stopping_monitor)
      break;
    if (g.schedule_needed && !g.shutting_down)
      continue;
    monitor_wait_locked(next_wakeup_locked(util_mono_ms()));
  }
  flush_heartbeats_locked(INT64_MAX / 2);
  state_unlock();
  return NULL;
}

int state_start_monitor(void) {
  g.last_keepalive_ms = util_mono_ms();
  g.last_hb_flush_ms = g.last_keepalive_ms;
  g.last_prune_ms = g.last_keepalive_ms - 60000 + 2000; /* first prune soon after start */
  return pthread_create(&g.monitor, NULL, monitor_main, NULL) == 0 ? 0 : MUSTER_E_INTERNAL;
}

void state_stop_monitor(void) {
  state_lock();
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
  if (g.backend && g.backend_started)
    g.backend->shutdown();
  g.backend_started = 0;
  for (; w; w = next) {
    next = w->next;
    free(w->outside_why);
    free(w);
  }
  g.head = g.tail = NULL;
  memset(g.hash, 0, sizeof(g.hash));
  free(g.pending);
  g.pending = NULL;
  leases_free_locked();
  db_close(g.db);
  g.db = NULL;
}
