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

#include <stdio.h>

/* Starts with MUSTER_EXEC_: muster run sets it itself (env_run_sets()). */
#define RANK_END_ENV "MUSTER_EXEC_REPORT"
/* Where `muster rank` also appends its line: a file in its daemon's
 * directory (rank_ends_dir()) that `muster rsh` names for the daemon it
 * starts (RANK_ENDS_FILE, under a name of that shell's own), and that
 * muster run reads and removes through the exec channel once mpirun has
 * failed: a daemon lost while Open MPI's relay held the line loses nothing. */
#define RANK_ENDS_ENV "MUSTER_RANK_ENDS"
#define RANK_ENDS_FILE "rank-ends"

/* The directory of the Open MPI daemon that `muster rsh` starts for host
 * (the address mpirun names it by; Open MPI's orte_tmpdir_base) into buf:
 * /tmp/muster-ompi-HOST, any character of HOST but [A-Za-z0-9.-] as '_'. */
static inline void rank_ends_dir(const char *host, char *buf, size_t size) {
  size_t n = (size_t)snprintf(buf, size, "/tmp/muster-ompi-");

  for (const char *c = host; *c && n + 1 < size; c++)
    buf[n++] = (char)(((*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') ||
                       (*c >= '0' && *c <= '9') || *c == '.' || *c == '-')
                          ? *c
                          : '_');
  if (n < size)
    buf[n] = '\0';
}
/* The marker's fixed start; a random hex string follows. */
#define RANK_END_PREFIX "muster-rank-end-"

#endif
