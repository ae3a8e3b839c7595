/*
 * tr_data.h: training data for muster-train: MNIST IDX files, or a
 * generated synthetic set for benchmarks.
 */
#ifndef MUSTER_TR_DATA_H
#define MUSTER_TR_DATA_H

#include <stddef.h>
#include <stdint.h>

struct tr_data {
  int n;             /* samples */
  int dim;           /* features per sample */
  int classes;       /* labels are 0..classes-1 */
  float *x;          /* n x dim, row-major, in [0, 1]; NULL where px holds them */
  const uint8_t *px; /* MNIST: n x dim pixels, feature = px / 255, mapped from the
                      * file (a quarter of the floats' memory, and no conversion
                      * of the whole set at start: rows are converted as drawn) */
  uint8_t *y;        /* n labels */
  void *map;         /* the mapped IDX file behind px, map_len bytes */
  size_t map_len;
};

/* Loads the MNIST set in dir: train (train-images-idx3-ubyte,
 * train-labels-idx1-ubyte) or test (t10k-...). A wrong magic number, wrong
 * dimensions, a count mismatch or a truncated file is refused with a
 * sentence naming the file in err. Returns 0 or a negative muster error;
 * *d is freed with tr_data_cleanup(). */
int tr_data_load_mnist(const char *dir, int train, struct tr_data *d, char *err, size_t errlen)
    __attribute__((warn_unused_result));

/* Generates n samples of dim features in classes separable-with-noise
 * classes, deterministically from seed. */
int tr_data_synthetic(int n, int dim, int classes, uint64_t seed, struct tr_data *d)
    __attribute__((warn_unused_result));

void tr_data_cleanup(struct tr_data *d);

/* Writes rows [first, first + count) of d as floats into out (count x dim). */
void tr_data_rows(const struct tr_data *d, int first, int count, float *out);

/* Gives d floats in x where it has only pixels (for code that wants the
 * whole set as floats: the CUDA path uploads it). Returns 0 or
 * MUSTER_E_NOMEM. An x made here is the caller's, freed with tr_free()
 * (tr_data_cleanup() does it for d itself). */
int tr_data_floats(struct tr_data *d) __attribute__((warn_unused_result));

/* size bytes, zeroed, 64-byte aligned (whole cache lines, full vectors
 * for the BLAS). A large block is mapped apart, its pages faulted in by the
 * kernel in one call instead of one trap per page at first touch: on a
 * virtual machine a trap costs microseconds, and the MNIST set alone is
 * 46,000 pages. NULL when out of memory; freed with tr_free(). */
void *tr_alloc(size_t size);
/* Frees a block of tr_alloc(); NULL is a no-op. */
void tr_free(void *p);

/* The sample order of an epoch: a permutation of 0..n-1 that depends only
 * on (seed, epoch), so every rank of a run draws the same global batches. */
void tr_epoch_order(uint64_t seed, int epoch, int n, int *perm);

/* A small, fast, seedable generator (splitmix64): the k-th draw after a
 * state s is tr_rand_mix(s + k * TR_RAND_STEP), so a loop can compute its
 * draws independently (and vectorize) instead of one call after another. */
#define TR_RAND_STEP 0x9e3779b97f4a7c15ULL
static inline uint64_t tr_rand_mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}
/* A draw's 24 high bits as a float uniform in [0, 1). */
static inline float tr_rand_float(uint64_t r) {
  return (float)(r >> 40) * (1.0f / 16777216.0f);
}
uint64_t tr_rand_next(uint64_t *state);
/* Uniform in [0, 1). */
float tr_rand_uniform(uint64_t *state);

#endif
