/* http.c: the transport of every call: one libcurl transfer on the
 * client's handle, its answer collected (capped) or streamed, an error
 * answer mapped back to a muster error. */
#include "ca_file.h"
#include "client_internal.h"
#include "muster.h"
#include "util.h"

#include <curl/curl.h>
#include <jansson.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

/* Answers are capped: a controller (or something pretending to be one)
 * cannot make the client allocate without bound. */
#define MAX_ANSWER (256L * 1024 * 1024)

static int progress_cb(void *arg, curl_off_t a, curl_off_t b, curl_off_t c2, curl_off_t d) {
  muster_client *c = arg;

  (void)a;
  (void)b;
  (void)c2;
  (void)d;
  return muster_client_cancelled_(c) ? 1 : 0;
}

static curl_socket_t open_socket(void *arg, curlsocktype purpose, struct curl_sockaddr *a) {
  muster_client *c = arg;
  curl_socket_t fd;

  (void)purpose;
  if (muster_client_cancelled_(c))
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

/* MUSTER_E_UNREACHABLE for a transfer that got no answer (cc, curl's
 * words in cerr), saying what to do where the controller's certificate
 * could not be verified. */
static int unreachable(muster_client *c, CURLcode cc, const char *cerr) {
  const char *ca = getenv("MUSTER_CA_FILE");

  if (cc == CURLE_SSL_CACERT_BADFILE && ca && *ca)
    return muster_set_errorf_(c, MUSTER_E_UNREACHABLE, NULL,
                              "MUSTER_CA_FILE %s cannot be read as certificates (%s)", ca,
                              cerr[0] ? cerr : curl_easy_strerror(cc));
  if (cc == CURLE_PEER_FAILED_VERIFICATION || cc == CURLE_SSL_CACERT_BADFILE)
    return muster_set_errorf_(c, MUSTER_E_UNREACHABLE, NULL,
                              "the controller at %s has a certificate this client cannot verify "
                              "(%s): set MUSTER_CA_FILE to the file of the CA that signed it",
                              c->url, cerr[0] ? cerr : curl_easy_strerror(cc));
  return muster_set_errorf_(c, MUSTER_E_UNREACHABLE, NULL,
                            "could not reach the controller at %s: %s", c->url,
                            cerr[0] ? cerr : curl_easy_strerror(cc));
}

/* Options every transfer of c gets. */
static void common_opts(muster_client *c, const char *url, struct curl_slist *hdrs, char *cerr) {
  curl_easy_setopt(c->curl, CURLOPT_URL, url);
  curl_easy_setopt(c->curl, CURLOPT_HTTPHEADER, hdrs);
  curl_easy_setopt(c->curl, CURLOPT_NOSIGNAL, 1L);
  muster_curl_ca(c->curl);
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
    muster_set_errorf_(c, err, field, "%s", msg ? msg : muster_strerror(err));
  } else {
    err = status == 401   ? MUSTER_E_UNAUTHORIZED
          : status == 404 ? MUSTER_E_NOT_FOUND
                          : MUSTER_E_PROTOCOL;
    muster_set_errorf_(c, err, NULL, "the controller answered HTTP %ld", status);
  }
  json_decref(j);
  return err;
}

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
  muster_clear_error_(c);
  if (muster_client_cancelled_(c))
    return muster_set_errorf_(c, MUSTER_E_SHUTTING_DOWN, NULL, "cancelled");
  if (snprintf(url, size, "%s%s", c->url, path) >= (int)size)
    return muster_set_errorf_(c, MUSTER_E_INVALID, NULL, "the request URL is too long");
  curl_easy_reset(c->curl);
  *hdrs = curl_slist_append(NULL, c->auth);
  if (json_body)
    *hdrs = curl_slist_append(*hdrs, "Content-Type: application/json");
  common_opts(c, url, *hdrs, cerr);
  return 0;
}

int muster_http_(muster_client *c, const struct call *k) {
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
  if (cc == CURLE_ABORTED_BY_CALLBACK || (cc != CURLE_OK && muster_client_cancelled_(c))) {
    rc = muster_set_errorf_(c, MUSTER_E_SHUTTING_DOWN, NULL, "cancelled");
  } else if (cc == CURLE_WRITE_ERROR && b.too_big) {
    rc = muster_set_errorf_(c, MUSTER_E_TOO_LARGE, NULL,
                            "the controller's answer is larger than 256 MiB");
  } else if (cc == CURLE_OPERATION_TIMEDOUT && status == 0) {
    rc = muster_set_errorf_(c, MUSTER_E_TIMEOUT, NULL, "no answer from %s within %g s", c->url,
                            k->timeout_s);
  } else if (cc != CURLE_OK && status == 0) {
    rc = unreachable(c, cc, cerr);
  } else if (status >= 400) {
    rc = answer_error(c, status, &b);
  } else if (cc != CURLE_OK) {
    rc = muster_set_errorf_(c, MUSTER_E_PROTOCOL, NULL, "the answer from %s broke off: %s", c->url,
                            cerr[0] ? cerr : curl_easy_strerror(cc));
  } else if (k->answer) {
    json_error_t jerr;
    *k->answer = NULL;
    if (b.len) {
      *k->answer = json_loadb(b.data, b.len, 0, &jerr);
      if (!*k->answer)
        rc = muster_set_errorf_(c, MUSTER_E_PROTOCOL, NULL,
                                "the controller's answer is not JSON: %s", jerr.text);
    }
  }
  free(b.data);
  return rc;
}

/* Runs a JSON call whose body is req (stolen). */
int muster_json_call_timeout_(muster_client *c, const char *method, const char *path, json_t *req,
                              double timeout_s, json_t **answer) {
  char *text = req ? json_dumps(req, JSON_COMPACT) : NULL;
  struct call k = {method, path, text, timeout_s, answer, NULL};
  int rc;

  json_decref(req);
  if (req && !text)
    return muster_set_errorf_(c, MUSTER_E_NOMEM, NULL, "out of memory");
  rc = muster_http_(c, &k);
  free(text);
  return rc;
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

/* Like muster_http_() for a GET whose answer is streamed to write. Returns 0 also
 * when the writer ended the transfer on purpose (*stopped set). */
int muster_http_stream_(muster_client *c, const char *path, curl_write_callback write, void *wdata,
                        const int *stopped, long silence_s) {
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
  else if (cc == CURLE_ABORTED_BY_CALLBACK || (cc != CURLE_OK && muster_client_cancelled_(c)))
    rc = muster_set_errorf_(c, MUSTER_E_SHUTTING_DOWN, NULL, "cancelled");
  else if (cc != CURLE_OK && status == 0)
    rc = unreachable(c, cc, cerr);
  else if (cc != CURLE_OK)
    rc = muster_set_errorf_(c, MUSTER_E_PROTOCOL, NULL, "the stream from %s broke off: %s", c->url,
                            cerr[0] ? cerr : curl_easy_strerror(cc));
  free(err.data);
  return rc;
}

int muster_json_call_(muster_client *c, const char *method, const char *path, json_t *req,
                      json_t **answer) {
  return muster_json_call_timeout_(c, method, path, req, c->timeout_s, answer);
}
