/* fuzz_idx.c: libFuzzer target for muster-train's MNIST IDX reader
 * (tr_data.c). The input is split into an images file and a labels file
 * (the first two bytes, big-endian, give the images file's length),
 * written where the reader looks for them,
 * and loaded. Any crash, leak or undefined behaviour is a finding; a
 * refusal with a sentence is the expected answer to a bad file. */
#include "tr_data.h"

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static char dir[64];

static void put(const char *name, const uint8_t *data, size_t n) {
  char path[128];
  FILE *f;

  snprintf(path, sizeof(path), "%s/%s", dir, name);
  f = fopen(path, "wb");
  if (!f)
    abort();
  if (n && fwrite(data, 1, n, f) != n)
    abort();
  fclose(f);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  struct tr_data d;
  char err[1200];
  size_t cut;

  if (!dir[0]) {
    snprintf(dir, sizeof(dir), "/dev/shm/muster-fuzz-idx-%d", (int)getpid());
    if (mkdir(dir, 0700) != 0 && access(dir, W_OK) != 0) {
      snprintf(dir, sizeof(dir), "/tmp/muster-fuzz-idx-%d", (int)getpid());
      (void)mkdir(dir, 0700);
    }
  }
  if (size < 2)
    return 0;
  cut = (size_t)data[0] << 8 | data[1];
  if (cut > size - 2)
    cut = size - 2;
  put("train-images-idx3-ubyte", data + 2, cut);
  put("train-labels-idx1-ubyte", data + 2 + cut, size - 2 - cut);
  if (tr_data_load_mnist(dir, 1, &d, err, sizeof(err)) == 0) {
    /* Every pixel the loader promised is there: its first and last rows. */
    float *row = malloc((size_t)d.dim * sizeof(float));
    if (row) {
      tr_data_rows(&d, 0, 1, row);
      tr_data_rows(&d, d.n - 1, 1, row);
      free(row);
    }
    tr_data_cleanup(&d);
  }
  return 0;
}
