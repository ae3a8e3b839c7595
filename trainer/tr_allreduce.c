/* tr_allreduce.c: --mode allreduce on the CPU, under mpirun. Every rank
 * starts from rank 0's weights, computes the gradient of its shard of each
 * global batch, and all gradients (every layer, plus the loss sum and the
 * correct count) travel in one fused MPI_Allreduce per step. */
#include "fabric.h"
#include "tr_metrics.h"
#include "tr_run.h"

#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

void tr_mpi_init(int *argc, char ***argv) {
  /* Open MPI 4.1 spends 0.2 s in MPI_Init probing the transports of its cm
   * and ucx messaging layers (PSM, PSM2, libfabric, UCX); on a host with
   * none of their hardware it then chooses ob1 (shared memory, TCP) anyway.
   * Its hwloc also reads every PCI device of the host (25 ms and more of
   * MPI_Init), for the locality of network cards such a host does not
   * have. A user's own settings always win. */
  if (!host_has_fabric()) {
    if (!getenv("OMPI_MCA_pml"))
      setenv("OMPI_MCA_pml", "ob1", 1);
    if (!getenv("HWLOC_COMPONENTS"))
      setenv("HWLOC_COMPONENTS", "-linuxio,-pci", 1);
  }
  MPI_Init(argc, argv);
}

int tr_run_allreduce(const struct tr_opts *o, struct tr_mlp *m, const struct tr_data *train,
                     const struct tr_data *test, struct tr_result *r, int *argc, char ***argv) {
  long spe = tr_steps_per_epoch(train->n, o->batch);
  long total = o->steps > 0 ? o->steps : o->epochs * spe, step = 0;
  int epochs = (int)((total + spe - 1) / spe);
  int rank, size, lo, hi, code = 0;
  int *perm = NULL;
  float *x = NULL;
  uint8_t *y = NULL;
  double t_start, t_epoch, t_comp = 0, t_comm = 0, ep_loss = 0, ep_ok = 0, last_loss = 0;
  long ep_steps = 0;
  char err[512];

  tr_mpi_init(argc, argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  r->mode = "allreduce";
  r->ranks = size;
  if (o->batch < size) {
    if (rank == 0)
      fprintf(stderr, "muster-train: --batch %d is smaller than the %d ranks\n", o->batch, size);
    code = 2;
    goto out;
  }
  tr_shard(o->batch, rank, size, &lo, &hi);
  perm = malloc((size_t)train->n * sizeof(int));
  x = tr_alloc((size_t)(hi - lo) * train->dim * sizeof(float));
  y = malloc((size_t)(hi - lo) + 1);
  if (!perm || !x || !y) {
    fprintf(stderr, "muster-train: rank %d: out of memory\n", rank);
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  /* Rank 0 alone reads the checkpoint (the others may not see its file
   * system); the broadcasts below hand it to every rank. */
  if (rank == 0 && o->resume[0] && tr_checkpoint_load(o->resume, m, &step, err, sizeof(err)) != 0) {
    fprintf(stderr, "muster-train: rank %d: %s\n", rank, err);
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  /* Everyone starts from rank 0's weights (and momentum, when resuming). */
  MPI_Bcast(m->params, (int)m->nparams, MPI_FLOAT, 0, MPI_COMM_WORLD);
  MPI_Bcast(m->velocity, (int)m->nparams, MPI_FLOAT, 0, MPI_COMM_WORLD);
  MPI_Bcast(&step, 1, MPI_LONG, 0, MPI_COMM_WORLD);

  MPI_Barrier(MPI_COMM_WORLD);
  r->t_ready = tr_wall();
  tr_metrics_open(o->metrics_every, rank);
  t_start = t_epoch = tr_now();
  if (step < total)
    tr_epoch_order(o->seed, (int)(step / spe), train->n, perm);
  for (; step < total; step++) {
    long s_in = step % spe;
    double t0 = tr_now(), t1, t2;

    if (s_in == 0 && step > 0)
      tr_epoch_order(o->seed, (int)(step / spe), train->n, perm);
    tr_gather(train, perm, s_in, o->batch, lo, hi, x, y);
    tr_mlp_backprop(m, x, y, hi - lo, o->batch);
    t1 = tr_now();
    MPI_Allreduce(MPI_IN_PLACE, m->grads, (int)m->nparams + 2, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    t2 = tr_now();
    tr_mlp_sgd(m->params, m->velocity, m->grads, 0, m->nparams, tr_lr_at(o, step, total),
               o->momentum);
    t_comm += t2 - t1;
    t_comp += (t1 - t0) + (tr_now() - t2);
    last_loss = m->grads[m->nparams] / o->batch;
    ep_loss += last_loss;
    ep_ok += m->grads[m->nparams + 1];
    ep_steps++;
    tr_metrics_step(step, spe, last_loss, m->grads[m->nparams + 1] / o->batch, hi - lo,
                    s_in == spe - 1 || step == total - 1);
    if (s_in == spe - 1 || step == total - 1) {
      if (rank == 0) {
        double tl = 0, ta = 0, el = tr_now() - t_epoch;
        if (!o->quiet) {
          tr_mlp_evaluate(m, test, &tl, &ta);
          tr_metrics_value(step, spe, "test_accuracy", ta);
        }
        tr_report_epoch(o, (int)(step / spe) + 1, epochs, ep_loss / ep_steps,
                        ep_ok / ((double)ep_steps * o->batch), ta,
                        (double)ep_steps * o->batch / (el > 0 ? el : 1));
        if (o->checkpoint[0] &&
            tr_checkpoint_save(o->checkpoint, m, step + 1, err, sizeof(err)) != 0) {
          fprintf(stderr, "muster-train: %s\n", err);
          MPI_Abort(MPI_COMM_WORLD, 1);
        }
      }
      ep_loss = ep_ok = 0;
      ep_steps = 0;
      t_epoch = tr_now();
    }
    r->steps++;
  }
  MPI_Barrier(MPI_COMM_WORLD);
  r->total_s = tr_now() - t_start;
  r->comm_s = t_comm;
  r->compute_s = t_comp;
  r->samples = r->steps * o->batch;
  r->samples_per_s = r->total_s > 0 ? r->samples / r->total_s : 0;
  r->final_loss = last_loss;
  r->report = rank == 0; /* one summary for the job */
  if (rank == 0) {
    tr_mlp_evaluate(m, test, &r->test_loss, &r->test_accuracy);
    tr_metrics_value(total - 1, spe, "test_accuracy", r->test_accuracy);
  }
out:
  tr_metrics_close();
  free(perm);
  tr_free(x);
  free(y);
  MPI_Finalize();
  return code;
}

int tr_bench_allreduce(long n, int *argc, char ***argv) {
  float *buf;
  int rank, size, iters = 0;
  double t0, t;

  tr_mpi_init(argc, argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  buf = calloc((size_t)n, sizeof(float));
  if (!buf)
    MPI_Abort(MPI_COMM_WORLD, 1);
  for (int i = 0; i < 20; i++) /* warm up the transport */
    MPI_Allreduce(MPI_IN_PLACE, buf, (int)n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
  /* Calibrate on 50 calls, then time a count that takes about a second,
   * the same on every rank, with nothing else in the loop. */
  MPI_Barrier(MPI_COMM_WORLD);
  t0 = tr_now();
  for (int i = 0; i < 50; i++)
    MPI_Allreduce(MPI_IN_PLACE, buf, (int)n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
  iters = (int)(50 / (tr_now() - t0 > 1e-6 ? tr_now() - t0 : 1e-6));
  if (iters < 50)
    iters = 50;
  MPI_Bcast(&iters, 1, MPI_INT, 0, MPI_COMM_WORLD);
  MPI_Barrier(MPI_COMM_WORLD);
  t0 = tr_now();
  for (int i = 0; i < iters; i++)
    MPI_Allreduce(MPI_IN_PLACE, buf, (int)n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
  t = tr_now() - t0;
  if (rank == 0)
    printf(
        "{\"allreduce_floats\": %ld, \"ranks\": %d, \"iterations\": %d, \"ms_per_call\": %.4f}\n",
        n, size, iters, t / iters * 1000);
  free(buf);
  MPI_Finalize();
  return 0;
}
