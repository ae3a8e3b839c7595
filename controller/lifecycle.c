/* lifecycle.c: the state's start and end: state_init() (the state
 * directory, the database, the backend, the restart's restore),
 * state_begin_shutdown() and state_cleanup(). See state.h. */
#include "state_internal.h"

#include "backend.h"
#include "checkpoint.h"
#include "lease.h"
#include "muster_errors.h"
#include "network.h"
#include "util.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int state_init(const struct ctl_config *cfg, char *err, size_t errlen) {
  char path[600];
  const char *host, *scheme;
  int rc;

  g.cfg = *cfg;
  g.backend = backend_find(cfg->backend);
  if (!g.backend) {
    snprintf(err, errlen, "there is no backend \"%s\" (this controller has: %s)", cfg->backend,
             backend_names());
    return MUSTER_E_INVALID;
  }
  util_cond_init_monotonic(&g.kick);

  rc = statedir_prepare(err, errlen);
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
  /* The log is copied into the database outside the state lock; the
   * writer does it only if the checkpointer falls far behind. */
  if (checkpointer_start(path) == 0)
    db_autocheckpoint(g.db, 20000);
  host = g.cfg.listen_host;
  if (strcmp(host, "0.0.0.0") == 0 || strcmp(host, "*") == 0 || host[0] == '\0' ||
      strcmp(host, "localhost") == 0)
    host = "127.0.0.1"; /* the IPv4 address bound: "localhost" may resolve to ::1 first */
  scheme = g.cfg.tls_cert[0] ? "https" : "http";
  if (g.cfg.advertise_url[0])
    snprintf(g.controller_url, sizeof(g.controller_url), "%s", g.cfg.advertise_url);
  else
    snprintf(g.controller_url, sizeof(g.controller_url), "%s://%s:%d", scheme, host, g.cfg.port);
  if (net_bridge() && !g.cfg.advertise_url[0])
    snprintf(g.worker_url, sizeof(g.worker_url), "%s://%s:%d", scheme, net_gateway(), g.cfg.port);
  else
    snprintf(g.worker_url, sizeof(g.worker_url), "%s", g.controller_url);

  rc = g.backend->init(&g.cfg, err, errlen);
  if (rc)
    return rc;
  g.backend_started = 1;
  state_lock();
  rc = restore_live_locked(err, errlen);
  if (rc) {
    state_unlock();
    return rc;
  }
  leases_restore_locked();
  g.schedule_needed = 1;
  state_unlock();
  return 0;
}

void state_begin_shutdown(void) {
  state_lock();
  g.shutting_down = 1;
  for (struct waiter *wt = g.waiters, *next; wt; wt = next) {
    next = wt->next; /* (a wake takes wt out of the list) */
    wt->shut_down = 1;
    waiter_wake_locked(wt);
  }
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
  checkpointer_stop();
  for (; w; w = next) {
    next = w->next;
    free(w->outside_why);
    free(w);
  }
  g.head = g.tail = g.scan_next = NULL;
  memset(&g.dirty, 0, sizeof(g.dirty));
  memset(&g.queue, 0, sizeof(g.queue));
  g.live_count = g.beating = 0;
  memset(g.live_by_status, 0, sizeof(g.live_by_status));
  user_live_free_locked();
  memset(g.hash, 0, sizeof(g.hash));
  free(g.pending);
  g.pending = NULL;
  leases_free_locked();
  db_close(g.db);
  g.db = NULL;
}
