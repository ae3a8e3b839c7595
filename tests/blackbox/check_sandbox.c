/* check_sandbox.c: a worker's code, played as an attacker's, under
 * `muster-controller --run-as muster-worker` (issue 26). Its script and the
 * commands the exec channel runs try to rewrite muster's web files and
 * binaries, read the state directory's token, and bind the controller's
 * port beside it with SO_REUSEPORT: every attempt fails, and the script's
 * own output says so. A script the account cannot read fails the worker
 * with a sentence naming the file and the account.
 *
 * The controller serves copies of the web files and runs a copy of
 * muster-workerd (root's, 0755, in this test's own directory), so that an
 * attempt that succeeded would spoil nothing of the build. Needs root and
 * the account that scripts/setup.sh makes. */
#include "harness.h"
#include "muster.h"

#include "../check_run.h"

#include <check.h>
#include <grp.h>
#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define ACCOUNT "muster-worker"
#define WEB_PAGE "<html>muster</html>\n"

static struct ctl_proc ctl;
static char dir[64];      /* this test's own directory (root's, 0755) */
static char web[128];     /* the copy of the web files */
static char workerd[160]; /* the copy of muster-workerd (or a wrapper of it) */
static char wk[128];      /* the workers' working directory (the account's) */
static int direct;        /* the controller starts workerds without its fork server */

/* Runs a shell command of the test's own; fails the test if it fails. */
static void sh(const char *fmt, const char *a, const char *b) {
  char cmd[512];

  snprintf(cmd, sizeof(cmd), fmt, a, b);
  ck_assert_msg(system(cmd) == 0, "%s failed", cmd);
}

/* This test's directory: copies of the web files and of muster-workerd
 * (root's, 0755), and the workers' working directory (the account's). */
static void up_dirs(void) {
  struct passwd *pw = getpwnam(ACCOUNT);
  char page[160];
  FILE *f;

  ck_assert_msg(geteuid() == 0, "this test needs root (it switches workers to " ACCOUNT ")");
  ck_assert_msg(pw != NULL, "no account " ACCOUNT " on this host: run scripts/setup.sh");
  snprintf(dir, sizeof(dir), "/var/tmp/muster-sandbox-XXXXXX");
  ck_assert_ptr_nonnull(mkdtemp(dir));
  ck_assert_int_eq(chmod(dir, 0755), 0);
  snprintf(web, sizeof(web), "%s/web", dir);
  snprintf(workerd, sizeof(workerd), "%s/muster-workerd", dir);
  snprintf(wk, sizeof(wk), "%s/wk", dir);
  ck_assert_int_eq(mkdir(web, 0755), 0);
  ck_assert_int_eq(mkdir(wk, 0755), 0);
  ck_assert_int_eq(chown(wk, pw->pw_uid, pw->pw_gid), 0);
  sh("cp %s %s", MUSTER_WORKERD_BIN, workerd);
  ck_assert_int_eq(chmod(workerd, 0755), 0);
  if (direct) {
    /* A muster-workerd that will not be a fork server: the controller
     * starts every worker's directly. */
    char wrapper[160], text[400];

    snprintf(wrapper, sizeof(wrapper), "%s/workerd-direct", dir);
    snprintf(text, sizeof(text), "#!/bin/sh\n[ \"$1\" = --zygote ] && exit 1\nexec %s \"$@\"\n",
             workerd);
    h_write_exec(wrapper, text);
    snprintf(workerd, sizeof(workerd), "%s", wrapper);
  }
  snprintf(page, sizeof(page), "%s/index.html", web);
  f = fopen(page, "w");
  ck_assert_ptr_nonnull(f);
  fputs(WEB_PAGE, f);
  fclose(f);
}

/* Starts a controller on this test's copies (up_dirs()): with --run-as
 * the account if run_as; as bin, uid and gid if bin is not NULL. */
static void ctl_start(int run_as, const char *bin, uid_t uid, gid_t gid) {
  int n = 0;

  memset(&ctl, 0, sizeof(ctl));
  ctl.bin = bin;
  ctl.uid = uid;
  ctl.gid = gid;
  if (run_as) {
    ctl.extra[n++] = "--run-as";
    ctl.extra[n++] = ACCOUNT;
  }
  ctl.extra[n++] = "--workerd";
  ctl.extra[n++] = workerd;
  ctl.extra[n++] = "--web-dir";
  ctl.extra[n++] = web;
  ctl.extra[n++] = "--workdir";
  ctl.extra[n++] = wk;
  h_start(&ctl);
}

/* up_dirs(), and a controller (run as root) with --run-as the account. */
static void up(void) {
  up_dirs();
  ctl_start(1, NULL, 0, 0);
}

static void down(void) {
  h_finish(&ctl);
  sh("rm -rf %s%s", dir, "");
}

/* The whole of a small file (malloc'ed), or NULL. */
static char *slurp(const char *path) {
  FILE *f = fopen(path, "r");
  char *buf = calloc(1, 1 << 16);

  if (!f || !buf) {
    if (f)
      fclose(f);
    free(buf);
    return NULL;
  }
  if (fread(buf, 1, (1 << 16) - 1, f) == 0)
    buf[0] = '\0';
  fclose(f);
  return buf;
}

START_TEST(a_workers_script_cannot_rewrite_muster_nor_read_its_token) {
  char code[1024], body[1400], page[160];
  char *out, *esc, *after;
  struct stat before, now;

  up();
  ck_assert_int_eq(stat(workerd, &before), 0);
  snprintf(page, sizeof(page), "%s/index.html", web);
  snprintf(
      code, sizeof(code),
      "id -u\n"
      "echo \"user=$USER logname=$LOGNAME\"\n"
      "if touch \"$HOME/m.$$\" && rm \"$HOME/m.$$\"; then echo 'home is writable'; fi\n"
      "for f in %s %s %s/token %s/muster.db; do\n"
      "  if echo x >> \"$f\" 2>/dev/null; then echo \"wrote $f\"; else echo \"refused $f\"; fi\n"
      "done\n"
      "if cat %s/token >/dev/null 2>&1; then echo 'read the token'; "
      "else echo 'refused to read the token'; fi\n",
      page, workerd, ctl.dir, ctl.dir, ctl.dir);
  esc = h_json_text(code);
  snprintf(body, sizeof(body), "{\"n\": 1, \"cpu\": 0.5, \"kernel\": \"bash\", \"code\": %s}", esc);
  free(esc);
  out = h_output_of(&ctl, body, NULL);
  ck_assert_msg(strncmp(out, "0\n", 2) != 0, "the script ran as root: %s", out);
  ck_assert_msg(strstr(out, "wrote") == NULL, "the script wrote muster's files: %s", out);
  ck_assert_msg(strstr(out, "user=" ACCOUNT " logname=" ACCOUNT "\n") != NULL, "%s", out);
  ck_assert_msg(strstr(out, "home is writable") != NULL, "the account's HOME: %s", out);
  ck_assert_msg(strstr(out, "refused to read the token") != NULL, "%s", out);
  ck_assert_msg(strstr(out, "refused ") != NULL && strstr(out, workerd) != NULL, "%s", out);
  after = slurp(page);
  ck_assert_ptr_nonnull(after);
  ck_assert_str_eq(after, WEB_PAGE);
  ck_assert_int_eq(stat(workerd, &now), 0);
  ck_assert_int_eq((long)now.st_size, (long)before.st_size);
  free(after);
  free(out);
  down();
}
END_TEST

/* The controller's address as the script reaches it (its
 * MUSTER_CONTROLLER_URL): the bridge's gateway, not the script's to bind
 * (EADDRNOTAVAIL), or with --network host the controller's own, whose port
 * it holds without SO_REUSEPORT (EADDRINUSE). check_network has the rest. */
START_TEST(a_workers_script_cannot_bind_the_controllers_port) {
  char code[600], body[900], *esc, *out;

  up();
  snprintf(code, sizeof(code),
           "import os, socket, urllib.parse\n"
           "u = urllib.parse.urlparse(os.environ['MUSTER_CONTROLLER_URL'])\n"
           "s = socket.socket()\n"
           "s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)\n"
           "try:\n"
           "    s.bind((u.hostname, %d)); s.listen(); print('bound the port')\n"
           "except OSError as e:\n"
           "    print('refused:', e.strerror)\n",
           ctl.port);
  esc = h_json_text(code);
  snprintf(body, sizeof(body), "{\"n\": 1, \"cpu\": 0.5, \"kernel\": \"python3\", \"code\": %s}",
           esc);
  free(esc);
  out = h_output_of(&ctl, body, NULL);
  ck_assert_msg(strstr(out, "refused:") != NULL && strstr(out, "bound") == NULL,
                "the script's attempt at the controller's port %d: %s", ctl.port, out);
  free(out);
  down();
}
END_TEST

/* What an exec'd command that tries to read the token prints, in an idle
 * worker of the controller ctl (its uid first). */
static void exec_reads_token(char *out) {
  char script[600], id[32], err[256] = "";
  const char *argv[] = {"sh", "-c", script};
  json_t *workers;
  muster_client *cl = NULL;
  muster_exec_target t;
  muster_exec_opts o;
  int code = -1;

  workers = h_launch(&ctl, "{\"n\": 1, \"cpu\": 0.5}");
  snprintf(id, sizeof(id), "%s", h_str(json_array_get(workers, 0), "id"));
  json_decref(h_wait_status(&ctl, id, "running", 30));
  json_decref(workers);
  /* The uid alone refuses it; the cover (a mount over the state
   * directory, in the command's own mount namespace) is checked too. */
  snprintf(script, sizeof(script),
           "id -u; if cat %s/token; then echo 'read the token'; else echo 'refused'; fi; "
           "grep -q ' %s ' /proc/self/mountinfo && echo covered",
           ctl.dir, ctl.dir);
  ck_assert_int_eq(muster_client_new(ctl.url, ctl.token, &cl), 0);
  ck_assert_int_eq(muster_exec_target_get(cl, id, &t), 0);
  muster_exec_opts_init(&o);
  o.argv = argv;
  o.argc = 3;
  o.on_stdout = h_collect;
  o.arg = out;
  o.stderr_fd = -1;
  ck_assert_int_eq(muster_exec_at(&t, &o, &code, err, sizeof(err)), 0);
  muster_client_free(cl);
}

START_TEST(an_exec_command_cannot_read_the_token) {
  char out[4096] = "";

  up();
  exec_reads_token(out);
  ck_assert_msg(strncmp(out, "0\n", 2) != 0, "the exec'd command ran as root: %s", out);
  ck_assert_msg(strstr(out, "refused") != NULL && strstr(out, ctl.token) == NULL,
                "the exec'd command read the token: %s", out);
  down();
}
END_TEST

/* Without --run-as, a root controller runs an exec'd command as the
 * setup script's account, never as root, in a mount namespace of its own,
 * the state directory out of its sight, as the worker's script is. */
START_TEST(an_exec_command_of_a_root_controller_runs_as_the_default_account) {
  char out[4096] = "", want[32];
  struct passwd *pw = getpwnam(ACCOUNT);

  ck_assert_msg(pw != NULL, "no account " ACCOUNT " (scripts/setup.sh makes it)");
  snprintf(want, sizeof(want), "%u\n", (unsigned)pw->pw_uid);
  up_dirs();
  ctl_start(0, NULL, 0, 0);
  exec_reads_token(out);
  ck_assert_msg(strncmp(out, want, strlen(want)) == 0, "the exec'd command's uid: %s", out);
  ck_assert_msg(strstr(out, "covered") != NULL, "the state directory is not covered: %s", out);
  ck_assert_msg(strstr(out, "refused") != NULL && strstr(out, ctl.token) == NULL,
                "the exec'd command read the token: %s", out);
  down();
}
END_TEST

/* Launches a script the account cannot read (path) and asserts the
 * sentence its failure gives. */
static void unreadable_script_fails(const char *path) {
  char body[400], want[300];
  json_t *workers, *ans, *f;

  snprintf(body, sizeof(body), "{\"n\": 1, \"cpu\": 0.5, \"script\": \"%s\"}", path);
  workers = h_launch(&ctl, body);
  ans = h_await(&ctl, workers, 1, 60);
  ck_assert_msg(json_array_size(json_object_get(ans, "failures")) == 1, "the worker did not fail");
  f = json_array_get(json_object_get(ans, "failures"), 0);
  snprintf(want, sizeof(want),
           "script %s cannot be read by the worker's account " ACCOUNT ": Permission denied", path);
  ck_assert_str_eq(h_str(f, "failure"), want);
  json_decref(ans);
  json_decref(workers);
}

START_TEST(a_script_the_account_cannot_read_fails_naming_both) {
  char secret[160], path[200];

  up();
  /* in a directory it cannot enter */
  snprintf(secret, sizeof(secret), "%s/private", dir);
  ck_assert_int_eq(mkdir(secret, 0700), 0);
  sh("echo 'print(1)' > %s/%s", secret, "train.py");
  snprintf(path, sizeof(path), "%s/train.py", secret);
  unreadable_script_fails(path);
  /* a file of its own mode 0600 in a directory it can read */
  sh("echo 'print(1)' > %s/%s", dir, "mine.py");
  snprintf(path, sizeof(path), "%s/mine.py", dir);
  ck_assert_int_eq(chmod(path, 0600), 0);
  unreadable_script_fails(path);
  down();
}
END_TEST

START_TEST(a_worker_started_without_the_fork_server_runs_as_the_account_too) {
  char *out;
  json_t *health = NULL;

  direct = 1;
  up();
  direct = 0;
  ck_assert_int_eq(h_http(&ctl, "GET", "/api/v1/health", NULL, NULL, &health, NULL), 200);
  ck_assert_str_eq(h_str(health, "run_as"), ACCOUNT);
  json_decref(health);
  out = h_output_of(
      &ctl, "{\"n\": 1, \"cpu\": 0.5, \"kernel\": \"bash\", \"code\": \"id -u; echo $USER\"}",
      NULL);
  ck_assert_msg(strncmp(out, "0\n", 2) != 0 && strstr(out, ACCOUNT) != NULL,
                "a worker started without the fork server ran as: %s", out);
  free(out);
  down();
}
END_TEST

/* A controller that an ordinary user runs (here the account itself, with
 * copies of the binaries it can run) has no cgroups; its workers'
 * commands still get namespaces of their own, so that the state directory,
 * which their uid could read, is out of their sight. */
START_TEST(a_controller_run_by_an_ordinary_user_hides_its_state_from_workers) {
  struct passwd *pw = getpwnam(ACCOUNT);
  char bin[160], code[300], body[600], *esc, *out;
  json_t *health = NULL;

  up_dirs();
  snprintf(bin, sizeof(bin), "%s/muster-controller", dir);
  sh("cp %s %s", MUSTER_CONTROLLER_BIN, bin);
  ck_assert_int_eq(chmod(bin, 0755), 0);
  ctl_start(0, bin, pw->pw_uid, pw->pw_gid);
  ck_assert_int_eq(h_http(&ctl, "GET", "/api/v1/health", NULL, NULL, &health, NULL), 200);
  ck_assert_str_eq(h_str(health, "isolation"), "namespaces");
  json_decref(health);
  snprintf(code, sizeof(code),
           "id -u; if cat %s/token >/dev/null 2>&1; then echo 'read the token'; "
           "else echo 'refused to read the token'; fi",
           ctl.dir);
  esc = h_json_text(code);
  snprintf(body, sizeof(body), "{\"n\": 1, \"cpu\": 0.5, \"kernel\": \"bash\", \"code\": %s}", esc);
  free(esc);
  out = h_output_of(&ctl, body, NULL);
  ck_assert_msg(strstr(out, "refused to read the token") != NULL,
                "a worker of a controller run by %s: %s", ACCOUNT, out);
  free(out);
  /* its session's /tmp (a plain one: it cannot mount the overlay) goes with
   * the session's last worker */
  {
    char tree[200];
    struct stat st;
    snprintf(tree, sizeof(tree), "%s/scratch/default", ctl.dir);
    for (double until = h_now() + 10; stat(tree, &st) == 0; usleep(50 * 1000))
      ck_assert_msg(h_now() < until, "%s outlived its session's worker", tree);
  }
  down();
}
END_TEST

/* The account's own supplementary groups (a GPU's render or video group,
 * say) stay with its commands: here a group this test makes, and removes. */
START_TEST(the_accounts_own_groups_stay_with_its_commands) {
  char group[64], cmd[200], want[32], *out;
  struct group *g;

  snprintf(group, sizeof(group), "muster-test-%d", (int)getpid());
  snprintf(cmd, sizeof(cmd), "groupadd %s && gpasswd -a " ACCOUNT " %s >/dev/null", group, group);
  ck_assert_msg(system(cmd) == 0, "%s failed", cmd);
  g = getgrnam(group);
  ck_assert_ptr_nonnull(g);
  snprintf(want, sizeof(want), " %u ", (unsigned)g->gr_gid);
  up();
  out = h_output_of(
      &ctl, "{\"n\": 1, \"cpu\": 0.5, \"kernel\": \"bash\", \"code\": \"echo \\\" $(id -G) \\\"\"}",
      NULL);
  down();
  snprintf(cmd, sizeof(cmd), "groupdel %s", group);
  ck_assert_msg(system(cmd) == 0, "%s failed", cmd);
  ck_assert_msg(strstr(out, want) != NULL, "the account's group %s (%s) is not its command's: %s",
                group, want, out);
  free(out);
}
END_TEST

/* The handles of the session that started the controller (its agents,
 * its bus, its runtime directory) do not reach a worker's code. */
START_TEST(the_controllers_session_handles_do_not_reach_workers) {
  char *out;

  setenv("SSH_AUTH_SOCK", "/tmp/ssh-muster-test/agent.1", 1);
  setenv("DBUS_SESSION_BUS_ADDRESS", "unix:path=/run/user/0/bus", 1);
  setenv("XDG_RUNTIME_DIR", "/run/user/0", 1);
  up();
  unsetenv("SSH_AUTH_SOCK");
  unsetenv("DBUS_SESSION_BUS_ADDRESS");
  unsetenv("XDG_RUNTIME_DIR");
  out = h_output_of(&ctl,
                    "{\"n\": 1, \"cpu\": 0.5, \"kernel\": \"sh\", \"code\": \"env | grep -E "
                    "'^(SSH_AUTH_SOCK|DBUS_SESSION_BUS_ADDRESS|XDG_RUNTIME_DIR)='; echo end\"}",
                    NULL);
  down();
  ck_assert_msg(strcmp(out, "end\n") == 0, "the worker saw the controller's session: %s", out);
  free(out);
}
END_TEST

/* 1 if a controller started on this test's copies refuses to start, and
 * says that the account can write want (within 10 s: one that starts runs
 * until the timeout). */
static int refuses_naming_in(const char *state, const char *want) {
  char cmd[2048], st[160];

  snprintf(st, sizeof(st), "%s/state", dir);
  ck_assert_int_lt(
      snprintf(cmd, sizeof(cmd),
               "timeout 10 %s --listen 127.0.0.1:0 --state-dir %s --workerd %s --web-dir %s "
               "--workdir %s >%s/out 2>&1; grep -qF 'account " ACCOUNT " can write %s (' %s/out",
               MUSTER_CONTROLLER_BIN, state ? state : st, workerd, web, wk, dir, want, dir),
      (int)sizeof(cmd));
  if (system(cmd) == 0)
    return 1;
  if (snprintf(cmd, sizeof(cmd), "cat %s/out >&2", dir) < (int)sizeof(cmd))
    (void)!system(cmd);
  return 0;
}

static int refuses_naming(const char *want) {
  return refuses_naming_in(NULL, want);
}

/* What runs as root or is served to browsers must be out of the account's
 * reach, or it is no boundary: a controller whose worker daemon, web files
 * or their directories the account can write refuses to start, naming it. */
START_TEST(a_controller_whose_files_the_account_can_write_refuses_to_start) {
  struct passwd *pw = getpwnam(ACCOUNT);
  char page[160];

  up_dirs();
  snprintf(page, sizeof(page), "%s/index.html", web);
  ck_assert_int_eq(chmod(page, 0666), 0);
  ck_assert_msg(refuses_naming(page), "a web file the account can write was accepted");
  ck_assert_int_eq(chmod(page, 0644), 0);
  ck_assert_int_eq(chown(workerd, pw->pw_uid, pw->pw_gid), 0);
  ck_assert_msg(refuses_naming(workerd), "a worker daemon the account owns was accepted");
  ck_assert_int_eq(chown(workerd, 0, 0), 0);
  ck_assert_int_eq(chmod(dir, 0777), 0);
  ck_assert_msg(refuses_naming(dir), "a directory the account can rename the daemon in");
  ck_assert_int_eq(chmod(dir, 0755), 0);
  /* Owned by the account, not writable: it may chmod it. */
  ck_assert_int_eq(chown(workerd, pw->pw_uid, pw->pw_gid), 0);
  ck_assert_int_eq(chmod(workerd, 0555), 0);
  ck_assert_msg(refuses_naming(workerd), "a worker daemon the account owns (0555) was accepted");
  ck_assert_int_eq(chown(workerd, 0, 0), 0);
  ck_assert_int_eq(chmod(workerd, 0755), 0);
  /* A web file deeper down. */
  {
    char sub[200], deep[240];
    snprintf(sub, sizeof(sub), "%s/css", web);
    snprintf(deep, sizeof(deep), "%s/app.css", sub);
    ck_assert_int_eq(mkdir(sub, 0755), 0);
    h_write_exec(deep, "body {}\n");
    ck_assert_int_eq(chmod(deep, 0666), 0);
    ck_assert_msg(refuses_naming(deep), "a web file below the web directory was accepted");
    ck_assert_int_eq(unlink(deep), 0);
    ck_assert_int_eq(rmdir(sub), 0);
  }
  /* On Slurm, a worker daemon the account can read (this test's copy is
   * 0755) would start dumpable in its jobs, holding their secret. */
  {
    char cmd[900];
    snprintf(cmd, sizeof(cmd),
             "timeout 10 %s --backend slurm --listen 127.0.0.1:0 --state-dir %s/state "
             "--workerd %s --web-dir %s 2>&1 | grep -qF '%s is readable by " ACCOUNT " (mode 0755'",
             MUSTER_CONTROLLER_BIN, dir, workerd, web, workerd);
    ck_assert_msg(system(cmd) == 0, "a Slurm controller took a worker daemon the account can read");
  }
  /* A web file that is a link to a file the account owns (read-only to it,
   * but it may chmod it). */
  {
    char owned[160], link[200];
    snprintf(owned, sizeof(owned), "%s/owned.js", dir);
    snprintf(link, sizeof(link), "%s/app.js", web);
    h_write_exec(owned, "// served\n");
    ck_assert_int_eq(chown(owned, pw->pw_uid, pw->pw_gid), 0);
    ck_assert_int_eq(chmod(owned, 0444), 0);
    ck_assert_int_eq(symlink(owned, link), 0);
    ck_assert_msg(refuses_naming(owned), "a web file linked to one the account owns was accepted");
    ck_assert_int_eq(unlink(link), 0);
    ck_assert_int_eq(unlink(owned), 0);
  }
  /* --workerd a link to a daemon in a directory the account can write. */
  {
    char open_dir[120], target[160], link[160], cmd[900];
    snprintf(open_dir, sizeof(open_dir), "%s/open", dir);
    snprintf(target, sizeof(target), "%s/muster-workerd", open_dir);
    snprintf(link, sizeof(link), "%s/workerd-link", dir);
    ck_assert_int_eq(mkdir(open_dir, 0777), 0);
    ck_assert_int_eq(chmod(open_dir, 0777), 0);
    sh("cp %s %s", workerd, target);
    ck_assert_int_eq(symlink(target, link), 0);
    snprintf(cmd, sizeof(cmd),
             "timeout 10 %s --listen 127.0.0.1:0 --state-dir %s/state --workerd %s --web-dir %s "
             "--workdir %s 2>&1 | grep -qF 'account " ACCOUNT " can write %s ('",
             MUSTER_CONTROLLER_BIN, dir, link, web, wk, open_dir);
    ck_assert_msg(system(cmd) == 0, "a --workerd link into a directory the account can write");
  }
  /* A state directory another account made first, in a sticky directory:
   * its to read, tokens and all. A root controller's check names it as the
   * account's; any controller (here one run by nobody, which has no such
   * check) refuses one that is not its own. */
  {
    char squat[80], cmd[900];
    snprintf(squat, sizeof(squat), "/tmp/muster-squat-%d", (int)getpid());
    snprintf(cmd, sizeof(cmd), "runuser -u " ACCOUNT " -- mkdir -m 777 %s", squat);
    ck_assert_msg(system(cmd) == 0, "%s failed", cmd);
    ck_assert_msg(refuses_naming_in(squat, squat),
                  "a state directory the account made was accepted");
    snprintf(cmd, sizeof(cmd),
             "timeout 10 runuser -u nobody -- %s --listen 127.0.0.1:0 --state-dir %s 2>&1 | "
             "grep -qF 'the state directory %s belongs to uid %u, not this controller'",
             MUSTER_CONTROLLER_BIN, squat, squat, (unsigned)pw->pw_uid);
    ck_assert_msg(system(cmd) == 0, "a state directory of another account was accepted");
    sh("rm -rf %s%s", squat, "");
  }
  sh("rm -rf %s%s", dir, "");
}
END_TEST

int main(void) {
  Suite *s = suite_create("sandbox");
  TCase *tc = tcase_create("sandbox");

  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, a_workers_script_cannot_rewrite_muster_nor_read_its_token);
  tcase_add_test(tc, a_workers_script_cannot_bind_the_controllers_port);
  tcase_add_test(tc, an_exec_command_cannot_read_the_token);
  tcase_add_test(tc, an_exec_command_of_a_root_controller_runs_as_the_default_account);
  tcase_add_test(tc, a_script_the_account_cannot_read_fails_naming_both);
  tcase_add_test(tc, a_worker_started_without_the_fork_server_runs_as_the_account_too);
  tcase_add_test(tc, a_controller_run_by_an_ordinary_user_hides_its_state_from_workers);
  tcase_add_test(tc, the_accounts_own_groups_stay_with_its_commands);
  tcase_add_test(tc, a_controller_whose_files_the_account_can_write_refuses_to_start);
  tcase_add_test(tc, the_controllers_session_handles_do_not_reach_workers);
  suite_add_tcase(s, tc);
  return check_run(s);
}
