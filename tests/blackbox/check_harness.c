/* check_harness.c: a test that fails still ends what it started. A failed
 * Check assertion ends the test's process with _exit(), and Check's
 * timeout kills it: no exit handler runs either way. Here a child process
 * starts a controller through the harness, launches a worker into its
 * cgroup and on its bridge, and ends as a failed assertion ends it: the
 * worker, its cgroups, its bridge and its session's /tmp overlay must be
 * gone soon after. */
#include "harness.h"

#include "../check_run.h"

#include <check.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

/* What the child started, as it tells the parent. */
struct started {
  long workerd;
  char dir[96];
  char subnet[24];
  int bridged; /* its bridge was there while the worker ran */
  int cgroups; /* the cgroup bases its controller listed then */
};

/* How many of the cgroup base directories listed in DIR/cgroups are still
 * there; the first in first (size bytes). */
static int cgroups_left(const char *dir, char *first, size_t size) {
  char path[160], base[600];
  int left = 0;
  FILE *f;

  snprintf(path, sizeof(path), "%s/cgroups", dir);
  f = fopen(path, "r");
  if (!f)
    return 0;
  while (fgets(base, sizeof(base), f)) {
    struct stat st;

    base[strcspn(base, "\n")] = '\0';
    if (base[0] && stat(base, &st) == 0 && left++ == 0)
      snprintf(first, size, "%s", base);
  }
  fclose(f);
  return left;
}

/* How many mounts are under dir (the sessions' /tmp overlays). */
static int mounts_under(const char *dir) {
  char line[1024], prefix[128];
  int n = 0;
  FILE *f = fopen("/proc/self/mounts", "r");

  if (!f)
    return 0;
  snprintf(prefix, sizeof(prefix), " %s/", dir);
  while (fgets(line, sizeof(line), f))
    n += strstr(line, prefix) != NULL;
  fclose(f);
  return n;
}

/* The child: starts a controller and a worker, tells the parent on fd,
 * and ends as a failed assertion ends a test. */
static void start_and_fail(int fd) {
  static struct ctl_proc ctl;
  struct started s = {0};
  json_t *ws;
  char id[16], first[600];

  ctl.orphan_timeout = "600"; /* (its workerd does not end by itself) */
  h_start(&ctl);
  ws = h_launch(&ctl, "{\"n\": 1, \"cpu\": 0.1, \"kernel\": \"sh\", \"code\": \"sleep 600\"}");
  snprintf(id, sizeof(id), "%s", h_str(json_array_get(ws, 0), "id"));
  json_decref(ws);
  json_decref(h_wait_status(&ctl, id, "running", 60));
  s.workerd = h_workerd_pid(&ctl, id);
  snprintf(s.dir, sizeof(s.dir), "%s", ctl.dir);
  snprintf(s.subnet, sizeof(s.subnet), "%s", ctl.subnet);
  s.bridged = h_bridge_there(ctl.subnet);
  s.cgroups = cgroups_left(ctl.dir, first, sizeof(first));
  if (write(fd, &s, sizeof(s)) != (ssize_t)sizeof(s))
    _exit(2);
  _exit(1); /* what a failed ck_assert does in a forked test */
}

START_TEST(a_test_that_fails_leaves_no_worker_cgroup_or_bridge) {
  struct started s;
  char left[600] = "", cmd[400];
  int p[2], status, alive = 1, cgroups = 1, bridged = 1, mounts = 1;
  double until;
  pid_t child;

  ck_assert_int_eq(pipe(p), 0);
  child = fork();
  ck_assert_int_ge(child, 0);
  if (child == 0) {
    close(p[0]);
    start_and_fail(p[1]);
  }
  close(p[1]);
  ck_assert_msg(read(p[0], &s, sizeof(s)) == (ssize_t)sizeof(s),
                "the child could not start a controller and a running worker");
  close(p[0]);
  ck_assert_int_eq(waitpid(child, &status, 0), child);
  ck_assert_msg(s.workerd > 1 && s.dir[0], "the child told no workerd");
  /* (else there would be nothing to check but the workerd) */
  ck_assert_msg(s.bridged && s.cgroups > 0,
                "the worker ran with %d cgroup bases and %s bridge: this test needs both (root)",
                s.cgroups, s.bridged ? "a" : "no");
  /* (the guardian gives the controller up to 15 s to go first) */
  for (until = h_now() + 60; h_now() < until; usleep(50 * 1000)) {
    alive = !h_gone(s.workerd, 0); /* (a zombie is gone: its parent may never reap it) */
    cgroups = cgroups_left(s.dir, left, sizeof(left));
    bridged = s.bridged && h_bridge_there(s.subnet);
    mounts = mounts_under(s.dir);
    if (!alive && !cgroups && !bridged && !mounts)
      break;
  }
  /* What is left is ended here either way, so a failure leaves nothing. */
  if (alive || cgroups || bridged || mounts) {
    struct ctl_proc c = {0};

    snprintf(c.dir, sizeof(c.dir), "%s", s.dir);
    snprintf(c.subnet, sizeof(c.subnet), "%s", s.subnet);
    snprintf(c.log, sizeof(c.log), "%s.controller.log", s.dir);
    snprintf(c.work, sizeof(c.work), "%s.work", s.dir);
    if (alive) {
      kill(-(pid_t)s.workerd, SIGKILL);
      kill((pid_t)s.workerd, SIGKILL);
    }
    h_finish(&c);
  } else {
    snprintf(cmd, sizeof(cmd), "rm -rf %s %s.controller.log %s.work", s.dir, s.dir, s.dir);
    ck_assert_int_eq(system(cmd), 0);
  }
  ck_assert_msg(!alive, "worker's workerd %ld still runs 60 s after its test failed", s.workerd);
  ck_assert_msg(!cgroups, "%d cgroups are left 60 s after the test failed (%s)", cgroups, left);
  ck_assert_msg(!bridged, "the bridge of %s is left 60 s after the test failed", s.subnet);
  ck_assert_msg(!mounts, "%d overlays are mounted under %s 60 s after the test failed", mounts,
                s.dir);
}
END_TEST

int main(void) {
  Suite *s = suite_create("harness");
  TCase *tc = tcase_create("harness");

  tcase_set_timeout(tc, 180);
  tcase_add_test(tc, a_test_that_fails_leaves_no_worker_cgroup_or_bridge);
  suite_add_tcase(s, tc);
  return check_run(s);
}
