/* check_validate.c: launch and await bodies are checked field by field. */
#include "muster_errors.h"
#include "resources.h"
#include "users.h"
#include "validate.h"

#include "../check_run.h"

#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int launch(const char *text, const char **field, char *msg, size_t msglen) {
  struct launch_req lr;
  json_t *body = json_loads(text, 0, NULL);
  int rc;

  ck_assert_ptr_nonnull(body);
  rc = validate_launch(body, &lr, field, msg, msglen);
  json_decref(body);
  return rc;
}

#define EXPECT_FIELD(text, code, name)                                                             \
  do {                                                                                             \
    const char *field = NULL;                                                                      \
    char msg[512];                                                                                 \
    ck_assert_int_eq(launch(text, &field, msg, sizeof(msg)), code);                                \
    ck_assert_ptr_nonnull(field);                                                                  \
    ck_assert_str_eq(field, name);                                                                 \
    ck_assert_ptr_nonnull(strstr(msg, name));                                                      \
  } while (0)

START_TEST(defaults_are_those_of_design) {
  struct launch_req lr;
  const char *field;
  char msg[256];
  json_t *body = json_loads("{\"n\": 3}", 0, NULL);

  ck_assert_int_eq(validate_launch(body, &lr, &field, msg, sizeof(msg)), 0);
  ck_assert_int_eq(lr.n, 3);
  ck_assert(lr.cpu == 1 && lr.memory == 1 && lr.nvidia_gpu == 0);
  ck_assert_str_eq(lr.kernel, "python3");
  ck_assert_str_eq(lr.session, "default");
  ck_assert_str_eq(lr.role, "worker");
  ck_assert_ptr_null(lr.script);
  json_decref(body);
}
END_TEST

START_TEST(bad_fields_are_named) {
  EXPECT_FIELD("{}", MUSTER_E_INVALID, "n");
  EXPECT_FIELD("{\"n\": 0}", MUSTER_E_INVALID, "n");
  EXPECT_FIELD("{\"n\": 1025}", MUSTER_E_INVALID, "n");
  EXPECT_FIELD("{\"n\": 1.5}", MUSTER_E_INVALID, "n");
  EXPECT_FIELD("{\"n\": \"2\"}", MUSTER_E_INVALID, "n");
  EXPECT_FIELD("{\"n\": 1, \"cpu\": -0.5}", MUSTER_E_INVALID, "cpu");
  EXPECT_FIELD("{\"n\": 1, \"cpu\": \"1\"}", MUSTER_E_INVALID, "cpu");
  EXPECT_FIELD("{\"n\": 1, \"memory\": -1}", MUSTER_E_INVALID, "memory");
  /* A 0 or a tiny number was an unlimited container that admission counted
   * as free; a huge one overflowed what Slurm was asked for. */
  EXPECT_FIELD("{\"n\": 1, \"cpu\": 0}", MUSTER_E_INVALID, "cpu");
  EXPECT_FIELD("{\"n\": 1, \"cpu\": 0.001}", MUSTER_E_INVALID, "cpu");
  EXPECT_FIELD("{\"n\": 1, \"cpu\": 3e9}", MUSTER_E_INVALID, "cpu");
  EXPECT_FIELD("{\"n\": 1, \"memory\": 0}", MUSTER_E_INVALID, "memory");
  EXPECT_FIELD("{\"n\": 1, \"memory\": 0.001}", MUSTER_E_INVALID, "memory");
  EXPECT_FIELD("{\"n\": 1, \"memory\": 1e17}", MUSTER_E_INVALID, "memory");
  EXPECT_FIELD("{\"n\": 1, \"nvidia_gpu\": -1}", MUSTER_E_INVALID, "nvidia_gpu");
  EXPECT_FIELD("{\"n\": 1, \"script\": 5}", MUSTER_E_INVALID, "script");
  EXPECT_FIELD("{\"n\": 1, \"args\": [1]}", MUSTER_E_INVALID, "args");
  EXPECT_FIELD("{\"n\": 1, \"env\": {\"A\": 1}}", MUSTER_E_INVALID, "env");
  EXPECT_FIELD("{\"n\": 1, \"env\": {\"A-B\": \"x\"}}", MUSTER_E_INVALID, "env");
  EXPECT_FIELD("{\"n\": 1, \"secret_env\": []}", MUSTER_E_INVALID, "secret_env");
  EXPECT_FIELD("{\"n\": 1, \"command\": []}", MUSTER_E_INVALID, "command");
  EXPECT_FIELD("{\"n\": 1, \"session\": \"a b\"}", MUSTER_E_INVALID, "session");
  EXPECT_FIELD("{\"n\": 1, \"role\": \"\"}", MUSTER_E_INVALID, "role");
  EXPECT_FIELD("{\"n\": 1, \"kernel\": \"py thon\"}", MUSTER_E_INVALID, "kernel");
  EXPECT_FIELD("{\"n\": 1, \"code\": \"x\", \"kernel\": \"java\"}", MUSTER_E_INVALID, "kernel");
  EXPECT_FIELD("{\"n\": 1, \"script\": \"a.py\", \"command\": [\"x\"]}", MUSTER_E_INVALID,
               "command");
}
END_TEST

/* Where the workers start: an absolute directory, bounded (a NUL never
 * gets this far: the API's parser refuses it); "" is not given. */
START_TEST(a_launchs_cwd_is_an_absolute_bounded_directory) {
  struct launch_req lr;
  const char *field;
  char msg[512], *big, *text;
  json_t *body;

  EXPECT_FIELD("{\"n\": 1, \"cwd\": \"project\"}", MUSTER_E_INVALID, "cwd");
  EXPECT_FIELD("{\"n\": 1, \"cwd\": \"~/project\"}", MUSTER_E_INVALID, "cwd");
  EXPECT_FIELD("{\"n\": 1, \"cwd\": 7}", MUSTER_E_INVALID, "cwd");
  EXPECT_FIELD("{\"n\": 1, \"path\": [\"/bin\"]}", MUSTER_E_INVALID, "path");
  big = malloc(5000);
  memset(big, 'a', 4999);
  big[0] = '/';
  big[4999] = '\0';
  text = malloc(5100);
  snprintf(text, 5100, "{\"n\": 1, \"cwd\": \"%s\"}", big);
  EXPECT_FIELD(text, MUSTER_E_INVALID, "cwd");
  free(text);
  free(big);

  body = json_loads("{\"n\": 1, \"cwd\": \"/home/u/project\", \"path\": \"/a:/b\"}", 0, NULL);
  ck_assert_int_eq(validate_launch(body, &lr, &field, msg, sizeof(msg)), 0);
  ck_assert_str_eq(lr.cwd, "/home/u/project");
  ck_assert_str_eq(lr.path, "/a:/b");
  json_decref(body);
  body = json_loads("{\"n\": 1, \"cwd\": \"\", \"path\": \"\"}", 0, NULL);
  ck_assert_int_eq(validate_launch(body, &lr, &field, msg, sizeof(msg)), 0);
  ck_assert_ptr_null(lr.cwd);
  ck_assert_ptr_null(lr.path);
  json_decref(body);
}
END_TEST

/* The ends of the ranges are accepted; the conversions every backend uses
 * saturate instead of wrapping. */
START_TEST(resource_ranges_and_their_conversions) {
  static const char *const ok[] = {"{\"n\": 1, \"cpu\": 0.01, \"memory\": 0.01}",
                                   "{\"n\": 1, \"cpu\": 4096, \"memory\": 65536}"};
  for (size_t i = 0; i < sizeof(ok) / sizeof(ok[0]); i++) {
    const char *field = NULL;
    char msg[512];
    ck_assert_msg(launch(ok[i], &field, msg, sizeof(msg)) == 0, "%s: %s", ok[i], msg);
  }
  ck_assert_int_eq(res_cpu_count(0.5), 1);
  ck_assert_int_eq(res_cpu_count(2), 2);
  ck_assert_int_eq(res_cpu_count(2.5), 3);
  ck_assert_int_eq(res_cpu_count(3e9), 4096);
  ck_assert_int_eq(res_cpu_quota_us(0.5, 100000), 50000);
  ck_assert_int_eq(res_cpu_quota_us(0.001, 100000), 1000);
  ck_assert(res_memory_bytes(1) == 1LL << 30);
  ck_assert(res_memory_bytes(1e17) == 1LL << 60);
  ck_assert(res_ceil_sat(NAN, 1, 10) == 1);
  ck_assert(res_ceil_sat(2.5, 1, 10) == 3);
}
END_TEST

START_TEST(unknown_fields_are_refused) {
  const char *field = NULL;
  char msg[512];

  ck_assert_int_eq(launch("{\"n\": 1, \"memroy\": 2}", &field, msg, sizeof(msg)), MUSTER_E_INVALID);
  ck_assert_ptr_nonnull(strstr(msg, "memroy"));
}
END_TEST

START_TEST(cml_empty_strings_mean_absent) {
  const char *field = NULL;
  char msg[512];

  ck_assert_int_eq(
      launch("{\"n\": 1, \"script\": \"\", \"code\": \"print(1)\"}", &field, msg, sizeof(msg)), 0);
  ck_assert_int_eq(
      launch("{\"n\": 1, \"code\": \"!echo hi\", \"kernel\": \"java\"}", &field, msg, sizeof(msg)),
      0);
}
END_TEST

START_TEST(kernels_and_their_code_flags) {
  ck_assert_str_eq(validate_kernel_code_flag("python3"), "-c");
  ck_assert_str_eq(validate_kernel_code_flag("/usr/bin/python3.11"), "-c");
  ck_assert_str_eq(validate_kernel_code_flag("bash"), "-c");
  ck_assert_str_eq(validate_kernel_code_flag("node"), "-e");
  ck_assert_ptr_null(validate_kernel_code_flag("java"));
}
END_TEST

START_TEST(await_bodies) {
  struct await_req ar;
  const char *field;
  char msg[256];
  json_t *b;

  b = json_loads("{\"ids\": [\"w-abcdefghij\", {\"id\": \"w-0123456789\"}]}", 0, NULL);
  ck_assert_int_eq(validate_await(b, &ar, &field, msg, sizeof(msg)), 0);
  ck_assert_int_eq(json_array_size(ar.ids), 2);
  ck_assert_str_eq(json_string_value(json_array_get(ar.ids, 1)), "w-0123456789");
  ck_assert_int_eq(ar.wait_for_completion, 1);
  ck_assert(ar.timeout_seconds == 60);
  json_decref(ar.ids);
  json_decref(b);

  b = json_loads("{\"ids\": [\"nope\"]}", 0, NULL);
  ck_assert_int_eq(validate_await(b, &ar, &field, msg, sizeof(msg)), MUSTER_E_INVALID);
  ck_assert_str_eq(field, "ids");
  json_decref(b);

  b = json_loads("{\"ids\": [], \"timeout_seconds\": -1}", 0, NULL);
  ck_assert_int_eq(validate_await(b, &ar, &field, msg, sizeof(msg)), MUSTER_E_INVALID);
  ck_assert_str_eq(field, "timeout_seconds");
  json_decref(b);

  b = json_loads("{\"ids\": [], \"wait_for_completion\": 1}", 0, NULL);
  ck_assert_int_eq(validate_await(b, &ar, &field, msg, sizeof(msg)), MUSTER_E_INVALID);
  ck_assert_str_eq(field, "wait_for_completion");
  json_decref(b);
}
END_TEST

/* One rule for a name a client gives (a session, a role, a lease's
 * holder), one for a user's, and a stored session is "USER/name". */
START_TEST(names_of_sessions_roles_and_users) {
  char long_name[80];

  ck_assert(validate_name("Train-1_a.b"));
  ck_assert(!validate_name(""));
  ck_assert(!validate_name(NULL));
  ck_assert(!validate_name("a b"));
  ck_assert(!validate_name("a/b"));
  ck_assert(!validate_name("caf\xc3\xa9"));
  memset(long_name, 'x', 64);
  long_name[64] = '\0';
  ck_assert(validate_name(long_name));
  long_name[64] = 'x';
  long_name[65] = '\0';
  ck_assert(!validate_name(long_name));

  ck_assert(user_name_ok("alice"));
  ck_assert(user_name_ok("a9_-"));
  ck_assert(!user_name_ok("admin")); /* the bootstrap administrator's */
  ck_assert(!user_name_ok("Alice"));
  ck_assert(!user_name_ok("9lives"));
  ck_assert(!user_name_ok("al.ice"));
  ck_assert(!user_name_ok(""));
  memset(long_name, 'u', 32);
  long_name[32] = '\0';
  ck_assert(user_name_ok(long_name));
  long_name[32] = 'u';
  long_name[33] = '\0';
  ck_assert(!user_name_ok(long_name));

  ck_assert(session_name_ok("default"));
  ck_assert(session_name_ok("alice/Train.1"));
  ck_assert(!session_name_ok("/x"));
  ck_assert(!session_name_ok("alice/"));
  ck_assert(!session_name_ok("Alice/x"));
  ck_assert(!session_name_ok("alice/x/y"));
  ck_assert(!session_name_ok("alice/a b"));
  snprintf(long_name, sizeof(long_name), "%.33s/x", "uuuuuuuuuuuuuuuuuuuuuuuuuuuuuuuuu");
  ck_assert(!session_name_ok(long_name));
  /* A launch names a bare session or a stored one; nothing else. */
  {
    struct launch_req lr;
    const char *field = NULL;
    char msg[256];
    json_t *b = json_loads("{\"n\": 1, \"session\": \"alice/x\"}", 0, NULL);

    ck_assert_int_eq(validate_launch(b, &lr, &field, msg, sizeof(msg)), 0);
    ck_assert_str_eq(lr.session, "alice/x");
    json_decref(b);
  }
}
END_TEST

START_TEST(worker_ids) {
  ck_assert(validate_worker_id("w-3kf9x2m1qa"));
  ck_assert(!validate_worker_id("w-3kf9x2m1q"));
  ck_assert(!validate_worker_id("w-3KF9X2M1QA"));
  ck_assert(!validate_worker_id("x-3kf9x2m1qa"));
  ck_assert(!validate_worker_id(NULL));
}
END_TEST

/* workerd's reason for a failed end is kept to 1000 bytes, cut between two
 * characters: a cut inside one would make the failure no UTF-8, and every
 * answer would leave it out. */
START_TEST(a_long_exit_reason_is_cut_between_characters) {
  struct exit_req ex;
  const char *field;
  char msg[256], reason[1200];
  json_t *body;

  memset(reason, 'a', 999);
  for (int i = 0; i < 50; i++)
    memcpy(reason + 999 + 2 * i, "\xc3\xa9", 2);
  reason[1099] = '\0';
  body = json_pack("{s:i, s:s}", "exit_code", 1, "reason", reason);
  ck_assert_ptr_nonnull(body);
  ck_assert_int_eq(validate_exit(body, &ex, &field, msg, sizeof(msg)), 0);
  ck_assert_uint_eq(strlen(ex.failure), 999);
  ck_assert_int_eq(ex.failure[998], 'a');
  json_decref(body);
}
END_TEST

int main(void) {
  Suite *s = suite_create("validate");
  TCase *tc = tcase_create("bodies");

  tcase_add_test(tc, defaults_are_those_of_design);
  tcase_add_test(tc, bad_fields_are_named);
  tcase_add_test(tc, a_launchs_cwd_is_an_absolute_bounded_directory);
  tcase_add_test(tc, resource_ranges_and_their_conversions);
  tcase_add_test(tc, unknown_fields_are_refused);
  tcase_add_test(tc, cml_empty_strings_mean_absent);
  tcase_add_test(tc, kernels_and_their_code_flags);
  tcase_add_test(tc, await_bodies);
  tcase_add_test(tc, worker_ids);
  tcase_add_test(tc, names_of_sessions_roles_and_users);
  tcase_add_test(tc, a_long_exit_reason_is_cut_between_characters);
  suite_add_tcase(s, tc);
  return check_run(s);
}
