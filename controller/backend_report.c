/* backend_report.c: what the backends report (backend.h: a start, a
 * refusal, an end, a wait, usage samples), turned into transitions through
 * the state machine's functions. */
#include "state.h"

#include "backend.h"
#include "log.h"
#include "muster_errors.h"
#include "util.h"

#include <stdio.h>
#include <string.h>

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
  case BACKEND_RESTART:
    /* As restore_live_locked() does for an attempt reconcile() says does
     * not run: a scheduling or starting worker gets a new attempt. */
    if (w->status == WS_SCHEDULING || w->status == WS_STARTING) {
      w->restart = 1;
      w->ref_known = 0;
      lw_queue_locked(w);
      state_kick_locked();
    } else if (sm_fail_locked(w, r->detail) != 0) {
      LOG(LOG_ERROR, "could not fail %s: %s", r->id, db_errmsg(g.db));
    }
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
      lw_dirty_locked(w);
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
