/*
 * http_client.c: muster-workerd's HTTP/1.1 client toward the controller.
 *
 * A worker makes few kinds of call, all of them a POST to one controller:
 * it needs no redirects, cookies, proxies or other schemes. libcurl, which
 * did this before, brought some thirty libraries into every worker, and a
 * worker forked from the fork server copied their two hundred mappings and
 * faulted their pages in again; this client needs only GnuTLS, which the
 * exec channel loads anyway.
 *
 * struct hc is one connection and the request on it. hc_start() begins a
 * request (on the connection kept from the last one when the controller
 * kept it open and it is still quiet); the caller polls hc_events() on
 * h->fd until hc_deadline(), hands what it saw to hc_step(), and the request
 * is over when h->st is HC_DONE. Nothing here blocks: the connect, the TLS
 * handshake, the sending and the reading all wait in the caller's poll(),
 * and a host name is looked up (http_target.c) while the caller polls its
 * clock. A request sent on a kept connection that the controller closed
 * unanswered is sent once more on a new one (as libcurl does). The answer
 * is read by http_answer.c.
 *
 * A body can wait for the controller's 100 Continue (hc_start()'s
 * expect_ms), so that a refusal is read before the body is sent.
 */
#include "http_client.h"

#include "muster_errors.h"
#include "util.h"

#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define HC_CONNECT_MS 2000   /* lookup, connect and TLS handshake, together */
#define HC_ADDRESS_MS 1000   /* one address's connect, where others follow */
#define HC_RESOLVE_POLL_MS 5 /* a lookup is looked at after 5 ms, 10, 20... */
#define HC_RESOLVE_POLL_MAX_MS 100
#define HC_READ_CHUNK 16384
#define HC_READS_A_STEP 16
#define HC_BODY_A_STEP (256 * 1024) /* a body sent after 100 Continue, a step */

/* ------------------------------------------------------------------------ */
/* The connection                                                           */

void hc_init(struct hc *h) {
  memset(h, 0, sizeof(*h));
  h->fd = -1;
}

/* Closes h's connection (if any); the request's state is left alone. */
void hc_close(struct hc *h) {
  if (h->tls)
    gnutls_deinit(h->tls);
  h->tls = NULL;
  hc_tls_release(h->cred);
  h->cred = NULL;
  if (h->fd >= 0)
    close(h->fd);
  h->fd = -1;
  h->keep = false;
}

/* Takes h's kept connection out of h into c. Returns whether h had one. */
bool hc_detach(struct hc *h, struct hc_conn *c) {
  if (h->fd < 0 || !h->keep || h->st != HC_DONE)
    return false;
  c->fd = h->fd;
  c->tls = h->tls;
  c->cred = h->cred;
  c->to = h->to;
  h->fd = -1;
  h->tls = NULL;
  h->cred = NULL;
  h->keep = false;
  return true;
}

/* Gives h, which has no connection, the kept connection c. */
void hc_attach(struct hc *h, struct hc_conn *c) {
  hc_close(h);
  h->fd = c->fd;
  h->tls = c->tls;
  h->cred = c->cred;
  h->to = c->to;
  h->keep = true;
  c->fd = -1;
  c->tls = NULL;
  c->cred = NULL;
}

/* Closes the kept connection c. */
void hc_conn_close(struct hc_conn *c) {
  if (c->tls)
    gnutls_deinit(c->tls);
  hc_tls_release(c->cred);
  if (c->fd >= 0)
    close(c->fd);
  c->fd = -1;
  c->tls = NULL;
  c->cred = NULL;
}

/* Ends h's request with rc and the reason fmt says (closing the
 * connection, which is in an unknown state). */
__attribute__((format(printf, 3, 4))) static void fail(struct hc *h, int rc, const char *fmt, ...) {
  char why[HC_ERR_MAX]; /* (the arguments may be h->err itself) */
  va_list ap;

  va_start(ap, fmt);
  vsnprintf(why, sizeof(why), fmt, ap);
  va_end(ap);
  memcpy(h->err, why, sizeof(why));
  hc_close(h);
  h->rc = rc;
  h->st = HC_DONE;
}

/* Whether a kept connection is still quiet: nothing to read, no end, no
 * error (the controller closes idle connections). */
static bool still_quiet(struct hc *h) {
  struct pollfd p = {.fd = h->fd, .events = POLLIN};

  if (h->tls && gnutls_record_check_pending(h->tls))
    return false;
  return poll(&p, 1, 0) == 0;
}

/* Starts over on a new connection after the kept one was found closed
 * before any answer (with a connect phase of its own). Returns whether it
 * did (once per request). */
static bool again_fresh(struct hc *h) {
  int64_t now = util_mono_ms();

  if (!h->reused || h->retried || h->got_bytes)
    return false;
  hc_close(h);
  h->reused = false;
  h->retried = true;
  h->out_sent = h->body_sent = 0;
  h->continued = false;
  h->send_more = false;
  h->addr_at = 0;
  h->st = HC_RESOLVE;
  h->step_deadline_ms = now;
  h->connect_by_ms = now + HC_CONNECT_MS;
  h->resolve_wait_ms = HC_RESOLVE_POLL_MS;
  return true;
}

/* Whether the socket has something to read (or an end) right now. */
static bool readable(const struct hc *h) {
  struct pollfd p = {.fd = h->fd, .events = POLLIN};

  return poll(&p, 1, 0) > 0;
}

/* Whether GnuTLS holds bytes already read that poll() cannot see. */
static bool tls_pending(const struct hc *h) {
  return h->tls && gnutls_record_check_pending(h->tls) > 0;
}

/* Begins connecting to the address after h->addr_at - 1 (h->addr_at: the
 * next to try). Returns 0, or -1 when no address is left. */
static int connect_next(struct hc *h, int64_t now) {
  const struct addrinfo *ai = hc_addresses();
  int one = 1;

  for (size_t i = 0; ai && i < h->addr_at; i++)
    ai = ai->ai_next;
  for (; ai; ai = ai->ai_next) {
    h->addr_at++;
    h->fd = socket(ai->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, ai->ai_protocol);
    if (h->fd < 0)
      continue;
    (void)setsockopt(h->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    if (connect(h->fd, ai->ai_addr, ai->ai_addrlen) == 0 || errno == EINPROGRESS) {
      h->st = HC_CONNECT;
      /* An address that does not answer leaves the next one time to. */
      h->step_deadline_ms = ai->ai_next && now + HC_ADDRESS_MS < h->connect_by_ms
                                ? now + HC_ADDRESS_MS
                                : h->connect_by_ms;
      return 0;
    }
    snprintf(h->err, sizeof(h->err), "%s", strerror(errno));
    hc_close(h);
  }
  return -1;
}

/* Sets up the TLS session on the connected h->fd. Returns 0 or -1 (the
 * request failed). */
static int tls_begin(struct hc *h) {
  char err[HC_ERR_MAX];
  int r;

  const char *ca = getenv("MUSTER_CA_FILE");

  if (hc_tls_cred(ca ? ca : "", err, sizeof(err)) != 0) {
    fail(h, MUSTER_E_UNREACHABLE, "%s", err);
    return -1;
  }
  r = gnutls_init(&h->tls, GNUTLS_CLIENT | GNUTLS_NONBLOCK | GNUTLS_NO_SIGNAL);
  if (r >= 0)
    r = gnutls_set_default_priority(h->tls);
  if (r >= 0)
    r = gnutls_credentials_set(h->tls, GNUTLS_CRD_CERTIFICATE, h->cred = hc_tls_hold());
  if (r >= 0 && !hc_is_address(h->to->host))
    r = gnutls_server_name_set(h->tls, GNUTLS_NAME_DNS, h->to->host, strlen(h->to->host));
  if (r < 0) {
    fail(h, r == GNUTLS_E_MEMORY_ERROR ? MUSTER_E_NOMEM : MUSTER_E_UNREACHABLE,
         "cannot set up TLS: %s", gnutls_strerror(r));
    return -1;
  }
  /* (checks the chain and that the certificate names the host, or the
   * address, in the URL) */
  gnutls_session_set_verify_cert(h->tls, h->to->host, 0);
  gnutls_transport_set_int(h->tls, h->fd);
  h->st = HC_HANDSHAKE;
  return 0;
}

/* Says why the handshake failed, in h->err. */
static void tls_failed(struct hc *h, int r) {
  gnutls_datum_t why = {NULL, 0};
  unsigned status;

  if (r != GNUTLS_E_CERTIFICATE_VERIFICATION_ERROR) {
    fail(h, MUSTER_E_UNREACHABLE, "TLS handshake failed: %s", gnutls_strerror(r));
    return;
  }
  status = gnutls_session_get_verify_cert_status(h->tls);
  (void)gnutls_certificate_verification_status_print(status, GNUTLS_CRT_X509, &why, 0);
  while (why.data && why.size && why.data[why.size - 1] == ' ') /* (it ends in spaces) */
    why.data[--why.size] = '\0';
  /* (the sentence every client of the controller says) */
  fail(h, MUSTER_E_UNREACHABLE,
       "the controller has a certificate this client cannot verify (%.100s): set "
       "MUSTER_CA_FILE to the file of the CA that signed it",
       why.data ? (const char *)why.data : "unknown reason");
  gnutls_free(why.data);
}

/* The socket's I/O, plain or TLS. Returns the bytes moved, 0 at the
 * connection's end (receiving), -1 when it must wait (h->want says for
 * what), or -2 on an error (h->err says which). */
static ssize_t io(struct hc *h, bool sending, void *p, size_t n) {
  ssize_t r;

  if (h->tls) {
    /* (a warning alert and the like are not the end: read on) */
    for (int tries = 0; tries < 8; tries++) {
      r = sending ? gnutls_record_send(h->tls, p, n) : gnutls_record_recv(h->tls, p, n);
      if (r >= 0 || r == GNUTLS_E_AGAIN || r == GNUTLS_E_INTERRUPTED ||
          gnutls_error_is_fatal((int)r))
        break;
    }
    if (r >= 0)
      return r;
    if (r == GNUTLS_E_AGAIN || r == GNUTLS_E_INTERRUPTED) {
      h->want = gnutls_record_get_direction(h->tls) ? POLLOUT : POLLIN;
      return -1;
    }
    /* An end without TLS's close_notify is the end of a kept connection
     * the controller closed, unless an answer had begun: then it may be a
     * cut one. */
    if (!sending && r == GNUTLS_E_PREMATURE_TERMINATION &&
        (!h->got_bytes || (h->head_done && h->until_eof)))
      return 0;
    snprintf(h->err, sizeof(h->err), "%s", gnutls_strerror((int)r));
    return -2;
  }
  r = sending ? send(h->fd, p, n, MSG_NOSIGNAL) : recv(h->fd, p, n, 0);
  if (r >= 0)
    return r;
  if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) {
    h->want = sending ? POLLOUT : POLLIN;
    return -1;
  }
  snprintf(h->err, sizeof(h->err), "%s", strerror(errno));
  return -2;
}

/* ------------------------------------------------------------------------ */
/* The request                                                              */

/* Begins POSTing body (len bytes, valid until the request is done) to
 * to->prefix + path, with the header lines headers (each ending in CRLF),
 * to end within timeout_ms. expect_ms: when not 0, the body waits that long
 * at most for 100 Continue. An answer longer than answer_max fails with
 * MUSTER_E_TOO_LARGE. Returns 0 or MUSTER_E_NOMEM (nothing started). */
int hc_start(struct hc *h, const struct hc_target *to, const char *path, const char *headers,
             const void *body, size_t len, int64_t expect_ms, size_t answer_max,
             int64_t timeout_ms) {
  static const char fixed[] =
      "POST  HTTP/1.1\r\nHost: \r\nUser-Agent: muster-workerd/" MUSTER_VERSION
      "\r\nContent-Length: \r\nExpect: 100-continue\r\n\r\n";
  int64_t now = util_mono_ms();
  bool expect = expect_ms > 0;
  size_t cap;
  int n;

  if (h->fd >= 0 && (!h->keep || h->to != to || !still_quiet(h)))
    hc_close(h);
  cap = sizeof(fixed) + strlen(to->prefix) + strlen(path) + strlen(to->host_header) +
        strlen(headers) + 24 + (expect ? 0 : len);
  if (h->out)
    explicit_bzero(h->out, h->out_len);
  free(h->out);
  h->out_len = 0;
  h->out = malloc(cap);
  if (!h->out)
    return MUSTER_E_NOMEM;
  n = snprintf(h->out, cap,
               "POST %s%s HTTP/1.1\r\nHost: %s\r\nUser-Agent: muster-workerd/" MUSTER_VERSION
               "\r\n%sContent-Length: %zu\r\n%s\r\n",
               to->prefix, path, to->host_header, headers, len,
               expect ? "Expect: 100-continue\r\n" : "");
  if (n < 0 || (size_t)n >= cap)
    return MUSTER_E_NOMEM;
  h->out_len = (size_t)n;
  if (!expect && len) {
    memcpy(h->out + h->out_len, body, len);
    h->out_len += len;
  }
  h->to = to;
  h->body = body;
  h->body_len = expect ? len : 0;
  h->expect = expect;
  h->expect_ms = expect_ms;
  h->out_sent = h->body_sent = 0;
  h->continued = h->retried = h->got_bytes = h->head_done = false;
  h->chunked = h->until_eof = false;
  h->head_bytes = 0;
  h->send_more = false;
  h->in_len = 0;
  h->answer_len = 0;
  if (h->answer)
    h->answer[0] = '\0';
  h->answer_max = answer_max;
  h->status = 0;
  h->rc = 0;
  h->err[0] = '\0';
  h->deadline_ms = now + timeout_ms;
  h->timeout_ms = timeout_ms;
  h->addr_at = 0;
  h->step_deadline_ms = now;
  h->connect_by_ms = now + HC_CONNECT_MS;
  h->resolve_wait_ms = HC_RESOLVE_POLL_MS;
  h->reused = h->fd >= 0;
  h->st = h->reused ? HC_SEND : HC_RESOLVE;
  h->want = POLLOUT;
  return 0;
}

/* What h waits for on h->fd (0: only the clock). */
short hc_events(const struct hc *h) {
  switch (h->st) {
  case HC_CONNECT:
    return POLLOUT;
  case HC_SEND:
    /* (a body sent after 100 Continue listens for an early refusal) */
    return h->want | (h->expect && h->continued ? POLLIN : 0);
  case HC_HANDSHAKE:
  case HC_CONTINUE:
  case HC_RECV:
    return h->want;
  default:
    return 0;
  }
}

static int64_t min64(int64_t a, int64_t b) {
  return a < b ? a : b;
}

/* When h next needs hc_step() whatever its socket does (INT64_MAX: never). */
int64_t hc_deadline(const struct hc *h) {
  int64_t d = h->deadline_ms;

  switch (h->st) {
  case HC_RESOLVE:
    return min64(min64(h->step_deadline_ms, h->connect_by_ms), d);
  case HC_CONTINUE:
    return tls_pending(h) ? 0 : min64(h->step_deadline_ms, d);
  case HC_CONNECT:
    return min64(h->step_deadline_ms, d);
  case HC_HANDSHAKE:
    return min64(h->connect_by_ms, d);
  case HC_SEND: /* (bytes GnuTLS holds wake no poll(): the step is due now) */
    return h->send_more || (h->expect && h->continued && tls_pending(h)) ? 0 : d;
  case HC_RECV:
    return tls_pending(h) ? 0 : d;
  default:
    return INT64_MAX;
  }
}

/* Grows h->in to room for HC_READ_CHUNK more bytes and a NUL. The old
 * copy is wiped (an answer may carry a token). Returns 0 or -1. */
static int in_grow(struct hc *h) {
  if (h->in_cap - h->in_len >= HC_READ_CHUNK)
    return 0;
  return hc_grow_wiped(&h->in, &h->in_cap, h->in_len, h->in_len + HC_READ_CHUNK * 2);
}

/* Reads what the socket holds into h->in and parses it, until the answer is
 * complete (HC_DONE) or the socket has nothing more for now. */
static void receive(struct hc *h) {
  /* (a bounded number of reads a step: a peer that never stops sending
   * holds the caller's loop no longer; the rest waits for the next) */
  for (int reads = 0;; reads++) {
    ssize_t r;
    int took = h->in_len ? hc_answer_take(h) : 0;

    if (took < 0) {
      fail(h, took, "%s", h->err);
      return;
    }
    if (took == 2) { /* 100 Continue: the body goes now */
      h->continued = true;
      h->st = HC_SEND;
      return;
    }
    if (took == 1) {
      bool unsent = h->expect && (!h->continued || h->body_sent < h->body_len);

      /* A success for a body never read is no success. */
      if (unsent && h->status < 300) {
        fail(h, MUSTER_E_UNREACHABLE, "the controller answered HTTP %ld before it read the body",
             h->status);
        return;
      }
      /* Kept only when it is quiet: an answer that left bytes over, or one
       * whose request body was not all sent, ends it. */
      if (!h->keep || h->in_len || unsent)
        hc_close(h);
      h->st = HC_DONE;
      return;
    }
    if (reads == HC_READS_A_STEP) {
      h->want = POLLIN;
      return;
    }
    if (in_grow(h) != 0) {
      fail(h, MUSTER_E_NOMEM, "out of memory");
      return;
    }
    r = io(h, false, h->in + h->in_len, h->in_cap - h->in_len - 1);
    if (r == -1)
      return;
    if (r == -2) {
      if (!again_fresh(h))
        fail(h, MUSTER_E_UNREACHABLE, "reading the answer: %s", h->err);
      return;
    }
    if (r == 0) {
      if (hc_answer_at_end(h)) {
        hc_close(h);
        h->st = HC_DONE;
      } else if (!again_fresh(h)) {
        fail(h, MUSTER_E_UNREACHABLE, "the controller closed the connection %s",
             h->got_bytes ? "in the middle of its answer" : "without answering");
      }
      return;
    }
    h->got_bytes = true;
    h->in_len += (size_t)r;
  }
}

/* Sends what is left of the request's head (and body); then it waits. */
static void send_some(struct hc *h, int64_t now) {
  bool body = h->expect && h->continued;
  const char *p = body ? h->body : h->out;
  size_t len = body ? h->body_len : h->out_len;
  size_t *sent = body ? &h->body_sent : &h->out_sent;
  size_t moved = 0;

  while (*sent < len) {
    ssize_t r;

    /* (a body that goes after 100 Continue goes a slice a step, between
     * which an early answer is looked for: hc_step()) */
    if (body && moved >= HC_BODY_A_STEP) {
      h->send_more = true;
      return;
    }
    r = io(h, true, (void *)(p + *sent),
           body && len - *sent > HC_BODY_A_STEP - moved ? HC_BODY_A_STEP - moved : len - *sent);
    if (r == -1)
      return;
    if (r < 0) {
      if (body) { /* (it may have answered first, and closed: read that) */
        h->st = HC_RECV;
        h->want = POLLIN;
      } else if (!again_fresh(h)) {
        fail(h, MUSTER_E_UNREACHABLE, "sending the request: %s", h->err);
      }
      return;
    }
    *sent += (size_t)r;
    moved += (size_t)r;
  }
  if (h->expect && !h->continued) {
    h->st = HC_CONTINUE;
    h->step_deadline_ms = now + h->expect_ms;
  } else {
    h->st = HC_RECV;
  }
  h->want = POLLIN;
}

/* Moves h on: revents is what poll() saw on h->fd (0 if nothing), now the
 * clock. h->st is HC_DONE once the request is over. */
void hc_step(struct hc *h, short revents, int64_t now) {
  int r;

  for (;;) {
    enum hc_state was = h->st;

    if (was == HC_DONE || was == HC_CLOSED)
      return;
    if (now >= h->deadline_ms) {
      fail(h, MUSTER_E_UNREACHABLE, "no answer within %lld ms%s%s", (long long)h->timeout_ms,
           h->err[0] ? ": " : "", h->err);
      return;
    }
    if ((was == HC_RESOLVE || was == HC_CONNECT || was == HC_HANDSHAKE) &&
        now >= h->connect_by_ms) {
      fail(h, MUSTER_E_UNREACHABLE, "cannot connect to %.200s port %s within %d ms%s%s",
           h->to->host, h->to->port, HC_CONNECT_MS, h->err[0] ? ": " : "", h->err);
      return;
    }
    switch (was) {
    case HC_RESOLVE:
      r = hc_resolve(h->to, now, h->err, sizeof(h->err));
      if (r == 0) { /* (looked at again shortly, then less often) */
        snprintf(h->err, sizeof(h->err), "still looking up %.200s", h->to->host);
        h->step_deadline_ms = now + h->resolve_wait_ms;
        h->resolve_wait_ms = min64(h->resolve_wait_ms * 2, HC_RESOLVE_POLL_MAX_MS);
        return;
      }
      if (r < 0) {
        fail(h, r, "%s", h->err);
        return;
      }
      h->err[0] = '\0'; /* (the addresses are in: no "still looking up") */
      if (connect_next(h, now) != 0) {
        fail(h, MUSTER_E_UNREACHABLE, "cannot connect to %s port %s: %s", h->to->host, h->to->port,
             h->err[0] ? h->err : "no address");
        return;
      }
      revents = 0;
      break;
    case HC_CONNECT: {
      int e = 0;
      socklen_t el = sizeof(e);

      if (!(revents & (POLLOUT | POLLERR | POLLHUP))) {
        if (now < h->step_deadline_ms)
          return;
        e = ETIMEDOUT;
      } else if (getsockopt(h->fd, SOL_SOCKET, SO_ERROR, &e, &el) != 0) {
        e = errno;
      }
      if (e) {
        snprintf(h->err, sizeof(h->err), "%s", strerror(e));
        hc_close(h);
        if (connect_next(h, now) != 0)
          fail(h, MUSTER_E_UNREACHABLE, "cannot connect to %s port %s: %s", h->to->host,
               h->to->port, h->err);
        revents = 0;
        break;
      }
      h->err[0] = '\0';
      if (h->to->tls) {
        if (tls_begin(h) != 0)
          return;
      } else {
        h->st = HC_SEND;
      }
      break;
    }
    case HC_HANDSHAKE:
      /* (a warning alert is not the end: go on) */
      for (int tries = 0; tries < 8; tries++) {
        r = gnutls_handshake(h->tls);
        if (r >= 0 || r == GNUTLS_E_AGAIN || r == GNUTLS_E_INTERRUPTED || gnutls_error_is_fatal(r))
          break;
      }
      if (r == GNUTLS_E_AGAIN || r == GNUTLS_E_INTERRUPTED) {
        h->want = gnutls_record_get_direction(h->tls) ? POLLOUT : POLLIN;
        return;
      }
      if (r < 0) {
        tls_failed(h, r);
        return;
      }
      h->st = HC_SEND;
      break;
    case HC_SEND:
      if (h->expect && h->continued &&
          ((revents & POLLIN) || h->in_len || tls_pending(h) || (h->send_more && readable(h)))) {
        /* An answer before the body is all sent (a refusal) ends the
         * sending once its head is in; until then, the body goes on. */
        h->st = HC_RECV;
        h->send_more = false;
        receive(h);
        if (h->st != HC_RECV || h->head_done)
          break;
        h->st = HC_SEND;
      }
      h->send_more = false;
      send_some(h, now);
      break;
    case HC_CONTINUE:
      if (now >= h->step_deadline_ms) { /* no 100 Continue came: send it anyway */
        h->continued = true;
        h->st = HC_SEND;
        break;
      }
      /* fall through */
    case HC_RECV:
      receive(h);
      break;
    default:
      return;
    }
    if (h->st == was)
      return;    /* waiting on the socket */
    revents = 0; /* (what poll() saw was for the state just left) */
  }
}

/* Frees everything h holds; h can be started again after hc_init(). */
void hc_free(struct hc *h) {
  hc_close(h);
  if (h->out)
    explicit_bzero(h->out, h->out_len);
  if (h->in)
    explicit_bzero(h->in, h->in_cap);
  if (h->answer)
    explicit_bzero(h->answer, h->answer_cap);
  free(h->out);
  free(h->in);
  free(h->answer);
  hc_init(h);
}

/* POSTs body (JSON) to to->prefix + path and waits for the answer, at most
 * timeout_ms: for muster-workerd --job, which has nothing else to do
 * meanwhile. Returns 0 with *status and *answer (malloc'd, NUL-terminated,
 * *answer_len bytes before the NUL; the caller wipes and frees it), or MUSTER_E_UNREACHABLE /
 * MUSTER_E_TOO_LARGE / MUSTER_E_NOMEM with the reason in err. */
int hc_post_wait(const struct hc_target *to, const char *path, const char *headers,
                 const char *body, int64_t timeout_ms, long *status, char **answer,
                 size_t *answer_len, char *err, size_t errlen) {
  struct hc h;
  int rc;

  hc_init(&h);
  *answer = NULL;
  *answer_len = 0;
  *status = 0;
  rc = hc_start(&h, to, path, headers, body, strlen(body), 0, 1u << 20, timeout_ms);
  if (rc) {
    snprintf(err, errlen, "out of memory");
    hc_free(&h);
    return rc;
  }
  while (h.st != HC_DONE) {
    int64_t now = util_mono_ms(), d = hc_deadline(&h);
    struct pollfd p = {.fd = h.fd, .events = hc_events(&h)};
    int wait = d == INT64_MAX ? 1000 : d <= now ? 0 : d - now > 1000 ? 1000 : (int)(d - now);

    if (poll(&p, h.fd >= 0 && p.events ? 1 : 0, wait) < 0 && errno != EINTR) {
      fail(&h, MUSTER_E_UNREACHABLE, "poll: %s", strerror(errno));
      break;
    }
    hc_step(&h, p.revents, util_mono_ms());
  }
  rc = h.rc;
  if (rc == 0) {
    *status = h.status;
    *answer = h.answer;
    *answer_len = h.answer_len;
    h.answer = NULL;
  } else {
    snprintf(err, errlen, "%s", h.err);
  }
  hc_free(&h);
  return rc;
}
