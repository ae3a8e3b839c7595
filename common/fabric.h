/*
 * fabric.h: whether this host has an RDMA or Omni-Path device, what Open
 * MPI's network transports (UCX, verbs, libfabric, PSM) and its hwloc's
 * reading of PCI devices (the locality of network cards) are for. Where
 * there is none, muster run and muster-train skip both.
 *
 * Header only (static inline): the CLI's library and the trainer share it.
 */
#ifndef MUSTER_FABRIC_H
#define MUSTER_FABRIC_H

#include <dirent.h>
#include <unistd.h>

static inline int host_has_fabric(void) {
  DIR *d = opendir("/sys/class/infiniband");
  struct dirent *e;
  int found = 0;

  while (d && !found && (e = readdir(d)))
    found = e->d_name[0] != '.';
  if (d)
    closedir(d);
  return found || access("/dev/hfi1_0", F_OK) == 0 || access("/dev/ipath", F_OK) == 0;
}

#endif
