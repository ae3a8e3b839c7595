/* backend_local.c: see backend.h. */
#include "backend.h"

#include "log.h"
#include "muster_errors.h"
#include "util.h"

#include <assert.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <poll.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

extern char **environ;

/* 127.0.1.1 .. 127.0.254.254: 254 hosts on each of 254 subnets. */
#define IP_SLOTS (254 * 254)

static unsigned char ip_used[IP_SLOTS];

/* The fork server (muster-workerd --zygote), see workerd.c. -1 when there
 * is none: then each worker is started with posix_spawn. */
static int zygote_fd = -1;
static pid_t zygote_pid;
static int64_t zygote_retry_ms;

static void zygote_close(void);
static int ip_next; /* round-robin start, so an address is not reused at once */
static char **base_env;
static size_t base_env_len;

int backend_init(void) {
  size_t n = 0;

  for (char **e = environ; *e; e++)
    n++;
  base_env = calloc(n + 1, sizeof(*base_env));
  if (!base_env)
    return MUSTER_E_NOMEM;
  /* The controller's own muster/CML variables (its API token above all)
   * must not leak into workers; everything else is the worker's
   * "image" environment: PATH, HOME, LANG. The settings meant for workerd
   * itself pass through. */
  for (char **e = environ; *e; e++)
    if ((strncmp(*e, "MUSTER_", 7) != 0 && strncmp(*e, "CDSW_", 5) != 0) ||
        strncmp(*e, "MUSTER_ORPHAN_TIMEOUT=", 22) == 0 ||
        strncmp(*e, "MUSTER_LOG_LEVEL=", 17) == 0)
      base_env[base_env_len++] = *e;
  return 0;
}

void backend_cleanup(void) {
  zygote_close();
  free(base_env);
  base_env = NULL;
  base_env_len = 0;
}

static void slot_to_ip(int slot, char *buf, size_t size) {
  snprintf(buf, size, "127.0.%d.%d", 1 + slot / 254, 1 + slot % 254);
}

static int ip_to_slot(const char *ip) {
  int a, b;
  char tail;

  if (sscanf(ip, "127.0.%d.%d%c", &a, &b, &tail) != 2)
    return -1;
  if (a < 1 || a > 254 || b < 1 || b > 254)
    return -1;
  return (a - 1) * 254 + (b - 1);
}

static int ip_alloc(void) {
  for (int k = 0; k < IP_SLOTS; k++) {
    int slot = (ip_next + k) % IP_SLOTS;
    if (!ip_used[slot]) {
      ip_used[slot] = 1;
      ip_next = (slot + 1) % IP_SLOTS;
      return slot;
    }
  }
  return -1;
}

int backend_fits_locked(double cpu, double memory, int ngpu) {
  int free_gpus = 0;

  for (int i = 0; i < g.cfg.gpus; i++)
    if (!(g.gpu_used & (1ULL << i)))
      free_gpus++;
  /* A little slack absorbs float rounding of fractional cores. */
  return g.cpu_used + cpu <= g.cfg.cpus + 1e-9 && g.memory_used + memory <= g.cfg.memory + 1e-9 &&
         ngpu <= free_gpus;
}

int backend_could_ever_fit(double cpu, double memory, int ngpu, const char **field) {
  if (cpu > g.cfg.cpus + 1e-9)
    *field = "cpu";
  else if (memory > g.cfg.memory + 1e-9)
    *field = "memory";
  else if (ngpu > g.cfg.gpus)
    *field = "nvidia_gpu";
  else
    return 0;
  return MUSTER_E_CAPACITY;
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

static void reserve(struct lw *w) {
  w->reserved = 1;
  g.cpu_used += w->cpu;
  g.memory_used += w->memory;
  g.gpu_used |= w->gpu_mask;
}

void backend_release_locked(struct lw *w) {
  ASSERT_LOCKED();
  if (!w->reserved)
    return; /* never started: nothing was reserved */
  w->reserved = 0;
  g.cpu_used -= w->cpu;
  g.memory_used -= w->memory;
  if (g.cpu_used < 1e-9)
    g.cpu_used = 0;
  if (g.memory_used < 1e-9)
    g.memory_used = 0;
  g.gpu_used &= ~w->gpu_mask;
  w->gpu_mask = 0;
  if (w->ip_slot >= 0)
    ip_used[w->ip_slot] = 0;
  w->ip_slot = -1;
}

void backend_adopt_locked(struct lw *w, const char *bind_ip, const char *gpu_indices) {
  ASSERT_LOCKED();
  w->ip_slot = bind_ip ? ip_to_slot(bind_ip) : -1;
  if (w->ip_slot >= 0)
    ip_used[w->ip_slot] = 1;
  w->gpu_mask = gpus_parse(gpu_indices);
  reserve(w);
}

/* Spawns workerd (the fork server, or one worker) with standard input from
 * /dev/null, its output appended to logpath, and fd3, if not -1, as its fd
 * 3; in its own session, so that it outlives a controller restart and can be
 * signalled as a group with its script; with default signal handling, since
 * the controller ignores SIGPIPE. Returns posix_spawn's answer. */
static int spawn_workerd(pid_t *pid, const char *logpath, int fd3, char *const argv[],
                         char *const envp[]) {
  posix_spawn_file_actions_t fa;
  posix_spawnattr_t attr;
  sigset_t none, defaults;
  int rc;

  posix_spawn_file_actions_init(&fa);
  if (fd3 >= 0)
    posix_spawn_file_actions_adddup2(&fa, fd3, 3);
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
  rc = posix_spawn(pid, g.cfg.workerd_path, &fa, &attr, argv, envp);
  posix_spawn_file_actions_destroy(&fa);
  posix_spawnattr_destroy(&attr);
  return rc;
}

static void zygote_close(void) {
  if (zygote_fd >= 0)
    close(zygote_fd);
  if (zygote_pid > 0)
    kill(zygote_pid, SIGKILL); /* reaped by the monitor */
  zygote_fd = -1;
  zygote_pid = 0;
  zygote_retry_ms = util_mono_ms() + 10000;
}

/* Starts the fork server; on failure workers are simply spawned. */
static void zygote_start(void) {
  char logpath[1100];
  char *argv[] = {g.cfg.workerd_path, "--zygote", NULL};
  int sv[2], rc;

  if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0)
    return;
  snprintf(logpath, sizeof(logpath), "%s/workers/zygote.log", g.cfg.state_dir);
  rc = spawn_workerd(&zygote_pid, logpath, sv[1], argv, base_env);
  close(sv[1]);
  if (rc != 0) {
    LOG(LOG_WARN, "could not start the workerd fork server (%s); spawning each worker",
        strerror(rc));
    close(sv[0]);
    zygote_pid = 0;
    zygote_retry_ms = util_mono_ms() + 10000;
    return;
  }
  zygote_fd = sv[0];
  {
    struct pollfd p = {.fd = zygote_fd, .events = POLLIN};
    pid_t hello = -1;
    if (poll(&p, 1, 2000) != 1 || recv(zygote_fd, &hello, sizeof(hello), 0) != sizeof(hello) ||
        hello != 0) {
      /* Not a fork server (a --workerd that predates it, or a wrapper):
       * spawn every worker, and do not try again. */
      LOG(LOG_INFO, "%s is not a fork server; spawning each worker", g.cfg.workerd_path);
      zygote_close();
      zygote_retry_ms = INT64_MAX;
      return;
    }
  }
  LOG(LOG_DEBUG, "workerd fork server started (pid %d)", (int)zygote_pid);
}

/* Asks the fork server for a worker. Returns 0 with *pid set, or an error
 * after which the caller spawns the worker itself. */
static int zygote_spawn(const char *const *vars, int nvars, pid_t *pid) {
  char req[4096];
  size_t len = 0;
  struct pollfd p;
  pid_t answer;

  if (zygote_fd < 0 && zygote_retry_ms != INT64_MAX && util_mono_ms() >= zygote_retry_ms)
    zygote_start();
  if (zygote_fd < 0)
    return MUSTER_E_BACKEND;
  for (int i = 0; i < nvars; i++) {
    size_t n = strlen(vars[i]) + 1;
    if (len + n > sizeof(req))
      return MUSTER_E_BACKEND;
    memcpy(req + len, vars[i], n);
    len += n;
  }
  if (send(zygote_fd, req, len, MSG_NOSIGNAL) != (ssize_t)len)
    goto broken;
  p.fd = zygote_fd;
  p.events = POLLIN;
  if (poll(&p, 1, 5000) != 1 || recv(zygote_fd, &answer, sizeof(answer), 0) != sizeof(answer))
    goto broken;
  if (answer <= 0) {
    LOG(LOG_WARN, "the workerd fork server could not fork: %s", strerror(-answer));
    return MUSTER_E_BACKEND;
  }
  *pid = answer;
  return 0;

broken:
  LOG(LOG_WARN, "the workerd fork server stopped answering; restarting it later");
  zygote_close();
  return MUSTER_E_BACKEND;
}

int backend_reaped_locked(pid_t pid) {
  if (pid != zygote_pid || pid <= 0)
    return 0;
  LOG(LOG_WARN, "the workerd fork server exited; restarting it later");
  zygote_pid = 0;
  zygote_close();
  return 1;
}

int backend_start_locked(struct lw *w, char *bind_ip, size_t iplen, char *gpu_indices,
                         size_t gpulen, char *err, size_t errlen) {
  char logpath[1100], env_log[1200];
  char env_url[200], env_id[64], env_token[128], env_ip[64];
  char **envp = NULL;
  char *argv[] = {g.cfg.workerd_path, NULL};
  pid_t pid;
  int rc = 0, slot, taken = 0;
  uint64_t mask = 0;

  ASSERT_LOCKED();
  slot = ip_alloc();
  if (slot < 0) {
    snprintf(err, errlen, "the local backend has no loopback address left");
    return MUSTER_E_BACKEND;
  }
  for (int i = 0; i < g.cfg.gpus && taken < w->ngpu; i++)
    if (!((g.gpu_used | mask) & (1ULL << i))) {
      mask |= 1ULL << i;
      taken++;
    }
  slot_to_ip(slot, bind_ip, iplen);
  gpus_format(mask, gpu_indices, gpulen);

  envp = calloc(base_env_len + 5, sizeof(*envp));
  if (!envp) {
    ip_used[slot] = 0;
    return MUSTER_E_NOMEM;
  }
  memcpy(envp, base_env, base_env_len * sizeof(*envp));
  snprintf(env_url, sizeof(env_url), "MUSTER_CONTROLLER_URL=%s", g.controller_url);
  snprintf(env_id, sizeof(env_id), "MUSTER_WORKER_ID=%s", w->id);
  snprintf(env_token, sizeof(env_token), "MUSTER_WORKER_TOKEN=%s", w->token);
  snprintf(env_ip, sizeof(env_ip), "MUSTER_BIND_IP=%s", bind_ip);
  envp[base_env_len] = env_url;
  envp[base_env_len + 1] = env_id;
  envp[base_env_len + 2] = env_token;
  envp[base_env_len + 3] = env_ip;

  snprintf(logpath, sizeof(logpath), "%s/workers/%s.log", g.cfg.state_dir, w->id);
  snprintf(env_log, sizeof(env_log), "MUSTER_LOG_FILE=%s", logpath);
  {
    const char *vars[] = {env_url, env_id, env_token, env_ip, env_log};
    rc = zygote_spawn(vars, 5, &pid);
  }
  if (rc != 0)
    rc = spawn_workerd(&pid, logpath, -1, argv, envp);
  free(envp);
  if (rc != 0) {
    snprintf(err, errlen, "could not start %s: %s", g.cfg.workerd_path, strerror(rc));
    ip_used[slot] = 0;
    return MUSTER_E_BACKEND;
  }
  w->pid = pid;
  w->ip_slot = slot;
  w->gpu_mask = mask;
  reserve(w);
  return 0;
}

/* Signals every process whose session is sid. A worker's workerd leads its
 * own session; the commands it runs for the exec channel have process groups
 * of their own (so that one can be signalled alone) but stay in the
 * session, so this is how "the whole worker" is reached. */
static void signal_session(pid_t sid, int sig) {
  DIR *d = opendir("/proc");
  struct dirent *e;

  if (!d)
    return;
  while ((e = readdir(d)) != NULL) {
    char path[300], buf[512], *p;
    long pid, session;
    FILE *f;
    size_t n;

    if (e->d_name[0] < '1' || e->d_name[0] > '9')
      continue;
    snprintf(path, sizeof(path), "/proc/%s/stat", e->d_name);
    f = fopen(path, "r");
    if (!f)
      continue;
    n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[n] = '\0';
    /* pid (comm) state ppid pgrp session ...; comm may hold spaces. */
    p = strrchr(buf, ')');
    if (!p || sscanf(p + 1, " %*c %*d %*d %ld", &session) != 1 || session != sid)
      continue;
    pid = strtol(e->d_name, NULL, 10);
    if (pid > 1)
      kill((pid_t)pid, sig);
  }
  closedir(d);
}

void backend_signal(pid_t pgid, int sig) {
  if (pgid <= 1)
    return;
  if (kill(-pgid, sig) != 0 && errno != ESRCH)
    LOG(LOG_WARN, "could not signal process group %d: %s", (int)pgid, strerror(errno));
  signal_session(pgid, sig);
}

int backend_alive(pid_t pid) {
  char path[64], buf[512];
  const char *state;
  FILE *f;
  size_t n;

  if (pid <= 0 || (kill(pid, 0) != 0 && errno != EPERM))
    return 0;
  /* A workerd orphaned by a controller crash may linger as a zombie when
   * nothing reaps orphans (a container's init, for one): dead all the same.
   * The state follows the last ')' of /proc/PID/stat. */
  snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
  f = fopen(path, "r");
  if (!f)
    return 1; /* no /proc: trust kill() */
  n = fread(buf, 1, sizeof(buf) - 1, f);
  fclose(f);
  buf[n] = '\0';
  state = strrchr(buf, ')');
  return !(state && state[1] == ' ' && (state[2] == 'Z' || state[2] == 'X'));
}
