/*
 * tr_blas.h: OpenBLAS, loaded on demand. muster-train is not linked against
 * it: OpenBLAS settles its kernels and its thread pool in its constructor,
 * from the environment, so tr_blas_load() sets that environment first and
 * then loads the library with dlopen (no second exec of the program).
 */
#ifndef MUSTER_TR_BLAS_H
#define MUSTER_TR_BLAS_H

#include "util.h"

#include <cblas.h> /* the types and enums only; the calls go through tr_sgemm */
#include <stddef.h>

typedef void tr_sgemm_fn(const enum CBLAS_ORDER order, const enum CBLAS_TRANSPOSE ta,
                         const enum CBLAS_TRANSPOSE tb, const blasint m, const blasint n,
                         const blasint k, const float alpha, const float *a, const blasint lda,
                         const float *b, const blasint ldb, const float beta, float *c,
                         const blasint ldc);

/* cblas_sgemm of the loaded library; NULL before tr_blas_load(). */
extern tr_sgemm_fn *tr_sgemm;

/* Sets OPENBLAS_NUM_THREADS to threads and, on a CPU with AVX-512 or AVX2
 * (which OpenBLAS may not know by name), OPENBLAS_CORETYPE to the kernels
 * for it, each unless the user set it; then loads OpenBLAS and gives it
 * threads threads. Idempotent.
 * Returns 0, or 2 with one sentence naming what is missing in err. */
MUST_CHECK int tr_blas_load(int threads, char *err, size_t errlen);

/* The kernels OpenBLAS chose ("Haswell", ...); "none" before the load. */
const char *tr_blas_corename(void);

#endif
