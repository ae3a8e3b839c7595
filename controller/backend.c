/* backend.c: the backends compiled in (see backend.h). */
#include "backend.h"

#include <string.h>

static const struct backend_ops *const backends[] = {&backend_local_ops, &backend_slurm_ops,
                                                     &backend_external_ops};

const struct backend_ops *backend_find(const char *name) {
  for (size_t i = 0; i < sizeof(backends) / sizeof(backends[0]); i++)
    if (strcmp(backends[i]->name, name) == 0)
      return backends[i];
  return NULL;
}

const char *backend_names(void) {
  return "local, slurm, external";
}
