/* heartbeat.c: heartbeats and timeouts: a heartbeat is recorded in memory,
 * written to SQLite in batches, and its absence (or a start that never
 * registered) fails the worker. See docs/internals/controller.md,
 * "Heartbeats". */
#include "state_internal.h"

#include "fault.h"
#include "log.h"
#include "muster_errors.h"
#include "util.h"

#include <math.h>
#include <stdio.h>

/* A worker is lost after this many of its intervals without a heartbeat,
 * once its interval is stretched past the configured one (a Kubernetes
 * node's 40 s grace over its 10 s lease). */
#define HB_TIMEOUT_BEATS 4
/* The longest interval told: 5 minutes, half a workerd's default orphan
 * timeout (MUSTER_ORPHAN_TIMEOUT, 600 s, which a workerd counts from its
 * first call without an answer and judges at each heartbeat), so that a
 * workerd whose controller is gone for good outlives it by at most the
 * timeout and two intervals. The rate holds up to 1,500,000 beating
 * workers. */
#define HB_INTERVAL_MAX_MS 300000

static int64_t configured_interval_ms(void) {
  return llround(g.cfg.heartbeat_interval_s * 1000);
}

int64_t hb_interval_ms(int beating) {
  int64_t ms = configured_interval_ms();

  if (g.cfg.heartbeat_rate > 0) {
    /* n workers each beating every ms/1000 s send n*1000/ms a second: at
     * most the rate, in whole tenths of a second (in double, clamped
     * before any conversion) */
    double spread = ceil((double)beating * 10 / g.cfg.heartbeat_rate) * 100;
    if (spread > HB_INTERVAL_MAX_MS)
      spread = HB_INTERVAL_MAX_MS;
    if ((int64_t)spread > ms)
      ms = (int64_t)spread;
  }
  return ms;
}

int64_t hb_interval_now_ms(void) {
  return hb_interval_ms(__atomic_load_n(&g.beating, __ATOMIC_RELAXED));
}

/* The heartbeat timeout of a worker told interval_ms (0: never told one). */
static int64_t hb_timeout_ms(int64_t interval_ms) {
  int64_t ms = llround(g.cfg.heartbeat_timeout_s * 1000);

  if (interval_ms > configured_interval_ms() && interval_ms * HB_TIMEOUT_BEATS > ms)
    ms = interval_ms * HB_TIMEOUT_BEATS;
  return ms;
}

/* The interval w is judged by: the longer of the last two it was told, so
 * that a worker whose answer telling it a shorter one was lost (it beats
 * at the longer one still) is not lost for it. */
static int64_t judged_interval_ms(const struct lw *w) {
  return w->hb_interval_ms > w->hb_prev_interval_ms ? w->hb_interval_ms : w->hb_prev_interval_ms;
}

double hb_tell_locked(struct lw *w) {
  int64_t ms = hb_interval_ms(g.beating);

  ASSERT_LOCKED();
  if (ms != w->hb_interval_ms || w->hb_prev_interval_ms != ms) {
    /* (what is stored is the interval it is judged by: it changes with
     * either) */
    w->hb_prev_interval_ms = w->hb_interval_ms;
    w->hb_interval_ms = ms;
    w->hb_dirty = 1;
    lw_dirty_locked(w);
  }
  return (double)ms / 1000;
}

void sm_heartbeat_locked(struct lw *w) {
  ASSERT_LOCKED();
  w->last_hb_ms = util_mono_ms();
  w->hb_dirty = 1;
  lw_dirty_locked(w);
}

/* Writes the heartbeats received (and the usage sampled) since the last
 * flush, in one transaction, at most every 100 ms (every FLUSH_BUSY_MS while
 * FLUSH_MAX_ROWS or more wait): the dirty workers only
 * (g.dirty), whatever the number of live ones; all of them when all is
 * set (the controller's end). Loss detection reads last_hb_ms, never the
 * database. */
int flush_heartbeats_locked(int64_t now, int all) {
  struct lw *w, *end;
  int rc, n = 0;

  if (!g.dirty.head ||
      (!all && now - g.last_hb_flush_ms < (g.dirty.n >= FLUSH_MAX_ROWS ? FLUSH_BUSY_MS : 100)))
    return 0;
  g.last_hb_flush_ms = now;
  rc = db_begin(g.db);
  if (!rc && FAULT_FAILS("heartbeat_flush"))
    rc = MUSTER_E_DB; /* (a test's: nothing is written) */
  for (w = g.dirty.head; !rc && w && (all || n < FLUSH_MAX_ROWS); w = w->dirty_link.next, n++) {
    if (w->hb_dirty)
      rc = db_worker_touch_heartbeat(g.db, w->id, judged_interval_ms(w));
    if (!rc && w->usage_dirty)
      rc = db_worker_usage(g.db, w->id, &w->usage);
  }
  end = w;
  if (!rc)
    rc = db_commit(g.db);
  if (rc) {
    static int64_t warned_ms;

    /* (tried again at the next flush; said once a minute) */
    if (!warned_ms || now - warned_ms >= 60000) {
      LOG(LOG_WARN, "could not record %d heartbeats and samples: %s", n, db_errmsg(g.db));
      warned_ms = now;
    }
    db_rollback(g.db);
    return 1;
  }
  while (g.dirty.head && g.dirty.head != end) {
    w = g.dirty.head;
    w->hb_dirty = w->usage_dirty = 0;
    lw_clean_locked(w);
  }
  return 1;
}

/* What a lost worker's failure says of a timeout hb_ms stretched past the
 * configured one ("" when it is not), in buf. */
static const char *stretch_words(const struct lw *w, int64_t hb_ms, char *buf, size_t size) {
  buf[0] = '\0';
  if (hb_ms != llround(g.cfg.heartbeat_timeout_s * 1000))
    snprintf(buf, size,
             ": %d of its %g s heartbeat intervals, stretched for the number of workers "
             "heartbeating",
             HB_TIMEOUT_BEATS, (double)judged_interval_ms(w) / 1000);
  return buf;
}

int64_t scan_every_ms(void) {
  /* Each worker judged every 100 ms while that leaves 10 ms a slice or
   * more (up to 10,000 live; a last slice partly filled counts whole),
   * else a slice every 10 ms (100,000 judged a second). */
  int64_t slices = ((int64_t)g.live_count + SCAN_SLICE - 1) / SCAN_SLICE;
  int64_t every = slices > 0 ? 100 / slices : 100;

  return every < 10 ? 10 : every > 100 ? 100 : every;
}

/* Fails workers that never registered or that stopped heartbeating. */
void check_timeouts_locked(int64_t now) {
  struct lw *w;
  int64_t start_ms = (int64_t)(g.cfg.start_timeout_s * 1000), hb_ms;
  char why[600], stretch[160];
  int n = 0;

  /* Each look judges up to SCAN_SLICE workers, going on from where the
   * last one stopped (g.scan_next; lw_remove_locked() moves it past a
   * worker that leaves), every scan_every_ms() once there are more
   * (state_internal.h). */
  if (g.live_count > SCAN_SLICE && now - g.last_scan_ms < scan_every_ms())
    return;
  g.last_scan_ms = now;
  for (w = g.scan_next ? g.scan_next : g.head; w && n < SCAN_SLICE; w = g.scan_next, n++) {
    g.scan_next = w->next;
    why[0] = '\0';
    hb_ms = hb_timeout_ms(judged_interval_ms(w));
    if (w->status == WS_STARTING && !w->queued && now - w->since_ms > start_ms)
      snprintf(why, sizeof(why),
               w->restart ? "could not be started again within the start timeout of %g s "
                            "after the controller restarted"
                          : "did not register within the start timeout of %g s",
               g.cfg.start_timeout_s);
    else if (w->outside_why && now >= w->outside_until_ms)
      snprintf(why, sizeof(why), "%s", w->outside_why);
    else if (w->status == WS_RUNNING && !w->outside_why && now - w->last_hb_ms > hb_ms)
      snprintf(why, sizeof(why), "lost: no heartbeat for %g s (the heartbeat timeout%s)",
               (double)hb_ms / 1000, stretch_words(w, hb_ms, stretch, sizeof(stretch)));
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

int hb_host_beat_now(void) {
  if (g.cfg.host_beat != HOST_BEAT_AUTO)
    return g.cfg.host_beat == HOST_BEAT_ON;
  /* (per worker until the rate stretches the interval: each worker's own
   * heartbeat judges it alone, and soonest) */
  return hb_interval_now_ms() > configured_interval_ms();
}

int64_t hb_cover_ms_locked(const struct lw *w) {
  int64_t i = w->hb_interval_ms, t = hb_timeout_ms(judged_interval_ms(w));
  int64_t cover = 2 * i + 1000;

  ASSERT_LOCKED();
  /* (its own beat, due when the cover ends, must still come within its
   * timeout of the vouch: an interval and two seconds to spare) */
  if (cover > t - i - 2000)
    cover = t - i - 2000;
  return cover > 0 ? cover : 0;
}
