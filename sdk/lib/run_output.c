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

  muster_run_note_output_(run);
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

/* The fields that may follow a keep_whole string on its line, at most. */
#define KEEP_FIELDS_MAX 64

/* How many bytes at the end of buf (n bytes) are keep, or its start, and
 * its fields: they go into the next line. 0 if none. */
static size_t kept_tail(const char *buf, size_t n, const char *keep) {
  size_t k = keep ? strlen(keep) : 0;

  if (k == 0)
    return 0;
  for (size_t j = n > k + KEEP_FIELDS_MAX ? n - k - KEEP_FIELDS_MAX : 0; j < n; j++)
    if (memcmp(buf + j, keep, n - j < k ? n - j : k) == 0)
      return n - j;
  return 0;
}

/* Cuts a process's output into lines and hands them out, less those its
 * take_line takes. A line longer than LINE_MAX_BYTES - 1 is cut there,
 * short of p->keep_whole. */
void muster_run_emit_(struct proc *p, int is_err, const char *data, size_t len) {
  size_t *n = &p->linelen[is_err];
  char *buf = p->line[is_err];

  for (size_t i = 0; i < len; i++) {
    int full = *n == LINE_MAX_BYTES - 1;
    size_t carry, out;
    char first;

    if (data[i] != '\n' && !full) {
      buf[(*n)++] = data[i];
      continue;
    }
    carry = full && data[i] != '\n' ? kept_tail(buf, *n, p->keep_whole) : 0;
    out = *n - carry;
    first = buf[out];
    buf[out] = '\0';
    if (!p->take_line || !p->take_line(p, is_err, buf, &out))
      hand_out(p, is_err, buf, out);
    if (carry) {
      buf[*n - carry] = first;
      memmove(buf, buf + *n - carry, carry);
    }
    *n = carry;
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
