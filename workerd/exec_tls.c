/*
 * exec_tls.c: the exec channel's TLS, the server's end (docs/exec-protocol.md,
 * "Credentials"). Every connection is TLS, keyed by the session's exec token
 * as a pre-shared key (GnuTLS, identity EXEC_TLS_IDENTITY), with an
 * ephemeral (EC)DH exchange on top (EXEC_TLS_PRIORITY): the token never
 * crosses the wire, what does is encrypted and authenticated, and a client
 * without the token fails the handshake before a byte of its hello is
 * read. Non-blocking throughout: the handshake and every record move on
 * as poll() says the socket can.
 */
#include "exec_internal.h"

#include "log.h"

#include <errno.h>
#include <gnutls/gnutls.h>
#include <stdlib.h>
#include <string.h>

static struct {
  gnutls_psk_server_credentials_t cred;
  gnutls_priority_t prio;
  bool ready;
} tls;

/* GnuTLS asks for the key of the identity the client named. */
static int psk_key(gnutls_session_t s, const gnutls_datum_t *identity, gnutls_datum_t *key) {
  size_t len;

  (void)s;
  if (!wd.exec_token || identity->size != strlen(EXEC_TLS_IDENTITY) ||
      memcmp(identity->data, EXEC_TLS_IDENTITY, identity->size) != 0)
    return -1;
  len = strlen(wd.exec_token);
  if (!(key->data = gnutls_malloc(len)))
    return -1;
  memcpy(key->data, wd.exec_token, len);
  key->size = (unsigned)len;
  return 0;
}

int ex_tls_init(void) {
  const char *at = NULL;

  if (tls.ready)
    return 0;
  if (gnutls_psk_allocate_server_credentials(&tls.cred) != GNUTLS_E_SUCCESS)
    return -1;
  gnutls_psk_set_server_credentials_function2(tls.cred, psk_key);
  if (gnutls_priority_init(&tls.prio, EXEC_TLS_PRIORITY, &at) != GNUTLS_E_SUCCESS) {
    LOG(LOG_ERROR, "GnuTLS takes no exec channel priority \"%s\" (at \"%s\")", EXEC_TLS_PRIORITY,
        at ? at : "?");
    gnutls_psk_free_server_credentials(tls.cred);
    return -1;
  }
  tls.ready = true;
  return 0;
}

void ex_tls_cleanup(void) {
  if (!tls.ready)
    return;
  gnutls_priority_deinit(tls.prio);
  gnutls_psk_free_server_credentials(tls.cred);
  tls.ready = false;
}

/* Runs before the server's hello goes out: by then GnuTLS has checked the
 * client's binder, made with the key: the client has the token (a
 * connection that far along is never dropped to make room). */
static int key_proven(gnutls_session_t s, unsigned htype, unsigned when, unsigned incoming,
                      const gnutls_datum_t *msg) {
  struct ex_conn *c = gnutls_session_get_ptr(s);

  (void)htype;
  (void)when;
  (void)incoming;
  (void)msg;
  if (c)
    c->proven = true;
  return 0;
}

int ex_tls_start(struct ex_conn *c) {
  if (!tls.ready || gnutls_init(&c->tls, GNUTLS_SERVER | GNUTLS_NONBLOCK | GNUTLS_NO_SIGNAL) !=
                        GNUTLS_E_SUCCESS) {
    c->tls = NULL;
    return -1;
  }
  if (gnutls_priority_set(c->tls, tls.prio) != GNUTLS_E_SUCCESS ||
      gnutls_credentials_set(c->tls, GNUTLS_CRD_PSK, tls.cred) != GNUTLS_E_SUCCESS) {
    gnutls_deinit(c->tls);
    c->tls = NULL;
    return -1;
  }
  gnutls_transport_set_int(c->tls, c->sock);
  gnutls_session_set_ptr(c->tls, c);
  gnutls_handshake_set_hook_function(c->tls, GNUTLS_HANDSHAKE_SERVER_HELLO, GNUTLS_HOOK_PRE,
                                     key_proven);
  /* (a client's hello with a pre-shared key is some hundreds of bytes: no
   * client without the token has GnuTLS buffer 128 KiB of handshake) */
  gnutls_handshake_set_max_packet_length(c->tls, 8192);
  return 0;
}

int ex_tls_handshake(struct ex_conn *c, const char **why) {
  int r = gnutls_handshake(c->tls);

  if (r == GNUTLS_E_SUCCESS) {
    c->tls_done = true;
    return 1;
  }
  if (r == GNUTLS_E_AGAIN || r == GNUTLS_E_INTERRUPTED || !gnutls_error_is_fatal(r))
    return 0;
  /* (the client hears an alert, not only a close: a wrong token is told
   * apart from a worker that had no room) */
  (void)gnutls_alert_send_appropriate(c->tls, r);
  *why = r == GNUTLS_E_RECEIVED_ILLEGAL_PARAMETER || r == GNUTLS_E_DECRYPTION_FAILED ||
                 r == GNUTLS_E_MAC_VERIFY_FAILED || r == GNUTLS_E_INSUFFICIENT_CREDENTIALS ||
                 r == GNUTLS_E_KEYFILE_ERROR
             ? EXEC_WIRE_ERR_TOKEN
             : "no TLS handshake with the exec token";
  return -1;
}

bool ex_tls_wants_write(const struct ex_conn *c) {
  return c->tls && gnutls_record_get_direction(c->tls) == 1;
}

bool ex_tls_pending(const struct ex_conn *c) {
  return c->tls && c->tls_done && gnutls_record_check_pending(c->tls) > 0;
}

ssize_t ex_tls_recv(struct ex_conn *c, void *buf, size_t n) {
  ssize_t r = gnutls_record_recv(c->tls, buf, n);

  if (r >= 0)
    return r;
  if (r == GNUTLS_E_AGAIN)
    errno = EAGAIN;
  else if (r == GNUTLS_E_INTERRUPTED || r == GNUTLS_E_WARNING_ALERT_RECEIVED)
    errno = EINTR; /* (a warning ends nothing: read again) */
  else if (r == GNUTLS_E_PREMATURE_TERMINATION)
    return 0; /* (a close without close_notify: the client is gone all the same) */
  else
    errno = ECONNRESET;
  return -1;
}

ssize_t ex_tls_send(struct ex_conn *c, const void *buf, size_t n) {
  /* After GNUTLS_E_AGAIN the same record is sent again (NULL, 0), not
   * what the buffer holds by then. */
  ssize_t r =
      c->tls_again ? gnutls_record_send(c->tls, NULL, 0) : gnutls_record_send(c->tls, buf, n);

  c->tls_again = r == GNUTLS_E_AGAIN || r == GNUTLS_E_INTERRUPTED;
  if (r >= 0)
    return r;
  errno = r == GNUTLS_E_AGAIN ? EAGAIN : r == GNUTLS_E_INTERRUPTED ? EINTR : ECONNRESET;
  return -1;
}

void ex_tls_bye(struct ex_conn *c) {
  /* (best effort, without waiting: the TCP close follows) */
  if (c->tls && c->tls_done)
    (void)gnutls_bye(c->tls, GNUTLS_SHUT_WR);
}

void ex_tls_free(struct ex_conn *c) {
  if (c->tls)
    gnutls_deinit(c->tls);
  c->tls = NULL;
  c->tls_done = false;
  c->tls_again = false;
}
