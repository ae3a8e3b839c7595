/* check_logs.c: a worker's logs as a user reads them, at their edges: the
 * 64 MiB cap of a stream (what is kept, and the one note that says the rest
 * was dropped, across a controller restart too), and a followed log that
 * must show a stopped worker's last output, which its workerd ships after
 * the stop was recorded, and still end by itself when a workerd dies
 * before it can say that its output is all in; and what a command run
 * through the exec channel writes, which is in the worker's log too; a log
 * POST sent again after a late answer, whose lines are there once; and the
 * exit report (which marks the log whole), never given up once answered. Real
 * controller, real workerd processes; the ordering is made certain with the
 * fault points of test builds. */
#include "harness.h"

#include "../check_run.h"
#include "muster.h"

#include <check.h>
#include <signal.h>
#include <sqlite3.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

/* The controller's cap on one stream of one worker (controller/api_worker.c). */
#define LOG_CAP (64L * 1024 * 1024)
#define NOTE "\n[muster: log truncated at 64 MiB]\n"

static struct ctl_proc ctl;

static void fresh(void) {
  memset(&ctl, 0, sizeof(ctl));
}

/* Ships n bytes of c (then NUL-free text) to worker id's stream as its
 * workerd would, and asserts that the controller took them (204). */
static void ship_to(const char *stream, const char *id, const char *auth, char c, size_t n,
                    const char *text) {
  char path[160];
  size_t tl = text ? strlen(text) : 0;
  char *body = malloc(n + tl + 1);

  ck_assert_ptr_nonnull(body);
  memset(body, c, n);
  memcpy(body + n, text ? text : "", tl);
  body[n + tl] = '\0';
  snprintf(path, sizeof(path), "/api/v1/workers/%s/logs?stream=%s", id, stream);
  ck_assert_int_eq(h_http(&ctl, "POST", path, body, auth, NULL, NULL), 204);
  free(body);
}

static void ship(const char *id, const char *auth, char c, size_t n, const char *text) {
  ship_to("stdout", id, auth, c, n, text);
}

/* What GET .../logs answers from offset on. */
static char *log_from(const char *id, long offset) {
  char path[160], *out = NULL;

  snprintf(path, sizeof(path), "/api/v1/workers/%s/logs?offset=%ld", id, offset);
  ck_assert_int_eq(h_http(&ctl, "GET", path, NULL, "", NULL, &out), 200);
  return out ? out : strdup("");
}

/* A stream that reaches the cap keeps its output up to the cap exactly (the
 * chunk that crosses it is cut there, not dropped), then says once that the
 * rest was dropped: later chunks, small or large, and a controller restart
 * add neither output nor a second note. */
START_TEST(a_log_past_64_mib_keeps_output_up_to_the_cap_and_says_truncated_once) {
  json_t *workers, *ans;
  char auth[200], id[16], *tail;
  const size_t mib = 1024 * 1024;

  fresh();
  h_start(&ctl);
  workers = h_launch(&ctl, "{\"n\": 1, \"cpu\": 0.1, \"kernel\": \"sh\", \"code\": \"true\"}");
  ans = h_await(&ctl, workers, 1, 30);
  ck_assert_int_eq(json_array_size(json_object_get(ans, "workers")), 1);
  snprintf(id, sizeof(id), "%s", h_str(json_array_get(workers, 0), "id"));
  h_worker_token(&ctl, id, auth, sizeof(auth));
  /* Up to 1000 bytes short of the cap, in POSTs of 1 MiB (the most one
   * request may carry). */
  for (long i = 0; i < LOG_CAP / (long)mib - 1; i++)
    ship(id, auth, 'a', mib, NULL);
  ship(id, auth, 'b', mib - 1000, NULL);
  /* This one crosses the cap: its first 1000 bytes fit. */
  ship(id, auth, 'c', 990, "0123456789past-the-cap\n");
  /* Small enough to fit where the note ends, and large: both dropped. */
  ship(id, auth, 'd', 0, "late line\n");
  ship(id, auth, 'e', 5000, NULL);
  h_kill9(&ctl);
  h_restart(&ctl);
  ship(id, auth, 'f', 0, "after the restart\n");
  ship(id, auth, 'g', 5000, NULL);

  tail = log_from(id, LOG_CAP - 20);
  ck_assert_msg(strcmp(tail, "cccccccccc0123456789" NOTE) == 0,
                "the log's last bytes from 20 before the cap are \"%.200s\"", tail);
  free(tail);
  json_decref(ans);
  json_decref(workers);
  h_finish(&ctl);
}
END_TEST

/* A script whose stderr passed the cap fails: its failure does not quote
 * the lines at the cap as the ones its stderr "ended with" (the real end,
 * the traceback, was never kept), it says that they were not kept. */
START_TEST(a_failure_whose_stderr_passed_the_cap_says_its_end_was_not_kept) {
  json_t *workers, *ans, *w;
  char auth[200], path[160], id[16];
  const size_t mib = 1024 * 1024;
  const char *f;

  fresh();
  h_start(&ctl);
  workers = h_launch(&ctl, "{\"n\": 1, \"cpu\": 0.1, \"kernel\": \"sh\", \"code\": \"sleep 60\"}");
  ans = h_await(&ctl, workers, 0, 30);
  ck_assert_int_eq(json_array_size(json_object_get(ans, "workers")), 1);
  snprintf(id, sizeof(id), "%s", h_str(json_array_get(workers, 0), "id"));
  h_worker_token(&ctl, id, auth, sizeof(auth));
  for (long i = 0; i < LOG_CAP / (long)mib; i++)
    ship_to("stderr", id, auth, 'a', mib - 10, "line past\n");
  ship_to("stderr", id, auth, 'b', 0, "Traceback: the real end\n");
  snprintf(path, sizeof(path), "/api/v1/workers/%s/exit", id);
  ck_assert_int_eq(h_http(&ctl, "POST", path, "{\"exit_code\": 1}", auth, NULL, NULL), 200);
  w = h_wait_status(&ctl, id, "failed", 20);
  f = h_str(w, "failure");
  ck_assert_msg(f && strcmp(f, "the script exited with code 1; its stderr passed 64 MiB, so its "
                               "last lines were not kept") == 0,
                "%s", f ? f : "(none)");
  json_decref(w);
  json_decref(ans);
  json_decref(workers);
  h_finish(&ctl);
}
END_TEST

/* The whole of a file (malloc'ed; "" if it is missing). */
static char *slurp(const char *path) {
  FILE *f = fopen(path, "r");
  char *s = calloc(1, 65536);
  size_t n = 0;

  ck_assert_ptr_nonnull(s);
  if (f) {
    n = fread(s, 1, 65535, f);
    fclose(f);
  }
  s[n] = '\0';
  return s;
}

/* A worker whose script answers the stop with a last line: its workerd
 * ships that line only after the controller recorded the stop (made certain
 * by a fault point that holds back whatever workerd ships once it is
 * stopping). A client following the log still gets it, and the follow ends
 * by itself as soon as the worker's last output is in. */
START_TEST(a_stopped_workers_last_output_reaches_logs_follow) {
  json_t *workers;
  char out[200], body[100], *text = NULL;
  const char *id;
  pid_t follower;
  int status;
  double t0;

  fresh();
  setenv("MUSTER_FAULT", "workerd_ship_after_stop:delay=1500", 1);
  ctl.extra[0] = "--stop-grace";
  ctl.extra[1] = "30";
  h_start(&ctl);
  unsetenv("MUSTER_FAULT");
  workers = h_launch(&ctl, "{\"n\": 1, \"cpu\": 0.1, \"kernel\": \"bash\", \"code\": "
                           "\"trap 'echo last words; exit 0' TERM; echo first words; "
                           "while :; do sleep 0.05; done\"}");
  id = h_str(json_array_get(workers, 0), "id");
  snprintf(out, sizeof(out), "%s.follow", ctl.dir);
  follower = h_sh_bg("exec curl -sN -m 60 -H 'Authorization: Bearer %s' "
                     "'%s/api/v1/workers/%s/logs?follow=1' > %s",
                     ctl.token, ctl.url, id, out);
  for (double until = h_now() + 30; !strstr(text = slurp(out), "first words\n"); usleep(50000)) {
    ck_assert_msg(h_now() < until, "the followed log did not show the first line in 30 s: \"%s\"",
                  text);
    free(text);
  }
  free(text);
  snprintf(body, sizeof(body), "{\"ids\": [\"%s\"]}", id);
  t0 = h_now();
  ck_assert_int_eq(h_http(&ctl, "POST", "/api/v1/workers/stop", body, "", NULL, NULL), 200);
  ck_assert_int_eq(waitpid(follower, &status, 0), follower);
  text = slurp(out);
  ck_assert_msg(strcmp(text, "first words\nlast words\n") == 0,
                "logs -f showed \"%s\", without the worker's last line", text);
  ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0,
                "the follow did not end by itself (curl exit status %d)",
                WIFEXITED(status) ? WEXITSTATUS(status) : -1);
  /* It ended when the last output came, not at the bound of the wait for
   * it (the stop grace of 30 s, and more). */
  ck_assert_msg(h_now() - t0 < 20, "the follow took %.1f s to end after the stop", h_now() - t0);
  free(text);
  unlink(out);
  json_decref(workers);
  h_finish(&ctl);
}
END_TEST

/* A worker whose workerd dies (kill -9) never says that its output is all
 * in: a followed log still ends by itself, soon after the worker's end (the
 * stop grace, 0 here, and 5 s), with what was shipped. */
START_TEST(a_followed_log_of_a_worker_whose_workerd_died_still_ends) {
  json_t *workers, *w;
  char out[200], *text = NULL;
  const char *id;
  pid_t follower;
  int status;
  long wd;
  double t0;

  fresh();
  ctl.extra[0] = "--stop-grace";
  ctl.extra[1] = "0";
  ctl.extra[2] = "--heartbeat-interval";
  ctl.extra[3] = "0.3";
  ctl.extra[4] = "--heartbeat-timeout";
  ctl.extra[5] = "2";
  h_start(&ctl);
  workers = h_launch(&ctl, "{\"n\": 1, \"cpu\": 0.1, \"kernel\": \"sh\", \"code\": "
                           "\"echo only words; exec sleep 600\"}");
  id = h_str(json_array_get(workers, 0), "id");
  snprintf(out, sizeof(out), "%s.follow", ctl.dir);
  follower = h_sh_bg("exec curl -sN -m 60 -H 'Authorization: Bearer %s' "
                     "'%s/api/v1/workers/%s/logs?follow=1' > %s",
                     ctl.token, ctl.url, id, out);
  for (double until = h_now() + 30; !strstr(text = slurp(out), "only words\n"); usleep(50000)) {
    ck_assert_msg(h_now() < until, "the followed log did not show the first line in 30 s: \"%s\"",
                  text);
    free(text);
  }
  free(text);
  wd = h_workerd_pid(&ctl, id);
  t0 = h_now();
  ck_assert_int_eq(kill(-(pid_t)wd, SIGKILL), 0);
  w = h_wait_status(&ctl, id, "failed", 20);
  json_decref(w);
  ck_assert_int_eq(waitpid(follower, &status, 0), follower);
  text = slurp(out);
  ck_assert_msg(strcmp(text, "only words\n") == 0, "logs -f showed \"%s\"", text);
  ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0,
                "the follow did not end by itself (curl exit status %d)",
                WIFEXITED(status) ? WEXITSTATUS(status) : -1);
  ck_assert_msg(h_now() - t0 < 30, "the follow took %.1f s to end after the kill", h_now() - t0);
  free(text);
  unlink(out);
  json_decref(workers);
  h_finish(&ctl);
}
END_TEST

/* A command run through the exec channel (as muster exec and every rank of
 * muster run are) in a worker whose script keeps writing lines: by the time
 * the exec call returns, the worker's log (GET .../logs, what muster logs
 * and the web UI show) has the command's stdout and stderr, each line whole
 * though the command wrote it in two pieces with the script's lines in
 * between, and its unended last line ended. */
START_TEST(an_exec_commands_output_is_in_the_workers_log_when_exec_returns) {
  const char *argv[] = {"sh", "-c",
                        "printf 'exec-'; sleep 0.3; echo 'line-1'; "
                        "printf 'err-' >&2; sleep 0.3; echo 'line-2' >&2; printf 'unended'"};
  json_t *workers, *w;
  muster_client *cl = NULL;
  muster_exec_target t;
  muster_exec_opts o;
  char err[256], path[160], *text = NULL;
  const char *id;
  int code = -1;

  fresh();
  h_start(&ctl);
  workers = h_launch(&ctl, "{\"n\": 1, \"cpu\": 0.1, \"kernel\": \"bash\", \"code\": "
                           "\"while :; do echo script-line; sleep 0.02; done\"}");
  id = h_str(json_array_get(workers, 0), "id");
  w = h_wait_status(&ctl, id, "running", 30);
  json_decref(w);
  ck_assert_int_eq(muster_client_new(ctl.url, ctl.token, &cl), 0);
  ck_assert_int_eq(muster_exec_target_get(cl, id, &t), 0);
  muster_exec_opts_init(&o);
  o.argv = argv;
  o.argc = 3;
  o.stdout_fd = o.stderr_fd = -1;
  ck_assert_int_eq(muster_exec_at(&t, &o, &code, err, sizeof(err)), 0);
  ck_assert_int_eq(code, 0);

  text = log_from(id, 0);
  ck_assert_msg(strstr(text, "script-line\n"), "the script's own lines are missing: \"%.300s\"",
                text);
  ck_assert_msg(strstr(text, "\nexec-line-1\n"),
                "muster logs does not show the exec'd command's line \"exec-line-1\" whole: "
                "\"%.2000s\"",
                text);
  ck_assert_msg(strstr(text, "\nunended\n"),
                "muster logs does not show the exec'd command's unended last line: \"%.2000s\"",
                text);
  free(text);
  snprintf(path, sizeof(path), "/api/v1/workers/%s/logs?stream=stderr", id);
  text = NULL;
  ck_assert_int_eq(h_http(&ctl, "GET", path, NULL, "", NULL, &text), 200);
  ck_assert_msg(text && strcmp(text, "err-line-2\n") == 0,
                "muster logs --stderr shows \"%s\", not the exec'd command's \"err-line-2\"",
                text ? text : "");
  free(text);
  muster_client_free(cl);
  json_decref(workers);
  h_finish(&ctl);
}
END_TEST

/* How many times needle is in text. */
static int count_of(const char *text, const char *needle) {
  int n = 0;

  for (const char *p = text; (p = strstr(p, needle)) != NULL; p += strlen(needle))
    n++;
  return n;
}

/* A log POST that the controller delivered but answered after the workerd
 * gave up waiting (10 s) is sent again: the controller adds only what is
 * new, and says so, and the line is in the worker's log once. (It was
 * there twice.) The first POST's answer is held 11 s after it was stored
 * (log_appended_answer_slow, once); heartbeats are given a minute, since
 * the held thread holds its other connections too. */
START_TEST(a_log_post_sent_again_after_its_answer_was_lost_adds_its_lines_once) {
  char grep[400], *text = NULL;
  json_t *workers;
  const char *id;
  int n = 0, said = 0;

  fresh();
  setenv("MUSTER_FAULT", "log_appended_answer_slow:delay=11000*1", 1);
  ctl.extra[0] = "--heartbeat-timeout";
  ctl.extra[1] = "60";
  h_start(&ctl);
  unsetenv("MUSTER_FAULT");
  workers = h_launch(&ctl, "{\"n\": 1, \"cpu\": 0.1, \"kernel\": \"bash\", \"code\": "
                           "\"echo said-once; sleep 120\"}");
  id = h_str(json_array_get(workers, 0), "id");
  snprintf(grep, sizeof(grep), "grep -qs '%s: left out .* that an earlier POST' %s", id, ctl.log);
  /* (until the line is there twice, or once and the controller said it
   * left the second out: the held POST has ended either way) */
  for (double until = h_now() + 60; n < 2 && !(n == 1 && said); usleep(100 * 1000)) {
    ck_assert_msg(h_now() < until,
                  "after 60 s worker %s's log holds \"said-once\" %d times, and the controller "
                  "%s that it left a POST sent again out (%s)",
                  id, n, said ? "said" : "did not say", ctl.log);
    free(text);
    text = log_from(id, 0);
    n = count_of(text, "said-once\n");
    said = system(grep) == 0;
  }
  ck_assert_msg(n == 1, "worker %s's log holds its one line %d times: \"%s\"", id, n, text);
  free(text);
  json_decref(workers);
  h_finish(&ctl);
}
END_TEST

/* The exit report's answer is taken whatever the time: a loop that comes
 * to it only at the report's deadline (a loaded host; the fault point
 * workerd_exit_answer_late) still finds the report taken, and says so.
 * (It gave it up: "ending without the exit report", and exited 1.) */
START_TEST(an_exit_report_answered_in_time_is_never_given_up) {
  char path[300], *text = NULL;
  json_t *workers, *w;
  const char *id;

  fresh();
  setenv("MUSTER_FAULT", "workerd_exit_answer_late:fail=1", 1);
  h_start(&ctl);
  unsetenv("MUSTER_FAULT");
  workers = h_launch(&ctl, "{\"n\": 1, \"cpu\": 0.1, \"kernel\": \"bash\", \"code\": "
                           "\"echo done\"}");
  id = h_str(json_array_get(workers, 0), "id");
  w = h_wait_status(&ctl, id, "succeeded", 60);
  snprintf(path, sizeof(path), "%s/workers/%s.log", ctl.dir, id);
  /* (until its workerd says how its report ended, either way) */
  for (double until = h_now() + 30;; usleep(50 * 1000)) {
    free(text);
    text = slurp(path);
    if (strstr(text, "reported the exit") || strstr(text, "without the exit report"))
      break;
    ck_assert_msg(h_now() < until,
                  "worker %s's workerd did not say how its report ended in 30 s: %s", id, path);
  }
  ck_assert_msg(strstr(text, "fault injection: workerd_exit_answer_late: fails"),
                "worker %s's workerd never came to its exit report's answer late: %s", id, path);
  ck_assert_msg(strstr(text, "reported the exit") && !strstr(text, "without the exit report"),
                "worker %s's workerd gave up an exit report the controller took: \"%s\"", id, text);
  free(text);
  json_decref(w);
  json_decref(workers);
  h_finish(&ctl);
}
END_TEST

int main(void) {
  Suite *s = suite_create("logs");
  TCase *tc = tcase_create("logs");

  tcase_set_timeout(tc, 180);
  tcase_add_test(tc, a_log_past_64_mib_keeps_output_up_to_the_cap_and_says_truncated_once);
  tcase_add_test(tc, a_failure_whose_stderr_passed_the_cap_says_its_end_was_not_kept);
  tcase_add_test(tc, a_stopped_workers_last_output_reaches_logs_follow);
  tcase_add_test(tc, a_followed_log_of_a_worker_whose_workerd_died_still_ends);
  tcase_add_test(tc, an_exec_commands_output_is_in_the_workers_log_when_exec_returns);
  tcase_add_test(tc, a_log_post_sent_again_after_its_answer_was_lost_adds_its_lines_once);
  tcase_add_test(tc, an_exit_report_answered_in_time_is_never_given_up);
  suite_add_tcase(s, tc);
  return check_run(s);
}
