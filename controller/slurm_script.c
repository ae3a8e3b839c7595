/*
 * slurm_script.c: what a job asks of Slurm, built: the shape of a task
 * (whole cores, memory per core, GPUs) as sbatch options and as words, and
 * the job's batch script, one srun step per worker. No I/O; reads only the
 * configuration (sb.cfg; slurm_internal.h). What the script's lines mean
 * to muster-workerd --job is in workerd/job.c.
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

/* The batch script of job j. Its first process is muster-workerd --job
 * (the kernel runs it as the script's interpreter; through sh where its
 * path cannot be one), which claims the workers' tokens with the job's
 * secret (in the job's environment) before anything else of the job runs,
 * then starts one srun step per "#@" line, handing each step's workerd its
 * token through srun's stdin. The script carries no secret: every step of
 * the job could read it. Its "#@" lines: ID ATTEMPT HET_GROUP (-1: not a
 * heterogeneous job) CPUS MEM_PER_CPU_MIB (0: none asked) GPUS. */
char *sb_job_script(const struct sb_job *j) {
  char workerd[2200];
  size_t cap = 2600 + (size_t)j->n * 120, len = 0;
  char *s = malloc(cap);
  int het = j->ncomp > 1;
  const char *p = sb.cfg.workerd_path;

  if (!s)
    return NULL;
  /* (Linux reads 255 bytes of a #! line, split at blanks) */
  if (p[0] == '/' && strlen(p) < 200 && !strpbrk(p, " \t\n")) {
    len += (size_t)snprintf(s + len, cap - len, "#!%s --job\n", p);
  } else {
    sh_quote(p, workerd, sizeof(workerd));
    len += (size_t)snprintf(s + len, cap - len, "#!/bin/sh\nexec %s --job \"$0\"\n", workerd);
  }
  len += (size_t)snprintf(s + len, cap - len,
                          "# muster launch %s: muster-workerd --job starts one job step per "
                          "worker:\n# ID ATTEMPT HET_GROUP CPUS MEM_PER_CPU_MIB GPUS\n",
                          j->launch);
  for (int i = 0; i < j->n; i++) {
    const struct sb_worker *w = &j->w[i];

    len += (size_t)snprintf(s + len, cap - len, "#@ %s %d %d %d %ld %d\n", w->id, w->attempt,
                            het ? w->comp : -1, task_cpus(&w->req), task_mem_per_cpu(&w->req),
                            w->req.ngpu);
  }
  return s;
}
