/*
 * tr_run.h: what the modes of muster-train share: options, the schedule of
 * global batches, progress lines, checkpoints and the JSON summary.
 */
#ifndef MUSTER_TR_RUN_H
#define MUSTER_TR_RUN_H

#include "tr_data.h"
#include "tr_mlp.h"
#include "util.h"

#include <stdint.h>

enum tr_mode { TR_SINGLE, TR_ALLREDUCE, TR_PS };
enum tr_device { TR_CPU, TR_CUDA };

struct tr_opts {
  enum tr_mode mode;
  enum tr_device device;
  int sync;            /* ps: 1 --sync (default), 0 --async */
  char data_dir[1024]; /* --data */
  int synthetic;       /* --synthetic N (0: use --data) */
  int sizes[TR_MAX_LAYERS + 1];
  int nsizes;
  int epochs; /* --epochs (ignored when steps > 0) */
  long steps; /* --steps: total optimizer steps */
  int batch;  /* --batch: global batch */
  float lr, momentum;
  uint64_t seed;
  char checkpoint[1024];  /* --checkpoint PATH ("" none) */
  char resume[1024];      /* --resume PATH ("" none) */
  int auto_resume;        /* --auto-resume: resume from checkpoint if it exists */
  int threads;            /* BLAS threads per rank (default 1) */
  int quiet;              /* no per-epoch lines */
  char dump_params[1024]; /* --dump-params PATH: final parameters, raw floats (tests) */
  double io_timeout_s;    /* ps: every socket wait (default 10) */
  int lr_constant;        /* --lr-schedule constant (default: cosine) */
  int bench_sgemm;        /* --bench-sgemm N: measure, print, exit */
  int bench_step_gemms;   /* --bench-step-gemms B: measure, print, exit */
  long bench_allreduce;   /* --bench-allreduce FLOATS: measure, print, exit */
  long metrics_every;     /* --metrics-every N: a point every N steps (0: every ~1 s) */
};

/* What a run reports in its last line. */
struct tr_result {
  const char *mode;
  int ranks;
  long steps;
  double samples_per_s;
  double final_loss;    /* mean loss of the last global batch */
  double test_accuracy; /* 0..1 */
  double test_loss;
  double compute_s, comm_s, total_s;
  long samples;
  int report; /* 1: this process prints the summary (rank 0, or a PS worker 0) */
  /* Where the time went, as Unix times (bench/run's phases): main() entered,
   * the data loaded, every rank in (MPI_Init and the first broadcast; the
   * connections to every PS), training done (when the summary is printed). */
  double t_main, t_loaded, t_ready;
};

/* Steps in one epoch of n samples with global batch b (a last partial
 * batch is dropped, as every rank must draw full shards). */
long tr_steps_per_epoch(int n, int b);

/* Rows [*lo, *hi) of a global batch of b rows that rank r of k takes. */
void tr_shard(int b, int r, int k, int *lo, int *hi);

/* Copies the rows of global batch step (within its epoch's order perm)
 * that [lo, hi) selects into x (rows x dim) and y. */
void tr_gather(const struct tr_data *d, const int *perm, long step_in_epoch, int b, int lo, int hi,
               float *x, uint8_t *y);

/* Prints "epoch E/N  loss L  train_acc A  test_acc T  samples/s S" to
 * stdout unless quiet. */
void tr_report_epoch(const struct tr_opts *o, int epoch, int epochs, double loss, double train_acc,
                     double test_acc, double samples_per_s);

/* Prints the one-line JSON summary (the last line of output). */
void tr_print_summary(const struct tr_result *r);

/* Writes params (and velocity) and the step reached to path atomically
 * (temp file + rename). Returns 0 or an error with err filled. */
int tr_checkpoint_save(const char *path, const struct tr_mlp *m, long step, char *err,
                       size_t errlen) __attribute__((warn_unused_result));

/* Loads a checkpoint into m (whose layer sizes must match) and *step.
 * Returns 0 or an error with err filled. */
int tr_checkpoint_load(const char *path, struct tr_mlp *m, long *step, char *err, size_t errlen)
    __attribute__((warn_unused_result));

/* Writes the final parameters as raw floats (for tests comparing modes). */
int tr_dump_params(const char *path, const struct tr_mlp *m) __attribute__((warn_unused_result));

/* The learning rate of step (0-based) of a run of total steps: --lr decayed
 * along a half cosine to 0 (the default), or constant. Every mode takes it
 * from here, so they all compute the same steps. */
float tr_lr_at(const struct tr_opts *o, long step, long total);

/* Monotonic seconds. */
double tr_now(void);
/* Unix time in seconds (comparable across the processes of a host). */
double tr_wall(void);

/* The modes; each returns a process exit code (0 on success) and fills r. */
MUST_CHECK int tr_run_single(const struct tr_opts *o, struct tr_mlp *m, const struct tr_data *train,
                             const struct tr_data *test, struct tr_result *r);
MUST_CHECK int tr_run_allreduce(const struct tr_opts *o, struct tr_mlp *m,
                                const struct tr_data *train, const struct tr_data *test,
                                struct tr_result *r, int *argc, char ***argv);
/* --bench-allreduce: the time of a bare MPI_Allreduce of n floats (under
 * mpirun), the reference for the trainer's per-step exchange. */
MUST_CHECK int tr_bench_allreduce(long n, int *argc, char ***argv);
/* MPI_Init, skipping Open MPI's probes for network hardware this host does
 * not have. */
void tr_mpi_init(int *argc, char ***argv);

/* Parameter servers over TCP; the cluster comes from TF_CONFIG (tr_ps.h). */
MUST_CHECK int tr_run_ps(const struct tr_opts *o, struct tr_mlp *m, const struct tr_data *train,
                         const struct tr_data *test, struct tr_result *r);
/* The layout muster-train and its CUDA plugin share (the structs above,
 * by size, and a version for changes sizes do not show): the loader
 * refuses a plugin built from other sources. */
#define TR_CUDA_PLUGIN_ABI                                                                         \
  (1000000000ul * 1 + 1000000ul * sizeof(struct tr_opts) % 1000 +                                  \
   1000ul * sizeof(struct tr_mlp) % 1000 + sizeof(struct tr_result) % 1000)

/* --device cuda (tr_cuda_load.c, which loads tr_cuda.cu's plugin); single
 * or allreduce (NCCL). */
MUST_CHECK int tr_run_cuda(const struct tr_opts *o, struct tr_mlp *m, const struct tr_data *train,
                           const struct tr_data *test, struct tr_result *r, int *argc,
                           char ***argv);

#endif
