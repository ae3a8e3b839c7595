/* check_isolation.c: workers of the local backend are containers. The
 * real controller and workerd, real cgroups (v1 on this machine and CI; v2
 * where the host has it): a memory limit the kernel enforces and that a
 * failure names, a stop and an end that leave no process behind, the
 * cgroup gone after, and --isolation none as before. */
#include "harness.h"

#include "../check_run.h"

#include <check.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <time.h>
#include <unistd.h>

static struct ctl_proc ctl;

static void fresh(void) {
  memset(&ctl, 0, sizeof(ctl));
}

/* Whether this controller isolates workers. Where it does not, the test
 * says why it cannot run here (no root, no cgroup file system) and checks
 * nothing; but as root on a host with cgroups v1 (this machine, CI)
 * isolation must work, and its absence fails the test. */
static int isolated(void) {
  json_t *h = NULL;
  int yes;

  ck_assert_int_eq(h_http(&ctl, "GET", "/api/v1/health", NULL, NULL, &h, NULL), 200);
  yes = strcmp(h_str(h, "isolation"), "cgroup") == 0;
  json_decref(h);
  ck_assert_msg(yes || getuid() != 0 || access("/sys/fs/cgroup/memory", F_OK) != 0,
                "a root controller on a cgroup v1 host isolates no workers (see %s)", ctl.log);
  if (!yes)
    fprintf(stderr, "SKIPPED: this host gives the controller no cgroups (see %s)\n", ctl.log);
  return yes;
}

/* The memory cgroup directory of process pid, from /proc/PID/cgroup ("" if
 * none). */
static void memory_cgroup(long pid, char *dir, size_t len) {
  char path[64], line[512];
  FILE *f;

  dir[0] = '\0';
  snprintf(path, sizeof(path), "/proc/%ld/cgroup", pid);
  f = fopen(path, "r");
  if (!f)
    return;
  while (fgets(line, sizeof(line), f)) {
    char *p = strstr(line, ":memory:");
    line[strcspn(line, "\n")] = '\0';
    if (p)
      snprintf(dir, len, "/sys/fs/cgroup/memory%s", p + 8);
    else if (strncmp(line, "0::", 3) == 0 && !dir[0])
      snprintf(dir, len, "/sys/fs/cgroup%s", line + 3);
  }
  fclose(f);
}

START_TEST(a_worker_past_its_memory_fails_saying_so) {
  json_t *workers, *ans, *f;
  double t0;

  fresh();
  h_start(&ctl);
  if (!isolated())
    goto out;
  /* 300 MB written, in a worker of 0.1 GiB; the script says when it starts
   * to allocate (the kill comes after) */
  workers = h_launch(&ctl, "{\"n\": 1, \"cpu\": 1, \"memory\": 0.1, \"code\": \"!python3 -c "
                           "'import time; print(repr(time.time()), flush=True); "
                           "x = b\\\"a\\\" * (300 << 20); time.sleep(30)'\"}");
  t0 = h_now();
  ans = h_await(&ctl, workers, 1, 30);
  f = json_array_get(json_object_get(ans, "failures"), 0);
  ck_assert_ptr_nonnull(f);
  ck_assert_str_eq(h_str(f, "status"), "failed");
  ck_assert_msg(strstr(h_str(f, "failure"), "killed: out of memory (limit 0.1 GiB)") != NULL,
                "failure: %s", h_str(f, "failure"));
  /* The kill comes after the script's first line: the failure is recorded
   * soon after that line, not a heartbeat timeout (15 s) later, and not at
   * the script's end (30 s). The bounds are halfway to those, so that a
   * loaded machine's delays do not decide. */
  {
    double ended = h_iso_seconds(h_str(f, "finished_at")), said = 0;
    char path[96], *out = NULL;
    snprintf(path, sizeof(path), "/api/v1/workers/%s/logs?stream=stdout", h_str(f, "id"));
    ck_assert_int_eq(h_http(&ctl, "GET", path, NULL, "", NULL, &out), 200);
    ck_assert_msg(out && sscanf(out, "%lf", &said) == 1, "the script said: %s", out);
    free(out);
    ck_assert_msg(ended > 0 && ended - said < 7.5, "failed %.2f s after it began to allocate",
                  ended - said);
  }
  ck_assert_msg(h_now() - t0 < 25, "the failure took %.1f s", h_now() - t0);
  json_decref(ans);
  json_decref(workers);
out:
  h_finish(&ctl);
}
END_TEST

/* The pids in cgroup directory dir (host pids), into pids; returns how many. */
static int cgroup_pids(const char *dir, long *pids, int max) {
  char path[700];
  int n = 0;
  FILE *f;

  snprintf(path, sizeof(path), "%s/cgroup.procs", dir);
  f = fopen(path, "r");
  if (!f)
    return 0;
  while (n < max && fscanf(f, "%ld", &pids[n]) == 1)
    n++;
  fclose(f);
  return n;
}

static void wait_file(const char *path, double timeout_s) {
  struct stat st;

  for (double until = h_now() + timeout_s; stat(path, &st) != 0; usleep(50 * 1000))
    ck_assert_msg(h_now() < until, "%s did not appear within %g s", path, timeout_s);
}

/* A worker whose script starts a daemon (double fork, its own session),
 * ended as end says ("" lets the script end by itself; "stop" stops it):
 * every process of its cgroup, the daemon among them, is gone after, and so
 * is the cgroup. */
static void daemon_case(const char *tail, int stop) {
  char body[700], dir[64], mark[96], cg[600];
  json_t *workers, *ans;
  long pids[64], wd;
  int n;
  struct stat st;

  h_shared_dir(dir, sizeof(dir), "iso");
  snprintf(mark, sizeof(mark), "%s/started", dir);
  snprintf(body, sizeof(body),
           "{\"n\": 1, \"cpu\": 0.5, \"memory\": 0.25, \"cwd\": \"%s\", \"code\": "
           "\"!(setsid sleep 300 >/dev/null 2>&1 &); touch %s; %s\"}",
           dir, mark, tail);
  workers = h_launch(&ctl, body);
  wait_file(mark, 20);
  wd = h_workerd_pid(&ctl, h_str(json_array_get(workers, 0), "id"));
  memory_cgroup(wd, cg, sizeof(cg));
  ck_assert_msg(strstr(cg, "/muster-") != NULL, "workerd %ld is in no muster cgroup: \"%s\"", wd,
                cg);
  n = cgroup_pids(cg, pids, 64);
  /* workerd, the command (and its namespace's process 1), the daemon */
  ck_assert_msg(n >= 4, "the cgroup %s holds %d processes", cg, n);
  if (stop)
    ck_assert_int_eq(h_http(&ctl, "POST", "/api/v1/workers/stop", "{}", "", NULL, NULL), 200);
  ans = h_await(&ctl, workers, 1, 20);
  if (!stop)
    ck_assert_msg(json_array_size(json_object_get(ans, "workers")) == 1, "the worker failed: %s",
                  h_str(json_array_get(json_object_get(ans, "failures"), 0), "failure"));
  json_decref(ans);
  for (int i = 0; i < n; i++)
    ck_assert_msg(h_gone(pids[i], 10), "process %ld of the worker's cgroup outlived it", pids[i]);
  for (int i = 0; i < 50 && stat(cg, &st) == 0; i++)
    usleep(100 * 1000);
  ck_assert_msg(stat(cg, &st) != 0 && errno == ENOENT, "the cgroup %s is still there", cg);
  json_decref(workers);
  h_shared_dir_remove(dir);
}

START_TEST(a_daemon_a_script_leaves_is_killed_and_the_cgroup_goes) {
  fresh();
  h_start(&ctl);
  if (isolated()) {
    daemon_case("sleep 1", 0);   /* the script ends by itself, and succeeds */
    daemon_case("sleep 300", 1); /* an idle worker, stopped */
  }
  h_finish(&ctl);
}
END_TEST

/* What a worker's script tries, and must not manage: the controller's
 * token, its database (every worker's token), another worker's
 * environment, and undoing the mount that hides them. */
START_TEST(a_script_cannot_reach_the_controllers_secrets) {
  char body[1600], dir[64], *text = NULL;
  json_t *workers, *other, *ans;
  long other_pid;

  fresh();
  h_start(&ctl);
  if (!isolated())
    goto out;
  other = h_launch(&ctl, "{\"n\": 1, \"cpu\": 0.1, \"memory\": 0.25}");
  json_decref(h_await(&ctl, other, 0, 20));
  other_pid = h_workerd_pid(&ctl, h_str(json_array_get(other, 0), "id"));
  h_shared_dir(dir, sizeof(dir), "iso");
  snprintf(
      body, sizeof(body),
      "{\"n\": 1, \"cpu\": 0.5, \"memory\": 0.25, \"cwd\": \"%s\", \"code\": \"!"
      "cat %s/token >/dev/null 2>&1 && echo token-read; "
      "cat %s/muster.db >/dev/null 2>&1 && echo db-read; "
      "ls -A %s | grep -q . && echo state-listed; "
      "cat /proc/%ld/environ >/dev/null 2>&1 && echo environ-read; "
      "umount %s 2>/dev/null && echo unmounted; "
      "grep -l MUSTER_WORKER_TOKEN /proc/[0-9]*/environ 2>/dev/null | grep -q . && "
      "echo some-token-seen; "
      "ls -A /sys/fs/cgroup | grep -q . && echo cgroups-seen; "
      "v=$(cat /proc/sys/kernel/sysrq); (echo $v > /proc/sys/kernel/sysrq) 2>/dev/null && "
      "echo sysctl-written; "
      "mknod %s/null c 1 3 2>/dev/null && echo mknod-done; "
      "b=$(find /dev -maxdepth 1 -type b | head -1); if [ -z \\\"$b\\\" ]; then echo no-disk; "
      "elif (: < $b) 2>&1 | grep -qE 'not permitted|Permission denied'; then echo disk-denied; "
      "fi; "
      "echo processes $(ls /proc | grep -c '^[0-9]').; echo uid=$(id -u).; "
      "grep -q ' %s ' /proc/self/mountinfo && echo state-covered; echo done\"}",
      dir, ctl.dir, ctl.dir, ctl.dir, other_pid, ctl.dir, dir, ctl.dir);
  workers = h_launch(&ctl, body);
  ans = h_await(&ctl, workers, 1, 20);
  json_decref(ans);
  {
    char path[80];
    snprintf(path, sizeof(path), "/api/v1/workers/%s/logs?stream=stdout",
             h_str(json_array_get(workers, 0), "id"));
    ck_assert_int_eq(h_http(&ctl, "GET", path, NULL, "", NULL, &text), 200);
  }
  fprintf(stderr, "the script saw: %s", text ? text : "(nothing)\n");
  ck_assert_msg(text && strstr(text, "done"), "the script did not run to its end: %s", text);
  ck_assert_msg(!strstr(text, "uid=0."), "the script ran as root");
  /* The uid alone refuses most of what follows: the namespaces are
   * checked for themselves (the state covered, few processes in sight). */
  ck_assert_msg(strstr(text, "state-covered"), "the state directory is not covered");
  {
    const char *p = strstr(text, "processes ");
    char *end = NULL;
    long n = p ? strtol(p + 10, &end, 10) : -1;
    ck_assert_msg(end && *end == '.' && n > 0 && n <= 10,
                  "the script sees the host's processes: %s", p ? p : "(none)");
  }
  ck_assert_msg(!strstr(text, "token-read"), "the script read the controller's token");
  ck_assert_msg(!strstr(text, "db-read"), "the script read muster.db");
  ck_assert_msg(!strstr(text, "state-listed"), "the script listed the state directory");
  ck_assert_msg(!strstr(text, "environ-read"), "the script read another worker's environ");
  ck_assert_msg(!strstr(text, "unmounted"), "the script unmounted what hides the state");
  ck_assert_msg(!strstr(text, "some-token-seen"), "the script saw a workerd's environment");
  ck_assert_msg(!strstr(text, "cgroups-seen"), "the script saw the cgroups (and its limits)");
  ck_assert_msg(!strstr(text, "sysctl-written"), "the script wrote a kernel setting");
  ck_assert_msg(!strstr(text, "mknod-done"), "the script made a device node");
  ck_assert_msg(strstr(text, "disk-denied") || strstr(text, "no-disk"),
                "the script could open a disk's device node");
  free(text);
  json_decref(workers);
  json_decref(other);
  h_shared_dir_remove(dir);
out:
  h_finish(&ctl);
}
END_TEST

/* The worker's usage now: cpu seconds and peak bytes (-1: none yet). */
static void usage_of(const char *id, double *cpu, double *peak) {
  json_t *w = h_worker(&ctl, id), *u = json_object_get(w, "usage");

  *cpu = json_is_object(u) ? json_number_value(json_object_get(u, "cpu_seconds")) : -1;
  *peak = json_is_object(u) ? json_number_value(json_object_get(u, "memory_peak_bytes")) : -1;
  json_decref(w);
}

/* The last "busy WALL CPU" line the script printed (seconds since its loop
 * began, by its own clocks), once WALL >= at_least; 0 while there is none. */
static int busy_line(const char *id, double at_least, double *first_wall, double *first_cpu,
                     double *wall, double *cpu) {
  char path[96], *out = NULL, *p;
  int found = 0;

  snprintf(path, sizeof(path), "/api/v1/workers/%s/logs?stream=stdout", id);
  ck_assert_int_eq(h_http(&ctl, "GET", path, NULL, "", NULL, &out), 200);
  for (p = out ? strstr(out, "busy ") : NULL; p; p = strstr(p + 1, "busy ")) {
    double w, c;

    if (sscanf(p, "busy %lf %lf", &w, &c) != 2)
      continue;
    if (!found++) {
      *first_wall = w;
      *first_cpu = c;
    }
    *wall = w;
    *cpu = c;
  }
  free(out);
  return found >= 2 && *wall - *first_wall >= at_least;
}

START_TEST(usage_shows_the_cpu_quota_and_the_memory_peak) {
  json_t *workers, *ans;
  double cpu1 = -1, peak = -1, c = -1, pk = -1, w0, c0, w1, c1, rate, launched;
  const char *id;

  fresh();
  h_start(&ctl);
  if (!isolated())
    goto out;
  /* 400 MiB written (the script says when), then a busy loop, in a worker
   * of half a core, that prints each second its own wall and cpu time.
   * Both clocks are the script's: a loaded machine delays this test's
   * polling, never what the script measured. */
  launched = h_now();
  workers = h_launch(&ctl, "{\"n\": 1, \"cpu\": 0.5, \"memory\": 1, \"code\": \"!python3 -c "
                           "'x = b\\\"a\\\" * (400 << 20)\\nprint(\\\"written\\\", flush=True)\\n"
                           "import time\\nt = time.monotonic(); c = time.process_time(); n = 1\\n"
                           "while time.monotonic() - t < 60:\\n"
                           "  if time.monotonic() - t >= n:\\n"
                           "    print(\\\"busy %.3f %.3f\\\" % (time.monotonic() - t, "
                           "time.process_time() - c), flush=True); n += 1'\"}");
  id = h_str(json_array_get(workers, 0), "id");
  json_decref(h_await(&ctl, workers, 0, 20));
  /* Writing 400 MiB page by page at half a core takes a while on a loaded
   * machine; the loop's lines come after. */
  for (double until = h_now() + 90; !busy_line(id, 3, &w0, &c0, &w1, &c1); usleep(200 * 1000))
    ck_assert_msg(h_now() < until, "the script printed no 3 s of its busy loop within 90 s");
  rate = (c1 - c0) / (w1 - w0);
  /* The quota is the upper bound (half of each 100 ms period). A machine
   * busy with other work may give the loop less than its half core (four
   * busy loops on two cores leave it 0.4), so below, the check is only that
   * the loop ran. */
  fprintf(stderr, "the script: %.3f cores over %.1f s at --cpu 0.5\n", rate, w1 - w0);
  ck_assert_msg(rate > 0.15 && rate < 0.6, "a busy loop at --cpu 0.5 used %.3f cores", rate);
  /* usage.cpu_seconds counts that use: it comes to at least what the loop
   * alone used, and to no more than half a core for as long as the worker
   * has lived (measured from before the launch, so never too short). */
  for (double until = h_now() + 15;; usleep(100 * 1000)) {
    usage_of(id, &c, &pk);
    if (c >= c1)
      break;
    ck_assert_msg(h_now() < until, "usage.cpu_seconds %g, below the %g s the loop alone used", c,
                  c1);
  }
  cpu1 = c;
  peak = pk;
  fprintf(stderr, "usage: %.3f cpu seconds within %.1f s; peak %.1f MiB for 400 MiB\n", cpu1,
          h_now() - launched, peak / 1048576);
  ck_assert_msg(cpu1 <= 0.5 * (h_now() - launched) + 0.5,
                "usage.cpu_seconds %.3f within %.1f s at --cpu 0.5", cpu1, h_now() - launched);
  ck_assert_msg(peak > 400.0 * 1048576 && peak < 1.1 * 400.0 * 1048576,
                "memory_peak_bytes %.0f for 400 MiB allocated", peak);
  /* and in /metrics, per worker */
  {
    char *text = NULL, want[80];
    ck_assert_int_eq(h_http(&ctl, "GET", "/metrics", NULL, "", NULL, &text), 200);
    snprintf(want, sizeof(want), "muster_worker_memory_peak_bytes{id=\"%s\"} ", id);
    ck_assert_msg(text && strstr(text, want), "/metrics has no %s", want);
    snprintf(want, sizeof(want), "muster_worker_cpu_seconds{id=\"%s\"} ", id);
    ck_assert_msg(text && strstr(text, want), "/metrics has no %s", want);
    free(text);
  }
  /* Final after the end: the peak stays, the cpu seconds do not shrink. */
  ck_assert_int_eq(h_http(&ctl, "POST", "/api/v1/workers/stop", "{}", "", NULL, NULL), 200);
  ans = h_await(&ctl, workers, 1, 20);
  json_decref(ans);
  for (int i = 0; i < 50; i++) {
    usage_of(id, &c, &pk);
    if (c > cpu1)
      break;
    usleep(100 * 1000);
  }
  ck_assert_msg(c >= cpu1 && pk >= peak, "final usage %g s, %g bytes after %g s, %g bytes", c, pk,
                cpu1, peak);
  json_decref(workers);
out:
  h_finish(&ctl);
}
END_TEST

/* Starts ctl (fresh() and its extra arguments already set) with
 * MUSTER_DEV_DIR=dev, the host's devices as the controller sees them.
 * Returns whether it restricts devices: isolated on cgroup v1's devices
 * controller (else says that what is skipped). */
static int start_with_devices(const char *dev, const char *what) {
  json_t *h = NULL;
  int ok;

  setenv("MUSTER_DEV_DIR", dev, 1);
  h_start(&ctl);
  unsetenv("MUSTER_DEV_DIR");
  ck_assert_int_eq(h_http(&ctl, "GET", "/api/v1/health", NULL, NULL, &h, NULL), 200);
  ok = strcmp(h_str(h, "isolation"), "cgroup") == 0 && access("/sys/fs/cgroup/devices", F_OK) == 0;
  if (!ok)
    fprintf(stderr,
            "SKIPPED: %s: devices are restricted on cgroup v1's devices controller, which "
            "this host does not have\n",
            what);
  json_decref(h);
  return ok;
}

/* GPUs: a worker reaches the GPU devices it was given, and no other.
 * Without a GPU, device nodes of the test's own stand in for the host's
 * (MUSTER_DEV_DIR): opening one that the worker may use fails for want of
 * a driver (ENXIO), one that its cgroup denies with EPERM. */
START_TEST(a_worker_reaches_only_the_gpus_it_was_given) {
  char dev[64], path[200], body[900], *out = NULL;
  json_t *workers, *ans;
  const char *names[] = {"nvidia0", "nvidia1", "nvidiactl"};
  const unsigned minors[] = {0, 1, 255};

  h_shared_dir(dev, sizeof(dev), "dev");
  for (int i = 0; i < 3; i++) {
    snprintf(path, sizeof(path), "%s/%s", dev, names[i]);
    if (mknod(path, S_IFCHR | 0666, makedev(195, minors[i])) != 0) {
      fprintf(stderr, "SKIPPED: GPU devices: cannot make device nodes here (%s)\n",
              strerror(errno));
      for (int k = 0; k < i; k++) {
        snprintf(path, sizeof(path), "%s/%s", dev, names[k]);
        unlink(path);
      }
      rmdir(dev);
      return;
    }
  }
  fresh();
  ctl.extra[0] = "--gpus";
  ctl.extra[1] = "2";
  if (!start_with_devices(dev, "GPU devices"))
    goto out;
  for (int gpus = 0; gpus <= 1; gpus++) {
    snprintf(body, sizeof(body),
             "{\"n\": 1, \"cpu\": 0.1, \"memory\": 0.25, \"nvidia_gpu\": %d, \"code\": \"!"
             "echo gpu=$CUDA_VISIBLE_DEVICES; for d in nvidia0 nvidia1 nvidiactl; do "
             "if (: < %s/$d) 2>/dev/null; then echo $d=open; else "
             "(: < %s/$d) 2>&1 | grep -q 'not permitted' && echo $d=denied || echo $d=usable; "
             "fi; done\"}",
             gpus, dev, dev);
    workers = h_launch(&ctl, body);
    ans = h_await(&ctl, workers, 1, 20);
    json_decref(ans);
    snprintf(path, sizeof(path), "/api/v1/workers/%s/logs?stream=stdout",
             h_str(json_array_get(workers, 0), "id"));
    ck_assert_int_eq(h_http(&ctl, "GET", path, NULL, "", NULL, &out), 200);
    fprintf(stderr, "a worker of %d GPU saw: %s", gpus, out);
    if (gpus == 0)
      ck_assert_msg(strstr(out, "nvidia0=denied") && strstr(out, "nvidia1=denied") &&
                        strstr(out, "nvidiactl=denied"),
                    "a worker without GPUs: %s", out);
    else
      ck_assert_msg(strstr(out, "gpu=0\n") && strstr(out, "nvidia0=usable") &&
                        strstr(out, "nvidia1=denied") && strstr(out, "nvidiactl=usable"),
                    "a worker of GPU 0: %s", out);
    free(out);
    out = NULL;
    json_decref(workers);
  }
out:
  h_finish(&ctl);
  for (int i = 0; i < 3; i++) {
    snprintf(path, sizeof(path), "%s/%s", dev, names[i]);
    unlink(path);
  }
  rmdir(dev);
}
END_TEST

START_TEST(isolation_none_runs_workers_as_before) {
  json_t *workers, *ans, *h = NULL;

  fresh();
  ctl.extra[0] = "--isolation";
  ctl.extra[1] = "none";
  h_start(&ctl);
  ck_assert_int_eq(h_http(&ctl, "GET", "/api/v1/health", NULL, NULL, &h, NULL), 200);
  ck_assert_str_eq(h_str(h, "isolation"), "none");
  json_decref(h);
  /* No limit: the same 300 MB in a worker of 0.1 GiB succeeds. */
  workers = h_launch(&ctl, "{\"n\": 1, \"cpu\": 1, \"memory\": 0.1, \"code\": \"!python3 -c "
                           "'x = b\\\"a\\\" * (300 << 20)'\"}");
  ans = h_await(&ctl, workers, 1, 30);
  ck_assert_msg(json_array_size(json_object_get(ans, "workers")) == 1, "failed: %s",
                h_str(json_array_get(json_object_get(ans, "failures"), 0), "failure"));
  json_decref(ans);
  json_decref(workers);
  h_finish(&ctl);
}
END_TEST

START_TEST(a_bad_isolation_value_is_refused) {
  json_t *h = NULL;

  fresh();
  h_start(&ctl);
  ck_assert_int_eq(h_http(&ctl, "GET", "/api/v1/health", NULL, NULL, &h, NULL), 200);
  /* said either way */
  ck_assert_msg(strcmp(h_str(h, "isolation"), "cgroup") == 0 ||
                    strcmp(h_str(h, "isolation"), "namespaces") == 0 ||
                    strcmp(h_str(h, "isolation"), "none") == 0,
                "isolation: %s", h_str(h, "isolation"));
  json_decref(h);
  h_finish(&ctl);
  {
    char cmd[700], dir[] = "/tmp/muster-iso-XXXXXX";
    ck_assert_ptr_nonnull(mkdtemp(dir));
    snprintf(cmd, sizeof(cmd),
             "timeout 10 %s --isolation maybe --listen 127.0.0.1:0 --state-dir %s/s 2>&1 | grep -q "
             "'isolation is none or cgroup, not \"maybe\"'",
             MUSTER_CONTROLLER_BIN, dir);
    ck_assert_int_eq(system(cmd), 0);
    snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
    ck_assert_int_eq(system(cmd), 0);
  }
}
END_TEST

/* On a host without NVIDIA devices a worker's devices cgroup is the
 * controller's base itself (none is made per worker), which still denies
 * every device but a container's: a node of the test's own (a GPU's
 * numbers under another name, so that the controller does not take it for
 * one) is refused, /dev/null is not. */
START_TEST(a_worker_on_a_host_without_gpus_reaches_no_other_device) {
  char dev[64], path[200], body[900], *out = NULL;
  json_t *workers, *ans;

  h_shared_dir(dev, sizeof(dev), "nodev");
  snprintf(path, sizeof(path), "%s/odd0", dev);
  if (mknod(path, S_IFCHR | 0666, makedev(195, 0)) != 0) {
    fprintf(stderr, "SKIPPED: devices: cannot make a device node here (%s)\n", strerror(errno));
    rmdir(dev);
    return;
  }
  fresh();
  if (!start_with_devices(dev, "a host without GPUs"))
    goto out;
  snprintf(body, sizeof(body),
           "{\"n\": 2, \"cpu\": 0.1, \"memory\": 0.25, \"code\": \"!"
           "(: < %s/odd0) 2>&1 | grep -q 'not permitted' && echo odd=denied || echo odd=usable; "
           "(: < /dev/null) && echo null=open; grep :devices: /proc/self/cgroup\"}",
           dev);
  workers = h_launch(&ctl, body);
  ans = h_await(&ctl, workers, 2, 20);
  json_decref(ans);
  for (int i = 0; i < 2; i++) {
    snprintf(path, sizeof(path), "/api/v1/workers/%s/logs?stream=stdout",
             h_str(json_array_get(workers, (size_t)i), "id"));
    ck_assert_int_eq(h_http(&ctl, "GET", path, NULL, "", NULL, &out), 200);
    ck_assert_msg(strstr(out, "odd=denied") && strstr(out, "null=open"), "a worker saw: %s", out);
    ck_assert_msg(strstr(out, ":devices:/") && !strstr(out, "/w-"),
                  "a worker's devices cgroup is its own, not the base: %s", out);
    free(out);
    out = NULL;
  }
  json_decref(workers);
out:
  h_finish(&ctl);
  snprintf(path, sizeof(path), "%s/odd0", dev);
  unlink(path);
  rmdir(dev);
}
END_TEST

int main(void) {
  Suite *s = suite_create("isolation");
  TCase *tc = tcase_create("cgroups");

  tcase_set_timeout(tc, 90);
  tcase_add_test(tc, a_worker_past_its_memory_fails_saying_so);
  tcase_add_test(tc, a_daemon_a_script_leaves_is_killed_and_the_cgroup_goes);
  tcase_add_test(tc, a_script_cannot_reach_the_controllers_secrets);
  tcase_add_test(tc, usage_shows_the_cpu_quota_and_the_memory_peak);
  tcase_add_test(tc, a_worker_reaches_only_the_gpus_it_was_given);
  tcase_add_test(tc, a_worker_on_a_host_without_gpus_reaches_no_other_device);
  tcase_add_test(tc, isolation_none_runs_workers_as_before);
  tcase_add_test(tc, a_bad_isolation_value_is_refused);
  suite_add_tcase(s, tc);
  return check_run(s);
}
