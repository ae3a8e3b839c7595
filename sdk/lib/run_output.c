/* run_output.c: a run's processes' output, cut into lines for the
 * on_output callback, with the last stdout line of worker 0 / rank 0 kept
 * as the run's summary. */
#include "muster.h"
#include "run_internal.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

/* Hands out one whole line (len bytes) of p's output, remembering worker
 * 0's / rank 0's last stdout line (the trainer's summary). */
static void hand_out(struct proc *p, int is_err, const char *buf, size_t len) {
  struct run *run = p->run;

  pthread_mutex_lock(&run->lock);
  if (run->o->on_output)
    run->o->on_output(run->o->arg, p->role, p->index, is_err ? MUSTER_STDERR : MUSTER_STDOUT, buf,
                      len);
  if (!is_err && strcmp(p->role, "ps") != 0) {
    const char *text = buf;
    /* mpirun --tag-output: "[1,0]<stdout>:line" is rank 0's line. */
    if (strcmp(p->role, "mpirun") == 0) {
      const char *tag = strstr(buf, "<stdout>:");
      text = strncmp(buf, "[1,0]", 5) == 0 && tag ? tag + 9 : NULL;
    } else if (p->index != 0) {
      text = NULL;
    }
    if (text && *text) {
      free(run->last_line);
      run->last_line = strdup(text);
    }
  }
  pthread_mutex_unlock(&run->lock);
}

/* Cuts a process's output into lines and hands them out, less those its
 * take_line takes. */
void muster_run_emit_(struct proc *p, int is_err, const char *data, size_t len) {
  size_t *n = &p->linelen[is_err];
  char *buf = p->line[is_err];

  for (size_t i = 0; i < len; i++) {
    int full = *n == LINE_MAX_BYTES - 1;
    if (data[i] != '\n' && !full) {
      buf[(*n)++] = data[i];
      continue;
    }
    buf[*n] = '\0';
    if (!p->take_line || !p->take_line(p, is_err, buf, n))
      hand_out(p, is_err, buf, *n);
    *n = 0;
    if (full && data[i] != '\n')
      buf[(*n)++] = data[i];
  }
}

void muster_run_flush_lines_(struct proc *p) {
  if (p->linelen[0])
    muster_run_emit_(p, 0, "\n", 1);
  if (p->linelen[1])
    muster_run_emit_(p, 1, "\n", 1);
}
