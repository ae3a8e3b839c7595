/*
 * rank_end.h: how `muster rank` tells muster run how its rank ended, so
 * that an allreduce run's failure names the rank, its worker and the cause
 * (mpirun's own exit code says none of them).
 *
 * muster run puts a marker of its own (a random string, new for each
 * attempt) in RANK_END_ENV, which mpirun hands its ranks (-x). A rank whose
 * command failed, or could not be run, writes one line on its stderr,
 * which Open MPI relays to mpirun's (--tag-output: "[1,R]<stderr>:LINE"):
 *
 *   MARKER RANK KIND N TEXT
 *
 * KIND is "exit" (N: the exit code), "signal" (N: the signal that killed
 * the command), "error" (the command could not be run; TEXT says why) or
 * "lost" (the worker's exec connection broke; TEXT says how); N is 0 for
 * the last two, and TEXT empty for the first two. muster run takes such
 * lines out of the output and names the rank's worker itself (rank R is
 * the R-th worker of MUSTER_EXEC_RANKS). Without the variable (muster rank
 * started by hand), muster rank writes no such line.
 *
 * Header only: the CLI and muster-launcher write the line, libmuster reads it.
 */
#ifndef MUSTER_RANK_END_H
#define MUSTER_RANK_END_H

/* Starts with MUSTER_EXEC_: muster run sets it itself (env_run_sets()). */
#define RANK_END_ENV "MUSTER_EXEC_REPORT"
/* The marker's fixed start; a random hex string follows. */
#define RANK_END_PREFIX "muster-rank-end-"

#endif
