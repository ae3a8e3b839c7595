/*
 * child.c: starting child processes, for the worker's command (its script)
 * and for the exec channel's commands alike.
 *
 * Everything a child needs is prepared before fork() (struct child_spec); the
 * child (child_run()) only wires its descriptors, resets its signals and
 * executes, allocating nothing. Whether exec succeeded comes back through a
 * close-on-exec status pipe (child_exec_failed()). The worker's command
 * (command_start(), child_reap()) is workerd's own child, in its process
 * group; an exec command leads a group of its own.
 */
#include "cgroup_mem.h"
#include "workerd.h"

#include "log.h"
#include "muster_errors.h"
#include "util.h"

#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <limits.h>
#include <linux/capability.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

/* ------------------------------------------------------------------------ */
/* Helpers                                                                  */

/* Frees a NULL-terminated array of strings and the strings; NULL is fine. */
void strv_free(char **v) {
  if (!v)
    return;
  for (char **p = v; *p; p++)
    free(*p);
  free(v);
}

/* Closes *fd if it is open and marks it closed. */
void fd_close(int *fd) {
  if (*fd >= 0)
    close(*fd);
  *fd = -1;
}

void fd_close_pair(int p[2]) {
  fd_close(&p[0]);
  fd_close(&p[1]);
}

/* ------------------------------------------------------------------------ */
/* Starting a child                                                         */

/* ---- confinement (the local backend's isolation) ----
 *
 * The command runs as process 2 of a PID namespace of its own, in mount and
 * IPC namespaces of its own where the controller's state directory is an
 * empty read-only tmpfs and /proc shows that namespace only (the file
 * system: sandbox.c). Three processes:
 *   A, workerd's child (its pid is the command's for workerd): unshares the
 *     namespaces, forks B, relays signals to it, and ends as the command
 *     ended (the same exit code, or killed by the same signal);
 *   B, process 1 of the new namespace: mounts its /proc, forks C, relays
 *     signals to it, reaps orphans, and tells A how C ended; its end ends
 *     every process left in the namespace;
 *   C, the command: drops the capabilities a container would not have
 *     (Docker's default set is kept), then executes.
 * Process 1 of a namespace ignores signals it has no handler for, which is
 * why the command is not process 1. None of this allocates. */

static volatile pid_t relay_to;

static void relay(int sig) {
  int saved = errno;

  if (relay_to > 0)
    kill(relay_to, sig);
  errno = saved;
}

static const int relayed[] = {SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2, SIGCONT};

static void relay_signals(pid_t to) {
  struct sigaction sa;

  memset(&sa, 0, sizeof(sa));
  sa.sa_handler = relay;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  relay_to = to;
  for (size_t i = 0; i < sizeof(relayed) / sizeof(relayed[0]); i++)
    sigaction(relayed[i], &sa, NULL);
}

/* Waits for child pid (reaping any other child meanwhile: B adopts the
 * namespace's orphans). Returns its wait status, or -1. */
static int wait_child(pid_t pid) {
  int st;

  for (;;) {
    pid_t w = waitpid(-1, &st, 0);
    if (w == pid)
      return st;
    if (w < 0 && errno != EINTR)
      return -1;
  }
}

/* Closes every descriptor from 3 up but keep (a pipe end) and keep2
 * (close_range where the kernel has it, else one by one). */
static void close_all_but(int keep, int keep2) {
  int lo = keep < keep2 ? keep : keep2, hi = keep < keep2 ? keep2 : keep;

  if ((lo > 3 && close_range(3, (unsigned)lo - 1, 0) != 0) ||
      (hi > lo + 1 && close_range((unsigned)lo + 1, (unsigned)hi - 1, 0) != 0) ||
      close_range((unsigned)hi + 1, ~0U, 0) != 0) {
    long max = sysconf(_SC_OPEN_MAX);
    if (max < 0 || max > 65536)
      max = 65536;
    for (int fd = 3; fd < max; fd++)
      if (fd != keep && fd != keep2)
        close(fd);
  }
}

/* A and B: hold none of workerd's descriptors (the command's output pipes,
 * the exec status pipe, its sockets) nor its secrets, relay signals to
 * child pid (signals were blocked since before it was forked) until it
 * ends, and return its wait status. keep, keep2: their own pipe ends. */
static int relay_until_end(const struct child_spec *cs, pid_t pid, int keep, int keep2) {
  sigset_t none;
  int st;

  close(cs->status_fd); /* (close_all_but would; this one matters most) */
  close(0);
  close(1);
  close(2);
  close_all_but(keep, keep2);
  explicit_bzero(wd.token, sizeof(wd.token));
  if (wd.exec_token)
    explicit_bzero(wd.exec_token, strlen(wd.exec_token));
  relay_signals(pid);
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, NULL);
  st = wait_child(pid);
  relay_to = 0; /* its pid may be someone else's now */
  return st;
}

/* Ends this process as status says the command ended. */
__attribute__((noreturn)) static void end_as(int status) {
  if (status != -1 && WIFSIGNALED(status)) {
    int sig = WTERMSIG(status);
    struct rlimit none = {0, 0};
    struct sigaction dfl;
    sigset_t one;

    setrlimit(RLIMIT_CORE, &none); /* the command's core, not a copy of workerd's */
    memset(&dfl, 0, sizeof(dfl));
    dfl.sa_handler = SIG_DFL;
    sigaction(sig, &dfl, NULL);
    sigemptyset(&one);
    sigaddset(&one, sig);
    sigprocmask(SIG_UNBLOCK, &one, NULL);
    kill(getpid(), sig);
    _exit(128 + sig); /* a signal that does not end a process */
  }
  _exit(status != -1 && WIFEXITED(status) ? WEXITSTATUS(status) : 127);
}

/* An exec'd command's confinement: the mounts and capabilities of the
 * worker's command, but no PID namespace of its own, so that the ranks of
 * one training on this host (each an exec'd command, in the same or other
 * workers) still share memory as Open MPI expects (its shared-memory
 * transport fails across PID namespaces). Returns 0, or -1 with st
 * filled. */
static int confine_exec(const struct child_spec *cs, struct exec_status *st) {
  st->stage = STAGE_CONFINE;
  if (confine_mounts(cs, CLONE_NEWNS | CLONE_NEWIPC) != 0 || confine_caps() != 0) {
    st->err = errno;
    return -1;
  }
  return 0;
}

/* Returns 0 in C (the command's process, ready to execute), or -1 in A
 * with st filled (nothing was forked). B reports its own failures through
 * the status pipe and exits. Every signal stays blocked until the relays
 * are in place. */
static int confine(const struct child_spec *cs, struct exec_status *st) {
  int sp[2] = {-1, -1}, lp[2] = {-1, -1}, status;
  sigset_t all;
  pid_t b, c;

  sigfillset(&all);
  sigprocmask(SIG_SETMASK, &all, NULL);
  st->stage = STAGE_CONFINE;
  if (confine_mounts(cs, CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWIPC) != 0)
    goto fail;
  if (pipe2(sp, O_CLOEXEC) != 0 || pipe2(lp, O_CLOEXEC) != 0)
    goto fail;
  b = _Fork();
  if (b < 0)
    goto fail;
  if (b > 0) { /* A: holds lp[1] while it lives */
    close(sp[1]);
    close(lp[0]);
    status = relay_until_end(cs, b, sp[0], lp[1]);
    /* C's status, from B; none if B itself was killed */
    if (read(sp[0], &status, sizeof(status)) != (ssize_t)sizeof(status) && status == -1)
      _exit(127);
    end_as(status);
  }
  /* B: process 1 of the namespace; dies with A (and if A died before the
   * death signal was set, lp shows it) */
  close(sp[0]);
  close(lp[1]);
  if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0)
    goto fail_b;
  {
    struct pollfd alive = {.fd = lp[0], .events = POLLIN};
    if (poll(&alive, 1, 0) != 0)
      _exit(127);
  }
  if (mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL) != 0 ||
      confine_read_only("/proc/sys") != 0 || confine_read_only("/proc/sysrq-trigger") != 0 ||
      confine_read_only("/proc/bus") != 0 || confine_read_only("/proc/irq") != 0)
    goto fail_b;
  c = _Fork();
  if (c < 0)
    goto fail_b;
  if (c > 0) {
    ssize_t n;
    status = relay_until_end(cs, c, sp[1], lp[0]);
    n = write(sp[1], &status, sizeof(status));
    (void)n;
    _exit(0);
  }
  /* C: the command */
  close(sp[1]);
  close(lp[0]);
  {
    struct sigaction dfl;
    sigset_t none;

    if (confine_caps() != 0)
      goto fail_c;
    memset(&dfl, 0, sizeof(dfl));
    dfl.sa_handler = SIG_DFL;
    for (size_t i = 0; i < sizeof(relayed) / sizeof(relayed[0]); i++)
      sigaction(relayed[i], &dfl, NULL);
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
  }
  return 0;
fail:
  st->err = errno;
  if (sp[0] >= 0) {
    close(sp[0]);
    close(sp[1]);
  }
  if (lp[0] >= 0) {
    close(lp[0]);
    close(lp[1]);
  }
  return -1;
fail_b:
fail_c:
  st->err = errno;
  {
    ssize_t n = write(cs->status_fd, st, sizeof(*st));
    (void)n;
    _exit(127);
  }
}

/* Fills in what every command of the worker shares (before fork(): the
 * child allocates and formats nothing): its isolation (MUSTER_CONFINE: the
 * directory to hide, the user namespace's maps when workerd is not root,
 * the user's own buses and engines to block) and its account
 * (MUSTER_RUN_AS). */
void child_spec_worker(struct child_spec *cs) {
  unsigned uid = (unsigned)geteuid(), gid = (unsigned)getegid();

  cs->run_uid = wd.run_uid;
  cs->run_gid = wd.run_gid;
  cs->run_groups = wd.run_groups;
  cs->n_run_groups = wd.n_run_groups;
  if (!wd.confine[0])
    return;
  cs->confine = wd.confine;
  cs->scratch = wd.scratch.lock_fd >= 0 ? wd.scratch.tmp : NULL;
  cs->home = wd.home[0] ? wd.home : NULL;
  if (uid != 0) {
    snprintf(cs->uid_map, sizeof(cs->uid_map), "%u %u 1", uid, uid);
    snprintf(cs->gid_map, sizeof(cs->gid_map), "%u %u 1", gid, gid);
  }
  snprintf(cs->user_sockets[0], sizeof(cs->user_sockets[0]), "/run/user/%u/bus", uid);
  snprintf(cs->user_sockets[1], sizeof(cs->user_sockets[1]), "/run/user/%u/systemd/private", uid);
  snprintf(cs->user_sockets[2], sizeof(cs->user_sockets[2]), "/run/user/%u/podman/podman.sock",
           uid);
  snprintf(cs->user_sockets[3], sizeof(cs->user_sockets[3]), "/run/user/%u/docker.sock", uid);
}

int worker_scratch_enter(void) {
  char err[300];
  const char *session = NULL;

  if (!wd.confine[0])
    return 0;
  for (char **e = wd.envp; e && *e && !session; e++)
    if (strncmp(*e, "MUSTER_SESSION=", 15) == 0)
      session = *e + 15;
  snprintf(wd.session, sizeof(wd.session), "%s", session ? session : "");
  if (scratch_enter(wd.confine, wd.session, &wd.scratch, err, sizeof(err)) == 0)
    return 0;
  snprintf(wd.reason, sizeof(wd.reason), "cannot give the worker its private /tmp: %s", err);
  LOG(LOG_ERROR, "%s", wd.reason);
  return -1;
}

void worker_scratch_leave(void) {
  scratch_leave(wd.confine, &wd.scratch);
}

/* 1 if some directory of this process's PATH (execvp's default without
 * one) holds name where this process can see it. Runs in the child:
 * allocates nothing. */
static int on_path(const char *name) {
  const char *p = getenv("PATH");
  char file[PATH_MAX];
  struct stat sb;

  if (!p)
    p = "/bin:/usr/bin";
  for (;;) {
    size_t len = strcspn(p, ":");
    int n = len ? snprintf(file, sizeof(file), "%.*s/%s", (int)len, p, name)
                : snprintf(file, sizeof(file), "%s", name);
    if (n > 0 && (size_t)n < sizeof(file) && stat(file, &sb) == 0)
      return 1;
    if (!p[len])
      return 0;
    p += len + 1;
  }
}

/* Runs in the child after fork(): wires the standard streams, resets the
 * signals, enters cwd, sets the environment to the prepared one and executes
 * the command. On failure it sends the stage and errno through status_fd and
 * exits 127; the parent writes the sentence. It calls no malloc (the
 * environment is swapped by pointer, not rebuilt with setenv), because
 * a name lookup may have left glibc's resolver thread behind holding a
 * lock. */
__attribute__((noreturn)) static void child_run(const struct child_spec *cs) {
  struct exec_status st = {STAGE_SETUP, 0};
  struct sigaction dfl;
  sigset_t none;
  ssize_t n;
  int lock_fd = host_beat_lock_fd();

  /* The host's lock is workerd's alone: a child that hung before its exec
   * must not hold it past workerd's end. */
  if (lock_fd >= 0)
    close(lock_fd);
  /* Both sides call setpgid, so that the group exists before either the
   * parent signals it or the command starts children. */
  if (cs->own_group && setpgid(0, 0) != 0) {
    st.err = errno;
    goto fail;
  }
  /* An exec command must not outlive a workerd that was killed outright
   * (SIGKILL, a crash): no one would relay or reap it. */
  if (cs->own_group && prctl(PR_SET_PDEATHSIG, SIGKILL) != 0) {
    st.err = errno;
    goto fail;
  }
  if (dup2(cs->in_fd, 0) < 0 || dup2(cs->out_fd, 1) < 0 || dup2(cs->err_fd, 2) < 0) {
    st.err = errno;
    goto fail;
  }
  /* Nothing of ours (the controller's sockets, the exec sockets, the pipes' other
   * ends) may leak into the command; the status pipe is close-on-exec
   * already. */
  if (close_range(3, ~0U, CLOSE_RANGE_CLOEXEC) != 0) {
    long max = sysconf(_SC_OPEN_MAX);
    if (max < 0 || max > 65536)
      max = 65536;
    for (int fd = 3; fd < max; fd++)
      fcntl(fd, F_SETFD, FD_CLOEXEC);
  }
  /* Handlers first, then the mask (the parent blocked everything around
   * fork), so a pending signal never runs our handler in the child. */
  memset(&dfl, 0, sizeof(dfl));
  dfl.sa_handler = SIG_DFL;
  sigemptyset(&dfl.sa_mask);
  for (int sig = 1; sig < NSIG; sig++)
    sigaction(sig, &dfl, NULL); /* fails harmlessly for SIGKILL, SIGSTOP */
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, NULL);
  /* workerd died between fork() and prctl(): the death signal missed us. */
  if (cs->own_group && getppid() != cs->parent)
    _exit(127);
  if (cs->confine && (cs->own_group ? confine_exec(cs, &st) : confine(cs, &st)) != 0)
    goto fail;
  /* The worker's account, last: the isolation needed root. Its uid drops
   * every capability; no file may give them back. Nothing of workerd's
   * secrets stays in this copy of its memory, which the account may read
   * until exec. */
  if (cs->run_uid != 0) {
    explicit_bzero(wd.token, sizeof(wd.token));
    if (wd.exec_token)
      explicit_bzero(wd.exec_token, strlen(wd.exec_token));
  }
  /* (not dumpable before and after the switch, which may reset it) */
  if (cs->run_uid != 0 &&
      (prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0 ||
       setgroups((size_t)cs->n_run_groups, cs->run_groups) != 0 || setgid(cs->run_gid) != 0 ||
       setuid(cs->run_uid) != 0 || prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0 ||
       prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0)) {
    st.stage = STAGE_USER;
    st.err = errno;
    goto fail;
  }
  /* A change of uid (or of user namespace) clears the parent-death
   * signal: set it again. */
  if ((cs->run_uid != 0 || (cs->confine && cs->uid_map[0])) && cs->own_group &&
      (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || getppid() != cs->parent))
    _exit(127);

  if (cs->cwd && chdir(cs->cwd) != 0) {
    st.stage = STAGE_CHDIR;
    st.err = errno;
    goto fail;
  }
  /* Checked here, after the chdir, the isolation and the switch to the
   * worker's account, as the kernel would open it: a missing script (or one
   * the account cannot read) is named, not left to the kernel's exit code
   * (python's 2) and a line on stderr. */
  if (cs->script && access(cs->script, cs->run_uid != 0 ? R_OK : F_OK) != 0) {
    st.stage = STAGE_SCRIPT;
    st.err = errno;
    goto fail;
  }
  /* execvp searches the PATH of the environment it runs in, which is now the
   * assigned one, as with clearenv() and setenv(). */
  environ = cs->envp;
  execvp(cs->argv[0], cs->argv);
  st.stage = STAGE_EXEC;
  st.err = errno;
  /* execvp says EACCES when some PATH entry could not be searched (root's
   * ~/.pyenv/shims, for the worker's account) even where no entry holds
   * the program: seen from the account, it is not there. Checked here, as
   * the account, so that nothing of a directory it cannot search leaks. */
  if (st.err == EACCES && !strchr(cs->argv[0], '/') && !on_path(cs->argv[0])) {
    st.stage = STAGE_PATH;
    st.err = ENOENT;
  }
  /* ENOENT for a program the account cannot see at all is "not found":
   * the parent, which looks further (for a missing #! interpreter), does
   * so as root, and must learn nothing of what the account cannot see. */
  if (st.err == ENOENT) {
    struct stat sb;
    int seen = strchr(cs->argv[0], '/') ? stat(cs->argv[0], &sb) == 0 : on_path(cs->argv[0]);
    if (!seen)
      st.stage = STAGE_PATH;
  }
fail:
  n = write(cs->status_fd, &st, sizeof(st));
  (void)n;
  _exit(127);
}

/* Forks a child that runs cs (child_run()). Every signal is blocked around
 * fork(), so that none of our handlers runs in the child before it has
 * reset them. Returns the child's pid, or -1 with errno set. */
pid_t child_spawn(const struct child_spec *cs) {
  sigset_t all, old;
  pid_t pid;
  int saved;

  sigfillset(&all);
  sigprocmask(SIG_BLOCK, &all, &old);
  pid = fork();
  if (pid == 0)
    child_run(cs);
  saved = errno;
  sigprocmask(SIG_SETMASK, &old, NULL);
  errno = saved;
  return pid;
}

/* Waits until the child whose status pipe's read end is status_fd (the
 * parent having closed the write end) has executed its command, or failed
 * to. Blocks only until exec, which closes the pipe; signals are unblocked
 * again, so a SIGCHLD may interrupt the read. Returns true with *st filled
 * if the child failed before the command started, false otherwise. */
bool child_exec_failed(int status_fd, struct exec_status *st) {
  ssize_t n;

  do
    n = read(status_fd, st, sizeof(*st));
  while (n < 0 && errno == EINTR);
  return n == (ssize_t)sizeof(*st);
}

/* ------------------------------------------------------------------------ */
/* The worker's command                                                     */

/* Starts the assigned command with its output on two pipes, and waits until
 * it has been executed or has failed to be (the status pipe tells which).
 * A failure to execute is not an error here: it shows as a reason in
 * wd.reason, a sentence on the command's stderr, and exit 127 through
 * SIGCHLD. Returns 0, or MUSTER_E_IO/MUSTER_E_NOMEM if no child could be
 * started at all, with wd.reason set for the exit report. */
MUST_CHECK int command_start(void) {
  int outp[2] = {-1, -1}, errp[2] = {-1, -1}, statp[2] = {-1, -1};
  int devnull = -1;
  struct exec_status st;
  pid_t pid;
  int rc = MUSTER_E_IO;

  if (stream_open(&wd.out) != 0 || stream_open(&wd.err) != 0) {
    snprintf(wd.reason, sizeof(wd.reason), "cannot start \"%s\": out of memory", wd.argv[0]);
    rc = MUSTER_E_NOMEM;
    goto out;
  }
  if (pipe2(outp, O_CLOEXEC) != 0 || pipe2(errp, O_CLOEXEC) != 0 || pipe2(statp, O_CLOEXEC) != 0 ||
      (devnull = open("/dev/null", O_RDONLY | O_CLOEXEC)) < 0 ||
      fcntl(outp[0], F_SETFL, O_NONBLOCK) != 0 || fcntl(errp[0], F_SETFL, O_NONBLOCK) != 0) {
    snprintf(wd.reason, sizeof(wd.reason), "cannot start \"%s\": %s", wd.argv[0], strerror(errno));
    goto out;
  }

  {
    struct child_spec cs = {.in_fd = devnull,
                            .out_fd = outp[1],
                            .err_fd = errp[1],
                            .status_fd = statp[1],
                            .argv = wd.argv,
                            .envp = wd.envp,
                            .cwd = wd.cwd,
                            .script = wd.script};

    child_spec_worker(&cs);

    struct cg_mem cg;

    /* Kills counted before the command: its own show as growth. */
    wd.oom_kills_at_start = cg_mem_read(&cg) == 0 ? cg.oom_kills : -1;
    pid = child_spawn(&cs);
  }
  if (pid < 0) {
    snprintf(wd.reason, sizeof(wd.reason), "cannot start \"%s\": %s", wd.argv[0], strerror(errno));
    goto out;
  }
  wd.child = pid;
  wd.out.fd = outp[0];
  wd.err.fd = errp[0];
  outp[0] = errp[0] = -1;
  fd_close(&statp[1]);

  if (child_exec_failed(statp[0], &st)) {
    char line[WD_REASON_MAX + 32];
    int k;

    child_failure_sentence(&st, wd.cwd, wd.script, wd.argv, wd.envp, wd.reason, sizeof(wd.reason));
    LOG(LOG_WARN, "%s", wd.reason);
    /* The user reads the command's stderr first, so say it there too. */
    k = snprintf(line, sizeof(line), "muster-workerd: %s\n", wd.reason);
    stream_append(&wd.err, line, (size_t)k < sizeof(line) ? (size_t)k : sizeof(line) - 1,
                  util_mono_ms());
  } else {
    LOG(LOG_INFO, "started \"%s\" as process %ld", wd.argv[0], (long)pid);
  }
  rc = 0;
out:
  fd_close_pair(outp);
  fd_close_pair(errp);
  fd_close_pair(statp);
  fd_close(&devnull);
  return rc;
}

/* The command was killed by SIGKILL (or exited 137, as a shell does when
 * its command was): if the out-of-memory killer of its
 * cgroup (a Slurm step's, a container's) did it, wd.reason says so, with
 * the limit it hit. */
static void note_oom_kill(void) {
  struct cg_mem cg;

  /* A stop (muster's, or a signal from outside that workerd escalated to
   * SIGKILL) is not the out-of-memory killer, whatever else it killed. */
  if (wd.reason[0] || wd.stopping || wd.term_received || wd.oom_kills_at_start < 0 ||
      cg_mem_read(&cg) != 0 || cg.oom_kills <= wd.oom_kills_at_start)
    return;
  if (cg.limit > 0)
    snprintf(wd.reason, sizeof(wd.reason), "killed: out of memory (limit %.3g GiB)",
             (double)cg.limit / (1024.0 * 1024.0 * 1024.0));
  else
    snprintf(wd.reason, sizeof(wd.reason), "killed: out of memory");
  LOG(LOG_WARN, "%s", wd.reason);
}

/* Collects the child's exit status if it has exited, and starts the 2 s
 * window in which its pipes are still read. */
void child_reap(int64_t now) {
  int st;
  pid_t r;

  if (wd.child <= 0 || wd.child_done)
    return;
  do
    r = waitpid(wd.child, &st, WNOHANG);
  while (r < 0 && errno == EINTR);
  if (r == 0)
    return;
  if (r < 0) {
    /* Cannot happen unless someone else reaped it; end rather than hang. */
    LOG(LOG_ERROR, "lost track of the command: %s", strerror(errno));
    snprintf(wd.reason, sizeof(wd.reason), "muster-workerd lost track of the command");
    wd.wait_status = -1;
  } else {
    wd.wait_status = st;
    if (WIFEXITED(st))
      LOG(LOG_INFO, "the command exited with code %d", WEXITSTATUS(st));
    else if (WIFSIGNALED(st))
      LOG(LOG_INFO, "the command was killed by signal %d", WTERMSIG(st));
    /* killed, or a shell whose command was (128 + SIGKILL; not once an
     * exec command, whose kills the cgroup counts too, has run) */
    if ((WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL) ||
        (WIFEXITED(st) && WEXITSTATUS(st) == 128 + SIGKILL && !wd.exec_started))
      note_oom_kill();
  }
  wd.child_done = true;
  wd.drain_until_ms = now + WD_DRAIN_MS;
}
