/* fuzz_exec.c: libFuzzer target for the exec channel's framing
 * (common/exec_wire.h), which both ends use, and for the client end as a
 * whole: libmuster's muster_exec_at() reading what a worker sends.
 *
 * Each input is first walked frame by frame with exec_wire_parse_hdr(), the
 * way both ends cut their byte streams (a header that comes out is
 * re-encoded and must give the same bytes). Then a loopback listener plays
 * the worker: it completes the TLS handshake with the client's token (the
 * exec channel's, common/exec_wire.h), then answers with the input, byte
 * for byte, inside the session, and muster_exec_at() must end with an
 * answer (never a hang, a crash, a leak or undefined behaviour). */
#include "exec_wire.h"
#include "muster.h"

#include <arpa/inet.h>
#include <gnutls/gnutls.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

static void walk(const uint8_t *data, size_t size) {
  size_t off = 0;

  while (off < size) {
    struct exec_wire_hdr h;
    unsigned char again[EXEC_WIRE_HDR_LEN];
    enum exec_wire_rc rc = exec_wire_parse_hdr(data + off, size - off, &h);

    if (rc == EXEC_WIRE_SHORT) {
      if (size - off >= EXEC_WIRE_HDR_LEN)
        abort();
      return;
    }
    if (rc == EXEC_WIRE_TOO_LARGE) {
      if (h.len <= EXEC_WIRE_FRAME_MAX)
        abort();
      return;
    }
    if ((rc == EXEC_WIRE_OK) != exec_wire_type_known(h.type))
      abort();
    exec_wire_put_hdr(again, h.type, h.len);
    if (memcmp(again, data + off, EXEC_WIRE_HDR_LEN) != 0)
      abort();
    if (h.len > size - off - EXEC_WIRE_HDR_LEN)
      return; /* the payload has not all arrived */
    off += EXEC_WIRE_HDR_LEN + h.len;
  }
}

static int listener = -1;
static int port;

static void listen_once(void) {
  struct sockaddr_in a = {.sin_family = AF_INET};
  socklen_t len = sizeof(a);

  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  listener = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (listener < 0 || bind(listener, (struct sockaddr *)&a, len) != 0 || listen(listener, 8) != 0 ||
      getsockname(listener, (struct sockaddr *)&a, &len) != 0)
    abort();
  port = ntohs(a.sin_port);
}

struct peer {
  const uint8_t *data;
  size_t size;
};

/* The worker's key: the token the client is given ("fuzz"). */
static int psk_key(gnutls_session_t s, const gnutls_datum_t *identity, gnutls_datum_t *key) {
  (void)s;
  (void)identity;
  if (!(key->data = gnutls_malloc(4)))
    return -1;
  memcpy(key->data, "fuzz", 4);
  key->size = 4;
  return 0;
}

/* Plays the worker on its own thread, so that the client's poll loop and
 * the answer are as over a network. */
static void *serve(void *arg) {
  const struct peer *pr = arg;
  const uint8_t *data = pr->data;
  size_t size = pr->size;
  struct pollfd lp = {.fd = listener, .events = POLLIN};
  gnutls_psk_server_credentials_t cred = NULL;
  gnutls_session_t s = NULL;
  int fd;
  char buf[4096];
  size_t off = 0;
  int broken = 0;

  /* The client may never come (its connect failed): never wait forever. */
  if (poll(&lp, 1, 5000) != 1)
    return NULL;
  fd = accept(listener, NULL, NULL);
  if (fd < 0)
    return NULL;
  if (gnutls_psk_allocate_server_credentials(&cred) < 0)
    abort();
  gnutls_psk_set_server_credentials_function2(cred, psk_key);
  if (gnutls_init(&s, GNUTLS_SERVER | GNUTLS_NONBLOCK | GNUTLS_NO_SIGNAL) < 0 ||
      gnutls_priority_set_direct(s, EXEC_TLS_PRIORITY, NULL) < 0 ||
      gnutls_credentials_set(s, GNUTLS_CRD_PSK, cred) < 0)
    abort();
  gnutls_transport_set_int(s, fd);
  for (int r; (r = gnutls_handshake(s)) != GNUTLS_E_SUCCESS;) {
    struct pollfd p = {.fd = fd, .events = gnutls_record_get_direction(s) ? POLLOUT : POLLIN};
    if (gnutls_error_is_fatal(r) || poll(&p, 1, 2000) <= 0)
      goto out;
  }
  /* The hello comes first; then the bytes go out while whatever the client
   * sends is read and dropped. */
  while (off < size) {
    struct pollfd p = {.fd = fd, .events = POLLIN | POLLOUT};
    if (gnutls_record_check_pending(s) == 0 && poll(&p, 1, 2000) <= 0)
      break;
    if ((p.revents & POLLIN) || gnutls_record_check_pending(s) > 0) {
      ssize_t n = gnutls_record_recv(s, buf, sizeof(buf));
      if ((n == 0 || (n < 0 && gnutls_error_is_fatal((int)n))) && !(p.revents & POLLOUT))
        break;
    }
    if (p.revents & POLLOUT) {
      ssize_t n = gnutls_record_send(s, data + off, size - off);
      if (n == GNUTLS_E_AGAIN)
        continue;
      if (n <= 0) {
        broken = 1;
        break;
      }
      off += (size_t)n;
    }
  }
  if (!broken)
    (void)gnutls_bye(s, GNUTLS_SHUT_WR);
out:
  shutdown(fd, SHUT_WR);
  while (read(fd, buf, sizeof(buf)) > 0)
    ;
  close(fd);
  gnutls_deinit(s);
  gnutls_psk_free_server_credentials(cred);
  return NULL;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  const char *argv[] = {"true"};
  muster_exec_target t;
  muster_exec_opts o;
  char err[512];
  int code, rc;
  pthread_t th;
  struct peer pr = {data, size};

  walk(data, size);
  if (listener < 0)
    listen_once();
  if (pthread_create(&th, NULL, serve, &pr) != 0)
    return 0;
  memset(&t, 0, sizeof(t));
  snprintf(t.host, sizeof(t.host), "127.0.0.1");
  t.port = port;
  snprintf(t.token, sizeof(t.token), "fuzz");
  snprintf(t.worker_id, sizeof(t.worker_id), "w-fuzz");
  muster_exec_opts_init(&o);
  o.argv = argv;
  o.argc = 1;
  o.stdout_fd = -1;
  o.stderr_fd = -1;
  rc = muster_exec_at(&t, &o, &code, err, sizeof(err));
  if (rc != 0 && !err[0])
    abort(); /* a failure says why */
  pthread_join(th, NULL);
  return 0;
}
