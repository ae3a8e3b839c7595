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
 *
 * This file holds the backend's thread (one poll of the queue, then what is
 * to be submitted or cancelled) and its operations; the rest is in
 * slurm_*.c, each named for its one job (slurm_internal.h lists them and
 * the one way their calls go).
 */
#include "slurm_internal.h"

#include "fault.h"
#include "log.h"
#include "muster_errors.h"

#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

/* One round of squeue: reports what changed for every tracked job. */
static void poll_jobs(void) {
  char words[400];
  json_t *root;
  struct sq_job *q;
  size_t nq, nn = 0, capn = 0;
  struct sb_note *notes = NULL;
  int64_t now = util_mono_ms();
  int sent_ending = 0;

  if (sb_queue_read(&root, &q, &nq, words, sizeof(words)) != 0) {
    static int64_t last_warn;
    if (now - last_warn > 30000) {
      LOG(LOG_WARN, "cannot read the Slurm queue: %s", words);
      last_warn = now;
    }
    return;
  }
  long copies[SB_COPIES_MAX], held[SB_COPIES_MAX];
  int ncopies = 0, nheld = 0;

  /* workers a restart could not match: matched now (not under sb.mu: sacct) */
  sb_resolve(q, nq);
  pthread_mutex_lock(&sb.mu);
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
          if (j->w[i].ended || !(nt = sb_note_add(&notes, &nn, &capn)))
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
      nt = sb_note_add(&notes, &nn, &capn);
      if (!nt) {
        live = 1; /* out of memory: the next poll tries again */
        break;
      }
      nn--; /* counted below, once it holds something to report */
      nt->w = *w;
      if (ended) {
        if (s && (state_is(s->state, "COMPLETED") || state_is(s->state, "FAILED"))) {
          nt->output_of = j->jobid;
          /* (an adopted job's account is not known: its output is read
           * only where every job is --run-as's) */
          if (j->out_dir[0] || !sb_users_have_dirs())
            snprintf(nt->out_dir, sizeof(nt->out_dir), "%s",
                     j->out_dir[0] ? j->out_dir : sb.out_dir);
          else
            nt->output_of = 0;
        }
        if (s && state_is(s->state, "NODE_FAIL"))
          nt->node_fail = 1;
        if (s)
          sb_end_sentence(s->state, s->reason, s->nodes, nt->detail, sizeof(nt->detail));
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
      sb_job_free(j);
      continue;
    }
    pj = &j->next;
  }
  pthread_mutex_unlock(&sb.mu);
  for (int i = 0; i < nheld; i++)
    if (sb_release_job(held[i]) == 0) {
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
    sb_scancel(job, args);
  }
  char down[200] = "";
  for (size_t i = 0, asked = 0; i < nn; i++) {
    if (notes[i].node_fail) {
      if (!asked++)
        sb_down_nodes(down, sizeof(down));
      if (down[0])
        snprintf(notes[i].detail, sizeof(notes[i].detail), "node %s failed (Slurm: NODE_FAIL)",
                 down);
    }
    if (notes[i].output_of)
      sb_append_output_error(notes[i].out_dir, notes[i].output_of, notes[i].detail,
                             sizeof(notes[i].detail));
    sb_report(notes[i].ev, &notes[i].w, notes[i].ref[0] ? notes[i].ref : NULL, notes[i].detail);
  }
  /* Tests: Slurm's account of an ending job comes late. */
  if (sent_ending)
    FAULT_POINT("slurm_after_ending");
  free(notes);
  free(q);
  json_decref(root);
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
      sb_prune_outputs();
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
      sb_submit_job(todo);
      pthread_mutex_lock(&sb.mu);
      continue;
    }
    if (cancel_job || step_job) {
      pthread_mutex_unlock(&sb.mu);
      if (cancel_job) {
        char job[32], *args[] = {job, NULL};
        snprintf(job, sizeof(job), "%ld", cancel_job);
        sb_scancel(job, args);
      } else {
        sb_cancel_step(step_id);
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
  int rc;

  sb.cfg = *cfg;
  snprintf(sb.controller_url, sizeof(sb.controller_url), "%s", state_controller_url());
  rc = sb_accounts_init(cfg, err, errlen);
  if (rc)
    return rc;
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
    sb_job_free(j);
  }
  free(sb.unresolved);
  free(sb.unresolved_ref);
  sb.unresolved = NULL;
  sb.unresolved_ref = NULL;
  sb.nunresolved = 0;
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

static int slurm_submit(const struct backend_start *ws, int n, char *why, size_t whylen) {
  /* (tests: an allocation that fails) */
  struct sb_job *j = FAULT_FAILS("slurm_submit_nomem") ? NULL : calloc(1, sizeof(*j));

  if (j)
    j->w = calloc((size_t)n, sizeof(*j->w));
  if (!j || !j->w) {
    /* Nothing can be reported from here (the state lock is held): the
     * caller fails the workers with why. */
    free(j);
    LOG(LOG_ERROR, "out of memory submitting %d workers to Slurm", n);
    snprintf(why, whylen, "out of memory in the controller preparing the Slurm job");
    return -1;
  }
  snprintf(j->launch, sizeof(j->launch), "%s", ws[0].launch ? ws[0].launch : "l-unknown");
  /* (a launch is one user's: its account is its first worker's) */
  snprintf(j->account, sizeof(j->account), "%s", ws[0].account ? ws[0].account : "");
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
  sb_job_append_locked(j);
  pthread_cond_signal(&sb.cv);
  pthread_mutex_unlock(&sb.mu);
  return 0;
}

static void slurm_cancel(const char *id, enum backend_cancel how) {
  pthread_mutex_lock(&sb.mu);
  /* A worker a restart left unmatched: its job, once found, is cancelled
   * rather than adopted (sb_resolve reads this under sb.mu). */
  for (int i = 0; i < sb.nunresolved; i++)
    if (strcmp(sb.unresolved[i].id, id) == 0)
      sb.unresolved[i].ended = 1;
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
