/*
 * http_client.h: muster-workerd's HTTP/1.1 client toward the controller (a
 * POST, its answer, a connection kept alive between calls), over TCP or
 * GnuTLS, driven by the caller's poll() and never blocking it. See
 * http_client.c.
 */
#ifndef MUSTER_HTTP_CLIENT_H
#define MUSTER_HTTP_CLIENT_H

#include <gnutls/gnutls.h>
#include <netdb.h>
#include <poll.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define HC_HOST_MAX 256
#define HC_PREFIX_MAX 2048
#define HC_ERR_MAX 256

/* Where the controller is: its URL, taken apart once. */
struct hc_target {
  bool tls;                           /* https:// */
  char host[HC_HOST_MAX];             /* a name or an address, without brackets */
  char host_header[HC_HOST_MAX + 16]; /* the Host: line's value */
  char port[8];
  char prefix[HC_PREFIX_MAX]; /* the URL's path, without a trailing '/' */
};

enum hc_state {
  HC_CLOSED,    /* no connection, no request */
  HC_IDLE,      /* a connection kept alive, no request */
  HC_RESOLVE,   /* waiting for the host's addresses */
  HC_CONNECT,   /* TCP connect in progress */
  HC_HANDSHAKE, /* TLS handshake in progress */
  HC_SEND,      /* sending the request (or, past a 100 Continue, its body) */
  HC_CONTINUE,  /* head sent, waiting for 100 Continue before the body */
  HC_RECV,      /* reading the answer */
  HC_DONE       /* answered or failed: hc.rc says which */
};

/* One connection to the controller and the request on it. Zero it, then
 * set fd to -1 (hc_init()). */
struct hc {
  enum hc_state st;
  int fd;
  gnutls_session_t tls;
  gnutls_certificate_credentials_t cred; /* tls's (hc_tls_hold()) */
  const struct hc_target *to;
  /* The request: out (its head, and its body unless it waits for 100
   * Continue) and then body[body_sent..] where it waits. */
  char *out;
  size_t out_len, out_sent;
  const char *body;
  size_t body_len, body_sent;
  bool expect, continued;
  int64_t expect_ms; /* how long the body waits for 100 Continue */
  bool reused;       /* sent on a connection kept from an earlier call */
  bool retried;      /* already sent again on a new connection */
  size_t addr_at;
  short want; /* what the socket's I/O waits for (POLLIN, POLLOUT) */
  int64_t deadline_ms, step_deadline_ms, timeout_ms;
  int64_t connect_by_ms;   /* the lookup, connect and handshake end by then */
  int64_t resolve_wait_ms; /* the next wait for a lookup in flight */
  /* The answer. */
  char *in; /* what was read and not yet parsed */
  size_t in_len, in_cap;
  bool got_bytes, head_done, chunked, until_eof, keep;
  size_t head_bytes; /* of heads (1xx included) and trailers, bounded */
  bool send_more;    /* a slice of the body went: the next is due at once */
  uint64_t left;     /* body bytes (or the current chunk's) still to come */
  int chunk_phase;   /* 0: size line, 1: data, 2: CRLF after data, 3: trailer */
  long status;
  char *answer; /* NUL-terminated */
  size_t answer_len, answer_cap, answer_max;
  /* HC_DONE: 0, or MUSTER_E_UNREACHABLE (err says why), MUSTER_E_TOO_LARGE,
   * MUSTER_E_NOMEM. */
  int rc;
  char err[HC_ERR_MAX];
};

/* http_target.c */
int hc_target_parse(const char *url, struct hc_target *t);
bool hc_is_address(const char *host);
int hc_resolve(const struct hc_target *to, int64_t now, char *err, size_t errlen);
const struct addrinfo *hc_addresses(void);
int hc_tls_cred(const char *ca, char *err, size_t errlen);
gnutls_certificate_credentials_t hc_tls_hold(void);
void hc_tls_release(gnutls_certificate_credentials_t c);
int hc_tls_kept(void);
void hc_tls_prewarm(const char *ca);

/* http_client.c */
void hc_init(struct hc *h);
int hc_start(struct hc *h, const struct hc_target *to, const char *path, const char *headers,
             const void *body, size_t len, int64_t expect_ms, size_t answer_max,
             int64_t timeout_ms);
short hc_events(const struct hc *h);
int64_t hc_deadline(const struct hc *h);
void hc_step(struct hc *h, short revents, int64_t now);
void hc_close(struct hc *h);
void hc_free(struct hc *h);
/* A kept connection, out of any request (a caller's pool of them). */
struct hc_conn {
  int fd;
  gnutls_session_t tls;
  gnutls_certificate_credentials_t cred; /* tls's (hc_tls_hold()) */
  const struct hc_target *to;
};

bool hc_detach(struct hc *h, struct hc_conn *c);
void hc_attach(struct hc *h, struct hc_conn *c);
void hc_conn_close(struct hc_conn *c);

/* http_answer.c */
int hc_answer_take(struct hc *h);
int hc_answer_at_end(struct hc *h);
int hc_grow_wiped(char **buf, size_t *cap, size_t len, size_t new_cap);

int hc_post_wait(const struct hc_target *to, const char *path, const char *headers,
                 const char *body, int64_t timeout_ms, long *status, char **answer,
                 size_t *answer_len, char *err, size_t errlen);

#endif
