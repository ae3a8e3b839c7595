/* check_sdk.c: libmuster against a real controller: typed results, error
 * mapping, streams and discovery. */
#include "harness.h"
#include "muster.h"

#include "../check_run.h"

#include <arpa/inet.h>
#include <check.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

static struct ctl_proc ctl;
static muster_client *cl;

static void up(void) {
  memset(&ctl, 0, sizeof(ctl));
  ctl.extra[0] = "--cpus";
  ctl.extra[1] = "8";
  h_start(&ctl);
  ck_assert_int_eq(muster_client_new(ctl.url, ctl.token, &cl), 0);
}

static void down(void) {
  muster_client_free(cl);
  cl = NULL;
  h_finish(&ctl);
}

static void ids_of(const muster_worker_list *l, const char **ids) {
  for (size_t i = 0; i < l->count; i++)
    ids[i] = l->items[i].id;
}

START_TEST(launch_returns_typed_workers) {
  muster_launch_opts o;
  muster_worker_list ws;
  const char *env[] = {"A=1", "B=two"};

  up();
  muster_launch_opts_init(&o);
  o.n = 3;
  o.cpu = 0.25;
  o.memory = 0.5;
  o.name = "trio";
  o.role = "ps";
  o.session = "sdk";
  o.env = env;
  o.nenv = 2;
  ck_assert_int_eq(muster_launch(cl, &o, &ws), 0);
  ck_assert_int_eq(ws.count, 3);
  for (size_t i = 0; i < ws.count; i++) {
    const muster_worker *w = &ws.items[i];
    ck_assert_int_eq(strlen(w->id), 12);
    ck_assert(strncmp(w->id, "w-", 2) == 0);
    ck_assert(w->status == MUSTER_SCHEDULING || w->status == MUSTER_STARTING);
    ck_assert(w->cpu == 0.25 && w->memory == 0.5 && w->nvidia_gpu == 0);
    ck_assert_str_eq(w->name, "trio");
    ck_assert_str_eq(w->role, "ps");
    ck_assert_str_eq(w->session, "sdk");
    ck_assert_ptr_null(w->ip_address);
    ck_assert(!w->has_exit_code);
  }
  muster_worker_list_free(&ws);
  muster_worker_list_free(&ws); /* a second free is harmless */
  down();
}
END_TEST

START_TEST(await_running_then_completion) {
  muster_launch_opts o;
  muster_worker_list ws, bad;
  muster_await_result r;
  const char *ids[4];

  up();
  muster_launch_opts_init(&o);
  o.n = 2;
  o.cpu = 0.1;
  /* Still running when the await for running answers, even where a
   * loaded machine makes one worker's start a second later than the
   * other's. */
  o.code = "import time; time.sleep(10)";
  ck_assert_int_eq(muster_launch(cl, &o, &ws), 0);
  ids_of(&ws, ids);
  ck_assert_int_eq(muster_await(cl, ids, 2, 0, 60, &r), 0);
  ck_assert_int_eq(r.timed_out, 0);
  ck_assert_msg(r.failures.count == 0, "a worker failed (status %d): %s",
                r.failures.count ? (int)r.failures.items[0].status : -1,
                r.failures.count && r.failures.items[0].failure ? r.failures.items[0].failure
                                                                : "?");
  ck_assert_int_eq(r.workers.count, 2);
  ck_assert(r.workers.items[0].status == MUSTER_RUNNING);
  ck_assert_ptr_nonnull(r.workers.items[0].ip_address);
  ck_assert_ptr_nonnull(r.workers.items[1].ip_address);
  ck_assert_str_ne(r.workers.items[0].ip_address, r.workers.items[1].ip_address);
  ck_assert_int_gt(r.workers.items[0].exec_port, 0);
  muster_await_result_free(&r);

  o.n = 1;
  o.code = "import sys; sys.exit(3)";
  ck_assert_int_eq(muster_launch(cl, &o, &bad), 0);
  ids[2] = bad.items[0].id;
  ck_assert_int_eq(muster_await(cl, ids, 3, 1, 60, &r), 0);
  ck_assert_int_eq(r.workers.count, 2);
  ck_assert_int_eq(r.failures.count, 1);
  ck_assert(r.failures.items[0].status == MUSTER_FAILED);
  ck_assert(r.failures.items[0].has_exit_code);
  ck_assert_int_eq(r.failures.items[0].exit_code, 3);
  ck_assert_ptr_nonnull(strstr(r.failures.items[0].failure, "code 3"));
  muster_await_result_free(&r);
  muster_worker_list_free(&ws);
  muster_worker_list_free(&bad);
  down();
}
END_TEST

START_TEST(get_list_and_stop) {
  muster_launch_opts o;
  muster_worker_list a, b, l, stopped;
  muster_worker w;
  muster_await_result r;
  const char *ids[3];
  int64_t seq = -1;

  up();
  muster_launch_opts_init(&o);
  o.n = 2;
  o.cpu = 0.1;
  o.session = "one";
  ck_assert_int_eq(muster_launch(cl, &o, &a), 0);
  o.n = 1;
  o.session = "two";
  o.role = "ps";
  ck_assert_int_eq(muster_launch(cl, &o, &b), 0);
  ids_of(&a, ids);
  ids[2] = b.items[0].id;
  ck_assert_int_eq(muster_await(cl, ids, 3, 0, 20, &r), 0);
  muster_await_result_free(&r);

  ck_assert_int_eq(muster_get(cl, ids[0], &w), 0);
  ck_assert_str_eq(w.id, ids[0]);
  ck_assert(w.status == MUSTER_RUNNING);
  ck_assert_str_eq(w.backend, "local");
  ck_assert_ptr_nonnull(w.running_at);
  muster_worker_cleanup(&w);

  ck_assert_int_eq(muster_list(cl, 0, "one", NULL, &l, &seq), 0);
  ck_assert_int_eq(l.count, 2);
  /* 3 workers x (created, starting, running) = 9 events so far. */
  ck_assert_int_eq(seq, 9);
  muster_worker_list_free(&l);
  ck_assert_int_eq(muster_list(cl, 0, NULL, "ps", &l, NULL), 0);
  ck_assert_int_eq(l.count, 1);
  ck_assert_str_eq(l.items[0].id, ids[2]);
  muster_worker_list_free(&l);

  /* Stop by id, then every live worker of a session. */
  ck_assert_int_eq(muster_stop(cl, &ids[0], 1, NULL, &stopped), 0);
  ck_assert_int_eq(stopped.count, 1);
  ck_assert(stopped.items[0].status == MUSTER_STOPPED);
  muster_worker_list_free(&stopped);
  ck_assert_int_eq(muster_stop(cl, NULL, 0, "one", &stopped), 0);
  ck_assert_int_eq(stopped.count, 1);
  ck_assert_str_eq(stopped.items[0].id, ids[1]);
  muster_worker_list_free(&stopped);
  ck_assert_int_eq(muster_list(cl, 1u << MUSTER_RUNNING, NULL, NULL, &l, NULL), 0);
  ck_assert_int_eq(l.count, 1);
  ck_assert_str_eq(l.items[0].id, ids[2]);
  muster_worker_list_free(&l);
  ck_assert_int_eq(muster_list(cl, 1u << MUSTER_STOPPED, NULL, NULL, &l, NULL), 0);
  ck_assert_int_eq(l.count, 2);
  muster_worker_list_free(&l);
  muster_worker_list_free(&a);
  muster_worker_list_free(&b);
  down();
}
END_TEST

struct text {
  char buf[8192];
  size_t len;
  int stop_after;
  int calls;
};

static int gather(void *arg, const char *data, size_t len) {
  struct text *t = arg;

  if (t->len + len >= sizeof(t->buf))
    len = sizeof(t->buf) - 1 - t->len;
  memcpy(t->buf + t->len, data, len);
  t->len += len;
  t->buf[t->len] = '\0';
  t->calls++;
  return t->stop_after && t->calls >= t->stop_after;
}

START_TEST(logs_plain_and_followed) {
  muster_launch_opts o;
  muster_worker_list ws;
  struct text t = {.len = 0};
  double t0;

  up();
  muster_launch_opts_init(&o);
  o.cpu = 0.1;
  o.kernel = "bash";
  o.code = "for i in 1 2 3; do echo out $i; echo err $i >&2; sleep 0.3; done";
  ck_assert_int_eq(muster_launch(cl, &o, &ws), 0);
  t0 = h_now();
  ck_assert_int_eq(muster_logs(cl, ws.items[0].id, MUSTER_STDOUT, 0, 1, gather, &t), 0);
  ck_assert_msg(h_now() - t0 < 15, "follow did not end with the worker");
  ck_assert_str_eq(t.buf, "out 1\nout 2\nout 3\n");
  memset(&t, 0, sizeof(t));
  ck_assert_int_eq(muster_logs(cl, ws.items[0].id, MUSTER_STDERR, 4, 0, gather, &t), 0);
  ck_assert_str_eq(t.buf, "1\nerr 2\nerr 3\n");
  memset(&t, 0, sizeof(t));
  ck_assert_int_eq(muster_logs(cl, "w-0000000000", MUSTER_STDOUT, 0, 0, gather, &t),
                   MUSTER_E_NOT_FOUND);
  ck_assert_ptr_nonnull(strstr(muster_client_errmsg(cl), "w-0000000000"));
  muster_worker_list_free(&ws);
  down();
}
END_TEST

/* A notebook in ~/project launches script="where.sh": the script is its
 * project's, and the worker starts there, not in the controller's
 * directory (where this test started it). */
START_TEST(a_relative_script_from_a_client_in_another_directory_runs) {
  muster_launch_opts o;
  muster_worker_list ws;
  struct text t = {.len = 0};
  char project[64], here[4096], script[128], want[160];

  up();
  ck_assert_ptr_nonnull(getcwd(here, sizeof(here)));
  h_shared_dir(project, sizeof(project), "project");
  snprintf(script, sizeof(script), "%s/where.sh", project);
  h_write_exec(script, "echo \"ran in $PWD\"\n");
  ck_assert_int_eq(chdir(project), 0);
  muster_launch_opts_init(&o);
  o.cpu = 0.1;
  o.kernel = "sh";
  o.script = "where.sh";
  ck_assert_int_eq(muster_launch(cl, &o, &ws), 0);
  ck_assert_int_eq(chdir(here), 0);
  ck_assert_int_eq(muster_logs(cl, ws.items[0].id, MUSTER_STDOUT, 0, 1, gather, &t), 0);
  snprintf(want, sizeof(want), "ran in %s\n", project);
  ck_assert_str_eq(t.buf, want);
  muster_worker_list_free(&ws);
  h_shared_dir_remove(project);
  down();
}
END_TEST

/* The worker's "cwd" and "path" as the controller has them, "null" for
 * none, in buf: "CWD PATH". */
static const char *where_of(const char *id, char *buf, size_t size) {
  json_t *w = h_worker(&ctl, id);
  const char *cwd = json_string_value(json_object_get(w, "cwd"));
  const char *path = json_string_value(json_object_get(w, "path"));

  snprintf(buf, size, "%s %s", cwd ? cwd : "null", path ? path : "null");
  json_decref(w);
  return buf;
}

/* A client whose directory and PATH mean nothing on the workers' hosts
 * opts out with MUSTER_SEND_CWD=0 / MUSTER_SEND_PATH=0; the PATH sent has
 * no empty or "." entries; a directory or PATH that is not UTF-8 fails the
 * launch naming it (not a launch that silently starts elsewhere). */
START_TEST(a_launch_sends_cwd_and_path_unless_told_not_to_and_refuses_non_utf8) {
  muster_launch_opts o;
  muster_worker_list ws;
  char bad[] = "/tmp/muster-j\xfcrgen-XXXXXX", here[4096], buf[8300];

  up();
  ck_assert_ptr_nonnull(getcwd(here, sizeof(here)));
  ck_assert_ptr_nonnull(mkdtemp(bad));
  muster_launch_opts_init(&o);
  o.cpu = 0.1;
  setenv("PATH", ":/usr/bin:.::/bin:", 1);
  ck_assert_int_eq(muster_launch(cl, &o, &ws), 0);
  snprintf(buf, sizeof(buf), "%s /usr/bin:/bin", here);
  ck_assert_str_eq(where_of(ws.items[0].id, buf + 4200, 4000), buf);
  muster_worker_list_free(&ws);
  setenv("MUSTER_SEND_CWD", "0", 1);
  setenv("MUSTER_SEND_PATH", "0", 1);
  ck_assert_int_eq(muster_launch(cl, &o, &ws), 0);
  ck_assert_str_eq(where_of(ws.items[0].id, buf, sizeof(buf)), "null null");
  muster_worker_list_free(&ws);
  unsetenv("MUSTER_SEND_CWD");
  unsetenv("MUSTER_SEND_PATH");

  ck_assert_int_eq(chdir(bad), 0);
  ck_assert_int_eq(muster_launch(cl, &o, &ws), MUSTER_E_INVALID);
  ck_assert_str_eq(muster_client_errfield(cl), "cwd");
  ck_assert_ptr_nonnull(strstr(muster_client_errmsg(cl), "cwd is not UTF-8"));
  ck_assert_int_eq(chdir(here), 0);
  o.path = "/opt/j\xfcrgen/bin";
  ck_assert_int_eq(muster_launch(cl, &o, &ws), MUSTER_E_INVALID);
  ck_assert_str_eq(muster_client_errfield(cl), "path");
  rmdir(bad);
  down();
}
END_TEST

struct seen {
  int n, want;
  char to[16][16];
};

static int count_events(void *arg, const muster_event *e) {
  struct seen *s = arg;

  if (s->n < 16)
    snprintf(s->to[s->n], sizeof(s->to[0]), "%s", muster_status_name(e->to));
  ck_assert_int_eq(e->seq, s->n + 1);
  ck_assert_ptr_nonnull(e->at);
  s->n++;
  return s->n >= s->want;
}

static void *cancel_later(void *arg) {
  usleep(300 * 1000);
  muster_client_cancel(arg);
  return NULL;
}

START_TEST(events_follow_and_cancel) {
  muster_launch_opts o;
  muster_worker_list ws;
  struct seen s = {0, 4, {{0}}};
  pthread_t th;
  double t0;
  int rc;

  up();
  muster_launch_opts_init(&o);
  o.cpu = 0.1;
  o.code = "!true";
  ck_assert_int_eq(muster_launch(cl, &o, &ws), 0);
  ck_assert_int_eq(muster_events(cl, 0, count_events, &s), 0);
  ck_assert_int_eq(s.n, 4);
  ck_assert_str_eq(s.to[0], "scheduling");
  ck_assert_str_eq(s.to[1], "starting");
  ck_assert_str_eq(s.to[2], "running");
  ck_assert_str_eq(s.to[3], "succeeded");
  /* Nothing more happens: only a cancel from another thread ends it. */
  s.want = 100;
  t0 = h_now();
  pthread_create(&th, NULL, cancel_later, cl);
  rc = muster_events(cl, 4, count_events, &s);
  pthread_join(th, NULL);
  ck_assert_int_eq(rc, MUSTER_E_SHUTTING_DOWN);
  ck_assert_msg(h_now() - t0 < 15, "cancel took %.2f s", h_now() - t0);
  ck_assert_int_eq(s.n, 4);
  muster_worker_list_free(&ws);
  down();
}
END_TEST

START_TEST(errors_map_back_to_the_table) {
  muster_launch_opts o;
  muster_worker_list ws;
  muster_worker w;
  muster_client *bad;
  const char *badenv[] = {"NOEQUALS"};

  up();
  muster_launch_opts_init(&o);
  o.n = 0;
  ck_assert_int_eq(muster_launch(cl, &o, &ws), MUSTER_E_INVALID);
  ck_assert_str_eq(muster_client_errfield(cl), "n");
  ck_assert_ptr_nonnull(strstr(muster_client_errmsg(cl), "between 1 and 1024"));
  o.n = 1;
  o.cpu = 4096; /* in range, more than any test host has */
  ck_assert_int_eq(muster_launch(cl, &o, &ws), MUSTER_E_CAPACITY);
  ck_assert_str_eq(muster_client_errfield(cl), "cpu");
  o.cpu = 1;
  o.env = badenv;
  o.nenv = 1;
  ck_assert_int_eq(muster_launch(cl, &o, &ws), MUSTER_E_INVALID);
  ck_assert_str_eq(muster_client_errfield(cl), "env");
  ck_assert_int_eq(muster_get(cl, "w-0000000000", &w), MUSTER_E_NOT_FOUND);
  ck_assert_int_eq(muster_get(cl, "nonsense", &w), MUSTER_E_INVALID);
  ck_assert_int_eq(muster_get(cl, NULL, &w), MUSTER_E_INVALID);

  ck_assert_int_eq(muster_client_new(ctl.url, "wrong-token", &bad), 0);
  ck_assert_int_eq(muster_list(bad, 0, NULL, NULL, &ws, NULL), MUSTER_E_UNAUTHORIZED);
  muster_client_free(bad);
  ck_assert_int_eq(muster_client_new("http://127.0.0.1:1", "tok", &bad), 0);
  ck_assert_int_eq(muster_get(bad, "w-0000000000", &w), MUSTER_E_UNREACHABLE);
  ck_assert_ptr_nonnull(strstr(muster_client_errmsg(bad), "127.0.0.1:1"));
  muster_client_free(bad);
  ck_assert_int_eq(muster_client_new("ftp://x", "tok", &bad), MUSTER_E_INVALID);
  ck_assert_ptr_null(bad);
  muster_client_free(NULL);
  muster_worker_list_free(NULL);
  muster_await_result_free(NULL);
  down();
}
END_TEST

START_TEST(default_client_discovers_the_local_controller) {
  muster_client *c = NULL;
  muster_worker_list ws;

  up();
  unsetenv("MUSTER_URL");
  unsetenv("MUSTER_TOKEN");
  setenv("MUSTER_STATE_DIR", ctl.dir, 1);
  ck_assert_int_eq(muster_client_new_default(&c), 0);
  ck_assert_str_eq(muster_client_url(c), ctl.url);
  ck_assert_int_eq(muster_list(c, 0, NULL, NULL, &ws, NULL), 0);
  muster_worker_list_free(&ws);
  muster_client_free(c);
  setenv("MUSTER_STATE_DIR", "/nonexistent-muster-dir", 1);
  ck_assert_int_eq(muster_client_new_default(&c), MUSTER_E_UNREACHABLE);
  setenv("MUSTER_URL", ctl.url, 1);
  setenv("MUSTER_TOKEN", ctl.token, 1);
  ck_assert_int_eq(muster_client_new_default(&c), 0);
  muster_client_free(c);
  down();
}
END_TEST

/* A loopback port that takes no more connections: a listener with a backlog
 * of 0, filled by one connection that is never accepted. A SYN to it is
 * dropped, as by a host that is down or a firewall, so a connect() would
 * wait the kernel's two minutes. fds gets the two sockets to close. */
static int silent_port(int fds[2]) {
  struct sockaddr_in a = {.sin_family = AF_INET};
  socklen_t len = sizeof(a);

  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  fds[0] = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ck_assert_int_ge(fds[0], 0);
  ck_assert_int_eq(bind(fds[0], (struct sockaddr *)&a, len), 0);
  ck_assert_int_eq(listen(fds[0], 0), 0);
  ck_assert_int_eq(getsockname(fds[0], (struct sockaddr *)&a, &len), 0);
  fds[1] = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ck_assert_int_eq(connect(fds[1], (struct sockaddr *)&a, len), 0);
  return ntohs(a.sin_port);
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static volatile int cancel_flag;

static void *cancel_soon(void *arg) {
  (void)arg;
  usleep(300 * 1000);
  cancel_flag = 1;
  return NULL;
}

/* muster_exec_at_signal() takes NULL for signo, as muster_exec_at() has no
 * signo at all. */
START_TEST(exec_at_signal_takes_a_null_signo) {
  muster_exec_target t;
  muster_exec_opts o;
  char err[256];
  int code;

  memset(&t, 0, sizeof(t));
  muster_exec_opts_init(&o);
  ck_assert_int_eq(muster_exec_at_signal(&t, &o, &code, NULL, err, sizeof(err)), MUSTER_E_INVALID);
  ck_assert_str_eq(err, "no command given");
}
END_TEST

START_TEST(exec_gives_up_on_a_worker_that_does_not_answer) {
  const char *argv[] = {"true"};
  muster_exec_target t;
  muster_exec_opts o;
  char err[512];
  int fds[2], code;
  double t0, took;
  pthread_t th;

  memset(&t, 0, sizeof(t));
  snprintf(t.host, sizeof(t.host), "127.0.0.1");
  t.port = silent_port(fds);
  snprintf(t.token, sizeof(t.token), "x");
  snprintf(t.worker_id, sizeof(t.worker_id), "w-silent0000");
  muster_exec_opts_init(&o);
  o.argv = argv;
  o.argc = 1;

  /* Within its connect timeout, saying what it waited for. */
  t0 = now_s();
  ck_assert_int_eq(muster_exec_at(&t, &o, &code, err, sizeof(err)), MUSTER_E_UNREACHABLE);
  took = now_s() - t0;
  ck_assert_msg(took > 9 && took < 20, "gave up after %.1f s", took);
  ck_assert_msg(strstr(err, "w-silent0000") && strstr(err, "no answer within 10 s"), "%s", err);

  /* And at once when cancelled. */
  cancel_flag = 0;
  o.cancel = &cancel_flag;
  ck_assert_int_eq(pthread_create(&th, NULL, cancel_soon, NULL), 0);
  t0 = now_s();
  ck_assert_int_eq(muster_exec_at(&t, &o, &code, err, sizeof(err)), MUSTER_E_SHUTTING_DOWN);
  took = now_s() - t0;
  pthread_join(th, NULL);
  ck_assert_msg(took < 7, "a cancelled connect took %.1f s", took);
  close(fds[1]);
  close(fds[0]);
}
END_TEST

/* A script that fails says why on its stderr: the worker's failure quotes
 * its last lines, so the user reads the traceback's last line, not only an
 * exit code. At most 10 lines and 2 KB of it, valid UTF-8, no control
 * characters but newlines. */
START_TEST(a_failed_workers_failure_ends_with_its_stderrs_last_lines) {
  muster_launch_opts o;
  muster_worker_list a, b;
  muster_await_result r;
  const char *ids[2];
  const char *f, *tail;
  int lines = 0;

  up();
  muster_launch_opts_init(&o);
  o.cpu = 0.1;
  o.code = "1/0";
  ck_assert_int_eq(muster_launch(cl, &o, &a), 0);
  /* 30 lines, then one with a colour, a tab, a bell and a carriage return. */
  o.code = "import sys\n"
           "for i in range(30): print('line %d' % i, file=sys.stderr)\n"
           "sys.stderr.write('\\x1b[31mred\\x1b[0m\\tand\\x07 bell\\r\\nlast words\\n\\n')\n"
           "sys.exit(4)";
  ck_assert_int_eq(muster_launch(cl, &o, &b), 0);
  ids[0] = a.items[0].id;
  ids[1] = b.items[0].id;
  ck_assert_int_eq(muster_await(cl, ids, 2, 1, 30, &r), 0);
  ck_assert_int_eq(r.failures.count, 2);
  for (size_t i = 0; i < 2; i++) {
    const muster_worker *w = &r.failures.items[i];
    f = w->failure;
    ck_assert_ptr_nonnull(f);
    if (strcmp(w->id, ids[0]) == 0) {
      ck_assert_msg(strstr(f, "the script exited with code 1; its stderr ended with:\n"), "%s", f);
      ck_assert_msg(strstr(f, "Traceback") || strstr(f, "line 1"), "%s", f);
      ck_assert_msg(strlen(f) > 35 &&
                        strcmp(f + strlen(f) - 35, "ZeroDivisionError: division by zero") == 0,
                    "%s", f);
      continue;
    }
    tail = strstr(f, "the script exited with code 4; its stderr ended with:\n");
    ck_assert_msg(tail, "%s", f);
    tail = strchr(tail, '\n') + 1;
    for (const char *p = tail; *p; p++) {
      ck_assert_msg((unsigned char)*p >= 0x20 || *p == '\n', "a control character in %s", f);
      lines += *p == '\n';
    }
    ck_assert_int_eq(lines + 1, 10); /* the last 10 lines */
    ck_assert_msg(strncmp(tail, "line 22\n", 8) == 0, "%s", f);
    ck_assert_msg(strstr(tail, "line 29\n[31mred") == NULL, "%s", f);
    ck_assert_msg(strstr(tail, "line 29\nred and bell\nlast words") &&
                      strcmp(tail + strlen(tail) - 10, "last words") == 0,
                  "%s", f);
  }
  muster_await_result_free(&r);
  muster_worker_list_free(&a);
  muster_worker_list_free(&b);
  down();
}
END_TEST

/* ---- a run whose worker's failure quotes a long traceback ---- */

struct run_thread {
  muster_client *c;
  muster_run_opts o;
  muster_run_result r;
  int rc;
};

static void *run_main(void *arg) {
  struct run_thread *t = arg;
  t->rc = muster_run_cluster(t->c, &t->o, &t->r);
  return NULL;
}

#define LAST_LINE                                                                                  \
  "ValueError: the last line \xc3\xbc"                                                             \
  "n\xc3\xaf"                                                                                      \
  "c\xc3\xb6"                                                                                      \
  "d\xc3\xa9"

/* Where the commands of the traceback test leave their markers: not the
 * state directory, which an exec'd command does not see. */
static char marks[64];

/* Waits for attempt's command to start (its marker file), then fails its
 * one worker as its workerd would: a traceback on its stderr (10 lines, a
 * line of 3-byte characters in it, placed so that the run's failure has
 * its byte 1000 inside one of them), then an exit with code 1. */
static void fail_attempt_with_a_traceback(const char *session, int attempt) {
  char marker[160], path[160], auth[200], id[16], body[2048];
  const char *prefix_fmt = "worker 0 (%s) failed: the script exited with code 1; its stderr "
                           "ended with:\n";
  muster_worker_list l;
  size_t n = 0, at, pad;
  double end = h_now() + 30;

  snprintf(marker, sizeof(marker), "%s/started.%d", marks, attempt);
  while (access(marker, F_OK) != 0 && h_now() < end)
    usleep(20000);
  ck_assert_msg(access(marker, F_OK) == 0, "attempt %d's command never started", attempt);
  ck_assert_int_eq(muster_list(cl, 1u << MUSTER_RUNNING, session, NULL, &l, NULL), 0);
  ck_assert_uint_eq(l.count, 1);
  snprintf(id, sizeof(id), "%s", l.items[0].id);
  muster_worker_list_free(&l);
  h_worker_token(&ctl, id, auth, sizeof(auth));

  /* Where the line of 3-byte characters starts in the run's failure: its
   * first 1000 bytes must end inside one. */
  at = (size_t)snprintf(NULL, 0, prefix_fmt, id) + strlen("Traceback (most recent call last):\n");
  pad = 100;
  if ((1000 - (at + pad + 1 + 2)) % 3 == 0)
    pad++;
  n += (size_t)snprintf(body + n, sizeof(body) - n, "Traceback (most recent call last):\n");
  memset(body + n, 'x', pad);
  n += pad;
  body[n++] = '\n';
  n += (size_t)snprintf(body + n, sizeof(body) - n, "  ");
  for (int i = 0; i < 300; i++)
    n += (size_t)snprintf(body + n, sizeof(body) - n, "\xe2\x96\x88");
  for (int i = 0; i < 6; i++)
    n += (size_t)snprintf(body + n, sizeof(body) - n, "\n  frame %d", i);
  snprintf(body + n, sizeof(body) - n, "\n" LAST_LINE "\n");
  snprintf(path, sizeof(path), "/api/v1/workers/%s/logs?stream=stderr", id);
  ck_assert_int_eq(h_http(&ctl, "POST", path, body, auth, NULL, NULL), 204);
  snprintf(path, sizeof(path), "/api/v1/workers/%s/exit", id);
  ck_assert_int_eq(h_http(&ctl, "POST", path, "{\"exit_code\": 1}", auth, NULL, NULL), 200);
}

/* 1 if s ends with end. */
static int ends_with(const char *s, const char *end) {
  size_t a = strlen(s), b = strlen(end);
  return a >= b && strcmp(s + a - b, end) == 0;
}

/* A worker's failure quotes its traceback, which makes it long: the run
 * still restarts (the restart and its cause are recorded, valid UTF-8,
 * wherever a character falls), its failure and its record's end with the
 * traceback's last line, and the earlier cause sits on the failure's first
 * line, not among the last cause's quoted lines. */
START_TEST(a_run_whose_worker_quotes_a_long_traceback_still_restarts_and_keeps_its_last_line) {
  struct run_thread t;
  pthread_t th;
  char cmd[300], path[128], *first_line;
  const char *argv[3];
  json_t *run = NULL, *j;
  const char *nl;

  up();
  memset(&t, 0, sizeof(t));
  ck_assert_int_eq(muster_client_new(ctl.url, ctl.token, &t.c), 0);
  muster_run_opts_init(&t.o);
  h_shared_dir(marks, sizeof(marks), "sdk-marks");
  snprintf(cmd, sizeof(cmd), "touch %s/started.$MUSTER_RESTART_COUNT; exec sleep 60", marks);
  argv[0] = "sh";
  argv[1] = "-c";
  argv[2] = cmd;
  t.o.mode = MUSTER_RUN_EXEC;
  t.o.n_workers = 1;
  t.o.cpu = 0.1;
  t.o.memory = 0.1;
  t.o.argv = argv;
  t.o.argc = 3;
  t.o.session = "tb";
  t.o.cwd = marks; /* (where its command may write) */
  t.o.max_restarts = 1;
  t.o.timeout_seconds = 30;
  ck_assert_int_eq(pthread_create(&th, NULL, run_main, &t), 0);
  fail_attempt_with_a_traceback("tb", 0);
  fail_attempt_with_a_traceback("tb", 1);
  pthread_join(th, NULL);

  ck_assert_int_eq(t.rc, 0);
  ck_assert_msg(t.r.restarts == 1, "%d restarts: %s", t.r.restarts, t.r.failure);
  j = json_string(t.r.failure);
  ck_assert_msg(j, "the run's failure is no UTF-8: %s", t.r.failure);
  json_decref(j);
  ck_assert_msg(ends_with(t.r.failure, "\n" LAST_LINE), "%s", t.r.failure);
  nl = strchr(t.r.failure, '\n');
  ck_assert_ptr_nonnull(nl);
  first_line = strndup(t.r.failure, (size_t)(nl - t.r.failure));
  ck_assert_msg(strncmp(first_line, "failed after 1 restart: (1) worker 0 (", 38) == 0 &&
                    strstr(first_line, "ended with: " LAST_LINE "; (2) worker 0 (") &&
                    ends_with(first_line, "its stderr ended with:"),
                "%s", t.r.failure);
  ck_assert_msg(!strstr(nl, "(2)"), "%s", t.r.failure);
  free(first_line);

  snprintf(path, sizeof(path), "/api/v1/runs/%s", t.r.run_id);
  ck_assert_int_eq(h_http(&ctl, "GET", path, NULL, "", &run, NULL), 200);
  ck_assert_str_eq(h_str(run, "status"), "failed");
  ck_assert_int_eq(json_integer_value(json_object_get(run, "restarts")), 1);
  ck_assert_msg(h_str(run, "failure") && ends_with(h_str(run, "failure"), "\n" LAST_LINE),
                "the run's record has no failure, or not its last line");
  j = json_array_get(json_object_get(run, "causes"), 0);
  ck_assert_msg(j && ends_with(h_str(j, "cause"), "\n" LAST_LINE), "the restart's cause");
  json_decref(run);
  muster_run_result_free(&t.r);
  muster_client_free(t.c);
  h_shared_dir_remove(marks);
  down();
}
END_TEST

int main(void) {
  Suite *s = suite_create("sdk");
  TCase *tc = tcase_create("libmuster");

  tcase_set_timeout(tc, 180);
  tcase_add_test(tc, launch_returns_typed_workers);
  tcase_add_test(tc, await_running_then_completion);
  tcase_add_test(tc, a_failed_workers_failure_ends_with_its_stderrs_last_lines);
  tcase_add_test(tc, get_list_and_stop);
  tcase_add_test(tc, logs_plain_and_followed);
  tcase_add_test(tc, a_relative_script_from_a_client_in_another_directory_runs);
  tcase_add_test(tc, a_launch_sends_cwd_and_path_unless_told_not_to_and_refuses_non_utf8);
  tcase_add_test(tc, events_follow_and_cancel);
  tcase_add_test(tc, errors_map_back_to_the_table);
  tcase_add_test(tc, default_client_discovers_the_local_controller);
  tcase_add_test(tc, exec_gives_up_on_a_worker_that_does_not_answer);
  tcase_add_test(tc, exec_at_signal_takes_a_null_signo);
  suite_add_tcase(s, tc);
  /* muster_run_cluster() (CK_RUN_CASE=run runs these alone). */
  tc = tcase_create("run");
  tcase_set_timeout(tc, 120);
  tcase_add_test(tc,
                 a_run_whose_worker_quotes_a_long_traceback_still_restarts_and_keeps_its_last_line);
  suite_add_tcase(s, tc);
  return check_run(s);
}
