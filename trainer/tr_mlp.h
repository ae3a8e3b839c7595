/*
 * tr_mlp.h: the multi-layer perceptron of muster-train (CPU, OpenBLAS).
 *
 * All parameters live in one flat float vector, layer by layer:
 * W0 (sizes[0] x sizes[1], row-major, input-major), b0 (sizes[1]), W1, b1,
 * ... The gradient vector has the same layout plus two trailing floats, the
 * batch's loss sum and count of correct predictions, so that one fused
 * all-reduce per step carries everything (and a parameter server can own a
 * contiguous range of it).
 */
#ifndef MUSTER_TR_MLP_H
#define MUSTER_TR_MLP_H

#include "tr_data.h"

#include <stddef.h>
#include <stdint.h>

#define TR_MAX_LAYERS 16

struct tr_mlp {
  int nlayers; /* weight layers: nsizes - 1 */
  int sizes[TR_MAX_LAYERS + 1];
  size_t nparams;
  size_t woff[TR_MAX_LAYERS], boff[TR_MAX_LAYERS];
  float *params;   /* nparams */
  float *grads;    /* nparams + 2: ..., loss sum, correct count */
  float *velocity; /* nparams, momentum */
  int max_batch;
  float *act[TR_MAX_LAYERS + 1];   /* act[l]: max_batch x sizes[l] (act[0] unused) */
  float *delta[TR_MAX_LAYERS + 1]; /* same shapes (delta[0]: tr_mlp_evaluate's scratch) */
};

/* Sets up a network of nsizes layer sizes (e.g. {784, 256, 128, 10}) for
 * batches of up to max_batch rows, with weights drawn as PyTorch's
 * nn.Linear does (uniform in +-1/sqrt(fan_in)) from seed. Returns 0 or
 * MUSTER_E_INVALID / MUSTER_E_NOMEM. Free with tr_mlp_cleanup(). */
int tr_mlp_init(struct tr_mlp *m, const int *sizes, int nsizes, int max_batch, uint64_t seed)
    __attribute__((warn_unused_result));
void tr_mlp_cleanup(struct tr_mlp *m);

/* Forward and backward pass over b local rows x (b x sizes[0]) with labels
 * y, as part of a global batch of global_b rows: m->grads gets the gradient
 * of the global batch's mean loss restricted to these rows (so the sum over
 * all parts of a global batch is the full gradient), then the loss sum and
 * the number of correct predictions of these rows. */
void tr_mlp_backprop(struct tr_mlp *m, const float *x, const uint8_t *y, int b, int global_b);

/* A whole single-process step on a batch of b rows: forward, backward and
 * the SGD-momentum update layer by layer, the gradient accumulated straight
 * into the velocity (no gradient buffer, the same arithmetic as
 * tr_mlp_backprop + tr_mlp_sgd up to float rounding). Returns the loss sum;
 * *correct gets the number of correct predictions. */
double tr_mlp_train_step(struct tr_mlp *m, const float *x, const uint8_t *y, int b, float lr,
                         float momentum, double *correct);

/* One SGD step with momentum on params[lo, hi) from grad (same indexing):
 * v = momentum * v + g; w -= lr * v (PyTorch's SGD, dampening 0). */
void tr_mlp_sgd(float *params, float *velocity, const float *grad, size_t lo, size_t hi, float lr,
                float momentum);

/* Mean loss and accuracy (0..1) of the network on d. */
void tr_mlp_evaluate(struct tr_mlp *m, const struct tr_data *d, double *loss, double *accuracy);

/* Floating-point operations of one training sample (forward + backward). */
double tr_mlp_flops_per_sample(const struct tr_mlp *m);

#endif
