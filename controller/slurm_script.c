/*
 * slurm_script.c: what a job asks of Slurm, built: the shape of a task
 * (whole cores, memory per core, GPUs) as sbatch options and as words, and
 * the job's batch script, one srun step per worker. No I/O; reads only the
 * configuration (sb.cfg; slurm_internal.h).
 */
#include "resources.h"
#include "slurm_internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Slurm allocates whole cores: a fractional request rounds up. */
static int task_cpus(const struct backend_req *r) {
  return res_cpu_count(r->cpu);
}

/* Memory per allocated core in MiB (rounded up), 0 when none was asked. */
static long task_mem_per_cpu(const struct backend_req *r) {
  if (r->memory <= 0)
    return 0;
  return (long)res_ceil_sat(r->memory * 1024.0 / task_cpus(r), 1, 1LL << 40);
}

void slurm_describe(const struct backend_req *r, char *buf, size_t len) {
  size_t n = (size_t)snprintf(buf, len, "%d core%s per worker", task_cpus(r),
                              task_cpus(r) == 1 ? "" : "s");
  if (n < len && r->cpu != task_cpus(r))
    n += (size_t)snprintf(buf + n, len - n, " (%g asked; Slurm allocates whole cores)", r->cpu);
  if (n < len && task_mem_per_cpu(r) > 0)
    n += (size_t)snprintf(buf + n, len - n, ", %ld MiB per core", task_mem_per_cpu(r));
  if (n < len && r->ngpu > 0)
    snprintf(buf + n, len - n, ", %d GPU%s", r->ngpu, r->ngpu == 1 ? "" : "s");
}

/* Appends the resource and placement options of a job (or a component of a
 * heterogeneous one) of ntasks tasks of shape r to argv (room for 16 more). */
int sb_shape_args(const struct backend_req *r, int ntasks, char *argv[], int n, char bufs[4][64]) {
  snprintf(bufs[0], 64, "--ntasks=%d", ntasks);
  argv[n++] = bufs[0];
  snprintf(bufs[1], 64, "--cpus-per-task=%d", task_cpus(r));
  argv[n++] = bufs[1];
  if (task_mem_per_cpu(r) > 0) {
    snprintf(bufs[2], 64, "--mem-per-cpu=%ld", task_mem_per_cpu(r));
    argv[n++] = bufs[2];
  }
  if (r->ngpu > 0) {
    snprintf(bufs[3], 64, "--gpus-per-task=%d", r->ngpu);
    argv[n++] = bufs[3];
  }
  if (sb.cfg.slurm_partition[0]) {
    argv[n++] = "--partition";
    argv[n++] = sb.cfg.slurm_partition;
  }
  if (sb.cfg.slurm_account[0]) {
    argv[n++] = "--account";
    argv[n++] = sb.cfg.slurm_account;
  }
  return n;
}

/* Quotes s for sh in single quotes into buf. */
static void sh_quote(const char *s, char *buf, size_t len) {
  size_t o = 0;

  if (len < 3)
    return;
  buf[o++] = '\'';
  for (; *s && o + 5 < len; s++) {
    if (*s == '\'') {
      memcpy(buf + o, "'\\''", 4);
      o += 4;
    } else {
      buf[o++] = *s;
    }
  }
  buf[o++] = '\'';
  buf[o] = '\0';
}

/* The batch script of job j: one srun step per worker, in the background,
 * then a wait. Each step's workerd gets its own id, attempt and token (the
 * tokens travel in the job's environment as MUSTER_TOKEN_I, never on a
 * command line). */
char *sb_job_script(const struct sb_job *j) {
  char workerd[2200];
  size_t cap = 256 + (size_t)j->n * 2700, len = 0;
  char *s = malloc(cap);
  int het = j->ncomp > 1;

  if (!s)
    return NULL;
  sh_quote(sb.cfg.workerd_path, workerd, sizeof(workerd));
  len += (size_t)snprintf(s + len, cap - len,
                          "#!/bin/sh\n"
                          "# muster launch %s: one job step per worker\n",
                          j->launch);
  for (int i = 0; i < j->n; i++) {
    const struct sb_worker *w = &j->w[i];
    char shape[160], group[32] = "";
    int sl = snprintf(shape, sizeof(shape), "-c %d", task_cpus(&w->req));

    if (task_mem_per_cpu(&w->req) > 0)
      sl += snprintf(shape + sl, sizeof(shape) - (size_t)sl, " --mem-per-cpu=%ld",
                     task_mem_per_cpu(&w->req));
    if (w->req.ngpu > 0)
      snprintf(shape + sl, sizeof(shape) - (size_t)sl, " --gpus-per-task=%d", w->req.ngpu);
    if (het)
      snprintf(group, sizeof(group), " --het-group=%d", w->comp);
    len += (size_t)snprintf(s + len, cap - len,
                            "MUSTER_WORKER_ID=%s MUSTER_WORKER_ATTEMPT=%d "
                            "MUSTER_WORKER_TOKEN=\"$MUSTER_TOKEN_%d\" "
                            "srun%s --exact -n1 -N1 %s -J %s %s &\n",
                            w->id, w->attempt, i, group, shape, w->id, workerd);
  }
  snprintf(s + len, cap - len, "wait\n");
  return s;
}
