/* check_network.c: a worker's code, played as an attacker's, against the
 * network of a root controller's local workers (docs/sandbox.md). In
 * bridge mode (the default here) each worker is a network namespace of
 * its own: it cannot take the controller's address, even while the
 * controller restarts, nor another worker's. With --network host it can
 * still not bind the controller's port while the controller holds it.
 *
 * MUSTER_TEST_NETWORK=host runs the bridge tests against a --network host
 * controller: they must fail there (what this change fixes). */
#include "harness.h"
#include "muster.h"
#include "subnet.h"

#include "../check_run.h"

#include <arpa/inet.h>
#include <check.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

static struct ctl_proc ctl;

/* The attack: binds the controller's address (argv[1], as workers reach
 * it) and the host's loopback on the controller's port (argv[2]), with
 * SO_REUSEPORT and SO_REUSEADDR (past the port's TIME_WAIT connections),
 * says how each went, then for up to 3 s counts the
 * connections that reach what it holds. */
static const char attack[] =
    "import errno, select, socket, sys, time\n"
    "host, port = sys.argv[1], int(sys.argv[2])\n"
    "held = []\n"
    "for h in sorted({host, '127.0.0.1'}):\n"
    "    s = socket.socket()\n"
    "    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)\n"
    "    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
    "    try:\n"
    "        s.bind((h, port)); s.listen(16); held.append(s)\n"
    "        print('bind %s: bound' % h, flush=True)\n"
    "    except OSError as e:\n"
    "        print('bind %s: %s' % (h, errno.errorcode.get(e.errno, e.errno)), flush=True)\n"
    "print('attempted', flush=True)\n"
    "n, end = 0, time.time() + 3\n"
    "while held and time.time() < end:\n"
    "    r, _, _ = select.select(held, [], [], max(0, end - time.time()))\n"
    "    for s in r:\n"
    "        c, _ = s.accept(); n += 1; c.close()\n"
    "print('connections: %d' % n, flush=True)\n";

/* An exec'd command's output, as it comes. */
struct out {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  char text[4096];
  int done, code;
  muster_exec_target t;
  const char *argv[6];
  size_t argc;
};

static int collect(void *arg, const char *data, size_t len) {
  struct out *o = arg;
  size_t have;

  pthread_mutex_lock(&o->mu);
  have = strlen(o->text);
  if (have + len < sizeof(o->text)) {
    memcpy(o->text + have, data, len);
    o->text[have + len] = '\0';
  }
  pthread_cond_broadcast(&o->cv);
  pthread_mutex_unlock(&o->mu);
  return 0;
}

static void *exec_thread(void *arg) {
  struct out *o = arg;
  muster_exec_opts eo;
  char err[256];
  int code = -1;

  muster_exec_opts_init(&eo);
  eo.argv = o->argv;
  eo.argc = o->argc;
  eo.on_stdout = collect;
  eo.arg = o;
  eo.stderr_fd = 2;
  if (muster_exec_at(&o->t, &eo, &code, err, sizeof(err)) != 0)
    fprintf(stderr, "exec: %s\n", err);
  pthread_mutex_lock(&o->mu);
  o->code = code;
  o->done = 1;
  pthread_cond_broadcast(&o->cv);
  pthread_mutex_unlock(&o->mu);
  return NULL;
}

/* Waits (30 s at most) until o's output holds what, or the command ended. */
static int wait_for(struct out *o, const char *what) {
  struct timespec until;
  int found;

  clock_gettime(CLOCK_REALTIME, &until);
  until.tv_sec += 30;
  pthread_mutex_lock(&o->mu);
  while (!strstr(o->text, what) && !o->done &&
         pthread_cond_timedwait(&o->cv, &o->mu, &until) != ETIMEDOUT)
    ;
  found = strstr(o->text, what) != NULL;
  pthread_mutex_unlock(&o->mu);
  return found;
}

static const char *mode(void) {
  const char *m = getenv("MUSTER_TEST_NETWORK");

  return m && *m ? m : "bridge";
}

static void start(const char *network) {
  memset(&ctl, 0, sizeof(ctl));
  ck_assert_msg(geteuid() == 0, "this test needs root (a worker's own network namespace)");
  ctl.extra[0] = "--network";
  ctl.extra[1] = network;
  h_start(&ctl);
}

/* Launches n idle workers and waits until they run; their ids into ids. */
static void idle_workers(int n, char ids[][32]) {
  char body[64];
  json_t *workers;

  snprintf(body, sizeof(body), "{\"n\": %d, \"cpu\": 0.2, \"memory\": 0.2}", n);
  workers = h_launch(&ctl, body);
  for (int i = 0; i < n; i++) {
    snprintf(ids[i], 32, "%s", h_str(json_array_get(workers, (size_t)i), "id"));
    json_decref(h_wait_status(&ctl, ids[i], "running", 30));
  }
  json_decref(workers);
}

/* The controller's address as workers reach it: the bridge's gateway, or
 * its --listen address on the host's network. */
static void controller_address(char *buf, size_t len) {
  struct subnet sn;
  struct in_addr gw;
  char err[200];
  json_t *health = NULL;

  ck_assert_int_eq(h_http(&ctl, "GET", "/api/v1/health", NULL, NULL, &health, NULL), 200);
  if (strcmp(h_str(health, "network"), "bridge") == 0) {
    ck_assert_int_eq(subnet_parse(ctl.subnet, &sn, err, sizeof(err)), 0);
    gw.s_addr = htonl(subnet_gateway(&sn));
    ck_assert_ptr_nonnull(inet_ntop(AF_INET, &gw, buf, (socklen_t)len));
  } else {
    snprintf(buf, len, "127.0.0.1");
  }
  json_decref(health);
}

/* Worker id's exec address and its session's exec token (asked of the
 * controller: before it is stopped). */
static void target_of(const char *id, muster_exec_target *t) {
  muster_client *cl = NULL;

  ck_assert_int_eq(muster_client_new(ctl.url, ctl.token, &cl), 0);
  ck_assert_int_eq(muster_exec_target_get(cl, id, t), 0);
  muster_client_free(cl);
}

/* Runs the attack in the worker of t, in a thread of its own (th). */
static void exec_start(struct out *o, pthread_t *th, const muster_exec_target *t, const char *host,
                       const char *port) {
  memset(o, 0, sizeof(*o));
  pthread_mutex_init(&o->mu, NULL);
  pthread_cond_init(&o->cv, NULL);
  o->t = *t;
  o->argv[0] = "python3";
  o->argv[1] = "-c";
  o->argv[2] = attack;
  o->argv[3] = host;
  o->argv[4] = port;
  o->argc = 5;
  ck_assert_int_eq(pthread_create(th, NULL, exec_thread, o), 0);
}

/* 1 if a TCP connection to ip:port is refused (nothing listens there). */
static int refused(const char *ip, int port) {
  struct sockaddr_in to = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
  int fd = socket(AF_INET, SOCK_STREAM, 0), rc;

  ck_assert_int_ge(fd, 0);
  ck_assert_int_eq(inet_pton(AF_INET, ip, &to.sin_addr), 1);
  rc = connect(fd, (struct sockaddr *)&to, sizeof(to));
  rc = rc != 0 && errno == ECONNREFUSED;
  close(fd);
  return rc;
}

/* While the controller runs, and while it is down between a kill and its
 * restart on the same port, a command in a worker binds the controller's
 * address: it is not the worker's to bind (EADDRNOTAVAIL), a client's
 * request in the window is refused, never answered by the worker, and the
 * restarted controller adopts the worker, still in its namespace. */
START_TEST(a_worker_cannot_take_the_controllers_address_even_while_it_restarts) {
  char ids[1][32], host[32], port[16], want[64], bound[64];
  struct out o;
  pthread_t th;
  muster_exec_target t;
  json_t *w;

  start(mode());
  idle_workers(1, ids);
  target_of(ids[0], &t);
  controller_address(host, sizeof(host));
  snprintf(port, sizeof(port), "%d", ctl.port);
  snprintf(want, sizeof(want), "bind %s: EADDRNOTAVAIL", host);

  /* while it runs: refused (with --network host too: EADDRINUSE) */
  snprintf(bound, sizeof(bound), "bind %s: bound", host);
  exec_start(&o, &th, &t, host, port);
  pthread_join(th, NULL);
  ck_assert_msg(strstr(o.text, "attempted") && !strstr(o.text, bound),
                "the worker's bind of %s:%s: %s", host, port, o.text);

  /* while it is down */
  h_kill9(&ctl);
  exec_start(&o, &th, &t, host, port);
  ck_assert_msg(wait_for(&o, "attempted"), "the attack did not run: %s", o.text);
  ck_assert_msg(h_http(&ctl, "GET", "/api/v1/health", NULL, NULL, NULL, NULL) == 0,
                "a client's request reached something while the controller was down: %s", o.text);
  ck_assert_msg(refused("127.0.0.1", ctl.port) && refused(host, ctl.port),
                "the controller's address took a connection while it was down: %s", o.text);
  pthread_join(th, NULL);
  ck_assert_msg(strstr(o.text, want) != NULL, "the worker's bind of %s:%s: %s", host, port, o.text);
  ck_assert_msg(strstr(o.text, "connections: 0") || !strstr(o.text, "connections:"),
                "a connection reached the worker's listener: %s", o.text);

  h_restart(&ctl);
  w = h_worker(&ctl, ids[0]);
  ck_assert_str_eq(h_str(w, "status"), "running");
  json_decref(w);
  /* still reachable in its namespace, through its exec channel */
  exec_start(&o, &th, &t, host, port);
  pthread_join(th, NULL);
  ck_assert_msg(strstr(o.text, want) != NULL, "after the restart: %s", o.text);
  h_finish(&ctl);
}
END_TEST

/* A worker binds another worker's address: not its own, refused. */
START_TEST(a_worker_cannot_bind_another_workers_address) {
  static const char code[] = "import errno, socket, sys\n"
                             "s = socket.socket()\n"
                             "try:\n"
                             "    s.bind((sys.argv[1], 0)); print('bound')\n"
                             "except OSError as e:\n"
                             "    print('refused:', errno.errorcode.get(e.errno, e.errno))\n";
  char ids[2][32], other[32];
  struct out o;
  pthread_t th;
  json_t *w;

  start(mode());
  idle_workers(2, ids);
  w = h_worker(&ctl, ids[1]);
  snprintf(other, sizeof(other), "%s", h_str(w, "ip_address"));
  json_decref(w);
  memset(&o, 0, sizeof(o));
  pthread_mutex_init(&o.mu, NULL);
  pthread_cond_init(&o.cv, NULL);
  target_of(ids[0], &o.t);
  o.argv[0] = "python3";
  o.argv[1] = "-c";
  o.argv[2] = code;
  o.argv[3] = other;
  o.argc = 4;
  ck_assert_int_eq(pthread_create(&th, NULL, exec_thread, &o), 0);
  pthread_join(th, NULL);
  ck_assert_msg(strstr(o.text, "refused: EADDRNOTAVAIL") != NULL,
                "worker %s binding worker %s's address %s: %s", ids[0], ids[1], other, o.text);
  h_finish(&ctl);
}
END_TEST

/* --network host: workers keep loopback addresses of their own on the
 * host's network, and the controller's port, which it holds without
 * SO_REUSEPORT, cannot be bound by the worker's account. Health says why
 * the workers are on the host's network. */
START_TEST(with_network_host_a_worker_still_cannot_bind_the_controllers_port) {
  char ids[1][32], port[16];
  struct out o;
  pthread_t th;
  muster_exec_target t;
  json_t *health = NULL, *w;

  start("host");
  ck_assert_int_eq(h_http(&ctl, "GET", "/api/v1/health", NULL, NULL, &health, NULL), 200);
  ck_assert_str_eq(h_str(health, "network"), "host");
  ck_assert_str_eq(h_str(health, "network_reason"), "--network host");
  json_decref(health);
  idle_workers(1, ids);
  w = h_worker(&ctl, ids[0]);
  ck_assert_msg(strncmp(h_str(w, "ip_address"), "127.0.", 6) == 0, "%s", h_str(w, "ip_address"));
  json_decref(w);
  snprintf(port, sizeof(port), "%d", ctl.port);
  target_of(ids[0], &t);
  exec_start(&o, &th, &t, "127.0.0.1", port);
  pthread_join(th, NULL);
  ck_assert_msg(strstr(o.text, "bind 127.0.0.1: EADDRINUSE") != NULL, "%s", o.text);
  h_finish(&ctl);
}
END_TEST

/* Two controllers on one bridge at once: the second is refused at start,
 * saying why. */
START_TEST(a_second_controller_on_the_same_bridge_is_refused) {
  char cmd[900];
  FILE *f;
  char line[600] = "";
  json_t *health = NULL;

  start("bridge");
  ck_assert_int_eq(h_http(&ctl, "GET", "/api/v1/health", NULL, NULL, &health, NULL), 200);
  ck_assert_str_eq(h_str(health, "network"), "bridge");
  ck_assert_ptr_null(json_string_value(json_object_get(health, "network_reason")));
  json_decref(health);
  snprintf(cmd, sizeof(cmd),
           "d=$(mktemp -d /tmp/muster-net2-XXXXXX); timeout 10 %s --listen 127.0.0.1:0 "
           "--state-dir $d/s --subnet %s 2>&1; echo \"exit $?\"; rm -rf $d",
           MUSTER_CONTROLLER_BIN, ctl.subnet);
  f = popen(cmd, "r");
  ck_assert_ptr_nonnull(f);
  while (fgets(line + strlen(line), (int)(sizeof(line) - strlen(line)), f) &&
         strlen(line) < sizeof(line) - 1)
    ;
  pclose(f);
  ck_assert_msg(strstr(line, "another muster-controller already serves workers on bridge") &&
                    strstr(line, "exit 1"),
                "%s", line);
  h_finish(&ctl);
}
END_TEST

/* The bridge's lock is root's alone: one anyone could open, anyone could
 * hold, and keep the controller from starting again. */
START_TEST(the_bridges_lock_is_roots_alone) {
  char lock[64];
  struct stat st;

  start("bridge");
  ck_assert_int_eq(stat("/run/muster", &st), 0);
  ck_assert_msg((st.st_mode & 077) == 0 && st.st_uid == 0, "/run/muster: uid %u mode %04o",
                (unsigned)st.st_uid, (unsigned)(st.st_mode & 07777));
  {
    struct subnet sn;
    char name[16], err[200];
    ck_assert_int_eq(subnet_parse(ctl.subnet, &sn, err, sizeof(err)), 0);
    subnet_bridge_name(&sn, name, sizeof(name));
    snprintf(lock, sizeof(lock), "/run/muster/%s.lock", name);
  }
  ck_assert_int_eq(stat(lock, &st), 0);
  ck_assert_msg((st.st_mode & 077) == 0, "%s: mode %04o", lock, (unsigned)(st.st_mode & 07777));
  h_finish(&ctl);
}
END_TEST

int main(void) {
  Suite *s = suite_create("network");
  TCase *tc = tcase_create("network");

  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, a_worker_cannot_take_the_controllers_address_even_while_it_restarts);
  tcase_add_test(tc, a_worker_cannot_bind_another_workers_address);
  tcase_add_test(tc, with_network_host_a_worker_still_cannot_bind_the_controllers_port);
  tcase_add_test(tc, a_second_controller_on_the_same_bridge_is_refused);
  tcase_add_test(tc, the_bridges_lock_is_roots_alone);
  suite_add_tcase(s, tc);
  return check_run(s);
}
