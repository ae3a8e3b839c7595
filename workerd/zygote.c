/*
 * zygote.c: muster-workerd --zygote, a fork server for the controller's local
 * backend (its protocol: common/zygote_proto.h).
 *
 * Loading muster-workerd and its libraries (GnuTLS's among them) costs
 * milliseconds of CPU per exec; forked from this warm process, a worker
 * starts in a fraction of that. Each worker is forked twice so that it is not the fork server's
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
#include <limits.h>
#include <poll.h>
#include <pwd.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/single_threaded.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

/* The environment variable that says the fork server set LD_BIND_NOW
 * itself (zygote_rebind()). */
#define BIND_NOW_MARK "MUSTER_ZYGOTE_BIND_NOW"

void zygote_rebind(char **argv) {
  struct stat self, named;

  if (getenv(BIND_NOW_MARK)) {
    unsetenv("LD_BIND_NOW");
    unsetenv(BIND_NOW_MARK);
    /* (run through /proc/self/exe, the kernel named it "exe": it takes
     * its binary's name again, cut to 15 bytes by the kernel) */
    prctl(PR_SET_NAME, strrchr(argv[0], '/') ? strrchr(argv[0], '/') + 1 : argv[0]);
    return;
  }
  /* Only where /proc/self/exe is this binary (not a loader that was
   * asked to run it). */
  if (getenv("LD_BIND_NOW") || stat("/proc/self/exe", &self) != 0 || stat(argv[0], &named) != 0 ||
      self.st_dev != named.st_dev || self.st_ino != named.st_ino)
    return;
  if (setenv("LD_BIND_NOW", "1", 1) == 0 && setenv(BIND_NOW_MARK, "1", 1) == 0)
    execv("/proc/self/exe", argv);
  /* (not run again: it serves all the same, binding lazily) */
  unsetenv("LD_BIND_NOW");
  unsetenv(BIND_NOW_MARK);
}

/* ---- the accounts workers run as, looked up ahead in a child ---- */

#define LOOKUP_RETRY_MS 10000 /* an account whose lookup failed: asked again after */
#define LOOKUP_LIMIT_S 10     /* a lookup's child is ended (SIGALRM) after */

/* The one lookup under way (fd: the read end of its child's pipe, -1:
 * none), and the last that failed. */
static struct {
  int fd;
  int64_t started_ms;
  char name[sizeof(((struct run_account *)0)->name)];
  char failed[sizeof(((struct run_account *)0)->name)];
  int64_t failed_ms;
} lk = {.fd = -1};

/* Reads the certificate authorities the worker of request req (n bytes, as
 * for zygote_fork()) will trust, when its controller's URL is https://,
 * so that every worker inherits them (hc_tls_prewarm(), done once per CA
 * file) instead of reading them itself. */
static void tls_prime(const char *req, size_t n) {
  static const char url[] = "MUSTER_CONTROLLER_URL=https://",
                    ca_key[] = "MUSTER_CA_FILE=", ca_key_name[] = "MUSTER_CA_FILE";
  const char *ca = getenv(ca_key_name); /* (the server's, unless the request sets one) */
  bool https = false;

  for (size_t off = 0; off < n;) {
    size_t len = strnlen(req + off, n - off);

    if (len >= strlen(url) && strncmp(req + off, url, strlen(url)) == 0)
      https = true;
    else if (strncmp(req + off, ca_key, strlen(ca_key)) == 0)
      ca = req + off + strlen(ca_key);
    off += len + 1;
  }
  if (https)
    hc_tls_prewarm(ca ? ca : "");
}

/* Has the account the worker of request req (n bytes, as for zygote_fork())
 * will run its commands as looked up, unless an answer for it is kept or
 * on its way: in a child, which sends the answer down a pipe, so that a
 * slow name service never holds up a fork. Until it is kept, workers ask
 * themselves, as a directly started workerd does (run_account.c). */
static void account_prime(int sock, const char *req, size_t n) {
  static const char key[] = "MUSTER_RUN_AS=";
  const char *name = geteuid() == 0 ? MUSTER_DEFAULT_ACCOUNT : NULL;
  struct run_account a;
  int p[2];
  pid_t pid;

  for (size_t off = 0; off < n;) {
    size_t len = strnlen(req + off, n - off);

    if (len > strlen(key) && strncmp(req + off, key, strlen(key)) == 0)
      name = req + off + strlen(key);
    off += len + 1;
  }
  if (!name || lk.fd >= 0 || !__libc_single_threaded || strlen(name) >= sizeof(lk.name) ||
      run_account_cached(name, &a) == 0 ||
      (strcmp(name, lk.failed) == 0 && util_mono_ms() - lk.failed_ms < LOOKUP_RETRY_MS))
    return;
  if (pipe2(p, O_CLOEXEC | O_NONBLOCK) != 0)
    return;
  lk.started_ms = util_mono_ms();
  pid = fork();
  if (pid == 0) {
    close(sock);
    close(p[0]);
    /* A name service that hangs ends this child, not the lookups. */
    signal(SIGALRM, SIG_DFL);
    alarm(LOOKUP_LIMIT_S);
    /* (one write of under PIPE_BUF bytes: all or nothing) */
    if (run_account_ask(name, &a) == 0 && a.keep && write(p[1], &a, sizeof(a)) < 0)
      _exit(1);
    _exit(0);
  }
  close(p[1]);
  if (pid < 0) {
    close(p[0]);
    return;
  }
  lk.fd = p[0];
  snprintf(lk.name, sizeof(lk.name), "%s", name);
}

/* Takes the answer of the lookup under way, once its child has sent it
 * or ended without (no such account, or one not to keep). */
static void account_take(void) {
  struct run_account a;
  ssize_t got = read(lk.fd, &a, sizeof(a));

  if (got < 0 && errno == EAGAIN)
    return; /* not yet */
  if (got == (ssize_t)sizeof(a) && strcmp(a.name, lk.name) == 0) {
    run_account_store(&a, lk.started_ms);
  } else {
    snprintf(lk.failed, sizeof(lk.failed), "%s", lk.name);
    lk.failed_ms = util_mono_ms();
  }
  close(lk.fd);
  lk.fd = -1;
}

_Static_assert(sizeof(struct run_account) <= PIPE_BUF, "an account's answer fits one pipe write");

/* ---- forking ---- */

/* The middle process's part of zygote_fork(): forks the worker, leaves
 * its pid (or -errno) in *answer and exits; returns 0 in the worker. Not
 * instrumented by AddressSanitizer: its calls before _exit() would
 * otherwise clear the poisoning of the stack it shares with the fork
 * server. */
static __attribute__((noinline, no_sanitize_address)) pid_t middle(int sock,
                                                                   volatile pid_t *answer) {
  pid_t w;

  /* Reaped by the kernel is right for this middle process, not for its
   * child: a worker that died before this process exits must stay a
   * zombie for the controller to reap and see. (A vfork child has its own
   * copy of the signal dispositions and of the descriptors.) */
  signal(SIGCHLD, SIG_DFL);
  close(sock);
  w = fork();
  if (w != 0) {
    *answer = w < 0 ? -errno : w;
    _exit(0);
  }
  return 0;
}

/* Starts one worker from a request of the controller's local backend: req
 * holds n bytes of NUL-terminated "NAME=value" strings, the worker's
 * settings, and ZYGOTE_LOG_FILE, where its output goes. The worker is
 * forked twice so that it is not our child: its parent exits at once and
 * the controller, a child subreaper, adopts it and reaps it, exactly as if
 * it had started it itself. The worker runs run_worker() and exits with
 * what it returns. Returns the worker's pid, -errno if none was forked, or
 * 0 if that is unknown (the middle process was killed before it said).
 *
 * The middle process is a vfork(): it shares this process's memory (we
 * are suspended until it exits), so that only the worker's fork copies
 * the address space, and nothing of the middle's needs tearing down. Its
 * fork() is glibc's, so the worker's thread id is its own and the child's
 * fork handlers (GnuTLS's, p11-kit's) run in it; the prepare and parent
 * handlers run in the middle, on our memory, as our own fork would run
 * them. It calls nothing but signal(), close(), fork() and _exit(), and
 * returns from nothing. Only a process of one thread may do this (no lock
 * that fork() takes can then be held): one that has started a thread
 * answers -ENOTSUP, and the backend stops using it. */
static MUST_CHECK pid_t zygote_fork(int sock, char *req, size_t n, int (*run_worker)(void)) {
  static volatile pid_t mid_pid; /* the middle's answer */
  pid_t mid;

  mid_pid = 0;
  mid = __libc_single_threaded ? vfork() : -2;
  if (mid == -2)
    return -ENOTSUP; /* (the backend starts this worker itself) */
  if (mid < 0)
    return -errno;
  if (mid == 0 && middle(sock, &mid_pid) == 0) {
    const char *logfile = NULL;
    int fd;

    /* The fork server ignores SIGCHLD (its children are reaped by the
     * kernel); a worker must not: it waits for its script. */
    signal(SIGCHLD, SIG_DFL);
    if (lk.fd >= 0)
      close(lk.fd); /* (a lookup's pipe is the server's) */

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
  /* The name service's modules and its configuration are loaded here,
   * once, and every fork inherits them (a worker that looks its account
   * up itself, and the lookups of account_prime()), instead of each
   * loading them again (3 ms a worker, a third of a launch, with
   * nss-systemd). */
  {
    struct passwd *pw = getpwnam(MUSTER_DEFAULT_ACCOUNT);
    gid_t groups[8];
    int ng = 8;

    if (pw)
      (void)getgrouplist(pw->pw_name, pw->pw_gid, groups, &ng);
    (void)getgrgid(0);
  }
  /* The middle processes of zygote_fork() and the lookups' children are
   * reaped by the kernel. */
  signal(SIGCHLD, SIG_IGN);
  /* Says it is ready (and is a fork server at all). */
  if (send(sock, &hello, sizeof(hello), MSG_NOSIGNAL) < 0)
    return 1;
  for (;;) {
    struct pollfd p[2] = {{.fd = sock, .events = POLLIN}, {.fd = lk.fd, .events = POLLIN}};
    ssize_t n;
    pid_t pid;

    if (poll(p, lk.fd >= 0 ? 2 : 1, -1) < 0) {
      if (errno == EINTR)
        continue;
      return 1;
    }
    if (lk.fd >= 0 && p[1].revents)
      account_take();
    if (!p[0].revents)
      continue;
    n = recv(sock, req, sizeof(req) - 1, MSG_DONTWAIT);
    if (n == 0)
      return 0;
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN)
        continue;
      return errno == ECONNRESET ? 0 : 1;
    }
    req[n] = '\0';
    account_prime(sock, req, (size_t)n);
    tls_prime(req, (size_t)n);
    pid = zygote_fork(sock, req, (size_t)n, run_worker);
    if (pid == 0) {
      /* Whether a worker runs is unknown: ending makes the backend say
       * so, and not start it again. */
      fprintf(stderr, "muster-workerd: the fork server's middle process died before it said "
                      "whether it forked the worker\n");
      return 1;
    }
    if (send(sock, &pid, sizeof(pid), MSG_NOSIGNAL) < 0)
      return 0;
  }
}
