/* check_leases.c: black-box tests of sessions' leases as the union of
 * their holders' parts, and of runs bound to their holder: the real
 * muster-controller and muster-workerd, driven through the REST API. The
 * ttls under test are the shortest (3 s); each wait is bounded and names
 * what it waited for. */
#include "harness.h"

#include "../check_run.h"

#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static struct ctl_proc ctl;

static void start(void) {
  memset(&ctl, 0, sizeof(ctl));
  ctl.extra[0] = "--cpus";
  ctl.extra[1] = "8";
  h_start(&ctl);
}

/* PUT session's lease for holder; returns the status, *out the answer. */
static long put(const char *session, const char *holder, int ttl, int stop_workers, json_t **out) {
  char path[160], body[200];

  snprintf(path, sizeof(path), "/api/v1/sessions/%s/lease", session);
  snprintf(body, sizeof(body), "{\"ttl_seconds\": %d, \"holder\": \"%s\", \"stop_workers\": %s}",
           ttl, holder, stop_workers ? "true" : "false");
  return h_http(&ctl, "PUT", path, body, "", out, NULL);
}

/* A part taken for as long as a loaded machine may need to launch its
 * session's worker: a test about a short ttl renews it with that one once
 * the worker runs (a 3 s part taken first could run out before). */
#define SETUP_TTL 600

/* DELETE holder's part; returns the status, *out the answer. */
static long give_back(const char *session, const char *holder, int stop_workers, json_t **out) {
  char path[200];

  snprintf(path, sizeof(path), "/api/v1/sessions/%s/lease?holder=%s%s", session, holder,
           stop_workers ? "&stop_workers=1" : "");
  return h_http(&ctl, "DELETE", path, NULL, "", out, NULL);
}

/* One running worker of session (the id, static). */
static const char *running_worker(const char *session, const char *run) {
  static char id[16];
  char body[200];
  json_t *ws;

  snprintf(body, sizeof(body),
           "{\"n\": 1, \"cpu\": 0.1, \"session\": \"%s\"%s%s%s, \"kernel\": \"sh\", "
           "\"code\": \"sleep 600\"}",
           session, run ? ", \"run\": \"" : "", run ? run : "", run ? "\"" : "");
  ws = h_launch(&ctl, body);
  snprintf(id, sizeof(id), "%s", h_str(json_array_get(ws, 0), "id"));
  json_decref(ws);
  json_decref(h_wait_status(&ctl, id, "running", 30));
  return id;
}

/* A run of session bound to holder (the id, static). */
static const char *new_run(const char *session, const char *holder) {
  static char id[16];
  char body[200];
  json_t *ans = NULL;
  long st;

  snprintf(body, sizeof(body),
           "{\"mode\": \"exec\", \"command\": [\"true\"], \"session\": \"%s\", \"holder\": "
           "\"%s\"}",
           session, holder);
  st = h_http(&ctl, "POST", "/api/v1/runs", body, "", &ans, NULL);
  ck_assert_msg(st == 201, "POST /api/v1/runs answered %ld", st);
  snprintf(id, sizeof(id), "%s", h_str(ans, "id"));
  json_decref(ans);
  return id;
}

/* Waits up to timeout_s for run id to leave status running; returns it. */
static json_t *wait_run_ended(const char *id, double timeout_s) {
  char path[64];
  double until = h_now() + timeout_s;
  json_t *run = NULL;

  snprintf(path, sizeof(path), "/api/v1/runs/%s", id);
  for (;;) {
    json_decref(run);
    run = NULL;
    ck_assert_int_eq(h_http(&ctl, "GET", path, NULL, "", &run, NULL), 200);
    if (strcmp(h_str(run, "status"), "running") != 0)
      return run;
    ck_assert_msg(h_now() < until, "run %s still running after %.0f s", id, timeout_s);
    usleep(100 * 1000); /* a poll's pace, not a wait for the event */
  }
}

/* Holder A gives its part back: holder B's next renewal is a renewal (200),
 * not "the lease expired and the workers were stopped", and the workers
 * still run. */
START_TEST(another_holders_give_back_leaves_my_lease_and_workers) {
  json_t *ans = NULL, *w;
  const char *id;

  start();
  ck_assert_int_eq(put("nb", "holder-a", SETUP_TTL, 1, &ans), 201);
  ck_assert_str_eq(h_str(ans, "previous"), "none");
  json_decref(ans);
  ck_assert_int_eq(put("nb", "holder-b", SETUP_TTL, 1, NULL), 201);
  id = running_worker("nb", NULL);
  ck_assert_int_eq(give_back("nb", "holder-a", 0, &ans), 200);
  ck_assert_msg(json_is_object(json_object_get(ans, "lease")),
                "after A gave its part back, B's part is still the session's lease");
  json_decref(ans);
  ck_assert_int_eq(put("nb", "holder-b", SETUP_TTL, 1, &ans), 200);
  ck_assert_ptr_null(json_object_get(ans, "previous"));
  json_decref(ans);
  w = h_worker(&ctl, id);
  ck_assert_str_eq(h_str(w, "status"), "running");
  json_decref(w);
  h_finish(&ctl);
}
END_TEST

/* A clean close of holder A (stop_workers) while holder B still holds its
 * part: B's workers stay; B's own clean close then stops them. */
START_TEST(a_clean_close_leaves_the_workers_another_holder_keeps) {
  json_t *ans = NULL, *w;
  const char *id;

  start();
  ck_assert_int_eq(put("shared", "holder-a", SETUP_TTL, 1, NULL), 201);
  ck_assert_int_eq(put("shared", "holder-b", SETUP_TTL, 1, NULL), 201);
  id = running_worker("shared", NULL);
  ck_assert_int_eq(give_back("shared", "holder-a", 1, &ans), 200);
  ck_assert(json_is_null(json_object_get(ans, "stopped")));
  json_decref(ans);
  w = h_worker(&ctl, id);
  ck_assert_str_eq(h_str(w, "status"), "running");
  json_decref(w);
  ck_assert_int_eq(give_back("shared", "holder-b", 1, &ans), 200);
  ck_assert_int_eq(json_integer_value(json_object_get(ans, "stopped")), 1);
  ck_assert(json_is_null(json_object_get(ans, "lease")));
  json_decref(ans);
  w = h_wait_status(&ctl, id, "stopped", 30);
  ck_assert_str_eq(h_str(w, "failure"), "stopped: its client ended the session's lease");
  json_decref(w);
  h_finish(&ctl);
}
END_TEST

/* A 3 s holder that dies is noticed within its own ttl, even while a
 * one-day holder keeps the session: its run fails, saying its client is
 * gone; the workers the other holder keeps still run. */
START_TEST(a_short_holders_death_ends_its_run_within_its_own_ttl) {
  json_t *run, *w;
  const char *rid, *id;
  char run_id[16];
  double t0;

  start();
  ck_assert_int_eq(put("long", "day-holder", 86400, 1, NULL), 201);
  ck_assert_int_eq(put("long", "short-holder", SETUP_TTL, 1, NULL), 201);
  rid = new_run("long", "short-holder");
  snprintf(run_id, sizeof(run_id), "%s", rid);
  id = running_worker("long", run_id);
  ck_assert_int_eq(put("long", "short-holder", 3, 1, NULL), 200);
  t0 = h_now();
  /* short-holder never renews from here on. */
  run = wait_run_ended(run_id, 3 + 15);
  ck_assert_str_eq(h_str(run, "status"), "failed");
  ck_assert_str_eq(h_str(run, "failure"),
                   "the client that ran it is gone: its part of the session's lease expired");
  ck_assert_msg(h_now() - t0 < 3 + 10, "noticed %.1f s after (ttl 3 s)", h_now() - t0);
  json_decref(run);
  w = h_worker(&ctl, id);
  ck_assert_str_eq(h_str(w, "status"), "running");
  json_decref(w);
  h_finish(&ctl);
}
END_TEST

/* When the last holder is gone the workers stop; a holder whose part ran
 * out earlier is told so at its next renewal (201, previous "expired",
 * workers_stopped). */
START_TEST(the_workers_stop_with_the_last_holder_and_each_is_told) {
  json_t *ans = NULL, *w;
  const char *id;

  start();
  ck_assert_int_eq(put("both", "first", SETUP_TTL, 1, NULL), 201);
  ck_assert_int_eq(put("both", "second", SETUP_TTL, 1, NULL), 201);
  id = running_worker("both", NULL);
  ck_assert_int_eq(put("both", "first", 3, 1, NULL), 200);
  ck_assert_int_eq(put("both", "second", 4, 1, NULL), 200);
  w = h_wait_status(&ctl, id, "stopped", 4 + 15);
  ck_assert_str_eq(h_str(w, "failure"), "stopped: the session's lease expired");
  json_decref(w);
  ck_assert_int_eq(put("both", "first", 3, 1, &ans), 201);
  ck_assert_str_eq(h_str(ans, "previous"), "expired");
  ck_assert(json_is_true(json_object_get(ans, "workers_stopped")));
  json_decref(ans);
  ck_assert_int_eq(put("both", "never-held", 3, 1, &ans), 201);
  ck_assert_str_eq(h_str(ans, "previous"), "none");
  ck_assert(json_is_false(json_object_get(ans, "workers_stopped")));
  json_decref(ans);
  h_finish(&ctl);
}
END_TEST

/* `muster run --no-lease`: its client holds a part that keeps no workers.
 * When the client dies the run fails (and takes no more workers), the
 * workers are left running as asked. */
START_TEST(a_run_without_a_lease_ends_when_its_client_is_gone) {
  char body[200], run_id[16];
  json_t *run, *w, *ans = NULL;
  const char *id;
  long st;

  start();
  ck_assert_int_eq(put("free", "no-lease-run", SETUP_TTL, 0, &ans), 201);
  ck_assert(json_is_false(json_object_get(ans, "stops_workers")));
  json_decref(ans);
  snprintf(run_id, sizeof(run_id), "%s", new_run("free", "no-lease-run"));
  id = running_worker("free", run_id);
  ck_assert_int_eq(put("free", "no-lease-run", 3, 0, NULL), 200);
  run = wait_run_ended(run_id, 3 + 15);
  ck_assert_str_eq(h_str(run, "status"), "failed");
  ck_assert_ptr_nonnull(strstr(h_str(run, "failure"), "the client that ran it is gone"));
  json_decref(run);
  w = h_worker(&ctl, id);
  ck_assert_str_eq(h_str(w, "status"), "running");
  json_decref(w);
  snprintf(body, sizeof(body),
           "{\"n\": 1, \"cpu\": 0.1, \"session\": \"free\", \"run\": \"%s\", \"kernel\": \"sh\", "
           "\"code\": \"true\"}",
           run_id);
  st = h_http(&ctl, "POST", "/api/v1/workers", body, "", NULL, NULL);
  ck_assert_int_eq(st, 409);
  h_finish(&ctl);
}
END_TEST

/* A run names the holder it is bound to, and that holder must hold a part. */
START_TEST(a_run_is_refused_without_a_holder_that_holds_a_part) {
  char *raw = NULL;
  long st;

  start();
  st = h_http(&ctl, "POST", "/api/v1/runs", "{\"mode\": \"exec\", \"command\": [\"x\"]}", "", NULL,
              &raw);
  ck_assert_int_eq(st, 422);
  ck_assert_ptr_nonnull(strstr(raw, "\"field\":\"holder\""));
  free(raw);
  st = h_http(&ctl, "POST", "/api/v1/runs",
              "{\"mode\": \"exec\", \"command\": [\"x\"], \"session\": \"s\", \"holder\": \"h1\"}",
              "", NULL, &raw);
  ck_assert_int_eq(st, 409);
  ck_assert_ptr_nonnull(strstr(raw, "holder h1 holds no part of session s's lease"));
  free(raw);
  st = h_http(&ctl, "PUT", "/api/v1/sessions/s/lease", "{\"holder\": \"bad holder\"}", "", NULL,
              &raw);
  ck_assert_int_eq(st, 422);
  ck_assert_ptr_nonnull(strstr(raw, "\"field\":\"holder\""));
  free(raw);
  st = h_http(&ctl, "DELETE", "/api/v1/sessions/s/lease?holder=h1", NULL, "", NULL, &raw);
  ck_assert_int_eq(st, 404);
  ck_assert_ptr_nonnull(strstr(raw, "holder h1 holds no part of session s's lease"));
  free(raw);
  h_finish(&ctl);
}
END_TEST

/* Every holder's part outlives a kill -9 of the controller and its
 * restart (one ttl of grace each), and the session lists its holders. */
START_TEST(every_holders_part_survives_a_restart) {
  json_t *s = NULL, *holders;

  start();
  ck_assert_int_eq(put("kept", "one", 60, 1, NULL), 201);
  ck_assert_int_eq(put("kept", "two", 60, 0, NULL), 201);
  h_kill9(&ctl);
  h_restart(&ctl);
  ck_assert_int_eq(h_http(&ctl, "GET", "/api/v1/sessions/kept", NULL, "", &s, NULL), 200);
  holders = json_object_get(json_object_get(s, "lease"), "holders");
  ck_assert_int_eq(json_array_size(holders), 2);
  ck_assert(json_is_true(json_object_get(json_object_get(s, "lease"), "stops_workers")));
  json_decref(s);
  ck_assert_int_eq(put("kept", "one", 60, 1, NULL), 200);
  ck_assert_int_eq(put("kept", "two", 60, 0, NULL), 200);
  h_finish(&ctl);
}
END_TEST

int main(void) {
  Suite *s = suite_create("leases");
  TCase *tc = tcase_create("holders");

  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, another_holders_give_back_leaves_my_lease_and_workers);
  tcase_add_test(tc, a_clean_close_leaves_the_workers_another_holder_keeps);
  tcase_add_test(tc, a_short_holders_death_ends_its_run_within_its_own_ttl);
  tcase_add_test(tc, the_workers_stop_with_the_last_holder_and_each_is_told);
  tcase_add_test(tc, a_run_without_a_lease_ends_when_its_client_is_gone);
  tcase_add_test(tc, a_run_is_refused_without_a_holder_that_holds_a_part);
  tcase_add_test(tc, every_holders_part_survives_a_restart);
  suite_add_tcase(s, tc);
  return check_run(s);
}
