/*
 * slurm_fate.c: what becomes of a worker an earlier controller left, once a
 * restarted controller has read Slurm's queue (and, for a job no longer in
 * it, Slurm's accounting): adopted, started again under a new attempt, or
 * lost with a sentence saying why. The one place that decides it, for the
 * restart's own reading of the queue (slurm_reconcile) and for the first
 * poll that reads it when the restart could not (sb_resolve). Pure: no I/O,
 * no lock. Calls slurm_words.c (slurm_internal.h).
 */
#include "slurm_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Whether comment ("muster:ID:ATTEMPT,...") names worker id's attempt. */
static int comment_names(const char *c, const char *id, int attempt) {
  char key[40];
  size_t kl;

  if (!c || strncmp(c, "muster:", 7) != 0)
    return 0;
  kl = (size_t)snprintf(key, sizeof(key), "%s:%d", id, attempt);
  for (const char *at = strstr(c + 7, key); at; at = strstr(at + 1, key))
    if ((at[kl] == ',' || at[kl] == '\0') && (at[-1] == ',' || at[-1] == ':'))
      return 1;
  return 0;
}

long sb_fate_job_of(const struct sq_job *q, size_t nq, const char *id, int attempt) {
  /* A job not ended first, one not held before a held one: a held job
   * beside another with the same workers is a copy an unanswered sbatch
   * queued (sb_submit_job), left untracked for the polls to cancel. A
   * heterogeneous job is known by its leader (its first component). */
  for (int pass = 0; pass < 3; pass++)
    for (size_t k = 0; k < nq; k++) {
      int ended = state_final(q[k].state), held = job_held(&q[k]);

      if ((q[k].het_id && q[k].het_id != q[k].id) || (pass == 0 && (ended || held)) ||
          (pass == 1 && (ended || !held)) || (pass == 2 && !ended) ||
          !comment_names(q[k].comment, id, attempt))
        continue;
      return (long)k;
    }
  return -1;
}

void sb_fate_decide(const struct sb_fate_in *in, struct sb_fate *f) {
  memset(f, 0, sizeof(*f));
  if (in->job && !state_final(in->job->state)) {
    f->kind = SB_FATE_ADOPT;
    return;
  }
  if (in->job) {
    /* It ended recently enough for squeue to still list it. */
    f->kind = SB_FATE_LOST;
    sb_end_sentence(in->job->state, in->job->reason, in->job->nodes, f->why, sizeof(f->why));
    if (state_is(in->job->state, "COMPLETED") || state_is(in->job->state, "FAILED"))
      f->output_of = in->job->id;
    f->node_fail = state_is(in->job->state, "NODE_FAIL");
    return;
  }
  if (in->acct && state_final(in->acct->state)) {
    /* It left squeue (older than MinJobAge): Slurm's accounting says how
     * it ended. Not sacct's Reason: that is the last reason the job waited
     * (JobHeldUser, since muster submits jobs held), not why it ended. */
    char code[40];

    f->kind = SB_FATE_LOST;
    f->from_acct = 1;
    snprintf(code, sizeof(code), "exit code %.20s",
             in->acct->exit_code ? in->acct->exit_code : "?");
    sb_end_sentence(in->acct->state, code, in->acct->nodes, f->why, sizeof(f->why));
    if (state_is(in->acct->state, "COMPLETED") || state_is(in->acct->state, "FAILED"))
      f->output_of = in->acct->id;
    f->node_fail = state_is(in->acct->state, "NODE_FAIL");
    return;
  }
  if (in->registered) {
    /* Its workerd ran, and Slurm knows no job of it: nothing is left to
     * adopt, and its attempt ran (it is not started again). */
    f->kind = SB_FATE_LOST;
    snprintf(f->why, sizeof(f->why),
             "lost: its muster-workerd (%s) was gone when the controller restarted",
             in->ref ? in->ref : "never seen running");
    return;
  }
  /* Never registered, and no job of it queued or ended that Slurm knows:
   * its job was never queued (the controller stopped before sbatch
   * answered) or ended unseen. Its script never ran a workerd that
   * registered: a new attempt (should the old one appear, it is refused). */
  f->kind = SB_FATE_RESTART;
}
