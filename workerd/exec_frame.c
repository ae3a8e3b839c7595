/*
 * exec_frame.c: the exec channel's framing on the server's side
 * (docs/exec-protocol.md; the header's layout is common/exec_wire.h, shared
 * with the client in sdk/lib/exec.c).
 *
 * A connection's frames to send are queued back to back in its output buffer
 * (ex_queue(), ex_out_room(), at most EX_OUT_CAP bytes) and sent as the
 * socket takes them (ex_flush()); frames from the client are read header
 * first, then payload (ex_frame_recv()), and handed to the caller whole.
 * What a frame means, and what a connection does next, is exec_server.c's:
 * nothing here changes a connection's state.
 */
#include "exec_internal.h"

#include "muster_errors.h"

#include <errno.h>
#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <unistd.h>

/* ------------------------------------------------------------------------ */
/* Frames to send                                                           */

/* Makes room for need more bytes at the end of c's output buffer, growing it
 * (up to EX_OUT_CAP) or moving its contents to the front. Returns where they
 * go, or NULL if out of memory or past the cap (which flow control makes
 * impossible: see EX_OUT_HIGH). */
unsigned char *ex_out_room(struct ex_conn *c, size_t need) {
  size_t cap;
  unsigned char *p;

  if (c->out_len + need > EX_OUT_CAP)
    return NULL;
  if (c->out_start + c->out_len + need <= c->out_cap)
    return c->out + c->out_start + c->out_len;
  if (c->out_len + need <= c->out_cap && c->out_start > 0) {
    memmove(c->out, c->out + c->out_start, c->out_len);
    c->out_start = 0;
    return c->out + c->out_len;
  }
  if (c->out_start > 0) {
    memmove(c->out, c->out + c->out_start, c->out_len);
    c->out_start = 0;
  }
  cap = c->out_cap ? c->out_cap : 4096;
  while (cap < c->out_len + need)
    cap *= 2;
  if (cap > EX_OUT_CAP)
    cap = EX_OUT_CAP;
  p = realloc(c->out, cap);
  if (!p)
    return NULL;
  c->out = p;
  c->out_cap = cap;
  return c->out + c->out_len;
}

/* Queues one frame (len <= EXEC_WIRE_FRAME_MAX) on c. Returns 0 or MUSTER_E_NOMEM. */
MUST_CHECK int ex_queue(struct ex_conn *c, char type, const void *data, size_t len) {
  unsigned char *w = ex_out_room(c, EXEC_WIRE_HDR_LEN + len);

  if (!w)
    return MUSTER_E_NOMEM;
  exec_wire_put_hdr(w, type, len);
  if (len)
    memcpy(w + EXEC_WIRE_HDR_LEN, data, len);
  c->out_len += EXEC_WIRE_HDR_LEN + len;
  return 0;
}

/* Builds the payload of an X frame: code and signo are -1 for null, error is
 * NULL for null. Returns a new string (free()), or NULL if out of memory. */
char *ex_exit_json(int code, int signo, const char *error) {
  json_t *o =
      json_pack("{s:o, s:o, s:o}", "exit_code", code >= 0 ? json_integer(code) : json_null(),
                "signal", signo >= 0 ? json_integer(signo) : json_null(), "error",
                error ? json_string(error) : json_null());
  char *s = o ? json_dumps(o, JSON_COMPACT) : NULL;

  json_decref(o);
  return s;
}

/* Sends c's queued frames until the socket is full. Returns 0, or
 * MUSTER_E_IO when the client is gone (connection reset or closed). */
MUST_CHECK int ex_flush(struct ex_conn *c, int64_t now) {
  while (c->out_len > 0) {
    ssize_t n = ex_tls_send(c, c->out + c->out_start, c->out_len);

    if (n > 0) {
      c->out_start += (size_t)n;
      c->out_len -= (size_t)n;
      if (c->state == EX_CLOSING)
        c->deadline_ms = now + EX_STALL_MS;
      continue;
    }
    if (n < 0 && errno == EINTR)
      continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
      return 0;
    return MUSTER_E_IO;
  }
  c->out_start = 0;
  return 0;
}

/* Refuses a connection that gets no record (even the spare ones are taken,
 * or out of memory), best effort and without blocking: X, our FIN, and what
 * the client sent is read, so that the close is less likely to turn into a
 * reset. */
void ex_refuse_now(int fd) {
  unsigned char buf[4096];

  /* (no X: there is no TLS session to carry it; the client's handshake
   * ends with the connection) */
  shutdown(fd, SHUT_WR);
  while (recv(fd, buf, sizeof(buf), MSG_DONTWAIT) > 0)
    ;
  close(fd);
}

/* ------------------------------------------------------------------------ */
/* Frames received                                                          */

/* Reads once from c's socket: the rest of the frame header, or of the
 * payload (c->in, allocated once the header is whole, with one more byte so
 * that a hello can be NUL-terminated); with drop, anything, to be dropped.
 * Says what it found (enum ex_rx); on EX_RX_FRAME the payload is c->in,
 * c->in_len bytes, which the caller takes over. */
enum ex_rx ex_frame_recv(struct ex_conn *c, bool drop) {
  unsigned char sink[4096];
  unsigned char *where;
  size_t want;
  ssize_t n;

  if (drop) {
    where = sink;
    want = sizeof(sink);
  } else if (c->hdr_got < EXEC_WIRE_HDR_LEN) {
    where = c->hdr + c->hdr_got;
    want = EXEC_WIRE_HDR_LEN - c->hdr_got;
  } else {
    where = c->in + c->in_got;
    want = c->in_len - c->in_got;
  }
  n = ex_tls_recv(c, where, want);
  if (n < 0 && errno == EINTR)
    return EX_RX_MORE;
  if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
    return EX_RX_AGAIN;
  if (n <= 0)
    return n == 0 ? EX_RX_CLOSED : EX_RX_BROKEN;
  if (drop)
    return EX_RX_MORE;
  if (c->hdr_got < EXEC_WIRE_HDR_LEN) {
    struct exec_wire_hdr h;
    enum exec_wire_rc hr;

    c->hdr_got += (size_t)n;
    if (c->hdr_got < EXEC_WIRE_HDR_LEN)
      return EX_RX_MORE;
    /* A type this protocol does not define is read like any other, and
     * ex_dispatch() ignores it. */
    hr = exec_wire_parse_hdr(c->hdr, c->hdr_got, &h);
    c->in_len = h.len;
    c->in_got = 0;
    if (hr == EXEC_WIRE_TOO_LARGE)
      return EX_RX_TOO_LARGE;
    if (!(c->in = malloc(c->in_len + 1)))
      return EX_RX_NOMEM;
    c->in[c->in_len] = '\0';
  } else {
    c->in_got += (size_t)n;
  }
  return c->in_got == c->in_len ? EX_RX_FRAME : EX_RX_MORE;
}

/* Closes c's socket and frees its buffers; the record itself stays while its
 * command needs reaping. */
void ex_sock_release(struct ex_conn *c) {
  ex_tls_free(c);
  fd_close(&c->sock);
  free(c->in);
  free(c->out);
  c->in = c->out = NULL;
  c->in_len = c->in_got = c->hdr_got = 0;
  c->out_start = c->out_len = c->out_cap = 0;
}
