/* check_cgroup: cg_mem_read_at() on cgroup trees laid out as the kernel
 * shows them (v1's memory hierarchy, v2's unified one), in a temporary
 * directory. The real thing is read in tests/slurm (a Slurm step's
 * cgroup, a script killed by its out-of-memory killer). */
#include "cgroup_mem.h"

#include "../check_run.h"

#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char root[64];

static void put(const char *rel, const char *text) {
  char path[512], dir[512], *slash;
  FILE *f;

  snprintf(path, sizeof(path), "%s/%s", root, rel);
  snprintf(dir, sizeof(dir), "%s", path);
  for (slash = strchr(dir + strlen(root) + 1, '/'); slash; slash = strchr(slash + 1, '/')) {
    *slash = '\0';
    mkdir(dir, 0700);
    *slash = '/';
  }
  f = fopen(path, "w");
  ck_assert_ptr_nonnull(f);
  fputs(text, f);
  fclose(f);
}

static void setup(void) {
  snprintf(root, sizeof(root), "/tmp/check_cgroup.XXXXXX");
  ck_assert_ptr_nonnull(mkdtemp(root));
}

static void teardown(void) {
  char cmd[128];
  snprintf(cmd, sizeof(cmd), "rm -rf '%s'", root);
  ck_assert_int_eq(system(cmd), 0);
}

START_TEST(v1_own_kills_and_tightest_limit) {
  struct cg_mem m;
  static const char self[] = "12:pids:/slurm/job_7\n"
                             "9:cpu,cpuacct:/slurm/job_7\n"
                             "4:memory:/slurm/job_7/step_0/task_0\n"
                             "1:name=systemd:/init.scope\n"
                             "0::/init.scope\n";

  put("memory/memory.usage_in_bytes", "1000\n");
  put("memory/memory.limit_in_bytes", "9223372036854771712\n");
  put("memory/slurm/job_7/memory.limit_in_bytes", "536870912\n");
  put("memory/slurm/job_7/memory.oom_control", "oom_kill_disable 0\nunder_oom 0\noom_kill 5\n");
  put("memory/slurm/job_7/step_0/memory.limit_in_bytes", "268435456\n");
  put("memory/slurm/job_7/step_0/task_0/memory.limit_in_bytes", "9223372036854771712\n");
  put("memory/slurm/job_7/step_0/task_0/memory.oom_control",
      "oom_kill_disable 0\nunder_oom 0\noom_kill 1\n");
  ck_assert_int_eq(cg_mem_read_at(root, self, &m), 0);
  /* its own count, not the job's (a sibling step's kills) */
  ck_assert_int_eq(m.oom_kills, 1);
  ck_assert_int_eq(m.limit, 268435456);
}
END_TEST

START_TEST(v2_unified) {
  struct cg_mem m;

  put("cgroup.controllers", "cpu memory pids\n");
  put("muster/w-1/memory.max", "107374182\n");
  put("muster/w-1/memory.events", "low 0\nhigh 0\nmax 3\noom 1\noom_kill 2\noom_group_kill 0\n");
  put("muster/memory.max", "max\n");
  put("muster/memory.events", "oom_kill 9\n");
  ck_assert_int_eq(cg_mem_read_at(root, "0::/muster/w-1\n", &m), 0);
  ck_assert_int_eq(m.oom_kills, 2);
  ck_assert_int_eq(m.limit, 107374182);
}
END_TEST

START_TEST(no_limit_no_kills) {
  struct cg_mem m;

  put("cgroup.controllers", "memory\n");
  put("user.slice/memory.max", "max\n");
  put("user.slice/memory.events", "oom 0\noom_kill 0\n");
  ck_assert_int_eq(cg_mem_read_at(root, "0::/user.slice\n", &m), 0);
  ck_assert_int_eq(m.oom_kills, 0);
  ck_assert_int_eq(m.limit, 0);
}
END_TEST

START_TEST(nothing_to_read) {
  struct cg_mem m;

  /* no memory hierarchy mounted where /proc/self/cgroup points */
  ck_assert_int_eq(cg_mem_read_at(root, "4:memory:/a\n", &m), -1);
  ck_assert_int_eq(cg_mem_read_at(root, "0::/a\n", &m), -1);
  /* nothing that names a memory cgroup at all */
  ck_assert_int_eq(cg_mem_read_at(root, "3:pids:/a\n", &m), -1);
  ck_assert_int_eq(cg_mem_read_at(root, "", &m), -1);
  ck_assert_int_eq(cg_mem_read_at(root, "garbage without colons", &m), -1);
  /* outside this cgroup namespace's root */
  put("memory/memory.usage_in_bytes", "1\n");
  ck_assert_int_eq(cg_mem_read_at(root, "4:memory:/../../other\n", &m), -1);
  /* memory among other controllers of one v1 line, before the v2 line */
  put("memory/a/memory.limit_in_bytes", "4096\n");
  ck_assert_int_eq(cg_mem_read_at(root, "4:cpuset,memory:/a\n0::/b\n", &m), 0);
  ck_assert_int_eq(m.limit, 4096);
}
END_TEST

int main(void) {
  Suite *s = suite_create("cgroup");
  TCase *tc = tcase_create("memory");

  tcase_add_checked_fixture(tc, setup, teardown);
  tcase_add_test(tc, v1_own_kills_and_tightest_limit);
  tcase_add_test(tc, v2_unified);
  tcase_add_test(tc, no_limit_no_kills);
  tcase_add_test(tc, nothing_to_read);
  suite_add_tcase(s, tc);
  return check_run(s);
}
