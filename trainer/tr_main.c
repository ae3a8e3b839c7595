/* tr_main.c: muster-train's command line and mode dispatch. */
#include "tr_blas.h"
#include "tr_run.h"
#include "util.h"

#include "muster_errors.h"

#if defined(__x86_64__) || defined(__i386__)
#include <pmmintrin.h>
#include <xmmintrin.h>
#endif
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

static void usage(FILE *f) {
  fprintf(f,
          "usage: muster-train [--mode single|allreduce|ps] [--sync|--async] [--device cpu|cuda]\n"
          "                    [--data DIR | --synthetic N] [--layers 784,256,128,10]\n"
          "                    [--epochs E | --steps S] [--batch B] [--lr L]\n"
          "                    [--lr-schedule cosine|constant] [--momentum M]\n"
          "                    [--seed S] [--checkpoint PATH] [--resume PATH] [--threads T]\n"
          "                    [--auto-resume] [--quiet] [--dump-params PATH] [--io-timeout S]\n"
          "                    [--metrics-every N]\n"
          "\n"
          "Trains a multi-layer perceptron (ReLU, softmax cross-entropy, SGD with momentum)\n"
          "data-parallel: single (one process), allreduce (under mpirun: one fused\n"
          "MPI_Allreduce or ncclAllReduce per step) or ps (parameter servers over TCP; the\n"
          "cluster comes from TF_CONFIG). --batch is the global batch: every mode with the\n"
          "same batch computes the same steps, to float rounding.\n"
          "\n"
          "  --data DIR      the four MNIST IDX files (default %s)\n"
          "  --synthetic N   N generated samples instead (benchmarks)\n"
          "  --epochs E      passes over the data (default 5); --steps S: S steps instead\n"
          "  --batch B       global batch (default 128)\n"
          "  --lr L          learning rate (default 0.1); --momentum M (default 0.9)\n"
          "  --lr-schedule cosine|constant  decay --lr to 0 along a half cosine (default)\n"
          "  --threads T     BLAS threads per process (default 1)\n"
          "  --checkpoint P  rank 0 writes P after every epoch (its directory is made;\n"
          "                  a leading ~/ is $HOME)\n"
          "  --auto-resume   resume from --checkpoint's file when it exists (else from\n"
          "                  --resume, else from the start)\n"
          "  --metrics-every N  under muster (MUSTER_RUN_ID), every rank posts loss,\n"
          "                  accuracy, samples/s and step time to its run every N steps\n"
          "                  (default 0: about once a second), and at each epoch's end\n"
          "\n"
          "The last line of output is a JSON summary.\n",
          MUSTER_DATA_DIR);
}

/* --bench-sgemm N: the single-thread rate of an N x N x N cblas_sgemm, the
 * compute bound that bench/trainer compares the training rate with. */
static int bench_sgemm(int n) {
  float *a = malloc((size_t)n * n * 4), *b = malloc((size_t)n * n * 4),
        *c = malloc((size_t)n * n * 4);
  double t0, t, flops = 2.0 * n * n * n;
  long it = 0;

  if (!a || !b || !c)
    return 1;
  for (size_t i = 0; i < (size_t)n * n; i++) {
    a[i] = (float)(i % 7) * 0.1f;
    b[i] = (float)(i % 5) * 0.1f;
  }
  tr_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1, a, n, b, n, 0, c, n);
  t0 = tr_now();
  do {
    tr_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1, a, n, b, n, 0, c, n);
    it++;
  } while ((t = tr_now() - t0) < 1.0);
  printf("{\"sgemm_n\": %d, \"gflops\": %.2f, \"kernel\": \"%s\"}\n", n, flops * it / t / 1e9,
         tr_blas_corename());
  free(a);
  free(b);
  free(c);
  return 0;
}

/* --bench-step-gemms B: the single-thread rate of exactly the GEMMs of one
 * training step at batch B (forward, weight gradients, input gradients),
 * with nothing else: the compute bound of this network at this batch. */
static int bench_step_gemms(const struct tr_opts *o, int b) {
  float *buf[3 * TR_MAX_LAYERS + 3] = {0};
  double flops = 0, t0, t;
  long it = 0;
  int L = o->nsizes - 1;

  for (int l = 0; l <= L; l++) {
    buf[l] = calloc((size_t)b * o->sizes[l], 4);         /* activations */
    buf[L + 1 + l] = calloc((size_t)b * o->sizes[l], 4); /* deltas */
  }
  for (int l = 0; l < L; l++) {
    buf[2 * L + 2 + l] = calloc((size_t)o->sizes[l] * o->sizes[l + 1], 4); /* W, dW */
    flops += 2.0 * b * o->sizes[l] * o->sizes[l + 1] * (l > 0 ? 3 : 2);
  }
  t0 = tr_now();
  do {
    for (int l = 0; l < L; l++)
      tr_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, b, o->sizes[l + 1], o->sizes[l], 1,
               buf[l], o->sizes[l], buf[2 * L + 2 + l], o->sizes[l + 1], 1, buf[l + 1],
               o->sizes[l + 1]);
    for (int l = L - 1; l >= 0; l--) {
      if (l > 0)
        tr_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, b, o->sizes[l], o->sizes[l + 1], 1,
                 buf[L + 2 + l], o->sizes[l + 1], buf[2 * L + 2 + l], o->sizes[l + 1], 0,
                 buf[L + 1 + l], o->sizes[l]);
      tr_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, o->sizes[l], o->sizes[l + 1], b, 1, buf[l],
               o->sizes[l], buf[L + 2 + l], o->sizes[l + 1], 0.9f, buf[2 * L + 2 + l],
               o->sizes[l + 1]);
    }
    it++;
  } while ((t = tr_now() - t0) < 1.0);
  printf("{\"step_gemms_batch\": %d, \"gflops\": %.2f, \"samples_per_s_bound\": %.0f}\n", b,
         flops * it / t / 1e9, (double)b * it / t);
  for (size_t i = 0; i < sizeof(buf) / sizeof(buf[0]); i++)
    free(buf[i]);
  return 0;
}

static int bad(const char *opt, const char *v, const char *want) {
  fprintf(stderr, "muster-train: %s: \"%s\" is not %s\n", opt, v ? v : "", want);
  return 2;
}

static MUST_CHECK int parse_long(const char *s, long min, long max, long *out) {
  char *end;
  long v;

  if (!s)
    return -1;
  errno = 0;
  v = strtol(s, &end, 10);
  if (errno || end == s || *end || v < min || v > max)
    return -1;
  *out = v;
  return 0;
}

static MUST_CHECK int parse_float(const char *s, double min, double max, float *out) {
  char *end;
  double v;

  if (!s)
    return -1;
  errno = 0;
  v = strtod(s, &end);
  if (errno || end == s || *end || !isfinite(v) || v < min || v > max)
    return -1;
  *out = (float)v;
  return 0;
}

static MUST_CHECK int parse_layers(const char *s, struct tr_opts *o) {
  o->nsizes = 0;
  while (s && *s) {
    char *end;
    long v;
    errno = 0;
    v = strtol(s, &end, 10);
    if (errno || end == s || v < 1 || v > 65536 || o->nsizes > TR_MAX_LAYERS)
      return -1;
    o->sizes[o->nsizes++] = (int)v;
    if (*end == ',')
      end++;
    else if (*end)
      return -1;
    s = end;
  }
  return o->nsizes >= 2 ? 0 : -1;
}

/* Fills o from argv; returns 0, or an exit code (0 after --help is 1). */
/* path into out, with a leading "~/" made the home of the account this
 * runs as ($HOME): muster run names its default checkpoint so, since a
 * worker's code runs as an account of its own, not as the client's. */
static void home_path(const char *path, char *out, size_t size) {
  const char *home = getenv("HOME");

  if (strncmp(path, "~/", 2) == 0 && home && *home)
    snprintf(out, size, "%s/%s", home, path + 2);
  else
    snprintf(out, size, "%s", path);
}

static MUST_CHECK int parse_args(int argc, char **argv, struct tr_opts *o) {
  memset(o, 0, sizeof(*o));
  o->mode = TR_SINGLE;
  o->device = TR_CPU;
  o->sync = 1;
  snprintf(o->data_dir, sizeof(o->data_dir), "%s", MUSTER_DATA_DIR);
  if (parse_layers("784,256,128,10", o) != 0)
    abort(); /* the default is well formed */
  o->epochs = 5;
  o->batch = 128;
  o->lr = 0.1f;
  o->momentum = 0.9f;
  o->seed = 1;
  o->threads = 1;
  o->io_timeout_s = 10;
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    long l;
    float f;

    if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
      usage(stdout);
      return -1;
    } else if (strcmp(a, "--sync") == 0) {
      o->sync = 1;
    } else if (strcmp(a, "--async") == 0) {
      o->sync = 0;
    } else if (strcmp(a, "--quiet") == 0) {
      o->quiet = 1;
    } else if (strcmp(a, "--auto-resume") == 0) {
      o->auto_resume = 1;
    } else if (!v) {
      fprintf(stderr, "muster-train: %s needs a value (see --help)\n", a);
      return 2;
    } else if (strcmp(a, "--mode") == 0) {
      i++;
      if (strcmp(v, "single") == 0)
        o->mode = TR_SINGLE;
      else if (strcmp(v, "allreduce") == 0)
        o->mode = TR_ALLREDUCE;
      else if (strcmp(v, "ps") == 0)
        o->mode = TR_PS;
      else
        return bad(a, v, "single, allreduce or ps");
    } else if (strcmp(a, "--device") == 0) {
      i++;
      if (strcmp(v, "cpu") == 0)
        o->device = TR_CPU;
      else if (strcmp(v, "cuda") == 0)
        o->device = TR_CUDA;
      else
        return bad(a, v, "cpu or cuda");
    } else if (strcmp(a, "--data") == 0) {
      i++;
      snprintf(o->data_dir, sizeof(o->data_dir), "%s", v);
    } else if (strcmp(a, "--synthetic") == 0) {
      i++;
      if (parse_long(v, 1, 10000000, &l))
        return bad(a, v, "a number of samples (1 to 10000000)");
      o->synthetic = (int)l;
    } else if (strcmp(a, "--layers") == 0) {
      i++;
      if (parse_layers(v, o))
        return bad(a, v, "a list of 2 to 17 layer sizes like 784,256,128,10");
    } else if (strcmp(a, "--epochs") == 0) {
      i++;
      if (parse_long(v, 1, 100000, &l))
        return bad(a, v, "a number of epochs (1 to 100000)");
      o->epochs = (int)l;
    } else if (strcmp(a, "--steps") == 0) {
      i++;
      if (parse_long(v, 1, 1000000000L, &l))
        return bad(a, v, "a number of steps (>= 1)");
      o->steps = l;
    } else if (strcmp(a, "--batch") == 0) {
      i++;
      if (parse_long(v, 1, 65536, &l))
        return bad(a, v, "a batch size (1 to 65536)");
      o->batch = (int)l;
    } else if (strcmp(a, "--lr") == 0) {
      i++;
      if (parse_float(v, 0, 100, &f))
        return bad(a, v, "a learning rate (0 to 100)");
      o->lr = f;
    } else if (strcmp(a, "--momentum") == 0) {
      i++;
      if (parse_float(v, 0, 0.9999, &f))
        return bad(a, v, "a momentum in [0, 1)");
      o->momentum = f;
    } else if (strcmp(a, "--seed") == 0) {
      i++;
      if (parse_long(v, 0, 0x7fffffffL, &l))
        return bad(a, v, "a seed (0 to 2^31-1)");
      o->seed = (uint64_t)l;
    } else if (strcmp(a, "--threads") == 0) {
      i++;
      if (parse_long(v, 1, 256, &l))
        return bad(a, v, "a thread count (1 to 256)");
      o->threads = (int)l;
    } else if (strcmp(a, "--lr-schedule") == 0) {
      i++;
      if (strcmp(v, "cosine") == 0)
        o->lr_constant = 0;
      else if (strcmp(v, "constant") == 0)
        o->lr_constant = 1;
      else
        return bad(a, v, "cosine or constant");
    } else if (strcmp(a, "--metrics-every") == 0) {
      i++;
      if (parse_long(v, 0, 1000000000L, &l))
        return bad(a, v, "a number of steps (0: about once a second)");
      o->metrics_every = l;
    } else if (strcmp(a, "--io-timeout") == 0) {
      i++;
      if (parse_float(v, 0.1, 3600, &f))
        return bad(a, v, "a number of seconds");
      o->io_timeout_s = f;
    } else if (strcmp(a, "--bench-sgemm") == 0) {
      i++;
      if (parse_long(v, 16, 8192, &l))
        return bad(a, v, "a matrix size (16 to 8192)");
      o->bench_sgemm = (int)l;
    } else if (strcmp(a, "--bench-step-gemms") == 0) {
      i++;
      if (parse_long(v, 1, 65536, &l))
        return bad(a, v, "a batch size");
      o->bench_step_gemms = (int)l;
    } else if (strcmp(a, "--bench-allreduce") == 0) {
      i++;
      if (parse_long(v, 1, 1L << 28, &l))
        return bad(a, v, "a number of floats");
      o->bench_allreduce = l;
    } else if (strcmp(a, "--checkpoint") == 0) {
      i++;
      home_path(v, o->checkpoint, sizeof(o->checkpoint));
    } else if (strcmp(a, "--resume") == 0) {
      i++;
      home_path(v, o->resume, sizeof(o->resume));
    } else if (strcmp(a, "--dump-params") == 0) {
      i++;
      snprintf(o->dump_params, sizeof(o->dump_params), "%s", v);
    } else {
      fprintf(stderr, "muster-train: unknown option %s (see --help)\n", a);
      return 2;
    }
  }
  /* --auto-resume: continue from the --checkpoint file when there is one
   * (a restarted run: muster run --max-restarts passes it), else from
   * --resume if given, else from the start. */
  if (o->auto_resume) {
    if (!o->checkpoint[0]) {
      fprintf(stderr, "muster-train: --auto-resume needs --checkpoint PATH\n");
      return 2;
    }
    if (access(o->checkpoint, F_OK) == 0)
      snprintf(o->resume, sizeof(o->resume), "%s", o->checkpoint);
  }
  return 0;
}

/* The test set of a synthetic run: the same classes, other samples. */
static MUST_CHECK int synthetic_split(const struct tr_opts *o, struct tr_data *train,
                                      struct tr_data *test) {
  int ntest = o->synthetic / 6 > 0 ? o->synthetic / 6 : 1, rc;
  struct tr_data all;

  rc = tr_data_synthetic(o->synthetic + ntest, o->sizes[0], o->sizes[o->nsizes - 1], o->seed, &all);
  if (rc)
    return rc;
  *train = all;
  train->n = o->synthetic;
  test->n = ntest;
  test->dim = all.dim;
  test->classes = all.classes;
  test->x = tr_alloc((size_t)ntest * all.dim * sizeof(float));
  test->y = malloc((size_t)ntest);
  if (!test->x || !test->y)
    return MUSTER_E_NOMEM;
  memcpy(test->x, all.x + (size_t)o->synthetic * all.dim, (size_t)ntest * all.dim * sizeof(float));
  memcpy(test->y, all.y + o->synthetic, (size_t)ntest);
  return 0;
}

int main(int argc, char **argv) {
  struct tr_opts o;
  struct tr_data train = {0}, test = {0};
  struct tr_mlp m;
  struct tr_result r;
  char err[600];
  int code, rc;
  double t_main = tr_wall(), t_loaded;

  code = parse_args(argc, argv, &o);
  if (code)
    return code < 0 ? 0 : code;
  rc = tr_blas_load(o.threads, err, sizeof err);
  if (rc) {
    fprintf(stderr, "muster-train: %s\n", err);
    return rc;
  }
#if defined(__x86_64__) || defined(__i386__)
  /* Weights whose gradient is always zero (MNIST's blank border pixels)
   * see their momentum decay geometrically into subnormal floats, on which
   * every operation traps to microcode: half the speed, for values that
   * cannot matter. Flush them to zero, as CPU deep-learning frameworks do. */
  _MM_SET_FLUSH_ZERO_MODE(_MM_FLUSH_ZERO_ON);
  _MM_SET_DENORMALS_ZERO_MODE(_MM_DENORMALS_ZERO_ON);
#endif
  if (o.bench_sgemm)
    return bench_sgemm(o.bench_sgemm);
  if (o.bench_step_gemms)
    return bench_step_gemms(&o, o.bench_step_gemms);
  if (o.bench_allreduce)
    return tr_bench_allreduce(o.bench_allreduce, &argc, &argv);

  if (o.synthetic) {
    rc = synthetic_split(&o, &train, &test);
    if (rc) {
      fprintf(stderr, "muster-train: could not make %d synthetic samples: %s\n", o.synthetic,
              muster_strerror(rc));
      return 1;
    }
  } else {
    rc = tr_data_load_mnist(o.data_dir, 1, &train, err, sizeof(err));
    if (!rc)
      rc = tr_data_load_mnist(o.data_dir, 0, &test, err, sizeof(err));
    if (rc) {
      fprintf(stderr,
              "muster-train: %s\n(the MNIST files come from scripts/setup.sh; or give "
              "--data DIR or --synthetic N)\n",
              err);
      tr_data_cleanup(&train);
      return 2;
    }
  }
  t_loaded = tr_wall();
  if (test.n > 0 && test.dim != train.dim) {
    fprintf(stderr,
            "muster-train: the test set's samples have %d features, the training set's %d "
            "(t10k-images-idx3-ubyte and train-images-idx3-ubyte must have the same image size)\n",
            test.dim, train.dim);
    code = 2;
    goto out;
  }
  if (o.sizes[0] != train.dim || o.sizes[o.nsizes - 1] < train.classes) {
    fprintf(stderr,
            "muster-train: --layers: the first layer must have %d units (the data's features) "
            "and the last at least %d (its classes); got %d and %d\n",
            train.dim, train.classes, o.sizes[0], o.sizes[o.nsizes - 1]);
    code = 2;
    goto out;
  }
  if (tr_steps_per_epoch(train.n, o.batch) < 1) {
    fprintf(stderr, "muster-train: --batch %d is larger than the %d training samples\n", o.batch,
            train.n);
    code = 2;
    goto out;
  }
  if (tr_mlp_init(&m, o.sizes, o.nsizes, o.batch, o.seed) != 0) {
    fprintf(stderr, "muster-train: out of memory for the network\n");
    code = 1;
    goto out;
  }
  memset(&r, 0, sizeof(r));
  r.report = 1;
  r.t_main = t_main;
  r.t_loaded = t_loaded;
  if (o.device == TR_CUDA)
    code = tr_run_cuda(&o, &m, &train, &test, &r, &argc, &argv);
  else if (o.mode == TR_SINGLE)
    code = tr_run_single(&o, &m, &train, &test, &r);
  else if (o.mode == TR_ALLREDUCE)
    code = tr_run_allreduce(&o, &m, &train, &test, &r, &argc, &argv);
  else
    code = tr_run_ps(&o, &m, &train, &test, &r);
  if (code == 0 && r.report) {
    if (o.dump_params[0] && o.device == TR_CPU && tr_dump_params(o.dump_params, &m) != 0) {
      fprintf(stderr, "muster-train: could not write %s\n", o.dump_params);
      code = 1;
    }
    tr_print_summary(&r);
  }
  tr_mlp_cleanup(&m);
out:
  tr_data_cleanup(&train);
  tr_data_cleanup(&test);
  return code;
}
