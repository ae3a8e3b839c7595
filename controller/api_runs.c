/* api_runs.c: runs: their creation, list, reads, restarts and end (see
 * api_internal.h and docs/design.md). */
#include "api_internal.h"
#include "api_scope.h"
#include "lease.h"
#include "log.h"
#include "muster_errors.h"
#include "session_name.h"
#include "state.h"
#include "validate.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define RUN_MAX_RESTARTS 1000

/* The body of a change of run id with only known fields: a new reference,
 * or NULL with the answer (404, 400, 422) queued through *ret. */
static json_t *run_change_body(struct MHD_Connection *c, struct req *rq, const char *id,
                               const char *const *known, size_t n, const char *list,
                               enum MHD_Result *ret) {
  json_t *body;

  if (!validate_run_id(id) || !api_sees_run(rq, id)) {
    *ret = api_respond_error(c, MUSTER_E_NOT_FOUND, "id", "there is no run %.40s", id);
    return NULL;
  }
  body = api_parse_body(c, rq, ret);
  if (body && !api_known_fields(c, body, known, n, list, ret)) {
    json_decref(body);
    return NULL;
  }
  return body;
}

/* ---- POST /api/v1/runs ---- */

struct named {
  const char *id;
  size_t at;
};

static int named_cmp(const void *a, const void *b) {
  const struct named *x = a, *y = b;
  int c = strcmp(x->id, y->id);

  return c ? c : (x->at > y->at) - (x->at < y->at);
}

/* Whether array workers names a worker twice: 1 with *at the first index
 * that repeats an earlier one, 0 if none does, -1 when out of memory. A
 * sorted copy makes it n log n (4,096 ids: no 8 million comparisons under
 * a request); items that are no strings are left to the check of each id. */
static int first_repeat(json_t *workers, size_t *at) {
  size_t n = 0, i;
  struct named *v = calloc(json_array_size(workers) + 1, sizeof(*v));
  json_t *item;
  int found = 0;

  if (!v)
    return -1;
  json_array_foreach(workers, i, item) if (json_is_string(item)) {
    v[n].id = json_string_value(item);
    v[n++].at = i;
  }
  qsort(v, n, sizeof(*v), named_cmp);
  /* Equal ids sit together, in array order: each run's second is its
   * first repeat, and the earliest of those is the one to name. */
  for (i = 1; i < n; i++)
    if (strcmp(v[i - 1].id, v[i].id) == 0 && (!found || v[i].at < *at)) {
      *at = v[i].at;
      found = 1;
      while (i + 1 < n && strcmp(v[i].id, v[i + 1].id) == 0)
        i++;
    }
  free(v);
  return found;
}

static enum MHD_Result api_run_create(struct MHD_Connection *c, struct req *rq, const char *arg) {
  (void)arg;
  static const char *const known[] = {"mode",    "command",      "session",
                                      "workers", "max_restarts", "holder"};
  json_t *body, *v, *workers, *item, *run = NULL;
  const char *mode, *session = "default", *holder;
  char stored[SESSION_STORED_MAX];
  char id[16], *command = NULL;
  struct reader *rd;
  enum MHD_Result ret = MHD_NO;
  int max_restarts = 0, rc;
  size_t i;

  body = api_parse_body(c, rq, &ret);
  if (!body)
    return ret;
  if (!api_known_fields(c, body, known, 6, "mode, command, session, workers, max_restarts, holder",
                        &ret))
    goto out;
  mode = json_string_value(json_object_get(body, "mode"));
  if (!validate_name(mode)) {
    ret = api_respond_error(c, MUSTER_E_INVALID, "mode",
                            "mode is required: a name such as allreduce, ps or exec");
    goto out;
  }
  v = json_object_get(body, "command");
  if (!json_is_array(v) || json_array_size(v) > 256) {
    ret = api_respond_error(c, MUSTER_E_INVALID, "command",
                            "command must be an array of at most 256 strings (the run's command)");
    goto out;
  }
  json_array_foreach(v, i, item) if (!json_is_string(item) || json_string_length(item) > 4096) {
    ret = api_respond_error(c, MUSTER_E_INVALID, "command",
                            "command[%zu] must be a string of at most 4096 characters", i);
    goto out;
  }
  v = json_object_get(body, "session");
  if (v && !json_is_null(v))
    session = json_string_value(v);
  /* The session as stored: a user's own (api_scope.h). */
  rc = api_session_scope(rq, session, stored, sizeof(stored));
  if (rc) {
    ret = rc == MUSTER_E_NOT_FOUND
              ? api_respond_error(c, rc, "session", "there is no session %.80s", session)
              : api_respond_error(c, MUSTER_E_INVALID, "session",
                                  "session must be 1 to 64 letters, digits, '_', '.' or '-'");
    goto out;
  }
  session = stored;
  /* The run ends when its holder's part of the session's lease does: a
   * client that dies never leaves it running. */
  holder = json_string_value(json_object_get(body, "holder"));
  if (!validate_name(holder)) {
    ret = api_respond_error(c, MUSTER_E_INVALID, "holder",
                            "holder is required: the id (1 to 64 letters, digits, '_', '.' or "
                            "'-') under which the client holds a part of the session's lease; "
                            "the run ends when that part does");
    goto out;
  }
  v = json_object_get(body, "max_restarts");
  if (v && !json_is_null(v)) {
    if (!json_is_integer(v) || json_integer_value(v) < 0 ||
        json_integer_value(v) > RUN_MAX_RESTARTS) {
      ret = api_respond_error(c, MUSTER_E_INVALID, "max_restarts",
                              "max_restarts must be an integer from 0 to %d", RUN_MAX_RESTARTS);
      goto out;
    }
    max_restarts = (int)json_integer_value(v);
  }
  workers = json_object_get(body, "workers");
  if (workers && !json_is_null(workers) &&
      (!json_is_array(workers) || json_array_size(workers) > LAUNCH_MAX_N * 4)) {
    ret = api_respond_error(c, MUSTER_E_INVALID, "workers",
                            "workers must be an array of at most %d worker ids", LAUNCH_MAX_N * 4);
    goto out;
  }
  /* Each named worker must exist, be of the session, and be in no run. */
  rc = first_repeat(workers, &i);
  if (rc < 0) {
    ret = api_respond_error(c, MUSTER_E_NOMEM, "workers", "out of memory checking the workers");
    goto out;
  }
  if (rc) {
    ret = api_respond_error(c, MUSTER_E_INVALID, "workers", "workers[%zu] names %.40s again", i,
                            json_string_value(json_array_get(workers, i)));
    goto out;
  }
  rd = api_reader_get();
  json_array_foreach(workers, i, item) {
    const char *wid = json_string_value(item);
    json_t *w = validate_worker_id(wid) && api_sees_worker(rq, rd, wid)
                    ? db_worker_json(rd->db, wid)
                    : NULL;
    const char *why = !validate_worker_id(wid) ? "is not a worker id"
                      : !w                     ? "is no worker"
                      : strcmp(json_string_value(json_object_get(w, "session")), session) != 0
                          ? "is of another session"
                      : !json_is_null(json_object_get(w, "run")) ? "belongs to another run"
                                                                 : NULL;
    json_decref(w);
    if (why) {
      api_reader_put(rd);
      ret = api_respond_error(c, MUSTER_E_INVALID, "workers", "workers[%zu] (%.40s) %s", i,
                              wid ? wid : "?", why);
      goto out;
    }
  }
  api_reader_put(rd);
  command = json_dumps(json_object_get(body, "command"), JSON_COMPACT);
  memcpy(id, "r-", 2);
  if (!command || util_random_alnum(id + 2, 10) != 0) {
    ret = api_respond_error(c, MUSTER_E_INTERNAL, NULL, "could not make the run's id");
    goto out;
  }

  state_lock();
  if (!lease_held_locked(session, holder)) {
    state_unlock();
    ret = api_respond_error(c, MUSTER_E_CONFLICT, "holder",
                            "holder %s holds no part of session %s's lease: take one first (PUT "
                            "/api/v1/sessions/%s/lease with this holder)",
                            holder, session, session);
    goto out;
  }
  rc = db_begin(g.db);
  if (!rc)
    rc = db_session_touch(g.db, session, NULL);
  if (!rc) {
    struct db_run_new r = {id, session, mode, command, holder, max_restarts};
    rc = db_run_insert(g.db, &r);
  }
  json_array_foreach(workers, i, item) if (!rc) rc =
      db_worker_set_run(g.db, json_string_value(item), id);
  /* Claimed by another run (or pruned) since it was checked. */
  if (rc == MUSTER_E_CONFLICT) {
    db_rollback(g.db);
    state_unlock();
    ret = api_respond_error(c, rc, "workers",
                            "a worker it names joined another run meanwhile; no run was recorded");
    goto out;
  }
  if (!rc)
    rc = db_commit(g.db);
  if (rc) {
    LOG(LOG_ERROR, "could not store a run: %s", db_errmsg(g.db));
    db_rollback(g.db);
  }
  state_unlock();
  if (rc) {
    ret = api_respond_error(c, MUSTER_E_DB, NULL, "the run could not be stored");
    goto out;
  }
  rd = api_reader_get();
  run = db_run_json(rd->db, id, 1);
  api_reader_put(rd);
  LOG(LOG_INFO, "run %s (%s) recorded in session %s", id, mode, session);
  ret = run ? api_respond_json(c, MHD_HTTP_CREATED, run)
            : api_respond_error(c, MUSTER_E_DB, NULL, "could not read the run back");
out:
  free(command);
  json_decref(body);
  return ret;
}

/* ---- GET /api/v1/runs, GET /api/v1/runs/{id} ---- */

static json_t *run_read(const char *id) {
  struct reader *rd = api_reader_get();
  json_t *o = db_run_json(rd->db, id, 1);

  api_reader_put(rd);
  return o;
}

static enum MHD_Result api_run_get(struct MHD_Connection *c, struct req *rq, const char *id) {
  json_t *o = validate_run_id(id) && api_sees_run(rq, id) ? run_read(id) : NULL;

  if (!o)
    return api_respond_error(c, MUSTER_E_NOT_FOUND, "id", "there is no run %.40s", id);
  return api_respond_json(c, MHD_HTTP_OK, o);
}

static enum MHD_Result api_runs_list(struct MHD_Connection *c, struct req *rq, const char *arg) {
  (void)arg;
  const char *session = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "session");
  char stored[SESSION_STORED_MAX], own[USER_NAME_MAX + 2];
  const char *prefix = api_own_prefix(rq, own, sizeof(own));
  const char *status = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "status");
  char(*ids)[16];
  struct reader *rd;
  json_t *runs;
  enum MHD_Result ret;
  int64_t before, next;
  int limit, n = 0, rc;

  if (api_page_params(c, &limit, &before, &ret) != 0)
    return ret;
  if (session) {
    rc = api_session_scope(rq, session, stored, sizeof(stored));
    if (rc == MUSTER_E_INVALID)
      return api_respond_error(c, rc, "session", "\"%.80s\" is not a session's name", session);
    session = rc ? "/" : stored; /* another user's session: none of its runs */
  }
  if (status && strcmp(status, "running") != 0 && strcmp(status, "succeeded") != 0 &&
      strcmp(status, "failed") != 0 && strcmp(status, "stopped") != 0)
    return api_respond_error(c, MUSTER_E_INVALID, "status",
                             "status must be running, succeeded, failed or stopped");
  ids = calloc((size_t)limit, sizeof(*ids));
  if (!ids)
    return api_respond_error(c, MUSTER_E_NOMEM, NULL, NULL);
  runs = json_array();
  rd = api_reader_get();
  rc = db_run_page(rd->db, session, prefix, status, before, limit, ids, &n, &next);
  for (int i = 0; !rc && i < n; i++) {
    json_t *o = db_run_json(rd->db, ids[i], 0);
    if (o)
      json_array_append_new(runs, o);
  }
  api_reader_put(rd);
  free(ids);
  if (rc) {
    json_decref(runs);
    return api_respond_error(c, MUSTER_E_DB, NULL, "could not list runs");
  }
  return api_respond_json(c, MHD_HTTP_OK,
                          json_pack("{s:o, s:o}", "runs", runs, "next",
                                    next ? json_sprintf("%lld", (long long)next) : json_null()));
}

/* ---- POST /api/v1/runs/{id}/restarts, POST /api/v1/runs/{id}/end ---- */

/* Answers a change of run id that rc tells about: the run now, or why not. */
static MUST_CHECK enum MHD_Result run_changed(struct MHD_Connection *c, const char *id, int rc,
                                              const char *conflict) {
  json_t *o;

  if (rc == MUSTER_E_NOT_FOUND)
    return api_respond_error(c, rc, "id", "there is no run %s", id);
  if (rc == MUSTER_E_CONFLICT) {
    enum MHD_Result r;
    const char *st;

    o = run_read(id);
    st = json_string_value(json_object_get(o, "status"));
    if (st && strcmp(st, "running") != 0)
      r = api_respond_error(c, rc, "status", "run %s has ended (%s)", id, st);
    else
      r = api_respond_error(c, rc, NULL, "%s", conflict);
    json_decref(o);
    return r;
  }
  if (rc)
    return api_respond_error(c, rc, NULL, "could not change run %s", id);
  o = run_read(id);
  return o ? api_respond_json(c, MHD_HTTP_OK, o)
           : api_respond_error(c, MUSTER_E_DB, NULL, "could not read run %s back", id);
}

static enum MHD_Result api_run_restart(struct MHD_Connection *c, struct req *rq, const char *id) {
  static const char *const known[] = {"cause"};
  json_t *body;
  const char *cause;
  enum MHD_Result ret = MHD_NO;
  char msg[160];
  int rc;

  body = run_change_body(c, rq, id, known, 1, "cause", &ret);
  if (!body)
    return ret;
  cause = json_string_value(json_object_get(body, "cause"));
  if (!cause || !*cause || strlen(cause) > 4096) {
    ret = api_respond_error(c, MUSTER_E_INVALID, "cause",
                            "cause is required: a sentence of at most 4096 characters");
    goto out;
  }
  state_lock();
  rc = db_run_restart(g.db, id, cause);
  state_unlock();
  snprintf(msg, sizeof(msg), "run %s has used all of its restarts (max_restarts)", id);
  ret = run_changed(c, id, rc, msg);
out:
  json_decref(body);
  return ret;
}

static enum MHD_Result api_run_stall(struct MHD_Connection *c, struct req *rq, const char *id) {
  static const char *const known[] = {"report"};
  json_t *body;
  const char *report;
  enum MHD_Result ret = MHD_NO;
  int rc;

  body = run_change_body(c, rq, id, known, 1, "report", &ret);
  if (!body)
    return ret;
  report = json_string_value(json_object_get(body, "report"));
  if (!report || !*report || strlen(report) > 16384) {
    ret = api_respond_error(c, MUSTER_E_INVALID, "report",
                            "report is required: text of at most 16 KiB");
    goto out;
  }
  state_lock();
  rc = db_run_stall(g.db, id, report);
  state_unlock();
  if (!rc)
    LOG(LOG_WARN, "run %s stalled", id);
  ret = run_changed(c, id, rc, "the run holds 20 stall reports already");
out:
  json_decref(body);
  return ret;
}

static enum MHD_Result api_run_end(struct MHD_Connection *c, struct req *rq, const char *id) {
  static const char *const known[] = {"status", "summary", "failure"};
  json_t *body, *summary;
  const char *status, *failure;
  char *summary_text = NULL;
  enum MHD_Result ret = MHD_NO;
  int rc;

  body = run_change_body(c, rq, id, known, 3, "status, summary, failure", &ret);
  if (!body)
    return ret;
  status = json_string_value(json_object_get(body, "status"));
  if (!status || (strcmp(status, "succeeded") != 0 && strcmp(status, "failed") != 0 &&
                  strcmp(status, "stopped") != 0)) {
    ret = api_respond_error(c, MUSTER_E_INVALID, "status",
                            "status must be succeeded, failed or stopped");
    goto out;
  }
  failure = json_string_value(json_object_get(body, "failure"));
  if (json_object_get(body, "failure") && !json_is_null(json_object_get(body, "failure")) &&
      (!failure || strlen(failure) > 16384)) {
    ret = api_respond_error(c, MUSTER_E_INVALID, "failure",
                            "failure must be a string of at most 16384 characters");
    goto out;
  }
  summary = json_object_get(body, "summary");
  if (summary && !json_is_null(summary)) {
    summary_text = json_dumps(summary, JSON_COMPACT | JSON_ENCODE_ANY);
    if (!summary_text || strlen(summary_text) > 65536) {
      ret = api_respond_error(c, MUSTER_E_INVALID, "summary",
                              "summary must be JSON of at most 64 KiB");
      goto out;
    }
  }
  state_lock();
  rc = db_run_end(g.db, id, status, summary_text, failure);
  if (!rc)
    streams_wake_logs_locked(id); /* its metrics' followers end */
  state_unlock();
  if (!rc)
    LOG(LOG_INFO, "run %s ended: %s", id, status);
  ret = run_changed(c, id, rc, "the run has ended");
out:
  free(summary_text);
  json_decref(body);
  return ret;
}

/* The routes of this file (api_routes.c lists the table). */
const struct api_route api_runs_routes[] = {
    {"POST", "/api/v1/runs", AUTH_CLIENT, api_run_create, NULL},
    {"GET", "/api/v1/runs", AUTH_CLIENT, api_runs_list, NULL},
    {"GET", "/api/v1/runs/{run}", AUTH_CLIENT, api_run_get, NULL},
    {"POST", "/api/v1/runs/{run}/restarts", AUTH_CLIENT, api_run_restart, NULL},
    {"POST", "/api/v1/runs/{run}/stalls", AUTH_CLIENT, api_run_stall, NULL},
    {"POST", "/api/v1/runs/{run}/end", AUTH_CLIENT, api_run_end, NULL},
    {NULL, NULL, AUTH_NONE, NULL, NULL},
};
