/* fuzz_exec.c: libFuzzer target for the exec channel's framing
 * (common/exec_wire.h), which both ends use, and for the client end as a
 * whole: libmuster's muster_exec_at() reading what a worker sends.
 *
 * Each input is first walked frame by frame with exec_wire_parse_hdr(), the
 * way both ends cut their byte streams (a header that comes out is
 * re-encoded and must give the same bytes). Then a loopback listener plays
 * the worker: it reads the client's hello and answers with the input,
 * byte for byte, and muster_exec_at() must end with an answer (never a
 * hang, a crash, a leak or undefined behaviour). */
#include "exec_wire.h"
#include "muster.h"

#include <arpa/inet.h>
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

/* Plays the worker on its own thread, so that the client's poll loop and
 * the answer are as over a network. */
static void *serve(void *arg) {
  const struct peer *pr = arg;
  const uint8_t *data = pr->data;
  size_t size = pr->size;
  struct pollfd lp = {.fd = listener, .events = POLLIN};
  int fd;
  char buf[4096];
  size_t off = 0;

  /* The client may never come (its connect failed): never wait forever. */
  if (poll(&lp, 1, 5000) != 1)
    return NULL;
  fd = accept(listener, NULL, NULL);
  if (fd < 0)
    return NULL;
  /* The hello comes first; then the bytes go out while whatever the client
   * sends is read and dropped. */
  while (off < size) {
    struct pollfd p = {.fd = fd, .events = POLLIN | POLLOUT};
    if (poll(&p, 1, 2000) <= 0)
      break;
    if (p.revents & POLLIN) {
      ssize_t n = read(fd, buf, sizeof(buf));
      if (n <= 0 && !(p.revents & POLLOUT))
        break;
    }
    if (p.revents & POLLOUT) {
      ssize_t n = send(fd, data + off, size - off, MSG_NOSIGNAL);
      if (n <= 0)
        break;
      off += (size_t)n;
    }
  }
  shutdown(fd, SHUT_WR);
  while (read(fd, buf, sizeof(buf)) > 0)
    ;
  close(fd);
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
