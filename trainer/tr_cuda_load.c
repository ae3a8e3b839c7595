/*
 * tr_cuda_load.c: --device cuda, loaded on demand. The CUDA code lives in a
 * plugin built beside muster-train (libmuster-train-cuda.so, linked against
 * the CUDA runtime, cuBLAS and NCCL), so that the CPU paths neither load nor
 * need those libraries: half a gigabyte that every rank on every host would
 * otherwise map at start.
 */
#include "tr_run.h"

#include <dlfcn.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define PLUGIN "libmuster-train-cuda.so"
/* Where cmake --install puts it, relative to muster-train's directory. */
#ifndef MUSTER_CUDA_PLUGIN_REL
#define MUSTER_CUDA_PLUGIN_REL "../lib/muster/" PLUGIN
#endif

typedef int plugin_run_fn(const struct tr_opts *o, struct tr_mlp *m, const struct tr_data *train,
                          const struct tr_data *test, struct tr_result *r, int *argc, char ***argv);

/* Writes the plugin's path into path: $MUSTER_TRAIN_CUDA_PLUGIN, else the
 * first of the build tree's (beside the executable) and the installed one
 * that exists. Returns 0, or -1 when none exists. */
static int find_plugin(char *path, size_t len) {
  const char *env = getenv("MUSTER_TRAIN_CUDA_PLUGIN");
  char exe[PATH_MAX], *slash;
  ssize_t n;

  if (env && env[0]) {
    snprintf(path, len, "%s", env);
    return access(path, R_OK) == 0 ? 0 : -2;
  }
  n = readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (n <= 0)
    return -1;
  exe[n] = '\0';
  slash = strrchr(exe, '/');
  if (!slash)
    return -1;
  *slash = '\0';
  snprintf(path, len, "%s/%s", exe, PLUGIN);
  if (access(path, R_OK) == 0)
    return 0;
  snprintf(path, len, "%s/%s", exe, MUSTER_CUDA_PLUGIN_REL);
  return access(path, R_OK) == 0 ? 0 : -1;
}

/* One sentence for a plugin that would not load: the library the loader
 * could not find, by name, where that is what dlerror() says. */
static void say_load_error(const char *path, const char *why) {
  const char *colon = strchr(why, ':');

  if (colon && strstr(why, "cannot open shared object file") && colon - why < 200 &&
      strncmp(why, path, (size_t)(colon - why)) != 0)
    fprintf(stderr,
            "muster-train: --device cuda needs %.*s, which this machine's loader cannot find "
            "(install CUDA with cuBLAS and NCCL, or put their directory on LD_LIBRARY_PATH)\n",
            (int)(colon - why), why);
  else
    fprintf(stderr, "muster-train: --device cuda: cannot load %s: %s\n", path, why);
}

int tr_run_cuda(const struct tr_opts *o, struct tr_mlp *m, const struct tr_data *train,
                const struct tr_data *test, struct tr_result *r, int *argc, char ***argv) {
  char path[PATH_MAX + 64];
  plugin_run_fn *run;
  unsigned long (*abi)(void);
  struct tr_data tr = *train, te = *test;
  void *lib;
  int rc;

  rc = find_plugin(path, sizeof path);
  if (rc == -2) {
    fprintf(stderr, "muster-train: --device cuda: MUSTER_TRAIN_CUDA_PLUGIN=%s: no such file\n",
            path);
    return 2;
  }
  if (rc != 0) {
    fprintf(stderr,
            "muster-train: --device cuda: this muster-train was built without CUDA (no %s "
            "beside it or in %s)\n",
            PLUGIN, MUSTER_CUDA_PLUGIN_REL);
    return 2;
  }
  lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    say_load_error(path, dlerror());
    return 2;
  }
  run = (plugin_run_fn *)dlsym(lib, "tr_cuda_plugin_run");
  abi = (unsigned long (*)(void))dlsym(lib, "tr_cuda_plugin_abi");
  if (!run || !abi) {
    fprintf(stderr, "muster-train: --device cuda: %s is not muster-train's CUDA plugin\n", path);
    return 2;
  }
  if (abi() != TR_CUDA_PLUGIN_ABI) {
    fprintf(stderr,
            "muster-train: --device cuda: %s was built from other sources than this "
            "muster-train (plugin interface %lu, not %lu); rebuild or reinstall both\n",
            path, abi(), (unsigned long)TR_CUDA_PLUGIN_ABI);
    return 2;
  }
  /* It uploads the sets as floats: MNIST's pixels are converted here, into
   * copies of the descriptors that own only those floats. */
  if (tr_data_floats(&tr) != 0 || tr_data_floats(&te) != 0) {
    fprintf(stderr, "muster-train: --device cuda: out of memory for the data set as floats\n");
    rc = 1;
  } else {
    /* The plugin stays loaded until exit: CUDA's own exit handlers live
     * in it. */
    rc = run(o, m, &tr, &te, r, argc, argv);
  }
  if (tr.x != train->x)
    tr_free(tr.x);
  if (te.x != test->x)
    tr_free(te.x);
  return rc;
}
