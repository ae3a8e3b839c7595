/* exec_target.c: where a worker's exec channel is and its session's token,
 * asked of the controller (exec.c, which talks to the worker, needs no
 * controller). */
#include "muster.h"

#include <stdio.h>
#include <string.h>

int muster_exec_target_get(muster_client *c, const char *id, muster_exec_target *out) {
  muster_worker w;
  int rc;

  memset(out, 0, sizeof(*out));
  rc = muster_get(c, id, &w);
  if (rc)
    return rc;
  if (w.status != MUSTER_RUNNING || !w.ip_address || !w.exec_port) {
    rc = MUSTER_E_CONFLICT;
  } else {
    snprintf(out->host, sizeof(out->host), "%s", w.ip_address);
    out->port = w.exec_port;
    snprintf(out->worker_id, sizeof(out->worker_id), "%s", w.id);
    rc = muster_session_exec_token(c, w.session ? w.session : "default", out->token,
                                   sizeof(out->token));
  }
  muster_worker_cleanup(&w);
  return rc;
}
