/* calls.c: the calls on workers (launch, get, list with its pages,
 * await, stop) and a session's exec token. */
#include "client_internal.h"
#include "muster.h"
#include "session_name.h"

#include <curl/curl.h>
#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

void muster_launch_opts_init(muster_launch_opts *o) {
  memset(o, 0, sizeof(*o));
  o->n = 1;
  o->cpu = 1;
  o->memory = 1;
  o->kernel = "python3";
}

static json_t *strv(const char *const *v, size_t n) {
  json_t *a = json_array();
  for (size_t i = 0; i < n; i++)
    json_array_append_new(a, json_string(v[i] ? v[i] : ""));
  return a;
}

/* "NAME=value" strings as a JSON object; NULL (with an error) if one has
 * no '='. */
static json_t *kv_object(muster_client *c, const char *what, const char *const *v, size_t n) {
  json_t *o = json_object();

  for (size_t i = 0; i < n; i++) {
    const char *eq = v[i] ? strchr(v[i], '=') : NULL;
    char key[257];
    if (!eq || eq == v[i] || (size_t)(eq - v[i]) >= sizeof(key)) {
      json_decref(o);
      muster_set_errorf_(c, MUSTER_E_INVALID, what, "%s entry \"%.60s\" is not NAME=value", what,
                         v[i] ? v[i] : "(null)");
      return NULL;
    }
    memcpy(key, v[i], (size_t)(eq - v[i]));
    key[eq - v[i]] = '\0';
    json_object_set_new(o, key, json_string(eq + 1));
  }
  return o;
}

/* Whether the environment variable name (MUSTER_SEND_CWD or
 * MUSTER_SEND_PATH) lets a launch send this process's cwd or PATH: any
 * value but "0". */
static int sends(const char *name) {
  const char *v = getenv(name);
  return !v || strcmp(v, "0") != 0;
}

/* This process's PATH without its empty and "." entries (which would
 * search the workers' cwd): a new string, or NULL if there is none. */
static char *client_path(void) {
  const char *p = getenv("PATH");
  char *out;
  size_t n = 0;

  if (!p || !(out = malloc(strlen(p) + 1)))
    return NULL;
  while (*p) {
    size_t len = strcspn(p, ":");
    if (len > 0 && !(len == 1 && p[0] == '.')) {
      if (n)
        out[n++] = ':';
      memcpy(out + n, p, len);
      n += len;
    }
    p += len + (p[len] == ':');
  }
  out[n] = '\0';
  return out;
}

/* Sets key (cwd or path) of a launch body req to v, unless v is NULL or
 * "". Returns 0, or an error set on c (v not UTF-8). */
static int set_where(muster_client *c, json_t *req, const char *key, const char *v) {
  if (!v || !*v)
    return 0;
  if (json_object_set_new(req, key, json_string(v)) != 0)
    return muster_set_errorf_(c, MUSTER_E_INVALID, key,
                              "%s is not UTF-8 text: give a %s that is (\"\": the %s)", key, key,
                              key[0] == 'c' ? "controller's --workdir" : "worker's own PATH");
  return 0;
}

/* Sets cwd and path of a launch body req from o: by default this
 * process's working directory and PATH (less its empty and "." entries),
 * unless MUSTER_SEND_CWD=0 / MUSTER_SEND_PATH=0. Returns 0, or an error
 * set on c. */
static int launch_where(muster_client *c, const muster_launch_opts *o, json_t *req) {
  char here[PATH_MAX], *own = NULL;
  const char *cwd = o->cwd, *path = o->path;
  int rc;

  if (!cwd && !sends("MUSTER_SEND_CWD"))
    cwd = "";
  if (!cwd) {
    if (!getcwd(here, sizeof(here)))
      return muster_set_errorf_(c, MUSTER_E_INVALID, "cwd",
                                "this process's working directory is unknown (%s): give cwd",
                                strerror(errno));
    cwd = here;
  }
  if (!path && sends("MUSTER_SEND_PATH"))
    path = own = client_path();
  rc = set_where(c, req, "cwd", cwd);
  if (rc == 0)
    rc = set_where(c, req, "path", path);
  free(own);
  return rc;
}

/* The launch body of o: a new object, or NULL with c's error set. */
static json_t *launch_body(muster_client *c, const muster_launch_opts *o) {
  json_t *req = json_object(), *env = NULL, *secret = NULL;

  if (!req)
    return NULL;
  if (launch_where(c, o, req) != 0) {
    json_decref(req);
    return NULL;
  }
  json_object_set_new(req, "n", json_integer(o->n));
  json_object_set_new(req, "cpu", json_real(o->cpu));
  json_object_set_new(req, "memory", json_real(o->memory));
  json_object_set_new(req, "nvidia_gpu", json_integer(o->nvidia_gpu));
  if (o->script)
    json_object_set_new(req, "script", json_string(o->script));
  if (o->code)
    json_object_set_new(req, "code", json_string(o->code));
  if (o->kernel)
    json_object_set_new(req, "kernel", json_string(o->kernel));
  if (o->ncommand)
    json_object_set_new(req, "command", strv(o->command, o->ncommand));
  if (o->nargs)
    json_object_set_new(req, "args", strv(o->args, o->nargs));
  if (o->role)
    json_object_set_new(req, "role", json_string(o->role));
  if (o->name)
    json_object_set_new(req, "name", json_string(o->name));
  if (o->session)
    json_object_set_new(req, "session", json_string(o->session));
  if (o->run)
    json_object_set_new(req, "run", json_string(o->run));
  if ((o->nenv && !(env = kv_object(c, "env", o->env, o->nenv))) ||
      (o->nsecret_env && !(secret = kv_object(c, "secret_env", o->secret_env, o->nsecret_env)))) {
    json_decref(req);
    json_decref(env);
    return NULL;
  }
  if (env)
    json_object_set_new(req, "env", env);
  if (secret)
    json_object_set_new(req, "secret_env", secret);
  return req;
}

int muster_launch(muster_client *c, const muster_launch_opts *o, muster_worker_list *out) {
  return muster_launch_groups(c, o, 1, out);
}

int muster_launch_groups(muster_client *c, const muster_launch_opts *groups, size_t n,
                         muster_worker_list *out) {
  json_t *req = NULL, *arr = NULL, *ans = NULL;
  int rc;

  out->count = 0;
  out->items = NULL;
  if (n == 0 || n > 16)
    return muster_set_errorf_(c, MUSTER_E_INVALID, "groups", "a launch has 1 to 16 groups, not %zu",
                              n);
  if (n == 1) {
    req = launch_body(c, &groups[0]);
    if (!req)
      return MUSTER_E_INVALID;
  } else {
    arr = json_array();
    for (size_t i = 0; arr && i < n; i++) {
      json_t *g = launch_body(c, &groups[i]);
      if (!g) {
        json_decref(arr);
        return MUSTER_E_INVALID;
      }
      json_array_append_new(arr, g);
    }
    req = json_pack("{s:o}", "groups", arr);
    if (!req)
      return muster_set_errorf_(c, MUSTER_E_NOMEM, NULL, "out of memory");
  }
  rc = muster_json_call_timeout_(c, "POST", "/api/v1/workers", req, c->timeout_s, &ans);
  if (!rc)
    rc = muster_list_from_json_(c, json_object_get(ans, "workers"), out);
  json_decref(ans);
  return rc;
}

int muster_get(muster_client *c, const char *id, muster_worker *out) {
  char path[64];
  json_t *ans = NULL;
  int rc;

  memset(out, 0, sizeof(*out));
  if ((rc = muster_worker_id_ok_(c, id)))
    return rc;
  snprintf(path, sizeof(path), "/api/v1/workers/%s", id);
  rc = muster_json_call_timeout_(c, "GET", path, NULL, c->timeout_s, &ans);
  if (!rc) {
    if (json_is_object(ans))
      muster_worker_from_json_(ans, out);
    else
      rc =
          muster_set_errorf_(c, MUSTER_E_PROTOCOL, NULL, "the controller's answer is not a worker");
  }
  json_decref(ans);
  return rc;
}

/* Appends "&key=value" (URL-escaped) to path. */
static int query_add(muster_client *c, char *path, size_t size, const char *key, const char *v) {
  char *esc = curl_easy_escape(c->curl, v, 0);
  size_t len = strlen(path);
  int n;

  if (!esc)
    return muster_set_errorf_(c, MUSTER_E_NOMEM, NULL, "out of memory");
  n = snprintf(path + len, size - len, "%c%s=%s", strchr(path, '?') ? '&' : '?', key, esc);
  curl_free(esc);
  if (n < 0 || (size_t)n >= size - len)
    return muster_set_errorf_(c, MUSTER_E_INVALID, key, "%s is too long", key);
  return 0;
}

int muster_list(muster_client *c, unsigned statuses, const char *session, const char *role,
                muster_worker_list *out, int64_t *last_event) {
  char path[512] = "/api/v1/workers?limit=5000", page[600];
  json_t *ans = NULL, *all = json_array();
  int64_t seq = 0, first_seq = 0;
  const char *next = NULL;
  int rc = all ? 0 : muster_set_errorf_(c, MUSTER_E_NOMEM, NULL, "out of memory");

  out->count = 0;
  out->items = NULL;
  for (int s = 0; !rc && s < MUSTER_STATUS_UNKNOWN; s++)
    if (statuses & (1u << s))
      rc = query_add(c, path, sizeof(path), "status", muster_status_name((muster_status)s));
  if (!rc && session)
    rc = query_add(c, path, sizeof(path), "session", session);
  if (!rc && role)
    rc = query_add(c, path, sizeof(path), "role", role);
  /* The controller answers in pages, newest first; this gathers them all.
   * The first page's event seq is the one to follow from: nothing after it
   * can be missing from the pages. */
  for (int first = 1; !rc && (first || next); first = 0) {
    struct call k = {"GET", page, NULL, c->timeout_s, &ans, &seq};
    json_t *items;

    if (next && strlen(next) > 30) {
      rc = muster_set_errorf_(c, MUSTER_E_PROTOCOL, NULL,
                              "the controller's page cursor is malformed");
      break;
    }
    snprintf(page, sizeof(page), "%s%s%s", path, next ? "&before=" : "", next ? next : "");
    json_decref(ans);
    ans = NULL;
    rc = muster_http_(c, &k);
    if (rc)
      break;
    if (first)
      first_seq = seq;
    items = json_object_get(ans, "workers");
    if (!json_is_array(items)) {
      rc = muster_set_errorf_(c, MUSTER_E_PROTOCOL, NULL,
                              "the controller's answer has no worker list");
      break;
    }
    json_array_extend(all, items);
    next = json_string_value(json_object_get(ans, "next"));
  }
  if (!rc)
    rc = muster_list_from_json_(c, all, out);
  if (!rc && last_event)
    *last_event = first_seq;
  json_decref(ans);
  json_decref(all);
  return rc;
}

void muster_await_result_free(muster_await_result *r) {
  if (!r)
    return;
  muster_worker_list_free(&r->workers);
  muster_worker_list_free(&r->failures);
  r->timed_out = 0;
}

int muster_await(muster_client *c, const char *const *ids, size_t nids, int wait_for_completion,
                 double timeout_seconds, muster_await_result *out) {
  json_t *req, *ans = NULL;
  int rc;

  memset(out, 0, sizeof(*out));
  for (size_t i = 0; i < nids; i++)
    if ((rc = muster_worker_id_ok_(c, ids[i])))
      return rc;
  req = json_pack("{s:o, s:b, s:f}", "ids", strv(ids, nids), "wait_for_completion",
                  wait_for_completion, "timeout_seconds", timeout_seconds);
  /* The controller answers by the timeout (+1 s); the transport waits a
   * little longer so that it never cuts the answer off. */
  rc = muster_json_call_timeout_(c, "POST", "/api/v1/workers/await", req,
                                 timeout_seconds > 0 ? timeout_seconds + 30 : 0, &ans);
  if (!rc)
    rc = muster_list_from_json_(c, json_object_get(ans, "workers"), &out->workers);
  if (!rc)
    rc = muster_list_from_json_(c, json_object_get(ans, "failures"), &out->failures);
  if (!rc)
    out->timed_out = json_is_true(json_object_get(ans, "timed_out"));
  if (rc)
    muster_await_result_free(out);
  json_decref(ans);
  return rc;
}

int muster_stop(muster_client *c, const char *const *ids, size_t nids, const char *session,
                muster_worker_list *out) {
  json_t *req = json_object(), *ans = NULL;
  muster_worker_list none;
  int rc;

  for (size_t i = 0; i < nids; i++)
    if ((rc = muster_worker_id_ok_(c, ids[i]))) {
      json_decref(req);
      return rc;
    }
  if (nids)
    json_object_set_new(req, "ids", strv(ids, nids));
  if (session)
    json_object_set_new(req, "session", json_string(session));
  rc = muster_json_call_timeout_(c, "POST", "/api/v1/workers/stop", req, c->timeout_s, &ans);
  if (!rc)
    rc = muster_list_from_json_(c, json_object_get(ans, "workers"), out ? out : &none);
  if (!out && !rc)
    muster_worker_list_free(&none);
  json_decref(ans);
  return rc;
}

int muster_session_exec_token(muster_client *c, const char *session, char *buf, size_t size) {
  char path[200];
  json_t *ans = NULL;
  const char *tok;
  int rc;

  if (!session || strlen(session) >= SESSION_STORED_MAX)
    return muster_set_errorf_(c, MUSTER_E_INVALID, "session", "not a session name");
  snprintf(path, sizeof(path), "/api/v1/sessions/%s", session);
  rc = muster_json_call_timeout_(c, "GET", path, NULL, c->timeout_s, &ans);
  if (!rc) {
    tok = json_string_value(json_object_get(ans, "exec_token"));
    if (!tok || strlen(tok) >= size)
      rc = muster_set_errorf_(c, MUSTER_E_PROTOCOL, NULL, "the session has no exec token");
    else
      snprintf(buf, size, "%s", tok);
  }
  json_decref(ans);
  return rc;
}
