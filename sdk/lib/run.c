/* run.c: muster_run_cluster(), see muster.h. */
#include "envlists.h"
#include "fabric.h"
#include "hostport.h"
#include "internal.h"
#include "muster.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

#define LINE_MAX_BYTES (64 * 1024)

void muster_run_opts_init(muster_run_opts *o) {
  memset(o, 0, sizeof(*o));
  o->mode = MUSTER_RUN_ALLREDUCE;
  o->n_workers = 2;
  o->cpu = 1;
  o->memory = 1;
  o->port = 2222;
  o->timeout_seconds = 60;
}

void muster_run_result_free(muster_run_result *r) {
  if (!r)
    return;
  free(r->summary);
  r->summary = NULL;
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

/* One process of the run: a PS or worker (through exec) or mpirun. */
struct proc {
  struct run *run;
  const char *role;
  int index;
  muster_exec_target target;
  char *env[10];
  size_t nenv;
  char line[2][LINE_MAX_BYTES];
  size_t linelen[2];
  int exit_code;
  int rc;
  char err[512];
  pthread_t thread;
  int started;
};

struct run {
  const muster_run_opts *o;
  muster_run_result *r;
  pthread_mutex_t lock;
  pthread_cond_t failed; /* signalled when the first failure is recorded */
  volatile int cancel;
  pid_t mpirun;
  char *last_line; /* of worker 0 / rank 0 */
  muster_worker_list ps, workers;
  char exec_token[128];
  /* This attempt's command (the options' own, or with the trainer's
   * checkpoint flags), and its number (0: the first; MUSTER_RESTART_COUNT). */
  const char *const *argv;
  size_t argc;
  int attempt;
  const char *run_id; /* the run's record, which its workers join ("": none) */
  /* The attempt must not be restarted: 1, a worker was stopped from
   * outside (by the user, or its session's lease ran out); 2, its workers
   * could not be stopped. */
  int final;
};

/* Records the first failure only. */
static void fail(struct run *run, const char *worker, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void fail(struct run *run, const char *worker, const char *fmt, ...) {
  va_list ap;

  pthread_mutex_lock(&run->lock);
  if (!run->r->failure[0]) {
    va_start(ap, fmt);
    vsnprintf(run->r->failure, sizeof(run->r->failure), fmt, ap);
    va_end(ap);
    snprintf(run->r->failed_worker, sizeof(run->r->failed_worker), "%s", worker ? worker : "");
    pthread_cond_broadcast(&run->failed);
  }
  run->cancel = 1;
  if (run->mpirun > 0)
    kill(run->mpirun, SIGTERM);
  pthread_mutex_unlock(&run->lock);
}

/* Hands out complete lines of a process's output, remembering worker 0's /
 * rank 0's last stdout line (the trainer's summary). */
static void emit(struct proc *p, int is_err, const char *data, size_t len) {
  struct run *run = p->run;
  size_t *n = &p->linelen[is_err];
  char *buf = p->line[is_err];

  for (size_t i = 0; i < len; i++) {
    int full = *n == LINE_MAX_BYTES - 1;
    if (data[i] != '\n' && !full) {
      buf[(*n)++] = data[i];
      continue;
    }
    buf[*n] = '\0';
    pthread_mutex_lock(&run->lock);
    if (run->o->on_output)
      run->o->on_output(run->o->arg, p->role, p->index, is_err ? MUSTER_STDERR : MUSTER_STDOUT, buf,
                        *n);
    if (!is_err && strcmp(p->role, "ps") != 0) {
      const char *text = buf;
      /* mpirun --tag-output: "[1,0]<stdout>:line" is rank 0's line. */
      if (strcmp(p->role, "mpirun") == 0) {
        const char *tag = strstr(buf, "<stdout>:");
        text = strncmp(buf, "[1,0]", 5) == 0 && tag ? tag + 9 : NULL;
      } else if (p->index != 0) {
        text = NULL;
      }
      if (text && *text) {
        free(run->last_line);
        run->last_line = strdup(text);
      }
    }
    pthread_mutex_unlock(&run->lock);
    *n = 0;
    if (full && data[i] != '\n')
      buf[(*n)++] = data[i];
  }
}

static void flush_lines(struct proc *p) {
  if (p->linelen[0])
    emit(p, 0, "\n", 1);
  if (p->linelen[1])
    emit(p, 1, "\n", 1);
}

static int on_out(void *arg, const char *d, size_t n) {
  emit(arg, 0, d, n);
  return 0;
}

static int on_err(void *arg, const char *d, size_t n) {
  emit(arg, 1, d, n);
  return 0;
}

static void await_worker_failure(struct run *run, int seconds);

static void *exec_main(void *arg) {
  struct proc *p = arg;
  muster_exec_opts eo;

  muster_exec_opts_init(&eo);
  eo.argv = p->run->argv;
  eo.argc = p->run->argc;
  eo.env = (const char *const *)p->env;
  eo.nenv = p->nenv;
  eo.on_stdout = on_out;
  eo.on_stderr = on_err;
  eo.arg = p;
  eo.cancel = &p->run->cancel;
  p->rc = muster_exec_at(&p->target, &eo, &p->exit_code, p->err, sizeof(p->err));
  flush_lines(p);
  /* A failure ends the run at once, whichever process it is: the others
   * are cancelled now, not when their turn to be waited for comes. */
  if (p->run->cancel)
    return NULL;
  /* A lost connection, or a command killed by SIGTERM or SIGKILL (what a
   * stop of its worker, an expired lease or the OOM killer sends): the
   * controller says moments later what happened to the worker (stopped by
   * the user, out of memory); that names the cause better, and a stop is
   * no failure to restart after. */
  if (p->rc || p->exit_code == 128 + SIGTERM || p->exit_code == 128 + SIGKILL)
    await_worker_failure(p->run, 3);
  if (p->rc)
    fail(p->run, p->target.worker_id, "%s %d (%s): %s", p->role, p->index, p->target.worker_id,
         p->err);
  else if (p->exit_code != 0)
    fail(p->run, p->target.worker_id, "%s %d (%s) exited with code %d", p->role, p->index,
         p->target.worker_id, p->exit_code);
  return NULL;
}

/* Follows the event stream and fails the run when one of its workers fails
 * or is stopped by someone else. */
struct monitor {
  struct run *run;
  muster_client *c;
  int64_t since;
};

static int watch(void *arg, const muster_event *e) {
  struct monitor *m = arg;
  struct run *run = m->run;
  muster_worker_list *lists[2] = {&run->ps, &run->workers};

  if (e->to != MUSTER_FAILED && e->to != MUSTER_STOPPED)
    return run->cancel;
  for (int k = 0; k < 2; k++)
    for (size_t i = 0; i < lists[k]->count; i++)
      if (strcmp(lists[k]->items[i].id, e->worker_id) == 0 && !run->cancel) {
        /* A stop is someone's decision to end the run: no restart. */
        if (e->to == MUSTER_STOPPED)
          run->final = 1;
        /* The event's detail is the worker's failure sentence (the client
         * is busy streaming: no other call on it from here). */
        fail(run, e->worker_id, "%s %zu (%s) %s: %s", k ? "worker" : "ps", i, e->worker_id,
             e->to == MUSTER_FAILED ? "failed" : "was stopped",
             e->detail && e->detail[0] ? e->detail : muster_status_name(e->to));
      }
  return run->cancel;
}

static void *monitor_main(void *arg) {
  struct monitor *m = arg;

  if (muster_events(m->c, m->since, watch, m) != 0 && !m->run->cancel)
    fail(m->run, NULL, "lost the controller's event stream: %s", muster_client_errmsg(m->c));
  return NULL;
}

static char *xasprintf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static char *xasprintf(const char *fmt, ...) {
  va_list ap;
  char *s = NULL;

  va_start(ap, fmt);
  if (vasprintf(&s, fmt, ap) < 0)
    s = NULL;
  va_end(ap);
  return s;
}

/* TF_CONFIG for task (type, index) of cluster (a JSON object). */
static char *tf_config(json_t *cluster, const char *type, int index) {
  json_t *t =
      json_pack("{s:O, s:{s:s, s:i}}", "cluster", cluster, "task", "type", type, "index", index);
  char *s = json_dumps(t, JSON_COMPACT);
  json_decref(t);
  return s;
}

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
    emit(r->p, r->is_err, buf, (size_t)n);
  }
  return NULL;
}

/* Two workers share a host when they report the same host name (the
 * local backend's workers all do; Slurm jobs on one node do). */
static int same_host(const muster_worker *a, const muster_worker *b) {
  return a->hostname && b->hostname && strcmp(a->hostname, b->hostname) == 0;
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

/* A rank or daemon that lost its worker's exec connection makes mpirun exit
 * with 255 (what muster rank and muster rsh then say, as ssh does). The
 * controller tells the monitor which worker failed, and why, moments later:
 * wait a little for that, so that the run names the worker. */
static void await_worker_failure(struct run *run, int seconds) {
  struct timespec end;

  clock_gettime(CLOCK_MONOTONIC, &end);
  end.tv_sec += seconds;
  pthread_mutex_lock(&run->lock);
  while (!run->r->failure[0] && pthread_cond_timedwait(&run->failed, &run->lock, &end) == 0)
    ;
  pthread_mutex_unlock(&run->lock);
}

/* Runs mpirun here, with muster's rsh agent, so that its daemons start
 * inside the workers through their exec channel. Open MPI sees one node per
 * host: the workers that share a host share one daemon (started in the
 * first of them), and each rank is started through `muster rank`, which
 * runs it inside its own worker, again through the exec channel. Ranks on
 * one host thus talk through shared memory, as Open MPI's ranks on one node
 * do, and every rank still lives (and is stopped) with its worker. */
static void run_allreduce(struct run *run, const char *master) {
  const muster_run_opts *o = run->o;
  char *program = agent_program(o->muster_program ? o->muster_program : "muster");
  size_t nw = run->workers.count;
  char *hosts = NULL, *exec_hosts = NULL, *exec_ranks = NULL, *agent = NULL, np[16];
  char *argv[170];
  char *own[8] = {0};
  char **envp = NULL;
  char *placed = calloc(nw ? nw : 1, 1);
  size_t nenv = 0, off = 0;
  int out[2] = {-1, -1}, err[2] = {-1, -1}, n = 0, status = 0, oom = !placed;
  posix_spawn_file_actions_t fa;
  pthread_t t_out, t_err;
  struct proc p;
  struct relay ro, re;

  memset(&p, 0, sizeof(p));
  p.run = run;
  p.role = "mpirun";
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
  argv[n++] = "MUSTER_EXEC_TOKEN";
  argv[n++] = "-x";
  argv[n++] = "MUSTER_RESTART_COUNT";
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
  /* Open MPI's hwloc reads the PCI devices of the host in mpirun and in
   * every daemon (50 ms and more each, most of a daemon's start), for NIC
   * locality that --bind-to none never uses; GPUs are NCCL's business. A
   * user's own setting wins, and a host with a fabric keeps it all (the
   * daemons get what mpirun has: where the nodes have a fabric and this
   * host none, HWLOC_COMPONENTS= (empty) keeps the reading on). */
  if (!getenv("HWLOC_COMPONENTS") && !host_has_fabric())
    own[7] = xasprintf("HWLOC_COMPONENTS=-linuxio,-pci");
  for (char **e = environ; *e; e++)
    nenv++;
  envp = calloc(nenv + 9, sizeof(*envp));
  for (int i = 0; i < 7; i++)
    oom |= !own[i];
  if (oom || !envp || !hosts || !exec_ranks || !agent || pipe2(out, O_CLOEXEC) != 0 ||
      pipe2(err, O_CLOEXEC) != 0) {
    fail(run, NULL, "could not prepare mpirun: %s", strerror(errno));
    goto out;
  }
  for (char **e = environ; *e; e++)
    if (!env_run_sets(*e))
      envp[off++] = *e;
  for (int i = 0; i < 8 && own[i]; i++)
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
    fail(run, NULL, "could not start mpirun (is Open MPI installed?)");
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
  flush_lines(&p);
  if (WIFEXITED(status) && WEXITSTATUS(status) == 255)
    await_worker_failure(run, 3);
  if (WIFEXITED(status) && WEXITSTATUS(status) != 0)
    fail(run, NULL, "mpirun exited with code %d", WEXITSTATUS(status));
  else if (WIFSIGNALED(status))
    fail(run, NULL, "mpirun was killed by signal %d", WTERMSIG(status));
out:
  for (int i = 0; i < 2; i++) {
    if (out[i] >= 0)
      close(out[i]);
    if (err[i] >= 0)
      close(err[i]);
  }
  for (int i = 0; i < 8; i++)
    free(own[i]);
  free(envp);
  free(hosts);
  free(exec_hosts);
  free(exec_ranks);
  free(agent);
  free(program);
  free(placed);
}

/* Runs the command on every PS and worker through their exec channels, and
 * waits for the workers (PS processes are ended when the workers are done,
 * as a TensorFlow PS never ends by itself). */
static void run_exec_all(struct run *run, const char *master, json_t *cluster) {
  const muster_run_opts *o = run->o;
  size_t nps = run->ps.count, nw = run->workers.count;
  struct proc *procs = calloc(nps + nw, sizeof(*procs));

  if (!procs) {
    fail(run, NULL, "out of memory");
    goto out;
  }
  for (size_t k = 0; k < nps + nw; k++) {
    struct proc *p = &procs[k];
    int is_ps = k < nps;
    const muster_worker *w = is_ps ? &run->ps.items[k] : &run->workers.items[k - nps];
    char *tf;

    p->run = run;
    p->role = is_ps ? "ps" : "worker";
    p->index = (int)(is_ps ? k : k - nps);
    snprintf(p->target.host, sizeof(p->target.host), "%s", w->ip_address);
    p->target.port = w->exec_port;
    snprintf(p->target.token, sizeof(p->target.token), "%s", run->exec_token);
    snprintf(p->target.worker_id, sizeof(p->target.worker_id), "%s", w->id);
    tf = tf_config(cluster, p->role, p->index);
    p->env[p->nenv++] = xasprintf("TF_CONFIG=%s", tf ? tf : "");
    p->env[p->nenv++] = xasprintf("MUSTER_CLUSTER=%s", tf ? tf : "");
    free(tf);
    p->env[p->nenv++] = xasprintf("MASTER_ADDR=%s", master);
    p->env[p->nenv++] = xasprintf("MASTER_PORT=%d", o->port);
    p->env[p->nenv++] = xasprintf("WORLD_SIZE=%zu", nw);
    p->env[p->nenv++] = xasprintf("RANK=%d", is_ps ? -1 : p->index);
    p->env[p->nenv++] = xasprintf("LOCAL_RANK=0");
    p->env[p->nenv++] = xasprintf("MUSTER_RESTART_COUNT=%d", run->attempt);
  }
  for (size_t k = 0; k < nps + nw; k++)
    procs[k].started = pthread_create(&procs[k].thread, NULL, exec_main, &procs[k]) == 0;
  /* The workers decide the outcome (each thread reports its own failure). */
  for (size_t k = nps; k < nps + nw; k++)
    if (procs[k].started) {
      pthread_join(procs[k].thread, NULL);
      procs[k].started = 0;
    }
  /* Done (or failed): the parameter servers go too. */
  run->cancel = 1;
  for (size_t k = 0; k < nps; k++)
    if (procs[k].started)
      pthread_join(procs[k].thread, NULL);
out:
  for (size_t k = 0; procs && k < nps + nw; k++)
    for (size_t i = 0; i < procs[k].nenv; i++)
      free(procs[k].env[i]);
  free(procs);
}

/* Launches the parameter servers (mode ps) and the workers as one launch,
 * so that a backend places them as one gang; splits them into run->ps and
 * run->workers. */
static int launch_cluster(muster_client *c, struct run *run, const char *session) {
  const muster_run_opts *o = run->o;
  muster_launch_opts lo[2];
  muster_worker_list all = {0};
  size_t ng = 0, nps = o->mode == MUSTER_RUN_PS ? (size_t)o->n_ps : 0;
  int rc;

  memset(&run->ps, 0, sizeof(run->ps));
  memset(&run->workers, 0, sizeof(run->workers));
  if (nps) {
    muster_launch_opts_init(&lo[ng]);
    lo[ng].n = (int)nps;
    lo[ng].cpu = o->ps_cpu > 0 ? o->ps_cpu : o->cpu;
    lo[ng].memory = o->ps_memory > 0 ? o->ps_memory : o->memory;
    lo[ng].role = lo[ng].name = "ps";
    lo[ng].session = session;
    lo[ng].run = run->run_id[0] ? run->run_id : NULL;
    ng++;
  }
  muster_launch_opts_init(&lo[ng]);
  lo[ng].n = o->n_workers;
  lo[ng].cpu = o->cpu;
  lo[ng].memory = o->memory;
  lo[ng].nvidia_gpu = o->nvidia_gpu;
  lo[ng].role = lo[ng].name = "worker";
  lo[ng].session = session;
  lo[ng].run = run->run_id[0] ? run->run_id : NULL;
  ng++;
  rc = muster_launch_groups(c, lo, ng, &all);
  if (rc)
    return rc;
  /* Group after group: the parameter servers first. */
  run->ps.items = calloc(nps + 1, sizeof(*run->ps.items));
  run->workers.items = calloc(all.count + 1, sizeof(*run->workers.items));
  if (!run->ps.items || !run->workers.items) {
    /* The workers run: they stay in one list, for the stop. */
    free(run->ps.items);
    free(run->workers.items);
    run->ps.items = NULL;
    run->workers = all;
    return MUSTER_E_NOMEM;
  }
  for (size_t i = 0; i < all.count; i++) {
    muster_worker_list *l = i < nps ? &run->ps : &run->workers;
    l->items[l->count++] = all.items[i];
  }
  free(all.items); /* the workers moved into the two lists */
  return 0;
}

/* One attempt of the run: launches, awaits, runs the command, stops every
 * worker. Returns 0 when it got as far as running (r->failure says whether
 * the command failed), or the controller's error. */
static int run_attempt(muster_client *c, const muster_run_opts *o, muster_run_result *r,
                       const char *session, const char *const *argv, size_t argc, int attempt,
                       int *final) {
  struct run run;
  struct monitor mon;
  pthread_t mon_thread;
  int mon_started = 0, rc;
  char master[64];
  const char **ids = NULL;
  muster_await_result ar;
  json_t *cluster = NULL, *ps = json_array(), *wk = json_array();
  double t0 = now_s();

  memset(&run, 0, sizeof(run));
  memset(&ar, 0, sizeof(ar));
  memset(&mon, 0, sizeof(mon));
  *final = 0;
  r->exit_code = 1;
  r->failure[0] = r->failed_worker[0] = '\0';
  free(r->summary);
  r->summary = NULL;
  run.o = o;
  run.r = r;
  run.argv = argv;
  run.argc = argc;
  run.attempt = attempt;
  run.run_id = r->run_id;
  pthread_mutex_init(&run.lock, NULL);
  {
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&run.failed, &ca);
    pthread_condattr_destroy(&ca);
  }
  rc = launch_cluster(c, &run, session);
  if (rc && run.workers.count)
    goto stop; /* launched, then out of memory: they go again */
  if (rc)
    goto out;

  /* Await every one running; fail fast with the failures. */
  ids = calloc(run.ps.count + run.workers.count + 1, sizeof(*ids));
  if (!ids) {
    rc = MUSTER_E_NOMEM;
    goto stop;
  }
  for (size_t i = 0; i < run.ps.count; i++)
    ids[i] = run.ps.items[i].id;
  for (size_t i = 0; i < run.workers.count; i++)
    ids[run.ps.count + i] = run.workers.items[i].id;
  rc = muster_await(c, ids, run.ps.count + run.workers.count, 0, o->timeout_seconds, &ar);
  if (rc)
    goto stop;
  if (ar.failures.count) {
    const muster_worker *f = &ar.failures.items[0];
    /* Stopped while it started: someone ended the run. */
    for (size_t k = 0; k < ar.failures.count; k++)
      if (ar.failures.items[k].status == MUSTER_STOPPED)
        run.final = 1;
    fail(&run, f->id, "%s %s did not start: %s", f->role ? f->role : "worker", f->id,
         ar.timed_out && !muster_status_terminal(f->status)
             ? "still not running when the timeout passed"
             : (f->failure ? f->failure : muster_status_name(f->status)));
    goto stop;
  }
  /* The running workers, with their addresses, in launch order. */
  for (size_t k = 0; k < ar.workers.count; k++) {
    muster_worker *w = &ar.workers.items[k];
    muster_worker_list *l = w->role && strcmp(w->role, "ps") == 0 ? &run.ps : &run.workers;
    for (size_t i = 0; i < l->count; i++)
      if (strcmp(l->items[i].id, w->id) == 0) {
        muster_worker tmp = l->items[i];
        l->items[i] = *w;
        *w = tmp;
      }
  }
  r->start_s = now_s() - t0;
  if (muster_session_exec_token(c, session, run.exec_token, sizeof(run.exec_token)) != 0) {
    fail(&run, NULL, "could not get the session's exec token: %s", muster_client_errmsg(c));
    goto stop;
  }
  for (size_t i = 0; i < run.ps.count; i++)
    json_array_append_new(ps, json_sprintf("%s:%d", run.ps.items[i].ip_address, o->port));
  for (size_t i = 0; i < run.workers.count; i++)
    json_array_append_new(wk, json_sprintf("%s:%d", run.workers.items[i].ip_address, o->port));
  cluster = json_pack("{s:O, s:O}", "ps", ps, "worker", wk);
  snprintf(master, sizeof(master), "%s", run.workers.items[0].ip_address);

  /* Watch for failures while the command runs. */
  mon.run = &run;
  mon.since = 0;
  if (muster_client_new(muster_client_url(c), muster_client_token_(c), &mon.c) == 0) {
    muster_worker_list none;
    if (muster_list(mon.c, 1u << MUSTER_FAILED, session, NULL, &none, &mon.since) == 0)
      muster_worker_list_free(&none);
    mon_started = pthread_create(&mon_thread, NULL, monitor_main, &mon) == 0;
  }

  t0 = now_s();
  if (o->mode == MUSTER_RUN_ALLREDUCE)
    run_allreduce(&run, master);
  else
    run_exec_all(&run, master, cluster);
  r->run_s = now_s() - t0;
  if (!r->failure[0])
    r->exit_code = 0;

stop:
  run.cancel = 1;
  if (mon_started) {
    muster_client_cancel(mon.c);
    pthread_join(mon_thread, NULL);
  }
  muster_client_free(mon.c);
  /* Every worker of the run goes, whatever happened; only those: the
   * session may hold the user's other workers. */
  if (run.ps.count || run.workers.count) {
    size_t n = run.ps.count + run.workers.count;
    const char **mine = calloc(n, sizeof(*mine));
    muster_worker_list stopped;
    if (mine) {
      for (size_t i = 0; i < run.ps.count; i++)
        mine[i] = run.ps.items[i].id;
      for (size_t i = 0; i < run.workers.count; i++)
        mine[run.ps.count + i] = run.workers.items[i].id;
      /* Before a restart: stopped from outside meanwhile (the monitor may
       * have ended before its event came, or a failure of the command came
       * first)? */
      if (!run.final && r->failure[0] && attempt < o->max_restarts &&
          muster_list(c, 1u << MUSTER_STOPPED, session, NULL, &stopped, NULL) == 0) {
        for (size_t k = 0; k < stopped.count; k++)
          for (size_t i = 0; i < n; i++)
            if (strcmp(stopped.items[k].id, mine[i]) == 0)
              run.final = 1;
        muster_worker_list_free(&stopped);
      }
      if (muster_stop(c, mine, n, NULL, &stopped) == 0)
        muster_worker_list_free(&stopped);
      else
        run.final = 2; /* still running: a new attempt could run beside them */
      free(mine);
    } else {
      run.final = 2;
    }
  }
  *final = run.final;
  r->summary = run.last_line;
  run.last_line = NULL;
  if (rc == 0 || r->failure[0])
    rc = 0;
out:
  muster_await_result_free(&ar);
  muster_worker_list_free(&run.ps);
  muster_worker_list_free(&run.workers);
  free(ids);
  free(run.last_line);
  json_decref(cluster);
  json_decref(ps);
  json_decref(wk);
  pthread_cond_destroy(&run.failed);
  pthread_mutex_destroy(&run.lock);
  return rc;
}

/* ---- restarts ---- */

/* 1 if argv runs muster-train. */
static int is_trainer(const char *const *argv, size_t argc) {
  const char *base;

  if (argc == 0)
    return 0;
  base = strrchr(argv[0], '/');
  return strcmp(base ? base + 1 : argv[0], "muster-train") == 0;
}

/* The value of option name in argv ("--name V" or "--name=V"), or NULL. */
static const char *arg_value(const char *const *argv, size_t argc, const char *name) {
  size_t n = strlen(name);

  for (size_t i = 1; i < argc; i++) {
    if (strcmp(argv[i], name) == 0 && i + 1 < argc)
      return argv[i + 1];
    if (strncmp(argv[i], name, n) == 0 && argv[i][n] == '=')
      return argv[i] + n + 1;
  }
  return NULL;
}

/* The command of an attempt: the options' own, with --checkpoint ckpt when
 * it names none, and on a restart --auto-resume (muster-train resumes from
 * the checkpoint if rank 0 wrote one, on its own file system, else from the
 * command's --resume, if any). argv_out has room for argc + 3. */
static size_t trainer_argv(const muster_run_opts *o, const char *ckpt, int restart,
                           const char **argv_out) {
  size_t n = 0;

  for (size_t i = 0; i < o->argc; i++) {
    if (restart && strcmp(o->argv[i], "--auto-resume") == 0)
      continue;
    argv_out[n++] = o->argv[i];
  }
  if (!arg_value(o->argv, o->argc, "--checkpoint")) {
    argv_out[n++] = "--checkpoint";
    argv_out[n++] = ckpt;
  }
  if (restart)
    argv_out[n++] = "--auto-resume";
  return n;
}

/* Removes the run's own checkpoint directory (best effort: the client sees
 * it where the workers' file system is shared, as on the local backend). */
static void remove_run_dir(const char *ckpt) {
  char dir[1024], path[1300];
  char *slash;
  DIR *d;
  struct dirent *e;

  snprintf(dir, sizeof(dir), "%s", ckpt);
  slash = strrchr(dir, '/');
  if (!slash)
    return;
  *slash = '\0';
  d = opendir(dir);
  if (!d)
    return;
  /* The checkpoint, and a rank's half-written one (checkpoint.tmp.PID). */
  while ((e = readdir(d)) != NULL)
    if (strncmp(e->d_name, "checkpoint", 10) == 0) {
      snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
      unlink(path);
    }
  closedir(d);
  rmdir(dir);
}

static const char *mode_name(muster_run_mode m) {
  return m == MUSTER_RUN_PS ? "ps" : m == MUSTER_RUN_ALLREDUCE ? "allreduce" : "exec";
}

int muster_run_cluster(muster_client *c, const muster_run_opts *o, muster_run_result *r) {
  char session[72], ckpt[1024] = "", causes[3800] = "", why[1024];
  const char **argv = NULL;
  muster_lease *lease = NULL;
  size_t argc = o->argc;
  /* Checkpoints matter only to an allreduce run that may restart
   * (muster-train --mode ps cannot resume: its momentum lives on the
   * parameter servers). */
  int rc, final = 0, own_ckpt = 0,
          trainer = o->max_restarts > 0 && o->mode == MUSTER_RUN_ALLREDUCE &&
                    is_trainer(o->argv, o->argc);

  memset(r, 0, sizeof(*r));
  r->exit_code = 1;
  if (o->n_workers < 1 || o->n_ps < 0 || o->argc == 0 || o->max_restarts < 0 ||
      (o->mode != MUSTER_RUN_PS && o->n_ps))
    return MUSTER_E_INVALID;
  if (o->session) {
    snprintf(session, sizeof(session), "%s", o->session);
  } else {
    /* A session of its own: "stop every live worker of the session" at the
     * end touches nothing else, nor does its lease. */
    unsigned long x = (unsigned long)time(NULL) ^ ((unsigned long)getpid() << 16);
    snprintf(session, sizeof(session), "run-%08lx", x & 0xffffffffUL);
  }
  /* The lease first: from here on, this process dying stops the workers. */
  if (o->lease_ttl >= 0) {
    rc = muster_lease_start(c, session, o->lease_ttl, &lease);
    if (rc)
      return rc;
  }
  rc = muster_run_record_new(c, session, mode_name(o->mode), o->argv, o->argc, o->max_restarts,
                             r->run_id);
  if (rc)
    goto out;
  /* muster-train checkpoints into the run's directory, unless told where;
   * rank 0 makes the directory, where it runs. */
  if (trainer) {
    const char *given = arg_value(o->argv, o->argc, "--checkpoint");
    const char *dir = o->run_dir ? o->run_dir : getenv("MUSTER_RUN_DIR");
    const char *home = getenv("HOME");
    if (given)
      snprintf(ckpt, sizeof(ckpt), "%s", given);
    else if (dir && *dir)
      snprintf(ckpt, sizeof(ckpt), "%s/%s/checkpoint", dir, r->run_id);
    else
      snprintf(ckpt, sizeof(ckpt), "%s/.muster/runs/%s/checkpoint", home ? home : "/tmp",
               r->run_id);
    own_ckpt = !given;
    argv = calloc(o->argc + 4, sizeof(*argv));
    if (!argv) {
      rc = MUSTER_E_NOMEM;
      goto out;
    }
    argc = trainer_argv(o, ckpt, 0, argv);
  }

  for (int attempt = 0;; attempt++) {
    char cause[1100];
    size_t len;

    if (attempt > 0 && trainer)
      argc = trainer_argv(o, ckpt, 1, argv);
    rc = run_attempt(c, o, r, session, argv ? argv : o->argv, argv ? argc : o->argc, attempt,
                     &final);
    if (rc || !r->failure[0] || final || attempt >= o->max_restarts)
      break;
    /* A restart: every worker of the failed attempt is stopped already. */
    snprintf(cause, sizeof(cause), "%.1000s", r->failure);
    len = strlen(causes);
    snprintf(causes + len, sizeof(causes) - len, "%s(%d) %s", len ? "; " : "", attempt + 1, cause);
    r->restarts = attempt + 1;
    if (muster_run_record_restart(c, r->run_id, cause) != 0) {
      snprintf(r->failure, sizeof(r->failure), "could not record restart %d (%.1000s): %.900s",
               attempt + 1, cause, muster_client_errmsg(c));
      final = 1;
      break;
    }
    if (o->on_restart)
      o->on_restart(o->arg, attempt + 1, cause);
  }
  /* After restarts, the failure names every cause. */
  if (!rc && r->failure[0] && r->restarts > 0 && !strstr(r->failure, "could not record")) {
    char last[1100];
    size_t len = strlen(causes);
    snprintf(last, sizeof(last), "%.1000s", r->failure);
    snprintf(causes + len, sizeof(causes) - len, "; (%d) %s", r->restarts + 1, last);
    snprintf(r->failure, sizeof(r->failure), "failed after %d restart%s: %s", r->restarts,
             r->restarts == 1 ? "" : "s", causes);
  }
  /* The record's end is best effort: the training's outcome stands. */
  snprintf(why, sizeof(why), "%.1000s", rc ? muster_client_errmsg(c) : r->failure);
  {
    char *summary = NULL;
    if (!why[0] && r->summary)
      summary = strndup(r->summary, 16384); /* the controller keeps at most 64 KiB */
    int erc = muster_run_record_end(c, r->run_id, why[0] ? "failed" : "succeeded", summary,
                                    why[0] ? why : NULL);
    /* Not recorded: the record stays "running" until its session's lease
     * runs out (or forever without one); the training's outcome stands. */
    (void)erc;
    free(summary);
  }
  /* A run that succeeded needs its own checkpoint no more; a failed one
   * keeps it (--resume by hand). */
  if (own_ckpt && !why[0])
    remove_run_dir(ckpt);
out:
  free(argv);
  if (lease)
    (void)muster_lease_error(lease, r->lease_error, sizeof(r->lease_error));
  /* The workers are stopped: the lease goes back (should that fail, it runs
   * out by itself, with nothing left to stop). If they could not be
   * stopped, it is left to run out: the controller then stops them. */
  (void)muster_lease_end(lease, final == 2 ? MUSTER_LEASE_ABANDON : MUSTER_LEASE_RELEASE);
  return rc;
}
