/* check_hostile.c: black-box tests of what a client without a token can
 * cost the controller (docs/design.md, "Hostile clients"): bodies refused
 * before they are read, thousands of idle connections that leave the API
 * and a leased session's workers alone, and time the controller could not
 * serve given back to leases and heartbeats. The real muster-controller and
 * muster-workerd; the hostile clients are raw sockets of this process. */
#include "harness.h"

#include "../check_run.h"
#include "muster.h"

#include <arpa/inet.h>
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

static struct ctl_proc ctl;

/* What 100 refused 1 MiB bodies may cost the controller: libmicrohttpd's
 * buffer of each connection while it lives (32 KiB), more under
 * AddressSanitizer's redzones and quarantine; reading the bodies cost
 * 100 MiB and more. */
#if defined(__SANITIZE_ADDRESS__)
#define GROWTH_MAX_KIB (12 * 1024)
#else
#define GROWTH_MAX_KIB (4 * 1024)
#endif

/* A controller whose workers beat every 0.5 s and are lost after
 * heartbeat_timeout seconds without one. */
static void start_lost_after(const char *heartbeat_timeout) {
  memset(&ctl, 0, sizeof(ctl));
  ctl.extra[0] = "--cpus";
  ctl.extra[1] = "8";
  ctl.extra[2] = "--heartbeat-interval";
  ctl.extra[3] = "0.5";
  ctl.extra[4] = "--heartbeat-timeout";
  ctl.extra[5] = heartbeat_timeout;
  h_start(&ctl);
}

/* (a loaded machine may keep a workerd from beating for seconds while a
 * test opens its thousands of connections: that is not what it is about) */
static void start(void) {
  start_lost_after("20");
}

/* The controller's resident memory, in KiB. */
static long rss_kib(void) {
  char path[64], line[256];
  long kib = -1;
  FILE *f;

  snprintf(path, sizeof(path), "/proc/%d/status", (int)ctl.pid);
  f = fopen(path, "r");
  ck_assert_msg(f != NULL, "cannot read %s", path);
  while (fgets(line, sizeof(line), f))
    if (sscanf(line, "VmRSS: %ld kB", &kib) == 1)
      break;
  fclose(f);
  return kib;
}

/* A connection to the controller from the loopback address 127.77.A.B
 * (from: its index; -1: the kernel's choice), non-blocking; -1 when the
 * connection could not be made. */
static int dial(int from) {
  struct sockaddr_in a;
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);

  ck_assert_int_ge(fd, 0);
  if (from >= 0) {
    memset(&a, 0, sizeof(a));
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl((127u << 24) | (77u << 16) | (unsigned)(from % 60000 + 1));
    ck_assert_int_eq(bind(fd, (struct sockaddr *)&a, sizeof(a)), 0);
  }
  memset(&a, 0, sizeof(a));
  a.sin_family = AF_INET;
  a.sin_port = htons((uint16_t)ctl.port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, (struct sockaddr *)&a, sizeof(a)) != 0) {
    close(fd);
    return -1;
  }
  fcntl(fd, F_SETFL, O_NONBLOCK);
  return fd;
}

/* Sends what the socket takes of n bytes (it does not wait). */
static void push(int fd, const char *data, size_t n) {
  while (n) {
    ssize_t w = send(fd, data, n, MSG_NOSIGNAL);
    if (w <= 0)
      return;
    data += w;
    n -= (size_t)w;
  }
}

/* A GET as a client with the token: it must answer 200 within 1 s. */
static void served_within_a_second(const char *path) {
  double t0 = h_now(), took;
  long st = h_http(&ctl, "GET", path, NULL, "", NULL, NULL);

  took = h_now() - t0;
  ck_assert_msg(st == 200 && took <= 1.0, "GET %s: %ld in %.2f s", path, st, took);
}

/* 100 POSTs of 1 MiB without a token, all open at once: the controller
 * answers each 401 from its head and reads none of the bodies, so its
 * memory stays where it was (it grew by the bodies' size when it read a
 * body before it checked the token). */
START_TEST(bodies_without_a_token_cost_no_memory) {
  static char mib[1024 * 1024];
  static const char head[] =
      "POST /api/v1/workers HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
      "Content-Length: 1048576\r\n\r\n";
  int fds[100];
  long before, after;
  char answer[64];

  start();
  memset(mib, '{', sizeof(mib));
  served_within_a_second("/api/v1/workers");
  before = rss_kib();
  for (int i = 0; i < 100; i++) {
    fds[i] = dial(i);
    ck_assert_msg(fds[i] >= 0, "connection %d refused", i);
    push(fds[i], head, sizeof(head) - 1);
    push(fds[i], mib, sizeof(mib));
  }
  /* Every one answered 401 (what its head earned), while all are open. */
  for (int i = 0; i < 100; i++) {
    ssize_t n = -1;
    fcntl(fds[i], F_SETFL, 0);
    struct timeval tv = {5, 0};
    setsockopt(fds[i], SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    n = recv(fds[i], answer, sizeof(answer) - 1, 0);
    ck_assert_msg(n > 12, "connection %d: no answer (%s)", i, n < 0 ? strerror(errno) : "closed");
    answer[n] = '\0';
    ck_assert_msg(strncmp(answer, "HTTP/1.1 401", 12) == 0, "connection %d: %s", i, answer);
  }
  after = rss_kib();
  for (int i = 0; i < 100; i++)
    close(fds[i]);
  ck_assert_msg(after - before < GROWTH_MAX_KIB,
                "the controller grew by %ld KiB for 100 MiB it refused", after - before);
  served_within_a_second("/api/v1/health");
  h_finish(&ctl);
}
END_TEST

/* PUT session's lease for holder "h", for ttl seconds, its workers stopped
 * when it runs out. */
static long renew_for(const char *session, int ttl) {
  char path[160], body[128];

  snprintf(path, sizeof(path), "/api/v1/sessions/%s/lease", session);
  snprintf(body, sizeof(body), "{\"ttl_seconds\": %d, \"holder\": \"h\", \"stop_workers\": true}",
           ttl);
  return h_http(&ctl, "PUT", path, body, "", NULL, NULL);
}

/* The shortest ttl (3 s), which the tests outlast. */
static long renew(const char *session) {
  return renew_for(session, 3);
}

/* Taken for as long as a loaded machine may need to launch the session's
 * worker (the test then renews with the short ttl it is about). */
#define SETUP_TTL 600

/* One running worker of session (the id, static). */
static const char *running_worker(const char *session) {
  static char id[16];
  char body[200];
  json_t *ws;

  snprintf(body, sizeof(body),
           "{\"n\": 1, \"cpu\": 0.1, \"session\": \"%s\", \"kernel\": \"sh\", \"code\": \"sleep "
           "600\"}",
           session);
  ws = h_launch(&ctl, body);
  snprintf(id, sizeof(id), "%s", h_str(json_array_get(ws, 0), "id"));
  json_decref(ws);
  json_decref(h_wait_status(&ctl, id, "running", 30));
  return id;
}

static void still_running(const char *id) {
  char path[64];
  json_t *w = NULL;

  snprintf(path, sizeof(path), "/api/v1/workers/%s", id);
  ck_assert_int_eq(h_http(&ctl, "GET", path, NULL, "", &w, NULL), 200);
  ck_assert_msg(strcmp(h_str(w, "status"), "running") == 0, "worker %s is %s: %s", id,
                h_str(w, "status"),
                json_is_string(json_object_get(w, "failure")) ? h_str(w, "failure") : "");
  json_decref(w);
}

#define IDLE 16000

/* 16,000 idle connections without a token, from 64 addresses: the API
 * still answers a client with the token, and health, within 1 s; a leased
 * session's renewals get through, so its worker keeps running past its
 * ttl; the hostile connections are the ones closed. */
START_TEST(thousands_of_idle_connections_leave_the_api_and_leases_alone) {
  static int fds[IDLE];
  struct rlimit rl;
  const char *id;
  int opened = 0;
  double until;

  getrlimit(RLIMIT_NOFILE, &rl);
  rl.rlim_cur = rl.rlim_max;
  setrlimit(RLIMIT_NOFILE, &rl);
  ck_assert_msg(rl.rlim_max >= IDLE + 256, "this test needs %d descriptors (ulimit -Hn is %ld)",
                IDLE + 256, (long)rl.rlim_max);
  start();
  ck_assert_int_eq(renew_for("kept", SETUP_TTL), 201);
  id = running_worker("kept");
  for (int i = 0; i < IDLE; i++) {
    fds[i] = dial(i % 64);
    opened += fds[i] >= 0;
  }
  ck_assert_msg(opened > IDLE / 2, "only %d of %d connections were made", opened, IDLE);
  served_within_a_second("/api/v1/health");
  served_within_a_second("/api/v1/workers");
  /* Past two ttls, renewing every second, as a client does (every ttl/3). */
  until = h_now() + 7;
  while (h_now() < until) {
    double t0 = h_now();
    long st = renew("kept");
    ck_assert_msg(st == 200 && h_now() - t0 <= 1.0, "a renewal: %ld in %.2f s", st, h_now() - t0);
    usleep(1000 * 1000); /* a client's pace of renewals */
  }
  still_running(id);
  ck_assert_msg(h_metric(&ctl, "muster_http_connections_unauthenticated") <= 1024,
                "%.0f unauthenticated connections are open",
                h_metric(&ctl, "muster_http_connections_unauthenticated"));
  for (int i = 0; i < IDLE; i++)
    if (fds[i] >= 0)
      close(fds[i]);
  h_finish(&ctl);
}
END_TEST

/* A controller with few descriptors (1,200: room for 688 connections):
 * idle connections without a token never take more than half, so a client
 * with the token still gets in; and nothing counts as time the controller
 * could not serve. */
START_TEST(few_descriptors_still_leave_room_for_a_client_with_the_token) {
  static int fds[1000];
  struct rlimit rl = {1200, 1200};

  /* (this test's own process, forked by Check, and the controller it starts) */
  ck_assert_int_eq(setrlimit(RLIMIT_NOFILE, &rl), 0);
  start();
  for (int i = 0; i < 1000; i++)
    fds[i] = dial(i % 64);
  served_within_a_second("/api/v1/workers");
  served_within_a_second("/api/v1/health");
  ck_assert_msg(h_metric(&ctl, "muster_http_connections_refused_total") == 0,
                "%.0f connections were refused",
                h_metric(&ctl, "muster_http_connections_refused_total"));
  for (int i = 0; i < 1000; i++)
    if (fds[i] >= 0)
      close(fds[i]);
  h_finish(&ctl);
}
END_TEST

/* The controller stopped (SIGSTOP) for more than two ttls and a heartbeat
 * timeout: it could not serve the renewals nor the heartbeats, so once it
 * runs again the lease has not expired and the worker is not lost; the
 * time shows in /metrics. */
START_TEST(time_the_controller_could_not_serve_is_given_back) {
  const char *id;

  start_lost_after("5"); /* (within the 7 s stall) */
  ck_assert_int_eq(renew_for("paused", SETUP_TTL), 201);
  id = running_worker("paused");
  ck_assert_int_eq(renew("paused"), 200);
  ck_assert_int_eq(kill(ctl.pid, SIGSTOP), 0);
  usleep(7 * 1000 * 1000); /* the stall itself: what the test is about */
  ck_assert_int_eq(kill(ctl.pid, SIGCONT), 0);
  ck_assert_int_eq(renew("paused"), 200);
  still_running(id);
  /* (the monitor thread counts the gap at its first look after the stall,
   * which the API's threads may answer before) */
  for (double until = h_now() + 10; h_metric(&ctl, "muster_unserved_seconds_total") < 6.0;
       usleep(50 * 1000))
    ck_assert_msg(h_now() < until, "muster_unserved_seconds_total is still %.1f 10 s on",
                  h_metric(&ctl, "muster_unserved_seconds_total"));
  h_finish(&ctl);
}
END_TEST

/* The bytes of worker id's stderr log. */
static size_t stderr_log_len(const char *id) {
  char path[96], *raw = NULL;
  size_t n;

  snprintf(path, sizeof(path), "/api/v1/workers/%s/logs?stream=stderr", id);
  ck_assert_int_eq(h_http(&ctl, "GET", path, NULL, "", NULL, &raw), 200);
  n = raw ? strlen(raw) : 0;
  free(raw);
  return n;
}

/* A connection to the exec port of t. */
static int dial_exec(const muster_exec_target *t) {
  struct sockaddr_in a;
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);

  ck_assert_int_ge(fd, 0);
  memset(&a, 0, sizeof(a));
  a.sin_family = AF_INET;
  a.sin_port = htons((uint16_t)t->port);
  ck_assert_int_eq(inet_pton(AF_INET, t->host, &a.sin_addr), 1);
  if (connect(fd, (struct sockaddr *)&a, sizeof(a)) != 0) {
    close(fd);
    return -1;
  }
  fcntl(fd, F_SETFL, O_NONBLOCK);
  return fd;
}

/* 200 idle connections and 64 hellos of 1 MiB that stop short, none with
 * the token (in clear: no TLS handshake), on a small worker's exec port:
 * its own session's exec still runs, the worker is not killed for memory
 * (workerd reads nothing but a TLS handshake before the token holds), and
 * its log does not grow by a line per connection. */
START_TEST(hostile_exec_connections_leave_the_sessions_exec_alone) {
  static char chunk[64 * 1024];
  const char *argv[] = {"sh", "-c", "echo still-served"};
  char id[16], err[256] = "", out[H_COLLECT_MAX] = "";
  int idle[200], partial[64], code = -1;
  muster_client *cl = NULL;
  muster_exec_target t;
  muster_exec_opts o;
  json_t *ws;
  size_t log0, log1;

  start();
  ws = h_launch(&ctl, "{\"n\": 1, \"cpu\": 0.1, \"memory\": 0.06}");
  snprintf(id, sizeof(id), "%s", h_str(json_array_get(ws, 0), "id"));
  json_decref(ws);
  json_decref(h_wait_status(&ctl, id, "running", 30));
  ck_assert_int_eq(muster_client_new(ctl.url, ctl.token, &cl), 0);
  ck_assert_int_eq(muster_exec_target_get(cl, id, &t), 0);
  log0 = stderr_log_len(id);
  memset(chunk, 'a', sizeof(chunk));
  for (int i = 0; i < 200; i++)
    idle[i] = dial_exec(&t);
  for (int i = 0; i < 64; i++) {
    unsigned char hdr[5] = {'H', 0, 0x10, 0, 0}; /* a hello of 1 MiB */
    partial[i] = dial_exec(&t);
    if (partial[i] < 0)
      continue;
    push(partial[i], (const char *)hdr, sizeof(hdr));
    push(partial[i], "{\"token\":\"", 10);
    for (int k = 0; k < 15; k++)
      push(partial[i], chunk, sizeof(chunk));
  }
  muster_exec_opts_init(&o);
  o.argv = argv;
  o.argc = 3;
  o.on_stdout = h_collect;
  o.arg = out;
  o.stderr_fd = -1;
  ck_assert_int_eq(muster_exec_at(&t, &o, &code, err, sizeof(err)), 0);
  ck_assert_msg(code == 0 && strcmp(out, "still-served\n") == 0, "exec: %d %s (%s)", code, out,
                err);
  still_running(id);
  log1 = stderr_log_len(id);
  ck_assert_msg(log1 - log0 < 1024, "the worker's log grew by %zu bytes", log1 - log0);
  /* ...and counted, as its heartbeats tell the controller's /metrics */
  {
    double until = h_now() + 10;
    while (h_metric(&ctl, "muster_exec_refused_total") < 64 && h_now() < until)
      usleep(100 * 1000); /* a heartbeat's pace (0.5 s here) */
    ck_assert_msg(h_metric(&ctl, "muster_exec_refused_total") >= 64,
                  "muster_exec_refused_total is %.0f", h_metric(&ctl, "muster_exec_refused_total"));
  }
  for (int i = 0; i < 200; i++)
    if (idle[i] >= 0)
      close(idle[i]);
  for (int i = 0; i < 64; i++)
    if (partial[i] >= 0)
      close(partial[i]);
  muster_client_free(cl);
  h_finish(&ctl);
}
END_TEST

int main(void) {
  Suite *s = suite_create("hostile");
  TCase *tc = tcase_create("hostile");

  tcase_set_timeout(tc, 120);
  tcase_add_test(tc, bodies_without_a_token_cost_no_memory);
  tcase_add_test(tc, thousands_of_idle_connections_leave_the_api_and_leases_alone);
  tcase_add_test(tc, few_descriptors_still_leave_room_for_a_client_with_the_token);
  tcase_add_test(tc, time_the_controller_could_not_serve_is_given_back);
  tcase_add_test(tc, hostile_exec_connections_leave_the_sessions_exec_alone);
  suite_add_tcase(s, tc);
  return check_run(s);
}
