/* run_stall.c: the stall watchdog of a run's attempt (docs/design.md,
 * "Stalls"). A run is stalled when no rank has made progress for
 * stall_timeout seconds: no new metric point, no output line, and (for a
 * run that posts no metrics) no CPU time worth the name. Then each worker
 * is asked what its processes do (`muster stack --json` through the exec
 * channel, all at once), and the report names every rank with its worker,
 * last step, state, CPU over the window and stack, the one behind first.
 * It goes to on_stall, to the run's record (POST /runs/{id}/stalls), and
 * with on_stall_fail it fails the attempt like a failed rank. */
#include "client_internal.h"
#include "muster.h"
#include "run_internal.h"

#include <ctype.h>
#include <jansson.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* The run's CPU that counts as progress (cores, over a sampling window),
 * for a run that posts no metrics. */
#define STALL_CPU_CORES 0.1
/* How long the workers get to say what they do. */
#define STALL_PROBE_S 40
#define REPORT_MAX 16384

static double mono_s(void) {
  struct timespec ts;

  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static double wall_s(void) {
  struct timespec ts;

  clock_gettime(CLOCK_REALTIME, &ts);
  return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

void muster_run_note_output_(struct run *run) {
  __atomic_store_n(&run->last_output_ms, (int64_t)(mono_s() * 1000), __ATOMIC_RELAXED);
}

/* ---- what each worker says ---- */

struct probe {
  struct run *run;
  const muster_worker *w;
  volatile int cancel;
  char *out;
  size_t len;
  int rc, exit_code;
  char err[256];
  pthread_t thread;
  int started;
};

static int probe_out(void *arg, const char *data, size_t len) {
  struct probe *p = arg;
  char *grown;

  if (p->len + len > 512 * 1024)
    return 0;
  grown = realloc(p->out, p->len + len + 1);
  if (!grown)
    return 0;
  p->out = grown;
  memcpy(p->out + p->len, data, len);
  p->len += len;
  p->out[p->len] = '\0';
  return 0;
}

static void *probe_main(void *arg) {
  struct probe *p = arg;
  const muster_run_opts *o = p->run->o;
  const char *argv[] = {o->muster_program ? o->muster_program : "muster", "stack", "--json"};
  muster_exec_target t;
  muster_exec_opts eo;

  memset(&t, 0, sizeof(t));
  snprintf(t.host, sizeof(t.host), "%s", p->w->ip_address ? p->w->ip_address : "");
  t.port = p->w->exec_port;
  snprintf(t.token, sizeof(t.token), "%s", p->run->exec_token);
  snprintf(t.worker_id, sizeof(t.worker_id), "%s", p->w->id);
  muster_exec_opts_init(&eo);
  eo.argv = argv;
  eo.argc = 3;
  eo.on_stdout = probe_out;
  eo.stderr_fd = -1;
  eo.arg = p;
  eo.cancel = &p->cancel;
  p->rc = muster_exec_at(&t, &eo, &p->exit_code, p->err, sizeof(p->err));
  return NULL;
}

/* ---- one rank's view ---- */

struct rank_view {
  int index; /* the worker's, in the run's order */
  long rank; /* its process's rank (RANK, Open MPI's), else the index */
  const char *worker;
  long step; /* the last metric step, -1: none */
  double step_at;
  double cpu_window; /* < 0: unknown */
  char state[2], wchan[64], doing[256], comm[64];
  long pid;
  int waits; /* blocked waiting for others (a lock, a socket): not behind */
  char *stacks;
};

/* The innermost frame of a py-bt traceback: "sleep (ddp.py:12)". */
static void python_top(const char *py, char *out, size_t size) {
  const char *t = py ? strstr(py, "most recent call first") : NULL, *b, *f;
  char builtin[64] = "", file[128] = "", func[64] = "";
  int line = 0;

  out[0] = '\0';
  if (!t)
    return;
  b = strstr(t, "<built-in method ");
  f = strstr(t, "File \"");
  if (b && (!f || b < f))
    sscanf(b + 17, "%63[A-Za-z0-9_]", builtin);
  if (f && sscanf(f + 6, "%127[^\"]\", line %d, in %63s", file, &line, func) >= 2) {
    const char *base = strrchr(file, '/');
    snprintf(out, size, "%s (%s:%d)", builtin[0] ? builtin : func, base ? base + 1 : file, line);
  } else if (builtin[0]) {
    snprintf(out, size, "%s", builtin);
  }
}

/* The first thread's innermost function in an eu-stack or gdb stack. */
static void native_top(const char *st, char *out, size_t size) {
  const char *h = st ? strstr(st, "#0 ") : NULL;
  char fn[128] = "";

  out[0] = '\0';
  if (!h)
    return;
  h += 3;
  while (*h == ' ')
    h++;
  /* eu-stack: "#0  0xADDR name"; gdb: "#0  0xADDR in name (" or "#0  name (" */
  if (strncmp(h, "0x", 2) == 0) {
    h += strcspn(h, " ");
    while (*h == ' ')
      h++;
    if (strncmp(h, "in ", 3) == 0)
      h += 3;
  }
  sscanf(h, "%127[^ (@\n]", fn);
  snprintf(out, size, "%s", fn);
}

/* The string member key of o, or "". */
static const char *str_or(json_t *o, const char *key) {
  const char *v = json_string_value(json_object_get(o, key));

  return v ? v : "";
}

static int mentions(const char *text, const char *const *words) {
  for (; text && *words; words++)
    if (strstr(text, *words))
      return 1;
  return 0;
}

/* What a report shows of a process's stacks: the Python traceback (from
 * gdb's py-bt, without gdb's own lines) and the native stack of its first
 * thread (the main one), at most 24 frames. A new string, or NULL. */
static char *short_stacks(const char *py, const char *na) {
  const char *t = py ? strstr(py, "Traceback (most recent call first):") : NULL;
  const char *end = t ? strstr(t, "\n[Inferior ") : NULL;
  const char *n0 = na ? strstr(na, "#0 ") : NULL, *n1;
  size_t tl = t ? (end ? (size_t)(end - t) : strlen(t)) : 0, nl = 0;
  int frames = 0;
  char *out;

  /* The first thread's frames: up to the next thread, or 24 of them. */
  for (n1 = n0; n1 && *n1 && frames < 24; frames++) {
    const char *eol = strchr(n1, '\n');
    n1 = eol ? eol + 1 : n1 + strlen(n1);
    if (strncmp(n1, "TID ", 4) == 0 || strncmp(n1, "Thread ", 7) == 0 || *n1 != '#')
      break;
  }
  if (n0)
    nl = (size_t)(n1 - n0);
  out = malloc(tl + nl + 64);
  if (!out)
    return NULL;
  snprintf(out, tl + nl + 64, "%.*s%s%s%.*s", (int)tl, t ? t : "", tl ? "\n" : "",
           nl ? "native, main thread:\n" : "", (int)nl, n0 ? n0 : "");
  return out;
}

/* Whether process pr of procs is muster's or Open MPI's own. */
static int is_agent(json_t *pr) {
  static const char *const agents[] = {"muster", "muster-launcher", "muster-workerd",
                                       "orted",  "prted",           NULL};
  const char *comm = str_or(pr, "comm");

  for (int i = 0; agents[i]; i++)
    if (strcmp(comm, agents[i]) == 0)
      return 1;
  return 0;
}

/* Whether pr has a child among procs that is a ranked process too (a
 * wrapper: bash -c, torchrun's agent), so that the child is the rank. */
static int has_ranked_child(json_t *procs, json_t *pr) {
  json_int_t pid = json_integer_value(json_object_get(pr, "pid"));
  size_t i;
  json_t *x;

  json_array_foreach(procs, i, x) if (json_integer_value(json_object_get(x, "ppid")) == pid &&
                                      json_is_integer(json_object_get(x, "rank")) &&
                                      !is_agent(x)) return 1;
  return 0;
}

/* The training's process among procs: a ranked one that is no agent and
 * no wrapper of another, with a stack, the busiest; else the busiest
 * process that is no agent. */
static json_t *pick_process(json_t *procs) {
  json_t *pr, *best = NULL, *busiest = NULL;
  size_t i;

  json_array_foreach(procs, i, pr) {
    double cpu = json_number_value(json_object_get(pr, "cpu_seconds"));
    if (is_agent(pr))
      continue;
    if (json_is_integer(json_object_get(pr, "rank")) && !has_ranked_child(procs, pr) &&
        (json_is_string(json_object_get(pr, "native_stack")) ||
         json_is_string(json_object_get(pr, "python_stack"))) &&
        (!best || cpu > json_number_value(json_object_get(best, "cpu_seconds"))))
      best = pr;
    if (!busiest || cpu > json_number_value(json_object_get(busiest, "cpu_seconds")))
      busiest = pr;
  }
  return best ? best : busiest;
}

/* Reads one worker's `muster stack --json` into v: the training's process
 * (pick_process()). */
static void read_probe(struct rank_view *v, const struct probe *p) {
  static const char *const waits_w[] = {"futex",   "poll",       "epoll",       "select",
                                        "sk_wait", "wait_woken", "unix_stream", "pipe_read",
                                        "tcp",     NULL};
  static const char *const collective[] = {"allreduce", "all_reduce", "AllReduce", "barrier",
                                           "broadcast", "all_gather", "allgather", "MPI_",
                                           "nccl",      "backward",   NULL};
  json_t *j = p->out ? json_loads(p->out, 0, NULL) : NULL, *procs, *best = NULL;
  const char *py, *na;
  char top[128] = "";

  procs = json_object_get(j, "processes");
  best = pick_process(procs);
  if (!best) {
    if (p->rc)
      snprintf(v->doing, sizeof(v->doing), "could not be asked what it does (%.200s)",
               p->err[0] ? p->err : muster_strerror(p->rc));
    else if (p->exit_code != 0)
      snprintf(v->doing, sizeof(v->doing),
               "could not be asked what it does (muster stack exited with code %d)", p->exit_code);
    else
      snprintf(v->doing, sizeof(v->doing), "could not be asked what it does (%s)",
               j ? "no process of it was found" : "its answer was not JSON");
    json_decref(j);
    return;
  }
  v->pid = (long)json_integer_value(json_object_get(best, "pid"));
  if (json_is_integer(json_object_get(best, "rank")))
    v->rank = (long)json_integer_value(json_object_get(best, "rank"));
  snprintf(v->comm, sizeof(v->comm), "%s", str_or(best, "comm"));
  snprintf(v->state, sizeof(v->state), "%s", str_or(best, "state"));
  snprintf(v->wchan, sizeof(v->wchan), "%s", str_or(best, "wchan"));
  py = json_string_value(json_object_get(best, "python_stack"));
  na = json_string_value(json_object_get(best, "native_stack"));
  python_top(py, top, sizeof(top));
  if (!top[0])
    native_top(na, top, sizeof(top));
  /* Waiting for the others: blocked on a lock or a socket, or in a
   * collective by its Python frames. Anything else (sleeping, computing,
   * reading a disk) is behind them. */
  v->waits = mentions(v->wchan, waits_w) || mentions(py, collective);
  snprintf(v->doing, sizeof(v->doing), "%s%s", v->waits ? "waits in " : "in ",
           top[0] ? top : (v->wchan[0] ? v->wchan : "?"));
  v->stacks = short_stacks(py, na);
  json_decref(j);
}

static int view_cmp(const void *a, const void *b) {
  const struct rank_view *x = a, *y = b;

  if (x->waits != y->waits)
    return x->waits - y->waits;
  /* A known step before an unknown one (a rank that logs no metrics, or
   * could not be asked), the lower first. */
  if ((x->step < 0) != (y->step < 0))
    return x->step < 0 ? 1 : -1;
  if (x->step != y->step)
    return x->step < y->step ? -1 : 1;
  return x->rank < y->rank ? -1 : x->rank > y->rank;
}

/* ---- the watchdog ---- */

struct stall {
  struct run *run;
  muster_client *c;
  double last; /* the last progress (monotonic) */
  int64_t since;
  int has_metrics;
  double cpu, cpu_t;   /* the run's CPU at the last sample */
  double *cpu_at_last; /* each worker's CPU when progress was last seen */
  double *cpu_now;
  double *cpu_asked; /* ... when the workers were asked (before their tools ran) */
  double asked_t;    /* when that was (monotonic) */
  double *cpu_prev;  /* each worker's CPU at the previous sample (< 0: not measured) */
  int reported;
};

/* Samples the workers' CPU seconds into cpu_now (-1: not measured).
 * Returns the CPU they used since the previous sample, over the workers
 * measured both times (a worker missed once adds no jump), or -1 if none
 * was; the sample becomes the previous one. */
static double sample_cpu(struct stall *s) {
  double used = -1;

  for (size_t i = 0; i < s->run->workers.count; i++) {
    muster_worker w;
    muster_usage u;
    s->cpu_now[i] = -1;
    if (muster_get(s->c, s->run->workers.items[i].id, &w) != 0)
      continue;
    if (muster_worker_usage(&w, &u))
      s->cpu_now[i] = u.cpu_seconds;
    muster_worker_cleanup(&w);
    if (s->cpu_now[i] >= 0 && s->cpu_prev[i] >= 0 && s->cpu_now[i] >= s->cpu_prev[i])
      used = (used < 0 ? 0 : used) + (s->cpu_now[i] - s->cpu_prev[i]);
    s->cpu_prev[i] = s->cpu_now[i];
  }
  return used;
}

/* Whether a new metric point came since the last look. */
static int new_metrics(struct stall *s) {
  char *text = NULL;
  json_t *j;
  int64_t next;

  if (!s->run->run_id || !s->run->run_id[0] ||
      muster_run_metrics(s->c, s->run->run_id, NULL, s->since, 1, &text) != 0)
    return 0;
  j = json_loads(text, 0, NULL);
  free(text);
  next = (int64_t)json_integer_value(json_object_get(j, "next_since"));
  json_decref(j);
  if (next <= s->since)
    return 0;
  s->since = next;
  s->has_metrics = 1;
  return 1;
}

/* Each rank's last step and when it was logged, from the run's metrics:
 * metric rank r is the view whose process has rank r. */
static void last_steps(struct stall *s, struct rank_view *v, size_t n) {
  char *text = NULL;
  json_t *j, *pt;
  size_t i;

  if (!s->run->run_id || !s->run->run_id[0] ||
      muster_run_metrics(s->c, s->run->run_id, NULL, 0, 1, &text) != 0)
    return;
  j = json_loads(text, 0, NULL);
  free(text);
  json_array_foreach(json_object_get(j, "points"), i, pt) {
    long r = (long)json_integer_value(json_object_get(pt, "rank"));
    long step = (long)json_integer_value(json_object_get(pt, "step"));
    for (size_t k = 0; k < n; k++)
      if (v[k].rank == r && step > v[k].step) {
        v[k].step = step;
        v[k].step_at = json_number_value(json_object_get(pt, "at"));
      }
  }
  json_decref(j);
}

static void append(char *buf, size_t size, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void append(char *buf, size_t size, const char *fmt, ...) {
  size_t len = strlen(buf);
  va_list ap;

  if (len + 1 >= size)
    return;
  va_start(ap, fmt);
  vsnprintf(buf + len, size - len, fmt, ap);
  va_end(ap);
}

/* Asks every worker, then builds the report (malloc'ed) and its first
 * sentence's worker (*who). */
/* Asks every worker at once what its processes do (each bounded by muster
 * stack's own timeouts; past STALL_PROBE_S, what has not answered is
 * cancelled). Returns the answers (n of them), or NULL. */
static struct probe *probe_all(struct stall *s) {
  struct run *run = s->run;
  size_t n = run->workers.count;
  struct probe *pb = calloc(n + 1, sizeof(*pb));
  double until;

  if (!pb)
    return NULL;
  for (size_t i = 0; i < n; i++) {
    pb[i].run = run;
    pb[i].w = &run->workers.items[i];
    pb[i].started = pthread_create(&pb[i].thread, NULL, probe_main, &pb[i]) == 0;
  }
  until = mono_s() + STALL_PROBE_S;
  for (size_t i = 0; i < n; i++) {
    if (!pb[i].started)
      continue;
    while (mono_s() < until && !run->cancel) {
      struct timespec ts = {0, 50 * 1000 * 1000};
      if (pthread_tryjoin_np(pb[i].thread, NULL) == 0) {
        pb[i].started = 0;
        break;
      }
      nanosleep(&ts, NULL);
    }
    if (pb[i].started) {
      pb[i].cancel = 1;
      pthread_join(pb[i].thread, NULL);
      pb[i].started = 0;
    }
  }
  return pb;
}

static void probes_free(struct probe *pb, size_t n) {
  for (size_t i = 0; pb && i < n; i++)
    free(pb[i].out);
  free(pb);
}

/* The report (malloc'ed) from the workers' answers pb, and in *who the
 * worker of the rank it names first. */
static char *build_report(struct stall *s, const struct probe *pb, double idle, const char **who) {
  struct run *run = s->run;
  size_t n = run->workers.count;
  struct rank_view *v = calloc(n + 1, sizeof(*v));
  char *rep = calloc(1, REPORT_MAX);
  const char *unit = run->o->mode == MUSTER_RUN_PS ? "worker" : "rank";
  double now_w = wall_s();

  if (!v || !rep) {
    free(v);
    free(rep);
    return NULL;
  }
  for (size_t i = 0; i < n; i++) {
    v[i].index = (int)i;
    v[i].rank = (long)i;
    v[i].worker = run->workers.items[i].id;
    v[i].step = -1;
    v[i].cpu_window =
        s->cpu_asked[i] >= 0 && s->cpu_at_last[i] >= 0 ? s->cpu_asked[i] - s->cpu_at_last[i] : -1;
    read_probe(&v[i], &pb[i]);
  }
  last_steps(s, v, n);
  qsort(v, n, sizeof(*v), view_cmp);
  append(rep, REPORT_MAX,
         "no %s made progress for %.0f s (no new metric point, output line or CPU time). ", unit,
         idle);
  for (size_t i = 0; i < n; i++) {
    const struct rank_view *x = &v[i];
    append(rep, REPORT_MAX, "%s%s %ld (%s) ", i ? "; " : "", unit, x->rank, x->worker);
    if (x->step >= 0 && !x->waits)
      append(rep, REPORT_MAX, "has been at step %ld for %.0f s, %s", x->step, now_w - x->step_at,
             x->doing);
    else if (x->step >= 0)
      append(rep, REPORT_MAX, "%s at step %ld", x->doing, x->step);
    else
      append(rep, REPORT_MAX, "%s", x->doing);
  }
  append(rep, REPORT_MAX, ".\n");
  for (size_t i = 0; i < n; i++) {
    const struct rank_view *x = &v[i];
    append(rep, REPORT_MAX, "\n%s %ld (%s): pid %ld %s, state %s%s%s", unit, x->rank, x->worker,
           x->pid, x->comm, x->state[0] ? x->state : "?", x->wchan[0] ? " in " : "", x->wchan);
    if (x->cpu_window >= 0)
      append(rep, REPORT_MAX, ", %.2f s of CPU in the %.0f s before it was asked", x->cpu_window,
             s->asked_t - s->last);
    append(rep, REPORT_MAX, "\n%s\n", x->stacks && x->stacks[0] ? x->stacks : "(no stack)");
  }
  *who = n ? v[0].worker : NULL;
  /* (v[0].worker points into run->workers, which outlives the report) */
  for (size_t i = 0; i < n; i++)
    free(v[i].stacks);
  free(v);
  return rep;
}

static void report(struct stall *s, const struct probe *pb, double idle) {
  struct run *run = s->run;
  const char *who = NULL;
  char *rep = build_report(s, pb, idle, &who), path[64];
  json_t *body;
  int over;

  if (!rep)
    return;
  /* ASCII only: valid JSON text whatever a probe's error said. */
  for (char *c = rep; *c; c++)
    if ((unsigned char)*c >= 0x80)
      *c = '?';
  /* (under the run's lock, as its output lines are handed out; not once
   * the command is over) */
  pthread_mutex_lock(&run->lock);
  over = run->cancel;
  if (!over && run->o->on_stall)
    run->o->on_stall(run->o->arg, rep);
  pthread_mutex_unlock(&run->lock);
  if (over) {
    free(rep);
    return;
  }
  if (run->run_id && run->run_id[0]) {
    body = json_pack("{s:s}", "report", rep);
    snprintf(path, sizeof(path), "/api/v1/runs/%s/stalls", run->run_id);
    /* (not kept in the run's record if that fails: it was printed) */
    if (body && muster_json_call_(s->c, "POST", path, body, NULL) != 0) {
      /* (printed already: only the record misses it) */
    }
  }
  if (run->o->on_stall_fail) {
    /* The first sentence is the cause (a restart's too). */
    char *dot = strstr(rep, ".\n"), *cause;
    if (dot)
      *dot = '\0';
    cause = malloc(strlen(rep) + 16);
    if (cause) {
      snprintf(cause, strlen(rep) + 16, "stalled: %s", rep);
      (void)muster_run_fail_live_(run, who, cause);
      free(cause);
    }
  }
  free(rep);
}

void *muster_run_stall_main_(void *arg) {
  struct stall *s = arg;
  struct run *run = s->run;
  size_t nw = run->workers.count;
  double timeout = run->o->stall_timeout, next_cpu = 0;
  /* The workers are asked this long before the timeout (gdb takes seconds
   * on a process with large libraries): the report comes at the timeout,
   * with stacks taken during the stall. */
  double lead = timeout * 0.5 < 10 ? timeout * 0.5 : 10;
  struct probe *pb = NULL; /* asked during this stall, not yet reported */

  for (size_t i = 0; i < nw; i++)
    s->cpu_prev[i] = -1;
  s->last = mono_s();
  (void)sample_cpu(s);
  s->cpu_t = s->last;
  memcpy(s->cpu_at_last, s->cpu_now, nw * sizeof(double));
  while (!run->cancel) {
    double now = mono_s(),
           out = (double)__atomic_load_n(&run->last_output_ms, __ATOMIC_RELAXED) / 1000;
    int progress = out > s->last;
    struct timespec ts = {0, 50 * 1000 * 1000};

    if (new_metrics(s))
      progress = 1;
    if (now >= next_cpu) {
      double used = sample_cpu(s);
      /* A worker's first measure is its window's start, if none was. */
      for (size_t i = 0; i < nw; i++)
        if (s->cpu_at_last[i] < 0)
          s->cpu_at_last[i] = s->cpu_now[i];
      if (!s->has_metrics && used >= 0 && used / (now - s->cpu_t) >= STALL_CPU_CORES)
        progress = 1;
      s->cpu_t = now;
      next_cpu = now + 2;
    }
    if (progress) {
      s->last = now;
      s->reported = 0;
      memcpy(s->cpu_at_last, s->cpu_now, nw * sizeof(double));
      /* What the workers said before is not this stall's. */
      probes_free(pb, nw);
      pb = NULL;
    } else if (!s->reported && !pb && now - s->last >= timeout - lead) {
      /* The workers' CPU before the stack tools run in them: theirs is no
       * progress, and no part of the report's window. */
      (void)sample_cpu(s);
      s->asked_t = mono_s();
      memcpy(s->cpu_asked, s->cpu_now, nw * sizeof(double));
      pb = probe_all(s);
      (void)sample_cpu(s);
      s->cpu_t = mono_s();
      next_cpu = s->cpu_t + 2;
      if (!pb) {
        s->reported = 1; /* out of memory: no report for this stall */
      } else {
        /* Progress while they were asked: not a stall after all. */
        double checked = mono_s();
        out = (double)__atomic_load_n(&run->last_output_ms, __ATOMIC_RELAXED) / 1000;
        if (out > s->asked_t || new_metrics(s)) {
          s->last = checked;
          memcpy(s->cpu_at_last, s->cpu_now, nw * sizeof(double));
          probes_free(pb, nw);
          pb = NULL;
        }
        continue;
      }
    } else if (!s->reported && pb && now - s->last >= timeout) {
      s->reported = 1;
      report(s, pb, now - s->last);
      probes_free(pb, nw);
      pb = NULL;
    }
    for (int i = 0; i < 10 && !run->cancel; i++)
      nanosleep(&ts, NULL);
  }
  probes_free(pb, nw);
  return NULL;
}

int muster_run_stall_start_(struct stall_watch *w, struct run *run, muster_client *c) {
  struct stall *s;

  memset(w, 0, sizeof(*w));
  if (run->o->stall_timeout <= 0 || run->workers.count == 0)
    return 0;
  s = calloc(1, sizeof(*s));
  if (!s)
    return MUSTER_E_NOMEM;
  s->run = run;
  s->cpu_at_last = calloc(run->workers.count, sizeof(double));
  s->cpu_now = calloc(run->workers.count, sizeof(double));
  s->cpu_asked = calloc(run->workers.count, sizeof(double));
  s->cpu_prev = calloc(run->workers.count, sizeof(double));
  if (!s->cpu_at_last || !s->cpu_now || !s->cpu_asked || !s->cpu_prev ||
      muster_client_new(muster_client_url(c), muster_client_token_(c), &s->c) != 0) {
    free(s->cpu_at_last);
    free(s->cpu_now);
    free(s->cpu_asked);
    free(s->cpu_prev);
    free(s);
    return MUSTER_E_NOMEM;
  }
  muster_client_set_timeout(s->c, 10);
  w->s = s;
  w->started = pthread_create(&w->thread, NULL, muster_run_stall_main_, s) == 0;
  return 0;
}

void muster_run_stall_stop_(struct stall_watch *w) {
  struct stall *s = w->s;

  if (!s)
    return;
  if (w->started) {
    muster_client_cancel(s->c);
    pthread_join(w->thread, NULL);
  }
  muster_client_free(s->c);
  free(s->cpu_at_last);
  free(s->cpu_now);
  free(s->cpu_asked);
  free(s->cpu_prev);
  free(s);
  w->s = NULL;
}
