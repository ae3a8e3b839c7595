/* api_users.c: who a call comes from (GET /api/v1/whoami), and the users
 * themselves for administrators (POST, GET, DELETE /api/v1/users...,
 * POST /api/v1/users/{name}/token), as `muster-controller user` manages
 * them (user_cmd.c) on the same rows (db_users.c). */
#include "api_internal.h"

#include "muster_errors.h"
#include "state.h"
#include "users.h"

#include <stdlib.h>
#include <string.h>

/* {"user", "admin", "run_as"}: run_as, the account the caller's workers
 * run as (their unix_user, else --run-as; null: the controller's own). */
static enum MHD_Result api_whoami(struct MHD_Connection *c, struct req *rq, const char *arg) {
  char run_as[sizeof(g.cfg.run_as) > sizeof(((struct db_user *)0)->unix_user)
                  ? sizeof(g.cfg.run_as)
                  : sizeof(((struct db_user *)0)->unix_user)];
  struct db_user u;
  int rc = 0;

  (void)arg;
  snprintf(run_as, sizeof(run_as), "%s", g.cfg.run_as);
  if (rq->who.name[0]) {
    state_lock();
    rc = db_user_get(g.db, rq->who.name, &u);
    state_unlock();
    if (rc == 0 && u.unix_user[0])
      snprintf(run_as, sizeof(run_as), "%s", u.unix_user);
  }
  if (rc != 0 && rc != MUSTER_E_NOT_FOUND)
    return api_respond_error(c, rc, NULL, NULL);
  return api_respond_json(
      c, MHD_HTTP_OK,
      json_pack("{s:s, s:b, s:o}", "user", rq->who.name[0] ? rq->who.name : USER_BOOTSTRAP, "admin",
                rq->who.admin, "run_as", run_as[0] ? json_string(run_as) : json_null()));
}

/* A limit as JSON: null where there is none. */
static json_t *limit_json(double v, int whole) {
  return v < 0 ? json_null() : whole ? json_integer((json_int_t)v) : json_real(v);
}

/* The user object: {"name", "admin", "unix_user", "max_cpu", "max_memory",
 * "max_gpus", "max_workers", "created_at", "live_workers"}. */
static json_t *user_json(const struct db_user *u, long live) {
  return json_pack("{s:s, s:b, s:s?, s:o, s:o, s:o, s:o, s:s, s:I}", "name", u->name, "admin",
                   u->admin, "unix_user", u->unix_user[0] ? u->unix_user : NULL, "max_cpu",
                   limit_json(u->max_cpu, 0), "max_memory", limit_json(u->max_memory, 0),
                   "max_gpus", limit_json((double)u->max_gpus, 1), "max_workers",
                   limit_json((double)u->max_workers, 1), "created_at", u->created_at,
                   "live_workers", (json_int_t)live);
}

static enum MHD_Result not_admin(struct MHD_Connection *c) {
  return api_respond_error(c, MUSTER_E_FORBIDDEN, NULL, "only administrators manage users");
}

/* A limit field of body into *out (-1: absent or null). 0, or 1 with a 422
 * queued through *ret. */
static int body_limit(struct MHD_Connection *c, json_t *body, const char *key, int whole,
                      double *out, enum MHD_Result *ret) {
  json_t *v = json_object_get(body, key);

  *out = -1;
  if (!v || json_is_null(v))
    return 0;
  if (!json_is_number(v) || json_number_value(v) < 0 || json_number_value(v) > 1e9 ||
      (whole && !json_is_integer(v))) {
    *ret = api_respond_error(c, MUSTER_E_INVALID, key, "%s must be a %snumber >= 0 (or null)", key,
                             whole ? "whole " : "");
    return 1;
  }
  *out = json_number_value(v);
  return 0;
}

static enum MHD_Result api_user_add(struct MHD_Connection *c, struct req *rq, const char *arg) {
  static const char *const known[] = {"name",       "admin",    "unix_user",  "max_cpu",
                                      "max_memory", "max_gpus", "max_workers"};
  char token[USER_TOKEN_LEN + 1];
  enum MHD_Result ret = MHD_NO;
  json_t *body, *v;
  struct db_user u;
  double gpus, workers;
  int rc = USER_PREFIX_TAKEN;

  (void)arg;
  if (!rq->who.admin)
    return not_admin(c);
  if (!(body = api_parse_body(c, rq, &ret)))
    return ret;
  memset(&u, 0, sizeof(u));
  if (!api_known_fields(c, body, known, sizeof(known) / sizeof(known[0]),
                        "name, admin, unix_user, max_cpu, max_memory, max_gpus, max_workers", &ret))
    goto out;
  v = json_object_get(body, "name");
  if (!json_is_string(v) || !user_name_ok(json_string_value(v))) {
    ret = api_respond_error(c, MUSTER_E_INVALID, "name",
                            "name must be 1 to 32 of a-z, 0-9, _ and -, starting with a letter "
                            "(and not \"" USER_BOOTSTRAP "\")");
    goto out;
  }
  snprintf(u.name, sizeof(u.name), "%s", json_string_value(v));
  v = json_object_get(body, "admin");
  if (v && !json_is_boolean(v)) {
    ret = api_respond_error(c, MUSTER_E_INVALID, "admin", "admin must be true or false");
    goto out;
  }
  u.admin = json_is_true(v);
  v = json_object_get(body, "unix_user");
  if (v && !json_is_null(v) && !json_is_string(v)) {
    ret = api_respond_error(c, MUSTER_E_INVALID, "unix_user", "unix_user must be an account name");
    goto out;
  }
  if (json_is_string(v)) {
    char why[200];
    if (user_unix_ok(json_string_value(v), why, sizeof(why)) != 0) {
      ret = api_respond_error(c, MUSTER_E_INVALID, "unix_user", "unix_user: %s", why);
      goto out;
    }
  }
  if (json_is_string(v))
    snprintf(u.unix_user, sizeof(u.unix_user), "%s", json_string_value(v));
  if (body_limit(c, body, "max_cpu", 0, &u.max_cpu, &ret) ||
      body_limit(c, body, "max_memory", 0, &u.max_memory, &ret) ||
      body_limit(c, body, "max_gpus", 1, &gpus, &ret) ||
      body_limit(c, body, "max_workers", 1, &workers, &ret))
    goto out;
  u.max_gpus = (long)gpus;
  u.max_workers = (long)workers;
  state_lock();
  for (int tries = 0; rc == USER_PREFIX_TAKEN && tries < 4; tries++)
    rc =
        user_token_new(token, u.token_prefix, u.token_sha256) ? MUSTER_E_IO : db_user_add(g.db, &u);
  if (!rc)
    rc = db_user_get(g.db, u.name, &u);
  state_unlock();
  if (rc == MUSTER_E_CONFLICT)
    ret = api_respond_error(c, rc, "name",
                            "the name %s is taken (by a user, or by one removed: a name is never "
                            "given to another)",
                            u.name);
  else if (rc)
    ret = api_respond_error(c, rc, NULL, "could not add the user");
  else
    ret = api_respond_json(c, MHD_HTTP_CREATED,
                           json_pack("{s:o, s:s}", "user", user_json(&u, 0), "token", token));
  explicit_bzero(token, sizeof(token));
out:
  json_decref(body);
  return ret;
}

/* The users list's lines, gathered. */
static void add_user(void *arg, const struct db_user *u) {
  json_array_append_new(arg, user_json(u, -1));
}

static enum MHD_Result api_users_list(struct MHD_Connection *c, struct req *rq, const char *arg) {
  json_t *list = json_array(), *u;
  size_t i;
  int rc;

  (void)arg;
  if (!rq->who.admin) {
    json_decref(list);
    return not_admin(c);
  }
  state_lock();
  rc = db_user_each(g.db, add_user, list);
  json_array_foreach(list, i, u) {
    long live = 0;
    if (!rc)
      rc = db_user_live_workers(g.db, json_string_value(json_object_get(u, "name")), &live);
    json_object_set_new(u, "live_workers", json_integer(live));
  }
  state_unlock();
  if (rc) {
    json_decref(list);
    return api_respond_error(c, rc, NULL, "could not list the users");
  }
  return api_respond_json(c, MHD_HTTP_OK, json_pack("{s:o}", "users", list));
}

static enum MHD_Result api_user_get(struct MHD_Connection *c, struct req *rq, const char *name) {
  struct db_user u;
  long live = 0;
  int rc;

  if (!rq->who.admin && strcmp(rq->who.name, name) != 0)
    return api_respond_error(c, MUSTER_E_NOT_FOUND, NULL, "there is no user %.40s", name);
  state_lock();
  rc = db_user_get(g.db, name, &u);
  if (!rc && u.removed)
    rc = MUSTER_E_NOT_FOUND;
  if (!rc)
    rc = db_user_live_workers(g.db, name, &live);
  state_unlock();
  if (rc)
    return api_respond_error(
        c, rc, NULL,
        rc == MUSTER_E_NOT_FOUND ? "there is no user %.40s" : "could not read user %.40s", name);
  return api_respond_json(c, MHD_HTTP_OK, user_json(&u, live));
}

static enum MHD_Result api_user_token(struct MHD_Connection *c, struct req *rq, const char *name) {
  char token[USER_TOKEN_LEN + 1], prefix[USER_PREFIX_LEN + 1], sha[65];
  enum MHD_Result ret;
  int rc = USER_PREFIX_TAKEN;

  if (!rq->who.admin)
    return not_admin(c);
  state_lock();
  for (int tries = 0; rc == USER_PREFIX_TAKEN && tries < 4; tries++)
    rc = user_token_new(token, prefix, sha) ? MUSTER_E_IO
                                            : db_user_set_token(g.db, name, prefix, sha);
  state_unlock();
  if (rc)
    ret = api_respond_error(c, rc, NULL,
                            rc == MUSTER_E_NOT_FOUND ? "there is no user %.40s"
                                                     : "could not change the token of %.40s",
                            name);
  else
    ret = api_respond_json(c, MHD_HTTP_OK, json_pack("{s:s}", "token", token));
  explicit_bzero(token, sizeof(token));
  return ret;
}

/* sm_stop_many_with_locked()'s: the user goes in the stops' transaction. */
static int remove_also(void *name) {
  return db_user_remove(g.db, name);
}

/* ?stop=1: the user's live workers (the ones they launched: what the
 * removal counts) are stopped and the user removed, in one transaction. */
static int stop_and_remove_locked(const struct req *rq, const char *name) {
  char(*ids)[16], detail[120];
  int n, rc = db_user_live_ids(g.db, name, &ids, &n);

  if (rc)
    return rc;
  snprintf(detail, sizeof(detail), "stopped by %s: user %s removed",
           rq->who.name[0] ? rq->who.name : USER_BOOTSTRAP, name);
  rc = sm_stop_many_with_locked(ids, n, detail, NULL, remove_also, (void *)name);
  free(ids);
  return rc;
}

static enum MHD_Result api_user_remove(struct MHD_Connection *c, struct req *rq, const char *name) {
  const char *stop = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "stop");
  long live = 0;
  int rc;

  if (!rq->who.admin)
    return not_admin(c);
  if (stop && strcmp(stop, "1") != 0 && strcmp(stop, "0") != 0)
    return api_respond_error(c, MUSTER_E_INVALID, "stop", "stop must be 1 or 0");
  state_lock();
  rc = stop && strcmp(stop, "1") == 0 && user_name_ok(name) ? stop_and_remove_locked(rq, name)
                                                            : db_user_remove(g.db, name);
  if (rc == MUSTER_E_CONFLICT && db_user_live_workers(g.db, name, &live) != 0)
    live = -1;
  state_unlock();
  if (rc == MUSTER_E_CONFLICT)
    return api_respond_error(c, rc, NULL,
                             "%.40s has %ld live worker%s: stop them first, or remove with ?stop=1",
                             name, live, live == 1 ? "" : "s");
  if (rc)
    return api_respond_error(
        c, rc, NULL,
        rc == MUSTER_E_NOT_FOUND ? "there is no user %.40s" : "could not remove user %.40s", name);
  return api_respond_json(c, MHD_HTTP_OK, json_pack("{s:s}", "removed", name));
}

/* The routes of this file (api_routes.c lists the table). */
const struct api_route api_users_routes[] = {
    {"GET", "/api/v1/whoami", AUTH_CLIENT, api_whoami, NULL},
    {"POST", "/api/v1/users", AUTH_CLIENT, api_user_add, NULL},
    {"GET", "/api/v1/users", AUTH_CLIENT, api_users_list, NULL},
    {"GET", "/api/v1/users/{name}", AUTH_CLIENT, api_user_get, NULL},
    {"POST", "/api/v1/users/{name}/token", AUTH_CLIENT, api_user_token, NULL},
    {"DELETE", "/api/v1/users/{name}", AUTH_CLIENT, api_user_remove, NULL},
    {NULL, NULL, AUTH_NONE, NULL, NULL},
};
