/* check_rank_end.c: the ranks' end reports in mpirun's output, as muster run
 * takes them (sdk/lib/run_rank_end.c): the run names the rank that failed
 * first, with its cause, whatever its peers report after it. */
#include "run_internal.h"

#include "../check_run.h"

#include <check.h>
#include <stdio.h>
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

int main(void) {
  Suite *s = suite_create("rank_end");
  TCase *tc = tcase_create("take");

  tcase_add_test(tc, a_peers_later_exit_does_not_replace_a_stopped_ranks_report);
  tcase_add_test(tc, a_later_lost_connection_still_awaits_the_controller);
  tcase_add_test(tc, a_report_after_a_partial_line_leaves_no_dangling_tag);
  suite_add_tcase(s, tc);
  return check_run(s);
}
