/*
 * exec_wire.h: the exec channel's framing (docs/exec-protocol.md), in one
 * place for both of its ends: the server in muster-workerd
 * (workerd/exec_frame.c) and the client in libmuster (sdk/lib/exec.c).
 *
 * Both directions carry frames: a type byte, the payload's length in 4 bytes
 * big-endian (at most EXEC_WIRE_FRAME_MAX), then the payload. What the
 * payloads mean (JSON hello and exit, raw bytes, a signal number) is the
 * protocol document's; this header only frames them.
 *
 * Header only (static inline), and pure: no I/O, no allocation, so that the
 * header parser can be fuzzed on its own.
 */
#ifndef MUSTER_EXEC_WIRE_H
#define MUSTER_EXEC_WIRE_H

#include <stddef.h>

#define EXEC_WIRE_HDR_LEN 5            /* type byte + 4-byte big-endian length */
#define EXEC_WIRE_FRAME_MAX (1u << 20) /* largest payload, both ways */

/* Frame types, client -> worker. */
#define EXEC_FRAME_HELLO 'H'  /* JSON {"token", "argv", "env", "cwd"}: first, once */
#define EXEC_FRAME_STDIN 'I'  /* bytes for the command's stdin; empty: close it */
#define EXEC_FRAME_SIGNAL 'K' /* a signal number in ASCII decimal, for the group */
/* Frame types, worker -> client. */
#define EXEC_FRAME_STDOUT 'O' /* bytes the command wrote to stdout */
#define EXEC_FRAME_STDERR 'E' /* bytes the command wrote to stderr */
#define EXEC_FRAME_EXIT 'X'   /* JSON {"exit_code", "signal", "error"}: last */

/* The X frame's "error" when the worker refuses the hello's token (exit
 * code 126): the client tells these apart from other refusals. */
#define EXEC_WIRE_ERR_TOKEN "wrong exec token"
#define EXEC_WIRE_ERR_NO_TOKEN "this worker has no exec token"
/* The connection is TLS (GnuTLS) keyed by the session's exec token as a
 * pre-shared key, with an ephemeral (EC)DH exchange on top: the token never
 * crosses the wire, and a client without it fails the handshake. Both ends
 * take the priority string and the key's identity from here. */
/* (TLS 1.3 and the two cheapest groups only: a client without the token
 * must not make workerd compute a large finite-field exchange before the
 * key's binder is checked) */
#define EXEC_TLS_PRIORITY                                                                          \
  "NORMAL:-VERS-ALL:+VERS-TLS1.3:-KX-ALL:+ECDHE-PSK:-GROUP-ALL:+GROUP-X25519:+GROUP-SECP256R1"
#define EXEC_TLS_IDENTITY "muster-exec"
/* How long the client waits for the TCP connection to a worker. */
#define EXEC_WIRE_CONNECT_MS 10000
#define EXEC_WIRE_CONNECT_S "10" /* the same, for messages */

/* A frame header, decoded. */
struct exec_wire_hdr {
  char type;  /* one of EXEC_FRAME_*, or a type this protocol does not define */
  size_t len; /* bytes of payload after the header */
};

/* What exec_wire_parse_hdr() found. */
enum exec_wire_rc {
  EXEC_WIRE_OK = 0,        /* a type of this protocol, a length within bounds */
  EXEC_WIRE_UNKNOWN = 1,   /* a length within bounds but a type this protocol does not
                              define: the frame is read and ignored (both ends do so, so
                              that a later protocol may add types) */
  EXEC_WIRE_SHORT = -1,    /* fewer than EXEC_WIRE_HDR_LEN bytes: wait for more */
  EXEC_WIRE_TOO_LARGE = -2 /* a length over EXEC_WIRE_FRAME_MAX: a protocol error */
};

/* True if type is one of the six frame types of this protocol, in either
 * direction. */
static inline int exec_wire_type_known(char type) {
  switch (type) {
  case EXEC_FRAME_HELLO:
  case EXEC_FRAME_STDIN:
  case EXEC_FRAME_SIGNAL:
  case EXEC_FRAME_STDOUT:
  case EXEC_FRAME_STDERR:
  case EXEC_FRAME_EXIT:
    return 1;
  default:
    return 0;
  }
}

/* Writes the header of a frame of type with a payload of len bytes
 * (len <= EXEC_WIRE_FRAME_MAX) into buf, which has room for
 * EXEC_WIRE_HDR_LEN bytes. */
static inline void exec_wire_put_hdr(unsigned char *buf, char type, size_t len) {
  buf[0] = (unsigned char)type;
  buf[1] = (unsigned char)(len >> 24);
  buf[2] = (unsigned char)(len >> 16);
  buf[3] = (unsigned char)(len >> 8);
  buf[4] = (unsigned char)len;
}

/* Decodes the frame header at the start of buf (n bytes available; only the
 * first EXEC_WIRE_HDR_LEN are looked at) into *h. Returns EXEC_WIRE_OK or
 * EXEC_WIRE_UNKNOWN with *h filled; EXEC_WIRE_TOO_LARGE with *h filled too
 * (the length claimed, for the error message), since the length is checked
 * before the type; EXEC_WIRE_SHORT with *h zeroed. */
static inline enum exec_wire_rc exec_wire_parse_hdr(const unsigned char *buf, size_t n,
                                                    struct exec_wire_hdr *h) {
  h->type = 0;
  h->len = 0;
  if (n < EXEC_WIRE_HDR_LEN)
    return EXEC_WIRE_SHORT;
  h->type = (char)buf[0];
  h->len = (size_t)buf[1] << 24 | (size_t)buf[2] << 16 | (size_t)buf[3] << 8 | (size_t)buf[4];
  if (h->len > EXEC_WIRE_FRAME_MAX)
    return EXEC_WIRE_TOO_LARGE;
  return exec_wire_type_known(h->type) ? EXEC_WIRE_OK : EXEC_WIRE_UNKNOWN;
}

#endif
