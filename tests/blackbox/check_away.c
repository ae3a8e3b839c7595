/* check_away.c: a worker while its controller is away (issue 25). The
 * controller is paused (SIGSTOP: its sockets still take connections, and
 * nothing answers), killed (kill -9) or restarted, and muster-workerd must
 * never wait on it: the exec channel keeps relaying, the script's output
 * keeps being drained (what does not fit is dropped and said so), SIGTERM
 * ends the script at once and workerd within its grace, and a restarted
 * controller gets every line back. Real controller, real workerd processes.
 *
 * Each test first makes sure that its scenario really happened: the
 * controller is in state T (stopped) and a call of workerd is waiting at
 * its port (bytes it has not read, in /proc/net/tcp), or it is dead. Times
 * are measured (with a generous ceiling) and asserted after the clean-up,
 * so that a failing test says how long it took and leaves nothing behind. */
#include "away.h"
#include "harness.h"
#include "muster.h"

#include "../check_run.h"

#include <check.h>
#include <dirent.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

/* ------------------------------------------------------------------------ */
/* 1. The exec channel while the controller is paused                       */

#define EXEC_LINES 40

struct flow {
  pthread_mutex_t mu;
  int lines, bad; /* lines read; 1 if one was not the number expected */
  double at[EXEC_LINES];
  char part[64];
  size_t plen;
  int done;                                        /* the exec call returned */
  int stopped, waited, still_stopped, stopped_for; /* the pause, as it went */
};

/* The exec'd command's stdout: each line (its number) stamped as it comes. */
static int on_out(void *arg, const char *data, size_t len) {
  struct flow *f = arg;

  pthread_mutex_lock(&f->mu);
  for (size_t i = 0; i < len; i++) {
    if (data[i] != '\n') {
      if (f->plen < sizeof(f->part) - 1)
        f->part[f->plen++] = data[i];
      continue;
    }
    f->part[f->plen] = '\0';
    if (f->lines < EXEC_LINES) {
      char *end;
      long v = strtol(f->part, &end, 10);

      if (*end || end == f->part || v != f->lines)
        f->bad = 1;
      f->at[f->lines] = h_now();
    }
    f->lines++;
    f->plen = 0;
  }
  pthread_mutex_unlock(&f->mu);
  return 0;
}

static int lines_of(struct flow *f) {
  int n;

  pthread_mutex_lock(&f->mu);
  n = f->done ? -1 : f->lines;
  pthread_mutex_unlock(&f->mu);
  return n;
}

/* Stops the controller once line 2 is in, and continues it once line 32 is
 * in or 6 s after a call of workerd's is seen waiting on it (so that output
 * held back by the pause would show as a gap of seconds). */
static void *pauser(void *arg) {
  struct flow *f = arg;
  double until = h_now() + 30, t0;
  int n;

  while ((n = lines_of(f)) >= 0 && n < 3 && h_now() < until)
    usleep(2000);
  if (n < 3)
    return NULL;
  f->stopped = aw_ctl_stop();
  f->waited = aw_call_waits();
  t0 = h_now();
  while ((n = lines_of(f)) >= 0 && n < 33 && h_now() < t0 + 6)
    usleep(2000);
  f->still_stopped = aw_state_of(ctl.pid) == 'T';
  f->stopped_for = (int)(h_now() - t0);
  kill(ctl.pid, SIGCONT);
  return NULL;
}

START_TEST(exec_output_flows_while_the_controller_is_paused) {
  const char *argv[] = {"sh", "-c",
                        "i=0; while [ $i -lt 40 ]; do echo $i; i=$((i+1)); sleep 0.2; done"};
  struct flow f = {.mu = PTHREAD_MUTEX_INITIALIZER};
  muster_client *cl = NULL;
  muster_exec_target t;
  muster_exec_opts o;
  char id[16], err[256] = "";
  double gap = 0;
  int code = -1, rc, at = 0;
  pthread_t th;

  aw_up();
  aw_launch(NULL, NULL, id, sizeof(id));
  ck_assert_int_eq(muster_client_new(ctl.url, ctl.token, &cl), 0);
  ck_assert_int_eq(muster_exec_target_get(cl, id, &t), 0);
  muster_exec_opts_init(&o);
  o.argv = argv;
  o.argc = 3;
  o.on_stdout = on_out;
  o.arg = &f;
  o.stderr_fd = -1;
  aw_guard(ctl.pid);
  ck_assert_int_eq(pthread_create(&th, NULL, pauser, &f), 0);
  rc = muster_exec_at(&t, &o, &code, err, sizeof(err));
  pthread_mutex_lock(&f.mu);
  f.done = 1;
  pthread_mutex_unlock(&f.mu);
  pthread_join(th, NULL);
  aw_resume_ctl();
  for (int i = 1; i < EXEC_LINES && i < f.lines; i++)
    if (f.at[i] - f.at[i - 1] > gap) {
      gap = f.at[i] - f.at[i - 1];
      at = i;
    }
  muster_client_free(cl);
  aw_down();

  ck_assert_msg(f.stopped && f.still_stopped,
                "the controller was not stopped through the pause (stopped %d, still %d)",
                f.stopped, f.still_stopped);
  ck_assert_msg(f.waited, "no call of workerd met the paused controller");
  ck_assert_msg(rc == 0 && code == 0, "muster exec: %d, exit code %d: %s", rc, code, err);
  ck_assert_msg(f.lines == EXEC_LINES && !f.bad, "the client read %d lines, not 0 to 39 (bad %d)",
                f.lines, f.bad);
  ck_assert_msg(gap <= 2.0, /* (not drained: the 6 s of the pause) */
                "the exec'd command's lines reached the client with a gap of %.2f s (before "
                "line %d) while the controller was paused for %d s",
                gap, at, f.stopped_for);
}
END_TEST

/* ------------------------------------------------------------------------ */
/* 2-4. SIGTERM to workerd while the controller is dead or hangs            */

/* A worker whose script writes the file F when SIGTERM comes, then exits
 * (its sleep holds none of the script's pipes, so its end is the script's);
 * returns its workerd's pid once the trap is set. */
static long trapping_worker(char *id, size_t len) {
  char code[1000], ready[PATHLEN], f[PATHLEN];

  aw_in_tmp(f, "F");
  aw_in_tmp(ready, "READY");
  snprintf(code, sizeof(code),
           "trap 'echo t > %s; exit 0' TERM; sleep 600 </dev/null >/dev/null 2>&1 & "
           "echo > %s; wait",
           f, ready);
  aw_launch("sh", code, id, len);
  ck_assert_msg(aw_file_after(ready, h_now(), 20) >= 0, "the script did not start in 20 s");
  return h_workerd_pid(&ctl, id);
}

START_TEST(sigterm_ends_the_worker_at_once_when_the_controller_is_dead) {
  char id[16], f[PATHLEN], b1[32], b2[32];
  double t0, script, wd_end;
  long wd;

  aw_up();
  wd = trapping_worker(id, sizeof(id));
  aw_in_tmp(f, "F");
  h_kill9(&ctl);
  ck_assert_msg(aw_state_of(wd) && aw_state_of(wd) != 'Z', "workerd ended with its controller");
  t0 = h_now();
  ck_assert_int_eq(kill((pid_t)wd, SIGTERM), 0);
  script = aw_file_after(f, t0, 20);
  wd_end = aw_gone_after(wd, t0, 30);
  aw_down();
  ck_assert_msg(script >= 0 && script <= 2.5, "the script got its SIGTERM %s after workerd did",
                aw_secs(script, 20, b1));
  ck_assert_msg(wd_end >= 0 && wd_end - script <= 2.5,
                "workerd ended %s after SIGTERM (its script %s after it), with its controller "
                "dead",
                aw_secs(wd_end, 30, b1), aw_secs(script, 20, b2));
}
END_TEST

START_TEST(sigterm_ends_the_worker_within_its_grace_when_the_controller_hangs) {
  char id[16], f[PATHLEN], b1[32];
  double t0, script, wd_end;
  long wd;
  int still;

  aw_up();
  wd = trapping_worker(id, sizeof(id));
  aw_in_tmp(f, "F");
  aw_pause_ctl(1);
  t0 = h_now();
  ck_assert_int_eq(kill((pid_t)wd, SIGTERM), 0);
  script = aw_file_after(f, t0, 20);
  wd_end = aw_gone_after(wd, t0, 30);
  still = aw_state_of(ctl.pid) == 'T';
  aw_resume_ctl();
  aw_down();
  ck_assert_msg(still, "the controller did not stay stopped");
  ck_assert_msg(script >= 0 && script <= 2.5,
                "the script got its SIGTERM %s after workerd did, with the controller paused",
                aw_secs(script, 20, b1));
  ck_assert_msg(wd_end >= 0 && wd_end <= 5 + 2.5,
                "workerd ended %s after SIGTERM, past its 5 s grace, with the controller paused",
                aw_secs(wd_end, 30, b1));
}
END_TEST

/* Launches a script that waits for GO and then ends with exit status
 * status, kills its controller (kill -9), lets the script end, and returns
 * its workerd, which is left with an exit to report; the worker's id in id. */
static long ended_while_controller_gone(int status, char *id, size_t len) {
  char code[1000], ready[PATHLEN], go[PATHLEN], ended[PATHLEN];
  long wd;

  aw_in_tmp(ready, "READY");
  aw_in_tmp(go, "GO");
  aw_in_tmp(ended, "ENDED");
  snprintf(code, sizeof(code),
           "echo > %s; while [ ! -e %s ]; do sleep 0.05; done; echo bye; echo > %s; exit %d", ready,
           go, ended, status);
  aw_launch("sh", code, id, len);
  ck_assert_msg(aw_file_after(ready, h_now(), 20) >= 0, "the script did not start in 20 s");
  wd = h_workerd_pid(&ctl, id);
  h_kill9(&ctl);
  aw_touch("GO");
  ck_assert_msg(aw_file_after(ended, h_now(), 20) >= 0, "the script did not end in 20 s");
  return wd;
}

START_TEST(a_script_that_ended_by_itself_still_obeys_sigterm) {
  char id[16], b1[32];
  double t0, wd_end;
  long wd;

  aw_up();
  wd = ended_while_controller_gone(0, id, sizeof(id));
  /* Its end is workerd's to see: the script is reaped, workerd lives on (it
   * has an exit to report, and a line to ship). */
  for (double until = h_now() + 10; aw_children_of(wd) > 0; usleep(10000))
    ck_assert_msg(h_now() < until, "workerd still has a child 10 s after its script ended");
  ck_assert_msg(aw_state_of(wd) && aw_state_of(wd) != 'Z',
                "workerd did not wait for its controller to report the script's exit");
  t0 = h_now();
  ck_assert_int_eq(kill((pid_t)wd, SIGTERM), 0);
  wd_end = aw_gone_after(wd, t0, 20);
  aw_down();
  ck_assert_msg(wd_end >= 0 && wd_end <= 2.5,
                "workerd, retrying its exit report to a dead controller, ended %s after SIGTERM",
                aw_secs(wd_end, 20, b1));
}
END_TEST

/* ------------------------------------------------------------------------ */
/* 5. 10 MB while the controller is paused                                  */

#define BIG_LINES 100000 /* of 100 bytes: 10,000,000 bytes */

START_TEST(a_10_mb_script_is_not_blocked_while_the_controller_is_paused) {
  char id[16], code[1000], line[100], go[PATHLEN], done[PATHLEN], end[PATHLEN], b1[32], *text;
  unsigned long long dropped = 0;
  size_t notices, kept = 0, odd = 0;
  double took;
  int still, exit_code = -1;
  json_t *w;

  aw_up();
  memset(line, 'x', 99);
  line[99] = '\0';
  aw_in_tmp(go, "GO");
  aw_in_tmp(done, "DONE");
  aw_in_tmp(end, "END");
  snprintf(code, sizeof(code),
           "while [ ! -e %s ]; do sleep 0.05; done; yes %s | head -n %d; echo end > %s; "
           "while [ ! -e %s ]; do sleep 0.05; done",
           go, line, BIG_LINES, done, end);
  aw_launch("sh", code, id, sizeof(id));
  aw_pause_ctl(1);
  aw_touch("GO");
  took = aw_file_after(done, h_now(), 20);
  still = aw_state_of(ctl.pid) == 'T';
  aw_resume_ctl();
  /* The rest only when the script was not held (a long pause has the
   * worker failed as lost, which is not what this test is about). */
  if (took >= 0 && took <= 3.0) {
    aw_touch("END");
    w = h_wait_status(&ctl, id, "succeeded", 60);
    exit_code = (int)json_integer_value(json_object_get(w, "exit_code"));
    json_decref(w);
    text = aw_log_of(id);
    dropped = aw_dropped_in(text, &notices);
    kept = strlen(text) - notices;
    for (const char *p = text; *p; p++) {
      if (strncmp(p, NOTICE, strlen(NOTICE)) == 0)
        p = strstr(p, "]\n") + 1;
      else
        odd += *p != 'x' && *p != '\n';
    }
    free(text);
  }
  aw_down();
  ck_assert_msg(still, "the controller did not stay stopped");
  ck_assert_msg(took >= 0 && took <= 3.0,
                "the script took %s to write 10 MB while the controller was paused",
                aw_secs(took, 20, b1));
  ck_assert_msg(exit_code == 0, "the script exited with code %d", exit_code);
  ck_assert_msg(odd == 0, "the log holds %zu bytes that are neither the script's nor a notice",
                odd);
  ck_assert_msg(kept + dropped == (unsigned long long)BIG_LINES * 100,
                "the log keeps %zu bytes and says %llu were dropped: %llu, not the 10000000 the "
                "script wrote",
                kept, dropped, kept + dropped);
}
END_TEST

/* ------------------------------------------------------------------------ */
/* 6. Every line after a pause and a restart                                 */

#define PAD 1000 /* bytes of padding a line: 50 KB/s, more than a pipe holds in 2 s */

struct seen {
  long max, missing, bad_lines, last; /* last: the N of "last N", or 0 */
  double gap, prev_ts;
  long gap_at;
};

/* The number at the start of the line at p, or 0. */
static long number_at(const char *p) {
  char *end;
  long n = strtol(p, &end, 10);

  return end > p && *end == ' ' ? n : 0;
}

/* Reads one line of the script (len bytes at p) into s. A line that is not
 * whole is allowed only where a resend (bytes that reached the controller,
 * whose answer did not reach workerd, sent again: there is nothing to tell
 * them apart) begins: the line is the next one's start followed by the
 * resent bytes, or the next whole line goes back to a number already seen;
 * or next to a notice of dropped bytes. */
static void seen_line(struct seen *s, const char *p, size_t len, long next, int by_notice) {
  char buf[64], *end;
  long n;
  double ts;
  size_t head;
  int used = -1;

  if (len > 5 && strncmp(p, "last ", 5) == 0) {
    snprintf(buf, sizeof(buf), "%.*s", (int)(len - 5 < 40 ? len - 5 : 40), p + 5);
    s->last = strtol(buf, &end, 10);
    return;
  }
  head = len > PAD ? len - PAD : 0;
  snprintf(buf, sizeof(buf), "%.*s", (int)(head < 63 ? head : 63), p);
  if (len <= PAD || head < 4 || head >= 40 || strspn(p + head, "0") != PAD ||
      buf[head - 1] != ' ' || sscanf(buf, "%ld %lf%n", &n, &ts, &used) != 2 ||
      used != (int)head - 1 || n <= 0) {
    if (number_at(p) == s->max + 1) {
      s->max++;
      s->prev_ts = 0; /* (its time may be cut) */
    } else if (!by_notice && !(next > 0 && next <= s->max)) {
      s->bad_lines++;
    }
    return;
  }
  if (n <= s->max)
    return; /* a resend */
  if (n == s->max + 1 && s->prev_ts > 0 && ts - s->prev_ts > s->gap) {
    s->gap = ts - s->prev_ts;
    s->gap_at = n;
  }
  s->missing += n - s->max - 1;
  s->max = n;
  s->prev_ts = ts;
}

START_TEST(after_a_restart_every_line_is_there_but_those_said_dropped) {
  char id[16], code[600], go[PATHLEN], *text, *notice;
  struct seen s = {0};
  int by_notice = 0;
  unsigned long long dropped;
  size_t notices;
  double t0, restart;
  json_t *w;

  aw_up();
  aw_in_tmp(go, "GO");
  snprintf(code, sizeof(code),
           "p=$(printf '%%0%dd' 0); i=0; while [ ! -e %s ]; do i=$((i+1)); "
           "echo \"$i $EPOCHREALTIME $p\"; sleep 0.02; done; echo \"last $i\"",
           PAD, go);
  aw_launch("bash", code, id, sizeof(id));
  aw_pause_ctl(1);
  /* The pause itself is the scenario: 6 s by the clock. */
  t0 = h_now();
  while (h_now() < t0 + 6)
    usleep(20000);
  ck_assert_msg(aw_state_of(ctl.pid) == 'T', "the controller did not stay stopped");
  aw_resume_ctl();
  h_kill9(&ctl);
  restart = h_wall();
  h_restart(&ctl);
  /* Re-attached: the restarted controller hears its heartbeats. */
  for (double until = h_now() + 20;; usleep(50000)) {
    w = h_worker(&ctl, id);
    if (strcmp(h_str(w, "status"), "running") == 0 &&
        h_iso_seconds(h_str(w, "last_heartbeat")) > restart)
      break;
    ck_assert_msg(h_now() < until, "worker %s is %s and not heard 20 s after the restart", id,
                  h_str(w, "status"));
    json_decref(w);
  }
  json_decref(w);
  aw_touch("GO");
  w = h_wait_status(&ctl, id, "succeeded", 60);
  json_decref(w);

  text = aw_log_of(id);
  dropped = aw_dropped_in(text, &notices);
  notice = strstr(text, NOTICE);
  for (char *p = text, *nl; (nl = strchr(p, '\n')) != NULL; p = nl + 1) {
    int here;

    while (notice && notice < p)
      notice = strstr(notice + 1, NOTICE);
    here = notice && notice < nl;
    seen_line(&s, p, (size_t)(nl - p), nl[1] ? number_at(nl + 1) : 0, here || by_notice);
    by_notice = here;
  }
  free(text);
  aw_down();
  ck_assert_msg(s.last > 0, "the script's last line (\"last N\") is not in the log");
  ck_assert_msg(s.max == s.last, "the log's lines end at %ld; the script wrote %ld", s.max, s.last);
  ck_assert_msg(s.bad_lines == 0, "%ld lines of the log are cut or mangled", s.bad_lines);
  ck_assert_msg((unsigned long long)s.missing * PAD <= dropped,
                "%ld of the script's %ld lines are not in the log, and workerd said it dropped "
                "%llu bytes",
                s.missing, s.last, dropped);
  ck_assert_msg(s.gap <= 2.0, /* (not drained: most of the 6 s pause) */
                "the script was held %.2f s writing line %ld (its output not drained while the "
                "controller was paused)",
                s.gap, s.gap_at);
}
END_TEST

/* The last len - 1 bytes (at most) of the file at path, into buf. */
static void tail_of(const char *path, char *buf, size_t len) {
  FILE *f = fopen(path, "r");
  size_t n = 0;

  if (f && fseek(f, 0, SEEK_END) == 0) {
    long size = ftell(f);

    if (size > (long)len - 1)
      fseek(f, size - (long)len + 1, SEEK_SET);
    else
      rewind(f);
    n = fread(buf, 1, len - 1, f);
  }
  if (f)
    fclose(f);
  buf[n] = '\0';
}

/* ------------------------------------------------------------------------ */
/* 7. SIGTERM while registering                                             */

START_TEST(sigterm_while_registering_with_a_paused_controller) {
  char log[PATHLEN], b1[32], said[600];
  double t0, took = -1;
  int status = 0, still;
  pid_t wd;

  aw_up();
  aw_in_tmp(log, "workerd.log");
  aw_pause_ctl(0);
  wd = fork();
  ck_assert_int_ge(wd, 0);
  if (wd == 0) {
    int fd = open(log, O_WRONLY | O_CREAT | O_APPEND, 0600);

    /* A failed test must not leave it running. */
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (fd >= 0)
      dup2(fd, 2);
    for (int k = 3; k < 1024; k++)
      close(k);
    setenv("MUSTER_CONTROLLER_URL", ctl.url, 1);
    setenv("MUSTER_WORKER_ID", "w-away0000001", 1);
    setenv("MUSTER_WORKER_TOKEN", "x", 1);
    setenv("MUSTER_LOG_LEVEL", "debug", 1);
    unsetenv("MUSTER_ORPHAN_TIMEOUT");
    execl(MUSTER_WORKERD_BIN, "muster-workerd", (char *)NULL);
    _exit(127);
  }
  ck_assert_msg(aw_call_waits(),
                "muster-workerd made no call to the paused controller in 5 s (its "
                "log: %s)",
                log);
  ck_assert_int_eq(waitpid(wd, &status, WNOHANG), 0);
  t0 = h_now();
  ck_assert_int_eq(kill(wd, SIGTERM), 0);
  while (h_now() < t0 + 20) {
    if (waitpid(wd, &status, WNOHANG) == wd) {
      took = h_now() - t0;
      break;
    }
    usleep(5000);
  }
  if (took < 0) {
    kill(wd, SIGKILL);
    waitpid(wd, &status, 0);
  }
  still = aw_state_of(ctl.pid) == 'T';
  aw_resume_ctl();
  tail_of(log, said, sizeof(said));
  aw_down();
  ck_assert_msg(still, "the controller did not stay stopped");
  ck_assert_msg(took >= 0 && took <= 2.5,
                "muster-workerd, registering with a paused controller, ended %s after SIGTERM; "
                "its log ended with:\n%s",
                aw_secs(took, 20, b1), said);
  ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0,
                "muster-workerd stopped before registering exits 0, not with status %#x", status);
}
END_TEST

/* ------------------------------------------------------------------------ */
/* 8. An idle worker whose controller is gone ends by its orphan timeout    */

/* Starts a controller telling the heartbeat interval interval_s (a worker
 * lost after 60 s of silence) whose workerds end after orphan_s without an
 * answer, and an idle worker of it (its id in id); returns its workerd. */
static long idle_worker(const char *interval_s, const char *orphan_s, char *id, size_t len) {
  memset(&ctl, 0, sizeof(ctl));
  ctl.extra[0] = "--heartbeat-interval";
  ctl.extra[1] = interval_s;
  ctl.extra[2] = "--heartbeat-timeout";
  ctl.extra[3] = "60";
  ctl.orphan_timeout = orphan_s;
  h_start(&ctl);
  snprintf(aw_tmp, sizeof(aw_tmp), "%s", ctl.work);
  aw_launch(NULL, NULL, id, len);
  return h_workerd_pid(&ctl, id);
}

/* Kills the controller for good and returns the seconds until workerd wd
 * ended, or -1 if it still ran after ceiling_s (it is then killed); the
 * test's controller and files are gone after. */
static double ended_after_kill(long wd, double ceiling_s) {
  double end;

  h_kill9(&ctl);
  end = aw_gone_after(wd, h_now(), ceiling_s);
  if (end < 0)
    kill((pid_t)wd, SIGKILL);
  aw_down();
  return end;
}

/* The heartbeat that finds the controller gone too long decides the stop;
 * an idle worker has nothing else to wake its loop, and must act on it. */
START_TEST(an_idle_worker_whose_controller_is_gone_ends_after_its_orphan_timeout) {
  char id[16], b1[32];
  double end = ended_after_kill(idle_worker("0.3", "2", id, sizeof(id)), 20);

  ck_assert_msg(
      end >= 0 && end <= 2 + 8,
      "an idle workerd whose controller was killed ended %s after it (orphan timeout 2 s)",
      aw_secs(end, 20, b1));
}
END_TEST

/* ------------------------------------------------------------------------ */
/* 9. A heartbeat interval longer than the orphan timeout                   */

/* Waits (20 s at most, while workerd wd runs) until worker id's workerd log
 * has a line matching pattern (grep -E). */
static void wait_logged(const char *id, long wd, const char *pattern) {
  char cmd[400];

  snprintf(cmd, sizeof(cmd), "grep -qsE '%s' %s/workers/%s.log", pattern, ctl.dir, id);
  for (double until = h_now() + 20; system(cmd) != 0; usleep(50 * 1000))
    ck_assert_msg(h_now() < until && !h_gone(wd, 0),
                  "worker %s's workerd %ld: no \"%s\" in its log (%s/workers)", id, wd, pattern,
                  ctl.dir);
}

/* The orphan timeout runs from the first call that got no answer, not from
 * the last answer: a worker told to beat every 12 s, with a 4 s orphan
 * timeout, outlives a controller restart that one of its heartbeats found
 * away (it was ended at once, "no answer for 12 s"); and once the
 * controller is gone for good, its next heartbeat, 12 s after the first
 * that failed, still ends it (a time away never started or always
 * cleared would keep it for ever). */
START_TEST(one_failed_heartbeat_never_ends_a_worker_beating_less_often_than_its_orphan_timeout) {
  char id[16], b1[32];
  long wd = idle_worker("12", "4", id, sizeof(id));
  double up, end;

  wait_logged(id, wd, "registered as an idle worker");
  h_kill9(&ctl);
  wait_logged(id, wd, "cannot reach the controller");
  h_restart(&ctl);
  up = h_wall();
  h_wait_beat_after(&ctl, id, up, 40);
  ck_assert_msg(!h_gone(wd, 0), "worker %s's workerd %ld is gone (logs in %s/workers)", id, wd,
                ctl.dir);
  end = ended_after_kill(wd, 12 + 12 + 20);
  ck_assert_msg(end >= 0, "the workerd still ran %s after its controller ended for good",
                aw_secs(end, 44, b1));
  ck_assert_msg(end >= 4,
                "the workerd ended %s after its controller did: before its orphan timeout",
                aw_secs(end, 44, b1));
}
END_TEST

#ifdef MUSTER_FAULT_INJECTION
/* The seconds that worker id's workerd log says it went without an answer
 * ("no answer from the controller itself for N s"), or -1 if it says not. */
static long said_away_s(const char *id) {
  char path[300], line[1024];
  const char *key = "no answer from the controller itself for ";
  long secs = -1;
  FILE *f;

  snprintf(path, sizeof(path), "%s/workers/%s.log", ctl.dir, id);
  f = fopen(path, "r");
  while (f && secs < 0 && fgets(line, sizeof(line), f)) {
    const char *p = strstr(line, key);
    char *end;

    if (p) {
      secs = strtol(p + strlen(key), &end, 10);
      if (end == p + strlen(key))
        secs = -1;
    }
  }
  if (f)
    fclose(f);
  return secs;
}

/* An answer past 1 MiB is no answer from the controller as far as a
 * workerd can tell (a proxy in front of a controller that is gone may send
 * one for ever): a worker whose every heartbeat gets one ends after its
 * orphan timeout, named in its log. (Such a heartbeat skipped the check,
 * and the worker ran on for ever.) */
START_TEST(a_worker_whose_heartbeats_get_only_oversized_answers_ends_after_its_orphan_timeout) {
  char id[16], b1[32];
  long wd, away;
  double t0, end;

  setenv("MUSTER_FAULT", "workerd_heartbeat_too_large:fail=1000000000", 1);
  wd = idle_worker("0.3", "5", id, sizeof(id));
  unsetenv("MUSTER_FAULT");
  t0 = h_now();
  wait_logged(id, wd, "larger than 1 MiB");
  end = aw_gone_after(wd, t0, 30);
  if (end < 0)
    kill((pid_t)wd, SIGKILL);
  ck_assert_msg(end >= 0 && end <= 5 + 10,
                "worker %s's workerd, every heartbeat of which got an answer past 1 MiB, ended "
                "%s after it ran (orphan timeout 5 s; logs in %s/workers)",
                id, aw_secs(end, 30, b1), ctl.dir);
  away = said_away_s(id);
  ck_assert_msg(away >= 5,
                "worker %s's workerd ended saying it went %ld s without an answer (-1: not "
                "saying it), not the 5 s of its orphan timeout (%s/workers)",
                id, away, ctl.dir);
  aw_down();
}
END_TEST

/* A command that ended by itself has its exit reported for 10 minutes, or
 * for MUSTER_ORPHAN_TIMEOUT if longer: a user who set a longer timeout, so
 * that workers ride out a longer outage of the controller, gets the result
 * after it. Here the 10 minutes are 3 s (the fault point
 * workerd_retry_total_3s), the orphan timeout 30 s, and the controller is
 * gone for 6 s after the command ended. (workerd gave up at 3 s: the
 * worker ended "lost", its exit code unknown.) */
START_TEST(an_exit_is_reported_after_an_outage_longer_than_the_retries_within_the_orphan_timeout) {
  char id[16], b1[32], cmd[400];
  double t0, gone;
  json_t *w;
  long wd;

  memset(&ctl, 0, sizeof(ctl));
  ctl.extra[0] = "--heartbeat-interval";
  ctl.extra[1] = "0.3";
  ctl.extra[2] = "--heartbeat-timeout";
  ctl.extra[3] = "60";
  ctl.orphan_timeout = "30";
  setenv("MUSTER_FAULT", "workerd_retry_total_3s:fail=1000000000", 1);
  h_start(&ctl);
  unsetenv("MUSTER_FAULT");
  snprintf(aw_tmp, sizeof(aw_tmp), "%s", ctl.work);
  wd = ended_while_controller_gone(7, id, sizeof(id));
  /* (twice the 3 s of retries, and the script's own end: workerd must
   * still be trying) */
  t0 = h_now();
  gone = aw_gone_after(wd, t0, 6);
  ck_assert_msg(gone < 0,
                "worker %s's workerd gave up its exit report %s after its script ended, its "
                "controller away, although its orphan timeout is 30 s (logs in %s/workers)",
                id, aw_secs(gone, 6, b1), ctl.dir);
  snprintf(cmd, sizeof(cmd),
           "grep -qs 'fault injection: workerd_retry_total_3s: fails' %s/workers/%s.log", ctl.dir,
           id);
  ck_assert_msg(system(cmd) == 0,
                "worker %s's workerd was not told that its retries last 3 s (%s/workers)", id,
                ctl.dir);
  h_restart(&ctl);
  w = h_wait_status(&ctl, id, "failed", 40);
  ck_assert_msg(json_integer_value(json_object_get(w, "exit_code")) == 7 &&
                    json_is_integer(json_object_get(w, "exit_code")),
                "worker %s ended without its script's exit code 7 (failure %s; logs in %s/workers)",
                id, h_str(w, "failure") ? h_str(w, "failure") : "none", ctl.dir);
  json_decref(w);
  aw_down();
}
END_TEST
#endif

/* One case per test, named after it, so that CK_RUN_CASE=name runs one. */
#define ADD_TEST(s, t)                                                                             \
  do {                                                                                             \
    TCase *tc = tcase_create(#t);                                                                  \
    tcase_set_timeout(tc, 150);                                                                    \
    tcase_add_test(tc, t);                                                                         \
    suite_add_tcase(s, tc);                                                                        \
  } while (0)

int main(void) {
  Suite *s = suite_create("away");

  ADD_TEST(s, exec_output_flows_while_the_controller_is_paused);
  ADD_TEST(s, sigterm_ends_the_worker_at_once_when_the_controller_is_dead);
  ADD_TEST(s, sigterm_ends_the_worker_within_its_grace_when_the_controller_hangs);
  ADD_TEST(s, a_script_that_ended_by_itself_still_obeys_sigterm);
  ADD_TEST(s, a_10_mb_script_is_not_blocked_while_the_controller_is_paused);
  ADD_TEST(s, after_a_restart_every_line_is_there_but_those_said_dropped);
  ADD_TEST(s, sigterm_while_registering_with_a_paused_controller);
  ADD_TEST(s, an_idle_worker_whose_controller_is_gone_ends_after_its_orphan_timeout);
  ADD_TEST(s, one_failed_heartbeat_never_ends_a_worker_beating_less_often_than_its_orphan_timeout);
#ifdef MUSTER_FAULT_INJECTION
  ADD_TEST(s, a_worker_whose_heartbeats_get_only_oversized_answers_ends_after_its_orphan_timeout);
  ADD_TEST(s,
           an_exit_is_reported_after_an_outage_longer_than_the_retries_within_the_orphan_timeout);
#endif
  return check_run(s);
}
