/*
 * report.c: the end of a worker: its last output shipped, then its exit
 * reported, as steps the main loop drives (never waiting itself).
 *
 * The report comes after the last output, since it tells a followed log
 * that it is whole. How hard it tries depends on why the worker ends:
 *   - its command ended by itself: the result must not be lost, so both are
 *     retried with backoff for 10 minutes, or MUSTER_ORPHAN_TIMEOUT if
 *     longer (the controller may be restarting);
 *   - SIGTERM or SIGINT stopped it (a Slurm cancel, a node shutdown, the
 *     local backend's stop): whoever sent it waits for the worker to end
 *     within the stop grace, so the report gets until 5 s after the signal
 *     (1 s at least) and no second try; the controller's reconcile learns the
 *     rest, as after a crash. A signal during those retries cuts them to
 *     that; a second one ends the report at once;
 *   - the controller asked it to stop: one try each, 10 s at most (it knows
 *     the outcome; the report only says that the output is all in);
 *   - the controller no longer knows it: nothing is said.
 */
#include "workerd.h"

#include "fault.h"
#include "log.h"
#include "muster_errors.h"
#include "util.h"

#include <jansson.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#define REPORT_MIN_MS 1000 /* the least a signalled report gets */

static struct {
  enum { RS_SHIP, RS_EXIT, RS_DONE } state;
  char *body;
  struct call call;
  struct backoff backoff;
  int64_t retry_at_ms;
  int64_t deadline_ms;
  bool one_try;        /* a failure ends the step it is in */
  bool signalled;      /* a signal has cut the report short */
  int64_t try_from_ms; /* one try: log POSTs started since count */
} rp;

/* Builds the exit report: exit code, or signal, and the reason the command
 * could not start if that is what happened. Returns a new string (free()),
 * or NULL if out of memory. */
static char *exit_body(void) {
  json_t *o = json_object();
  json_t *code = NULL, *sig = NULL, *reason = NULL;
  char *s = NULL;

  if (!o)
    goto out;
  if (wd.child_done && wd.wait_status >= 0 && WIFEXITED(wd.wait_status))
    code = json_integer(WEXITSTATUS(wd.wait_status));
  else if (wd.child_done && wd.wait_status >= 0 && WIFSIGNALED(wd.wait_status))
    sig = json_integer(WTERMSIG(wd.wait_status));
  else if (!wd.child_done && wd.stop_signal)
    sig = json_integer(wd.stop_signal); /* an idle worker killed by a signal */
  /* The controller's own stops never need a reason (the worker is stopped
   * already and this report changes nothing). A signal from anyone else
   * (a scancel, a node shutdown, a kill by hand) reaches workerd and the
   * script together: say so, rather than only that the script was killed. */
  if (!wd.reason[0] && wd.term_received && !code)
    snprintf(wd.reason, sizeof(wd.reason),
             MUSTER_OUTSIDE_STOP ": muster-workerd was sent %s (a Slurm cancel, a node "
                                 "shutdown or a kill)",
             wd.term_received == SIGTERM ? "SIGTERM" : "SIGINT");
  reason = wd.reason[0] ? json_string(wd.reason) : json_null();
  if (json_object_set_new(o, "exit_code", code ? code : json_null()) != 0 ||
      json_object_set_new(o, "signal", sig ? sig : json_null()) != 0 ||
      json_object_set_new(o, "reason", reason) != 0)
    goto out;
  s = json_dumps(o, JSON_COMPACT);
out:
  json_decref(o);
  return s;
}

/* Cuts the report to the stop grace after a signal at now: until
 * now + 5 s (but REPORT_MIN_MS at least from the start), no second try. */
static void report_cut(int64_t signal_ms, int64_t now) {
  int64_t until = signal_ms + WD_KILL_GRACE_MS;

  if (until < now + REPORT_MIN_MS)
    until = now + REPORT_MIN_MS;
  if (until < rp.deadline_ms)
    rp.deadline_ms = until;
  rp.one_try = true;
  rp.signalled = true;
  rp.try_from_ms = now; /* the one try starts now */
  /* A try waiting for its backoff goes now: it is the last. */
  rp.retry_at_ms = now;
  wd.logs_retry_at_ms = now;
}

/* Begins the end, as wd.mode says, once the command is over and the exec
 * channel closed (nothing more can reach the streams). Returns 0 or
 * MUSTER_E_NOMEM. */
MUST_CHECK int report_begin(int64_t now) {
  rp.try_from_ms = now;
  if (wd.mode == FINISH_SILENT) {
    rp.state = RS_DONE;
    return 0;
  }
  if (!(rp.body = exit_body()))
    return MUSTER_E_NOMEM;
  rp.state = RS_SHIP;
  backoff_init(&rp.backoff);
  /* (a user who set a longer MUSTER_ORPHAN_TIMEOUT, so that workers ride
   * out a longer outage of the controller, gets their results after it:
   * until the timeout from the time away began, as the heartbeats that
   * end here would have judged it, 10 minutes from now at least) */
  {
    int64_t orphan_end = (wd.away_since_ms ? wd.away_since_ms : now) + wd.orphan_ms;

    if (orphan_end > rp.backoff.give_up_ms)
      rp.backoff.give_up_ms = orphan_end;
  }
  rp.deadline_ms = rp.backoff.give_up_ms;
  if (wd.mode == FINISH_QUIET) {
    rp.deadline_ms = now + WD_CALL_TIMEOUT_MS;
    rp.one_try = true;
  }
  if (wd.term_received)
    report_cut(wd.term_at_ms, now);
  return 0;
}

/* SIGTERM or SIGINT came while the report runs: the first cuts it to the
 * stop grace, a second ends it now. */
void report_signal(int64_t now) {
  if (rp.signalled)
    rp.deadline_ms = now;
  else
    report_cut(now, now);
}

/* Ends the report without what is left of it; why says what failed. A
 * quiet end was only a courtesy (REPORT_DONE: the controller stopped the
 * worker and has its outcome); any other is given up (REPORT_GAVE_UP: the
 * controller's reconcile learns how the worker ended). */
static enum report_result report_abandon(const char *why) {
  streams_cancel();
  call_cancel(&rp.call);
  rp.state = RS_DONE;
  if (wd.mode == FINISH_QUIET && !rp.signalled) {
    LOG(LOG_INFO, "%s; the controller, which stopped this worker, has its outcome", why);
    return REPORT_DONE;
  }
  LOG(LOG_WARN, "%s; ending without the exit report", why);
  return REPORT_GAVE_UP;
}

/* The answer to the exit report, taken: REPORT_DONE when the controller
 * took it or already had the worker finished (a 4xx), REPORT_BUSY with a
 * retry planned, else what report_abandon() says. */
static enum report_result exit_answer(int64_t now) {
  long status;
  int rc = call_take(&rp.call, &status);

  if (rc == 0 && status >= 200 && status < 300) {
    LOG(LOG_INFO, "reported the exit: %s", rp.body);
    rp.state = RS_DONE;
    return REPORT_DONE;
  }
  if (rc == 0 && status < 500) {
    LOG(LOG_INFO, "the controller already considers this worker finished (HTTP %ld)", status);
    rp.state = RS_DONE;
    return REPORT_DONE;
  }
  if (rp.one_try)
    return report_abandon("the controller did not take the exit report");
  rp.retry_at_ms = backoff_next(&rp.backoff, now);
  if (rp.retry_at_ms == INT64_MAX)
    return report_abandon("could not report the exit in time (10 minutes, or "
                          "MUSTER_ORPHAN_TIMEOUT if longer)");
  return REPORT_BUSY;
}

/* Moves the end on: ships the streams until they are empty, then reports
 * the exit. Never waits. Returns REPORT_BUSY, REPORT_DONE, or
 * REPORT_GAVE_UP (time ran out, a call failed after a signal; logged). */
enum report_result report_step(int64_t now) {
  if (rp.state == RS_DONE)
    return REPORT_DONE;
  /* (tests: the loop comes to the exit report's answer only at its
   * deadline, as a loaded host may make it) */
  if (rp.call.state == CALL_DONE && now < rp.deadline_ms && FAULT_FAILS("workerd_exit_answer_late"))
    now = rp.deadline_ms;
  /* An answer that came is taken, whatever the time: a report the
   * controller took is not given up. */
  if (rp.call.state == CALL_DONE)
    return exit_answer(now);
  if (now >= rp.deadline_ms) {
    if (rp.signalled)
      return report_abandon("no answer from the controller within the stop grace");
    if (wd.mode == FINISH_QUIET)
      return report_abandon("no answer from the controller in 10 s");
    return report_abandon("no answer from the controller in time (10 minutes, or "
                          "MUSTER_ORPHAN_TIMEOUT if longer)");
  }
  if (rp.state == RS_SHIP) {
    /* After a failed try, no report either: it would mark the log whole
     * without its end. */
    if (rp.one_try && wd.logs_failed_ms >= rp.try_from_ms)
      return report_abandon("the last output of the command could not be shipped");
    if (rp.one_try)
      wd.logs_retry_at_ms = now; /* a POST from before the try failed: it is the try */
    streams_ship(now, true);
    if (!streams_idle())
      return REPORT_BUSY;
    rp.state = RS_EXIT;
    rp.retry_at_ms = now;
  }
  if (rp.call.state == CALL_IDLE && now >= rp.retry_at_ms &&
      call_start(&rp.call, "exit", true, rp.body, strlen(rp.body), rp.deadline_ms - now) != 0) {
    LOG(LOG_ERROR, "cannot make the exit report's call: out of memory");
    return report_abandon("out of memory");
  }
  return REPORT_BUSY;
}

/* When report_step() must next run if no socket moves before. */
int64_t report_deadline(void) {
  int64_t next = rp.state == RS_DONE ? INT64_MAX : rp.deadline_ms;

  if (rp.state == RS_EXIT && rp.call.state == CALL_IDLE && rp.retry_at_ms < next)
    next = rp.retry_at_ms;
  if (rp.state == RS_SHIP && streams_deadline() < next)
    next = streams_deadline();
  return next;
}

/* Frees the report's body and abandons its call. */
void report_cleanup(void) {
  call_cancel(&rp.call);
  free(rp.body);
  rp.body = NULL;
}
