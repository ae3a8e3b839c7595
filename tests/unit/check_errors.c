/* check_errors.c: the error table stays consistent in every direction. */
#include "muster_errors.h"

#include "../check_run.h"

#include <check.h>
#include <string.h>

START_TEST(names_map_back_to_codes) {
#define X(sym, num, name, status, msg)                                                             \
  ck_assert_int_eq(muster_error_from_name(name), MUSTER_E_##sym);                                  \
  ck_assert_str_eq(muster_error_name(MUSTER_E_##sym), name);                                       \
  ck_assert_str_eq(muster_strerror(MUSTER_E_##sym), msg);                                          \
  ck_assert_int_eq(muster_error_http_status(MUSTER_E_##sym), status);                              \
  ck_assert_int_lt(MUSTER_E_##sym, 0);
  MUSTER_ERRORS(X)
#undef X
}
END_TEST

START_TEST(unknown_values_are_harmless) {
  ck_assert_str_eq(muster_strerror(-9999), "unknown error");
  ck_assert_str_eq(muster_error_name(-9999), "unknown_error");
  ck_assert_int_eq(muster_error_http_status(-9999), 500);
  ck_assert_int_eq(muster_error_from_name("no_such_error"), MUSTER_E_PROTOCOL);
  ck_assert_int_eq(muster_error_from_name(NULL), MUSTER_E_PROTOCOL);
  ck_assert_str_eq(muster_strerror(MUSTER_OK), "success");
}
END_TEST

START_TEST(http_statuses_of_design) {
  ck_assert_int_eq(muster_error_http_status(MUSTER_E_MALFORMED), 400);
  ck_assert_int_eq(muster_error_http_status(MUSTER_E_UNAUTHORIZED), 401);
  ck_assert_int_eq(muster_error_http_status(MUSTER_E_FORBIDDEN), 403);
  ck_assert_int_eq(muster_error_http_status(MUSTER_E_NOT_FOUND), 404);
  ck_assert_int_eq(muster_error_http_status(MUSTER_E_CONFLICT), 409);
  ck_assert_int_eq(muster_error_http_status(MUSTER_E_TOO_LARGE), 413);
  ck_assert_int_eq(muster_error_http_status(MUSTER_E_INVALID), 422);
  ck_assert_int_eq(muster_error_http_status(MUSTER_E_SHUTTING_DOWN), 503);
}
END_TEST

int main(void) {
  Suite *s = suite_create("errors");
  TCase *tc = tcase_create("table");

  tcase_add_test(tc, names_map_back_to_codes);
  tcase_add_test(tc, unknown_values_are_harmless);
  tcase_add_test(tc, http_statuses_of_design);
  suite_add_tcase(s, tc);
  return check_run(s);
}
