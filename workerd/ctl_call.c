/*
 * ctl_call.c: muster-workerd's calls to the controller, none of which ever
 * blocks.
 *
 * Each call is a POST to {url}/api/v1/workers/{id}/{suffix}, made by one of
 * a few fixed slots (struct call: the registration, the heartbeat, each log
 * stream, the exit report), at most one in flight per slot. The transfers
 * run on libcurl's multi interface in its socket flavour: libcurl says which
 * sockets it waits on (on_socket()) and when it next needs the clock
 * (on_timer()), the main loop polls those sockets beside its own pipes and
 * hands back what happened (calls_poll_handle()), and a finished transfer
 * leaves its slot CALL_DONE for its owner to take. So the exec channel, the
 * command's pipes and signals are served while the controller is slow,
 * paused or gone; each call ends by its own deadline (10 s, or less when
 * the caller has less time) and nothing here ever waits.
 *
 * Connections are kept alive in the multi's cache and shared by the slots.
 * Any answer below 500 counts as contact with the controller
 * (wd.last_contact_ms); a call that got no answer marks it away
 * (wd.controller_up), which is said once, and its return said once too.
 */
#include "ca_file.h"
#include "workerd.h"

#include "log.h"
#include "muster_errors.h"
#include "util.h"

#include <curl/curl.h>
#include <inttypes.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CALL_SLOTS 8  /* slots that ever started a call */
#define CALL_SOCKS 16 /* sockets libcurl waits on at once */
#define CALL_SLOW_MS 1000
#define CALL_EXPECT_BYTES (16 * 1024) /* a body this large waits for 100 Continue */

static struct {
  CURLM *multi;
  struct curl_slist *hdr_json;
  struct curl_slist *hdr_bytes;
  struct curl_slist *hdr_bytes_large; /* hdr_bytes, waiting for 100 Continue */
  struct call *slots[CALL_SLOTS];
  size_t n_slots;
  /* The sockets libcurl waits on, and for what (CURL_POLL_*). */
  struct {
    curl_socket_t fd;
    int what;
  } socks[CALL_SOCKS];
  size_t n_socks;
  int64_t timer_at_ms; /* when libcurl wants the clock; INT64_MAX: never */
  /* Where this round's sockets are in the main loop's pollfd array. */
  int poll_at, poll_n;
} cc = {.timer_at_ms = INT64_MAX, .poll_at = -1};

/* libcurl's socket callback: records that it waits on fd for what
 * (CURL_POLL_IN, OUT, INOUT), or no longer (CURL_POLL_REMOVE). */
static int on_socket(CURL *easy, curl_socket_t fd, int what, void *unused, void *unused2) {
  size_t i;

  (void)easy;
  (void)unused;
  (void)unused2;
  for (i = 0; i < cc.n_socks && cc.socks[i].fd != fd; i++)
    ;
  if (what == CURL_POLL_REMOVE) {
    if (i < cc.n_socks)
      cc.socks[i] = cc.socks[--cc.n_socks];
    return 0;
  }
  if (i == cc.n_socks) {
    if (cc.n_socks == CALL_SOCKS) {
      LOG(LOG_ERROR, "more than %d sockets toward the controller", CALL_SOCKS);
      return -1; /* libcurl fails that transfer */
    }
    cc.n_socks++;
  }
  cc.socks[i].fd = fd;
  cc.socks[i].what = what;
  return 0;
}

/* libcurl's timer callback: it wants the clock in timeout_ms (-1: never). */
static int on_timer(CURLM *multi, long timeout_ms, void *unused) {
  (void)multi;
  (void)unused;
  cc.timer_at_ms = timeout_ms < 0 ? INT64_MAX : util_mono_ms() + timeout_ms;
  return 0;
}

/* libcurl's write callback: appends to the slot's answer, growing it up to
 * WD_ANSWER_MAX and keeping it NUL-terminated; past that it refuses the data,
 * which ends the transfer with CURLE_WRITE_ERROR. */
static size_t on_data(char *data, size_t size, size_t nmemb, void *slot) {
  struct call *c = slot;
  size_t n = size * nmemb;

  if (n > WD_ANSWER_MAX - c->answer_len) {
    c->answer_too_big = true;
    return 0;
  }
  if (c->answer_len + n + 1 > c->answer_cap) {
    size_t cap = c->answer_cap ? c->answer_cap : 1024;
    char *a;

    while (cap < c->answer_len + n + 1)
      cap *= 2;
    if (cap > WD_ANSWER_MAX + 1)
      cap = WD_ANSWER_MAX + 1;
    if (!(a = realloc(c->answer, cap)))
      return 0;
    c->answer = a;
    c->answer_cap = cap;
  }
  memcpy(c->answer + c->answer_len, data, n);
  c->answer_len += n;
  c->answer[c->answer_len] = '\0';
  return n;
}

/* Runs f on the multi with SIGCHLD, SIGTERM and SIGINT held back, so that a
 * thread the resolver starts is born with them blocked and every signal
 * reaches the main thread (its handler only writes to the self-pipe, so
 * holding them for these microseconds loses nothing). */
static void multi_act(curl_socket_t fd, int ev) {
  sigset_t block, old;
  int running;

  sigemptyset(&block);
  sigaddset(&block, SIGCHLD);
  sigaddset(&block, SIGTERM);
  sigaddset(&block, SIGINT);
  sigprocmask(SIG_BLOCK, &block, &old);
  curl_multi_socket_action(cc.multi, fd, ev, &running);
  sigprocmask(SIG_SETMASK, &old, NULL);
}

/* Creates the multi handle and the two header lists (both carrying the
 * bearer token); calls_cleanup() frees them. curl_global_init() must have
 * been called. Returns 0 or MUSTER_E_NOMEM. */
MUST_CHECK int calls_init(void) {
  char auth[WD_TOKEN_MAX + 32];
  struct curl_slist *l;
  int rc = MUSTER_E_NOMEM;
  curl_version_info_data *v = curl_version_info(CURLVERSION_NOW);

  if (!(v->features & CURL_VERSION_ASYNCHDNS))
    LOG(LOG_WARN, "this libcurl resolves names in the foreground: a controller named by a "
                  "slow DNS name can stall muster-workerd");
  snprintf(auth, sizeof(auth), "Authorization: Bearer %s", wd.token);
  if (!(cc.multi = curl_multi_init()))
    goto out;
  curl_multi_setopt(cc.multi, CURLMOPT_SOCKETFUNCTION, on_socket);
  curl_multi_setopt(cc.multi, CURLMOPT_TIMERFUNCTION, on_timer);
  /* curl_slist_append returns NULL on failure and leaves the list as it was,
   * so each step keeps the list where calls_cleanup() can free it. */
  if (!(l = curl_slist_append(NULL, auth)))
    goto out;
  cc.hdr_json = l;
  /* "Expect:" stops libcurl from waiting for a 100-continue before large
   * bodies, which only adds a round trip against our controller. */
  if (!(l = curl_slist_append(cc.hdr_json, "Content-Type: application/json")))
    goto out;
  if (!(l = curl_slist_append(cc.hdr_json, "Expect:")))
    goto out;
  if (!(l = curl_slist_append(NULL, auth)))
    goto out;
  cc.hdr_bytes = l;
  if (!(l = curl_slist_append(cc.hdr_bytes, "Content-Type: application/octet-stream")))
    goto out;
  if (!(l = curl_slist_append(cc.hdr_bytes, "Expect:")))
    goto out;
  /* A large log chunk waits for the controller's go (100 Continue): one
   * that refuses it answers before the body is sent, and the answer is not
   * lost to a reset of the body it never read. */
  if (!(l = curl_slist_append(NULL, auth)))
    goto out;
  cc.hdr_bytes_large = l;
  if (!(l = curl_slist_append(cc.hdr_bytes_large, "Content-Type: application/octet-stream")))
    goto out;
  if (!(l = curl_slist_append(cc.hdr_bytes_large, "Expect: 100-continue")))
    goto out;
  rc = 0;
out:
  /* The token must not linger on the stack. */
  explicit_bzero(auth, sizeof(auth));
  return rc;
}

/* Replaces the bearer token (wd.token and the header lists, in place: no
 * call is in flight while registering, and the new token is as long as
 * the old). Returns 0 or MUSTER_E_PROTOCOL. */
MUST_CHECK int calls_set_token(const char *tok) {
  size_t n = strlen(tok), at = strlen("Authorization: Bearer ");

  if (n != strlen(wd.token) || !cc.hdr_json || !cc.hdr_bytes || !cc.hdr_bytes_large)
    return MUSTER_E_PROTOCOL;
  for (const char *p = tok; *p; p++)
    if (*p <= ' ' || *p == 0x7f)
      return MUSTER_E_PROTOCOL;
  memcpy(cc.hdr_json->data + at, tok, n);
  memcpy(cc.hdr_bytes->data + at, tok, n);
  memcpy(cc.hdr_bytes_large->data + at, tok, n);
  memcpy(wd.token, tok, n);
  return 0;
}

/* Cancels every call and frees the slots' handles and answers, the multi
 * and the header lists; harmless if calls_init() failed part way. */
void calls_cleanup(void) {
  for (size_t i = 0; i < cc.n_slots; i++) {
    struct call *c = cc.slots[i];

    call_cancel(c);
    if (c->easy)
      curl_easy_cleanup(c->easy);
    free(c->answer);
    c->easy = NULL;
    c->answer = NULL;
    c->answer_cap = c->answer_len = 0;
  }
  cc.n_slots = 0;
  if (cc.multi)
    curl_multi_cleanup(cc.multi);
  cc.multi = NULL;
  curl_slist_free_all(cc.hdr_json);
  curl_slist_free_all(cc.hdr_bytes);
  curl_slist_free_all(cc.hdr_bytes_large);
  cc.hdr_json = cc.hdr_bytes = cc.hdr_bytes_large = NULL;
}

/* Gives slot c its easy handle, once, with what every call of it shares.
 * Returns 0 or MUSTER_E_NOMEM. */
MUST_CHECK static int call_setup(struct call *c) {
  if (c->easy)
    return 0;
  if (cc.n_slots == CALL_SLOTS)
    return MUSTER_E_INTERNAL;
  if (!(c->easy = curl_easy_init()))
    return MUSTER_E_NOMEM;
  cc.slots[cc.n_slots++] = c;
  curl_easy_setopt(c->easy, CURLOPT_PRIVATE, c);
  curl_easy_setopt(c->easy, CURLOPT_NOSIGNAL, 1L);
  muster_curl_ca(c->easy);
  curl_easy_setopt(c->easy, CURLOPT_CONNECTTIMEOUT_MS, WD_CONNECT_TIMEOUT_MS);
  curl_easy_setopt(c->easy, CURLOPT_WRITEFUNCTION, on_data);
  curl_easy_setopt(c->easy, CURLOPT_WRITEDATA, c);
  curl_easy_setopt(c->easy, CURLOPT_ERRORBUFFER, c->err);
  curl_easy_setopt(c->easy, CURLOPT_USERAGENT, "muster-workerd/" MUSTER_VERSION);
  /* Workers talk to the controller directly, as they talk to each other; a
   * site-wide http_proxy meant for the internet would only get in the way. */
  curl_easy_setopt(c->easy, CURLOPT_PROXY, "");
#if LIBCURL_VERSION_NUM >= 0x075700
  /* A call given up while its name is still being resolved must not wait
   * for the resolver's thread (a DNS server that does not answer takes
   * many seconds): libcurl leaves the thread behind instead. */
  curl_easy_setopt(c->easy, CURLOPT_QUICK_EXIT, 1L);
#endif
#if LIBCURL_VERSION_NUM >= 0x075500
  curl_easy_setopt(c->easy, CURLOPT_PROTOCOLS_STR, "http,https");
#endif
  return 0;
}

/* Starts POSTing body (len bytes, which must stay valid until the call is
 * done; JSON if json, raw bytes otherwise) to
 * {url}/api/v1/workers/{id}/{suffix}, to end within timeout_ms (at most
 * 10 s). c must be idle. Returns 0, or MUSTER_E_NOMEM / MUSTER_E_INTERNAL
 * (the call did not start; c stays idle). */
MUST_CHECK int call_start(struct call *c, const char *suffix, bool json, const void *body,
                          size_t len, int64_t timeout_ms) {
  int n;
  int rc = call_setup(c);

  if (rc)
    return rc;
  n = snprintf(c->url, sizeof(c->url), "%s/api/v1/workers/%s/%s", wd.url, wd.id, suffix);
  if (n < 0 || (size_t)n >= sizeof(c->url))
    return MUSTER_E_INTERNAL;
  snprintf(c->what, sizeof(c->what), "%s", suffix);
  if (timeout_ms > WD_CALL_TIMEOUT_MS)
    timeout_ms = WD_CALL_TIMEOUT_MS;
  if (timeout_ms < 1)
    timeout_ms = 1;
  c->answer_len = 0;
  if (c->answer)
    c->answer[0] = '\0';
  c->answer_too_big = false;
  c->err[0] = '\0';
  c->status = 0;
  c->rc = 0;
  curl_easy_setopt(c->easy, CURLOPT_URL, c->url);
  curl_easy_setopt(c->easy, CURLOPT_HTTPHEADER,
                   json                      ? cc.hdr_json
                   : len > CALL_EXPECT_BYTES ? cc.hdr_bytes_large
                                             : cc.hdr_bytes);
  curl_easy_setopt(c->easy, CURLOPT_POSTFIELDS, body);
  curl_easy_setopt(c->easy, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)len);
  curl_easy_setopt(c->easy, CURLOPT_TIMEOUT_MS, (long)timeout_ms);
  if (curl_multi_add_handle(cc.multi, c->easy) != CURLM_OK)
    return MUSTER_E_NOMEM;
  c->state = CALL_RUNNING;
  c->started_ms = util_mono_ms();
  return 0;
}

/* Abandons c's call, if one is in flight (its connection is closed); c is
 * idle afterwards, whatever state it was in. */
void call_cancel(struct call *c) {
  if (c->state == CALL_RUNNING)
    curl_multi_remove_handle(cc.multi, c->easy);
  c->state = CALL_IDLE;
}

/* Takes c's finished call: c becomes idle. Returns 0 when the controller
 * answered, with the status in *status and the body in c->answer (NULL or
 * NUL-terminated, valid until c's next call); MUSTER_E_UNREACHABLE when no
 * answer came (refused, timed out, reset); MUSTER_E_TOO_LARGE when the answer
 * passed 1 MiB; MUSTER_E_NOMEM. */
MUST_CHECK int call_take(struct call *c, long *status) {
  c->state = CALL_IDLE;
  *status = c->status;
  return c->rc;
}

/* Records how c's transfer ended (result), and the contact it means. */
static void call_finished(struct call *c, CURLcode result) {
  int64_t now = util_mono_ms();

  curl_multi_remove_handle(cc.multi, c->easy);
  c->state = CALL_DONE;
  if (now - c->started_ms >= CALL_SLOW_MS)
    LOG(LOG_DEBUG, "POST %s ended after %" PRId64 " ms", c->what, now - c->started_ms);
  if (result == CURLE_WRITE_ERROR && c->answer_too_big) {
    LOG(LOG_WARN, "the controller's answer to %s was larger than 1 MiB", c->what);
    c->rc = MUSTER_E_TOO_LARGE;
  } else if (result == CURLE_OUT_OF_MEMORY || result == CURLE_WRITE_ERROR) {
    c->rc = MUSTER_E_NOMEM;
  } else if (result != CURLE_OK) {
    const char *why = c->err[0] ? c->err : curl_easy_strerror(result);

    if (wd.controller_up)
      LOG(LOG_WARN, "cannot reach the controller at %s (%s); will keep trying", wd.url, why);
    LOG(LOG_DEBUG, "POST %s: %s", c->what, why);
    wd.controller_up = false;
    c->rc = MUSTER_E_UNREACHABLE;
  } else {
    curl_easy_getinfo(c->easy, CURLINFO_RESPONSE_CODE, &c->status);
    /* A 5xx does not hold off MUSTER_ORPHAN_TIMEOUT: a proxy answers
     * 502/503/504 for a controller that is gone, and one that fails every
     * call for that long is no better. (Each owner says what a 5xx means
     * for its own call.) */
    if (c->status < 500)
      wd.last_contact_ms = now;
    if (!wd.controller_up)
      LOG(LOG_INFO, "the controller answers again");
    wd.controller_up = true;
    c->rc = 0;
  }
}

/* Adds the sockets libcurl waits on to the main loop's pollfd array p (at
 * *n, which grows); room for CALL_SOCKS entries must be there. */
void calls_poll_add(struct pollfd *p, int *n) {
  cc.poll_at = *n;
  cc.poll_n = (int)cc.n_socks;
  for (size_t i = 0; i < cc.n_socks; i++) {
    short ev = 0;

    if (cc.socks[i].what == CURL_POLL_IN || cc.socks[i].what == CURL_POLL_INOUT)
      ev |= POLLIN;
    if (cc.socks[i].what == CURL_POLL_OUT || cc.socks[i].what == CURL_POLL_INOUT)
      ev |= POLLOUT;
    p[(*n)++] = (struct pollfd){.fd = cc.socks[i].fd, .events = ev};
  }
}

/* When libcurl next needs the clock (INT64_MAX: not before a socket moves). */
int64_t calls_next_deadline(void) {
  return cc.timer_at_ms;
}

/* Hands libcurl what poll() saw on its sockets (p: the main loop's array,
 * filled by calls_poll_add() this round) and the clock when its timer is
 * due, then marks each transfer that ended: its slot becomes CALL_DONE. */
void calls_poll_handle(const struct pollfd *p, int64_t now) {
  CURLMsg *m;
  int left;

  for (int i = 0; cc.poll_at >= 0 && i < cc.poll_n; i++) {
    const struct pollfd *q = &p[cc.poll_at + i];
    int ev = 0;

    if (!q->revents)
      continue;
    if (q->revents & (POLLIN | POLLHUP))
      ev |= CURL_CSELECT_IN;
    if (q->revents & POLLOUT)
      ev |= CURL_CSELECT_OUT;
    if (q->revents & (POLLERR | POLLNVAL))
      ev |= CURL_CSELECT_ERR;
    multi_act(q->fd, ev);
  }
  cc.poll_at = -1;
  if (now >= cc.timer_at_ms) {
    cc.timer_at_ms = INT64_MAX; /* on_timer() sets the next one */
    multi_act(CURL_SOCKET_TIMEOUT, 0);
  }
  while ((m = curl_multi_info_read(cc.multi, &left))) {
    struct call *c = NULL;

    if (m->msg != CURLMSG_DONE)
      continue;
    curl_easy_getinfo(m->easy_handle, CURLINFO_PRIVATE, (char **)&c);
    if (c)
      call_finished(c, m->data.result);
  }
}
