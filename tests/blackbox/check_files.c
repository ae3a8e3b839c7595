/*
 * check_files: what of the host's files a confined worker may write, seen
 * as an attacker with a worker's script would try: the host read-only even
 * where its permissions would let the account write, but for the worker's
 * directory, its home and a /tmp of its own; that /tmp shared by the
 * session's workers (and their exec'd commands), out of other sessions'
 * sight, and gone when the session's last worker ends.
 */
#include "harness.h"

#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <pwd.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static struct ctl_proc ctl;
static char host_dir[64]; /* the host's, writable by every account's permissions */
static char host_tmp[64]; /* a directory in the host's /tmp */

static void up(void) {
  char path[160];
  FILE *f;

  memset(&ctl, 0, sizeof(ctl));
  h_start(&ctl);
  unlink("/tmp/muster-files-mine"); /* (what a worker must not leave on the host) */
  unlink("/tmp/muster-files-a-secret");
  h_shared_dir(host_dir, sizeof(host_dir), "files");
  snprintf(path, sizeof(path), "%s/open", host_dir);
  f = fopen(path, "w");
  ck_assert_ptr_nonnull(f);
  fputs("the host's\n", f);
  fclose(f);
  ck_assert_int_eq(chmod(path, 0666), 0);
  snprintf(host_tmp, sizeof(host_tmp), "/tmp/muster-files-XXXXXX");
  ck_assert_ptr_nonnull(mkdtemp(host_tmp));
  ck_assert_int_eq(chmod(host_tmp, 0777), 0);
  snprintf(path, sizeof(path), "%s/seen", host_tmp);
  f = fopen(path, "w");
  ck_assert_ptr_nonnull(f);
  fclose(f);
  ck_assert_int_eq(chmod(path, 0666), 0);
}

static void down(void) {
  char cmd[200];

  h_finish(&ctl);
  h_shared_dir_remove(host_dir);
  snprintf(cmd, sizeof(cmd), "rm -rf %s", host_tmp);
  if (system(cmd) != 0)
    fprintf(stderr, "could not remove %s\n", host_tmp);
}

/* 1 when this controller confines its workers (root, or namespaces). */
static int confined(void) {
  json_t *h = NULL;
  int yes;

  ck_assert_int_eq(h_http(&ctl, "GET", "/api/v1/health", NULL, NULL, &h, NULL), 200);
  yes = strcmp(h_str(h, "isolation"), "none") != 0;
  if (!yes)
    fprintf(stderr, "SKIPPED: this controller does not confine its workers (isolation none)\n");
  json_decref(h);
  return yes;
}

/* A launch body: one worker of session, bash code, in cwd (NULL: the
 * controller's --workdir). */
static void body_of(char *body, size_t size, const char *session, const char *cwd,
                    const char *code) {
  char *esc = h_json_text(code), where[200] = "";

  if (cwd)
    snprintf(where, sizeof(where), ", \"cwd\": \"%s\"", cwd);
  ck_assert_int_lt(snprintf(body, size,
                            "{\"n\": 1, \"cpu\": 0.2, \"memory\": 0.25, \"session\": \"%s\", "
                            "\"kernel\": \"bash\"%s, \"code\": %s}",
                            session, where, esc),
                   (int)size);
  free(esc);
}

/* 1 when the session's /tmp is an overlay on the host's: a root
 * controller's (it mounts it); an ordinary user's gets a plain one. */
static int overlay(void) {
  return geteuid() == 0;
}

/* Fails the test unless path is gone within 10 s; why: what should have
 * removed it by then. */
static void gone_within(const char *path, const char *why) {
  struct stat st;

  for (double until = h_now() + 10; stat(path, &st) == 0; usleep(50 * 1000))
    ck_assert_msg(h_now() < until, "%s is still there 10 s after %s", path, why);
  ck_assert_int_eq(errno, ENOENT);
}

/* (workerd lets its session's /tmp go after it reported its end) */
static void gone_soon(const char *path) {
  gone_within(path, "its session's workers ended");
}

START_TEST(the_host_is_read_only_to_a_worker_but_for_its_own_directories) {
  char code[1500], body[2200], path[200], *out;
  FILE *f;

  up();
  if (!confined())
    goto out;
  snprintf(
      code, sizeof(code),
      "try() { if (echo x >> \"$1\") 2>/dev/null; then echo \"wrote $1\"; "
      "else echo \"refused $1\"; fi; }\n"
      "try %s/open; try %s/new; try /var/tmp/muster-files-$$; try /etc/muster-files\n"
      "try ./here; try \"$HOME/.muster-files\"; rm -f \"$HOME/.muster-files\"\n"
      "try /tmp/muster-files-mine; try /dev/shm/muster-files-$$; rm -f /dev/shm/muster-files-$$\n"
      "[ -e %s/seen ] && echo 'saw the host /tmp'\n"
      "echo changed >> %s/seen && echo 'changed it, for itself'\n"
      "[ -e /tmp/muster-files-mine ] && echo 'kept its own'\n"
      "echo \"ipc $(readlink /proc/self/ns/ipc)\"\n",
      host_dir, host_dir, host_tmp, host_tmp);
  body_of(body, sizeof(body), "files-a", NULL, code);
  out = h_output_of(&ctl, body, "stdout");
  fprintf(stderr, "the script said:\n%s", out);
  /* The host's files: refused, though their permissions let anyone write. */
  snprintf(path, sizeof(path), "refused %s/open\n", host_dir);
  ck_assert_msg(strstr(out, path), "the host's 0666 file: %s", out);
  snprintf(path, sizeof(path), "refused %s/new\n", host_dir);
  ck_assert_msg(strstr(out, path), "the host's 0777 directory: %s", out);
  ck_assert_msg(strstr(out, "refused /var/tmp/muster-files-"), "/var/tmp: %s", out);
  ck_assert_msg(strstr(out, "refused /etc/muster-files\n"), "/etc: %s", out);
  /* Its own: its directory, its home, its /tmp, /dev/shm. */
  ck_assert_msg(strstr(out, "wrote ./here\n"), "its directory: %s", out);
  {
    struct passwd *pw = getpwnam("muster-worker");
    snprintf(path, sizeof(path), "wrote %s/.muster-files\n", pw ? pw->pw_dir : "");
    ck_assert_msg(!pw || strstr(out, path), "its home: %s", out);
  }
  ck_assert_msg(strstr(out, "wrote /tmp/muster-files-mine\n"), "its /tmp: %s", out);
  ck_assert_msg(strstr(out, "wrote /dev/shm/muster-files-"), "/dev/shm: %s", out);
  /* Its /tmp: the host's below, read-only (where a root controller can
   * mount the overlay), its own above. */
  ck_assert_msg(strstr(out, "kept its own\n"), "its /tmp: %s", out);
  /* its own IPC namespace (System V IPC, POSIX message queues) */
  {
    char mine[64] = "", line[80];
    ck_assert_int_gt((int)readlink("/proc/self/ns/ipc", mine, sizeof(mine) - 1), 0);
    snprintf(line, sizeof(line), "ipc %s\n", mine);
    ck_assert_msg(strstr(out, "ipc ipc:[") && !strstr(out, line), "the host's IPC: %s", out);
  }
  if (overlay())
    ck_assert_msg(strstr(out, "saw the host /tmp\nchanged it, for itself\n"), "%s", out);
  else
    ck_assert_msg(!strstr(out, "saw the host /tmp"), "the worker saw the host's /tmp: %s", out);
  snprintf(path, sizeof(path), "%s/seen", host_tmp);
  {
    struct stat st;
    ck_assert_int_eq(stat(path, &st), 0);
    ck_assert_msg(st.st_size == 0, "the worker changed the host's %s", path);
  }
  /* and nothing of it reached the host */
  snprintf(path, sizeof(path), "%s/open", host_dir);
  f = fopen(path, "r");
  ck_assert_ptr_nonnull(f);
  {
    char line[64] = "";
    ck_assert_ptr_nonnull(fgets(line, sizeof(line), f));
    ck_assert_str_eq(line, "the host's\n");
    ck_assert_ptr_null(fgets(line, sizeof(line), f));
  }
  fclose(f);
  ck_assert_int_ne(access("/tmp/muster-files-mine", F_OK), 0);
  snprintf(path, sizeof(path), "%s/here", ctl.work);
  ck_assert_msg(access(path, F_OK) == 0, "the worker's file is not in its directory %s", ctl.work);
  free(out);
out:
  down();
}
END_TEST

/* A working directory reached through a link (the account may have made
 * one, in its home, to "/") or the file system's root itself is not made
 * writable: the host stays read-only around it. */
START_TEST(a_working_directory_linked_to_the_root_leaves_the_host_read_only) {
  char link[200], body[1200], code[600], *out;

  up();
  if (!confined())
    goto out;
  snprintf(link, sizeof(link), "%s/to-root", host_dir);
  ck_assert_int_eq(symlink("/", link), 0);
  snprintf(code, sizeof(code),
           "if (echo x > %s/through-link) 2>/dev/null; then echo wrote; else echo refused; fi",
           host_dir);
  body_of(body, sizeof(body), "files-l", link, code);
  out = h_output_of(&ctl, body, "stdout");
  ck_assert_msg(strcmp(out, "refused\n") == 0, "a cwd linked to /: %s", out);
  free(out);
  body_of(body, sizeof(body), "files-l", "/", code);
  out = h_output_of(&ctl, body, "stdout");
  ck_assert_msg(strcmp(out, "refused\n") == 0, "cwd /: %s", out);
  free(out);
  unlink(link);
out:
  down();
}
END_TEST

/* A session's workers share their /tmp (and their exec'd commands with
 * them); another session's cannot see it; the last worker's end removes
 * it from the state directory. */
START_TEST(a_sessions_workers_share_a_tmp_no_other_session_sees) {
  char body[1200], path[700], go[200], *out;
  json_t *holder;
  struct stat st;

  up();
  if (!confined())
    goto out;
  snprintf(go, sizeof(go), "%s/go", ctl.work);
  snprintf(path, sizeof(path),
           "echo secret > /tmp/muster-files-a-secret; echo > %s/ready; "
           "while [ ! -e %s ]; do sleep 0.05; done",
           ctl.work, go);
  body_of(body, sizeof(body), "files-a", NULL, path);
  holder = h_launch(&ctl, body);
  snprintf(path, sizeof(path), "%s/ready", ctl.work);
  for (double until = h_now() + 30; access(path, F_OK) != 0; usleep(50 * 1000))
    ck_assert_msg(h_now() < until, "the first worker did not start within 30 s");
  /* the same session: sees it */
  body_of(body, sizeof(body), "files-a", NULL, "cat /tmp/muster-files-a-secret 2>&1; echo end");
  out = h_output_of(&ctl, body, "stdout");
  ck_assert_msg(strstr(out, "secret\nend\n"), "the session's other worker: %s", out);
  free(out);
  /* nor with a launch's env naming the session */
  {
    char *out2;
    char *esc = h_json_text("cat /tmp/muster-files-a-secret 2>/dev/null && echo 'read it'; "
                            "echo end");
    snprintf(body, sizeof(body),
             "{\"n\": 1, \"cpu\": 0.2, \"memory\": 0.25, \"session\": \"files-b\", "
             "\"env\": {\"MUSTER_SESSION\": \"files-a\"}, \"kernel\": \"bash\", \"code\": %s}",
             esc);
    free(esc);
    out2 = h_output_of(&ctl, body, "stdout");
    ck_assert_msg(strcmp(out2, "end\n") == 0, "a launch env naming files-a: %s", out2);
    free(out2);
  }
  /* a controller's restart (its start sweeps) leaves a held tree alone */
  h_kill9(&ctl);
  h_restart(&ctl);
  {
    char held[300];
    snprintf(held, sizeof(held), "%s/scratch/files-a/%s/muster-files-a-secret", ctl.dir,
             overlay() ? "upper" : "tmp");
    ck_assert_msg(stat(held, &st) == 0, "the restart swept %s, which a worker holds", held);
  }
  /* another session: does not, and may not write it either */
  body_of(body, sizeof(body), "files-b", NULL,
          "cat /tmp/muster-files-a-secret 2>/dev/null && echo 'read it'; "
          "echo x > /tmp/muster-files-a-secret; echo end");
  out = h_output_of(&ctl, body, "stdout");
  ck_assert_msg(!strstr(out, "read it") && !strstr(out, "secret") && strstr(out, "end\n"),
                "another session's worker: %s", out);
  free(out);
  snprintf(path, sizeof(path), "%s/scratch/files-a/%s/muster-files-a-secret", ctl.dir,
           overlay() ? "upper" : "tmp");
  ck_assert_msg(stat(path, &st) == 0, "the session's /tmp is not in %s/scratch", ctl.dir);
  {
    char line[32] = "";
    FILE *f = fopen(path, "r");
    ck_assert_ptr_nonnull(f);
    ck_assert_ptr_nonnull(fgets(line, sizeof(line), f));
    fclose(f);
    ck_assert_str_eq(line, "secret\n");
  }
  /* a session named ".dot" gets its /tmp too; a tree 100 directories
   * deep goes with it */
  body_of(body, sizeof(body), ".dot", NULL,
          "d=/tmp; for i in $(seq 100); do d=$d/d; done; mkdir -p $d && touch $d/f && echo deep");
  out = h_output_of(&ctl, body, "stdout");
  ck_assert_msg(strcmp(out, "deep\n") == 0, "session .dot: %s", out);
  free(out);
  snprintf(path, sizeof(path), "%s/scratch/+.dot", ctl.dir);
  gone_soon(path);
  /* files-b's last worker ended: its /tmp is gone */
  snprintf(path, sizeof(path), "%s/scratch/files-b", ctl.dir);
  gone_soon(path);
  /* and so is files-a's, once its holder ends */
  {
    FILE *f = fopen(go, "w");
    ck_assert_ptr_nonnull(f);
    fclose(f);
  }
  json_decref(h_await(&ctl, holder, 1, 30));
  json_decref(holder);
  snprintf(path, sizeof(path), "%s/scratch/files-a", ctl.dir);
  gone_soon(path);
out:
  down();
}
END_TEST

/* Fails the test unless body's one worker fails saying want. */
static void failure_says(const char *body, const char *want) {
  json_t *workers = h_launch(&ctl, body), *ans = h_await(&ctl, workers, 1, 30);
  json_t *f = json_array_get(json_object_get(ans, "failures"), 0);

  ck_assert_msg(f && strstr(h_str(f, "failure"), want), "want a failure saying \"%s\": %.1500s",
                want, json_dumps(ans, 0));
  json_decref(ans);
  json_decref(workers);
}

/* A working directory in the host's /tmp is the host's, bound into the
 * worker's own /tmp: what the worker writes there, the host sees; a
 * directory above it that the account may not enter stays closed. A script
 * in the host's /tmp runs. */
START_TEST(a_working_directory_in_the_hosts_tmp_is_still_the_hosts) {
  char body[1200], path[200], closed[200];

  up();
  if (!confined())
    goto out;
  body_of(body, sizeof(body), "files-c", host_tmp, "echo made > made; ls -A /tmp");
  {
    char *out = h_output_of(&ctl, body, "stdout");
    ck_assert_msg(strstr(out, host_tmp + 5), "the worker's /tmp: %s", out);
    free(out);
  }
  snprintf(path, sizeof(path), "%s/made", host_tmp);
  ck_assert_msg(access(path, F_OK) == 0, "the worker's file is not in %s", host_tmp);
  /* a 0700 root directory above the working directory */
  snprintf(closed, sizeof(closed), "%s/closed", host_tmp);
  ck_assert_int_eq(mkdir(closed, 0700), 0);
  snprintf(path, sizeof(path), "%s/closed/open", host_tmp);
  ck_assert_int_eq(mkdir(path, 0777), 0);
  ck_assert_int_eq(chmod(path, 0777), 0);
  body_of(body, sizeof(body), "files-c", path, "echo in");
  failure_says(body, "cannot enter the working directory");
  /* a script in the host's /tmp: found there, through the overlay */
  if (overlay()) {
    char *out;
    snprintf(path, sizeof(path), "%s/hello.py", host_tmp);
    {
      FILE *f = fopen(path, "w");
      ck_assert_ptr_nonnull(f);
      fputs("print('hello from the host tmp')\n", f);
      fclose(f);
      ck_assert_int_eq(chmod(path, 0644), 0);
    }
    snprintf(body, sizeof(body), "{\"n\": 1, \"cpu\": 0.2, \"script\": \"%s\"}", path);
    out = h_output_of(&ctl, body, "stdout");
    ck_assert_msg(strstr(out, "hello from the host tmp\n"), "%s", out);
    free(out);
  }
out:
  down();
}
END_TEST

/* A workerd killed outright leaves its session's /tmp behind: the
 * controller's next start removes it. */
START_TEST(a_controller_start_sweeps_what_killed_workers_left) {
  char path[400];

  up();
  if (!confined())
    goto out;
  snprintf(path, sizeof(path), "%s/scratch/left/tmp/deep/er", ctl.dir);
  {
    char cmd[1400];
    snprintf(cmd, sizeof(cmd), "mkdir -p %s && touch %s/file && ln -s /etc %s/etc", path, path,
             path);
    ck_assert_int_eq(system(cmd), 0);
  }
  h_kill9(&ctl);
  /* The sweep runs while the restarted controller already answers: held
   * back here so that it is always still to come when the restart is
   * seen. */
  setenv("MUSTER_FAULT", "scratch_before_sweep:delay=1000", 1);
  h_restart(&ctl);
  unsetenv("MUSTER_FAULT");
  snprintf(path, sizeof(path), "%s/scratch/left", ctl.dir);
  gone_within(path, "the controller's restart");
  ck_assert_int_eq(access("/etc/passwd", F_OK), 0);
  /* and a workerd killed outright while the controller runs: its
   * session's tree goes when the controller reaps it */
  {
    char body[800], ready[200];
    json_t *w;
    snprintf(ready, sizeof(ready), "%s/k-ready", ctl.work);
    snprintf(path, sizeof(path), "echo x > /tmp/k; echo > %s; sleep 300", ready);
    body_of(body, sizeof(body), "files-k", NULL, path);
    w = h_launch(&ctl, body);
    for (double until = h_now() + 30; access(ready, F_OK) != 0; usleep(50 * 1000))
      ck_assert_msg(h_now() < until, "the worker did not start within 30 s");
    ck_assert_int_eq(kill((pid_t)h_workerd_pid(&ctl, h_str(json_array_get(w, 0), "id")), SIGKILL),
                     0);
    json_decref(h_await(&ctl, w, 1, 30));
    json_decref(w);
  }
  snprintf(path, sizeof(path), "%s/scratch/files-k", ctl.dir);
  gone_soon(path);
out:
  down();
}
END_TEST

int main(void) {
  Suite *s = suite_create("files");
  TCase *tc = tcase_create("files");
  SRunner *sr;
  int failed;

  tcase_set_timeout(tc, 240);
  tcase_add_test(tc, the_host_is_read_only_to_a_worker_but_for_its_own_directories);
  tcase_add_test(tc, a_working_directory_linked_to_the_root_leaves_the_host_read_only);
  tcase_add_test(tc, a_sessions_workers_share_a_tmp_no_other_session_sees);
  tcase_add_test(tc, a_working_directory_in_the_hosts_tmp_is_still_the_hosts);
  tcase_add_test(tc, a_controller_start_sweeps_what_killed_workers_left);
  suite_add_tcase(s, tc);
  sr = srunner_create(s);
  srunner_run_all(sr, CK_NORMAL);
  failed = srunner_ntests_failed(sr);
  srunner_free(sr);
  return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
