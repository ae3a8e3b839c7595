/*
 * tr_ps.c: the parameter-server mode of muster-train (--mode ps).
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
#include "tr_run.h"
#include "util.h"

#include <jansson.h>

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

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
  struct ps_addr *ps, *worker; /* owned; freed by cluster_cleanup */
  int is_ps;
  int index;
};

/* A connection with one message being received and bytes waiting to go. */
struct conn {
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

struct net {
  struct conn *c; /* owned, n of them */
  struct pollfd *pfd;
  int n;
};

/* ---- cluster spec ---- */

static void cluster_cleanup(struct ps_cluster *cl) {
  free(cl->ps);
  free(cl->worker);
  cl->ps = cl->worker = NULL;
}

/* Splits "host:port" (or "[v6]:port") into a. Returns 0 or -1. */
static int parse_addr(const char *s, struct ps_addr *a) {
  const char *colon = strrchr(s, ':');
  const char *h = s;
  size_t hl;
  long port;

  if (!colon || strlen(s) >= sizeof a->text)
    return -1;
  hl = (size_t)(colon - s);
  if (hl >= 2 && s[0] == '[' && s[hl - 1] == ']') {
    h = s + 1;
    hl -= 2;
  }
  if (hl == 0 || hl >= sizeof a->host || util_parse_long(colon + 1, 1, 65535, &port) != 0)
    return -1;
  snprintf(a->text, sizeof a->text, "%s", s);
  memcpy(a->host, h, hl);
  a->host[hl] = '\0';
  snprintf(a->port, sizeof a->port, "%ld", port);
  return 0;
}

/* Fills *out from the JSON array arr of "host:port" strings (new array in
 * *out, freed by cluster_cleanup). Returns 0 or -1 with err filled. */
static int parse_addr_list(json_t *arr, const char *what, struct ps_addr **out, int *n, char *err,
                           size_t errlen) {
  size_t i, k;

  if (!json_is_array(arr) || json_array_size(arr) == 0 || json_array_size(arr) > PS_MAX_PEERS) {
    snprintf(err, errlen, "TF_CONFIG's cluster.%s must be a non-empty array of \"ip:port\" strings",
             what);
    return -1;
  }
  k = json_array_size(arr);
  *out = calloc(k, sizeof **out);
  if (!*out) {
    snprintf(err, errlen, "out of memory");
    return -1;
  }
  for (i = 0; i < k; i++) {
    const char *s = json_string_value(json_array_get(arr, i));
    if (!s || parse_addr(s, &(*out)[i]) != 0) {
      snprintf(err, errlen, "TF_CONFIG's cluster.%s[%zu] is not an \"ip:port\" string", what, i);
      return -1;
    }
  }
  *n = (int)k;
  return 0;
}

/* Reads the cluster spec from TF_CONFIG into *cl. Returns 0 or -1 with a
 * sentence in err; cluster_cleanup(cl) either way. */
static int cluster_from_env(struct ps_cluster *cl, char *err, size_t errlen) {
  const char *env = getenv("TF_CONFIG");
  json_error_t jerr;
  json_t *root, *cluster, *task, *type, *index;
  const char *t;
  int rc = -1;

  memset(cl, 0, sizeof *cl);
  if (!env || !*env) {
    snprintf(err, errlen,
             "--mode ps needs the cluster spec in TF_CONFIG, e.g. {\"cluster\": {\"ps\": "
             "[\"ip:port\"], \"worker\": [\"ip:port\", ...]}, \"task\": {\"type\": "
             "\"worker\", \"index\": 0}}, and TF_CONFIG is not set");
    return -1;
  }
  root = json_loads(env, 0, &jerr);
  if (!root) {
    snprintf(err, errlen, "TF_CONFIG is not valid JSON (%s at column %d)", jerr.text, jerr.column);
    return -1;
  }
  cluster = json_object_get(root, "cluster");
  task = json_object_get(root, "task");
  if (!json_is_object(cluster) || !json_is_object(task)) {
    snprintf(err, errlen, "TF_CONFIG must hold the objects \"cluster\" and \"task\"");
    goto out;
  }
  if (parse_addr_list(json_object_get(cluster, "ps"), "ps", &cl->ps, &cl->nps, err, errlen) ||
      parse_addr_list(json_object_get(cluster, "worker"), "worker", &cl->worker, &cl->nworkers, err,
                      errlen))
    goto out;
  type = json_object_get(task, "type");
  index = json_object_get(task, "index");
  t = json_string_value(type);
  if (!t || (strcmp(t, "ps") != 0 && strcmp(t, "worker") != 0)) {
    snprintf(err, errlen, "TF_CONFIG's task.type must be \"ps\" or \"worker\"");
    goto out;
  }
  cl->is_ps = strcmp(t, "ps") == 0;
  if (!json_is_integer(index) || json_integer_value(index) < 0 ||
      json_integer_value(index) >= (cl->is_ps ? cl->nps : cl->nworkers)) {
    snprintf(err, errlen, "TF_CONFIG's task.index must be an integer from 0 to %d for a %s",
             (cl->is_ps ? cl->nps : cl->nworkers) - 1, t);
    goto out;
  }
  cl->index = (int)json_integer_value(index);
  rc = 0;
out:
  json_decref(root);
  return rc;
}

/* ---- connections ---- */

static void conn_init(struct conn *c) {
  memset(c, 0, sizeof *c);
  c->fd = -1;
}

static void conn_cleanup(struct conn *c) {
  if (c->fd >= 0)
    close(c->fd);
  free(c->rbuf);
  free(c->tbuf);
  conn_init(c);
}

/* Gives c buffers for payloads of up to rcap bytes received and two
 * messages of up to tpay payload bytes queued. Returns 0 or -1. */
static int conn_buffers(struct conn *c, size_t rcap, size_t tpay) {
  unsigned char *r, *t;
  size_t tcap = 2 * (sizeof(struct ps_hdr) + tpay);

  if (rcap < PS_MAX_ERROR)
    rcap = PS_MAX_ERROR;
  if (tcap < 2 * (sizeof(struct ps_hdr) + PS_MAX_ERROR))
    tcap = 2 * (sizeof(struct ps_hdr) + PS_MAX_ERROR);
  r = realloc(c->rbuf, rcap);
  if (!r)
    return -1;
  c->rbuf = r;
  c->rcap = rcap;
  t = realloc(c->tbuf, tcap);
  if (!t)
    return -1;
  c->tbuf = t;
  c->tcap = tcap;
  return 0;
}

static void sock_setup(int fd) {
  int one = 1;
  int fl = fcntl(fd, F_GETFL);

  if (fl >= 0)
    (void)fcntl(fd, F_SETFL, fl | O_NONBLOCK);
  (void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

/* Appends one message (payload a then b) to c's send buffer. The protocol
 * keeps at most one message in flight per direction, so the room for two
 * that conn_buffers makes is enough; -1 says otherwise (a bug). */
static int conn_queue(struct conn *c, uint16_t type, int64_t step, const void *a, size_t alen,
                      const void *b, size_t blen) {
  struct ps_hdr h = {PS_MAGIC, PS_VERSION, type, step, (uint64_t)(alen + blen)};
  size_t need = sizeof h + alen + blen;

  if (c->toff > 0) {
    memmove(c->tbuf, c->tbuf + c->toff, c->tlen - c->toff);
    c->tlen -= c->toff;
    c->toff = 0;
  }
  if (c->tlen + need > c->tcap)
    return -1;
  memcpy(c->tbuf + c->tlen, &h, sizeof h);
  if (alen)
    memcpy(c->tbuf + c->tlen + sizeof h, a, alen);
  if (blen)
    memcpy(c->tbuf + c->tlen + sizeof h + alen, b, blen);
  c->tlen += need;
  c->last_ms = util_mono_ms();
  return 0;
}

/* We now wait for a message from c. */
static void conn_expect(struct conn *c) {
  c->want_rx = 1;
  c->ready = 0;
  c->rgot = 0;
  c->last_ms = util_mono_ms();
}

/* Takes c's waiting message; c receives the next one from now on. */
static void conn_consume(struct conn *c) {
  c->ready = 0;
  c->rgot = 0;
  c->last_ms = util_mono_ms();
}

static void describe_sock_error(int e, char *why, size_t n) {
  if (e == ECONNRESET || e == EPIPE)
    snprintf(why, n, "closed the connection (%s)", strerror(e));
  else
    snprintf(why, n, "failed (%s)", strerror(e));
}

/* Sends what c has queued until done or the socket is full. Returns 0 or -1
 * with why filled. */
static int conn_send(struct conn *c, char *why, size_t n) {
  while (c->toff < c->tlen) {
    ssize_t k = send(c->fd, c->tbuf + c->toff, c->tlen - c->toff, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (k < 0) {
      if (errno == EINTR)
        continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK)
        return 0;
      describe_sock_error(errno, why, n);
      return -1;
    }
    c->toff += (size_t)k;
    c->last_ms = util_mono_ms();
  }
  c->toff = c->tlen = 0;
  return 0;
}

/* Receives into c's message until it is whole (c->ready) or the socket is
 * empty; never reads past the message. Returns 0 or -1 with why filled. */
static int conn_recv(struct conn *c, char *why, size_t n) {
  while (!c->ready) {
    unsigned char *dst;
    size_t want;
    ssize_t k;

    if (c->rgot < sizeof c->rh) {
      dst = (unsigned char *)&c->rh + c->rgot;
      want = sizeof c->rh - c->rgot;
    } else {
      dst = c->rbuf + (c->rgot - sizeof c->rh);
      want = sizeof c->rh + (size_t)c->rh.len - c->rgot;
    }
    if (want > 0) {
      k = recv(c->fd, dst, want, MSG_DONTWAIT);
      if (k == 0) {
        snprintf(why, n, "closed the connection");
        return -1;
      }
      if (k < 0) {
        if (errno == EINTR)
          continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK)
          return 0;
        describe_sock_error(errno, why, n);
        return -1;
      }
      c->rgot += (size_t)k;
      c->last_ms = util_mono_ms();
    }
    if (c->rgot == sizeof c->rh) {
      if (c->rh.magic != PS_MAGIC) {
        snprintf(why, n,
                 "sent something that is not a muster-train ps message (magic 0x%08" PRIx32
                 "; a peer of another byte order?)",
                 c->rh.magic);
        return -1;
      }
      if (c->rh.version != PS_VERSION) {
        snprintf(why, n, "speaks ps protocol version %u, this muster-train speaks %d",
                 (unsigned)c->rh.version, PS_VERSION);
        return -1;
      }
      if (c->rh.len > c->rcap) {
        snprintf(why, n, "sent a message of %" PRIu64 " bytes, more than the %zu expected",
                 c->rh.len, c->rcap);
        return -1;
      }
    }
    if (c->rgot >= sizeof c->rh && c->rgot == sizeof c->rh + (size_t)c->rh.len)
      c->ready = 1;
  }
  return 0;
}

static void net_cleanup(struct net *nt) {
  for (int i = 0; nt->c && i < nt->n; i++)
    conn_cleanup(&nt->c[i]);
  free(nt->c);
  free(nt->pfd);
  nt->c = NULL;
  nt->pfd = NULL;
  nt->n = 0;
}

static int net_init(struct net *nt, int n) {
  nt->n = n;
  nt->c = calloc((size_t)n, sizeof *nt->c);
  nt->pfd = calloc((size_t)n, sizeof *nt->pfd);
  if (!nt->c || !nt->pfd) {
    free(nt->c);
    free(nt->pfd);
    nt->c = NULL;
    nt->pfd = NULL;
    nt->n = 0;
    return -1;
  }
  for (int i = 0; i < n; i++)
    conn_init(&nt->c[i]);
  return 0;
}

enum { WAIT_ALL, WAIT_ANY };

/*
 * Moves bytes on every connection of nt until: (WAIT_ALL) every connection
 * we want a message from has one ready, or (WAIT_ANY) one of them has; and,
 * if drain, everything queued has been sent. A BYE closes its connection at
 * once (the peer is done with it); an ERROR ends the wait with its text.
 * Returns 0; -1 on a dead, silent or misbehaving peer; -2 when a peer sent
 * ERROR. err gets a sentence naming the peer, ending with when.
 */
static int pump(struct net *nt, int mode, int drain, double timeout_s, const char *when, char *err,
                size_t errlen) {
  int64_t tmo_ms = (int64_t)(timeout_s * 1000.0);
  char why[PS_MAX_ERROR + 64];

  for (;;) {
    int64_t now = util_mono_ms(), next = -1;
    int all = 1, any = 0, txleft = 0, done, r, failed = 0;

    for (int i = 0; i < nt->n; i++) {
      struct conn *c = &nt->c[i];
      int waited = 0;
      if (c->want_rx) {
        if (c->ready)
          any = 1;
        else
          all = 0, waited = 1;
      }
      if (c->fd >= 0 && c->toff < c->tlen)
        txleft = 1, waited = 1;
      if (waited && c->fd >= 0) {
        int64_t dl = c->last_ms + tmo_ms;
        if (now >= dl) {
          if (c->toff < c->tlen)
            snprintf(err, errlen, "%s read nothing for %.0f s %s", c->name, timeout_s, when);
          else
            snprintf(err, errlen, "%s sent nothing for %.0f s %s", c->name, timeout_s, when);
          return -1;
        }
        if (next < 0 || dl < next)
          next = dl;
      }
    }
    done = (mode == WAIT_ALL ? all : any) && (!drain || !txleft);
    if (done)
      return 0;
    for (int i = 0; i < nt->n; i++) {
      struct conn *c = &nt->c[i];
      nt->pfd[i].fd = c->fd;
      nt->pfd[i].revents = 0;
      /* POLLRDHUP: a peer that dies while we owe it an answer (or while its
       * message waits for the others' in --sync) is noticed at once. */
      nt->pfd[i].events = POLLRDHUP;
      if (c->want_rx && !c->ready)
        nt->pfd[i].events |= POLLIN;
      if (c->toff < c->tlen)
        nt->pfd[i].events |= POLLOUT;
    }
    r = poll(nt->pfd, (nfds_t)nt->n, next < 0 ? 1000 : (int)(next - now));
    if (r < 0) {
      if (errno == EINTR)
        continue;
      snprintf(err, errlen, "poll failed: %s", strerror(errno));
      return -1;
    }
    /* Peers that fail in the same round are all named: which of them died
     * first (and took the others with it) cannot be told from here. */
    for (int i = 0; i < nt->n && r > 0; i++) {
      struct conn *c = &nt->c[i];
      short re = nt->pfd[i].revents;
      size_t at;
      if (c->fd < 0 || !re)
        continue;
      if (failed) {
        if (!(re & (POLLERR | POLLHUP | POLLRDHUP)))
          continue;
        snprintf(why, sizeof why, "closed the connection");
        goto fail;
      }
      if ((re & POLLOUT) && conn_send(c, why, sizeof why) != 0)
        goto fail;
      if ((re & (POLLIN | POLLERR | POLLHUP | POLLRDHUP)) && c->want_rx && !c->ready) {
        if (conn_recv(c, why, sizeof why) != 0)
          goto fail;
        if (c->ready && c->rh.type == MSG_ERROR) {
          snprintf(err, errlen, "%s refused: %.*s", c->name, (int)c->rh.len, (char *)c->rbuf);
          return -2;
        }
        if (c->ready && c->rh.type == MSG_BYE) {
          close(c->fd);
          c->fd = -1;
          continue;
        }
        if (!c->ready)
          continue;
      }
      if (re & (POLLERR | POLLHUP | POLLRDHUP)) {
        int e = 0;
        socklen_t el = sizeof e;
        if ((re & POLLERR) && getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &e, &el) == 0 && e)
          describe_sock_error(e, why, sizeof why);
        else
          snprintf(why, sizeof why, "closed the connection");
        goto fail;
      }
      continue;
    fail:
      if (!failed)
        snprintf(err, errlen, "%s %s %s", c->name, why, when);
      else if ((at = strlen(err)) + 1 < errlen)
        snprintf(err + at, errlen - at, "; %s %s too", c->name, why);
      failed = 1;
    }
    if (failed)
      return -1;
  }
}

/* ---- parameter server ---- */

static void range_of(size_t nparams, int j, int nps, size_t *lo, size_t *hi) {
  *lo = nparams * (size_t)j / (size_t)nps;
  *hi = nparams * (size_t)(j + 1) / (size_t)nps;
}

static long total_steps(const struct tr_opts *o, const struct tr_data *train) {
  return o->steps > 0 ? o->steps : (long)o->epochs * tr_steps_per_epoch(train->n, o->batch);
}

static void fill_hello(struct ps_hello *h, const struct tr_opts *o, const struct tr_mlp *m,
                       const struct ps_cluster *cl, int worker, int ps_index, long steps) {
  memset(h, 0, sizeof *h);
  h->worker = (uint32_t)worker;
  h->nworkers = (uint32_t)cl->nworkers;
  h->nps = (uint32_t)cl->nps;
  h->ps_index = (uint32_t)ps_index;
  h->nparams = m->nparams;
  h->steps = steps;
  h->sync = (uint32_t)(o->sync != 0);
  h->batch = (uint32_t)o->batch;
  h->seed = o->seed;
  h->lr = o->lr;
  h->momentum = o->momentum;
}

/* Compares a worker's HELLO with ours; fills why with the first difference.
 * Returns 0 when they agree. */
static int hello_differs(const struct ps_hello *a, const struct ps_hello *b, char *why, size_t n) {
#define CMP(f, fmt)                                                                                \
  if (a->f != b->f) {                                                                              \
    snprintf(why, n, #f " is " fmt " on the worker but " fmt " on the ps", a->f, b->f);            \
    return 1;                                                                                      \
  }
  CMP(nworkers, "%" PRIu32)
  CMP(nps, "%" PRIu32)
  CMP(ps_index, "%" PRIu32)
  CMP(nparams, "%" PRIu64)
  CMP(steps, "%" PRId64)
  CMP(sync, "%" PRIu32)
  CMP(batch, "%" PRIu32)
  CMP(seed, "%" PRIu64)
  CMP(lr, "%g")
  CMP(momentum, "%g")
#undef CMP
  return 0;
}

/* Binds and listens on a (the PS's address in the cluster spec). Returns the
 * socket or -1 with err filled. */
static int ps_listen(const struct ps_addr *a, const char *name, char *err, size_t errlen) {
  struct addrinfo hints, *res = NULL, *ai;
  int fd = -1, e = 0, gai;

  memset(&hints, 0, sizeof hints);
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  gai = getaddrinfo(a->host, a->port, &hints, &res);
  if (gai != 0) {
    snprintf(err, errlen, "%s cannot resolve its own address: %s", name, gai_strerror(gai));
    return -1;
  }
  for (ai = res; ai; ai = ai->ai_next) {
    int one = 1;
    fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
    if (fd < 0) {
      e = errno;
      continue;
    }
    (void)setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(fd, ai->ai_addr, ai->ai_addrlen) == 0) {
      if (listen(fd, 128) == 0)
        break;
    } else if (errno == EADDRNOTAVAIL) {
      /* Behind NAT the spec's address may not be ours: take the port on
       * every address instead. */
      struct sockaddr_storage any;
      memset(&any, 0, sizeof any);
      memcpy(&any, ai->ai_addr, ai->ai_addrlen);
      if (ai->ai_family == AF_INET)
        ((struct sockaddr_in *)&any)->sin_addr.s_addr = htonl(INADDR_ANY);
      else if (ai->ai_family == AF_INET6)
        ((struct sockaddr_in6 *)&any)->sin6_addr = in6addr_any;
      fprintf(stderr,
              "muster-train: %s is not an address of this host; listening on port %s of "
              "every address\n",
              a->host, a->port);
      if (bind(fd, (struct sockaddr *)&any, ai->ai_addrlen) == 0 && listen(fd, 128) == 0)
        break;
    }
    e = errno;
    close(fd);
    fd = -1;
  }
  freeaddrinfo(res);
  if (fd < 0) {
    snprintf(err, errlen, "%s cannot listen: %s", name, strerror(e));
    return -1;
  }
  sock_setup(fd);
  return fd;
}

/* Sends an ERROR to c as well as the socket takes it at once (a small
 * message on a fresh connection: it does), then gives up on c. */
static void refuse(struct conn *c, const char *text) {
  char why[64];
  size_t n = strlen(text);

  if (n > PS_MAX_ERROR)
    n = PS_MAX_ERROR;
  c->toff = c->tlen = 0;
  if (conn_queue(c, MSG_ERROR, 0, text, n, NULL, 0) == 0)
    (void)conn_send(c, why, sizeof why);
}

/*
 * Accepts connections on lfd until every worker has said a HELLO that
 * agrees with ours; each becomes nt->c[worker]. Strangers that close, time
 * out or send garbage before a HELLO are dropped. Returns 0, 1 (a worker
 * missing after the window) or 2 (a worker of another configuration: it is
 * told why) with err filled.
 */
static int ps_accept_workers(int lfd, struct net *nt, const struct ps_cluster *cl,
                             const struct ps_hello *mine, size_t rbytes, size_t tbytes,
                             double window_s, double io_timeout_s, char *err, size_t errlen) {
  struct conn pend[PS_MAX_STRANGERS];
  struct pollfd pfd[PS_MAX_STRANGERS + 1];
  int npend = 0, npolled, have = 0, rc = 1;
  int64_t deadline = util_mono_ms() + (int64_t)(window_s * 1000.0);
  char why[256];

  for (int i = 0; i < PS_MAX_STRANGERS; i++)
    conn_init(&pend[i]);
  while (have < cl->nworkers) {
    int64_t now = util_mono_ms();
    int r;

    if (now >= deadline) {
      int k = 0;
      size_t at = 0;
      at += (size_t)snprintf(err, errlen, "worker");
      for (int i = 0; i < cl->nworkers && at < errlen; i++)
        if (nt->c[i].fd < 0)
          at += (size_t)snprintf(err + at, errlen - at, "%s %d (%s)", k++ ? "," : "", i,
                                 cl->worker[i].text);
      if (at < errlen)
        snprintf(err + at, errlen - at, " did not connect to ps %d (%s) within %.0f s", cl->index,
                 cl->ps[cl->index].text, window_s);
      goto out;
    }
    pfd[0].fd = lfd;
    pfd[0].events = npend < PS_MAX_STRANGERS ? POLLIN : 0;
    pfd[0].revents = 0;
    for (int i = 0; i < npend; i++) {
      pfd[i + 1].fd = pend[i].fd;
      pfd[i + 1].events = POLLIN;
      pfd[i + 1].revents = 0;
    }
    npolled = npend;
    r = poll(pfd, (nfds_t)npend + 1, (int)(deadline - now < 500 ? deadline - now : 500));
    if (r < 0 && errno != EINTR) {
      snprintf(err, errlen, "poll failed: %s", strerror(errno));
      goto out;
    }
    if (r > 0 && (pfd[0].revents & POLLIN)) {
      int fd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
      if (fd >= 0) {
        struct conn *c = &pend[npend];
        conn_init(c);
        c->fd = fd;
        sock_setup(fd);
        snprintf(c->name, sizeof c->name, "a connection");
        if (conn_buffers(c, sizeof(struct ps_hello), 0) != 0) {
          snprintf(err, errlen, "out of memory");
          conn_cleanup(c);
          goto out;
        }
        conn_expect(c);
        npend++;
      }
    }
    now = util_mono_ms();
    for (int i = npend - 1; i >= 0; i--) {
      struct conn *c = &pend[i];
      struct ps_hello h;
      int drop = 0;

      /* pfd[i + 1] is pend[i]'s only for the connections polled (a swap
       * below only moves an already handled one into i). */
      if (r > 0 && i < npolled && pfd[i + 1].revents && conn_recv(c, why, sizeof why) != 0)
        drop = 1;
      else if (!c->ready && now - c->last_ms > (int64_t)(io_timeout_s * 1000.0))
        drop = 1;
      else if (c->ready && (c->rh.type != MSG_HELLO || c->rh.len != sizeof h))
        drop = 1;
      if (!drop && c->ready) {
        char text[PS_MAX_ERROR];
        memcpy(&h, c->rbuf, sizeof h);
        if (h.worker >= (uint32_t)cl->nworkers) {
          snprintf(text, sizeof text,
                   "ps %d (%s) knows %d workers, and this one says it is worker %" PRIu32,
                   cl->index, cl->ps[cl->index].text, cl->nworkers, h.worker);
        } else if (nt->c[h.worker].fd >= 0) {
          snprintf(text, sizeof text, "ps %d (%s) has a worker %" PRIu32 " already", cl->index,
                   cl->ps[cl->index].text, h.worker);
        } else if (hello_differs(&h, mine, why, sizeof why)) {
          snprintf(text, sizeof text,
                   "worker %" PRIu32 " runs another configuration than ps %d (%s): %s", h.worker,
                   cl->index, cl->ps[cl->index].text, why);
        } else {
          struct conn *w = &nt->c[h.worker];
          *w = *c;
          conn_init(c);
          snprintf(w->name, sizeof w->name, "worker %" PRIu32 " (%s)", h.worker,
                   cl->worker[h.worker].text);
          if (conn_buffers(w, rbytes, tbytes) != 0) {
            snprintf(err, errlen, "out of memory");
            goto out;
          }
          conn_consume(w);
          w->want_rx = 0;
          have++;
          pend[i] = pend[--npend];
          conn_init(&pend[npend]);
          continue;
        }
        refuse(c, text);
        snprintf(err, errlen, "%s", text);
        rc = 2;
        goto out;
      }
      if (drop) {
        conn_cleanup(c);
        pend[i] = pend[--npend];
        conn_init(&pend[npend]);
      }
    }
  }
  rc = 0;
out:
  for (int i = 0; i < npend; i++)
    conn_cleanup(&pend[i]);
  return rc;
}

static int run_server(const struct tr_opts *o, struct tr_mlp *m, const struct ps_cluster *cl,
                      long steps, double startup_s, struct tr_result *r) {
  const int K = cl->nworkers, j = cl->index;
  size_t lo, hi, len;
  struct ps_hello mine;
  struct net nt = {0};
  float *sum = NULL, zero2[2] = {0, 0};
  char name[340], err[2048], when[64];
  int lfd = -1, rc = 1, e;
  double t0 = tr_now(), tcomp = 0;
  const double tmo = o->io_timeout_s;

  range_of(m->nparams, j, cl->nps, &lo, &hi);
  len = hi - lo;
  snprintf(name, sizeof name, "ps %d (%s)", j, cl->ps[j].text);
  fill_hello(&mine, o, m, cl, 0, j, steps);
  sum = malloc((len + 2) * sizeof *sum);
  if (!sum || net_init(&nt, K) != 0) {
    fprintf(stderr, "muster-train: out of memory\n");
    goto out;
  }
  lfd = ps_listen(&cl->ps[j], name, err, sizeof err);
  if (lfd < 0) {
    fprintf(stderr, "muster-train: %s\n", err);
    rc = 2;
    goto out;
  }
  e = ps_accept_workers(lfd, &nt, cl, &mine, (len + 2) * sizeof(float), (len + 2) * sizeof(float),
                        startup_s, tmo, err, sizeof err);
  close(lfd);
  lfd = -1;
  if (e != 0) {
    fprintf(stderr, "muster-train: %s\n", err);
    rc = e;
    goto out;
  }
  for (int i = 0; i < K; i++) {
    if (conn_queue(&nt.c[i], MSG_PARAMS, 0, m->params + lo, len * sizeof(float), zero2,
                   sizeof zero2) != 0)
      goto bug;
    conn_expect(&nt.c[i]);
  }

  if (o->sync) {
    for (long s = 1; s <= steps; s++) {
      double tc;
      snprintf(when, sizeof when, "during step %ld", s);
      e = pump(&nt, WAIT_ALL, 0, s == 1 ? startup_s : tmo, when, err, sizeof err);
      if (e != 0) {
        fprintf(stderr, "muster-train: %s\n", err);
        goto out;
      }
      tc = tr_now();
      for (int i = 0; i < K; i++) {
        struct conn *c = &nt.c[i];
        const float *g = (const float *)c->rbuf;
        if (c->rh.type != MSG_PUSH || c->rh.step != s || c->rh.len != (len + 2) * sizeof(float)) {
          fprintf(stderr,
                  "muster-train: %s sent message type %u for step %" PRId64 " (%" PRIu64
                  " bytes) where a gradient push for step %ld was due\n",
                  c->name, (unsigned)c->rh.type, c->rh.step, c->rh.len, s);
          goto out;
        }
        if (i == 0)
          memcpy(sum, g, (len + 2) * sizeof *sum);
        else
          for (size_t k = 0; k < len + 2; k++)
            sum[k] += g[k];
        conn_consume(c);
      }
      tr_mlp_sgd(m->params + lo, m->velocity + lo, sum, 0, len, tr_lr_at(o, s - 1, steps),
                 o->momentum);
      tcomp += tr_now() - tc;
      for (int i = 0; i < K; i++) {
        if (conn_queue(&nt.c[i], MSG_PARAMS, s, m->params + lo, len * sizeof(float), sum + len,
                       2 * sizeof(float)) != 0)
          goto bug;
        conn_expect(&nt.c[i]);
      }
    }
  } else {
    long *done = calloc((size_t)K, sizeof *done);
    int finished = 0;
    if (!done) {
      fprintf(stderr, "muster-train: out of memory\n");
      goto out;
    }
    while (finished < K) {
      long least = steps;
      for (int i = 0; i < K; i++)
        if (nt.c[i].want_rx && done[i] < least)
          least = done[i];
      snprintf(when, sizeof when, "during step %ld", least + 1);
      e = pump(&nt, WAIT_ANY, 0, least == 0 ? startup_s : tmo, when, err, sizeof err);
      if (e != 0) {
        fprintf(stderr, "muster-train: %s\n", err);
        free(done);
        goto out;
      }
      for (int i = 0; i < K; i++) {
        struct conn *c = &nt.c[i];
        const float *g = (const float *)c->rbuf;
        double tc;
        if (!c->want_rx || !c->ready)
          continue;
        if (c->rh.type == MSG_BYE && done[i] == steps && c->rh.len == 0) {
          c->want_rx = 0;
          finished++;
          continue;
        }
        if (c->rh.type != MSG_PUSH || c->rh.step != done[i] + 1 || done[i] >= steps ||
            c->rh.len != (len + 2) * sizeof(float)) {
          fprintf(stderr,
                  "muster-train: %s sent message type %u for step %" PRId64 " (%" PRIu64
                  " bytes) where a gradient push for step %ld was due\n",
                  c->name, (unsigned)c->rh.type, c->rh.step, c->rh.len, done[i] + 1);
          free(done);
          goto out;
        }
        tc = tr_now();
        /* Each worker's gradient is scaled by 1/global batch over its
         * 1/K share of the rows: times K makes it a full step's mean. */
        for (size_t k = 0; k < len; k++)
          sum[k] = g[k] * (float)K;
        tr_mlp_sgd(m->params + lo, m->velocity + lo, sum, 0, len, tr_lr_at(o, done[i], steps),
                   o->momentum);
        tcomp += tr_now() - tc;
        done[i]++;
        if (conn_queue(c, MSG_PARAMS, done[i], m->params + lo, len * sizeof(float), g + len,
                       2 * sizeof(float)) != 0) {
          free(done);
          goto bug;
        }
        conn_consume(c);
      }
    }
    free(done);
  }
  if (o->sync) {
    /* Each worker says BYE once it has the last step's parameters. */
    e = pump(&nt, WAIT_ALL, 1, steps == 0 ? startup_s : tmo, "after the last step", err,
             sizeof err);
    if (e != 0) {
      fprintf(stderr, "muster-train: %s\n", err);
      goto out;
    }
    for (int i = 0; i < K; i++) {
      struct conn *c = &nt.c[i];
      if (c->rh.type != MSG_BYE || c->rh.step != steps) {
        fprintf(stderr,
                "muster-train: %s sent message type %u for step %" PRId64
                " after the last step, where a BYE was due\n",
                c->name, (unsigned)c->rh.type, c->rh.step);
        goto out;
      }
    }
  }
  rc = 0;
  r->compute_s = tcomp;
  goto out;
bug:
  fprintf(stderr, "muster-train: %s: internal error: send buffer full\n", name);
out:
  if (lfd >= 0)
    close(lfd);
  net_cleanup(&nt);
  free(sum);
  r->total_s = tr_now() - t0;
  return rc;
}

/* ---- worker ---- */

/* Connects to a, retrying until deadline (util_mono_ms) while the PS is not
 * up yet. Returns the socket or -1 with err filled. */
static int connect_retry(const struct ps_addr *a, const char *name, int64_t deadline,
                         double window_s, char *err, size_t errlen) {
  int64_t backoff = 50;
  char last[256] = "no attempt";

  for (;;) {
    struct addrinfo hints, *res = NULL, *ai;
    int gai, fd = -1;

    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_NUMERICSERV;
    gai = getaddrinfo(a->host, a->port, &hints, &res);
    if (gai != 0)
      snprintf(last, sizeof last, "%s", gai_strerror(gai));
    for (ai = gai == 0 ? res : NULL; ai; ai = ai->ai_next) {
      int64_t now = util_mono_ms();
      fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, ai->ai_protocol);
      if (fd < 0) {
        snprintf(last, sizeof last, "%s", strerror(errno));
        continue;
      }
      if (connect(fd, ai->ai_addr, ai->ai_addrlen) != 0) {
        int e = errno;
        if (e == EINPROGRESS) {
          struct pollfd p = {fd, POLLOUT, 0};
          socklen_t el = sizeof e;
          int left = (int)(deadline > now ? deadline - now : 0);
          e = ETIMEDOUT;
          if (poll(&p, 1, left) == 1 && getsockopt(fd, SOL_SOCKET, SO_ERROR, &e, &el) != 0)
            e = errno;
        }
        if (e != 0) {
          snprintf(last, sizeof last, "%s", strerror(e));
          close(fd);
          fd = -1;
          continue;
        }
      }
      break;
    }
    if (res)
      freeaddrinfo(res);
    if (fd >= 0) {
      sock_setup(fd);
      return fd;
    }
    if (util_mono_ms() + backoff >= deadline) {
      snprintf(err, errlen, "could not connect to %s within %.0f s: %s", name, window_s, last);
      return -1;
    }
    {
      struct timespec ts = {(time_t)(backoff / 1000), (long)(backoff % 1000) * 1000000L};
      nanosleep(&ts, NULL);
    }
    backoff = backoff * 2 > 1000 ? 1000 : backoff * 2;
  }
}

static int run_worker(const struct tr_opts *o, struct tr_mlp *m, const struct tr_data *train,
                      const struct tr_data *test, const struct ps_cluster *cl, long steps,
                      double startup_s, struct tr_result *r) {
  const int P = cl->nps, K = cl->nworkers, w = cl->index, B = o->batch;
  const long spe = tr_steps_per_epoch(train->n, B);
  const long nepochs = (steps + spe - 1) / spe;
  const double tmo = o->io_timeout_s;
  struct net nt = {0};
  struct tr_opts oq = *o;
  int lo_row, hi_row, rows, rc = 1, e, cur_epoch = -1;
  float *x = NULL;
  uint8_t *y = NULL;
  int *perm = NULL;
  char err[2048], when[64];
  double t0 = tr_now(), t_train0, tcomp = 0, tcomm = 0, t_epoch0 = 0;
  double ep_loss = 0, ep_correct = 0, last_loss = 0;
  long ep_steps = 0;
  int64_t deadline;

  oq.quiet = o->quiet || w != 0;
  tr_shard(B, w, K, &lo_row, &hi_row);
  rows = hi_row - lo_row;
  if (rows > m->max_batch) {
    fprintf(stderr,
            "muster-train: worker %d's shard of %d rows exceeds the network's batch of %d\n", w,
            rows, m->max_batch);
    return 2;
  }
  x = malloc((size_t)(rows ? rows : 1) * (size_t)train->dim * sizeof *x);
  y = malloc((size_t)(rows ? rows : 1));
  perm = malloc((size_t)train->n * sizeof *perm);
  if (!x || !y || !perm || net_init(&nt, P) != 0) {
    fprintf(stderr, "muster-train: out of memory\n");
    goto out;
  }

  /* Connect to every PS, say HELLO and take the initial weights. */
  deadline = util_mono_ms() + (int64_t)((startup_s - tmo) * 1000.0);
  for (int j = 0; j < P; j++) {
    struct conn *c = &nt.c[j];
    struct ps_hello h;
    size_t plo, phi;
    range_of(m->nparams, j, P, &plo, &phi);
    snprintf(c->name, sizeof c->name, "ps %d (%s)", j, cl->ps[j].text);
    c->fd = connect_retry(&cl->ps[j], c->name, deadline, startup_s - tmo, err, sizeof err);
    if (c->fd < 0) {
      fprintf(stderr, "muster-train: worker %d %s\n", w, err);
      goto out;
    }
    if (conn_buffers(c, (phi - plo + 2) * sizeof(float), (phi - plo + 2) * sizeof(float)) != 0) {
      fprintf(stderr, "muster-train: out of memory\n");
      goto out;
    }
    fill_hello(&h, o, m, cl, w, j, steps);
    if (conn_queue(c, MSG_HELLO, 0, &h, sizeof h, NULL, 0) != 0)
      goto out;
    conn_expect(c);
  }
  t_train0 = tr_now();
  for (long s = 0; s <= steps; s++) {
    double tc = tr_now(), ts;
    double loss = 0, correct = 0;

    if (s > 0) {
      long t = s - 1, sie = t % spe;
      int epoch = (int)(t / spe);
      if (epoch != cur_epoch) {
        tr_epoch_order(o->seed, epoch, train->n, perm);
        cur_epoch = epoch;
        t_epoch0 = tr_now();
      }
      tr_gather(train, perm, sie, B, lo_row, hi_row, x, y);
      tr_mlp_backprop(m, x, y, rows, B);
      ts = tr_now();
      tcomp += ts - tc;
      for (int j = 0; j < P; j++) {
        struct conn *c = &nt.c[j];
        size_t plo, phi;
        range_of(m->nparams, j, P, &plo, &phi);
        if (conn_queue(c, MSG_PUSH, s, m->grads + plo, (phi - plo) * sizeof(float),
                       m->grads + m->nparams, 2 * sizeof(float)) != 0)
          goto out;
        conn_expect(c);
      }
    } else {
      ts = tc;
    }
    if (s == 0)
      snprintf(when, sizeof when, "during the handshake");
    else
      snprintf(when, sizeof when, "during step %ld", s);
    e = pump(&nt, WAIT_ALL, 0, s <= 1 ? startup_s : tmo, when, err, sizeof err);
    if (e != 0) {
      fprintf(stderr, "muster-train: worker %d: %s\n", w, err);
      rc = e == -2 ? 2 : 1;
      goto out;
    }
    for (int j = 0; j < P; j++) {
      struct conn *c = &nt.c[j];
      size_t plo, phi;
      const float *p = (const float *)c->rbuf;
      range_of(m->nparams, j, P, &plo, &phi);
      if (c->rh.type != MSG_PARAMS || c->rh.step != s ||
          c->rh.len != (phi - plo + 2) * sizeof(float)) {
        fprintf(stderr,
                "muster-train: worker %d: %s sent message type %u for step %" PRId64 " (%" PRIu64
                " bytes) where the parameters of step %ld were due\n",
                w, c->name, (unsigned)c->rh.type, c->rh.step, c->rh.len, s);
        goto out;
      }
      memcpy(m->params + plo, p, (phi - plo) * sizeof(float));
      if (j == 0) {
        loss = p[phi - plo];
        correct = p[phi - plo + 1];
      }
      conn_consume(c);
      c->want_rx = 0;
    }
    tcomm += tr_now() - ts;
    if (s == 0) {
      t_train0 = tr_now();
      continue;
    }

    {
      /* --sync: the PS summed the whole global batch's loss; --async: it
       * returned this worker's own, over its rows. */
      double denom = o->sync ? (double)B : (double)rows;
      long t = s - 1, sie = t % spe;
      last_loss = loss / denom;
      ep_loss += last_loss;
      ep_correct += correct / denom;
      ep_steps++;
      if (sie == spe - 1 || s == steps) {
        double test_acc = -1, test_loss = 0;
        double dt = tr_now() - t_epoch0;
        double sps = dt > 0 ? (double)ep_steps * B / dt : 0;
        if (!oq.quiet && test && test->n > 0)
          tr_mlp_evaluate(m, test, &test_loss, &test_acc);
        tr_report_epoch(&oq, cur_epoch + 1, (int)nepochs, ep_loss / (double)ep_steps,
                        ep_correct / (double)ep_steps, test_acc, sps);
        if (w == 0 && o->checkpoint[0]) {
          char cerr[512];
          /* The velocity lives on the PS; the checkpoint holds the
           * parameters and the step (--resume is not supported in ps mode). */
          if (tr_checkpoint_save(o->checkpoint, m, s, cerr, sizeof cerr) != 0) {
            fprintf(stderr, "muster-train: %s\n", cerr);
            goto out;
          }
        }
        ep_loss = ep_correct = 0;
        ep_steps = 0;
        t_epoch0 = tr_now();
      }
    }
  }
  {
    double t_end = tr_now(), ts = t_end;
    for (int j = 0; j < P; j++)
      if (conn_queue(&nt.c[j], MSG_BYE, steps, NULL, 0, NULL, 0) != 0)
        goto out;
    e = pump(&nt, WAIT_ALL, 1, tmo, "after the last step", err, sizeof err);
    if (e != 0) {
      fprintf(stderr, "muster-train: worker %d: %s\n", w, err);
      goto out;
    }
    tcomm += tr_now() - ts;
    r->steps = steps;
    r->samples = steps * (long)B;
    r->samples_per_s = t_end > t_train0 ? (double)r->samples / (t_end - t_train0) : 0;
  }
  r->final_loss = last_loss;
  r->compute_s = tcomp;
  r->comm_s = tcomm;
  r->test_accuracy = -1;
  r->test_loss = 0;
  if (w == 0 && test && test->n > 0)
    tr_mlp_evaluate(m, test, &r->test_loss, &r->test_accuracy);
  rc = 0;
out:
  net_cleanup(&nt);
  free(x);
  free(y);
  free(perm);
  r->total_s = tr_now() - t0;
  return rc;
}

int tr_run_ps(const struct tr_opts *o, struct tr_mlp *m, const struct tr_data *train,
              const struct tr_data *test, struct tr_result *r) {
  struct ps_cluster cl;
  struct tr_opts oo = *o;
  char err[1024];
  long steps, spe;
  double startup_s;
  int rc;

  memset(r, 0, sizeof *r);
  r->mode = "ps";
  /* One summary for the job, worker 0's (tr_main prints it and writes
   * --dump-params from it). */
  r->report = 0;
  r->test_accuracy = -1;
  if (oo.io_timeout_s <= 0)
    oo.io_timeout_s = 10;
  if (o->resume[0]) {
    fprintf(stderr, "muster-train: --resume is not supported in --mode ps\n");
    return 2;
  }
  if (cluster_from_env(&cl, err, sizeof err) != 0) {
    fprintf(stderr, "muster-train: %s\n", err);
    cluster_cleanup(&cl);
    return 2;
  }
  r->ranks = cl.nworkers;
  r->report = !cl.is_ps && cl.index == 0;
  spe = tr_steps_per_epoch(train->n, o->batch);
  steps = total_steps(o, train);
  if (o->batch < cl.nworkers) {
    fprintf(stderr,
            "muster-train: the global batch (%d) must have a row for each of the %d "
            "workers\n",
            o->batch, cl.nworkers);
    rc = 2;
  } else if (spe < 1 || steps < 1) {
    fprintf(stderr,
            "muster-train: nothing to train: %d samples, a global batch of %d and %ld "
            "steps\n",
            train->n, o->batch, steps);
    rc = 2;
  } else {
    startup_s = (PS_CONNECT_WINDOW_S > oo.io_timeout_s ? PS_CONNECT_WINDOW_S : oo.io_timeout_s) +
                oo.io_timeout_s;
    r->steps = steps;
    if (cl.is_ps)
      rc = run_server(&oo, m, &cl, steps, startup_s, r);
    else
      rc = run_worker(&oo, m, train, test, &cl, steps, startup_s, r);
  }
  cluster_cleanup(&cl);
  return rc;
}
