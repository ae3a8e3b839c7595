/* api.c: see api.h. */
#include <stddef.h>

#include "api.h"

#include "backend.h"
#include "log.h"
#include "muster_errors.h"
#include "state.h"
#include "util.h"
#include "validate.h"
#include "worker_spec.h"
#include "wcache.h"
#include "fault.h"

#include <arpa/inet.h>
#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <pthread.h>
#include <sys/stat.h>
#include <unistd.h>

#define MAX_BODY (1024 * 1024)
#define MAX_LOG_FILE (64LL * 1024 * 1024)

static struct MHD_Daemon *daemon_handle;

/* Read-only SQLite connections for lists and gets, which so never wait for
 * the state lock nor hold it. Each is used by one thread at a time. */
#define MAX_READERS 66
static struct reader {
  pthread_mutex_t mu;
  struct db *db;
} readers[MAX_READERS];
static int nreaders;

/* Takes a reader connection; give it back with reader_put(). */
static struct reader *reader_get(void) {
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

static void reader_put(struct reader *r) { pthread_mutex_unlock(&r->mu); }

/* The worker object of id as JSON text, from the cache or read through
 * rd (without the state lock). Returns a malloc'ed string (length *len), or
 * NULL if there is no such worker. */
static char *worker_text(struct reader *rd, const char *id, size_t *len) {
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
static json_t *worker_read(const char *id) {
  struct reader *r = reader_get();
  json_t *w = db_worker_json(r->db, id);

  reader_put(r);
  return w;
}

/* Per-request state, kept in libmicrohttpd's con_cls. */
struct req {
  char *body;
  size_t len;
  int too_large;
  struct waiter *waiter; /* a suspended await */
};

/* ---- answers ---- */

/* Queues body (a reference is stolen) as a JSON answer with status. */
static enum MHD_Result respond_json(struct MHD_Connection *c, unsigned status, json_t *body) {
  char *text = json_dumps(body, JSON_COMPACT);
  struct MHD_Response *r;
  enum MHD_Result ret;

  json_decref(body);
  if (!text)
    return MHD_NO;
  r = MHD_create_response_from_buffer(strlen(text), text, MHD_RESPMEM_MUST_FREE);
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

static enum MHD_Result respond_error(struct MHD_Connection *c, int err, const char *field,
                                     const char *fmt, ...) __attribute__((format(printf, 4, 5)));

/* Queues DESIGN.md's error object for err, with a sentence from fmt. */
static enum MHD_Result respond_error(struct MHD_Connection *c, int err, const char *field,
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
  return respond_json(c, (unsigned)muster_error_http_status(err), json_pack("{s:o}", "error", e));
}

static enum MHD_Result respond_empty(struct MHD_Connection *c, unsigned status) {
  struct MHD_Response *r = MHD_create_response_from_buffer(0, NULL, MHD_RESPMEM_PERSISTENT);
  enum MHD_Result ret = MHD_queue_response(c, status, r);

  MHD_destroy_response(r);
  return ret;
}

/* ---- authentication ---- */

static const char *bearer(struct MHD_Connection *c) {
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
  const char *t = bearer(c);

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

/* Checks a worker-facing call: the token must be worker id's own.
 * On success returns 0 and *live is the worker if it is still live (NULL
 * if it is terminal). Called locked. */
static int worker_auth_locked(struct MHD_Connection *c, const char *id, struct lw **live,
                              char *status, size_t statuslen) {
  const char *t = bearer(c);
  struct db_worker_info info;
  struct lw *w;
  int rc, ok;

  *live = NULL;
  if (!t)
    return MUSTER_E_UNAUTHORIZED;
  w = lw_find_locked(id);
  if (w) {
    if (!util_secret_equal(t, w->token))
      return MUSTER_E_FORBIDDEN;
    *live = w;
    snprintf(status, statuslen, "%s", ws_name(w->status));
    return 0;
  }
  rc = db_worker_info(g.db, id, &info);
  if (rc)
    return rc == MUSTER_E_NOT_FOUND ? MUSTER_E_FORBIDDEN : rc;
  ok = util_secret_equal(t, info.token);
  snprintf(status, statuslen, "%s", info.status);
  db_worker_info_cleanup(&info);
  return ok ? 0 : MUSTER_E_FORBIDDEN;
}

/* ---- helpers ---- */

static void client_ip(struct MHD_Connection *c, char *buf, size_t size) {
  const union MHD_ConnectionInfo *ci =
      MHD_get_connection_info(c, MHD_CONNECTION_INFO_CLIENT_ADDRESS);

  buf[0] = '\0';
  if (!ci || !ci->client_addr)
    return;
  if (ci->client_addr->sa_family == AF_INET)
    inet_ntop(AF_INET, &((const struct sockaddr_in *)ci->client_addr)->sin_addr, buf,
              (socklen_t)size);
  else if (ci->client_addr->sa_family == AF_INET6)
    inet_ntop(AF_INET6, &((const struct sockaddr_in6 *)ci->client_addr)->sin6_addr, buf,
              (socklen_t)size);
}

/* Parses the request body as a JSON object; NULL (with an error queued
 * through *ret) if it is not one. New reference. */
static json_t *parse_body(struct MHD_Connection *c, struct req *rq, enum MHD_Result *ret) {
  json_error_t jerr;
  json_t *body;

  if (rq->len == 0) {
    *ret = respond_error(c, MUSTER_E_MALFORMED, NULL, "the request needs a JSON body");
    return NULL;
  }
  body = json_loadb(rq->body, rq->len, JSON_REJECT_DUPLICATES, &jerr);
  if (!body) {
    *ret = respond_error(c, MUSTER_E_MALFORMED, NULL, "the body is not valid JSON: %s (line %d)",
                         jerr.text, jerr.line);
    return NULL;
  }
  if (!json_is_object(body)) {
    json_decref(body);
    *ret = respond_error(c, MUSTER_E_MALFORMED, NULL, "the body must be a JSON object");
    return NULL;
  }
  return body;
}

static char *dump_or_default(json_t *v, const char *dflt) {
  return v ? json_dumps(v, JSON_COMPACT) : strdup(dflt);
}

/* ---- POST /api/v1/workers ---- */

static enum MHD_Result h_launch(struct MHD_Connection *c, struct req *rq) {
  struct launch_req lr;
  struct backend_req req;
  char launch[16];
  const char *field = NULL;
  char msg[512], master_ip[64];
  char (*ids)[16] = NULL;
  char (*tokens)[72] = NULL;
  char *command = NULL, *args = NULL, *env = NULL, *secret = NULL;
  json_t *body, *out = NULL;
  enum MHD_Result ret = MHD_NO;
  int rc;

  body = parse_body(c, rq, &ret);
  if (!body)
    return ret;
  rc = validate_launch(body, &lr, &field, msg, sizeof(msg));
  req.cpu = lr.cpu;
  req.memory = lr.memory;
  req.ngpu = lr.nvidia_gpu;
  if (!rc)
    rc = g.backend->could_ever_fit(&req, &field, msg, sizeof(msg));
  if (rc) {
    ret = respond_error(c, rc, field, "%s", msg);
    goto out;
  }
  ids = calloc((size_t)lr.n, sizeof(*ids));
  tokens = calloc((size_t)lr.n, sizeof(*tokens));
  command = lr.command ? json_dumps(lr.command, JSON_COMPACT) : NULL;
  args = dump_or_default(lr.args, "[]");
  env = dump_or_default(lr.env, "{}");
  secret = dump_or_default(lr.secret_env, "{}");
  if (!ids || !tokens || !args || !env || !secret || (lr.command && !command)) {
    ret = respond_error(c, MUSTER_E_NOMEM, NULL, NULL);
    goto out;
  }
  for (long i = 0; i < lr.n; i++) {
    memcpy(ids[i], "w-", 2);
    if (util_random_alnum(ids[i] + 2, 10) != 0 || util_random_hex(tokens[i], 24) != 0) {
      ret = respond_error(c, MUSTER_E_INTERNAL, NULL, "no random bytes for worker ids");
      goto out;
    }
  }
  client_ip(c, master_ip, sizeof(master_ip));
  memcpy(launch, "l-", 2);
  if (util_random_alnum(launch + 2, 10) != 0) {
    ret = respond_error(c, MUSTER_E_INTERNAL, NULL, "no random bytes for the launch id");
    goto out;
  }

  state_lock();
  if (g.shutting_down) {
    state_unlock();
    ret = respond_error(c, MUSTER_E_SHUTTING_DOWN, NULL, NULL);
    goto out;
  }
  rc = db_begin(g.db);
  if (!rc)
    rc = db_session_touch(g.db, lr.session, master_ip);
  for (long i = 0; !rc && i < lr.n; i++) {
    struct db_worker_new w = {
        .id = ids[i], .session = lr.session, .name = lr.name, .role = lr.role,
        .cpu = lr.cpu, .memory = lr.memory, .nvidia_gpu = lr.nvidia_gpu,
        .script = lr.script, .code = lr.code, .kernel = lr.kernel,
        .command_json = command, .args_json = args, .env_json = env,
        .secret_env_json = secret, .token = tokens[i], .master_ip = master_ip,
        .backend = g.cfg.backend, .launch_id = launch};
    rc = db_worker_insert(g.db, &w);
  }
  if (!rc)
    rc = db_commit(g.db);
  if (rc) {
    LOG(LOG_ERROR, "launch failed: %s", db_errmsg(g.db));
    db_rollback(g.db);
    state_unlock();
    ret = respond_error(c, MUSTER_E_DB, NULL, "the launch could not be stored; nothing was launched");
    goto out;
  }
  for (long i = 0; i < lr.n; i++)
    if (lw_add_locked(ids[i], tokens[i], lr.session, launch, &req) != 0)
      LOG(LOG_ERROR, "out of memory tracking %s", ids[i]);
  streams_wake_events_locked();
  state_kick_locked();
  state_unlock();
  out = json_array();
  {
    struct reader *r = reader_get();
    for (long i = 0; i < lr.n; i++)
      json_array_append_new(out, db_worker_json(r->db, ids[i]));
    reader_put(r);
  }
  LOG(LOG_INFO, "launched %ld worker(s) in session %s", lr.n, lr.session);
  ret = respond_json(c, MHD_HTTP_CREATED, json_pack("{s:o}", "workers", out));

out:
  json_decref(body);
  free(ids);
  free(tokens);
  free(command);
  free(args);
  free(env);
  free(secret);
  return ret;
}

/* ---- GET /api/v1/workers ---- */

struct list_query {
  json_t *statuses;
  const char *bad;
};

static enum MHD_Result collect_status(void *cls, enum MHD_ValueKind kind, const char *key,
                                      const char *value) {
  struct list_query *q = cls;
  enum wstatus st;

  (void)kind;
  if (strcmp(key, "status") != 0 || !value)
    return MHD_YES;
  /* Both ?status=a&status=b and ?status=a,b are accepted. */
  for (const char *p = value; *p;) {
    char name[32];
    size_t n = strcspn(p, ",");
    snprintf(name, sizeof(name), "%.*s", (int)(n < sizeof(name) ? n : sizeof(name) - 1), p);
    if (ws_parse(name, &st) != 0) {
      q->bad = value;
      return MHD_NO;
    }
    json_array_append_new(q->statuses, json_string(name));
    p += n;
    if (*p == ',')
      p++;
  }
  return MHD_YES;
}

/* Reads the paging parameters limit (default 500, at most 5000) and before
 * (a cursor from an earlier page's "next"). Returns 0, or queues a 422
 * naming the parameter through *ret. */
static int page_params(struct MHD_Connection *c, int *limit, int64_t *before,
                       enum MHD_Result *ret) {
  const char *l = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "limit");
  const char *b = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "before");
  long v;

  *limit = 500;
  *before = 0;
  if (l) {
    if (util_parse_long(l, 1, 5000, &v) != 0) {
      *ret = respond_error(c, MUSTER_E_INVALID, "limit", "limit must be 1 to 5000");
      return -1;
    }
    *limit = (int)v;
  }
  if (b && *b) {
    if (util_parse_long(b, 1, 0x7fffffffffffffffL, &v) != 0) {
      *ret = respond_error(c, MUSTER_E_INVALID, "before",
                           "before must be the \"next\" cursor of an earlier page");
      return -1;
    }
    *before = v;
  }
  return 0;
}

static enum MHD_Result h_list(struct MHD_Connection *c) {
  struct list_query q = {json_array(), NULL};
  const char *session = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "session");
  const char *role = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "role");
  char *statuses = NULL, seq[32], (*ids)[16];
  struct reader *rd;
  struct MHD_Response *r;
  char *text = NULL;
  size_t textlen = 0;
  FILE *out;
  enum MHD_Result ret;
  int64_t before, next;
  int limit, n = 0, rc;

  if (page_params(c, &limit, &before, &ret) != 0) {
    json_decref(q.statuses);
    return ret;
  }
  MHD_get_connection_values(c, MHD_GET_ARGUMENT_KIND, collect_status, &q);
  if (q.bad) {
    json_decref(q.statuses);
    return respond_error(c, MUSTER_E_INVALID, "status",
                         "status must be scheduling, starting, running, succeeded, failed or "
                         "stopped");
  }
  if (json_array_size(q.statuses))
    statuses = json_dumps(q.statuses, JSON_COMPACT);
  json_decref(q.statuses);
  ids = calloc((size_t)limit, sizeof(*ids));
  if (!ids) {
    free(statuses);
    return respond_error(c, MUSTER_E_NOMEM, NULL, NULL);
  }
  rd = reader_get();
  /* The seq first: events after it may already show in the list, none
   * before it can be missing from it. */
  snprintf(seq, sizeof(seq), "%lld", (long long)db_last_event_seq(rd->db));
  rc = db_worker_page(rd->db, statuses, session, role, before, limit, ids, &n, &next);
  /* The page is built as text from the cached objects: a page of finished
   * workers is copies, not queries. */
  out = rc ? NULL : open_memstream(&text, &textlen);
  if (out) {
    fputs("{\"workers\":[", out);
    for (int i = 0; i < n; i++) {
      size_t len;
      char *w = worker_text(rd, ids[i], &len);
      if (!w)
        continue; /* pruned between the two reads */
      if (i)
        fputc(',', out);
      fwrite(w, 1, len, out);
      free(w);
    }
    if (next)
      fprintf(out, "],\"next\":\"%lld\"}", (long long)next);
    else
      fputs("],\"next\":null}", out);
  }
  reader_put(rd);
  free(statuses);
  free(ids);
  if (!out || fclose(out) != 0) {
    free(text);
    return respond_error(c, MUSTER_E_DB, NULL, "could not list workers");
  }
  r = MHD_create_response_from_buffer(textlen, text, MHD_RESPMEM_MUST_FREE);
  if (!r) {
    free(text);
    return MHD_NO;
  }
  MHD_add_response_header(r, "Content-Type", "application/json");
  MHD_add_response_header(r, "Cache-Control", "no-store");
  /* The last event seq at the time of the list: a client that then follows
   * /api/v1/events?since= that seq misses nothing. */
  MHD_add_response_header(r, "X-Muster-Last-Event", seq);
  ret = MHD_queue_response(c, MHD_HTTP_OK, r);
  MHD_destroy_response(r);
  return ret;
}

/* ---- GET /api/v1/workers/{id}, DELETE, POST stop ---- */

/* Queues text (malloc'ed, taken over) as a JSON answer. */
static enum MHD_Result respond_text(struct MHD_Connection *c, unsigned status, char *text,
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

static enum MHD_Result h_get(struct MHD_Connection *c, const char *id) {
  struct reader *rd = reader_get();
  size_t len;
  char *text = worker_text(rd, id, &len);

  reader_put(rd);
  if (!text)
    return respond_error(c, MUSTER_E_NOT_FOUND, "id", "there is no worker %s", id);
  return respond_text(c, MHD_HTTP_OK, text, len);
}

static enum MHD_Result h_delete(struct MHD_Connection *c, const char *id) {
  char ids[1][16];
  json_t *w = worker_read(id);
  int rc;

  if (!w)
    return respond_error(c, MUSTER_E_NOT_FOUND, "id", "there is no worker %s", id);
  json_decref(w);
  snprintf(ids[0], sizeof(ids[0]), "%s", id);
  state_lock();
  rc = sm_stop_many_locked(ids, 1, "stopped by the user");
  state_unlock();
  if (rc)
    return respond_error(c, rc, NULL, "could not stop %s", id);
  w = worker_read(id);
  return w ? respond_json(c, MHD_HTTP_OK, w) : respond_error(c, MUSTER_E_DB, NULL, NULL);
}

static enum MHD_Result h_stop(struct MHD_Connection *c, struct req *rq) {
  json_t *body = NULL, *ids, *item, *out = json_array();
  const char *session = "default";
  char (*targets)[16] = NULL;
  enum MHD_Result ret = MHD_NO;
  struct reader *rd;
  size_t i;
  int n = 0, rc = 0;

  if (rq->len) {
    body = parse_body(c, rq, &ret);
    if (!body)
      goto out;
  }
  ids = body ? json_object_get(body, "ids") : NULL;
  if (body && json_object_get(body, "session")) {
    session = json_string_value(json_object_get(body, "session"));
    if (!validate_name(session)) {
      ret = respond_error(c, MUSTER_E_INVALID, "session",
                          "session must be 1 to 64 letters, digits, '_', '.' or '-'");
      goto out;
    }
  }
  if (ids && !json_is_null(ids) && !json_is_array(ids)) {
    ret = respond_error(c, MUSTER_E_INVALID, "ids", "ids must be an array of worker ids");
    goto out;
  }
  if (json_array_size(ids) > 100000) {
    ret = respond_error(c, MUSTER_E_INVALID, "ids", "ids may name at most 100000 workers");
    goto out;
  }
  json_array_foreach(ids, i, item) {
    const char *id = json_is_object(item) ? json_string_value(json_object_get(item, "id"))
                                          : json_string_value(item);
    if (!validate_worker_id(id)) {
      ret = respond_error(c, MUSTER_E_INVALID, "ids", "ids[%zu] is not a worker id", i);
      goto out;
    }
  }
  rd = reader_get();
  json_array_foreach(ids, i, item) {
    const char *id = json_is_object(item) ? json_string_value(json_object_get(item, "id"))
                                          : json_string_value(item);
    json_t *w = db_worker_json(rd->db, id);
    if (!w) {
      reader_put(rd);
      ret = respond_error(c, MUSTER_E_NOT_FOUND, "ids", "there is no worker %s", id);
      goto out;
    }
    json_decref(w);
  }
  reader_put(rd);

  state_lock();
  n = (int)json_array_size(ids);
  if (n == 0)
    for (struct lw *w = g.head; w; w = w->next)
      n += strcmp(w->session, session) == 0;
  targets = calloc((size_t)n + 1, sizeof(*targets));
  if (!targets) {
    state_unlock();
    ret = respond_error(c, MUSTER_E_NOMEM, NULL, NULL);
    goto out;
  }
  if (json_array_size(ids)) {
    json_array_foreach(ids, i, item) {
      const char *id = json_is_object(item) ? json_string_value(json_object_get(item, "id"))
                                            : json_string_value(item);
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
  rc = sm_stop_many_locked(targets, n, "stopped by the user");
  state_unlock();
  if (rc) {
    ret = respond_error(c, rc, NULL, "could not stop the workers; none was stopped");
    goto out;
  }
  rd = reader_get();
  for (int k = 0; k < n; k++)
    json_array_append_new(out, db_worker_json(rd->db, targets[k]));
  reader_put(rd);
  ret = respond_json(c, MHD_HTTP_OK, json_pack("{s:O}", "workers", out));

out:
  free(targets);
  json_decref(out);
  json_decref(body);
  return ret;
}

/* ---- GET /api/v1/sessions/{name} ---- */

static enum MHD_Result h_session(struct MHD_Connection *c, const char *name) {
  struct reader *rd;
  json_t *o;

  if (!validate_name(name))
    return respond_error(c, MUSTER_E_NOT_FOUND, "name", "\"%.64s\" is not a session name", name);
  rd = reader_get();
  o = db_session_json(rd->db, name);
  reader_put(rd);
  if (!o)
    return respond_error(c, MUSTER_E_NOT_FOUND, "name",
                         "there is no session %s (a session exists once it has launched)", name);
  return respond_json(c, MHD_HTTP_OK, o);
}

/* ---- POST /api/v1/workers/await ---- */

/* Builds await's answer from the workers' current rows (read without the
 * state lock: every change that woke the await is committed). */
static json_t *await_answer(json_t *ids, int wfc, int timed_out) {
  json_t *done = json_array(), *failures = json_array(), *item;
  const char *target = wfc ? "succeeded" : "running";
  struct reader *rd = reader_get();
  size_t i;

  json_array_foreach(ids, i, item) {
    json_t *w = db_worker_json(rd->db, json_string_value(item));
    const char *st;
    if (!w)
      continue;
    st = json_string_value(json_object_get(w, "status"));
    json_array_append_new(st && strcmp(st, target) == 0 ? done : failures, w);
  }
  reader_put(rd);
  return json_pack("{s:o, s:o, s:b}", "workers", done, "failures", failures, "timed_out",
                   timed_out);
}

static void waiter_free(struct waiter *wt) {
  if (!wt)
    return;
  free(wt->ids);
  free(wt->done);
  free(wt);
}

/* Finishes a resumed await: its waiter is ready. */
static enum MHD_Result await_finish(struct MHD_Connection *c, struct req *rq) {
  struct waiter *wt = rq->waiter;
  json_t *ids = json_array(), *answer;
  int shutting, gone, timed_out;

  state_lock();
  waiter_remove_locked(wt);
  shutting = g.shutting_down && wt->pending > 0 && !wt->timed_out;
  gone = wt->client_gone;
  timed_out = wt->timed_out && wt->pending > 0;
  state_unlock();
  rq->waiter = NULL;
  if (gone) {
    /* Nobody to answer: close the connection, which frees it. */
    waiter_free(wt);
    json_decref(ids);
    return MHD_NO;
  }
  for (int i = 0; i < wt->n; i++)
    json_array_append_new(ids, json_string(wt->ids[i]));
  answer = shutting ? NULL : await_answer(ids, wt->wait_for_completion, timed_out);
  json_decref(ids);
  waiter_free(wt);
  if (shutting)
    return respond_error(c, MUSTER_E_SHUTTING_DOWN, NULL,
                         "the controller is shutting down; await again after it restarts");
  return respond_json(c, MHD_HTTP_OK, answer);
}

static enum MHD_Result h_await(struct MHD_Connection *c, struct req *rq) {
  struct await_req ar;
  const char *field;
  char msg[512];
  struct waiter *wt = NULL;
  json_t *body, *item;
  enum MHD_Result ret = MHD_NO;
  size_t i;
  int n, rc;

  body = parse_body(c, rq, &ret);
  if (!body)
    return ret;
  rc = validate_await(body, &ar, &field, msg, sizeof(msg));
  json_decref(body);
  if (rc)
    return respond_error(c, rc, field, "%s", msg);

  n = (int)json_array_size(ar.ids);
  wt = calloc(1, sizeof(*wt));
  if (wt) {
    wt->ids = calloc((size_t)n + 1, sizeof(*wt->ids));
    wt->done = calloc((size_t)n + 1, 1);
  }
  if (!wt || !wt->ids || !wt->done) {
    waiter_free(wt);
    json_decref(ar.ids);
    return respond_error(c, MUSTER_E_NOMEM, NULL, NULL);
  }
  wt->conn = c;
  wt->n = n;
  wt->wait_for_completion = ar.wait_for_completion;

  state_lock();
  json_array_foreach(ar.ids, i, item) {
    const char *id = json_string_value(item);
    struct lw *w = lw_find_locked(id);
    enum wstatus st = WS_FAILED;

    snprintf(wt->ids[i], sizeof(wt->ids[i]), "%s", id);
    if (w) {
      st = w->status;
    } else {
      struct db_worker_info info;
      if (db_worker_info(g.db, id, &info) != 0) {
        enum MHD_Result ret;
        state_unlock();
        waiter_free(wt);
        ret = respond_error(c, MUSTER_E_NOT_FOUND, "ids", "there is no worker %s", id);
        json_decref(ar.ids); /* id points into it */
        return ret;
      }
      if (ws_parse(info.status, &st) != 0)
        st = WS_FAILED;
      db_worker_info_cleanup(&info);
    }
    if (ws_terminal(st) || (!ar.wait_for_completion && st == WS_RUNNING))
      wt->done[i] = 1;
    else
      wt->pending++;
  }
  if (wt->pending == 0 || g.shutting_down) {
    json_t *answer;
    state_unlock();
    answer = await_answer(ar.ids, ar.wait_for_completion, 0);
    waiter_free(wt);
    json_decref(ar.ids);
    return respond_json(c, MHD_HTTP_OK, answer);
  }
  /* Wait on the state change itself: the connection is parked, no thread
   * is held, and sm_commit() (or the monitor, at the deadline) resumes it. */
  if (ar.timeout_seconds > 0)
    wt->deadline_ms = util_mono_ms() + (int64_t)(ar.timeout_seconds * 1000);
  rq->waiter = wt;
  waiter_add_locked(wt);
  MHD_suspend_connection(c);
  if (wt->deadline_ms)
    pthread_cond_signal(&g.kick); /* the monitor must learn the new deadline */
  state_unlock();
  json_decref(ar.ids);
  return MHD_YES;
}

/* ---- worker-facing calls ---- */

static enum MHD_Result h_register(struct MHD_Connection *c, struct req *rq, const char *id) {
  struct db_worker_info info;
  struct db_fields f = DB_FIELDS_INIT;
  char status[16], ip[64], detail[160];
  const char *hostname;
  json_t *body, *v, *answer;
  struct lw *w;
  enum MHD_Result ret = MHD_NO;
  unsigned char addr[16];
  int rc, attempt;

  body = parse_body(c, rq, &ret);
  if (!body)
    return ret;
  v = json_object_get(body, "ip_address");
  if (!json_is_string(v) || (inet_pton(AF_INET, json_string_value(v), addr) != 1 &&
                             inet_pton(AF_INET6, json_string_value(v), addr) != 1)) {
    json_decref(body);
    return respond_error(c, MUSTER_E_INVALID, "ip_address", "ip_address must be an IP address");
  }
  snprintf(ip, sizeof(ip), "%s", json_string_value(v));
  hostname = json_string_value(json_object_get(body, "hostname"));
  if (hostname && strlen(hostname) > 255)
    hostname = NULL;
  v = json_object_get(body, "exec_port");
  if (json_is_integer(v) && json_integer_value(v) > 0 && json_integer_value(v) < 65536)
    f.exec_port = (int)json_integer_value(v);
  v = json_object_get(body, "pid");
  if (json_is_integer(v) && json_integer_value(v) > 0 && json_integer_value(v) < (1 << 30))
    f.pid = (int)json_integer_value(v);
  v = json_object_get(body, "attempt");
  attempt = json_is_integer(v) && json_integer_value(v) > 0 && json_integer_value(v) < (1 << 30)
                ? (int)json_integer_value(v)
                : 0;

  state_lock();
  rc = worker_auth_locked(c, id, &w, status, sizeof(status));
  if (rc) {
    state_unlock();
    json_decref(body);
    return respond_error(c, rc, NULL, "worker calls need that worker's own token");
  }
  if (!w || (w->status != WS_STARTING && w->status != WS_RUNNING)) {
    state_unlock();
    json_decref(body);
    return respond_error(c, MUSTER_E_CONFLICT, "status",
                         "worker %s is %s; it cannot register", id, status);
  }
  /* Exactly once: only the workerd of the committed attempt may run the
   * worker's script; any other (one started before a controller crash, say)
   * is refused and ends without running anything. */
  if (attempt != w->attempt || w->restart) {
    int current = w->attempt;
    state_unlock();
    json_decref(body);
    LOG(LOG_INFO, "%s: refused a registration of attempt %d (the current attempt is %d)", id,
        attempt, current);
    return respond_error(c, MUSTER_E_CONFLICT, "attempt",
                         "worker %s is on start attempt %d; this muster-workerd belongs to "
                         "attempt %d and must end",
                         id, current, attempt);
  }
  /* A registration of a worker that already runs is its own workerd asking
   * again (the first answer was lost): the same pid. Another process with
   * the same attempt (started twice by a backend) is refused. */
  if (w->status == WS_RUNNING && w->reg_pid && w->reg_pid != (f.pid > 0 ? f.pid : 0)) {
    state_unlock();
    json_decref(body);
    return respond_error(c, MUSTER_E_CONFLICT, "pid",
                         "worker %s already runs with another muster-workerd; this one must "
                         "end",
                         id);
  }
  if (w->status == WS_STARTING) {
    f.ip_address = ip;
    f.hostname = hostname;
    f.set_running_at = 1;
    f.set_heartbeat = 1;
    snprintf(detail, sizeof(detail), "registered at %s", ip);
    rc = sm_begin();
    if (!rc)
      rc = sm_transition(w, WS_RUNNING, &f, detail);
    if (!rc)
      rc = sm_commit();
    else
      sm_rollback();
  }
  /* A second register (the answer to the first was lost) is answered the
   * same way and changes nothing. */
  if (!rc) {
    if (!w->reg_pid && f.pid > 0)
      w->reg_pid = f.pid;
    sm_heartbeat_locked(w);
    rc = db_worker_info(g.db, id, &info);
  }
  if (rc) {
    state_unlock();
    json_decref(body);
    return respond_error(c, rc, NULL, "could not register %s", id);
  }
  answer = json_pack("{s:f, s:o, s:o, s:s}", "heartbeat_interval_seconds",
                     g.cfg.heartbeat_interval_s, "command", spec_command(&info), "env",
                     spec_env(&info, ip, g.controller_url), "cwd", g.cfg.workdir);
  {
    /* The session's exec credential: the worker checks it on every exec
     * request (docs/exec-protocol.md). */
    json_t *sess = db_session_json(g.db, info.session);
    json_t *tok = json_object_get(sess, "exec_token");
    if (json_is_string(tok))
      json_object_set(answer, "exec_token", tok);
    json_decref(sess);
  }
  db_worker_info_cleanup(&info);
  state_unlock();
  json_decref(body);
  return respond_json(c, MHD_HTTP_OK, answer);
}

static enum MHD_Result h_heartbeat(struct MHD_Connection *c, const char *id) {
  char status[16];
  struct lw *w;
  int rc, stop;

  state_lock();
  rc = worker_auth_locked(c, id, &w, status, sizeof(status));
  if (rc) {
    state_unlock();
    return respond_error(c, rc, NULL, "worker calls need that worker's own token");
  }
  if (w && w->status == WS_STARTING) {
    state_unlock();
    return respond_error(c, MUSTER_E_CONFLICT, "status", "worker %s has not registered", id);
  }
  stop = !w;
  if (w)
    sm_heartbeat_locked(w);
  state_unlock();
  return respond_json(c, MHD_HTTP_OK, json_pack("{s:b}", "stop", stop));
}

static enum MHD_Result h_exit(struct MHD_Connection *c, struct req *rq, const char *id) {
  struct db_fields f = DB_FIELDS_INIT;
  char status[16], why[1200];
  const char *reason;
  json_t *body, *code, *sig;
  enum MHD_Result ret = MHD_NO;
  enum wstatus to;
  struct lw *w;
  int rc;

  body = parse_body(c, rq, &ret);
  if (!body)
    return ret;
  code = json_object_get(body, "exit_code");
  sig = json_object_get(body, "signal");
  reason = json_string_value(json_object_get(body, "reason"));
  if ((code && !json_is_null(code) && !json_is_integer(code)) ||
      (sig && !json_is_null(sig) && !json_is_integer(sig))) {
    json_decref(body);
    return respond_error(c, MUSTER_E_INVALID, "exit_code",
                         "exit_code and signal must be integers or null");
  }
  why[0] = '\0';
  if (json_is_integer(code))
    f.exit_code = (int)json_integer_value(code);
  if (json_is_integer(sig) && json_integer_value(sig) > 0 && json_integer_value(sig) < 128) {
    f.signal = (int)json_integer_value(sig);
    snprintf(why, sizeof(why), "the script was killed by signal %d (%s)", f.signal,
             strsignal(f.signal));
  } else if (f.exit_code > 0) {
    snprintf(why, sizeof(why), "the script exited with code %d", f.exit_code);
  }
  if (reason && *reason)
    snprintf(why, sizeof(why), "%.1000s", reason);
  to = why[0] ? WS_FAILED : WS_SUCCEEDED;
  f.failure = why[0] ? why : NULL;

  state_lock();
  rc = worker_auth_locked(c, id, &w, status, sizeof(status));
  if (!rc && w)
    rc = sm_finish_locked(w, to, &f, why[0] ? why : "the script exited with code 0",
                          BACKEND_KILL_LATER);
  state_unlock();
  json_decref(body);
  if (rc)
    return respond_error(c, rc, NULL, "could not record the end of %s", id);
  /* An end reported after the worker already ended (stopped, or failed)
   * changes nothing. */
  return respond_json(c, MHD_HTTP_OK, json_object());
}

static int log_path(const char *id, const char *stream, char *buf, size_t size) {
  if (!stream)
    stream = "stdout";
  if (strcmp(stream, "stdout") != 0 && strcmp(stream, "stderr") != 0)
    return MUSTER_E_INVALID;
  snprintf(buf, size, "%s/logs/%s.%s", g.cfg.state_dir, id, stream);
  return 0;
}

static enum MHD_Result h_log_append(struct MHD_Connection *c, struct req *rq, const char *id) {
  const char *stream = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "stream");
  char path[700], status[16];
  struct lw *w;
  struct stat stt;
  int rc, fd;

  if (log_path(id, stream, path, sizeof(path)) != 0)
    return respond_error(c, MUSTER_E_INVALID, "stream", "stream must be stdout or stderr");
  state_lock();
  rc = worker_auth_locked(c, id, &w, status, sizeof(status));
  state_unlock();
  if (rc)
    return respond_error(c, rc, NULL, "worker calls need that worker's own token");
  fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
  if (fd < 0)
    return respond_error(c, MUSTER_E_IO, NULL, "could not open the log: %s", strerror(errno));
  if (fstat(fd, &stt) == 0 && stt.st_size + (off_t)rq->len > MAX_LOG_FILE) {
    /* A runaway worker must not fill the disk: past the cap, output is
     * dropped, and the log says so once. */
    static const char note[] = "\n[muster: log truncated at 64 MiB]\n";
    if (stt.st_size < MAX_LOG_FILE && write(fd, note, sizeof(note) - 1) < 0)
      LOG(LOG_WARN, "could not write to %s", path);
  } else if (rq->len && write(fd, rq->body, rq->len) != (ssize_t)rq->len) {
    close(fd);
    return respond_error(c, MUSTER_E_IO, NULL, "could not append to the log: %s",
                         strerror(errno));
  }
  close(fd);
  state_lock();
  streams_wake_logs_locked(id);
  state_unlock();
  return respond_empty(c, MHD_HTTP_NO_CONTENT);
}

/* ---- streaming answers: GET /api/v1/events and logs with follow=1 ---- */

struct events_ctx {
  struct stream s; /* first: the registry sees only this part */
  int64_t last_seq;
  char *buf;
  size_t len, pos;
};

static ssize_t copy_out(char **bufp, size_t *len, size_t *pos, char *out, size_t max) {
  size_t n = *len - *pos;

  if (n > max)
    n = max;
  memcpy(out, *bufp + *pos, n);
  *pos += n;
  if (*pos == *len) {
    free(*bufp);
    *bufp = NULL;
    *len = *pos = 0;
  }
  return (ssize_t)n;
}

/* A client further behind than this many events is told to list again. */
#define EVENTS_MAX_BEHIND 100000

/* libmicrohttpd asks for the next bytes of the event stream, only as fast
 * as the client takes them: at most 512 events are buffered per client. The
 * events are read without the state lock; with nothing new, the connection
 * is suspended (returning 0) until sm_commit() wakes it: no polling of the
 * database, no thread held. */
static ssize_t events_reader(void *cls, uint64_t pos, char *out, size_t max) {
  struct events_ctx *e = cls;
  struct reader *rd;
  int n, waiting;
  int64_t newest;

  (void)pos;
  if (e->len)
    return copy_out(&e->buf, &e->len, &e->pos, out, max);
  for (;;) {
    if (e->s.client_gone || e->s.too_slow)
      return MHD_CONTENT_READER_END_WITH_ERROR;
    if (g.shutting_down)
      return MHD_CONTENT_READER_END_OF_STREAM;
    rd = reader_get();
    newest = db_last_event_seq(rd->db);
    if (newest - e->last_seq > EVENTS_MAX_BEHIND) {
      reader_put(rd);
      /* Catching up event by event would take longer than a fresh list:
       * say so, and end; the client lists and follows from there. */
      e->s.too_slow = 1;
      e->buf = strdup("event: too_far_behind\ndata: {\"message\": \"more than 100000 events "
                      "behind: list the workers again and follow from X-Muster-Last-Event\"}"
                      "\nretry: 1000\n\n");
      e->len = e->buf ? strlen(e->buf) : 0;
      e->pos = 0;
      return e->len ? copy_out(&e->buf, &e->len, &e->pos, out, max)
                    : MHD_CONTENT_READER_END_WITH_ERROR;
    }
    n = db_events_since(rd->db, e->last_seq, 512, &e->buf, &e->len, &e->last_seq);
    reader_put(rd);
    if (n < 0)
      return MHD_CONTENT_READER_END_WITH_ERROR;
    if (n == 0 && e->s.keepalive_due) {
      e->s.keepalive_due = 0;
      e->buf = strdup(": keepalive\n\n");
      e->len = e->buf ? strlen(e->buf) : 0;
    }
    if (e->len) {
      e->pos = 0;
      return copy_out(&e->buf, &e->len, &e->pos, out, max);
    }
    state_lock();
    waiting = stream_wait_locked(&e->s);
    state_unlock();
    if (waiting)
      return 0;
  }
}

static void events_free(void *cls) {
  struct events_ctx *e = cls;

  state_lock();
  stream_remove_locked(&e->s);
  state_unlock();
  free(e->buf);
  free(e);
}

static enum MHD_Result h_events(struct MHD_Connection *c) {
  const char *since = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "since");
  const char *last = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Last-Event-ID");
  struct events_ctx *e;
  struct MHD_Response *r;
  enum MHD_Result ret;
  long v = 0;

  /* A browser's EventSource reconnects with Last-Event-ID; it wins. */
  if (last && *last)
    since = last;
  if (since && util_parse_long(since, 0, 0x7fffffffffffffffL, &v) != 0)
    return respond_error(c, MUSTER_E_INVALID, "since", "since must be an event seq (>= 0)");
  e = calloc(1, sizeof(*e));
  if (!e)
    return MHD_NO;
  e->s.kind = STREAM_EVENTS;
  e->s.conn = c;
  e->last_seq = v;
  e->buf = strdup("retry: 1000\n\n");
  e->len = e->buf ? strlen(e->buf) : 0;
  r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16 * 1024, events_reader, e,
                                        events_free);
  if (!r) {
    free(e->buf);
    free(e);
    return MHD_NO;
  }
  state_lock();
  stream_add_locked(&e->s);
  state_unlock();
  MHD_add_response_header(r, "Content-Type", "text/event-stream");
  MHD_add_response_header(r, "Cache-Control", "no-store");
  ret = MHD_queue_response(c, MHD_HTTP_OK, r);
  MHD_destroy_response(r);
  return ret;
}

struct log_ctx {
  struct stream s;
  char path[700];
  int fd;
  off_t offset;
};

/* Reads the next bytes of the log file (opened once it exists). */
static ssize_t log_read(struct log_ctx *l, char *out, size_t max) {
  ssize_t n;

  if (l->fd < 0)
    l->fd = open(l->path, O_RDONLY | O_CLOEXEC);
  n = l->fd >= 0 ? pread(l->fd, out, max, l->offset) : 0;
  if (n > 0)
    l->offset += n;
  return n;
}

/* Next bytes of a followed log; suspends at its end while the worker is
 * live, ends the answer once the worker has ended and all is sent. The
 * file is read without the state lock; an append that lands between the
 * read and the wait marks the stream pending, so it reads again instead of
 * waiting (stream_wait_locked). */
static ssize_t log_reader(void *cls, uint64_t pos, char *out, size_t max) {
  struct log_ctx *l = cls;
  ssize_t n;
  int live, waiting;

  (void)pos;
  for (;;) {
    if (l->s.client_gone)
      return MHD_CONTENT_READER_END_WITH_ERROR;
    n = log_read(l, out, max);
    if (n > 0)
      return n;
    if (n < 0)
      return MHD_CONTENT_READER_END_WITH_ERROR;
    FAULT_POINT("log_follow_at_end");
    state_lock();
    live = !g.shutting_down && lw_find_locked(l->s.worker_id) != NULL;
    waiting = live ? stream_wait_locked(&l->s) : 0;
    state_unlock();
    if (waiting)
      return 0;
    if (!live) {
      /* Ended: what it wrote before its end is all there is. */
      n = log_read(l, out, max);
      return n > 0 ? n : n < 0 ? MHD_CONTENT_READER_END_WITH_ERROR
                               : MHD_CONTENT_READER_END_OF_STREAM;
    }
  }
}

static void log_free(void *cls) {
  struct log_ctx *l = cls;

  state_lock();
  stream_remove_locked(&l->s);
  state_unlock();
  if (l->fd >= 0)
    close(l->fd);
  free(l);
}

static enum MHD_Result h_logs(struct MHD_Connection *c, const char *id) {
  const char *stream = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "stream");
  const char *offs = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "offset");
  const char *follow = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "follow");
  struct MHD_Response *r;
  struct log_ctx *l;
  json_t *w;
  char path[700];
  long offset = 0;
  enum MHD_Result ret;

  if (log_path(id, stream, path, sizeof(path)) != 0)
    return respond_error(c, MUSTER_E_INVALID, "stream", "stream must be stdout or stderr");
  if (offs && util_parse_long(offs, 0, 0x7fffffffffffffffL, &offset) != 0)
    return respond_error(c, MUSTER_E_INVALID, "offset", "offset must be a byte offset (>= 0)");
  w = worker_read(id);
  if (!w)
    return respond_error(c, MUSTER_E_NOT_FOUND, "id", "there is no worker %s", id);
  json_decref(w);

  l = calloc(1, sizeof(*l));
  if (!l)
    return MHD_NO;
  l->s.kind = STREAM_LOG;
  l->s.conn = c;
  snprintf(l->s.worker_id, sizeof(l->s.worker_id), "%s", id);
  snprintf(l->path, sizeof(l->path), "%s", path);
  l->fd = open(path, O_RDONLY | O_CLOEXEC);
  l->offset = offset;
  if (!follow || strcmp(follow, "1") != 0) {
    struct stat st;
    off_t size = l->fd >= 0 && fstat(l->fd, &st) == 0 ? st.st_size : 0;
    int fd = l->fd;
    free(l);
    if (fd < 0 || offset >= size) {
      if (fd >= 0)
        close(fd);
      r = MHD_create_response_from_buffer(0, NULL, MHD_RESPMEM_PERSISTENT);
    } else {
      r = MHD_create_response_from_fd_at_offset64((uint64_t)(size - offset), fd,
                                                  (uint64_t)offset);
    }
  } else {
    r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 32 * 1024, log_reader, l,
                                          log_free);
    if (r) {
      state_lock();
      stream_add_locked(&l->s);
      state_unlock();
    } else {
      if (l->fd >= 0)
        close(l->fd);
      free(l);
    }
  }
  if (!r)
    return MHD_NO;
  MHD_add_response_header(r, "Content-Type", "text/plain; charset=utf-8");
  MHD_add_response_header(r, "Cache-Control", "no-store");
  ret = MHD_queue_response(c, MHD_HTTP_OK, r);
  MHD_destroy_response(r);
  return ret;
}

/* ---- health, metrics, web UI ---- */

static enum MHD_Result h_health(struct MHD_Connection *c) {
  json_t *counts;
  int shutting;

  struct reader *rd = reader_get();

  counts = db_status_counts(rd->db);
  reader_put(rd);
  shutting = g.shutting_down;
  return respond_json(c, shutting ? MHD_HTTP_SERVICE_UNAVAILABLE : MHD_HTTP_OK,
                      json_pack("{s:s, s:s, s:s, s:o}", "status",
                                shutting ? "shutting_down" : "ok", "version", MUSTER_VERSION,
                                "backend", g.cfg.backend, "workers", counts));
}

static enum MHD_Result h_metrics(struct MHD_Connection *c) {
  char *text = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&text, &len);
  struct MHD_Response *r;
  enum MHD_Result ret;
  json_t *counts, *v;
  const char *k;
  int waiters = 0, streams = 0;

  if (!f)
    return MHD_NO;
  struct reader *rd = reader_get();
  double cpu_used = 0, cpu_total = 0, mem_used = 0, mem_total = 0;

  counts = db_status_counts(rd->db);
  reader_put(rd);
  g.backend->usage(&cpu_used, &cpu_total, &mem_used, &mem_total);
  state_lock();
  for (struct waiter *wt = g.waiters; wt; wt = wt->next)
    waiters++;
  for (struct stream *s = g.streams; s; s = s->next)
    streams++;
  state_unlock();
  fprintf(f, "# HELP muster_workers Workers by status.\n# TYPE muster_workers gauge\n");
  json_object_foreach(counts, k, v)
      fprintf(f, "muster_workers{status=\"%s\"} %lld\n", k, (long long)json_integer_value(v));
  fprintf(f, "# HELP muster_cpu_used Cores held by live workers.\n# TYPE muster_cpu_used gauge\n"
             "muster_cpu_used %g\n",
          cpu_used);
  fprintf(f, "# HELP muster_cpu_capacity Cores of the backend.\n"
             "# TYPE muster_cpu_capacity gauge\nmuster_cpu_capacity %g\n",
          cpu_total);
  fprintf(f, "# HELP muster_memory_used_gib Memory held by live workers.\n"
             "# TYPE muster_memory_used_gib gauge\nmuster_memory_used_gib %g\n",
          mem_used);
  fprintf(f, "# HELP muster_memory_capacity_gib Memory of the backend.\n"
             "# TYPE muster_memory_capacity_gib gauge\nmuster_memory_capacity_gib %g\n",
          mem_total);
  fprintf(f, "# HELP muster_transitions_total State changes since start.\n"
             "# TYPE muster_transitions_total counter\nmuster_transitions_total %llu\n",
          (unsigned long long)g.transitions);
  fprintf(f, "# HELP muster_http_requests_total Requests since start.\n"
             "# TYPE muster_http_requests_total counter\nmuster_http_requests_total %llu\n",
          (unsigned long long)g.http_requests);
  fprintf(f, "# HELP muster_await_waiting Suspended await calls.\n"
             "# TYPE muster_await_waiting gauge\nmuster_await_waiting %d\n",
          waiters);
  fprintf(f, "# HELP muster_streams_waiting Open event streams and followed logs.\n"
             "# TYPE muster_streams_waiting gauge\nmuster_streams_waiting %d\n",
          streams);
  json_decref(counts);
  fclose(f);
  r = MHD_create_response_from_buffer(len, text, MHD_RESPMEM_MUST_FREE);
  MHD_add_response_header(r, "Content-Type", "text/plain; version=0.0.4");
  ret = MHD_queue_response(c, MHD_HTTP_OK, r);
  MHD_destroy_response(r);
  return ret;
}

static const char *content_type(const char *path) {
  const char *dot = strrchr(path, '.');

  if (!dot)
    return "application/octet-stream";
  if (strcmp(dot, ".html") == 0)
    return "text/html; charset=utf-8";
  if (strcmp(dot, ".js") == 0 || strcmp(dot, ".mjs") == 0)
    return "text/javascript; charset=utf-8";
  if (strcmp(dot, ".css") == 0)
    return "text/css; charset=utf-8";
  if (strcmp(dot, ".svg") == 0)
    return "image/svg+xml";
  if (strcmp(dot, ".png") == 0)
    return "image/png";
  if (strcmp(dot, ".json") == 0)
    return "application/json";
  return "application/octet-stream";
}

/* Serves a file of the web UI; the UI holds no data, so no token is needed
 * (every API call it makes needs one). */
static enum MHD_Result h_static(struct MHD_Connection *c, const char *url) {
  char path[1400];
  struct stat st;
  struct MHD_Response *r;
  enum MHD_Result ret;
  int fd;

  if (strcmp(url, "/") == 0)
    url = "/index.html";
  if (strstr(url, "..") || strlen(url) > 200)
    return respond_error(c, MUSTER_E_NOT_FOUND, NULL, "no such page");
  snprintf(path, sizeof(path), "%s%s", g.cfg.web_dir, url);
  fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0 || fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    if (fd >= 0)
      close(fd);
    return respond_error(c, MUSTER_E_NOT_FOUND, NULL, "no such page: %s", url);
  }
  r = MHD_create_response_from_fd64((uint64_t)st.st_size, fd);
  if (!r) {
    close(fd);
    return MHD_NO;
  }
  MHD_add_response_header(r, "Content-Type", content_type(path));
  ret = MHD_queue_response(c, MHD_HTTP_OK, r);
  MHD_destroy_response(r);
  return ret;
}

/* ---- routing ---- */

static enum MHD_Result route(struct MHD_Connection *c, struct req *rq, const char *url,
                             const char *method) {
  static const char prefix[] = "/api/v1/workers/";
  int get = strcmp(method, "GET") == 0, post = strcmp(method, "POST") == 0;
  int del = strcmp(method, "DELETE") == 0;

  if (strcmp(url, "/api/v1/health") == 0)
    return get ? h_health(c) : respond_error(c, MUSTER_E_METHOD, NULL, "use GET");
  if (strcmp(url, "/metrics") == 0)
    return get ? h_metrics(c) : respond_error(c, MUSTER_E_METHOD, NULL, "use GET");
  if (strncmp(url, "/api/", 5) != 0)
    return get ? h_static(c, url) : respond_error(c, MUSTER_E_METHOD, NULL, "use GET");

  if (strncmp(url, prefix, sizeof(prefix) - 1) == 0) {
    char id[16];
    const char *rest = url + sizeof(prefix) - 1;
    size_t idlen = strcspn(rest, "/");
    const char *sub = rest + idlen;

    if (idlen < sizeof(id)) {
      memcpy(id, rest, idlen);
      id[idlen] = '\0';
      if (validate_worker_id(id)) {
        /* The worker's own calls carry its token, not the client's. */
        if (post && strcmp(sub, "/register") == 0)
          return h_register(c, rq, id);
        if (post && strcmp(sub, "/heartbeat") == 0)
          return h_heartbeat(c, id);
        if (post && strcmp(sub, "/exit") == 0)
          return h_exit(c, rq, id);
        if (post && strcmp(sub, "/logs") == 0)
          return h_log_append(c, rq, id);
      }
    }
  }
  if (!client_ok(c) && !events_query_token_ok(c, url, method))
    return respond_error(c, MUSTER_E_UNAUTHORIZED, NULL,
                         bearer(c) ? "the bearer token is not valid"
                                   : "this call needs \"Authorization: Bearer <token>\" (the "
                                     "token is in the controller's state directory)");

  if (strcmp(url, "/api/v1/workers") == 0) {
    if (post)
      return h_launch(c, rq);
    return get ? h_list(c) : respond_error(c, MUSTER_E_METHOD, NULL, "use GET or POST");
  }
  if (strcmp(url, "/api/v1/workers/await") == 0)
    return post ? h_await(c, rq) : respond_error(c, MUSTER_E_METHOD, NULL, "use POST");
  if (strcmp(url, "/api/v1/workers/stop") == 0)
    return post ? h_stop(c, rq) : respond_error(c, MUSTER_E_METHOD, NULL, "use POST");
  if (strcmp(url, "/api/v1/events") == 0)
    return get ? h_events(c) : respond_error(c, MUSTER_E_METHOD, NULL, "use GET");
  if (strncmp(url, "/api/v1/sessions/", 17) == 0)
    return get ? h_session(c, url + 17) : respond_error(c, MUSTER_E_METHOD, NULL, "use GET");
  if (strncmp(url, prefix, sizeof(prefix) - 1) == 0) {
    const char *rest = url + sizeof(prefix) - 1;
    char id[16];
    size_t idlen = strcspn(rest, "/");

    if (idlen >= sizeof(id))
      return respond_error(c, MUSTER_E_NOT_FOUND, "id", "there is no such worker");
    memcpy(id, rest, idlen);
    id[idlen] = '\0';
    if (!validate_worker_id(id))
      return respond_error(c, MUSTER_E_NOT_FOUND, "id", "\"%s\" is not a worker id", id);
    if (rest[idlen] == '\0') {
      if (get)
        return h_get(c, id);
      return del ? h_delete(c, id) : respond_error(c, MUSTER_E_METHOD, NULL, "use GET or DELETE");
    }
    if (strcmp(rest + idlen, "/logs") == 0)
      return get ? h_logs(c, id) : respond_error(c, MUSTER_E_METHOD, NULL, "use GET");
  }
  return respond_error(c, MUSTER_E_NOT_FOUND, NULL, "no such endpoint: %s %s", method, url);
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
    return await_finish(c, rq);
  __atomic_add_fetch(&g.http_requests, 1, __ATOMIC_RELAXED);
  if (rq->too_large) {
    free(rq->body);
    rq->body = NULL;
    rq->len = 0;
    return respond_error(c, MUSTER_E_TOO_LARGE, NULL, "the request body is larger than 1 MiB");
  }
  if (g.shutting_down && strcmp(url, "/api/v1/health") != 0)
    return respond_error(c, MUSTER_E_SHUTTING_DOWN, NULL, NULL);
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
    waiter_free(rq->waiter);
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
      MHD_USE_EPOLL_INTERNAL_THREAD | MHD_ALLOW_SUSPEND_RESUME | MHD_USE_ERROR_LOG, 0, NULL,
      NULL, handle, NULL, MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&addr,
      MHD_OPTION_THREAD_POOL_SIZE, (unsigned)g.cfg.http_threads, MHD_OPTION_NOTIFY_COMPLETED,
      completed, NULL, MHD_OPTION_CONNECTION_LIMIT, (unsigned)16000,
      MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)300, MHD_OPTION_LISTEN_BACKLOG_SIZE,
      (unsigned)4096, MHD_OPTION_LISTENING_ADDRESS_REUSE, (unsigned)1,
      MHD_OPTION_EXTERNAL_LOGGER, mhd_log, NULL, MHD_OPTION_END);
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
