/* check_heartbeat.c: heartbeat intervals that grow with the number of live
 * workers (--heartbeat-rate, docs/internals/controller.md "Heartbeats"):
 * what the register and heartbeat answers tell, the timeout that follows
 * the interval a worker was told (also across a controller restart), and a
 * real muster-workerd that beats at the interval its answers carry. The
 * test plays the workerd of an external-backend worker where it must see
 * the answers themselves. And the checkpointer that copies the log those
 * writes fill. */
#include "harness.h"

#include "../check_run.h"

#include <check.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static struct ctl_proc ctl;

/* A controller whose intervals stretch early: 2 heartbeats a second, so
 * that n starting or running workers are told max(0.5 s, n / 2 s); a
 * worker is lost after timeout seconds without a word (or, once it was
 * told an interval longer than the configured 0.5 s, 4 of that interval,
 * if longer); cpus: the local backend's cores (NULL: all). */
static void start_with(const char *backend, const char *cpus, const char *timeout) {
  memset(&ctl, 0, sizeof(ctl));
  ctl.extra[0] = "--backend";
  ctl.extra[1] = backend;
  ctl.extra[2] = "--heartbeat-rate";
  ctl.extra[3] = "2";
  ctl.extra[4] = "--heartbeat-interval";
  ctl.extra[5] = "0.5";
  ctl.extra[6] = "--heartbeat-timeout";
  ctl.extra[7] = timeout;
  ctl.extra[8] = "--start-timeout";
  ctl.extra[9] = "600";
  if (cpus) {
    ctl.extra[10] = "--cpus";
    ctl.extra[11] = cpus;
  }
  h_start(&ctl);
}

static void start(const char *backend) {
  start_with(backend, NULL, "3");
}

/* Launches n workers in session; returns their ids (new reference). */
static json_t *launch(int n, const char *session) {
  char body[200];

  snprintf(body, sizeof(body), "{\"n\": %d, \"cpu\": 0.01, \"memory\": 0.01, \"session\": \"%s\"}",
           n, session);
  return h_launch(&ctl, body);
}

/* Launches n workers of the external backend in session and waits until
 * each is starting: only then do they count among those that heartbeat
 * (the scheduling pass moves them there after the launch's answer). */
static json_t *launch_started(int n, const char *session) {
  json_t *ws = launch(n, session);

  for (int i = 0; i < n; i++)
    json_decref(h_wait_status(&ctl, h_str(json_array_get(ws, (size_t)i), "id"), "starting", 30));
  return ws;
}

static double told(json_t *answer) {
  json_t *v = json_object_get(answer, "heartbeat_interval_seconds");

  ck_assert_msg(json_is_number(v), "the answer tells no heartbeat interval");
  return json_number_value(v);
}

/* Stops every worker of session (the controller's own token). */
static void stop_session(const char *session) {
  char body[120];

  snprintf(body, sizeof(body), "{\"session\": \"%s\"}", session);
  ck_assert_int_eq(h_http(&ctl, "POST", "/api/v1/workers/stop", body, "", NULL, NULL), 200);
}

/* Column col of worker id's row, as text in buf ("" for NULL). */
static void row_text(const char *id, const char *col, char *buf, size_t len) {
  char path[160], sql[200];
  sqlite3 *db;
  sqlite3_stmt *st;

  snprintf(path, sizeof(path), "%s/muster.db", ctl.dir);
  snprintf(sql, sizeof(sql), "SELECT %s FROM workers WHERE id = ?1", col);
  ck_assert_int_eq(sqlite3_open_v2(path, &db, SQLITE_OPEN_READONLY, NULL), SQLITE_OK);
  sqlite3_busy_timeout(db, 5000);
  ck_assert_int_eq(sqlite3_prepare_v2(db, sql, -1, &st, NULL), SQLITE_OK);
  sqlite3_bind_text(st, 1, id, -1, SQLITE_TRANSIENT);
  buf[0] = '\0';
  if (sqlite3_step(st) == SQLITE_ROW && sqlite3_column_type(st, 0) != SQLITE_NULL)
    snprintf(buf, len, "%s", (const char *)sqlite3_column_text(st, 0));
  sqlite3_finalize(st);
  sqlite3_close(db);
}

/* The stored heartbeat interval of worker id in ms, or -1 for none. */
static long long row_interval(const char *id) {
  char v[32];

  row_text(id, "heartbeat_interval_ms", v, sizeof(v));
  return v[0] ? atoll(v) : -1;
}

/* The stored time of worker id's last heartbeat (ISO text). */
static void last_beat(const char *id, char *buf, size_t len) {
  row_text(id, "last_heartbeat", buf, len);
}

/* Waits (timeout_s at most) until worker id's stored heartbeat interval is
 * ms: the controller writes it with the heartbeats, a second late at most. */
static void wait_stored_interval(const char *id, long long ms, double timeout_s) {
  double until = h_now() + timeout_s;
  long long v;

  while ((v = row_interval(id)) != ms && h_now() < until)
    usleep(50 * 1000);
  ck_assert_msg(v == ms, "%s's stored heartbeat interval is %lld ms, not %lld", id, v, ms);
}

/* The register and heartbeat answers tell max(--heartbeat-interval, live /
 * --heartbeat-rate), and so does /metrics: it grows as workers are launched
 * and shrinks as they end. */
START_TEST(the_interval_grows_and_shrinks_with_the_live_workers) {
  json_t *one, *more, *ans;
  const char *id;

  /* (the test speaks for its worker between launches that a loaded
   * machine may take seconds over: it is about intervals, not losses) */
  start_with("external", NULL, "60");
  one = launch_started(1, "one");
  id = h_str(json_array_get(one, 0), "id");
  ans = h_worker_call(&ctl, id, "register", "{\"ip_address\": \"127.0.0.1\", \"attempt\": 1}");
  ck_assert_double_eq_tol(told(ans), 0.5, 1e-9); /* 1 live: the configured 0.5 s */
  json_decref(ans);
  ck_assert_double_eq_tol(h_metric(&ctl, "muster_heartbeat_interval_seconds"), 0.5, 1e-9);

  more = launch_started(9, "more"); /* 10 live at 2 a second: every 5 s */
  ans = h_worker_call(&ctl, id, "heartbeat", "{}");
  ck_assert(json_is_false(json_object_get(ans, "stop")));
  ck_assert_double_eq_tol(told(ans), 5.0, 1e-9);
  json_decref(ans);
  ck_assert_double_eq_tol(h_metric(&ctl, "muster_heartbeat_interval_seconds"), 5.0, 1e-9);
  wait_stored_interval(id, 5000, 10);

  stop_session("more");
  ans = h_worker_call(&ctl, id, "heartbeat", "{}");
  ck_assert_double_eq_tol(told(ans), 0.5, 1e-9);
  json_decref(ans);
  ck_assert_double_eq_tol(h_metric(&ctl, "muster_heartbeat_interval_seconds"), 0.5, 1e-9);
  json_decref(more);
  json_decref(one);
  h_finish(&ctl);
}
END_TEST

/* Launches 4 workers (at 2 heartbeats a second: every 2 s, lost after 8 s
 * rather than 3) and registers the first, which is told 2 s; returns the
 * 4 (new reference) and the first's id. */
static json_t *register_one_of_four(const char **id) {
  json_t *ws = launch_started(4, "four"), *ans;

  *id = h_str(json_array_get(ws, 0), "id");
  ans = h_worker_call(&ctl, *id, "register", "{\"ip_address\": \"127.0.0.1\", \"attempt\": 1}");
  ck_assert_double_eq_tol(told(ans), 2.0, 1e-9);
  json_decref(ans);
  return ws;
}

/* Workers that wait for room (or in a queue) send no heartbeats: they do
 * not stretch the interval of those that do. */
START_TEST(workers_waiting_for_room_do_not_stretch_the_interval) {
  json_t *ws, *ans;
  const char *id;

  start_with("local", "1", "3");
  ws = h_launch(&ctl, "{\"n\": 10, \"cpu\": 1, \"memory\": 0.01}"); /* 1 runs, 9 wait */
  id = h_str(json_array_get(ws, 0), "id");
  json_decref(h_wait_status(&ctl, id, "running", 60));
  ans = h_worker(&ctl, h_str(json_array_get(ws, 9), "id"));
  ck_assert_str_eq(h_str(ans, "status"), "scheduling");
  json_decref(ans);
  ck_assert_double_eq_tol(h_metric(&ctl, "muster_heartbeat_interval_seconds"), 0.5, 1e-9);
  json_decref(ws);
  h_finish(&ctl);
}
END_TEST

/* An answer telling a shorter interval can be lost (a timeout, a reset):
 * the worker beats at the longer one still, and is judged by the longer of
 * the last two intervals told, not lost 3 s after the answer it never got. */
START_TEST(a_lost_answer_shortening_the_interval_loses_no_worker) {
  json_t *one, *more, *ans, *w;
  const char *id;
  double told_at;

  start("external");
  one = launch_started(1, "one");
  more = launch_started(9, "more"); /* 10 live: every 5 s */
  id = h_str(json_array_get(one, 0), "id");
  ans = h_worker_call(&ctl, id, "register", "{\"ip_address\": \"127.0.0.1\", \"attempt\": 1}");
  ck_assert_double_eq_tol(told(ans), 5.0, 1e-9);
  json_decref(ans);
  stop_session("more");
  ans = h_worker_call(&ctl, id, "heartbeat", "{}"); /* tells 0.5 s: taken as lost */
  told_at = h_now();
  ck_assert_double_eq_tol(told(ans), 0.5, 1e-9);
  json_decref(ans);
  /* The next heartbeat comes at the 5 s interval it still beats at: more
   * than the 3 s timeout of 0.5 s later, well within 4 of 5 s. */
  while (h_now() - told_at < 4.5)
    usleep(100 * 1000);
  w = h_worker(&ctl, id);
  ck_assert_msg(strcmp(h_str(w, "status"), "running") == 0, "%s after 4.5 s: %s",
                h_str(w, "status"), h_str(w, "failure"));
  json_decref(w);
  ans = h_worker_call(&ctl, id, "heartbeat", "{}");
  ck_assert(json_is_false(json_object_get(ans, "stop")));
  json_decref(ans);
  json_decref(more);
  json_decref(one);
  h_finish(&ctl);
}
END_TEST

/* A worker told a stretched interval is lost after 4 of them, not after
 * the configured timeout, and the failure says which timeout it was. */
START_TEST(a_silent_worker_is_lost_after_four_of_its_intervals) {
  json_t *ws, *w;
  const char *id;
  double t0;

  start("external");
  t0 = h_now(); /* (before the register: its time is the last word) */
  ws = register_one_of_four(&id);
  w = h_wait_status(&ctl, id, "failed", 60);
  ck_assert_msg(h_now() - t0 >= 7.9, "lost %.1f s after its last word, before 4 intervals of 2 s",
                h_now() - t0);
  ck_assert_msg(strstr(h_str(w, "failure"), "no heartbeat for 8 s (the heartbeat timeout: 4 of "
                                            "its 2 s heartbeat intervals"),
                "failure: %s", h_str(w, "failure"));
  json_decref(w);
  json_decref(ws);
  h_finish(&ctl);
}
END_TEST

/* Restarts the killed controller, which tells now_told (s), and waits for
 * worker id (told 2 s before the crash, silent since) to be lost: not
 * before 4 of its 2 s intervals, and saying so. */
static void restart_and_lose_after_8_s(const char *id, double now_told) {
  double t0 = h_now();
  json_t *w;

  h_restart(&ctl);
  ck_assert_double_eq_tol(h_metric(&ctl, "muster_heartbeat_interval_seconds"), now_told, 1e-9);
  w = h_wait_status(&ctl, id, "failed", 60);
  ck_assert_msg(h_now() - t0 >= 7.9, "lost %.1f s after the restart, before 4 intervals of 2 s",
                h_now() - t0);
  ck_assert_msg(strstr(h_str(w, "failure"), "no heartbeat for 8 s"), "failure: %s",
                h_str(w, "failure"));
  json_decref(w);
}

/* A restarted controller gives each worker the timeout of the interval it
 * was told before the restart (stored with its heartbeats), even when it
 * would tell a shorter one now. */
START_TEST(a_restarted_controller_keeps_the_interval_its_workers_beat_at) {
  json_t *ws;
  const char *id;

  start("external");
  ws = register_one_of_four(&id);
  wait_stored_interval(id, 2000, 10);
  h_kill9(&ctl);
  /* Without a rate the new controller would tell 0.5 s (a 3 s timeout). */
  ctl.extra[3] = "0";
  restart_and_lose_after_8_s(id, 0.5);
  json_decref(ws);
  h_finish(&ctl);
}
END_TEST

#ifdef MUSTER_FAULT_INJECTION
/* A worker told a stretched interval that was never written (the flush
 * fails every time: a fault point) keeps it across a crash: the restored
 * worker is judged by the interval of the workers restored, as many as it
 * was told it for, not by the configured one. */
START_TEST(an_interval_not_yet_written_survives_a_crash) {
  json_t *ws;
  const char *id;

  setenv("MUSTER_FAULT", "heartbeat_flush:fail=1000000", 1);
  start("external");
  unsetenv("MUSTER_FAULT");
  ws = register_one_of_four(&id);
  h_kill9(&ctl);
  ck_assert_int_eq(row_interval(id), -1); /* never written */
  restart_and_lose_after_8_s(id, 2.0);
  json_decref(ws);
  h_finish(&ctl);
}
END_TEST
#endif

/* A real muster-workerd beats at the interval each answer tells: registered
 * among 10 live workers (every 5 s), it beats every 0.5 s once the other 9
 * are stopped (else it would be lost 3 s after the first short answer),
 * and stays running. */
START_TEST(a_workerd_follows_the_interval_its_answers_tell) {
  json_t *ws, *w;
  const char *id;
  long long beats = 0;
  char beat[40];
  double until;

  start("local");
  ws = launch(1, "one");
  id = h_str(json_array_get(ws, 0), "id");
  json_decref(launch(9, "nine"));
  json_decref(h_await(&ctl, ws, 0, 60));
  wait_stored_interval(id, 5000, 20);
  stop_session("nine");
  wait_stored_interval(id, 500, 20);
  /* Six more beats, each stored with its time (at most a second late): at
   * 0.5 s they take about 3 s; at the 5 s it was first told, 30 s. */
  last_beat(id, beat, sizeof(beat));
  until = h_now() + 20;
  while (beats < 6 && h_now() < until) {
    char b[40];

    last_beat(id, b, sizeof(b));
    if (strcmp(b, beat) != 0) {
      beats++;
      snprintf(beat, sizeof(beat), "%s", b);
    }
    usleep(100 * 1000);
  }
  ck_assert_msg(beats >= 6, "only %lld heartbeats stored in 20 s at a 0.5 s interval", beats);
  w = h_worker(&ctl, id);
  ck_assert_str_eq(h_str(w, "status"), "running");
  json_decref(w);
  json_decref(ws);
  h_finish(&ctl);
}
END_TEST

/* Waits (5 s at most) until the controller counts no more open connections
 * than base; what: when, for the message. */
static void wait_connections(double base, const char *what) {
  double open = 0;

  for (double until = h_now() + 5; h_now() < until; usleep(100 * 1000))
    if ((open = h_metric(&ctl, "muster_http_connections")) <= base)
      return;
  ck_assert_msg(0, "%g connections open %s, %g before the worker (for 5 s)", open, what, base);
}

/* The fewest connections the controller counts open in half a second (one
 * of them the asking one). */
static double connections_now(void) {
  double least = h_metric(&ctl, "muster_http_connections");

  for (int i = 0; i < 5; i++) {
    double n;

    usleep(100 * 1000);
    n = h_metric(&ctl, "muster_http_connections");
    least = n < least ? n : least;
  }
  return least;
}

/* A workerd told an interval past 10 s keeps no connection to the
 * controller while it waits: 100,000 workers beating every 20 s would
 * otherwise hold 100,000 of its connections, past the 60,000 it takes. The
 * open connections fall back to those before it after its register, after
 * a heartbeat, and 2 s after a log POST of a worker that printed once. */
START_TEST(a_worker_told_a_long_interval_holds_no_connection_while_it_waits) {
  json_t *ws;
  const char *id;
  double base, registered;
  char *out = NULL, path[96];

  memset(&ctl, 0, sizeof(ctl));
  ctl.extra[0] = "--heartbeat-interval";
  ctl.extra[1] = "12";
  ctl.extra[2] = "--heartbeat-timeout";
  ctl.extra[3] = "60";
  h_start(&ctl);
  base = connections_now();
  ws = launch(1, "long");
  id = h_str(json_array_get(ws, 0), "id");
  json_decref(h_await(&ctl, ws, 0, 60));
  registered = h_wall();
  wait_connections(base, "after its register");
  h_wait_beat_after(&ctl, id, registered + 1, 40);
  wait_connections(base, "after a heartbeat");
  json_decref(ws);
  /* One that prints once, then waits: its log POST's connection goes
   * after 2 s, long before its first heartbeat (12 s). */
  ws = h_launch(&ctl, "{\"n\": 1, \"cpu\": 0.01, \"memory\": 0.01, \"kernel\": \"sh\", "
                      "\"code\": \"echo printed-once; exec sleep 600\"}");
  snprintf(path, sizeof(path), "/api/v1/workers/%s/logs", h_str(json_array_get(ws, 0), "id"));
  for (double until = h_now() + 30; !(out && strstr(out, "printed-once")); usleep(100 * 1000)) {
    ck_assert_msg(h_now() < until, "the worker's line was not shipped within 30 s: %s",
                  out ? out : "");
    free(out);
    out = NULL;
    ck_assert_int_eq(h_http(&ctl, "GET", path, NULL, "", NULL, &out), 200);
  }
  free(out);
  wait_connections(base, "2 s after a log POST");
  json_decref(ws);
  h_finish(&ctl);
}
END_TEST

/* The controller's writes (here a launch's) fill the database's
 * write-ahead log; the checkpointer thread copies it into the database
 * (outside the state lock), so that the writer's own checkpoint (at 20,000
 * pages, tens of milliseconds under the state lock) never comes due. */
START_TEST(the_checkpointer_copies_the_log_the_writes_fill) {
  json_t *ws;

  start("external");
  ws = launch_started(50, "ck");
  for (double until = h_now() + 15; h_metric(&ctl, "muster_db_log_checkpointed_frames") <= 0;
       usleep(100 * 1000))
    ck_assert_msg(h_now() < until,
                  "the checkpointer copied nothing in 15 s (the log at its last look: %.0f "
                  "frames)",
                  h_metric(&ctl, "muster_db_log_frames"));
  json_decref(ws);
  h_finish(&ctl);
}
END_TEST

int main(void) {
  Suite *s = suite_create("heartbeat");
  TCase *tc = tcase_create("heartbeat");

  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, the_interval_grows_and_shrinks_with_the_live_workers);
  tcase_add_test(tc, workers_waiting_for_room_do_not_stretch_the_interval);
  tcase_add_test(tc, a_lost_answer_shortening_the_interval_loses_no_worker);
  tcase_add_test(tc, a_silent_worker_is_lost_after_four_of_its_intervals);
  tcase_add_test(tc, a_restarted_controller_keeps_the_interval_its_workers_beat_at);
  tcase_add_test(tc, a_workerd_follows_the_interval_its_answers_tell);
  tcase_add_test(tc, a_worker_told_a_long_interval_holds_no_connection_while_it_waits);
  tcase_add_test(tc, the_checkpointer_copies_the_log_the_writes_fill);
#ifdef MUSTER_FAULT_INJECTION
  tcase_add_test(tc, an_interval_not_yet_written_survives_a_crash);
#endif
  suite_add_tcase(s, tc);
  return check_run(s);
}
