/* lease.c: see lease.h. */
#include "lease.h"
#include "session_name.h"

#include "db.h"
#include "log.h"
#include "muster_errors.h"
#include "state.h"
#include "util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* One holder's part of a session's lease. */
struct part {
  char holder[72];
  double ttl_s;
  int64_t expires_ms;
  int stop_workers;
};

struct lease {
  char session[SESSION_STORED_MAX];
  struct part *parts;
  int n, cap;
  struct lease *next; /* hash chain */
};

#define LEASE_BUCKETS 1024

static struct lease *buckets[LEASE_BUCKETS];
static int nleases;

static unsigned bucket_of(const char *s) {
  return util_fnv1a(s) % LEASE_BUCKETS;
}

static struct lease **find_slot(const char *session) {
  struct lease **p = &buckets[bucket_of(session)];
  while (*p && strcmp((*p)->session, session) != 0)
    p = &(*p)->next;
  return p;
}

static struct part *find_part(struct lease *l, const char *holder) {
  for (int i = 0; l && i < l->n; i++)
    if (strcmp(l->parts[i].holder, holder) == 0)
      return &l->parts[i];
  return NULL;
}

/* Room for one more part in l. Returns 0 or MUSTER_E_NOMEM. */
static int reserve_part(struct lease *l) {
  struct part *p;
  int cap;

  if (l->n < l->cap)
    return 0;
  cap = l->cap ? l->cap * 2 : 2;
  p = realloc(l->parts, (size_t)cap * sizeof(*p));
  if (!p)
    return MUSTER_E_NOMEM;
  l->parts = p;
  l->cap = cap;
  return 0;
}

static struct lease *lease_new(const char *session) {
  struct lease *l = calloc(1, sizeof(*l));

  if (l)
    snprintf(l->session, sizeof(l->session), "%s", session);
  return l;
}

static void lease_link(struct lease **slot, struct lease *l) {
  l->next = *slot;
  *slot = l;
  nleases++;
}

static void lease_unlink(struct lease **p) {
  struct lease *l = *p;
  *p = l->next;
  free(l->parts);
  free(l);
  nleases--;
}

static void part_remove(struct lease *l, struct part *p) {
  *p = l->parts[--l->n];
}

int lease_put_locked(const char *session, const char *holder, double ttl, int stop_workers,
                     struct lease_put *out) {
  struct lease **slot, *l, *fresh = NULL;
  struct part *p;
  int rc, past, stopped = 0;

  ASSERT_LOCKED();
  memset(out, 0, sizeof(*out));
  slot = find_slot(session);
  l = *slot;
  p = find_part(l, holder);
  if (!l && nleases >= LEASE_MAX)
    return MUSTER_E_CONFLICT;
  if (!p && l && l->n >= LEASE_HOLDERS_MAX) {
    out->session_full = 1;
    return MUSTER_E_CONFLICT;
  }
  if (!p) {
    /* A new part: was there one that ran out? (Its holder is told so.) */
    past = db_holder_past(g.db, session, holder, &stopped);
    if (past < 0)
      return MUSTER_E_DB;
    out->created = 1;
    out->expired = past;
    out->workers_stopped = past && stopped;
    if (!l && !(l = fresh = lease_new(session)))
      return MUSTER_E_NOMEM;
    if (reserve_part(l) != 0) {
      free(fresh);
      return MUSTER_E_NOMEM;
    }
  }
  /* Only a new part, or a changed one, is written; a renewal is memory. */
  if (!p || p->ttl_s != ttl || p->stop_workers != stop_workers) {
    rc = db_holder_set(g.db, session, holder, ttl, stop_workers);
    if (rc) {
      if (fresh)
        free(fresh->parts), free(fresh);
      return rc;
    }
  }
  if (fresh)
    lease_link(slot, fresh);
  if (!p) {
    p = &l->parts[l->n++];
    memset(p, 0, sizeof(*p));
    snprintf(p->holder, sizeof(p->holder), "%s", holder);
  }
  p->ttl_s = ttl;
  p->stop_workers = stop_workers;
  p->expires_ms = util_mono_ms() + (int64_t)(ttl * 1000);
  return 0;
}

int lease_held_locked(const char *session, const char *holder) {
  ASSERT_LOCKED();
  return find_part(*find_slot(session), holder) != NULL;
}

/* Whether a part of l other than skip keeps the session's workers and is
 * still live at now. */
static int others_keep(const struct lease *l, const struct part *skip, int64_t now) {
  for (int i = 0; i < l->n; i++)
    if (&l->parts[i] != skip && l->parts[i].stop_workers && l->parts[i].expires_ms > now)
      return 1;
  return 0;
}

/* The session's live workers, for a stop: a new array (*n of them). */
static char (*session_workers(const char *session, int *n))[16] {
  char(*ids)[16];
  int k = 0;

  *n = 0;
  for (struct lw *w = g.head; w; w = w->next)
    *n += strcmp(w->session, session) == 0;
  ids = calloc((size_t)*n + 1, sizeof(*ids));
  if (ids)
    for (struct lw *w = g.head; w; w = w->next)
      if (strcmp(w->session, session) == 0)
        snprintf(ids[k++], sizeof(ids[0]), "%s", w->id);
  return ids;
}

struct drop {
  const char *session, *holder;
  int stops; /* the session's workers stop with it */
  int runs;
};

/* Inside the drop's transaction: the holder's part and its runs end. */
static int drop_rows(void *arg) {
  struct drop *d = arg;
  int rc = db_runs_fail_holder(g.db, d->session, d->holder,
                               "the client that ran it gave its lease back before the run ended",
                               &d->runs);
  if (!rc && d->stops)
    rc = db_holders_stopped(g.db, d->session);
  return rc ? rc : db_holder_drop(g.db, d->session, d->holder);
}

int lease_drop_locked(const char *session, const char *holder, int stop_workers, int *stopped) {
  struct lease **slot = find_slot(session);
  struct part *p = find_part(*slot, holder);
  struct drop d = {session, holder, 0, 0};
  char(*ids)[16] = NULL;
  int n = 0, rc, last = 0;

  ASSERT_LOCKED();
  *stopped = -1;
  if (!p) {
    /* A part that ran out: its holder said goodbye, its row can go. */
    if (db_holder_drop(g.db, session, holder) != 0)
      LOG(LOG_WARN, "could not forget holder %s's expired part of %s: %s", holder, session,
          db_errmsg(g.db));
    return MUSTER_E_NOT_FOUND;
  }
  /* The workers stop only with the last part that keeps them: the others'
   * holders keep them (and stop them at their own end). */
  if (stop_workers && !others_keep(*slot, p, util_mono_ms())) {
    last = d.stops = 1;
    ids = session_workers(session, &n);
    if (!ids)
      return MUSTER_E_NOMEM;
  }
  rc = sm_stop_many_with_locked(ids, n, LEASE_GIVEN_BACK, LEASE_GIVEN_BACK, drop_rows, &d);
  free(ids);
  if (rc)
    return rc;
  if (last)
    *stopped = n;
  part_remove(*slot, p);
  if (!(*slot)->n)
    lease_unlink(slot);
  if (d.runs)
    LOG(LOG_INFO, "holder %s gave back its part of session %s's lease: %d run%s failed", holder,
        session, d.runs, d.runs == 1 ? "" : "s");
  return 0;
}

struct expiry {
  struct lease *l;
  int64_t now;
  int session_end; /* the last part keeping the workers ran out */
  int runs;
};

/* Inside the expiry's transaction: the parts that ran out are marked so,
 * with their runs failed (all the session's runs if the lease ended). */
static int expire_rows(void *arg) {
  struct expiry *e = arg;
  int rc = 0, n;

  if (e->session_end)
    rc = db_runs_fail_session(g.db, e->l->session,
                              "the session's lease expired: the client that ran it is gone",
                              &e->runs);
  for (int i = 0; !rc && i < e->l->n; i++) {
    struct part *p = &e->l->parts[i];
    if (p->expires_ms > e->now)
      continue;
    rc = db_holder_expire(g.db, e->l->session, p->holder, e->session_end);
    if (!rc && !e->session_end) {
      rc = db_runs_fail_holder(g.db, e->l->session, p->holder,
                               "the client that ran it is gone: its part of the session's lease "
                               "expired",
                               &n);
      e->runs += n;
    }
  }
  /* Holders whose part ran out earlier learn that the workers stopped. */
  if (!rc && e->session_end)
    rc = db_holders_stopped(g.db, e->l->session);
  return rc;
}

/* Ends the parts of l that ran out by now, in one transaction: marks them
 * expired and fails their runs; if the last part keeping the session's
 * workers is among them, stops the session's live workers and fails all
 * its running runs. Returns 0, or an error (nothing changed; they are tried
 * again a second later). */
static int expire_parts(struct lease *l, int64_t now) {
  struct expiry e = {l, now, 0, 0};
  char(*ids)[16] = NULL;
  int n = 0, rc, any = 0, stop = 0;

  for (int i = 0; i < l->n; i++)
    if (l->parts[i].expires_ms <= now) {
      any = 1;
      stop |= l->parts[i].stop_workers;
    }
  if (!any)
    return 0;
  e.session_end = stop && !others_keep(l, NULL, now);
  if (e.session_end && !(ids = session_workers(l->session, &n)))
    return MUSTER_E_NOMEM;
  rc = sm_stop_many_with_locked(ids, n, LEASE_EXPIRED, LEASE_EXPIRED, expire_rows, &e);
  free(ids);
  if (rc)
    return rc;
  for (int i = l->n - 1; i >= 0; i--)
    if (l->parts[i].expires_ms <= now) {
      LOG(LOG_INFO, "holder %s's part of session %s's lease expired (ttl %.0f s)",
          l->parts[i].holder, l->session, l->parts[i].ttl_s);
      part_remove(l, &l->parts[i]);
    }
  if (e.session_end) {
    g.leases_expired++;
    LOG(LOG_INFO, "the lease of session %s expired: %d worker%s stopped, %d run%s failed",
        l->session, n, n == 1 ? "" : "s", e.runs, e.runs == 1 ? "" : "s");
  } else if (e.runs) {
    LOG(LOG_INFO, "session %s: %d run%s failed, their client gone", l->session, e.runs,
        e.runs == 1 ? "" : "s");
  }
  return 0;
}

void leases_expire_locked(int64_t now) {
  ASSERT_LOCKED();
  if (!nleases || g.shutting_down)
    return;
  for (int b = 0; b < LEASE_BUCKETS; b++) {
    struct lease **p = &buckets[b];
    while (*p) {
      struct lease *l = *p;
      if (expire_parts(l, now) != 0) {
        LOG(LOG_ERROR, "could not end the expired lease parts of %s: %s", l->session,
            db_errmsg(g.db));
        for (int i = 0; i < l->n; i++)
          if (l->parts[i].expires_ms <= now)
            l->parts[i].expires_ms = now + 1000;
      }
      if (l->n)
        p = &l->next;
      else
        lease_unlink(p);
    }
  }
}

void leases_credit_locked(int64_t ms) {
  ASSERT_LOCKED();
  for (int b = 0; b < LEASE_BUCKETS; b++)
    for (struct lease *l = buckets[b]; l; l = l->next)
      for (int i = 0; i < l->n; i++)
        l->parts[i].expires_ms += ms;
}

static void restore_one(void *arg, const char *session, const char *holder, double ttl,
                        int stop_workers) {
  int64_t *now = arg;
  struct lease **slot = find_slot(session), *l = *slot, *fresh = NULL;
  struct part *p;

  if (ttl <= 0 || find_part(l, holder))
    return;
  if (!l && !(l = fresh = lease_new(session)))
    goto nomem;
  if (reserve_part(l) != 0) {
    free(fresh);
    goto nomem;
  }
  if (fresh)
    lease_link(slot, fresh);
  p = &l->parts[l->n++];
  memset(p, 0, sizeof(*p));
  snprintf(p->holder, sizeof(p->holder), "%s", holder);
  p->ttl_s = ttl;
  p->stop_workers = stop_workers;
  p->expires_ms = *now + (int64_t)(ttl * 1000);
  return;
nomem:
  LOG(LOG_ERROR, "out of memory restoring holder %s's lease of %s", holder, session);
}

void leases_restore_locked(void) {
  int64_t now = util_mono_ms();

  ASSERT_LOCKED();
  if (db_holders(g.db, restore_one, &now) != 0)
    LOG(LOG_ERROR, "could not read the sessions' leases: %s", db_errmsg(g.db));
  else if (nleases)
    LOG(LOG_INFO, "restart: %d sessions' leases restored, each part with one ttl of grace",
        nleases);
}

/* The part that sums l up: the longest-lasting of those that keep the
 * workers, or of all if none does. */
static const struct part *summary_part(const struct lease *l) {
  const struct part *best = NULL;

  for (int i = 0; i < l->n; i++) {
    const struct part *p = &l->parts[i];
    if (!best || p->stop_workers > best->stop_workers ||
        (p->stop_workers == best->stop_workers && p->expires_ms > best->expires_ms))
      best = p;
  }
  return best;
}

static double left_s(int64_t expires_ms, int64_t now) {
  double left = (double)(expires_ms - now) / 1000.0;
  return left > 0 ? left : 0.0;
}

json_t *lease_json_locked(const char *session) {
  struct lease *l;
  const struct part *best;
  json_t *holders, *o;
  int64_t now = util_mono_ms();
  char at[40];

  ASSERT_LOCKED();
  l = *find_slot(session);
  if (!l || !(best = summary_part(l)))
    return json_null();
  holders = json_array();
  for (int i = 0; i < l->n; i++) {
    const struct part *p = &l->parts[i];
    util_iso_after(p->expires_ms - now, at, sizeof(at));
    json_array_append_new(holders,
                          json_pack("{s:s, s:f, s:s, s:f, s:b}", "holder", p->holder, "ttl_seconds",
                                    p->ttl_s, "expires_at", at, "seconds_left",
                                    left_s(p->expires_ms, now), "stop_workers", p->stop_workers));
  }
  util_iso_after(best->expires_ms - now, at, sizeof(at));
  o = json_pack("{s:f, s:s, s:f, s:b, s:o}", "ttl_seconds", best->ttl_s, "expires_at", at,
                "seconds_left", left_s(best->expires_ms, now), "stops_workers", best->stop_workers,
                "holders", holders);
  return o;
}

void leases_each_locked(void (*fn)(void *arg, const char *session, double ttl, double left,
                                   int stops_workers),
                        void *arg) {
  int64_t now = util_mono_ms();

  ASSERT_LOCKED();
  for (int b = 0; b < LEASE_BUCKETS; b++)
    for (struct lease *l = buckets[b]; l; l = l->next) {
      const struct part *best = summary_part(l);
      if (best)
        fn(arg, l->session, best->ttl_s, left_s(best->expires_ms, now), best->stop_workers);
    }
}

void leases_free_locked(void) {
  for (int b = 0; b < LEASE_BUCKETS; b++)
    while (buckets[b])
      lease_unlink(&buckets[b]);
}
