/* away.c: see away.h. */
#include "away.h"

#include <check.h>
#include <dirent.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

struct ctl_proc ctl;
char aw_tmp[112];
static pid_t guard_pid;
static int guard_fd = -1;

/* path gets name inside aw_tmp. */
void aw_in_tmp(char *path, const char *name) {
  snprintf(path, PATHLEN, "%s/%s", aw_tmp, name);
}

void aw_touch(const char *name) {
  char path[PATHLEN];
  FILE *f;

  aw_in_tmp(path, name);
  f = fopen(path, "w");
  ck_assert_ptr_nonnull(f);
  fclose(f);
}

/* A controller whose workers heartbeat every 0.3 s, so that some call of
 * theirs is certain to meet a pause, and a fresh directory for the scripts. */
void aw_up(void) {
  memset(&ctl, 0, sizeof(ctl));
  ctl.extra[0] = "--heartbeat-interval";
  ctl.extra[1] = "0.3";
  h_start(&ctl);
  /* (the workers' own directory: the one they may write) */
  snprintf(aw_tmp, sizeof(aw_tmp), "%s", ctl.work);
}

void aw_down(void) {
  char cmd[128];

  h_finish(&ctl);
  snprintf(cmd, sizeof(cmd), "rm -rf %s", aw_tmp);
  if (system(cmd) != 0)
    fprintf(stderr, "could not remove %s\n", aw_tmp);
}

/* Check ends a failed test with _exit(): no atexit handler runs, and the
 * SIGTERM that the controller gets when its parent dies (PR_SET_PDEATHSIG)
 * would stay pending for ever in a stopped controller. A guardian process
 * outlives the test and, unless aw_unguard() tells it that all went well,
 * continues the controller, which then takes its SIGTERM and ends. */
void aw_guard(pid_t pid) {
  int p[2];

  ck_assert_int_eq(pipe(p), 0);
  guard_pid = fork();
  ck_assert_int_ge(guard_pid, 0);
  if (guard_pid == 0) {
    char ok;

    for (int k = 3; k < 1024; k++)
      if (k != p[0])
        close(k);
    if (read(p[0], &ok, 1) != 1)
      kill(pid, SIGCONT);
    _exit(0);
  }
  close(p[0]);
  guard_fd = p[1];
}

void aw_unguard(void) {
  if (guard_fd < 0)
    return;
  if (write(guard_fd, "k", 1) != 1)
    fprintf(stderr, "could not tell the guardian process\n");
  close(guard_fd);
  guard_fd = -1;
  waitpid(guard_pid, NULL, 0);
}

/* The state letter of pid ('T' stopped, 'Z' zombie), or 0 when it is gone. */
char aw_state_of(long pid) {
  char buf[512];
  const char *f = h_proc_stat(pid, buf, sizeof(buf));

  return f ? f[0] : 0;
}

/* SIGSTOP to the controller; returns 1 once it is stopped (2 s at most).
 * Asserts nothing: the exec test calls it from a thread of its own. */
int aw_ctl_stop(void) {
  kill(ctl.pid, SIGSTOP);
  for (double until = h_now() + 2; h_now() < until; usleep(5000))
    if (aw_state_of(ctl.pid) == 'T')
      return 1;
  return 0;
}

/* How many connections to port hold bytes that the listener has not read:
 * calls made to a controller that does not answer (from /proc/net/tcp; the
 * controller's own end of each, before or after accept()). */
int aw_calls_waiting(int port) {
  FILE *f = fopen("/proc/net/tcp", "r");
  char line[512];
  int n = 0;

  if (!f)
    return 0;
  while (fgets(line, sizeof(line), f)) {
    unsigned lport, st;
    unsigned long txq, rxq;

    if (sscanf(line, " %*u: %*x:%x %*x:%*x %x %lx:%lx", &lport, &st, &txq, &rxq) == 4 &&
        (int)lport == port && st == 1 /* established */ && rxq > 0)
      n++;
  }
  fclose(f);
  return n;
}

/* Returns 1 once some call waits at the controller's port (5 s at most). */
int aw_call_waits(void) {
  for (double until = h_now() + 5; h_now() < until; usleep(10000))
    if (aw_calls_waiting(ctl.port) > 0)
      return 1;
  return 0;
}

/* Pauses the controller, under a guardian, and asserts that it stopped and
 * that a call of a workerd waits on it. */
void aw_pause_ctl(int want_call) {
  aw_guard(ctl.pid);
  ck_assert_msg(aw_ctl_stop(), "the controller is not stopped 2 s after SIGSTOP");
  if (want_call)
    ck_assert_msg(aw_call_waits(), "no call of workerd waits at the paused controller after 5 s "
                                   "(heartbeats every 0.3 s)");
}

void aw_resume_ctl(void) {
  kill(ctl.pid, SIGCONT);
  aw_unguard();
}

/* t seconds as a message says them: "1.23 s", or "over C s" where the wait
 * gave up (t < 0) at its ceiling C. buf: 32 bytes. */
const char *aw_secs(double t, double ceiling, char *buf) {
  if (t < 0)
    snprintf(buf, 32, "over %.0f s", ceiling);
  else
    snprintf(buf, 32, "%.2f s", t);
  return buf;
}

/* Seconds from t0 until path exists, or -1 after ceiling seconds. */
double aw_file_after(const char *path, double t0, double ceiling) {
  while (access(path, F_OK) != 0) {
    if (h_now() - t0 > ceiling)
      return -1;
    usleep(5000);
  }
  return h_now() - t0;
}

/* Seconds from t0 until pid is gone (or a zombie), or -1 after ceiling. */
double aw_gone_after(long pid, double t0, double ceiling) {
  double left = ceiling - (h_now() - t0);

  return h_gone(pid, left > 0 ? left : 0) ? h_now() - t0 : -1;
}

/* How many processes have pid as their parent. */
int aw_children_of(long pid) {
  DIR *d = opendir("/proc");
  struct dirent *e;
  int n = 0;

  ck_assert_ptr_nonnull(d);
  while ((e = readdir(d)) != NULL) {
    char buf[512], *end;
    const char *f;
    long p = strtol(e->d_name, &end, 10), ppid;

    if (*end || p <= 0 || !(f = h_proc_stat(p, buf, sizeof(buf))))
      continue;
    if (sscanf(f, "%*c %ld", &ppid) == 1 && ppid == pid)
      n++;
  }
  closedir(d);
  return n;
}

/* Launches one worker (code under kernel; idle if code is NULL), waits until
 * it runs and copies its id into id. */
void aw_launch(const char *kernel, const char *code, char *id, size_t len) {
  json_t *b =
      code ? json_pack("{s:i, s:f, s:s, s:s}", "n", 1, "cpu", 1.0, "kernel", kernel, "code", code)
           : json_pack("{s:i, s:f}", "n", 1, "cpu", 1.0);
  char *text = json_dumps(b, 0);
  json_t *ws = h_launch(&ctl, text), *w;

  snprintf(id, len, "%s", h_str(json_array_get(ws, 0), "id"));
  w = h_wait_status(&ctl, id, "running", 30);
  json_decref(w);
  json_decref(ws);
  json_decref(b);
  free(text);
}

/* Worker id's stdout as GET .../logs gives it (malloc'ed). */
char *aw_log_of(const char *id) {
  char path[160], *out = NULL;

  snprintf(path, sizeof(path), "/api/v1/workers/%s/logs", id);
  ck_assert_int_eq(h_http(&ctl, "GET", path, NULL, "", NULL, &out), 200);
  return out ? out : strdup("");
}

/* The notices of a log that workerd dropped bytes ("[muster-workerd: N bytes
 * of output dropped while the controller was unreachable]\n"): their N added
 * up, and in *len the bytes the notices themselves take. */
unsigned long long aw_dropped_in(const char *text, size_t *len) {
  unsigned long long sum = 0;
  const char *p = text;

  *len = 0;
  while ((p = strstr(p, NOTICE)) != NULL) {
    char *end;
    unsigned long long n = strtoull(p + strlen(NOTICE), &end, 10);
    const char *tail = strstr(end, "]\n");

    ck_assert_msg(end > p + strlen(NOTICE) && strncmp(end, " bytes of output dropped", 24) == 0 &&
                      tail,
                  "a notice of workerd that is not one of dropped bytes: \"%.120s\"", p);
    sum += n;
    *len += (size_t)(tail + 2 - p);
    p = tail + 2;
  }
  return sum;
}
