/*
 * slurm_internal.h: what the files of the Slurm backend share; nothing
 * outside them includes it (backend_slurm.c says what the backend does).
 *
 * Calls go one way, down this list, never up:
 *   backend_slurm.c  its thread's loop, one poll of the queue, the operations
 *   slurm_adopt.c    after a restart: the jobs an earlier controller left
 *   slurm_fate.c     after a restart: what becomes of each worker (no I/O)
 *   slurm_retain.c   retention of ended jobs' output (OUT_DIR/JOBID.out)
 *   slurm_submit.c   sbatch (and --test-only), scontrol release, scancel
 *   slurm_script.c   a job's batch script and its shape options (no I/O)
 *   slurm_queue.c    squeue --json, read
 *   slurm_words.c    what Slurm says, made into muster's sentences
 *   slurm_accounts.c the accounts jobs run as, and their output's directories
 *   slurm_run.c      running one Slurm command, with a timeout
 *   slurm_jobs.c     the backend's state (sb), its tracked jobs, reports
 */
#ifndef MUSTER_SLURM_INTERNAL_H
#define MUSTER_SLURM_INTERNAL_H

#include "backend.h"
#include "state.h"
#include "util.h"

#include <jansson.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

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
  int started;      /* BACKEND_STARTED sent (a restart's unresolved worker: registered) */
  int ended;        /* cancelled by the controller, or reported lost */
  char reason[300]; /* the last BACKEND_WAITING sent */
};

/* One Slurm job: one launch's workers. */
struct sb_job {
  long jobid; /* 0 until sbatch answered */
  char launch[16];
  char account[64];  /* its user's unix_user; "" for --run-as (sb.uid_arg) */
  char out_dir[600]; /* where its output goes ("": sb.out_dir; a restart's) */
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

/* The backend's one state (defined in slurm_jobs.c). */
struct sb_state {
  pthread_mutex_t mu; /* leaf lock: never held while calling backend_report */
  pthread_cond_t cv;
  pthread_t thread;
  int running, stop;
  struct ctl_config cfg;
  char controller_url[600]; /* where workerd registers */
  /* Where jobs write their output (sbatch --output): STATE/slurm when jobs
   * run as the controller's own account; else a directory of the
   * --run-as account beside the state directory (slurmstepd opens the
   * file as the job's user, who must not enter the state directory). */
  char out_dir[600];
  /* sbatch --uid= and --gid= for a root controller's --run-as ("": none) */
  char uid_arg[32], gid_arg[32];
  char run_user[64], run_home[500]; /* that account's name and home */
  uid_t run_uid;                    /* ...and its ids */
  gid_t run_gid;
  struct sb_job *jobs;
  /* Workers a restart could not match with a job (squeue failed then):
   * matched by the first poll that reads the queue. */
  struct sb_worker *unresolved;
  char (*unresolved_ref)[32]; /* their recorded backend_ref ("" when none) */
  int nunresolved;
  int reconciled; /* reconcile has run: every job still queued is tracked */
};
extern struct sb_state sb;

/* The output of one command. */
struct sb_out {
  char *out, *err; /* NUL-terminated, never NULL after sb_run() */
  int status;      /* exit code, or 128 + signal; -1 if it could not run */
  int timed_out;
};

/* What squeue says of one job. */
struct sq_job {
  long id;
  long het_id; /* the heterogeneous job's leader, or 0 */
  const char *state, *reason, *nodes, *comment;
};

/* What to report after a poll, gathered under sb.mu, sent after. */
struct sb_note {
  enum backend_event ev;
  struct sb_worker w;
  char ref[32];
  char detail[600];
  long output_of;    /* a job whose output may say why it ended (read after sb.mu) */
  char out_dir[600]; /* ...in this directory (its account's) */
  int node_fail;     /* NODE_FAIL: name the nodes that are down (asked after sb.mu) */
};

/* ---- Slurm's job states (squeue's and sacct's words) ---- */

static inline int state_is(const char *s, const char *name) {
  return s && strcmp(s, name) == 0;
}

/* Slurm's final job states; any other state (PENDING, RUNNING and the
 * passing ones: COMPLETING, CONFIGURING, SIGNALING, STAGE_OUT, RESIZING,
 * REQUEUED, SUSPENDED, STOPPED...) is not an end. */
static inline int state_final(const char *s) {
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
static inline int state_ending(const char *s) {
  return state_is(s, "COMPLETING") || state_is(s, "STAGE_OUT");
}

/* Held as muster submits every job (sbatch --hold), or by a user. */
static inline int job_held(const struct sq_job *q) {
  return state_is(q->state, "PENDING") && state_is(q->reason, "JobHeldUser");
}

/* Waiting for resources, not running yet. */
static inline int state_queued(const char *s) {
  return state_is(s, "PENDING") || state_is(s, "REQUEUED") || state_is(s, "REQUEUE_HOLD") ||
         state_is(s, "SUSPENDED");
}

/* ---- slurm_jobs.c ---- */

/* Frees tracked job j and its workers (j is off the list). */
void sb_job_free(struct sb_job *j);
/* Appends j to the tracked jobs; called with sb.mu held. */
void sb_job_append_locked(struct sb_job *j);
/* Reports ev for worker w to the state machine; never under sb.mu. */
void sb_report(enum backend_event ev, const struct sb_worker *w, const char *ref,
               const char *detail);
/* Room for one more note in *notes (grown, freed by the caller); NULL when
 * memory ran out. */
struct sb_note *sb_note_add(struct sb_note **notes, size_t *nn, size_t *capn);

/* ---- slurm_run.c ---- */

/* Runs argv with a timeout; o's buffers are freed with sb_out_free(). */
MUST_CHECK int sb_run(char *const argv[], char *const envp[], const char *input, int timeout_ms,
                      struct sb_out *o);
void sb_out_free(struct sb_out *o);

/* ---- slurm_words.c ---- */

/* Slurm's own words from a failed command, into buf. */
void slurm_words(const struct sb_out *o, const char *cmd, int timeout_ms, char *buf, size_t len);
/* Whether Slurm's words say it could not be reached at all. */
int slurm_unreachable(const char *words);
/* A sentence for a job that ended in state with reason, into buf. */
void sb_end_sentence(const char *state, const char *reason, const char *nodes, char *buf,
                     size_t len);
/* The nodes Slurm has down now, into buf (runs sinfo; not under sb.mu). */
void sb_down_nodes(char *buf, size_t len);
/* Appends the error line of job jobid's output file to buf. */
void sb_append_output_error(const char *dir, long jobid, char *buf, size_t len);

/* ---- slurm_queue.c ---- */

/* Reads the queue: *root (to json_decref) and its jobs *q (to free). */
int sb_queue_read(json_t **root, struct sq_job **q, size_t *nq, char *words, size_t len);
/* The job queued with comment: its id, 0 when none, -1 when unknown. */
long sb_queued_with_comment(const char *comment, char *words, size_t len);

/* ---- slurm_script.c ---- */

/* backend_ops.describe: the shape Slurm is asked for. */
void slurm_describe(const struct backend_req *r, char *buf, size_t len);
/* Appends a shape's resource and placement options to argv; returns n. */
int sb_shape_args(const struct backend_req *r, int ntasks, char *argv[], int n, char bufs[4][64]);
/* Job j's batch script (malloc'd, the caller frees it), or NULL. */
char *sb_job_script(const struct sb_job *j);

/* ---- slurm_submit.c ---- */

/* backend_ops.could_ever_fit: sbatch --test-only. */
int slurm_could_ever_fit(const struct backend_req *r, const char **field, char *msg, size_t msglen);
/* Releases held job id (not under sb.mu): 0, or -1. */
int sb_release_job(long id);
/* Submits job j (not under sb.mu); a job it drops (refused, or every worker
 * stopped before it was queued) is taken off sb.jobs and freed. */
void sb_submit_job(struct sb_job *j);
/* Runs scancel with args (not under sb.mu). */
void sb_scancel(const char *what, char *const args[]);
/* Ends worker id's step (not under sb.mu). */
void sb_cancel_step(const char *id);

/* ---- slurm_retain.c ---- */

/* Removes the output of jobs that ended longer than --retain ago (not
 * under sb.mu). */
void sb_prune_outputs(void);

/* ---- slurm_fate.c ---- */

/* What sacct says of one ended job (pointers into its output). */
struct sb_acct {
  long id;
  const char *state, *exit_code, *nodes;
};

/* What is known of one worker an earlier controller left. */
struct sb_fate_in {
  int registered;             /* its workerd registered: it was running */
  const char *ref;            /* its recorded backend_ref (its job id), or NULL */
  const struct sq_job *job;   /* the queue's job that names it, or NULL */
  const struct sb_acct *acct; /* sacct's account of its job ref, or NULL */
};

enum sb_fate_kind {
  SB_FATE_ADOPT,   /* its job is queued or running: tracked again */
  SB_FATE_RESTART, /* its attempt never ran: a new attempt */
  SB_FATE_LOST,    /* it ended: why says how */
};

/* What becomes of it. */
struct sb_fate {
  enum sb_fate_kind kind;
  char why[256];  /* LOST: the sentence */
  long output_of; /* LOST: a job whose output may say more (read by the caller) */
  int node_fail;  /* LOST: NODE_FAIL (the caller names the nodes down) */
  int from_acct;  /* LOST: said by sacct */
};

/* The index in q of the job whose comment names worker id's attempt (one
 * not ended before an ended one; one not held before a held copy), or -1.
 * Pure. */
long sb_fate_job_of(const struct sq_job *q, size_t nq, const char *id, int attempt);
/* Decides the fate of one worker after a restart, into *f: adopted while
 * its job is queued or running; lost with Slurm's sentence when its job
 * ended (the queue's state, else sacct's); lost when it was running and
 * Slurm knows no job of it; else started again. Pure: no I/O, no lock. */
void sb_fate_decide(const struct sb_fate_in *in, struct sb_fate *f);

/* ---- slurm_adopt.c ---- */

/* Matches the workers a restart could not match, once the queue (q) can
 * be read: adopts them, or reports them started again or lost (sacct asked
 * as at the restart). Not under sb.mu; the backend's thread only. */
void sb_resolve(const struct sq_job *q, size_t nq);
/* backend_ops.reconcile. */
int slurm_reconcile(struct backend_live *ws, int n, char *err, size_t errlen);

/* ---- slurm_accounts.c: the accounts jobs run as, and where their output
 * goes ---- */

/* An account a job runs as, as sbatch is told. */
struct sb_account {
  char uid_arg[32], gid_arg[32]; /* sbatch --uid= --gid= ("": the controller's own) */
  char user[64], home[500];      /* its name and home ("": the controller's own) */
  char out_dir[600];             /* where its jobs' output goes */
  uid_t uid;                     /* (when uid_arg is set) */
  gid_t gid;
};
/* The default account (--run-as) and its output directory, sb.out_dir.
 * Returns 0, or an error with a sentence in err. */
int sb_accounts_init(const struct ctl_config *cfg, char *err, size_t errlen)
    __attribute__((warn_unused_result));
/* The account named name ("": the default), its output directory made.
 * Returns 0, or an error with why (the job's workers fail saying it). */
int sb_account_get(const char *name, struct sb_account *a, char *why, size_t whylen)
    __attribute__((warn_unused_result));
/* Whether any user's own account has had a job (STATE-slurm-users). */
int sb_users_have_dirs(void);
/* Calls fn with each account's output directory. */
void sb_output_dirs(void (*fn)(const char *dir, void *arg), void *arg);

#endif
