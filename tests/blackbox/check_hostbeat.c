/* check_hostbeat.c: liveness per host (--host-beat, docs/internals/
 * controller.md "Liveness per host"): the workerds of one host beat as one
 * (the agent's heartbeat carries its siblings'), and yet a hung sibling is
 * still lost and named, a hung agent's siblings beat on their own, and the
 * end of the agent hands the beat to another. Real local workers. */
#include "harness.h"

#include "../check_run.h"

#include <check.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static struct ctl_proc ctl;

/* A controller whose workerds always beat per host, every 0.5 s; a worker
 * is lost after 5 s without a word. n idle workers, running; their ids in
 * ids. Returns the workers (new reference). */
static json_t *start_running(int n, const char **ids) {
  char body[160];
  json_t *ws;

  memset(&ctl, 0, sizeof(ctl));
  ctl.extra[0] = "--host-beat";
  ctl.extra[1] = "on";
  ctl.extra[2] = "--heartbeat-interval";
  ctl.extra[3] = "0.5";
  ctl.extra[4] = "--heartbeat-timeout";
  ctl.extra[5] = "5";
  h_start(&ctl);
  snprintf(body, sizeof(body), "{\"n\": %d, \"cpu\": 0.01, \"memory\": 0.01}", n);
  ws = h_launch(&ctl, body);
  json_decref(h_await(&ctl, ws, 0, 60));
  for (int i = 0; i < n; i++)
    ids[i] = h_str(json_array_get(ws, (size_t)i), "id");
  return ws;
}

/* Waits (30 s at most) until the controller counts more than `more`
 * heartbeats vouched for since it counted `since`; returns the count. */
static double wait_vouched(double since, double more, const char *what) {
  double v = since;

  for (double until = h_now() + 30; h_now() < until; usleep(100 * 1000))
    if ((v = h_metric(&ctl, "muster_heartbeats_vouched_total")) > since + more)
      return v;
  ck_assert_msg(0, "%g heartbeats vouched for in 30 s %s (%g wanted)", v - since, what, more);
  return v;
}

/* The pid holding the host directory's lock (the agent's workerd), from
 * /proc/locks; 0 if none does (10 s at most). */
static long agent_pid(void) {
  char path[200], line[256];
  struct stat st;

  snprintf(path, sizeof(path), "%s/host/agent.lock", ctl.dir);
  for (double until = h_now() + 10; h_now() < until; usleep(100 * 1000)) {
    FILE *f = fopen("/proc/locks", "r");
    long pid = 0;

    if (stat(path, &st) != 0 || !f) {
      if (f)
        fclose(f);
      continue;
    }
    while (!pid && fgets(line, sizeof(line), f)) {
      long p;
      unsigned long long ino;

      if (strstr(line, "FLOCK") &&
          sscanf(line, "%*s FLOCK %*s %*s %ld %*x:%*x:%llu", &p, &ino) == 2 &&
          ino == (unsigned long long)st.st_ino)
        pid = p;
    }
    fclose(f);
    if (pid)
      return pid;
  }
  return 0;
}

/* The index in ids (n workers, n-1 of them vouched for already) of the
 * agent's worker; its workerd's pid in *pid. */
static int agent_of(const char **ids, int n, long *pid) {
  wait_vouched(0, n - 1, "after the start");
  *pid = agent_pid();
  ck_assert_msg(*pid > 0, "no workerd holds %s/host/agent.lock", ctl.dir);
  for (int i = 0; i < n; i++)
    if (h_workerd_pid(&ctl, ids[i]) == *pid)
      return i;
  ck_assert_msg(0, "the lock's holder %ld is no worker's workerd", *pid);
  return -1;
}

/* Each of the n workers but ids[skip] (-1: none) beats after `after` (its
 * heartbeat stored) and is running; what: since when, for the message. */
static void others_run_on(const char **ids, int n, int skip, double after, const char *what) {
  for (int i = 0; i < n; i++) {
    json_t *w;

    if (i == skip)
      continue;
    h_wait_beat_after(&ctl, ids[i], after, 30);
    w = h_worker(&ctl, ids[i]);
    ck_assert_msg(strcmp(h_str(w, "status"), "running") == 0, "%s is %s %s: %s", ids[i],
                  h_str(w, "status"), what, h_str(w, "failure"));
    json_decref(w);
  }
}

/* Four workers on one host: their heartbeats reach the controller in one
 * call an interval, the agent's, which speaks for the three others; all
 * four stay running, each heartbeat stored. */
START_TEST(a_hosts_workers_beat_in_one_call) {
  const char *ids[4];
  json_t *ws = start_running(4, ids);
  double v0, c0, v1, c1, t0;

  /* (the three siblings beat on their own until the agent's first answer
   * for them) */
  wait_vouched(0, 3, "after the start");
  v0 = h_metric(&ctl, "muster_heartbeats_vouched_total");
  c0 = h_metric(&ctl, "muster_heartbeat_calls_total");
  t0 = h_wall();
  v1 = wait_vouched(v0, 30, "over ten intervals");
  c1 = h_metric(&ctl, "muster_heartbeat_calls_total");
  /* one call carries three: per-worker beats would be 4 calls an interval */
  ck_assert_msg(c1 - c0 <= (v1 - v0) / 3 + 3,
                "%g heartbeat calls for %g heartbeats vouched for: the workers beat on their own",
                c1 - c0, v1 - v0);
  others_run_on(ids, 4, -1, t0 + 1, "while they beat per host");
  json_decref(ws);
  h_finish(&ctl);
}
END_TEST

/* A hung workerd (SIGSTOP) that is not the agent stops touching its
 * beacon: the agent leaves it out, and it is lost after its heartbeat
 * timeout, named; the others run on. */
START_TEST(a_hung_sibling_is_lost_and_the_others_run_on) {
  const char *ids[3];
  json_t *ws = start_running(3, ids), *w;
  long agent, pid;
  int hung = (agent_of(ids, 3, &agent) + 1) % 3;
  double t;

  pid = h_workerd_pid(&ctl, ids[hung]);
  ck_assert_int_gt(pid, 0);
  ck_assert_int_eq(kill((pid_t)pid, SIGSTOP), 0);
  t = h_wall();
  w = h_wait_status(&ctl, ids[hung], "failed", 40);
  ck_assert_msg(strstr(h_str(w, "failure"), "heartbeat") != NULL,
                "the hung worker failed for another reason: %s", h_str(w, "failure"));
  json_decref(w);
  kill((pid_t)pid, SIGCONT);
  others_run_on(ids, 3, hung, t + 6, "after a sibling hung");
  json_decref(ws);
  h_finish(&ctl);
}
END_TEST

/* A hung agent holds the lock and answers for nobody: its siblings beat on
 * their own again, and only its own worker is lost. */
START_TEST(a_hung_agents_siblings_beat_on_their_own) {
  const char *ids[3];
  json_t *ws = start_running(3, ids);
  long agent;
  int a = agent_of(ids, 3, &agent);
  double t;

  ck_assert_int_eq(kill((pid_t)agent, SIGSTOP), 0);
  t = h_wall();
  json_decref(h_wait_status(&ctl, ids[a], "failed", 40));
  kill((pid_t)agent, SIGCONT);
  others_run_on(ids, 3, a, t + 6, "after their agent hung");
  json_decref(ws);
  h_finish(&ctl);
}
END_TEST

/* The agent's end (kill -9) frees the lock: another workerd takes it and
 * speaks for the rest, who stay running. */
START_TEST(the_agents_end_hands_the_beat_to_another) {
  const char *ids[3];
  json_t *ws = start_running(3, ids);
  long agent, next;
  int a = agent_of(ids, 3, &agent);
  double t;

  ck_assert_int_eq(kill((pid_t)agent, SIGKILL), 0);
  t = h_wall();
  json_decref(h_wait_status(&ctl, ids[a], "failed", 40));
  next = agent_pid();
  ck_assert_msg(next > 0 && next != agent, "no other workerd took the lock (holder %ld)", next);
  wait_vouched(h_metric(&ctl, "muster_heartbeats_vouched_total"), 4, "after the agent's end");
  others_run_on(ids, 3, a, t + 6, "after their agent's end");
  json_decref(ws);
  h_finish(&ctl);
}
END_TEST

/* By default (--host-beat auto) workerds beat per host only while the
 * interval is stretched (past --heartbeat-rate): at 4 heartbeats a second
 * and 0.5 s, four workers are told 1 s and beat per host; with two of them
 * stopped, the two left are told 0.5 s and each beats on its own again. */
START_TEST(host_beats_follow_the_stretch_of_the_interval) {
  json_t *ws, *two;
  const char *ids[4];
  double v = 0, c0, v0;
  int quiet = 0;

  memset(&ctl, 0, sizeof(ctl));
  ctl.extra[0] = "--heartbeat-rate";
  ctl.extra[1] = "4";
  ctl.extra[2] = "--heartbeat-interval";
  ctl.extra[3] = "0.5";
  ctl.extra[4] = "--heartbeat-timeout";
  ctl.extra[5] = "8";
  h_start(&ctl);
  ws = h_launch(&ctl, "{\"n\": 2, \"cpu\": 0.01, \"memory\": 0.01, \"session\": \"stay\"}");
  two = h_launch(&ctl, "{\"n\": 2, \"cpu\": 0.01, \"memory\": 0.01, \"session\": \"go\"}");
  json_decref(h_await(&ctl, ws, 0, 60));
  json_decref(h_await(&ctl, two, 0, 60));
  for (int i = 0; i < 2; i++)
    ids[i] = h_str(json_array_get(ws, (size_t)i), "id");
  wait_vouched(0, 3, "with the interval stretched to 1 s");
  ck_assert_int_eq(
      h_http(&ctl, "POST", "/api/v1/workers/stop", "{\"session\": \"go\"}", "", NULL, NULL), 200);
  /* Once all have heard (an interval or two), no heartbeat is vouched for
   * while each worker's own go on. */
  for (double until = h_now() + 40; h_now() < until && quiet < 1;) {
    v0 = h_metric(&ctl, "muster_heartbeats_vouched_total");
    c0 = h_metric(&ctl, "muster_heartbeat_calls_total");
    while (h_metric(&ctl, "muster_heartbeat_calls_total") < c0 + 8 && h_now() < until)
      usleep(100 * 1000);
    v = h_metric(&ctl, "muster_heartbeats_vouched_total");
    quiet = v == v0 && h_metric(&ctl, "muster_heartbeat_calls_total") >= c0 + 8;
  }
  ck_assert_msg(quiet, "heartbeats still vouched for 40 s after the interval shrank back (%g)", v);
  others_run_on(ids, 2, -1, h_wall(), "on their own");
  json_decref(two);
  json_decref(ws);
  h_finish(&ctl);
}
END_TEST

int main(void) {
  Suite *s = suite_create("hostbeat");
  TCase *tc = tcase_create("hostbeat");

  tcase_set_timeout(tc, 150);
  tcase_add_test(tc, a_hosts_workers_beat_in_one_call);
  tcase_add_test(tc, a_hung_sibling_is_lost_and_the_others_run_on);
  tcase_add_test(tc, a_hung_agents_siblings_beat_on_their_own);
  tcase_add_test(tc, the_agents_end_hands_the_beat_to_another);
  tcase_add_test(tc, host_beats_follow_the_stretch_of_the_interval);
  suite_add_tcase(s, tc);
  return check_run(s);
}
