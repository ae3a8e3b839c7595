/*
 * cgroup.h: the local backend's containers. Each worker runs in a cgroup
 * of its own, on cgroup v2 (the unified hierarchy) or v1 (one hierarchy
 * per controller): its memory a hard limit, its cpu a quota, its process
 * count bounded, and its end the end of every process in it.
 *
 * The cgroups of one controller live under a base directory per hierarchy,
 * "muster-TAG" beside the controller's own cgroup's children (TAG names
 * its state directory, so that a restarted controller finds the cgroups of
 * the workers it adopts). A worker's cgroup is named "ID.ATTEMPT".
 *
 * Devices (cgroup v1's devices controller): every device is denied but a
 * container's and the host's GPUs (on the base, which worker cgroups copy);
 * the host's /dev/nvidiaN that a worker was not given are denied to it,
 * and so are the NVIDIA control devices (nvidiactl, nvidia-uvm...) when it
 * was given none. The devices
 * are found once, at setup, in $MUSTER_DEV_DIR (default /dev; tests point
 * it at device nodes of their own). cgroup v2 restricts devices through a
 * BPF program only, which muster does not load: there, GPUs are not
 * restricted (cg_setup says so).
 *
 * Everything here reads and writes files: it runs on the backend's thread,
 * never under the state lock.
 */
#ifndef MUSTER_CGROUP_H
#define MUSTER_CGROUP_H

#include "util.h"

#include <stddef.h>
#include <stdint.h>

/* The pids limit of every worker: a fork bomb stops there. Threads count. */
#define CG_PIDS_MAX 8192

enum cg_isolation { CG_AUTO, CG_FORCE, CG_OFF };

struct cg_limits {
  double cpu;    /* cores; 0: no quota */
  double memory; /* GiB; 0: no limit */
  uint64_t gpus; /* the GPU indices it was given (bit i: /dev/nvidiaI) */
};

struct cg_usage {
  double cpu_seconds;
  long long memory_bytes, memory_peak_bytes;
};

/* Finds the cgroup file systems and makes the base directories. With
 * CG_AUTO, a host where that cannot be done runs without isolation and
 * *why says why; with CG_FORCE that is an error (returns -1, *why says
 * why). CG_OFF: none. Returns 0. state_dir names the base. */
MUST_CHECK int cg_setup(enum cg_isolation want, const char *state_dir, char *why, size_t len);

/* "cgroup v1", "cgroup v2" or "none". */
const char *cg_mode(void);
int cg_enabled(void);
/* Whether workers' commands can also get namespaces of their own (tried at
 * setup: a container, a seccomp profile or a distribution's policy may
 * refuse them while cgroups work). */
int cg_confined(void);
/* Why commands cannot be confined here: "" when they can. */
const char *cg_confine_why(void);

/* Creates worker name's cgroup in every hierarchy with its limits, and
 * writes into dirs the directories a process must join, one per line.
 * Returns 0, or -1 with a sentence in err (nothing is left behind). */
MUST_CHECK int cg_create(const char *name, const struct cg_limits *l, char *dirs, size_t dirs_len,
                         char *err, size_t errlen);

/* Kills every process in worker name's cgroup (cgroup.kill on v2; on v1
 * frozen first, so that nothing forks away meanwhile), waits up to
 * timeout_ms for them to go, and removes the cgroup. Returns the number of
 * processes still there (0: removed), or 0 when there is no such cgroup. */
int cg_destroy(const char *name, int timeout_ms);

/* How many processes of worker name's cgroup the out-of-memory killer
 * killed, and its memory limit in bytes (0: none). Returns 0, or -1. */
MUST_CHECK int cg_oom(const char *name, long long *kills, long long *limit);

/* The cgroup's use so far. Returns 0, or -1. */
MUST_CHECK int cg_usage_of(const char *name, struct cg_usage *u);

/* Removes the base directories if no worker cgroup is left in them (at
 * the controller's exit: workers that run on keep theirs). */
void cg_teardown(void);

/* Calls fn(name) for each worker cgroup under the base (to sweep the
 * ones no worker owns). */
void cg_each(void (*fn)(const char *name, void *arg), void *arg);

#endif
