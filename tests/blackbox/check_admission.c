/* check_admission.c: black-box tests of admission: what a launch that can
 * never start is told (a gang larger than the backend, refused with the
 * launch), and what a worker that waits for room says it waits for. The
 * real controller and workerds, driven through the REST API. */
#include "harness.h"

#include "../check_run.h"

#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static struct ctl_proc ctl;

static void fresh(void) {
  memset(&ctl, 0, sizeof(ctl));
}

START_TEST(a_gang_of_3_one_core_workers_on_2_cores_is_refused_at_once) {
  json_t *ans = NULL, *workers;
  const char *msg, *field;
  double t0, took;

  fresh();
  ctl.extra[0] = "--cpus";
  ctl.extra[1] = "2";
  h_start(&ctl);
  /* The workers of a launch of groups must all run at once: 3 × 1 core
   * never fits 2 cores, and the POST itself says so, with the arithmetic
   * (it used to be accepted and wait out its client's start timeout). */
  t0 = h_now();
  ck_assert_int_eq(h_http(&ctl, "POST", "/api/v1/workers",
                          "{\"groups\": [{\"n\": 3, \"cpu\": 1, \"session\": \"gang\"}]}", "", &ans,
                          NULL),
                   422);
  took = h_now() - t0;
  ck_assert_msg(took < 5.0, "the refusal took %.3f s", took);
  msg = h_str(json_object_get(ans, "error"), "message");
  field = h_str(json_object_get(ans, "error"), "field");
  ck_assert_str_eq(h_str(json_object_get(ans, "error"), "code"), "exceeds_capacity");
  ck_assert_str_eq(field ? field : "", "cpu");
  ck_assert_msg(msg &&
                    strstr(msg, "3 workers × 1 core = 3 cores, but this host has 2 cores in all"),
                "message: %s", msg ? msg : "(none)");
  json_decref(ans);
  /* Of several shapes: each group's share is in the sum. */
  ck_assert_int_eq(h_http(&ctl, "POST", "/api/v1/workers",
                          "{\"groups\": [{\"n\": 1, \"cpu\": 1, \"role\": \"ps\", \"session\": "
                          "\"gang\"}, {\"n\": 2, \"cpu\": 0.75, \"session\": \"gang\"}]}",
                          "", &ans, NULL),
                   422);
  msg = h_str(json_object_get(ans, "error"), "message");
  ck_assert_msg(msg && strstr(msg, "1 ps × 1 core + 2 workers × 0.75 cores = 2.5 cores, but this "
                                   "host has 2 cores in all"),
                "message: %s", msg ? msg : "(none)");
  json_decref(ans);
  /* Nothing was stored. */
  ck_assert_int_eq(h_http(&ctl, "GET", "/api/v1/workers?session=gang", NULL, "", &ans, NULL), 200);
  ck_assert_int_eq(json_array_size(json_object_get(ans, "workers")), 0);
  json_decref(ans);
  /* A plain launch's workers may wait for each other's room: accepted. */
  workers = h_launch(&ctl, "{\"n\": 3, \"cpu\": 1, \"session\": \"plain\"}");
  ck_assert_int_eq(json_array_size(workers), 3);
  json_decref(workers);
  h_finish(&ctl);
}
END_TEST

/* Starts a controller of cores cores, and in it one worker that takes them
 * all (returned once running) and one more of 1 core (*blocked), which
 * waits for room. */
static json_t *one_running_one_blocked(const char *cores, json_t **blocked) {
  char body[80];
  json_t *big;

  fresh();
  ctl.extra[0] = "--cpus";
  ctl.extra[1] = cores;
  h_start(&ctl);
  snprintf(body, sizeof(body), "{\"n\": 1, \"cpu\": %s, \"memory\": 0.01}", cores);
  big = h_launch(&ctl, body);
  json_decref(h_await(&ctl, big, 0, 20));
  *blocked = h_launch(&ctl, "{\"n\": 1, \"cpu\": 1, \"memory\": 0.01}");
  return big;
}

START_TEST(a_waiting_workers_reason_says_1_core_not_1_cores) {
  json_t *big, *blocked, *ans;

  big = one_running_one_blocked("2", &blocked);
  /* Its reason is recorded by the scheduling pass after the launch. */
  {
    const char *id = h_str(json_array_get(blocked, 0), "id");
    double until = h_now() + 20;
    ans = NULL;
    while (h_now() < until) {
      json_decref(ans);
      ans = h_worker(&ctl, id);
      if (h_str(ans, "waiting_for"))
        break;
      usleep(20 * 1000); /* polling the recorded reason: no event says it changed */
    }
  }
  ck_assert_str_eq(h_str(ans, "status"), "scheduling");
  ck_assert_str_eq(h_str(ans, "waiting_for") ? h_str(ans, "waiting_for") : "(none)",
                   "1 core (0 free of 2)");
  json_decref(ans);
  json_decref(big);
  json_decref(blocked);
  h_finish(&ctl);
}
END_TEST

/* POSTs body as a launch and returns its status; *msg gets the error's
 * message (static copy, "" when none), *field its field. */
static long post_launch(const char *body, char *msg, size_t msglen, char *field, size_t fieldlen) {
  json_t *ans = NULL, *e;
  long st = h_http(&ctl, "POST", "/api/v1/workers", body, "", &ans, NULL);

  e = json_object_get(ans, "error");
  snprintf(msg, msglen, "%s", h_str(e, "message") ? h_str(e, "message") : "");
  snprintf(field, fieldlen, "%s", h_str(e, "field") ? h_str(e, "field") : "");
  json_decref(ans);
  return st;
}

START_TEST(a_gang_of_16_long_named_groups_is_refused_with_a_422_not_a_dropped_connection) {
  char body[4096], msg[2048], field[32];
  size_t len = 0;

  fresh();
  ctl.extra[0] = "--cpus";
  ctl.extra[1] = "2";
  h_start(&ctl);
  /* 16 groups whose roles are 26 characters: their terms came to 880
   * bytes, cut at 400, which fell inside the two bytes of "×"; Jansson took
   * no such string, and the connection was dropped without an answer. */
  len += (size_t)snprintf(body + len, sizeof(body) - len, "{\"groups\": [");
  for (int k = 0; k < 16; k++)
    len += (size_t)snprintf(body + len, sizeof(body) - len,
                            "%s{\"n\": 1, \"cpu\": 1, \"role\": \"r%02dxxxxxxxxxxxxxxxxxxxxxxx\", "
                            "\"session\": \"long\"}",
                            k ? ", " : "", k);
  snprintf(body + len, sizeof(body) - len, "]}");
  ck_assert_int_eq(post_launch(body, msg, sizeof(msg), field, sizeof(field)), 422);
  ck_assert_str_eq(field, "cpu");
  /* Whole terms only, the rest counted, and the sum is still all of them. */
  ck_assert_msg(strstr(msg, "1 r00xxxxxxxxxxxxxxxxxxxxxxx × 1 core + ") == msg, "message: %s", msg);
  ck_assert_msg(strstr(msg, " more groups = 16 cores, but this host has 2 cores in all"),
                "message: %s", msg);
  /* A sum just over the host's size does not read as equal to it: it said
   * "= 2 cores, but this host has 2 cores in all". */
  ck_assert_int_eq(post_launch("{\"groups\": [{\"n\": 3, \"cpu\": 0.667, \"session\": \"e\"}]}",
                               msg, sizeof(msg), field, sizeof(field)),
                   422);
  ck_assert_msg(
      strstr(msg, "3 workers × 0.667 cores = 2.001 cores, but this host has 2 cores in all"),
      "message: %s", msg);
  h_finish(&ctl);
}
END_TEST

START_TEST(a_gang_that_fits_the_host_exactly_is_accepted) {
  char msg[1024], field[32];
  json_t *workers;

  fresh();
  ctl.extra[0] = "--cpus";
  ctl.extra[1] = "2";
  ctl.extra[2] = "--memory";
  ctl.extra[3] = "2";
  h_start(&ctl);
  /* Sums equal to the host's size are not "more than" it. */
  ck_assert_msg(post_launch("{\"groups\": [{\"n\": 4, \"cpu\": 0.5, \"memory\": 0.25, \"session\": "
                            "\"a\"}]}",
                            msg, sizeof(msg), field, sizeof(field)) == 201,
                "4 × 0.5 cores on 2: %s", msg);
  ck_assert_msg(post_launch("{\"groups\": [{\"n\": 2, \"cpu\": 1, \"memory\": 0.25, \"session\": "
                            "\"b\"}]}",
                            msg, sizeof(msg), field, sizeof(field)) == 201,
                "2 × 1 core on 2: %s", msg);
  ck_assert_msg(post_launch("{\"groups\": [{\"n\": 1, \"cpu\": 0.2, \"memory\": 1.5, \"role\": "
                            "\"ps\", \"session\": \"c\"}, {\"n\": 2, \"cpu\": 0.1, \"memory\": "
                            "0.25, \"session\": \"c\"}]}",
                            msg, sizeof(msg), field, sizeof(field)) == 201,
                "1.5 + 2 × 0.25 GiB on 2 GiB: %s", msg);
  /* And the 4 halves run, all at once. */
  h_finish(&ctl);
  fresh();
  ctl.extra[0] = "--cpus";
  ctl.extra[1] = "2";
  h_start(&ctl);
  workers = h_launch(&ctl, "{\"groups\": [{\"n\": 4, \"cpu\": 0.5, \"session\": \"d\"}]}");
  json_decref(h_await(&ctl, workers, 0, 30));
  for (size_t i = 0; i < json_array_size(workers); i++) {
    json_t *w = h_worker(&ctl, h_str(json_array_get(workers, i), "id"));
    ck_assert_str_eq(h_str(w, "status"), "running");
    json_decref(w);
  }
  json_decref(workers);
  h_finish(&ctl);
}
END_TEST

START_TEST(a_gang_over_the_hosts_memory_or_gpus_is_refused_naming_them) {
  char msg[1024], field[32];

  fresh();
  ctl.extra[0] = "--memory";
  ctl.extra[1] = "2";
  ctl.extra[2] = "--gpus";
  ctl.extra[3] = "1";
  h_start(&ctl);
  ck_assert_int_eq(post_launch("{\"groups\": [{\"n\": 3, \"cpu\": 0.1, \"memory\": 1, \"session\": "
                               "\"m\"}]}",
                               msg, sizeof(msg), field, sizeof(field)),
                   422);
  ck_assert_str_eq(field, "memory");
  ck_assert_msg(strstr(msg, "3 workers × 1 GiB = 3 GiB, but this host has 2 GiB of memory in all"),
                "message: %s", msg);
  ck_assert_int_eq(post_launch("{\"groups\": [{\"n\": 2, \"cpu\": 0.1, \"memory\": 0.25, "
                               "\"nvidia_gpu\": 1, \"session\": \"g\"}]}",
                               msg, sizeof(msg), field, sizeof(field)),
                   422);
  ck_assert_str_eq(field, "nvidia_gpu");
  ck_assert_msg(strstr(msg, "2 workers × 1 GPU = 2 GPUs, but this host has 1 GPU in all"),
                "message: %s", msg);
  h_finish(&ctl);
}
END_TEST

START_TEST(a_restarts_launch_while_the_last_attempt_still_runs_is_accepted_then_runs) {
  char body[256], msg[1024], field[32], run[16];
  json_t *ans = NULL, *first, *second, *ids;

  fresh();
  ctl.extra[0] = "--cpus";
  ctl.extra[1] = "2";
  h_start(&ctl);
  /* A run is bound to its holder's part of the session's lease. */
  ck_assert_int_eq(h_http(&ctl, "PUT", "/api/v1/sessions/r/lease",
                          "{\"ttl_seconds\": 300, \"holder\": \"h\", \"stop_workers\": true}", "",
                          NULL, NULL),
                   201);
  ck_assert_int_eq(
      h_http(&ctl, "POST", "/api/v1/runs",
             "{\"mode\": \"exec\", \"command\": [\"true\"], \"session\": \"r\", \"holder\": \"h\"}",
             "", &ans, NULL),
      201);
  snprintf(run, sizeof(run), "%s", h_str(ans, "id"));
  json_decref(ans);
  /* Attempt 1 fills the host. */
  snprintf(body, sizeof(body), "{\"n\": 2, \"cpu\": 1, \"session\": \"r\", \"run\": \"%s\"}", run);
  first = h_launch(&ctl, body);
  json_decref(h_await(&ctl, first, 0, 30));
  /* Attempt 2 is launched while attempt 1's workers still hold it: the
   * host's size is what counts, not what is free now. */
  ck_assert_msg(post_launch(body, msg, sizeof(msg), field, sizeof(field)) == 201,
                "the restart's launch: %s", msg);
  ck_assert_int_eq(h_http(&ctl, "GET", "/api/v1/workers?session=r", NULL, "", &ans, NULL), 200);
  ck_assert_int_eq(json_array_size(json_object_get(ans, "workers")), 4);
  second = json_array();
  for (size_t i = 0; i < 4; i++) {
    json_t *w = json_array_get(json_object_get(ans, "workers"), i);
    int old = 0;
    for (size_t j = 0; j < 2; j++)
      old |= strcmp(h_str(w, "id"), h_str(json_array_get(first, j), "id")) == 0;
    if (!old)
      json_array_append(second, w);
  }
  json_decref(ans);
  ck_assert_int_eq(json_array_size(second), 2);
  /* Once attempt 1's workers are stopped, attempt 2's run. */
  ids = json_array();
  for (size_t j = 0; j < 2; j++)
    json_array_append_new(ids, json_string(h_str(json_array_get(first, j), "id")));
  ans = json_pack("{s:o}", "ids", ids);
  {
    char *text = json_dumps(ans, JSON_COMPACT);
    ck_assert_int_eq(h_http(&ctl, "POST", "/api/v1/workers/stop", text, "", NULL, NULL), 200);
    free(text);
  }
  json_decref(ans);
  for (size_t j = 0; j < 2; j++)
    json_decref(h_wait_status(&ctl, h_str(json_array_get(second, j), "id"), "running", 60));
  json_decref(first);
  json_decref(second);
  h_finish(&ctl);
}
END_TEST

#ifdef MUSTER_FAULT_INJECTION
/* A scheduling pass whose commit keeps failing (a full disk) is tried again
 * every 100 ms, not at once and forever on the state lock: the API still
 * answers what needs that lock, here a stop of the worker that cannot
 * start. */
START_TEST(a_scheduling_pass_that_keeps_failing_leaves_the_api_answering) {
  json_t *workers, *w;
  char path[64];
  double t0, took;
  int st;

  fresh();
  ctl.extra[0] = "--backend";
  ctl.extra[1] = "external";
  setenv("MUSTER_FAULT", "schedule_commit:fail=100000000", 1);
  h_start(&ctl);
  unsetenv("MUSTER_FAULT");
  workers = h_launch(&ctl, "{\"n\": 1, \"cpu\": 0.1, \"memory\": 0.1}");
  snprintf(path, sizeof(path), "/api/v1/workers/%s", h_str(json_array_get(workers, 0), "id"));
  /* (held on the state lock, it would get no answer: 0 after the
   * harness's 30 s) */
  t0 = h_now();
  st = (int)h_http(&ctl, "DELETE", path, NULL, "", NULL, NULL);
  took = h_now() - t0;
  ck_assert_msg(st == 200, "the stop answered %d after %.1f s", st, took);
  w = h_worker(&ctl, h_str(json_array_get(workers, 0), "id"));
  ck_assert_str_eq(h_str(w, "status"), "stopped");
  json_decref(w);
  json_decref(workers);
  h_finish(&ctl);
}
END_TEST
#endif

/* The workers by status in /metrics and in /api/v1/health, which count
 * the live ones in memory and the ended ones in the database. */
static void assert_counts(long scheduling, long running, long stopped) {
  static const char *const names[] = {"scheduling", "starting", "running",
                                      "succeeded",  "failed",   "stopped"};
  const long want[] = {scheduling, 0, running, 0, 0, stopped};
  json_t *health = NULL, *counts;

  ck_assert_int_eq(h_http(&ctl, "GET", "/api/v1/health", NULL, NULL, &health, NULL), 200);
  counts = json_object_get(health, "workers");
  for (int i = 0; i < 6; i++) {
    char metric[64];

    snprintf(metric, sizeof(metric), "muster_workers{status=\"%s\"}", names[i]);
    ck_assert_msg(h_metric(&ctl, metric) == want[i], "%s is %.0f, not %ld", metric,
                  h_metric(&ctl, metric), want[i]);
    ck_assert_msg(json_integer_value(json_object_get(counts, names[i])) == want[i],
                  "the health call counts %lld %s, not %ld",
                  (long long)json_integer_value(json_object_get(counts, names[i])), names[i],
                  want[i]);
  }
  json_decref(health);
}

START_TEST(the_worker_counts_follow_each_worker_and_a_restart) {
  json_t *first, *second, *w;
  char body[96];

  first = one_running_one_blocked("1", &second);
  /* (it waits for the first one's core, saying so) */
  for (double t0 = h_now();; usleep(50 * 1000)) {
    const char *why;

    w = h_worker(&ctl, h_str(json_array_get(second, 0), "id"));
    why = h_str(w, "waiting_for");
    if (why && why[0]) {
      json_decref(w);
      break;
    }
    json_decref(w);
    ck_assert_msg(h_now() - t0 < 30, "the second worker never said what it waits for");
  }
  assert_counts(1, 1, 0);
  snprintf(body, sizeof(body), "{\"ids\": [\"%s\"]}", h_str(json_array_get(first, 0), "id"));
  ck_assert_int_eq(h_http(&ctl, "POST", "/api/v1/workers/stop", body, "", NULL, NULL), 200);
  json_decref(h_await(&ctl, second, 0, 30));
  assert_counts(0, 1, 1);
  h_kill9(&ctl);
  h_restart(&ctl);
  assert_counts(0, 1, 1);
  ck_assert_int_eq(h_http(&ctl, "POST", "/api/v1/workers/stop", "{}", "", NULL, NULL), 200);
  json_decref(h_await(&ctl, second, 1, 30));
  assert_counts(0, 0, 2);
  json_decref(first);
  json_decref(second);
  h_finish(&ctl);
}
END_TEST

int main(void) {
  Suite *s = suite_create("admission");
  TCase *tc = tcase_create("admission");

  tcase_set_timeout(tc, 90);
  tcase_add_test(tc, a_gang_of_3_one_core_workers_on_2_cores_is_refused_at_once);
  tcase_add_test(tc, a_waiting_workers_reason_says_1_core_not_1_cores);
  tcase_add_test(tc, a_gang_of_16_long_named_groups_is_refused_with_a_422_not_a_dropped_connection);
  tcase_add_test(tc, a_gang_that_fits_the_host_exactly_is_accepted);
  tcase_add_test(tc, a_gang_over_the_hosts_memory_or_gpus_is_refused_naming_them);
  tcase_add_test(tc, a_restarts_launch_while_the_last_attempt_still_runs_is_accepted_then_runs);
  tcase_add_test(tc, the_worker_counts_follow_each_worker_and_a_restart);
#ifdef MUSTER_FAULT_INJECTION
  tcase_add_test(tc, a_scheduling_pass_that_keeps_failing_leaves_the_api_answering);
#endif
  suite_add_tcase(s, tc);
  return check_run(s);
}
