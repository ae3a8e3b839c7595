/* state.c: the state machine: every status change goes through
 * sm_transition() between sm_begin() and sm_commit(), and what follows from
 * a change happens only once it has committed. See state.h. */
#include "state_internal.h"

#include "log.h"
#include "muster_errors.h"
#include "util.h"

#include <assert.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
  lw_set_status_locked(w, to);
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
    lw_set_status_locked(w, g.pending[i].to);
    w->attempt = g.pending[i].attempt;
    w->restart = g.pending[i].restart;
    w->ref_known = g.pending[i].ref_known;
    w->since_ms = g.pending[i].since_ms;
    lw_queue_locked(w); /* (it may want a start again: the next pass sees) */
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
