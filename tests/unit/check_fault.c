/* check_fault.c: the fault-injection points of test builds (common/fault.h):
 * fail=N fails the first N times a point is reached, fail=N@K the N times
 * after the first K; a malformed count never fails. Each test runs in its
 * own process (Check forks), which reads MUSTER_FAULT at its first point.
 * Built in test builds only. */
#include "fault.h"

#include "../check_run.h"

#include <check.h>
#include <stdlib.h>

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

int main(void) {
  Suite *s = suite_create("fault");
  TCase *tc = tcase_create("fault");

  tcase_add_test(tc, fail_n_fails_the_first_n_times_and_fail_n_at_k_the_n_after_k);
  suite_add_tcase(s, tc);
  return check_run(s);
}
