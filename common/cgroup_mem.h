/*
 * cgroup_mem.h: what the memory cgroup of this process says of it, on
 * cgroup v1 (the memory controller's own hierarchy) and v2 (the unified
 * one): how many processes of it the out-of-memory killer killed, and the
 * tightest memory limit on it and the cgroups above it.
 *
 * muster-workerd reads it when its command is killed by SIGKILL: a count
 * that grew since it started means the kernel's out-of-memory killer did
 * it, inside whatever put workerd in a cgroup (a Slurm step with
 * ConstrainRAMSpace, the local backend's container). Paths come from
 * /proc/self/cgroup, so a cgroup namespace (a container's) is followed as
 * it is seen from inside.
 */
#ifndef MUSTER_CGROUP_MEM_H
#define MUSTER_CGROUP_MEM_H

#include "util.h"

struct cg_mem {
  long long oom_kills; /* its processes killed for want of memory */
  long long limit;     /* bytes; 0 when none is set */
};

/* Fills *m. Returns 0, or -1 when this process is in no memory cgroup
 * that can be read (no cgroup file system, no memory controller). */
MUST_CHECK int cg_mem_read(struct cg_mem *m);

/* root_dir: the cgroup file system's mount point ("/sys/fs/cgroup");
 * self_cgroup: the text of /proc/self/cgroup. For tests. */
MUST_CHECK int cg_mem_read_at(const char *root_dir, const char *self_cgroup, struct cg_mem *m);

#endif
