/* check_fault.c: the fault-injection points of test builds (common/fault.h):
 * fail=N fails the first N times a point is reached, fail=N@K the N times
 * after the first K; a malformed count never fails; delay=MS*N sleeps the
 * first N times only. Each test runs in its
 * own process (Check forks), which reads MUSTER_FAULT at its first point.
 * Built in test builds only. */
#include "fault.h"

#include "../check_run.h"

#include <check.h>
#include <stdlib.h>
#include <time.h>

/* The first n results of point name, as a string of '0' and '1'. */
static const char *results(const char *name, int n) {
  static char out[32];

  for (int i = 0; i < n && i < (int)sizeof(out) - 1; i++)
    out[i] = FAULT_FAILS(name) ? '1' : '0';
  out[n] = '\0';
  return out;
}

START_TEST(fail_n_fails_the_first_n_times_and_fail_n_at_k_the_n_after_k) {
  setenv("MUSTER_FAULT", "first:fail=2,later:fail=2@3,bad:fail=1@x,zero:fail=0", 1);
  ck_assert_str_eq(results("first", 5), "11000");
  ck_assert_str_eq(results("later", 7), "0001100");
  ck_assert_str_eq(results("bad", 3), "000");
  ck_assert_str_eq(results("zero", 3), "000");
  ck_assert_str_eq(results("unnamed", 3), "000");
}
END_TEST

/* The seconds each of the first n passes through point name took. */
static void delays(const char *name, int n, double *out) {
  for (int i = 0; i < n; i++) {
    struct timespec a, b;

    clock_gettime(CLOCK_MONOTONIC, &a);
    FAULT_POINT(name);
    clock_gettime(CLOCK_MONOTONIC, &b);
    out[i] = (double)(b.tv_sec - a.tv_sec) + (double)(b.tv_nsec - a.tv_nsec) / 1e9;
  }
}

/* delay=MS sleeps every time, delay=MS*N the first N times only; a
 * malformed count never sleeps. */
START_TEST(delay_ms_star_n_sleeps_the_first_n_times) {
  double always[2], twice[4], bad[2];

  setenv("MUSTER_FAULT", "always:delay=300,twice:delay=300*2,bad:delay=300*x", 1);
  delays("always", 2, always);
  delays("twice", 4, twice);
  delays("bad", 2, bad);
  ck_assert_msg(always[0] >= 0.3 && always[1] >= 0.3, "delay=300 slept %.3f and %.3f s", always[0],
                always[1]);
  ck_assert_msg(twice[0] >= 0.3 && twice[1] >= 0.3 && twice[2] < 0.15 && twice[3] < 0.15,
                "delay=300*2 slept %.3f, %.3f, %.3f and %.3f s", twice[0], twice[1], twice[2],
                twice[3]);
  ck_assert_msg(bad[0] < 0.15 && bad[1] < 0.15, "delay=300*x slept %.3f and %.3f s", bad[0],
                bad[1]);
}
END_TEST

int main(void) {
  Suite *s = suite_create("fault");
  TCase *tc = tcase_create("fault");

  tcase_add_test(tc, fail_n_fails_the_first_n_times_and_fail_n_at_k_the_n_after_k);
  tcase_add_test(tc, delay_ms_star_n_sleeps_the_first_n_times);
  suite_add_tcase(s, tc);
  return check_run(s);
}
