/* tr_run.c: see tr_run.h; also the single-process mode. */
#include "tr_run.h"
#include "tr_metrics.h"
#include "util.h"

#include "muster_errors.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

float tr_lr_at(const struct tr_opts *o, long step, long total) {
  if (o->lr_constant || total <= 1)
    return o->lr;
  return (float)(o->lr * 0.5 * (1.0 + cos(3.14159265358979323846 * (double)step / (double)total)));
}

double tr_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

double tr_wall(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

long tr_steps_per_epoch(int n, int b) {
  return b > 0 ? n / b : 0;
}

void tr_shard(int b, int r, int k, int *lo, int *hi) {
  *lo = (int)((long)b * r / k);
  *hi = (int)((long)b * (r + 1) / k);
}

void tr_gather(const struct tr_data *d, const int *perm, long step_in_epoch, int b, int lo, int hi,
               float *x, uint8_t *y) {
  const int *idx = perm + step_in_epoch * b;

  for (int i = lo; i < hi; i++) {
    tr_data_rows(d, idx[i], 1, x + (size_t)(i - lo) * d->dim);
    y[i - lo] = d->y[idx[i]];
  }
}

void tr_report_epoch(const struct tr_opts *o, int epoch, int epochs, double loss, double train_acc,
                     double test_acc, double samples_per_s) {
  if (o->quiet)
    return;
  printf("epoch %d/%d  loss %.4f  train_acc %.4f  test_acc %.4f  samples/s %.0f\n", epoch, epochs,
         loss, train_acc, test_acc, samples_per_s);
  fflush(stdout);
}

void tr_print_summary(const struct tr_result *r) {
  printf("{\"mode\": \"%s\", \"ranks\": %d, \"steps\": %ld, \"samples\": %ld, "
         "\"samples_per_s\": %.1f, \"final_loss\": %.6f, \"test_accuracy\": %.4f, "
         "\"test_loss\": %.6f, \"compute_s\": %.4f, \"comm_s\": %.4f, \"total_s\": %.4f, "
         "\"t_main\": %.4f, \"t_loaded\": %.4f, \"t_ready\": %.4f, \"t_end\": %.4f}\n",
         r->mode, r->ranks, r->steps, r->samples, r->samples_per_s, r->final_loss, r->test_accuracy,
         r->test_loss, r->compute_s, r->comm_s, r->total_s, r->t_main, r->t_loaded,
         r->t_ready ? r->t_ready : r->t_loaded, tr_wall());
  fflush(stdout);
}

/* ---- checkpoints ---- */

#define CKPT_MAGIC "MUSTRCK1"

struct ckpt_head {
  char magic[8];
  int32_t nsizes;
  int32_t sizes[TR_MAX_LAYERS + 1];
  int64_t nparams;
  int64_t step;
};

static MUST_CHECK int write_all(int fd, const void *p, size_t n) {
  const char *c = p;
  while (n) {
    ssize_t w = write(fd, c, n);
    if (w < 0) {
      if (errno == EINTR)
        continue;
      return -1;
    }
    c += w;
    n -= (size_t)w;
  }
  return 0;
}

/* mkdir -p of path's directory. */
static int make_parent_dirs(const char *path) {
  char buf[1024];

  if (snprintf(buf, sizeof(buf), "%s", path) >= (int)sizeof(buf))
    return -1;
  for (char *p = buf + 1; *p; p++) {
    if (*p != '/')
      continue;
    *p = '\0';
    if (mkdir(buf, 0755) != 0 && errno != EEXIST)
      return -1;
    *p = '/';
  }
  return 0;
}

int tr_checkpoint_save(const char *path, const struct tr_mlp *m, long step, char *err,
                       size_t errlen) {
  struct ckpt_head h;
  char tmp[1100];
  int fd;

  memset(&h, 0, sizeof(h));
  memcpy(h.magic, CKPT_MAGIC, 8);
  h.nsizes = m->nlayers + 1;
  for (int i = 0; i <= m->nlayers; i++)
    h.sizes[i] = m->sizes[i];
  h.nparams = (int64_t)m->nparams;
  h.step = step;
  snprintf(tmp, sizeof(tmp), "%s.tmp.%d", path, (int)getpid());
  fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0 && errno == ENOENT && make_parent_dirs(path) == 0)
    fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0 || write_all(fd, &h, sizeof(h)) || write_all(fd, m->params, m->nparams * 4) ||
      write_all(fd, m->velocity, m->nparams * 4) || fsync(fd) != 0) {
    snprintf(err, errlen, "could not write the checkpoint %s: %s", tmp, strerror(errno));
    if (fd >= 0)
      close(fd);
    unlink(tmp);
    return MUSTER_E_IO;
  }
  close(fd);
  /* The rename is atomic: a reader sees the old checkpoint or the new. */
  if (rename(tmp, path) != 0) {
    snprintf(err, errlen, "could not rename %s to %s: %s", tmp, path, strerror(errno));
    unlink(tmp);
    return MUSTER_E_IO;
  }
  return 0;
}

int tr_checkpoint_load(const char *path, struct tr_mlp *m, long *step, char *err, size_t errlen) {
  struct ckpt_head h;
  FILE *f = fopen(path, "rb");
  int rc = MUSTER_E_INVALID;

  if (!f) {
    snprintf(err, errlen, "--resume %s: %s", path, strerror(errno));
    return MUSTER_E_IO;
  }
  if (fread(&h, sizeof(h), 1, f) != 1 || memcmp(h.magic, CKPT_MAGIC, 8) != 0) {
    snprintf(err, errlen, "--resume %s: not a muster-train checkpoint", path);
    goto out;
  }
  if (h.nsizes != m->nlayers + 1 || (size_t)h.nparams != m->nparams) {
    snprintf(err, errlen,
             "--resume %s: the checkpoint is of another network (%d layers, %lld "
             "parameters; this run has %d and %zu)",
             path, h.nsizes, (long long)h.nparams, m->nlayers + 1, m->nparams);
    goto out;
  }
  for (int i = 0; i < h.nsizes; i++)
    if (h.sizes[i] != m->sizes[i]) {
      snprintf(err, errlen, "--resume %s: layer %d has %d units, --layers says %d", path, i,
               h.sizes[i], m->sizes[i]);
      goto out;
    }
  if (fread(m->params, 4, m->nparams, f) != m->nparams ||
      fread(m->velocity, 4, m->nparams, f) != m->nparams) {
    snprintf(err, errlen, "--resume %s: truncated", path);
    goto out;
  }
  *step = (long)h.step;
  rc = 0;
out:
  fclose(f);
  return rc;
}

int tr_dump_params(const char *path, const struct tr_mlp *m) {
  FILE *f = fopen(path, "wb");
  int ok;

  if (!f)
    return MUSTER_E_IO;
  ok = fwrite(m->params, 4, m->nparams, f) == m->nparams;
  return fclose(f) == 0 && ok ? 0 : MUSTER_E_IO;
}

/* ---- single process ---- */

int tr_run_single(const struct tr_opts *o, struct tr_mlp *m, const struct tr_data *train,
                  const struct tr_data *test, struct tr_result *r) {
  long spe = tr_steps_per_epoch(train->n, o->batch);
  long total = o->steps > 0 ? o->steps : o->epochs * spe, step = 0;
  int epochs = (int)((total + spe - 1) / spe);
  int *perm = malloc((size_t)train->n * sizeof(int));
  float *x = tr_alloc((size_t)o->batch * train->dim * sizeof(float));
  uint8_t *y = malloc((size_t)o->batch);
  double t_start, t_train = 0, t_epoch = 0, ep_loss = 0, ep_ok = 0, last_loss = 0, ok;
  long ep_steps = 0;
  char err[512];
  int code = 0;

  r->mode = "single";
  r->ranks = 1;
  if (!perm || !x || !y) {
    fprintf(stderr, "muster-train: out of memory\n");
    code = 1;
    goto out;
  }
  if (o->resume[0] && tr_checkpoint_load(o->resume, m, &step, err, sizeof(err)) != 0) {
    fprintf(stderr, "muster-train: %s\n", err);
    code = 2;
    goto out;
  }
  tr_metrics_open(o->metrics_every, 0);
  t_start = tr_now();
  if (step < total)
    tr_epoch_order(o->seed, (int)(step / spe), train->n, perm);
  for (; step < total; step++) {
    long s_in = step % spe;
    double t0 = tr_now();

    if (s_in == 0 && step > 0)
      tr_epoch_order(o->seed, (int)(step / spe), train->n, perm);
    tr_gather(train, perm, s_in, o->batch, 0, o->batch, x, y);
    last_loss =
        tr_mlp_train_step(m, x, y, o->batch, tr_lr_at(o, step, total), o->momentum, &ok) / o->batch;
    t_train += tr_now() - t0;
    t_epoch += tr_now() - t0;
    ep_loss += last_loss;
    ep_ok += ok;
    ep_steps++;
    tr_metrics_step(step, spe, last_loss, ok / o->batch, o->batch,
                    s_in == spe - 1 || step == total - 1);
    if (s_in == spe - 1 || step == total - 1) {
      double tl = 0, ta = 0;
      if (!o->quiet) {
        tr_mlp_evaluate(m, test, &tl, &ta);
        tr_metrics_value(step, spe, "test_accuracy", ta);
      }
      tr_report_epoch(o, (int)(step / spe) + 1, epochs, ep_loss / ep_steps,
                      ep_ok / ((double)ep_steps * o->batch), ta,
                      ep_steps * o->batch / (t_epoch > 0 ? t_epoch : 1));
      if (o->checkpoint[0] && tr_checkpoint_save(o->checkpoint, m, step + 1, err, sizeof(err))) {
        fprintf(stderr, "muster-train: %s\n", err);
        code = 1;
        goto out;
      }
      ep_loss = ep_ok = t_epoch = 0;
      ep_steps = 0;
    }
    r->steps++;
  }
  r->total_s = tr_now() - t_start;
  r->compute_s = t_train;
  r->samples = r->steps * o->batch;
  r->samples_per_s = t_train > 0 ? r->samples / t_train : 0;
  r->final_loss = last_loss;
  tr_mlp_evaluate(m, test, &r->test_loss, &r->test_accuracy);
out:
  tr_metrics_close();
  free(perm);
  tr_free(x);
  free(y);
  return code;
}
