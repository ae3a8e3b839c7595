/* check_admission.c: black-box tests of admission: what a launch that can
 * never start is told (a gang larger than the backend, refused with the
 * launch), and what a worker that waits for room says it waits for. The
 * real controller and workerds, driven through the REST API. */
#include "harness.h"

#include "../check_run.h"

#include <check.h>
#include <stdio.h>
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

START_TEST(a_waiting_workers_reason_says_1_core_not_1_cores) {
  json_t *big, *blocked, *ans;

  fresh();
  ctl.extra[0] = "--cpus";
  ctl.extra[1] = "2";
  h_start(&ctl);
  big = h_launch(&ctl, "{\"n\": 1, \"cpu\": 2}");
  json_decref(h_await(&ctl, big, 0, 20));
  blocked = h_launch(&ctl, "{\"n\": 1, \"cpu\": 1}");
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

int main(void) {
  Suite *s = suite_create("admission");
  TCase *tc = tcase_create("admission");

  tcase_set_timeout(tc, 90);
  tcase_add_test(tc, a_gang_of_3_one_core_workers_on_2_cores_is_refused_at_once);
  tcase_add_test(tc, a_waiting_workers_reason_says_1_core_not_1_cores);
  suite_add_tcase(s, tc);
  return check_run(s);
}
