/*
 * envlists.h: which environment variables cross each boundary between the
 * parts, in one place. Every list holds entries that end in '=' (one
 * variable) or not (every variable whose name starts so).
 *
 *   controller -> workerd    env_to_worker(): the controller's environment
 *                            is the worker's "image" (PATH, HOME, LANG...),
 *                            less its own muster/CML settings, its API
 *                            token above all; workerd's own settings pass.
 *   workerd -> the script    env_workerd_only(): what workerd keeps to
 *                            itself: its token, its bind address, its own
 *                            settings.
 *   muster run -> mpirun     env_run_sets(): what muster run sets itself
 *                            for mpirun (and drops from its own
 *                            environment so that the two cannot disagree).
 *   mpirun -> its daemon     env_rsh_forwards(): what `muster rsh` passes
 *                            on to the daemon it starts in a worker.
 *   Open MPI daemon -> rank  env_rank_forwards(): what `muster rank` takes
 *                            from the daemon into the rank; the rest of the
 *                            rank's environment is its own worker's.
 *
 * Header only (static inline): the CLI, which links libmuster alone, uses
 * it too.
 */
#ifndef MUSTER_ENVLISTS_H
#define MUSTER_ENVLISTS_H

#include <stdbool.h>
#include <stddef.h>
#include <string.h>

/* Whether var ("NAME=value") is in the NULL-terminated list. */
static inline bool env_in(const char *var, const char *const *list) {
  for (; *list; list++)
    if (strncmp(var, *list, strlen(*list)) == 0)
      return true;
  return false;
}

/* The settings meant for workerd itself, which it does not hand on. */
static inline bool env_workerd_only(const char *var) {
  /* MUSTER_JOB_SECRET: a Slurm job's, which its launcher (muster-workerd
   * --job) takes out before it starts any step; MUSTER_WORKER_TOKEN_FD:
   * where a Slurm step's workerd reads its token. MUSTER_TOKEN_ (a
   * prefix): the tokens of a job's every worker, which jobs queued by a
   * version before the job secret carry in their environment. */
  static const char *const list[] = {"MUSTER_WORKER_TOKEN=",    "MUSTER_TOKEN_",
                                     "MUSTER_WORKER_TOKEN_FD=", "MUSTER_JOB_SECRET=",
                                     "MUSTER_BIND_IP=",         "MUSTER_ORPHAN_TIMEOUT=",
                                     "MUSTER_LOG_LEVEL=",       "MUSTER_NETNS=",
                                     "MUSTER_HOST_DIR=",        NULL};
  return env_in(var, list);
}

/* Whether the controller's variable var reaches the workers it starts.
 * The handles of the session that started the controller (its SSH and GPG
 * agents, its desktop bus, its runtime directory, its Kerberos tickets) do
 * not: a worker's code is not that user's, and a container does not
 * inherit them. */
static inline bool env_to_worker(const char *var) {
  static const char *const controller_own[] = {
      "MUSTER_",          "CDSW_",           "SSH_AUTH_SOCK=",
      "SSH_AGENT_PID=",   "GPG_AGENT_INFO=", "DBUS_SESSION_BUS_ADDRESS=",
      "XDG_RUNTIME_DIR=", "KRB5CCNAME=",     NULL};
  static const char *const for_workerd[] = {
      "MUSTER_ORPHAN_TIMEOUT=", "MUSTER_LOG_LEVEL=", "MUSTER_FAULT=", "MUSTER_CA_FILE=", NULL};
  return !env_in(var, controller_own) || env_in(var, for_workerd);
}

/* Whether the controller's variable var goes into a Slurm job it submits:
 * what reaches any worker, less Slurm's own settings of the controller's
 * process (a controller started inside a job must not hand that job's
 * SLURM_JOB_ID to its own jobs), but with SLURM_CONF, which finds the
 * cluster. */
static inline bool env_to_slurm_job(const char *var) {
  static const char *const slurm_own[] = {"SLURM_", "SBATCH_", "SRUN_", "SALLOC_", NULL};
  static const char *const keep[] = {"SLURM_CONF=", NULL};
  return env_to_worker(var) && (!env_in(var, slurm_own) || env_in(var, keep));
}

/* What muster run sets for its mpirun itself. */
static inline bool env_run_sets(const char *var) {
  static const char *const list[] = {
      "MUSTER_EXEC_", "MUSTER_RESTART_COUNT=", "MASTER_ADDR=", "MASTER_PORT=", "WORLD_SIZE=", NULL};
  return env_in(var, list);
}

/* What `muster rsh` passes from mpirun's environment to the daemon it
 * starts in a worker (whose environment is otherwise the worker's own). */
static inline bool env_rsh_forwards(const char *var) {
  /* MUSTER_FAULT: a test build's fault points (common/fault.h) reach the
   * daemon's muster rank. MUSTER_EXEC_TOKEN: what the daemon's muster
   * rank execs its rank with, given to the daemon here, inside the exec
   * channel's TLS, and never through mpirun's -x: Open MPI's own wire to
   * its daemons is not encrypted. */
  static const char *const list[] = {
      "HWLOC_COMPONENTS=", "MUSTER_FAULT=", "MUSTER_EXEC_TOKEN=", NULL};
  return env_in(var, list);
}

/* What an Open MPI daemon gives its ranks (and what mpirun -x passes on). */
static inline bool env_rank_forwards(const char *var) {
  static const char *const list[] = {"OMPI_",
                                     "PMIX_",
                                     "OPAL_",
                                     "ORTE_",
                                     "MASTER_ADDR=",
                                     "MASTER_PORT=",
                                     "WORLD_SIZE=",
                                     "MUSTER_RESTART_COUNT=",
                                     "HWLOC_COMPONENTS=",
                                     NULL};
  return env_in(var, list);
}

#endif
