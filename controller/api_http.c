/* api_http.c: the REST API's plumbing on libmicrohttpd: answers,
 * authentication, the route table, the request life cycle, the read-only
 * database connections. See api.h and api_internal.h. */
#include "api_internal.h"

#include "backend.h"
#include "log.h"
#include "muster_errors.h"
#include "state.h"
#include "util.h"
#include "validate.h"
#include "wcache.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#define MAX_BODY (1024 * 1024)

static struct MHD_Daemon *daemon_handle;

/* Read-only SQLite connections for lists and gets, which so never wait for
 * the state lock nor hold it. Each is used by one thread at a time. */
#define MAX_READERS 66
static struct reader readers[MAX_READERS];
static int nreaders;

/* Takes a reader connection; give it back with api_reader_put(). */
struct reader *api_reader_get(void) {
  static __thread unsigned hint;

  for (int i = 0; i < nreaders; i++) {
    struct reader *r = &readers[(hint + (unsigned)i) % (unsigned)nreaders];
    if (pthread_mutex_trylock(&r->mu) == 0)
      return r;
  }
  hint++;
  pthread_mutex_lock(&readers[hint % (unsigned)nreaders].mu);
  return &readers[hint % (unsigned)nreaders];
}

void api_reader_put(struct reader *r) {
  pthread_mutex_unlock(&r->mu);
}

/* The worker object of id as JSON text, from the cache or read through
 * rd (without the state lock). Returns a malloc'ed string (length *len), or
 * NULL if there is no such worker. */
char *api_worker_text(struct reader *rd, const char *id, size_t *len) {
  uint64_t gen;
  char *text;
  json_t *w;

  if (wcache_get(id, &text, len, &gen))
    return text;
  w = db_worker_json(rd->db, id);
  if (!w)
    return NULL;
  text = json_dumps(w, JSON_COMPACT);
  json_decref(w);
  if (!text)
    return NULL;
  *len = strlen(text);
  wcache_put(id, text, *len, gen);
  return text;
}

/* The worker object of id, read without the state lock. New reference, or
 * NULL if there is none. */
json_t *api_worker_read(const char *id) {
  struct reader *r = api_reader_get();
  json_t *w = db_worker_json(r->db, id);

  api_reader_put(r);
  return w;
}

/* ---- answers ---- */

/* Queues body (a reference is stolen) as a JSON answer with status. */
enum MHD_Result api_respond_json(struct MHD_Connection *c, unsigned status, json_t *body) {
  char *text = json_dumps(body, JSON_COMPACT);

  json_decref(body);
  if (!text)
    return MHD_NO;
  return api_respond_text(c, status, text, strlen(text));
}

enum MHD_Result api_respond_error(struct MHD_Connection *c, int err, const char *field,
                                  const char *fmt, ...) __attribute__((format(printf, 4, 5)));

/* Queues the error object (docs/design.md) for err, with a sentence from fmt. */
enum MHD_Result api_respond_error(struct MHD_Connection *c, int err, const char *field,
                                  const char *fmt, ...) {
  char msg[1024];
  json_t *e;
  va_list ap;

  va_start(ap, fmt);
  vsnprintf(msg, sizeof(msg), fmt ? fmt : muster_strerror(err), ap);
  va_end(ap);
  e = json_pack("{s:s, s:s}", "code", muster_error_name(err), "message", msg);
  if (field)
    json_object_set_new(e, "field", json_string(field));
  return api_respond_json(c, (unsigned)muster_error_http_status(err),
                          json_pack("{s:o}", "error", e));
}

enum MHD_Result api_respond_empty(struct MHD_Connection *c, unsigned status) {
  struct MHD_Response *r = MHD_create_response_from_buffer(0, NULL, MHD_RESPMEM_PERSISTENT);
  enum MHD_Result ret = MHD_queue_response(c, status, r);

  MHD_destroy_response(r);
  return ret;
}

/* Queues text (malloc'ed, taken over) as a JSON answer. */
enum MHD_Result api_respond_text(struct MHD_Connection *c, unsigned status, char *text,
                                 size_t len) {
  struct MHD_Response *r = MHD_create_response_from_buffer(len, text, MHD_RESPMEM_MUST_FREE);
  enum MHD_Result ret;

  if (!r) {
    free(text);
    return MHD_NO;
  }
  MHD_add_response_header(r, "Content-Type", "application/json");
  MHD_add_response_header(r, "Cache-Control", "no-store");
  ret = MHD_queue_response(c, status, r);
  MHD_destroy_response(r);
  return ret;
}

/* ---- authentication ---- */

const char *api_bearer(struct MHD_Connection *c) {
  const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization");

  if (!h || strncasecmp(h, "Bearer ", 7) != 0)
    return NULL;
  h += 7;
  while (*h == ' ')
    h++;
  return h;
}

/* 1 if the request carries the client API token. */
static int client_ok(struct MHD_Connection *c) {
  const char *t = api_bearer(c);

  return t && util_secret_equal(t, g.api_token);
}

/* 1 if this is GET /api/v1/events carrying the client API token as the query
 * parameter access_token=<token>. Only the event stream takes it: a
 * browser's EventSource cannot set an Authorization header. Compared in
 * constant time, as client_ok() does. */
static int events_query_token_ok(struct MHD_Connection *c, const char *url, const char *method) {
  const char *t;

  if (strcmp(url, "/api/v1/events") != 0 || strcmp(method, "GET") != 0)
    return 0;
  t = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "access_token");
  return t && util_secret_equal(t, g.api_token);
}

/* Parses the request body as a JSON object; NULL (with an error queued
 * through *ret) if it is not one. New reference. */
json_t *api_parse_body(struct MHD_Connection *c, struct req *rq, enum MHD_Result *ret) {
  json_error_t jerr;
  json_t *body;

  if (rq->len == 0) {
    *ret = api_respond_error(c, MUSTER_E_MALFORMED, NULL, "the request needs a JSON body");
    return NULL;
  }
  body = json_loadb(rq->body, rq->len, JSON_REJECT_DUPLICATES, &jerr);
  if (!body) {
    *ret = api_respond_error(c, MUSTER_E_MALFORMED, NULL,
                             "the body is not valid JSON: %s (line %d)", jerr.text, jerr.line);
    return NULL;
  }
  if (!json_is_object(body)) {
    json_decref(body);
    *ret = api_respond_error(c, MUSTER_E_MALFORMED, NULL, "the body must be a JSON object");
    return NULL;
  }
  return body;
}

/* ---- routing ---- */

static const struct api_route routes[] = {
    {"GET", "/api/v1/health", AUTH_NONE, api_health},
    {"GET", "/metrics", AUTH_NONE, api_metrics},
    /* The worker's own calls carry its token, not the client's. */
    {"POST", "/api/v1/workers/{id}/register", AUTH_WORKER, api_register},
    {"POST", "/api/v1/workers/{id}/heartbeat", AUTH_WORKER, api_heartbeat},
    {"POST", "/api/v1/workers/{id}/exit", AUTH_WORKER, api_exit},
    {"POST", "/api/v1/workers/{id}/logs", AUTH_WORKER, api_log_append},
    {"POST", "/api/v1/workers", AUTH_CLIENT, api_launch},
    {"GET", "/api/v1/workers", AUTH_CLIENT, api_list},
    {"POST", "/api/v1/workers/await", AUTH_CLIENT, api_await},
    {"POST", "/api/v1/workers/stop", AUTH_CLIENT, api_stop_workers},
    {"GET", "/api/v1/events", AUTH_CLIENT, api_events},
    {"GET", "/api/v1/sessions", AUTH_CLIENT, api_sessions},
    {"GET", "/api/v1/sessions/{name}", AUTH_CLIENT, api_session},
    {"PUT", "/api/v1/sessions/{name}/lease", AUTH_CLIENT, api_lease_put},
    {"DELETE", "/api/v1/sessions/{name}/lease", AUTH_CLIENT, api_lease_delete},
    {"POST", "/api/v1/runs", AUTH_CLIENT, api_run_create},
    {"GET", "/api/v1/runs", AUTH_CLIENT, api_runs_list},
    {"GET", "/api/v1/runs/{run}", AUTH_CLIENT, api_run_get},
    {"POST", "/api/v1/runs/{run}/restarts", AUTH_CLIENT, api_run_restart},
    {"POST", "/api/v1/runs/{run}/end", AUTH_CLIENT, api_run_end},
    {"GET", "/api/v1/workers/{id}", AUTH_CLIENT, api_get},
    {"DELETE", "/api/v1/workers/{id}", AUTH_CLIENT, api_delete},
    {"GET", "/api/v1/workers/{id}/logs", AUTH_CLIENT, api_logs},
};
#define NROUTES ((int)(sizeof(routes) / sizeof(routes[0])))

const struct api_route *api_routes(int *n) {
  *n = NROUTES;
  return routes;
}

/* Matches url against pattern. Returns 1 if it matches, with the {id} or
 * {name} segment copied to arg (arg_ok 0 if an {id} segment is not a
 * worker id); 0 if not. */
static int path_match(const char *pattern, const char *url, char *arg, size_t arglen, int *arg_ok) {
  *arg_ok = 1;
  arg[0] = '\0';
  while (*pattern && *url) {
    if (*pattern == '{') {
      const char *close = strchr(pattern, '}');
      size_t n = strcspn(url, "/");
      int is_id = strncmp(pattern, "{id}", 4) == 0;

      if (!close || n == 0)
        return 0;
      snprintf(arg, arglen, "%.*s", (int)(n < arglen ? n : arglen - 1), url);
      if (n >= arglen || (is_id && !validate_worker_id(arg)))
        *arg_ok = 0;
      pattern = close + 1;
      url += n;
      continue;
    }
    if (*pattern != *url)
      return 0;
    pattern++;
    url++;
  }
  return *pattern == '\0' && *url == '\0';
}

static enum MHD_Result route(struct MHD_Connection *c, struct req *rq, const char *url,
                             const char *method) {
  char arg[80], allowed[64] = "";
  int authed = -1;

  for (int pass = 0; pass < 2; pass++) {
    for (int i = 0; i < NROUTES; i++) {
      const struct api_route *r = &routes[i];
      int arg_ok;

      /* Worker calls first, and only for a well-formed id: anything else is
       * a client's business. */
      if ((pass == 0) != (r->auth == AUTH_WORKER))
        continue;
      if (!path_match(r->path, url, arg, sizeof(arg), &arg_ok))
        continue;
      if (r->auth == AUTH_WORKER && !arg_ok)
        continue;
      if (strcmp(r->method, method) != 0) {
        if (!strstr(allowed, r->method) &&
            strlen(allowed) + strlen(r->method) + 5 < sizeof(allowed))
          snprintf(allowed + strlen(allowed), sizeof(allowed) - strlen(allowed), "%s%s",
                   allowed[0] ? " or " : "", r->method);
        continue;
      }
      if (r->auth == AUTH_CLIENT) {
        if (authed < 0)
          authed = client_ok(c) || events_query_token_ok(c, url, method);
        if (!authed)
          return api_respond_error(c, MUSTER_E_UNAUTHORIZED, NULL,
                                   api_bearer(c)
                                       ? "the bearer token is not valid"
                                       : "this call needs \"Authorization: Bearer <token>\" (the "
                                         "token is in the controller's state directory)");
        if (!arg_ok)
          return api_respond_error(c, MUSTER_E_NOT_FOUND, "id", "\"%.40s\" is not a worker id",
                                   arg);
      }
      return r->fn(c, rq, arg);
    }
  }
  if (allowed[0]) {
    if (authed < 0 && !client_ok(c))
      return api_respond_error(c, MUSTER_E_UNAUTHORIZED, NULL, "the bearer token is not valid");
    return api_respond_error(c, MUSTER_E_METHOD, NULL, "use %s", allowed);
  }
  /* Everything outside /api/ is the web UI's. */
  if (strncmp(url, "/api/", 5) != 0)
    return strcmp(method, "GET") == 0 ? api_static(c, rq, url)
                                      : api_respond_error(c, MUSTER_E_METHOD, NULL, "use GET");
  if (!client_ok(c))
    return api_respond_error(c, MUSTER_E_UNAUTHORIZED, NULL,
                             api_bearer(c) ? "the bearer token is not valid"
                                           : "this call needs \"Authorization: Bearer <token>\"");
  return api_respond_error(c, MUSTER_E_NOT_FOUND, NULL, "no such endpoint: %s %.200s", method, url);
}

static enum MHD_Result handle(void *cls, struct MHD_Connection *c, const char *url,
                              const char *method, const char *version, const char *upload,
                              size_t *upload_size, void **con_cls) {
  struct req *rq = *con_cls;

  (void)cls;
  (void)version;
  if (!rq) {
    const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Length");
    long n;

    rq = calloc(1, sizeof(*rq));
    if (!rq)
      return MHD_NO;
    *con_cls = rq;
    if (cl && util_parse_long(cl, 0, 0x7fffffffffffffffL, &n) == 0 && n > MAX_BODY)
      rq->too_large = 1;
    return MHD_YES;
  }
  if (*upload_size) {
    /* Bodies are capped at 1 MiB; past that the rest is read and dropped,
     * and the answer is 413. */
    if (!rq->too_large && rq->len + *upload_size > MAX_BODY)
      rq->too_large = 1;
    if (!rq->too_large) {
      char *grown = realloc(rq->body, rq->len + *upload_size + 1);
      if (!grown)
        return MHD_NO;
      rq->body = grown;
      memcpy(rq->body + rq->len, upload, *upload_size);
      rq->len += *upload_size;
      rq->body[rq->len] = '\0';
    }
    *upload_size = 0;
    return MHD_YES;
  }
  if (rq->waiter)
    return api_await_finish(c, rq);
  __atomic_add_fetch(&g.http_requests, 1, __ATOMIC_RELAXED);
  if (rq->too_large) {
    free(rq->body);
    rq->body = NULL;
    rq->len = 0;
    return api_respond_error(c, MUSTER_E_TOO_LARGE, NULL, "the request body is larger than 1 MiB");
  }
  if (g.shutting_down && strcmp(url, "/api/v1/health") != 0)
    return api_respond_error(c, MUSTER_E_SHUTTING_DOWN, NULL, NULL);
  return route(c, rq, url, method);
}

static void completed(void *cls, struct MHD_Connection *c, void **con_cls,
                      enum MHD_RequestTerminationCode toe) {
  struct req *rq = *con_cls;

  (void)cls;
  (void)c;
  (void)toe;
  if (!rq)
    return;
  if (rq->waiter) {
    state_lock();
    waiter_remove_locked(rq->waiter);
    state_unlock();
    api_waiter_free(rq->waiter);
  }
  free(rq->body);
  free(rq);
  *con_cls = NULL;
}

static void mhd_log(void *cls, const char *fmt, va_list ap) {
  char msg[512];

  (void)cls;
  vsnprintf(msg, sizeof(msg), fmt, ap);
  msg[strcspn(msg, "\n")] = '\0';
  LOG(LOG_DEBUG, "libmicrohttpd: %s", msg);
}

int api_start(char *err, size_t errlen) {
  struct sockaddr_in addr;
  const union MHD_DaemonInfo *info;
  const char *host = g.cfg.listen_host;

  {
    char path[600];
    snprintf(path, sizeof(path), "%s/muster.db", g.cfg.state_dir);
    nreaders = g.cfg.http_threads + 2;
    if (nreaders > MAX_READERS)
      nreaders = MAX_READERS;
    for (int i = 0; i < nreaders; i++) {
      int rc = db_open_reader(path, &readers[i].db, err, errlen);
      if (rc)
        return rc;
      pthread_mutex_init(&readers[i].mu, NULL);
    }
  }
  memset(&addr, 0, sizeof(addr));
  addr.sin_family = AF_INET;
  addr.sin_port = htons((uint16_t)g.cfg.port);
  if (strcmp(host, "*") == 0 || host[0] == '\0')
    host = "0.0.0.0";
  if (strcmp(host, "localhost") == 0)
    host = "127.0.0.1";
  if (inet_pton(AF_INET, host, &addr.sin_addr) != 1) {
    snprintf(err, errlen, "--listen: \"%s\" is not an IPv4 address", g.cfg.listen_host);
    return MUSTER_E_INVALID;
  }
  daemon_handle = MHD_start_daemon(
      MHD_USE_EPOLL_INTERNAL_THREAD | MHD_ALLOW_SUSPEND_RESUME | MHD_USE_ERROR_LOG, 0, NULL, NULL,
      handle, NULL, MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&addr, MHD_OPTION_THREAD_POOL_SIZE,
      (unsigned)g.cfg.http_threads, MHD_OPTION_NOTIFY_COMPLETED, completed, NULL,
      MHD_OPTION_CONNECTION_LIMIT, (unsigned)16000, MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)300,
      MHD_OPTION_LISTEN_BACKLOG_SIZE, (unsigned)4096, MHD_OPTION_LISTENING_ADDRESS_REUSE,
      (unsigned)1, MHD_OPTION_EXTERNAL_LOGGER, mhd_log, NULL, MHD_OPTION_END);
  if (!daemon_handle) {
    snprintf(err, errlen, "could not listen on %s:%d (is the port in use?)", host, g.cfg.port);
    return MUSTER_E_IO;
  }
  info = MHD_get_daemon_info(daemon_handle, MHD_DAEMON_INFO_BIND_PORT);
  if (info && info->port)
    g.cfg.port = info->port;
  if (strcmp(host, "0.0.0.0") == 0)
    host = "127.0.0.1";
  snprintf(g.controller_url, sizeof(g.controller_url), "http://%s:%d", host, g.cfg.port);
  return 0;
}

void api_stop(void) {
  if (daemon_handle)
    MHD_stop_daemon(daemon_handle);
  daemon_handle = NULL;
  for (int i = 0; i < nreaders; i++) {
    db_close(readers[i].db);
    readers[i].db = NULL;
    pthread_mutex_destroy(&readers[i].mu);
  }
  nreaders = 0;
}
