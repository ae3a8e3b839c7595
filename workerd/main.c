/*
 * main.c: muster-workerd, the daemon that runs inside every worker: its
 * entry point, start-up, stopping and main loop.
 *
 * It registers the worker's address with the controller, runs the worker's
 * command, ships the command's stdout and stderr to the controller, sends
 * heartbeats, and reports how the command ended. It also serves the exec
 * channel (docs/exec-protocol.md): the launching session runs commands in
 * the worker through it, as it would through SSH.
 *
 * It is single-threaded (but for glibc's thread that looks up the
 * controller's host, where the URL names it by a name): one poll() loop over
 * the command's two output pipes, the exec channel's sockets and pipes, the
 * sockets of its calls to the controller, and a self-pipe that turns
 * SIGCHLD, SIGTERM and SIGINT into readable bytes. No call to the controller
 * ever blocks it (ctl_call.c, http_client.c): a slow, paused or missing
 * controller never holds up the exec channel, the command's output or a
 * signal.
 *
 * The controller may restart at any moment. workerd survives that: register
 * and the exit report retry with backoff for MUSTER_ORPHAN_TIMEOUT (10
 * minutes by default; the report 10 minutes at least), logs stay buffered
 * (up to 8 MiB per stream) until the next POST gets through, and heartbeats
 * are simply tried again at the next interval, so a worker re-attaches by
 * being heard again. SIGTERM always works: the command gets it at once,
 * SIGKILL 5 s later, and the exit report gets the rest of those 5 s.
 *
 * Environment: MUSTER_CONTROLLER_URL, MUSTER_WORKER_ID, MUSTER_WORKER_TOKEN
 * (a secret: never logged), MUSTER_BIND_IP (optional), MUSTER_LOG_LEVEL
 * (optional: error, warn, info or debug). stderr is the daemon's log file.
 *
 * The other modules (workerd.h lists them): config.c reads the
 * configuration, signals.c turns signals into self-pipe bytes, ctl_call.c
 * makes the calls to the controller, client.c registers and beats,
 * report.c ends, logship.c ships the command's output, child.c
 * starts children, exec_server.c serves the exec channel, zygote.c is the
 * fork server, job.c starts a Slurm job's steps (--job). This file drives them; none of them calls
 * back into it (the fork server gets worker_main() as a function pointer).
 */
#include "workerd.h"

#include "fault.h"
#include "log.h"
#include "muster_errors.h"
#include "util.h"
#include "zygote_proto.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <jansson.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

/* ------------------------------------------------------------------------ */
/* Start-up                                                                 */

/* Makes sure that file descriptors 0, 1 and 2 are open (on /dev/null if the
 * backend closed them), so that no pipe we create later lands on one of them
 * and gets clobbered by the child's dup2() calls. */
static void std_fds_ensure(void) {
  for (int fd = 0; fd < 3; fd++) {
    if (fcntl(fd, F_GETFD) >= 0 || errno != EBADF)
      continue;
    /* open() takes the lowest free descriptor, which is this one. */
    int n = open("/dev/null", O_RDWR);
    if (n > fd)
      close(n);
  }
}

/* ------------------------------------------------------------------------ */
/* Stopping                                                                 */

/* Decides to stop, in the given mode, unless a stop is already under way or
 * the command has already ended (then its own end is what gets reported).
 * signo is SIGTERM or SIGINT when a signal asked, else 0. A running command
 * gets SIGTERM now and SIGKILL 5 s later; an idle worker ends at once. */
static void stop_begin(enum finish_mode mode, int signo, int64_t now) {
  if (wd.stopping || wd.child_done)
    return;
  wd.stopping = true;
  wd.mode = mode;
  wd.stop_signal = signo;
  if (wd.child > 0) {
    /* Tests: the command gets its SIGTERM from here well after a stop
     * began, so that any other SIGTERM would reach it first. */
    FAULT_POINT("workerd_stop_term");
    kill(wd.child, SIGTERM);
    wd.kill_at_ms = now + WD_KILL_GRACE_MS;
  } else {
    wd.finish = true;
  }
}

/* ------------------------------------------------------------------------ */
/* The main loop                                                            */

/* Where the worker is in its life. */
enum phase {
  PH_REGISTER, /* registering; nothing else runs yet */
  PH_RUN,      /* the command runs (or the worker idles), exec served */
  PH_FINISH,   /* the last output shipped, then the exit reported */
  PH_DONE
};

/* The earlier of two deadlines. */
static int64_t min64(int64_t a, int64_t b) {
  return a < b ? a : b;
}

/* Ends, now, what the stopped command left in our process group (a
 * daemonised grandchild that holds its pipes, say): a worker stopped by a
 * signal ends with its command, as a container ends with its first process,
 * and its rest need not be waited for. Only when workerd leads the group, as
 * the backend's setsid() makes it; otherwise the group belongs to whoever
 * started us (a shell, a test) and is not ours to signal. workerd does not
 * hear its own SIGTERM. */
static void group_term(void) {
  struct sigaction ign, old;

  if (wd.child <= 0 || getpgrp() != getpid())
    return;
  memset(&ign, 0, sizeof(ign));
  ign.sa_handler = SIG_IGN;
  sigemptyset(&ign.sa_mask);
  sigaction(SIGTERM, &ign, &old);
  kill(0, SIGTERM);
  sigaction(SIGTERM, &old, NULL);
}

/* The run phase's decisions by the clock, before poll(): the worker's end
 * (an idle worker told to stop, a command that exited and was drained) winds
 * the exec channel down (its commands killed, their clients told, for at
 * most 5 s); SIGKILL when the stop grace is over; heartbeats. Returns true
 * once the run is over. */
static bool run_step(int64_t now) {
  /* Heartbeats first: a stop their answer decides is acted on below, in
   * this same round (an idle worker has nothing else to wake the loop). */
  if (wd.stopping || wd.child_done || wd.ending) {
    hb_cancel(); /* no more beats; one in flight is moot */
  } else {
    enum hb_result hb = hb_step(now);

    if (hb != HB_NONE)
      stop_begin(hb == HB_STOP_QUIET ? FINISH_QUIET : FINISH_SILENT, 0, now);
  }
  if (!wd.ending && (wd.finish || (wd.child_done && ((wd.out.fd < 0 && wd.err.fd < 0) ||
                                                     now >= wd.drain_until_ms)))) {
    wd.ending = true;
    fd_close(&wd.out.fd);
    fd_close(&wd.err.fd);
  }
  if ((wd.ending || wd.stopping) && !ex_stopping())
    ex_stop_all(now);
  if (wd.ending && ex_done(now))
    return true;
  if (wd.stopping && !wd.child_done && now >= wd.kill_at_ms) {
    LOG(LOG_WARN, "the command is still running %d s after SIGTERM; sending SIGKILL",
        WD_KILL_GRACE_MS / 1000);
    kill(wd.child, SIGKILL);
    wd.kill_at_ms = INT64_MAX;
  }
  return false;
}

/* When run_step() must next run if nothing else wakes the loop. */
static int64_t run_deadline(void) {
  int64_t next = ex_next_deadline();

  if (!wd.stopping && !wd.child_done && !wd.ending)
    next = min64(next, min64(wd.next_hb_ms, host_beat_deadline()));
  if (wd.stopping && !wd.child_done)
    next = min64(next, wd.kill_at_ms);
  if (wd.child_done && !wd.ending)
    next = min64(next, wd.drain_until_ms);
  return next;
}

/* A signal stops the worker and its command has ended: what the command
 * left is told to end too, and its output is read until the stop grace is
 * over, not past it. */
static void leftovers_end(void) {
  group_term();
  wd.drain_until_ms = min64(wd.drain_until_ms, wd.term_at_ms + WD_KILL_GRACE_MS);
}

/* A SIGTERM or SIGINT arrived: in the run phase it stops the worker (the
 * command gets SIGTERM); in the finish phase it cuts the report short. */
static void on_term(enum phase ph, int term, int64_t now) {
  LOG(LOG_INFO, "received %s; stopping", term == SIGTERM ? "SIGTERM" : "SIGINT");
  if (!wd.term_received) {
    wd.term_received = term;
    wd.term_at_ms = now;
  }
  if (ph == PH_RUN) {
    stop_begin(FINISH_REPORT, term, now);
    if (wd.child_done)
      leftovers_end();
  } else if (ph == PH_FINISH) {
    report_signal(now);
  }
}

/* The command ended (SIGCHLD reaped it): when a signal is stopping the
 * worker, what it left behind is told to end too (leftovers_end()). */
static void on_child(int64_t now) {
  bool was_done = wd.child_done;

  child_reap(now);
  if (!was_done && wd.child_done && wd.term_received)
    leftovers_end();
}

/* Runs the worker's life from registration to the exit report: registers
 * (retrying while the controller is away), runs the command, reads its
 * pipes, ships logs, heartbeats, serves exec, turns signals into stop
 * decisions, and ends with the last output and the exit report. Calls to the
 * controller are steps on the same loop: nothing here waits on the network.
 * Returns 0; MUSTER_E_SHUTTING_DOWN when a signal came before registration
 * ended; what registration failed with; MUSTER_E_TIMEOUT when the exit
 * report was given up; MUSTER_E_IO if poll() itself failed. */
MUST_CHECK static int main_loop(void) {
  enum phase ph = PH_REGISTER;
  int rc = register_begin();

  while (rc == 0 && ph != PH_DONE) {
    struct pollfd p[3 + EX_POLL_MAX + CALL_POLL_MAX];
    int nfds = 0, at_out = -1, at_err = -1;
    int64_t now = util_mono_ms();
    int64_t next = INT64_MAX;
    int timeout;
    bool child = false;
    int term = 0;

    if (ph == PH_REGISTER) {
      enum reg_result r = register_step(now, &rc);

      if (r == REG_FAILED)
        break;
      if (r == REG_OK) {
        register_cancel();
        calls_keep_none();
        if (wd.argv)
          LOG(LOG_INFO, "registered; running \"%s\" with %zu more arguments", wd.argv[0],
              wd.argc - 1);
        else
          LOG(LOG_INFO, "registered as an idle worker");
        wd.next_hb_ms = now + wd.hb_interval_ms;
        if (worker_scratch_enter() != 0 || (wd.argv && command_start() != 0))
          wd.finish = true; /* reported at the end, with wd.reason */
        ph = PH_RUN;
      }
    }
    if (ph == PH_RUN && run_step(now)) {
      /* Nothing reaches the streams after this: their last bytes ship. */
      fd_close(&wd.out.fd);
      fd_close(&wd.err.fd);
      ex_cleanup();
      hb_cancel();
      rc = report_begin(now);
      if (rc)
        break;
      ph = PH_FINISH;
    }
    if (ph == PH_RUN)
      streams_ship(now, false);
    if (ph == PH_FINISH) {
      enum report_result r = report_step(now);

      if (r != REPORT_BUSY) {
        rc = r == REPORT_DONE ? 0 : MUSTER_E_TIMEOUT;
        ph = PH_DONE;
        break;
      }
    }

    if (ph == PH_REGISTER)
      next = register_deadline();
    if (ph == PH_RUN)
      next = min64(run_deadline(), streams_deadline());
    if (ph == PH_FINISH)
      next = report_deadline();
    next = min64(next, calls_next_deadline());
    now = util_mono_ms();
    timeout = next == INT64_MAX ? -1 : next <= now ? 0 : (int)min64(next - now, INT_MAX);

    p[nfds++] = (struct pollfd){.fd = wd.sig_read_fd, .events = POLLIN};
    if (ph == PH_RUN) {
      if (wd.out.fd >= 0) {
        at_out = nfds;
        p[nfds++] = (struct pollfd){.fd = wd.out.fd, .events = POLLIN};
      }
      if (wd.err.fd >= 0) {
        at_err = nfds;
        p[nfds++] = (struct pollfd){.fd = wd.err.fd, .events = POLLIN};
      }
      ex_poll_add(p, &nfds, now);
    }
    calls_poll_add(p, &nfds);
    if (poll(p, (nfds_t)nfds, timeout) < 0) {
      if (errno == EINTR)
        continue;
      LOG(LOG_ERROR, "poll: %s", strerror(errno));
      rc = MUSTER_E_IO;
      break;
    }
    now = util_mono_ms();
    /* The controller's answers first: a log POST that ended frees its
     * stream for the next, and an exec X waiting for it sees it below. */
    calls_poll_handle(p, now);
    streams_take(now);
    /* Pipes before SIGCHLD, so the drain window starts after what is here. */
    if (at_out >= 0 && p[at_out].revents)
      stream_read(&wd.out, now);
    if (at_err >= 0 && p[at_err].revents)
      stream_read(&wd.err, now);
    if (p[0].revents) {
      signals_take(&child, &term);
      if (child && ph == PH_RUN) {
        on_child(now);
        ex_reap(now);
      }
      if (term && ph == PH_REGISTER) {
        LOG(LOG_INFO, "stopped before registering");
        rc = MUSTER_E_SHUTTING_DOWN;
        break;
      }
      if (term)
        on_term(ph, term, now);
    }
    if (ph == PH_RUN)
      ex_poll_handle(p, now);
  }
  if (rc && wd.child > 0 && !wd.child_done)
    kill(wd.child, SIGKILL); /* never leave the command running unwatched */
  fd_close(&wd.out.fd);
  fd_close(&wd.err.fd);
  return rc;
}

/* ------------------------------------------------------------------------ */
/* The end                                                                  */

/* Frees everything in wd and closes its descriptors, so that sanitizer runs
 * see no leaks. */
static void cleanup(void) {
  ex_cleanup();
  worker_scratch_leave();
  register_cancel();
  report_cleanup();
  calls_cleanup();
  strv_free(wd.argv);
  strv_free(wd.envp);
  free(wd.cwd);
  free(wd.script);
  if (wd.exec_token) {
    explicit_bzero(wd.exec_token, strlen(wd.exec_token));
    free(wd.exec_token);
    wd.exec_token = NULL;
  }
  free(wd.out.ring);
  free(wd.err.ring);
  free(wd.out.send);
  free(wd.err.send);
  fd_close(&wd.out.fd);
  fd_close(&wd.err.fd);
  fd_close(&wd.listen_fd);
  explicit_bzero(wd.token, sizeof(wd.token));
}

/* The local backend's container: joins each cgroup directory listed in
 * MUSTER_CGROUP (one a line), before the worker does anything else, so that
 * everything it runs is inside. Returns 0, or -1 (said on stderr, which is
 * the worker's workerd log). */
static int cgroup_join(void) {
  const char *list = getenv("MUSTER_CGROUP");
  char dir[PATH_MAX], path[PATH_MAX + 16];

  for (const char *p = list; p && *p;) {
    size_t n = strcspn(p, "\n");
    int fd, ok;

    if (n > 0 && n < sizeof(dir)) {
      memcpy(dir, p, n);
      dir[n] = '\0';
      /* cgroup v1: "tasks" moves this thread only, which is the whole
       * process (no thread has started yet), and spares the kernel's global
       * lock on thread groups that cgroup.procs takes, whose first writer
       * after a quiet spell waits out an RCU grace period (some 20 ms a
       * worker). v2 has cgroup.procs only. */
      snprintf(path, sizeof(path), "%s/tasks", dir);
      fd = open(path, O_WRONLY | O_CLOEXEC);
      if (fd < 0) { /* (v2, or a v1 "tasks" this process may not write) */
        snprintf(path, sizeof(path), "%s/cgroup.procs", dir);
        fd = open(path, O_WRONLY | O_CLOEXEC);
      }
      ok = fd >= 0 && write(fd, "0", 1) == 1;
      if (!ok) {
        fprintf(stderr, "muster-workerd: cannot join its cgroup %s: %s\n", dir, strerror(errno));
        if (fd >= 0)
          close(fd);
        return -1;
      }
      close(fd);
    }
    p += n;
    if (*p == '\n')
      p++;
  }
  unsetenv("MUSTER_CGROUP");
  return 0;
}

/* Runs one worker: reads its configuration from the environment, registers,
 * runs its command and reports how it ended. Returns the process's exit
 * code. */
static int worker_main(void) {
  int code = 1;
  int rc;

  std_fds_ensure();
  if (cgroup_join() != 0 || wd_netns_enter() != 0)
    return 1;
  log_level_from_env();
  wd.listen_fd = wd.sig_read_fd = wd.scratch.lock_fd = -1;
  wd.out = (struct stream){.name = "stdout", .fd = -1};
  wd.err = (struct stream){.name = "stderr", .fd = -1};
  wd.controller_up = true;
  wd.mode = FINISH_REPORT;
  wd.kill_at_ms = INT64_MAX;
  wd.logs_backoff_ms = WD_RETRY_FIRST_MS;

  rc = config_load();
  if (rc && wd.token_missing)
    code = WD_EXIT_NO_TOKEN;
  if (rc == 0)
    rc = signals_install();
  if (rc == 0)
    rc = calls_init();
  if (rc)
    goto out;
  if (!wd.ip[0]) {
    struct backoff b;

    /* The host's name or route may not be there yet on a node that is still
     * coming up; that is worth 10 minutes of patience. */
    backoff_init(&b);
    while ((rc = ip_toward_controller(wd.ip, sizeof(wd.ip))) == MUSTER_E_UNREACHABLE) {
      rc = backoff_wait(&b);
      if (rc)
        break;
    }
    if (rc == MUSTER_E_SHUTTING_DOWN)
      code = 0;
    if (rc)
      goto out;
  }
  rc = exec_listen();
  if (rc)
    goto out;
  LOG(LOG_INFO, "worker %s on %s, exec port %d, controller %s", wd.id, wd.ip, wd.exec_port, wd.url);

  rc = main_loop();
  if (rc == 0 || rc == MUSTER_E_SHUTTING_DOWN)
    code = 0;
out:
  /* (one line for every way out with an error, those said before too) */
  if (code != 0)
    LOG(LOG_ERROR, "ends with exit %d: %s", code, rc ? muster_strerror(rc) : "an error");
  group_term();
  cleanup();
  return code;
}

int main(int argc, char **argv) {
  /* First of all: only root reads a workerd's memory (its token) and
   * environment (a job's secret), not the worker's own code, which may run
   * as workerd's account (on Slurm). The kernel makes it so from exec on
   * only when this binary is unreadable by that account (root-owned, mode
   * 0711, as CMake builds and installs it); until here it was dumpable
   * otherwise, and a /proc file opened then stays open (docs/backends.md).
   * config_load() gives this back to a workerd that confines its command
   * in a user namespace (it must write its own uid_map). */
  int dumpable = prctl(PR_GET_DUMPABLE, 0, 0, 0, 0);
  int code;

  prctl(PR_SET_DUMPABLE, 0);
  log_set_program("muster-workerd");
  if (argc == 2 && strcmp(argv[1], "--version") == 0) {
    printf("muster-workerd %s\n", MUSTER_VERSION);
    return 0;
  }
  if (argc == 3 && strcmp(argv[1], "--job") == 0) {
    /* a Slurm job's first process (job.c): before anything else */
    if (job_check_dumpable(dumpable) != 0)
      return 1;
    return job_main(argv[2], argv[0]);
  }
  if (argc > 2 || (argc == 2 && strcmp(argv[1], ZYGOTE_ARG) != 0)) {
    fprintf(stderr,
            "usage: muster-workerd [--zygote | --job SCRIPT]\n"
            "Started by the muster controller's backend, configured by MUSTER_CONTROLLER_URL,\n"
            "MUSTER_WORKER_ID, MUSTER_WORKER_TOKEN (or MUSTER_WORKER_TOKEN_FD, a file\n"
            "descriptor to read it from) and optionally MUSTER_BIND_IP.\n"
            "--zygote serves the local backend as a fork server on fd 3.\n"
            "--job SCRIPT starts the steps of a Slurm job muster submitted.\n");
    return 2;
  }
  if (argc == 2)
    zygote_rebind(argv);
  if (job_check_dumpable(dumpable) != 0)
    return 1;
  if (argc == 2) {
    exec_prewarm();
    code = zygote_main(worker_main);
  } else {
    code = worker_main();
  }
  return code;
}
