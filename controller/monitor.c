/* monitor.c: the monitor thread, which drives time: it runs the periodic
 * work of the other files (timeouts, leases, scheduling, awaits' deadlines,
 * streams' wake times, heartbeat flushes, clients that hung up,
 * keep-alives, retention) under the state lock, and sleeps until kicked or
 * due. */
#include "state_internal.h"

#include "lease.h"
#include "log.h"
#include "muster_errors.h"
#include "util.h"

#include <pthread.h>
#include <stdint.h>

/* The earliest moment the monitor must look again, at most 100 ms away so
 * that timeouts stay prompt, sooner while many heartbeats wait to be
 * written or the timeout scan goes in slices (heartbeat.c), and a
 * millisecond away at least: a look that ran long leaves the API's threads
 * their turn at the state lock before the next. */
static int64_t next_wakeup_locked(int64_t now) {
  int64_t at = now + 100;

  if (g.live_count > SCAN_SLICE && g.last_scan_ms + scan_every_ms() < at)
    at = g.last_scan_ms + scan_every_ms();
  if (g.schedule_needed && !g.shutting_down && g.schedule_retry_ms < at)
    at = g.schedule_retry_ms; /* (a failed pass's retry: sched.c) */
  /* (heartbeats to write come in small batches: heartbeat.c) */
  if (g.dirty.n >= FLUSH_MAX_ROWS && g.last_hb_flush_ms + FLUSH_BUSY_MS < at)
    at = g.last_hb_flush_ms + FLUSH_BUSY_MS;
  for (struct waiter *wt = g.waiters; wt; wt = wt->next)
    if (!wt->ready && wt->deadline_ms && wt->deadline_ms < at)
      at = wt->deadline_ms;
  return at > now + 2 ? at : now + 2; /* (now is rounded down: 1 to 2 ms) */
}

/* Whether a scheduling pass is due now: asked for, and not held back by a
 * failed one (sched.c). */
static int schedule_due_locked(int64_t now) {
  return g.schedule_needed && !g.shutting_down && now >= g.schedule_retry_ms;
}

static void monitor_wait_locked(int64_t at) {
  g.lock_held = 0;
  util_cond_wait_until(&g.kick, &g.lock, at);
  g.lock_owner = pthread_self();
  g.lock_held = 1;
}

/* Time the controller could not serve (docs/design.md): a gap between
 * two of the monitor's looks longer than UNSERVED_GAP_MS (the process was
 * stopped or starved, or the state lock held that long: no call could be
 * answered), or connections refused at the limit since the last look
 * (api_guard.c). Leases and heartbeat timeouts get that time back before
 * anything is judged to have run out. */
#define UNSERVED_GAP_MS 2000

static void credit_unserved_locked(int64_t now, int64_t *last_look) {
  int64_t gap = now - *last_look;
  int64_t refused_at = __atomic_load_n(&g.unserved_at_ms, __ATOMIC_RELAXED);
  static int64_t logged_ms;
  static double unlogged_s;

  if (*last_look && (gap > UNSERVED_GAP_MS || refused_at > *last_look) && gap > 0) {
    leases_credit_locked(gap);
    heartbeats_credit_locked(gap);
    __atomic_add_fetch(&g.unserved_ms, (uint64_t)gap, __ATOMIC_RELAXED);
    unlogged_s += (double)gap / 1000.0;
    if (!logged_ms || now - logged_ms >= 60000) {
      LOG(LOG_WARN,
          "the controller could not serve for %.1f s (%s): leases and heartbeat timeouts get "
          "that time back",
          unlogged_s, gap > UNSERVED_GAP_MS ? "stalled" : "connections refused at the limit");
      logged_ms = now;
      unlogged_s = 0;
    }
  }
  *last_look = now;
}

static void *monitor_main(void *arg) {
  int64_t last_look = 0;

  (void)arg;
  state_lock();
  while (!g.stopping_monitor) {
    int64_t now = util_mono_ms();

    credit_unserved_locked(now, &last_look);
    /* A heartbeat flush and a slice of the timeout scan in one look would
     * hold the state lock for both: a slice waits for the next look (2 ms
     * on), unless it is a whole interval late. (A scan of SCAN_SLICE or
     * fewer workers is short: it never waits.) */
    if (!flush_heartbeats_locked(now, 0) || g.live_count <= SCAN_SLICE ||
        now - g.last_scan_ms >= 2 * scan_every_ms())
      check_timeouts_locked(now);
    leases_expire_locked(now);
    if (schedule_due_locked(now))
      schedule_locked();
    expire_waiters_locked(now);
    streams_wake_due_locked(now);
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
    if (schedule_due_locked(util_mono_ms()))
      continue;
    monitor_wait_locked(next_wakeup_locked(util_mono_ms()));
  }
  flush_heartbeats_locked(util_mono_ms(), 1);
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
