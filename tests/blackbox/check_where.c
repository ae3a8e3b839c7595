/* check_where.c: where a worker starts and what it finds there: a
 * launch's cwd (the client's directory, not the controller's --workdir)
 * and path (the client's PATH), and the sentences a worker fails with when
 * its script, its command or its directory is not there. The real
 * controller and workerds, driven through the REST API. */
#include "harness.h"

#include "../check_run.h"

#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static struct ctl_proc ctl;
static char project[64]; /* a project the worker's account can enter */

static void up(void) {
  memset(&ctl, 0, sizeof(ctl));
  h_start(&ctl);
  h_shared_dir(project, sizeof(project), "where");
}

static void down(void) {
  h_finish(&ctl);
  h_shared_dir_remove(project);
}

/* Launches body (one worker), awaits its end, and returns the one failure
 * (new reference); fails the test if it did not fail. */
static json_t *failure_of(const char *body) {
  json_t *workers = h_launch(&ctl, body), *ans, *f;

  ans = h_await(&ctl, workers, 1, 30);
  ck_assert_msg(json_array_size(json_object_get(ans, "failures")) == 1, "the worker did not fail");
  f = json_incref(json_array_get(json_object_get(ans, "failures"), 0));
  json_decref(ans);
  json_decref(workers);
  return f;
}

START_TEST(a_missing_script_fails_with_script_not_found) {
  char body[512], want[160];
  json_t *f;

  up();
  snprintf(body, sizeof(body), "{\"n\": 1, \"cpu\": 0.1, \"script\": \"fail.py\", \"cwd\": \"%s\"}",
           project);
  f = failure_of(body);
  snprintf(want, sizeof(want), "script %s/fail.py not found", project);
  ck_assert_str_eq(h_str(f, "failure"), want);
  json_decref(f);
  down();
}
END_TEST

START_TEST(a_missing_command_says_not_found_on_the_workers_path) {
  json_t *f;

  up();
  f = failure_of("{\"n\": 1, \"cpu\": 0.1, \"command\": [\"muster-no-such-train\", \"--epochs\", "
                 "\"1\"], \"path\": \"/nowhere/a:/nowhere/b\"}");
  ck_assert_str_eq(h_str(f, "failure"),
                   "muster-no-such-train: not found on the worker's PATH (/nowhere/a:/nowhere/b)");
  json_decref(f);
  down();
}
END_TEST

/* A client's PATH may hold a directory the worker's account cannot search
 * (root's ~/.pyenv/shims, say): a program on no directory of it is still
 * "not found", and one only in that directory is out of the account's
 * reach, not a file that is no program. */
START_TEST(a_path_the_workers_account_cannot_search_still_says_not_found) {
  char body[512], shut[80], prog[128], want[400];
  json_t *f;

  up();
  snprintf(shut, sizeof(shut), "%s/shut", project);
  ck_assert_int_eq(mkdir(shut, 0700), 0);
  snprintf(body, sizeof(body),
           "{\"n\": 1, \"cpu\": 0.1, \"command\": [\"muster-no-such-train\"], \"path\": "
           "\"%s:/usr/bin:/bin\"}",
           shut);
  f = failure_of(body);
  snprintf(want, sizeof(want),
           "muster-no-such-train: not found on the worker's PATH (%s:/usr/bin:/bin)", shut);
  ck_assert_str_eq(h_str(f, "failure"), want);
  ck_assert_int_eq(json_integer_value(json_object_get(f, "exit_code")), 127);
  json_decref(f);
  /* One there, out of the account's sight: "not found" as well, so that
   * nothing of root's directory shows. */
  snprintf(prog, sizeof(prog), "%s/muster-shut-train", shut);
  h_write_exec(prog, "#!/bin/sh\necho hi\n");
  snprintf(body, sizeof(body),
           "{\"n\": 1, \"cpu\": 0.1, \"command\": [\"muster-shut-train\"], \"path\": "
           "\"%s:/usr/bin:/bin\"}",
           shut);
  f = failure_of(body);
  snprintf(want, sizeof(want),
           "muster-shut-train: not found on the worker's PATH (%s:/usr/bin:/bin)", shut);
  ck_assert_str_eq(h_str(f, "failure"), want);
  json_decref(f);
  /* A file in the state directory, which the worker's mount namespace
   * covers: "not found", as the worker sees it, not what root sees there
   * (before: "... exists but cannot be started: its loader is missing"). */
  {
    char hidden[200];
    snprintf(hidden, sizeof(hidden), "%s/token", ctl.dir);
    snprintf(body, sizeof(body), "{\"n\": 1, \"cpu\": 0.1, \"command\": [\"%s\"]}", hidden);
    f = failure_of(body);
    snprintf(want, sizeof(want), "%s: not found", hidden);
    ck_assert_str_eq(h_str(f, "failure"), want);
    json_decref(f);
  }
  unlink(prog);
  /* One the account sees but may not run (root's, 0700). */
  snprintf(prog, sizeof(prog), "%s/muster-own-train", project);
  h_write_exec(prog, "#!/bin/sh\necho hi\n");
  ck_assert_int_eq(chmod(prog, 0700), 0);
  snprintf(body, sizeof(body),
           "{\"n\": 1, \"cpu\": 0.1, \"command\": [\"muster-own-train\"], \"path\": "
           "\"%s:/usr/bin:/bin\"}",
           project);
  f = failure_of(body);
  ck_assert_str_eq(h_str(f, "failure"),
                   "cannot run \"muster-own-train\" as the worker's account muster-worker: "
                   "Permission denied");
  json_decref(f);
  unlink(prog);
  rmdir(shut);
  down();
}
END_TEST

START_TEST(a_missing_working_directory_fails_naming_it) {
  json_t *f;

  up();
  f = failure_of("{\"n\": 1, \"cpu\": 0.1, \"kernel\": \"sh\", \"code\": \"true\", "
                 "\"cwd\": \"/nowhere/project\"}");
  ck_assert_str_eq(h_str(f, "failure"),
                   "the working directory /nowhere/project does not exist on this worker's host");
  json_decref(f);
  down();
}
END_TEST

/* A script or program that is there but whose #! interpreter is not: the
 * sentence names the interpreter, not "not found on the PATH". */
START_TEST(a_script_whose_interpreter_is_missing_names_the_interpreter) {
  char body[512], script[128], want[256];
  json_t *f;
  FILE *fp;

  up();
  snprintf(script, sizeof(script), "%s/run.sh", project);
  fp = fopen(script, "w");
  ck_assert_ptr_nonnull(fp);
  fputs("#!/nowhere/bin/foo -x\necho hi\n", fp);
  fclose(fp);
  ck_assert_int_eq(chmod(script, 0755), 0);
  snprintf(body, sizeof(body),
           "{\"n\": 1, \"cpu\": 0.1, \"command\": [\"./run.sh\"], \"cwd\": \"%s\"}", project);
  f = failure_of(body);
  ck_assert_str_eq(h_str(f, "failure"), "./run.sh: its interpreter /nowhere/bin/foo was not found");
  json_decref(f);
  snprintf(body, sizeof(body),
           "{\"n\": 1, \"cpu\": 0.1, \"command\": [\"run.sh\"], \"path\": \"/nowhere:%s\"}",
           project);
  f = failure_of(body);
  snprintf(want, sizeof(want), "%s: its interpreter /nowhere/bin/foo was not found", script);
  ck_assert_str_eq(h_str(f, "failure"), want);
  json_decref(f);
  unlink(script);
  down();
}
END_TEST

/* Writes to buf (size bytes) head, then unit n times, then tail. */
static void repeat(char *buf, size_t size, const char *head, const char *unit, int n,
                   const char *tail) {
  size_t len = (size_t)snprintf(buf, size, "%s", head);

  for (int i = 0; i < n && len < size; i++)
    len += (size_t)snprintf(buf + len, size - len, "%s", unit);
  if (len < size)
    snprintf(buf + len, size - len, "%s", tail);
}

/* A PATH or a working directory with non-ASCII characters, long enough that
 * the sentence is cut inside one: the sentence still comes back (cut at a
 * character), not a worker lost for want of an exit report. */
START_TEST(a_long_non_ascii_path_or_cwd_still_fails_with_its_sentence) {
  char body[1400], want[700];
  json_t *f;
  const char *got;

  up();
  /* "/xyzw" then ":/ü"s: byte 300 of the PATH falls inside a "ü". */
  repeat(body, sizeof(body),
         "{\"n\": 1, \"cpu\": 0.1, \"command\": [\"muster-no-such-train\"], \"path\": \"/xyzw",
         ":/\xc3\xbc", 100, "\"}");
  f = failure_of(body);
  repeat(want, sizeof(want), "muster-no-such-train: not found on the worker's PATH (/xyzw",
         ":/\xc3\xbc", 73, ":/\xe2\x80\xa6)");
  ck_assert_str_eq(h_str(f, "failure"), want);
  json_decref(f);

  /* A name too long to change to: "cannot change to the working directory
   * /abc" is 43 bytes, so the reason's 511 bytes end inside a "ü". */
  repeat(body, sizeof(body),
         "{\"n\": 1, \"cpu\": 0.1, \"kernel\": \"sh\", \"code\": \"true\", \"cwd\": \"/abc",
         "\xc3\xbc", 300, "\"}");
  f = failure_of(body);
  got = h_str(f, "failure");
  repeat(want, sizeof(want), "cannot change to the working directory /abc", "\xc3\xbc", 234, "");
  ck_assert_msg(strncmp(got, want, strlen(want)) == 0, "failure: %s", got);
  json_decref(f);
  down();
}
END_TEST

/* The worker object says where it starts and on which PATH; a launch that
 * names neither (an older client) gets null: the controller's --workdir
 * and the worker's own PATH, as before. A relative cwd is refused. */
START_TEST(a_worker_says_where_it_starts_and_a_relative_cwd_is_refused) {
  char body[512];
  json_t *ws, *ans = NULL, *w;

  up();
  snprintf(body, sizeof(body),
           "{\"n\": 1, \"cpu\": 0.1, \"kernel\": \"sh\", \"code\": \"pwd; echo $PATH\", "
           "\"cwd\": \"%s\", \"path\": \"/usr/bin:/bin\"}",
           project);
  ws = h_launch(&ctl, body);
  w = json_array_get(ws, 0);
  ck_assert_str_eq(h_str(w, "cwd"), project);
  ck_assert_str_eq(h_str(w, "path"), "/usr/bin:/bin");
  ans = h_await(&ctl, ws, 1, 30);
  ck_assert_int_eq(json_array_size(json_object_get(ans, "failures")), 0);
  json_decref(ans);
  {
    char path[64], *raw = NULL, want[160];
    snprintf(path, sizeof(path), "/api/v1/workers/%s/logs", h_str(w, "id"));
    ck_assert_int_eq(h_http(&ctl, "GET", path, NULL, "", NULL, &raw), 200);
    snprintf(want, sizeof(want), "%s\n/usr/bin:/bin\n", project);
    ck_assert_str_eq(raw, want);
    free(raw);
  }
  json_decref(ws);

  ws = h_launch(&ctl, "{\"n\": 1, \"cpu\": 0.1}");
  ck_assert(json_is_null(json_object_get(json_array_get(ws, 0), "cwd")));
  ck_assert(json_is_null(json_object_get(json_array_get(ws, 0), "path")));
  json_decref(ws);

  ck_assert_int_eq(
      h_http(&ctl, "POST", "/api/v1/workers", "{\"n\": 1, \"cwd\": \"project\"}", "", &ans, NULL),
      422);
  ck_assert_str_eq(h_str(json_object_get(ans, "error"), "field"), "cwd");
  ck_assert_ptr_nonnull(
      strstr(h_str(json_object_get(ans, "error"), "message"), "cwd must be an absolute directory"));
  json_decref(ans);
  ck_assert_int_eq(
      h_http(&ctl, "POST", "/api/v1/workers", "{\"n\": 1, \"cwd\": 7}", "", &ans, NULL), 422);
  ck_assert_str_eq(h_str(json_object_get(ans, "error"), "field"), "cwd");
  json_decref(ans);
  down();
}
END_TEST

int main(void) {
  Suite *s = suite_create("where");
  TCase *tc = tcase_create("where");

  tcase_set_timeout(tc, 90);
  tcase_add_test(tc, a_missing_script_fails_with_script_not_found);
  tcase_add_test(tc, a_missing_command_says_not_found_on_the_workers_path);
  tcase_add_test(tc, a_missing_working_directory_fails_naming_it);
  tcase_add_test(tc, a_path_the_workers_account_cannot_search_still_says_not_found);
  tcase_add_test(tc, a_worker_says_where_it_starts_and_a_relative_cwd_is_refused);
  tcase_add_test(tc, a_script_whose_interpreter_is_missing_names_the_interpreter);
  tcase_add_test(tc, a_long_non_ascii_path_or_cwd_still_fails_with_its_sentence);
  suite_add_tcase(s, tc);
  return check_run(s);
}
