/* check_rank_end.c: the ranks' end reports in mpirun's output, as muster run
 * takes them (sdk/lib/run_rank_end.c): the run names the rank that failed
 * first, with its cause, whatever its peers report after it. */
#include "run_internal.h"

#include "../check_run.h"

#include <check.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MARKER "muster-rank-end-0123456789abcdef"

static struct rank_ends ends;
static struct proc p;
static char line[512];

static void fresh(void) {
  memset(&ends, 0, sizeof(ends));
  memset(&p, 0, sizeof(p));
  snprintf(ends.marker, sizeof(ends.marker), "%s", MARKER);
  p.take_arg = &ends;
}

/* Passes text as one stderr line of mpirun; returns 1 if it was taken
 * whole, else 0 with what is handed out left in line. */
static int take(const char *text) {
  size_t len;

  snprintf(line, sizeof(line), "%s", text);
  len = strlen(line);
  if (muster_run_take_rank_end_(&p, 1, line, &len))
    return 1;
  ck_assert_uint_eq(len, strlen(line));
  return 0;
}

/* Rank 1's worker is stopped (SIGTERM reaches its command); rank 0 then
 * exits 1 when its gloo connection resets. The run names rank 1, and waits
 * for the controller's word on its worker. */
START_TEST(a_peers_later_exit_does_not_replace_a_stopped_ranks_report) {
  fresh();
  ck_assert_int_eq(take("[1,1]<stderr>:" MARKER " 1 signal 15"), 1);
  ck_assert_int_eq(take("[1,0]<stderr>:" MARKER " 0 exit 1"), 1);
  ck_assert_int_eq(ends.seen, 1);
  ck_assert_int_eq(ends.rank, 1);
  ck_assert_str_eq(ends.kind, "signal");
  ck_assert_int_eq(ends.n, 15);
  ck_assert_int_eq(ends.outside, 1);
}
END_TEST

/* The other way round: a rank's own exit first, a peer's lost connection
 * after it. The exit stays the cause; the wait for the controller still
 * comes (a worker may have died). */
START_TEST(a_later_lost_connection_still_awaits_the_controller) {
  fresh();
  ck_assert_int_eq(take("[1,0]<stderr>:" MARKER " 0 exit 3"), 1);
  ck_assert_int_eq(ends.outside, 0);
  ck_assert_int_eq(take("[1,1]<stderr>:" MARKER " 1 lost 0 the connection broke"), 1);
  ck_assert_int_eq(ends.rank, 0);
  ck_assert_str_eq(ends.kind, "exit");
  ck_assert_int_eq(ends.n, 3);
  ck_assert_int_eq(ends.outside, 1);
}
END_TEST

/* A report after a rank's unended line: that line is handed out without
 * the report's own tag. */
START_TEST(a_report_after_a_partial_line_leaves_no_dangling_tag) {
  fresh();
  ck_assert_int_eq(take("[1,0]<stderr>:progress 10%[1,1]<stderr>:" MARKER " 1 exit 2"), 0);
  ck_assert_str_eq(line, "[1,0]<stderr>:progress 10%");
  ck_assert_int_eq(take("[1,1]<stderr>:epoch 3" MARKER " 1 exit 2"), 0);
  ck_assert_str_eq(line, "[1,1]<stderr>:epoch 3");
  ck_assert_int_eq(take("[1,1]<stderr>:no report here"), 0);
  ck_assert_str_eq(line, "[1,1]<stderr>:no report here");
}
END_TEST

/* A report cut short (no kind, no number) is no report, and its marker is
 * not handed out to the user either. */
START_TEST(a_report_cut_short_never_reaches_the_output) {
  fresh();
  ck_assert_int_eq(take("[1,1]<stderr>:" MARKER " 1 exi"), 1);
  ck_assert_int_eq(ends.seen, 0);
  ck_assert_int_eq(take("[1,1]<stderr>:step 9" MARKER), 0);
  ck_assert_str_eq(line, "[1,1]<stderr>:step 9");
}
END_TEST

/* What muster run's output callback got. */
static char *got[8];
static size_t ngot;

static void on_output(void *arg, const char *role, int index, muster_stream stream,
                      const char *text, size_t len) {
  (void)arg, (void)role, (void)index, (void)stream;
  if (ngot < 8)
    got[ngot++] = strndup(text, len);
}

/* A rank's stderr with no newline for 64 KiB (a progress bar), then its
 * report: the cut for the line's length falls inside the marker. The
 * report is still taken whole, and no line handed out holds the marker. */
START_TEST(a_report_at_a_long_lines_cut_is_still_taken) {
  static struct proc mp;
  static struct run run;
  static char data[LINE_MAX_BYTES + 100];
  muster_run_opts o;
  muster_run_result r;
  size_t n = LINE_MAX_BYTES - 1 - 20;

  fresh();
  memset(&mp, 0, sizeof(mp));
  memset(&run, 0, sizeof(run));
  memset(&r, 0, sizeof(r));
  muster_run_opts_init(&o);
  o.on_output = on_output;
  run.o = &o;
  run.r = &r;
  pthread_mutex_init(&run.lock, NULL);
  mp.run = &run;
  mp.role = "mpirun";
  mp.take_line = muster_run_take_rank_end_;
  mp.take_arg = &ends;
  mp.keep_whole = ends.marker;
  memset(data, 'x', n);
  n += (size_t)snprintf(data + n, sizeof(data) - n, "%s 1 exit 3\n", MARKER);
  muster_run_emit_(&mp, 1, data, n);
  muster_run_flush_lines_(&mp);
  ck_assert_int_eq(ends.seen, 1);
  ck_assert_int_eq(ends.rank, 1);
  ck_assert_str_eq(ends.kind, "exit");
  ck_assert_int_eq(ends.n, 3);
  for (size_t i = 0; i < ngot; i++) {
    ck_assert_msg(!strstr(got[i], "muster-rank-end"), "line %zu holds the marker", i);
    free(got[i]);
  }
  ck_assert_uint_ge(ngot, 1);
  pthread_mutex_destroy(&run.lock);
}
END_TEST

int main(void) {
  Suite *s = suite_create("rank_end");
  TCase *tc = tcase_create("take");

  tcase_add_test(tc, a_peers_later_exit_does_not_replace_a_stopped_ranks_report);
  tcase_add_test(tc, a_later_lost_connection_still_awaits_the_controller);
  tcase_add_test(tc, a_report_after_a_partial_line_leaves_no_dangling_tag);
  tcase_add_test(tc, a_report_cut_short_never_reaches_the_output);
  tcase_add_test(tc, a_report_at_a_long_lines_cut_is_still_taken);
  suite_add_tcase(s, tc);
  return check_run(s);
}
