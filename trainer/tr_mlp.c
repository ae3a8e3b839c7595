/* tr_mlp.c: see tr_mlp.h. */
#include "tr_mlp.h"
#include "tr_blas.h"

#include "muster_errors.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* The element-wise loops are built for AVX-512, AVX2 and plain x86-64 and
 * picked at load time, so one binary is fast everywhere. */
#define TR_HOT __attribute__((target_clones("avx512f", "avx2", "default")))

static void *alloc_floats(size_t n) {
  return tr_alloc((n ? n : 1) * sizeof(float));
}

/* w[i] uniform in +-bound from the n draws after state st: the same draws
 * as tr_rand_uniform() in turn, computed apart, so that the loop
 * vectorizes (64-bit multiplies: AVX-512DQ has them, AVX2 builds them). */
__attribute__((target_clones("arch=x86-64-v4", "avx2", "default"))) static void
uniform_fill(float *w, size_t n, uint64_t st, float bound) {
  for (size_t i = 0; i < n; i++)
    w[i] = (2 * tr_rand_float(tr_rand_mix(st + (uint64_t)(i + 1) * TR_RAND_STEP)) - 1) * bound;
}

int tr_mlp_init(struct tr_mlp *m, const int *sizes, int nsizes, int max_batch, uint64_t seed) {
  uint64_t st = seed * 0x9e3779b97f4a7c15ULL + 0x1234567ULL;
  size_t off = 0;

  memset(m, 0, sizeof(*m));
  if (nsizes < 2 || nsizes > TR_MAX_LAYERS + 1 || max_batch < 1)
    return MUSTER_E_INVALID;
  m->nlayers = nsizes - 1;
  m->max_batch = max_batch;
  for (int i = 0; i < nsizes; i++) {
    if (sizes[i] < 1 || sizes[i] > 1 << 16)
      return MUSTER_E_INVALID;
    m->sizes[i] = sizes[i];
  }
  for (int l = 0; l < m->nlayers; l++) {
    m->woff[l] = off;
    off += (size_t)sizes[l] * sizes[l + 1];
    m->boff[l] = off;
    off += (size_t)sizes[l + 1];
  }
  m->nparams = off;
  m->params = alloc_floats(off);
  m->grads = alloc_floats(off + 2);
  m->velocity = alloc_floats(off);
  if (!m->params || !m->grads || !m->velocity)
    goto nomem;
  for (int l = 0; l <= m->nlayers; l++) {
    if (l > 0 && !(m->act[l] = alloc_floats((size_t)max_batch * sizes[l])))
      goto nomem;
    if (!(m->delta[l] = alloc_floats((size_t)max_batch * sizes[l])))
      goto nomem;
  }
  /* As PyTorch's nn.Linear: weights and biases uniform in +-1/sqrt(fan_in). */
  for (int l = 0; l < m->nlayers; l++) {
    float bound = 1.0f / sqrtf((float)sizes[l]);
    size_t nw = (size_t)sizes[l] * sizes[l + 1];
    uniform_fill(m->params + m->woff[l], nw, st, bound);
    st += (uint64_t)nw * TR_RAND_STEP;
    for (int i = 0; i < sizes[l + 1]; i++)
      m->params[m->boff[l] + i] = (2 * tr_rand_uniform(&st) - 1) * bound;
  }
  return 0;
nomem:
  tr_mlp_cleanup(m);
  return MUSTER_E_NOMEM;
}

void tr_mlp_cleanup(struct tr_mlp *m) {
  if (!m)
    return;
  tr_free(m->params);
  tr_free(m->grads);
  tr_free(m->velocity);
  for (int l = 0; l <= TR_MAX_LAYERS; l++) {
    tr_free(m->act[l]);
    tr_free(m->delta[l]);
  }
  memset(m, 0, sizeof(*m));
}

/* out[r][j] += bias[j], then ReLU for hidden layers: one pass over the
 * output, instead of copying the bias in first and having the GEMM read it
 * back (beta = 1). */
TR_HOT static void add_bias(float *restrict out, const float *restrict bias, int b, int no,
                            int relu) {
  for (int r = 0; r < b; r++) {
    float *restrict o = out + (size_t)r * no;
    if (relu)
      for (int j = 0; j < no; j++) {
        float v = o[j] + bias[j];
        o[j] = v > 0 ? v : 0;
      }
    else
      for (int j = 0; j < no; j++)
        o[j] += bias[j];
  }
}

/* d[i] = 0 where the layer's output a[i] was not positive. */
TR_HOT static void relu_backward(float *restrict d, const float *restrict a, size_t n) {
  for (size_t i = 0; i < n; i++)
    d[i] = a[i] > 0 ? d[i] : 0;
}

/* gb = column sums of the b x no matrix d. */
TR_HOT static void column_sums(float *restrict gb, const float *restrict d, int b, int no) {
  memcpy(gb, d, (size_t)no * sizeof(float));
  for (int r = 1; r < b; r++) {
    const float *restrict dr = d + (size_t)r * no;
    for (int j = 0; j < no; j++)
      gb[j] += dr[j];
  }
}

/* act[l+1] = relu(act[l] W_l + b_l) for hidden layers, the logits for the
 * last; the bias is copied into the output first and the GEMM adds onto it
 * (beta = 1), which saves a pass over the output. */
static void forward(struct tr_mlp *m, const float *x, int b) {
  const float *in = x;

  for (int l = 0; l < m->nlayers; l++) {
    int ni = m->sizes[l], no = m->sizes[l + 1];
    const float *w = m->params + m->woff[l], *bias = m->params + m->boff[l];
    float *out = m->act[l + 1];

    tr_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, b, no, ni, 1.0f, in, ni, w, no, 0.0f, out,
             no);
    add_bias(out, bias, b, no, l + 1 < m->nlayers);
    in = out;
  }
}

/* Softmax cross-entropy of the logits of b rows: loss sum and correct
 * count; delta = (softmax - onehot) * scale. */
static void softmax_xent(const float *z, const uint8_t *y, int b, int k, float scale, float *delta,
                         double *loss, double *correct) {
  double ls = 0, ok = 0;

  for (int r = 0; r < b; r++) {
    const float *zr = z + (size_t)r * k;
    float *dr = delta + (size_t)r * k;
    float mx = zr[0], sum = 0;
    int arg = 0;

    for (int j = 1; j < k; j++)
      if (zr[j] > mx) {
        mx = zr[j];
        arg = j;
      }
    for (int j = 0; j < k; j++) {
      dr[j] = expf(zr[j] - mx);
      sum += dr[j];
    }
    ls += logf(sum) + mx - zr[y[r]];
    ok += arg == y[r];
    float inv = scale / sum;
    for (int j = 0; j < k; j++)
      dr[j] *= inv;
    dr[y[r]] -= scale;
  }
  *loss = ls;
  *correct = ok;
}

void tr_mlp_backprop(struct tr_mlp *m, const float *x, const uint8_t *y, int b, int global_b) {
  int L = m->nlayers;
  double loss, correct;

  forward(m, x, b);
  softmax_xent(m->act[L], y, b, m->sizes[L], 1.0f / (float)global_b, m->delta[L], &loss, &correct);
  for (int l = L - 1; l >= 0; l--) {
    int ni = m->sizes[l], no = m->sizes[l + 1];
    const float *in = l ? m->act[l] : x;
    const float *d = m->delta[l + 1];
    float *gw = m->grads + m->woff[l], *gb = m->grads + m->boff[l];

    /* dW = in^T d; db = column sums of d. */
    tr_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, ni, no, b, 1.0f, in, ni, d, no, 0.0f, gw, no);
    column_sums(gb, d, b, no);
    if (l > 0) {
      /* d_in = (d W^T) * relu'(in). */
      float *dn = m->delta[l];
      tr_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, b, ni, no, 1.0f, d, no,
               m->params + m->woff[l], no, 0.0f, dn, ni);
      relu_backward(dn, in, (size_t)b * ni);
    }
  }
  m->grads[m->nparams] = (float)loss;
  m->grads[m->nparams + 1] = (float)correct;
}

TR_HOT /* w -= lr * v over n elements. */
    TR_HOT static void
    axpy_neg(float *restrict w, const float *restrict v, size_t n, float lr) {
  for (size_t i = 0; i < n; i++)
    w[i] -= lr * v[i];
}

/* b = momentum * b + column sums of d (the bias velocity). */
TR_HOT static void column_sums_into(float *restrict vb, const float *restrict d, int b, int no,
                                    float momentum) {
  for (int j = 0; j < no; j++)
    vb[j] *= momentum;
  for (int r = 0; r < b; r++) {
    const float *restrict dr = d + (size_t)r * no;
    for (int j = 0; j < no; j++)
      vb[j] += dr[j];
  }
}

double tr_mlp_train_step(struct tr_mlp *m, const float *x, const uint8_t *y, int b, float lr,
                         float momentum, double *correct) {
  int L = m->nlayers;
  double loss;

  forward(m, x, b);
  softmax_xent(m->act[L], y, b, m->sizes[L], 1.0f / (float)b, m->delta[L], &loss, correct);
  for (int l = L - 1; l >= 0; l--) {
    int ni = m->sizes[l], no = m->sizes[l + 1];
    const float *in = l ? m->act[l] : x;
    const float *d = m->delta[l + 1];
    float *w = m->params + m->woff[l], *vw = m->velocity + m->woff[l];

    /* The lower layer's delta needs this layer's weights before they move. */
    if (l > 0) {
      float *dn = m->delta[l];
      tr_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, b, ni, no, 1.0f, d, no, w, no, 0.0f, dn,
               ni);
      relu_backward(dn, in, (size_t)b * ni);
    }
    /* v = momentum * v + in^T d, in the GEMM itself (beta = momentum):
     * the gradient never takes memory of its own. Then w -= lr * v while
     * both are still in cache. */
    tr_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, ni, no, b, 1.0f, in, ni, d, no, momentum, vw,
             no);
    axpy_neg(w, vw, (size_t)ni * no, lr);
    column_sums_into(m->velocity + m->boff[l], d, b, no, momentum);
    axpy_neg(m->params + m->boff[l], m->velocity + m->boff[l], (size_t)no, lr);
  }
  return loss;
}

void tr_mlp_sgd(float *restrict params, float *restrict velocity, const float *restrict grad,
                size_t lo, size_t hi, float lr, float momentum) {
  if (momentum == 0) {
    for (size_t i = lo; i < hi; i++)
      params[i] -= lr * grad[i];
    return;
  }
  for (size_t i = lo; i < hi; i++) {
    float v = momentum * velocity[i] + grad[i];
    velocity[i] = v;
    params[i] -= lr * v;
  }
}

void tr_mlp_evaluate(struct tr_mlp *m, const struct tr_data *d, double *loss, double *accuracy) {
  double ls = 0, ok = 0;
  int L = m->nlayers, k = m->sizes[L];
  /* Pixels are converted a batch at a time; delta[0] (max_batch x
   * sizes[0]) is free here: no pass computes the inputs' gradient. */
  float *rows = m->delta[0];

  if (d->dim != m->sizes[0]) /* main() refuses such data; never read past */
    abort();

  for (int at = 0; at < d->n; at += m->max_batch) {
    int b = d->n - at < m->max_batch ? d->n - at : m->max_batch;
    double l1, c1;
    if (d->x) {
      forward(m, d->x + (size_t)at * d->dim, b);
    } else {
      tr_data_rows(d, at, b, rows);
      forward(m, rows, b);
    }
    softmax_xent(m->act[L], d->y + at, b, k, 1.0f, m->delta[L], &l1, &c1);
    ls += l1;
    ok += c1;
  }
  *loss = d->n ? ls / d->n : 0;
  *accuracy = d->n ? ok / d->n : 0;
}

double tr_mlp_flops_per_sample(const struct tr_mlp *m) {
  double f = 0;

  for (int l = 0; l < m->nlayers; l++) {
    double mn = (double)m->sizes[l] * m->sizes[l + 1];
    f += 2 * mn; /* forward */
    f += 2 * mn; /* dW */
    if (l > 0)
      f += 2 * mn; /* d_in */
  }
  return f;
}
