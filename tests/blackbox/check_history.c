/* check_history.c: a worker's history as the controller keeps it, black
 * box: its events (oldest first, and live, in order, on the event
 * stream) and what retention prunes (ended workers, with their events and
 * logs). */
#include "harness.h"

#include "../check_run.h"

#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static struct ctl_proc ctl;

static void fresh(void) {
  memset(&ctl, 0, sizeof(ctl));
}

START_TEST(a_workers_events_come_oldest_first) {
  json_t *workers, *ans = NULL, *ev;
  char path[96], auth[200];

  fresh();
  h_start(&ctl);
  workers = h_launch(&ctl, "{\"n\": 1, \"cpu\": 0.1}");
  json_decref(h_wait_status(&ctl, h_str(json_array_get(workers, 0), "id"), "running", 30));
  snprintf(path, sizeof(path), "/api/v1/workers/%s/events",
           h_str(json_array_get(workers, 0), "id"));
  ck_assert_int_eq(h_http(&ctl, "GET", path, NULL, "", &ans, NULL), 200);
  ev = json_object_get(ans, "events");
  ck_assert(json_is_null(json_object_get(json_array_get(ev, 0), "from")));
  ck_assert_str_eq(h_str(json_array_get(ev, json_array_size(ev) - 1), "to"), "running");
  ck_assert(json_is_false(json_object_get(ans, "truncated")));
  json_decref(ans);
  h_worker_token(&ctl, h_str(json_array_get(workers, 0), "id"), auth, sizeof(auth));
  ck_assert_int_eq(h_http(&ctl, "GET", path, NULL, auth, NULL, NULL), 401);
  ck_assert_int_eq(h_http(&ctl, "GET", "/api/v1/workers/w-0000000000/events", NULL, "", 0, 0), 404);
  ck_assert_int_eq(h_http(&ctl, "GET", "/api/v1/workers/%3Cimg%3E/events", NULL, "", 0, 0), 404);
  json_decref(workers);
  h_finish(&ctl);
}
END_TEST

START_TEST(events_stream_live_transitions_in_order) {
  json_t *workers;
  char *events = NULL, want[160];
  const char *p;
  const char *id;
  long last;

  fresh();
  h_start(&ctl);
  workers = h_launch(&ctl, "{\"n\": 1, \"cpu\": 0.1, \"code\": \"!true\"}");
  id = h_str(json_array_get(workers, 0), "id");
  json_decref(h_await(&ctl, workers, 1, 20));
  ck_assert_int_eq(h_sse(&ctl, 0, 4, 5000, &events), 4);
  p = events;
  const char *steps[][2] = {{"null", "\"scheduling\""},
                            {"\"scheduling\"", "\"starting\""},
                            {"\"starting\"", "\"running\""},
                            {"\"running\"", "\"succeeded\""}};
  for (int i = 0; i < 4; i++) {
    snprintf(want, sizeof(want), "\"worker_id\":\"%s\",\"from\":%s,\"to\":%s", id, steps[i][0],
             steps[i][1]);
    p = strstr(p, want);
    ck_assert_msg(p != NULL, "event %d (%s) missing or out of order in: %s", i, want, events);
  }
  free(events);
  /* A stream opened from the latest seq (4: the events above) sees only
   * what happens next, as it happens: the next worker's events, from 5 on
   * (so there was no fifth before them). */
  last = 4;
  json_decref(workers);
  workers = h_launch(&ctl, "{\"n\": 1, \"cpu\": 0.1}");
  ck_assert_int_eq(h_sse(&ctl, last, 3, 10000, &events), 3);
  snprintf(want, sizeof(want), "id: 5\ndata: {\"seq\":5,\"worker_id\":\"%s\",\"from\":null,",
           h_str(json_array_get(workers, 0), "id"));
  p = strstr(events, "id: ");
  ck_assert_msg(p && strncmp(p, want, strlen(want)) == 0, "not the next worker's first: %s",
                events);
  ck_assert_ptr_null(strstr(events, "succeeded"));
  ck_assert_ptr_nonnull(strstr(events, "\"to\":\"running\""));
  free(events);
  json_decref(workers);
  h_finish(&ctl);
}
END_TEST

START_TEST(retention_prunes_ended_workers_with_their_events_and_logs) {
  json_t *workers, *ans, *keep, *w = NULL;
  char path[300], get[64], *raw = NULL;
  const char *id;
  struct stat st;
  int gone = 0;

  fresh();
  ctl.extra[0] = "--retain";
  ctl.extra[1] = "2";
  h_start(&ctl);
  workers = h_launch(&ctl, "{\"n\": 1, \"cpu\": 0.1, \"kernel\": \"sh\", \"code\": "
                           "\"echo to be pruned\"}");
  id = h_str(json_array_get(workers, 0), "id");
  ans = h_await(&ctl, workers, 1, 20);
  ck_assert_int_eq(json_array_size(json_object_get(ans, "workers")), 1);
  /* A live worker is never pruned, however old. */
  keep = h_launch(&ctl, "{\"n\": 1, \"cpu\": 0.1}");
  json_decref(h_await(&ctl, keep, 0, 20));
  snprintf(path, sizeof(path), "%s/logs/%s.stdout", ctl.dir, id);
  snprintf(get, sizeof(get), "/api/v1/workers/%s", id);
  for (int i = 0; i < 24 && !gone; i++) {
    gone = h_http(&ctl, "GET", get, NULL, "", NULL, NULL) == 404;
    if (!gone)
      usleep(500 * 1000);
  }
  ck_assert_msg(gone, "%s was still there 12 s after it ended (--retain 2)", id);
  /* (the row goes first, in its commit; the files just after it) */
  for (double until = h_now() + 10; stat(path, &st) == 0; usleep(50 * 1000))
    ck_assert_msg(h_now() < until, "its log %s is still there 10 s after its row went", path);
  /* The oldest events left (from seq 0: those of the kept worker, were its
   * own gone). */
  ck_assert_int_ge(h_sse(&ctl, 0, 1, 10000, &raw), 1);
  ck_assert_msg(!strstr(raw, id), "its events are still in the stream: %s", raw);
  free(raw);
  w = h_worker(&ctl, h_str(json_array_get(keep, 0), "id"));
  ck_assert_str_eq(h_str(w, "status"), "running");
  json_decref(w);
  json_decref(keep);
  json_decref(ans);
  json_decref(workers);
  h_finish(&ctl);
}
END_TEST

int main(void) {
  Suite *s = suite_create("history");
  TCase *tc = tcase_create("history");

  tcase_set_timeout(tc, 90);
  tcase_add_test(tc, a_workers_events_come_oldest_first);
  tcase_add_test(tc, events_stream_live_transitions_in_order);
  tcase_add_test(tc, retention_prunes_ended_workers_with_their_events_and_logs);
  suite_add_tcase(s, tc);
  return check_run(s);
}
