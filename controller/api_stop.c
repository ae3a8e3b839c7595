/* api_stop.c: stopping workers: DELETE /api/v1/workers/{id} and POST
 * /api/v1/workers/stop (by ids, or every live worker of a session). See
 * api_internal.h. */
#include "api_internal.h"
#include "api_scope.h"
#include "session_name.h"

#include "muster_errors.h"
#include "state.h"
#include "validate.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- DELETE /api/v1/workers/{id}, POST /api/v1/workers/stop ---- */

/* Why a worker stopped, naming who stopped it: "stopped by the user" for
 * the bootstrap administrator (as before users), else "stopped by NAME". */
static const char *stopped_by(const struct req *rq, char *buf, size_t size) {
  if (!rq->who.name[0])
    return "stopped by the user";
  snprintf(buf, size, "stopped by %s", rq->who.name);
  return buf;
}

static enum MHD_Result api_delete(struct MHD_Connection *c, struct req *rq, const char *id) {
  char ids[1][16], why[64];
  struct reader *rd = api_reader_get();
  int sees = api_sees_worker(rq, rd, id), rc;
  json_t *w;

  api_reader_put(rd);
  w = sees ? api_worker_read(id) : NULL;
  if (!w)
    return api_respond_error(c, MUSTER_E_NOT_FOUND, "id", "there is no worker %s", id);
  json_decref(w);
  snprintf(ids[0], sizeof(ids[0]), "%s", id);
  state_lock();
  rc = sm_stop_many_locked(ids, 1, stopped_by(rq, why, sizeof(why)), NULL);
  state_unlock();
  if (rc)
    return api_respond_error(c, rc, NULL, "could not stop %s", id);
  w = api_worker_read(id);
  return w ? api_respond_json(c, MHD_HTTP_OK, w) : api_respond_error(c, MUSTER_E_DB, NULL, NULL);
}

/* The worker id of an ids[] item: an id, or a worker object (borrowed;
 * NULL if neither). */
static const char *item_id(json_t *item) {
  return json_is_object(item) ? json_string_value(json_object_get(item, "id"))
                              : json_string_value(item);
}

static enum MHD_Result api_stop_workers(struct MHD_Connection *c, struct req *rq, const char *arg) {
  (void)arg;
  json_t *body = NULL, *ids, *item, *out = json_array();
  const char *session = "default";
  char(*targets)[16] = NULL, stored[SESSION_STORED_MAX], why[64];
  enum MHD_Result ret = MHD_NO;
  struct reader *rd;
  size_t i;
  int n = 0, rc = 0;

  if (rq->len) {
    body = api_parse_body(c, rq, &ret);
    if (!body)
      goto out;
  }
  ids = body ? json_object_get(body, "ids") : NULL;
  if (body && json_object_get(body, "session"))
    session = json_string_value(json_object_get(body, "session"));
  /* The session as stored (a user's own; another user's has nothing to stop). */
  rc = api_session_scope(rq, session, stored, sizeof(stored));
  if (rc == MUSTER_E_INVALID) {
    ret = api_respond_error(c, MUSTER_E_INVALID, "session",
                            "session must be 1 to 64 letters, digits, '_', '.' or '-'");
    goto out;
  }
  session = rc ? "/" : stored;
  rc = 0;
  if (ids && !json_is_null(ids) && !json_is_array(ids)) {
    ret = api_respond_error(c, MUSTER_E_INVALID, "ids", "ids must be an array of worker ids");
    goto out;
  }
  if (json_array_size(ids) > 100000) {
    ret = api_respond_error(c, MUSTER_E_INVALID, "ids", "ids may name at most 100000 workers");
    goto out;
  }
  json_array_foreach(ids, i, item) {
    const char *id = item_id(item);
    if (!validate_worker_id(id)) {
      ret = api_respond_error(c, MUSTER_E_INVALID, "ids", "ids[%zu] is not a worker id", i);
      goto out;
    }
  }
  rd = api_reader_get();
  json_array_foreach(ids, i, item) {
    const char *id = item_id(item);
    json_t *w = api_sees_worker(rq, rd, id) ? db_worker_json(rd->db, id) : NULL;
    if (!w) {
      api_reader_put(rd);
      ret = api_respond_error(c, MUSTER_E_NOT_FOUND, "ids", "there is no worker %s", id);
      goto out;
    }
    json_decref(w);
  }
  api_reader_put(rd);

  state_lock();
  n = (int)json_array_size(ids);
  if (n == 0)
    for (struct lw *w = g.head; w; w = w->next)
      n += strcmp(w->session, session) == 0;
  targets = calloc((size_t)n + 1, sizeof(*targets));
  if (!targets) {
    state_unlock();
    ret = api_respond_error(c, MUSTER_E_NOMEM, NULL, NULL);
    goto out;
  }
  if (json_array_size(ids)) {
    json_array_foreach(ids, i, item) {
      const char *id = item_id(item);
      snprintf(targets[i], sizeof(targets[i]), "%s", id);
    }
  } else {
    int k = 0;
    /* Every live worker of the session. */
    for (struct lw *w = g.head; w; w = w->next)
      if (strcmp(w->session, session) == 0)
        snprintf(targets[k++], sizeof(targets[0]), "%s", w->id);
  }
  /* One transaction for all of them, however many. */
  rc = sm_stop_many_locked(targets, n, stopped_by(rq, why, sizeof(why)), NULL);
  state_unlock();
  if (rc) {
    ret = api_respond_error(c, rc, NULL, "could not stop the workers; none was stopped");
    goto out;
  }
  rd = api_reader_get();
  for (int k = 0; k < n; k++)
    json_array_append_new(out, db_worker_json(rd->db, targets[k]));
  api_reader_put(rd);
  ret = api_respond_json(c, MHD_HTTP_OK, json_pack("{s:O}", "workers", out));

out:
  free(targets);
  json_decref(out);
  json_decref(body);
  return ret;
}

/* The routes of this file (api_routes.c lists the table). */
const struct api_route api_stop_routes[] = {
    {"POST", "/api/v1/workers/stop", AUTH_CLIENT, api_stop_workers, NULL},
    {"DELETE", "/api/v1/workers/{id}", AUTH_CLIENT, api_delete, NULL},
    {NULL, NULL, AUTH_NONE, NULL, NULL},
};
