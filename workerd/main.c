/*
 * main.c: muster-workerd, the daemon that runs inside every worker: its
 * entry point, configuration, signals, main loop, heartbeats and end.
 *
 * It registers the worker's address with the controller, runs the worker's
 * command, ships the command's stdout and stderr to the controller, sends
 * heartbeats, and reports how the command ended. It also serves the exec
 * channel (docs/exec-protocol.md): the launching session runs commands in
 * the worker through it, as it would through SSH.
 *
 * It is single-threaded: one poll() loop over the command's two output pipes,
 * the exec channel's sockets and pipes, and a self-pipe that turns SIGCHLD,
 * SIGTERM and SIGINT into readable bytes.
 * HTTP calls are blocking (libcurl easy interface, one handle reused for
 * keep-alive); each is bounded by a 10 s timeout, and while one runs the
 * command simply fills its pipes and waits, which is the back-pressure we want.
 *
 * The controller may restart at any moment. workerd survives that: register
 * and the exit report retry with backoff for 10 minutes, logs stay buffered
 * (up to 8 MiB per stream) until the next flush gets through, and heartbeats
 * are simply tried again at the next interval, so a worker re-attaches by
 * being heard again.
 *
 * Environment: MUSTER_CONTROLLER_URL, MUSTER_WORKER_ID, MUSTER_WORKER_TOKEN
 * (a secret: never logged), MUSTER_BIND_IP (optional), MUSTER_LOG_LEVEL
 * (optional: error, warn, info or debug). stderr is the daemon's log file.
 *
 * The other modules (workerd.h lists them): config.c reads the
 * configuration, signals.c turns signals into self-pipe bytes, client.c
 * talks to the controller, logship.c ships the command's output, child.c
 * starts children, exec_server.c serves the exec channel, zygote.c is the
 * fork server. This file drives them; none of them calls back into it (the
 * fork server gets worker_main() as a function pointer).
 */
#include "workerd.h"

#include "fault.h"
#include "log.h"
#include "muster_errors.h"
#include "util.h"
#include "zygote_proto.h"

#include <curl/curl.h>
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
/* Heartbeats and the main loop                                             */

/* Sends one heartbeat and acts on the answer: a stop, or an answer saying
 * that the controller no longer knows this worker, starts stopping. A
 * controller that cannot be reached is not an error: the next interval tries
 * again, and succeeding is all it takes to re-attach. */
static void heartbeat(void) {
  json_t *ans = NULL;
  json_t *stop;
  long status;
  int rc = http_post("heartbeat", true, "{}", 2, &status);

  if (rc == MUSTER_E_UNREACHABLE || (rc == 0 && status >= 500)) {
    int64_t now = util_mono_ms();
    if (now - wd.last_contact_ms > wd.orphan_ms) {
      LOG(LOG_ERROR,
          "no answer from the controller itself for %" PRId64 " s (MUSTER_ORPHAN_TIMEOUT); "
          "ending this worker",
          (now - wd.last_contact_ms) / 1000);
      stop_begin(FINISH_SILENT, 0, now);
      goto out;
    }
    LOG(LOG_DEBUG, "heartbeat not delivered (%s); next one in %" PRId64 " ms",
        rc ? "unreachable" : "server error", wd.hb_interval_ms);
    goto out;
  }
  if (rc) {
    LOG(LOG_WARN, "heartbeat failed: %s", muster_strerror(rc));
    goto out;
  }
  if (status == 401 || status == 403 || status == 404 || status == 409) {
    LOG(LOG_INFO, "the controller no longer runs this worker (HTTP %ld); stopping", status);
    stop_begin(FINISH_SILENT, 0, util_mono_ms());
    goto out;
  }
  if (status != 200) {
    LOG(LOG_WARN, "unexpected HTTP %ld to a heartbeat", status);
    goto out;
  }
  ans = json_loadb(wd.answer, wd.answer_len, 0, NULL);
  stop = json_object_get(ans, "stop");
  if (!json_is_boolean(stop)) {
    LOG(LOG_WARN, "the heartbeat answer has no boolean \"stop\"");
    goto out;
  }
  LOG(LOG_DEBUG, "heartbeat delivered");
  if (json_is_true(stop)) {
    LOG(LOG_INFO, "the controller asked this worker to stop");
    stop_begin(FINISH_QUIET, 0, util_mono_ms());
  }
out:
  json_decref(ans);
}

/* The earlier of two deadlines. */
static int64_t min64(int64_t a, int64_t b) {
  return a < b ? a : b;
}

/* Runs until the worker must end: the command has exited and its pipes are
 * drained (or 2 s have passed), or an idle worker was told to stop; then the
 * exec channel is wound down (its commands killed, for at most 5 s). Reads
 * the pipes, ships logs, heartbeats, serves exec, and turns signals into
 * stop decisions.
 * Returns 0, or MUSTER_E_IO if poll() itself failed. */
MUST_CHECK static int main_loop(void) {
  int rc = 0;

  for (;;) {
    struct pollfd p[3 + EX_POLL_MAX];
    int nfds = 0, at_out = -1, at_err = -1;
    int64_t now = util_mono_ms();
    int64_t next = INT64_MAX;
    int timeout;
    bool child = false;
    int term = 0;

    /* The worker's own end (an idle worker told to stop, a script that
     * exited and was drained) waits for the exec channel to wind down:
     * its commands are killed, their clients told, for at most 5 s. */
    if (!wd.ending && (wd.finish || (wd.child_done && ((wd.out.fd < 0 && wd.err.fd < 0) ||
                                                       now >= wd.drain_until_ms)))) {
      wd.ending = true;
      fd_close(&wd.out.fd);
      fd_close(&wd.err.fd);
    }
    if ((wd.ending || wd.stopping) && !ex_stopping())
      ex_stop_all(now);
    if (wd.ending && ex_done(now))
      break;
    if (wd.stopping && !wd.child_done && now >= wd.kill_at_ms) {
      LOG(LOG_WARN, "the command is still running %d s after SIGTERM; sending SIGKILL",
          WD_KILL_GRACE_MS / 1000);
      kill(wd.child, SIGKILL);
      wd.kill_at_ms = INT64_MAX;
    }
    if (!wd.stopping && !wd.child_done && !wd.ending && now >= wd.next_hb_ms) {
      heartbeat();
      wd.next_hb_ms = util_mono_ms() + wd.hb_interval_ms;
      continue; /* the call took time, and may have decided a stop */
    }
    streams_flush_due(now);

    if (!wd.stopping && !wd.child_done && !wd.ending)
      next = min64(next, wd.next_hb_ms);
    if (wd.stopping && !wd.child_done)
      next = min64(next, wd.kill_at_ms);
    if (wd.child_done && !wd.ending)
      next = min64(next, wd.drain_until_ms);
    next = min64(next, ex_next_deadline());
    if (wd.out.ring)
      next = min64(next, stream_deadline(&wd.out));
    if (wd.err.ring)
      next = min64(next, stream_deadline(&wd.err));
    now = util_mono_ms();
    timeout = next == INT64_MAX ? -1 : next <= now ? 0 : (int)min64(next - now, INT_MAX);

    p[nfds++] = (struct pollfd){.fd = wd.sig_read_fd, .events = POLLIN};
    if (wd.out.fd >= 0) {
      at_out = nfds;
      p[nfds++] = (struct pollfd){.fd = wd.out.fd, .events = POLLIN};
    }
    if (wd.err.fd >= 0) {
      at_err = nfds;
      p[nfds++] = (struct pollfd){.fd = wd.err.fd, .events = POLLIN};
    }
    ex_poll_add(p, &nfds, now);
    if (poll(p, (nfds_t)nfds, timeout) < 0) {
      if (errno == EINTR)
        continue;
      LOG(LOG_ERROR, "poll: %s", strerror(errno));
      rc = MUSTER_E_IO;
      break;
    }
    now = util_mono_ms();
    /* Pipes before SIGCHLD, so the drain window starts after what is here. */
    if (at_out >= 0 && p[at_out].revents)
      stream_read(&wd.out, now);
    if (at_err >= 0 && p[at_err].revents)
      stream_read(&wd.err, now);
    if (p[0].revents) {
      signals_take(&child, &term);
      if (child) {
        child_reap(now);
        ex_reap(now);
      }
      if (term) {
        wd.term_received = term;
        LOG(LOG_INFO, "received %s; stopping", term == SIGTERM ? "SIGTERM" : "SIGINT");
        stop_begin(FINISH_REPORT, term, now);
      }
    }
    ex_poll_handle(p, now);
  }
  fd_close(&wd.out.fd);
  fd_close(&wd.err.fd);
  return rc;
}

/* ------------------------------------------------------------------------ */
/* The end                                                                  */

/* Builds the exit report: exit code, or signal, and the reason the command
 * could not start if that is what happened. Returns a new string (free()),
 * or NULL if out of memory. */
static char *exit_body(void) {
  json_t *o = json_object();
  json_t *code = NULL, *sig = NULL, *reason = NULL;
  char *s = NULL;

  if (!o)
    goto out;
  if (wd.child_done && wd.wait_status >= 0 && WIFEXITED(wd.wait_status))
    code = json_integer(WEXITSTATUS(wd.wait_status));
  else if (wd.child_done && wd.wait_status >= 0 && WIFSIGNALED(wd.wait_status))
    sig = json_integer(WTERMSIG(wd.wait_status));
  else if (!wd.child_done && wd.stop_signal)
    sig = json_integer(wd.stop_signal); /* an idle worker killed by a signal */
  /* The controller's own stops never need a reason (the worker is stopped
   * already and this report changes nothing). A signal from anyone else
   * (a scancel, a node shutdown, a kill by hand) reaches workerd and the
   * script together: say so, rather than only that the script was killed. */
  if (!wd.reason[0] && wd.term_received && !code)
    snprintf(wd.reason, sizeof(wd.reason),
             MUSTER_OUTSIDE_STOP ": muster-workerd was sent %s (a Slurm cancel, a node "
                                 "shutdown or a kill)",
             wd.term_received == SIGTERM ? "SIGTERM" : "SIGINT");
  reason = wd.reason[0] ? json_string(wd.reason) : json_null();
  if (json_object_set_new(o, "exit_code", code ? code : json_null()) != 0 ||
      json_object_set_new(o, "signal", sig ? sig : json_null()) != 0 ||
      json_object_set_new(o, "reason", reason) != 0)
    goto out;
  s = json_dumps(o, JSON_COMPACT);
out:
  json_decref(o);
  return s;
}

/* Ends the worker as wd.mode says. For FINISH_REPORT it ships the remaining
 * logs and then reports the exit, retrying both with backoff for 10 minutes
 * (a 4xx to the report means the controller already considers the worker
 * finished); for FINISH_QUIET, one try at each. The report always comes
 * after the last output: it tells a followed log that it is whole.
 * Returns 0, MUSTER_E_TIMEOUT (logged) or MUSTER_E_NOMEM. */
MUST_CHECK static int finish(void) {
  struct backoff b;
  char *body = NULL;
  long status;
  int rc = 0;

  if (wd.mode == FINISH_SILENT)
    goto out;
  if (wd.mode == FINISH_QUIET) {
    /* One try: the controller stopped this worker and may refuse logs now.
     * The report changes nothing there but says that the output is all in. */
    if (streams_flush_all() != 0)
      LOG(LOG_INFO, "the last output of the command could not be shipped");
    else if (!(body = exit_body()))
      rc = MUSTER_E_NOMEM;
    else if (http_post("exit", true, body, strlen(body), &status) != 0)
      LOG(LOG_INFO, "could not say that the last output was shipped");
    goto out;
  }
  body = exit_body();
  if (!body) {
    rc = MUSTER_E_NOMEM;
    goto out;
  }
  backoff_init(&b);
  /* A worker ended by SIGTERM is most often being stopped by the controller,
   * which knows the outcome already: a short try is enough. The long one is
   * for a command that ended by itself, whose result must not be lost. */
  if (wd.stop_signal)
    b.give_up_ms = util_mono_ms() + 10 * 1000;
  for (;;) {
    if (streams_flush_all() == 0) {
      rc = http_post("exit", true, body, strlen(body), &status);
      if (rc == 0 && status >= 200 && status < 300) {
        LOG(LOG_INFO, "reported the exit: %s", body);
        break;
      }
      if (rc == 0 && status < 500) {
        LOG(LOG_INFO, "the controller already considers this worker finished (HTTP %ld)", status);
        break;
      }
    }
    rc = backoff_wait(&b, false);
    if (rc) {
      LOG(LOG_ERROR, "could not report the exit in time; giving up");
      goto out;
    }
  }
  rc = 0;
out:
  free(body);
  return rc;
}

/* Ends what the command left behind in our process group (say, a daemonised
 * grandchild that still holds its pipes): the worker ends with workerd, as a
 * container ends with its first process. Only when workerd leads the group,
 * as the backend's setsid() makes it; otherwise the group belongs to whoever
 * started us (a shell, a test) and is not ours to signal. */
static void group_terminate(void) {
  struct sigaction ign;

  if (wd.child <= 0 || getpgrp() != getpid())
    return;
  memset(&ign, 0, sizeof(ign));
  ign.sa_handler = SIG_IGN;
  sigemptyset(&ign.sa_mask);
  sigaction(SIGTERM, &ign, NULL);
  kill(0, SIGTERM);
}

/* Frees everything in wd and closes its descriptors, so that sanitizer runs
 * see no leaks. */
static void cleanup(void) {
  ex_cleanup();
  http_cleanup();
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
      if (access(path, W_OK) != 0)
        snprintf(path, sizeof(path), "%s/cgroup.procs", dir);
      fd = open(path, O_WRONLY | O_CLOEXEC);
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
 * runs its command and reports how it ended. curl_global_init() must have
 * been called. Returns the process's exit code. */
static int worker_main(void) {
  int code = 1;
  int rc;

  std_fds_ensure();
  if (cgroup_join() != 0)
    return 1;
  log_level_from_env();
  wd.listen_fd = wd.sig_read_fd = -1;
  wd.out = (struct stream){.name = "stdout", .fd = -1};
  wd.err = (struct stream){.name = "stderr", .fd = -1};
  wd.controller_up = true;
  wd.mode = FINISH_REPORT;
  wd.kill_at_ms = INT64_MAX;
  wd.logs_backoff_ms = WD_RETRY_FIRST_MS;

  rc = config_load();
  if (rc == 0)
    rc = signals_install();
  if (rc == 0)
    rc = http_init();
  if (rc)
    goto out;
  if (!wd.ip[0]) {
    struct backoff b;

    /* The host's name or route may not be there yet on a node that is still
     * coming up; that is worth the same patience as the controller itself. */
    backoff_init(&b);
    while ((rc = ip_toward_controller(wd.ip, sizeof(wd.ip))) == MUSTER_E_UNREACHABLE) {
      rc = backoff_wait(&b, true);
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

  rc = register_worker();
  if (rc == MUSTER_E_SHUTTING_DOWN) {
    LOG(LOG_INFO, "stopped before registering");
    code = 0;
  }
  if (rc)
    goto out;
  if (wd.argv)
    LOG(LOG_INFO, "registered; running \"%s\" with %zu more arguments", wd.argv[0], wd.argc - 1);
  else
    LOG(LOG_INFO, "registered as an idle worker");
  wd.next_hb_ms = util_mono_ms() + wd.hb_interval_ms;

  if (wd.argv && command_start() != 0)
    wd.finish = true; /* reported below, with wd.reason */
  rc = main_loop();
  if (rc) {
    /* Never leave the command running without anyone to watch it. */
    if (wd.child > 0 && !wd.child_done)
      kill(wd.child, SIGKILL);
    goto out;
  }
  rc = finish();
  if (rc == 0)
    code = 0;
out:
  group_terminate();
  cleanup();
  return code;
}

int main(int argc, char **argv) {
  int code;

  log_set_program("muster-workerd");
  if (argc == 2 && strcmp(argv[1], "--version") == 0) {
    printf("muster-workerd %s\n", MUSTER_VERSION);
    return 0;
  }
  if (argc > 2 || (argc == 2 && strcmp(argv[1], ZYGOTE_ARG) != 0)) {
    fprintf(stderr,
            "usage: muster-workerd [--zygote]\n"
            "Started by the muster controller's backend, configured by MUSTER_CONTROLLER_URL,\n"
            "MUSTER_WORKER_ID, MUSTER_WORKER_TOKEN and optionally MUSTER_BIND_IP.\n"
            "--zygote serves the local backend as a fork server on fd 3.\n");
    return 2;
  }
  if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK) {
    LOG(LOG_ERROR, "cannot initialise libcurl");
    return 1;
  }
  code = argc == 2 ? zygote_main(worker_main) : worker_main();
  curl_global_cleanup();
  return code;
}
