/* fuzz_ps.c: libFuzzer target for muster-train's parameter-server mode:
 * the cluster spec it reads from TF_CONFIG, and its wire framing (message
 * headers and payloads as they arrive from a peer, tr_ps_wire.c).
 *
 * The first byte picks the target. 0: the rest is TF_CONFIG. Otherwise the
 * rest is what a peer sends, written into one end of a socket pair in
 * pieces (the second byte sets the piece size) and received at the other
 * the way a parameter server or worker receives it, message by message,
 * with a payload limit set by the third byte; a refusal with a sentence is
 * the expected answer to garbage. */
#include "tr_ps.h"

#include <fcntl.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

static void cluster(const uint8_t *data, size_t size) {
  struct ps_cluster cl;
  char *s = malloc(size + 1), err[1024];

  err[0] = '\0';
  if (!s)
    return;
  memcpy(s, data, size);
  s[size] = '\0';
  if (ps_cluster_parse(s, &cl, err, sizeof(err)) == 0) {
    /* What the caller relies on: the task's index is within its list. */
    if (cl.nps < 1 || cl.nworkers < 1 || cl.index < 0 ||
        cl.index >= (cl.is_ps ? cl.nps : cl.nworkers))
      abort();
    for (int i = 0; i < cl.nps; i++)
      if (!cl.ps[i].host[0] || !cl.ps[i].port[0])
        abort();
    for (int i = 0; i < cl.nworkers; i++)
      if (!cl.worker[i].host[0] || !cl.worker[i].port[0])
        abort();
  } else if (!err[0]) {
    abort(); /* a refusal says why */
  }
  ps_cluster_cleanup(&cl);
  free(s);
}

static void wire(const uint8_t *data, size_t size) {
  struct ps_conn c;
  int sv[2];
  size_t piece, cap, off = 0;
  char why[2048];

  if (size < 2)
    return;
  piece = (size_t)data[0] + 1;
  cap = (size_t)data[1] * 64;
  data += 2;
  size -= 2;
  /* The writing end does not block: a round writes a piece, and reads
   * at most one message, so bytes may pile up. */
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0)
    return;
  (void)fcntl(sv[0], F_SETFL, O_NONBLOCK);
  ps_conn_init(&c);
  c.fd = sv[1];
  if (ps_conn_buffers(&c, cap, 0) != 0)
    goto out;
  ps_conn_expect(&c);
  for (;;) {
    if (off < size) {
      size_t n = size - off < piece ? size - off : piece;
      ssize_t k = write(sv[0], data + off, n);
      if (k > 0)
        off += (size_t)k;
    } else if (sv[0] >= 0) {
      close(sv[0]); /* the peer is done: the next read sees the end */
      sv[0] = -1;
    }
    why[0] = '\0';
    if (ps_conn_recv(&c, why, sizeof(why)) != 0) {
      if (!why[0])
        abort();
      break;
    }
    if (c.ready) {
      /* A whole message: the header passed its check. */
      if (c.rh.len > c.rcap || c.rh.magic != PS_MAGIC || c.rh.version != PS_VERSION)
        abort();
      ps_conn_consume(&c);
    }
  }
out:
  if (sv[0] >= 0)
    close(sv[0]);
  ps_conn_cleanup(&c); /* closes sv[1] */
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1)
    return 0;
  if (data[0] == 0)
    cluster(data + 1, size - 1);
  else
    wire(data + 1, size - 1);
  return 0;
}
