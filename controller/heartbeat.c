/* heartbeat.c: heartbeats and timeouts: a heartbeat is recorded in memory,
 * written to SQLite in batches, and its absence (or a start that never
 * registered) fails the worker. See docs/internals/controller.md,
 * "Heartbeats". */
#include "state_internal.h"

#include "log.h"
#include "util.h"

#include <stdio.h>

void sm_heartbeat_locked(struct lw *w) {
  ASSERT_LOCKED();
  w->last_hb_ms = util_mono_ms();
  w->hb_dirty = 1;
}

/* Writes the heartbeats received (and the usage sampled) since the last
 * flush in one transaction:
 * at most one write a second, whatever the number of workers. Loss
 * detection reads last_hb_ms, never the database. */
void flush_heartbeats_locked(int64_t now) {
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
void check_timeouts_locked(int64_t now) {
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

void heartbeats_credit_locked(int64_t ms) {
  for (struct lw *w = g.head; w; w = w->next) {
    if (w->status == WS_RUNNING)
      w->last_hb_ms += ms;
    else if (w->status == WS_STARTING)
      w->since_ms += ms; /* its start timeout: its register could not be served either */
  }
}
