/* tr_blas.c: OpenBLAS loaded after its environment is set (tr_blas.h). */
#include "tr_blas.h"

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

#ifndef MUSTER_OPENBLAS_SONAME
#define MUSTER_OPENBLAS_SONAME "libopenblas.so.0"
#endif

/* The sanitizers' runtimes (ASan, TSan) refuse RTLD_DEEPBIND. */
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define DEEPBIND 0
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define DEEPBIND 0
#endif
#endif
#ifndef DEEPBIND
#define DEEPBIND RTLD_DEEPBIND
#endif

tr_sgemm_fn *tr_sgemm;
static char *(*corename_fn)(void);
static void (*set_threads_fn)(int);

/* The kernels for this CPU, or NULL to leave the choice to OpenBLAS. It
 * falls back to SSE3 kernels, at a quarter of the speed, on CPUs newer than
 * it knows by name (a recent Xeon or EPYC with a generic model name); the
 * features decide instead. */
static const char *coretype_for_cpu(void) {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq"))
    return "SkylakeX";
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
    return "Haswell";
#endif
  return NULL;
}

int tr_blas_load(int threads, char *err, size_t errlen) {
  const char *core;
  char n[16];
  void *lib;

  if (tr_sgemm)
    return 0;
  /* Its pthread build starts a thread per core unless told otherwise, and
   * idle ones spin at first, stealing the core another rank needs. A
   * user's own OPENBLAS_* settings always win. */
  if (!getenv("OPENBLAS_NUM_THREADS")) {
    snprintf(n, sizeof n, "%d", threads);
    setenv("OPENBLAS_NUM_THREADS", n, 1);
  }
  core = coretype_for_cpu();
  if (core && !getenv("OPENBLAS_CORETYPE"))
    setenv("OPENBLAS_CORETYPE", core, 1);
  /* Lazy: of its thousands of functions, a run calls a few. Deep binding:
   * its thousands of references to itself resolve in its own symbols
   * first, not after a search of every library already loaded. The
   * sanitizers' runtime refuses deep binding. */
  lib = dlopen(MUSTER_OPENBLAS_SONAME, RTLD_LAZY | RTLD_LOCAL | DEEPBIND);
  if (!lib) {
    snprintf(err, errlen,
             "cannot load OpenBLAS (%s); install Debian's libopenblas0 or put its directory on "
             "LD_LIBRARY_PATH",
             dlerror());
    return 2;
  }
  tr_sgemm = (tr_sgemm_fn *)dlsym(lib, "cblas_sgemm");
  corename_fn = (char *(*)(void))dlsym(lib, "openblas_get_corename");
  set_threads_fn = (void (*)(int))dlsym(lib, "openblas_set_num_threads");
  if (!tr_sgemm) {
    snprintf(err, errlen, "%s has no cblas_sgemm", MUSTER_OPENBLAS_SONAME);
    dlclose(lib);
    return 2;
  }
  /* What --threads asks, whatever the environment said. */
  if (set_threads_fn)
    set_threads_fn(threads);
  return 0;
}

const char *tr_blas_corename(void) {
  return corename_fn ? corename_fn() : "none";
}
