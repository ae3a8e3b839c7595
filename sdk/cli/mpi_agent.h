/*
 * mpi_agent.h: Open MPI's two agents on the exec channel, as muster run
 * uses them: `rsh` (mpirun's plm_rsh_agent, which starts a daemon in a
 * worker) and `rank` (which a daemon starts, to run one rank inside that
 * rank's own worker). Shared by the muster CLI (`muster rsh`, `muster
 * rank`) and muster-launcher, a small program without libcurl that muster
 * run uses for both: each start of an agent is on the path from mpirun to
 * the first step, and loading libcurl's dozens of libraries is most of a
 * CLI's start.
 */
#ifndef MUSTER_MPI_AGENT_H
#define MUSTER_MPI_AGENT_H

#include "muster.h"

extern const char mpi_agent_usage_rsh[];
extern const char mpi_agent_usage_rank[];

/* The index in argv of rsh's HOST, after ssh-style options (which mean
 * nothing here), or -1 when no HOST and command follow. */
int mpi_agent_rsh_host(int argc, char **argv);

/* Fills t with HOST's exec channel from MUSTER_EXEC_HOSTS and
 * MUSTER_EXEC_TOKEN (set by muster run). Returns 0, or -1 when they are
 * not set or do not name HOST. */
int mpi_agent_rsh_target_env(const char *host, muster_exec_target *t);

/* Runs the shell command line of the words argv[first..argc) in the worker
 * at t, as ssh would, with what env_rsh_forwards() passes on. Returns the
 * process exit code: the command's, or 255 where the worker could not be
 * reached (what ssh says). who prefixes messages ("muster rsh"). */
int mpi_agent_rsh_at(const muster_exec_target *t, int argc, char **argv, int first,
                     const char *who);

/* `rank [--] COMMAND...` (mpi_agent_usage_rank). Returns the process exit
 * code. who prefixes messages ("muster rank"). */
int mpi_agent_rank(int argc, char **argv, const char *who);

#endif
