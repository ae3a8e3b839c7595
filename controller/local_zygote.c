/*
 * local_zygote.c: starting muster-workerd processes, through the workerd
 * fork server (muster-workerd --zygote; its protocol is
 * common/zygote_proto.h) or, without it, by posix_spawn. The backend's
 * thread's own: lb.zygote_* and lb.base_env are read and written without
 * a lock.
 */
#include "local_internal.h"

#include "log.h"
#include "muster_errors.h"
#include "zygote_proto.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

/* Spawns workerd (the fork server, or one worker) with standard input from
 * /dev/null, its output appended to logpath, and fd3, if not -1, as its fd
 * 3 (ZYGOTE_FD); in its own session, so that it outlives a controller
 * restart and can be signalled as a group with its script; with default
 * signal handling, since the controller ignores SIGPIPE. Returns
 * posix_spawn's answer. */
static MUST_CHECK int spawn_workerd(pid_t *pid, const char *logpath, int fd3, char *const argv[],
                                    char *const envp[]) {
  posix_spawn_file_actions_t fa;
  posix_spawnattr_t attr;
  sigset_t none, defaults;
  int rc;

  posix_spawn_file_actions_init(&fa);
  if (fd3 >= 0)
    posix_spawn_file_actions_adddup2(&fa, fd3, ZYGOTE_FD);
  posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&fa, 1, logpath, O_WRONLY | O_CREAT | O_APPEND, 0600);
  posix_spawn_file_actions_adddup2(&fa, 1, 2);
  posix_spawnattr_init(&attr);
  sigemptyset(&none);
  sigemptyset(&defaults);
  sigaddset(&defaults, SIGPIPE);
  sigaddset(&defaults, SIGCHLD);
  sigaddset(&defaults, SIGTERM);
  sigaddset(&defaults, SIGINT);
  sigaddset(&defaults, SIGHUP);
  posix_spawnattr_setsigmask(&attr, &none);
  posix_spawnattr_setsigdefault(&attr, &defaults);
  posix_spawnattr_setflags(&attr,
                           POSIX_SPAWN_SETSID | POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
  rc = posix_spawn(pid, lb.cfg.workerd_path, &fa, &attr, argv, envp);
  posix_spawn_file_actions_destroy(&fa);
  posix_spawnattr_destroy(&attr);
  return rc;
}

void local_zygote_close(void) {
  if (lb.zygote_fd >= 0)
    close(lb.zygote_fd);
  if (lb.zygote_pid > 0)
    kill(lb.zygote_pid, SIGKILL); /* reaped by the backend thread */
  lb.zygote_fd = -1;
  lb.zygote_pid = 0;
  lb.zygote_retry_ms = util_mono_ms() + 10000;
}

void local_zygote_ensure(void) {
  if (lb.zygote_spent) {
    LOG(LOG_INFO, "the workerd fork server can no longer fork; spawning each worker");
    local_zygote_close();
    lb.zygote_retry_ms = INT64_MAX;
    lb.zygote_spent = 0;
  }
  if (lb.zygote_fd < 0 && lb.zygote_retry_ms != INT64_MAX && util_mono_ms() >= lb.zygote_retry_ms)
    local_zygote_start();
}

/* Starts the fork server (muster-workerd --zygote; its protocol is
 * common/zygote_proto.h); on failure workers are simply spawned. */
void local_zygote_start(void) {
  char logpath[1100];
  char *argv[] = {lb.cfg.workerd_path, ZYGOTE_ARG, NULL};
  struct pollfd p;
  pid_t hello = -1;
  int sv[2], rc;

  if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0)
    return;
  snprintf(logpath, sizeof(logpath), "%s/workers/zygote.log", lb.cfg.state_dir);
  rc = spawn_workerd(&lb.zygote_pid, logpath, sv[1], argv, lb.base_env);
  close(sv[1]);
  if (rc != 0) {
    LOG(LOG_WARN, "could not start the workerd fork server (%s); spawning each worker",
        strerror(rc));
    close(sv[0]);
    lb.zygote_pid = 0;
    lb.zygote_retry_ms = util_mono_ms() + 10000;
    return;
  }
  lb.zygote_fd = sv[0];
  p.fd = lb.zygote_fd;
  p.events = POLLIN;
  if (poll(&p, 1, 2000) != 1 || recv(lb.zygote_fd, &hello, sizeof(hello), 0) != sizeof(hello) ||
      hello != ZYGOTE_HELLO) {
    /* Not a fork server (a --workerd that predates it, or a wrapper): spawn
     * every worker, and do not try again. */
    LOG(LOG_INFO, "%s is not a fork server; spawning each worker", lb.cfg.workerd_path);
    local_zygote_close();
    lb.zygote_retry_ms = INT64_MAX;
    return;
  }
  LOG(LOG_DEBUG, "workerd fork server started (pid %d)", (int)lb.zygote_pid);
}

/* Sends one request to the fork server. Returns 0, or an error (nothing was
 * sent; the fork server is closed if it broke). */
MUST_CHECK int local_zygote_send(const struct wvars *w) {
  char req[ZYGOTE_REQ_MAX];
  size_t len = 0;

  if (lb.zygote_fd < 0)
    return MUSTER_E_BACKEND;
  for (int i = 0; i < WVARS; i++) {
    size_t n = strlen(w->v[i]) + 1;
    if (len + n > sizeof(req))
      return MUSTER_E_BACKEND;
    memcpy(req + len, w->v[i], n);
    len += n;
  }
  if (send(lb.zygote_fd, req, len, MSG_NOSIGNAL) != (ssize_t)len) {
    LOG(LOG_WARN, "the workerd fork server stopped taking requests; restarting it later");
    local_zygote_close();
    return MUSTER_E_BACKEND;
  }
  return 0;
}

/* Reads the fork server's answer to the oldest request not yet answered.
 * Returns 0 with *pid set; MUSTER_E_BACKEND if it could not fork (nothing
 * started); MUSTER_E_PROTOCOL if it broke (whether it started the worker is
 * unknown). */
MUST_CHECK int local_zygote_recv(pid_t *pid) {
  struct pollfd p = {.fd = lb.zygote_fd, .events = POLLIN};
  pid_t answer;

  if (lb.zygote_fd < 0 || poll(&p, 1, 5000) != 1 ||
      recv(lb.zygote_fd, &answer, sizeof(answer), 0) != sizeof(answer)) {
    if (lb.zygote_fd >= 0) {
      LOG(LOG_WARN, "the workerd fork server stopped answering; restarting it later");
      local_zygote_close();
    }
    return MUSTER_E_PROTOCOL;
  }
  if (answer == -ENOTSUP) {
    /* It has started a thread, and never forks again (workerd/zygote.c):
     * closed once this batch's answers are read (local_zygote_ensure()). */
    lb.zygote_spent = 1;
    return MUSTER_E_BACKEND;
  }
  if (answer <= 0) {
    LOG(LOG_WARN, "the workerd fork server could not fork: %s", strerror(-answer));
    return MUSTER_E_BACKEND;
  }
  *pid = answer;
  return 0;
}

/* Starts one workerd without the fork server. Returns 0 with *pid set, or
 * an error with a sentence in err. */
MUST_CHECK int local_spawn_direct(const struct wvars *w, pid_t *pid, char *err, size_t errlen) {
  char *argv[] = {lb.cfg.workerd_path, NULL};
  char **envp = calloc(lb.base_env_len + WVARS, sizeof(*envp));
  int rc;

  if (!envp) {
    snprintf(err, errlen, "out of memory");
    return MUSTER_E_NOMEM;
  }
  memcpy(envp, lb.base_env, lb.base_env_len * sizeof(*envp));
  /* Every setting but the fork server's own (v[5]): one left out here
   * would change what the worker is (its account, its confinement). */
  for (size_t i = 0, k = lb.base_env_len; i < WVARS; i++)
    if (i != 5)
      envp[k++] = (char *)w->v[i];
  rc = spawn_workerd(pid, w->logpath, -1, argv, envp);
  free(envp);
  if (rc != 0) {
    snprintf(err, errlen, "could not start %s: %s", lb.cfg.workerd_path, strerror(rc));
    return MUSTER_E_BACKEND;
  }
  return 0;
}
