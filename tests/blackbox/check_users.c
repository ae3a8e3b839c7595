/* check_users.c: black-box tests of users and their tokens
 * (`muster-controller user ...`, GET /api/v1/whoami): the real
 * muster-controller, its database and its CLI, as an operator uses them. */
#include "harness.h"

#include "account.h"

#include "../check_run.h"

#include <check.h>
#include <math.h>
#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static struct ctl_proc ctl;

static void start(void) {
  memset(&ctl, 0, sizeof(ctl));
  ctl.extra[0] = "--cpus";
  ctl.extra[1] = "4";
  h_start(&ctl);
}

/* Runs `muster-controller user ARGS --state-dir ctl.dir`: its stdout's
 * first line into out (size bytes), its stderr into err; returns its exit
 * code. */
static int user_cmd(const char *args, char *out, size_t size, char *err, size_t esize) {
  char cmd[1024], errf[200];
  FILE *p;
  int st;

  snprintf(errf, sizeof(errf), "%s.user-err", ctl.dir);
  snprintf(cmd, sizeof(cmd), "%s user %s --state-dir %s 2>%s", MUSTER_CONTROLLER_BIN, args, ctl.dir,
           errf);
  p = popen(cmd, "r");
  ck_assert_ptr_nonnull(p);
  out[0] = '\0';
  if (!fgets(out, (int)size, p))
    out[0] = '\0';
  out[strcspn(out, "\n")] = '\0';
  while (fgetc(p) != EOF)
    ;
  st = pclose(p);
  err[0] = '\0';
  if ((p = fopen(errf, "r"))) {
    size_t n = fread(err, 1, esize - 1, p);
    err[n] = '\0';
    fclose(p);
  }
  unlink(errf);
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* GET path with token: the status, *out the answer. */
static long get_as(const char *token, const char *path, json_t **out) {
  return h_http(&ctl, "GET", path, NULL, token, out, NULL);
}

/* Whether the bytes of the file path hold needle. */
static int file_has(const char *path, const char *needle) {
  FILE *f = fopen(path, "rb");
  char *buf;
  long n;
  int hit;

  if (!f)
    return 0;
  fseek(f, 0, SEEK_END);
  n = ftell(f);
  fseek(f, 0, SEEK_SET);
  buf = malloc((size_t)n + 1);
  ck_assert_ptr_nonnull(buf);
  n = (long)fread(buf, 1, (size_t)n, f);
  fclose(f);
  hit = memmem(buf, (size_t)n, needle, strlen(needle)) != NULL;
  free(buf);
  return hit;
}

/* What the worker launched with token prints (its code: code), once it
 * succeeded; or, with failure set, the sentence of its failure. */
static void worker_says(const char *token, const char *code, char *out, size_t size, int failure) {
  char body[400], path[160], *text = NULL;
  json_t *ws = NULL, *w;
  const char *id;

  snprintf(body, sizeof(body), "{\"n\": 1, \"cpu\": 0.1, \"kernel\": \"sh\", \"code\": \"%s\"}",
           code);
  ck_assert_int_eq(h_http(&ctl, "POST", "/api/v1/workers", body, token, &ws, NULL), 201);
  id = h_str(json_array_get(json_object_get(ws, "workers"), 0), "id");
  w = h_wait_status(&ctl, id, failure ? "failed" : "succeeded", 60);
  if (failure) {
    snprintf(out, size, "%s", h_str(w, "failure"));
  } else {
    snprintf(path, sizeof(path), "/api/v1/workers/%s/logs", id);
    ck_assert_int_eq(h_http(&ctl, "GET", path, NULL, token, NULL, &text), 200);
    snprintf(out, size, "%s", text);
    out[strcspn(out, "\n")] = '\0';
    free(text);
  }
  json_decref(w);
  json_decref(ws);
}

/* Workers of two users run as their two unix accounts (--unix-user), as
 * Slurm runs a job as its owner; a user without one, as the controller's
 * --run-as; an account that is not there fails the worker saying so; root
 * is never one. The accounts are scripts/test.sh's. */
START_TEST(workers_of_two_users_run_as_their_two_accounts) {
  static const char *const acct[2] = {"muster-test-u1", "muster-test-u2"};
  char tok[3][128], out[600], err[512], args[200], want[32];
  struct passwd *pw;

  if (geteuid() != 0 || !getpwnam(acct[0]) || !getpwnam(acct[1])) {
    fprintf(stderr, "skipped: needs root and the accounts %s and %s (scripts/test.sh)\n", acct[0],
            acct[1]);
    return;
  }
  start();
  for (int i = 0; i < 2; i++) {
    snprintf(args, sizeof(args), "add u%d --unix-user %s", i + 1, acct[i]);
    ck_assert_int_eq(user_cmd(args, tok[i], sizeof(tok[i]), err, sizeof(err)), 0);
  }
  ck_assert_int_eq(user_cmd("add u3", tok[2], sizeof(tok[2]), err, sizeof(err)), 0);
  for (int i = 0; i < 2; i++) {
    pw = getpwnam(acct[i]);
    snprintf(want, sizeof(want), "%u %s", (unsigned)pw->pw_uid, acct[i]);
    worker_says(tok[i], "echo $(id -u) $(id -un)", out, sizeof(out), 0);
    ck_assert_msg(strcmp(out, want) == 0, "u%d's worker ran as \"%s\", not \"%s\"", i + 1, out,
                  want);
  }
  for (int i = 0; i < 3; i++) {
    json_t *who = NULL;
    ck_assert_int_eq(get_as(tok[i], "/api/v1/whoami", &who), 200);
    ck_assert_str_eq(h_str(who, "run_as"), i < 2 ? acct[i] : MUSTER_DEFAULT_ACCOUNT);
    json_decref(who);
  }
  pw = getpwnam(MUSTER_DEFAULT_ACCOUNT);
  ck_assert_ptr_nonnull(pw);
  snprintf(want, sizeof(want), "%u", (unsigned)pw->pw_uid);
  worker_says(tok[2], "id -u", out, sizeof(out), 0);
  ck_assert_str_eq(out, want);
  /* an account removed from the host after the user was made */
  ck_assert_int_eq(user_cmd("add u4 --unix-user muster-no-such-account", tok[2], sizeof(tok[2]),
                            err, sizeof(err)),
                   0);
  worker_says(tok[2], "id -u", out, sizeof(out), 1);
  ck_assert_msg(strstr(out, "its user's unix account muster-no-such-account does not exist") !=
                    NULL,
                "the failure: %s", out);
  ck_assert_int_eq(user_cmd("add u5 --unix-user root", out, sizeof(out), err, sizeof(err)), 2);
  ck_assert_msg(strstr(err, "root is root or in root's group") != NULL, "add said: %s", err);
  {
    json_t *ans = NULL;
    ck_assert_int_eq(h_http(&ctl, "POST", "/api/v1/users",
                            "{\"name\": \"u6\", \"unix_user\": \"a b\"}", "", &ans, NULL),
                     422);
    ck_assert_str_eq(h_str(json_object_get(ans, "error"), "message"),
                     "unix_user: a b is not an account name");
    json_decref(ans);
  }
  h_finish(&ctl);
}
END_TEST

/* A user added prints a token once; the token names its user (whoami); a
 * user who is no administrator is refused the rest, saying why; an
 * administrator is served; the state directory's token is "admin". */
START_TEST(a_users_token_names_the_user) {
  char alice[128], carol[128], err[512];
  json_t *who = NULL;

  start();
  ck_assert_int_eq(user_cmd("add alice --max-cpu 8", alice, sizeof(alice), err, sizeof(err)), 0);
  ck_assert_msg(strncmp(alice, "mu_", 3) == 0 && strlen(alice) == 67, "the token: %s", alice);
  ck_assert_int_eq(user_cmd("add carol --admin", carol, sizeof(carol), err, sizeof(err)), 0);
  ck_assert_int_eq(get_as(alice, "/api/v1/whoami", &who), 200);
  ck_assert_str_eq(h_str(who, "user"), "alice");
  ck_assert(json_is_false(json_object_get(who, "admin")));
  json_decref(who);
  ck_assert_int_eq(get_as(carol, "/api/v1/whoami", &who), 200);
  ck_assert_str_eq(h_str(who, "user"), "carol");
  ck_assert(json_is_true(json_object_get(who, "admin")));
  json_decref(who);
  ck_assert_int_eq(get_as("", "/api/v1/whoami", &who), 200);
  ck_assert_str_eq(h_str(who, "user"), "admin");
  json_decref(who);
  ck_assert_int_eq(get_as(alice, "/api/v1/users", NULL), 403);       /* administrators' */
  ck_assert_int_eq(get_as(alice, "/api/v1/users/alice", NULL), 200); /* one's own */
  ck_assert_int_eq(get_as(alice, "/api/v1/users/carol", NULL), 404);
  ck_assert_int_eq(get_as(carol, "/api/v1/workers", NULL), 200);
  ck_assert_int_eq(user_cmd("list", carol, sizeof(carol), err, sizeof(err)), 0);
  ck_assert_msg(strncmp(carol, "NAME", 4) == 0, "user list's first line: %s", carol);
  h_finish(&ctl);
}
END_TEST

/* A new token revokes the old one at once, the controller running; a
 * token of a user's shape that no user has is refused too. */
START_TEST(a_new_token_revokes_the_old_one) {
  char old[128], fresh[128], err[512];

  start();
  ck_assert_int_eq(user_cmd("add dora --admin", old, sizeof(old), err, sizeof(err)), 0);
  ck_assert_int_eq(get_as(old, "/api/v1/workers", NULL), 200);
  ck_assert_int_eq(user_cmd("token dora", fresh, sizeof(fresh), err, sizeof(err)), 0);
  ck_assert_str_ne(old, fresh);
  ck_assert_int_eq(get_as(old, "/api/v1/workers", NULL), 401);
  ck_assert_int_eq(get_as(fresh, "/api/v1/workers", NULL), 200);
  /* the same prefix, another token */
  fresh[66] = fresh[66] == '0' ? '1' : '0';
  ck_assert_int_eq(get_as(fresh, "/api/v1/workers", NULL), 401);
  h_finish(&ctl);
}
END_TEST

/* The database keeps no token in clear, only its hash. */
START_TEST(tokens_are_not_in_the_database_in_clear) {
  char token[128], err[512], path[200], wal[220];

  start();
  ck_assert_int_eq(user_cmd("add erin", token, sizeof(token), err, sizeof(err)), 0);
  snprintf(path, sizeof(path), "%s/muster.db", ctl.dir);
  snprintf(wal, sizeof(wal), "%s-wal", path);
  ck_assert_msg(!file_has(path, token) && !file_has(wal, token), "the token is in the database");
  ck_assert_msg(!file_has(path, token + 3) && !file_has(wal, token + 3),
                "the token's digits are in the database");
  h_finish(&ctl);
}
END_TEST

/* A user with live workers is not removed; once they are stopped, it is,
 * and its token is dead. Names are checked. */
START_TEST(a_user_with_live_workers_is_not_removed) {
  char token[128], out[128], err[512], auth[160], id[16];
  json_t *ws = NULL;
  long st;

  start();
  ck_assert_int_eq(user_cmd("add fay --admin", token, sizeof(token), err, sizeof(err)), 0);
  st = h_http(&ctl, "POST", "/api/v1/workers", "{\"n\": 1, \"cpu\": 0.1}", token, &ws, NULL);
  ck_assert_int_eq(st, 201);
  snprintf(id, sizeof(id), "%s", h_str(json_array_get(json_object_get(ws, "workers"), 0), "id"));
  ck_assert_str_eq(h_str(json_array_get(json_object_get(ws, "workers"), 0), "user"), "fay");
  json_decref(ws);
  ck_assert_int_eq(user_cmd("remove fay", out, sizeof(out), err, sizeof(err)), 1);
  ck_assert_msg(strstr(err, "fay has 1 live worker") != NULL, "remove said: %s", err);
  ck_assert_int_eq(get_as(token, "/api/v1/whoami", NULL), 200);
  snprintf(auth, sizeof(auth), "/api/v1/workers/%s", id);
  ck_assert_int_eq(h_http(&ctl, "DELETE", auth, NULL, token, NULL, NULL), 200);
  json_decref(h_wait_status(&ctl, id, "stopped", 30));
  ck_assert_int_eq(user_cmd("remove fay", out, sizeof(out), err, sizeof(err)), 0);
  ck_assert_int_eq(get_as(token, "/api/v1/whoami", NULL), 401);
  ck_assert_int_eq(user_cmd("add Fay", out, sizeof(out), err, sizeof(err)), 2);
  ck_assert_msg(strstr(err, "is not a user name") != NULL, "add Fay said: %s", err);
  ck_assert_int_eq(user_cmd("add admin", out, sizeof(out), err, sizeof(err)), 2);
  ck_assert_int_eq(user_cmd("token nobody", out, sizeof(out), err, sizeof(err)), 2);
  ck_assert_msg(strstr(err, "there is no user nobody") != NULL, "token nobody said: %s", err);
  ck_assert_int_eq(user_cmd("remove nobody", out, sizeof(out), err, sizeof(err)), 2);
  ck_assert_int_eq(user_cmd("add hal --max-gpus 1.5", out, sizeof(out), err, sizeof(err)), 2);
  ck_assert_int_eq(user_cmd("add gus", out, sizeof(out), err, sizeof(err)), 0);
  ck_assert_int_eq(user_cmd("add gus", out, sizeof(out), err, sizeof(err)), 2);
  ck_assert_msg(strstr(err, "the name gus is taken") != NULL, "add gus again said: %s", err);
  /* a removed user's name is never another's */
  ck_assert_int_eq(user_cmd("add fay", out, sizeof(out), err, sizeof(err)), 2);
  ck_assert_msg(strstr(err, "the name fay is taken") != NULL, "add fay again said: %s", err);
  h_finish(&ctl);
}
END_TEST

/* Removing a user who owns live workers is refused, saying how; with
 * ?stop=1 their workers are stopped and the user removed at once. */
START_TEST(removing_a_user_with_stop_stops_their_workers) {
  char token[128], err[512], path[64], ids[2][16];
  json_t *ws = NULL, *ans = NULL;

  start();
  ck_assert_int_eq(user_cmd("add ivy", token, sizeof(token), err, sizeof(err)), 0);
  ck_assert_int_eq(
      h_http(&ctl, "POST", "/api/v1/workers", "{\"n\": 2, \"cpu\": 0.1}", token, &ws, NULL), 201);
  for (int i = 0; i < 2; i++)
    snprintf(ids[i], sizeof(ids[i]), "%s",
             h_str(json_array_get(json_object_get(ws, "workers"), (size_t)i), "id"));
  json_decref(ws);
  ck_assert_int_eq(h_http(&ctl, "DELETE", "/api/v1/users/ivy", NULL, "", &ans, NULL), 409);
  ck_assert_msg(strstr(h_str(json_object_get(ans, "error"), "message"), "?stop=1") != NULL,
                "the refusal: %s", h_str(json_object_get(ans, "error"), "message"));
  json_decref(ans);
  ck_assert_int_eq(h_http(&ctl, "DELETE", "/api/v1/users/ivy?stop=2", NULL, "", NULL, NULL), 422);
  ck_assert_int_eq(h_http(&ctl, "DELETE", "/api/v1/users/ivy?stop=1", NULL, "", &ans, NULL), 200);
  ck_assert_str_eq(h_str(ans, "removed"), "ivy");
  json_decref(ans);
  for (int i = 0; i < 2; i++) {
    json_t *w = h_worker(&ctl, ids[i]);
    ck_assert_str_eq(h_str(w, "status"), "stopped");
    json_decref(w);
  }
  ck_assert_int_eq(get_as(token, "/api/v1/whoami", NULL), 401);
  snprintf(path, sizeof(path), "/api/v1/users/ivy");
  ck_assert_int_eq(get_as("", path, NULL), 404);
  h_finish(&ctl);
}
END_TEST

/* The same through the REST calls, as an administrator makes them; a
 * user who is no administrator may not. */
START_TEST(administrators_manage_users_through_the_api) {
  json_t *ans = NULL;
  char token[128], fresh[128];
  long st;

  start();
  st = h_http(&ctl, "POST", "/api/v1/users",
              "{\"name\": \"ivy\", \"max_cpu\": 4, \"max_workers\": 2}", "", &ans, NULL);
  ck_assert_int_eq(st, 201);
  snprintf(token, sizeof(token), "%s", h_str(ans, "token"));
  ck_assert_str_eq(h_str(json_object_get(ans, "user"), "name"), "ivy");
  ck_assert(json_integer_value(json_object_get(json_object_get(ans, "user"), "max_workers")) == 2);
  json_decref(ans);
  ck_assert_int_eq(get_as(token, "/api/v1/whoami", NULL), 200);
  ck_assert_int_eq(h_http(&ctl, "POST", "/api/v1/users", "{\"name\": \"ivy\"}", "", NULL, NULL),
                   409);
  ck_assert_int_eq(h_http(&ctl, "POST", "/api/v1/users", "{\"name\": \"Ivy\"}", "", NULL, NULL),
                   422);
  ck_assert_int_eq(h_http(&ctl, "POST", "/api/v1/users", "{\"name\": \"jo\", \"max_gpus\": 1.5}",
                          "", NULL, NULL),
                   422);
  ck_assert_int_eq(get_as("", "/api/v1/users", &ans), 200);
  ck_assert_int_eq(json_array_size(json_object_get(ans, "users")), 1);
  json_decref(ans);
  ck_assert_int_eq(h_http(&ctl, "POST", "/api/v1/users/ivy/token", NULL, "", &ans, NULL), 200);
  snprintf(fresh, sizeof(fresh), "%s", h_str(ans, "token"));
  json_decref(ans);
  ck_assert_int_eq(get_as(token, "/api/v1/whoami", NULL), 401);
  ck_assert_int_eq(get_as(fresh, "/api/v1/whoami", NULL), 200);
  ck_assert_int_eq(h_http(&ctl, "POST", "/api/v1/users", "{\"name\": \"kit\"}", fresh, NULL, NULL),
                   403);
  ck_assert_int_eq(h_http(&ctl, "DELETE", "/api/v1/users/ivy", NULL, "", NULL, NULL), 200);
  ck_assert_int_eq(get_as(fresh, "/api/v1/whoami", NULL), 401);
  ck_assert_int_eq(h_http(&ctl, "DELETE", "/api/v1/users/ivy", NULL, "", NULL, NULL), 404);
  h_finish(&ctl);
}
END_TEST

/* A launch past a user's limits is refused with 422 naming the limit,
 * what they hold and what it asks, and launches nothing; within them it
 * goes; /metrics has what each user holds. */
START_TEST(a_launch_past_a_users_limits_is_refused_and_changes_nothing) {
  char token[128], err[512];
  json_t *ans = NULL;
  long st, before;

  start();
  ck_assert_int_eq(user_cmd("add lee --admin --max-cpu 1 --max-workers 3", token, sizeof(token),
                            err, sizeof(err)),
                   0);
  st = h_http(&ctl, "POST", "/api/v1/workers", "{\"n\": 2, \"cpu\": 0.4}", token, NULL, NULL);
  ck_assert_int_eq(st, 201);
  ck_assert_int_eq(get_as("", "/api/v1/workers", &ans), 200);
  before = (long)json_array_size(json_object_get(ans, "workers"));
  json_decref(ans);
  st = h_http(&ctl, "POST", "/api/v1/workers", "{\"n\": 1, \"cpu\": 0.5}", token, &ans, NULL);
  ck_assert_int_eq(st, 422);
  ck_assert_str_eq(h_str(json_object_get(ans, "error"), "field"), "cpu");
  ck_assert_str_eq(h_str(json_object_get(ans, "error"), "message"),
                   "lee holds 0.8 of their 1 cores; this launch asks for 0.5 more");
  json_decref(ans);
  st = h_http(&ctl, "POST", "/api/v1/workers", "{\"n\": 2, \"cpu\": 0.05}", token, &ans, NULL);
  ck_assert_int_eq(st, 422);
  ck_assert_str_eq(h_str(json_object_get(ans, "error"), "field"), "n");
  json_decref(ans);
  ck_assert_int_eq(get_as("", "/api/v1/workers", &ans), 200);
  ck_assert_int_eq((long)json_array_size(json_object_get(ans, "workers")), before);
  json_decref(ans);
  st = h_http(&ctl, "POST", "/api/v1/workers", "{\"n\": 1, \"cpu\": 0.2}", token, NULL, NULL);
  ck_assert_int_eq(st, 201);
  ck_assert(h_metric(&ctl, "muster_user_workers{user=\"lee\"}") == 3);
  ck_assert(h_metric(&ctl, "muster_user_cpu{user=\"lee\"}") > 0.99);
  /* A controller killed and started again holds the same against lee:
   * what each user holds is rebuilt with the live workers, owners and all. */
  h_kill9(&ctl);
  h_restart(&ctl);
  ck_assert(h_metric(&ctl, "muster_user_workers{user=\"lee\"}") == 3);
  st = h_http(&ctl, "POST", "/api/v1/workers", "{\"n\": 1, \"cpu\": 0.5}", token, &ans, NULL);
  ck_assert_int_eq(st, 422);
  ck_assert_str_eq(h_str(json_object_get(ans, "error"), "message"),
                   "lee holds 1 of their 1 cores; this launch asks for 0.5 more");
  json_decref(ans);
  /* Their workers stopped and ended, lee holds nothing again: as much as
   * the limits allow goes. */
  ck_assert_int_eq(h_http(&ctl, "POST", "/api/v1/workers/stop", "{}", token, NULL, NULL), 200);
  for (double t0 = h_now();
       h_metric(&ctl, "muster_workers{status=\"stopped\"}") < 3 && h_now() - t0 < 30;)
    usleep(50 * 1000);
  st = h_http(&ctl, "POST", "/api/v1/workers", "{\"n\": 3, \"cpu\": 0.3}", token, &ans, NULL);
  ck_assert_msg(st == 201, "lee's launch within the limits answered %ld: %s", st,
                h_str(json_object_get(ans, "error"), "message"));
  json_decref(ans);
  ck_assert(h_metric(&ctl, "muster_user_workers{user=\"lee\"}") == 3);
  ck_assert(fabs(h_metric(&ctl, "muster_user_cpu{user=\"lee\"}") - 0.9) < 1e-9);
  /* the bootstrap administrator has no limits */
  ck_assert_int_eq(
      h_http(&ctl, "POST", "/api/v1/workers", "{\"n\": 1, \"cpu\": 2}", "", NULL, NULL), 201);
  h_finish(&ctl);
}
END_TEST

/* The events the stream at path (token in its query) sends within 2 s. */
static char *events_for(const char *token) {
  char cmd[600], *buf = calloc(1, 65536);
  size_t n = 0;
  FILE *p;

  ck_assert_ptr_nonnull(buf);
  snprintf(cmd, sizeof(cmd), "curl -s -N --max-time 2 '%s/api/v1/events?since=0&access_token=%s'",
           ctl.url, token);
  p = popen(cmd, "r");
  ck_assert_ptr_nonnull(p);
  n = fread(buf, 1, 65535, p);
  buf[n] = '\0';
  pclose(p);
  return buf;
}

/* Two users who are no administrators and one who is: each user's calls
 * see only their own workers, sessions and runs, another's answering 404
 * as if it did not exist (every endpoint tried with the other's ids); the
 * administrator's see both. */
START_TEST(each_user_sees_only_their_own) {
  char alice[128], bob[128], carol[128], err[512], path[300], a[16], b[16], run[32];
  json_t *ans = NULL;
  char *ev;
  long st;

  start();
  ck_assert_int_eq(user_cmd("add alice", alice, sizeof(alice), err, sizeof(err)), 0);
  ck_assert_int_eq(user_cmd("add bob", bob, sizeof(bob), err, sizeof(err)), 0);
  ck_assert_int_eq(user_cmd("add carol --admin", carol, sizeof(carol), err, sizeof(err)), 0);
  /* both in a session each calls "default" */
  ck_assert_int_eq(
      h_http(&ctl, "POST", "/api/v1/workers", "{\"n\": 1, \"cpu\": 0.1}", alice, &ans, NULL), 201);
  snprintf(a, sizeof(a), "%s", h_str(json_array_get(json_object_get(ans, "workers"), 0), "id"));
  ck_assert_str_eq(h_str(json_array_get(json_object_get(ans, "workers"), 0), "session"),
                   "alice/default");
  json_decref(ans);
  ck_assert_int_eq(
      h_http(&ctl, "POST", "/api/v1/workers", "{\"n\": 1, \"cpu\": 0.1}", bob, &ans, NULL), 201);
  snprintf(b, sizeof(b), "%s", h_str(json_array_get(json_object_get(ans, "workers"), 0), "id"));
  json_decref(ans);
  json_decref(h_wait_status(&ctl, a, "running", 30));
  json_decref(h_wait_status(&ctl, b, "running", 30));

  /* a session named as stored (what a worker's MUSTER_SESSION holds): one's
   * own, not another's; an administrator's for a user, not for a name
   * nobody has */
  ck_assert_int_eq(get_as(alice, "/api/v1/workers?session=alice/default", &ans), 200);
  ck_assert_int_eq(json_array_size(json_object_get(ans, "workers")), 1);
  json_decref(ans);
  ck_assert_int_eq(h_http(&ctl, "POST", "/api/v1/workers",
                          "{\"n\": 1, \"cpu\": 0.1, \"session\": \"alice/default\"}", bob, NULL,
                          NULL),
                   404);
  ck_assert_int_eq(h_http(&ctl, "PUT", "/api/v1/sessions/ghost/x/lease",
                          "{\"ttl_seconds\": 30, \"holder\": \"h\"}", carol, NULL, NULL),
                   404);
  /* lists */
  ck_assert_int_eq(get_as(alice, "/api/v1/workers", &ans), 200);
  ck_assert_int_eq(json_array_size(json_object_get(ans, "workers")), 1);
  ck_assert_str_eq(h_str(json_array_get(json_object_get(ans, "workers"), 0), "id"), a);
  json_decref(ans);
  ck_assert_int_eq(get_as(alice, "/api/v1/workers?session=bob/default", &ans), 200);
  ck_assert_int_eq(json_array_size(json_object_get(ans, "workers")), 0);
  json_decref(ans);
  ck_assert_int_eq(get_as(carol, "/api/v1/workers", &ans), 200);
  ck_assert_int_eq(json_array_size(json_object_get(ans, "workers")), 2);
  json_decref(ans);
  /* another's worker, every way */
  snprintf(path, sizeof(path), "/api/v1/workers/%s", b);
  ck_assert_int_eq(get_as(alice, path, NULL), 404);
  ck_assert_int_eq(get_as(carol, path, NULL), 200);
  snprintf(path, sizeof(path), "/api/v1/workers/%s/events", b);
  ck_assert_int_eq(get_as(alice, path, NULL), 404);
  snprintf(path, sizeof(path), "/api/v1/workers/%s/logs", b);
  ck_assert_int_eq(get_as(alice, path, NULL), 404);
  snprintf(path, sizeof(path), "{\"ids\": [\"%s\"]}", b);
  ck_assert_int_eq(h_http(&ctl, "POST", "/api/v1/workers/await", path, alice, NULL, NULL), 404);
  ck_assert_int_eq(h_http(&ctl, "POST", "/api/v1/workers/stop", path, alice, NULL, NULL), 404);
  snprintf(path, sizeof(path), "/api/v1/workers/%s", b);
  ck_assert_int_eq(h_http(&ctl, "DELETE", path, NULL, alice, NULL, NULL), 404);
  ck_assert_int_eq(h_http(&ctl, "POST", "/api/v1/workers/stop", "{\"session\": \"bob/default\"}",
                          alice, &ans, NULL),
                   200);
  ck_assert_int_eq(json_array_size(json_object_get(ans, "workers")), 0);
  json_decref(ans);
  snprintf(path, sizeof(path), "/api/v1/workers/%s", b);
  ck_assert_int_eq(get_as(bob, path, &ans), 200);
  ck_assert_str_eq(h_str(ans, "status"), "running");
  json_decref(ans);
  /* sessions: one's own by its bare name, with its exec token; not another's */
  ck_assert_int_eq(get_as(alice, "/api/v1/sessions/default", &ans), 200);
  ck_assert_str_eq(h_str(ans, "name"), "alice/default");
  ck_assert_ptr_nonnull(json_string_value(json_object_get(ans, "exec_token")));
  json_decref(ans);
  ck_assert_int_eq(get_as(alice, "/api/v1/sessions/bob/default", NULL), 404);
  ck_assert_int_eq(get_as(carol, "/api/v1/sessions/bob/default", NULL), 200);
  ck_assert_int_eq(h_http(&ctl, "PUT", "/api/v1/sessions/bob/default/lease",
                          "{\"ttl_seconds\": 30, \"holder\": \"h\"}", alice, NULL, NULL),
                   404);
  ck_assert_int_eq(get_as(alice, "/api/v1/sessions", &ans), 200);
  ck_assert_int_eq(json_array_size(json_object_get(ans, "sessions")), 1);
  json_decref(ans);
  /* runs */
  ck_assert_int_eq(h_http(&ctl, "PUT", "/api/v1/sessions/default/lease",
                          "{\"ttl_seconds\": 30, \"holder\": \"h\", \"stop_workers\": false}",
                          alice, NULL, NULL),
                   201);
  st =
      h_http(&ctl, "POST", "/api/v1/runs",
             "{\"mode\": \"exec\", \"command\": [\"true\"], \"holder\": \"h\"}", alice, &ans, NULL);
  ck_assert_int_eq(st, 201);
  snprintf(run, sizeof(run), "%s", h_str(ans, "id"));
  json_decref(ans);
  snprintf(path, sizeof(path), "/api/v1/runs/%s", run);
  ck_assert_int_eq(get_as(alice, path, NULL), 200);
  ck_assert_int_eq(get_as(bob, path, NULL), 404);
  ck_assert_int_eq(get_as(bob, "/api/v1/runs", &ans), 200);
  ck_assert_int_eq(json_array_size(json_object_get(ans, "runs")), 0);
  json_decref(ans);
  snprintf(path, sizeof(path), "/api/v1/runs/%s/end", run);
  ck_assert_int_eq(h_http(&ctl, "POST", path, "{\"status\": \"stopped\"}", bob, NULL, NULL), 404);
  /* the event stream: one's own workers' events alone */
  ev = events_for(alice);
  ck_assert_msg(strstr(ev, a) && !strstr(ev, b), "alice's stream: %.400s", ev);
  free(ev);
  ev = events_for(carol);
  ck_assert_msg(strstr(ev, a) && strstr(ev, b), "carol's stream: %.400s", ev);
  free(ev);
  /* events and failures say who did what */
  snprintf(path, sizeof(path), "/api/v1/workers/%s/events", a);
  ck_assert_int_eq(get_as(alice, path, &ans), 200);
  ck_assert_str_eq(h_str(json_array_get(json_object_get(ans, "events"), 0), "detail"),
                   "launched by alice");
  json_decref(ans);
  snprintf(path, sizeof(path), "/api/v1/workers/%s", b);
  ck_assert_int_eq(h_http(&ctl, "DELETE", path, NULL, carol, &ans, NULL), 200);
  json_decref(ans);
  json_decref(h_wait_status(&ctl, b, "stopped", 30));
  snprintf(path, sizeof(path), "/api/v1/workers/%s/events", b);
  ck_assert_int_eq(get_as(carol, path, &ans), 200);
  {
    json_t *evs = json_object_get(ans, "events"), *e;
    size_t k;
    int said = 0;
    json_array_foreach(evs, k, e) said |= json_is_string(json_object_get(e, "detail")) &&
                                          strcmp(h_str(e, "detail"), "stopped by carol") == 0;
    ck_assert_msg(said, "no event says \"stopped by carol\"");
  }
  json_decref(ans);
  h_finish(&ctl);
}
END_TEST

int main(void) {
  Suite *s = suite_create("users");
  TCase *tc = tcase_create("users");

  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, a_users_token_names_the_user);
  tcase_add_test(tc, each_user_sees_only_their_own);
  tcase_add_test(tc, a_new_token_revokes_the_old_one);
  tcase_add_test(tc, tokens_are_not_in_the_database_in_clear);
  tcase_add_test(tc, a_user_with_live_workers_is_not_removed);
  tcase_add_test(tc, administrators_manage_users_through_the_api);
  tcase_add_test(tc, a_launch_past_a_users_limits_is_refused_and_changes_nothing);
  tcase_add_test(tc, workers_of_two_users_run_as_their_two_accounts);
  tcase_add_test(tc, removing_a_user_with_stop_stops_their_workers);
  suite_add_tcase(s, tc);
  return check_run(s);
}
