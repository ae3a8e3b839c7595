/* check_faults.c: what a crash, a race or a hostile host can do to the
 * controller, made to happen on purpose: kill -9 at named points (the
 * fault-injection points of test builds, MUSTER_FAULT) and at random
 * moments, appends racing a followed log, a recycled pid, clients that hang
 * up, a state directory others can read. Real controller, real workerd
 * processes, real SQLite. */
#include "harness.h"

#include "../check_run.h"

#include <arpa/inet.h>
#include <check.h>
#include <errno.h>
#include <netinet/in.h>
#include <signal.h>
#include <sqlite3.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

static struct ctl_proc ctl;

static void fresh(void) {
  memset(&ctl, 0, sizeof(ctl));
}

/* How many lines of path are exactly line. */
static int count_lines(const char *path, const char *line) {
  char buf[256];
  int n = 0;
  FILE *f = fopen(path, "r");

  if (!f)
    return 0;
  while (fgets(buf, sizeof(buf), f)) {
    buf[strcspn(buf, "\n")] = '\0';
    n += strcmp(buf, line) == 0;
  }
  fclose(f);
  return n;
}

/* Runs sql on c's database while the controller is down. */
static void db_exec(struct ctl_proc *c, const char *sql) {
  char path[160], *err = NULL;
  sqlite3 *db;

  snprintf(path, sizeof(path), "%s/muster.db", c->dir);
  ck_assert_int_eq(sqlite3_open(path, &db), SQLITE_OK);
  ck_assert_msg(sqlite3_exec(db, sql, NULL, NULL, &err) == SQLITE_OK, "%s: %s", sql,
                err ? err : "?");
  sqlite3_close(db);
}

/* The launch body of n workers whose script appends its id to file. */
static void once_body(char *buf, size_t size, int n, const char *file, double sleep_s) {
  snprintf(buf, size,
           "{\"n\": %d, \"cpu\": 0.01, \"memory\": 0.01, \"kernel\": \"sh\", \"code\": "
           "\"echo $MUSTER_WORKER_ID >> %s; sleep %g\"}",
           n, file, sleep_s);
}

/* 1. The controller dies (kill -9) after a workerd was started and before
 * the controller learnt how it runs. The restart must not start the script
 * a second time: the first workerd is ended before anything new starts
 * (its attempt is not the current one; were it to register, it would be
 * refused) and the worker runs once, under a new attempt.
 *
 * The first workerds live on meanwhile, their network set up and not yet
 * registered (workerd_before_register holds them): in bridge mode a new
 * attempt may get the same address, and its workerd once found the first
 * one's veth pair there, fought over it and failed ("cannot make its veth
 * pair ...: File exists"). */
START_TEST(a_crash_right_after_a_spawn_runs_each_script_once) {
  char file[160], body[400], cmd[400];
  json_t *workers, *ans, *w;
  size_t i;

  fresh();
  setenv("MUSTER_FAULT", "local_spawned:abort,workerd_before_register:delay=60000", 1);
  h_start(&ctl);
  unsetenv("MUSTER_FAULT");
  snprintf(file, sizeof(file), "%s/ran", ctl.work);
  unlink(file);
  once_body(body, sizeof(body), 4, file, 0);
  workers = h_launch(&ctl, body);
  ck_assert_msg(h_wait_exit(&ctl, 10), "the fault point did not end the controller");
  /* The restart comes once a first workerd runs, its network set up (the
   * fork server may start the others, or not, as the controller died). */
  snprintf(cmd, sizeof(cmd), "grep -qs 'INFO worker w-.* on .*exec port' %s/workers/w-*.log",
           ctl.dir);
  for (double until = h_now() + 20; system(cmd) != 0; usleep(50 * 1000))
    ck_assert_msg(h_now() < until, "no first workerd started within 20 s (logs in %s/workers)",
                  ctl.dir);
  h_restart(&ctl);
  ans = h_await(&ctl, workers, 1, 30);
  ck_assert_msg(json_array_size(json_object_get(ans, "workers")) == 4,
                "not all 4 workers succeeded: %.3000s (logs in %s/workers)", json_dumps(ans, 0),
                ctl.dir);
  json_array_foreach(workers, i, w) {
    json_t *now = h_worker(&ctl, h_str(w, "id"));
    json_int_t attempt = json_integer_value(json_object_get(now, "attempt"));

    ck_assert_int_eq(count_lines(file, h_str(w, "id")), 1);
    ck_assert_str_eq(h_str(now, "status"), "succeeded");
    ck_assert_msg(attempt == 2, "attempt %d", (int)attempt);
    json_decref(now);
  }
  /* No second attempt met what the first one had made. */
  snprintf(cmd, sizeof(cmd), "grep -l 'was still there' %s/workers/w-*.log", ctl.dir);
  ck_assert_msg(system(cmd) != 0, "a new attempt found the first one's veth pair (above)");
  unlink(file);
  json_decref(ans);
  json_decref(workers);
  h_finish(&ctl);
}
END_TEST

/* 1a. A controller that dies between a registration's commit and its
 * answer (fault register_committed): the workerd, told nothing, tries
 * again, and the restarted controller answers it as the first would have.
 * The worker runs on with the workerd that registered, never taken for
 * lost. */
START_TEST(a_crash_between_a_register_and_its_answer_loses_no_worker) {
  json_t *workers;
  const char *id;
  double up;
  long wd;

  fresh();
  ctl.extra[0] = "--heartbeat-timeout";
  ctl.extra[1] = "8"; /* (over the 5 s a register's backoff can reach) */
  setenv("MUSTER_FAULT", "register_committed:abort", 1);
  h_start(&ctl);
  unsetenv("MUSTER_FAULT");
  workers = h_launch(&ctl, "{\"n\": 1, \"cpu\": 0.01, \"memory\": 0.01}");
  id = h_str(json_array_get(workers, 0), "id");
  ck_assert_msg(h_wait_exit(&ctl, 30), "the fault point did not end the controller");
  wd = h_workerd_pid(&ctl, id); /* (committed: the row has it) */
  ck_assert_msg(!h_gone(wd, 0), "worker %s's workerd %ld ended with the controller (logs in %s)",
                id, wd, ctl.dir);
  h_restart(&ctl);
  up = h_wall();
  /* A heartbeat recorded more than the heartbeat timeout after the
   * restart: it re-registered, or beat, and was never lost meanwhile. */
  h_wait_beat_after(&ctl, id, up + 9, 40);
  ck_assert_int_eq(h_workerd_pid(&ctl, id), wd);
  ck_assert_msg(!h_gone(wd, 0), "worker %s's workerd %ld is gone", id, wd);
  json_decref(workers);
  h_finish(&ctl);
}
END_TEST

/* 1b. A registration that names another attempt is refused with 409. */
START_TEST(a_registration_from_another_attempt_is_refused) {
  json_t *workers, *ans, *out = NULL;
  char path[160], auth[200];
  const char *id;

  fresh();
  h_start(&ctl);
  workers = h_launch(&ctl, "{\"n\": 1, \"cpu\": 0.01, \"memory\": 0.01}");
  ans = h_await(&ctl, workers, 0, 20);
  id = h_str(json_array_get(workers, 0), "id");
  h_worker_token(&ctl, id, auth, sizeof(auth));
  snprintf(path, sizeof(path), "/api/v1/workers/%s/register", id);
  ck_assert_int_eq(h_http(&ctl, "POST", path, "{\"ip_address\": \"127.0.0.1\", \"attempt\": 7}",
                          auth, &out, NULL),
                   409);
  ck_assert_str_eq(h_str(json_object_get(out, "error"), "field"), "attempt");
  ck_assert_ptr_nonnull(strstr(h_str(json_object_get(out, "error"), "message"), "attempt 1"));
  json_decref(out);
  /* Nothing changed for the worker itself. */
  out = h_worker(&ctl, id);
  ck_assert_str_eq(h_str(out, "status"), "running");
  json_decref(out);
  json_decref(ans);
  json_decref(workers);
  h_finish(&ctl);
}
END_TEST

/* A Slurm launcher whose step's workerd got no token (another process of
 * the account read it from srun's stdin) says so with that token
 * ("token_lost"): the worker fails at once, with a sentence saying why,
 * rather than running under whoever took the token. */
START_TEST(a_token_read_by_another_process_fails_its_worker) {
  json_t *workers, *ans, *out = NULL;
  char path[160], auth[200];
  const char *id;

  fresh();
  h_start(&ctl);
  workers = h_launch(&ctl, "{\"n\": 1, \"cpu\": 0.01, \"memory\": 0.01, \"command\": "
                           "[\"sleep\", \"30\"]}");
  id = h_str(json_array_get(workers, 0), "id");
  json_decref(h_wait_status(&ctl, id, "running", 30));
  h_worker_token(&ctl, id, auth, sizeof(auth));
  snprintf(path, sizeof(path), "/api/v1/workers/%s/register", id);
  ck_assert_int_eq(h_http(&ctl, "POST", path,
                          "{\"ip_address\": \"127.0.0.1\", \"attempt\": 1, \"pid\": 1, "
                          "\"token_lost\": true}",
                          auth, &out, NULL),
                   409);
  ck_assert_str_eq(h_str(json_object_get(out, "error"), "field"), "token");
  json_decref(out);
  ans = h_worker(&ctl, id);
  ck_assert_str_eq(h_str(ans, "status"), "failed");
  ck_assert_ptr_nonnull(strstr(h_str(ans, "failure"), "got no token on its stdin"));
  json_decref(ans);
  json_decref(workers);
  h_finish(&ctl);
}
END_TEST

/* A stand-in for a proxy whose controller is gone: on port, every request
 * gets 502. Returns its pid (a child, killed by the caller). */
static pid_t bad_gateway(int port) {
  struct sockaddr_in a = {.sin_family = AF_INET,
                          .sin_addr.s_addr = htonl(INADDR_LOOPBACK),
                          .sin_port = htons((uint16_t)port)};
  int one = 1, fd = socket(AF_INET, SOCK_STREAM, 0);
  pid_t pid;

  ck_assert_int_ge(fd, 0);
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  ck_assert_msg(bind(fd, (struct sockaddr *)&a, sizeof(a)) == 0 && listen(fd, 64) == 0,
                "cannot listen on port %d: %s", port, strerror(errno));
  pid = fork();
  ck_assert_int_ge(pid, 0);
  if (pid == 0) {
    static const char answer[] =
        "HTTP/1.1 502 Bad Gateway\r\nContent-Length: 0\r\nConnection: close\r\n\r\n";
    char buf[4096];
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    for (;;) {
      int c = accept(fd, NULL, NULL);
      if (c < 0)
        continue;
      if (read(c, buf, sizeof(buf)) > 0 && write(c, answer, sizeof(answer) - 1) < 0)
        _exit(1);
      close(c);
    }
  }
  close(fd);
  return pid;
}

/* 1d. A worker whose controller is gone behind a proxy (502 to every call)
 * ends at MUSTER_ORPHAN_TIMEOUT, as when nothing answers at all: a 5xx is
 * not the controller's answer. */
START_TEST(a_proxy_answering_502_does_not_keep_an_orphan_alive) {
  json_t *workers, *ans;
  pid_t wd, proxy;
  const char *id;

  fresh();
  ctl.orphan_timeout = "3";
  ctl.extra[0] = "--heartbeat-interval";
  ctl.extra[1] = "0.3";
  h_start(&ctl);
  workers = h_launch(&ctl, "{\"n\": 1, \"cpu\": 0.1, \"code\": \"!sleep 300\"}");
  ans = h_await(&ctl, workers, 0, 20);
  id = h_str(json_array_get(workers, 0), "id");
  wd = (pid_t)h_workerd_pid(&ctl, id);
  h_kill9(&ctl);
  proxy = bad_gateway(ctl.port);
  /* 3 s without the controller's answer, then its stop (within its grace
   * period); half a minute is more than that on a loaded machine, and far
   * less than for ever. */
  ck_assert_msg(h_gone(wd, 30),
                "workerd %d still runs 30 s after its controller was replaced by "
                "a proxy answering 502 (orphan timeout 3 s)",
                (int)wd);
  kill(proxy, SIGKILL);
  waitpid(proxy, NULL, 0);
  h_restart(&ctl);
  json_decref(ans);
  json_decref(workers);
  h_finish(&ctl);
}
END_TEST

/* 1c. An exit report with a code no process can have (-1, 256) is refused,
 * naming exit_code; the worker is not recorded as a success. */
START_TEST(an_exit_code_that_is_no_exit_status_is_refused) {
  json_t *workers, *ans, *out = NULL;
  char path[160], auth[200];
  const char *id;

  fresh();
  h_start(&ctl);
  workers = h_launch(&ctl, "{\"n\": 1, \"cpu\": 0.01, \"memory\": 0.01}");
  ans = h_await(&ctl, workers, 0, 20);
  id = h_str(json_array_get(workers, 0), "id");
  h_worker_token(&ctl, id, auth, sizeof(auth));
  snprintf(path, sizeof(path), "/api/v1/workers/%s/exit", id);
  ck_assert_int_eq(h_http(&ctl, "POST", path, "{\"exit_code\": -1}", auth, &out, NULL), 422);
  ck_assert_str_eq(h_str(json_object_get(out, "error"), "field"), "exit_code");
  ck_assert_ptr_nonnull(strstr(h_str(json_object_get(out, "error"), "message"), "0 to 255"));
  json_decref(out);
  ck_assert_int_eq(h_http(&ctl, "POST", path, "{\"exit_code\": 256}", auth, NULL, NULL), 422);
  out = h_worker(&ctl, id);
  ck_assert_str_eq(h_str(out, "status"), "running");
  json_decref(out);
  json_decref(ans);
  json_decref(workers);
  h_finish(&ctl);
}
END_TEST

/* 2. A followed log whose append lands between the reader's look at the
 * file and its wait: the controller must neither deadlock nor lose lines.
 * The fault point holds each reader in exactly that gap; 12 followers and a
 * worker that writes in bursts make the gap busy even without it. */
START_TEST(appends_racing_a_followed_log_neither_hang_nor_get_lost) {
  json_t *workers, *ans;
  char path[300];
  pid_t followers[12], launcher, writer;
  const int nf = 12;

  fresh();
  setenv("MUSTER_FAULT", "log_follow_at_end:delay=5", 1);
  ctl.extra[0] = "--cpus";
  ctl.extra[1] = "1";
  h_start(&ctl);
  unsetenv("MUSTER_FAULT");
  /* Big launches that can never be admitted meanwhile: the lock is busy,
   * as on a controller in use. */
  launcher = h_sh_bg("sleep 0.4; for i in $(seq 8); do curl -s -m 20 -H 'Authorization: Bearer %s' "
                     "-d '{\"n\": 1024, \"cpu\": 1, \"memory\": 0.01}' %s/api/v1/workers "
                     ">/dev/null; done",
                     ctl.token, ctl.url);
  /* (half a core: the cpu asked for is a quota; at 0.01 core the 400
   * lines would take minutes) */
  workers = h_launch(&ctl, "{\"n\": 1, \"cpu\": 0.5, \"kernel\": \"sh\", \"code\": "
                           "\"sleep 0.5; i=0; while [ $i -lt 400 ]; do echo line $i; "
                           "i=$((i+1)); [ $((i % 20)) -eq 0 ] && sleep 0.02; done\"}");
  for (int k = 0; k < nf; k++)
    followers[k] = h_sh_bg("curl -s -m 30 -H 'Authorization: Bearer %s' "
                           "'%s/api/v1/workers/%s/logs?follow=1' > %s.follow%d",
                           ctl.token, ctl.url, h_str(json_array_get(workers, 0), "id"), ctl.dir, k);
  /* Another writer appends to the same log file without a word to the
   * controller, as fast as it can: a reader at the end of the file sees it
   * grow at any moment, the gap between its look and its wait included. */
  writer = fork();
  ck_assert_int_ge(writer, 0);
  if (writer == 0) {
    char lp[200];
    double until = h_now() + 3;
    FILE *f;
    snprintf(lp, sizeof(lp), "%s/logs/%s.stdout", ctl.dir, h_str(json_array_get(workers, 0), "id"));
    f = fopen(lp, "a");
    for (long i = 0; f && h_now() < until; i++) {
      fprintf(f, "direct %ld\n", i);
      fflush(f);
    }
    _exit(0);
  }
  waitpid(writer, NULL, 0);
  for (int k = 0; k < nf; k++) {
    char cmd[400];
    waitpid(followers[k], NULL, 0);
    snprintf(path, sizeof(path), "%s.follow%d", ctl.dir, k);
    snprintf(cmd, sizeof(cmd), "test $(grep -c '^line ' %s) -eq 400", path);
    ck_assert_msg(system(cmd) == 0, "follower %d did not get the 400 lines (see %s)", k, path);
    unlink(path);
  }
  waitpid(launcher, NULL, 0);
  /* Every thread still takes the lock: the API answers, and the controller
   * stops on SIGTERM. */
  ck_assert_int_eq(h_http(&ctl, "GET", "/api/v1/health", NULL, NULL, NULL, NULL), 200);
  ans = h_await(&ctl, workers, 1, 10);
  ck_assert_int_eq(json_array_size(json_object_get(ans, "workers")), 1);
  kill(ctl.pid, SIGTERM);
  ck_assert_msg(h_wait_exit(&ctl, 10), "the controller did not stop on SIGTERM");
  json_decref(ans);
  json_decref(workers);
  h_finish(&ctl);
}
END_TEST

/* The start time of process pid, in clock ticks since boot (the 22nd
 * field of /proc/PID/stat, as the local backend records it), or 0. */
static unsigned long long start_ticks(pid_t pid) {
  char buf[1024];
  const char *f = h_proc_stat(pid, buf, sizeof(buf));
  unsigned long long t = 0;

  /* the state (field 3), 18 numbers, the start time */
  if (!f ||
      sscanf(f, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %*u %*u %*d %*d %*d %*d %*d %*d %llu",
             &t) != 1)
    return 0;
  return t;
}

/* 3. After a restart the controller must not trust a bare pid: here the
 * worker's workerd is gone and its pid now belongs to an unrelated process.
 * The worker fails ("lost") and that process is never signalled. */
START_TEST(a_recycled_pid_is_never_signalled) {
  json_t *workers, *ans, *w, *other;
  char sql[400], ref[64];
  const char *id, *colon;
  unsigned long long recorded;
  pid_t decoy, wd;
  int st;

  fresh();
  h_start(&ctl);
  workers = h_launch(&ctl, "{\"n\": 1, \"cpu\": 0.01, \"memory\": 0.01}");
  ans = h_await(&ctl, workers, 0, 20);
  id = h_str(json_array_get(workers, 0), "id");
  w = h_worker(&ctl, id);
  snprintf(ref, sizeof(ref), "%s", h_str(w, "backend_ref") ? h_str(w, "backend_ref") : "");
  wd = (pid_t)h_workerd_pid(&ctl, id);
  json_decref(w);
  h_kill9(&ctl);
  kill(-wd, SIGKILL);
  kill(wd, SIGKILL);
  /* An unrelated process in a session of its own, standing in for the
   * process that got the dead workerd's pid. A pid comes round again only
   * after the kernel went through the others, well after the clock tick
   * (10 ms) that start times are counted in: the decoy is one started in a
   * later tick than the workerd. */
  colon = strchr(ref, ':');
  recorded = 0;
  if (colon) {
    char *end;
    recorded = strtoull(colon + 1, &end, 10);
    ck_assert_msg(end != colon + 1 && *end == '\0', "backend_ref %s: no start time", ref);
  }
  for (double until = h_now() + 10;;) {
    decoy = fork();
    ck_assert_int_ge(decoy, 0);
    if (decoy == 0) {
      setsid();
      execl("/bin/sleep", "sleep", "30", (char *)NULL);
      _exit(127);
    }
    if (start_ticks(decoy) != recorded)
      break;
    kill(decoy, SIGKILL);
    waitpid(decoy, NULL, 0);
    ck_assert_msg(h_now() < until, "every process started in the workerd's clock tick (%llu)",
                  recorded);
    usleep(10 * 1000);
  }
  /* The row now says what a recycled pid looks like: the decoy's pid, with
   * whatever else the backend recorded to know its process. */
  snprintf(sql, sizeof(sql), "UPDATE workers SET pid = %d, backend_ref = '%d%s' WHERE id = '%s'",
           (int)decoy, (int)decoy, colon ? colon : "", id);
  db_exec(&ctl, sql);
  ctl.extra[0] = "--heartbeat-timeout";
  ctl.extra[1] = "1";
  ctl.extra[2] = "--heartbeat-interval";
  ctl.extra[3] = "0.3";
  h_restart(&ctl);
  w = h_wait_status(&ctl, id, "failed", 10);
  ck_assert_ptr_nonnull(strstr(h_str(w, "failure"), "lost"));
  json_decref(w);
  /* Past what the controller does to a failed worker's processes, and past
   * the heartbeat timeout: a worker launched now runs (the backend's
   * thread took its start after the lost worker's end), then, its workerd
   * hung, fails for its heartbeats. (Its heartbeats, every 2 s, would come
   * too late for the 1 s timeout anyway: it may have failed already.) */
  other = h_launch(&ctl, "{\"n\": 1, \"cpu\": 0.01, \"memory\": 0.01}");
  json_decref(h_await(&ctl, other, 0, 20));
  wd = (pid_t)h_workerd_pid(&ctl, h_str(json_array_get(other, 0), "id"));
  kill(wd, SIGSTOP);
  w = h_wait_status(&ctl, h_str(json_array_get(other, 0), "id"), "failed", 10);
  ck_assert_ptr_nonnull(strstr(h_str(w, "failure"), "heartbeat"));
  json_decref(w);
  kill(wd, SIGCONT);
  json_decref(other);
  ck_assert_msg(waitpid(decoy, &st, WNOHANG) == 0, "the controller signalled pid %d", (int)decoy);
  kill(decoy, SIGKILL);
  waitpid(decoy, NULL, 0);
  json_decref(ans);
  json_decref(workers);
  h_finish(&ctl);
}
END_TEST

/* A worker adopted after a restart is still ended by the controller: here
 * its workerd hangs (SIGSTOP), its heartbeats stop, and the worker fails;
 * the controller must kill it rather than leave it holding its room. */
START_TEST(a_hung_adopted_worker_is_killed_when_it_fails) {
  json_t *workers, *ans, *w;
  const char *id;
  pid_t wd;
  int i;

  fresh();
  h_start(&ctl);
  workers = h_launch(&ctl, "{\"n\": 1, \"cpu\": 0.01, \"memory\": 0.01}");
  ans = h_await(&ctl, workers, 0, 20);
  id = h_str(json_array_get(workers, 0), "id");
  wd = (pid_t)h_workerd_pid(&ctl, id);
  h_kill9(&ctl);
  ctl.extra[0] = "--heartbeat-timeout";
  ctl.extra[1] = "1";
  ctl.extra[2] = "--heartbeat-interval";
  ctl.extra[3] = "0.3";
  h_restart(&ctl);
  ck_assert_int_eq(kill(wd, SIGSTOP), 0);
  /* (judged by 4 of the 2 s interval it was told before the restart: 8 s,
   * more if the controller stalls meanwhile) */
  w = h_wait_status(&ctl, id, "failed", 30);
  ck_assert_ptr_nonnull(strstr(h_str(w, "failure"), "heartbeat"));
  json_decref(w);
  /* Not our child any more (the test reaps it): gone means no such pid or a
   * zombie. */
  for (i = 0; i < 50; i++) {
    char path[64], st[512];
    FILE *f;
    size_t n = 0;
    snprintf(path, sizeof(path), "/proc/%d/stat", (int)wd);
    f = fopen(path, "r");
    if (f) {
      n = fread(st, 1, sizeof(st) - 1, f);
      fclose(f);
    }
    st[n] = '\0';
    if (!f || (strrchr(st, ')') && strrchr(st, ')')[2] == 'Z'))
      break;
    usleep(100 * 1000);
  }
  ck_assert_msg(i < 50, "the failed worker's workerd (pid %d) still runs", (int)wd);
  json_decref(ans);
  json_decref(workers);
  h_finish(&ctl);
}
END_TEST

/* 4. Clients that hang up while they wait: a suspended await (no timeout)
 * and a followed log of a quiet worker. Their waiters must go, and the
 * gauges come back down. */
START_TEST(abandoned_waits_are_freed) {
  json_t *workers, *blocked, *ans;
  char body[300], path[200];
  int i;

  fresh();
  ctl.extra[0] = "--cpus";
  ctl.extra[1] = "1";
  h_start(&ctl);
  workers = h_launch(&ctl, "{\"n\": 1, \"cpu\": 1, \"memory\": 0.01}");
  ans = h_await(&ctl, workers, 0, 20);
  json_decref(ans);
  /* Never fits while the first runs: its await has nothing to wake it. */
  blocked = h_launch(&ctl, "{\"n\": 1, \"cpu\": 1, \"memory\": 0.01}");
  snprintf(body, sizeof(body), "{\"ids\": [\"%s\"], \"timeout_seconds\": 0}",
           h_str(json_array_get(blocked, 0), "id"));
  snprintf(path, sizeof(path), "/api/v1/workers/%s/logs?follow=1",
           h_str(json_array_get(workers, 0), "id"));
  /* Clients that give up after half a second. */
  for (int k = 0; k < 3; k++)
    waitpid(h_sh_bg("curl -s -m 0.5 -H 'Authorization: Bearer %s' -d '%s' %s/api/v1/workers/await "
                    ">/dev/null; curl -s -m 0.5 -H 'Authorization: Bearer %s' '%s%s' >/dev/null",
                    ctl.token, body, ctl.url, ctl.token, ctl.url, path),
            NULL, 0);
  for (i = 0; i < 50; i++) {
    if (h_metric(&ctl, "muster_await_waiting") == 0 &&
        h_metric(&ctl, "muster_streams_waiting") == 0)
      break;
    usleep(100 * 1000);
  }
  ck_assert_msg(i < 50, "waiters left: %g awaits, %g streams",
                h_metric(&ctl, "muster_await_waiting"), h_metric(&ctl, "muster_streams_waiting"));
  json_decref(blocked);
  json_decref(workers);
  h_finish(&ctl);
}
END_TEST

/* 5a. A fresh state directory: its files are made private from the start,
 * so the controller has nothing to tighten and says nothing about modes. */
START_TEST(a_fresh_state_directory_is_private_without_a_word_about_modes) {
  char path[200], line[512];
  struct stat st;
  FILE *f;

  fresh();
  h_start(&ctl);
  snprintf(path, sizeof(path), "%s/muster.db", ctl.dir);
  ck_assert_int_eq(stat(path, &st), 0);
  ck_assert_msg((st.st_mode & 0777) == 0600, "%s is %o", path, st.st_mode & 0777);
  f = fopen(ctl.log, "r");
  ck_assert_ptr_nonnull(f);
  while (fgets(line, sizeof(line), f))
    ck_assert_msg(!strstr(line, "was mode"), "a fresh state directory logged: %s", line);
  fclose(f);
  h_finish(&ctl);
}
END_TEST

/* 5. A state directory made by someone else's umask: the controller makes
 * it private, says so, and never prints the token where stdout goes. */
START_TEST(the_state_directory_is_private_whatever_existed) {
  static const char *const files[] = {"muster.db", "muster.db-wal", "muster.db-shm", "token"};
  char path[200], cmd[400];
  struct stat st;
  FILE *f;
  char line[512];
  int said = 0;

  fresh();
  h_start(&ctl);
  h_kill9(&ctl); /* the WAL and shm files stay */
  ck_assert_int_eq(chmod(ctl.dir, 0755), 0);
  for (size_t i = 0; i < sizeof(files) / sizeof(files[0]); i++) {
    snprintf(path, sizeof(path), "%s/%s", ctl.dir, files[i]);
    ck_assert_int_eq(chmod(path, 0644), 0);
  }
  h_restart(&ctl);
  ck_assert_int_eq(stat(ctl.dir, &st), 0);
  ck_assert_int_eq(st.st_mode & 0777, 0700);
  for (size_t i = 0; i < sizeof(files) / sizeof(files[0]); i++) {
    snprintf(path, sizeof(path), "%s/%s", ctl.dir, files[i]);
    ck_assert_int_eq(stat(path, &st), 0);
    ck_assert_msg((st.st_mode & 0777) == 0600, "%s is %o", path, st.st_mode & 0777);
  }
  f = fopen(ctl.log, "r");
  ck_assert_ptr_nonnull(f);
  while (fgets(line, sizeof(line), f)) {
    ck_assert_msg(!strstr(line, ctl.token), "the log holds the API token: %s", line);
    said |= strstr(line, "was mode 0644; made it 0600") != NULL;
  }
  fclose(f);
  ck_assert_msg(said, "the controller did not say that it tightened the modes");
  snprintf(cmd, sizeof(cmd), "grep -rl %s %s/workers >/dev/null 2>&1", ctl.token, ctl.dir);
  ck_assert_msg(system(cmd) != 0, "a worker log holds the API token");
  h_finish(&ctl);
}
END_TEST

/* The chaos test: 10 rounds of "launch 20 workers, kill -9 the controller at
 * a random moment of the launch, restart". Afterwards no script ran twice,
 * every worker ends terminal, and every id the API ever answered is known. */
START_TEST(kill9_at_random_moments_runs_nothing_twice) {
  char file[160], body[400];
  json_t *all = json_array(), *ans, *w;
  size_t i;
  int rounds = 10;

  fresh();
  ctl.extra[0] = "--start-timeout";
  ctl.extra[1] = "30";
  h_start(&ctl);
  snprintf(file, sizeof(file), "%s/ran", ctl.work);
  unlink(file);
  once_body(body, sizeof(body), 20, file, 0.2);
  srand((unsigned)getpid());
  for (int r = 0; r < rounds; r++) {
    json_t *out = NULL;
    pid_t killer = fork();
    ck_assert_int_ge(killer, 0);
    if (killer == 0) {
      usleep((useconds_t)(rand() % 40000));
      kill(ctl.pid, SIGKILL);
      _exit(0);
    }
    if (h_http(&ctl, "POST", "/api/v1/workers", body, "", &out, NULL) == 201)
      json_array_extend(all, json_object_get(out, "workers"));
    json_decref(out);
    waitpid(killer, NULL, 0);
    waitpid(ctl.pid, NULL, 0);
    ctl.pid = 0;
    h_restart(&ctl);
  }
  ans = h_await(&ctl, all, 1, 60);
  ck_assert(json_is_false(json_object_get(ans, "timed_out")));
  json_decref(ans);
  /* Workers whose launch answer was lost to a kill end too. */
  for (double until = h_now() + 60; h_now() < until;) {
    json_t *live = NULL;
    size_t n;
    ck_assert_int_eq(h_http(&ctl, "GET", "/api/v1/workers?status=scheduling,starting,running", NULL,
                            "", &live, NULL),
                     200);
    n = json_array_size(json_object_get(live, "workers"));
    json_decref(live);
    if (n == 0)
      break;
    usleep(100 * 1000);
  }
  {
    /* Every worker the controller knows, answered or not. */
    json_t *list = NULL;
    ck_assert_int_eq(h_http(&ctl, "GET", "/api/v1/workers?limit=5000", NULL, "", &list, NULL), 200);
    json_array_foreach(json_object_get(list, "workers"), i, w) {
      const char *st = h_str(w, "status");
      ck_assert_msg(strcmp(st, "succeeded") == 0 || strcmp(st, "failed") == 0 ||
                        strcmp(st, "stopped") == 0,
                    "%s is still %s", h_str(w, "id"), st);
      ck_assert_msg(count_lines(file, h_str(w, "id")) <= 1, "%s ran its script %d times",
                    h_str(w, "id"), count_lines(file, h_str(w, "id")));
    }
    json_decref(list);
  }
  json_array_foreach(all, i, w) {
    json_t *now = h_worker(&ctl, h_str(w, "id"));
    ck_assert_msg(now != NULL, "%s was answered once and is unknown now", h_str(w, "id"));
    json_decref(now);
  }
  unlink(file);
  json_decref(all);
  h_finish(&ctl);
}
END_TEST

int main(void) {
  Suite *s = suite_create("faults");
  TCase *tc = tcase_create("spawn_crash");

  /* A case of its own, so that CK_RUN_CASE=spawn_crash repeats it alone. */
  tcase_set_timeout(tc, 180);
  tcase_add_test(tc, a_crash_right_after_a_spawn_runs_each_script_once);
  suite_add_tcase(s, tc);
  tc = tcase_create("faults");

  tcase_set_timeout(tc, 180);
  tcase_add_test(tc, a_crash_between_a_register_and_its_answer_loses_no_worker);
  tcase_add_test(tc, a_registration_from_another_attempt_is_refused);
  tcase_add_test(tc, a_token_read_by_another_process_fails_its_worker);
  tcase_add_test(tc, an_exit_code_that_is_no_exit_status_is_refused);
  tcase_add_test(tc, a_proxy_answering_502_does_not_keep_an_orphan_alive);
  tcase_add_test(tc, appends_racing_a_followed_log_neither_hang_nor_get_lost);
  tcase_add_test(tc, a_recycled_pid_is_never_signalled);
  tcase_add_test(tc, a_hung_adopted_worker_is_killed_when_it_fails);
  tcase_add_test(tc, abandoned_waits_are_freed);
  tcase_add_test(tc, a_fresh_state_directory_is_private_without_a_word_about_modes);
  tcase_add_test(tc, the_state_directory_is_private_whatever_existed);
  tcase_add_test(tc, kill9_at_random_moments_runs_nothing_twice);
  suite_add_tcase(s, tc);
  return check_run(s);
}
