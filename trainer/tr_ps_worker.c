/*
 * tr_ps_worker.c: a worker of --mode ps: it connects to every parameter
 * server, pulls the parameters, computes its share of each global batch's
 * gradient and pushes each server its range. The protocol is described in
 * tr_ps.h.
 */
#include "tr_metrics.h"
#include "tr_ps.h"
#include "util.h"

#include <errno.h>
#include <inttypes.h>
#include <netdb.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

/* Connects to a, retrying until deadline (util_mono_ms) while the PS is not
 * up yet. Returns the socket or -1 with err filled. */
static MUST_CHECK int connect_retry(const struct ps_addr *a, const char *name, int64_t deadline,
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
      ps_sock_setup(fd);
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

int ps_run_worker(const struct tr_opts *o, struct tr_mlp *m, const struct tr_data *train,
                  const struct tr_data *test, const struct ps_cluster *cl, long steps,
                  double startup_s, struct tr_result *r) {
  const int P = cl->nps, K = cl->nworkers, w = cl->index, B = o->batch;
  const long spe = tr_steps_per_epoch(train->n, B);
  const long nepochs = (steps + spe - 1) / spe;
  const double tmo = o->io_timeout_s;
  struct ps_net nt = {0};
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
  x = tr_alloc((size_t)(rows ? rows : 1) * (size_t)train->dim * sizeof *x);
  y = malloc((size_t)(rows ? rows : 1));
  perm = malloc((size_t)train->n * sizeof *perm);
  if (!x || !y || !perm || ps_net_init(&nt, P) != 0) {
    fprintf(stderr, "muster-train: out of memory\n");
    goto out;
  }

  /* Connect to every PS, say HELLO and take the initial weights. */
  deadline = util_mono_ms() + (int64_t)((startup_s - tmo) * 1000.0);
  for (int j = 0; j < P; j++) {
    struct ps_conn *c = &nt.c[j];
    struct ps_hello h;
    size_t plo, phi;
    ps_range_of(m->nparams, j, P, &plo, &phi);
    snprintf(c->name, sizeof c->name, "ps %d (%s)", j, cl->ps[j].text);
    c->fd = connect_retry(&cl->ps[j], c->name, deadline, startup_s - tmo, err, sizeof err);
    if (c->fd < 0) {
      fprintf(stderr, "muster-train: worker %d %s\n", w, err);
      goto out;
    }
    if (ps_conn_buffers(c, (phi - plo + 2) * sizeof(float), (phi - plo + 2) * sizeof(float)) != 0) {
      fprintf(stderr, "muster-train: out of memory\n");
      goto out;
    }
    ps_fill_hello(&h, o, m, cl, w, j, steps);
    if (ps_conn_queue(c, MSG_HELLO, 0, &h, sizeof h, NULL, 0) != 0)
      goto out;
    ps_conn_expect(c);
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
        struct ps_conn *c = &nt.c[j];
        size_t plo, phi;
        ps_range_of(m->nparams, j, P, &plo, &phi);
        if (ps_conn_queue(c, MSG_PUSH, s, m->grads + plo, (phi - plo) * sizeof(float),
                          m->grads + m->nparams, 2 * sizeof(float)) != 0)
          goto out;
        ps_conn_expect(c);
      }
    } else {
      ts = tc;
    }
    if (s == 0)
      snprintf(when, sizeof when, "during the handshake");
    else
      snprintf(when, sizeof when, "during step %ld", s);
    e = ps_pump(&nt, WAIT_ALL, 0, s <= 1 ? startup_s : tmo, when, err, sizeof err);
    if (e != 0) {
      fprintf(stderr, "muster-train: worker %d: %s\n", w, err);
      rc = e == -2 ? 2 : 1;
      goto out;
    }
    for (int j = 0; j < P; j++) {
      struct ps_conn *c = &nt.c[j];
      size_t plo, phi;
      const float *p = (const float *)c->rbuf;
      ps_range_of(m->nparams, j, P, &plo, &phi);
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
      ps_conn_consume(c);
      c->want_rx = 0;
    }
    tcomm += tr_now() - ts;
    if (s == 0) {
      /* Every PS has every worker in and sent its weights. */
      r->t_ready = tr_wall();
      t_train0 = tr_now();
      tr_metrics_open(o->metrics_every, w);
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
      tr_metrics_step(t, spe, last_loss, correct / denom, rows, sie == spe - 1 || s == steps);
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
      if (ps_conn_queue(&nt.c[j], MSG_BYE, steps, NULL, 0, NULL, 0) != 0)
        goto out;
    e = ps_pump(&nt, WAIT_ALL, 1, tmo, "after the last step", err, sizeof err);
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
  tr_metrics_close();
  ps_net_cleanup(&nt);
  tr_free(x);
  free(y);
  free(perm);
  r->total_s = tr_now() - t0;
  return rc;
}
