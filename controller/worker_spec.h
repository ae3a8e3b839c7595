/*
 * worker_spec.h: what a worker runs and with which environment, built from
 * its launch request. Every backend's workers get the same: the register
 * answer carries both to muster-workerd, whatever started it.
 */
#ifndef MUSTER_WORKER_SPEC_H
#define MUSTER_WORKER_SPEC_H

#include "db.h"

#include <jansson.h>

/* The argv the worker runs (script with its kernel, code, a "!" shell
 * command, or command), with args appended; an empty array for an idle
 * worker. New reference. */
json_t *spec_command(const struct db_worker_info *info);

/* The environment of the worker's script: MUSTER_*, the CML names
 * (CDSW_*), CUDA_VISIBLE_DEVICES, then the user's env and secret_env on
 * top, and a run's worker its run's MUSTER_RUN_ID and MUSTER_RUN_TOKEN
 * (derived under run_key: job_secret.h). ip is the address the worker
 * registered. New reference; it holds secrets (secret_env, the run's
 * token): never log it. */
json_t *spec_env(const struct db_worker_info *info, const char *ip, const char *controller_url,
                 const char *run_key);

/* The directory the worker starts in: its launch's cwd, else workdir (the
 * controller's --workdir). Borrowed from info or workdir. */
const char *spec_cwd(const struct db_worker_info *info, const char *workdir);

/* The absolute path of the worker's script (a relative one resolved
 * against spec_cwd()), which muster-workerd checks before it runs the
 * kernel; JSON null when it runs no script. New reference. */
json_t *spec_script(const struct db_worker_info *info, const char *workdir);

#endif
