/*
 * backend_local.c: the local backend (see backend.h).
 *
 * Workers run as muster-workerd processes on the controller's host, each in
 * its own session, each with its own loopback address (127.0.1.1 on). The
 * backend owns those processes: it spawns them (through the workerd fork
 * server), signals them with TERM -> KILL escalation, reaps them and probes
 * the ones an earlier controller left. All of that happens on the backend's
 * own thread; the operations called under the state lock only record what
 * to do (lb.mu, a leaf lock: nothing else is taken while it is held).
 *
 * A worker's process is identified by its pid and its start time (field 22
 * of /proc/PID/stat), written as backend_ref "PID:START". A pid whose start
 * time differs belongs to someone else and is never signalled.
 *
 * Where the host allows it, each worker is a container (cgroup.h): its
 * workerd joins a cgroup of its own, "ID.ATTEMPT", before it does anything
 * else, with the worker's memory as a hard limit and its cpu as a quota;
 * when the workerd ends (or its SIGKILL is due), every process left in the
 * cgroup is killed and the cgroup removed.
 */
#include "backend.h"
#include "cgroup.h"
#include "envlists.h"

#include "fault.h"
#include "log.h"
#include "muster_errors.h"
#include "state.h"
#include "util.h"
#include "zygote_proto.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

/* 127.0.1.1 .. 127.0.254.254: 254 hosts on each of 254 subnets. */
#define IP_SLOTS (254 * 254)
#define LP_HASH 4096
#define KILL_LATER_MS 2000

/* One worker the backend knows: placed, started, or adopted. */
struct lproc {
  char id[16];
  int attempt;
  pid_t pid;                /* 0 until spawned */
  unsigned long long start; /* its start time, in clock ticks after boot */
  struct backend_req req;
  int ip_slot; /* -1: none */
  uint64_t gpu_mask;
  int live;           /* placed and not yet released */
  int adopted;        /* not our child: probed through /proc */
  int reported;       /* its end was reported: no second report */
  int exited;         /* our child, reaped: pid and start kept for its leftovers */
  int64_t kill_at_ms; /* a SIGKILL is due then; 0: none */
  struct lproc *hnext;
  struct lproc *next, *prev;
};

/* Work for the backend's thread. */
struct job {
  enum { JOB_START, JOB_CANCEL } kind;
  char id[16];
  char token[72];
  char controller_url[600];
  int attempt;
  struct backend_placement where;
  enum backend_cancel how;
  struct job *next;
};

static struct {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  pthread_t thread;
  int running, stop;
  struct ctl_config cfg;
  /* Under mu: */
  struct lproc *hash[LP_HASH];
  struct lproc *head;
  struct job *jobs, *jobs_tail;
  unsigned char ip_used[IP_SLOTS];
  int ip_next; /* round-robin, so that an address is not reused at once */
  double cpu_used, memory_used;
  uint64_t gpu_used;
  /* The backend thread's own: */
  char **base_env;
  size_t base_env_len;
  int zygote_fd;
  pid_t zygote_pid;
  int64_t zygote_retry_ms;
  int64_t last_probe_ms;
  int room_freed; /* under mu: a record that held an address or GPUs went */
  int sweep;      /* under mu: reconciled; cgroups no worker owns can go */
} lb = {.mu = PTHREAD_MUTEX_INITIALIZER, .zygote_fd = -1};

/* ---- the table (lb.mu held) ---- */

static unsigned lp_hash(const char *id) {
  unsigned h = 2166136261u;

  for (; *id; id++)
    h = (h ^ (unsigned char)*id) * 16777619u;
  return h % LP_HASH;
}

static struct lproc *lp_find(const char *id) {
  for (struct lproc *p = lb.hash[lp_hash(id)]; p; p = p->hnext)
    if (strcmp(p->id, id) == 0)
      return p;
  return NULL;
}

static struct lproc *lp_new(const char *id) {
  struct lproc *p = calloc(1, sizeof(*p));
  unsigned h;

  if (!p)
    return NULL;
  snprintf(p->id, sizeof(p->id), "%s", id);
  p->ip_slot = -1;
  h = lp_hash(id);
  p->hnext = lb.hash[h];
  lb.hash[h] = p;
  p->next = lb.head;
  if (lb.head)
    lb.head->prev = p;
  lb.head = p;
  return p;
}

/* Drops a record and gives back the address and GPUs it held. */
static void lp_free(struct lproc *p) {
  struct lproc **pp = &lb.hash[lp_hash(p->id)];

  if (p->gpu_mask)
    lb.room_freed = 1; /* a waiting worker may fit now */
  lb.gpu_used &= ~p->gpu_mask;
  if (p->ip_slot >= 0)
    lb.ip_used[p->ip_slot] = 0;
  while (*pp && *pp != p)
    pp = &(*pp)->hnext;
  if (*pp)
    *pp = p->hnext;
  if (p->prev)
    p->prev->next = p->next;
  else
    lb.head = p->next;
  if (p->next)
    p->next->prev = p->prev;
  free(p);
}

/* A record is dropped once it is released, nothing is due for it, and its
 * process is gone (reaped), never existed, or (adopted, so not ours to
 * reap) was cancelled or seen gone. Until then it keeps its address and its
 * GPUs: a worker in its stop grace period still uses them. */
static void lp_maybe_free(struct lproc *p) {
  if (!p->live && !p->kill_at_ms && (p->pid == 0 || p->exited || (p->adopted && p->reported)))
    lp_free(p);
}

/* A worker attempt's cgroup: "ID.ATTEMPT". */
static void cg_name(const char *id, int attempt, char *buf, size_t size) {
  snprintf(buf, size, "%s.%d", id, attempt);
}

static void slot_to_ip(int slot, char *buf, size_t size) {
  snprintf(buf, size, "127.0.%d.%d", 1 + slot / 254, 1 + slot % 254);
}

static MUST_CHECK int ip_to_slot(const char *ip) {
  unsigned a, b;
  char tail;

  if (sscanf(ip, "127.0.%u.%u%c", &a, &b, &tail) != 2 || a < 1 || a > 254 || b < 1 || b > 254)
    return -1;
  return (int)((a - 1) * 254 + (b - 1));
}

static MUST_CHECK int ip_alloc(void) {
  for (int k = 0; k < IP_SLOTS; k++) {
    int slot = (lb.ip_next + k) % IP_SLOTS;
    if (!lb.ip_used[slot]) {
      lb.ip_used[slot] = 1;
      lb.ip_next = (slot + 1) % IP_SLOTS;
      return slot;
    }
  }
  return -1;
}

static void gpus_format(uint64_t mask, char *buf, size_t size) {
  size_t len = 0;

  buf[0] = '\0';
  for (int i = 0; i < 64 && len + 4 < size; i++)
    if (mask & (1ULL << i))
      len += (size_t)snprintf(buf + len, size - len, "%s%d", len ? "," : "", i);
}

static uint64_t gpus_parse(const char *s) {
  uint64_t mask = 0;
  char *end;

  while (s && *s) {
    long i = strtol(s, &end, 10);
    if (end == s)
      break;
    if (i >= 0 && i < 64)
      mask |= 1ULL << i;
    s = *end == ',' ? end + 1 : end;
  }
  return mask;
}

static int free_gpus(void) {
  int n = 0;

  for (int i = 0; i < lb.cfg.gpus; i++)
    if (!(lb.gpu_used & (1ULL << i)))
      n++;
  return n;
}

static void reserve(struct lproc *p) {
  p->live = 1;
  lb.cpu_used += p->req.cpu;
  lb.memory_used += p->req.memory;
  lb.gpu_used |= p->gpu_mask;
}

/* Gives back a released worker's cores and memory (what admission counts);
 * its address and GPUs go with its record (lp_maybe_free). */
static void unreserve(struct lproc *p) {
  if (!p->live)
    return;
  p->live = 0;
  lb.cpu_used -= p->req.cpu;
  lb.memory_used -= p->req.memory;
  if (lb.cpu_used < 1e-9)
    lb.cpu_used = 0;
  if (lb.memory_used < 1e-9)
    lb.memory_used = 0;
}

/* ---- processes (the backend thread, or reconcile before it runs) ---- */

/* 1 if the process recorded as (pid, start) still runs. */
static int proc_same(pid_t pid, unsigned long long start) {
  unsigned long long now;
  int zombie;

  return pid > 1 && util_proc_stat(pid, &now, &zombie) == 0 && now == start && !zombie;
}

/* A signal due to one worker's processes. */
struct sigjob {
  pid_t pid;                /* its workerd, the leader of its session */
  unsigned long long start; /* that workerd's start time */
  int sig;
};

static int sid_cmp(const void *a, const void *b) {
  pid_t x = ((const struct sigjob *)a)->pid, y = ((const struct sigjob *)b)->pid;

  return (x > y) - (x < y);
}

/* Signals each worker of jobs (n of them): its process group and its whole
 * session, but only while its workerd's pid is still the same process, or is
 * gone altogether (then the session's leftovers are signalled: a pid number
 * is not handed out again while processes of its session remain). A pid
 * that now belongs to another process is left alone. A workerd leads its own
 * session; the commands it runs for the exec channel have process groups of
 * their own but stay in the session, so the session is "the whole worker".
 * /proc is read once for the whole batch: a stop of 1,000 workers is one
 * pass, not 1,000. */
static void signal_workers(struct sigjob *jobs, int n) {
  struct dirent *e;
  int k = 0;
  DIR *d;

  for (int i = 0; i < n; i++) {
    unsigned long long now;
    int zombie;

    if (jobs[i].pid <= 1)
      continue;
    if (util_proc_stat(jobs[i].pid, &now, &zombie) == 0 && now != jobs[i].start) {
      LOG(LOG_DEBUG, "pid %d is another process now; not signalled", (int)jobs[i].pid);
      continue;
    }
    /* The process itself (a fork server's child may not lead its session
     * yet), its group, then (below) its session. */
    kill(jobs[i].pid, jobs[i].sig);
    if (kill(-jobs[i].pid, jobs[i].sig) != 0 && errno != ESRCH)
      LOG(LOG_WARN, "could not signal process group %d: %s", (int)jobs[i].pid, strerror(errno));
    jobs[k++] = jobs[i];
  }
  if (!k)
    return;
  qsort(jobs, (size_t)k, sizeof(*jobs), sid_cmp);
  d = opendir("/proc");
  if (!d)
    return;
  while ((e = readdir(d)) != NULL) {
    char path[300], buf[512], *p;
    struct sigjob key, *hit;
    long pid, session;
    FILE *f;
    size_t len;

    if (e->d_name[0] < '1' || e->d_name[0] > '9')
      continue;
    snprintf(path, sizeof(path), "/proc/%s/stat", e->d_name);
    f = fopen(path, "re");
    if (!f)
      continue;
    len = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[len] = '\0';
    /* pid (comm) state ppid pgrp session ...; comm may hold spaces. */
    p = strrchr(buf, ')');
    if (!p || sscanf(p + 1, " %*c %*d %*d %ld", &session) != 1)
      continue;
    key.pid = (pid_t)session;
    hit = bsearch(&key, jobs, (size_t)k, sizeof(*jobs), sid_cmp);
    pid = strtol(e->d_name, &p, 10);
    if (hit && pid > 1 && *p == '\0')
      kill((pid_t)pid, hit->sig);
  }
  closedir(d);
}

static void signal_worker(pid_t pid, unsigned long long start, int sig) {
  struct sigjob j = {pid, start, sig};

  signal_workers(&j, 1);
}

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

static void zygote_close(void) {
  if (lb.zygote_fd >= 0)
    close(lb.zygote_fd);
  if (lb.zygote_pid > 0)
    kill(lb.zygote_pid, SIGKILL); /* reaped by the backend thread */
  lb.zygote_fd = -1;
  lb.zygote_pid = 0;
  lb.zygote_retry_ms = util_mono_ms() + 10000;
}

/* Starts the fork server (muster-workerd --zygote; its protocol is
 * common/zygote_proto.h); on failure workers are simply spawned. */
static void zygote_start(void) {
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
    zygote_close();
    lb.zygote_retry_ms = INT64_MAX;
    return;
  }
  LOG(LOG_DEBUG, "workerd fork server started (pid %d)", (int)lb.zygote_pid);
}

/* The settings one workerd is started with. */
#define WVARS 8
struct wvars {
  char url[640], id[64], token[128], ip[64], attempt[48], log[1200], logpath[1100];
  char cgroup[4200]; /* MUSTER_CGROUP: the cgroup directories workerd joins, one a line */
  char confine[600]; /* MUSTER_CONFINE: the directory the command must not see */
  const char *v[WVARS];
};

static void wvars_fill(struct wvars *w, const struct job *j) {
  snprintf(w->url, sizeof(w->url), "MUSTER_CONTROLLER_URL=%s", j->controller_url);
  snprintf(w->id, sizeof(w->id), "MUSTER_WORKER_ID=%s", j->id);
  snprintf(w->token, sizeof(w->token), "MUSTER_WORKER_TOKEN=%s", j->token);
  snprintf(w->ip, sizeof(w->ip), "MUSTER_BIND_IP=%s", j->where.bind_ip);
  snprintf(w->attempt, sizeof(w->attempt), "MUSTER_WORKER_ATTEMPT=%d", j->attempt);
  snprintf(w->logpath, sizeof(w->logpath), "%s/workers/%s.log", lb.cfg.state_dir, j->id);
  snprintf(w->log, sizeof(w->log), ZYGOTE_LOG_FILE "=%s", w->logpath);
  w->v[0] = w->url;
  w->v[1] = w->id;
  w->v[2] = w->token;
  w->v[3] = w->ip;
  w->v[4] = w->attempt;
  w->v[5] = w->log; /* the fork server's only: where the output goes */
  snprintf(w->cgroup, sizeof(w->cgroup), "MUSTER_CGROUP=");
  w->v[6] = w->cgroup;
  /* Isolated workers' commands get namespaces of their own, in which the
   * state directory (the API token, every worker's token in muster.db) is
   * out of sight. */
  snprintf(w->confine, sizeof(w->confine), "MUSTER_CONFINE=%s",
           cg_confined() ? lb.cfg.state_dir : "");
  w->v[7] = w->confine;
}

/* Sends one request to the fork server. Returns 0, or an error (nothing was
 * sent; the fork server is closed if it broke). */
static MUST_CHECK int zygote_send(const struct wvars *w) {
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
    zygote_close();
    return MUSTER_E_BACKEND;
  }
  return 0;
}

/* Reads the fork server's answer to the oldest request not yet answered.
 * Returns 0 with *pid set; MUSTER_E_BACKEND if it could not fork (nothing
 * started); MUSTER_E_PROTOCOL if it broke (whether it started the worker is
 * unknown). */
static MUST_CHECK int zygote_recv(pid_t *pid) {
  struct pollfd p = {.fd = lb.zygote_fd, .events = POLLIN};
  pid_t answer;

  if (lb.zygote_fd < 0 || poll(&p, 1, 5000) != 1 ||
      recv(lb.zygote_fd, &answer, sizeof(answer), 0) != sizeof(answer)) {
    if (lb.zygote_fd >= 0) {
      LOG(LOG_WARN, "the workerd fork server stopped answering; restarting it later");
      zygote_close();
    }
    return MUSTER_E_PROTOCOL;
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
static MUST_CHECK int spawn_direct(const struct wvars *w, pid_t *pid, char *err, size_t errlen) {
  char *argv[] = {lb.cfg.workerd_path, NULL};
  char **envp = calloc(lb.base_env_len + WVARS, sizeof(*envp));
  int rc;

  if (!envp) {
    snprintf(err, errlen, "out of memory");
    return MUSTER_E_NOMEM;
  }
  memcpy(envp, lb.base_env, lb.base_env_len * sizeof(*envp));
  for (int i = 0; i < 5; i++)
    envp[lb.base_env_len + (size_t)i] = (char *)w->v[i];
  envp[lb.base_env_len + 5] = (char *)w->v[6]; /* (v[5] is the fork server's) */
  envp[lb.base_env_len + 6] = (char *)w->v[7];
  rc = spawn_workerd(pid, w->logpath, -1, argv, envp);
  free(envp);
  if (rc != 0) {
    snprintf(err, errlen, "could not start %s: %s", lb.cfg.workerd_path, strerror(rc));
    return MUSTER_E_BACKEND;
  }
  return 0;
}

/* ---- the backend thread ---- */

static void report_fail(enum backend_event ev, const char *id, int attempt, const char *why) {
  struct backend_report r = {.event = ev, .id = id, .attempt = attempt, .detail = why};

  backend_report(&r);
}

/* Records that j's workerd runs as pid (and reports it), or, if the worker
 * was released meanwhile, ends it again. */
static void start_done(const struct job *j, pid_t pid) {
  char ref[64], detail[160];
  unsigned long long start = 0;
  struct lproc *p;
  int zombie, wanted;

  /* The start time is read while the process cannot have been reaped yet:
   * only this thread reaps. */
  if (util_proc_stat(pid, &start, &zombie) != 0)
    start = 0;
  pthread_mutex_lock(&lb.mu);
  p = lp_find(j->id);
  if (p && p->attempt == j->attempt) {
    p->pid = pid;
    p->start = start;
  }
  wanted = p && p->live && p->attempt == j->attempt;
  pthread_mutex_unlock(&lb.mu);
  if (!wanted) {
    signal_worker(pid, start, SIGKILL);
    return;
  }
  snprintf(ref, sizeof(ref), "%d:%llu", (int)pid, start);
  snprintf(detail, sizeof(detail), "local backend: pid %d, address %s", (int)pid, j->where.bind_ip);
  {
    struct backend_report r = {
        .event = BACKEND_STARTED, .id = j->id, .attempt = j->attempt, .ref = ref, .detail = detail};
    backend_report(&r);
  }
}

/* Starts the workerds of n start jobs. Requests go to the fork server all
 * at once and the answers are read after, so that its forks overlap with
 * the rest; a worker it cannot fork is spawned directly. A request whose
 * answer is lost (the fork server broke) is not tried again: that workerd
 * may exist, and a second one of the same attempt must not. */
static void start_batch(struct job **jobs, int n) {
  struct wvars *w = calloc((size_t)n, sizeof(*w));
  unsigned char *sent = calloc((size_t)n, 1);
  char err[1200];

  if (!w || !sent) {
    for (int i = 0; i < n; i++)
      report_fail(BACKEND_REFUSED, jobs[i]->id, jobs[i]->attempt, "out of memory");
    goto out;
  }
  if (lb.zygote_fd < 0 && lb.zygote_retry_ms != INT64_MAX && util_mono_ms() >= lb.zygote_retry_ms)
    zygote_start();
  for (int i = 0; i < n; i++) {
    struct cg_limits lim = {0};
    struct lproc *p;
    char name[32];
    int wanted;

    pthread_mutex_lock(&lb.mu);
    p = lp_find(jobs[i]->id);
    wanted = p && p->live && p->attempt == jobs[i]->attempt && p->pid == 0;
    if (wanted) {
      lim.cpu = p->req.cpu;
      lim.memory = p->req.memory;
      lim.gpus = p->gpu_mask;
    }
    pthread_mutex_unlock(&lb.mu);
    if (!wanted) {
      jobs[i] = NULL; /* stopped before it could start: it never will */
      continue;
    }
    wvars_fill(&w[i], jobs[i]);
    cg_name(jobs[i]->id, jobs[i]->attempt, name, sizeof(name));
    if (cg_create(name, &lim, w[i].cgroup + strlen("MUSTER_CGROUP="),
                  sizeof(w[i].cgroup) - strlen("MUSTER_CGROUP="), err, sizeof(err)) != 0) {
      report_fail(BACKEND_REFUSED, jobs[i]->id, jobs[i]->attempt, err);
      jobs[i] = NULL;
      continue;
    }
    sent[i] = zygote_send(&w[i]) == 0;
  }
  /* The workerds exist (or are being forked) and nothing records them yet:
   * the window a crash must not turn into a second run. */
  FAULT_POINT("local_spawned");
  for (int i = 0; i < n; i++) {
    pid_t pid = 0;
    int rc = MUSTER_E_BACKEND;

    if (!jobs[i])
      continue;
    if (sent[i]) {
      rc = zygote_recv(&pid);
      if (rc == MUSTER_E_PROTOCOL) {
        report_fail(BACKEND_REFUSED, jobs[i]->id, jobs[i]->attempt,
                    "the workerd fork server broke while starting it");
        continue;
      }
    }
    if (rc != 0 && spawn_direct(&w[i], &pid, err, sizeof(err)) != 0) {
      report_fail(BACKEND_REFUSED, jobs[i]->id, jobs[i]->attempt, err);
      continue;
    }
    start_done(jobs[i], pid);
  }
out:
  if (w)
    explicit_bzero(w, (size_t)n * sizeof(*w)); /* the tokens */
  free(w);
  free(sent);
}

/* Records worker j->id's cancellation; fills *out with the signal it needs
 * now (out->pid 0: none). */
static void job_cancel(const struct job *j, struct sigjob *out) {
  struct lproc *p;

  out->pid = 0;
  out->sig = SIGKILL;
  pthread_mutex_lock(&lb.mu);
  p = lp_find(j->id);
  if (p && p->pid > 0) {
    out->pid = p->pid;
    out->start = p->start;
    switch (j->how) {
    case BACKEND_KILL_NOW:
      p->kill_at_ms = 0;
      break;
    case BACKEND_TERM_THEN_KILL:
      out->sig = SIGTERM;
      p->kill_at_ms = util_mono_ms() + (int64_t)(lb.cfg.stop_grace_s * 1000);
      if (p->kill_at_ms == 0)
        p->kill_at_ms = 1;
      break;
    case BACKEND_KILL_LATER:
      out->pid = 0; /* nothing now */
      p->kill_at_ms = util_mono_ms() + KILL_LATER_MS;
      break;
    }
    p->reported = 1; /* its end is the state machine's already */
  }
  if (p)
    lp_maybe_free(p);
  pthread_mutex_unlock(&lb.mu);
}

/* Fills u (id and attempt set) from its cgroup. Returns 0, or -1. */
static int usage_read(struct backend_usage *u) {
  struct cg_usage cu;
  char name[32];

  cg_name(u->id, u->attempt, name, sizeof(name));
  if (cg_usage_of(name, &cu) != 0)
    return -1;
  u->cpu_seconds = cu.cpu_seconds;
  u->memory_bytes = cu.memory_bytes;
  u->memory_peak_bytes = cu.memory_peak_bytes;
  return 0;
}

/* The end of a worker attempt's processes: its cgroup's last usage goes
 * to the state machine, then whatever is left in it is killed and the
 * cgroup removed. */
static void cg_finish(const char *id, int attempt) {
  struct backend_usage u = {.id = id, .attempt = attempt, .final = 1};
  char name[32];

  cg_name(id, attempt, name, sizeof(name));
  if (usage_read(&u) == 0)
    backend_report_usage(&u, 1);
  /* (what will not die within 200 ms is left to the sweep, 5 s on: the
   * backend's thread has other workers to start) */
  if (cg_destroy(name, 200) != 0)
    LOG(LOG_WARN, "the cgroup of %s still holds processes; trying again later", name);
}

/* Sends the SIGKILLs that are due (all of them when all is set), in one
 * batch. */
static void kills_due(int64_t now, int all) {
  struct sigjob *jobs = NULL;
  struct attempt_of {
    char id[16];
    int attempt;
  } *names = NULL;
  int n = 0, cap = 0;

  pthread_mutex_lock(&lb.mu);
  for (struct lproc *p = lb.head, *next; p; p = next) {
    next = p->next;
    if (!p->kill_at_ms || (!all && p->kill_at_ms > now))
      continue;
    if (n == cap) {
      int c2 = cap ? 2 * cap : 64;
      struct sigjob *grown = realloc(jobs, (size_t)c2 * sizeof(*grown));
      struct attempt_of *more;
      if (!grown)
        break; /* the rest next time */
      jobs = grown;
      more = realloc(names, (size_t)c2 * sizeof(*more));
      if (!more)
        break;
      names = more;
      cap = c2;
    }
    jobs[n].pid = p->pid;
    jobs[n].start = p->start;
    jobs[n].sig = SIGKILL;
    snprintf(names[n].id, sizeof(names[n].id), "%s", p->id);
    names[n].attempt = p->attempt;
    n++;
    p->kill_at_ms = 0;
    lp_maybe_free(p);
  }
  pthread_mutex_unlock(&lb.mu);
  signal_workers(jobs, n);
  /* and whatever of the worker left its session (a daemon that called
   * setsid()): the cgroup holds it still */
  for (int i = 0; i < n; i++)
    cg_finish(names[i].id, names[i].attempt);
  free(jobs);
  free(names);
}

/* The end of worker name's workerd (pid, wait status st): if the
 * out-of-memory killer of its cgroup killed it, says so in why. */
static int oom_words(const char *name, int st, char *why, size_t len) {
  long long kills, limit;

  if (!WIFSIGNALED(st) || WTERMSIG(st) != SIGKILL || cg_oom(name, &kills, &limit) != 0 ||
      kills <= 0)
    return 0;
  if (limit > 0)
    snprintf(why, len, "killed: out of memory (limit %.3g GiB)",
             (double)limit / (1024.0 * 1024.0 * 1024.0));
  else
    snprintf(why, len, "killed: out of memory");
  return 1;
}

/* Reaps exited children: the fork server, or workerds (reported if their
 * worker's end was not). */
static void reap(void) {
  int st;
  pid_t pid;

  while ((pid = waitpid(-1, &st, WNOHANG)) > 0) {
    char why[200], id[16] = "", name[32] = "", cid[16] = "";
    int attempt = 0, catt = 0;

    if (pid == lb.zygote_pid) {
      LOG(LOG_WARN, "the workerd fork server exited; restarting it later");
      lb.zygote_pid = 0;
      zygote_close();
      continue;
    }
    pthread_mutex_lock(&lb.mu);
    for (struct lproc *p = lb.head; p; p = p->next)
      if (p->pid == pid && !p->adopted && !p->exited) {
        cg_name(p->id, p->attempt, name, sizeof(name));
        snprintf(cid, sizeof(cid), "%s", p->id);
        catt = p->attempt;
        if (p->live && !p->reported) {
          snprintf(id, sizeof(id), "%s", p->id);
          attempt = p->attempt;
          p->reported = 1;
        }
        /* Reaped: the pid and start time stay, for the leftovers of its
         * session (signal_workers() checks the start time). A released
         * worker's workerd has finished with its script: whatever is left
         * of its session is killed now, not at the end of the grace period,
         * so that its GPUs come free at once. */
        p->exited = 1;
        if (!p->live && p->kill_at_ms)
          p->kill_at_ms = 1;
        lp_maybe_free(p);
        break;
      }
    pthread_mutex_unlock(&lb.mu);
    if (!name[0])
      continue;
    if (!id[0]) {
      /* its end was reported (or it was stopped): what is left of it goes */
      cg_finish(cid, catt);
      continue;
    }
    if (oom_words(name, st, why, sizeof(why)))
      ;
    else if (WIFSIGNALED(st))
      snprintf(why, sizeof(why), "muster-workerd (pid %d) was killed by signal %d (%s)", (int)pid,
               WTERMSIG(st), strsignal(WTERMSIG(st)));
    else
      snprintf(why, sizeof(why),
               "muster-workerd (pid %d) exited with code %d before reporting the worker's end",
               (int)pid, WEXITSTATUS(st));
    cg_finish(id, attempt);
    report_fail(BACKEND_EXITED, id, attempt, why);
  }
}

/* Workers adopted after a restart are not our children: their end is seen
 * through /proc, once a second (heartbeat loss catches them anyway; this
 * only makes it sooner). */
static void probe_adopted(int64_t now) {
  if (now - lb.last_probe_ms < 1000)
    return;
  lb.last_probe_ms = now;
  for (;;) {
    char id[16] = "", why[200];
    int attempt = 0;
    pid_t pid = 0;

    pthread_mutex_lock(&lb.mu);
    for (struct lproc *p = lb.head; p; p = p->next)
      if (p->adopted && p->live && !p->reported && !proc_same(p->pid, p->start)) {
        snprintf(id, sizeof(id), "%s", p->id);
        attempt = p->attempt;
        pid = p->pid;
        p->reported = 1;
        break;
      }
    pthread_mutex_unlock(&lb.mu);
    if (!id[0])
      return;
    cg_finish(id, attempt); /* its leftovers */
    snprintf(why, sizeof(why), "lost: its muster-workerd (pid %d) is gone", (int)pid);
    report_fail(BACKEND_LOST, id, attempt, why);
  }
}

/* Cgroups that no worker record owns (an adopted worker stopped at once,
 * a controller that crashed between creating one and starting its workerd,
 * a worker whose record went while its cgroup could not be emptied): their
 * processes are killed and they go. Every 5 s, once reconciled. */
struct names {
  char (*v)[32];
  int n, cap;
};

static void name_add(const char *name, void *arg) {
  struct names *ns = arg;

  if (strlen(name) >= sizeof(ns->v[0]))
    return;
  if (ns->n == ns->cap) {
    int c2 = ns->cap ? 2 * ns->cap : 32;
    char(*grown)[32] = realloc(ns->v, (size_t)c2 * sizeof(*grown));
    if (!grown)
      return;
    ns->v = grown;
    ns->cap = c2;
  }
  snprintf(ns->v[ns->n++], sizeof(ns->v[0]), "%s", name);
}

static void sweep_cgroups(int64_t now) {
  static int64_t last;
  struct names ns = {0};

  pthread_mutex_lock(&lb.mu);
  if (!lb.sweep || now - last < 5000) {
    pthread_mutex_unlock(&lb.mu);
    return;
  }
  pthread_mutex_unlock(&lb.mu);
  last = now;
  cg_each(name_add, &ns);
  for (int i = 0; i < ns.n; i++) {
    char id[32], *dot, *end;
    struct lproc *p;
    long attempt;
    int owned;

    snprintf(id, sizeof(id), "%s", ns.v[i]);
    dot = strrchr(id, '.');
    if (!dot)
      continue;
    *dot = '\0';
    attempt = strtol(dot + 1, &end, 10);
    pthread_mutex_lock(&lb.mu);
    p = lp_find(id);
    owned = p && *end == '\0' && p->attempt == attempt;
    pthread_mutex_unlock(&lb.mu);
    if (owned)
      continue;
    LOG(LOG_INFO, "cgroup %s belongs to no worker now: its processes are killed and it goes",
        ns.v[i]);
    (void)cg_destroy(ns.v[i], 200);
  }
  free(ns.v);
}

/* Samples what running workers use (their cgroups) and reports them in one
 * batch: once a second, SAMPLE_MAX of them at a time, in turn, so that
 * each worker is sampled at most once a second and thousands of them cost
 * the backend's thread (and the database) little. */
#define SAMPLE_MAX 200
static void sample_usage(int64_t now) {
  static int64_t last;
  static unsigned long turn; /* where this round starts among the running */
  struct backend_usage u[SAMPLE_MAX];
  char ids[SAMPLE_MAX][16];
  unsigned long k = 0, running = 0;
  int n = 0, got = 0;

  if (!cg_enabled() || now - last < 1000)
    return;
  last = now;
  pthread_mutex_lock(&lb.mu);
  for (struct lproc *p = lb.head; p; p = p->next)
    running += p->live && p->pid > 0 && !p->exited;
  if (turn >= running)
    turn = 0;
  for (struct lproc *p = lb.head; p && n < SAMPLE_MAX; p = p->next) {
    if (!p->live || p->pid <= 0 || p->exited || k++ < turn)
      continue;
    snprintf(ids[n], sizeof(ids[n]), "%s", p->id);
    u[n] = (struct backend_usage){.id = ids[n], .attempt = p->attempt};
    n++;
  }
  turn += (unsigned long)n;
  pthread_mutex_unlock(&lb.mu);
  for (int i = 0; i < n; i++)
    if (usage_read(&u[i]) == 0)
      u[got++] = u[i];
  if (got)
    backend_report_usage(u, got);
}

static int64_t next_kill_ms(void) {
  int64_t at = INT64_MAX;

  for (struct lproc *p = lb.head; p; p = p->next)
    if (p->kill_at_ms && p->kill_at_ms < at)
      at = p->kill_at_ms;
  return at;
}

/* Runs (and frees) a list of jobs in order: runs of starts go out as one
 * batch each, and the signals of its cancellations as one batch at the end. */
static void run_jobs(struct job *jobs) {
  struct sigjob *sigs = NULL;
  struct job *starts[64], *owned[64];
  int n = 0, cap = 0, ns = 0;

  while (jobs) {
    struct job *next = jobs->next;

    if (jobs->kind == JOB_START) {
      owned[ns] = jobs;
      starts[ns++] = jobs;
      if (ns == 64 || !next || next->kind != JOB_START) {
        start_batch(starts, ns);
        for (int i = 0; i < ns; i++) {
          explicit_bzero(owned[i]->token, sizeof(owned[i]->token));
          free(owned[i]);
        }
        ns = 0;
      }
      jobs = next;
      continue;
    }
    {
      struct sigjob sj;
      job_cancel(jobs, &sj);
      if (sj.pid > 0 && n == cap) {
        int c2 = cap ? 2 * cap : 64;
        struct sigjob *grown = realloc(sigs, (size_t)c2 * sizeof(*grown));
        if (grown) {
          sigs = grown;
          cap = c2;
        } else {
          signal_worker(sj.pid, sj.start, sj.sig); /* no room to batch it */
          sj.pid = 0;
        }
      }
      if (sj.pid > 0)
        sigs[n++] = sj;
    }
    free(jobs);
    jobs = next;
  }
  signal_workers(sigs, n);
  free(sigs);
}

static void *backend_main(void *arg) {
  (void)arg;
  pthread_mutex_lock(&lb.mu);
  while (!lb.stop) {
    struct job *jobs = lb.jobs;
    int64_t now, at;

    lb.jobs = lb.jobs_tail = NULL;
    pthread_mutex_unlock(&lb.mu);
    run_jobs(jobs);
    now = util_mono_ms();
    reap();
    kills_due(util_mono_ms(), 0);
    probe_adopted(now);
    sweep_cgroups(now);
    sample_usage(now);
    pthread_mutex_lock(&lb.mu);
    if (lb.room_freed) {
      struct backend_report r = {.event = BACKEND_ROOM};
      lb.room_freed = 0;
      pthread_mutex_unlock(&lb.mu);
      backend_report(&r);
      pthread_mutex_lock(&lb.mu);
    }
    if (lb.jobs || lb.stop)
      continue;
    /* Children are reaped within 50 ms; nothing else needs a tick. */
    at = util_mono_ms() + 50;
    if (next_kill_ms() < at)
      at = next_kill_ms();
    util_cond_wait_until(&lb.cv, &lb.mu, at);
  }
  pthread_mutex_unlock(&lb.mu);
  return NULL;
}

/* ---- the operations ---- */

static int local_init(const struct ctl_config *cfg, char *err, size_t errlen) {
  char why[600];
  size_t n = 0;

  char abs[PATH_MAX];

  lb.cfg = *cfg;
  /* absolute: the cgroups' tag comes from it, and workers hide it */
  if (realpath(cfg->state_dir, abs) && strlen(abs) < sizeof(lb.cfg.state_dir))
    memcpy(lb.cfg.state_dir, abs, strlen(abs) + 1);
  if (cg_setup(cfg->isolation, lb.cfg.state_dir, why, sizeof(why)) != 0) {
    snprintf(err, errlen, "--isolation cgroup: workers cannot be put in cgroups here: %s", why);
    return MUSTER_E_BACKEND;
  }
  if (cg_enabled())
    LOG(LOG_INFO, "isolation: each worker runs in a cgroup of its own (%s): memory, cpu, pids",
        cg_mode());
  else if (cfg->isolation != CG_OFF)
    LOG(LOG_WARN, "isolation: none; workers run without limits (%s)", why);
  for (char **e = environ; *e; e++)
    n++;
  lb.base_env = calloc(n + 1, sizeof(*lb.base_env));
  if (!lb.base_env) {
    snprintf(err, errlen, "out of memory");
    return MUSTER_E_NOMEM;
  }
  /* The controller's own muster/CML variables (its API token above all)
   * must not leak into workers; everything else is the worker's "image"
   * environment: PATH, HOME, LANG. The settings meant for workerd itself
   * pass through. */
  for (char **e = environ; *e; e++)
    if (env_to_worker(*e))
      lb.base_env[lb.base_env_len++] = *e;
  util_cond_init_monotonic(&lb.cv);
  lb.zygote_retry_ms = 0;
  lb.stop = 0;
  if (pthread_create(&lb.thread, NULL, backend_main, NULL) != 0) {
    snprintf(err, errlen, "could not start the local backend's thread");
    return MUSTER_E_INTERNAL;
  }
  lb.running = 1;
  return 0;
}

static void local_shutdown(void) {
  if (lb.running) {
    pthread_mutex_lock(&lb.mu);
    lb.stop = 1;
    pthread_cond_signal(&lb.cv);
    pthread_mutex_unlock(&lb.mu);
    pthread_join(lb.thread, NULL);
    lb.running = 0;
  }
  /* Stopped workers still in their grace period are ended now: nobody would
   * be left to do it. */
  kills_due(0, 1);
  zygote_close();
  cg_teardown();
  pthread_mutex_lock(&lb.mu);
  while (lb.jobs) {
    struct job *j = lb.jobs;
    lb.jobs = j->next;
    free(j);
  }
  while (lb.head)
    lp_free(lb.head);
  memset(lb.ip_used, 0, sizeof(lb.ip_used));
  lb.cpu_used = lb.memory_used = 0;
  lb.gpu_used = 0;
  pthread_mutex_unlock(&lb.mu);
  free(lb.base_env);
  lb.base_env = NULL;
  lb.base_env_len = 0;
}

static int local_could_ever_fit(const struct backend_req *r, const char **field, char *msg,
                                size_t msglen) {
  if (r->cpu > lb.cfg.cpus + 1e-9)
    *field = "cpu";
  else if (r->memory > lb.cfg.memory + 1e-9)
    *field = "memory";
  else if (r->ngpu > lb.cfg.gpus)
    *field = "nvidia_gpu";
  else
    return 0;
  snprintf(msg, msglen,
           "%s: the request can never fit the local backend (it has %g cores, %g GiB of "
           "memory and %d GPUs in all)",
           *field, lb.cfg.cpus, lb.cfg.memory, lb.cfg.gpus);
  return MUSTER_E_CAPACITY;
}

static int local_place(const char *id, const struct backend_req *r, struct backend_placement *where,
                       char *why, size_t whylen) {
  struct lproc *p;
  uint64_t mask = 0;
  int slot, taken = 0, ok = 0;

  pthread_mutex_lock(&lb.mu);
  /* A little slack absorbs float rounding of fractional cores. */
  if (lb.cpu_used + r->cpu > lb.cfg.cpus + 1e-9) {
    snprintf(why, whylen, "%g cores (%g free of %g)", r->cpu,
             lb.cfg.cpus - lb.cpu_used < 0 ? 0 : lb.cfg.cpus - lb.cpu_used, lb.cfg.cpus);
    goto out;
  }
  if (lb.memory_used + r->memory > lb.cfg.memory + 1e-9) {
    snprintf(why, whylen, "%g GiB of memory (%g free of %g)", r->memory,
             lb.cfg.memory - lb.memory_used < 0 ? 0 : lb.cfg.memory - lb.memory_used,
             lb.cfg.memory);
    goto out;
  }
  if (r->ngpu > free_gpus()) {
    snprintf(why, whylen, "%d GPUs (%d free of %d on this host)", r->ngpu, free_gpus(),
             lb.cfg.gpus);
    goto out;
  }
  p = lp_find(id);
  if (p) {
    lp_maybe_free(p);
    p = lp_find(id);
  }
  if (p) {
    snprintf(why, whylen, "its earlier attempt to end");
    goto out;
  }
  slot = ip_alloc();
  if (slot < 0) {
    snprintf(why, whylen, "a free loopback address");
    goto out;
  }
  p = lp_new(id);
  if (!p) {
    lb.ip_used[slot] = 0;
    snprintf(why, whylen, "memory in the controller");
    goto out;
  }
  for (int i = 0; i < lb.cfg.gpus && taken < r->ngpu; i++)
    if (!((lb.gpu_used | mask) & (1ULL << i))) {
      mask |= 1ULL << i;
      taken++;
    }
  p->req = *r;
  p->ip_slot = slot;
  p->gpu_mask = mask;
  reserve(p);
  slot_to_ip(slot, where->bind_ip, sizeof(where->bind_ip));
  gpus_format(mask, where->gpu_indices, sizeof(where->gpu_indices));
  ok = 1;
out:
  pthread_mutex_unlock(&lb.mu);
  return ok;
}

/* Queues j for the backend's thread (lb.mu held). */
static void job_push(struct job *j) {
  if (lb.jobs_tail)
    lb.jobs_tail->next = j;
  else
    lb.jobs = j;
  lb.jobs_tail = j;
}

static void local_submit(const struct backend_start *ws, int n) {
  pthread_mutex_lock(&lb.mu);
  for (int i = 0; i < n; i++) {
    struct lproc *p = lp_find(ws[i].id);
    struct job *j = calloc(1, sizeof(*j));

    if (!j || !p) {
      free(j);
      LOG(LOG_ERROR, "could not queue the start of %s", ws[i].id);
      continue; /* it fails at its start timeout */
    }
    p->attempt = ws[i].attempt;
    j->kind = JOB_START;
    snprintf(j->id, sizeof(j->id), "%s", ws[i].id);
    snprintf(j->token, sizeof(j->token), "%s", ws[i].token);
    snprintf(j->controller_url, sizeof(j->controller_url), "%s", ws[i].controller_url);
    j->attempt = ws[i].attempt;
    j->where = *ws[i].where;
    job_push(j);
  }
  pthread_cond_signal(&lb.cv);
  pthread_mutex_unlock(&lb.mu);
}

static void local_cancel(const char *id, enum backend_cancel how) {
  struct job *j = calloc(1, sizeof(*j));

  pthread_mutex_lock(&lb.mu);
  if (!j) {
    /* No memory to queue it: at least nothing more will be started. */
    struct lproc *p = lp_find(id);
    if (p)
      p->kill_at_ms = 1;
  } else {
    j->kind = JOB_CANCEL;
    snprintf(j->id, sizeof(j->id), "%s", id);
    j->how = how;
    job_push(j);
  }
  pthread_cond_signal(&lb.cv);
  pthread_mutex_unlock(&lb.mu);
}

static void local_release(const char *id) {
  struct lproc *p;

  pthread_mutex_lock(&lb.mu);
  p = lp_find(id);
  if (p) {
    unreserve(p);
    lp_maybe_free(p);
  }
  pthread_mutex_unlock(&lb.mu);
}

/* Parses "PID:START". Returns 0, or -1 for anything else (a bare pid from
 * an older controller is not enough to know the process). */
static MUST_CHECK int ref_parse(const char *ref, pid_t *pid, unsigned long long *start) {
  char *end;
  long p;
  unsigned long long s;

  if (!ref)
    return -1;
  errno = 0;
  p = strtol(ref, &end, 10);
  if (end == ref || *end != ':' || p <= 1 || p > 0x3fffffff)
    return -1;
  ref = end + 1;
  s = strtoull(ref, &end, 10);
  if (end == ref || *end || errno)
    return -1;
  *pid = (pid_t)p;
  *start = s;
  return 0;
}

static void local_reconcile(struct backend_live *ws, int n) {
  pthread_mutex_lock(&lb.mu);
  lb.sweep = 1; /* every record of an adopted worker is made below */
  for (int i = 0; i < n; i++) {
    struct backend_live *l = &ws[i];
    unsigned long long start;
    struct lproc *p;
    pid_t pid;

    l->adopted = 0;
    if (ref_parse(l->ref, &pid, &start) != 0 || !proc_same(pid, start))
      continue;
    p = lp_new(l->id);
    if (!p)
      continue;
    l->adopted = 1;
    p->attempt = l->attempt;
    p->pid = pid;
    p->start = start;
    p->adopted = 1;
    p->req = l->req;
    p->ip_slot = ip_to_slot(l->where.bind_ip);
    if (p->ip_slot >= 0)
      lb.ip_used[p->ip_slot] = 1;
    p->gpu_mask = gpus_parse(l->where.gpu_indices);
    reserve(p);
  }
  pthread_mutex_unlock(&lb.mu);
}

static int local_ref_from_register(long pid, unsigned long long start_time, char *ref, size_t len) {
  if (pid <= 1 || start_time == 0)
    return -1;
  snprintf(ref, len, "%ld:%llu", pid, start_time);
  return 0;
}

static const char *local_isolation(void) {
  return cg_enabled() ? "cgroup" : "none";
}

static void local_usage(double *cpu_used, double *cpu_total, double *mem_used, double *mem_total) {
  pthread_mutex_lock(&lb.mu);
  *cpu_used = lb.cpu_used;
  *cpu_total = lb.cfg.cpus;
  *mem_used = lb.memory_used;
  *mem_total = lb.cfg.memory;
  pthread_mutex_unlock(&lb.mu);
}

const struct backend_ops backend_local_ops = {
    .name = "local",
    .init = local_init,
    .shutdown = local_shutdown,
    .could_ever_fit = local_could_ever_fit,
    .place = local_place,
    .submit = local_submit,
    .cancel = local_cancel,
    .release = local_release,
    .reconcile = local_reconcile,
    .ref_from_register = local_ref_from_register,
    .usage = local_usage,
    .isolation = local_isolation,
};
