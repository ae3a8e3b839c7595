/*
 * slurm_adopt.c: after a controller restart, the jobs an earlier controller
 * submitted: adopted when queued or running (matched by their comment
 * "muster:ID:ATTEMPT,..."), or the sentence of how they ended, from the
 * queue or from Slurm's accounting (sacct); workers the restart could not
 * match are matched by the first poll that reads the queue. Calls
 * slurm_queue.c, slurm_words.c, slurm_run.c and slurm_jobs.c
 * (slurm_internal.h).
 */
#include "slurm_internal.h"

#include "log.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Matches workers an earlier controller left with the jobs in q (their
 * comment "muster:ID:ATTEMPT,..."): a worker of a job that is queued or
 * running is adopted (and its job tracked), one of a job that ended gets
 * the sentence of that end in why. Called with sb.mu held; no I/O. */
static void adopt_from_queue(const struct sq_job *q, size_t nq, struct backend_live *ws, int n) {
  /* Jobs not held first: a held job beside another with the same workers
   * is a copy an unanswered sbatch queued (sb_submit_job), left untracked for
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
          sb_end_sentence(q[k].state, q[k].reason, q[k].nodes, ws[i].why, sizeof(ws[i].why));
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
      sb_job_append_locked(j);
    } else if (j) {
      sb_job_free(j);
    }
  }
}

/* The workers a restart could not match (squeue failed then), matched now:
 * adopted, or lost with the end of their job, or lost for having none.
 * Called with sb.mu held. */
void sb_resolve_locked(const struct sq_job *q, size_t nq, struct sb_note **notes, size_t *nn,
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

    if (ws[i].adopted || !(nt = sb_note_add(notes, nn, capn)))
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
        sb_down_nodes(down, sizeof(down));
      sb_end_sentence(f[1], code, state_is(f[1], "NODE_FAIL") && down[0] ? down : f[2], ws[i].why,
                      sizeof(ws[i].why));
      if (state_is(f[1], "COMPLETED") || state_is(f[1], "FAILED"))
        sb_append_output_error(id, ws[i].why, sizeof(ws[i].why));
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
void slurm_reconcile(struct backend_live *ws, int n) {
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
    if (sb_queue_read(&root, &q, &nq, words, sizeof(words)) == 0)
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
