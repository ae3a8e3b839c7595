/* metrics_call.c: bench/metrics' measure of muster_log_metrics() on a
 * training loop's hot path, beside its reference: the same loop with a
 * bare mutex-guarded copy of the same values into a buffer (what any
 * thread-safe logger's call costs at least).
 *
 * usage: muster-metrics-call URL RUN TOKEN CALLS
 * Prints {"calls", "ns_per_call", "ref_ns_per_call", "dropped_by_then"}
 * (values dropped, past the 100,000 that may wait, when the loop ended). */
#include "muster.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_ns(void) {
  struct timespec ts;

  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e9 + ts.tv_nsec;
}

static pthread_mutex_t ref_lock = PTHREAD_MUTEX_INITIALIZER;
static double ref_buf[4096][4];

/* The reference: a locked copy of the values with their step and time. */
static __attribute__((noinline)) void ref_log(long step, const double *v) {
  struct timespec ts;

  clock_gettime(CLOCK_REALTIME, &ts);
  pthread_mutex_lock(&ref_lock);
  memcpy(ref_buf[step & 4095], v, 4 * sizeof(double));
  ref_buf[step & 4095][1] = (double)ts.tv_nsec;
  pthread_mutex_unlock(&ref_lock);
}

int main(int argc, char **argv) {
  static const char *const names[] = {"loss", "accuracy", "samples_per_s", "step_time"};
  muster_metrics *m = NULL;
  uint64_t sent = 0, dropped = 0;
  double v[4] = {0.5, 0.9, 1000, 0.01}, t0, t_log, t_ref;
  long n, rc;

  if (argc != 5 || (n = atol(argv[4])) <= 0) {
    fprintf(stderr, "usage: muster-metrics-call URL RUN TOKEN CALLS\n");
    return 2;
  }
  rc = muster_metrics_open(argv[1], argv[2], argv[3], 0, 0.1, &m);
  if (rc) {
    fprintf(stderr, "muster-metrics-call: %s\n", muster_strerror((int)rc));
    return 1;
  }
  t0 = now_ns();
  for (long i = 0; i < n; i++) {
    v[0] = 1.0 / (double)(i + 1);
    (void)muster_log_metrics(m, i, -1, names, v, 4);
  }
  t_log = now_ns() - t0;
  t0 = now_ns();
  for (long i = 0; i < n; i++) {
    v[0] = 1.0 / (double)(i + 1);
    ref_log(i, v);
  }
  t_ref = now_ns() - t0;
  muster_metrics_counts(m, &sent, &dropped);
  muster_metrics_close(m, 10);
  printf("{\"calls\": %ld, \"ns_per_call\": %.1f, \"ref_ns_per_call\": %.1f, \"dropped_by_then\": "
         "%llu}\n",
         n, t_log / n, t_ref / n, (unsigned long long)dropped);
  return 0;
}
