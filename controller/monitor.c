/* monitor.c: the monitor thread, which drives time: it runs the periodic
 * work of the other files (timeouts, leases, scheduling, awaits' deadlines,
 * streams' wake times, heartbeat flushes, clients that hung up,
 * keep-alives, retention) under the state lock, and sleeps until kicked or
 * due. */
#include "state_internal.h"

#include "lease.h"
#include "muster_errors.h"
#include "util.h"

#include <pthread.h>
#include <stdint.h>

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
    streams_wake_due_locked(now);
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
