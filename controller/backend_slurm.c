/*
 * backend_slurm.c: the "slurm" backend (see backend.h, docs/backends.md).
 *
 * The controller runs where sbatch, squeue and scancel work (a login node).
 * A launch of N workers is one Slurm job of N tasks: sbatch allocates them
 * all at once (the gang starts together or not at all); a launch of several
 * shapes (muster run's PS and workers) is one heterogeneous job, a
 * component per shape, allocated together as well. The job's
 * script starts one job step per worker with srun, each step a
 * muster-workerd bound to its worker id, so that stopping one worker can end
 * its step alone. The job's name is "muster-LAUNCH" and its comment lists
 * "muster:ID:ATTEMPT,..." so that a restarted controller finds its jobs
 * again.
 *
 * It is a queueing backend: a submitted worker stays `scheduling` while its
 * job is PENDING (Slurm's reason is its waiting_for) and becomes `starting`
 * when the job runs; its workerd then registers from its node.
 *
 * Every Slurm command runs on this backend's own thread, never under the
 * state lock, with a timeout, and reads machine-readable output (sbatch
 * --parsable, squeue --json). The one exception is could_ever_fit(), which
 * runs `sbatch --test-only` on the launching request's own thread (the
 * state lock is not held there) so that a request Slurm says can never run
 * is refused at launch.
 */
#include "backend.h"
#include "envlists.h"
#include "fault.h"
#include "log.h"
#include "muster_errors.h"
#include "state.h"
#include "util.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <math.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

#define SB_CMD_TIMEOUT_MS 30000  /* any one Slurm command */
#define SB_TEST_TIMEOUT_MS 10000 /* sbatch --test-only, while a launch waits */
#define SB_POLL_MS 1000          /* squeue, while jobs are tracked */
#define SB_GONE_GRACE_MS 30000   /* a submitted job squeue does not list yet */
#define SB_OUT_MAX (16u << 20)   /* most output read from one command */
#define SB_RETRY_MAX_MS 30000    /* submit again after Slurm could not be reached: 1 s, doubling */
#define SB_GIVE_UP_MS 600000     /* ...until a launch has waited this long for Slurm */
#define SB_SACCT_MAX 256         /* jobs asked about in the restart's one sacct */
#define SB_COPIES_MAX 8          /* second jobs of launches cancelled per poll */
#define SB_COMP_MAX 16           /* components of a heterogeneous job (launch groups) */
#define SB_ARGV_MAX 512

/* One worker of a tracked job. */
struct sb_worker {
  char id[16];
  int attempt;
  int comp; /* its component of a heterogeneous job (0 in a plain one) */
  struct backend_req req;
  char token[72];
  int started;      /* BACKEND_STARTED sent */
  int ended;        /* cancelled by the controller, or reported lost */
  char reason[300]; /* the last BACKEND_WAITING sent */
};

/* One Slurm job: one launch's workers. */
struct sb_job {
  long jobid; /* 0 until sbatch answered */
  char launch[16];
  int n;
  struct sb_worker *w;
  struct backend_req req;   /* the first worker's shape */
  int ncomp;                /* components: 1, or more for a heterogeneous job */
  int submitted;            /* sbatch is running or has answered (jobid set, or refused) */
  int tries;                /* sbatch runs that could not reach Slurm */
  int maybe_queued;         /* one of them may have queued the job all the same */
  int64_t first_try_ms;     /* when sbatch first ran for it */
  int64_t retry_at_ms;      /* not submitted again before this */
  char *comment;            /* its --comment, once sbatch has run (under sb.mu) */
  int release;              /* submitted held: to be released (until that works) */
  int64_t since_ms;         /* when it was submitted (or adopted) */
  int seen;                 /* squeue listed it at least once */
  int ending;               /* BACKEND_ENDING sent (squeue said COMPLETING) */
  int cancel_job;           /* every worker is cancelled: scancel the job */
  char (*cancel_steps)[16]; /* workers whose step is to be cancelled */
  int ncancel_steps;
  struct sb_job *next;
};

static struct {
  pthread_mutex_t mu; /* leaf lock: never held while calling backend_report */
  pthread_cond_t cv;
  pthread_t thread;
  int running, stop;
  struct ctl_config cfg;
  char controller_url[600]; /* where workerd registers */
  struct sb_job *jobs;
  /* Workers a restart could not match with a job (squeue failed then):
   * matched by the first poll that reads the queue. */
  struct sb_worker *unresolved;
  int nunresolved;
  int reconciled; /* reconcile has run: every job still queued is tracked */
} sb = {.mu = PTHREAD_MUTEX_INITIALIZER};

static void job_free(struct sb_job *j) {
  free(j->comment);
  free(j->w);
  free(j->cancel_steps);
  free(j);
}

/* ---- running a command ---- */

/* The output of one command. */
struct sb_out {
  char *out, *err; /* NUL-terminated, never NULL after sb_run() */
  int status;      /* exit code, or 128 + signal; -1 if it could not run */
  int timed_out;
};

static void sb_out_free(struct sb_out *o) {
  free(o->out);
  free(o->err);
  memset(o, 0, sizeof(*o));
}

static int append(char **buf, size_t *len, const char *data, size_t n) {
  char *grown;

  if (*len + n > SB_OUT_MAX)
    n = SB_OUT_MAX - *len;
  grown = realloc(*buf, *len + n + 1);
  if (!grown)
    return -1;
  memcpy(grown + *len, data, n);
  *len += n;
  grown[*len] = '\0';
  *buf = grown;
  return 0;
}

/* Runs argv with envp (NULL: ours), feeding it input (may be NULL), and
 * collects its output; kills it after timeout_ms. Returns 0 when it ran (its
 * exit status in o->status), or -1 with o->err saying why it could not. */
static MUST_CHECK int sb_run(char *const argv[], char *const envp[], const char *input,
                             int timeout_ms, struct sb_out *o) {
  int in[2] = {-1, -1}, out[2] = {-1, -1}, err[2] = {-1, -1};
  posix_spawn_file_actions_t fa;
  size_t olen = 0, elen = 0, ilen = input ? strlen(input) : 0, ioff = 0;
  int64_t deadline = util_mono_ms() + timeout_ms;
  posix_spawnattr_t attr;
  sigset_t none, all;
  pid_t pid;
  int rc, st = 0;

  memset(o, 0, sizeof(*o));
  o->status = -1;
  o->out = calloc(1, 1);
  o->err = calloc(1, 1);
  if (!o->out || !o->err || pipe2(in, O_CLOEXEC) || pipe2(out, O_CLOEXEC) ||
      pipe2(err, O_CLOEXEC)) {
    for (int i = 0; i < 2; i++) {
      if (in[i] >= 0)
        close(in[i]);
      if (out[i] >= 0)
        close(out[i]);
      if (err[i] >= 0)
        close(err[i]);
    }
    return -1;
  }
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, in[0], 0);
  posix_spawn_file_actions_adddup2(&fa, out[1], 1);
  posix_spawn_file_actions_adddup2(&fa, err[1], 2);
  /* Not the controller's blocked and ignored signals: Slurm's commands get
   * the defaults. */
  posix_spawnattr_init(&attr);
  sigemptyset(&none);
  sigfillset(&all);
  posix_spawnattr_setsigmask(&attr, &none);
  posix_spawnattr_setsigdefault(&attr, &all);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
  rc = posix_spawnp(&pid, argv[0], &fa, &attr, argv, envp ? envp : environ);
  posix_spawnattr_destroy(&attr);
  posix_spawn_file_actions_destroy(&fa);
  close(in[0]);
  close(out[1]);
  close(err[1]);
  if (rc != 0) {
    close(in[1]);
    close(out[0]);
    close(err[0]);
    free(o->err);
    o->err = NULL;
    if (asprintf(&o->err, "cannot run %s: %s", argv[0], strerror(rc)) < 0)
      o->err = NULL;
    return -1;
  }
  (void)fcntl(in[1], F_SETFL, O_NONBLOCK);
  if (ilen == 0) {
    close(in[1]);
    in[1] = -1;
  }
  while (out[0] >= 0 || err[0] >= 0) {
    struct pollfd p[3];
    int np = 0, left = (int)(deadline - util_mono_ms());

    if (left <= 0) {
      o->timed_out = 1;
      kill(pid, SIGKILL);
      break;
    }
    p[np++] = (struct pollfd){.fd = out[0], .events = POLLIN};
    p[np++] = (struct pollfd){.fd = err[0], .events = POLLIN};
    p[np++] = (struct pollfd){.fd = in[1], .events = POLLOUT};
    if (poll(p, (nfds_t)np, left) < 0 && errno != EINTR)
      break;
    for (int i = 0; i < 2; i++) {
      int *fd = i == 0 ? &out[0] : &err[0];
      char buf[65536];
      ssize_t k;

      if (*fd < 0 || !p[i].revents)
        continue;
      k = read(*fd, buf, sizeof(buf));
      if (k > 0) {
        if (append(i == 0 ? &o->out : &o->err, i == 0 ? &olen : &elen, buf, (size_t)k) != 0)
          k = 0;
      }
      if (k == 0 || (k < 0 && errno != EINTR && errno != EAGAIN)) {
        close(*fd);
        *fd = -1;
      }
    }
    if (in[1] >= 0 && p[2].revents) {
      ssize_t k = write(in[1], input + ioff, ilen - ioff);
      if (k > 0)
        ioff += (size_t)k;
      if ((k < 0 && errno != EAGAIN && errno != EINTR) || ioff == ilen) {
        close(in[1]);
        in[1] = -1;
      }
    }
  }
  if (in[1] >= 0)
    close(in[1]);
  if (out[0] >= 0)
    close(out[0]);
  if (err[0] >= 0)
    close(err[0]);
  /* The output is closed; the exit comes within the same deadline, or it
   * is killed (a command that closed its output and lingers). */
  for (;;) {
    pid_t r = waitpid(pid, &st, WNOHANG);

    if (r == pid)
      break;
    if (r < 0 && errno != EINTR) {
      st = -1;
      break;
    }
    if (r == 0 && util_mono_ms() >= deadline && !o->timed_out) {
      o->timed_out = 1;
      kill(pid, SIGKILL);
    }
    if (r == 0)
      usleep(o->timed_out ? 10000 : 2000);
  }
  o->status = st < 0 ? -1 : WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  return 0;
}

/* Slurm's own words from a failed command: its stderr's last line, without
 * "sbatch: error: " and the like. */
static void slurm_words(const struct sb_out *o, const char *cmd, int timeout_ms, char *buf,
                        size_t len) {
  const char *s = o->err ? o->err : "";
  const char *last = s, *p;
  size_t n;

  if (o->timed_out) {
    snprintf(buf, len, "%s did not answer within %d s", cmd, timeout_ms / 1000);
    return;
  }
  for (p = s; *p; p++)
    if (*p == '\n' && p[1])
      last = p + 1;
  n = strcspn(last, "\n");
  for (const char *pre = "error: "; (p = memmem(last, n, pre, strlen(pre)));) {
    n -= (size_t)(p + strlen(pre) - last);
    last = p + strlen(pre);
  }
  if (strncmp(last, "Batch job submission failed: ", 29) == 0 && n > 29) {
    last += 29;
    n -= 29;
  }
  if (n == 0)
    snprintf(buf, len, "%s failed with exit code %d", cmd, o->status);
  else
    snprintf(buf, len, "%.*s", (int)n, last);
}

/* Whether Slurm's words say it could not be reached at all. */
static int slurm_unreachable(const char *words) {
  return strstr(words, "Unable to contact slurm controller") != NULL ||
         strstr(words, "Zero Bytes were transmitted") != NULL ||
         strstr(words, "Socket timed out") != NULL ||
         strstr(words, "Communication connection failure") != NULL ||
         strstr(words, "did not answer within") != NULL || strstr(words, "cannot run ") == words;
}

/* ---- the shape of a task ---- */

/* Slurm allocates whole cores: a fractional request rounds up. */
static int task_cpus(const struct backend_req *r) {
  int c = (int)ceil(r->cpu - 1e-9);
  return c < 1 ? 1 : c;
}

/* Memory per allocated core in MiB (rounded up), 0 when none was asked. */
static long task_mem_per_cpu(const struct backend_req *r) {
  if (r->memory <= 0)
    return 0;
  return (long)ceil(r->memory * 1024.0 / task_cpus(r));
}

static void slurm_describe(const struct backend_req *r, char *buf, size_t len) {
  size_t n = (size_t)snprintf(buf, len, "%d core%s per worker", task_cpus(r),
                              task_cpus(r) == 1 ? "" : "s");
  if (n < len && r->cpu != task_cpus(r))
    n += (size_t)snprintf(buf + n, len - n, " (%g asked; Slurm allocates whole cores)", r->cpu);
  if (n < len && task_mem_per_cpu(r) > 0)
    n += (size_t)snprintf(buf + n, len - n, ", %ld MiB per core", task_mem_per_cpu(r));
  if (n < len && r->ngpu > 0)
    snprintf(buf + n, len - n, ", %d GPU%s", r->ngpu, r->ngpu == 1 ? "" : "s");
}

/* Appends the resource and placement options of a job (or a component of a
 * heterogeneous one) of ntasks tasks of shape r to argv (room for 16 more). */
static int shape_args(const struct backend_req *r, int ntasks, char *argv[], int n,
                      char bufs[4][64]) {
  snprintf(bufs[0], 64, "--ntasks=%d", ntasks);
  argv[n++] = bufs[0];
  snprintf(bufs[1], 64, "--cpus-per-task=%d", task_cpus(r));
  argv[n++] = bufs[1];
  if (task_mem_per_cpu(r) > 0) {
    snprintf(bufs[2], 64, "--mem-per-cpu=%ld", task_mem_per_cpu(r));
    argv[n++] = bufs[2];
  }
  if (r->ngpu > 0) {
    snprintf(bufs[3], 64, "--gpus-per-task=%d", r->ngpu);
    argv[n++] = bufs[3];
  }
  if (sb.cfg.slurm_partition[0]) {
    argv[n++] = "--partition";
    argv[n++] = sb.cfg.slurm_partition;
  }
  if (sb.cfg.slurm_account[0]) {
    argv[n++] = "--account";
    argv[n++] = sb.cfg.slurm_account;
  }
  return n;
}

/* ---- could_ever_fit: sbatch --test-only ---- */

/* Asks Slurm whether a job of one task of shape r could ever run. Returns 0,
 * MUSTER_E_CAPACITY (Slurm says it cannot) or MUSTER_E_BACKEND_DOWN, with
 * Slurm's words in words. */
static int test_only(const struct backend_req *r, char *words, size_t len) {
  char *argv[64], bufs[4][64];
  struct sb_out o;
  int n = 0, rc;

  argv[n++] = "sbatch";
  argv[n++] = "--test-only";
  argv[n++] = "--job-name=muster-test";
  n = shape_args(r, 1, argv, n, bufs);
  for (int i = 0; i < sb.cfg.nslurm_args && n < 60; i++)
    argv[n++] = sb.cfg.slurm_args[i];
  argv[n++] = "--wrap=true";
  argv[n] = NULL;
  if (sb_run(argv, NULL, NULL, SB_TEST_TIMEOUT_MS, &o) != 0) {
    snprintf(words, len, "%s", o.err ? o.err : "cannot run sbatch");
    sb_out_free(&o);
    return MUSTER_E_BACKEND_DOWN;
  }
  rc = 0;
  if (o.status != 0 || o.timed_out) {
    slurm_words(&o, "sbatch", SB_TEST_TIMEOUT_MS, words, len);
    rc = slurm_unreachable(words) ? MUSTER_E_BACKEND_DOWN : MUSTER_E_CAPACITY;
  }
  sb_out_free(&o);
  return rc;
}

static int slurm_could_ever_fit(const struct backend_req *r, const char **field, char *msg,
                                size_t msglen) {
  char words[400];
  int rc = test_only(r, words, sizeof(words));

  if (rc == 0)
    return 0;
  if (rc == MUSTER_E_BACKEND_DOWN) {
    *field = NULL;
    snprintf(msg, msglen, "Slurm cannot be reached: %s", words);
    return rc;
  }
  /* Which field: the first one whose smallest value makes Slurm agree. */
  *field = NULL;
  {
    struct backend_req t = *r;
    t.ngpu = 0;
    if (r->ngpu > 0 && test_only(&t, msg, msglen) == 0)
      *field = "nvidia_gpu";
    t = *r;
    t.cpu = 1;
    if (!*field && r->cpu > 1 && test_only(&t, msg, msglen) == 0)
      *field = "cpu";
    t = *r;
    t.memory = 0;
    if (!*field && r->memory > 0 && test_only(&t, msg, msglen) == 0)
      *field = "memory";
  }
  snprintf(msg, msglen, "Slurm says this worker can never run%s%s%s: %s", *field ? " (" : "",
           *field ? *field : "", *field ? ")" : "", words);
  return MUSTER_E_CAPACITY;
}

/* ---- the job script ---- */

/* Quotes s for sh in single quotes into buf. */
static void sh_quote(const char *s, char *buf, size_t len) {
  size_t o = 0;

  if (len < 3)
    return;
  buf[o++] = '\'';
  for (; *s && o + 5 < len; s++) {
    if (*s == '\'') {
      memcpy(buf + o, "'\\''", 4);
      o += 4;
    } else {
      buf[o++] = *s;
    }
  }
  buf[o++] = '\'';
  buf[o] = '\0';
}

/* The batch script of job j: one srun step per worker, in the background,
 * then a wait. Each step's workerd gets its own id, attempt and token (the
 * tokens travel in the job's environment as MUSTER_TOKEN_I, never on a
 * command line). */
static char *job_script(const struct sb_job *j) {
  char workerd[2200];
  size_t cap = 256 + (size_t)j->n * 2700, len = 0;
  char *s = malloc(cap);
  int het = j->ncomp > 1;

  if (!s)
    return NULL;
  sh_quote(sb.cfg.workerd_path, workerd, sizeof(workerd));
  len += (size_t)snprintf(s + len, cap - len,
                          "#!/bin/sh\n"
                          "# muster launch %s: one job step per worker\n",
                          j->launch);
  for (int i = 0; i < j->n; i++) {
    const struct sb_worker *w = &j->w[i];
    char shape[160], group[32] = "";
    int sl = snprintf(shape, sizeof(shape), "-c %d", task_cpus(&w->req));

    if (task_mem_per_cpu(&w->req) > 0)
      sl += snprintf(shape + sl, sizeof(shape) - (size_t)sl, " --mem-per-cpu=%ld",
                     task_mem_per_cpu(&w->req));
    if (w->req.ngpu > 0)
      snprintf(shape + sl, sizeof(shape) - (size_t)sl, " --gpus-per-task=%d", w->req.ngpu);
    if (het)
      snprintf(group, sizeof(group), " --het-group=%d", w->comp);
    len += (size_t)snprintf(s + len, cap - len,
                            "MUSTER_WORKER_ID=%s MUSTER_WORKER_ATTEMPT=%d "
                            "MUSTER_WORKER_TOKEN=\"$MUSTER_TOKEN_%d\" "
                            "srun%s --exact -n1 -N1 %s -J %s %s &\n",
                            w->id, w->attempt, i, group, shape, w->id, workerd);
  }
  snprintf(s + len, cap - len, "wait\n");
  return s;
}

/* ---- the backend thread: sbatch, scancel, squeue ---- */

static void report(enum backend_event ev, const struct sb_worker *w, const char *ref,
                   const char *detail) {
  struct backend_report r = {
      .event = ev, .id = w->id, .attempt = w->attempt, .ref = ref, .detail = detail};
  backend_report(&r);
}

static long queued_with_comment(const char *comment, char *words, size_t len);

/* Releases held job id (not under sb.mu). Returns 0, or -1 (logged, at
 * most every 30 s). */
static int release_job(long id) {
  char job[32], *argv[] = {"scontrol", "release", job, NULL};
  struct sb_out o;
  int rc = 0;

  snprintf(job, sizeof(job), "%ld", id);
  if (sb_run(argv, NULL, NULL, SB_CMD_TIMEOUT_MS, &o) != 0 || o.status != 0 || o.timed_out) {
    static int64_t last_warn;
    char words[400];
    slurm_words(&o, "scontrol release", SB_CMD_TIMEOUT_MS, words, sizeof(words));
    if (util_mono_ms() - last_warn > 30000) {
      LOG(LOG_WARN, "could not release Slurm job %ld (tried again each poll): %s", id, words);
      last_warn = util_mono_ms();
    }
    rc = -1;
  }
  sb_out_free(&o);
  return rc;
}

/* Whether every worker of j has ended (cancelled before its job was
 * queued). */
static int job_all_ended(struct sb_job *j) {
  int all = 1;

  pthread_mutex_lock(&sb.mu);
  for (int i = 0; i < j->n; i++)
    all &= j->w[i].ended;
  pthread_mutex_unlock(&sb.mu);
  return all;
}

/* Slurm could not be reached (words): j is submitted again after a backoff,
 * and its workers wait saying why; after SB_GIVE_UP_MS, 0 is returned and
 * the caller refuses it. */
static int submit_later(struct sb_job *j, const char *words) {
  struct sb_worker *ws = calloc((size_t)j->n, sizeof(*ws));
  char detail[300];
  int nw = 0;
  int64_t now = util_mono_ms(), wait_ms;

  if (!ws || now - j->first_try_ms >= SB_GIVE_UP_MS) {
    free(ws);
    return 0;
  }
  wait_ms = j->tries < 5 ? 1000LL << j->tries : SB_RETRY_MAX_MS;
  if (wait_ms > SB_RETRY_MAX_MS)
    wait_ms = SB_RETRY_MAX_MS;
  LOG(LOG_WARN, "launch %s: Slurm cannot be reached (%s); submitting again in %lld s", j->launch,
      words, (long long)(wait_ms / 1000));
  pthread_mutex_lock(&sb.mu);
  j->tries++;
  j->maybe_queued = 1;
  j->retry_at_ms = now + wait_ms;
  j->submitted = 0;
  for (int i = 0; i < j->n; i++)
    if (!j->w[i].ended)
      ws[nw++] = j->w[i];
  pthread_mutex_unlock(&sb.mu);
  snprintf(detail, sizeof(detail), "Slurm cannot be reached: %.200s (trying again)", words);
  for (int i = 0; i < nw; i++)
    report(BACKEND_WAITING, &ws[i], NULL, detail);
  free(ws);
  return 1;
}

/* Submits job j (not under sb.mu). On success j->jobid is set; a refusal
 * is reported for every worker with Slurm's words; when Slurm cannot be
 * reached, j waits to be submitted again (submit_later). An sbatch that
 * could not answer may have queued the job all the same: before the next
 * sbatch, the queue is searched for the job's comment, so that a launch is
 * never queued twice. */
static void submit_job(struct sb_job *j) {
  char *argv[SB_ARGV_MAX], bufs[SB_COMP_MAX][4][64], name[64], output[700], chdir[1100];
  char **envp = NULL, **tok = NULL;
  char *script = job_script(j), *comment_text = NULL;
  size_t nenv = 0, clen = 0;
  struct sb_out o = {0};
  char words[400];
  int n = 0, drop = 0;
  long id;

  for (char **e = environ; *e; e++)
    nenv++;
  envp = calloc(nenv + (size_t)j->n + 4, sizeof(*envp));
  tok = calloc((size_t)j->n + 2, sizeof(*tok));
  comment_text = malloc(16 + (size_t)j->n * 32);
  if (!script || !envp || !tok || !comment_text) {
    snprintf(words, sizeof(words), "out of memory preparing the Slurm job");
    goto refuse;
  }
  if (9 + j->ncomp * (10 + sb.cfg.nslurm_args) >= SB_ARGV_MAX) {
    snprintf(words, sizeof(words),
             "a job of %d shapes with %d --slurm-arg options has more sbatch arguments than "
             "muster passes (%d)",
             j->ncomp, sb.cfg.nslurm_args, SB_ARGV_MAX);
    goto refuse;
  }
  nenv = 0;
  for (char **e = environ; *e; e++)
    if (env_to_slurm_job(*e))
      envp[nenv++] = *e;
  for (int i = 0; i < j->n; i++) {
    if (asprintf(&tok[i], "MUSTER_TOKEN_%d=%s", i, j->w[i].token) < 0) {
      tok[i] = NULL;
      snprintf(words, sizeof(words), "out of memory preparing the Slurm job");
      goto refuse;
    }
    envp[nenv++] = tok[i];
  }
  if (asprintf(&tok[j->n], "MUSTER_CONTROLLER_URL=%s", sb.controller_url) < 0) {
    tok[j->n] = NULL;
    snprintf(words, sizeof(words), "out of memory preparing the Slurm job");
    goto refuse;
  }
  envp[nenv++] = tok[j->n];
  envp[nenv] = NULL;
  clen = (size_t)snprintf(comment_text, 16, "muster:");
  for (int i = 0; i < j->n; i++)
    clen += (size_t)snprintf(comment_text + clen, 32, "%s%s:%d", i ? "," : "", j->w[i].id,
                             j->w[i].attempt);
  if (!j->first_try_ms) {
    char *c = strdup(comment_text);
    j->first_try_ms = util_mono_ms();
    pthread_mutex_lock(&sb.mu);
    j->comment = c; /* NULL if out of memory: only the check for copies is lost */
    pthread_mutex_unlock(&sb.mu);
  }
  if (j->maybe_queued) {
    id = queued_with_comment(comment_text, words, sizeof(words));
    if (id < 0)
      goto again;
    if (id > 0) {
      LOG(LOG_INFO, "launch %s: Slurm job %ld was queued by an sbatch that could not answer",
          j->launch, id);
      goto queued;
    }
    j->maybe_queued = 0;
  }
  if (job_all_ended(j)) {
    drop = 1; /* every worker was stopped before its job was queued */
    goto out;
  }

  snprintf(name, sizeof(name), "--job-name=muster-%s", j->launch);
  snprintf(output, sizeof(output), "--output=%s/slurm/%%j.out", sb.cfg.state_dir);
  snprintf(chdir, sizeof(chdir), "--chdir=%s", sb.cfg.workdir);
  argv[n++] = "sbatch";
  argv[n++] = "--parsable";
  /* Never again by itself: a job Slurm requeued (after a node failure,
   * say) would start workers whose attempt already ran. muster decides
   * what starts again, under a new attempt. */
  argv[n++] = "--no-requeue";
  /* Held until muster knows its id, then released: an sbatch whose answer
   * was lost may have queued the job after all (a slow slurmctld, even
   * after the queue was searched for it), and such a copy, never released,
   * starts nothing before a poll cancels it. */
  argv[n++] = "--hold";
  argv[n++] = name;
  argv[n++] = "--comment";
  argv[n++] = comment_text;
  argv[n++] = output;
  argv[n++] = chdir;
  /* One set of shape options per component, separated by ":" (the
   * heterogeneous job syntax); the --slurm-args go to each. */
  for (int c = 0, i = 0; c < j->ncomp; c++) {
    int first = i, count = 0;

    while (i < j->n && j->w[i].comp == c) {
      i++;
      count++;
    }
    if (c > 0)
      argv[n++] = ":";
    n = shape_args(&j->w[first].req, count, argv, n, bufs[c]);
    for (int a = 0; a < sb.cfg.nslurm_args && n < SB_ARGV_MAX - 24; a++)
      argv[n++] = sb.cfg.slurm_args[a];
    if (n >= SB_ARGV_MAX - 24)
      break;
  }
  argv[n] = NULL;
  FAULT_POINT("slurm_before_submit");
  if (sb_run(argv, envp, script, SB_CMD_TIMEOUT_MS, &o) != 0) {
    snprintf(words, sizeof(words), "%s", o.err ? o.err : "cannot run sbatch");
    goto refuse;
  }
  if (o.status != 0 || o.timed_out) {
    slurm_words(&o, "sbatch", SB_CMD_TIMEOUT_MS, words, sizeof(words));
    if (o.timed_out || slurm_unreachable(words))
      goto again;
    goto refuse;
  }
  {
    char *end;
    id = strtol(o.out, &end, 10);
    if (end == o.out || id <= 0 || (*end && *end != ';' && *end != '\n')) {
      snprintf(words, sizeof(words), "sbatch answered \"%.100s\", not a job id", o.out);
      goto refuse;
    }
  }
  /* Tests: sbatch queued the job, but its answer never came. */
  if (FAULT_FAILS("slurm_sbatch_answer_lost")) {
    snprintf(words, sizeof(words), "sbatch's answer was lost (fault injection)");
    goto again;
  }
  LOG(LOG_INFO, "launch %s: Slurm job %ld, %d tasks", j->launch, id, j->n);
queued:
  pthread_mutex_lock(&sb.mu);
  j->jobid = id;
  j->since_ms = util_mono_ms();
  j->release = 1;
  pthread_mutex_unlock(&sb.mu);
  if (release_job(id) == 0) { /* else the next poll that sees it held tries again */
    pthread_mutex_lock(&sb.mu);
    j->release = 0;
    pthread_mutex_unlock(&sb.mu);
  }
  goto out;

again:
  if (submit_later(j, words))
    goto out;
  {
    char why[sizeof(words)];
    memcpy(why, words, sizeof(why));
    snprintf(words, sizeof(words), "Slurm could not be reached for %d minutes: %.300s",
             SB_GIVE_UP_MS / 60000, why);
  }
refuse:
  LOG(LOG_WARN, "launch %s: Slurm refused the job: %s", j->launch, words);
  pthread_mutex_lock(&sb.mu);
  for (int i = 0; i < j->n; i++)
    j->w[i].ended = 1;
  pthread_mutex_unlock(&sb.mu);
  for (int i = 0; i < j->n; i++)
    report(BACKEND_REFUSED, &j->w[i], NULL, words);
  drop = 1;
out:
  sb_out_free(&o);
  for (int i = 0; tok && i <= j->n; i++)
    free(tok[i]);
  free(tok);
  free(envp);
  free(script);
  /* A refused job is done with: only this thread frees jobs, and nothing
   * else frees one without a job id. */
  if (drop) {
    pthread_mutex_lock(&sb.mu);
    for (struct sb_job **pj = &sb.jobs; *pj; pj = &(*pj)->next)
      if (*pj == j) {
        *pj = j->next;
        break;
      }
    pthread_mutex_unlock(&sb.mu);
    job_free(j);
  }
  free(comment_text);
}

/* Runs scancel with args (not under sb.mu); logs a failure. */
static void scancel(const char *what, char *const args[]) {
  char *argv[16];
  struct sb_out o;
  int n = 0;

  argv[n++] = "scancel";
  for (int i = 0; args[i] && n < 15; i++)
    argv[n++] = args[i];
  argv[n] = NULL;
  if (sb_run(argv, NULL, NULL, SB_CMD_TIMEOUT_MS, &o) != 0 || o.status != 0) {
    char words[400];
    slurm_words(&o, "scancel", SB_CMD_TIMEOUT_MS, words, sizeof(words));
    LOG(LOG_WARN, "could not cancel %s: %s", what, words);
  }
  sb_out_free(&o);
}

/* Ends worker id's step: the step named id, in whichever job (component). */
static void cancel_step(const char *id) {
  /* Not filtered by job: the components of a heterogeneous job have job
   * ids of their own. Step names (worker ids) are unique. */
  char *argv[] = {"squeue", "--steps", "--noheader", "--format=%i %j", NULL};
  struct sb_out o;

  if (sb_run(argv, NULL, NULL, SB_CMD_TIMEOUT_MS, &o) == 0 && o.status == 0) {
    for (char *line = o.out; line && *line;) {
      char *nl = strchr(line, '\n'), step[64], name[64];
      if (nl)
        *nl = '\0';
      if (sscanf(line, "%63s %63s", step, name) == 2 && strcmp(name, id) == 0) {
        char *args[] = {step, NULL};
        scancel(id, args);
      }
      line = nl ? nl + 1 : NULL;
    }
  }
  sb_out_free(&o);
}

/* A sentence for a job that ended in state with reason. */
static void end_sentence(const char *state, const char *reason, const char *nodes, char *buf,
                         size_t len) {
  if (strcmp(state, "NODE_FAIL") == 0)
    snprintf(buf, len, "node %s failed (Slurm: NODE_FAIL)", nodes && *nodes ? nodes : "?");
  else if (strcmp(state, "OUT_OF_MEMORY") == 0)
    snprintf(buf, len, "killed: out of memory (Slurm: OUT_OF_MEMORY)");
  else if (strcmp(state, "TIMEOUT") == 0)
    snprintf(buf, len, "hit the job's time limit (Slurm: TIMEOUT)");
  else if (strcmp(state, "CANCELLED") == 0)
    snprintf(buf, len, "cancelled outside muster (Slurm: CANCELLED)");
  else if (strcmp(state, "PREEMPTED") == 0)
    snprintf(buf, len, "preempted by Slurm (Slurm: PREEMPTED)");
  else if (strcmp(state, "BOOT_FAIL") == 0)
    snprintf(buf, len, "its node failed to boot (Slurm: BOOT_FAIL)");
  else if (strcmp(state, "DEADLINE") == 0)
    snprintf(buf, len, "missed the job's deadline (Slurm: DEADLINE)");
  else if (strcmp(state, "FAILED") == 0)
    snprintf(buf, len, "its Slurm job failed (Slurm: FAILED, %s)",
             reason && *reason ? reason : "no reason given");
  else
    snprintf(buf, len, "its Slurm job ended before its muster-workerd said how (Slurm: %s)", state);
}

/* What squeue says of one job. */
struct sq_job {
  long id;
  long het_id; /* the heterogeneous job's leader, or 0 */
  const char *state, *reason, *nodes, *comment;
};

/* A job's state: a string up to Slurm 22.05, an array of a base state and
 * flags ("RUNNING", "COMPLETING") from 23.02: the first that is a final
 * or a base state, else the first. */
static const char *job_state_of(json_t *v) {
  if (json_is_string(v))
    return json_string_value(v);
  if (json_is_array(v) && json_array_size(v) > 0)
    return json_string_value(json_array_get(v, 0));
  return NULL;
}

/* An integer: a number up to 22.05, {"set", "infinite", "number"} from
 * 23.02. */
static long number_of(json_t *v) {
  if (json_is_object(v))
    return json_is_true(json_object_get(v, "set"))
               ? (long)json_integer_value(json_object_get(v, "number"))
               : 0;
  return (long)json_integer_value(v);
}

/* Parses squeue --json's jobs into *out (pointers into root). */
static int squeue_parse(json_t *root, struct sq_job **out, size_t *n) {
  json_t *jobs = json_object_get(root, "jobs"), *j;
  size_t i;

  *out = NULL;
  *n = 0;
  if (!json_is_array(jobs))
    return -1;
  *out = calloc(json_array_size(jobs) + 1, sizeof(**out));
  if (!*out)
    return -1;
  json_array_foreach(jobs, i, j) {
    struct sq_job *q = &(*out)[*n];
    q->id = number_of(json_object_get(j, "job_id"));
    q->het_id = number_of(json_object_get(j, "het_job_id"));
    q->state = job_state_of(json_object_get(j, "job_state"));
    q->reason = json_string_value(json_object_get(j, "state_reason"));
    q->nodes = json_string_value(json_object_get(j, "nodes"));
    q->comment = json_string_value(json_object_get(j, "comment"));
    if (q->id > 0 && q->state)
      (*n)++;
  }
  return 0;
}

/* Runs squeue --json. Returns its parsed output (to json_decref) or NULL
 * with words filled. */
static json_t *squeue_json(char *words, size_t len) {
  char *argv[] = {"squeue", "--json", NULL};
  struct sb_out o;
  json_t *root = NULL;

  if (sb_run(argv, NULL, NULL, SB_CMD_TIMEOUT_MS, &o) != 0) {
    snprintf(words, len, "%s", o.err ? o.err : "cannot run squeue");
  } else if (o.status != 0 || o.timed_out) {
    slurm_words(&o, "squeue", SB_CMD_TIMEOUT_MS, words, len);
  } else {
    json_error_t je;
    root = json_loads(o.out, 0, &je);
    if (!root)
      snprintf(words, len, "squeue --json printed something that is not JSON (%s)", je.text);
  }
  sb_out_free(&o);
  return root;
}

/* Reads the queue: *root (to json_decref) and its jobs *q (to free, pointing
 * into *root). Returns 0, or -1 with nothing to free and words filled. */
static int queue_read(json_t **root, struct sq_job **q, size_t *nq, char *words, size_t len) {
  *q = NULL;
  *nq = 0;
  *root = squeue_json(words, len);
  if (!*root)
    return -1;
  if (squeue_parse(*root, q, nq) != 0) {
    snprintf(words, len, "squeue --json printed no jobs array");
    free(*q);
    *q = NULL;
    json_decref(*root);
    *root = NULL;
    return -1;
  }
  return 0;
}

/* The job queued with comment: its id (a heterogeneous job's leader), 0 when
 * there is none, -1 when the queue cannot be read (words say why). */
static long queued_with_comment(const char *comment, char *words, size_t len) {
  json_t *root;
  struct sq_job *q;
  size_t nq;
  long id = -1;

  if (queue_read(&root, &q, &nq, words, len) == 0) {
    id = 0;
    for (size_t i = 0; i < nq && !id; i++)
      if (q[i].comment && strcmp(q[i].comment, comment) == 0)
        id = q[i].het_id ? q[i].het_id : q[i].id;
  }
  free(q);
  json_decref(root);
  return id;
}

static int state_is(const char *s, const char *name) {
  return s && strcmp(s, name) == 0;
}

/* Slurm's final job states; any other state (PENDING, RUNNING and the
 * passing ones: COMPLETING, CONFIGURING, SIGNALING, STAGE_OUT, RESIZING,
 * REQUEUED, SUSPENDED, STOPPED...) is not an end. */
static int state_final(const char *s) {
  static const char *const final[] = {"COMPLETED", "CANCELLED", "FAILED",
                                      "TIMEOUT",   "NODE_FAIL", "PREEMPTED",
                                      "BOOT_FAIL", "DEADLINE",  "OUT_OF_MEMORY"};
  for (size_t i = 0; i < sizeof(final) / sizeof(final[0]); i++)
    if (state_is(s, final[i]))
      return 1;
  return 0;
}

/* Ending: up to 22.05, squeue shows these instead of the final state
 * while the job's processes die and its epilogs run (from 23.02 the final
 * state comes first in job_state, with COMPLETING as a flag after it). */
static int state_ending(const char *s) {
  return state_is(s, "COMPLETING") || state_is(s, "STAGE_OUT");
}

/* Held as muster submits every job (sbatch --hold), or by a user. */
static int job_held(const struct sq_job *q) {
  return state_is(q->state, "PENDING") && state_is(q->reason, "JobHeldUser");
}

/* Waiting for resources, not running yet. */
static int state_queued(const char *s) {
  return state_is(s, "PENDING") || state_is(s, "REQUEUED") || state_is(s, "REQUEUE_HOLD") ||
         state_is(s, "SUSPENDED");
}

/* What to report after a poll, gathered under sb.mu, sent after. */
struct sb_note {
  enum backend_event ev;
  struct sb_worker w;
  char ref[32];
  char detail[600];
  long output_of; /* a job whose output may say why it ended (read after sb.mu) */
  int node_fail;  /* NODE_FAIL: name the nodes that are down (asked after sb.mu) */
};

/* The nodes Slurm has down now ("n2"), for a NODE_FAIL sentence; "" when
 * it cannot tell. */
static void down_nodes(char *buf, size_t len) {
  char *argv[] = {"sinfo", "--noheader", "--states=down,fail,no_respond", "--format=%N", NULL};
  struct sb_out o;

  buf[0] = '\0';
  if (sb_run(argv, NULL, NULL, SB_CMD_TIMEOUT_MS, &o) == 0 && o.status == 0 && o.out)
    snprintf(buf, len, "%.*s", (int)strcspn(o.out, "\n"), o.out);
  sb_out_free(&o);
}

/* The last line of job jobid's output (STATE/slurm/JOBID.out) that says
 * "error:" and why (slurmstepd's words for a step that could not start: a
 * workerd that is not where --workerd says on that node, say), rather than
 * srun's summary of the task's exit, appended to buf. */
static void append_output_error(long jobid, char *buf, size_t len) {
  char path[700], tail[8192], *last = NULL, *last_any = NULL;
  ssize_t n;
  int fd;

  snprintf(path, sizeof(path), "%s/slurm/%ld.out", sb.cfg.state_dir, jobid);
  fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return;
  if (lseek(fd, 0, SEEK_END) > (off_t)sizeof(tail) - 1)
    (void)lseek(fd, -(off_t)sizeof(tail) + 1, SEEK_END);
  else
    (void)lseek(fd, 0, SEEK_SET);
  n = read(fd, tail, sizeof(tail) - 1);
  close(fd);
  if (n <= 0)
    return;
  tail[n] = '\0';
  for (char *line = tail; line && *line;) {
    char *nl = strchr(line, '\n');
    if (nl)
      *nl = '\0';
    /* srun's own summary of a task's end ("srun: error: n1: task 0:
     * Exited with exit code 2") comes after the line that says why: that
     * one is quoted, the summary only where there is nothing else. */
    if (strstr(line, "error:")) {
      last_any = line;
      if (!(strstr(line, "srun: error:") && strstr(line, ": task ")))
        last = line;
    }
    line = nl ? nl + 1 : NULL;
  }
  if (!last)
    last = last_any;
  if (last) {
    size_t at = strlen(buf);
    if (at < len)
      snprintf(buf + at, len - at, ": %.300s", last);
  }
}

/* Appends j to the tracked jobs (oldest first: sbatch runs in launch
 * order). Called with sb.mu held. */
static void job_append_locked(struct sb_job *j) {
  struct sb_job **pj = &sb.jobs;

  while (*pj)
    pj = &(*pj)->next;
  j->next = NULL;
  *pj = j;
}

/* Matches workers an earlier controller left with the jobs in q (their
 * comment "muster:ID:ATTEMPT,..."): a worker of a job that is queued or
 * running is adopted (and its job tracked), one of a job that ended gets
 * the sentence of that end in why. Called with sb.mu held; no I/O. */
static void adopt_from_queue(const struct sq_job *q, size_t nq, struct backend_live *ws, int n) {
  /* Jobs not held first: a held job beside another with the same workers
   * is a copy an unanswered sbatch queued (submit_job), left untracked for
   * the polls to cancel. */
  for (size_t kk = 0; kk < 2 * nq; kk++) {
    size_t k = kk % nq;
    const char *c = q[k].comment;
    int matches = 0, held = job_held(&q[k]);
    struct sb_job *j = NULL;

    /* A heterogeneous job is known by its leader (its first component). */
    if (!c || strncmp(c, "muster:", 7) != 0 || (q[k].het_id && q[k].het_id != q[k].id) ||
        held != (kk >= nq))
      continue;
    for (int pass = 0; pass < 2; pass++) {
      for (int i = 0; i < n; i++) {
        char key[40];
        const char *at;
        size_t kl = (size_t)snprintf(key, sizeof(key), "%s:%d", ws[i].id, ws[i].attempt);

        at = strstr(c + 7, key);
        if (ws[i].adopted || !at || (at[kl] != ',' && at[kl] != '\0') ||
            (at[-1] != ',' && at[-1] != ':'))
          continue;
        if (pass == 0) {
          matches++;
          continue;
        }
        if (state_final(q[k].state)) {
          end_sentence(q[k].state, q[k].reason, q[k].nodes, ws[i].why, sizeof(ws[i].why));
          continue;
        }
        if (!j)
          continue; /* out of memory: not adopted; the state machine decides */
        ws[i].adopted = 1;
        snprintf(j->w[j->n].id, sizeof(j->w[j->n].id), "%s", ws[i].id);
        j->w[j->n].attempt = ws[i].attempt;
        j->w[j->n].req = ws[i].req;
        /* Only a registration tells that its workerd runs: a worker still
         * scheduling in a job that runs now gets its STARTED (and its start
         * timeout) from the next poll. */
        j->w[j->n].started = ws[i].registered;
        j->n++;
      }
      if (pass == 0) {
        if (!matches || state_final(q[k].state))
          continue;
        j = calloc(1, sizeof(*j));
        if (j && !(j->w = calloc((size_t)matches, sizeof(*j->w)))) {
          free(j);
          j = NULL;
        }
        if (j) {
          j->jobid = q[k].id;
          j->submitted = 1;
          j->seen = 1;
          j->comment = strdup(c); /* NULL: only the check for copies is lost */
          j->release = held;      /* held by its submission, never released */
          j->ncomp = 1;
          j->since_ms = util_mono_ms();
          snprintf(j->launch, sizeof(j->launch), "adopted");
        }
      }
    }
    if (j && j->n) {
      j->req = j->w[0].req;
      job_append_locked(j);
    } else if (j) {
      job_free(j);
    }
  }
}

/* Room for one more note; NULL when memory ran out. */
static struct sb_note *note_add(struct sb_note **notes, size_t *nn, size_t *capn) {
  if (*nn == *capn) {
    size_t cap = *capn ? 2 * *capn : 64;
    struct sb_note *grown = realloc(*notes, cap * sizeof(*grown));
    if (!grown)
      return NULL;
    *notes = grown;
    *capn = cap;
  }
  memset(&(*notes)[*nn], 0, sizeof((*notes)[*nn]));
  return &(*notes)[(*nn)++];
}

/* The workers a restart could not match (squeue failed then), matched now:
 * adopted, or lost with the end of their job, or lost for having none.
 * Called with sb.mu held. */
static void resolve_locked(const struct sq_job *q, size_t nq, struct sb_note **notes, size_t *nn,
                           size_t *capn) {
  struct backend_live *ws = calloc((size_t)sb.nunresolved, sizeof(*ws));

  if (!ws)
    return; /* tried again at the next poll */
  for (int i = 0; i < sb.nunresolved; i++) {
    ws[i].id = sb.unresolved[i].id;
    ws[i].attempt = sb.unresolved[i].attempt;
    ws[i].registered = sb.unresolved[i].started;
    ws[i].req = sb.unresolved[i].req;
  }
  adopt_from_queue(q, nq, ws, sb.nunresolved);
  for (int i = 0; i < sb.nunresolved; i++) {
    struct sb_note *nt;

    if (ws[i].adopted || !(nt = note_add(notes, nn, capn)))
      continue;
    nt->ev = BACKEND_LOST;
    nt->w = sb.unresolved[i];
    snprintf(nt->detail, sizeof(nt->detail), "%s",
             ws[i].why[0] ? ws[i].why
                          : "lost: Slurm had no job for it when the controller restarted");
  }
  free(ws);
  free(sb.unresolved);
  sb.unresolved = NULL;
  sb.nunresolved = 0;
}

/* One round of squeue: reports what changed for every tracked job. */
static void poll_jobs(void) {
  char words[400];
  json_t *root;
  struct sq_job *q;
  size_t nq, nn = 0, capn = 0;
  struct sb_note *notes = NULL;
  int64_t now = util_mono_ms();
  int sent_ending = 0;

  if (queue_read(&root, &q, &nq, words, sizeof(words)) != 0) {
    static int64_t last_warn;
    if (now - last_warn > 30000) {
      LOG(LOG_WARN, "cannot read the Slurm queue: %s", words);
      last_warn = now;
    }
    return;
  }
  long copies[SB_COPIES_MAX], held[SB_COPIES_MAX];
  int ncopies = 0, nheld = 0;

  pthread_mutex_lock(&sb.mu);
  if (sb.nunresolved)
    resolve_locked(q, nq, &notes, &nn, &capn);
  /* A second job of a launch: an sbatch that did not answer had queued
   * one after all, after the queue was searched for it. The tracked one
   * runs the workers; the copy, held since muster never released it,
   * goes. (A copy someone else released is left alone: its workerds are
   * refused when they register.) */
  for (size_t i = 0; i < nq && ncopies < SB_COPIES_MAX; i++) {
    long leader = q[i].het_id ? q[i].het_id : q[i].id;
    if (!q[i].comment || strncmp(q[i].comment, "muster:", 7) != 0 ||
        !state_is(q[i].state, "PENDING") || (q[i].het_id && q[i].het_id != q[i].id))
      continue;
    for (struct sb_job *j = sb.jobs; j; j = j->next)
      if (j->jobid && j->jobid != leader && j->comment && strcmp(j->comment, q[i].comment) == 0) {
        copies[ncopies++] = leader;
        break;
      }
  }
  for (struct sb_job **pj = &sb.jobs; *pj;) {
    struct sb_job *j = *pj;
    const struct sq_job *s = NULL;
    int ended = 0, live = 0, continue_job = 0;
    char detail[300];

    if (!j->jobid) {
      pj = &j->next;
      continue;
    }
    for (size_t i = 0; i < nq; i++)
      if (q[i].id == j->jobid)
        s = &q[i];
    detail[0] = '\0';
    if (s) {
      j->seen = 1;
      /* still held by its submission: its release after sbatch failed, or
       * a restart came between the two (a hold someone put on it later is
       * theirs) */
      if (j->release && job_held(s) && nheld < SB_COPIES_MAX)
        held[nheld++] = j->jobid;
      else if (j->release && !state_queued(s->state))
        j->release = 0;
      if (state_queued(s->state))
        snprintf(detail, sizeof(detail), "the Slurm queue: %s (job %ld)",
                 s->reason && *s->reason ? s->reason : s->state, j->jobid);
      else if (state_final(s->state))
        ended = 1;
      else if (!state_is(s->state, "RUNNING"))
        continue_job = 1; /* passing (COMPLETING, CONFIGURING...): wait */
    } else if (j->seen || now - j->since_ms > SB_GONE_GRACE_MS) {
      ended = 1;
    } else {
      continue_job = 1; /* submitted a moment ago: squeue has not listed it yet */
    }
    if (continue_job) {
      /* Its workers' workerds may report a stop from outside (SIGTERM)
       * before Slurm shows why: the controller is told to wait for it. */
      if (s && state_ending(s->state) && !j->ending) {
        j->ending = 1;
        LOG(LOG_INFO, "Slurm job %ld is ending (%s)", j->jobid, s->state);
        for (int i = 0; i < j->n; i++) {
          struct sb_note *nt;
          if (j->w[i].ended || !(nt = note_add(&notes, &nn, &capn)))
            continue;
          nt->ev = BACKEND_ENDING;
          nt->w = j->w[i];
          snprintf(nt->detail, sizeof(nt->detail), "Slurm job %ld is ending", j->jobid);
          sent_ending = 1;
        }
      }
      pj = &j->next;
      continue;
    }
    for (int i = 0; i < j->n; i++) {
      struct sb_worker *w = &j->w[i];
      struct sb_note *nt;

      if (w->ended)
        continue;
      nt = note_add(&notes, &nn, &capn);
      if (!nt) {
        live = 1; /* out of memory: the next poll tries again */
        break;
      }
      nn--; /* counted below, once it holds something to report */
      nt->w = *w;
      if (ended) {
        if (s && (state_is(s->state, "COMPLETED") || state_is(s->state, "FAILED")))
          nt->output_of = j->jobid;
        if (s && state_is(s->state, "NODE_FAIL"))
          nt->node_fail = 1;
        if (s)
          end_sentence(s->state, s->reason, s->nodes, nt->detail, sizeof(nt->detail));
        else
          snprintf(nt->detail, sizeof(nt->detail), "lost: Slurm no longer knows its job %ld",
                   j->jobid);
        nt->ev = BACKEND_LOST;
        w->ended = 1;
        nn++;
      } else if (detail[0]) {
        if (strcmp(detail, w->reason) != 0) {
          snprintf(w->reason, sizeof(w->reason), "%s", detail);
          nt->ev = BACKEND_WAITING;
          snprintf(nt->detail, sizeof(nt->detail), "%s", detail);
          nn++;
        }
        live = 1;
      } else {
        if (!w->started) {
          w->started = 1;
          nt->ev = BACKEND_STARTED;
          snprintf(nt->ref, sizeof(nt->ref), "%ld", j->jobid);
          size_t dl = (size_t)snprintf(nt->detail, sizeof(nt->detail), "Slurm job %ld runs on %s",
                                       j->jobid, s && s->nodes ? s->nodes : "?");
          for (size_t c = 0; c < nq && dl < sizeof(nt->detail); c++)
            if (q[c].het_id == j->jobid && q[c].id != j->jobid && q[c].nodes)
              dl += (size_t)snprintf(nt->detail + dl, sizeof(nt->detail) - dl, ", %s", q[c].nodes);
          nn++;
        }
        live = 1;
      }
    }
    if (!live && !j->cancel_job && !j->ncancel_steps) {
      *pj = j->next;
      job_free(j);
      continue;
    }
    pj = &j->next;
  }
  pthread_mutex_unlock(&sb.mu);
  for (int i = 0; i < nheld; i++)
    if (release_job(held[i]) == 0) {
      pthread_mutex_lock(&sb.mu);
      for (struct sb_job *j = sb.jobs; j; j = j->next)
        if (j->jobid == held[i])
          j->release = 0;
      pthread_mutex_unlock(&sb.mu);
    }
  for (int i = 0; i < ncopies; i++) {
    char job[32], *args[] = {job, NULL};
    snprintf(job, sizeof(job), "%ld", copies[i]);
    LOG(LOG_WARN,
        "cancelling Slurm job %s: a second job of a launch (an sbatch that did not "
        "answer had queued it)",
        job);
    scancel(job, args);
  }
  char down[200] = "";
  for (size_t i = 0, asked = 0; i < nn; i++) {
    if (notes[i].node_fail) {
      if (!asked++)
        down_nodes(down, sizeof(down));
      if (down[0])
        snprintf(notes[i].detail, sizeof(notes[i].detail), "node %s failed (Slurm: NODE_FAIL)",
                 down);
    }
    if (notes[i].output_of)
      append_output_error(notes[i].output_of, notes[i].detail, sizeof(notes[i].detail));
    report(notes[i].ev, &notes[i].w, notes[i].ref[0] ? notes[i].ref : NULL, notes[i].detail);
  }
  /* Tests: Slurm's account of an ending job comes late. */
  if (sent_ending)
    FAULT_POINT("slurm_after_ending");
  free(notes);
  free(q);
  json_decref(root);
}

/* Whether Slurm job id is tracked (its output may still grow). */
static int job_tracked(long id) {
  int yes = 0;

  pthread_mutex_lock(&sb.mu);
  for (struct sb_job *j = sb.jobs; j && !yes; j = j->next)
    yes = j->jobid == id;
  pthread_mutex_unlock(&sb.mu);
  return yes;
}

/* Whether every job this controller may have queued is known by its id:
 * reconciled after a restart, nothing unresolved, no sbatch without an
 * answer. Until then an untracked job's output may be a live one's. */
static int jobs_all_known(void) {
  int yes;

  pthread_mutex_lock(&sb.mu);
  yes = sb.reconciled && !sb.nunresolved;
  for (struct sb_job *j = sb.jobs; j && yes; j = j->next)
    yes = j->jobid || !j->maybe_queued;
  pthread_mutex_unlock(&sb.mu);
  return yes;
}

/* Whether squeue lists job id as not yet ended (queue: squeue's jobs, NULL
 * when it could not be read, which counts as yes). */
static int job_listed_live(const struct sq_job *q, size_t nq, int readable, long id) {
  if (!readable)
    return 1;
  for (size_t i = 0; i < nq; i++)
    if ((q[i].id == id || q[i].het_id == id) && !state_final(q[i].state))
      return 1;
  return 0;
}

/* Retention: the output (slurm/JOBID.out) of a job that has ended goes once
 * the file is older than --retain, as ended workers' logs do. A job this
 * controller tracks, or squeue lists as not ended, keeps its output
 * (workerd writes to it only at its start, so a long job's file is old).
 * Not under sb.mu. */
static void prune_outputs(void) {
  char dir[600], path[900], words[400];
  time_t cutoff = time(NULL) - (time_t)sb.cfg.retain_s;
  struct dirent *e;
  struct stat st;
  json_t *root = NULL;
  struct sq_job *q = NULL;
  size_t nq = 0;
  int asked = 0, readable = 0;
  DIR *d;
  int n = 0;

  if (!jobs_all_known())
    return;

  snprintf(dir, sizeof(dir), "%s/slurm", sb.cfg.state_dir);
  d = opendir(dir);
  if (!d)
    return;
  while ((e = readdir(d))) {
    char *end;
    long id = strtol(e->d_name, &end, 10);

    if (end == e->d_name || id <= 0 || strcmp(end, ".out") != 0)
      continue;
    snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
    if (stat(path, &st) != 0 || st.st_mtime >= cutoff || job_tracked(id))
      continue;
    if (!asked++)
      readable = queue_read(&root, &q, &nq, words, sizeof(words)) == 0;
    if (job_listed_live(q, nq, readable, id))
      continue;
    if (unlink(path) == 0)
      n++;
    else if (errno != ENOENT)
      LOG(LOG_WARN, "could not remove %s: %s", path, strerror(errno));
  }
  closedir(d);
  free(q);
  json_decref(root);
  if (n)
    LOG(LOG_INFO, "retention: removed the output of %d ended Slurm jobs", n);
}

static void *backend_main(void *arg) {
  /* Once a minute, or more often for a short --retain (tests), as the
   * state's own retention. */
  int64_t prune_every = (int64_t)(sb.cfg.retain_s * 500), last_prune = util_mono_ms();

  (void)arg;
  if (prune_every > 60000)
    prune_every = 60000;
  if (prune_every < 500)
    prune_every = 500;
  pthread_mutex_lock(&sb.mu);
  while (!sb.stop) {
    struct sb_job *todo = NULL;
    long cancel_job = 0, step_job = 0;
    char step_id[16] = "";
    int64_t now = util_mono_ms();

    if (sb.cfg.retain_s > 0 && now - last_prune >= prune_every) {
      last_prune = now;
      pthread_mutex_unlock(&sb.mu);
      prune_outputs();
      pthread_mutex_lock(&sb.mu);
    }

    for (struct sb_job *j = sb.jobs; j; j = j->next) {
      if (!j->submitted && now >= j->retry_at_ms) {
        todo = j;
        break;
      }
      if (j->jobid && j->cancel_job) {
        cancel_job = j->jobid;
        j->cancel_job = 0;
        j->ncancel_steps = 0;
        break;
      }
      if (j->jobid && j->ncancel_steps) {
        step_job = j->jobid;
        snprintf(step_id, sizeof(step_id), "%s", j->cancel_steps[--j->ncancel_steps]);
        break;
      }
    }
    if (todo) {
      todo->submitted = 1;
      pthread_mutex_unlock(&sb.mu);
      submit_job(todo);
      pthread_mutex_lock(&sb.mu);
      continue;
    }
    if (cancel_job || step_job) {
      pthread_mutex_unlock(&sb.mu);
      if (cancel_job) {
        char job[32], *args[] = {job, NULL};
        snprintf(job, sizeof(job), "%ld", cancel_job);
        scancel(job, args);
      } else {
        cancel_step(step_id);
      }
      pthread_mutex_lock(&sb.mu);
      continue;
    }
    /* (a job waiting to be submitted again has nothing to ask about) */
    int ask = sb.nunresolved > 0;
    for (struct sb_job *j = sb.jobs; j && !ask; j = j->next)
      ask = j->jobid != 0;
    if (ask) {
      pthread_mutex_unlock(&sb.mu);
      poll_jobs();
      pthread_mutex_lock(&sb.mu);
    }
    if (sb.stop)
      break;
    util_cond_wait_until(&sb.cv, &sb.mu, util_mono_ms() + SB_POLL_MS);
  }
  pthread_mutex_unlock(&sb.mu);
  return NULL;
}

/* ---- the operations ---- */

static int slurm_init(const struct ctl_config *cfg, char *err, size_t errlen) {
  char dir[600];

  sb.cfg = *cfg;
  snprintf(sb.controller_url, sizeof(sb.controller_url), "%s", state_controller_url());
  snprintf(dir, sizeof(dir), "%s/slurm", cfg->state_dir);
  if (mkdir(dir, 0700) != 0 && errno != EEXIST) {
    snprintf(err, errlen, "could not create %s: %s", dir, strerror(errno));
    return MUSTER_E_IO;
  }
  util_cond_init_monotonic(&sb.cv);
  sb.stop = 0;
  if (pthread_create(&sb.thread, NULL, backend_main, NULL) != 0) {
    snprintf(err, errlen, "could not start the Slurm backend's thread");
    return MUSTER_E_INTERNAL;
  }
  sb.running = 1;
  return 0;
}

static void slurm_shutdown(void) {
  if (!sb.running)
    return;
  pthread_mutex_lock(&sb.mu);
  sb.stop = 1;
  pthread_cond_signal(&sb.cv);
  pthread_mutex_unlock(&sb.mu);
  pthread_join(sb.thread, NULL);
  sb.running = 0;
  while (sb.jobs) {
    struct sb_job *j = sb.jobs;
    sb.jobs = j->next;
    job_free(j);
  }
}

static int slurm_place(const char *id, const struct backend_req *r, struct backend_placement *where,
                       char *why, size_t whylen) {
  (void)id;
  (void)r;
  (void)why;
  (void)whylen;
  memset(where, 0, sizeof(*where));
  return 1;
}

static void slurm_submit(const struct backend_start *ws, int n) {
  struct sb_job *j = calloc(1, sizeof(*j));

  if (j)
    j->w = calloc((size_t)n, sizeof(*j->w));
  if (!j || !j->w) {
    /* Nothing can be reported from here (the state lock is held); the
     * workers stay queued with "submitted to the slurm backend". */
    free(j);
    LOG(LOG_ERROR, "out of memory submitting %d workers to Slurm", n);
    return;
  }
  snprintf(j->launch, sizeof(j->launch), "%s", ws[0].launch ? ws[0].launch : "l-unknown");
  j->n = n;
  /* The launch's groups arrive in order: a new shape starts a new
   * component of a heterogeneous job. */
  for (int i = 0; i < n; i++) {
    const struct backend_req *r = ws[i].req, *prev = i ? ws[i - 1].req : NULL;

    snprintf(j->w[i].id, sizeof(j->w[i].id), "%s", ws[i].id);
    snprintf(j->w[i].token, sizeof(j->w[i].token), "%s", ws[i].token);
    j->w[i].attempt = ws[i].attempt;
    j->w[i].req = *r;
    if (prev && (r->cpu != prev->cpu || r->memory != prev->memory || r->ngpu != prev->ngpu) &&
        j->ncomp < SB_COMP_MAX - 1)
      j->ncomp++;
    j->w[i].comp = j->ncomp;
  }
  j->ncomp++;
  j->req = *ws[0].req;
  j->since_ms = util_mono_ms();
  pthread_mutex_lock(&sb.mu);
  job_append_locked(j);
  pthread_cond_signal(&sb.cv);
  pthread_mutex_unlock(&sb.mu);
}

static void slurm_cancel(const char *id, enum backend_cancel how) {
  pthread_mutex_lock(&sb.mu);
  for (struct sb_job *j = sb.jobs; j; j = j->next) {
    int left = 0, found = -1;

    for (int i = 0; i < j->n; i++) {
      if (strcmp(j->w[i].id, id) == 0)
        found = i;
      else
        left += !j->w[i].ended;
    }
    if (found < 0)
      continue;
    j->w[found].ended = 1;
    /* The worker reported its own end: its workerd exits and its step
     * with it, and the job ends when its last step does. */
    if (how == BACKEND_KILL_LATER)
      break;
    if (!left) {
      j->cancel_job = 1;
    } else {
      char(*grown)[16] = realloc(j->cancel_steps, (size_t)(j->ncancel_steps + 1) * 16);
      if (grown) {
        j->cancel_steps = grown;
        snprintf(j->cancel_steps[j->ncancel_steps++], 16, "%s", id);
      }
    }
    pthread_cond_signal(&sb.cv);
    break;
  }
  pthread_mutex_unlock(&sb.mu);
}

static void slurm_release(const char *id) {
  (void)id;
}

/* After a restart, for the workers whose job squeue no longer lists (it
 * ended longer ago than MinJobAge): why it ended, from Slurm's accounting
 * (sacct), by the job id recorded as their backend_ref. Without
 * accounting, sacct fails and nothing is filled. Not under sb.mu. */
static void ended_from_accounting(struct backend_live *ws, int n) {
  char ids[SB_SACCT_MAX * 21], *argv[16], down[200] = "";
  long seen[SB_SACCT_MAX], *job = calloc((size_t)n, sizeof(*job));
  size_t len = 0;
  struct sb_out o = {0};
  int a = 0, nseen = 0, skipped = 0, asked_down = 0;

  if (!job)
    return;
  /* each worker's job: its recorded backend_ref, when that is a job id */
  for (int i = 0; i < n; i++) {
    char *end;
    long id = ws[i].ref ? strtol(ws[i].ref, &end, 10) : 0;
    int dup = 0;

    if (ws[i].adopted || ws[i].why[0] || id <= 0 || *end)
      continue;
    job[i] = id;
    for (int k = 0; k < nseen && !dup; k++)
      dup = seen[k] == id; /* once per job: a launch's workers share it */
    if (dup)
      continue;
    if (nseen == SB_SACCT_MAX) {
      skipped++;
      continue;
    }
    seen[nseen++] = id;
    len += (size_t)snprintf(ids + len, sizeof(ids) - len, "%s%ld", len ? "," : "", id);
  }
  if (skipped)
    LOG(LOG_WARN, "after the restart, sacct is asked about %d jobs; %d more fail as lost", nseen,
        skipped);
  if (!len)
    goto out;
  argv[a++] = "sacct";
  argv[a++] = "--allocations";
  argv[a++] = "--noheader";
  argv[a++] = "--parsable2";
  argv[a++] = "--jobs";
  argv[a++] = ids;
  /* Not sacct's Reason: that is the last reason the job waited (JobHeldUser,
   * since muster submits jobs held), not why it ended. */
  argv[a++] = "--format=JobIDRaw,State,NodeList,ExitCode";
  argv[a] = NULL;
  /* At startup, under the state lock: a shorter timeout than other commands. */
  if (sb_run(argv, NULL, NULL, SB_TEST_TIMEOUT_MS, &o) != 0 || o.status != 0 || o.timed_out) {
    char words[400];
    slurm_words(&o, "sacct", SB_TEST_TIMEOUT_MS, words, sizeof(words));
    LOG(LOG_INFO, "no Slurm accounting to say how ended jobs ended: %s", words);
    goto out;
  }
  /* JOBID|STATE[ by UID]|NODES|EXITCODE per line */
  for (char *line = o.out, *next; line && *line; line = next) {
    char *f[4] = {line, NULL, NULL, NULL}, *end, *sp;
    long id;

    next = strchr(line, '\n');
    if (next)
      *next++ = '\0';
    for (int k = 1; k < 4 && f[k - 1]; k++)
      if ((f[k] = strchr(f[k - 1], '|')))
        *f[k]++ = '\0';
    id = strtol(f[0], &end, 10);
    if (!f[3] || id <= 0 || *end)
      continue;
    if ((sp = strchr(f[1], ' ')))
      *sp = '\0'; /* "CANCELLED by 0" */
    if (!state_final(f[1]))
      continue;
    for (int i = 0; i < n; i++) {
      char code[40];
      if (job[i] != id || ws[i].why[0])
        continue;
      snprintf(code, sizeof(code), "exit code %.20s", f[3]);
      if (state_is(f[1], "NODE_FAIL") && !asked_down++)
        down_nodes(down, sizeof(down));
      end_sentence(f[1], code, state_is(f[1], "NODE_FAIL") && down[0] ? down : f[2], ws[i].why,
                   sizeof(ws[i].why));
      if (state_is(f[1], "COMPLETED") || state_is(f[1], "FAILED"))
        append_output_error(id, ws[i].why, sizeof(ws[i].why));
      LOG(LOG_INFO, "%s: its Slurm job %ld ended while the controller was down: %s (sacct)",
          ws[i].id, id, ws[i].why);
    }
  }
out:
  sb_out_free(&o);
  free(job);
}

/* After a restart: finds the jobs an earlier controller submitted, adopts
 * what is queued or running, and says why the others ended. When the queue
 * cannot be read (three tries, 2 s apart), every worker is kept as recorded
 * and matched with its job on the first poll that can read it. */
static void slurm_reconcile(struct backend_live *ws, int n) {
  char words[400] = "";
  json_t *root = NULL;
  struct sq_job *q = NULL;
  size_t nq = 0;

  if (n == 0) {
    pthread_mutex_lock(&sb.mu);
    sb.reconciled = 1;
    pthread_mutex_unlock(&sb.mu);
    return;
  }
  for (int tries = 0; tries < 3; tries++) {
    if (tries)
      sleep(2);
    if (queue_read(&root, &q, &nq, words, sizeof(words)) == 0)
      break;
  }
  pthread_mutex_lock(&sb.mu);
  if (!root) {
    LOG(LOG_WARN,
        "restart: cannot read the Slurm queue (%s); the %d recorded workers are kept and "
        "matched with their jobs once it can be read",
        words, n);
    sb.unresolved = calloc((size_t)n, sizeof(*sb.unresolved));
    for (int i = 0; sb.unresolved && i < n; i++) {
      struct sb_worker *w = &sb.unresolved[i];
      snprintf(w->id, sizeof(w->id), "%s", ws[i].id);
      w->attempt = ws[i].attempt;
      w->req = ws[i].req;
      w->started = ws[i].registered;
      ws[i].adopted = 1;
    }
    sb.nunresolved = sb.unresolved ? n : 0;
  } else {
    adopt_from_queue(q, nq, ws, n);
  }
  sb.reconciled = 1;
  pthread_cond_signal(&sb.cv);
  pthread_mutex_unlock(&sb.mu);
  if (root)
    ended_from_accounting(ws, n);
  free(q);
  json_decref(root);
}

/* Slurm confines its steps itself (task/cgroup, where its site set it up). */
static const char *slurm_isolation(void) {
  return "slurm";
}

static void slurm_usage(double *cpu_used, double *cpu_total, double *mem_used, double *mem_total) {
  *cpu_used = *cpu_total = *mem_used = *mem_total = 0;
}

const struct backend_ops backend_slurm_ops = {
    .name = "slurm",
    .queues = 1,
    .init = slurm_init,
    .shutdown = slurm_shutdown,
    .could_ever_fit = slurm_could_ever_fit,
    .place = slurm_place,
    .submit = slurm_submit,
    .cancel = slurm_cancel,
    .release = slurm_release,
    .reconcile = slurm_reconcile,
    .ref_from_register = NULL,
    .describe = slurm_describe,
    .usage = slurm_usage,
    .isolation = slurm_isolation,
};
