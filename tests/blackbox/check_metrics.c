/* check_metrics.c: black-box tests of runs' metrics (docs/design.md,
 * "Metrics"): the real muster-controller and muster-workerd, a worker of a
 * run posting with the run's own token, bounded storage read back
 * downsampled with its extremes, refusals that store nothing, and metrics
 * that go with their run. */
#include "harness.h"

#include "../check_run.h"

#include <check.h>
#include <math.h>
#include <signal.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static struct ctl_proc ctl;

static void start(const char *retain) {
  memset(&ctl, 0, sizeof(ctl));
  ctl.extra[0] = "--cpus";
  ctl.extra[1] = "8";
  if (retain) {
    ctl.extra[2] = "--retain";
    ctl.extra[3] = retain;
  }
  h_start(&ctl);
}

/* A run of session "m" bound to a holder of its lease (the id, static). */
static const char *new_run(void) {
  static char id[16];
  json_t *ans = NULL;

  ck_assert_int_eq(h_http(&ctl, "PUT", "/api/v1/sessions/m/lease",
                          "{\"ttl_seconds\": 60, \"holder\": \"h\"}", "", NULL, NULL),
                   201);
  ck_assert_int_eq(h_http(&ctl, "POST", "/api/v1/runs",
                          "{\"mode\": \"exec\", \"command\": [\"train\"], \"session\": \"m\", "
                          "\"holder\": \"h\"}",
                          "", &ans, NULL),
                   201);
  snprintf(id, sizeof(id), "%s", h_str(ans, "id"));
  json_decref(ans);
  return id;
}

/* POST to run's metrics (query: "" or "?..."). */
static long post_q(const char *run, const char *query, const char *body, const char *token,
                   char **raw) {
  char path[160];

  snprintf(path, sizeof(path), "/api/v1/runs/%s/metrics%s", run, query);
  return h_http(&ctl, "POST", path, body, token, NULL, raw);
}

static long post(const char *run, const char *body, const char *token, char **raw) {
  char path[96];

  snprintf(path, sizeof(path), "/api/v1/runs/%s/metrics", run);
  return h_http(&ctl, "POST", path, body, token, NULL, raw);
}

/* GET the run's metrics with query q ("" for none); asserts 200. */
static json_t *get(const char *run, const char *q) {
  char path[200];
  json_t *ans = NULL;

  snprintf(path, sizeof(path), "/api/v1/runs/%s/metrics%s", run, q);
  ck_assert_int_eq(h_http(&ctl, "GET", path, NULL, "", &ans, NULL), 200);
  return ans;
}

static size_t npoints(json_t *ans) {
  return json_array_size(json_object_get(ans, "points"));
}

/* A worker launched into a run finds MUSTER_RUN_ID and MUSTER_RUN_TOKEN,
 * and posts its metrics with them, as any script of a run would. */
START_TEST(a_runs_worker_posts_with_the_runs_own_token) {
  const char *run;
  char body[1024];
  json_t *ws, *ans, *pt;

  start(NULL);
  run = new_run();
  snprintf(body, sizeof(body),
           "{\"n\": 2, \"cpu\": 0.1, \"session\": \"m\", \"run\": \"%s\", \"kernel\": \"sh\", "
           "\"code\": \"curl -sS -f -H \\\"Authorization: Bearer $MUSTER_RUN_TOKEN\\\" -d "
           "'{\\\"step\\\": 7, \\\"values\\\": {\\\"loss\\\": 0.25}}' "
           "\\\"$MUSTER_CONTROLLER_URL/api/v1/runs/$MUSTER_RUN_ID/metrics\\\" && echo posted\"}",
           run);
  ws = h_launch(&ctl, body);
  ans = h_await(&ctl, ws, 1, 60);
  ck_assert_msg(json_array_size(json_object_get(ans, "workers")) == 2,
                "the run's workers did not both succeed: %s", json_dumps(ans, 0));
  json_decref(ans);
  ans = get(run, "");
  ck_assert_int_eq(npoints(ans), 2); /* each posted a point of rank 0's step 7 */
  pt = json_array_get(json_object_get(ans, "points"), 0);
  ck_assert_int_eq(json_integer_value(json_object_get(pt, "step")), 7);
  ck_assert(fabs(json_number_value(json_object_get(json_object_get(pt, "values"), "loss")) - 0.25) <
            1e-9);
  ck_assert_int_eq(json_integer_value(json_object_get(pt, "n")), 0); /* not a merged bucket */
  json_decref(ans);
  json_decref(ws);
  h_finish(&ctl);
}
END_TEST

/* 100,000 points of one series are kept as at most 2,000 rows, and a read
 * of at most 100 points per series still holds its true least and greatest
 * value, and its last. */
START_TEST(a_hundred_thousand_points_read_back_as_a_hundred_with_their_extremes) {
  const char *run;
  json_t *ans, *pt;
  size_t i;
  double lo = INFINITY, hi = -INFINITY;
  size_t cap = 10000 * 64 + 16;
  char *body = malloc(cap);
  int step = 0;

  start(NULL);
  run = new_run();
  for (int batch = 0; batch < 10; batch++) {
    size_t len = 0;
    len += (size_t)snprintf(body + len, cap - len, "[");
    for (int k = 0; k < 10000; k++, step++) {
      double v = sin(step / 100.0);
      if (step == 31337)
        v = -5;
      if (step == 77777)
        v = 7;
      len += (size_t)snprintf(body + len, cap - len, "%s{\"step\":%d,\"values\":{\"loss\":%.6f}}",
                              k ? "," : "", step, v);
    }
    snprintf(body + len, cap - len, "]");
    ck_assert_int_eq(post(run, body, "", NULL), 204);
  }
  free(body);
  ans = get(run, "?max_points=100");
  ck_assert_int_le(npoints(ans), 100);
  ck_assert_int_ge(npoints(ans), 50);
  json_array_foreach(json_object_get(ans, "points"), i, pt) {
    json_t *mn = json_object_get(json_object_get(pt, "min"), "loss");
    json_t *mx = json_object_get(json_object_get(pt, "max"), "loss");
    double v = json_number_value(json_object_get(json_object_get(pt, "values"), "loss"));
    lo = fmin(lo, mn ? json_number_value(mn) : v);
    hi = fmax(hi, mx ? json_number_value(mx) : v);
  }
  ck_assert_msg(lo == -5 && hi == 7, "the extremes read back were %g and %g, not -5 and 7", lo, hi);
  pt = json_array_get(json_object_get(ans, "points"), npoints(ans) - 1);
  ck_assert_int_eq(json_integer_value(json_object_get(pt, "step")), 99999);
  json_decref(ans);
  /* All of it: the stored rows, bounded. */
  ans = get(run, "");
  ck_assert_int_le(npoints(ans), 2000);
  ck_assert_int_ge(npoints(ans), 1000);
  json_decref(ans);
  /* The run's latest value, as runs show it. */
  {
    char path[64];
    json_t *r = NULL, *latest;
    snprintf(path, sizeof(path), "/api/v1/runs/%s", run);
    ck_assert_int_eq(h_http(&ctl, "GET", path, NULL, "", &r, NULL), 200);
    latest = json_object_get(json_object_get(r, "latest"), "loss");
    ck_assert_int_eq(json_integer_value(json_object_get(latest, "step")), 99999);
    json_decref(r);
  }
  h_finish(&ctl);
}
END_TEST

/* since= returns only what was written after an earlier answer. */
START_TEST(since_follows_new_points) {
  const char *run;
  json_t *ans;
  char q[64];
  long long next;

  start(NULL);
  run = new_run();
  ck_assert_int_eq(post(run,
                        "[{\"step\": 1, \"rank\": 0, \"values\": {\"loss\": 1, \"acc\": 0.1}}, "
                        "{\"step\": 1, \"rank\": 1, \"epoch\": 0.5, \"values\": {\"loss\": 2}}]",
                        "", NULL),
                   204);
  ans = get(run, "");
  ck_assert_int_eq(npoints(ans), 3);
  next = (long long)json_integer_value(json_object_get(ans, "next_since"));
  json_decref(ans);
  ck_assert_int_eq(post(run, "{\"step\": 2, \"values\": {\"loss\": 0.5}}", "", NULL), 204);
  snprintf(q, sizeof(q), "?since=%lld", next);
  ans = get(run, q);
  ck_assert_int_eq(npoints(ans), 1);
  ck_assert_int_eq(json_integer_value(
                       json_object_get(json_array_get(json_object_get(ans, "points"), 0), "step")),
                   2);
  json_decref(ans);
  ans = get(run, "?names=acc");
  ck_assert_int_eq(npoints(ans), 1);
  json_decref(ans);
  h_finish(&ctl);
}
END_TEST

/* A sender's retry of a call that was stored (its answer lost) is stored
 * once; its next call is stored. */
START_TEST(a_retried_call_is_stored_once) {
  static const char one[] = "{\"step\": 1, \"values\": {\"loss\": 1}}";
  const char *run;
  json_t *ans;

  start(NULL);
  run = new_run();
  ck_assert_int_eq(post_q(run, "?sender=py-1&seq=1", one, "", NULL), 204);
  ck_assert_int_eq(post_q(run, "?sender=py-1&seq=1", one, "", NULL), 204);
  ck_assert_int_eq(post_q(run, "?sender=py-1&seq=2", one, "", NULL), 204);
  /* Another sender's first call is its own. */
  ck_assert_int_eq(post_q(run, "?sender=py-2&seq=1", one, "", NULL), 204);
  ans = get(run, "");
  ck_assert_int_eq(npoints(ans), 3);
  json_decref(ans);
  ck_assert_int_eq(post_q(run, "?sender=py-1", one, "", NULL), 422);
  h_finish(&ctl);
}
END_TEST

/* The count of "data: " events in file path so far. */
static int events_in(const char *path) {
  FILE *f = fopen(path, "r");
  char line[65536];
  int n = 0;

  while (f && fgets(line, sizeof(line), f))
    n += strncmp(line, "data: ", 6) == 0;
  if (f)
    fclose(f);
  return n;
}

/* Waits up to timeout_s for file path to hold want events. */
static int wait_events(const char *path, int want, double timeout_s) {
  double until = h_now() + timeout_s;

  while (events_in(path) < want && h_now() < until)
    usleep(20 * 1000);
  return events_in(path) >= want;
}

/* A followed read gets the points so far, then each call's new points as
 * they are committed, and ends when the run ends. */
START_TEST(a_followed_read_gets_new_points_as_they_come_and_ends_with_the_run) {
  const char *run;
  char file[300], path[96];
  pid_t curl;
  int status = 0;
  double until;

  start(NULL);
  run = new_run();
  ck_assert_int_eq(post(run, "{\"step\": 1, \"values\": {\"loss\": 1}}", "", NULL), 204);
  snprintf(file, sizeof(file), "%s/follow.out", ctl.dir);
  curl = h_sh_bg("exec curl -sN -H 'Authorization: Bearer %s' '%s/api/v1/runs/%s/metrics?follow=1' "
                 "> %s",
                 ctl.token, ctl.url, run, file);
  ck_assert_msg(wait_events(file, 1, 20), "no first event in 20 s");
  ck_assert_int_eq(post(run, "{\"step\": 2, \"values\": {\"loss\": 0.5}}", "", NULL), 204);
  ck_assert_msg(wait_events(file, 2, 10),
                "the new point did not come in 10 s (a keepalive is 15 s)");
  ck_assert_int_eq(post(run, "{\"step\": 3, \"values\": {\"loss\": 0.25}}", "", NULL), 204);
  ck_assert_msg(wait_events(file, 3, 10), "the next point did not come in 10 s");
  snprintf(path, sizeof(path), "/api/v1/runs/%s/end", run);
  ck_assert_int_eq(h_http(&ctl, "POST", path, "{\"status\": \"succeeded\"}", "", NULL, NULL), 200);
  until = h_now() + 10;
  while (waitpid(curl, &status, WNOHANG) == 0 && h_now() < until)
    usleep(20 * 1000);
  if (h_now() >= until) {
    kill(curl, SIGKILL);
    waitpid(curl, &status, 0);
    ck_abort_msg("the followed read did not end within 10 s of the run's end");
  }
  ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0, "curl ended with %d", status);
  ck_assert_int_eq(events_in(file), 3);
  h_finish(&ctl);
}
END_TEST

/* Each bad call is refused with a sentence naming what is wrong, and none
 * of its points is stored, not even the good ones before the bad one. */
START_TEST(bad_points_are_refused_and_none_of_their_batch_is_stored) {
  static const struct {
    const char *body, *words;
    long status;
  } bad[] = {
      {"[{\"step\": 1, \"values\": {\"loss\": 1}}, {\"values\": {\"loss\": 1}}]", "point 1: step",
       422},
      {"{\"step\": -1, \"values\": {\"loss\": 1}}", "step must be", 422},
      {"{\"step\": 1, \"values\": {\"loss\": \"high\"}}", "loss must be a number", 422},
      {"{\"step\": 1, \"values\": {\"lo ss\": 1}}", "is not a metric's name", 422},
      {"{\"step\": 1, \"values\": {}}", "values must be", 422},
      {"{\"step\": 1, \"values\": {\"loss\": 1}, \"wall\": 3}", "unknown field \\\"wall\\\"", 422},
      {"{\"step\": 1, \"at\": 1, \"values\": {\"loss\": 1}}", "at must be", 422},
      {"{\"step\": 1, \"values\": {\"loss\": NaN}}", "not JSON", 400},
  };
  const char *run;
  json_t *ans;
  char *raw = NULL, path[96];

  start(NULL);
  run = new_run();
  for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
    long st = post(run, bad[i].body, "", &raw);
    ck_assert_msg(st == bad[i].status && raw && strstr(raw, bad[i].words),
                  "%s answered %ld %s, not %ld naming \"%s\"", bad[i].body, st, raw, bad[i].status,
                  bad[i].words);
    free(raw);
    raw = NULL;
  }
  ans = get(run, "");
  ck_assert_int_eq(npoints(ans), 0);
  json_decref(ans);
  /* No token, another run's token, a run that is not there. */
  ck_assert_int_eq(post(run, "{\"step\": 1, \"values\": {\"loss\": 1}}", NULL, NULL), 401);
  ck_assert_int_eq(post(run, "{\"step\": 1, \"values\": {\"loss\": 1}}",
                        "mr_000000000000000000000000000000000000000000000000", NULL),
                   401);
  ck_assert_int_eq(post("r-nosuchrun1", "{\"step\": 1, \"values\": {\"loss\": 1}}", "", NULL), 404);
  /* An ended run takes no more. */
  snprintf(path, sizeof(path), "/api/v1/runs/%s/end", run);
  ck_assert_int_eq(h_http(&ctl, "POST", path, "{\"status\": \"succeeded\"}", "", NULL, NULL), 200);
  ck_assert_int_eq(post(run, "{\"step\": 1, \"values\": {\"loss\": 1}}", "", &raw), 409);
  ck_assert_msg(strstr(raw, "has ended"), "%s", raw);
  free(raw);
  h_finish(&ctl);
}
END_TEST

static int count_rows(const char *db_path, const char *sql) {
  sqlite3 *db = NULL;
  sqlite3_stmt *s = NULL;
  int n = -1;

  ck_assert_int_eq(sqlite3_open_v2(db_path, &db, SQLITE_OPEN_READONLY, NULL), SQLITE_OK);
  ck_assert_int_eq(sqlite3_prepare_v2(db, sql, -1, &s, NULL), SQLITE_OK);
  if (sqlite3_step(s) == SQLITE_ROW)
    n = sqlite3_column_int(s, 0);
  sqlite3_finalize(s);
  sqlite3_close(db);
  return n;
}

/* The retention pruner takes an ended run's metrics with it. */
START_TEST(metrics_are_pruned_with_their_run) {
  const char *run;
  char path[96], db_path[200];
  int gone = 0;

  start("2");
  run = new_run();
  ck_assert_int_eq(post(run, "{\"step\": 1, \"values\": {\"loss\": 1, \"acc\": 0.5}}", "", NULL),
                   204);
  snprintf(path, sizeof(path), "/api/v1/runs/%s/end", run);
  ck_assert_int_eq(h_http(&ctl, "POST", path, "{\"status\": \"succeeded\"}", "", NULL, NULL), 200);
  snprintf(path, sizeof(path), "/api/v1/runs/%s", run);
  for (int i = 0; i < 60 && !gone; i++) {
    gone = h_http(&ctl, "GET", path, NULL, "", NULL, NULL) == 404;
    if (!gone)
      usleep(250 * 1000);
  }
  ck_assert_msg(gone, "run %s was still there 15 s after it ended (--retain 2)", run);
  snprintf(db_path, sizeof(db_path), "%s/muster.db", ctl.dir);
  ck_assert_int_eq(count_rows(db_path, "SELECT count(*) FROM metric_series"), 0);
  ck_assert_int_eq(count_rows(db_path, "SELECT count(*) FROM metric_points"), 0);
  h_finish(&ctl);
}
END_TEST

int main(void) {
  Suite *s = suite_create("metrics");
  TCase *tc = tcase_create("metrics");

  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, a_runs_worker_posts_with_the_runs_own_token);
  tcase_add_test(tc, a_hundred_thousand_points_read_back_as_a_hundred_with_their_extremes);
  tcase_add_test(tc, since_follows_new_points);
  tcase_add_test(tc, a_retried_call_is_stored_once);
  tcase_add_test(tc, a_followed_read_gets_new_points_as_they_come_and_ends_with_the_run);
  tcase_add_test(tc, bad_points_are_refused_and_none_of_their_batch_is_stored);
  tcase_add_test(tc, metrics_are_pruned_with_their_run);
  suite_add_tcase(s, tc);
  return check_run(s);
}
