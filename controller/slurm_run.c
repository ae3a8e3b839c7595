/*
 * slurm_run.c: runs one Slurm command (sbatch, squeue, scancel...) with a
 * timeout, feeding it input and collecting its output. Calls nothing of the
 * backend's other files (slurm_internal.h).
 */
#include "slurm_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;

void sb_out_free(struct sb_out *o) {
  free(o->out);
  free(o->err);
  memset(o, 0, sizeof(*o));
}

static int append(char **buf, size_t *len, const char *data, size_t n) {
  char *grown;

  if (*len + n > SB_OUT_MAX)
    n = SB_OUT_MAX - *len;
  grown = realloc(*buf, *len + n + 1);
  if (!grown)
    return -1;
  memcpy(grown + *len, data, n);
  *len += n;
  grown[*len] = '\0';
  *buf = grown;
  return 0;
}

/* Runs argv with envp (NULL: ours), feeding it input (may be NULL), and
 * collects its output; kills it after timeout_ms. Returns 0 when it ran (its
 * exit status in o->status), or -1 with o->err saying why it could not. */
MUST_CHECK int sb_run(char *const argv[], char *const envp[], const char *input, int timeout_ms,
                      struct sb_out *o) {
  int in[2] = {-1, -1}, out[2] = {-1, -1}, err[2] = {-1, -1};
  posix_spawn_file_actions_t fa;
  size_t olen = 0, elen = 0, ilen = input ? strlen(input) : 0, ioff = 0;
  int64_t deadline = util_mono_ms() + timeout_ms;
  posix_spawnattr_t attr;
  sigset_t none, all;
  pid_t pid;
  int rc, st = 0;

  memset(o, 0, sizeof(*o));
  o->status = -1;
  o->out = calloc(1, 1);
  o->err = calloc(1, 1);
  if (!o->out || !o->err || pipe2(in, O_CLOEXEC) || pipe2(out, O_CLOEXEC) ||
      pipe2(err, O_CLOEXEC)) {
    for (int i = 0; i < 2; i++) {
      if (in[i] >= 0)
        close(in[i]);
      if (out[i] >= 0)
        close(out[i]);
      if (err[i] >= 0)
        close(err[i]);
    }
    return -1;
  }
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, in[0], 0);
  posix_spawn_file_actions_adddup2(&fa, out[1], 1);
  posix_spawn_file_actions_adddup2(&fa, err[1], 2);
  /* Not the controller's blocked and ignored signals: Slurm's commands get
   * the defaults. */
  posix_spawnattr_init(&attr);
  sigemptyset(&none);
  sigfillset(&all);
  posix_spawnattr_setsigmask(&attr, &none);
  posix_spawnattr_setsigdefault(&attr, &all);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
  rc = posix_spawnp(&pid, argv[0], &fa, &attr, argv, envp ? envp : environ);
  posix_spawnattr_destroy(&attr);
  posix_spawn_file_actions_destroy(&fa);
  close(in[0]);
  close(out[1]);
  close(err[1]);
  if (rc != 0) {
    close(in[1]);
    close(out[0]);
    close(err[0]);
    free(o->err);
    o->err = NULL;
    if (asprintf(&o->err, "cannot run %s: %s", argv[0], strerror(rc)) < 0)
      o->err = NULL;
    return -1;
  }
  (void)fcntl(in[1], F_SETFL, O_NONBLOCK);
  if (ilen == 0) {
    close(in[1]);
    in[1] = -1;
  }
  while (out[0] >= 0 || err[0] >= 0) {
    struct pollfd p[3];
    int np = 0, left = (int)(deadline - util_mono_ms());

    if (left <= 0) {
      o->timed_out = 1;
      kill(pid, SIGKILL);
      break;
    }
    p[np++] = (struct pollfd){.fd = out[0], .events = POLLIN};
    p[np++] = (struct pollfd){.fd = err[0], .events = POLLIN};
    p[np++] = (struct pollfd){.fd = in[1], .events = POLLOUT};
    if (poll(p, (nfds_t)np, left) < 0 && errno != EINTR)
      break;
    for (int i = 0; i < 2; i++) {
      int *fd = i == 0 ? &out[0] : &err[0];
      char buf[65536];
      ssize_t k;

      if (*fd < 0 || !p[i].revents)
        continue;
      k = read(*fd, buf, sizeof(buf));
      if (k > 0) {
        if (append(i == 0 ? &o->out : &o->err, i == 0 ? &olen : &elen, buf, (size_t)k) != 0)
          k = 0;
      }
      if (k == 0 || (k < 0 && errno != EINTR && errno != EAGAIN)) {
        close(*fd);
        *fd = -1;
      }
    }
    if (in[1] >= 0 && p[2].revents) {
      ssize_t k = write(in[1], input + ioff, ilen - ioff);
      if (k > 0)
        ioff += (size_t)k;
      if ((k < 0 && errno != EAGAIN && errno != EINTR) || ioff == ilen) {
        close(in[1]);
        in[1] = -1;
      }
    }
  }
  if (in[1] >= 0)
    close(in[1]);
  if (out[0] >= 0)
    close(out[0]);
  if (err[0] >= 0)
    close(err[0]);
  /* The output is closed; the exit comes within the same deadline, or it
   * is killed (a command that closed its output and lingers). */
  for (;;) {
    pid_t r = waitpid(pid, &st, WNOHANG);

    if (r == pid)
      break;
    if (r < 0 && errno != EINTR) {
      st = -1;
      break;
    }
    if (r == 0 && util_mono_ms() >= deadline && !o->timed_out) {
      o->timed_out = 1;
      kill(pid, SIGKILL);
    }
    if (r == 0)
      usleep(o->timed_out ? 10000 : 2000);
  }
  o->status = st < 0 ? -1 : WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  return 0;
}
