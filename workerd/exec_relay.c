/*
 * exec_relay.c: an exec command and the pipes between it and its
 * connection. The command is started (ex_spawn(), through child.c) in a
 * process group of its own with three pipes: stdin is fed from I frames
 * (ex_stdin_write()), stdout and stderr are read into O and E frames
 * (ex_pipe_read()) while the connection holds less than EX_OUT_HIGH unsent
 * bytes, and copied, a whole line at a time, into the worker's own log
 * (logship.c's streams), so that `muster logs` has them too. The command is
 * signalled through its group (ex_signal()) and waited for by its own pid
 * (ex_child_reap()), never by another's. When the connection moves on is
 * exec_server.c's to decide.
 */
#include "exec_internal.h"

#include "muster_errors.h"
#include "util.h"

#include <errno.h>
#include <fcntl.h>
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
/* Starting the command                                                     */

/* Starts cmd's command for c: its stdin, stdout and stderr on pipes (c's
 * stdin_fd, out_fd and err_fd once it runs), in a process group of its own
 * (c->pid), killed with workerd. Waits only until it has executed or failed
 * to. Returns 0; or MUSTER_E_IO, with *code (126, or 127 for a program not
 * found) and err (size bytes) for the refusal, when nothing runs (a child
 * that failed before executing is reaped here). */
MUST_CHECK int ex_spawn(struct ex_conn *c, const struct ex_cmd *cmd, int *code, char *err,
                        size_t size) {
  int inp[2] = {-1, -1}, outp[2] = {-1, -1}, errp[2] = {-1, -1}, statp[2] = {-1, -1};
  const char *cwd = cmd->cwd;
  struct exec_status st;
  pid_t pid;
  int rc = MUSTER_E_IO;

  *code = 126;
  if (pipe2(inp, O_CLOEXEC) != 0 || pipe2(outp, O_CLOEXEC) != 0 || pipe2(errp, O_CLOEXEC) != 0 ||
      pipe2(statp, O_CLOEXEC) != 0 || fcntl(inp[1], F_SETFL, O_NONBLOCK) != 0 ||
      fcntl(outp[0], F_SETFL, O_NONBLOCK) != 0 || fcntl(errp[0], F_SETFL, O_NONBLOCK) != 0) {
    snprintf(err, size, "cannot start \"%s\": %s", c->name, strerror(errno));
    goto out;
  }

  {
    struct child_spec cs = {.in_fd = inp[0],
                            .out_fd = outp[1],
                            .err_fd = errp[1],
                            .status_fd = statp[1],
                            .argv = cmd->argv,
                            .envp = cmd->envp,
                            .cwd = cwd,
                            .own_group = true,
                            .parent = getpid()};

    child_spec_worker(&cs);

    pid = child_spawn(&cs);
  }
  if (pid > 0)
    wd.exec_started = true;
  if (pid < 0) {
    snprintf(err, size, "cannot start \"%s\": %s", c->name, strerror(errno));
    goto out;
  }
  /* The child does the same; whichever runs first makes the group, so it
   * exists before we could signal it. (EACCES once it has exec'd: fine.) */
  setpgid(pid, pid);
  fd_close(&statp[1]);
  if (child_exec_failed(statp[0], &st)) {
    *code = (st.stage == STAGE_EXEC && st.err == ENOENT) || st.stage == STAGE_PATH ? 127 : 126;

    /* It has written its status and is exiting: reap it here, so that it
     * is never mistaken for a running command. */
    while (waitpid(pid, NULL, 0) < 0 && errno == EINTR)
      ;
    child_failure_sentence(&st, cwd, NULL, cmd->argv, cmd->envp, err, size);
    goto out;
  }
  c->pid = pid;
  c->stdin_fd = inp[1];
  c->out_fd = outp[0];
  c->err_fd = errp[0];
  inp[1] = outp[0] = errp[0] = -1;
  rc = 0;
out:
  fd_close_pair(inp);
  fd_close_pair(outp);
  fd_close_pair(errp);
  fd_close_pair(statp);
  return rc;
}

/* ------------------------------------------------------------------------ */
/* The worker's log                                                         */

/* Copies n bytes of c's output on stream i (0 stdout, 1 stderr) into the
 * worker's log of that stream, whole lines at a time, so that the lines of
 * commands that run side by side, and of the worker's own command, do not
 * cut into each other. What follows the last newline waits in c's tail for
 * the rest of its line; a line longer than the tail holds goes in pieces.
 * Never blocks the relay: the log's ring drops its oldest bytes when full
 * (stream_append()), and without memory the log misses this output. */
static void ex_log_tee(struct ex_conn *c, int i, const char *p, size_t n, int64_t now) {
  struct stream *s = i == 0 ? &wd.out : &wd.err;
  const char *nl = memrchr(p, '\n', n);
  size_t head = nl ? (size_t)(nl - p) + 1 : 0;

  if (stream_open(s) != 0)
    return;
  if (head == 0 && c->tail[i].len + n > EX_TAIL_MAX)
    head = n;
  if (head > 0) {
    stream_append(s, c->tail[i].buf, c->tail[i].len, now);
    c->tail[i].len = 0;
    stream_append(s, p, head, now);
  }
  if (head == n)
    return;
  if (!c->tail[i].buf && !(c->tail[i].buf = malloc(EX_TAIL_MAX))) {
    stream_append(s, p + head, n - head, now);
    return;
  }
  memcpy(c->tail[i].buf + c->tail[i].len, p + head, n - head);
  c->tail[i].len += n - head;
}

/* Puts the unended last line of c's stream i into the worker's log, ended
 * with a newline so that the next command's first line starts a line of its
 * own, and frees the tail. */
static void ex_log_tail_end(struct ex_conn *c, int i) {
  struct stream *s = i == 0 ? &wd.out : &wd.err;

  if (c->tail[i].len > 0 && stream_open(s) == 0) {
    int64_t now = util_mono_ms();

    stream_append(s, c->tail[i].buf, c->tail[i].len, now);
    stream_append(s, "\n", 1, now);
  }
  free(c->tail[i].buf);
  c->tail[i].buf = NULL;
  c->tail[i].len = 0;
}

/* Closes the command's pipes, drops unwritten stdin and puts what is left of
 * an unended output line into the worker's log. */
void ex_pipes_close(struct ex_conn *c) {
  fd_close(&c->stdin_fd);
  fd_close(&c->out_fd);
  fd_close(&c->err_fd);
  free(c->pend);
  c->pend = NULL;
  c->pend_len = c->pend_off = 0;
  ex_log_tail_end(c, 0);
  ex_log_tail_end(c, 1);
}

/* ------------------------------------------------------------------------ */
/* Relaying                                                                 */

/* Writes pending stdin into the command's stdin pipe. A command that closed
 * its stdin (EPIPE) loses the rest, as it would from a terminal. */
void ex_stdin_write(struct ex_conn *c) {
  while (c->pend && c->stdin_fd >= 0) {
    ssize_t n = write(c->stdin_fd, c->pend + c->pend_off, c->pend_len - c->pend_off);

    if (n > 0) {
      c->pend_off += (size_t)n;
      if (c->pend_off == c->pend_len) {
        free(c->pend);
        c->pend = NULL;
        c->pend_len = c->pend_off = 0;
      }
      continue;
    }
    if (n < 0 && errno == EINTR)
      continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
      return;
    fd_close(&c->stdin_fd);
  }
  if (c->stdin_fd < 0 && c->pend) {
    free(c->pend);
    c->pend = NULL;
    c->pend_len = c->pend_off = 0;
  }
}

/* Reads the command's output pipe *fd into type frames while c's buffer is
 * under EX_OUT_HIGH, copying each read into the worker's log; closes *fd at
 * end of file. */
void ex_pipe_read(struct ex_conn *c, int *fd, char type, int64_t now) {
  int i = type == EXEC_FRAME_STDOUT ? 0 : 1;

  for (int k = 0; k < EX_READS_PER_WAKE && *fd >= 0 && c->out_len < EX_OUT_HIGH; k++) {
    unsigned char *w = ex_out_room(c, EXEC_WIRE_HDR_LEN + EX_READ_CHUNK);
    ssize_t n;

    if (!w)
      return; /* out of memory: the pipe stays full until it passes */
    n = read(*fd, w + EXEC_WIRE_HDR_LEN, EX_READ_CHUNK);
    if (n > 0) {
      exec_wire_put_hdr(w, type, (size_t)n);
      ex_log_tee(c, i, (const char *)w + EXEC_WIRE_HDR_LEN, (size_t)n, now);
      c->out_len += EXEC_WIRE_HDR_LEN + (size_t)n;
      continue;
    }
    if (n < 0 && errno == EINTR)
      continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
      return;
    fd_close(fd);
    ex_log_tail_end(c, i);
  }
}

/* ------------------------------------------------------------------------ */
/* Signals and the end                                                      */

/* Sends sig to c's command's process group if the command is still there. */
void ex_signal(struct ex_conn *c, int sig) {
  if (c->pid > 0 && !c->exited)
    kill(-c->pid, sig);
}

/* Collects the exit of c's command if it has exited. It is waited for by
 * its own pid, so the script's child is left to child_reap(). */
void ex_child_reap(struct ex_conn *c, int64_t now) {
  pid_t r;
  int st;

  if (c->pid <= 0 || c->exited)
    return;
  do
    r = waitpid(c->pid, &st, WNOHANG);
  while (r < 0 && errno == EINTR);
  if (r == 0)
    return;
  c->exited = true;
  c->wait_status = r < 0 ? -1 : st;
  c->drain_until_ms = now + EX_DRAIN_MS;
  if (c->state == EX_ORPHAN) {
    /* What the command left in its group goes with it. */
    kill(-c->pid, SIGKILL);
    c->kill_at_ms = INT64_MAX;
  }
}

/* Kills c's command with its group, if it still runs, and reaps it. */
void ex_child_kill(struct ex_conn *c) {
  if (c->pid > 0 && !c->exited) {
    kill(-c->pid, SIGKILL);
    while (waitpid(c->pid, NULL, 0) < 0 && errno == EINTR)
      ;
  }
}
