/* tr_data.c: see tr_data.h. */
#include "tr_data.h"
#include "util.h"

#include "muster_errors.h"

#include <errno.h>
#include <math.h>
#include <pwd.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

uint64_t tr_rand_next(uint64_t *state) {
  return tr_rand_mix(*state += TR_RAND_STEP);
}

float tr_rand_uniform(uint64_t *state) {
  return tr_rand_float(tr_rand_next(state));
}

void tr_epoch_order(uint64_t seed, int epoch, int n, int *perm) {
  uint64_t st = seed * 0x2545f4914f6cdd1dULL + (uint64_t)epoch * 0x9e3779b97f4a7c15ULL + 1;

  for (int i = 0; i < n; i++)
    perm[i] = i;
  /* Fisher-Yates. */
  for (int i = n - 1; i > 0; i--) {
    int j = (int)(tr_rand_next(&st) % (uint64_t)(i + 1));
    int t = perm[i];
    perm[i] = perm[j];
    perm[j] = t;
  }
}

static uint32_t be32(const unsigned char *p) {
  return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

#if defined(__SANITIZE_ADDRESS__)
#define TR_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define TR_SANITIZED 1
#endif
#endif
#ifndef TR_SANITIZED
#define TR_SANITIZED 0
#endif

/* Blocks from this size on are mapped apart: zeroed and faulted in by the
 * kernel in one call. */
#define BIG_BLOCK (256u << 10)
/* Before each block: its mapped length (0: from malloc). A whole cache
 * line, so the block keeps the line's alignment. */
#define HEADER 64

void *tr_alloc(size_t size) {
  size_t total = size + HEADER;
  unsigned char *base;

  if (size > SIZE_MAX - HEADER)
    return NULL;
  /* Under AddressSanitizer every block comes from malloc, which it watches
   * (it does not watch mapped memory). */
  if (total >= BIG_BLOCK && !TR_SANITIZED) {
    base = mmap(NULL, total, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1,
                0);
    if (base == MAP_FAILED)
      return NULL;
    memcpy(base, &total, sizeof total);
  } else {
    if (posix_memalign((void **)&base, 64, total) != 0)
      return NULL;
    memset(base, 0, total);
  }
  return base + HEADER;
}

void tr_free(void *p) {
  unsigned char *base = p;
  size_t mapped;

  if (!p)
    return;
  base -= HEADER;
  memcpy(&mapped, base, sizeof mapped);
  if (mapped)
    munmap(base, mapped);
  else
    free(base);
}

/* Maps a whole IDX file (*map, *map_len; unmapped with munmap) after
 * checking its header: magic 0x0000 08 ndims, then ndims big-endian sizes,
 * then the bytes, which start at *data. The file's pages are read in with
 * the mapping, in one call. */
static MUST_CHECK int map_idx(const char *path, int ndims, uint32_t *dims, void **map,
                              size_t *map_len, const unsigned char **data, char *err,
                              size_t errlen) {
  unsigned char head[16];
  size_t want = 1, hl = 4 + 4 * (size_t)ndims;
  struct stat st;
  FILE *f = fopen(path, "rb");
  void *m;

  *map = NULL;
  *map_len = 0;
  *data = NULL;
  if (!f && errno == EACCES && geteuid() != 0) {
    /* A worker runs as an account of its own (--run-as): say which. */
    struct passwd *pw = getpwuid(geteuid());

    snprintf(err, errlen, "%s cannot be read by the account %s: %s", path,
             pw ? pw->pw_name : "(unnamed)", strerror(EACCES));
    return MUSTER_E_IO;
  }
  if (!f) {
    snprintf(err, errlen, "%s: %s", path, strerror(errno));
    return MUSTER_E_IO;
  }
  if (fread(head, 1, hl, f) != hl) {
    snprintf(err, errlen, "%s: truncated IDX header", path);
    goto bad;
  }
  if (head[0] != 0 || head[1] != 0 || head[2] != 0x08 || head[3] != ndims) {
    snprintf(err, errlen,
             "%s: not an IDX file of unsigned bytes with %d dimensions (magic %02x%02x%02x%02x, "
             "expected 000008%02x)",
             path, ndims, head[0], head[1], head[2], head[3], ndims);
    goto bad;
  }
  for (int i = 0; i < ndims; i++) {
    dims[i] = be32(head + 4 + 4 * i);
    if (dims[i] == 0 || dims[i] > 100000000u) {
      snprintf(err, errlen, "%s: dimension %d is %u", path, i, dims[i]);
      goto bad;
    }
    /* The product must not wrap (it is then compared with the file's
     * size, and indexes the data): 2^31 bytes is more than any IDX set. */
    if (want > (1ULL << 31) / dims[i]) {
      snprintf(err, errlen, "%s: the dimensions promise more than 2^31 bytes", path);
      goto bad;
    }
    want *= dims[i];
  }
  if (fstat(fileno(f), &st) != 0 || (size_t)st.st_size != hl + want) {
    snprintf(err, errlen, "%s: %s: the header promises %zu bytes of data, the file has %lld", path,
             (size_t)st.st_size < hl + want ? "truncated" : "trailing bytes", want,
             (long long)st.st_size - (long long)hl);
    goto bad;
  }
  /* Private and read-only: the data set is never written. */
  m = mmap(NULL, hl + want, PROT_READ, MAP_PRIVATE | MAP_POPULATE, fileno(f), 0);
  if (m == MAP_FAILED) {
    snprintf(err, errlen, "%s: could not map %zu bytes: %s", path, hl + want, strerror(errno));
    fclose(f);
    return MUSTER_E_IO;
  }
  fclose(f);
  *map = m;
  *map_len = hl + want;
  *data = (const unsigned char *)m + hl;
  return 0;
bad:
  fclose(f);
  return MUSTER_E_INVALID;
}

int tr_data_load_mnist(const char *dir, int train, struct tr_data *d, char *err, size_t errlen) {
  char ipath[1100], lpath[1100];
  uint32_t idims[3], ldims[1];
  const unsigned char *lab = NULL;
  void *lmap = NULL;
  size_t llen = 0;
  int rc;

  memset(d, 0, sizeof(*d));
  snprintf(ipath, sizeof(ipath), "%s/%s-images-idx3-ubyte", dir, train ? "train" : "t10k");
  snprintf(lpath, sizeof(lpath), "%s/%s-labels-idx1-ubyte", dir, train ? "train" : "t10k");
  rc = map_idx(ipath, 3, idims, &d->map, &d->map_len, &d->px, err, errlen);
  if (!rc)
    rc = map_idx(lpath, 1, ldims, &lmap, &llen, &lab, err, errlen);
  if (!rc && idims[0] != ldims[0]) {
    snprintf(err, errlen, "%s has %u images but %s has %u labels", ipath, idims[0], lpath,
             ldims[0]);
    rc = MUSTER_E_INVALID;
  }
  if (rc)
    goto out;
  d->n = (int)idims[0];
  d->dim = (int)(idims[1] * idims[2]);
  d->classes = 10;
  d->y = malloc((size_t)d->n);
  if (!d->y) {
    rc = MUSTER_E_NOMEM;
    snprintf(err, errlen, "out of memory for %d labels", d->n);
    goto out;
  }
  for (int i = 0; i < d->n; i++) {
    if (lab[i] > 9) {
      snprintf(err, errlen, "%s: label %d of sample %d is not a digit", lpath, lab[i], i);
      rc = MUSTER_E_INVALID;
      goto out;
    }
    d->y[i] = lab[i];
  }
out:
  if (lmap)
    munmap(lmap, llen);
  if (rc)
    tr_data_cleanup(d);
  return rc;
}

void tr_data_rows(const struct tr_data *d, int first, int count, float *out) {
  size_t n = (size_t)count * d->dim, at = (size_t)first * d->dim;

  if (d->x) {
    memcpy(out, d->x + at, n * sizeof(float));
    return;
  }
  for (size_t i = 0; i < n; i++)
    out[i] = d->px[at + i] * (1.0f / 255.0f);
}

int tr_data_floats(struct tr_data *d) {
  if (d->x || d->n == 0)
    return 0;
  float *x = tr_alloc((size_t)d->n * d->dim * sizeof(float));

  if (!x)
    return MUSTER_E_NOMEM;
  tr_data_rows(d, 0, d->n, x);
  d->x = x;
  return 0;
}

/* One synthetic sample around its class's centre ctr, from the dim draws
 * after state st: the same draws as tr_rand_uniform() in turn, computed
 * apart, so that the loop vectorizes (64-bit multiplies: AVX-512DQ has
 * them, AVX2 builds them from 32-bit ones). */
__attribute__((target_clones("arch=x86-64-v4", "avx2", "default"))) static void
synthetic_row(const float *ctr, int dim, uint64_t st, float *x) {
  for (int j = 0; j < dim; j++) {
    float v =
        ctr[j] + 0.6f * (tr_rand_float(tr_rand_mix(st + (uint64_t)(j + 1) * TR_RAND_STEP)) - 0.5f);
    x[j] = v < 0 ? 0 : v > 1 ? 1 : v;
  }
}

int tr_data_synthetic(int n, int dim, int classes, uint64_t seed, struct tr_data *d) {
  uint64_t st = seed ^ 0x5eed5eed5eedULL;
  float *centers;

  memset(d, 0, sizeof(*d));
  if (n <= 0 || dim <= 0 || classes < 2 || classes > 255)
    return MUSTER_E_INVALID;
  d->n = n;
  d->dim = dim;
  d->classes = classes;
  d->x = tr_alloc((size_t)n * dim * sizeof(float));
  d->y = malloc((size_t)n);
  centers = malloc((size_t)classes * dim * sizeof(float));
  if (!d->x || !d->y || !centers) {
    free(centers);
    tr_data_cleanup(d);
    return MUSTER_E_NOMEM;
  }
  /* One random centre per class, samples around it: learnable, but not
   * trivially (the noise overlaps the classes). */
  for (size_t i = 0; i < (size_t)classes * dim; i++)
    centers[i] = tr_rand_uniform(&st);
  for (int i = 0; i < n; i++) {
    int c = (int)(tr_rand_next(&st) % (uint64_t)classes);
    d->y[i] = (uint8_t)c;
    synthetic_row(centers + (size_t)c * dim, dim, st, d->x + (size_t)i * dim);
    st += (uint64_t)dim * TR_RAND_STEP;
  }
  free(centers);
  return 0;
}

void tr_data_cleanup(struct tr_data *d) {
  if (!d)
    return;
  tr_free(d->x);
  free(d->y);
  if (d->map)
    munmap(d->map, d->map_len);
  memset(d, 0, sizeof(*d));
}
