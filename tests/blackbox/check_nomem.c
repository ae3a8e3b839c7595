/* check_nomem.c: allocations that fail (the fault-injection points of
 * test builds, MUSTER_FAULT) before a launch is answered, where nothing
 * may be stored, and after, where its workers must fail saying why rather
 * than wait with nothing to start them. Real controller, real workerd
 * processes, real SQLite. */
#include "harness.h"

#include "../check_run.h"

#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static struct ctl_proc ctl;

static void fresh(void) {
  memset(&ctl, 0, sizeof(ctl));
}

/* A launch the controller has no memory to track (fault: the live
 * table's entry cannot be allocated) is refused, 500 saying so, and stores
 * nothing: no row is left `scheduling` with nothing in memory to start it.
 * The next launch runs. */
START_TEST(a_launch_without_memory_to_track_it_stores_nothing) {
  char *raw = NULL;
  json_t *ans = NULL, *workers;
  long st;

  fresh();
  setenv("MUSTER_FAULT", "lw_reserve_nomem:fail=1", 1);
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
  tcase_add_test(tc, a_worker_the_local_backend_cannot_place_or_start_fails_saying_why);
  tcase_add_test(tc, a_worker_slurm_cannot_take_fails_saying_why);
  suite_add_tcase(s, tc);
  return check_run(s);
}
