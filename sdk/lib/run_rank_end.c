/* run_rank_end.c: the ranks' end reports (common/rank_end.h) taken out of
 * mpirun's output: the first one kept, and whether any may be the mark of
 * a stop from outside. */
#include "run_internal.h"

#include <signal.h>
#include <stdio.h>
#include <string.h>

/* Whether a rank's end may be the mark of something done to it from
 * outside (its exec connection lost, SIGTERM, SIGKILL: what a stop of the
 * worker, an expired lease or the OOM killer sends), which the controller
 * names better moments later. mpirun's own teardown of the other ranks
 * gives no report at all: it kills their muster rank, which writes none. */
static int end_from_outside(const char *kind, int n) {
  return strcmp(kind, "lost") == 0 ||
         (strcmp(kind, "signal") == 0 && (n == SIGTERM || n == SIGKILL));
}

int muster_run_take_rank_end_(struct proc *p, int is_err, char *line, size_t *len) {
  struct rank_ends *e = p->take_arg;
  char *at = is_err ? strstr(line, e->marker) : NULL, *tag = NULL, *cut, kind[8];
  long rank;
  int n, off = 0;

  if (!at)
    return 0;
  /* A report cut short is no report, but the marker never goes out. */
  if (sscanf(at + strlen(e->marker), " %ld %7s %d %n", &rank, kind, &n, &off) >= 3) {
    if (end_from_outside(kind, n))
      e->outside = 1;
    if (!e->seen) {
      e->seen = 1;
      e->rank = rank;
      e->n = n;
      snprintf(e->kind, sizeof(e->kind), "%s", kind);
      snprintf(e->text, sizeof(e->text), "%s", off ? at + strlen(e->marker) + off : "");
    }
  }
  /* The last tag before the report: the report's own if right before it. */
  for (char *t = strstr(line, "<stderr>:"); t && t + 9 <= at; t = strstr(t + 9, "<stderr>:"))
    tag = t;
  cut = at;
  if (tag && tag + 9 == at) {
    cut = tag;
    while (cut > line && *cut != '[')
      cut--;
  }
  if (cut == line)
    return 1;
  *cut = '\0';
  *len = (size_t)(cut - line);
  return 0;
}
