/* check_waiters.c: black-box tests of parked awaits and followed logs
 * (the controller's waiters and streams, indexed by the worker they wait
 * on): many of them at once, over overlapping and repeated ids, with some
 * timing out or hanging up while the others wait, each woken by the changes
 * of the workers it names and by no other. The real controller, real idle
 * workers (local backend); the parked requests are kept in flight together
 * on one libcurl multi handle. */
#include "harness.h"

#include "../check_run.h"

#include <check.h>
#include <curl/curl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static struct ctl_proc ctl;
static CURLM *multi;

/* One request kept in flight on multi. */
struct req {
  CURL *e;
  struct curl_slist *hdrs;
  char *body; /* what came back so far (malloc'ed) */
  size_t len;
  int done;
  long status;
};

static size_t collect(char *p, size_t size, size_t n, void *arg) {
  struct req *r = arg;
  char *b = realloc(r->body, r->len + size * n + 1);

  if (!b)
    return 0;
  memcpy(b + r->len, p, size * n);
  r->len += size * n;
  b[r->len] = '\0';
  r->body = b;
  return size * n;
}

/* Starts method path (with a JSON body, or none) on multi; it proceeds as
 * pump() is called. */
static struct req *req_start(const char *method, const char *path, const char *body) {
  struct req *r = calloc(1, sizeof(*r));
  char url[600], auth[160];

  ck_assert_ptr_nonnull(r);
  r->e = curl_easy_init();
  ck_assert_ptr_nonnull(r->e);
  snprintf(url, sizeof(url), "%s%s", ctl.url, path);
  snprintf(auth, sizeof(auth), "Authorization: Bearer %s", ctl.token);
  r->hdrs = curl_slist_append(NULL, auth);
  r->hdrs = curl_slist_append(r->hdrs, "Content-Type: application/json");
  curl_easy_setopt(r->e, CURLOPT_URL, url);
  curl_easy_setopt(r->e, CURLOPT_CUSTOMREQUEST, method);
  curl_easy_setopt(r->e, CURLOPT_HTTPHEADER, r->hdrs);
  curl_easy_setopt(r->e, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(r->e, CURLOPT_TIMEOUT, 90L);
  curl_easy_setopt(r->e, CURLOPT_WRITEFUNCTION, collect);
  curl_easy_setopt(r->e, CURLOPT_WRITEDATA, r);
  curl_easy_setopt(r->e, CURLOPT_PRIVATE, r);
  if (body)
    curl_easy_setopt(r->e, CURLOPT_COPYPOSTFIELDS, body);
  ck_assert_int_eq(curl_multi_add_handle(multi, r->e), CURLM_OK);
  return r;
}

/* Moves every request on for up to ms, and marks the ones that ended. */
static void pump(int ms) {
  int running, left;
  CURLMsg *m;

  curl_multi_perform(multi, &running);
  curl_multi_poll(multi, NULL, 0, ms, NULL);
  curl_multi_perform(multi, &running);
  while ((m = curl_multi_info_read(multi, &left)) != NULL) {
    struct req *r = NULL;
    if (m->msg != CURLMSG_DONE)
      continue;
    curl_easy_getinfo(m->easy_handle, CURLINFO_PRIVATE, (char **)&r);
    ck_assert_msg(m->data.result == CURLE_OK, "a parked request failed: %s",
                  curl_easy_strerror(m->data.result));
    curl_easy_getinfo(m->easy_handle, CURLINFO_RESPONSE_CODE, &r->status);
    r->done = 1;
  }
}

/* Ends r (hanging up if it is still in flight) and frees it. */
static void req_free(struct req *r) {
  if (!r)
    return;
  curl_multi_remove_handle(multi, r->e);
  curl_easy_cleanup(r->e);
  curl_slist_free_all(r->hdrs);
  free(r->body);
  free(r);
}

/* Waits up to timeout_s for r to end, and checks it answered 200. */
static void wait_done(struct req *r, const char *what, double timeout_s) {
  double t0 = h_now();

  while (!r->done && h_now() - t0 < timeout_s)
    pump(50);
  ck_assert_msg(r->done, "%s did not answer within %.0f s", what, timeout_s);
  ck_assert_msg(r->status == 200, "%s answered %ld: %s", what, r->status, r->body ? r->body : "");
}

/* Waits up to timeout_s for the metric to be want, moving the requests on
 * meanwhile. */
static void wait_metric(const char *name, double want, double timeout_s) {
  double t0 = h_now(), v;

  while ((v = h_metric(&ctl, name)) != want && h_now() - t0 < timeout_s)
    pump(50);
  ck_assert_msg(v == want, "%s is %.0f, not %.0f, after %.0f s", name, v, want, timeout_s);
}

/* Parks POST /workers/await of ids (n of them, repeats allowed). */
static struct req *park_await(const char *const *ids, int n, int wait_for_completion,
                              double timeout_s) {
  json_t *body = json_pack("{s:[], s:b, s:f}", "ids", "wait_for_completion", wait_for_completion,
                           "timeout_seconds", timeout_s);
  struct req *r;
  char *text;

  for (int i = 0; i < n; i++)
    json_array_append_new(json_object_get(body, "ids"), json_string(ids[i]));
  text = json_dumps(body, 0);
  r = req_start("POST", "/api/v1/workers/await", text);
  free(text);
  json_decref(body);
  return r;
}

/* Checks an await's answer: not timed out, and every one of the n ids
 * (repeats counted) reported with status. */
static void check_answer(struct req *r, const char *what, int n, const char *status) {
  json_t *ans = json_loads(r->body ? r->body : "", 0, NULL), *w, *all;
  size_t i;
  int got = 0;

  ck_assert_msg(ans != NULL, "%s answered no JSON: %s", what, r->body ? r->body : "");
  ck_assert_msg(json_is_false(json_object_get(ans, "timed_out")), "%s timed out: %s", what,
                r->body);
  all = json_array();
  json_array_extend(all, json_object_get(ans, "workers"));
  json_array_extend(all, json_object_get(ans, "failures"));
  json_array_foreach(all, i, w) got += strcmp(h_str(w, "status"), status) == 0;
  ck_assert_msg(got == n && json_array_size(all) == (size_t)n,
                "%s: %d of %zu workers %s, not %d: %s", what, got, json_array_size(all), status, n,
                r->body);
  json_decref(all);
  json_decref(ans);
}

static void stop(const char *id) {
  char body[96];

  snprintf(body, sizeof(body), "{\"ids\": [\"%s\"]}", id);
  ck_assert_int_eq(h_http(&ctl, "POST", "/api/v1/workers/stop", body, "", NULL, NULL), 200);
}

/* Starts a controller and n idle workers; returns them once running. */
static json_t *start_with_running(int n) {
  char body[96];
  json_t *workers;

  memset(&ctl, 0, sizeof(ctl));
  h_start(&ctl);
  multi = curl_multi_init();
  snprintf(body, sizeof(body), "{\"n\": %d, \"cpu\": 0.01, \"memory\": 0.01}", n);
  workers = h_launch(&ctl, body);
  json_decref(h_await(&ctl, workers, 0, 30));
  return workers;
}

static struct req *follow(const char *id) {
  char path[96];

  snprintf(path, sizeof(path), "/api/v1/workers/%s/logs?follow=1", id);
  return req_start("GET", path, NULL);
}

/* Six awaits parked over four running workers, with overlapping and
 * repeated ids, and three followed logs: a stop answers exactly the awaits
 * whose last worker it ended, and the follows of that worker; an await that
 * timed out and one whose client hung up leave, and the later stops of their
 * workers still answer the others (the sanitized build would catch a
 * dangling entry left behind). */
START_TEST(parked_awaits_answer_when_the_last_worker_they_name_ends_and_no_sooner) {
  json_t *workers;
  const char *a, *b, *c, *d;
  struct req *p1, *p2, *p3, *p4, *p5, *p6, *fa1, *fa2, *fb;
  double p6_at;

  workers = start_with_running(4);
  a = h_str(json_array_get(workers, 0), "id");
  b = h_str(json_array_get(workers, 1), "id");
  c = h_str(json_array_get(workers, 2), "id");
  d = h_str(json_array_get(workers, 3), "id");
  p1 = park_await((const char *[]){a}, 1, 1, 60);
  p2 = park_await((const char *[]){a, b}, 2, 1, 60);
  p3 = park_await((const char *[]){b, c, b}, 3, 1, 60);
  p4 = park_await((const char *[]){a, a, d}, 3, 1, 60);
  p5 = park_await((const char *[]){c, d}, 2, 1, 60);
  fa1 = follow(a);
  fa2 = follow(a);
  fb = follow(b);
  wait_metric("muster_await_waiting", 5, 30);
  wait_metric("muster_streams_waiting", 3, 30);
  /* (parked once the others are: its 1 s may run out before a loaded
   * machine has parked the rest) */
  p6_at = h_now();
  p6 = park_await((const char *[]){d, c, a}, 3, 1, 1);

  /* p6 times out (its workers run on), having waited its 1 s parked; p5's
   * client hangs up. */
  wait_done(p6, "the await with a 1 s timeout", 30);
  ck_assert_msg(h_now() - p6_at >= 0.9, "the await with a 1 s timeout answered after %.2f s",
                h_now() - p6_at);
  {
    json_t *ans = json_loads(p6->body, 0, NULL);
    ck_assert_msg(ans && json_is_true(json_object_get(ans, "timed_out")),
                  "the await with a 1 s timeout answered %s", p6->body);
    json_decref(ans);
  }
  req_free(p5);
  wait_metric("muster_await_waiting", 4, 30);

  /* a ends: p1 (a) answers, and a's two follows end; p2 (a, b) and p4 (a,
   * a, d) wait on. */
  stop(a);
  wait_done(p1, "await a", 30);
  check_answer(p1, "await a", 1, "stopped");
  wait_done(fa1, "the first follow of a", 30);
  wait_done(fa2, "the second follow of a", 30);
  wait_metric("muster_streams_waiting", 1, 30);
  ck_assert_msg(!p2->done && !p3->done && !p4->done, "an await answered before its workers ended");
  ck_assert_int_eq(h_metric(&ctl, "muster_await_waiting"), 3);

  /* b ends: p2 answers, and b's follow ends; p3 (b, c, b) still waits on c. */
  stop(b);
  wait_done(p2, "await a, b", 30);
  check_answer(p2, "await a, b", 2, "stopped");
  wait_done(fb, "the follow of b", 30);
  wait_metric("muster_streams_waiting", 0, 30);
  ck_assert_msg(!p3->done && !p4->done, "an await answered before its workers ended");

  /* c, which the timed-out and the hung-up awaits named, ends: p3 answers. */
  stop(c);
  wait_done(p3, "await b, c, b", 30);
  check_answer(p3, "await b, c, b", 3, "stopped");
  ck_assert_msg(!p4->done, "await a, a, d answered before d ended");

  stop(d);
  wait_done(p4, "await a, a, d", 30);
  check_answer(p4, "await a, a, d", 3, "stopped");
  wait_metric("muster_await_waiting", 0, 30);

  req_free(p1);
  req_free(p2);
  req_free(p3);
  req_free(p4);
  req_free(p6);
  req_free(fa1);
  req_free(fa2);
  req_free(fb);
  curl_multi_cleanup(multi);
  json_decref(workers);
  h_finish(&ctl);
}
END_TEST

/* On one worker blocked in scheduling, an await for running and an await
 * for completion: its start answers the first only; its end the second. */
START_TEST(a_running_await_and_a_completion_await_on_one_worker_each_answer_at_their_status) {
  json_t *big, *blocked;
  const char *id;
  struct req *running, *done;

  memset(&ctl, 0, sizeof(ctl));
  ctl.extra[0] = "--cpus";
  ctl.extra[1] = "2";
  h_start(&ctl);
  multi = curl_multi_init();
  big = h_launch(&ctl, "{\"n\": 1, \"cpu\": 2, \"memory\": 0.01}");
  json_decref(h_await(&ctl, big, 0, 30));
  blocked = h_launch(&ctl, "{\"n\": 1, \"cpu\": 1, \"memory\": 0.01}");
  id = h_str(json_array_get(blocked, 0), "id");
  done = park_await((const char *[]){id}, 1, 1, 60);
  running = park_await((const char *[]){id, id}, 2, 0, 60);
  wait_metric("muster_await_waiting", 2, 30);

  stop(h_str(json_array_get(big, 0), "id"));
  wait_done(running, "the await for running", 30);
  check_answer(running, "the await for running", 2, "running");
  ck_assert_msg(!done->done, "the await for completion answered when the worker started");
  ck_assert_int_eq(h_metric(&ctl, "muster_await_waiting"), 1);

  stop(id);
  wait_done(done, "the await for completion", 30);
  check_answer(done, "the await for completion", 1, "stopped");

  req_free(running);
  req_free(done);
  curl_multi_cleanup(multi);
  json_decref(big);
  json_decref(blocked);
  h_finish(&ctl);
}
END_TEST

/* A controller told to stop answers every parked await at once, with 503
 * and the sentence that says to await again after its restart; an await
 * the stop of its worker woke just before is answered as usual. */
START_TEST(parked_awaits_are_answered_when_the_controller_shuts_down) {
  json_t *workers;
  struct req *parked[3], *woken;
  const char *last;

  workers = start_with_running(4);
  for (int i = 0; i < 3; i++)
    parked[i] = park_await((const char *[]){h_str(json_array_get(workers, i), "id")}, 1, 1, 60);
  last = h_str(json_array_get(workers, 3), "id");
  woken = park_await((const char *[]){last}, 1, 1, 60);
  wait_metric("muster_await_waiting", 4, 30);
  stop(last);
  wait_metric("muster_await_waiting", 3, 30);
  kill(ctl.pid, SIGTERM);
  for (double t0 = h_now(); h_now() - t0 < 30;) {
    int all = woken->done;

    for (int i = 0; i < 3; i++)
      all = all && parked[i]->done;
    if (all)
      break;
    pump(50);
  }
  for (int i = 0; i < 3; i++) {
    ck_assert_msg(parked[i]->done, "parked await %d was not answered within 30 s of the SIGTERM",
                  i);
    ck_assert_msg(parked[i]->status == 503 && parked[i]->body &&
                      strstr(parked[i]->body, "shutting down; await again after it restarts"),
                  "parked await %d answered %ld: %s", i, parked[i]->status,
                  parked[i]->body ? parked[i]->body : "");
    req_free(parked[i]);
  }
  wait_done(woken, "the await the stop woke", 1);
  check_answer(woken, "the await the stop woke", 1, "stopped");
  req_free(woken);
  curl_multi_cleanup(multi);
  json_decref(workers);
  h_finish(&ctl);
}
END_TEST

int main(void) {
  Suite *s = suite_create("waiters");
  TCase *tc = tcase_create("waiters");

  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, parked_awaits_answer_when_the_last_worker_they_name_ends_and_no_sooner);
  tcase_add_test(tc,
                 a_running_await_and_a_completion_await_on_one_worker_each_answer_at_their_status);
  tcase_add_test(tc, parked_awaits_are_answered_when_the_controller_shuts_down);
  suite_add_tcase(s, tc);
  return check_run(s);
}
