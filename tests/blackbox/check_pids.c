/* check_pids.c: a pid the controller no longer owns is never signalled.
 * Once the local backend has reaped a workerd, its pid is free for any
 * process; here one takes it (the kernel's ns_last_pid hands it out) while
 * the backend's thread waits after the reap (fault point local_reaped),
 * with /proc entries that cannot be read (local_proc_unreadable): the KILL
 * due for the stopped worker's leftovers must not reach it. Needs a test
 * build (MUSTER_FAULT) and a writable /proc/sys/kernel/ns_last_pid (root);
 * without one the test says so and passes. */
#include "harness.h"

#include "../check_run.h"

#include <check.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define LAST_PID "/proc/sys/kernel/ns_last_pid"

/* A child in a session of its own with pid want, or -1 when other
 * processes kept taking it until deadline (a monotonic h_now() time). */
static pid_t child_with_pid(pid_t want, double deadline) {
  while (h_now() < deadline) {
    FILE *f = fopen(LAST_PID, "w");
    pid_t p;

    ck_assert_ptr_nonnull(f);
    fprintf(f, "%d", (int)want - 1);
    fclose(f);
    p = fork();
    ck_assert_int_ge(p, 0);
    if (p == 0) {
      setsid();
      execl("/bin/sleep", "sleep", "60", (char *)NULL);
      _exit(127);
    }
    if (p == want)
      return p;
    kill(p, SIGKILL);
    waitpid(p, NULL, 0);
  }
  return -1;
}

START_TEST(a_stop_never_signals_the_process_that_got_a_reaped_workerds_pid) {
  struct ctl_proc ctl;
  json_t *workers, *other, *w;
  char path[64];
  pid_t wd, decoy;
  int st;

  if (access(LAST_PID, W_OK) != 0) {
    printf("skipped: %s cannot be written here (not root)\n", LAST_PID);
    return;
  }
  memset(&ctl, 0, sizeof(ctl));
  setenv("MUSTER_FAULT", "local_reaped:delay=8000,local_proc_unreadable:fail=100000", 1);
  h_start(&ctl);
  unsetenv("MUSTER_FAULT");
  workers = h_launch(&ctl, "{\"n\": 1, \"cpu\": 0.01, \"memory\": 0.01}");
  json_decref(h_await(&ctl, workers, 0, 20));
  wd = (pid_t)h_workerd_pid(&ctl, h_str(json_array_get(workers, 0), "id"));
  snprintf(path, sizeof(path), "/api/v1/workers/%s", h_str(json_array_get(workers, 0), "id"));
  ck_assert_int_eq(h_http(&ctl, "DELETE", path, NULL, "", &w, NULL), 200);
  json_decref(w);
  /* The workerd ends on its TERM and is reaped: its /proc entry goes (a
   * zombie's would stay). The backend's thread now waits at local_reaped,
   * before the KILL due for what is left of the worker. */
  snprintf(path, sizeof(path), "/proc/%d", (int)wd);
  for (double until = h_now() + 20; access(path, F_OK) == 0;) {
    ck_assert_msg(h_now() < until, "workerd %d was not reaped", (int)wd);
    usleep(10 * 1000);
  }
  decoy = child_with_pid(wd, h_now() + 5);
  ck_assert_msg(decoy == wd, "no process could be given pid %d", (int)wd);
  /* The backend's thread does one thing at a time: once a worker launched
   * now runs, the KILL due after the reap was sent, or not. */
  other = h_launch(&ctl, "{\"n\": 1, \"cpu\": 0.01, \"memory\": 0.01}");
  json_decref(h_await(&ctl, other, 0, 30));
  w = h_worker(&ctl, h_str(json_array_get(other, 0), "id"));
  ck_assert_str_eq(h_str(w, "status"), "running");
  json_decref(w);
  ck_assert_msg(waitpid(decoy, &st, WNOHANG) == 0, "the controller signalled pid %d (%s)",
                (int)decoy, WIFSIGNALED(st) ? strsignal(WTERMSIG(st)) : "exited");
  kill(decoy, SIGKILL);
  waitpid(decoy, NULL, 0);
  json_decref(other);
  json_decref(workers);
  h_finish(&ctl);
}
END_TEST

int main(void) {
  Suite *s = suite_create("pids");
  TCase *tc = tcase_create("pids");

  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, a_stop_never_signals_the_process_that_got_a_reaped_workerds_pid);
  suite_add_tcase(s, tc);
  return check_run(s);
}
