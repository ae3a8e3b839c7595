/*
 * backend_external.c: the "external" backend (see backend.h): starts
 * nothing. Every worker is placed at once and goes to `starting`; its
 * muster-workerd is started by someone else (by hand, a site's own launcher,
 * or a load generator such as bench/controller) with MUSTER_CONTROLLER_URL,
 * MUSTER_WORKER_ID, MUSTER_WORKER_TOKEN and MUSTER_WORKER_ATTEMPT (the
 * worker's "attempt" field), and registers like any other. The controller
 * still detects start timeouts and lost heartbeats; a stop reaches such a
 * workerd through its next heartbeat ({"stop": true}).
 */
#include "backend.h"

#include "muster_errors.h"
#include "state.h"

#include <stdio.h>

static int ext_init(const struct ctl_config *cfg, char *err, size_t errlen) {
  (void)cfg;
  (void)err;
  (void)errlen;
  return 0;
}

static void ext_shutdown(void) {}

static int ext_could_ever_fit(const struct backend_req *r, const char **field, char *msg,
                              size_t msglen) {
  (void)r;
  (void)field;
  (void)msg;
  (void)msglen;
  return 0;
}

static int ext_place(const char *id, const struct backend_req *r, struct backend_placement *where,
                     char *why, size_t whylen) {
  (void)id;
  (void)r;
  (void)why;
  (void)whylen;
  where->bind_ip[0] = '\0';
  where->gpu_indices[0] = '\0';
  return 1;
}

static int ext_submit(const struct backend_start *ws, int n, char *why, size_t whylen) {
  (void)ws;
  (void)n;
  (void)why;
  (void)whylen;
  return 0;
}

static void ext_cancel(const char *id, enum backend_cancel how) {
  (void)id;
  (void)how;
}

static void ext_release(const char *id) {
  (void)id;
}

/* Nothing to look at: whatever registered before the restart is trusted to
 * run on, and found out by its heartbeats if it does not. */
static int ext_reconcile(struct backend_live *ws, int n, char *err, size_t errlen) {
  (void)err;
  (void)errlen;
  for (int i = 0; i < n; i++)
    ws[i].adopted = 1;
  return 0;
}

static void ext_usage(double *cpu_used, double *cpu_total, double *mem_used, double *mem_total) {
  *cpu_used = *cpu_total = *mem_used = *mem_total = 0;
}

const struct backend_ops backend_external_ops = {
    .name = "external",
    .init = ext_init,
    .shutdown = ext_shutdown,
    .could_ever_fit = ext_could_ever_fit,
    .place = ext_place,
    .submit = ext_submit,
    .cancel = ext_cancel,
    .release = ext_release,
    .reconcile = ext_reconcile,
    .usage = ext_usage,
};
