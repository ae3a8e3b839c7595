/* check_run.h: runs a Check suite and gives main()'s exit status, for every
 * Check test (tests/unit, tests/blackbox). */
#ifndef MUSTER_CHECK_RUN_H
#define MUSTER_CHECK_RUN_H

#include <check.h>

/* Runs s (and frees it); 0 when every test passed, else 1. */
static inline int check_run(Suite *s) {
  SRunner *sr = srunner_create(s);
  int failed;

  srunner_run_all(sr, CK_NORMAL);
  failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? 1 : 0;
}

#endif
