/* restore.c: a restarted controller's live table: the workers an earlier
 * controller left live are re-created from SQLite and reconciled with what
 * the backend still runs, before anything is started or served. See
 * docs/internals/controller.md, "Exactly once". */
#include "state_internal.h"

#include "log.h"
#include "muster_errors.h"
#include "util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct restore {
  struct backend_live *live;
  int n, cap;
  int nomem; /* a worker could not be put in the live table */
};

/* Re-creates the live table from the rows an earlier controller left, and
 * lists the ones the backend may still run. */
static void restore_one(void *arg, const struct db_worker_info *info) {
  struct restore *r = arg;
  struct backend_req req = {info->cpu, info->memory, info->nvidia_gpu};
  struct backend_live *l;
  struct lw *w;
  enum wstatus st;

  if (info->nomem) {
    r->nomem = 1; /* (its backend reference may be missing) */
    return;
  }
  if (ws_parse(info->status, &st) != 0)
    return;
  w = lw_new_locked(info->id, info->token, info->session, info->launch_id, info->owner, &req);
  if (!w) {
    r->nomem = 1;
    return;
  }
  lw_set_status_locked(w, st);
  w->attempt = info->attempt;
  w->reg_pid = st == WS_RUNNING && info->pid > 0 ? info->pid : 0;
  w->host_hash = util_fnv1a(info->hostname);
  /* It beats at the interval it was last told (written with its heartbeats,
   * a fraction of a second late when the flush keeps up;
   * restore_live_locked() takes the longer of it and the interval of the
   * workers restored) until its next answer. */
  w->hb_interval_ms = info->heartbeat_interval_ms;
  /* (a register answered just before the restart may have been lost: its
   * retry, from that pid, is answered until the new token is used) */
  w->rotation_open = w->reg_pid > 0;
  if (st == WS_SCHEDULING && !lw_submitted(w))
    return;
  if (r->n == r->cap) {
    int cap = r->cap ? 2 * r->cap : 64;
    struct backend_live *grown = realloc(r->live, (size_t)cap * sizeof(*grown));
    if (!grown) {
      /* (unreconciled, the backend would take it for gone) */
      r->nomem = 1;
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
  if (info->backend_ref && !l->ref)
    r->nomem = 1; /* (without it, the backend would take it for lost) */
  l->req = req;
  snprintf(l->where.bind_ip, sizeof(l->where.bind_ip), "%s", info->bind_ip);
  snprintf(l->where.gpu_indices, sizeof(l->where.gpu_indices), "%s", info->gpu_indices);
}

/* Reconciles what the backend runs with what the database says, before
 * anything is started or served: the recorded attempts that still run are
 * adopted; a starting worker whose attempt does not run gets a new attempt
 * (no workerd of it registered, so its script never ran; the old one, should
 * it appear, is refused); a running one whose workerd is gone failed. A
 * live row that could not be read, put in the live table or listed for
 * the backend stops the start before the backend reconciles anything
 * (its init has run, and adopts or sweeps nothing until then): a worker
 * left out would be neither started nor ended by this controller, or be
 * taken by the backend for lost. */
int restore_live_locked(char *err, size_t errlen) {
  struct restore r = {NULL, 0, 0, 0};
  int adopted = 0, lost = 0, restarted = 0, waiting = 0, rc = 0;
  int64_t restored_ms;

  if (db_live_workers(g.db, restore_one, &r) != 0) {
    snprintf(err, errlen, "could not read the live workers from the database: %s", db_errmsg(g.db));
    rc = MUSTER_E_DB;
  } else if (r.nomem) {
    snprintf(err, errlen, "out of memory putting the live workers in the live table");
    rc = MUSTER_E_NOMEM;
  }
  if (!rc)
    rc = g.backend->reconcile(r.live, r.n, err, errlen);
  if (rc) {
    for (int i = 0; i < r.n; i++)
      free((char *)r.live[i].ref);
    free(r.live);
    return rc;
  }
  /* (once, before the loop fails any: the interval for as many as were
   * restored, those that beat at it among them) */
  restored_ms = hb_interval_ms(g.beating);
  for (int i = 0; i < r.n; i++) {
    struct lw *w = lw_find_locked(r.live[i].id);

    if (!w)
      continue;
    w->last_hb_ms = util_mono_ms();
    /* (a worker whose interval was not written yet, 0, was told one for
     * about as many workers as are restored) */
    if (w->status == WS_RUNNING && w->hb_interval_ms < restored_ms)
      w->hb_interval_ms = restored_ms;
    if (r.live[i].adopted) {
      w->ref_known = 1;
      adopted++;
    } else if (r.live[i].why[0]) {
      if (sm_fail_locked(w, r.live[i].why) != 0)
        LOG(LOG_ERROR, "could not mark %s failed: %s", w->id, db_errmsg(g.db));
      lost++;
    } else if (w->status == WS_STARTING || w->status == WS_SCHEDULING) {
      w->restart = 1;
      lw_queue_locked(w);
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
  return 0;
}
