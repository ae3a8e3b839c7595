/* client.c: the client handle (muster_client_new(), _free(), its URL,
 * timeout and cancel) and the error it records of its last call. The calls
 * themselves go through http.c. */
#include "client_internal.h"
#include "muster.h"
#include "util.h"

#include <curl/curl.h>
#include <jansson.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

static pthread_once_t curl_once = PTHREAD_ONCE_INIT;
static void curl_init_once(void) {
  curl_global_init(CURL_GLOBAL_DEFAULT);
}

/* Records the message of a failed call and returns err. */
int muster_set_errorf_(muster_client *c, int err, const char *field, const char *fmt, ...) {
  va_list ap;

  va_start(ap, fmt);
  vsnprintf(c->errmsg, sizeof(c->errmsg), fmt, ap);
  va_end(ap);
  c->has_errfield = field != NULL;
  snprintf(c->errfield, sizeof(c->errfield), "%s", field ? field : "");
  return err;
}

void muster_clear_error_(muster_client *c) {
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

int muster_client_cancelled_(muster_client *c) {
  return __atomic_load_n(&c->cancel, __ATOMIC_SEQ_CST);
}

int muster_client_new(const char *url, const char *token, muster_client **out) {
  muster_client *c;
  size_t n;

  *out = NULL;
  /* "HOST:PORT" is http://HOST:PORT, as in the Python client; any other
   * scheme is refused. */
  if (!url || !*url || strpbrk(url, " \r\n\t") ||
      (strstr(url, "://") && strncmp(url, "http://", 7) != 0 && strncmp(url, "https://", 8) != 0) ||
      !token || !*token || strlen(token) > 200 || strpbrk(token, " \r\n\t"))
    return MUSTER_E_INVALID;
  pthread_once(&curl_once, curl_init_once);
  c = calloc(1, sizeof(*c));
  if (!c)
    return MUSTER_E_NOMEM;
  pthread_mutex_init(&c->sock_lock, NULL);
  c->sock = CURL_SOCKET_BAD;
  if (strstr(url, "://")) {
    c->url = strdup(url);
  } else if ((c->url = malloc(strlen(url) + 8)) != NULL) {
    memcpy(c->url, "http://", 7);
    memcpy(c->url + 7, url, strlen(url) + 1);
  }
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

/* url without its scheme and any trailing '/', into buf. */
static const char *url_core(const char *url, char *buf, size_t size) {
  const char *p = strstr(url, "://");
  size_t n;

  snprintf(buf, size, "%s", p ? p + 3 : url);
  n = strlen(buf);
  while (n > 0 && buf[n - 1] == '/')
    buf[--n] = '\0';
  return buf;
}

/* Whether the local state directory's token may go to url: the URL its url
 * file names, or a loopback address. A typo or another host never gets it. */
static int token_may_go_to(const char *url, const char *dir_url) {
  char a[512], b[512];
  const char *host = url_core(url, a, sizeof(a));

  if (dir_url && strcmp(host, url_core(dir_url, b, sizeof(b))) == 0)
    return 1;
  return strncmp(host, "127.", 4) == 0 || strncmp(host, "localhost:", 10) == 0 ||
         strcmp(host, "localhost") == 0 || strncmp(host, "[::1]", 5) == 0;
}

int muster_client_new_default(muster_client **out) {
  const char *url = getenv("MUSTER_URL"), *token = getenv("MUSTER_TOKEN");
  const char *dir = getenv("MUSTER_STATE_DIR"), *home = getenv("HOME");
  char dirbuf[1024], path[1100], urlbuf[512], tokbuf[256], dirurl[512];
  int own_url = 0;

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
    own_url = 1;
  }
  if (!token || !*token) {
    /* The state directory's token goes only to its own controller. */
    snprintf(path, sizeof(path), "%s/url", dir);
    if (!own_url &&
        !token_may_go_to(url, read_line(path, dirurl, sizeof(dirurl)) == 0 ? dirurl : NULL))
      return MUSTER_E_UNAUTHORIZED;
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

long muster_last_status_(const muster_client *c) {
  return c->last_status;
}

int muster_set_error_(muster_client *c, int err, const char *field, const char *msg) {
  return muster_set_errorf_(c, err, field, "%s", msg);
}

/* For run_attempt.c and lease.c: a second client for the same controller
 * (internal). */
const char *muster_client_token_(const muster_client *c) {
  return c->auth + strlen("Authorization: Bearer ");
}
