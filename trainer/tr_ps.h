/*
 * tr_ps.h: the parameter-server mode of muster-train (--mode ps), shared by
 * its modules: tr_ps.c (the entry point and what both sides share),
 * tr_ps_wire.c (the cluster spec and the framing: connections, messages,
 * the poll loop), tr_ps_server.c (a parameter server) and tr_ps_worker.c (a
 * worker).
 *
 * The cluster comes from TF_CONFIG:
 *   {"cluster": {"ps": ["ip:port", ...], "worker": ["ip:port", ...]},
 *    "task": {"type": "ps"|"worker", "index": N}}
 * The flat parameter vector of the network (tr_mlp.h) is sharded by
 * contiguous ranges over the P parameter servers: PS j owns
 * [j*N/P, (j+1)*N/P). Every process starts from the same seed, so each PS
 * takes its range from its own m->params, and the workers pull all ranges
 * before the first step anyway.
 *
 * Protocol (one TCP connection per worker and PS, TCP_NODELAY, version 1).
 * Every message is a 24-byte header followed by len payload bytes:
 *   uint32 magic "MSPS" (0x5350534d), uint16 version (1), uint16 type,
 *   int64 step, uint64 len.
 * Integers and floats are in the host's byte order: all processes of a run
 * must share it (a mismatch shows up as a bad magic number and is refused).
 *   HELLO  worker -> ps, step 0: struct ps_hello (the worker's index and the
 *          run's configuration, which the PS checks against its own).
 *   PARAMS ps -> worker: the PS's range of parameters (hi - lo floats), then
 *          two floats: the step's loss sum and correct count (step 0: the
 *          initial weights and two zeros, sent once every worker has said
 *          HELLO).
 *   PUSH   worker -> ps: the worker's gradient over the PS's range
 *          (hi - lo floats), then its loss sum and correct count.
 *   BYE    worker -> ps, step = total steps, empty: the worker got the last
 *          PARAMS; the PS exits once every worker said it.
 *   ERROR  ps -> worker: a sentence (at most 1024 bytes) saying why the PS
 *          refused the worker's HELLO; the worker prints it and exits 2.
 * --sync: the PS waits for the PUSH of step s from every worker, sums them
 * in worker-index order (deterministic), applies one SGD step on its range
 * and sends PARAMS of step s, with the summed loss and correct count, to
 * every worker. --async: each PUSH is applied on arrival (scaled by the
 * number of workers so that one push is a full step) and answered with
 * PARAMS to that worker alone, carrying the worker's own loss back.
 *
 * Every wait polls with a deadline: a peer that sends or reads nothing for
 * io_timeout_s (while we wait on it), closes or resets its connection ends
 * this process with exit code 1 and a sentence naming the peer. The first
 * exchange (handshake and step 1) gets a longer startup window, as the
 * processes of a cluster start in any order.
 */
#ifndef MUSTER_TR_PS_H
#define MUSTER_TR_PS_H

#include "tr_run.h"

#include <poll.h>
#include <stddef.h>
#include <stdint.h>

#define PS_MAGIC 0x5350534dU
#define PS_VERSION 1
#define PS_MAX_ERROR 1024
#define PS_MAX_PEERS 4096
/* Connecting to a PS that is not up yet is retried for this long at start. */
#define PS_CONNECT_WINDOW_S 30.0
/* Connections to a PS that have not said HELLO yet, beyond the workers. */
#define PS_MAX_STRANGERS 16

enum ps_type { MSG_HELLO = 1, MSG_PARAMS = 2, MSG_PUSH = 3, MSG_BYE = 4, MSG_ERROR = 5 };

struct ps_hdr {
  uint32_t magic;
  uint16_t version;
  uint16_t type;
  int64_t step;
  uint64_t len;
};
_Static_assert(sizeof(struct ps_hdr) == 24, "ps header is 24 bytes");

struct ps_hello {
  uint32_t worker, nworkers, nps, ps_index;
  uint64_t nparams;
  int64_t steps;
  uint32_t sync, batch;
  uint64_t seed;
  float lr, momentum;
};
_Static_assert(sizeof(struct ps_hello) == 56, "ps hello has no padding");

/* One "host:port" of the cluster spec. */
struct ps_addr {
  char text[300]; /* as written in TF_CONFIG */
  char host[256];
  char port[8];
};

struct ps_cluster {
  int nps, nworkers;
  struct ps_addr *ps, *worker; /* owned; freed by ps_cluster_cleanup */
  int is_ps;
  int index;
};

/* A connection with one message being received and bytes waiting to go. */
struct ps_conn {
  int fd;
  char name[340]; /* "ps 0 (10.0.0.5:2222)" */
  struct ps_hdr rh;
  size_t rgot; /* bytes of header + payload received */
  unsigned char *rbuf;
  size_t rcap;
  int ready;   /* a whole message waits in rh / rbuf */
  int want_rx; /* we wait for a message from this peer */
  unsigned char *tbuf;
  size_t tcap, tlen, toff;
  int64_t last_ms; /* last progress; a wait on this peer times out from it */
};

struct ps_net {
  struct ps_conn *c; /* owned, n of them */
  struct pollfd *pfd;
  int n;
};

enum { WAIT_ALL, WAIT_ANY };

#define PS_CHECK MUST_CHECK

/* ---- tr_ps_wire.c: the cluster spec ---- */

/* Reads the cluster spec from TF_CONFIG into *cl. Returns 0 or -1 with a
 * sentence in err; ps_cluster_cleanup(cl) either way. */
PS_CHECK int ps_cluster_from_env(struct ps_cluster *cl, char *err, size_t errlen);
/* The same from the text of a TF_CONFIG (NULL: not set). */
PS_CHECK int ps_cluster_parse(const char *text, struct ps_cluster *cl, char *err, size_t errlen);
void ps_cluster_cleanup(struct ps_cluster *cl);

/* ---- tr_ps_wire.c: connections and messages ---- */

void ps_conn_init(struct ps_conn *c);
void ps_conn_cleanup(struct ps_conn *c);
/* Gives c buffers for payloads of up to rcap bytes received and two
 * messages of up to tpay payload bytes queued. Returns 0 or -1. */
PS_CHECK int ps_conn_buffers(struct ps_conn *c, size_t rcap, size_t tpay);
/* Non-blocking, TCP_NODELAY. */
void ps_sock_setup(int fd);
/* Appends one message (payload a then b) to c's send buffer; -1 if it does
 * not fit (a bug: one message in flight per direction). */
PS_CHECK int ps_conn_queue(struct ps_conn *c, uint16_t type, int64_t step, const void *a,
                           size_t alen, const void *b, size_t blen);
/* We now wait for a message from c. */
void ps_conn_expect(struct ps_conn *c);
/* Takes c's waiting message; c receives the next one from now on. */
void ps_conn_consume(struct ps_conn *c);
/* Sends / receives what the socket takes; 0, or -1 with why filled. */
PS_CHECK int ps_conn_send(struct ps_conn *c, char *why, size_t n);
PS_CHECK int ps_conn_recv(struct ps_conn *c, char *why, size_t n);
/* Checks a received header: our magic and version, a payload of at most
 * cap bytes. Returns 0, or -1 with why filled (a sentence to follow the
 * peer's name). Pure: the fuzzer of the wire header calls it. */
PS_CHECK int ps_hdr_check(const struct ps_hdr *h, size_t cap, char *why, size_t n);
PS_CHECK int ps_net_init(struct ps_net *nt, int n);
void ps_net_cleanup(struct ps_net *nt);
/* Moves bytes on every connection of nt until WAIT_ALL / WAIT_ANY of the
 * awaited messages are ready (and, if drain, everything is sent). Returns 0;
 * -1 on a dead, silent or misbehaving peer; -2 when a peer sent ERROR; err
 * names the peer, ending with when. */
PS_CHECK int ps_pump(struct ps_net *nt, int mode, int drain, double timeout_s, const char *when,
                     char *err, size_t errlen);

/* ---- tr_ps_wire.c: what both sides share ---- */

/* PS j's range [lo, hi) of the nparams parameters. */
void ps_range_of(size_t nparams, int j, int nps, size_t *lo, size_t *hi);
/* The HELLO that describes this run (worker's index, or the ps's). */
void ps_fill_hello(struct ps_hello *h, const struct tr_opts *o, const struct tr_mlp *m,
                   const struct ps_cluster *cl, int worker, int ps_index, long steps);

/* ---- tr_ps_server.c, tr_ps_worker.c ---- */

PS_CHECK int ps_run_server(const struct tr_opts *o, struct tr_mlp *m, const struct ps_cluster *cl,
                           long steps, double startup_s, struct tr_result *r);
PS_CHECK int ps_run_worker(const struct tr_opts *o, struct tr_mlp *m, const struct tr_data *train,
                           const struct tr_data *test, const struct ps_cluster *cl, long steps,
                           double startup_s, struct tr_result *r);

#endif
