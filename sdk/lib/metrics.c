/* metrics.c: a process's metrics, logged without waiting and sent to its
 * run from a thread of its own (muster_log_metrics()), and a run's metrics
 * read back (muster_run_metrics()). See muster.h and docs/design.md,
 * "Metrics". */
#include "client_internal.h"
#include "muster.h"

#include <curl/curl.h>
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* Values waiting at most (logged and not yet sent): past it, new ones are
 * dropped (and counted). */
#define METRICS_KEEP 100000
/* Values sent in one call at most: well under the controller's 20,000 and
 * its 1 MiB body, long names and all. */
#define METRICS_CALL 4000
#define METRICS_NAME_MAX 64

/* One value; first: it begins a point (one muster_log_metrics() call). */
struct mval {
  char name[METRICS_NAME_MAX + 1];
  int first;
  int64_t step;
  double epoch, at, value;
};

/* A growing array of values. */
struct mvals {
  struct mval *v;
  size_t n, cap;
};

struct muster_metrics {
  muster_client *c;
  char path[96];
  long rank;
  double interval_s;
  pthread_t thread;
  pthread_mutex_t lock;
  pthread_cond_t wake;
  int closing, started;
  double close_timeout;
  /* Under the lock: what loggers appended since the sender last took it,
   * what the sender holds unsent (its number), and the counts. */
  struct mvals logged;
  size_t held;
  uint64_t sent, dropped;
  /* The sender's own: values taken and not yet answered, and the call
   * not yet answered (its first k of them and its number, kept for its
   * retry: a call stored whose answer was lost is stored once). */
  struct mvals pending;
  size_t inflight_k;
  int tries; /* times the controller failed it (500) */
  int64_t seq;
  char sender[48];
  int told;
};

static double wall(void) {
  struct timespec ts;

  clock_gettime(CLOCK_REALTIME, &ts);
  return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static int mvals_reserve(struct mvals *a, size_t more) {
  if (a->n + more > a->cap) {
    size_t cap = a->cap ? a->cap : 256;
    struct mval *grown;
    while (cap < a->n + more)
      cap *= 2;
    grown = realloc(a->v, cap * sizeof(*grown));
    if (!grown)
      return -1;
    a->v = grown;
    a->cap = cap;
  }
  return 0;
}

int muster_log_metrics(muster_metrics *m, int64_t step, double epoch, const char *const *names,
                       const double *values, size_t n) {
  size_t len[64];
  double at;

  if (!m || step < 0 || !names || !values || n == 0 || n > 64)
    return MUSTER_E_INVALID;
  /* A name the controller would refuse would cost its whole call. */
  for (size_t i = 0; i < n; i++)
    if (!names[i] || !*names[i] || (len[i] = strlen(names[i])) > METRICS_NAME_MAX ||
        strspn(names[i], "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-/:") !=
            len[i])
      return MUSTER_E_INVALID;
  at = wall();
  pthread_mutex_lock(&m->lock);
  if (m->logged.n + m->held + n > METRICS_KEEP || mvals_reserve(&m->logged, n) != 0) {
    m->dropped += n;
  } else {
    struct mval *v = m->logged.v + m->logged.n;
    for (size_t i = 0; i < n; i++, v++) {
      memcpy(v->name, names[i], len[i] + 1);
      v->first = i == 0;
      v->step = step;
      v->epoch = epoch;
      v->at = at;
      v->value = values[i];
    }
    m->logged.n += n;
  }
  pthread_mutex_unlock(&m->lock);
  return 0;
}

/* The first k pending values, as the API's points. */
static json_t *points_of(muster_metrics *m, size_t k) {
  json_t *pts = json_array(), *pt = NULL, *vals = NULL;

  for (size_t i = 0; i < k; i++) {
    const struct mval *v = &m->pending.v[i];
    if (v->first || !pt) {
      pt = json_object();
      vals = json_object();
      json_object_set_new(pt, "step", json_integer(v->step));
      if (v->epoch >= 0)
        json_object_set_new(pt, "epoch", json_real(v->epoch));
      json_object_set_new(pt, "rank", json_integer(m->rank));
      json_object_set_new(pt, "at", json_real(v->at));
      json_object_set_new(pt, "values", vals);
      json_array_append_new(pts, pt);
    }
    /* JSON carries no NaN or infinity: null, which the controller skips. */
    json_object_set_new(vals, v->name, isfinite(v->value) ? json_real(v->value) : json_null());
  }
  return pts;
}

/* Takes what loggers appended (the lock held): the two arrays trade places
 * when nothing is pending, the usual case. */
static void take_logged(muster_metrics *m) {
  if (m->pending.n == 0) {
    struct mvals t = m->pending;
    m->pending = m->logged;
    m->logged = t;
    m->logged.n = 0;
  } else if (m->logged.n && mvals_reserve(&m->pending, m->logged.n) == 0) {
    memcpy(m->pending.v + m->pending.n, m->logged.v, m->logged.n * sizeof(*m->logged.v));
    m->pending.n += m->logged.n;
    m->logged.n = 0;
  }
  m->held = m->pending.n;
}

/* Sends what is pending, a call at a time, until none is or a call fails
 * (the controller away: the values wait for the next round). Called by the
 * sender's thread alone, without the lock. */
static void send_pending(muster_metrics *m) {
  while (m->pending.n > 0) {
    size_t k = m->inflight_k, sent = 0, dropped = 0;
    char path[192];
    json_t *pts;
    long status;
    int rc;

    /* A new call: whole points only (the next one's first value ends it). */
    if (!k) {
      k = m->pending.n < METRICS_CALL ? m->pending.n : METRICS_CALL;
      while (k < m->pending.n && k > 1 && !m->pending.v[k].first)
        k--;
      m->inflight_k = k;
      m->seq++;
    }
    snprintf(path, sizeof(path), "%s?sender=%s&seq=%lld", m->path, m->sender, (long long)m->seq);
    pts = points_of(m, k);
    rc = muster_json_call_(m->c, "POST", path, pts, NULL);
    status = muster_last_status_(m->c);
    /* Said once on stderr, either way; the training goes on. */
    /* Too large for one call: the same values go again in halves. */
    if (rc && status == 413 && k > 1) {
      m->inflight_k = k / 2;
      continue;
    }
    /* Away, or failing now and then: again next round. A call it fails
     * over and over (500) would hold back every later one: dropped after
     * a few tries. */
    if (rc && (status == 0 || (status >= 500 && !(status == 500 && ++m->tries >= 5)))) {
      if (!m->told)
        fprintf(stderr,
                "muster: could not send metrics (%s); they are kept (up to %d values) and sent "
                "once the controller answers\n",
                muster_client_errmsg(m->c), METRICS_KEEP);
      m->told = 1;
      return;
    }
    if (rc) {
      /* Refused (the run ended, a bad value): those values are dropped. */
      if (!m->told)
        fprintf(stderr, "muster: metrics refused (%s); %zu values dropped\n",
                muster_client_errmsg(m->c), k);
      m->told = 1;
      dropped = k;
    } else {
      m->told = 0;
      sent = k;
    }
    m->inflight_k = 0;
    m->tries = 0;
    memmove(m->pending.v, m->pending.v + k, (m->pending.n - k) * sizeof(*m->pending.v));
    m->pending.n -= k;
    pthread_mutex_lock(&m->lock);
    m->sent += sent;
    m->dropped += dropped;
    m->held = m->pending.n;
    pthread_mutex_unlock(&m->lock);
  }
}

/* One round: take what was logged, send it. */
static void send_round(muster_metrics *m) {
  pthread_mutex_lock(&m->lock);
  take_logged(m);
  pthread_mutex_unlock(&m->lock);
  send_pending(m);
}

static void *sender(void *arg) {
  muster_metrics *m = arg;
  int closing;

  do {
    struct timespec until;
    clock_gettime(CLOCK_MONOTONIC, &until);
    until.tv_sec += (time_t)m->interval_s;
    until.tv_nsec += (long)((m->interval_s - (double)(time_t)m->interval_s) * 1e9);
    if (until.tv_nsec >= 1000000000L) {
      until.tv_sec++;
      until.tv_nsec -= 1000000000L;
    }
    pthread_mutex_lock(&m->lock);
    while (!m->closing && pthread_cond_timedwait(&m->wake, &m->lock, &until) != ETIMEDOUT)
      ;
    closing = m->closing;
    pthread_mutex_unlock(&m->lock);
    if (closing)
      muster_client_set_timeout(m->c, m->close_timeout);
    send_round(m);
  } while (!closing);
  return NULL;
}

static long rank_from_env(void) {
  static const char *const vars[] = {"RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", NULL};

  for (int i = 0; vars[i]; i++) {
    const char *v = getenv(vars[i]);
    char *end;
    long r;
    if (!v || !*v)
      continue;
    errno = 0;
    r = strtol(v, &end, 10);
    if (!errno && !*end && r >= 0 && r <= 1000000)
      return r;
  }
  return 0;
}

int muster_metrics_open(const char *url, const char *run, const char *token, long rank,
                        double interval_s, muster_metrics **out) {
  muster_metrics *m;
  char *esc;
  int rc;

  *out = NULL;
  url = url ? url : getenv("MUSTER_CONTROLLER_URL");
  run = run ? run : getenv("MUSTER_RUN_ID");
  token = token ? token : getenv("MUSTER_RUN_TOKEN");
  if (!url || !*url || !run || !*run || !token || !*token)
    return MUSTER_E_NOT_FOUND;
  m = calloc(1, sizeof(*m));
  if (!m)
    return MUSTER_E_NOMEM;
  rc = muster_client_new(url, token, &m->c);
  esc = rc ? NULL : curl_easy_escape(NULL, run, 0);
  if (rc || !esc ||
      snprintf(m->path, sizeof(m->path), "/api/v1/runs/%s/metrics", esc) >= (int)sizeof(m->path)) {
    curl_free(esc);
    muster_client_free(m->c);
    free(m);
    return rc ? rc : MUSTER_E_INVALID;
  }
  curl_free(esc);
  muster_client_set_timeout(m->c, 10);
  m->rank = rank >= 0 ? rank : rank_from_env();
  {
    unsigned r = 0;
    FILE *f = fopen("/dev/urandom", "rb");
    if (!f || fread(&r, sizeof(r), 1, f) != 1)
      r = (unsigned)time(NULL) ^ (unsigned)(uintptr_t)m;
    if (f)
      fclose(f);
    snprintf(m->sender, sizeof(m->sender), "c-%08x-%ld", r, (long)getpid());
  }
  m->interval_s = interval_s > 0 ? interval_s : 1;
  pthread_mutex_init(&m->lock, NULL);
  {
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&m->wake, &ca);
    pthread_condattr_destroy(&ca);
  }
  if (pthread_create(&m->thread, NULL, sender, m) != 0) {
    muster_metrics_close(m, 0);
    return MUSTER_E_NOMEM;
  }
  m->started = 1;
  *out = m;
  return 0;
}

void muster_metrics_counts(muster_metrics *m, uint64_t *sent, uint64_t *dropped) {
  pthread_mutex_lock(&m->lock);
  if (sent)
    *sent = m->sent;
  if (dropped)
    *dropped = m->dropped;
  pthread_mutex_unlock(&m->lock);
}

void muster_metrics_close(muster_metrics *m, double timeout_s) {
  if (!m)
    return;
  if (m->started) {
    pthread_mutex_lock(&m->lock);
    m->closing = 1;
    /* (the last round's calls wait at most timeout_s; one already on the
     * wire, its own 10 s) */
    m->close_timeout = timeout_s > 0 ? timeout_s : 0.001;
    pthread_cond_signal(&m->wake);
    pthread_mutex_unlock(&m->lock);
    pthread_join(m->thread, NULL);
  }
  pthread_mutex_destroy(&m->lock);
  pthread_cond_destroy(&m->wake);
  muster_client_free(m->c);
  free(m->logged.v);
  free(m->pending.v);
  free(m);
}

int muster_run_metrics(muster_client *c, const char *run, const char *names, int64_t since,
                       int max_points, char **json) {
  char path[512], *esc_run, *esc_names = NULL;
  json_t *ans = NULL;
  int rc, n;

  *json = NULL;
  if (!run || !*run)
    return muster_set_errorf_(c, MUSTER_E_INVALID, "run", "no run given");
  esc_run = curl_easy_escape(NULL, run, 0);
  if (names && *names)
    esc_names = curl_easy_escape(NULL, names, 0);
  n = snprintf(path, sizeof(path), "/api/v1/runs/%s/metrics?since=%lld%s%s", esc_run ? esc_run : "",
               (long long)since, esc_names ? "&names=" : "", esc_names ? esc_names : "");
  if (max_points > 0 && n > 0 && (size_t)n < sizeof(path))
    n += snprintf(path + n, sizeof(path) - (size_t)n, "&max_points=%d", max_points);
  curl_free(esc_run);
  curl_free(esc_names);
  if (n < 0 || (size_t)n >= sizeof(path))
    return muster_set_errorf_(c, MUSTER_E_INVALID, "names", "the names are too long");
  rc = muster_json_call_(c, "GET", path, NULL, &ans);
  if (rc)
    return rc;
  *json = json_dumps(ans, JSON_COMPACT);
  json_decref(ans);
  return *json ? 0 : muster_set_errorf_(c, MUSTER_E_NOMEM, NULL, "out of memory");
}
