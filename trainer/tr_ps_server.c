/*
 * tr_ps_server.c: a parameter server of --mode ps: it accepts the workers,
 * checks that each runs the same configuration, and applies their pushes to
 * its range of the parameters (--sync: summed in worker order; --async: on
 * arrival). The protocol is described in tr_ps.h.
 */
#include "tr_ps.h"
#include "util.h"

#include <errno.h>
#include <inttypes.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

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
static MUST_CHECK int ps_listen(const struct ps_addr *a, const char *name, char *err,
                                size_t errlen) {
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
  ps_sock_setup(fd);
  return fd;
}

/* Sends an ERROR to c as well as the socket takes it at once (a small
 * message on a fresh connection: it does), then gives up on c. */
static void refuse(struct ps_conn *c, const char *text) {
  char why[64];
  size_t n = strlen(text);

  if (n > PS_MAX_ERROR)
    n = PS_MAX_ERROR;
  c->toff = c->tlen = 0;
  /* Best effort: a worker that is gone already learns nothing either way. */
  if (ps_conn_queue(c, MSG_ERROR, 0, text, n, NULL, 0) == 0 && ps_conn_send(c, why, sizeof why))
    return;
}

/*
 * Accepts connections on lfd until every worker has said a HELLO that
 * agrees with ours; each becomes nt->c[worker]. Strangers that close, time
 * out or send garbage before a HELLO are dropped. Returns 0, 1 (a worker
 * missing after the window) or 2 (a worker of another configuration: it is
 * told why) with err filled.
 */
static MUST_CHECK int ps_accept_workers(int lfd, struct ps_net *nt, const struct ps_cluster *cl,
                                        const struct ps_hello *mine, size_t rbytes, size_t tbytes,
                                        double window_s, double io_timeout_s, char *err,
                                        size_t errlen) {
  struct ps_conn pend[PS_MAX_STRANGERS];
  struct pollfd pfd[PS_MAX_STRANGERS + 1];
  int npend = 0, npolled, have = 0, rc = 1;
  int64_t deadline = util_mono_ms() + (int64_t)(window_s * 1000.0);
  char why[256];

  for (int i = 0; i < PS_MAX_STRANGERS; i++)
    ps_conn_init(&pend[i]);
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
        struct ps_conn *c = &pend[npend];
        ps_conn_init(c);
        c->fd = fd;
        ps_sock_setup(fd);
        snprintf(c->name, sizeof c->name, "a connection");
        if (ps_conn_buffers(c, sizeof(struct ps_hello), 0) != 0) {
          snprintf(err, errlen, "out of memory");
          ps_conn_cleanup(c);
          goto out;
        }
        ps_conn_expect(c);
        npend++;
      }
    }
    now = util_mono_ms();
    for (int i = npend - 1; i >= 0; i--) {
      struct ps_conn *c = &pend[i];
      struct ps_hello h;
      int drop = 0;

      /* pfd[i + 1] is pend[i]'s only for the connections polled (a swap
       * below only moves an already handled one into i). */
      if (r > 0 && i < npolled && pfd[i + 1].revents && ps_conn_recv(c, why, sizeof why) != 0)
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
          struct ps_conn *w = &nt->c[h.worker];
          *w = *c;
          ps_conn_init(c);
          snprintf(w->name, sizeof w->name, "worker %" PRIu32 " (%s)", h.worker,
                   cl->worker[h.worker].text);
          if (ps_conn_buffers(w, rbytes, tbytes) != 0) {
            snprintf(err, errlen, "out of memory");
            goto out;
          }
          ps_conn_consume(w);
          w->want_rx = 0;
          have++;
          pend[i] = pend[--npend];
          ps_conn_init(&pend[npend]);
          continue;
        }
        refuse(c, text);
        snprintf(err, errlen, "%s", text);
        rc = 2;
        goto out;
      }
      if (drop) {
        ps_conn_cleanup(c);
        pend[i] = pend[--npend];
        ps_conn_init(&pend[npend]);
      }
    }
  }
  rc = 0;
out:
  for (int i = 0; i < npend; i++)
    ps_conn_cleanup(&pend[i]);
  return rc;
}

int ps_run_server(const struct tr_opts *o, struct tr_mlp *m, const struct ps_cluster *cl,
                  long steps, double startup_s, struct tr_result *r) {
  const int K = cl->nworkers, j = cl->index;
  size_t lo, hi, len;
  struct ps_hello mine;
  struct ps_net nt = {0};
  float *sum = NULL, zero2[2] = {0, 0};
  char name[340], err[2048], when[64];
  int lfd = -1, rc = 1, e;
  double t0 = tr_now(), tcomp = 0;
  const double tmo = o->io_timeout_s;

  ps_range_of(m->nparams, j, cl->nps, &lo, &hi);
  len = hi - lo;
  snprintf(name, sizeof name, "ps %d (%s)", j, cl->ps[j].text);
  ps_fill_hello(&mine, o, m, cl, 0, j, steps);
  sum = malloc((len + 2) * sizeof *sum);
  if (!sum || ps_net_init(&nt, K) != 0) {
    fprintf(stderr, "muster-train: out of memory\n");
    goto out;
  }
  lfd = ps_listen(&cl->ps[j], name, err, sizeof err);
  if (lfd < 0) {
    fprintf(stderr, "muster-train: %s\n", err);
    rc = 2;
    goto out;
  }
  /* Two lines for whoever watches the log (a person, a test waiting to
   * kill this PS mid-training): listening, then every worker in. */
  fprintf(stderr, "muster-train: %s is listening for %d worker%s\n", name, K, K == 1 ? "" : "s");
  e = ps_accept_workers(lfd, &nt, cl, &mine, (len + 2) * sizeof(float), (len + 2) * sizeof(float),
                        startup_s, tmo, err, sizeof err);
  close(lfd);
  lfd = -1;
  if (e != 0) {
    fprintf(stderr, "muster-train: %s\n", err);
    rc = e;
    goto out;
  }
  if (K == 1)
    fprintf(stderr, "muster-train: %s: its worker connected\n", name);
  else
    fprintf(stderr, "muster-train: %s: all %d workers connected\n", name, K);
  for (int i = 0; i < K; i++) {
    if (ps_conn_queue(&nt.c[i], MSG_PARAMS, 0, m->params + lo, len * sizeof(float), zero2,
                      sizeof zero2) != 0)
      goto bug;
    ps_conn_expect(&nt.c[i]);
  }

  if (o->sync) {
    for (long s = 1; s <= steps; s++) {
      double tc;
      snprintf(when, sizeof when, "during step %ld", s);
      e = ps_pump(&nt, WAIT_ALL, 0, s == 1 ? startup_s : tmo, when, err, sizeof err);
      if (e != 0) {
        fprintf(stderr, "muster-train: %s\n", err);
        goto out;
      }
      tc = tr_now();
      for (int i = 0; i < K; i++) {
        struct ps_conn *c = &nt.c[i];
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
        ps_conn_consume(c);
      }
      tr_mlp_sgd(m->params + lo, m->velocity + lo, sum, 0, len, tr_lr_at(o, s - 1, steps),
                 o->momentum);
      tcomp += tr_now() - tc;
      for (int i = 0; i < K; i++) {
        if (ps_conn_queue(&nt.c[i], MSG_PARAMS, s, m->params + lo, len * sizeof(float), sum + len,
                          2 * sizeof(float)) != 0)
          goto bug;
        ps_conn_expect(&nt.c[i]);
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
      e = ps_pump(&nt, WAIT_ANY, 0, least == 0 ? startup_s : tmo, when, err, sizeof err);
      if (e != 0) {
        fprintf(stderr, "muster-train: %s\n", err);
        free(done);
        goto out;
      }
      for (int i = 0; i < K; i++) {
        struct ps_conn *c = &nt.c[i];
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
        if (ps_conn_queue(c, MSG_PARAMS, done[i], m->params + lo, len * sizeof(float), g + len,
                          2 * sizeof(float)) != 0) {
          free(done);
          goto bug;
        }
        ps_conn_consume(c);
      }
    }
    free(done);
  }
  if (o->sync) {
    /* Each worker says BYE once it has the last step's parameters. */
    e = ps_pump(&nt, WAIT_ALL, 1, steps == 0 ? startup_s : tmo, "after the last step", err,
                sizeof err);
    if (e != 0) {
      fprintf(stderr, "muster-train: %s\n", err);
      goto out;
    }
    for (int i = 0; i < K; i++) {
      struct ps_conn *c = &nt.c[i];
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
  ps_net_cleanup(&nt);
  free(sum);
  r->total_s = tr_now() - t0;
  return rc;
}
