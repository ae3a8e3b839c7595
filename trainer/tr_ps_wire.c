/*
 * tr_ps_wire.c: the parameter-server mode's cluster spec (TF_CONFIG) and
 * its framing: connections that carry one message each way at a time, and
 * the poll loop that moves them with a deadline per peer; and what both
 * sides share (each PS's range of the parameters, the HELLO that describes
 * the run). The protocol is described in tr_ps.h.
 */
#include "hostport.h"
#include "tr_ps.h"
#include "util.h"

#include <jansson.h>

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

/* ---- cluster spec ---- */

void ps_cluster_cleanup(struct ps_cluster *cl) {
  free(cl->ps);
  free(cl->worker);
  cl->ps = cl->worker = NULL;
}

/* Splits "host:port" (or "[v6]:port") into a. Returns 0 or -1. */
static MUST_CHECK int parse_addr(const char *s, struct ps_addr *a) {
  size_t len = strlen(s);
  int port;

  if (len >= sizeof a->text || hostport_split(s, len, a->host, sizeof a->host, 1, &port) != 0)
    return -1;
  snprintf(a->text, sizeof a->text, "%s", s);
  snprintf(a->port, sizeof a->port, "%d", port);
  return 0;
}

/* Fills *out from the JSON array arr of "host:port" strings (new array in
 * *out, freed by ps_cluster_cleanup). Returns 0 or -1 with err filled. */
static MUST_CHECK int parse_addr_list(json_t *arr, const char *what, struct ps_addr **out, int *n,
                                      char *err, size_t errlen) {
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
 * sentence in err; ps_cluster_cleanup(cl) either way. */
int ps_cluster_from_env(struct ps_cluster *cl, char *err, size_t errlen) {
  return ps_cluster_parse(getenv("TF_CONFIG"), cl, err, errlen);
}

int ps_cluster_parse(const char *env, struct ps_cluster *cl, char *err, size_t errlen) {
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

void ps_conn_init(struct ps_conn *c) {
  memset(c, 0, sizeof *c);
  c->fd = -1;
}

void ps_conn_cleanup(struct ps_conn *c) {
  if (c->fd >= 0)
    close(c->fd);
  free(c->rbuf);
  free(c->tbuf);
  ps_conn_init(c);
}

/* Gives c buffers for payloads of up to rcap bytes received and two
 * messages of up to tpay payload bytes queued. Returns 0 or -1. */
int ps_conn_buffers(struct ps_conn *c, size_t rcap, size_t tpay) {
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

void ps_sock_setup(int fd) {
  int one = 1;
  int fl = fcntl(fd, F_GETFL);

  if (fl >= 0)
    (void)fcntl(fd, F_SETFL, fl | O_NONBLOCK);
  (void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

/* Appends one message (payload a then b) to c's send buffer. The protocol
 * keeps at most one message in flight per direction, so the room for two
 * that ps_conn_buffers makes is enough; -1 says otherwise (a bug). */
int ps_conn_queue(struct ps_conn *c, uint16_t type, int64_t step, const void *a, size_t alen,
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
void ps_conn_expect(struct ps_conn *c) {
  c->want_rx = 1;
  c->ready = 0;
  c->rgot = 0;
  c->last_ms = util_mono_ms();
}

/* Takes c's waiting message; c receives the next one from now on. */
void ps_conn_consume(struct ps_conn *c) {
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
int ps_conn_send(struct ps_conn *c, char *why, size_t n) {
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

int ps_hdr_check(const struct ps_hdr *h, size_t cap, char *why, size_t n) {
  if (h->magic != PS_MAGIC) {
    snprintf(why, n,
             "sent something that is not a muster-train ps message (magic 0x%08" PRIx32
             "; a peer of another byte order?)",
             h->magic);
    return -1;
  }
  if (h->version != PS_VERSION) {
    snprintf(why, n, "speaks ps protocol version %u, this muster-train speaks %d",
             (unsigned)h->version, PS_VERSION);
    return -1;
  }
  if (h->len > cap) {
    snprintf(why, n, "sent a message of %" PRIu64 " bytes, more than the %zu expected", h->len,
             cap);
    return -1;
  }
  return 0;
}

/* Receives into c's message until it is whole (c->ready) or the socket is
 * empty; never reads past the message. Returns 0 or -1 with why filled. */
int ps_conn_recv(struct ps_conn *c, char *why, size_t n) {
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
    if (c->rgot == sizeof c->rh && ps_hdr_check(&c->rh, c->rcap, why, n) != 0)
      return -1;
    if (c->rgot >= sizeof c->rh && c->rgot == sizeof c->rh + (size_t)c->rh.len)
      c->ready = 1;
  }
  return 0;
}

void ps_net_cleanup(struct ps_net *nt) {
  for (int i = 0; nt->c && i < nt->n; i++)
    ps_conn_cleanup(&nt->c[i]);
  free(nt->c);
  free(nt->pfd);
  nt->c = NULL;
  nt->pfd = NULL;
  nt->n = 0;
}

int ps_net_init(struct ps_net *nt, int n) {
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
    ps_conn_init(&nt->c[i]);
  return 0;
}

/*
 * Moves bytes on every connection of nt until: (WAIT_ALL) every connection
 * we want a message from has one ready, or (WAIT_ANY) one of them has; and,
 * if drain, everything queued has been sent. A BYE closes its connection at
 * once (the peer is done with it); an ERROR ends the wait with its text.
 * Returns 0; -1 on a dead, silent or misbehaving peer; -2 when a peer sent
 * ERROR. err gets a sentence naming the peer, ending with when.
 */
int ps_pump(struct ps_net *nt, int mode, int drain, double timeout_s, const char *when, char *err,
            size_t errlen) {
  int64_t tmo_ms = (int64_t)(timeout_s * 1000.0);
  char why[PS_MAX_ERROR + 64];

  for (;;) {
    int64_t now = util_mono_ms(), next = -1;
    int all = 1, any = 0, txleft = 0, done, r, failed = 0;

    for (int i = 0; i < nt->n; i++) {
      struct ps_conn *c = &nt->c[i];
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
      struct ps_conn *c = &nt->c[i];
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
      struct ps_conn *c = &nt->c[i];
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
      if ((re & POLLOUT) && ps_conn_send(c, why, sizeof why) != 0)
        goto fail;
      if ((re & (POLLIN | POLLERR | POLLHUP | POLLRDHUP)) && c->want_rx && !c->ready) {
        if (ps_conn_recv(c, why, sizeof why) != 0)
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

/* ---- what both sides share: the ranges, the HELLO ---- */

void ps_range_of(size_t nparams, int j, int nps, size_t *lo, size_t *hi) {
  *lo = nparams * (size_t)j / (size_t)nps;
  *hi = nparams * (size_t)(j + 1) / (size_t)nps;
}

void ps_fill_hello(struct ps_hello *h, const struct tr_opts *o, const struct tr_mlp *m,
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
