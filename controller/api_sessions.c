/* api_sessions.c: sessions: their leases (PUT and DELETE
 * /api/v1/sessions/{name}/lease), the session list and one session (see
 * api_internal.h and docs/design.md). */
#include "api_internal.h"
#include "api_scope.h"
#include "lease.h"
#include "muster_errors.h"
#include "session_name.h"
#include "state.h"
#include "validate.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static MUST_CHECK enum MHD_Result bad_session_name(struct MHD_Connection *c, const char *name) {
  return api_respond_error(c, MUSTER_E_NOT_FOUND, "name",
                           "\"%.64s\" is not a session name (1 to 64 letters, digits, '_', '.' "
                           "or '-')",
                           name);
}

/* ---- PUT / DELETE /api/v1/sessions/{name}/lease ---- */

static MUST_CHECK enum MHD_Result bad_holder(struct MHD_Connection *c, const char *holder) {
  return api_respond_error(c, MUSTER_E_INVALID, "holder",
                           "\"%.64s\" is not a holder id (1 to 64 letters, digits, '_', '.' or "
                           "'-', naming the client that holds the lease)",
                           holder);
}

static enum MHD_Result api_lease_put(struct MHD_Connection *c, struct req *rq, const char *name) {
  static const char *const known[] = {"ttl_seconds", "holder", "stop_workers"};
  json_t *body = NULL, *v, *lease;
  enum MHD_Result ret = MHD_NO;
  const char *holder = LEASE_HOLDER_DEFAULT;
  double ttl = 30;
  struct lease_put put;
  int rc, stop_workers = 1;

  /* PUT makes the session if it is new: a bad name is a bad value. */
  char stored[SESSION_STORED_MAX];
  rc = api_session_scope(rq, name, stored, sizeof(stored));
  if (rc == MUSTER_E_NOT_FOUND)
    return api_respond_error(c, rc, "name", "there is no session %.80s", name);
  if (rc)
    return api_respond_error(c, MUSTER_E_INVALID, "name",
                             "\"%.64s\" is not a session name (1 to 64 letters, digits, '_', '.' "
                             "or '-')",
                             name);
  name = stored;
  if (rq->len) {
    body = api_parse_body(c, rq, &ret);
    if (!body)
      return ret;
    if (!api_known_fields(c, body, known, 3, "ttl_seconds, holder, stop_workers", &ret))
      goto out;
  }
  v = json_object_get(body, "ttl_seconds");
  if (v && !json_is_null(v)) {
    if (!json_is_number(v) || json_number_value(v) < LEASE_TTL_MIN ||
        json_number_value(v) > LEASE_TTL_MAX) {
      ret = api_respond_error(c, MUSTER_E_INVALID, "ttl_seconds",
                              "ttl_seconds must be a number from %.0f to %.0f (seconds)",
                              LEASE_TTL_MIN, LEASE_TTL_MAX);
      goto out;
    }
    ttl = json_number_value(v);
  }
  v = json_object_get(body, "holder");
  if (v && !json_is_null(v)) {
    holder = json_string_value(v);
    if (!validate_name(holder)) {
      ret = bad_holder(c, holder ? holder : "(not a string)");
      goto out;
    }
  }
  v = json_object_get(body, "stop_workers");
  if (v && !json_is_null(v)) {
    if (!json_is_boolean(v)) {
      ret = api_respond_error(c, MUSTER_E_INVALID, "stop_workers",
                              "stop_workers must be true (the part keeps the session's workers) "
                              "or false (it binds only its holder's runs)");
      goto out;
    }
    stop_workers = json_is_true(v);
  }
  state_lock();
  if (g.shutting_down) {
    state_unlock();
    ret = api_respond_error(c, MUSTER_E_SHUTTING_DOWN, NULL, NULL);
    goto out;
  }
  rc = lease_put_locked(name, holder, ttl, stop_workers, &put);
  lease = rc ? NULL : lease_json_locked(name);
  state_unlock();
  if (rc == MUSTER_E_CONFLICT && put.session_full)
    ret = api_respond_error(c, rc, "holder",
                            "%d holders hold a part of session %s's lease already; one must give "
                            "its part back first",
                            LEASE_HOLDERS_MAX, name);
  else if (rc == MUSTER_E_CONFLICT)
    ret = api_respond_error(c, rc, NULL, "%d sessions hold a lease already; give one back first",
                            LEASE_MAX);
  else if (rc)
    ret = api_respond_error(c, rc, NULL, "could not store the lease of session %s", name);
  else {
    /* 201: this holder held no part (a first PUT, or a renewal that came
     * after its part had run out: "previous" says which, and whether the
     * session's workers were stopped then). */
    json_object_set_new(lease, "session", json_string(name));
    json_object_set_new(lease, "holder", json_string(holder));
    if (put.created) {
      json_object_set_new(lease, "previous", json_string(put.expired ? "expired" : "none"));
      json_object_set_new(lease, "workers_stopped", json_boolean(put.workers_stopped));
    }
    ret = api_respond_json(c, put.created ? MHD_HTTP_CREATED : MHD_HTTP_OK, lease);
  }
out:
  json_decref(body);
  return ret;
}

static enum MHD_Result api_lease_delete(struct MHD_Connection *c, struct req *rq,
                                        const char *name) {
  const char *holder = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "holder");
  const char *stop = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "stop_workers");
  json_t *lease;
  int rc, stopped;
  char stored[SESSION_STORED_MAX];

  rc = api_session_scope(rq, name, stored, sizeof(stored));
  if (rc == MUSTER_E_NOT_FOUND)
    return api_respond_error(c, rc, "name", "there is no session %.80s", name);
  if (rc)
    return bad_session_name(c, name);
  name = stored;
  if (!holder)
    holder = LEASE_HOLDER_DEFAULT;
  if (!validate_name(holder))
    return bad_holder(c, holder);
  if (stop && strcmp(stop, "0") != 0 && strcmp(stop, "1") != 0)
    return api_respond_error(c, MUSTER_E_INVALID, "stop_workers",
                             "stop_workers must be 1 (stop the session's workers unless another "
                             "holder keeps them) or 0");
  state_lock();
  rc = lease_drop_locked(name, holder, stop && strcmp(stop, "1") == 0, &stopped);
  lease = rc ? NULL : lease_json_locked(name);
  state_unlock();
  if (rc == MUSTER_E_NOT_FOUND)
    return api_respond_error(c, rc, "holder", "holder %s holds no part of session %s's lease",
                             holder, name);
  if (rc)
    return api_respond_error(c, rc, NULL, "could not give back the lease of session %s", name);
  /* lease: what the other holders still hold (null: nobody); stopped: how
   * many workers stop_workers stopped (null: others keep them, or not
   * asked). */
  return api_respond_json(c, MHD_HTTP_OK,
                          json_pack("{s:s, s:s, s:o, s:o}", "session", name, "holder", holder,
                                    "lease", lease, "stopped",
                                    stopped >= 0 ? json_integer(stopped) : json_null()));
}

/* ---- GET /api/v1/sessions ---- */

struct session_list {
  json_t *by_name; /* name -> {"name", "live_workers", "lease"} */
};

static json_t *session_entry(struct session_list *sl, const char *name) {
  json_t *o = json_object_get(sl->by_name, name);

  if (!o) {
    o = json_pack("{s:s, s:i, s:n}", "name", name, "live_workers", 0, "lease");
    json_object_set_new(sl->by_name, name, o);
  }
  return o;
}

static void add_lease(void *arg, const char *session, double ttl, double left, int stops) {
  (void)ttl;
  (void)left;
  (void)stops;
  json_object_set_new(session_entry(arg, session), "lease", lease_json_locked(session));
}

static enum MHD_Result api_sessions(struct MHD_Connection *c, struct req *rq, const char *arg) {
  (void)arg;
  struct session_list sl = {json_object()};
  json_t *out = json_array(), *v;
  const char *key;

  state_lock();
  for (struct lw *w = g.head; w; w = w->next) {
    json_t *o;
    if (!api_sees_session(rq, w->session))
      continue;
    o = session_entry(&sl, w->session);
    json_object_set_new(o, "live_workers",
                        json_integer(json_integer_value(json_object_get(o, "live_workers")) + 1));
  }
  leases_each_locked(add_lease, &sl);
  state_unlock();
  json_object_foreach(sl.by_name, key, v) {
    if (api_sees_session(rq, key))
      json_array_append(out, v);
  }
  json_decref(sl.by_name);
  return api_respond_json(c, MHD_HTTP_OK, json_pack("{s:o}", "sessions", out));
}

/* ---- GET /api/v1/sessions/{name} ---- */

static enum MHD_Result api_session(struct MHD_Connection *c, struct req *rq, const char *name) {
  struct reader *rd;
  json_t *o;
  char stored[SESSION_STORED_MAX];

  if (api_session_scope(rq, name, stored, sizeof(stored)) != 0)
    return api_respond_error(c, MUSTER_E_NOT_FOUND, "name", "there is no session %.80s", name);
  name = stored;
  rd = api_reader_get();
  o = db_session_json(rd->db, name);
  api_reader_put(rd);
  if (!o)
    return api_respond_error(c, MUSTER_E_NOT_FOUND, "name",
                             "there is no session %s (a session exists once it has launched)",
                             name);
  state_lock();
  json_object_set_new(o, "lease", lease_json_locked(name));
  state_unlock();
  return api_respond_json(c, MHD_HTTP_OK, o);
}

/* The routes of this file (api_routes.c lists the table). */
const struct api_route api_sessions_routes[] = {
    {"GET", "/api/v1/sessions", AUTH_CLIENT, api_sessions, NULL},
    {"GET", "/api/v1/sessions/{session}", AUTH_CLIENT, api_session, NULL},
    {"PUT", "/api/v1/sessions/{session}/lease", AUTH_CLIENT, api_lease_put, NULL},
    {"DELETE", "/api/v1/sessions/{session}/lease", AUTH_CLIENT, api_lease_delete, NULL},
    {NULL, NULL, AUTH_NONE, NULL, NULL},
};
