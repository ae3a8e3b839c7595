/* check_hostbeat.c: liveness per host (--host-beat, docs/internals/
 * controller.md "Liveness per host"): the workerds of one host beat as one
 * (the agent's heartbeat carries its siblings'), and yet a hung sibling is
 * still lost and named, a hung agent's siblings beat on their own, and the
 * end of the agent hands the beat to another. Real local workers. */
#include "harness.h"

#include "../check_run.h"

#include <check.h>
#include <glob.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static struct ctl_proc ctl;

/* A controller whose workerds always beat per host, every 0.5 s; a worker
 * is lost after 5 s without a word. */
static void start_on(void) {
  memset(&ctl, 0, sizeof(ctl));
  ctl.extra[0] = "--host-beat";
  ctl.extra[1] = "on";
  ctl.extra[2] = "--heartbeat-interval";
  ctl.extra[3] = "0.5";
  ctl.extra[4] = "--heartbeat-timeout";
  ctl.extra[5] = "5";
  h_start(&ctl);
}

/* n idle workers of cpu cores each, running; their ids in ids. Returns the
 * workers (new reference). */
static json_t *launch_running(int n, double cpu, const char **ids) {
  char body[160];
  json_t *ws;

  snprintf(body, sizeof(body), "{\"n\": %d, \"cpu\": %g, \"memory\": 0.01}", n, cpu);
  ws = h_launch(&ctl, body);
  json_decref(h_await(&ctl, ws, 0, 60));
  for (int i = 0; i < n; i++)
    ids[i] = h_str(json_array_get(ws, (size_t)i), "id");
  return ws;
}

/* start_on() and launch_running(). */
static json_t *start_running(int n, const char **ids) {
  start_on();
  return launch_running(n, 0.01, ids);
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

/* The pid holding the lock of the host's directory of the controller's
 * workers (the agent's workerd), from /proc/locks; 0 if none does (10 s at
 * most). */
static long agent_pid(void) {
  char pattern[200], line[256];

  snprintf(pattern, sizeof(pattern), "%s/host/g-*/agent.lock", ctl.dir);
  for (double until = h_now() + 10; h_now() < until; usleep(100 * 1000)) {
    glob_t gl;
    struct stat st;
    FILE *f;
    long pid = 0;

    if (glob(pattern, 0, NULL, &gl) != 0)
      continue;
    f = gl.gl_pathc == 1 && stat(gl.gl_pathv[0], &st) == 0 ? fopen("/proc/locks", "r") : NULL;
    globfree(&gl);
    while (f && !pid && fgets(line, sizeof(line), f)) {
      long p;
      unsigned long long ino;

      if (strstr(line, "FLOCK") &&
          sscanf(line, "%*s FLOCK %*s %*s %ld %*x:%*x:%llu", &p, &ino) == 2 &&
          ino == (unsigned long long)st.st_ino)
        pid = p;
    }
    if (f)
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
  ck_assert_msg(*pid > 0, "no workerd holds %s/host/g-*/agent.lock", ctl.dir);
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

/* Sends sig to pid, the workerd of ids[i] (one of 3 running workers),
 * waits for that worker to fail and for the two others to beat 6 s later,
 * running; what: after what, for the message. Returns the failed worker
 * (new reference). */
static json_t *lose_one(const char **ids, int i, long pid, int sig, const char *what) {
  json_t *w;
  double t;

  ck_assert_int_eq(kill((pid_t)pid, sig), 0);
  t = h_wall();
  w = h_wait_status(&ctl, ids[i], "failed", 40);
  others_run_on(ids, 3, i, t + 6, what);
  return w;
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
  /* one call carries three (each worker's own would be 4 calls an interval
   * where this is 1, and none vouched for): fewer calls than heartbeats
   * carried, whatever a loaded machine's late answer makes a sibling send
   * on its own */
  ck_assert_msg(c1 - c0 < v1 - v0,
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

  pid = h_workerd_pid(&ctl, ids[hung]);
  ck_assert_int_gt(pid, 0);
  w = lose_one(ids, hung, pid, SIGSTOP, "after a sibling hung");
  ck_assert_msg(strstr(h_str(w, "failure"), "heartbeat") != NULL,
                "the hung worker failed for another reason: %s", h_str(w, "failure"));
  json_decref(w);
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

  json_decref(lose_one(ids, a, agent, SIGSTOP, "after their agent hung"));
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

  json_decref(lose_one(ids, a, agent, SIGKILL, "after their agent's end"));
  next = agent_pid();
  ck_assert_msg(next > 0 && next != agent, "no other workerd took the lock (holder %ld)", next);
  wait_vouched(h_metric(&ctl, "muster_heartbeats_vouched_total"), 4, "after the agent's end");
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

/* Registers worker id (external backend: the test plays its workerd) from
 * hostname host with pid. */
static void register_as(const char *id, const char *host, int pid) {
  char body[200];

  json_decref(h_wait_status(&ctl, id, "starting", 30));
  snprintf(body, sizeof(body),
           "{\"ip_address\": \"127.0.0.1\", \"hostname\": \"%s\", \"pid\": %d, "
           "\"attempt\": 1}",
           host, pid);
  json_decref(h_worker_call(&ctl, id, "register", body));
}

/* One external worker launched with token (a user's; "": the
 * administrator's); its id (a static buffer of k's). */
static const char *launch_one(const char *token, int k) {
  static char ids[8][16];
  json_t *ans = NULL;

  ck_assert_int_eq(h_http(&ctl, "POST", "/api/v1/workers",
                          "{\"n\": 1, \"cpu\": 0.01, \"memory\": 0.01}", token, &ans, NULL),
                   201);
  snprintf(ids[k], sizeof(ids[k]), "%s",
           h_str(json_array_get(json_object_get(ans, "workers"), 0), "id"));
  json_decref(ans);
  return ids[k];
}

/* The controller takes a vouch only for a running worker of the caller's
 * own user and hostname, registered by the pid the vouch names: a worker of
 * another user, of another host, of another workerd (an earlier attempt, a
 * forged beacon) or not registered is refused and lost in its time; one
 * vouched for stays running though it never beats itself. A second vouch
 * within half an interval is not taken. */
START_TEST(a_vouch_counts_only_for_the_callers_user_host_and_workerd) {
  char token[128], body[1024];
  const char *a, *b, *other_user, *other_host, *other_pid, *unreg;
  json_t *ans = NULL, *v;

  memset(&ctl, 0, sizeof(ctl));
  ctl.extra[0] = "--backend";
  ctl.extra[1] = "external";
  ctl.extra[2] = "--heartbeat-interval";
  ctl.extra[3] = "2";
  ctl.extra[4] = "--heartbeat-timeout";
  ctl.extra[5] = "10";
  ctl.extra[6] = "--start-timeout";
  ctl.extra[7] = "600";
  h_start(&ctl);
  ck_assert_int_eq(h_http(&ctl, "POST", "/api/v1/users", "{\"name\": \"ivy\"}", "", &ans, NULL),
                   201);
  snprintf(token, sizeof(token), "%s", h_str(ans, "token"));
  json_decref(ans);
  a = launch_one("", 0);
  b = launch_one("", 1);
  other_user = launch_one(token, 2);
  other_host = launch_one("", 3);
  other_pid = launch_one("", 4);
  unreg = launch_one("", 5);
  register_as(a, "h1", 100);
  register_as(b, "h1", 101);
  register_as(other_user, "h1", 102);
  register_as(other_host, "h2", 103);
  register_as(other_pid, "h1", 104);
  json_decref(h_wait_status(&ctl, unreg, "starting", 30));
  snprintf(body, sizeof(body),
           "{\"vouch\": [{\"id\": \"%s\", \"pid\": 101}, {\"id\": \"%s\", \"pid\": 102}, "
           "{\"id\": \"%s\", \"pid\": 103}, {\"id\": \"%s\", \"pid\": 999}, "
           "{\"id\": \"%s\", \"pid\": 0}, {\"id\": \"w-nosuch\", \"pid\": 1}]}",
           b, other_user, other_host, other_pid, unreg);
  ans = h_worker_call(&ctl, a, "heartbeat", body);
  v = json_object_get(ans, "vouched");
  ck_assert_msg(json_is_false(json_object_get(json_object_get(v, b), "stop")),
                "the worker of the same user, host and workerd is not vouched for: %s",
                json_dumps(ans, 0));
  ck_assert_int_eq(json_integer_value(json_object_get(json_object_get(v, b), "pid")), 101);
  {
    const char *refused[] = {other_user, other_host, other_pid, unreg, "w-nosuch"};

    for (int i = 0; i < 5; i++)
      ck_assert_msg(json_is_string(json_object_get(json_object_get(v, refused[i]), "refused")),
                    "%s is not refused: %s", refused[i], json_dumps(ans, 0));
  }
  json_decref(ans);
  /* (at once again: within half an interval, 1 s, not taken) */
  ans = h_worker_call(&ctl, a, "heartbeat", body);
  ck_assert_msg(!json_object_get(ans, "vouched"), "a second vouch at once was taken");
  json_decref(ans);
  /* a beats, vouching for all, until the refused are lost */
  for (double until = h_now() + 40;; usleep(500 * 1000)) {
    json_t *w = h_worker(&ctl, other_pid);
    int lost = strcmp(h_str(w, "status"), "failed") == 0;

    json_decref(w);
    ck_assert_msg(h_now() < until, "%s, vouched for with the wrong pid, not lost in 40 s",
                  other_pid);
    json_decref(h_worker_call(&ctl, a, "heartbeat", body));
    if (lost)
      break;
  }
  json_decref(h_wait_status(&ctl, other_user, "failed", 20));
  json_decref(h_wait_status(&ctl, other_host, "failed", 20));
  {
    json_t *w = h_worker(&ctl, b);

    ck_assert_msg(strcmp(h_str(w, "status"), "running") == 0,
                  "%s, vouched for and never beating itself, is %s: %s", b, h_str(w, "status"),
                  h_str(w, "failure"));
    json_decref(w);
  }
  /* After a restart (each restored worker beats once on its own first, its
   * register's window closed), restored and new workers of one host vouch
   * for each other: the hostname each registered with is restored too. */
  h_kill9(&ctl);
  h_restart(&ctl);
  json_decref(h_worker_call(&ctl, a, "heartbeat", "{}"));
  json_decref(h_worker_call(&ctl, b, "heartbeat", "{}"));
  {
    const char *n = launch_one("", 6);
    const char *pairs[2][3] = {{a, n, "105"}, {n, b, "101"}};

    register_as(n, "h1", 105);
    for (int i = 0; i < 2; i++) {
      snprintf(body, sizeof(body), "{\"vouch\": [{\"id\": \"%s\", \"pid\": %s}]}", pairs[i][1],
               pairs[i][2]);
      ans = h_worker_call(&ctl, pairs[i][0], "heartbeat", body);
      ck_assert_msg(json_is_false(json_object_get(
                        json_object_get(json_object_get(ans, "vouched"), pairs[i][1]), "stop")),
                    "after the restart %s does not vouch for %s: %s", pairs[i][0], pairs[i][1],
                    json_dumps(ans, 0));
      json_decref(ans);
    }
  }
  h_finish(&ctl);
}
END_TEST

/* The CPU seconds process pid has used (user and system). */
static double cpu_s(long pid) {
  char buf[1024];
  const char *f = h_proc_stat(pid, buf, sizeof(buf));
  unsigned long ut = 0, st = 0;

  ck_assert_msg(f &&
                    sscanf(f, "%*s %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu", &ut, &st) == 2,
                "no /proc/%ld/stat to read", pid);
  return (double)(ut + st) / (double)sysconf(_SC_CLK_TCK);
}

/* A host directory that cannot be used (here a file where it would be)
 * leaves each worker beating on its own, and its workerd idle between
 * tries, not spinning on them. */
START_TEST(an_unusable_host_directory_leaves_each_worker_beating_on_its_own) {
  const char *ids[2];
  char path[200];
  long pid[2];
  double cpu0[2], t;
  json_t *ws;
  FILE *f;

  start_on();
  snprintf(path, sizeof(path), "%s/host", ctl.dir);
  ck_assert_ptr_nonnull(f = fopen(path, "w"));
  fclose(f);
  /* (half a core each: a spinning workerd is held to what its cgroup
   * allows) */
  ws = launch_running(2, 0.5, ids);
  for (int i = 0; i < 2; i++) {
    pid[i] = h_workerd_pid(&ctl, ids[i]);
    ck_assert_int_gt(pid[i], 0);
    cpu0[i] = cpu_s(pid[i]);
  }
  t = h_wall();
  others_run_on(ids, 2, -1, t + 3, "beating on their own");
  for (int i = 0; i < 2; i++)
    ck_assert_msg(cpu_s(pid[i]) - cpu0[i] < (h_wall() - t) / 4,
                  "workerd %ld used %.2f s of CPU in %.1f s: it spins", pid[i],
                  cpu_s(pid[i]) - cpu0[i], h_wall() - t);
  ck_assert_msg(h_metric(&ctl, "muster_heartbeats_vouched_total") == 0,
                "heartbeats vouched for without a host directory");
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
  tcase_add_test(tc, a_vouch_counts_only_for_the_callers_user_host_and_workerd);
  tcase_add_test(tc, an_unusable_host_directory_leaves_each_worker_beating_on_its_own);
  suite_add_tcase(s, tc);
  return check_run(s);
}
