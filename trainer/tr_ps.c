/*
 * tr_ps.c: the parameter-server mode of muster-train (--mode ps): the entry
 * point, which reads the cluster spec and becomes a server or a worker. The
 * protocol and the modules are described in tr_ps.h.
 */
#include "tr_ps.h"

#include <stdio.h>
#include <string.h>

static long total_steps(const struct tr_opts *o, const struct tr_data *train) {
  return o->steps > 0 ? o->steps : (long)o->epochs * tr_steps_per_epoch(train->n, o->batch);
}

int tr_run_ps(const struct tr_opts *o, struct tr_mlp *m, const struct tr_data *train,
              const struct tr_data *test, struct tr_result *r) {
  struct ps_cluster cl;
  struct tr_opts oo = *o;
  char err[1024];
  long steps, spe;
  double startup_s;
  int rc;
  double t_main = r->t_main, t_loaded = r->t_loaded;

  memset(r, 0, sizeof *r);
  r->t_main = t_main;
  r->t_loaded = t_loaded;
  r->mode = "ps";
  /* One summary for the job, worker 0's (tr_main prints it and writes
   * --dump-params from it). */
  r->report = 0;
  r->test_accuracy = -1;
  if (oo.io_timeout_s <= 0)
    oo.io_timeout_s = 10;
  if (o->resume[0]) {
    fprintf(stderr, "muster-train: --resume is not supported in --mode ps\n");
    return 2;
  }
  if (ps_cluster_from_env(&cl, err, sizeof err) != 0) {
    fprintf(stderr, "muster-train: %s\n", err);
    ps_cluster_cleanup(&cl);
    return 2;
  }
  r->ranks = cl.nworkers;
  r->report = !cl.is_ps && cl.index == 0;
  spe = tr_steps_per_epoch(train->n, o->batch);
  steps = total_steps(o, train);
  if (o->batch < cl.nworkers) {
    fprintf(stderr,
            "muster-train: the global batch (%d) must have a row for each of the %d "
            "workers\n",
            o->batch, cl.nworkers);
    rc = 2;
  } else if (spe < 1 || steps < 1) {
    fprintf(stderr,
            "muster-train: nothing to train: %d samples, a global batch of %d and %ld "
            "steps\n",
            train->n, o->batch, steps);
    rc = 2;
  } else {
    startup_s = (PS_CONNECT_WINDOW_S > oo.io_timeout_s ? PS_CONNECT_WINDOW_S : oo.io_timeout_s) +
                oo.io_timeout_s;
    r->steps = steps;
    if (cl.is_ps)
      rc = ps_run_server(&oo, m, &cl, steps, startup_s, r);
    else
      rc = ps_run_worker(&oo, m, train, test, &cl, steps, startup_s, r);
  }
  ps_cluster_cleanup(&cl);
  return rc;
}
