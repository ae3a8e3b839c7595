/* check_nomem.c: allocations that fail (the fault-injection points of
 * test builds, MUSTER_FAULT) before a launch is answered, where nothing
 * may be stored, and after, where its workers must fail saying why rather
 * than wait with nothing to start them. Real controller, real workerd
 * processes, real SQLite. */
#include "harness.h"

#include "../check_run.h"

#include <check.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static struct ctl_proc ctl;

static void fresh(void) {
  memset(&ctl, 0, sizeof(ctl));
}

/* A launch the controller has no memory to track (fault: the third of its
 * live-table entries cannot be allocated; the two before it are freed) is
 * refused, 500 saying so, and stores nothing: no row is left `scheduling`
 * with nothing in memory to start it. The next launch runs. */
START_TEST(a_launch_without_memory_to_track_it_stores_nothing) {
  char *raw = NULL;
  json_t *ans = NULL, *workers;
  long st;

  fresh();
  setenv("MUSTER_FAULT", "lw_reserve_nomem:fail=1@2", 1);
  h_start(&ctl);
  unsetenv("MUSTER_FAULT");
  st = h_http(&ctl, "POST", "/api/v1/workers", "{\"n\": 3, \"cpu\": 0.01, \"memory\": 0.01}", "",
              NULL, &raw);
  ck_assert_msg(st == 500 && raw && strstr(raw, "out of memory; nothing was launched"),
                "a launch without memory answered %ld: %s", st, raw ? raw : "");
  free(raw);
  ck_assert_int_eq(h_http(&ctl, "GET", "/api/v1/workers", NULL, "", &ans, NULL), 200);
  ck_assert_int_eq(json_array_size(json_object_get(ans, "workers")), 0);
  json_decref(ans);
  ck_assert_int_eq(h_metric(&ctl, "muster_workers{status=\"scheduling\"}"), 0);
  workers = h_launch(&ctl, "{\"n\": 2, \"cpu\": 0.01, \"memory\": 0.01}");
  ans = h_await(&ctl, workers, 0, 60);
  ck_assert(json_is_false(json_object_get(ans, "timed_out")));
  ck_assert_int_eq(json_array_size(json_object_get(ans, "workers")), 2);
  json_decref(ans);
  json_decref(workers);
  ck_assert_int_eq(h_metric(&ctl, "muster_workers{status=\"running\"}"), 2);
  h_finish(&ctl);
}
END_TEST

/* The first 64 KiB of the file at path (malloc'ed; "" if unreadable). */
static char *file_text(const char *path) {
  char *text = calloc(1, 65536);
  FILE *f = fopen(path, "r");

  ck_assert_ptr_nonnull(text);
  if (f) {
    size_t n = fread(text, 1, 65535, f);

    text[n] = '\0';
    fclose(f);
  }
  return text;
}

/* The controller's exit status when started on ctl's state directory and
 * port with MUSTER_FAULT=fault (it must end by itself within 60 s); its
 * output goes to log. */
static int exit_status_of_start(const char *fault, const char *log) {
  char port[16], listen[64];
  double until = h_now() + 60;
  int status = -1;
  pid_t pid;

  snprintf(port, sizeof(port), "%d", ctl.port);
  snprintf(listen, sizeof(listen), "127.0.0.1:%s", port);
  pid = fork();
  ck_assert_int_ge(pid, 0);
  if (pid == 0) {
    int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0600);

    if (fd >= 0) {
      dup2(fd, 1);
      dup2(fd, 2);
    }
    setenv("MUSTER_FAULT", fault, 1);
    execl(MUSTER_CONTROLLER_BIN, MUSTER_CONTROLLER_BIN, "--listen", listen, "--state-dir", ctl.dir,
          "--workdir", ctl.work, "--subnet", ctl.subnet, (char *)NULL);
    _exit(127);
  }
  while (waitpid(pid, &status, WNOHANG) == 0) {
    if (h_now() > until) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      ck_abort_msg("a controller started with %s still ran after 60 s; see %s", fault, log);
    }
    usleep(20 * 1000);
  }
  return status;
}

/* Fails the test unless the workerd wd[i] of each of the three workers
 * still runs after what (words for the message). */
static void workerds_run(json_t *workers, const long *wd, const char *what) {
  for (size_t i = 0; i < 3; i++)
    ck_assert_msg(!h_gone(wd[i], 0), "worker %s's workerd %ld ended with %s (logs in %s)",
                  h_str(json_array_get(workers, i), "id"), wd[i], what, ctl.dir);
}

/* A restarted controller started with MUSTER_FAULT=fault, whose third of
 * three live workers it then has no memory for, does not start: it says
 * so (words) and exits 1 rather than serve with a worker it would neither
 * start nor end, or take for lost and kill; what it had built is freed (the
 * sanitized build would say otherwise in its log). Nothing is lost: the
 * next start re-attaches the workers. */
static void restart_stops_and_loses_nothing(const char *fault, const char *words) {
  char log[200], *text;
  json_t *workers, *w;
  int status;
  long wd[3];

  fresh();
  h_start(&ctl);
  workers = h_launch(&ctl, "{\"n\": 3, \"cpu\": 0.01, \"memory\": 0.01}");
  json_decref(h_await(&ctl, workers, 0, 60));
  for (size_t i = 0; i < 3; i++)
    wd[i] = h_workerd_pid(&ctl, h_str(json_array_get(workers, i), "id"));
  h_kill9(&ctl);
  /* (the fault counts the workers found running: all three must be) */
  workerds_run(workers, wd, "the kill -9");
  snprintf(log, sizeof(log), "%s.nomem.log", ctl.dir);
  status = exit_status_of_start(fault, log);
  text = file_text(log);
  ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 1,
                "a restart with %s ended with status %#x: %s", fault, status, text);
  ck_assert_msg(strstr(text, words), "the failed restart did not say \"%s\": %s", words, text);
  ck_assert_msg(!strstr(text, "Sanitizer") && !strstr(text, "runtime error"),
                "the failed restart's cleanup: %s", text);
  free(text);
  unlink(log);
  workerds_run(workers, wd, "the failed restart");
  h_restart(&ctl);
  for (size_t i = 0; i < 3; i++) {
    const char *each = h_str(json_array_get(workers, i), "id");

    w = h_worker(&ctl, each);
    ck_assert_msg(strcmp(h_str(w, "status"), "running") == 0, "after the restart %s is %s: %s",
                  each, h_str(w, "status"),
                  json_is_string(json_object_get(w, "failure")) ? h_str(w, "failure") : "");
    json_decref(w);
  }
  json_decref(workers);
  h_finish(&ctl);
}

/* ...before its backend reconciles anything: no room in the live table. */
START_TEST(a_restart_without_memory_for_its_live_workers_stops_and_loses_nothing) {
  restart_stops_and_loses_nothing("lw_reserve_nomem:fail=1@2",
                                  "out of memory putting the live workers in the live table");
}
END_TEST

/* ...while the local backend adopts the workers that still run: no record
 * for the third (its cgroup, owned by none, would have been swept, and the
 * worker with it). */
START_TEST(a_restart_without_memory_to_adopt_a_local_worker_stops_and_loses_nothing) {
  restart_stops_and_loses_nothing("local_adopt_nomem:fail=1@2",
                                  "out of memory recording the local workers still running");
}
END_TEST

/* A launch answered 201 whose workers the backend then cannot place or
 * take (an allocation that fails, fault) fails them, saying why, and
 * await returns: they never stay `scheduling` with nothing to retry them.
 * extra: controller options (NULL-terminated); fault: MUSTER_FAULT. */
static void fails_saying_why(const char *const *extra, const char *fault, const char *words) {
  json_t *workers, *ans, *w;

  fresh();
  for (int i = 0; extra[i]; i++)
    ctl.extra[i] = extra[i];
  setenv("MUSTER_FAULT", fault, 1);
  h_start(&ctl);
  unsetenv("MUSTER_FAULT");
  workers = h_launch(&ctl, "{\"n\": 1, \"cpu\": 0.01, \"memory\": 0.01}");
  ans = h_await(&ctl, workers, 1, 20);
  ck_assert_msg(json_is_false(json_object_get(ans, "timed_out")), "%s: await timed out", fault);
  w = h_worker(&ctl, h_str(json_array_get(workers, 0), "id"));
  ck_assert_msg(strcmp(h_str(w, "status"), "failed") == 0, "%s: %s", fault, h_str(w, "status"));
  ck_assert_msg(strstr(h_str(w, "failure"), words), "%s: failure \"%s\"", fault,
                h_str(w, "failure"));
  json_decref(w);
  json_decref(ans);
  json_decref(workers);
  h_finish(&ctl);
}

START_TEST(a_worker_the_local_backend_cannot_place_or_start_fails_saying_why) {
  static const char *const none[] = {NULL};

  fails_saying_why(none, "local_place_nomem:fail=1",
                   "could not be placed by the local backend: out of memory");
  fails_saying_why(none, "local_submit_nomem:fail=1",
                   "could not be started by the local backend: out of memory");
}
END_TEST

START_TEST(a_worker_slurm_cannot_take_fails_saying_why) {
  static const char *const slurm[] = {"--backend", "slurm", NULL};
  char dir[] = "/tmp/muster-fake-slurm-XXXXXXXX", path[4200], *old = getenv("PATH");
  char saved[4096];

  /* Commands that answer like an empty cluster: the fault comes first. */
  ck_assert_ptr_nonnull(mkdtemp(dir));
  snprintf(saved, sizeof(saved), "%s", old ? old : "/usr/bin:/bin");
  for (int i = 0; i < 4; i++) {
    static const char *const cmd[] = {"sbatch", "squeue", "scontrol", "sinfo"};
    snprintf(path, sizeof(path), "%s/%s", dir, cmd[i]);
    h_write_exec(path, "#!/bin/sh\nexit 0\n");
  }
  snprintf(path, sizeof(path), "%s:%s", dir, saved);
  setenv("PATH", path, 1);
  fails_saying_why(slurm, "slurm_submit_nomem:fail=1",
                   "could not be started by the slurm backend: out of memory");
  setenv("PATH", saved, 1);
  for (int i = 0; i < 4; i++) {
    static const char *const cmd[] = {"sbatch", "squeue", "scontrol", "sinfo"};
    snprintf(path, sizeof(path), "%s/%s", dir, cmd[i]);
    unlink(path);
  }
  rmdir(dir);
}
END_TEST

int main(void) {
  Suite *s = suite_create("nomem");
  TCase *tc = tcase_create("nomem");

  tcase_set_timeout(tc, 180);
  tcase_add_test(tc, a_launch_without_memory_to_track_it_stores_nothing);
  tcase_add_test(tc, a_restart_without_memory_for_its_live_workers_stops_and_loses_nothing);
  tcase_add_test(tc, a_restart_without_memory_to_adopt_a_local_worker_stops_and_loses_nothing);
  tcase_add_test(tc, a_worker_the_local_backend_cannot_place_or_start_fails_saying_why);
  tcase_add_test(tc, a_worker_slurm_cannot_take_fails_saying_why);
  suite_add_tcase(s, tc);
  return check_run(s);
}
