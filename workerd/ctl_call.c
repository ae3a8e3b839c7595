/*
 * ctl_call.c: muster-workerd's calls to the controller, none of which ever
 * blocks.
 *
 * Each call is a POST to {url}/api/v1/workers/{id}/{suffix}, made by one of
 * a few fixed slots (struct call: the registration, the heartbeat, each log
 * stream, the exit report), at most one in flight per slot, each on a
 * connection of its own (http_client.c). A connection the controller kept
 * open goes back to a pool of two when its call ends, for the next call to
 * take. The main loop polls the sockets of the calls in flight beside its
 * own pipes (calls_poll_add()) and hands back what happened
 * (calls_poll_handle()), and a finished call leaves its slot CALL_DONE for its owner to take. So
 * the exec channel, the command's pipes and signals are served while the
 * controller is slow, paused or gone; each call ends by its own deadline
 * (10 s, or less when the caller has less time) and nothing here ever
 * waits.
 *
 * Any answer below 500 counts as contact with the controller
 * (wd.last_contact_ms); a call that got no answer marks it away
 * (wd.controller_up), which is said once, and its return said once too.
 * The first call without an answer (or with a 5xx) since the last contact
 * starts the time away (wd.away_since_ms) that MUSTER_ORPHAN_TIMEOUT
 * bounds.
 */
#include "workerd.h"

#include "fault.h"
#include "log.h"
#include "muster_errors.h"
#include "util.h"

#include <inttypes.h>
#include <poll.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CALL_SLOTS 8 /* slots that ever started a call */
#define CALL_SLOW_MS 1000
#define CALL_EXPECT_BYTES (16 * 1024) /* a body this large waits for 100 Continue... */
#define CALL_EXPECT_MS 1000           /* ...a second at most */
#define CALL_IDLE_CONNS 2             /* connections kept between calls */
#define AUTH_PREFIX "Authorization: Bearer "

static struct {
  struct hc_target to;
  /* The header lines of a call with a JSON body and of one with bytes,
   * both carrying the bearer token. */
  char hdr_json[WD_TOKEN_MAX + 96];
  char hdr_bytes[WD_TOKEN_MAX + 96];
  struct call *slots[CALL_SLOTS];
  size_t n_slots;
  /* The connections kept open between calls, newest last: a call takes
   * one, and gives it back when the controller keeps it open. */
  struct hc_conn idle[CALL_IDLE_CONNS];
  int64_t idle_since[CALL_IDLE_CONNS]; /* when each came back */
  size_t n_idle;
  /* Which slot each of this round's pollfd entries is (from poll_at). */
  struct call *polled[CALL_SLOTS];
  int poll_at, poll_n;
} cc = {.poll_at = -1};

/* Writes the two header lists for token tok. */
static void headers_make(const char *tok) {
  snprintf(cc.hdr_json, sizeof(cc.hdr_json), AUTH_PREFIX "%s\r\nContent-Type: application/json\r\n",
           tok);
  snprintf(cc.hdr_bytes, sizeof(cc.hdr_bytes),
           AUTH_PREFIX "%s\r\nContent-Type: application/octet-stream\r\n", tok);
}

/* Takes the controller's URL apart and makes the header lists (both
 * carrying the bearer token); calls_cleanup() undoes it. Returns 0 or
 * MUSTER_E_INVALID. */
MUST_CHECK int calls_init(void) {
  if (hc_target_parse(wd.url, &cc.to) != 0) {
    LOG(LOG_ERROR, "MUSTER_CONTROLLER_URL is not a valid http:// or https:// URL");
    return MUSTER_E_INVALID;
  }
  headers_make(wd.token);
  return 0;
}

/* Replaces the bearer token (wd.token and the header lists: no call is in
 * flight while registering, and the new token is as long as the old).
 * Returns 0 or MUSTER_E_PROTOCOL. */
MUST_CHECK int calls_set_token(const char *tok) {
  size_t n = strlen(tok);

  if (n != strlen(wd.token))
    return MUSTER_E_PROTOCOL;
  for (const char *p = tok; *p; p++)
    if (*p <= ' ' || *p == 0x7f)
      return MUSTER_E_PROTOCOL;
  memcpy(wd.token, tok, n);
  headers_make(wd.token);
  return 0;
}

/* Cancels every call and frees the slots' connections and answers;
 * harmless if calls_init() failed part way. */
void calls_cleanup(void) {
  for (size_t i = 0; i < cc.n_slots; i++) {
    struct call *c = cc.slots[i];

    call_cancel(c);
    hc_free(&c->hc);
    c->answer = NULL;
    c->answer_len = 0;
    c->ready = false;
  }
  cc.n_slots = 0;
  while (cc.n_idle)
    hc_conn_close(&cc.idle[--cc.n_idle]);
  explicit_bzero(cc.hdr_json, sizeof(cc.hdr_json));
  explicit_bzero(cc.hdr_bytes, sizeof(cc.hdr_bytes));
}

/* Closes the oldest kept connection. */
static void drop_oldest(void) {
  hc_conn_close(&cc.idle[0]);
  memmove(&cc.idle[0], &cc.idle[1], sizeof(cc.idle[0]) * (CALL_IDLE_CONNS - 1));
  memmove(&cc.idle_since[0], &cc.idle_since[1], sizeof(cc.idle_since[0]) * (CALL_IDLE_CONNS - 1));
  cc.n_idle--;
}

/* Whether kept connections go once idle CALL_KEEP_IDLE_MS (a long
 * interval: calls_keep_none()). */
static bool keep_briefly(void) {
  return wd.hb_interval_ms > CALL_KEEP_INTERVAL_MS;
}

void calls_keep_none(void) {
  if (!keep_briefly())
    return;
  while (cc.n_idle)
    hc_conn_close(&cc.idle[--cc.n_idle]);
}

/* Registers slot c, once. Returns 0 or MUSTER_E_INTERNAL. */
MUST_CHECK static int call_setup(struct call *c) {
  if (c->ready)
    return 0;
  if (cc.n_slots == CALL_SLOTS)
    return MUSTER_E_INTERNAL;
  hc_init(&c->hc);
  c->ready = true;
  cc.slots[cc.n_slots++] = c;
  return 0;
}

/* Starts POSTing body (len bytes, which must stay valid until the call is
 * done; JSON if json, raw bytes otherwise) to
 * {url}/api/v1/workers/{id}/{suffix}, to end within timeout_ms (at most
 * 10 s). c must be idle. Returns 0, or MUSTER_E_NOMEM / MUSTER_E_INTERNAL
 * (the call did not start; c stays idle). */
MUST_CHECK int call_start(struct call *c, const char *suffix, bool json, const void *body,
                          size_t len, int64_t timeout_ms) {
  char path[WD_ID_MAX + 64];
  int n;
  int rc = call_setup(c);

  if (rc)
    return rc;
  n = snprintf(path, sizeof(path), "/api/v1/workers/%s/%s", wd.id, suffix);
  if (n < 0 || (size_t)n >= sizeof(path))
    return MUSTER_E_INTERNAL;
  snprintf(c->what, sizeof(c->what), "%s", suffix);
  if (timeout_ms > WD_CALL_TIMEOUT_MS)
    timeout_ms = WD_CALL_TIMEOUT_MS;
  if (timeout_ms < 1)
    timeout_ms = 1;
  c->answer = NULL;
  c->answer_len = 0;
  c->status = 0;
  c->rc = 0;
  if (c->hc.fd < 0 && cc.n_idle)
    hc_attach(&c->hc, &cc.idle[--cc.n_idle]);
  rc = hc_start(&c->hc, &cc.to, path, json ? cc.hdr_json : cc.hdr_bytes, body, len,
                !json && len > CALL_EXPECT_BYTES ? CALL_EXPECT_MS : 0, WD_ANSWER_MAX, timeout_ms);
  if (rc)
    return rc;
  c->state = CALL_RUNNING;
  c->started_ms = util_mono_ms();
  hc_step(&c->hc, 0, c->started_ms); /* (a kept connection sends at once) */
  return 0;
}

/* Abandons c's call, if one is in flight (its connection is closed); c is
 * idle afterwards, whatever state it was in. */
void call_cancel(struct call *c) {
  if (c->state == CALL_RUNNING) {
    hc_close(&c->hc);
    c->hc.st = HC_CLOSED;
  }
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

/* Whether a call that ended with rc (and, for rc 0, status) got no answer
 * of the controller's own: none came (refused, timed out, reset), or one
 * past 1 MiB or a 5xx (a proxy's, for a controller that may be gone). Such
 * calls start the time away (MUSTER_ORPHAN_TIMEOUT) and are tried again. */
bool call_unanswered(int rc, long status) {
  return rc == MUSTER_E_UNREACHABLE || rc == MUSTER_E_TOO_LARGE || (rc == 0 && status >= 500);
}

/* Records how c's request ended, and the contact it means. */
static void call_finished(struct call *c) {
  int64_t now = util_mono_ms();

  c->state = CALL_DONE;
  /* Its connection, if kept open, goes back for any call to take (the
   * oldest kept one is closed to make room). */
  if (c->hc.fd >= 0 && c->hc.keep) {
    if (cc.n_idle == CALL_IDLE_CONNS)
      drop_oldest();
    if (hc_detach(&c->hc, &cc.idle[cc.n_idle]))
      cc.idle_since[cc.n_idle++] = now;
  }
  if (now - c->started_ms >= CALL_SLOW_MS)
    LOG(LOG_DEBUG, "POST %s ended after %" PRId64 " ms", c->what, now - c->started_ms);
  c->rc = c->hc.rc;
  /* (tests: a proxy in front of the controller answers every heartbeat
   * with more than 1 MiB) */
  if (c->rc == 0 && strcmp(c->what, "heartbeat") == 0 &&
      FAULT_FAILS("workerd_heartbeat_too_large")) {
    snprintf(c->hc.err, sizeof(c->hc.err), "the answer is larger than 1 MiB (fault injected)");
    c->rc = MUSTER_E_TOO_LARGE;
  }
  /* (the first unanswered call since the last answer starts the time
   * away, from its start or the last answer if later: a heartbeat interval
   * longer than the orphan timeout is not time the controller did not
   * answer) */
  if (call_unanswered(c->rc, c->hc.status) && !wd.away_since_ms)
    wd.away_since_ms = c->started_ms > wd.last_contact_ms ? c->started_ms : wd.last_contact_ms;
  if (c->rc == MUSTER_E_TOO_LARGE) {
    LOG(LOG_WARN, "the controller's answer to %s was larger than 1 MiB", c->what);
  } else if (c->rc == MUSTER_E_UNREACHABLE) {
    if (wd.controller_up)
      LOG(LOG_WARN, "cannot reach the controller at %s (%s); will keep trying", wd.url, c->hc.err);
    LOG(LOG_DEBUG, "POST %s: %s", c->what, c->hc.err);
    wd.controller_up = false;
  } else if (c->rc == 0) {
    c->status = c->hc.status;
    c->answer = c->hc.answer;
    c->answer_len = c->hc.answer_len;
    /* A 5xx does not hold off MUSTER_ORPHAN_TIMEOUT: a proxy answers
     * 502/503/504 for a controller that is gone, and one that fails every
     * call for that long is no better. (Each owner says what a 5xx means
     * for its own call.) */
    if (c->status < 500) {
      wd.last_contact_ms = now;
      wd.away_since_ms = 0;
    }
    if (!wd.controller_up)
      LOG(LOG_INFO, "the controller answers again");
    wd.controller_up = true;
  }
}

/* Adds the sockets of the calls in flight to the main loop's pollfd array
 * p (at *n, which grows); room for CALL_POLL_MAX entries must be there. */
void calls_poll_add(struct pollfd *p, int *n) {
  cc.poll_at = *n;
  cc.poll_n = 0;
  for (size_t i = 0; i < cc.n_slots; i++) {
    struct call *c = cc.slots[i];
    short ev = c->state == CALL_RUNNING ? hc_events(&c->hc) : 0;

    if (!ev || c->hc.fd < 0)
      continue;
    cc.polled[cc.poll_n++] = c;
    p[(*n)++] = (struct pollfd){.fd = c->hc.fd, .events = ev};
  }
}

/* When a call in flight next needs the clock (INT64_MAX: not before a
 * socket moves). */
int64_t calls_next_deadline(void) {
  int64_t d = INT64_MAX;

  for (size_t i = 0; i < cc.n_slots; i++) {
    const struct call *c = cc.slots[i];
    int64_t t = c->state != CALL_RUNNING ? INT64_MAX
                : c->hc.st == HC_DONE    ? 0 /* (ended as it started) */
                                         : hc_deadline(&c->hc);

    d = t < d ? t : d;
  }
  if (keep_briefly() && cc.n_idle && cc.idle_since[0] + CALL_KEEP_IDLE_MS < d)
    d = cc.idle_since[0] + CALL_KEEP_IDLE_MS;
  return d;
}

/* Moves each call in flight on with what poll() saw on its socket (p: the
 * main loop's array, filled by calls_poll_add() this round) or the clock,
 * then marks each call that ended: its slot becomes CALL_DONE. */
void calls_poll_handle(const struct pollfd *p, int64_t now) {
  for (size_t i = 0; i < cc.n_slots; i++) {
    struct call *c = cc.slots[i];
    short rev = 0;

    if (c->state != CALL_RUNNING)
      continue;
    for (int k = 0; cc.poll_at >= 0 && k < cc.poll_n; k++)
      if (cc.polled[k] == c)
        rev = p[cc.poll_at + k].revents;
    if (rev || now >= hc_deadline(&c->hc))
      hc_step(&c->hc, rev, now);
    if (c->hc.st == HC_DONE)
      call_finished(c);
  }
  cc.poll_at = -1;
  while (keep_briefly() && cc.n_idle && now - cc.idle_since[0] >= CALL_KEEP_IDLE_MS)
    drop_oldest();
}
