/*
 * slurm_jobs.c: the Slurm backend's one state (sb): its tracked jobs and
 * their workers, and what it reports to the state machine. Calls nothing
 * of the backend's other files (slurm_internal.h).
 */
#include "slurm_internal.h"

#include <stdlib.h>
#include <string.h>

struct sb_state sb = {.mu = PTHREAD_MUTEX_INITIALIZER};

void sb_job_free(struct sb_job *j) {
  free(j->comment);
  free(j->w);
  free(j->cancel_steps);
  free(j);
}

void sb_report(enum backend_event ev, const struct sb_worker *w, const char *ref,
               const char *detail) {
  struct backend_report r = {
      .event = ev, .id = w->id, .attempt = w->attempt, .ref = ref, .detail = detail};
  backend_report(&r);
}

/* Appends j to the tracked jobs (oldest first: sbatch runs in launch
 * order). Called with sb.mu held. */
void sb_job_append_locked(struct sb_job *j) {
  struct sb_job **pj = &sb.jobs;

  while (*pj)
    pj = &(*pj)->next;
  j->next = NULL;
  *pj = j;
}

/* Room for one more note; NULL when memory ran out. */
struct sb_note *sb_note_add(struct sb_note **notes, size_t *nn, size_t *capn) {
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
