/*
 * tr_cuda.cu: --device cuda for muster-train, in modes single and
 * allreduce (NCCL, with the NCCL id broadcast over MPI). Built as the
 * plugin libmuster-train-cuda.so, which tr_cuda_load.c loads only when
 * --device cuda is asked; it calls muster-train's own tr_* functions, which
 * the executable exports.
 *
 * The math is tr_mlp.c's, step for step: the same flat parameter layout,
 * the same initial weights (taken from m->params, which tr_mlp_init or a
 * checkpoint filled on the host), forward with bias then ReLU on hidden
 * layers, softmax cross-entropy scaled by 1/global_batch, and PyTorch's SGD
 * with momentum. cuBLAS runs in plain FP32 (no TF32), and the kernels keep
 * the CPU's rounding where they can (no fused multiply-adds in the SGD and
 * the softmax gradient, the bias gradient summed row by row in the same
 * order), so that only the GEMMs' summation order tells the paths apart.
 *
 * Row-major versus cuBLAS's column-major: a row-major r x c matrix is the
 * column-major c x r matrix of its transpose, so out = in W (row-major) is
 * computed as out^T = W^T in^T (column-major), with no copies.
 *
 * Every resource lives in one struct cu_run, freed by cu_cleanup(), which
 * accepts a partly set up one; helpers return 0 or the exit code and print
 * the sentence themselves.
 */
extern "C" {
#include "tr_metrics.h"
#include "tr_run.h"
}

#include <cublas_v2.h>
#include <cuda_runtime.h>
/* This file is C++ to nvcc; only MPI's C API is wanted (the C++ bindings
 * do not build with -Wextra -Werror). */
#define OMPI_SKIP_MPICXX 1
#define MPICH_SKIP_MPICXX 1
#include <mpi.h>
#include <nccl.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CU_THREADS 256
/* Grid-stride kernels need no more blocks than this to fill an H100. */
#define CU_MAX_BLOCKS 4096
/* Rows evaluated at once on the test set (at least the local batch). */
#define CU_EVAL_ROWS 2048

struct cu_run {
  const struct tr_opts *o;
  struct tr_mlp *m;
  int rank, nranks;
  int mpi_here; /* 1: MPI_Init was called here, so MPI_Finalize is ours */
  int all_fail; /* 1: an error every rank meets alike (no MPI_Abort needed) */
  int lo, hi;   /* this rank's rows of every global batch */
  int rows;     /* rows the activation buffers hold */
  cudaStream_t stream;
  cublasHandle_t blas;
  ncclComm_t comm;
  cudaEvent_t ev[4];
  int nev;
  float *d_pv;   /* nparams parameters, then nparams velocity */
  float *d_grad; /* nparams + 2, the layout of m->grads */
  float *d_x;
  uint8_t *d_y;
  float *d_act[TR_MAX_LAYERS + 1];   /* [1..L]: rows x sizes[l] */
  float *d_delta[TR_MAX_LAYERS + 1]; /* [1..L]: (hi - lo) x sizes[l] */
  float *d_row;                      /* 2 x rows: per-row loss, then per-row correct */
  double *d_eval;                    /* 2: loss sum and correct count over the test set */
  float *d_tx;                       /* the test set (rank 0 only) */
  uint8_t *d_ty;
  float *h_x[2]; /* pinned: two shards, one gathered while the other trains */
  uint8_t *h_y[2];
  float *h_stats; /* pinned, 2: the step's global loss sum and correct count */
  double *h_eval; /* pinned, 2 */
  int *perm;
  int perm_epoch;
};

/* ---- error reporting ------------------------------------------------- */

static int cu_ok(cudaError_t e, const char *what) {
  if (e == cudaSuccess)
    return 0;
  fprintf(stderr, "muster-train: --device cuda: %s failed: %s\n", what, cudaGetErrorString(e));
  return 1;
}

static int blas_ok(cublasStatus_t s, const char *what) {
  if (s == CUBLAS_STATUS_SUCCESS)
    return 0;
  fprintf(stderr, "muster-train: --device cuda: %s failed: %s\n", what, cublasGetStatusString(s));
  return 1;
}

static int nccl_ok(ncclResult_t s, const char *what) {
  if (s == ncclSuccess)
    return 0;
  fprintf(stderr, "muster-train: --device cuda: %s failed: %s\n", what, ncclGetErrorString(s));
  return 1;
}

static int mpi_ok(int e, const char *what) {
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;

  if (e == MPI_SUCCESS)
    return 0;
  if (MPI_Error_string(e, msg, &len) != MPI_SUCCESS)
    snprintf(msg, sizeof msg, "MPI error %d", e);
  fprintf(stderr, "muster-train: --device cuda: %s failed: %s\n", what, msg);
  return 1;
}

/* A kernel launch reports a bad configuration only through the next
 * cudaGetLastError(); faults inside it surface at the next synchronisation. */
static int launch_ok(const char *kernel) {
  return cu_ok(cudaGetLastError(), kernel);
}

#define TRY(x)                                                                                     \
  do {                                                                                             \
    int rc_ = (x);                                                                                 \
    if (rc_)                                                                                       \
      return rc_;                                                                                  \
  } while (0)

static unsigned blocks_for(size_t n) {
  size_t b = (n + CU_THREADS - 1) / CU_THREADS;
  return (unsigned)(b < 1 ? 1 : b > CU_MAX_BLOCKS ? CU_MAX_BLOCKS : b);
}

/* ---- kernels ----------------------------------------------------------- */

/* out = out + bias (per column), then max(0, .) when relu. */
__global__ void k_bias_act(float *out, const float *bias, int rows, int cols, int relu) {
  size_t n = (size_t)rows * cols;

  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x) {
    float v = out[i] + bias[i % (size_t)cols];
    out[i] = relu ? (v > 0 ? v : 0) : v;
  }
}

/* One thread per row, as softmax_xent in tr_mlp.c: row_loss and row_ok get
 * the row's loss and 1 if its argmax (first maximum) is the label; delta,
 * unless NULL, gets (softmax - onehot) * scale. */
__global__ void k_softmax_xent(const float *z, const uint8_t *y, int rows, int k, float scale,
                               float *delta, float *row_loss, float *row_ok) {
  int r = blockIdx.x * blockDim.x + threadIdx.x;

  if (r >= rows)
    return;
  const float *zr = z + (size_t)r * k;
  float mx = zr[0], sum = 0;
  int arg = 0;
  for (int j = 1; j < k; j++)
    if (zr[j] > mx) {
      mx = zr[j];
      arg = j;
    }
  for (int j = 0; j < k; j++) {
    float e = expf(zr[j] - mx);
    if (delta)
      delta[(size_t)r * k + j] = e;
    sum += e;
  }
  row_loss[r] = logf(sum) + mx - zr[y[r]];
  row_ok[r] = arg == y[r] ? 1.0f : 0.0f;
  if (delta) {
    float *dr = delta + (size_t)r * k;
    float inv = scale / sum;
    for (int j = 0; j < k; j++)
      dr[j] = __fmul_rn(dr[j], inv);
    dr[y[r]] = __fsub_rn(dr[y[r]], scale);
  }
}

/* Sums row_loss and row_ok (rows each) in double, in one block of
 * CU_THREADS threads; writes the sums as floats to out[0..1], or adds
 * them to acc[0..1] when acc is not NULL. */
__global__ void k_reduce_rows(const float *row_loss, const float *row_ok, int rows, float *out,
                              double *acc) {
  __shared__ double sl[CU_THREADS], so[CU_THREADS];
  int t = threadIdx.x;
  double l = 0, c = 0;

  for (int i = t; i < rows; i += CU_THREADS) {
    l += row_loss[i];
    c += row_ok[i];
  }
  sl[t] = l;
  so[t] = c;
  __syncthreads();
  for (int s = CU_THREADS / 2; s > 0; s >>= 1) {
    if (t < s) {
      sl[t] += sl[t + s];
      so[t] += so[t + s];
    }
    __syncthreads();
  }
  if (t == 0) {
    if (acc) {
      acc[0] += sl[0];
      acc[1] += so[0];
    } else {
      out[0] = (float)sl[0];
      out[1] = (float)so[0];
    }
  }
}

/* gb[j] = sum over rows of d[r][j], row by row as tr_mlp.c adds them
 * (rows >= 1). */
__global__ void k_colsum(const float *d, int rows, int cols, float *gb) {
  int j = blockIdx.x * blockDim.x + threadIdx.x;

  if (j >= cols)
    return;
  float s = d[j];
  for (int r = 1; r < rows; r++)
    s += d[(size_t)r * cols + j];
  gb[j] = s;
}

/* dn = dn where the layer's output was positive, else 0 (ReLU backward). */
__global__ void k_relu_mask(float *dn, const float *act, size_t n) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x)
    dn[i] = act[i] > 0 ? dn[i] : 0;
}

/* tr_mlp_sgd on the device: v = momentum * v + g; w -= lr * v, or
 * w -= lr * g (velocity untouched) when momentum is 0. The _rn intrinsics
 * keep nvcc from fusing the products into FMAs, which would round unlike
 * the CPU. */
__global__ void k_sgd(float *p, float *v, const float *g, size_t n, float lr, float momentum) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x) {
    if (momentum == 0) {
      p[i] = __fsub_rn(p[i], __fmul_rn(lr, g[i]));
    } else {
      float vi = __fadd_rn(__fmul_rn(momentum, v[i]), g[i]);
      v[i] = vi;
      p[i] = __fsub_rn(p[i], __fmul_rn(lr, vi));
    }
  }
}

/* ---- setup and teardown ------------------------------------------------ */

static int cu_alloc(void *pp, size_t bytes, const char *what) {
  void **p = (void **)pp;
  cudaError_t e = cudaMalloc(p, bytes ? bytes : 1);

  if (e != cudaSuccess) {
    *p = NULL;
    fprintf(stderr, "muster-train: --device cuda: cudaMalloc of %zu bytes for %s failed: %s\n",
            bytes, what, cudaGetErrorString(e));
    return 1;
  }
  return 0;
}

static int cu_alloc_host(void *pp, size_t bytes, const char *what) {
  void **p = (void **)pp;
  cudaError_t e = cudaMallocHost(p, bytes ? bytes : 1);

  if (e != cudaSuccess) {
    *p = NULL;
    fprintf(stderr, "muster-train: --device cuda: cudaMallocHost of %zu bytes for %s failed: %s\n",
            bytes, what, cudaGetErrorString(e));
    return 1;
  }
  return 0;
}

/* Frees everything c holds; a partly set up c is fine. Errors on the way
 * out are ignored: there is nothing left to do about them. */
static void cu_cleanup(struct cu_run *c) {
  if (c->stream)
    (void)cudaStreamSynchronize(c->stream);
  if (c->comm)
    (void)ncclCommDestroy(c->comm);
  if (c->blas)
    (void)cublasDestroy(c->blas);
  for (int i = 0; i < c->nev; i++)
    (void)cudaEventDestroy(c->ev[i]);
  (void)cudaFree(c->d_pv);
  (void)cudaFree(c->d_grad);
  (void)cudaFree(c->d_x);
  (void)cudaFree(c->d_y);
  for (int l = 0; l <= TR_MAX_LAYERS; l++) {
    (void)cudaFree(c->d_act[l]);
    (void)cudaFree(c->d_delta[l]);
  }
  (void)cudaFree(c->d_row);
  (void)cudaFree(c->d_eval);
  (void)cudaFree(c->d_tx);
  (void)cudaFree(c->d_ty);
  for (int i = 0; i < 2; i++) {
    (void)cudaFreeHost(c->h_x[i]);
    (void)cudaFreeHost(c->h_y[i]);
  }
  (void)cudaFreeHost(c->h_stats);
  (void)cudaFreeHost(c->h_eval);
  if (c->stream)
    (void)cudaStreamDestroy(c->stream);
  free(c->perm);
  memset(c, 0, sizeof(*c));
}

/* The node-local rank: Open MPI's OMPI_COMM_WORLD_LOCAL_RANK when set and
 * sane, else the rank in a communicator of the processes sharing memory,
 * else the global rank. */
static int local_rank(int rank) {
  const char *s = getenv("OMPI_COMM_WORLD_LOCAL_RANK");
  MPI_Comm node;
  int lr = rank;

  if (s && *s) {
    char *end = NULL;
    long v;
    errno = 0;
    v = strtol(s, &end, 10);
    if (errno == 0 && end && *end == '\0' && v >= 0 && v < 1 << 20)
      return (int)v;
  }
  if (MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node) ==
      MPI_SUCCESS) {
    if (MPI_Comm_rank(node, &lr) != MPI_SUCCESS)
      lr = rank;
    (void)MPI_Comm_free(&node);
  }
  return lr;
}

/* Allreduce mode: MPI, the device of this rank, the NCCL communicator. */
static int setup_comm(struct cu_run *c, int ndev, int *argc, char ***argv) {
  int inited = 0, lr;
  ncclUniqueId id;

  TRY(mpi_ok(MPI_Initialized(&inited), "MPI_Initialized"));
  if (!inited) {
    TRY(mpi_ok(MPI_Init(argc, argv), "MPI_Init"));
    c->mpi_here = 1;
  }
  TRY(mpi_ok(MPI_Comm_rank(MPI_COMM_WORLD, &c->rank), "MPI_Comm_rank"));
  TRY(mpi_ok(MPI_Comm_size(MPI_COMM_WORLD, &c->nranks), "MPI_Comm_size"));
  lr = local_rank(c->rank);
  TRY(cu_ok(cudaSetDevice(lr % ndev), "cudaSetDevice"));
  memset(&id, 0, sizeof id);
  if (c->rank == 0)
    TRY(nccl_ok(ncclGetUniqueId(&id), "ncclGetUniqueId"));
  TRY(mpi_ok(MPI_Bcast(&id, (int)sizeof id, MPI_BYTE, 0, MPI_COMM_WORLD),
             "MPI_Bcast of the NCCL id"));
  TRY(nccl_ok(ncclCommInitRank(&c->comm, c->nranks, id, c->rank), "ncclCommInitRank"));
  return 0;
}

/* Device buffers, the stream, cuBLAS, and the parameters uploaded (and in
 * allreduce mode replaced by rank 0's). */
static int setup_device(struct cu_run *c, const struct tr_data *train, const struct tr_data *test) {
  struct tr_mlp *m = c->m;
  int L = m->nlayers, b = c->hi - c->lo;
  size_t np = m->nparams;
  int test_rows = (c->rank == 0 && test && test->n > 0) ? test->n : 0;

  c->rows = b;
  if (test_rows) {
    int er = test_rows < CU_EVAL_ROWS ? test_rows : CU_EVAL_ROWS;
    if (er > c->rows)
      c->rows = er;
  }
  if (c->rows < 1)
    c->rows = 1;

  TRY(cu_ok(cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking), "cudaStreamCreate"));
  for (c->nev = 0; c->nev < 4; c->nev++)
    TRY(cu_ok(cudaEventCreate(&c->ev[c->nev]), "cudaEventCreate"));
  TRY(blas_ok(cublasCreate(&c->blas), "cublasCreate"));
  TRY(blas_ok(cublasSetStream(c->blas, c->stream), "cublasSetStream"));
  /* Plain FP32: TF32 tensor cores would round the inputs to 10 mantissa
   * bits and part from the CPU path by far more than summation order. */
  TRY(blas_ok(cublasSetMathMode(c->blas, CUBLAS_DEFAULT_MATH), "cublasSetMathMode"));

  TRY(cu_alloc(&c->d_pv, 2 * np * sizeof(float), "parameters"));
  TRY(cu_alloc(&c->d_grad, (np + 2) * sizeof(float), "gradients"));
  TRY(cu_alloc(&c->d_x, (size_t)(b ? b : 1) * m->sizes[0] * sizeof(float), "inputs"));
  TRY(cu_alloc(&c->d_y, (size_t)(b ? b : 1), "labels"));
  for (int l = 1; l <= L; l++) {
    TRY(cu_alloc(&c->d_act[l], (size_t)c->rows * m->sizes[l] * sizeof(float), "activations"));
    TRY(cu_alloc(&c->d_delta[l], (size_t)(b ? b : 1) * m->sizes[l] * sizeof(float), "deltas"));
  }
  TRY(cu_alloc(&c->d_row, 2 * (size_t)c->rows * sizeof(float), "per-row losses"));
  TRY(cu_alloc(&c->d_eval, 2 * sizeof(double), "evaluation sums"));
  for (int i = 0; i < 2; i++) {
    TRY(cu_alloc_host(&c->h_x[i], (size_t)(b ? b : 1) * train->dim * sizeof(float),
                      "input staging"));
    TRY(cu_alloc_host(&c->h_y[i], (size_t)(b ? b : 1), "label staging"));
  }
  TRY(cu_alloc_host(&c->h_stats, 2 * sizeof(float), "step statistics"));
  TRY(cu_alloc_host(&c->h_eval, 2 * sizeof(double), "evaluation sums"));
  if (test_rows) {
    TRY(cu_alloc(&c->d_tx, (size_t)test_rows * test->dim * sizeof(float), "the test set"));
    TRY(cu_alloc(&c->d_ty, (size_t)test_rows, "the test labels"));
    TRY(cu_ok(cudaMemcpyAsync(c->d_tx, test->x, (size_t)test_rows * test->dim * sizeof(float),
                              cudaMemcpyHostToDevice, c->stream),
              "cudaMemcpyAsync of the test set"));
    TRY(cu_ok(
        cudaMemcpyAsync(c->d_ty, test->y, (size_t)test_rows, cudaMemcpyHostToDevice, c->stream),
        "cudaMemcpyAsync of the test labels"));
  }
  c->perm = (int *)malloc((size_t)(train->n ? train->n : 1) * sizeof(int));
  if (!c->perm) {
    fprintf(stderr, "muster-train: --device cuda: out of memory for the epoch order\n");
    return 1;
  }
  c->perm_epoch = -1;

  /* Everything goes through the one stream: the stream is non-blocking,
   * so plain cudaMemcpy on the legacy stream would not be ordered with it. */
  TRY(cu_ok(
      cudaMemcpyAsync(c->d_pv, m->params, np * sizeof(float), cudaMemcpyHostToDevice, c->stream),
      "cudaMemcpyAsync of the parameters"));
  TRY(cu_ok(cudaMemcpyAsync(c->d_pv + np, m->velocity, np * sizeof(float), cudaMemcpyHostToDevice,
                            c->stream),
            "cudaMemcpyAsync of the velocity"));
  if (c->comm) {
    /* All ranks start from rank 0's parameters and velocity. */
    TRY(nccl_ok(ncclBroadcast(c->d_pv, c->d_pv, 2 * np, ncclFloat, 0, c->comm, c->stream),
                "ncclBroadcast of the initial parameters"));
  }
  TRY(cu_ok(cudaStreamSynchronize(c->stream), "cudaStreamSynchronize after the upload"));
  return 0;
}

/* ---- the network ------------------------------------------------------- */

static int gemm(struct cu_run *c, cublasOperation_t ta, cublasOperation_t tb, int mm, int nn,
                int kk, const float *a, int lda, const float *b, int ldb, float *out, int ldc) {
  const float one = 1.0f, zero = 0.0f;

  return blas_ok(cublasSgemm(c->blas, ta, tb, mm, nn, kk, &one, a, lda, b, ldb, &zero, out, ldc),
                 "cublasSgemm");
}

/* act[l+1] = relu(act[l] W_l + b_l) for b >= 1 rows of x; the logits land
 * in act[L]. */
static int forward(struct cu_run *c, const float *x, int b) {
  struct tr_mlp *m = c->m;
  const float *in = x;

  for (int l = 0; l < m->nlayers; l++) {
    int ni = m->sizes[l], no = m->sizes[l + 1];
    float *out = c->d_act[l + 1];

    /* out^T (no x b) = W^T (no x ni) in^T (ni x b), all column-major. */
    TRY(gemm(c, CUBLAS_OP_N, CUBLAS_OP_N, no, b, ni, c->d_pv + m->woff[l], no, in, ni, out, no));
    k_bias_act<<<blocks_for((size_t)b * no), CU_THREADS, 0, c->stream>>>(out, c->d_pv + m->boff[l],
                                                                         b, no, l + 1 < m->nlayers);
    TRY(launch_ok("the bias and ReLU kernel"));
    in = out;
  }
  return 0;
}

/* tr_mlp_backprop on the device: d_grad gets the gradient of the global
 * batch's mean loss restricted to the b rows in d_x/d_y, then their loss
 * sum and correct count. */
static int backprop(struct cu_run *c, int b, int global_b) {
  struct tr_mlp *m = c->m;
  int L = m->nlayers, k = m->sizes[L];

  if (b == 0) /* a rank with an empty shard adds nothing */
    return cu_ok(cudaMemsetAsync(c->d_grad, 0, (m->nparams + 2) * sizeof(float), c->stream),
                 "cudaMemsetAsync of the gradients");
  TRY(forward(c, c->d_x, b));
  k_softmax_xent<<<(b + CU_THREADS - 1) / CU_THREADS, CU_THREADS, 0, c->stream>>>(
      c->d_act[L], c->d_y, b, k, 1.0f / (float)global_b, c->d_delta[L], c->d_row,
      c->d_row + c->rows);
  TRY(launch_ok("the softmax cross-entropy kernel"));
  k_reduce_rows<<<1, CU_THREADS, 0, c->stream>>>(c->d_row, c->d_row + c->rows, b,
                                                 c->d_grad + m->nparams, NULL);
  TRY(launch_ok("the loss reduction kernel"));
  for (int l = L - 1; l >= 0; l--) {
    int ni = m->sizes[l], no = m->sizes[l + 1];
    const float *in = l ? c->d_act[l] : c->d_x;
    const float *d = c->d_delta[l + 1];

    /* dW = in^T d: dW^T (no x ni) = d^T (no x b) in (b x ni). */
    TRY(gemm(c, CUBLAS_OP_N, CUBLAS_OP_T, no, ni, b, d, no, in, ni, c->d_grad + m->woff[l], no));
    k_colsum<<<(no + CU_THREADS - 1) / CU_THREADS, CU_THREADS, 0, c->stream>>>(
        d, b, no, c->d_grad + m->boff[l]);
    TRY(launch_ok("the bias gradient kernel"));
    if (l > 0) {
      /* d_in = d W^T: d_in^T (ni x b) = W (ni x no) d^T (no x b). */
      TRY(gemm(c, CUBLAS_OP_T, CUBLAS_OP_N, ni, b, no, c->d_pv + m->woff[l], no, d, no,
               c->d_delta[l], ni));
      k_relu_mask<<<blocks_for((size_t)b * ni), CU_THREADS, 0, c->stream>>>(
          c->d_delta[l], c->d_act[l], (size_t)b * ni);
      TRY(launch_ok("the ReLU backward kernel"));
    }
  }
  return 0;
}

/* Mean loss and accuracy on the test set held on the device (rank 0). */
static int evaluate(struct cu_run *c, int n, double *loss, double *acc) {
  struct tr_mlp *m = c->m;
  int L = m->nlayers, k = m->sizes[L], dim = m->sizes[0];

  *loss = 0;
  *acc = 0;
  if (!c->d_tx || n <= 0)
    return 0;
  TRY(cu_ok(cudaMemsetAsync(c->d_eval, 0, 2 * sizeof(double), c->stream), "cudaMemsetAsync"));
  for (int at = 0; at < n; at += c->rows) {
    int b = n - at < c->rows ? n - at : c->rows;
    TRY(forward(c, c->d_tx + (size_t)at * dim, b));
    k_softmax_xent<<<(b + CU_THREADS - 1) / CU_THREADS, CU_THREADS, 0, c->stream>>>(
        c->d_act[L], c->d_ty + at, b, k, 1.0f, NULL, c->d_row, c->d_row + c->rows);
    TRY(launch_ok("the softmax cross-entropy kernel"));
    k_reduce_rows<<<1, CU_THREADS, 0, c->stream>>>(c->d_row, c->d_row + c->rows, b, NULL,
                                                   c->d_eval);
    TRY(launch_ok("the loss reduction kernel"));
  }
  TRY(cu_ok(
      cudaMemcpyAsync(c->h_eval, c->d_eval, 2 * sizeof(double), cudaMemcpyDeviceToHost, c->stream),
      "cudaMemcpyAsync of the evaluation sums"));
  TRY(cu_ok(cudaStreamSynchronize(c->stream), "cudaStreamSynchronize after the evaluation"));
  *loss = c->h_eval[0] / n;
  *acc = c->h_eval[1] / n;
  return 0;
}

/* Copies the parameters and velocity back into m (for checkpoints, the
 * dump, and the caller). */
static int download(struct cu_run *c) {
  size_t np = c->m->nparams;

  TRY(cu_ok(
      cudaMemcpyAsync(c->m->params, c->d_pv, np * sizeof(float), cudaMemcpyDeviceToHost, c->stream),
      "cudaMemcpyAsync of the parameters to the host"));
  TRY(cu_ok(cudaMemcpyAsync(c->m->velocity, c->d_pv + np, np * sizeof(float),
                            cudaMemcpyDeviceToHost, c->stream),
            "cudaMemcpyAsync of the velocity to the host"));
  return cu_ok(cudaStreamSynchronize(c->stream), "cudaStreamSynchronize after the download");
}

/* Gathers this rank's shard of global step `step` into staging buffer i. */
static void stage(struct cu_run *c, const struct tr_data *train, long spe, long step, int i) {
  int epoch = (int)(step / spe);

  if (epoch != c->perm_epoch) {
    tr_epoch_order(c->o->seed, epoch, train->n, c->perm);
    c->perm_epoch = epoch;
  }
  if (c->hi > c->lo)
    tr_gather(train, c->perm, step % spe, c->o->batch, c->lo, c->hi, c->h_x[i], c->h_y[i]);
}

static double elapsed_s(cudaEvent_t a, cudaEvent_t b) {
  float ms = 0;

  if (cudaEventElapsedTime(&ms, a, b) != cudaSuccess)
    return 0;
  return ms / 1e3;
}

/* The training loop from step `start` to `total`, with per-epoch reports,
 * test evaluation and checkpoints on rank 0; fills r. */
static int train_loop(struct cu_run *c, const struct tr_data *train, const struct tr_data *test,
                      long start, struct tr_result *r) {
  const struct tr_opts *o = c->o;
  struct tr_mlp *m = c->m;
  int b = c->hi - c->lo, B = o->batch, cur = 0, have_eval = 0;
  long spe = tr_steps_per_epoch(train->n, B);
  long total = o->steps > 0 ? o->steps : (long)o->epochs * spe;
  int nepochs = (int)((total + spe - 1) / spe);
  int test_n = test ? test->n : 0;
  double train_s = 0, epoch_t0 = 0, eloss = 0, eok = 0, tacc = 0, tloss = 0;
  long esteps = 0;
  char err[512];
  double t_start = tr_now();

  tr_metrics_open(o->metrics_every, c->rank);
  if (start < total)
    stage(c, train, spe, start, cur);
  for (long step = start; step < total; step++) {
    long sie = step % spe;

    if (sie == 0 || step == start) {
      epoch_t0 = tr_now();
      eloss = eok = 0;
      esteps = 0;
    }
    if (b > 0) {
      TRY(cu_ok(cudaMemcpyAsync(c->d_x, c->h_x[cur], (size_t)b * train->dim * sizeof(float),
                                cudaMemcpyHostToDevice, c->stream),
                "cudaMemcpyAsync of the inputs"));
      TRY(cu_ok(cudaMemcpyAsync(c->d_y, c->h_y[cur], (size_t)b, cudaMemcpyHostToDevice, c->stream),
                "cudaMemcpyAsync of the labels"));
    }
    TRY(cu_ok(cudaEventRecord(c->ev[0], c->stream), "cudaEventRecord"));
    TRY(backprop(c, b, B));
    TRY(cu_ok(cudaEventRecord(c->ev[1], c->stream), "cudaEventRecord"));
    if (c->comm)
      TRY(nccl_ok(ncclAllReduce(c->d_grad, c->d_grad, m->nparams + 2, ncclFloat, ncclSum, c->comm,
                                c->stream),
                  "ncclAllReduce of the gradients"));
    TRY(cu_ok(cudaEventRecord(c->ev[2], c->stream), "cudaEventRecord"));
    k_sgd<<<blocks_for(m->nparams), CU_THREADS, 0, c->stream>>>(
        c->d_pv, c->d_pv + m->nparams, c->d_grad, m->nparams, tr_lr_at(o, step, total),
        o->momentum);
    TRY(launch_ok("the SGD kernel"));
    TRY(cu_ok(cudaEventRecord(c->ev[3], c->stream), "cudaEventRecord"));
    TRY(cu_ok(cudaMemcpyAsync(c->h_stats, c->d_grad + m->nparams, 2 * sizeof(float),
                              cudaMemcpyDeviceToHost, c->stream),
              "cudaMemcpyAsync of the step's loss"));
    /* The next shard is gathered while the device works on this one; its
     * staging buffer was last read by the previous step, which is done. */
    if (step + 1 < total)
      stage(c, train, spe, step + 1, cur ^ 1);
    TRY(cu_ok(cudaStreamSynchronize(c->stream), "cudaStreamSynchronize after a training step"));
    r->compute_s += elapsed_s(c->ev[0], c->ev[1]) + elapsed_s(c->ev[2], c->ev[3]);
    r->comm_s += elapsed_s(c->ev[1], c->ev[2]);
    r->final_loss = c->h_stats[0] / B;
    eloss += r->final_loss;
    eok += c->h_stats[1];
    esteps++;
    tr_metrics_step(step, spe, r->final_loss, c->h_stats[1] / B, b,
                    sie == spe - 1 || step + 1 == total);
    r->steps++;
    r->samples += B;
    cur ^= 1;
    have_eval = 0;

    if (sie == spe - 1 || step + 1 == total) {
      double et = tr_now() - epoch_t0;
      train_s += et;
      if (c->rank != 0)
        continue;
      /* As on the CPU, --quiet skips the per-epoch test pass. */
      if (!o->quiet) {
        TRY(evaluate(c, test_n, &tloss, &tacc));
        have_eval = 1;
      }
      tr_report_epoch(o, (int)(step / spe) + 1, nepochs, eloss / esteps, eok / ((double)esteps * B),
                      tacc, et > 0 ? (double)esteps * B / et : 0);
      if (o->checkpoint[0]) {
        TRY(download(c));
        if (tr_checkpoint_save(o->checkpoint, m, step + 1, err, sizeof err) != 0) {
          fprintf(stderr, "muster-train: %s\n", err);
          return 1;
        }
      }
    }
  }
  tr_metrics_close();
  r->total_s = tr_now() - t_start;
  if (c->rank == 0 && !have_eval)
    TRY(evaluate(c, test_n, &tloss, &tacc));
  r->test_accuracy = tacc;
  r->test_loss = tloss;
  r->samples_per_s = train_s > 0 ? (double)r->samples / train_s : 0;
  return 0;
}

/* Everything after the device count check: set up, train, write the
 * results back to m and the files the options name. */
static int run(struct cu_run *c, int ndev, const struct tr_data *train, const struct tr_data *test,
               struct tr_result *r, int *argc, char ***argv) {
  const struct tr_opts *o = c->o;
  long start = 0;
  char err[512];

  if (o->mode == TR_ALLREDUCE) {
    TRY(setup_comm(c, ndev, argc, argv));
  } else {
    c->rank = 0;
    c->nranks = 1;
    TRY(cu_ok(cudaSetDevice(0), "cudaSetDevice"));
  }
  r->mode = o->mode == TR_ALLREDUCE ? "allreduce" : "single";
  r->ranks = c->nranks;
  /* One summary for the job, from rank 0 (main set report to 1). */
  r->report = c->rank == 0;
  /* The same refusals, in the same words, as the CPU paths. */
  if (tr_steps_per_epoch(train->n, o->batch) < 1) {
    if (c->rank == 0)
      fprintf(stderr, "muster-train: --batch %d is larger than the %d training samples\n", o->batch,
              train->n);
    c->all_fail = 1;
    return 2;
  }
  if (o->batch < c->nranks) {
    if (c->rank == 0)
      fprintf(stderr, "muster-train: --batch %d is smaller than the %d ranks\n", o->batch,
              c->nranks);
    c->all_fail = 1;
    return 2;
  }
  tr_shard(o->batch, c->rank, c->nranks, &c->lo, &c->hi);
  /* Rank 0 alone reads it; its parameters and step are broadcast. */
  if (c->rank == 0 && o->resume[0] &&
      tr_checkpoint_load(o->resume, c->m, &start, err, sizeof err) != 0) {
    if (c->nranks > 1)
      fprintf(stderr, "muster-train: rank %d: %s\n", c->rank, err);
    else
      fprintf(stderr, "muster-train: %s\n", err);
    return 2;
  }
  if (c->nranks > 1) {
    /* Rank 0's step, as its parameters (broadcast in setup_device). */
    TRY(mpi_ok(MPI_Bcast(&start, 1, MPI_LONG, 0, MPI_COMM_WORLD), "MPI_Bcast of the step"));
  }
  TRY(setup_device(c, train, test));
  TRY(train_loop(c, train, test, start, r));
  TRY(download(c));
  if (c->rank == 0 && o->dump_params[0] && tr_dump_params(o->dump_params, c->m) != 0) {
    fprintf(stderr, "muster-train: cannot write --dump-params %s\n", o->dump_params);
    return 1;
  }
  return 0;
}

/* What the loader compares with its own TR_CUDA_PLUGIN_ABI. */
extern "C" __attribute__((visibility("default"))) unsigned long tr_cuda_plugin_abi(void) {
  return TR_CUDA_PLUGIN_ABI;
}

extern "C" __attribute__((visibility("default"))) int
tr_cuda_plugin_run(const struct tr_opts *o, struct tr_mlp *m, const struct tr_data *train,
                   const struct tr_data *test, struct tr_result *r, int *argc, char ***argv) {
  struct cu_run c;
  int ndev = 0, rc, mpi_here;
  cudaError_t e;

  memset(&c, 0, sizeof c);
  e = cudaGetDeviceCount(&ndev);
  if (e != cudaSuccess || ndev < 1) {
    fprintf(stderr,
            "muster-train: --device cuda: no CUDA device is present (cudaGetDeviceCount: %s)\n",
            cudaGetErrorString(e != cudaSuccess ? e : cudaErrorNoDevice));
    return 2;
  }
  if (o->mode != TR_SINGLE && o->mode != TR_ALLREDUCE) {
    fprintf(stderr, "muster-train: --device cuda works with --mode single or allreduce only\n");
    return 2;
  }
  c.o = o;
  c.m = m;
  rc = run(&c, ndev, train, test, r, argc, argv);
  if (rc != 0 && c.nranks > 1 && !c.all_fail) {
    /* The other ranks may be waiting in a collective for this one; only
     * an abort ends them. */
    fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, rc);
  }
  mpi_here = c.mpi_here;
  cu_cleanup(&c);
  if (mpi_here)
    (void)MPI_Finalize();
  return rc;
}
