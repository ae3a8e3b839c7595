/*
 * signals.c: muster-workerd's signals, turned into bytes on a self-pipe
 * (SIGCHLD, SIGTERM, SIGINT) that the main loop and backoff_wait() poll
 * (wd.sig_read_fd). It calls no other module of workerd.
 */
#include "workerd.h"

#include "log.h"
#include "muster_errors.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdbool.h>
#include <string.h>
#include <sys/types.h>
#include <unistd.h>

/* The write end of the self-pipe, read by the signal handler. It is set once
 * before any handler is installed and never changes afterwards. */
static int sig_write_fd = -1;

/* Turns a signal into one byte on the self-pipe; the main loop does the work.
 * A full pipe loses the byte, which is harmless: one pending byte per kind
 * of signal is all the loop needs. */
static void on_signal(int signo) {
  int saved = errno;
  unsigned char b = (unsigned char)signo;
  ssize_t n = write(sig_write_fd, &b, 1);

  (void)n;
  errno = saved;
}

/* Creates the self-pipe and installs the handlers for SIGCHLD, SIGTERM and
 * SIGINT; ignores SIGPIPE, which the child gets back at its default.
 * Returns 0 or MUSTER_E_IO (logged). */
MUST_CHECK int signals_install(void) {
  struct sigaction sa;
  int p[2];

  if (pipe2(p, O_CLOEXEC | O_NONBLOCK) != 0) {
    LOG(LOG_ERROR, "cannot create the signal pipe: %s", strerror(errno));
    return MUSTER_E_IO;
  }
  wd.sig_read_fd = p[0];
  sig_write_fd = p[1];
  memset(&sa, 0, sizeof(sa));
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  /* Only an exit of the child matters, not its being stopped or continued. */
  sa.sa_flags = SA_NOCLDSTOP;
  if (sigaction(SIGCHLD, &sa, NULL) != 0 || sigaction(SIGTERM, &sa, NULL) != 0 ||
      sigaction(SIGINT, &sa, NULL) != 0)
    return MUSTER_E_IO;
  sa.sa_handler = SIG_IGN;
  sa.sa_flags = 0;
  if (sigaction(SIGPIPE, &sa, NULL) != 0)
    return MUSTER_E_IO;
  return 0;
}

/* Empties the self-pipe. Sets *child if SIGCHLD arrived and *term to SIGTERM
 * or SIGINT if one of them did (left alone otherwise). */
void signals_take(bool *child, int *term) {
  unsigned char buf[64];
  ssize_t n;

  while ((n = read(wd.sig_read_fd, buf, sizeof(buf))) > 0) {
    for (ssize_t i = 0; i < n; i++) {
      if (buf[i] == SIGCHLD)
        *child = true;
      else if (buf[i] == SIGTERM || buf[i] == SIGINT)
        *term = buf[i];
    }
  }
}
