/*
 * slurm_submit.c: the commands that change Slurm's queue, on the backend's
 * thread: sbatch for a launch's job (submitted held, released once its id
 * is known, submitted again while Slurm cannot be reached), scontrol
 * release, scancel for a job or a worker's step; and sbatch --test-only
 * for could_ever_fit, on the launching request's thread. Calls
 * slurm_script.c, slurm_queue.c, slurm_words.c, slurm_run.c and
 * slurm_jobs.c (slurm_internal.h).
 */
#include "slurm_internal.h"

#include "envlists.h"
#include "fault.h"
#include "job_secret.h"
#include "log.h"
#include "muster_errors.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

extern char **environ;

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
  if (sb.uid_arg[0]) { /* asked as the account the jobs run as */
    argv[n++] = sb.uid_arg;
    argv[n++] = sb.gid_arg;
  }
  n = sb_shape_args(r, 1, argv, n, bufs);
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

int slurm_could_ever_fit(const struct backend_req *r, const char **field, char *msg,
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

/* Releases held job id (not under sb.mu). Returns 0, or -1 (logged, at
 * most every 30 s). */
int sb_release_job(long id) {
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
    sb_report(BACKEND_WAITING, &ws[i], NULL, detail);
  free(ws);
  return 1;
}

/* Submits job j (not under sb.mu). On success j->jobid is set; a refusal
 * is reported for every worker with Slurm's words; when Slurm cannot be
 * reached, j waits to be submitted again (submit_later). An sbatch that
 * could not answer may have queued the job all the same: before the next
 * sbatch, the queue is searched for the job's comment, so that a launch is
 * never queued twice. */
/* 1 for the variables that name whoever runs: HOME, USER, LOGNAME (and
 * MUSTER_JOB_ACCOUNT, which the controller sets itself). */
static int sb_env_is_account(const char *e) {
  return strncmp(e, "HOME=", 5) == 0 || strncmp(e, "USER=", 5) == 0 ||
         strncmp(e, "LOGNAME=", 8) == 0 || strncmp(e, "MUSTER_JOB_ACCOUNT=", 19) == 0;
}

void sb_submit_job(struct sb_job *j) {
  char *argv[SB_ARGV_MAX], bufs[SB_COMP_MAX][4][64], name[64], output[700], chdir[1100];
  char **envp = NULL, **tok = NULL, acct_env[4][600];
  char *script = sb_job_script(j), *comment_text = NULL;
  struct sb_account acct;
  size_t nenv = 0, clen = 0;
  struct sb_out o = {0};
  char words[400];
  int n = 0, drop = 0;
  long id;

  for (char **e = environ; *e; e++)
    nenv++;
  envp = calloc(nenv + (size_t)j->n + 8, sizeof(*envp));
  tok = calloc((size_t)j->n + 2, sizeof(*tok));
  comment_text = malloc(16 + (size_t)j->n * 32);
  if (!script || !envp || !tok || !comment_text) {
    snprintf(words, sizeof(words), "out of memory preparing the Slurm job");
    goto refuse;
  }
  if (11 + j->ncomp * (10 + sb.cfg.nslurm_args) >= SB_ARGV_MAX) {
    snprintf(words, sizeof(words),
             "a job of %d shapes with %d --slurm-arg options has more sbatch arguments than "
             "muster passes (%d)",
             j->ncomp, sb.cfg.nslurm_args, SB_ARGV_MAX);
    goto refuse;
  }
  /* Its user's account (their unix_user), else --run-as: sbatch --uid,
   * as Slurm runs a job as its owner (its accounting, limits and files). */
  if (sb_account_get(j->account, &acct, words, sizeof(words)) != 0)
    goto refuse;
  snprintf(j->out_dir, sizeof(j->out_dir), "%s", acct.out_dir);
  nenv = 0;
  for (char **e = environ; *e; e++)
    if (env_to_slurm_job(*e) && !(acct.uid_arg[0] && sb_env_is_account(*e)))
      envp[nenv++] = *e;
  /* A job of an account is that account's, its home included (Slurm
   * passes the submitter's HOME on): `~` is its own, not root's.
   * MUSTER_JOB_ACCOUNT tells the launcher to refuse to start dumpable. */
  if (acct.uid_arg[0]) {
    snprintf(acct_env[0], sizeof(acct_env[0]), "HOME=%s", acct.home);
    snprintf(acct_env[1], sizeof(acct_env[1]), "USER=%s", acct.user);
    snprintf(acct_env[2], sizeof(acct_env[2]), "LOGNAME=%s", acct.user);
    snprintf(acct_env[3], sizeof(acct_env[3]), "MUSTER_JOB_ACCOUNT=%s", acct.user);
    for (int i = 0; i < 4; i++)
      envp[nenv++] = acct_env[i];
  }
  /* One secret for the job, no worker's token: every step of the job can
   * read its environment. Its launcher claims the tokens with it before
   * any step runs (the claim mints new ones: only the same claim, with the
   * launcher's own key, is answered again, and only until a register). */
  {
    struct job_member *m = calloc((size_t)j->n, sizeof(*m));
    char secret[JOB_SECRET_LEN + 1];
    int bad = !m;

    for (int i = 0; !bad && i < j->n; i++)
      m[i] = (struct job_member){j->w[i].id, j->w[i].attempt, j->w[i].token};
    bad = bad || job_secret(m, j->n, secret) != 0 ||
          asprintf(&tok[0], "MUSTER_JOB_SECRET=%s", secret) < 0;
    explicit_bzero(secret, sizeof(secret));
    free(m);
    if (bad) {
      tok[0] = NULL;
      snprintf(words, sizeof(words), "out of memory preparing the Slurm job");
      goto refuse;
    }
    envp[nenv++] = tok[0];
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
    id = sb_queued_with_comment(comment_text, words, sizeof(words));
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
  snprintf(output, sizeof(output), "--output=%s/%%j.out", acct.out_dir);
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
  /* A root controller's jobs run as an account (sbatch takes these from
   * root only): a worker's code never runs as root. */
  if (acct.uid_arg[0]) {
    argv[n++] = acct.uid_arg;
    argv[n++] = acct.gid_arg;
  }
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
    n = sb_shape_args(&j->w[first].req, count, argv, n, bufs[c]);
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
  if (sb_release_job(id) == 0) { /* else the next poll that sees it held tries again */
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
    sb_report(BACKEND_REFUSED, &j->w[i], NULL, words);
  drop = 1;
out:
  sb_out_free(&o);
  for (int i = 0; tok && i <= j->n; i++)
    if (tok[i]) {
      explicit_bzero(tok[i], strlen(tok[i]));
      free(tok[i]);
    }
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
    sb_job_free(j);
  }
  free(comment_text);
}

/* Runs scancel with args (not under sb.mu); logs a failure. */
void sb_scancel(const char *what, char *const args[]) {
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
void sb_cancel_step(const char *id) {
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
        sb_scancel(id, args);
      }
      line = nl ? nl + 1 : NULL;
    }
  }
  sb_out_free(&o);
}
