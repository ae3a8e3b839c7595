/*
 * launcher.c: muster-launcher, the agents muster run gives Open MPI:
 *
 *   muster-launcher rsh [options] HOST COMMAND...   (mpirun's plm_rsh_agent)
 *   muster-launcher rank [--] COMMAND...            (what a daemon starts)
 *
 * the same as `muster rsh` and `muster rank` (sdk/cli/mpi_agent.c), in a
 * program that links the exec channel's client alone: no libcurl, whose
 * libraries are most of the CLI's start, paid twice on the way from mpirun
 * to every rank. The exec addresses come from muster run's environment
 * only (MUSTER_EXEC_HOSTS, MUSTER_EXEC_RANKS, MUSTER_EXEC_TOKEN); `muster
 * rsh` also asks the controller.
 */
#include "mpi_agent.h"

#include <stdio.h>
#include <string.h>

static const char usage[] =
    "usage: muster-launcher rsh [options] HOST COMMAND...\n"
    "       muster-launcher rank [--] COMMAND [ARGS...]\n"
    "\n"
    "Open MPI's agents for muster run (see muster rsh --help and muster rank\n"
    "--help); the workers' exec addresses come from muster run's environment.\n";

int main(int argc, char **argv) {
  muster_exec_target t;
  int host;

  if (argc < 2 || strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0) {
    fputs(usage, argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  if (argc > 2 && (strcmp(argv[2], "--help") == 0 || strcmp(argv[2], "-h") == 0) &&
      (strcmp(argv[1], "rsh") == 0 || strcmp(argv[1], "rank") == 0)) {
    fputs(strcmp(argv[1], "rsh") == 0 ? mpi_agent_usage_rsh : mpi_agent_usage_rank, stdout);
    return 0;
  }
  if (strcmp(argv[1], "rank") == 0)
    return mpi_agent_rank(argc - 1, argv + 1, "muster-launcher rank");
  if (strcmp(argv[1], "rsh") != 0) {
    fprintf(stderr, "muster-launcher: no command \"%s\" (rsh or rank)\n\n%s", argv[1], usage);
    return 2;
  }
  host = mpi_agent_rsh_host(argc - 1, argv + 1);
  if (host < 0) {
    fprintf(stderr, "muster-launcher rsh: a host and a command are needed\n\n%s",
            mpi_agent_usage_rsh);
    return 2;
  }
  if (mpi_agent_rsh_target_env(argv[1 + host], &t) != 0) {
    fprintf(stderr,
            "muster-launcher rsh: %s is not in MUSTER_EXEC_HOSTS, or MUSTER_EXEC_TOKEN is not "
            "set (muster run sets both; outside it, use muster rsh)\n",
            argv[1 + host]);
    return 255;
  }
  return mpi_agent_rsh_at(&t, argc - 1, argv + 1, host + 1, "muster-launcher rsh");
}
