/*
 * slurm_adopt.c: after a controller restart, the jobs an earlier controller
 * submitted: each recorded worker is matched with its job (by the job's
 * comment "muster:ID:ATTEMPT,..."), Slurm's accounting (sacct) is asked
 * about the jobs no longer queued, and slurm_fate.c decides what becomes
 * of each: adopted (its job tracked again), started again, or lost. When
 * the restart cannot read the queue, the workers are kept as recorded and
 * the first poll that reads it does the same (sb_resolve). Calls
 * slurm_fate.c, slurm_queue.c, slurm_words.c, slurm_run.c and
 * slurm_jobs.c (slurm_internal.h).
 */
#include "slurm_internal.h"

#include "log.h"
#include "muster_errors.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Whether unmatched worker id was stopped meanwhile (slurm_cancel). Under
 * sb.mu. */
static int unresolved_ended_locked(const char *id) {
  for (int i = 0; i < sb.nunresolved; i++)
    if (strcmp(sb.unresolved[i].id, id) == 0)
      return sb.unresolved[i].ended;
  return 0;
}

/* Tracks again the jobs of the workers whose fate is ADOPT (job[i]: the
 * index in q of worker i's job); a job whose workers were all stopped
 * meanwhile is cancelled instead of released. Called with sb.mu held; no
 * I/O. Returns 0, or MUSTER_E_NOMEM when a job could not be tracked (the
 * others are). */
static int adopt_locked(const struct sq_job *q, const long *job, const struct backend_live *ws,
                        const struct sb_fate *f, int n) {
  int rc = 0;

  for (int i = 0; i < n; i++) {
    const struct sq_job *s;
    struct sb_job *j;
    int m = 0, ended = 0;

    if (f[i].kind != SB_FATE_ADOPT)
      continue;
    /* once per job: at its first worker */
    int first = 1;
    for (int k = 0; k < i && first; k++)
      first = !(f[k].kind == SB_FATE_ADOPT && job[k] == job[i]);
    if (!first)
      continue;
    for (int k = i; k < n; k++)
      m += f[k].kind == SB_FATE_ADOPT && job[k] == job[i];
    s = &q[job[i]];
    j = calloc(1, sizeof(*j));
    if (j && !(j->w = calloc((size_t)m, sizeof(*j->w)))) {
      free(j);
      j = NULL;
    }
    if (!j) {
      LOG(LOG_ERROR, "out of memory adopting Slurm job %ld", s->id);
      rc = MUSTER_E_NOMEM; /* (a poll's: its workers stay live; the start timeout
                            * or heartbeats decide) */
      continue;
    }
    j->jobid = s->id;
    j->submitted = 1;
    j->seen = 1;
    j->comment =
        s->comment ? strdup(s->comment) : NULL; /* NULL: only the check for copies is lost */
    j->release = job_held(s);                   /* held by its submission, never released */
    j->ncomp = 1;
    j->since_ms = util_mono_ms();
    snprintf(j->launch, sizeof(j->launch), "adopted");
    for (int k = i; k < n; k++) {
      if (f[k].kind != SB_FATE_ADOPT || job[k] != job[i])
        continue;
      snprintf(j->w[j->n].id, sizeof(j->w[j->n].id), "%s", ws[k].id);
      j->w[j->n].attempt = ws[k].attempt;
      j->w[j->n].req = ws[k].req;
      /* Only a registration tells that its workerd runs: a worker still
       * scheduling in a job that runs now gets its STARTED (and its start
       * timeout) from the next poll. */
      j->w[j->n].started = ws[k].registered;
      /* Stopped while it was unmatched (slurm_cancel): its job goes. */
      j->w[j->n].ended = unresolved_ended_locked(ws[k].id);
      ended += j->w[j->n].ended;
      j->n++;
    }
    if (ended == j->n) {
      j->release = 0;
      j->cancel_job = 1;
    }
    j->req = j->w[0].req;
    sb_job_append_locked(j);
  }
  return rc;
}

/* Frees the jobs appended to sb.jobs after last (NULL: every one): a
 * reconcile that failed tracks none. Called with sb.mu held. */
static void drop_jobs_after_locked(struct sb_job *last) {
  struct sb_job **pj = last ? &last->next : &sb.jobs;

  while (*pj) {
    struct sb_job *j = *pj;

    *pj = j->next;
    sb_job_free(j);
  }
}

/* Slurm's accounting (sacct) of the jobs of the workers squeue no longer
 * lists (job[i] < 0): by the job id recorded as their backend_ref, into
 * acct[i] (id 0: nothing said); *o holds the words acct points into (the
 * caller frees it). Without accounting, sacct fails and nothing is filled.
 * Not under sb.mu. */
static void ask_accounting(const struct backend_live *ws, const long *job, int n,
                           struct sb_acct *acct, struct sb_out *o) {
  char ids[SB_SACCT_MAX * 21], *argv[16];
  long seen[SB_SACCT_MAX], *ref = calloc((size_t)n, sizeof(*ref));
  size_t len = 0;
  int a = 0, nseen = 0, skipped = 0;

  if (!ref)
    return;
  /* each worker's job: its recorded backend_ref, when that is a job id */
  for (int i = 0; i < n; i++) {
    char *end;
    long id = ws[i].ref ? strtol(ws[i].ref, &end, 10) : 0;
    int dup = 0;

    if (job[i] >= 0 || id <= 0 || *end)
      continue;
    ref[i] = id;
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
    LOG(LOG_WARN, "after the restart, sacct is asked about %d jobs; %d more are not", nseen,
        skipped);
  if (!len)
    goto out;
  argv[a++] = "sacct";
  argv[a++] = "--allocations";
  /* (every user's jobs, as root: the --run-as account's too) */
  argv[a++] = "--allusers";
  argv[a++] = "--noheader";
  argv[a++] = "--parsable2";
  argv[a++] = "--jobs";
  argv[a++] = ids;
  argv[a++] = "--format=JobIDRaw,State,NodeList,ExitCode";
  argv[a] = NULL;
  /* Before the API serves, or on the backend's thread: a shorter timeout
   * than other commands. */
  if (sb_run(argv, NULL, NULL, SB_TEST_TIMEOUT_MS, o) != 0 || o->status != 0 || o->timed_out) {
    char words[400];
    slurm_words(o, "sacct", SB_TEST_TIMEOUT_MS, words, sizeof(words));
    LOG(LOG_INFO, "no Slurm accounting to say how ended jobs ended: %s", words);
    goto out;
  }
  /* JOBID|STATE[ by UID]|NODES|EXITCODE per line */
  for (char *line = o->out, *next; line && *line; line = next) {
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
    for (int i = 0; i < n; i++)
      if (ref[i] == id && !acct[i].id)
        acct[i] = (struct sb_acct){id, f[1], f[3], f[2]};
  }
out:
  free(ref);
}

/* Decides the fate of each of ws's n workers (slurm_fate.c) from the queue
 * q, and sacct for the jobs q does not list: into f[i], with job[i] the
 * index in q of worker i's job (or -1). A lost worker's sentence is
 * complete (the nodes down, the error its job's output shows). Not under
 * sb.mu: runs sacct, sinfo, and reads job output. */
static void decide(const struct backend_live *ws, int n, const struct sq_job *q, size_t nq,
                   long *job, struct sb_fate *f) {
  struct sb_acct *acct = calloc((size_t)n, sizeof(*acct));
  struct sb_out o = {0};
  char down[200] = "";
  int asked_down = 0;

  for (int i = 0; i < n; i++)
    job[i] = sb_fate_job_of(q, nq, ws[i].id, ws[i].attempt);
  if (acct)
    ask_accounting(ws, job, n, acct, &o);
  for (int i = 0; i < n; i++) {
    struct sb_fate_in in = {ws[i].registered, ws[i].ref, job[i] >= 0 ? &q[job[i]] : NULL,
                            acct && acct[i].id ? &acct[i] : NULL};

    sb_fate_decide(&in, &f[i]);
    if (f[i].node_fail && !asked_down++)
      sb_down_nodes(down, sizeof(down));
    if (f[i].node_fail && down[0])
      sb_end_sentence("NODE_FAIL", NULL, down, f[i].why, sizeof(f[i].why));
    /* (whose account a job an earlier controller submitted ran as is not
     * known here: its output is read only where every job is --run-as's) */
    if (f[i].output_of && !sb_users_have_dirs())
      sb_append_output_error(sb.out_dir, f[i].output_of, f[i].why, sizeof(f[i].why));
    if (f[i].from_acct)
      LOG(LOG_INFO, "%s: its Slurm job %s ended while the controller was down: %s (sacct)",
          ws[i].id, ws[i].ref, f[i].why);
  }
  sb_out_free(&o);
  free(acct);
}

/* The workers a restart could not match (squeue failed then), matched now
 * as the restart would have: adopted, or started again, or lost (their
 * job's end, from the queue or sacct). Not under sb.mu; on the backend's
 * thread, the only one that changes sb.unresolved once reconcile ran. */
void sb_resolve(const struct sq_job *q, size_t nq) {
  struct backend_live *ws;
  struct sb_fate *f;
  long *job;
  int n;

  pthread_mutex_lock(&sb.mu);
  n = sb.nunresolved;
  if (!n) {
    pthread_mutex_unlock(&sb.mu);
    return;
  }
  ws = calloc((size_t)n, sizeof(*ws));
  f = calloc((size_t)n, sizeof(*f));
  job = calloc((size_t)n, sizeof(*job));
  /* (pointers into sb.unresolved: it stays until this thread frees it) */
  for (int i = 0; ws && i < n; i++) {
    ws[i].id = sb.unresolved[i].id;
    ws[i].attempt = sb.unresolved[i].attempt;
    ws[i].registered = sb.unresolved[i].started;
    ws[i].req = sb.unresolved[i].req;
    ws[i].ref = sb.unresolved_ref[i][0] ? sb.unresolved_ref[i] : NULL;
  }
  pthread_mutex_unlock(&sb.mu);
  if (!ws || !f || !job)
    goto out; /* tried again at the next poll */
  decide(ws, n, q, nq, job, f);
  pthread_mutex_lock(&sb.mu);
  (void)adopt_locked(q, job, ws, f, n); /* (said; the others go on) */
  pthread_mutex_unlock(&sb.mu);
  for (int i = 0; i < n; i++) {
    const struct sb_worker *w = &sb.unresolved[i];

    if (f[i].kind == SB_FATE_LOST) {
      sb_report(BACKEND_LOST, w, NULL, f[i].why);
    } else if (f[i].kind == SB_FATE_RESTART) {
      LOG(LOG_INFO, "%s: Slurm has no job of its attempt %d, which never ran: a new attempt", w->id,
          w->attempt);
      sb_report(BACKEND_RESTART, w, NULL,
                "lost: Slurm had no job for it when the controller restarted");
    }
  }
  pthread_mutex_lock(&sb.mu);
  free(sb.unresolved);
  free(sb.unresolved_ref);
  sb.unresolved = NULL;
  sb.unresolved_ref = NULL;
  sb.nunresolved = 0;
  pthread_mutex_unlock(&sb.mu);
out:
  free(ws);
  free(f);
  free(job);
}

/* After a restart: finds the jobs an earlier controller submitted, and
 * decides each recorded worker's fate (slurm_fate.c): adopted, started
 * again (ws[i].why "", not adopted), or lost (why). When the queue cannot be
 * read (three tries, 2 s apart), every worker is kept as recorded and the
 * first poll that can read it decides the same way (sb_resolve). */
int slurm_reconcile(struct backend_live *ws, int n, char *err, size_t errlen) {
  char words[400] = "";
  int rc = 0;
  json_t *root = NULL;
  struct sq_job *q = NULL;
  size_t nq = 0;
  struct sb_fate *f = NULL;
  long *job = NULL;

  if (n == 0) {
    pthread_mutex_lock(&sb.mu);
    sb.reconciled = 1;
    pthread_mutex_unlock(&sb.mu);
    return 0;
  }
  for (int tries = 0; tries < 3; tries++) {
    if (tries)
      sleep(2);
    if (sb_queue_read(&root, &q, &nq, words, sizeof(words)) == 0)
      break;
  }
  if (root) {
    f = calloc((size_t)n, sizeof(*f));
    job = calloc((size_t)n, sizeof(*job));
    if (f && job)
      decide(ws, n, q, nq, job, f);
  }
  pthread_mutex_lock(&sb.mu);
  if (!root || !f || !job) {
    sb.unresolved = calloc((size_t)n, sizeof(*sb.unresolved));
    sb.unresolved_ref = calloc((size_t)n, sizeof(*sb.unresolved_ref));
    if (!sb.unresolved || !sb.unresolved_ref) {
      free(sb.unresolved);
      free(sb.unresolved_ref);
      sb.unresolved = NULL;
      sb.unresolved_ref = NULL;
      snprintf(err, errlen, "out of memory keeping the %d recorded Slurm workers", n);
      rc = MUSTER_E_NOMEM;
    } else {
      LOG(LOG_WARN,
          "restart: cannot read the Slurm queue (%s); the %d recorded workers are kept and "
          "matched with their jobs once it can be read",
          root ? "out of memory" : words, n);
      for (int i = 0; i < n; i++) {
        struct sb_worker *w = &sb.unresolved[i];
        snprintf(w->id, sizeof(w->id), "%s", ws[i].id);
        w->attempt = ws[i].attempt;
        w->req = ws[i].req;
        w->started = ws[i].registered;
        snprintf(sb.unresolved_ref[i], sizeof(sb.unresolved_ref[i]), "%s",
                 ws[i].ref ? ws[i].ref : "");
        ws[i].adopted = 1;
      }
      sb.nunresolved = n;
    }
  } else {
    struct sb_job *last = sb.jobs;

    while (last && last->next)
      last = last->next;
    if (adopt_locked(q, job, ws, f, n) != 0) {
      drop_jobs_after_locked(last);
      snprintf(err, errlen, "out of memory tracking the Slurm jobs of the recorded workers");
      rc = MUSTER_E_NOMEM;
    }
    for (int i = 0; !rc && i < n; i++) {
      ws[i].adopted = f[i].kind == SB_FATE_ADOPT;
      if (f[i].kind == SB_FATE_LOST)
        snprintf(ws[i].why, sizeof(ws[i].why), "%s", f[i].why);
    }
  }
  /* (a reconcile that failed tracks nothing, and leaves the queue and the
   * jobs' output to the next start: nothing polled, released or pruned) */
  if (!rc) {
    sb.reconciled = 1;
    pthread_cond_signal(&sb.cv);
  }
  pthread_mutex_unlock(&sb.mu);
  free(f);
  free(job);
  free(q);
  json_decref(root);
  return rc;
}
