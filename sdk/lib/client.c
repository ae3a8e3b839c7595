/* client.c: libmuster, see muster.h. */
#include "internal.h"
#include "muster.h"
#include "util.h"

#include <curl/curl.h>
#include <errno.h>
#include <jansson.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

/* Answers are capped: a controller (or something pretending to be one)
 * cannot make the client allocate without bound. */
#define MAX_ANSWER (256L * 1024 * 1024)
#define MAX_SSE_RECORD (1024 * 1024)

struct muster_client {
  CURL *curl;
  char *url;
  char auth[256];
  double timeout_s;
  char errmsg[1024];
  char errfield[64];
  int has_errfield;
  int cancel;       /* sticky: once set, every call returns at once */
  long last_status; /* the HTTP status of the last answer (0: none) */
  /* The socket of the transfer in progress, so that a cancel from another
   * thread can wake it at once (libcurl looks at its progress callback only
   * about once a second on an idle stream). */
  pthread_mutex_t sock_lock;
  curl_socket_t sock;
};

struct buf {
  char *data;
  size_t len;
  int too_big;
};

static pthread_once_t curl_once = PTHREAD_ONCE_INIT;
static void curl_init_once(void) {
  curl_global_init(CURL_GLOBAL_DEFAULT);
}

static const char *const status_names[] = {
#define MUSTER_X_STATUS(sym, name, terminal) name,
    MUSTER_STATUSES(MUSTER_X_STATUS)
#undef MUSTER_X_STATUS
        "unknown"};

const char *muster_status_name(muster_status s) {
  return (unsigned)s <= MUSTER_STATUS_UNKNOWN ? status_names[s] : "unknown";
}

int muster_worker_usage(const muster_worker *w, muster_usage *u) {
  json_t *o = w && w->json ? json_loads(w->json, 0, NULL) : NULL;
  json_t *us = o ? json_object_get(o, "usage") : NULL;
  int ok = json_is_object(us);

  if (ok) {
    u->cpu_seconds = json_number_value(json_object_get(us, "cpu_seconds"));
    u->memory_bytes = (long long)json_integer_value(json_object_get(us, "memory_bytes"));
    u->memory_peak_bytes = (long long)json_integer_value(json_object_get(us, "memory_peak_bytes"));
  }
  json_decref(o);
  return ok;
}

int muster_status_terminal(muster_status s) {
  switch (s) {
#define MUSTER_X_STATUS(sym, name, terminal)                                                       \
  case MUSTER_##sym:                                                                               \
    return terminal;
    MUSTER_STATUSES(MUSTER_X_STATUS)
#undef MUSTER_X_STATUS
  case MUSTER_STATUS_UNKNOWN:
    return 0;
  }
  return 0;
}

static muster_status status_parse(const char *name) {
  for (int i = 0; name && i < MUSTER_STATUS_UNKNOWN; i++)
    if (strcmp(name, status_names[i]) == 0)
      return (muster_status)i;
  return MUSTER_STATUS_UNKNOWN;
}

static int set_error(muster_client *c, int err, const char *field, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* Records the message of a failed call and returns err. */
static int set_error(muster_client *c, int err, const char *field, const char *fmt, ...) {
  va_list ap;

  va_start(ap, fmt);
  vsnprintf(c->errmsg, sizeof(c->errmsg), fmt, ap);
  va_end(ap);
  c->has_errfield = field != NULL;
  snprintf(c->errfield, sizeof(c->errfield), "%s", field ? field : "");
  return err;
}

static void clear_error(muster_client *c) {
  c->errmsg[0] = '\0';
  c->has_errfield = 0;
}

const char *muster_client_errmsg(const muster_client *c) {
  return c ? c->errmsg : "";
}
const char *muster_client_errfield(const muster_client *c) {
  return c && c->has_errfield ? c->errfield : NULL;
}
const char *muster_client_url(const muster_client *c) {
  return c->url;
}
void muster_client_set_timeout(muster_client *c, double seconds) {
  c->timeout_s = seconds;
}
void muster_client_cancel(muster_client *c) {
  __atomic_store_n(&c->cancel, 1, __ATOMIC_SEQ_CST);
  pthread_mutex_lock(&c->sock_lock);
  if (c->sock != CURL_SOCKET_BAD)
    shutdown(c->sock, SHUT_RDWR);
  pthread_mutex_unlock(&c->sock_lock);
}

static int cancelled(muster_client *c) {
  return __atomic_load_n(&c->cancel, __ATOMIC_SEQ_CST);
}

static int progress_cb(void *arg, curl_off_t a, curl_off_t b, curl_off_t c2, curl_off_t d) {
  muster_client *c = arg;

  (void)a;
  (void)b;
  (void)c2;
  (void)d;
  return cancelled(c) ? 1 : 0;
}

static curl_socket_t open_socket(void *arg, curlsocktype purpose, struct curl_sockaddr *a) {
  muster_client *c = arg;
  curl_socket_t fd;

  (void)purpose;
  if (cancelled(c))
    return CURL_SOCKET_BAD;
  fd = socket(a->family, a->socktype | SOCK_CLOEXEC, a->protocol);
  pthread_mutex_lock(&c->sock_lock);
  c->sock = fd;
  pthread_mutex_unlock(&c->sock_lock);
  return fd;
}

static int close_socket(void *arg, curl_socket_t fd) {
  muster_client *c = arg;

  pthread_mutex_lock(&c->sock_lock);
  if (c->sock == fd)
    c->sock = CURL_SOCKET_BAD;
  pthread_mutex_unlock(&c->sock_lock);
  return close(fd);
}

/* Options every transfer of c gets. */
static void common_opts(muster_client *c, const char *url, struct curl_slist *hdrs, char *cerr) {
  curl_easy_setopt(c->curl, CURLOPT_URL, url);
  curl_easy_setopt(c->curl, CURLOPT_HTTPHEADER, hdrs);
  curl_easy_setopt(c->curl, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(c->curl, CURLOPT_NOPROXY, "*");
  curl_easy_setopt(c->curl, CURLOPT_ERRORBUFFER, cerr);
  curl_easy_setopt(c->curl, CURLOPT_CONNECTTIMEOUT_MS, 5000L);
  curl_easy_setopt(c->curl, CURLOPT_OPENSOCKETFUNCTION, open_socket);
  curl_easy_setopt(c->curl, CURLOPT_OPENSOCKETDATA, c);
  curl_easy_setopt(c->curl, CURLOPT_CLOSESOCKETFUNCTION, close_socket);
  curl_easy_setopt(c->curl, CURLOPT_CLOSESOCKETDATA, c);
  curl_easy_setopt(c->curl, CURLOPT_NOPROGRESS, 0L);
  curl_easy_setopt(c->curl, CURLOPT_XFERINFOFUNCTION, progress_cb);
  curl_easy_setopt(c->curl, CURLOPT_XFERINFODATA, c);
}

int muster_client_new(const char *url, const char *token, muster_client **out) {
  muster_client *c;
  size_t n;

  *out = NULL;
  if (!url || (strncmp(url, "http://", 7) != 0 && strncmp(url, "https://", 8) != 0) || !token ||
      !*token || strlen(token) > 200 || strpbrk(token, " \r\n\t"))
    return MUSTER_E_INVALID;
  pthread_once(&curl_once, curl_init_once);
  c = calloc(1, sizeof(*c));
  if (!c)
    return MUSTER_E_NOMEM;
  pthread_mutex_init(&c->sock_lock, NULL);
  c->sock = CURL_SOCKET_BAD;
  c->url = strdup(url);
  c->curl = curl_easy_init();
  if (!c->url || !c->curl) {
    muster_client_free(c);
    return MUSTER_E_NOMEM;
  }
  n = strlen(c->url);
  while (n > 8 && c->url[n - 1] == '/')
    c->url[--n] = '\0';
  snprintf(c->auth, sizeof(c->auth), "Authorization: Bearer %s", token);
  c->timeout_s = 30;
  *out = c;
  return 0;
}

/* Reads the first line of path into buf; 0 or -1. */
static MUST_CHECK int read_line(const char *path, char *buf, size_t size) {
  FILE *f = fopen(path, "r");
  int ok;

  if (!f)
    return -1;
  ok = fgets(buf, (int)size, f) != NULL;
  fclose(f);
  buf[strcspn(buf, "\r\n")] = '\0';
  return ok && buf[0] ? 0 : -1;
}

int muster_client_new_default(muster_client **out) {
  const char *url = getenv("MUSTER_URL"), *token = getenv("MUSTER_TOKEN");
  const char *dir = getenv("MUSTER_STATE_DIR"), *home = getenv("HOME");
  char dirbuf[1024], path[1100], urlbuf[512], tokbuf[256];

  *out = NULL;
  if (!dir || !*dir) {
    snprintf(dirbuf, sizeof(dirbuf), "%s/.muster", home ? home : ".");
    dir = dirbuf;
  }
  if (!url || !*url) {
    snprintf(path, sizeof(path), "%s/url", dir);
    if (read_line(path, urlbuf, sizeof(urlbuf)) != 0)
      return MUSTER_E_UNREACHABLE;
    url = urlbuf;
  }
  if (!token || !*token) {
    snprintf(path, sizeof(path), "%s/token", dir);
    if (read_line(path, tokbuf, sizeof(tokbuf)) != 0)
      return MUSTER_E_UNAUTHORIZED;
    token = tokbuf;
  }
  return muster_client_new(url, token, out);
}

void muster_client_free(muster_client *c) {
  if (!c)
    return;
  if (c->curl)
    curl_easy_cleanup(c->curl);
  pthread_mutex_destroy(&c->sock_lock);
  free(c->url);
  free(c);
}

/* ---- HTTP ---- */

static size_t collect(char *p, size_t size, size_t n, void *arg) {
  struct buf *b = arg;
  size_t add = size * n;
  char *grown;

  if (b->len + add > (size_t)MAX_ANSWER) {
    b->too_big = 1;
    return 0;
  }
  grown = realloc(b->data, b->len + add + 1);
  if (!grown)
    return 0;
  b->data = grown;
  memcpy(b->data + b->len, p, add);
  b->len += add;
  b->data[b->len] = '\0';
  return add;
}

/* Maps an error answer (status >= 400, body b) to a muster error. */
static int answer_error(muster_client *c, long status, const struct buf *b) {
  json_t *j = b->data ? json_loadb(b->data, b->len, 0, NULL) : NULL;
  json_t *e = json_object_get(j, "error");
  const char *code = json_string_value(json_object_get(e, "code"));
  const char *msg = json_string_value(json_object_get(e, "message"));
  const char *field = json_string_value(json_object_get(e, "field"));
  int err;

  if (code) {
    err = muster_error_from_name(code);
    set_error(c, err, field, "%s", msg ? msg : muster_strerror(err));
  } else {
    err = status == 401   ? MUSTER_E_UNAUTHORIZED
          : status == 404 ? MUSTER_E_NOT_FOUND
                          : MUSTER_E_PROTOCOL;
    set_error(c, err, NULL, "the controller answered HTTP %ld", status);
  }
  json_decref(j);
  return err;
}

/* One call: method path (with query), body (JSON text or NULL). On success
 * (2xx) *answer (if not NULL) gets the parsed JSON (new reference; NULL for
 * an empty body) and *hdr_seq the X-Muster-Last-Event header if asked.
 * timeout_s 0 means none. write/wdata replace the collecting of the body
 * (streaming). */
struct call {
  const char *method, *path, *body;
  double timeout_s;
  json_t **answer;
  int64_t *hdr_seq;
};

static size_t header_cb(char *p, size_t size, size_t n, void *arg) {
  int64_t *seq = arg;
  size_t len = size * n;
  static const char name[] = "x-muster-last-event:";

  if (seq && len > sizeof(name) - 1 && strncasecmp(p, name, sizeof(name) - 1) == 0) {
    char *end;
    long long v = strtoll(p + sizeof(name) - 1, &end, 10);
    /* A header line ends with CR LF; anything else is not a seq. */
    if (end != p + sizeof(name) - 1 && (*end == '\r' || *end == '\n'))
      *seq = v;
  }
  return len;
}

/* The start of every call: no error yet, not cancelled, the URL of path
 * (in url), a reset handle with the common options and the headers (*hdrs,
 * freed by the caller). Returns 0 or an error already recorded. */
static int prepare(muster_client *c, const char *path, int json_body, char *url, size_t size,
                   char *cerr, struct curl_slist **hdrs) {
  clear_error(c);
  if (cancelled(c))
    return set_error(c, MUSTER_E_SHUTTING_DOWN, NULL, "cancelled");
  if (snprintf(url, size, "%s%s", c->url, path) >= (int)size)
    return set_error(c, MUSTER_E_INVALID, NULL, "the request URL is too long");
  curl_easy_reset(c->curl);
  *hdrs = curl_slist_append(NULL, c->auth);
  if (json_body)
    *hdrs = curl_slist_append(*hdrs, "Content-Type: application/json");
  common_opts(c, url, *hdrs, cerr);
  return 0;
}

static MUST_CHECK int http(muster_client *c, const struct call *k) {
  struct curl_slist *hdrs = NULL;
  struct buf b = {NULL, 0, 0};
  char url[2048], cerr[CURL_ERROR_SIZE] = "";
  long status = 0;
  CURLcode cc;
  int rc = 0;

  if ((rc = prepare(c, k->path, k->body != NULL, url, sizeof(url), cerr, &hdrs)))
    return rc;
  curl_easy_setopt(c->curl, CURLOPT_CUSTOMREQUEST, k->method);
  if (k->timeout_s > 0)
    curl_easy_setopt(c->curl, CURLOPT_TIMEOUT_MS, (long)(k->timeout_s * 1000));
  if (k->body) {
    curl_easy_setopt(c->curl, CURLOPT_POSTFIELDS, k->body);
    curl_easy_setopt(c->curl, CURLOPT_POSTFIELDSIZE, (long)strlen(k->body));
  }
  curl_easy_setopt(c->curl, CURLOPT_WRITEFUNCTION, collect);
  curl_easy_setopt(c->curl, CURLOPT_WRITEDATA, &b);
  curl_easy_setopt(c->curl, CURLOPT_HEADERFUNCTION, header_cb);
  curl_easy_setopt(c->curl, CURLOPT_HEADERDATA, k->hdr_seq);

  cc = curl_easy_perform(c->curl);
  curl_easy_getinfo(c->curl, CURLINFO_RESPONSE_CODE, &status);
  c->last_status = status;
  curl_slist_free_all(hdrs);
  if (cc == CURLE_ABORTED_BY_CALLBACK || (cc != CURLE_OK && cancelled(c))) {
    rc = set_error(c, MUSTER_E_SHUTTING_DOWN, NULL, "cancelled");
  } else if (cc == CURLE_WRITE_ERROR && b.too_big) {
    rc = set_error(c, MUSTER_E_TOO_LARGE, NULL, "the controller's answer is larger than 256 MiB");
  } else if (cc == CURLE_OPERATION_TIMEDOUT && status == 0) {
    rc =
        set_error(c, MUSTER_E_TIMEOUT, NULL, "no answer from %s within %g s", c->url, k->timeout_s);
  } else if (cc != CURLE_OK && status == 0) {
    rc = set_error(c, MUSTER_E_UNREACHABLE, NULL, "could not reach the controller at %s: %s",
                   c->url, cerr[0] ? cerr : curl_easy_strerror(cc));
  } else if (status >= 400) {
    rc = answer_error(c, status, &b);
  } else if (cc != CURLE_OK) {
    rc = set_error(c, MUSTER_E_PROTOCOL, NULL, "the answer from %s broke off: %s", c->url,
                   cerr[0] ? cerr : curl_easy_strerror(cc));
  } else if (k->answer) {
    json_error_t jerr;
    *k->answer = NULL;
    if (b.len) {
      *k->answer = json_loadb(b.data, b.len, 0, &jerr);
      if (!*k->answer)
        rc = set_error(c, MUSTER_E_PROTOCOL, NULL, "the controller's answer is not JSON: %s",
                       jerr.text);
    }
  }
  free(b.data);
  return rc;
}

/* ---- worker objects ---- */

static char *jdup(json_t *o, const char *key) {
  const char *v = json_string_value(json_object_get(o, key));
  return v ? strdup(v) : NULL;
}

static void worker_from_json(json_t *o, muster_worker *w) {
  json_t *v;

  memset(w, 0, sizeof(*w));
  w->json = json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER);
  snprintf(w->id, sizeof(w->id), "%s",
           json_string_value(json_object_get(o, "id")) ? json_string_value(json_object_get(o, "id"))
                                                       : "");
  w->status = status_parse(json_string_value(json_object_get(o, "status")));
  w->session = jdup(o, "session");
  w->name = jdup(o, "name");
  w->role = jdup(o, "role");
  w->cpu = json_number_value(json_object_get(o, "cpu"));
  w->memory = json_number_value(json_object_get(o, "memory"));
  w->nvidia_gpu = (int)json_integer_value(json_object_get(o, "nvidia_gpu"));
  w->script = jdup(o, "script");
  w->code = jdup(o, "code");
  w->kernel = jdup(o, "kernel");
  w->ip_address = jdup(o, "ip_address");
  w->hostname = jdup(o, "hostname");
  w->exec_port = (int)json_integer_value(json_object_get(o, "exec_port"));
  w->backend = jdup(o, "backend");
  w->backend_ref = jdup(o, "backend_ref");
  v = json_object_get(o, "exit_code");
  w->has_exit_code = json_is_integer(v);
  w->exit_code = (int)json_integer_value(v);
  w->signal = (int)json_integer_value(json_object_get(o, "signal"));
  w->failure = jdup(o, "failure");
  w->created_at = jdup(o, "created_at");
  w->running_at = jdup(o, "running_at");
  w->finished_at = jdup(o, "finished_at");
  w->last_heartbeat = jdup(o, "last_heartbeat");
}

void muster_worker_cleanup(muster_worker *w) {
  if (!w)
    return;
  free(w->session);
  free(w->name);
  free(w->role);
  free(w->script);
  free(w->code);
  free(w->kernel);
  free(w->ip_address);
  free(w->hostname);
  free(w->backend);
  free(w->backend_ref);
  free(w->failure);
  free(w->created_at);
  free(w->running_at);
  free(w->finished_at);
  free(w->last_heartbeat);
  free(w->json);
  memset(w, 0, sizeof(*w));
}

void muster_worker_list_free(muster_worker_list *l) {
  if (!l)
    return;
  for (size_t i = 0; i < l->count; i++)
    muster_worker_cleanup(&l->items[i]);
  free(l->items);
  l->items = NULL;
  l->count = 0;
}

static int list_from_json(muster_client *c, json_t *arr, muster_worker_list *out) {
  size_t i;
  json_t *o;

  out->count = 0;
  out->items = NULL;
  if (!json_is_array(arr))
    return set_error(c, MUSTER_E_PROTOCOL, NULL, "the controller's answer has no worker list");
  out->items = calloc(json_array_size(arr) + 1, sizeof(*out->items));
  if (!out->items)
    return set_error(c, MUSTER_E_NOMEM, NULL, "out of memory");
  json_array_foreach(arr, i, o) worker_from_json(o, &out->items[out->count++]);
  return 0;
}

/* ---- calls ---- */

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
      set_error(c, MUSTER_E_INVALID, what, "%s entry \"%.60s\" is not NAME=value", what,
                v[i] ? v[i] : "(null)");
      return NULL;
    }
    memcpy(key, v[i], (size_t)(eq - v[i]));
    key[eq - v[i]] = '\0';
    json_object_set_new(o, key, json_string(eq + 1));
  }
  return o;
}

/* Runs a JSON call whose body is req (stolen). */
static MUST_CHECK int json_call(muster_client *c, const char *method, const char *path, json_t *req,
                                double timeout_s, json_t **answer) {
  char *text = req ? json_dumps(req, JSON_COMPACT) : NULL;
  struct call k = {method, path, text, timeout_s, answer, NULL};
  int rc;

  json_decref(req);
  if (req && !text)
    return set_error(c, MUSTER_E_NOMEM, NULL, "out of memory");
  rc = http(c, &k);
  free(text);
  return rc;
}

/* The launch body of o: a new object, or NULL with c's error set. */
static json_t *launch_body(muster_client *c, const muster_launch_opts *o) {
  json_t *req = json_object(), *env = NULL, *secret = NULL;

  if (!req)
    return NULL;
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
    return set_error(c, MUSTER_E_INVALID, "groups", "a launch has 1 to 16 groups, not %zu", n);
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
      return set_error(c, MUSTER_E_NOMEM, NULL, "out of memory");
  }
  rc = json_call(c, "POST", "/api/v1/workers", req, c->timeout_s, &ans);
  if (!rc)
    rc = list_from_json(c, json_object_get(ans, "workers"), out);
  json_decref(ans);
  return rc;
}

static int id_ok(muster_client *c, const char *id) {
  if (!id || strlen(id) != 12 || strncmp(id, "w-", 2) != 0 ||
      strspn(id + 2, "abcdefghijklmnopqrstuvwxyz0123456789") != 10)
    return set_error(c, MUSTER_E_INVALID, "id", "\"%.40s\" is not a worker id (like w-3kf9x2m1qa)",
                     id ? id : "(null)");
  return 0;
}

int muster_get(muster_client *c, const char *id, muster_worker *out) {
  char path[64];
  json_t *ans = NULL;
  int rc;

  memset(out, 0, sizeof(*out));
  if ((rc = id_ok(c, id)))
    return rc;
  snprintf(path, sizeof(path), "/api/v1/workers/%s", id);
  rc = json_call(c, "GET", path, NULL, c->timeout_s, &ans);
  if (!rc) {
    if (json_is_object(ans))
      worker_from_json(ans, out);
    else
      rc = set_error(c, MUSTER_E_PROTOCOL, NULL, "the controller's answer is not a worker");
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
    return set_error(c, MUSTER_E_NOMEM, NULL, "out of memory");
  n = snprintf(path + len, size - len, "%c%s=%s", strchr(path, '?') ? '&' : '?', key, esc);
  curl_free(esc);
  if (n < 0 || (size_t)n >= size - len)
    return set_error(c, MUSTER_E_INVALID, key, "%s is too long", key);
  return 0;
}

int muster_list(muster_client *c, unsigned statuses, const char *session, const char *role,
                muster_worker_list *out, int64_t *last_event) {
  char path[512] = "/api/v1/workers?limit=5000", page[600];
  json_t *ans = NULL, *all = json_array();
  int64_t seq = 0, first_seq = 0;
  const char *next = NULL;
  int rc = all ? 0 : set_error(c, MUSTER_E_NOMEM, NULL, "out of memory");

  out->count = 0;
  out->items = NULL;
  for (int s = 0; !rc && s < MUSTER_STATUS_UNKNOWN; s++)
    if (statuses & (1u << s))
      rc = query_add(c, path, sizeof(path), "status", status_names[s]);
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
      rc = set_error(c, MUSTER_E_PROTOCOL, NULL, "the controller's page cursor is malformed");
      break;
    }
    snprintf(page, sizeof(page), "%s%s%s", path, next ? "&before=" : "", next ? next : "");
    json_decref(ans);
    ans = NULL;
    rc = http(c, &k);
    if (rc)
      break;
    if (first)
      first_seq = seq;
    items = json_object_get(ans, "workers");
    if (!json_is_array(items)) {
      rc = set_error(c, MUSTER_E_PROTOCOL, NULL, "the controller's answer has no worker list");
      break;
    }
    json_array_extend(all, items);
    next = json_string_value(json_object_get(ans, "next"));
  }
  if (!rc)
    rc = list_from_json(c, all, out);
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
    if ((rc = id_ok(c, ids[i])))
      return rc;
  req = json_pack("{s:o, s:b, s:f}", "ids", strv(ids, nids), "wait_for_completion",
                  wait_for_completion, "timeout_seconds", timeout_seconds);
  /* The controller answers by the timeout (+1 s); the transport waits a
   * little longer so that it never cuts the answer off. */
  rc = json_call(c, "POST", "/api/v1/workers/await", req,
                 timeout_seconds > 0 ? timeout_seconds + 30 : 0, &ans);
  if (!rc)
    rc = list_from_json(c, json_object_get(ans, "workers"), &out->workers);
  if (!rc)
    rc = list_from_json(c, json_object_get(ans, "failures"), &out->failures);
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
    if ((rc = id_ok(c, ids[i]))) {
      json_decref(req);
      return rc;
    }
  if (nids)
    json_object_set_new(req, "ids", strv(ids, nids));
  if (session)
    json_object_set_new(req, "session", json_string(session));
  rc = json_call(c, "POST", "/api/v1/workers/stop", req, c->timeout_s, &ans);
  if (!rc)
    rc = list_from_json(c, json_object_get(ans, "workers"), out ? out : &none);
  if (!out && !rc)
    muster_worker_list_free(&none);
  json_decref(ans);
  return rc;
}

/* ---- streaming ---- */

struct logs_ctx {
  muster_data_cb cb;
  void *arg;
  int stopped;
  struct buf err; /* an error answer's body */
};

static size_t logs_write(char *p, size_t size, size_t n, void *arg) {
  struct logs_ctx *l = arg;

  if (l->stopped)
    return 0;
  if (l->cb(l->arg, p, size * n)) {
    l->stopped = 1;
    return 0;
  }
  return size * n;
}

/* Streams a 2xx body to write; an error body is collected in err. */
struct stream_call {
  muster_client *c;
  curl_write_callback write;
  void *wdata;
  struct buf *err;
};

static size_t stream_dispatch(char *p, size_t size, size_t n, void *arg) {
  struct stream_call *s = arg;
  long status = 0;

  curl_easy_getinfo(s->c->curl, CURLINFO_RESPONSE_CODE, &status);
  if (status >= 400)
    return collect(p, size, n, s->err);
  return s->write(p, size, n, s->wdata);
}

/* Like http() for a GET whose answer is streamed to write. Returns 0 also
 * when the writer ended the transfer on purpose (*stopped set). */
static MUST_CHECK int http_stream(muster_client *c, const char *path, curl_write_callback write,
                                  void *wdata, const int *stopped, long silence_s) {
  struct curl_slist *hdrs = NULL;
  struct buf err = {NULL, 0, 0};
  struct stream_call s = {c, write, wdata, &err};
  char url[2048], cerr[CURL_ERROR_SIZE] = "";
  long status = 0;
  CURLcode cc;
  int rc = 0;

  if ((rc = prepare(c, path, 0, url, sizeof(url), cerr, &hdrs)))
    return rc;
  curl_easy_setopt(c->curl, CURLOPT_WRITEFUNCTION, stream_dispatch);
  curl_easy_setopt(c->curl, CURLOPT_WRITEDATA, &s);
  /* The controller sends a keep-alive every 15 s on event streams, so a
   * minute of silence there means it is gone. A followed log may be quiet
   * for as long as the worker is (silence_s 0). */
  if (silence_s > 0) {
    curl_easy_setopt(c->curl, CURLOPT_LOW_SPEED_LIMIT, 1L);
    curl_easy_setopt(c->curl, CURLOPT_LOW_SPEED_TIME, silence_s);
  }
  cc = curl_easy_perform(c->curl);
  curl_easy_getinfo(c->curl, CURLINFO_RESPONSE_CODE, &status);
  c->last_status = status;
  curl_slist_free_all(hdrs);
  if (status >= 400)
    rc = answer_error(c, status, &err);
  else if (cc == CURLE_WRITE_ERROR && *stopped)
    rc = 0;
  else if (cc == CURLE_ABORTED_BY_CALLBACK || (cc != CURLE_OK && cancelled(c)))
    rc = set_error(c, MUSTER_E_SHUTTING_DOWN, NULL, "cancelled");
  else if (cc != CURLE_OK && status == 0)
    rc = set_error(c, MUSTER_E_UNREACHABLE, NULL, "could not reach the controller at %s: %s",
                   c->url, cerr[0] ? cerr : curl_easy_strerror(cc));
  else if (cc != CURLE_OK)
    rc = set_error(c, MUSTER_E_PROTOCOL, NULL, "the stream from %s broke off: %s", c->url,
                   cerr[0] ? cerr : curl_easy_strerror(cc));
  free(err.data);
  return rc;
}

int muster_logs(muster_client *c, const char *id, muster_stream stream, int64_t offset, int follow,
                muster_data_cb cb, void *arg) {
  struct logs_ctx l = {cb, arg, 0, {NULL, 0, 0}};
  char path[128];
  int rc;

  if ((rc = id_ok(c, id)))
    return rc;
  if (offset < 0)
    return set_error(c, MUSTER_E_INVALID, "offset", "offset must be >= 0");
  snprintf(path, sizeof(path), "/api/v1/workers/%s/logs?stream=%s&offset=%lld%s", id,
           stream == MUSTER_STDERR ? "stderr" : "stdout", (long long)offset,
           follow ? "&follow=1" : "");
  return http_stream(c, path, logs_write, &l, &l.stopped, 0);
}

struct events_ctx {
  muster_event_cb cb;
  void *arg;
  int stopped;
  char *rec;
  size_t len;
};

/* Handles one SSE record ("id: N\ndata: {...}"). Returns non-zero to stop. */
static int sse_record(struct events_ctx *e, char *rec) {
  char *data = strstr(rec, "data: ");
  json_t *j;
  muster_event ev;
  int stop;

  if (!data)
    return 0; /* a comment (keep-alive) or a retry: line */
  data += 6;
  data[strcspn(data, "\n")] = '\0';
  j = json_loads(data, 0, NULL);
  if (!j)
    return 0;
  memset(&ev, 0, sizeof(ev));
  ev.seq = json_integer_value(json_object_get(j, "seq"));
  snprintf(ev.worker_id, sizeof(ev.worker_id), "%s",
           json_string_value(json_object_get(j, "worker_id"))
               ? json_string_value(json_object_get(j, "worker_id"))
               : "");
  ev.from = status_parse(json_string_value(json_object_get(j, "from")));
  ev.to = status_parse(json_string_value(json_object_get(j, "to")));
  ev.at = json_string_value(json_object_get(j, "at"));
  ev.detail = json_string_value(json_object_get(j, "detail"));
  stop = e->cb(e->arg, &ev);
  json_decref(j);
  return stop;
}

static size_t events_write(char *p, size_t size, size_t n, void *arg) {
  struct events_ctx *e = arg;
  size_t len = size * n;
  char *end, *grown;

  if (e->len + len > MAX_SSE_RECORD)
    return 0; /* a record larger than any event: not a muster stream */
  grown = realloc(e->rec, e->len + len + 1);
  if (!grown)
    return 0;
  e->rec = grown;
  memcpy(e->rec + e->len, p, len);
  e->len += len;
  e->rec[e->len] = '\0';
  while ((end = strstr(e->rec, "\n\n")) != NULL) {
    size_t used = (size_t)(end - e->rec) + 2;
    *end = '\0';
    if (sse_record(e, e->rec)) {
      e->stopped = 1;
      return 0;
    }
    memmove(e->rec, e->rec + used, e->len - used + 1);
    e->len -= used;
  }
  return len;
}

int muster_events(muster_client *c, int64_t since, muster_event_cb cb, void *arg) {
  struct events_ctx e = {cb, arg, 0, NULL, 0};
  char path[96];
  int rc;

  if (since < 0)
    return set_error(c, MUSTER_E_INVALID, "since", "since must be >= 0");
  snprintf(path, sizeof(path), "/api/v1/events?since=%lld", (long long)since);
  rc = http_stream(c, path, events_write, &e, &e.stopped, 60);
  free(e.rec);
  return rc;
}

int muster_session_exec_token(muster_client *c, const char *session, char *buf, size_t size) {
  char path[160];
  json_t *ans = NULL;
  const char *tok;
  int rc;

  if (!session || strlen(session) > 64)
    return set_error(c, MUSTER_E_INVALID, "session", "not a session name");
  snprintf(path, sizeof(path), "/api/v1/sessions/%s", session);
  rc = json_call(c, "GET", path, NULL, c->timeout_s, &ans);
  if (!rc) {
    tok = json_string_value(json_object_get(ans, "exec_token"));
    if (!tok || strlen(tok) >= size)
      rc = set_error(c, MUSTER_E_PROTOCOL, NULL, "the session has no exec token");
    else
      snprintf(buf, size, "%s", tok);
  }
  json_decref(ans);
  return rc;
}

int muster_json_call_(muster_client *c, const char *method, const char *path, json_t *req,
                      json_t **answer) {
  return json_call(c, method, path, req, c->timeout_s, answer);
}

long muster_last_status_(const muster_client *c) {
  return c->last_status;
}

int muster_set_error_(muster_client *c, int err, const char *field, const char *msg) {
  return set_error(c, err, field, "%s", msg);
}

/* For run.c: a second client for the same controller (internal). */
const char *muster_client_token_(const muster_client *c) {
  return c->auth + strlen("Authorization: Bearer ");
}
