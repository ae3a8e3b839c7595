/* check_slurm_fate.c: what becomes of a Slurm worker after a controller
 * restart (controller/slurm_fate.c), over its table of cases: the same
 * inputs give the same fate whichever path asks (the restart's own reading
 * of the queue, or the first poll that reads it). */
#include "slurm_internal.h"

#include "../check_run.h"

#include <check.h>
#include <string.h>

static const struct sq_job running = {100, 0, "RUNNING", "None", "n1", "muster:w-a:1"};
static const struct sq_job pending = {101, 0, "PENDING", "Resources", "", "muster:w-a:1"};
static const struct sq_job cancelled = {102, 0, "CANCELLED", "None", "n1", "muster:w-a:1"};
static const struct sq_job node_fail = {103, 0, "NODE_FAIL", "None", "n2", "muster:w-a:1"};
static const struct sb_acct acct_cancelled = {100, "CANCELLED", "0:15", "n1"};
static const struct sb_acct acct_failed = {100, "FAILED", "3:0", "n1"};

static struct sb_fate fate(int registered, const char *ref, const struct sq_job *job,
                           const struct sb_acct *acct) {
  struct sb_fate_in in = {registered, ref, job, acct};
  struct sb_fate f;

  sb_fate_decide(&in, &f);
  return f;
}

START_TEST(a_worker_whose_job_is_queued_or_running_is_adopted) {
  ck_assert_int_eq(fate(1, "100", &running, NULL).kind, SB_FATE_ADOPT);
  ck_assert_int_eq(fate(0, NULL, &pending, NULL).kind, SB_FATE_ADOPT);
  /* the queue outranks accounting */
  ck_assert_int_eq(fate(0, "100", &running, &acct_cancelled).kind, SB_FATE_ADOPT);
}
END_TEST

START_TEST(a_worker_whose_job_squeue_shows_ended_is_lost_with_slurms_sentence) {
  struct sb_fate f = fate(1, "102", &cancelled, NULL);

  ck_assert_int_eq(f.kind, SB_FATE_LOST);
  ck_assert_str_eq(f.why, "cancelled outside muster (Slurm: CANCELLED)");
  ck_assert_int_eq(f.from_acct, 0);
  f = fate(1, "103", &node_fail, NULL);
  ck_assert_int_eq(f.kind, SB_FATE_LOST);
  ck_assert_int_eq(f.node_fail, 1);
  ck_assert_str_eq(f.why, "node n2 failed (Slurm: NODE_FAIL)");
}
END_TEST

START_TEST(a_worker_whose_job_left_squeue_is_lost_with_saccts_account) {
  struct sb_fate f;

  /* running or only starting: its job ended, so it does not start again */
  for (int registered = 0; registered < 2; registered++) {
    f = fate(registered, "100", NULL, &acct_cancelled);
    ck_assert_int_eq(f.kind, SB_FATE_LOST);
    ck_assert_int_eq(f.from_acct, 1);
    ck_assert_str_eq(f.why, "cancelled outside muster (Slurm: CANCELLED)");
  }
  f = fate(1, "100", NULL, &acct_failed);
  ck_assert_int_eq(f.kind, SB_FATE_LOST);
  ck_assert_int_eq(f.output_of, 100);
  ck_assert_str_eq(f.why, "its Slurm job failed (Slurm: FAILED, exit code 3:0)");
}
END_TEST

START_TEST(a_running_worker_slurm_knows_no_job_of_is_lost) {
  struct sb_fate f = fate(1, "100", NULL, NULL);

  ck_assert_int_eq(f.kind, SB_FATE_LOST);
  ck_assert_str_eq(f.why, "lost: its muster-workerd (100) was gone when the controller restarted");
}
END_TEST

START_TEST(a_never_queued_worker_gets_a_new_attempt) {
  /* scheduling (no ref) or starting (its job id recorded, no workerd yet) */
  ck_assert_int_eq(fate(0, NULL, NULL, NULL).kind, SB_FATE_RESTART);
  ck_assert_int_eq(fate(0, "100", NULL, NULL).kind, SB_FATE_RESTART);
}
END_TEST

START_TEST(a_worker_is_matched_with_the_job_that_names_its_attempt) {
  const struct sq_job q[] = {
      {200, 0, "RUNNING", "None", "n1", "muster:w-b:1,w-a:2"},
      {201, 0, "PENDING", "JobHeldUser", "", "muster:w-c:1"},
      {202, 0, "PENDING", "Resources", "", "muster:w-c:1"},
      {203, 0, "CANCELLED", "None", "", "muster:w-d:1"},
      {204, 0, "RUNNING", "None", "", "muster:w-d:1"},
      {205, 205, "RUNNING", "None", "", "muster:w-e:1"},
      {206, 205, "RUNNING", "None", "", "muster:w-e:1"},
      {207, 0, "RUNNING", "None", "", "other:w-f:1"},
  };
  size_t nq = sizeof(q) / sizeof(q[0]);

  ck_assert_int_eq(sb_fate_job_of(q, nq, "w-a", 2), 0);
  ck_assert_int_eq(sb_fate_job_of(q, nq, "w-a", 1), -1); /* another attempt */
  ck_assert_int_eq(sb_fate_job_of(q, nq, "w-b", 1), 0);
  ck_assert_int_eq(sb_fate_job_of(q, nq, "w-c", 1), 2); /* not the held copy */
  ck_assert_int_eq(sb_fate_job_of(q, nq, "w-d", 1), 4); /* not the ended one */
  ck_assert_int_eq(sb_fate_job_of(q, nq, "w-e", 1), 5); /* the leader */
  ck_assert_int_eq(sb_fate_job_of(q, nq, "w-f", 1), -1);
  ck_assert_int_eq(sb_fate_job_of(q, 0, "w-a", 2), -1);
}
END_TEST

int main(void) {
  Suite *s = suite_create("slurm_fate");
  TCase *tc = tcase_create("fates");

  tcase_add_test(tc, a_worker_whose_job_is_queued_or_running_is_adopted);
  tcase_add_test(tc, a_worker_whose_job_squeue_shows_ended_is_lost_with_slurms_sentence);
  tcase_add_test(tc, a_worker_whose_job_left_squeue_is_lost_with_saccts_account);
  tcase_add_test(tc, a_running_worker_slurm_knows_no_job_of_is_lost);
  tcase_add_test(tc, a_never_queued_worker_gets_a_new_attempt);
  tcase_add_test(tc, a_worker_is_matched_with_the_job_that_names_its_attempt);
  suite_add_tcase(s, tc);
  return check_run(s);
}
