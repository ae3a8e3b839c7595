/* run_allreduce.c: a run's command under mpirun (mode allreduce): the
 * hosts, the agent (muster rsh, muster rank), the environment, mpirun's
 * output relayed into lines. */
#include "envlists.h"
#include "fabric.h"
#include "muster.h"
#include "rank_end.h"
#include "run_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

struct relay {
  struct proc *p;
  int fd;
  int is_err;
};

/* Copies mpirun's output (one of its two pipes) into lines. */
static void *relay_main(void *arg) {
  struct relay *r = arg;
  char buf[65536];
  ssize_t n;

  while ((n = read(r->fd, buf, sizeof(buf))) != 0) {
    if (n < 0) {
      if (errno == EINTR)
        continue;
      break;
    }
    muster_run_emit_(r->p, r->is_err, buf, (size_t)n);
  }
  return NULL;
}

/* Fails run with what rank e->rank reported, naming its worker: rank r is
 * the worker rank_worker[r] of run's workers. When any report may be the
 * mark of an outside stop (the first one, or a peer's), the controller's
 * word on the worker is awaited first: it names the cause better. */
static void fail_rank(struct run *run, const struct rank_ends *e, const size_t *rank_worker) {
  const char *w = e->rank >= 0 && (size_t)e->rank < run->workers.count
                      ? run->workers.items[rank_worker[e->rank]].id
                      : NULL;

  if (e->outside)
    muster_run_await_worker_failure_(run, 3);
  if (strcmp(e->kind, "exit") == 0)
    muster_run_fail_(run, w, "rank %ld (%s) exited with code %d", e->rank, w ? w : "?", e->n);
  else if (strcmp(e->kind, "signal") == 0)
    muster_run_fail_(run, w, "rank %ld (%s) was killed by signal %d", e->rank, w ? w : "?", e->n);
  else
    muster_run_fail_(run, w, "rank %ld (%s): %s", e->rank, w ? w : "?", e->text);
}

/* Hands what a command wrote to arg's process as mpirun's stderr. */
static int ends_out(void *arg, const char *data, size_t len) {
  muster_run_emit_(arg, 1, data, len);
  return 0;
}

/* Reads, and removes, the reports of failed ranks that each daemon's file
 * holds (common/rank_end.h) from the first worker of every host (the list
 * exec_hosts), through the exec channel: once mpirun has failed, what a
 * lost daemon's relay never delivered is there. Into p's lines; a worker
 * that cannot be reached adds nothing (its own failure names it). */
static void collect_rank_ends(struct run *run, struct proc *p, const char *exec_hosts) {
  const char *sh[3] = {"/bin/sh", "-c", NULL};
  char dir[160], line[600], err[300];
  muster_exec_target t;
  muster_exec_opts o;
  int code;

  for (long i = 0; muster_exec_list_find(exec_hosts, NULL, i, run->exec_token, &t) == 0; i++) {
    rank_ends_dir(t.host, dir, sizeof(dir));
    snprintf(line, sizeof(line),
             "cat %s/" RANK_ENDS_FILE ".* 2>/dev/null; rm -f %s/" RANK_ENDS_FILE
             ".*; rmdir %s 2>/dev/null; exit 0",
             dir, dir, dir);
    sh[2] = line;
    muster_exec_opts_init(&o);
    o.argv = sh;
    o.argc = 3;
    o.stdin_fd = -1;
    o.stderr_fd = -1;
    o.on_stdout = ends_out;
    o.arg = p;
    o.cancel = &run->cancel;
    if (muster_exec_at(&t, &o, &code, err, sizeof(err)) != 0)
      continue;
  }
  muster_run_flush_lines_(p);
}

/* A marker no command's output holds by chance: RANK_END_PREFIX and 32
 * random hex digits. */
static void new_marker(char *buf, size_t size) {
  unsigned char r[16];
  size_t off;

  if (getrandom(r, sizeof(r), 0) != (ssize_t)sizeof(r)) {
    struct timespec ts;
    uint64_t a = (uint64_t)getpid(), b;
    clock_gettime(CLOCK_REALTIME, &ts);
    b = (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
    memcpy(r, &a, sizeof(a));
    memcpy(r + 8, &b, sizeof(b));
  }
  off = (size_t)snprintf(buf, size, "%s", RANK_END_PREFIX);
  for (size_t i = 0; i < sizeof(r) && off + 2 < size; i++)
    off += (size_t)snprintf(buf + off, size - off, "%02x", r[i]);
}

/* Two workers share a host's network, and so one Open MPI daemon, when
 * they report the same host name and either the same address (Slurm's
 * workers on one node) or each a loopback address of their own (the local
 * backend's --network host: one network, 127.0.X.Y each). A local worker
 * in a network namespace of its own (--network bridge) has an address of
 * its own on the bridge: a node of its own, which reaches the others over
 * TCP, as a daemon in another worker could not reach its loopback. */
static int same_host(const muster_worker *a, const muster_worker *b) {
  if (!a->hostname || !b->hostname || strcmp(a->hostname, b->hostname) != 0)
    return 0;
  if (!a->ip_address || !b->ip_address)
    return 1;
  return strcmp(a->ip_address, b->ip_address) == 0 ||
         (strncmp(a->ip_address, "127.", 4) == 0 && strncmp(b->ip_address, "127.", 4) == 0);
}

/* Appends ",fmt" (or "fmt" to an empty list) to *list; -1 when out of
 * memory (*list is then NULL). */
static int list_add(char **list, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static int list_add(char **list, const char *fmt, ...) {
  va_list ap;
  char *item = NULL, *joined;

  va_start(ap, fmt);
  if (vasprintf(&item, fmt, ap) < 0)
    item = NULL;
  va_end(ap);
  joined = item ? xasprintf("%s%s%s", *list ? *list : "", *list ? "," : "", item) : NULL;
  free(item);
  free(*list);
  *list = joined;
  return joined ? 0 : -1;
}

/* The exec-address lists (MUSTER_EXEC_HOSTS, MUSTER_EXEC_RANKS) are written
 * here and read by muster_exec_list_find() (exec.c), both in the format of
 * hostport.h: "ip:port,ip:port,...". */
static int exec_list_add(char **list, const muster_worker *w) {
  return list_add(list, "%s:%d", w->ip_address, w->exec_port);
}

/* The program of Open MPI's agents (rsh, rank): muster-launcher beside
 * program where it is installed (it starts without libcurl's libraries,
 * twice on the way to every rank), else program itself. New string. */
static char *agent_program(const char *program) {
  const char *slash = strrchr(program, '/');
  char *launcher;

  if (!slash)
    return xasprintf("%s", program);
  launcher = xasprintf("%.*s/muster-launcher", (int)(slash - program), program);
  if (launcher && access(launcher, X_OK) == 0)
    return launcher;
  free(launcher);
  return xasprintf("%s", program);
}

/* Runs mpirun here, with muster's rsh agent, so that its daemons start
 * inside the workers through their exec channel. Open MPI sees one node per
 * host: the workers that share a host share one daemon (started in the
 * first of them), and each rank is started through `muster rank`, which
 * runs it inside its own worker, again through the exec channel. Ranks on
 * one host thus talk through shared memory, as Open MPI's ranks on one node
 * do, and every rank still lives (and is stopped) with its worker. */
void muster_run_allreduce_(struct run *run, const char *master) {
  const muster_run_opts *o = run->o;
  char *program = agent_program(o->muster_program ? o->muster_program : "muster");
  size_t nw = run->workers.count;
  char *hosts = NULL, *exec_hosts = NULL, *exec_ranks = NULL, *agent = NULL, np[16];
  char *argv[170];
  char *own[9] = {0};
  char **envp = NULL;
  char *placed = calloc(nw ? nw : 1, 1);
  size_t *rank_worker = calloc(nw ? nw : 1, sizeof(*rank_worker));
  size_t nenv = 0, off = 0, nranks = 0;
  int out[2] = {-1, -1}, err[2] = {-1, -1}, n = 0, status = 0, oom = !placed || !rank_worker;
  posix_spawn_file_actions_t fa;
  pthread_t t_out, t_err;
  struct proc p;
  struct relay ro, re;
  struct rank_ends ends = {0};

  memset(&p, 0, sizeof(p));
  p.run = run;
  p.role = "mpirun";
  new_marker(ends.marker, sizeof(ends.marker));
  p.take_line = muster_run_take_rank_end_;
  p.take_arg = &ends;
  p.keep_whole = ends.marker;
  /* Ranks in host order: all of the first worker's host, then the next
   * host's; -H names each host by its first worker, with a slot per worker. */
  for (size_t i = 0; !oom && i < nw; i++) {
    const muster_worker *head = &run->workers.items[i];
    int slots = 0;
    if (placed[i])
      continue;
    for (size_t j = i; j < nw; j++) {
      const muster_worker *w = &run->workers.items[j];
      if (placed[j] || (j != i && !same_host(head, w)))
        continue;
      placed[j] = 1;
      slots++;
      rank_worker[nranks++] = j;
      oom |= exec_list_add(&exec_ranks, w);
    }
    oom |= list_add(&hosts, "%s:%d", head->ip_address, slots);
    oom |= exec_list_add(&exec_hosts, head);
  }
  agent = program ? xasprintf("%s rsh", program) : NULL;
  snprintf(np, sizeof(np), "%zu", run->workers.count);
  argv[n++] = "mpirun";
  if (geteuid() == 0)
    argv[n++] = "--allow-run-as-root";
  argv[n++] = "-np";
  argv[n++] = np;
  argv[n++] = "-H";
  argv[n++] = hosts;
  argv[n++] = "--mca";
  argv[n++] = "plm_rsh_agent";
  argv[n++] = agent;
  /* mpirun starts every daemon itself, through the agent here (where the
   * workers' exec addresses are known), and they all report to it directly;
   * a tree spawn would run the agent inside a worker. Without a tree Open
   * MPI would --daemonize its daemons: they would detach from the exec
   * channel (and from the worker's session, so stopping the worker would
   * miss them), and one dying before it reported in would leave mpirun
   * waiting forever. Attached, a daemon's exec connection lives exactly as
   * long as the daemon, and its end is an agent exit mpirun acts on. */
  argv[n++] = "--mca";
  argv[n++] = "plm_rsh_no_tree_spawn";
  argv[n++] = "1";
  argv[n++] = "--leave-session-attached";
  /* With --bind-to none, rtc hwloc has nothing to do but share the
   * topology, where Open MPI 4.1's daemons have been seen to crash. */
  argv[n++] = "--mca";
  argv[n++] = "rtc";
  argv[n++] = "^hwloc";
  argv[n++] = "--mca";
  argv[n++] = "routed";
  argv[n++] = "direct";
  argv[n++] = "--tag-output";
  argv[n++] = "--bind-to";
  argv[n++] = "none";
  /* Rank r is the r-th worker of exec_ranks: fill each host in turn. */
  argv[n++] = "--map-by";
  argv[n++] = "slot";
  argv[n++] = "-x";
  argv[n++] = "MASTER_ADDR";
  argv[n++] = "-x";
  argv[n++] = "MASTER_PORT";
  argv[n++] = "-x";
  argv[n++] = "WORLD_SIZE";
  argv[n++] = "-x";
  argv[n++] = "MUSTER_EXEC_RANKS";
  argv[n++] = "-x";
  argv[n++] = "MUSTER_RESTART_COUNT";
  argv[n++] = "-x";
  argv[n++] = RANK_END_ENV;
  /* Ranks start in mpirun's directory (this one) unless the run names its
   * own, as its workers do. */
  if (o->cwd && *o->cwd) {
    argv[n++] = "-wdir";
    argv[n++] = (char *)o->cwd;
  }
  argv[n++] = program;
  argv[n++] = "rank";
  argv[n++] = "--";
  for (size_t i = 0; i < run->argc && n < 160; i++)
    argv[n++] = (char *)run->argv[i];
  argv[n] = NULL;

  /* The agent learns each host's exec port and the session's token from
   * the environment, instead of asking the controller for every daemon. */
  own[0] = xasprintf("MUSTER_EXEC_HOSTS=%s", exec_hosts ? exec_hosts : "");
  own[1] = xasprintf("MUSTER_EXEC_TOKEN=%s", run->exec_token);
  own[2] = xasprintf("MASTER_ADDR=%s", master);
  own[3] = xasprintf("MASTER_PORT=%d", o->port);
  own[4] = xasprintf("WORLD_SIZE=%zu", run->workers.count);
  own[5] = xasprintf("MUSTER_EXEC_RANKS=%s", exec_ranks ? exec_ranks : "");
  own[6] = xasprintf("MUSTER_RESTART_COUNT=%d", run->attempt);
  own[7] = xasprintf("%s=%s", RANK_END_ENV, ends.marker);
  /* Open MPI's hwloc reads the PCI devices of the host in mpirun and in
   * every daemon (50 ms and more each, most of a daemon's start), for NIC
   * locality that --bind-to none never uses; GPUs are NCCL's business. A
   * user's own setting wins, and a host with a fabric keeps it all (the
   * daemons get what mpirun has: where the nodes have a fabric and this
   * host none, HWLOC_COMPONENTS= (empty) keeps the reading on). */
  if (!getenv("HWLOC_COMPONENTS") && !host_has_fabric())
    own[8] = xasprintf("HWLOC_COMPONENTS=-linuxio,-pci");
  for (char **e = environ; *e; e++)
    nenv++;
  envp = calloc(nenv + 10, sizeof(*envp));
  for (int i = 0; i < 8; i++)
    oom |= !own[i];
  if (oom || !envp || !hosts || !exec_ranks || !agent || pipe2(out, O_CLOEXEC) != 0 ||
      pipe2(err, O_CLOEXEC) != 0) {
    muster_run_fail_(run, NULL, "could not prepare mpirun: %s", strerror(errno));
    goto out;
  }
  for (char **e = environ; *e; e++)
    if (!env_run_sets(*e))
      envp[off++] = *e;
  for (int i = 0; i < 9 && own[i]; i++)
    envp[off++] = own[i];
  envp[off] = NULL;

  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_adddup2(&fa, out[1], 1);
  posix_spawn_file_actions_adddup2(&fa, err[1], 2);
  pthread_mutex_lock(&run->lock);
  if (!run->cancel && posix_spawnp(&run->mpirun, "mpirun", &fa, NULL, argv, envp) != 0) {
    run->mpirun = 0;
    pthread_mutex_unlock(&run->lock);
    posix_spawn_file_actions_destroy(&fa);
    muster_run_fail_(run, NULL, "could not start mpirun (is Open MPI installed?)");
    goto out;
  }
  pthread_mutex_unlock(&run->lock);
  posix_spawn_file_actions_destroy(&fa);
  close(out[1]);
  close(err[1]);
  out[1] = err[1] = -1;
  if (run->mpirun <= 0)
    goto out;

  ro = (struct relay){&p, out[0], 0};
  re = (struct relay){&p, err[0], 1};
  pthread_create(&t_out, NULL, relay_main, &ro);
  pthread_create(&t_err, NULL, relay_main, &re);
  while (waitpid(run->mpirun, &status, 0) < 0 && errno == EINTR)
    ;
  pthread_mutex_lock(&run->lock);
  run->mpirun = 0;
  pthread_mutex_unlock(&run->lock);
  pthread_join(t_out, NULL);
  pthread_join(t_err, NULL);
  muster_run_flush_lines_(&p);
  if (!(WIFEXITED(status) && WEXITSTATUS(status) == 0))
    collect_rank_ends(run, &p, exec_hosts);
  /* A rank that failed is named, with its worker and the cause; mpirun's
   * exit code says neither (it is the failed rank's, or 255 for a daemon
   * that was lost). */
  if (ends.seen && !(WIFEXITED(status) && WEXITSTATUS(status) == 0))
    fail_rank(run, &ends, rank_worker);
  else if (WIFEXITED(status) && WEXITSTATUS(status) == 255)
    muster_run_await_worker_failure_(run, 3);
  if (WIFEXITED(status) && WEXITSTATUS(status) != 0)
    muster_run_fail_(run, NULL, "mpirun exited with code %d", WEXITSTATUS(status));
  else if (WIFSIGNALED(status))
    muster_run_fail_(run, NULL, "mpirun was killed by signal %d", WTERMSIG(status));
out:
  for (int i = 0; i < 2; i++) {
    if (out[i] >= 0)
      close(out[i]);
    if (err[i] >= 0)
      close(err[i]);
  }
  for (int i = 0; i < 9; i++)
    free(own[i]);
  free(envp);
  free(hosts);
  free(exec_hosts);
  free(exec_ranks);
  free(agent);
  free(program);
  free(placed);
  free(rank_worker);
}
