/* check_idle.c: muster-workerd spends nothing while it waits on its
 * controller: no busy loop while an exec command's end waits for its output
 * to ship to a paused controller, and a steady flow of output goes out in
 * batches, not one POST per answer. Real controller, real workerd. */
#include "away.h"
#include "harness.h"
#include "muster.h"

#include "../check_run.h"

#include <check.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* The CPU time (user and system) pid has used, in seconds. */
static double cpu_of(long pid) {
  char buf[1024];
  const char *f = h_proc_stat(pid, buf, sizeof(buf));
  unsigned long ut = 0, st = 0;

  ck_assert_ptr_nonnull(f);
  ck_assert_int_eq(sscanf(f, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu", &ut, &st), 2);
  return (double)(ut + st) / (double)sysconf(_SC_CLK_TCK);
}

/* An exec'd command exits and leaves a background job holding its output
 * pipe: its X waits out the 2 s drain, then up to 2 s for its output to
 * ship to the paused controller. workerd polls through all of it. */
START_TEST(an_exec_end_waiting_on_a_paused_controller_costs_no_cpu) {
  const char *argv[] = {"sh", "-c", "echo hi; sleep 6 & exit 0"};
  muster_client *cl = NULL;
  muster_exec_target t;
  muster_exec_opts o;
  char id[16], err[256] = "";
  double t0, took, cpu;
  int code = -1, rc;
  long wd;

  aw_up();
  aw_launch(NULL, NULL, id, sizeof(id));
  wd = h_workerd_pid(&ctl, id);
  ck_assert_int_eq(muster_client_new(ctl.url, ctl.token, &cl), 0);
  ck_assert_int_eq(muster_exec_target_get(cl, id, &t), 0);
  muster_exec_opts_init(&o);
  o.argv = argv;
  o.argc = 3;
  o.stdout_fd = o.stderr_fd = -1;
  aw_pause_ctl(1);
  cpu = cpu_of(wd);
  t0 = h_now();
  rc = muster_exec_at(&t, &o, &code, err, sizeof(err));
  took = h_now() - t0;
  cpu = cpu_of(wd) - cpu;
  aw_resume_ctl();
  muster_client_free(cl);
  aw_down();
  ck_assert_msg(rc == 0 && code == 0, "muster exec: %d, exit code %d: %s", rc, code, err);
  ck_assert_msg(took >= 3.5,
                "the X came %.2f s after the command's exit: it did not wait out the drain and "
                "the ship to the paused controller",
                took);
  ck_assert_msg(cpu <= 0.5, "workerd used %.2f s of CPU in the %.2f s its X waited", cpu, took);
}
END_TEST

/* A line comes every millisecond or so, for 2 s or more, and the
 * controller takes 20 ms over each log POST (a fault point): what comes in
 * while one flies waits its own 200 ms, so it ships a few POSTs a second
 * beside the heartbeats, not one POST per answer. */
#ifdef MUSTER_FAULT_INJECTION
START_TEST(a_steady_flow_of_output_ships_in_batches) {
  const char *code = "import time\n"
                     "for i in range(2000):\n"
                     "    print('line', i, flush=True)\n"
                     "    time.sleep(0.001)\n";
  char id[16];
  double n0, n1, t0, took;
  char *log;
  int lines = 0;
  json_t *ws, *ans, *w;

  setenv("MUSTER_FAULT", "log_append_slow:delay=20", 1);
  aw_up();
  unsetenv("MUSTER_FAULT");
  aw_launch("python3", code, id, sizeof(id));
  ws = json_pack("[{s:s}]", "id", id);
  n0 = h_metric(&ctl, "muster_http_requests_total");
  t0 = h_now();
  ans = h_await(&ctl, ws, 1, 60); /* one request, answered at the end */
  took = h_now() - t0;
  n1 = h_metric(&ctl, "muster_http_requests_total");
  json_decref(ans);
  json_decref(ws);
  w = h_worker(&ctl, id);
  ck_assert_str_eq(h_str(w, "status"), "succeeded");
  json_decref(w);
  log = aw_log_of(id);
  for (const char *p = log; (p = strstr(p, "line ")) != NULL; p++)
    lines++;
  free(log);
  aw_down();
  fprintf(stderr, "check_idle: %.0f requests to the controller in %.2f s\n", n1 - n0, took);
  ck_assert_msg(lines == 2000, "the log holds %d of the script's 2000 lines", lines);
  /* 5 log POSTs and 3.3 heartbeats a second, and this test's own calls. */
  ck_assert_msg(n1 - n0 <= 20 + 12 * took,
                "the controller got %.0f requests in the %.2f s the script printed a line every "
                "millisecond: its output was not shipped in batches",
                n1 - n0, took);
}
END_TEST
#endif

int main(void) {
  Suite *s = suite_create("idle");
  TCase *tc = tcase_create("idle");

  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, an_exec_end_waiting_on_a_paused_controller_costs_no_cpu);
#ifdef MUSTER_FAULT_INJECTION
  tcase_add_test(tc, a_steady_flow_of_output_ships_in_batches);
#endif
  suite_add_tcase(s, tc);
  return check_run(s);
}
