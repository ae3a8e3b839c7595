/* api_metrics.c: runs' metrics: POST /api/v1/runs/{run}/metrics (the run's
 * processes, with the run's own token, or its user) and GET (see
 * api_internal.h and docs/design.md, "Metrics"). */
#include "api_metrics.h"
#include "api_internal.h"
#include "api_scope.h"
#include "job_secret.h"
#include "log.h"
#include "muster_errors.h"
#include "state.h"
#include "validate.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* The most values a call posts. */
#define METRICS_MAX_VALUES 20000

/* The route's check: the bearer token is run id's own. */
static int run_token_check(struct MHD_Connection *c, const char *id) {
  char want[RUN_TOKEN_LEN + 1];
  const char *t = api_bearer(c);
  int ok;

  if (!t)
    return MUSTER_E_UNAUTHORIZED;
  if (!validate_run_id(id) || run_token(g.api_token, id, want) != 0)
    return MUSTER_E_FORBIDDEN;
  ok = util_secret_equal(t, want);
  explicit_bzero(want, sizeof(want));
  return ok ? 0 : MUSTER_E_FORBIDDEN;
}

static int name_ok(const char *s) {
  size_t n = strlen(s);

  if (n == 0 || n > METRIC_NAME_MAX)
    return 0;
  for (; *s; s++)
    if (!((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') || (*s >= '0' && *s <= '9') ||
          strchr("_.-/:", *s)))
      return 0;
  return 1;
}

/* Why point pt (the i-th) is not one, into why; 0 if it is. Its values
 * are appended to v (*n of them; cap at most). */
static int read_point(json_t *pt, size_t i, double now, struct db_metric_in *v, size_t *n,
                      size_t cap, char *why, size_t wlen) {
  static const char *const known[] = {"step", "epoch", "rank", "at", "values"};
  json_t *step = json_object_get(pt, "step"), *epoch = json_object_get(pt, "epoch"),
         *rank = json_object_get(pt, "rank"), *at = json_object_get(pt, "at"),
         *values = json_object_get(pt, "values"), *val;
  const char *key;

  if (!json_is_object(pt))
    return snprintf(why, wlen, "point %zu is not an object", i), -1;
  json_object_foreach(pt, key, val) {
    size_t j = 0;
    while (j < 5 && strcmp(key, known[j]) != 0)
      j++;
    if (j == 5)
      return snprintf(why, wlen,
                      "point %zu has an unknown field \"%.40s\" (known: step, epoch, rank, at, "
                      "values)",
                      i, key),
             -1;
  }
  if (!json_is_integer(step) || json_integer_value(step) < 0)
    return snprintf(why, wlen, "point %zu: step must be an integer, 0 or more", i), -1;
  if (epoch && !json_is_null(epoch) && !json_is_number(epoch))
    return snprintf(why, wlen, "point %zu: epoch must be a number", i), -1;
  if (rank && (!json_is_integer(rank) || json_integer_value(rank) < 0 ||
               json_integer_value(rank) > 1000000))
    return snprintf(why, wlen, "point %zu: rank must be an integer from 0 to 1000000", i), -1;
  if (at && (!json_is_number(at) || json_number_value(at) < now - 366 * 86400.0 ||
             json_number_value(at) > now + 86400.0))
    return snprintf(why, wlen,
                    "point %zu: at must be the time it was logged, in seconds since 1970 "
                    "(within the last year)",
                    i),
           -1;
  if (!json_is_object(values) || json_object_size(values) == 0 ||
      json_object_size(values) > METRICS_POINT_NAMES)
    return snprintf(why, wlen, "point %zu: values must be an object of 1 to %d names and numbers",
                    i, METRICS_POINT_NAMES),
           -1;
  json_object_foreach(values, key, val) {
    if (!name_ok(key))
      return snprintf(why, wlen,
                      "point %zu: \"%.40s\" is not a metric's name (1 to %d letters, digits and "
                      "_.-/:)",
                      i, key, METRIC_NAME_MAX),
             -1;
    if (json_is_null(val))
      continue; /* a NaN or infinity, which JSON cannot carry */
    if (!json_is_number(val) || !isfinite(json_number_value(val)))
      return snprintf(why, wlen, "point %zu: %s must be a number", i, key), -1;
    if (*n >= cap)
      return snprintf(why, wlen, "a call posts at most %d values", METRICS_MAX_VALUES), -2;
    v[*n] = (struct db_metric_in){key,
                                  rank ? json_integer_value(rank) : 0,
                                  json_integer_value(step),
                                  json_is_number(epoch) ? json_number_value(epoch) : 0,
                                  json_is_number(epoch),
                                  at ? json_number_value(at) : now,
                                  json_number_value(val)};
    (*n)++;
  }
  return 0;
}

static double now_s(void) {
  struct timespec ts;

  clock_gettime(CLOCK_REALTIME, &ts);
  return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static enum MHD_Result api_metrics_post(struct MHD_Connection *c, struct req *rq, const char *id) {
  json_t *body, *points, *pt;
  struct db_metric_in *v = NULL;
  size_t n = 0, i, cap = 0;
  char why[200], status[16], session[SESSION_STORED_MAX];
  double now = now_s();
  enum MHD_Result ret = MHD_NO;
  json_error_t jerr;
  int rc, dup = 0;

  const char *sender = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "sender");
  const char *seq_arg = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "seq");
  long seq = 0;

  if (!rq->run_token && (!validate_run_id(id) || !api_sees_run(rq, id)))
    return api_respond_error(c, MUSTER_E_NOT_FOUND, "id", "there is no run %.40s", id);
  if ((sender != NULL) != (seq_arg != NULL) ||
      (sender && (!name_ok(sender) || util_parse_long(seq_arg, 1, 0x7fffffffffffffffL, &seq))))
    return api_respond_error(c, MUSTER_E_INVALID, "sender",
                             "sender (a name of 1 to %d letters, digits and _.-/:) and seq (a "
                             "number from 1) go together",
                             METRIC_NAME_MAX);
  body = json_loadb(rq->body ? rq->body : "", rq->len, JSON_REJECT_DUPLICATES, &jerr);
  if (!body)
    return api_respond_error(c, MUSTER_E_MALFORMED, NULL, "the body is not JSON: %s", jerr.text);
  points = json_is_array(body) ? body : NULL;
  if (!points) {
    points = json_array();
    json_array_append(points, body);
    json_decref(body);
    body = points;
  }
  json_array_foreach(points, i, pt) {
    json_t *vals = json_object_get(pt, "values");
    cap += json_is_object(vals) ? json_object_size(vals) : 0;
  }
  if (cap > METRICS_MAX_VALUES)
    cap = METRICS_MAX_VALUES + 1;
  v = calloc(cap + 1, sizeof(*v));
  if (!v) {
    ret = api_respond_error(c, MUSTER_E_NOMEM, NULL, NULL);
    goto out;
  }
  json_array_foreach(points, i, pt) {
    rc = read_point(pt, i, now, v, &n, cap > METRICS_MAX_VALUES ? METRICS_MAX_VALUES : cap, why,
                    sizeof(why));
    if (rc) {
      ret = api_respond_error(c, MUSTER_E_INVALID, rc == -2 ? NULL : "points", "%s", why);
      goto out;
    }
  }
  if (n == 0) {
    ret = api_respond_empty(c, MHD_HTTP_NO_CONTENT);
    goto out;
  }
  state_lock();
  rc = db_begin(g.db);
  if (!rc) {
    rc = db_run_state(g.db, id, status, sizeof(status), session, sizeof(session));
    if (!rc && strcmp(status, "running") != 0)
      rc = MUSTER_E_CONFLICT;
  }
  /* A retry of a call that was stored (its answer lost) is not stored
   * twice. */
  if (!rc && sender) {
    rc = db_metrics_seen(g.db, id, sender, seq);
    if (rc == 1) {
      dup = 1;
      rc = 0;
    }
  }
  if (!rc && !dup)
    rc = db_metrics_add(g.db, id, v, n);
  if (!rc)
    rc = db_commit(g.db);
  if (rc) {
    if (rc == MUSTER_E_DB)
      LOG(LOG_ERROR, "could not store run %s's metrics: %s", id, db_errmsg(g.db));
    db_rollback(g.db);
  } else if (!dup) {
    streams_wake_logs_locked(id); /* its followers (api_metrics_follow.c) */
  }
  state_unlock();
  if (rc == MUSTER_E_NOT_FOUND)
    ret = api_respond_error(c, rc, "id", "there is no run %.40s", id);
  else if (rc == MUSTER_E_CONFLICT)
    ret = api_respond_error(c, rc, "status", "run %s has ended (%s): it takes no more metrics", id,
                            status);
  else if (rc == MUSTER_E_INVALID)
    ret = api_respond_error(c, rc, "values",
                            "run %s would have more than %d series (names times ranks)", id,
                            METRIC_RUN_SERIES);
  else if (rc)
    ret = api_respond_error(c, MUSTER_E_DB, NULL, "run %s's metrics could not be stored", id);
  else
    ret = api_respond_empty(c, MHD_HTTP_NO_CONTENT);
out:
  free(v);
  json_decref(body);
  return ret;
}

/* Splits list (a comma list of names) into names (at most max). Returns
 * their number, or -1 when one is no name. */
static int split_names(char *list, const char **names, int max) {
  int n = 0;

  for (char *save = NULL, *t = strtok_r(list, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
    if (!name_ok(t) || n == max)
      return -1;
    names[n++] = t;
  }
  return n;
}

static enum MHD_Result api_metrics_get(struct MHD_Connection *c, struct req *rq, const char *id) {
  const char *names_arg = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "names");
  const char *since_arg = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "since");
  const char *max_arg = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "max_points");
  struct db_metric_query q = {NULL, 0, 0, METRIC_SERIES_ROWS};
  const char *names[METRICS_POINT_NAMES];
  char list[METRICS_LIST_MAX];
  const char *follow = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "follow");
  struct reader *rd;
  char *text = NULL;
  size_t len = 0;
  FILE *out;
  int64_t next = 0;
  long v;
  int rc;

  if (!validate_run_id(id) || !api_sees_run(rq, id))
    return api_respond_error(c, MUSTER_E_NOT_FOUND, "id", "there is no run %.40s", id);
  if (names_arg && *names_arg) {
    int k;
    if (snprintf(list, sizeof(list), "%s", names_arg) >= (int)sizeof(list) ||
        (k = split_names(list, names, METRICS_POINT_NAMES)) <= 0)
      return api_respond_error(c, MUSTER_E_INVALID, "names",
                               "names must be a comma list of at most %d metrics' names",
                               METRICS_POINT_NAMES);
    q.names = names;
    q.nnames = (size_t)k;
  }
  if (since_arg && *since_arg) {
    if (util_parse_long(since_arg, 0, 0x7fffffffffffffffL, &v) != 0)
      return api_respond_error(c, MUSTER_E_INVALID, "since",
                               "since must be the next_since of an earlier answer");
    q.since = v;
  }
  if (max_arg && *max_arg) {
    if (util_parse_long(max_arg, 1, 100000, &v) != 0)
      return api_respond_error(c, MUSTER_E_INVALID, "max_points", "max_points must be 1 to 100000");
    q.max_points = (int)v;
  }
  if (follow && strcmp(follow, "1") == 0)
    return api_metrics_follow(c, id, q.names ? names_arg : NULL, &q);
  out = open_memstream(&text, &len);
  if (!out)
    return api_respond_error(c, MUSTER_E_NOMEM, NULL, NULL);
  fputs("{\"points\":[", out);
  rd = api_reader_get();
  rc = db_metrics_query(rd->db, id, &q, out, &next);
  api_reader_put(rd);
  fprintf(out, "],\"next_since\":%lld}", (long long)next);
  if (fclose(out) != 0 || rc) {
    free(text);
    return api_respond_error(c, rc ? rc : MUSTER_E_NOMEM, NULL, "could not read run %s's metrics",
                             id);
  }
  return api_respond_text(c, MHD_HTTP_OK, text, len);
}

/* The routes of this file (api_routes.c lists the table). */
const struct api_route api_metrics_routes[] = {
    {"POST", "/api/v1/runs/{run}/metrics", AUTH_RUN, api_metrics_post, run_token_check},
    {"GET", "/api/v1/runs/{run}/metrics", AUTH_CLIENT, api_metrics_get, NULL},
    {NULL, NULL, AUTH_NONE, NULL, NULL},
};
