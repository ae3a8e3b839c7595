/*
 * zygote.c: muster-workerd --zygote, a fork server for the controller's local
 * backend (its protocol: common/zygote_proto.h).
 *
 * Loading libcurl and its dozens of libraries costs several milliseconds of
 * CPU per exec; forked from this warm process, a worker starts in a fraction
 * of that. Each worker is forked twice so that it is not the fork server's
 * child: the controller, a child subreaper, adopts and reaps it as if it had
 * started it itself, and it runs worker_main() (passed in by main.c as
 * run_worker) as a directly started one would.
 */
#include "workerd.h"

#include "account.h"
#include "zygote_proto.h"

#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <pwd.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <unistd.h>

/* Looks up the account the worker of request req (n bytes, as for
 * zygote_fork()) will run its commands as, as its config_load() will, so
 * that it finds the answer in the memory it inherits (run_account.c). */
static void account_prime(const char *req, size_t n) {
  static const char key[] = "MUSTER_RUN_AS=";
  const char *name = geteuid() == 0 ? MUSTER_DEFAULT_ACCOUNT : NULL;
  struct run_account a;

  for (size_t off = 0; off < n;) {
    size_t len = strnlen(req + off, n - off);

    if (len > strlen(key) && strncmp(req + off, key, strlen(key)) == 0)
      name = req + off + strlen(key);
    off += len + 1;
  }
  /* (no account: the worker says so, in its own log) */
  if (name && run_account_lookup(name, &a) != 0)
    return;
}

/* Starts one worker from a request of the controller's local backend: req
 * holds n bytes of NUL-terminated "NAME=value" strings, the worker's
 * settings, and ZYGOTE_LOG_FILE, where its output goes. The worker is
 * forked twice so that it is not our child: its parent exits at once and
 * the controller, a child subreaper, adopts it and reaps it, exactly as if
 * it had started it itself. The worker runs run_worker() and exits with
 * what it returns. Returns the worker's pid or -errno.
 *
 * The middle process is a vfork(): it shares this process's memory (we
 * are suspended until it exits), so that only the worker's fork copies
 * the address space, and nothing of the middle's needs tearing down; its
 * fork() runs glibc's fork handlers as our own would, and it leaves the
 * worker's pid in our memory, where we read it once it has exited. It
 * calls nothing but signal(), close(), fork() and _exit(), returns from
 * nothing, and writes no memory but mid_pid; this process has one
 * thread, so no lock that fork() takes can be held. */
static MUST_CHECK pid_t zygote_fork(int sock, char *req, size_t n, int (*run_worker)(void)) {
  static volatile pid_t mid_pid; /* the middle's answer: the worker's pid or -errno */
  pid_t mid;

  account_prime(req, n);
  mid_pid = -EAGAIN;
  mid = vfork();
  if (mid < 0)
    return -errno;
  if (mid == 0) {
    pid_t w;

    /* Reaped by the kernel is right for this middle process, not for its
     * child: a worker that died before this process exits must stay a
     * zombie for the controller to reap and see. (A vfork child has its
     * own copy of the signal dispositions and of the descriptors.) */
    signal(SIGCHLD, SIG_DFL);
    close(sock);
    w = fork();
    if (w == 0) {
      const char *logfile = NULL;
      int fd;

      /* The fork server ignores SIGCHLD (its children are reaped by the
       * kernel); a worker must not: it waits for its script. */
      signal(SIGCHLD, SIG_DFL);

      setsid();
      for (size_t off = 0; off < n;) {
        char *kv = req + off;
        size_t len = strnlen(kv, n - off);
        char *eq = memchr(kv, '=', len);

        /* req[n] is NUL, so the last string is terminated too. */
        off += len + 1;
        if (!eq)
          continue;
        *eq = '\0';
        if (strcmp(kv, ZYGOTE_LOG_FILE) == 0)
          logfile = eq + 1;
        else
          setenv(kv, eq + 1, 1);
      }
      fd = open("/dev/null", O_RDONLY);
      if (fd >= 0 && fd != 0) {
        dup2(fd, 0);
        close(fd);
      }
      fd = logfile ? open(logfile, O_WRONLY | O_CREAT | O_APPEND, 0600) : -1;
      if (fd >= 0) {
        dup2(fd, 1);
        dup2(fd, 2);
        if (fd > 2)
          close(fd);
      }
      _exit(run_worker());
    }
    mid_pid = w < 0 ? -errno : w;
    _exit(0);
  }
  /* The middle has exited (vfork() returns then); the kernel reaps it
   * (SIGCHLD is ignored here). */
  return mid_pid;
}

/* muster-workerd --zygote: serves the controller's local backend. Requests
 * come as datagrams on fd ZYGOTE_FD (a SOCK_SEQPACKET socket); each gets the
 * pid (or -errno) back; each worker runs run_worker(). It ends when the
 * controller closes the socket; the workers it started live on. */
int zygote_main(int (*run_worker)(void)) {
  char req[ZYGOTE_REQ_MAX + 1];
  int sock = ZYGOTE_FD;

  pid_t hello = ZYGOTE_HELLO;

  signal(SIGPIPE, SIG_IGN);
  /* The dynamic linker has bound every symbol (zygote_proto.h): no
   * worker's command inherits the setting. */
  if (getenv(ZYGOTE_BIND_NOW)) {
    unsetenv("LD_BIND_NOW");
    unsetenv(ZYGOTE_BIND_NOW);
  }
  /* Every worker looks its account up (config.c): the name service's
   * modules and its configuration are loaded here, once, and every fork
   * inherits them, instead of each worker loading them again (3 ms a
   * worker, a third of a launch, with nss-systemd). */
  {
    struct passwd *pw = getpwnam(MUSTER_DEFAULT_ACCOUNT);
    gid_t groups[8];
    int ng = 8;

    if (pw)
      (void)getgrouplist(pw->pw_name, pw->pw_gid, groups, &ng);
    (void)getgrgid(0);
  }
  /* The middle processes of zygote_fork() are reaped by the kernel. */
  signal(SIGCHLD, SIG_IGN);
  /* Says it is ready (and is a fork server at all). */
  if (send(sock, &hello, sizeof(hello), MSG_NOSIGNAL) < 0)
    return 1;
  for (;;) {
    ssize_t n = recv(sock, req, sizeof(req) - 1, 0);
    pid_t pid;

    if (n == 0)
      return 0;
    if (n < 0) {
      if (errno == EINTR)
        continue;
      return errno == ECONNRESET ? 0 : 1;
    }
    req[n] = '\0';
    pid = zygote_fork(sock, req, (size_t)n, run_worker);
    if (send(sock, &pid, sizeof(pid), MSG_NOSIGNAL) < 0)
      return 0;
  }
}
