/* check_http_client.c: workerd's HTTP client (workerd/http_client.c and
 * http_answer.c). An answer is read whatever its framing and however its
 * bytes are split; against a real socket on 127.0.0.1, a kept connection
 * serves the next request, one the server closed is replaced without the
 * caller seeing a failure, a refusal before 100 Continue keeps the body
 * unsent, and a server that never answers ends the call at its deadline
 * with a reason. */
#include "http_client.h"

#include "muster_errors.h"
#include "util.h"

#include "../check_run.h"

#include <arpa/inet.h>
#include <check.h>
#include <gnutls/x509.h>
#include <netdb.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

/* ------------------------------------------------------------------------ */
/* Answers, as bytes                                                        */

/* Feeds text to a fresh request's parser in pieces of step bytes. Returns
 * what the last hc_answer_take() said. */
static int feed(struct hc *h, const char *text, size_t step) {
  size_t len = strlen(text);
  int took = 0;

  hc_init(h);
  h->answer_max = 100;
  h->in_cap = len + 1;
  h->in = malloc(h->in_cap);
  ck_assert_ptr_nonnull(h->in);
  for (size_t at = 0; at < len && took == 0; at += step) {
    size_t n = len - at < step ? len - at : step;

    memcpy(h->in + h->in_len, text + at, n);
    h->in_len += n;
    took = hc_answer_take(h);
  }
  return took;
}

START_TEST(an_answer_is_read_however_it_is_framed_and_split) {
  static const char *const length = "HTTP/1.1 200 OK\r\nContent-Type: "
                                    "application/json\r\ncontent-length: 11\r\n\r\n{\"a\": true}";
  static const char *const chunked =
      "HTTP/1.1 201 Created\r\nTransfer-Encoding: chunked\r\n\r\n"
      "4;ext=1\r\n{\"a\"\r\n7\r\n: true}\r\n0\r\nX-Trailer: y\r\n\r\n";
  static const char *const interim =
      "HTTP/1.1 102 Processing\r\n\r\nHTTP/1.1 204 No Content\r\nConnection: close\r\n"
      "Transfer-Encoding: chunked\r\n\r\n";
  struct hc h;

  for (size_t step = 1; step <= 200; step = step * 3 + 1) {
    ck_assert_int_eq(feed(&h, length, step), 1);
    ck_assert_int_eq(h.status, 200);
    ck_assert_str_eq(h.answer, "{\"a\": true}");
    ck_assert(h.keep);
    hc_free(&h);

    ck_assert_int_eq(feed(&h, chunked, step), 1);
    ck_assert_int_eq(h.status, 201);
    ck_assert_str_eq(h.answer, "{\"a\": true}");
    ck_assert_uint_eq(h.in_len, 0);
    hc_free(&h);

    ck_assert_int_eq(feed(&h, interim, step), 1);
    ck_assert_int_eq(h.status, 204);
    ck_assert_ptr_null(h.answer);
    ck_assert(!h.keep);
    hc_free(&h);
  }
  /* Up to the connection's end: complete only there. */
  ck_assert_int_eq(feed(&h, "HTTP/1.0 200 OK\r\n\r\nall of it", 5), 0);
  ck_assert_int_eq(hc_answer_at_end(&h), 1);
  ck_assert_str_eq(h.answer, "all of it");
  ck_assert(!h.keep);
  hc_free(&h);
}
END_TEST

START_TEST(a_bad_or_oversized_answer_is_an_error_that_says_so) {
  struct hc h;

  ck_assert_int_eq(feed(&h, "SSH-2.0-OpenSSH\r\n\r\n", 64), MUSTER_E_UNREACHABLE);
  ck_assert_ptr_nonnull(strstr(h.err, "status line"));
  hc_free(&h);
  ck_assert_int_eq(feed(&h, "HTTP/1.1 20x OK\r\n\r\n", 64), MUSTER_E_UNREACHABLE);
  ck_assert_ptr_nonnull(strstr(h.err, "status line"));
  hc_free(&h);
  ck_assert_int_eq(feed(&h, "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n-1\r\n", 64),
                   MUSTER_E_UNREACHABLE);
  hc_free(&h);
  ck_assert_int_eq(feed(&h, "HTTP/1.1 200 OK\r\nContent-Length: 12x\r\n\r\n", 64),
                   MUSTER_E_UNREACHABLE);
  ck_assert_ptr_nonnull(strstr(h.err, "Content-Length"));
  hc_free(&h);
  ck_assert_int_eq(feed(&h, "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", 64),
                   MUSTER_E_UNREACHABLE);
  ck_assert_ptr_nonnull(strstr(h.err, "chunk"));
  hc_free(&h);
  /* (answer_max is 100) */
  ck_assert_int_eq(feed(&h, "HTTP/1.1 200 OK\r\nContent-Length: 101\r\n\r\n", 64), 0);
  {
    char big[101];

    memset(big, 'x', sizeof(big));
    memcpy(h.in, big, 40); /* (room: the head was longer) */
    h.in_len = 40;
    ck_assert_int_eq(hc_answer_take(&h), 0);
    h.in = realloc(h.in, 100);
    h.in_cap = 100;
    memcpy(h.in, big, 61);
    h.in_len = 61;
    ck_assert_int_eq(hc_answer_take(&h), MUSTER_E_TOO_LARGE);
    ck_assert_ptr_nonnull(strstr(h.err, "larger than 100 bytes"));
  }
  hc_free(&h);
}
END_TEST

/* ------------------------------------------------------------------------ */
/* A server on 127.0.0.1                                                     */

/* What the server does with each request it reads. */
enum plan {
  ANSWER_KEEP,           /* answers and keeps the connection */
  ANSWER_THEN_CLOSE,     /* answers (without saying so) and closes it */
  DROP_SECOND,           /* a connection's second request is read, then it is closed */
  REFUSE_BEFORE_BODY,    /* answers 413 as soon as the head is in, then closes */
  OK_BEFORE_BODY,        /* answers 200 as soon as the head is in (wrongly) */
  CONTINUE_THEN_READ,    /* says 100 Continue, reads the body, answers */
  CONTINUE_THEN_REFUSE,  /* says 100 Continue, reads 16 KiB of the body, answers 413 */
  READ_WITHOUT_CONTINUE, /* reads the body without a 100 Continue, answers */
  NEVER_ANSWER           /* reads and keeps quiet */
};

/* (plan, accepts, requests and body_bytes are shared with the server's
 * thread: read and written with __atomic) */
static struct {
  int fd;
  int port;
  int plan;
  int release; /* CONTINUE_THEN_REFUSE reads on once the test sets it */
  int accepts;
  int requests;
  size_t body_bytes; /* of the last request, as read */
  pthread_t thread;
} srv;

#define GET(x) __atomic_load_n(&(x), __ATOMIC_SEQ_CST)
#define SET(x, v) __atomic_store_n(&(x), (v), __ATOMIC_SEQ_CST)

/* Reads one request's head (and its body, unless the plan refuses it) from
 * c. Returns 0, or -1 at the connection's end. */
static int read_request(int c) {
  char buf[65536];
  size_t n = 0, len = 0, got;
  char *stop = NULL;
  char *end, *cl;

  for (;;) {
    ssize_t r = recv(c, buf + n, sizeof(buf) - 1 - n, 0);

    if (r <= 0)
      return -1;
    n += (size_t)r;
    buf[n] = '\0';
    if ((end = strstr(buf, "\r\n\r\n")))
      break;
  }
  cl = strstr(buf, "Content-Length: ");
  len = cl ? strtoul(cl + 16, &stop, 10) : 0;
  if (cl && *stop != '\r')
    return -1; /* (not a number: the connection is dropped) */
  got = n - (size_t)(end + 4 - buf);
  SET(srv.body_bytes, got);
  if (GET(srv.plan) == REFUSE_BEFORE_BODY || GET(srv.plan) == OK_BEFORE_BODY ||
      GET(srv.plan) == NEVER_ANSWER)
    return 0;
  if (GET(srv.plan) == CONTINUE_THEN_READ || GET(srv.plan) == CONTINUE_THEN_REFUSE)
    (void)!write(c, "HTTP/1.1 100 Continue\r\n\r\n", 25);
  if (GET(srv.plan) == CONTINUE_THEN_REFUSE)
    len = got + 16384 < len ? got + 16384 : len;
  while (got < len) {
    ssize_t r = recv(c, buf, sizeof(buf), 0);

    if (r <= 0)
      return -1;
    got += (size_t)r;
  }
  SET(srv.body_bytes, got);
  return 0;
}

static void *serve(void *unused) {
  static const char ok[] = "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok";
  static const char refused[] =
      "HTTP/1.1 413 Too Large\r\nConnection: close\r\nContent-Length: 3\r\n\r\nno!";

  (void)unused;
  for (;;) {
    int c = accept(srv.fd, NULL, NULL);
    int on_this = 0;

    if (c < 0)
      return NULL;
    __atomic_add_fetch(&srv.accepts, 1, __ATOMIC_SEQ_CST);
    while (read_request(c) == 0) {
      int plan = GET(srv.plan);

      __atomic_add_fetch(&srv.requests, 1, __ATOMIC_SEQ_CST);
      if (plan == DROP_SECOND && ++on_this == 2)
        break;
      if (plan == NEVER_ANSWER)
        continue;
      if (plan == REFUSE_BEFORE_BODY) {
        (void)!write(c, refused, sizeof(refused) - 1);
        break;
      }
      if (plan == CONTINUE_THEN_REFUSE) {
        char sink[65536];

        /* (then reads nothing more until the test has its answer, so the
         * client's sending stalls; then the rest, so that no reset loses
         * anything) */
        (void)!write(c, refused, sizeof(refused) - 1);
        shutdown(c, SHUT_WR);
        while (!GET(srv.release))
          usleep(1000);
        while (recv(c, sink, sizeof(sink), 0) > 0)
          ;
        break;
      }
      (void)!write(c, ok, sizeof(ok) - 1);
      if (plan == ANSWER_THEN_CLOSE || plan == OK_BEFORE_BODY)
        break;
    }
    close(c);
  }
}

static void server_start(void) {
  struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t al = sizeof(a);

  memset(&srv, 0, sizeof(srv));
  srv.fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ck_assert_int_ge(srv.fd, 0);
  ck_assert_int_eq(bind(srv.fd, (struct sockaddr *)&a, sizeof(a)), 0);
  ck_assert_int_eq(listen(srv.fd, 8), 0);
  ck_assert_int_eq(getsockname(srv.fd, (struct sockaddr *)&a, &al), 0);
  srv.port = ntohs(a.sin_port);
  ck_assert_int_eq(pthread_create(&srv.thread, NULL, serve, NULL), 0);
}

static void server_stop(void) {
  shutdown(srv.fd, SHUT_RDWR); /* (accept() returns) */
  pthread_join(srv.thread, NULL);
  close(srv.fd);
}

/* Runs h's request to its end, polling as workerd's loop does. */
static void run(struct hc *h) {
  while (h->st != HC_DONE) {
    int64_t now = util_mono_ms(), d = hc_deadline(h);
    struct pollfd p = {.fd = h->fd, .events = hc_events(h)};
    int wait = d <= now ? 0 : d - now > 1000 ? 1000 : (int)(d - now);

    (void)poll(&p, h->fd >= 0 && p.events ? 1 : 0, wait);
    hc_step(h, p.revents, util_mono_ms());
  }
}

static void target(struct hc_target *to) {
  char url[64];

  snprintf(url, sizeof(url), "http://127.0.0.1:%d", srv.port);
  ck_assert_int_eq(hc_target_parse(url, to), 0);
}

/* Makes three calls with h, each of which must get the server's 200 "ok"
 * (what says how, for the message). */
static void three_calls(struct hc *h, const struct hc_target *to, const char *what) {
  for (int i = 0; i < 3; i++) {
    ck_assert_int_eq(hc_start(h, to, "/x", "", "{}", 2, 0, 1024, 5000), 0);
    run(h);
    ck_assert_msg(h->rc == 0, "call %d %s: %s", i, what, h->err);
    ck_assert_int_eq(h->status, 200);
    ck_assert_str_eq(h->answer, "ok");
  }
}

START_TEST(a_kept_connection_serves_again_or_is_replaced_unseen) {
  struct hc_target to;
  struct hc h;

  server_start();
  target(&to);
  hc_init(&h);
  SET(srv.plan, ANSWER_KEEP);
  three_calls(&h, &to, "on a kept connection");
  ck_assert_int_eq(GET(srv.accepts), 1);
  ck_assert_int_eq(GET(srv.requests), 3);
  /* The server closes each connection after its answer: the next request
   * finds its kept connection dead and goes on a new one. */
  SET(srv.plan, ANSWER_THEN_CLOSE);
  three_calls(&h, &to, "after a close");
  ck_assert_int_eq(GET(srv.requests), 6);
  ck_assert_int_eq(GET(srv.accepts), 3);
  hc_free(&h);
  /* The server reads the request on the kept connection and closes it
   * unanswered (its idle timeout struck as the request came): sent again
   * on a new connection, and answered there. */
  SET(srv.plan, DROP_SECOND);
  SET(srv.accepts, 0);
  SET(srv.requests, 0);
  hc_init(&h);
  three_calls(&h, &to, "on a dropped connection");
  ck_assert_int_eq(GET(srv.requests), 5);
  ck_assert_int_eq(GET(srv.accepts), 3);
  hc_free(&h);
  server_stop();
}
END_TEST

START_TEST(a_refusal_before_100_continue_keeps_the_body_unsent) {
  static char body[64 * 1024];
  struct hc_target to;
  struct hc h;

  server_start();
  target(&to);
  hc_init(&h);
  SET(srv.plan, REFUSE_BEFORE_BODY);
  memset(body, 'b', sizeof(body));
  ck_assert_int_eq(hc_start(&h, &to, "/logs", "", body, sizeof(body), 30000, 1024, 5000), 0);
  run(&h);
  ck_assert_msg(h.rc == 0, "%s", h.err);
  ck_assert_int_eq(h.status, 413);
  ck_assert_str_eq(h.answer, "no!");
  ck_assert_uint_eq(GET(srv.body_bytes), 0);
  ck_assert_uint_eq(h.body_sent, 0);
  ck_assert_int_eq(h.fd, -1); /* (not kept: the body was never sent) */
  hc_free(&h);
  server_stop();
}
END_TEST

/* A large body waits for 100 Continue, then goes; where none comes, it
 * goes when its wait is over; a success before the body was read is not
 * taken for one. */
START_TEST(a_large_body_goes_after_100_continue_or_its_wait) {
  static char body[64 * 1024];
  struct hc_target to;
  struct hc h;
  int64_t t0;

  server_start();
  target(&to);
  hc_init(&h);
  memset(body, 'b', sizeof(body));
  SET(srv.plan, CONTINUE_THEN_READ);
  t0 = util_mono_ms();
  ck_assert_int_eq(hc_start(&h, &to, "/logs", "", body, sizeof(body), 30000, 1024, 20000), 0);
  run(&h);
  ck_assert_msg(h.rc == 0, "%s", h.err);
  ck_assert_int_eq(h.status, 200);
  ck_assert_uint_eq(GET(srv.body_bytes), sizeof(body));
  ck_assert_int_lt(util_mono_ms() - t0, 30000); /* (it did not wait out the 30 s) */
  ck_assert_int_ge(h.fd, 0);                    /* kept */

  SET(srv.plan, READ_WITHOUT_CONTINUE);
  t0 = util_mono_ms();
  ck_assert_int_eq(hc_start(&h, &to, "/logs", "", body, sizeof(body), 200, 1024, 20000), 0);
  run(&h);
  ck_assert_msg(h.rc == 0, "%s", h.err);
  ck_assert_int_eq(h.status, 200);
  ck_assert_uint_eq(GET(srv.body_bytes), sizeof(body));
  ck_assert_int_ge(util_mono_ms() - t0, 200);

  SET(srv.plan, OK_BEFORE_BODY);
  ck_assert_int_eq(hc_start(&h, &to, "/logs", "", body, sizeof(body), 30000, 1024, 20000), 0);
  run(&h);
  ck_assert_int_eq(h.rc, MUSTER_E_UNREACHABLE);
  ck_assert_msg(strstr(h.err, "answered HTTP 200 before it read the body"), "%s", h.err);
  hc_free(&h);
  server_stop();
}
END_TEST

/* A refusal that comes while the body is being sent stops the sending,
 * and is the call's answer (not a broken pipe). */
START_TEST(a_refusal_while_the_body_goes_is_the_answer) {
  static char body[32 << 20]; /* (more than the sockets' buffers hold) */
  struct hc_target to;
  struct hc h;

  server_start();
  target(&to);
  hc_init(&h);
  memset(body, 'b', sizeof(body));
  SET(srv.plan, CONTINUE_THEN_REFUSE);
  ck_assert_int_eq(hc_start(&h, &to, "/logs", "", body, sizeof(body), 30000, 1024, 20000), 0);
  run(&h);
  SET(srv.release, 1);
  ck_assert_msg(h.rc == 0, "%s", h.err);
  ck_assert_int_eq(h.status, 413);
  ck_assert_str_eq(h.answer, "no!");
  ck_assert_uint_lt(h.body_sent, sizeof(body));
  ck_assert_int_eq(h.fd, -1);
  hc_free(&h);
  server_stop();
}
END_TEST

/* A URL that names its host is looked up (glibc's getaddrinfo_a), and the
 * call goes to what the name is. */
START_TEST(a_named_host_is_looked_up_without_blocking) {
  struct hc_target to;
  struct hc h;
  char url[64];

  struct addrinfo *ai = NULL, hints = {.ai_socktype = SOCK_STREAM};

  /* (the name service answers for localhost here: its modules loaded) */
  ck_assert_msg(getaddrinfo("localhost", "80", &hints, &ai) == 0, "localhost has no address here");
  freeaddrinfo(ai);
  server_start();
  snprintf(url, sizeof(url), "http://localhost:%d", srv.port);
  ck_assert_int_eq(hc_target_parse(url, &to), 0);
  hc_init(&h);
  SET(srv.plan, ANSWER_KEEP);
  ck_assert_int_eq(hc_start(&h, &to, "/x", "", "{}", 2, 0, 1024, 5000), 0);
  ck_assert_int_eq(h.st, HC_RESOLVE);
  run(&h);
  ck_assert_msg(h.rc == 0, "%s", h.err);
  ck_assert_str_eq(h.answer, "ok");
  hc_free(&h);
  server_stop();
}
END_TEST

START_TEST(a_server_that_never_answers_ends_the_call_at_its_deadline) {
  struct hc_target to;
  struct hc h;
  int64_t t0;

  server_start();
  target(&to);
  hc_init(&h);
  SET(srv.plan, NEVER_ANSWER);
  t0 = util_mono_ms();
  ck_assert_int_eq(hc_start(&h, &to, "/x", "", "{}", 2, 0, 1024, 300), 0);
  run(&h);
  ck_assert_int_eq(h.rc, MUSTER_E_UNREACHABLE);
  ck_assert_msg(strstr(h.err, "no answer within 300 ms"), "%s", h.err);
  ck_assert_int_ge(util_mono_ms() - t0, 300);
  hc_free(&h);
  server_stop();
  /* Nobody listens there now: refused, and said so. */
  hc_init(&h);
  ck_assert_int_eq(hc_start(&h, &to, "/x", "", "{}", 2, 0, 1024, 5000), 0);
  run(&h);
  ck_assert_int_eq(h.rc, MUSTER_E_UNREACHABLE);
  ck_assert_msg(strstr(h.err, "Connection refused"), "%s", h.err);
  hc_free(&h);
}
END_TEST

/* Authorities replaced while a session uses them stay until it is gone;
 * a CA file that goes away leaves the last ones in use. */
START_TEST(replaced_authorities_outlive_the_sessions_that_use_them) {
  char dir[] = "/tmp/muster-hc-XXXXXX", cmd[700], ca[300], other[300], err[HC_ERR_MAX];
  gnutls_certificate_credentials_t c1, c2;
  gnutls_x509_trust_list_t tl = NULL;
  gnutls_session_t s1;

  ck_assert_ptr_nonnull(mkdtemp(dir));
  snprintf(cmd, sizeof(cmd),
           "bash %s/tests/tls/make_ca.sh %s/a 127.0.0.1 >/dev/null 2>&1 && "
           "bash %s/tests/tls/make_ca.sh %s/b 127.0.0.1 >/dev/null 2>&1",
           MUSTER_SOURCE_DIR, dir, MUSTER_SOURCE_DIR, dir);
  ck_assert_int_eq(system(cmd), 0);
  snprintf(ca, sizeof(ca), "%s/a/ca.pem", dir);
  snprintf(other, sizeof(other), "%s/b/ca.pem", dir);
  ck_assert_msg(hc_tls_cred(ca, err, sizeof(err)) == 0, "%s", err);
  c1 = hc_tls_hold();
  ck_assert_int_eq(gnutls_init(&s1, GNUTLS_CLIENT), 0);
  ck_assert_int_eq(gnutls_credentials_set(s1, GNUTLS_CRD_CERTIFICATE, c1), 0);
  /* The file is replaced (another CA at the same path): read again. */
  ck_assert_int_eq(rename(other, ca), 0);
  ck_assert_msg(hc_tls_cred(ca, err, sizeof(err)) == 0, "%s", err);
  c2 = hc_tls_hold();
  ck_assert_ptr_ne(c1, c2);
  ck_assert_int_eq(hc_tls_kept(), 1); /* (c1, for s1) */
  gnutls_certificate_get_trust_list(c1, &tl);
  ck_assert_ptr_nonnull(tl);
  gnutls_deinit(s1);
  hc_tls_release(c1);
  ck_assert_int_eq(hc_tls_kept(), 0); /* (freed with its last session) */
  /* The file goes: the last authorities serve. */
  ck_assert_int_eq(unlink(ca), 0);
  ck_assert_int_eq(hc_tls_cred(ca, err, sizeof(err)), 0);
  ck_assert_ptr_eq(hc_tls_hold(), c2);
  hc_tls_release(c2);
  hc_tls_release(c2);
  snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
  ck_assert_int_eq(system(cmd), 0);
}
END_TEST

START_TEST(urls_are_taken_apart_or_refused) {
  struct hc_target t;

  ck_assert_int_eq(hc_target_parse("https://[::1]:8443/base/", &t), 0);
  ck_assert(t.tls);
  ck_assert_str_eq(t.host, "::1");
  ck_assert_str_eq(t.port, "8443");
  ck_assert_str_eq(t.host_header, "[::1]:8443");
  ck_assert_str_eq(t.prefix, "/base");
  ck_assert_int_eq(hc_target_parse("http://ctl.example", &t), 0);
  ck_assert_str_eq(t.port, "80");
  ck_assert_str_eq(t.prefix, "");
  ck_assert_int_eq(hc_target_parse("ftp://x", &t), MUSTER_E_INVALID);
  ck_assert_int_eq(hc_target_parse("http://x:99999", &t), MUSTER_E_INVALID);
  ck_assert_int_eq(hc_target_parse("http://u@x:80", &t), MUSTER_E_INVALID);
  ck_assert_int_eq(hc_target_parse("http://:80", &t), MUSTER_E_INVALID);
  ck_assert_int_eq(hc_target_parse("http://x/a b", &t), MUSTER_E_INVALID);
}
END_TEST

int main(void) {
  Suite *s = suite_create("http_client");
  TCase *tc = tcase_create("http_client");

  tcase_set_timeout(tc, 60);
  tcase_add_test(tc, urls_are_taken_apart_or_refused);
  tcase_add_test(tc, replaced_authorities_outlive_the_sessions_that_use_them);
  tcase_add_test(tc, an_answer_is_read_however_it_is_framed_and_split);
  tcase_add_test(tc, a_bad_or_oversized_answer_is_an_error_that_says_so);
  tcase_add_test(tc, a_kept_connection_serves_again_or_is_replaced_unseen);
  tcase_add_test(tc, a_refusal_before_100_continue_keeps_the_body_unsent);
  tcase_add_test(tc, a_large_body_goes_after_100_continue_or_its_wait);
  tcase_add_test(tc, a_refusal_while_the_body_goes_is_the_answer);
  tcase_add_test(tc, a_named_host_is_looked_up_without_blocking);
  tcase_add_test(tc, a_server_that_never_answers_ends_the_call_at_its_deadline);
  suite_add_tcase(s, tc);
  return check_run(s);
}
