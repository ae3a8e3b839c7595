/* cmd_stack.c: muster stack, run inside a worker (muster run's stall
 * report runs it through the exec channel): what each process of this
 * worker is doing: its state, kernel wait channel, CPU time, rank, and for
 * the ranks their native stack (eu-stack, else gdb) and Python stack
 * (gdb's py-bt, where python3-dbg is installed). A process is this
 * worker's when it runs as this account with this MUSTER_WORKER_ID. */
#include "cli.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static const char usage_stack[] =
    "usage: muster stack [--json] [--no-stacks]\n"
    "\n"
    "Inside a worker (muster exec W -- muster stack): what each of this worker's\n"
    "processes is doing: its state, what it waits for in the kernel, its CPU time,\n"
    "its rank, and the ranks' native stacks (eu-stack or gdb) and Python stacks\n"
    "(gdb's py-bt, with python3-dbg installed). muster run's stall report runs it.\n";

/* The most processes looked at, stacks taken, and bytes kept of a stack. */
#define STACK_PROCS 256
#define STACK_MAX 4
#define STACK_BYTES 6000
/* Seconds all the stacks may take together (muster run waits 40). */
#define STACK_SECONDS 25

struct proc_info {
  long pid, ppid;
  char comm[64];
  char state;
  char wchan[64];
  double cpu_s;
  long rank; /* -1: none */
  char cmdline[256];
  int ranked, wrapper;
};

/* A whole small file into buf (NUL-terminated); its length, or -1. */
static ssize_t read_small(const char *path, char *buf, size_t size) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  ssize_t n, got = 0;

  if (fd < 0)
    return -1;
  while (got < (ssize_t)size - 1 && (n = read(fd, buf + got, size - 1 - (size_t)got)) > 0)
    got += n;
  close(fd);
  buf[got] = '\0';
  return got;
}

/* The value of name in the NUL-separated environment env (len bytes). */
static const char *env_value(const char *env, size_t len, const char *name) {
  size_t nl = strlen(name);

  for (size_t i = 0; i < len; i += strlen(env + i) + 1)
    if (strncmp(env + i, name, nl) == 0 && env[i + nl] == '=')
      return env + i + nl + 1;
  return NULL;
}

/* Printable ASCII only: a process's name and command line are its own to
 * choose, and the report is shown on terminals. */
static void printable(char *s) {
  for (; *s; s++)
    if ((unsigned char)*s < 0x20 || (unsigned char)*s >= 0x7f)
      *s = '?';
}

/* Fills *p for pid if it is this worker's (its MUSTER_WORKER_ID is id).
 * Returns 1 if it is. */
static int read_proc(long pid, const char *id, struct proc_info *p) {
  char path[64], buf[4096];
  static char env[65536];
  ssize_t n;
  const char *v, *close_paren;
  unsigned long ut = 0, st = 0;

  snprintf(path, sizeof(path), "/proc/%ld/environ", pid);
  n = read_small(path, env, sizeof(env));
  if (n <= 0 || !(v = env_value(env, (size_t)n, "MUSTER_WORKER_ID")) || strcmp(v, id) != 0)
    return 0;
  memset(p, 0, sizeof(*p));
  p->pid = pid;
  p->rank = -1;
  if ((v = env_value(env, (size_t)n, "OMPI_COMM_WORLD_RANK")) ||
      (v = env_value(env, (size_t)n, "RANK"))) {
    char *end;
    long r = strtol(v, &end, 10);
    if (end != v && *end == '\0' && r >= 0)
      p->rank = r;
  }
  snprintf(path, sizeof(path), "/proc/%ld/stat", pid);
  if (read_small(path, buf, sizeof(buf)) <= 0 || !(close_paren = strrchr(buf, ')')))
    return 0;
  {
    const char *open_paren = strchr(buf, '(');
    size_t cl = open_paren ? (size_t)(close_paren - open_paren - 1) : 0;
    snprintf(p->comm, sizeof(p->comm), "%.*s", (int)(cl < sizeof(p->comm) ? cl : 63),
             open_paren ? open_paren + 1 : "");
  }
  /* After "(comm) ": state ppid pgrp session tty tpgid flags minflt
   * cminflt majflt cmajflt utime stime */
  if (sscanf(close_paren + 2, "%c %ld %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu", &p->state,
             &p->ppid, &ut, &st) != 4)
    return 0;
  p->cpu_s = (double)(ut + st) / (double)sysconf(_SC_CLK_TCK);
  snprintf(path, sizeof(path), "/proc/%ld/wchan", pid);
  if (read_small(path, p->wchan, sizeof(p->wchan)) < 0 || strcmp(p->wchan, "0") == 0)
    p->wchan[0] = '\0';
  snprintf(path, sizeof(path), "/proc/%ld/cmdline", pid);
  n = read_small(path, p->cmdline, sizeof(p->cmdline));
  for (ssize_t i = 0; i < n - 1; i++)
    if (p->cmdline[i] == '\0')
      p->cmdline[i] = ' ';
  printable(p->comm);
  printable(p->cmdline);
  printable(p->wchan);
  return 1;
}

/* A stack tool running: its output so far. */
struct tool {
  pid_t pid;
  pid_t target; /* the process it attaches to */
  int fd;       /* -1: done */
  const char *name;
  double seconds;
  char *buf;
  size_t len;
};

/* Starts argv with its output (stdout and stderr) on a pipe; t->pid is -1
 * when it could not start. */
static void tool_start(struct tool *t, char *const argv[], double seconds, pid_t target) {
  int out[2];

  memset(t, 0, sizeof(*t));
  t->target = target;
  t->pid = -1;
  t->fd = -1;
  t->name = argv[0];
  t->seconds = seconds;
  t->buf = calloc(1, STACK_BYTES + 1);
  if (!t->buf || pipe2(out, O_CLOEXEC) != 0)
    return;
  t->pid = fork();
  if (t->pid == 0) {
    int devnull = open("/dev/null", O_RDONLY);
    if (devnull >= 0)
      dup2(devnull, 0);
    dup2(out[1], 1);
    dup2(out[1], 2);
    execvp(argv[0], argv);
    _exit(127);
  }
  close(out[1]);
  if (t->pid < 0)
    close(out[0]);
  else
    t->fd = out[0];
}

static double mono(void) {
  struct timespec ts;

  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

/* Reads the tools' output until each ends or runs out of its time (then
 * it is killed, and says so). Each t->buf ends up ASCII only: valid JSON
 * text, nothing that drives a terminal. */
static void tools_finish(struct tool *t, int n) {
  double t0 = mono();

  for (;;) {
    struct pollfd pf[4];
    int np = 0, idx[4];
    double wait_s = 3600;
    for (int i = 0; i < n && np < 4; i++) {
      double left = t[i].seconds - (mono() - t0);
      if (t[i].fd < 0)
        continue;
      if (left <= 0) {
        /* A tracer killed while it attaches can leave its target stopped:
         * the target is told to go on. */
        kill(t[i].pid, SIGKILL);
        waitpid(t[i].pid, NULL, 0);
        t[i].pid = -t[i].pid; /* reaped */
        kill(t[i].target, SIGCONT);
        snprintf(t[i].buf + t[i].len, STACK_BYTES + 1 - t[i].len, "%s[%s did not finish in %g s]",
                 t[i].len ? "\n" : "", t[i].name, t[i].seconds);
        t[i].len = strlen(t[i].buf);
        close(t[i].fd);
        t[i].fd = -1;
        continue;
      }
      if (left < wait_s)
        wait_s = left;
      pf[np] = (struct pollfd){t[i].fd, POLLIN, 0};
      idx[np++] = i;
    }
    if (np == 0)
      break;
    if (poll(pf, (nfds_t)np, (int)(wait_s * 1000) + 1) <= 0)
      continue;
    for (int k = 0; k < np; k++) {
      struct tool *x = &t[idx[k]];
      char sink[4096];
      ssize_t r;
      if (!pf[k].revents)
        continue;
      r = x->len < STACK_BYTES ? read(x->fd, x->buf + x->len, STACK_BYTES - x->len)
                               : read(x->fd, sink, sizeof(sink)); /* full: drained */
      if (r > 0 && x->len < STACK_BYTES)
        x->len += (size_t)r;
      else if (r == 0 || (r < 0 && errno != EINTR && errno != EAGAIN)) {
        close(x->fd);
        x->fd = -1;
      }
    }
  }
  for (int i = 0; i < n; i++) {
    if (t[i].pid > 0)
      waitpid(t[i].pid, NULL, 0);
    if (t[i].pid < -1)
      t[i].pid = -t[i].pid;
    for (size_t k = 0; t[i].buf && k < t[i].len; k++)
      if ((unsigned char)t[i].buf[k] >= 0x7f ||
          ((unsigned char)t[i].buf[k] < 0x20 && t[i].buf[k] != '\n'))
        t[i].buf[k] = '?';
  }
}

static int on_path(const char *name) {
  const char *path = getenv("PATH");
  char buf[1024];

  for (const char *p = path ? path : "/usr/bin:/bin"; *p;) {
    size_t n = strcspn(p, ":");
    snprintf(buf, sizeof(buf), "%.*s/%s", (int)n, p, name);
    if (access(buf, X_OK) == 0)
      return 1;
    p += n + (p[n] == ':');
  }
  return 0;
}

/* The process's native stack, and its Python one for a python: new
 * strings or NULL. */
static void stacks_of(const struct proc_info *p, double left, char **native, char **python) {
  char pid[24];
  /* gdb in a PID namespace of its own would read the target's files
   * through /proc/PID/root ("target:"), which it may not: the same files
   * are here. No frame's arguments: they are memory of the process. */
  char *gdb_bt[] = {"gdb",
                    "-nx",
                    "-batch",
                    "-iex",
                    "set sysroot /",
                    "-iex",
                    "set print frame-arguments none",
                    "-p",
                    pid,
                    "-ex",
                    "thread apply all -ascending bt 30",
                    NULL};
  char *gdb_py[] = {"gdb", "-nx", "-batch", "-iex",  "set sysroot /",
                    "-p",  pid,   "-ex",    "py-bt", NULL};
  char *eu[] = {"eu-stack", "-p", pid, NULL};
  struct tool t;
  double t0 = mono();

  snprintf(pid, sizeof(pid), "%ld", p->pid);
  *native = *python = NULL;
  /* One after the other: a process takes one tracer at a time. */
  if (on_path("eu-stack") || on_path("gdb")) {
    int eu_stack = on_path("eu-stack");
    tool_start(&t, eu_stack ? eu : gdb_bt, left < 10 ? left : 10, p->pid);
    tools_finish(&t, 1);
    if (t.pid > 0)
      *native = t.buf;
    else
      free(t.buf);
  }
  left -= mono() - t0;
  /* gdb loads python3-dbg's py-bt from its auto-load directory. */
  if (strncmp(p->comm, "python", 6) == 0 && on_path("gdb") && left > 1) {
    tool_start(&t, gdb_py, left < 15 ? left : 15, p->pid);
    tools_finish(&t, 1);
    if (t.pid > 0)
      *python = t.buf;
    else
      free(t.buf);
  }
}

/* Whether p is one of muster's or Open MPI's own processes, not the
 * training's. */
static int is_agent(const struct proc_info *p) {
  static const char *const agents[] = {"muster", "muster-launcher", "muster-workerd",
                                       "orted",  "prted",           NULL};

  for (int i = 0; agents[i]; i++)
    if (strcmp(p->comm, agents[i]) == 0)
      return 1;
  return 0;
}

int cmd_stack(int argc, char **argv) {
  const char *id = getenv("MUSTER_WORKER_ID");
  struct proc_info *ps = calloc(STACK_PROCS, sizeof(*ps));
  int as_json = 0, no_stacks = 0, n = 0, nstacks = 0, leaves = 0;
  long self = (long)getpid(), parent = (long)getppid();
  json_t *out, *list;
  struct dirent *de;
  double t_start = mono();
  DIR *d;

  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
      fputs(usage_stack, stdout);
      free(ps);
      return EXIT_OK;
    } else if (strcmp(argv[i], "--json") == 0) {
      as_json = 1;
    } else if (strcmp(argv[i], "--no-stacks") == 0) {
      no_stacks = 1;
    } else {
      free(ps);
      return unknown_option(usage_stack, argv[i]);
    }
  }
  if (!ps)
    return out_of_memory();
  if (!id || !*id) {
    free(ps);
    fprintf(stderr, "muster stack: MUSTER_WORKER_ID is not set: run it inside a worker (muster "
                    "exec W -- muster stack)\n");
    return EXIT_USAGE;
  }
  d = opendir("/proc");
  while (d && (de = readdir(d)) && n < STACK_PROCS) {
    char *end;
    long pid = strtol(de->d_name, &end, 10);
    if (*end || pid <= 0 || pid == self || pid == parent)
      continue;
    if (read_proc(pid, id, &ps[n]))
      n++;
  }
  if (d)
    closedir(d);
  /* The training's ranks get stacks: those with a rank, not muster's or
   * Open MPI's own agents, and not a wrapper of another (bash -c,
   * torchrun's agent), unless there is nothing but wrappers. */
  for (int i = 0; i < n; i++)
    ps[i].ranked = ps[i].rank >= 0 && !is_agent(&ps[i]);
  for (int i = 0; i < n; i++)
    for (int k = 0; k < n && ps[i].ranked; k++)
      if (k != i && ps[k].ranked && ps[k].ppid == ps[i].pid)
        ps[i].wrapper = 1;
  for (int i = 0; i < n; i++)
    leaves += ps[i].ranked && !ps[i].wrapper;
  out = json_pack("{s:s, s:[]}", "worker", id, "processes");
  list = json_object_get(out, "processes");
  for (int i = 0; i < n; i++) {
    const struct proc_info *p = &ps[i];
    int ranked = p->ranked && (!p->wrapper || leaves == 0);
    char state[2] = {p->state, 0}, *native = NULL, *python = NULL;
    json_t *o;
    if (ranked && !no_stacks && nstacks < STACK_MAX && mono() - t_start < STACK_SECONDS - 1) {
      stacks_of(p, STACK_SECONDS - (mono() - t_start), &native, &python);
      nstacks++;
    }
    o = json_pack("{s:I, s:I, s:s, s:s, s:s, s:f, s:s}", "pid", (json_int_t)p->pid, "ppid",
                  (json_int_t)p->ppid, "comm", p->comm, "state", state, "wchan", p->wchan,
                  "cpu_seconds", p->cpu_s, "cmdline", p->cmdline);
    if (o) {
      json_object_set_new(o, "rank", p->rank >= 0 ? json_integer(p->rank) : json_null());
      json_object_set_new(o, "native_stack", native ? json_string(native) : json_null());
      json_object_set_new(o, "python_stack", python ? json_string(python) : json_null());
      json_array_append_new(list, o);
    }
    if (!as_json) {
      printf("pid %ld (%s) rank %ld: state %s%s%s, %.2f s of CPU\n  %s\n", p->pid, p->comm, p->rank,
             state, p->wchan[0] ? " in " : "", p->wchan, p->cpu_s, p->cmdline);
      if (native)
        printf("%s\n", native);
      if (python)
        printf("%s\n", python);
    }
    free(native);
    free(python);
  }
  if (as_json) {
    char *text = json_dumps(out, JSON_COMPACT);
    if (text)
      puts(text);
    free(text);
  }
  json_decref(out);
  free(ps);
  return EXIT_OK;
}
