/*
 * tr_cuda_stub.c: tr_run_cuda for a muster-train built where CMake found no
 * CUDA compiler; compiled instead of tr_cuda.cu. --device cuda then fails
 * with the same exit code as on a machine without a GPU.
 */
#include "tr_run.h"

#include <stdio.h>

int tr_run_cuda(const struct tr_opts *o, struct tr_mlp *m, const struct tr_data *train,
                const struct tr_data *test, struct tr_result *r, int *argc, char ***argv) {
  (void)o;
  (void)m;
  (void)train;
  (void)test;
  (void)r;
  (void)argc;
  (void)argv;
  fprintf(stderr, "muster-train: --device cuda: this muster-train was built without CUDA\n");
  return 3;
}
