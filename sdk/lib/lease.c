/* lease.c: sessions' leases and run records, see muster.h. */
#include "internal.h"
#include "muster.h"
#include "session_name.h"
#include "utf8.h"

#include <jansson.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* ---- leases ---- */

struct muster_lease {
  muster_client *c; /* its own: the renewals never share a handle */
  char *url, *token;
  char session[SESSION_STORED_MAX];
  char holder[72]; /* this client's id: its part of the session's lease */
  double ttl;
  int stop_workers; /* the part keeps the session's workers */
  pthread_t thread;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int stop;
  int expired;         /* a renewal found this holder's part had run out */
  int workers_stopped; /* ...and the session's workers were stopped with it */
  char err[512];
};

static double mono_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static void lease_path(const muster_lease *l, char *path, size_t size) {
  snprintf(path, size, "/api/v1/sessions/%s/lease", l->session);
}

/* Takes or renews l's part. *created: 1 if the holder held none (201),
 * then *expired and *stopped say whether an earlier part had run out, and
 * whether the session's workers were stopped with it. */
static int lease_put(muster_client *c, const muster_lease *l, int *created, int *expired,
                     int *stopped) {
  json_t *ans = NULL;
  char path[192];
  int rc;

  lease_path(l, path, sizeof(path));
  rc = muster_json_call_(c, "PUT", path,
                         json_pack("{s:f, s:s, s:b}", "ttl_seconds", l->ttl, "holder", l->holder,
                                   "stop_workers", l->stop_workers),
                         &ans);
  *created = *expired = *stopped = 0;
  if (!rc && muster_last_status_(c) == 201) {
    const char *previous = json_string_value(json_object_get(ans, "previous"));
    *created = 1;
    *expired = previous && strcmp(previous, "expired") == 0;
    *stopped = json_is_true(json_object_get(ans, "workers_stopped"));
  }
  json_decref(ans);
  return rc;
}

/* A session's name: 1 to 64 of [A-Za-z0-9_.-], or a user's as the
 * controller stores it, "USER/name" (what a worker's MUSTER_SESSION holds). */
static int session_ok(muster_client *c, const char *session) {
  size_t n = session ? strlen(session) : 0, slashes = 0;

  for (size_t i = 0; i < n; i++) {
    char ch = session[i];
    if (ch == '/' && i > 0 && i + 1 < n && ++slashes == 1)
      continue;
    if (!((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
          ch == '_' || ch == '.' || ch == '-'))
      n = 0;
  }
  if (n == 0 || n > (slashes ? SESSION_STORED_MAX - 1 : 64))
    return muster_set_error_(c, MUSTER_E_INVALID, "session",
                             "session must be 1 to 64 letters, digits, '_', '.' or '-'");
  return 0;
}

/* A holder id of this process: its host (letters, digits, '-' only; at
 * most 32), its pid and 8 random hex digits. */
static void make_holder(char *out, size_t size) {
  char host[64] = "host", clean[33];
  size_t k = 0;
  unsigned r;
  FILE *f;

  (void)gethostname(host, sizeof(host) - 1);
  host[sizeof(host) - 1] = '\0';
  for (size_t i = 0; host[i] && k < sizeof(clean) - 1; i++) {
    char ch = host[i];
    if ((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
        ch == '-')
      clean[k++] = ch;
  }
  clean[k] = '\0';
  r = (unsigned)time(NULL) ^ ((unsigned)getpid() << 12) ^ (unsigned)(uintptr_t)out;
  f = fopen("/dev/urandom", "rb");
  if (f) {
    if (fread(&r, sizeof(r), 1, f) != 1)
      r ^= (unsigned)clock();
    fclose(f);
  }
  snprintf(out, size, "%s-%d-%08x", k ? clean : "host", (int)getpid(), r);
}

/* Renews every ttl/3; after a failure, every second. */
static void *renew_main(void *arg) {
  muster_lease *l = arg;
  double next = mono_s() + l->ttl / 3;

  pthread_mutex_lock(&l->mu);
  while (!l->stop) {
    double now = mono_s();
    int created, expired, stopped;
    if (now < next) {
      struct timespec ts;
      double at = next;
      ts.tv_sec = (time_t)at;
      ts.tv_nsec = (long)((at - (double)ts.tv_sec) * 1e9);
      pthread_cond_timedwait(&l->cv, &l->mu, &ts);
      continue;
    }
    pthread_mutex_unlock(&l->mu);
    int rc = lease_put(l->c, l, &created, &expired, &stopped);
    pthread_mutex_lock(&l->mu);
    if (rc == 0) {
      /* 201: this holder's part had run out (this process stalled, or the
       * controller was unreachable too long); it is held again. Said from
       * now on, with whether the session's workers were stopped then. */
      if (created) {
        l->expired = 1;
        l->workers_stopped |= stopped;
      }
      l->err[0] = '\0';
      next = mono_s() + l->ttl / 3;
    } else {
      if (!l->stop)
        snprintf(l->err, sizeof(l->err), "%s", muster_client_errmsg(l->c));
      next = mono_s() + 1;
    }
  }
  pthread_mutex_unlock(&l->mu);
  return NULL;
}

/* Frees l once its thread is gone (or never ran). */
static void lease_free(muster_lease *l) {
  muster_client_free(l->c);
  pthread_cond_destroy(&l->cv);
  pthread_mutex_destroy(&l->mu);
  free(l->url);
  free(l->token);
  free(l);
}

/* Gives l's part back at once, best effort: a start that failed after its
 * PUT must not leave a part that could, once alone, stop the session's
 * workers when it runs out. */
static void give_back_now(muster_client *c, const muster_lease *l) {
  char path[256];

  lease_path(l, path, sizeof(path) - 100);
  snprintf(path + strlen(path), sizeof(path) - strlen(path), "?holder=%s", l->holder);
  if (muster_json_call_(c, "DELETE", path, NULL, NULL) != 0)
    return; /* it runs out by itself */
}

int muster_lease_start_(muster_client *c, const char *session, double ttl, int stop_workers,
                        muster_lease **out) {
  muster_lease *l;
  pthread_condattr_t ca;
  int rc, created, expired, stopped;

  *out = NULL;
  if ((rc = session_ok(c, session)))
    return rc;
  if (ttl <= 0)
    ttl = 30;
  if (ttl < 3 || ttl > 86400)
    return muster_set_error_(c, MUSTER_E_INVALID, "ttl_seconds",
                             "a lease's ttl is 3 to 86400 seconds");
  l = calloc(1, sizeof(*l));
  if (!l)
    return muster_set_error_(c, MUSTER_E_NOMEM, NULL, "out of memory");
  snprintf(l->session, sizeof(l->session), "%s", session);
  make_holder(l->holder, sizeof(l->holder));
  l->ttl = ttl;
  l->stop_workers = stop_workers;
  rc = lease_put(c, l, &created, &expired, &stopped);
  if (rc) {
    free(l);
    return rc;
  }
  l->url = strdup(muster_client_url(c));
  l->token = strdup(muster_client_token_(c));
  if (!l->url || !l->token || muster_client_new(l->url, l->token, &l->c) != 0) {
    give_back_now(c, l);
    free(l->url);
    free(l->token);
    free(l);
    return muster_set_error_(c, MUSTER_E_NOMEM, NULL, "could not make the lease's connection");
  }
  /* A renewal that hangs must not outlive the lease it renews. */
  muster_client_set_timeout(l->c, ttl / 3 < 10 ? ttl / 3 : 10);
  pthread_mutex_init(&l->mu, NULL);
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_cond_init(&l->cv, &ca);
  pthread_condattr_destroy(&ca);
  if (pthread_create(&l->thread, NULL, renew_main, l) != 0) {
    give_back_now(c, l);
    lease_free(l);
    return muster_set_error_(c, MUSTER_E_NOMEM, NULL, "could not start the lease's thread");
  }
  *out = l;
  return 0;
}

int muster_lease_start(muster_client *c, const char *session, double ttl, muster_lease **out) {
  return muster_lease_start_(c, session, ttl, 1, out);
}

const char *muster_lease_holder(const muster_lease *l) {
  return l ? l->holder : NULL;
}

const char *muster_lease_error(muster_lease *l, char *buf, size_t size) {
  if (!l || size == 0) {
    if (size)
      buf[0] = '\0';
    return buf;
  }
  pthread_mutex_lock(&l->mu);
  if (l->expired && l->workers_stopped)
    snprintf(buf, size,
             "the lease of session %s had expired before a renewal: the controller stopped the "
             "session's workers%s%s",
             l->session, l->err[0] ? "; " : "", l->err);
  else if (l->expired)
    snprintf(buf, size,
             "this client's part of session %s's lease had expired before a renewal (its runs "
             "ended; %s)%s%s",
             l->session,
             l->stop_workers ? "other holders kept the workers" : "the workers were left running",
             l->err[0] ? "; " : "", l->err);
  else
    snprintf(buf, size, "%s", l->err);
  pthread_mutex_unlock(&l->mu);
  return buf;
}

int muster_lease_end(muster_lease *l, muster_lease_end_how how) {
  muster_client *c = NULL;
  char path[256];
  int rc = 0;

  if (!l)
    return 0;
  pthread_mutex_lock(&l->mu);
  l->stop = 1;
  pthread_cond_signal(&l->cv);
  pthread_mutex_unlock(&l->mu);
  /* A renewal in flight is waited for (it is bounded by its timeout): one
   * abandoned on the wire could reach the controller after the DELETE
   * below and take the part again. */
  pthread_join(l->thread, NULL);
  if (how != MUSTER_LEASE_ABANDON && muster_client_new(l->url, l->token, &c) == 0) {
    muster_client_set_timeout(c, 10);
    /* Only this holder's part ends; with STOP_WORKERS the controller stops
     * the session's workers too unless another holder's part keeps them,
     * in the same step. */
    lease_path(l, path, sizeof(path) - 100);
    snprintf(path + strlen(path), sizeof(path) - strlen(path), "?holder=%s%s", l->holder,
             how == MUSTER_LEASE_STOP_WORKERS ? "&stop_workers=1" : "");
    rc = muster_json_call_(c, "DELETE", path, NULL, NULL);
    /* Gone already (it ran out): nothing to give back. */
    if (rc == MUSTER_E_NOT_FOUND)
      rc = 0;
  } else if (how != MUSTER_LEASE_ABANDON) {
    rc = MUSTER_E_NOMEM;
  }
  muster_client_free(c);
  lease_free(l);
  return rc;
}

/* ---- run records ---- */

static int run_id_ok(muster_client *c, const char *id) {
  if (!id || strlen(id) != 12 || strncmp(id, "r-", 2) != 0 ||
      strspn(id + 2, "abcdefghijklmnopqrstuvwxyz0123456789") != 10)
    return muster_set_error_(c, MUSTER_E_INVALID, "id", "not a run id");
  return 0;
}

int muster_run_record_new(muster_client *c, const char *session, const char *holder,
                          const char *mode, const char *const *argv, size_t argc, int max_restarts,
                          char id[16]) {
  json_t *cmd = json_array(), *ans = NULL, *req;
  const char *got;
  int rc;

  id[0] = '\0';
  for (size_t i = 0; i < argc; i++)
    json_array_append_new(cmd, json_string(argv[i]));
  req = json_pack("{s:s, s:o, s:i, s:s?}", "mode", mode, "command", cmd, "max_restarts",
                  max_restarts, "holder", holder);
  if (req && session)
    json_object_set_new(req, "session", json_string(session));
  if (!req)
    return muster_set_error_(c, MUSTER_E_NOMEM, NULL, "out of memory");
  rc = muster_json_call_(c, "POST", "/api/v1/runs", req, &ans);
  if (!rc) {
    got = json_string_value(json_object_get(ans, "id"));
    if (got && strlen(got) < 16)
      snprintf(id, 16, "%s", got);
    else
      rc = muster_set_error_(c, MUSTER_E_PROTOCOL, NULL, "the controller's run has no id");
  }
  json_decref(ans);
  return rc;
}

int muster_run_record_restart(muster_client *c, const char *id, const char *cause) {
  char path[64];
  int rc = run_id_ok(c, id);

  if (rc)
    return rc;
  /* Jansson takes UTF-8 only: anything else would go as no body at all. */
  if (cause && !utf8_valid(cause))
    return muster_set_error_(c, MUSTER_E_INVALID, "cause", "the cause is not UTF-8 text");
  snprintf(path, sizeof(path), "/api/v1/runs/%s/restarts", id);
  return muster_json_call_(c, "POST", path, json_pack("{s:s}", "cause", cause ? cause : "?"), NULL);
}

int muster_run_record_end(muster_client *c, const char *id, const char *status, const char *summary,
                          const char *failure) {
  json_t *req, *s = NULL;
  char path[64];
  int rc = run_id_ok(c, id);

  if (rc)
    return rc;
  /* A failure that is no UTF-8 would be left out, silently. */
  if (failure && !utf8_valid(failure))
    return muster_set_error_(c, MUSTER_E_INVALID, "failure", "the failure is not UTF-8 text");
  req = json_pack("{s:s}", "status", status);
  if (!req)
    return muster_set_error_(c, MUSTER_E_NOMEM, NULL, "out of memory");
  if (summary) {
    s = json_loads(summary, JSON_DECODE_ANY, NULL);
    json_object_set_new(req, "summary", s ? s : json_string(summary));
  }
  if (failure)
    json_object_set_new(req, "failure", json_string(failure));
  snprintf(path, sizeof(path), "/api/v1/runs/%s/end", id);
  return muster_json_call_(c, "POST", path, req, NULL);
}

static char *jstr(json_t *o, const char *key) {
  const char *v = json_string_value(json_object_get(o, key));
  return v ? strdup(v) : NULL;
}

void muster_run_info_list_free(muster_run_info_list *l) {
  if (!l)
    return;
  for (size_t i = 0; i < l->count; i++) {
    muster_run_info *r = &l->items[i];
    free(r->session);
    free(r->mode);
    free(r->status);
    free(r->failure);
    free(r->created_at);
    free(r->finished_at);
    free(r->json);
  }
  free(l->items);
  l->items = NULL;
  l->count = 0;
}

int muster_runs(muster_client *c, const char *session, const char *status, int limit,
                const char *before, muster_run_info_list *out, char *next) {
  char path[512];
  json_t *ans = NULL, *runs, *o;
  size_t i, off;
  int rc;

  out->count = 0;
  out->items = NULL;
  if (next)
    next[0] = '\0';
  if ((session && session_ok(c, session)) ||
      (status && strspn(status, "abcdefghijklmnopqrstuvwxyz") != strlen(status)) ||
      (before && strspn(before, "0123456789") != strlen(before)))
    return muster_set_error_(c, MUSTER_E_INVALID, NULL, "bad session, status or cursor");
  off = (size_t)snprintf(path, sizeof(path), "/api/v1/runs?limit=%d", limit > 0 ? limit : 500);
  if (session)
    off += (size_t)snprintf(path + off, sizeof(path) - off, "&session=%s", session);
  if (status && off < sizeof(path))
    off += (size_t)snprintf(path + off, sizeof(path) - off, "&status=%.20s", status);
  if (before && *before && off < sizeof(path))
    snprintf(path + off, sizeof(path) - off, "&before=%.24s", before);
  rc = muster_json_call_(c, "GET", path, NULL, &ans);
  if (rc)
    return rc;
  runs = json_object_get(ans, "runs");
  out->items = calloc(json_array_size(runs) + 1, sizeof(*out->items));
  if (!out->items) {
    json_decref(ans);
    return muster_set_error_(c, MUSTER_E_NOMEM, NULL, "out of memory");
  }
  json_array_foreach(runs, i, o) {
    muster_run_info *r = &out->items[out->count++];
    const char *id = json_string_value(json_object_get(o, "id"));
    snprintf(r->id, sizeof(r->id), "%s", id ? id : "");
    r->session = jstr(o, "session");
    r->mode = jstr(o, "mode");
    r->status = jstr(o, "status");
    r->failure = jstr(o, "failure");
    r->created_at = jstr(o, "created_at");
    r->finished_at = jstr(o, "finished_at");
    r->restarts = (int)json_integer_value(json_object_get(o, "restarts"));
    r->max_restarts = (int)json_integer_value(json_object_get(o, "max_restarts"));
    r->nworkers = json_array_size(json_object_get(o, "workers"));
    r->json = json_dumps(o, JSON_COMPACT);
  }
  if (next && json_is_string(json_object_get(ans, "next")))
    snprintf(next, 32, "%s", json_string_value(json_object_get(ans, "next")));
  json_decref(ans);
  return 0;
}

int muster_run_get(muster_client *c, const char *id, char **json) {
  char path[64];
  json_t *ans = NULL;
  int rc;

  *json = NULL;
  rc = run_id_ok(c, id);
  if (rc)
    return rc;
  snprintf(path, sizeof(path), "/api/v1/runs/%s", id);
  rc = muster_json_call_(c, "GET", path, NULL, &ans);
  if (rc)
    return rc;
  *json = json_dumps(ans, JSON_COMPACT);
  json_decref(ans);
  return *json ? 0 : muster_set_error_(c, MUSTER_E_NOMEM, NULL, "out of memory");
}
