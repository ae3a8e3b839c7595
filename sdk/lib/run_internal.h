/* run_internal.h: what the files of muster_run_cluster() share: one
 * attempt's state (struct run), its processes (struct proc), and the calls
 * between its layers: run.c (the attempts, restarts) calls run_attempt.c
 * (launch, await, stop), which calls run_allreduce.c and run_exec.c (the
 * command) and run_monitor.c (the event stream); those report through
 * run_output.c (output lines) and run_failure.c (the first failure), which
 * call none of them. Not part of libmuster's API. */
#ifndef MUSTER_SDK_RUN_INTERNAL_H
#define MUSTER_SDK_RUN_INTERNAL_H

#include "internal.h"
#include "muster.h"

#include <jansson.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/types.h>

#define LINE_MAX_BYTES (64 * 1024)

/* One process of the run: a PS or worker (through exec) or mpirun. */
struct proc {
  struct run *run;
  const char *role;
  int index;
  muster_exec_target target;
  char *env[10];
  size_t nenv;
  char line[2][LINE_MAX_BYTES];
  size_t linelen[2];
  int exit_code;
  int rc;
  char err[512];
  pthread_t thread;
  int started;
  /* If set, sees each whole line of output first (line: len bytes and a
   * NUL, which it may shorten): a line it takes (returns 1) is not handed
   * out. Called from the thread that reads that output; take_arg is its. */
  int (*take_line)(struct proc *p, int is_err, char *line, size_t *len);
  void *take_arg;
  /* If set, a line cut for its length (LINE_MAX_BYTES) is never cut inside
   * this string (the start of it at the cut, or all of it followed by its
   * fields): that end goes into the next line, for take_line to see whole. */
  const char *keep_whole;
};

struct run {
  const muster_run_opts *o;
  muster_run_result *r;
  pthread_mutex_t lock;
  pthread_cond_t failed; /* signalled when the first failure is recorded */
  volatile int cancel;
  pid_t mpirun;
  char *last_line; /* of worker 0 / rank 0 */
  muster_worker_list ps, workers;
  char exec_token[128];
  /* This attempt's command (the options' own, or with the trainer's
   * checkpoint flags), and its number (0: the first; MUSTER_RESTART_COUNT). */
  const char *const *argv;
  size_t argc;
  int attempt;
  const char *run_id; /* the run's record, which its workers join ("": none) */
  /* The attempt must not be restarted: 1, a worker was stopped from
   * outside (by the user, or its session's lease ran out); 2, its workers
   * could not be stopped. */
  int final;
  /* When a process of the run last wrote a line (monotonic ms): progress,
   * for the stall watchdog. */
  int64_t last_output_ms;
};

/* Follows the event stream and fails the run when one of its workers fails
 * or is stopped by someone else. */
struct monitor {
  struct run *run;
  muster_client *c;
  int64_t since;
};

/* A new string made as printf would (free() it), or NULL when out of
 * memory. */
static inline char *xasprintf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static inline char *xasprintf(const char *fmt, ...) {
  va_list ap;
  char *s = NULL;

  va_start(ap, fmt);
  if (vasprintf(&s, fmt, ap) < 0)
    s = NULL;
  va_end(ap);
  return s;
}

/* ---- run_failure.c ---- */

/* Records the first failure only (of worker, NULL for none in particular),
 * and cancels the attempt: its processes end, mpirun gets SIGTERM. */
MUSTER_INTERNAL void muster_run_fail_(struct run *run, const char *worker, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* As muster_run_fail_() with text, unless the attempt is over already
 * (run->cancel: its command ended, or a failure came first): then it
 * records nothing. Returns whether it recorded. */
MUSTER_INTERNAL int muster_run_fail_live_(struct run *run, const char *worker, const char *text);
/* Waits up to seconds for a failure to be recorded (by the monitor). */
MUSTER_INTERNAL void muster_run_await_worker_failure_(struct run *run, int seconds);
/* Copies the failure in (a sentence, then maybe the lines its stderr ended
 * with) into out (size bytes, at least 64) as valid UTF-8, shortened if it
 * does not fit: the sentence stays (cut after "..." at a character only if
 * longer than half of out), then as many of the last lines as fit, the
 * first of them cut at its front after "..." if even the last line does
 * not fit. The last line, a traceback's last, is never lost. */
MUSTER_INTERNAL void muster_run_failure_fit_(const char *in, char *out, size_t size);
/* A failure on one line, into out (size bytes, at least 64): its sentence,
 * then its last quoted line, if any, after a space; fit as above. */
MUSTER_INTERNAL void muster_run_failure_line_(const char *in, char *out, size_t size);

/* ---- run_rank_end.c ---- */

/* The failure a rank reported first (common/rank_end.h): mpirun's exit
 * code alone names neither the rank nor the cause. */
struct rank_ends {
  char marker[64];
  int seen;
  int outside; /* some report was a lost connection, SIGTERM or SIGKILL */
  long rank;
  char kind[8];
  int n;
  char text[512];
};

/* mpirun's output lines pass here first (struct proc's take_line; take_arg
 * is a struct rank_ends holding the attempt's marker): a rank's end report
 * is taken out, and the first kept (a later one is collateral: a peer's
 * gloo or NCCL exit after this rank's worker was stopped). What came before
 * the report on its line (an unended last line of a rank's own stderr) is
 * still handed out, without the report's own tag ("[1,R]<stderr>:"). */
MUSTER_INTERNAL int muster_run_take_rank_end_(struct proc *p, int is_err, char *line, size_t *len);

/* ---- run_output.c ---- */

/* Hands len bytes of p's stdout (is_err 0) or stderr out as lines. */
MUSTER_INTERNAL void muster_run_emit_(struct proc *p, int is_err, const char *data, size_t len);
/* Hands out p's unfinished last lines. */
MUSTER_INTERNAL void muster_run_flush_lines_(struct proc *p);

/* ---- run_monitor.c ---- */

/* The monitor's thread (arg: a struct monitor): follows the event stream
 * until m->c is cancelled, failing the run when one of its workers fails
 * or is stopped. */
MUSTER_INTERNAL void *muster_run_monitor_main_(void *arg);

/* ---- run_stall.c ---- */

/* The stall watchdog of one attempt (o->stall_timeout > 0). */
struct stall;
struct stall_watch {
  struct stall *s;
  pthread_t thread;
  int started;
};

/* Notes that a process of the run wrote a line (run_output.c). */
MUSTER_INTERNAL void muster_run_note_output_(struct run *run);
/* Starts watching run (its workers running, its exec token known) with a
 * client of its own, like c. Returns 0 (nothing started when stalls are
 * not watched) or MUSTER_E_NOMEM. */
MUSTER_INTERNAL int muster_run_stall_start_(struct stall_watch *w, struct run *run,
                                            muster_client *c);
/* Stops it (run->cancel set first) and frees what it holds. */
MUSTER_INTERNAL void muster_run_stall_stop_(struct stall_watch *w);
MUSTER_INTERNAL void *muster_run_stall_main_(void *arg);

/* ---- run_allreduce.c, run_exec.c: the command ---- */

/* Runs the command under mpirun (mode allreduce); a failure is recorded in
 * run. */
MUSTER_INTERNAL void muster_run_allreduce_(struct run *run, const char *master);
/* Runs the command in every PS and worker (modes ps, exec); cluster is the
 * TF_CONFIG cluster (borrowed reference). A failure is recorded in run. */
MUSTER_INTERNAL void muster_run_exec_all_(struct run *run, const char *master, json_t *cluster);

/* ---- run_attempt.c ---- */

/* One attempt of the run: launches, awaits, runs the command, stops every
 * worker. Returns 0 when it got as far as running (r->failure says whether
 * the command failed), or the controller's error; *final says whether the
 * attempt may be followed by another (0) or not (see struct run). */
MUSTER_INTERNAL int muster_run_attempt_(muster_client *c, const muster_run_opts *o,
                                        muster_run_result *r, const char *session,
                                        const char *const *argv, size_t argc, int attempt,
                                        int *final);

#endif
