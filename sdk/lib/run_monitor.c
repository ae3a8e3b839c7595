/* run_monitor.c: the event stream followed while a run's command runs:
 * one of its workers failing, or stopped by someone else, fails the run. */
#include "muster.h"
#include "run_internal.h"

#include <stddef.h>
#include <string.h>

static int watch(void *arg, const muster_event *e) {
  struct monitor *m = arg;
  struct run *run = m->run;
  muster_worker_list *lists[2] = {&run->ps, &run->workers};

  if (e->to != MUSTER_FAILED && e->to != MUSTER_STOPPED)
    return run->cancel;
  for (int k = 0; k < 2; k++)
    for (size_t i = 0; i < lists[k]->count; i++)
      if (strcmp(lists[k]->items[i].id, e->worker_id) == 0 && !run->cancel) {
        /* A stop is someone's decision to end the run: no restart. */
        if (e->to == MUSTER_STOPPED)
          run->final = 1;
        /* The event's detail is the worker's failure sentence (the client
         * is busy streaming: no other call on it from here). */
        muster_run_fail_(run, e->worker_id, "%s %zu (%s) %s: %s", k ? "worker" : "ps", i,
                         e->worker_id, e->to == MUSTER_FAILED ? "failed" : "was stopped",
                         e->detail && e->detail[0] ? e->detail : muster_status_name(e->to));
      }
  return run->cancel;
}

void *muster_run_monitor_main_(void *arg) {
  struct monitor *m = arg;

  if (muster_events(m->c, m->since, watch, m) != 0 && !m->run->cancel)
    muster_run_fail_(m->run, NULL, "lost the controller's event stream: %s",
                     muster_client_errmsg(m->c));
  return NULL;
}
