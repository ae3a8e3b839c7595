/* harness_cleanup.c: see harness_cleanup.h. */
#include "harness_cleanup.h"

#include "netlink.h"
#include "subnet.h"
#include "util.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MAX_CTLS 4
static struct ctl_proc *live[MAX_CTLS];
/* The guardian's end of the pipe (-1: there is none). */
static int guard_fd = -1;

/* Process pid's start time (clock ticks after boot), zombie or not, 0 if
 * there is none: with the pid, it names one process, never a later one
 * that got the pid (which a zombie still holds). */
static unsigned long long start_of(pid_t pid) {
  unsigned long long t;
  int zombie = 0;

  return pid > 0 && util_proc_stat(pid, &t, &zombie) == 0 ? t : 0;
}

/* The same, 0 for a zombie too: the start time of a process that runs. */
static unsigned long long started_at(pid_t pid) {
  unsigned long long t;
  int zombie = 0;

  return pid > 0 && util_proc_stat(pid, &t, &zombie) == 0 && !zombie ? t : 0;
}

/* Kills the worker processes of c: the test started them, through its
 * controller, so the test ends them, and only them. The local backend's
 * reference ("PID:START") names a workerd by pid and start time: it and
 * its process group are killed while that very process is there (a
 * zombie too: its pid is not handed out again until it is reaped),
 * whatever its row says. A worker without one (another backend) is killed
 * by the pid its workerd registered, while its row is live: an ended
 * worker's pid may have been handed to another process since. (What is
 * left in their cgroups, remove_cgroups() ends.) */
static void kill_workers(struct ctl_proc *c) {
  char path[160];
  sqlite3 *db = NULL;
  sqlite3_stmt *st = NULL;

  /* The controller may be down: read the pids from its database. */
  snprintf(path, sizeof(path), "%s/muster.db", c->dir);
  if (sqlite3_open_v2(path, &db, SQLITE_OPEN_READONLY, NULL) == SQLITE_OK &&
      sqlite3_prepare_v2(
          db,
          "SELECT CASE WHEN status IN ('scheduling', 'starting', 'running') THEN pid "
          "END, backend_ref FROM workers",
          -1, &st, NULL) == SQLITE_OK) {
    while (sqlite3_step(st) == SQLITE_ROW) {
      const char *ref = (const char *)sqlite3_column_text(st, 1);
      long pids[2] = {sqlite3_column_int64(st, 0), 0};
      unsigned long long start;
      char *end;

      if (ref && strchr(ref, ':') && strncmp(ref, "local:", 6) != 0) {
        pids[0] = 0; /* (the same workerd: the reference says whether it is still that one) */
        pids[1] = strtol(ref, &end, 10);
        if (*end != ':' || (start = strtoull(end + 1, &end, 10), *end != '\0') || !start ||
            start_of((pid_t)pids[1]) != start)
          pids[1] = 0;
      }
      for (int i = 0; i < 2; i++)
        if (pids[i] > 1) {
          kill(-(pid_t)pids[i], SIGKILL);
          kill((pid_t)pids[i], SIGKILL);
        }
    }
  }
  sqlite3_finalize(st);
  sqlite3_close(db);
}

static void stop_controller(struct ctl_proc *c, int sig) {
  if (c->pid <= 0)
    return;
  kill(c->pid, sig);
  for (int i = 0; i < 100; i++) {
    if (waitpid(c->pid, NULL, WNOHANG) == c->pid) {
      c->pid = 0;
      return;
    }
    usleep(50 * 1000);
  }
  kill(c->pid, SIGKILL);
  waitpid(c->pid, NULL, 0);
  c->pid = 0;
}

/* Reaps the workers this process adopted as subreaper (their controller
 * was killed), so that no zombie outlives the test. */
static void reap_adopted(void) {
  while (waitpid(-1, NULL, WNOHANG) > 0)
    ;
}

/* Removes the cgroups the controller made (their base directories are
 * listed in STATE/cgroups), killing whatever is still in them: workers
 * outlive their controller, so its exit leaves theirs. */
static void remove_cgroups(struct ctl_proc *c) {
  char path[200], base[600];
  FILE *f;

  snprintf(path, sizeof(path), "%s/cgroups", c->dir);
  f = fopen(path, "r");
  if (!f)
    return;
  while (fgets(base, sizeof(base), f)) {
    struct dirent *e;
    DIR *d;

    base[strcspn(base, "\n")] = '\0';
    if (!base[0] || !(d = opendir(base)))
      continue;
    while ((e = readdir(d)) != NULL) {
      char dir[900], procs[920];
      long pid;
      FILE *p;

      if (e->d_type != DT_DIR || e->d_name[0] == '.')
        continue;
      snprintf(dir, sizeof(dir), "%s/%s", base, e->d_name);
      snprintf(procs, sizeof(procs), "%s/cgroup.procs", dir);
      for (int tries = 0; tries < 50 && rmdir(dir) != 0 && errno == EBUSY; tries++) {
        if ((p = fopen(procs, "r")) != NULL) {
          while (fscanf(p, "%ld", &pid) == 1)
            if (pid > 1)
              kill((pid_t)pid, SIGKILL);
          fclose(p);
        }
        usleep(20 * 1000);
      }
    }
    closedir(d);
    if (rmdir(base) != 0 && errno != ENOENT)
      fprintf(stderr, "could not remove the cgroup %s: %s\n", base, strerror(errno));
  }
  fclose(f);
}

/* The bridge of subnet: its name into name (16 bytes) and its link
 * index (0 if it is not there, or the subnet is none); *fd is the
 * netlink socket it was looked up on (-1 if none; the caller closes it). */
static int bridge_of(const char *subnet, char *name, int *fd) {
  struct subnet sn;
  char err[200];
  int idx;

  *fd = -1;
  if (!subnet[0] || subnet_parse(subnet, &sn, err, sizeof(err)) != 0)
    return 0;
  subnet_bridge_name(&sn, name, 16);
  *fd = nl_open();
  idx = *fd >= 0 ? nl_link_index(*fd, name) : 0;
  return idx > 0 ? idx : 0;
}

int h_bridge_there(const char *subnet) {
  char name[16];
  int fd, idx = bridge_of(subnet, name, &fd);

  if (fd >= 0)
    close(fd);
  return idx > 0;
}

void h_bridge_remove(struct ctl_proc *c) {
  char name[16];
  int fd, idx = bridge_of(c->subnet, name, &fd);

  if (fd < 0)
    return;
  if (idx > 0 && nl_link_del(fd, idx) != 0)
    fprintf(stderr, "could not remove bridge %s\n", name);
  close(fd);
  {
    char lock[64];
    snprintf(lock, sizeof(lock), "/run/muster/%s.lock", name);
    unlink(lock); /* (the controller's, which held it, is gone) */
  }
}

/* Unmounts the sessions' /tmp overlays that c's killed workerds left
 * mounted (a controller's next start would sweep them). */
static void unmount_overlays(struct ctl_proc *c) {
  char cmd[400];

  snprintf(cmd, sizeof(cmd),
           "for m in %s/scratch/*/merged; do mountpoint -q \"$m\" && umount -l \"$m\"; done; true",
           c->dir);
  if (system(cmd) != 0)
    fprintf(stderr, "could not unmount the overlays in %s/scratch\n", c->dir);
}

/* What c's controller leaves once it is gone: its workers, their cgroups,
 * its bridge, its overlays. */
static void end_leftovers(struct ctl_proc *c) {
  kill_workers(c);
  usleep(100 * 1000);
  reap_adopted();
  remove_cgroups(c);
  h_bridge_remove(c);
  unmount_overlays(c);
}

/* ---- the guardian ---- */

/* What the guardian is told, one datagram each: a controller started or
 * restarted ('S', with its pid and start time; pid 0 once it ended) or
 * was ended by the harness ('E'). */
struct guard_msg {
  char op;
  pid_t pid;
  unsigned long long start;
  char dir[sizeof(((struct ctl_proc *)0)->dir)];
  char subnet[sizeof(((struct ctl_proc *)0)->subnet)];
};

static void tell_guardian(char op, const struct ctl_proc *c) {
  struct guard_msg m = {.op = op, .pid = c->pid, .start = started_at(c->pid)};

  if (guard_fd < 0)
    return;
  snprintf(m.dir, sizeof(m.dir), "%s", c->dir);
  snprintf(m.subnet, sizeof(m.subnet), "%s", c->subnet);
  if (send(guard_fd, &m, sizeof(m), MSG_NOSIGNAL) != (ssize_t)sizeof(m))
    fprintf(stderr, "harness: could not tell the guardian about %s: %s\n", c->dir, strerror(errno));
}

/* 1 while m's controller (that very process) runs. */
static int running(const struct guard_msg *m) {
  return m->pid > 0 && m->start && started_at(m->pid) == m->start;
}

/* 1 once none of the n controllers in t runs, within timeout_s. */
static int all_gone_within(const struct guard_msg *t, int n, double timeout_s) {
  struct timespec tick = {0, 20 * 1000 * 1000};

  for (double waited = 0;; waited += 0.02) {
    int any = 0;

    for (int i = 0; i < n; i++)
      any |= running(&t[i]);
    if (!any)
      return 1;
    if (waited >= timeout_s)
      return 0;
    nanosleep(&tick, NULL);
  }
}

/* The guardian: reads what the test process tells it on fd until the
 * test process has ended (end of file, however it ended), then ends what
 * the controllers it was not told were ended left behind. Its controllers
 * get SIGTERM when the test process dies (spawn()'s death signal; one the
 * test stopped is continued to take it): they are given 15 s to go, then
 * killed, so that none starts a worker after its workers were killed.
 * Every signal goes to the process the pid and start time name. */
static void guardian(int fd) {
  struct guard_msg t[16], m;
  int n = 0;
  ssize_t got;

  while ((got = recv(fd, &m, sizeof(m), 0)) != 0) {
    int i;

    if (got < 0 && errno == EINTR)
      continue;
    if (got != (ssize_t)sizeof(m)) {
      fprintf(stderr, "harness: the guardian read %zd bytes, not a record: it stops guarding\n",
              got);
      _exit(1);
    }
    for (i = 0; i < n && strcmp(t[i].dir, m.dir) != 0; i++)
      ;
    if (m.op == 'E' && i < n)
      t[i] = t[--n];
    else if (m.op == 'S' && (i < n || n < (int)(sizeof(t) / sizeof(t[0]))))
      t[i == n ? n++ : i] = m;
    else if (m.op == 'S')
      fprintf(stderr, "harness: the guardian guards 16 controllers: not %s\n", m.dir);
  }
  for (int i = 0; i < n; i++)
    if (running(&t[i]))
      kill(t[i].pid, SIGCONT);
  if (!all_gone_within(t, n, 15)) {
    for (int i = 0; i < n; i++)
      if (running(&t[i])) {
        fprintf(stderr, "harness: the controller %d of %s still ran 15 s after its test: killed\n",
                (int)t[i].pid, t[i].dir);
        kill(t[i].pid, SIGKILL);
      }
    all_gone_within(t, n, 5);
  }
  for (int i = 0; i < n; i++) {
    struct ctl_proc c = {0};

    snprintf(c.dir, sizeof(c.dir), "%s", t[i].dir);
    snprintf(c.subnet, sizeof(c.subnet), "%s", t[i].subnet);
    fprintf(stderr,
            "harness: the test ended without finishing the controller of %s: its workers, "
            "cgroups and bridge are removed (its files stay)\n",
            c.dir);
    end_leftovers(&c);
  }
  _exit(0);
}

/* The process that started the guardian (a child it forks, which may exit
 * through its exit handlers, ends nothing of its parent's). */
static pid_t guarded;

/* Starts the guardian: a process of its own session (a Check timeout kills
 * the test's process group), with Check's signal handlers reset, and
 * nothing of the test's open but its end of a socket pair whose other end
 * only the test process holds (close-on-exec, so no controller or worker
 * keeps the guardian waiting; a child the test forks and does not exec
 * holds it until it exits). */
static void start_guardian(void) {
  int sv[2], null;
  pid_t pid;

  if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0) {
    fprintf(stderr, "harness: no guardian (socketpair: %s)\n", strerror(errno));
    return;
  }
  pid = fork();
  if (pid < 0) {
    fprintf(stderr, "harness: no guardian (fork: %s)\n", strerror(errno));
    close(sv[0]);
    close(sv[1]);
    return;
  }
  if (pid == 0) {
    setsid();
    signal(SIGTERM, SIG_DFL);
    signal(SIGINT, SIG_DFL);
    signal(SIGALRM, SIG_DFL);
    null = open("/dev/null", O_RDWR);
    if (null >= 0) {
      dup2(null, 0);
      dup2(null, 1);
    }
    for (int k = 3; k < 1024; k++)
      if (k != sv[0])
        close(k);
    guardian(sv[0]);
  }
  close(sv[0]);
  guard_fd = sv[1];
}

/* The test process's exit (not a failed assertion's: the guardian's). */
static void cleanup_all(void) {
  if (getpid() != guarded)
    return;
  for (int i = 0; i < MAX_CTLS; i++)
    if (live[i])
      hc_end(live[i]);
}

void hc_init(void) {
  /* Workers orphaned by a killed controller become our children, not
   * init's, and we reap them. */
  prctl(PR_SET_CHILD_SUBREAPER, 1);
  guarded = getpid();
  start_guardian();
  atexit(cleanup_all);
}

void hc_started(struct ctl_proc *c) {
  int free_at = -1;

  for (int i = 0; i < MAX_CTLS; i++) {
    if (live[i] == c) {
      free_at = i;
      break;
    }
    if (!live[i] && free_at < 0)
      free_at = i;
  }
  if (free_at >= 0)
    live[free_at] = c;
  else
    fprintf(stderr, "harness: more than %d controllers at once: %s is not guarded\n", MAX_CTLS,
            c->dir);
  tell_guardian('S', c);
}

void hc_end(struct ctl_proc *c) {
  /* The controller first: once it is gone it starts nothing more, so the
   * database names every worker process there is to end. */
  stop_controller(c, SIGTERM);
  tell_guardian('S', c); /* (pid 0: nothing of it to signal) */
  for (int i = 0; i < MAX_CTLS; i++)
    if (live[i] == c)
      live[i] = NULL;
  end_leftovers(c);
  tell_guardian('E', c);
}
