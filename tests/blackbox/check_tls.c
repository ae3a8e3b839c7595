/* check_tls.c: the controller over HTTPS (--tls-cert, --tls-key) with a
 * throwaway CA (tests/tls/make_ca.sh): clients and workers verify it, a
 * client without the CA is refused saying what to do, plain HTTP gets no
 * answer, and a capture of the API's port (loopback and the workers'
 * bridge, with tcpdump) during a launch, an await and a worker's whole life
 * holds no token and no secret env value, where the same capture of a
 * plain controller holds them; a workerd that cannot verify the certificate
 * says so in its log. Real controller, workerd, libcurl, GnuTLS. */
#include "harness.h"

#include "../check_run.h"

#include <check.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define SECRET "s3cret-value-that-must-not-cross-in-clear"

static struct ctl_proc ctl;

/* Whether the file path holds needle (0 while there is no such file). */
static int file_has(const char *path, const char *needle) {
  FILE *f = fopen(path, "rb");
  size_t n = 0, cap = 1 << 16;
  char *buf;
  int hit;

  if (!f)
    return 0;
  buf = malloc(cap);
  ck_assert_ptr_nonnull(buf);
  for (size_t k; (k = fread(buf + n, 1, cap - n, f)) > 0;) {
    n += k;
    if (n == cap) {
      cap *= 2;
      buf = realloc(buf, cap);
      ck_assert_ptr_nonnull(buf);
    }
  }
  fclose(f);
  hit = memmem(buf, n, needle, strlen(needle)) != NULL;
  free(buf);
  return hit;
}

/* Starts tcpdump on every interface for the controller's port, writing
 * to path; returns its pid once it listens. */
static pid_t capture_start(int port, const char *path) {
  char filter[32], errpath[200];
  pid_t pid;

  snprintf(filter, sizeof(filter), "tcp port %d", port);
  snprintf(errpath, sizeof(errpath), "%s.err", path);
  pid = fork();
  ck_assert_int_ge(pid, 0);
  if (pid == 0) {
    /* (a failed check ends the test's process: tcpdump goes with it) */
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    freopen(errpath, "w", stderr);
    /* (-Z root: a change of account would clear the death signal) */
    execlp("tcpdump", "tcpdump", "-Z", "root", "-i", "any", "-U", "-s", "0", "-w", path, filter,
           (char *)NULL);
    _exit(127);
  }
  for (double until = h_now() + 20; !file_has(errpath, "listening on"); usleep(20 * 1000))
    ck_assert_msg(h_now() < until, "tcpdump did not start listening within 20 s (%s)", errpath);
  unlink(errpath);
  return pid;
}

/* Stops tcpdump (it writes what it has on SIGINT). */
static void capture_stop(pid_t pid) {
  int st;

  kill(pid, SIGINT);
  ck_assert_int_eq(waitpid(pid, &st, 0), pid);
}

/* A launch, an await, the worker's life (register, heartbeats, logs,
 * exit) and a read of its logs, captured to path. Returns the worker's
 * token in auth ("Authorization: Bearer ..."). */
static void captured_life(struct ctl_proc *c, const char *path, char *auth, size_t len) {
  json_t *workers, *ans;
  char logs_path[160], *logs = NULL;
  const char *id;
  pid_t cap = capture_start(c->port, path);

  workers = h_launch(c, "{\"n\": 1, \"cpu\": 0.1, \"memory\": 0.1, \"kernel\": \"sh\", \"code\": "
                        "\"echo secret-length ${#MY_SECRET}; sleep 2.5\", \"secret_env\": "
                        "{\"MY_SECRET\": \"" SECRET "\"}}");
  id = h_str(json_array_get(workers, 0), "id");
  h_worker_token(c, id, auth, len);
  ans = h_await(c, workers, 1, 60);
  ck_assert_msg(json_array_size(json_object_get(ans, "workers")) == 1, "the worker: %.1500s",
                json_dumps(ans, 0));
  snprintf(logs_path, sizeof(logs_path), "/api/v1/workers/%s/logs", id);
  ck_assert_int_eq(h_http(c, "GET", logs_path, NULL, "", NULL, &logs), 200);
  ck_assert_msg(strstr(logs, "secret-length 41") != NULL, "its logs: %s", logs);
  free(logs);
  json_decref(ans);
  json_decref(workers);
  capture_stop(cap);
}

/* Over HTTPS nothing that a listener could reuse crosses the wire: not the
 * API token, not the worker's token, not its secret env value. The same
 * capture of a plain controller finds all three (so the capture sees what
 * it looks for). */
START_TEST(nothing_secret_crosses_the_wire_in_clear) {
  char pcap[200], auth[200];
  const char *token;
  struct stat st;

  if (system("command -v tcpdump >/dev/null") != 0) {
    fprintf(stderr, "skipped: no tcpdump (scripts/setup.sh installs it)\n");
    return;
  }
  memset(&ctl, 0, sizeof(ctl));
  h_start(&ctl);
  /* (in the state directory, root's and 0700, which h_finish removes) */
  snprintf(pcap, sizeof(pcap), "%s/plain.pcap", ctl.dir);
  captured_life(&ctl, pcap, auth, sizeof(auth));
  token = auth + strlen("Authorization: Bearer ");
  ck_assert_msg(file_has(pcap, ctl.token), "the plain capture lacks the API token");
  ck_assert_msg(file_has(pcap, SECRET), "the plain capture lacks the secret env value");
  ck_assert_msg(file_has(pcap, token), "the plain capture lacks the worker's token");
  unlink(pcap);
  h_finish(&ctl);

  memset(&ctl, 0, sizeof(ctl));
  ctl.tls = 1;
  h_start(&ctl);
  ck_assert_int_eq(strncmp(ctl.url, "https://", 8), 0);
  snprintf(pcap, sizeof(pcap), "%s/tls.pcap", ctl.dir);
  captured_life(&ctl, pcap, auth, sizeof(auth));
  token = auth + strlen("Authorization: Bearer ");
  ck_assert_int_eq(stat(pcap, &st), 0);
  ck_assert_msg(st.st_size > 4096, "the capture is %ld bytes: it saw nothing", (long)st.st_size);
  ck_assert_msg(!file_has(pcap, ctl.token), "the API token crossed in clear (%s)", pcap);
  ck_assert_msg(!file_has(pcap, SECRET), "the secret env value crossed in clear (%s)", pcap);
  ck_assert_msg(!file_has(pcap, token), "the worker's token crossed in clear (%s)", pcap);
  ck_assert_msg(!file_has(pcap, "/api/v1/"), "a request line crossed in clear (%s)", pcap);
  unlink(pcap);
  h_finish(&ctl);
}
END_TEST

/* A client verifies the controller's certificate: without the CA it is
 * refused, saying to set MUSTER_CA_FILE; with it, served. A plain HTTP
 * request to the HTTPS port gets no answer. */
START_TEST(clients_verify_the_certificate) {
  char cmd[600], out[600] = "";
  FILE *p;
  int st;

  memset(&ctl, 0, sizeof(ctl));
  ctl.tls = 1;
  h_start(&ctl);
  snprintf(cmd, sizeof(cmd),
           "env -u MUSTER_CA_FILE MUSTER_URL=%s MUSTER_TOKEN=%s %s/muster ls 2>&1; echo rc=$?",
           ctl.url, ctl.token, MUSTER_BUILD_DIR);
  p = popen(cmd, "r");
  ck_assert_ptr_nonnull(p);
  out[fread(out, 1, sizeof(out) - 1, p)] = '\0';
  pclose(p);
  ck_assert_msg(strstr(out, "has a certificate this client cannot verify") &&
                    strstr(out, "set MUSTER_CA_FILE") && strstr(out, "rc=5"),
                "muster ls without the CA said: %s", out);
  snprintf(cmd, sizeof(cmd),
           "MUSTER_CA_FILE=%s/ca.pem MUSTER_URL=%s MUSTER_TOKEN=%s %s/muster ls >/dev/null 2>&1",
           ctl.tls_dir, ctl.url, ctl.token, MUSTER_BUILD_DIR);
  st = system(cmd);
  ck_assert_msg(WIFEXITED(st) && WEXITSTATUS(st) == 0, "muster ls with the CA: %d", st);
  snprintf(
      cmd, sizeof(cmd),
      "curl -s -o /dev/null -w '%%{http_code}' --max-time 10 http://127.0.0.1:%d/api/v1/health",
      ctl.port);
  p = popen(cmd, "r");
  ck_assert_ptr_nonnull(p);
  out[fread(out, 1, sizeof(out) - 1, p)] = '\0';
  pclose(p);
  ck_assert_msg(strcmp(out, "000") == 0, "plain HTTP to the HTTPS port got HTTP %s", out);
  h_finish(&ctl);
}
END_TEST

static int64_t now_ms(void) {
  struct timespec t;

  clock_gettime(CLOCK_MONOTONIC, &t);
  return (int64_t)t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

/* Runs muster-workerd against the controller with the CA file ca until its
 * log says until_text (30 s at most); returns that log (static). */
static const char *workerd_log_with_ca(const char *ca, const char *until_text) {
  static char log[8192];
  char bin[300];
  size_t n = 0;
  int p[2], st;
  int64_t until = now_ms() + 30000;
  pid_t pid;

  snprintf(bin, sizeof(bin), "%s/muster-workerd", MUSTER_BUILD_DIR);
  ck_assert_int_eq(pipe(p), 0);
  pid = fork();
  ck_assert_int_ge(pid, 0);
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    dup2(p[1], 2);
    close(p[0]);
    setenv("MUSTER_CONTROLLER_URL", ctl.url, 1);
    setenv("MUSTER_WORKER_ID", "w-tlscheck01", 1);
    setenv("MUSTER_WORKER_TOKEN", "t-not-a-token-of-this-controller", 1);
    setenv("MUSTER_BIND_IP", "127.0.0.1", 1);
    setenv("MUSTER_CA_FILE", ca, 1);
    execl(bin, bin, (char *)NULL);
    _exit(127);
  }
  close(p[1]);
  log[0] = '\0';
  while (!strstr(log, until_text) && now_ms() < until && n < sizeof(log) - 1) {
    struct pollfd q = {.fd = p[0], .events = POLLIN};
    ssize_t r;

    if (poll(&q, 1, 1000) <= 0)
      continue;
    r = read(p[0], log + n, sizeof(log) - 1 - n);
    if (r <= 0)
      break;
    n += (size_t)r;
    log[n] = '\0';
  }
  kill(pid, SIGKILL);
  ck_assert_int_eq(waitpid(pid, &st, 0), pid);
  close(p[0]);
  return log;
}

/* A workerd verifies the certificate too: trusting another CA it cannot
 * register and its log says why and what to set; with the right one, it
 * gets through to the controller (which turns its made-up token away). */
START_TEST(a_workerd_that_cannot_verify_the_certificate_says_so) {
  char ca[300];
  const char *log;

  char cmd[700];

  memset(&ctl, 0, sizeof(ctl));
  ctl.tls = 1;
  h_start(&ctl);
  /* (another CA than the one that signed the controller's certificate,
   * rather than the system's, which a machine may lack) */
  snprintf(cmd, sizeof(cmd), "bash %s/tests/tls/make_ca.sh %s/other 127.0.0.1 >/dev/null 2>&1",
           MUSTER_SOURCE_DIR, ctl.dir);
  ck_assert_int_eq(system(cmd), 0);
  snprintf(ca, sizeof(ca), "%s/other/ca.pem", ctl.dir);
  log = workerd_log_with_ca(ca, "cannot reach the controller");
  ck_assert_msg(strstr(log, "cannot reach the controller") &&
                    strstr(log, "has a certificate this client cannot verify") &&
                    strstr(log, "set MUSTER_CA_FILE"),
                "workerd with another CA said: %s", log);
  snprintf(ca, sizeof(ca), "%s/ca.pem", ctl.tls_dir);
  /* (it got through: the controller turns its made-up token away) */
  log = workerd_log_with_ca(ca, "refused the registration");
  ck_assert_msg(strstr(log, "refused the registration") && !strstr(log, "certificate"),
                "workerd with the CA said: %s", log);
  h_finish(&ctl);
}
END_TEST

int main(void) {
  Suite *s = suite_create("tls");
  TCase *tc = tcase_create("tls");

  tcase_set_timeout(tc, 240);
  tcase_add_test(tc, clients_verify_the_certificate);
  tcase_add_test(tc, a_workerd_that_cannot_verify_the_certificate_says_so);
  tcase_add_test(tc, nothing_secret_crosses_the_wire_in_clear);
  suite_add_tcase(s, tc);
  return check_run(s);
}
