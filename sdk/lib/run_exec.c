/* run_exec.c: a run's command in every PS and worker through their exec
 * channels (modes ps and exec), with TF_CONFIG and the torch variables. */
#include "exec_words.h"
#include "muster.h"
#include "run_internal.h"

#include <jansson.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>

static int on_out(void *arg, const char *d, size_t n) {
  muster_run_emit_(arg, 0, d, n);
  return 0;
}

static int on_err(void *arg, const char *d, size_t n) {
  muster_run_emit_(arg, 1, d, n);
  return 0;
}

static void *exec_main(void *arg) {
  struct proc *p = arg;
  muster_exec_opts eo;

  muster_exec_opts_init(&eo);
  eo.argv = p->run->argv;
  eo.argc = p->run->argc;
  eo.env = (const char *const *)p->env;
  eo.nenv = p->nenv;
  eo.on_stdout = on_out;
  eo.on_stderr = on_err;
  eo.arg = p;
  eo.cancel = &p->run->cancel;
  p->rc = muster_exec_at(&p->target, &eo, &p->exit_code, p->err, sizeof(p->err));
  muster_run_flush_lines_(p);
  /* A failure ends the run at once, whichever process it is: the others
   * are cancelled now, not when their turn to be waited for comes. */
  if (p->run->cancel)
    return NULL;
  /* A lost connection, or a command killed by SIGTERM or SIGKILL (what a
   * stop of its worker, an expired lease or the OOM killer sends): the
   * controller says moments later what happened to the worker (stopped by
   * the user, out of memory); that names the cause better, and a stop is
   * no failure to restart after. */
  if (p->rc || p->exit_code == 128 + SIGTERM || p->exit_code == 128 + SIGKILL)
    muster_run_await_worker_failure_(p->run, 3);
  /* workerd's refusals (a directory that is not there, a program it may
   * not run) come with exit code 126 and a sentence: the sentence says it. */
  if (p->rc || (p->exit_code != 0 && p->err[0]))
    muster_run_fail_(p->run, p->target.worker_id, "%s %d (%s): %s", p->role, p->index,
                     p->target.worker_id, exec_words(p->err));
  else if (p->exit_code != 0)
    muster_run_fail_(p->run, p->target.worker_id, "%s %d (%s) exited with code %d", p->role,
                     p->index, p->target.worker_id, p->exit_code);
  return NULL;
}

/* TF_CONFIG for task (type, index) of cluster (a JSON object). */
static char *tf_config(json_t *cluster, const char *type, int index) {
  json_t *t =
      json_pack("{s:O, s:{s:s, s:i}}", "cluster", cluster, "task", "type", type, "index", index);
  char *s = json_dumps(t, JSON_COMPACT);
  json_decref(t);
  return s;
}

/* Runs the command on every PS and worker through their exec channels, and
 * waits for the workers (PS processes are ended when the workers are done,
 * as a TensorFlow PS never ends by itself). */
void muster_run_exec_all_(struct run *run, const char *master, json_t *cluster) {
  const muster_run_opts *o = run->o;
  size_t nps = run->ps.count, nw = run->workers.count;
  struct proc *procs = calloc(nps + nw, sizeof(*procs));

  if (!procs) {
    muster_run_fail_(run, NULL, "out of memory");
    goto out;
  }
  for (size_t k = 0; k < nps + nw; k++) {
    struct proc *p = &procs[k];
    int is_ps = k < nps;
    const muster_worker *w = is_ps ? &run->ps.items[k] : &run->workers.items[k - nps];
    char *tf;

    p->run = run;
    p->role = is_ps ? "ps" : "worker";
    p->index = (int)(is_ps ? k : k - nps);
    snprintf(p->target.host, sizeof(p->target.host), "%s", w->ip_address);
    p->target.port = w->exec_port;
    snprintf(p->target.token, sizeof(p->target.token), "%s", run->exec_token);
    snprintf(p->target.worker_id, sizeof(p->target.worker_id), "%s", w->id);
    tf = tf_config(cluster, p->role, p->index);
    p->env[p->nenv++] = xasprintf("TF_CONFIG=%s", tf ? tf : "");
    p->env[p->nenv++] = xasprintf("MUSTER_CLUSTER=%s", tf ? tf : "");
    free(tf);
    p->env[p->nenv++] = xasprintf("MASTER_ADDR=%s", master);
    p->env[p->nenv++] = xasprintf("MASTER_PORT=%d", o->port);
    p->env[p->nenv++] = xasprintf("WORLD_SIZE=%zu", nw);
    p->env[p->nenv++] = xasprintf("RANK=%d", is_ps ? -1 : p->index);
    p->env[p->nenv++] = xasprintf("LOCAL_RANK=0");
    p->env[p->nenv++] = xasprintf("MUSTER_RESTART_COUNT=%d", run->attempt);
  }
  for (size_t k = 0; k < nps + nw; k++)
    procs[k].started = pthread_create(&procs[k].thread, NULL, exec_main, &procs[k]) == 0;
  /* The workers decide the outcome (each thread reports its own failure). */
  for (size_t k = nps; k < nps + nw; k++)
    if (procs[k].started) {
      pthread_join(procs[k].thread, NULL);
      procs[k].started = 0;
    }
  /* Done (or failed): the parameter servers go too. */
  run->cancel = 1;
  for (size_t k = 0; k < nps; k++)
    if (procs[k].started)
      pthread_join(procs[k].thread, NULL);
out:
  for (size_t k = 0; procs && k < nps + nw; k++)
    for (size_t i = 0; i < procs[k].nenv; i++)
      free(procs[k].env[i]);
  free(procs);
}
