/*
 * slurm_retain.c: retention of the output Slurm writes for muster's jobs
 * (OUT_DIR/JOBID.out: STATE/slurm, or STATE-slurm for --run-as, and
 * STATE-slurm-users/ACCOUNT for a user's own account): an ended job's goes
 * after --retain, as ended workers' logs do. Calls slurm_accounts.c and
 * slurm_queue.c (slurm_internal.h).
 */
#include "slurm_internal.h"

#include "log.h"

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

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

/* One pass of retention over the output directories. */
struct prune {
  time_t cutoff;
  json_t *root;
  struct sq_job *q; /* squeue's jobs, read once a pass, when needed */
  size_t nq;
  int asked, readable, n;
};

static void prune_dir(const char *dir, void *arg) {
  struct prune *pr = arg;
  char path[1200], words[400];
  struct dirent *e;
  struct stat st;
  DIR *d = opendir(dir);

  if (!d)
    return;
  while ((e = readdir(d))) {
    char *end;
    long id = strtol(e->d_name, &end, 10);

    if (end == e->d_name || id <= 0 || strcmp(end, ".out") != 0)
      continue;
    snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
    if (lstat(path, &st) != 0 || st.st_mtime >= pr->cutoff || job_tracked(id))
      continue;
    if (!pr->asked++)
      pr->readable = sb_queue_read(&pr->root, &pr->q, &pr->nq, words, sizeof(words)) == 0;
    if (job_listed_live(pr->q, pr->nq, pr->readable, id))
      continue;
    if (unlink(path) == 0)
      pr->n++;
    else if (errno != ENOENT)
      LOG(LOG_WARN, "could not remove %s: %s", path, strerror(errno));
  }
  closedir(d);
}

/* Retention: the output (OUT_DIR/JOBID.out, in each account's directory)
 * of a job that has ended goes once the file is older than --retain, as
 * ended workers' logs do. A job this controller tracks, or squeue lists as
 * not ended, keeps its output (workerd writes to it only at its start, so
 * a long job's file is old). Not under sb.mu. */
void sb_prune_outputs(void) {
  struct prune pr = {.cutoff = time(NULL) - (time_t)sb.cfg.retain_s};

  if (!jobs_all_known())
    return;
  sb_output_dirs(prune_dir, &pr);
  free(pr.q);
  json_decref(pr.root);
  if (pr.n)
    LOG(LOG_INFO, "retention: removed the output of %d ended Slurm jobs", pr.n);
}
