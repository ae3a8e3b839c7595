/* lease.c: see lease.h. */
#include "lease.h"

#include "db.h"
#include "log.h"
#include "muster_errors.h"
#include "state.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct lease {
  char session[72];
  double ttl_s;
  int64_t expires_ms;
  struct lease *next; /* hash chain */
};

#define LEASE_BUCKETS 1024

static struct lease *buckets[LEASE_BUCKETS];
static int nleases;

static unsigned bucket_of(const char *s) {
  unsigned h = 2166136261u;
  for (; *s; s++)
    h = (h ^ (unsigned char)*s) * 16777619u;
  return h % LEASE_BUCKETS;
}

static struct lease **find_slot(const char *session) {
  struct lease **p = &buckets[bucket_of(session)];
  while (*p && strcmp((*p)->session, session) != 0)
    p = &(*p)->next;
  return p;
}

int lease_put_locked(const char *session, double ttl, int64_t *expires_ms, int *created) {
  struct lease **p, *l;
  int64_t until;
  int rc;

  ASSERT_LOCKED();
  p = find_slot(session);
  l = *p;
  *created = !l;
  if (!l && nleases >= LEASE_MAX)
    return MUSTER_E_CONFLICT;
  /* Holders of one session's lease may ask for different ttls: the lease
   * lasts as long as the longest asks (a short-lived holder's death never
   * cuts a longer one short). Only a new lease or a longer ttl is written;
   * a renewal is memory. */
  if (l && l->ttl_s > ttl)
    ttl = l->ttl_s;
  if (!l || l->ttl_s != ttl) {
    rc = db_lease_set(g.db, session, ttl);
    if (rc)
      return rc;
  }
  if (!l) {
    l = calloc(1, sizeof(*l));
    if (!l) {
      if (db_lease_set(g.db, session, 0) != 0)
        LOG(LOG_WARN, "could not clear the lease of %s: %s", session, db_errmsg(g.db));
      return MUSTER_E_NOMEM;
    }
    snprintf(l->session, sizeof(l->session), "%s", session);
    *p = l;
    nleases++;
  }
  until = util_mono_ms() + (int64_t)(ttl * 1000);
  l->ttl_s = ttl;
  if (until > l->expires_ms)
    l->expires_ms = until;
  *expires_ms = l->expires_ms;
  return 0;
}

static void lease_unlink(struct lease **p) {
  struct lease *l = *p;
  *p = l->next;
  free(l);
  nleases--;
}

int lease_drop_locked(const char *session) {
  struct lease **p;
  int rc;

  ASSERT_LOCKED();
  p = find_slot(session);
  if (!*p)
    return MUSTER_E_NOT_FOUND;
  rc = db_lease_set(g.db, session, 0);
  if (rc)
    return rc;
  lease_unlink(p);
  return 0;
}

struct expiry {
  const char *session;
  int runs;
};

/* Inside the stop's transaction: the session's running runs fail, and its
 * lease is gone from SQLite too. */
static int expire_rows(void *arg) {
  struct expiry *e = arg;
  int rc = db_runs_fail_session(
      g.db, e->session, "the session's lease expired: the client that ran it is gone", &e->runs);
  return rc ? rc : db_lease_set(g.db, e->session, 0);
}

/* Ends the lease of l in one transaction: stops the session's live
 * workers, fails its running runs, and forgets the lease. Returns 0, or an
 * error (nothing changed; the lease stays and is tried again a second
 * later). */
static int expire_one(struct lease *l) {
  struct expiry e = {l->session, 0};
  char(*ids)[16];
  int n = 0, k = 0, rc;

  for (struct lw *w = g.head; w; w = w->next)
    n += strcmp(w->session, l->session) == 0;
  ids = calloc((size_t)n + 1, sizeof(*ids));
  if (!ids)
    return MUSTER_E_NOMEM;
  for (struct lw *w = g.head; w; w = w->next)
    if (strcmp(w->session, l->session) == 0)
      snprintf(ids[k++], sizeof(ids[0]), "%s", w->id);
  rc = sm_stop_many_with_locked(ids, n, LEASE_EXPIRED, LEASE_EXPIRED, expire_rows, &e);
  free(ids);
  if (rc)
    return rc;
  g.leases_expired++;
  LOG(LOG_INFO, "the lease of session %s expired (ttl %.0f s): %d workers stopped, %d runs failed",
      l->session, l->ttl_s, n, e.runs);
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
      if (l->expires_ms > now) {
        p = &l->next;
        continue;
      }
      if (expire_one(l) != 0) {
        LOG(LOG_ERROR, "could not end the expired lease of %s: %s", l->session, db_errmsg(g.db));
        l->expires_ms = now + 1000;
        p = &l->next;
        continue;
      }
      lease_unlink(p);
    }
  }
}

static void restore_one(void *arg, const char *session, double ttl) {
  int64_t *now = arg;
  struct lease **p = find_slot(session), *l;

  if (*p || ttl <= 0)
    return;
  l = calloc(1, sizeof(*l));
  if (!l) {
    LOG(LOG_ERROR, "out of memory restoring the lease of %s", session);
    return;
  }
  snprintf(l->session, sizeof(l->session), "%s", session);
  l->ttl_s = ttl;
  l->expires_ms = *now + (int64_t)(ttl * 1000);
  *p = l;
  nleases++;
}

void leases_restore_locked(void) {
  int64_t now = util_mono_ms();

  ASSERT_LOCKED();
  if (db_leases(g.db, restore_one, &now) != 0)
    LOG(LOG_ERROR, "could not read the sessions' leases: %s", db_errmsg(g.db));
  else if (nleases)
    LOG(LOG_INFO, "restart: %d sessions' leases restored, each with one ttl of grace", nleases);
}

json_t *lease_json_locked(const char *session) {
  struct lease *l;
  char at[40];
  double left;

  ASSERT_LOCKED();
  l = *find_slot(session);
  if (!l)
    return json_null();
  left = (double)(l->expires_ms - util_mono_ms()) / 1000.0;
  util_iso_after(l->expires_ms - util_mono_ms(), at, sizeof(at));
  return json_pack("{s:f, s:s, s:f}", "ttl_seconds", l->ttl_s, "expires_at", at, "seconds_left",
                   left > 0 ? left : 0.0);
}

void leases_each_locked(void (*fn)(void *arg, const char *session, double ttl, double left),
                        void *arg) {
  int64_t now = util_mono_ms();

  ASSERT_LOCKED();
  for (int b = 0; b < LEASE_BUCKETS; b++)
    for (struct lease *l = buckets[b]; l; l = l->next) {
      double left = (double)(l->expires_ms - now) / 1000.0;
      fn(arg, l->session, l->ttl_s, left > 0 ? left : 0.0);
    }
}

void leases_free_locked(void) {
  for (int b = 0; b < LEASE_BUCKETS; b++)
    while (buckets[b])
      lease_unlink(&buckets[b]);
}
