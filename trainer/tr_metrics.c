/* tr_metrics.c: see tr_metrics.h. One logger per process. */
#include "tr_metrics.h"

#include "muster.h"

#include <stdio.h>
#include <time.h>

/* Monotonic seconds (its own: tr_run.c calls this file, never the other
 * way). */
static double mono(void) {
  struct timespec ts;

  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static struct {
  muster_metrics *m;
  long every;
  double t_last;    /* when the last point was logged */
  long steps_since; /* steps and samples since then */
  long samples_since;
} g;

void tr_metrics_open(long every, int rank) {
  int rc = muster_metrics_open(NULL, NULL, NULL, rank, 0.5, &g.m);

  if (rc && rc != MUSTER_E_NOT_FOUND)
    fprintf(stderr, "muster-train: metrics will not be sent: %s\n", muster_strerror(rc));
  g.every = every;
  g.t_last = mono();
  g.steps_since = g.samples_since = 0;
}

void tr_metrics_step(long step, long steps_per_epoch, double loss, double accuracy, long samples,
                     int last) {
  static const char *const names[] = {"loss", "accuracy", "samples_per_s", "step_time"};
  double now, dt, v[4];

  if (!g.m)
    return;
  g.steps_since++;
  g.samples_since += samples;
  now = mono();
  dt = now - g.t_last;
  if (!last && (g.every > 0 ? (step + 1) % g.every != 0 : dt < 1.0))
    return;
  v[0] = loss;
  v[1] = accuracy;
  v[2] = dt > 0 ? g.samples_since / dt : 0;
  v[3] = g.steps_since > 0 ? dt / g.steps_since : 0;
  (void)muster_log_metrics(g.m, step, (double)(step + 1) / steps_per_epoch, names, v, 4);
  g.t_last = now;
  g.steps_since = g.samples_since = 0;
}

void tr_metrics_value(long step, long steps_per_epoch, const char *name, double value) {
  if (g.m)
    (void)muster_log_metrics(g.m, step, (double)(step + 1) / steps_per_epoch, &name, &value, 1);
}

void tr_metrics_close(void) {
  muster_metrics_close(g.m, 5);
  g.m = NULL;
}
