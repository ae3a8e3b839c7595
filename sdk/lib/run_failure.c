/* run_failure.c: the first failure of a run's attempt, recorded once and
 * waited for. */
#include "muster.h"
#include "run_internal.h"

#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <time.h>

/* Records the first failure only. */
void muster_run_fail_(struct run *run, const char *worker, const char *fmt, ...) {
  va_list ap;

  pthread_mutex_lock(&run->lock);
  if (!run->r->failure[0]) {
    va_start(ap, fmt);
    vsnprintf(run->r->failure, sizeof(run->r->failure), fmt, ap);
    va_end(ap);
    snprintf(run->r->failed_worker, sizeof(run->r->failed_worker), "%s", worker ? worker : "");
    pthread_cond_broadcast(&run->failed);
  }
  run->cancel = 1;
  if (run->mpirun > 0)
    kill(run->mpirun, SIGTERM);
  pthread_mutex_unlock(&run->lock);
}

/* A rank or daemon that lost its worker's exec connection makes mpirun exit
 * with 255 (what muster rank and muster rsh then say, as ssh does). The
 * controller tells the monitor which worker failed, and why, moments later:
 * wait a little for that, so that the run names the worker. */
void muster_run_await_worker_failure_(struct run *run, int seconds) {
  struct timespec end;

  clock_gettime(CLOCK_MONOTONIC, &end);
  end.tv_sec += seconds;
  pthread_mutex_lock(&run->lock);
  while (!run->r->failure[0] && pthread_cond_timedwait(&run->failed, &run->lock, &end) == 0)
    ;
  pthread_mutex_unlock(&run->lock);
}
