/* users.c: who this client is (GET /api/v1/whoami), and the users of the
 * controller, which administrators manage (docs/design.md, "Users"). Each
 * call hands back the controller's JSON answer as text. */
#include "client_internal.h"
#include "muster.h"

#include <curl/curl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void muster_user_opts_init(muster_user_opts *o) {
  memset(o, 0, sizeof(*o));
  o->max_cpu = o->max_memory = -1;
  o->max_gpus = o->max_workers = -1;
}

/* method path (body: taken, or NULL) into *json as compact text. */
static int call_text(muster_client *c, const char *method, const char *path, json_t *body,
                     char **json) {
  json_t *ans = NULL;
  int rc = muster_json_call_(c, method, path, body, &ans);

  *json = NULL;
  if (rc)
    return rc;
  *json = json_dumps(ans ? ans : json_null(), JSON_COMPACT | JSON_ENCODE_ANY);
  json_decref(ans);
  return *json ? 0 : muster_set_errorf_(c, MUSTER_E_NOMEM, NULL, "out of memory");
}

/* /api/v1/users/NAME[suffix] into path (name escaped). */
static int user_path(muster_client *c, const char *name, const char *suffix, char *path,
                     size_t size) {
  char *esc = name && *name ? curl_easy_escape(NULL, name, 0) : NULL;
  int n;

  if (!esc)
    return muster_set_errorf_(c, MUSTER_E_INVALID, "name", "no user name given");
  n = snprintf(path, size, "/api/v1/users/%s%s", esc, suffix);
  curl_free(esc);
  if (n < 0 || (size_t)n >= size)
    return muster_set_errorf_(c, MUSTER_E_INVALID, "name", "the user name is too long");
  return 0;
}

int muster_whoami(muster_client *c, char **json) {
  return call_text(c, "GET", "/api/v1/whoami", NULL, json);
}

int muster_users_list(muster_client *c, char **json) {
  return call_text(c, "GET", "/api/v1/users", NULL, json);
}

/* A limit: null below 0. */
static json_t *limit(double v, int whole) {
  return v < 0 ? json_null() : whole ? json_integer((json_int_t)v) : json_real(v);
}

int muster_user_add(muster_client *c, const char *name, const muster_user_opts *o, char **json) {
  muster_user_opts none;
  json_t *body;

  if (!o) {
    muster_user_opts_init(&none);
    o = &none;
  }
  body = json_pack("{s:s, s:b, s:o, s:o, s:o, s:o, s:o}", "name", name ? name : "", "admin",
                   o->admin, "unix_user", o->unix_user ? json_string(o->unix_user) : json_null(),
                   "max_cpu", limit(o->max_cpu, 0), "max_memory", limit(o->max_memory, 0),
                   "max_gpus", limit(o->max_gpus, 1), "max_workers", limit(o->max_workers, 1));
  if (!body)
    return muster_set_errorf_(c, MUSTER_E_NOMEM, NULL, "out of memory");
  return call_text(c, "POST", "/api/v1/users", body, json);
}

int muster_user_get(muster_client *c, const char *name, char **json) {
  char path[300];
  int rc = user_path(c, name, "", path, sizeof(path));

  return rc ? rc : call_text(c, "GET", path, NULL, json);
}

int muster_user_token(muster_client *c, const char *name, char **json) {
  char path[300];
  int rc = user_path(c, name, "/token", path, sizeof(path));

  return rc ? rc : call_text(c, "POST", path, NULL, json);
}

int muster_user_remove(muster_client *c, const char *name, int stop, char **json) {
  char path[300];
  int rc = user_path(c, name, stop ? "?stop=1" : "", path, sizeof(path));

  return rc ? rc : call_text(c, "DELETE", path, NULL, json);
}
