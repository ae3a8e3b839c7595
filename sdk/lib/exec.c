/* exec.c: the client of a worker's exec channel; see docs/exec-protocol.md.
 * The framing is common/exec_wire.h, shared with the server in workerd.
 * Nothing here talks to the controller (exec_target.c does), so that
 * muster-launcher links this file without libcurl. */
#include "exec_wire.h"
#include "hostport.h"
#include "muster.h"
#include "util.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <gnutls/gnutls.h>
#include <jansson.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define OUT_MAX (4 * 1024 * 1024)

void muster_exec_opts_init(muster_exec_opts *o) {
  memset(o, 0, sizeof(*o));
  o->stdin_fd = -1;
  o->stdout_fd = 1;
  o->stderr_fd = 2;
}

/* The lists are written by run.c (MUSTER_EXEC_HOSTS, MUSTER_EXEC_RANKS), in
 * the format of hostport.h: "ip:port,ip:port,...". */
int muster_exec_list_find(const char *list, const char *host, long index, const char *token,
                          muster_exec_target *t) {
  memset(t, 0, sizeof(*t));
  if (hostport_list_find(list, host, index, t->host, sizeof(t->host), &t->port) != 0) {
    memset(t, 0, sizeof(*t));
    return MUSTER_E_NOT_FOUND;
  }
  snprintf(t->token, sizeof(t->token), "%s", token ? token : "");
  snprintf(t->worker_id, sizeof(t->worker_id), "at %.12s", t->host);
  return 0;
}

static MUST_CHECK int write_all(int fd, const char *p, size_t n) {
  while (n) {
    ssize_t w = write(fd, p, n);
    if (w < 0) {
      if (errno == EINTR)
        continue;
      return -1;
    }
    p += w;
    n -= (size_t)w;
  }
  return 0;
}

struct outbuf {
  char *data;
  size_t len, cap;
};

static MUST_CHECK int out_frame(struct outbuf *o, char type, const void *payload, size_t n) {
  if (o->len + EXEC_WIRE_HDR_LEN + n > o->cap) {
    size_t cap = o->cap ? o->cap : 65536;
    char *grown;
    while (cap < o->len + EXEC_WIRE_HDR_LEN + n)
      cap *= 2;
    grown = realloc(o->data, cap);
    if (!grown)
      return -1;
    o->data = grown;
    o->cap = cap;
  }
  exec_wire_put_hdr((unsigned char *)o->data + o->len, type, n);
  if (n)
    memcpy(o->data + o->len + EXEC_WIRE_HDR_LEN, payload, n);
  o->len += EXEC_WIRE_HDR_LEN + n;
  return 0;
}

/* Connects to t's exec port within EXEC_WIRE_CONNECT_MS (an address that
 * drops packets would otherwise hold a connect() for minutes), giving up at
 * once when o->cancel becomes non-zero. Returns a non-blocking socket, or -1
 * with err filled. */
static MUST_CHECK int connect_to(const muster_exec_target *t, const muster_exec_opts *o, char *err,
                                 size_t errlen) {
  struct addrinfo hints, *res = NULL;
  char port[16];
  int fd, one = 1, gai, e = 0;
  socklen_t elen = sizeof(e);

  memset(&hints, 0, sizeof(hints));
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV;
  snprintf(port, sizeof(port), "%d", t->port);
  gai = getaddrinfo(t->host, port, &hints, &res);
  if (gai) {
    snprintf(err, errlen, "cannot resolve %s: %s", t->host, gai_strerror(gai));
    return -1;
  }
  fd = socket(res->ai_family, res->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, res->ai_protocol);
  if (fd < 0) {
    e = errno;
  } else if (connect(fd, res->ai_addr, res->ai_addrlen) != 0) {
    struct timespec ts;
    int64_t deadline;

    e = errno;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    deadline = (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000 + EXEC_WIRE_CONNECT_MS;
    while (e == EINPROGRESS || e == EINTR) {
      struct pollfd p = {.fd = fd, .events = POLLOUT};
      int r;

      clock_gettime(CLOCK_MONOTONIC, &ts);
      if ((int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000 >= deadline) {
        e = ETIMEDOUT;
        break;
      }
      if (o->cancel && *o->cancel) {
        e = ECANCELED;
        break;
      }
      r = poll(&p, 1, 100);
      if (r < 0 && errno != EINTR)
        e = errno;
      else if (r > 0 && getsockopt(fd, SOL_SOCKET, SO_ERROR, &e, &elen) != 0)
        e = errno; /* else e is the connect's answer: 0 once connected */
    }
  }
  freeaddrinfo(res);
  if (fd < 0 || e) {
    snprintf(err, errlen, "cannot reach worker %s at %s:%d: %s", t->worker_id, t->host, t->port,
             e == ETIMEDOUT ? "no answer within " EXEC_WIRE_CONNECT_S " s" : strerror(e));
    if (fd >= 0)
      close(fd);
    return -1;
  }
  if (setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one)) != 0) {
    /* Only latency is lost. */
  }
  return fd;
}

/* The exec channel's TLS, the client's end (docs/exec-protocol.md,
 * "Credentials"): the session's token is the pre-shared key, never sent. */
struct tls {
  gnutls_session_t s;
  gnutls_psk_client_credentials_t cred;
  int again; /* the last record waits to be sent again (gnutls_record_send) */
};

static int64_t now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void tls_close(struct tls *tc) {
  if (tc->s)
    gnutls_deinit(tc->s);
  if (tc->cred)
    gnutls_psk_free_client_credentials(tc->cred);
  tc->s = NULL;
  tc->cred = NULL;
}

/* The handshake over fd, within EXEC_WIRE_CONNECT_MS. Returns 0; or
 * MUSTER_E_FORBIDDEN (*refused set: the worker said no to the token), or
 * another error, with err saying why. */
static int tls_open(struct tls *tc, int fd, const muster_exec_target *t, const muster_exec_opts *o,
                    char *err, size_t errlen) {
  gnutls_datum_t key = {(unsigned char *)t->token, (unsigned)strlen(t->token)};
  int64_t deadline = now_ms() + EXEC_WIRE_CONNECT_MS;
  int r;

  if (!t->token[0]) {
    snprintf(err, errlen, "%s (no exec token to give worker %s)", EXEC_WIRE_ERR_TOKEN,
             t->worker_id);
    return MUSTER_E_FORBIDDEN;
  }
  if (gnutls_psk_allocate_client_credentials(&tc->cred) < 0 ||
      gnutls_psk_set_client_credentials(tc->cred, EXEC_TLS_IDENTITY, &key, GNUTLS_PSK_KEY_RAW) <
          0 ||
      gnutls_init(&tc->s, GNUTLS_CLIENT | GNUTLS_NONBLOCK | GNUTLS_NO_SIGNAL) < 0 ||
      gnutls_priority_set_direct(tc->s, EXEC_TLS_PRIORITY, NULL) < 0 ||
      gnutls_credentials_set(tc->s, GNUTLS_CRD_PSK, tc->cred) < 0) {
    snprintf(err, errlen, "cannot set up TLS (GnuTLS) for worker %s", t->worker_id);
    return MUSTER_E_INTERNAL;
  }
  gnutls_transport_set_int(tc->s, fd);
  while ((r = gnutls_handshake(tc->s)) != GNUTLS_E_SUCCESS) {
    struct pollfd p = {.fd = fd};

    if (r == GNUTLS_E_FATAL_ALERT_RECEIVED) {
      gnutls_alert_description_t a = gnutls_alert_get(tc->s);

      /* (what GnuTLS answers a key that does not match, or none) */
      if (a == GNUTLS_A_DECRYPT_ERROR || a == GNUTLS_A_ILLEGAL_PARAMETER ||
          a == GNUTLS_A_BAD_RECORD_MAC || a == GNUTLS_A_UNKNOWN_PSK_IDENTITY) {
        snprintf(err, errlen, "%s (worker %s: its TLS handshake's alert: %s)", EXEC_WIRE_ERR_TOKEN,
                 t->worker_id, gnutls_alert_get_name(a));
        return MUSTER_E_FORBIDDEN;
      }
      snprintf(err, errlen, "worker %s (%s:%d) refused the TLS handshake: %s", t->worker_id,
               t->host, t->port, gnutls_alert_get_name(a));
      return MUSTER_E_PROTOCOL;
    }
    if (r != GNUTLS_E_AGAIN && r != GNUTLS_E_INTERRUPTED && gnutls_error_is_fatal(r)) {
      snprintf(err, errlen,
               "worker %s (%s:%d) ended the connection before its TLS handshake did (%s): it may "
               "serve too many exec connections, or be stopping",
               t->worker_id, t->host, t->port, gnutls_strerror(r));
      return MUSTER_E_UNREACHABLE;
    }
    if (o->cancel && *o->cancel) {
      snprintf(err, errlen, "cancelled");
      return MUSTER_E_SHUTTING_DOWN;
    }
    if (now_ms() >= deadline) {
      snprintf(err, errlen, "worker %s (%s:%d) did not finish a TLS handshake within %s s",
               t->worker_id, t->host, t->port, EXEC_WIRE_CONNECT_S);
      return MUSTER_E_UNREACHABLE;
    }
    p.events = gnutls_record_get_direction(tc->s) ? POLLOUT : POLLIN;
    (void)poll(&p, 1, 100);
  }
  return 0;
}

static char *hello(const muster_exec_target *t, const muster_exec_opts *o) {
  json_t *h = json_object(), *argv = json_array(), *env = json_object();
  char *text;

  for (size_t i = 0; i < o->argc; i++)
    json_array_append_new(argv, json_string(o->argv[i] ? o->argv[i] : ""));
  for (size_t i = 0; i < o->nenv; i++) {
    const char *eq = strchr(o->env[i], '=');
    char key[257];
    if (!eq || eq == o->env[i] || (size_t)(eq - o->env[i]) >= sizeof(key))
      continue;
    memcpy(key, o->env[i], (size_t)(eq - o->env[i]));
    key[eq - o->env[i]] = '\0';
    json_object_set_new(env, key, json_string(eq + 1));
  }
  (void)t; /* (the token keys the TLS: the hello carries none) */
  json_object_set_new(h, "argv", argv);
  json_object_set_new(h, "env", env);
  json_object_set_new(h, "cwd", o->cwd ? json_string(o->cwd) : json_null());
  text = json_dumps(h, JSON_COMPACT);
  json_decref(h);
  return text;
}

static MUST_CHECK int deliver(const muster_exec_opts *o, int is_err, const char *p, size_t n) {
  muster_data_cb cb = is_err ? o->on_stderr : o->on_stdout;
  int fd = is_err ? o->stderr_fd : o->stdout_fd;

  if (cb)
    return cb(o->arg, p, n) ? -1 : 0;
  if (fd >= 0 && write_all(fd, p, n) != 0)
    return -1;
  return 0;
}

int muster_exec_at(const muster_exec_target *t, const muster_exec_opts *o, int *exit_code,
                   char *err, size_t errlen) {
  int signo;

  return muster_exec_at_signal(t, o, exit_code, &signo, err, errlen);
}

int muster_exec_at_signal(const muster_exec_target *t, const muster_exec_opts *o, int *exit_code,
                          int *signo, char *err, size_t errlen) {
  struct outbuf out = {0};
  struct tls tc = {0};
  char *in = NULL, *h = NULL;
  size_t inlen = 0;
  int fd, stdin_open = o->stdin_fd >= 0, rc = MUSTER_E_UNREACHABLE, done = 0, no_signo;

  if (!signo)
    signo = &no_signo;
  *exit_code = -1;
  *signo = 0;
  err[0] = '\0';
  if (o->argc == 0) {
    snprintf(err, errlen, "no command given");
    return MUSTER_E_INVALID;
  }
  fd = connect_to(t, o, err, errlen);
  if (fd < 0) /* cancelled: as a cancel anywhere else here */
    return o->cancel && *o->cancel ? MUSTER_E_SHUTTING_DOWN : MUSTER_E_UNREACHABLE;
  if ((rc = tls_open(&tc, fd, t, o, err, errlen)) != 0) {
    if (rc == MUSTER_E_FORBIDDEN)
      *exit_code = 126; /* (as a refused hello: the command never ran) */
    goto out;
  }
  rc = MUSTER_E_UNREACHABLE;
  h = hello(t, o);
  in = malloc(EXEC_WIRE_FRAME_MAX + EXEC_WIRE_HDR_LEN);
  if (!h || !in || out_frame(&out, EXEC_FRAME_HELLO, h, strlen(h)) != 0) {
    snprintf(err, errlen, "out of memory");
    rc = MUSTER_E_NOMEM;
    goto out;
  }
  if (!stdin_open && out_frame(&out, EXEC_FRAME_STDIN, NULL, 0) != 0) {
    snprintf(err, errlen, "out of memory");
    rc = MUSTER_E_NOMEM;
    goto out;
  }

  while (!done) {
    struct pollfd p[2];
    int np = 1;

    if (o->cancel && *o->cancel) {
      snprintf(err, errlen, "cancelled");
      rc = MUSTER_E_SHUTTING_DOWN;
      goto out;
    }
    p[0].fd = fd;
    p[0].events = POLLIN | (out.len ? POLLOUT : 0);
    p[0].revents = 0;
    /* Read our stdin only while the worker keeps up. */
    if (stdin_open && out.len < OUT_MAX) {
      p[1].fd = o->stdin_fd;
      p[1].events = POLLIN;
      p[1].revents = 0;
      np = 2;
    }
    /* (records read already may hold frames: poll() says nothing of them) */
    if (poll(p, (nfds_t)np, gnutls_record_check_pending(tc.s) > 0 ? 0 : o->cancel ? 200 : -1) < 0) {
      if (errno == EINTR)
        continue;
      snprintf(err, errlen, "poll: %s", strerror(errno));
      goto out;
    }
    if (np == 2 && p[1].revents) {
      char buf[65536];
      ssize_t n = read(o->stdin_fd, buf, sizeof(buf));
      if (n > 0) {
        if (out_frame(&out, EXEC_FRAME_STDIN, buf, (size_t)n) != 0) {
          snprintf(err, errlen, "out of memory");
          rc = MUSTER_E_NOMEM;
          goto out;
        }
      } else if (n == 0 || (errno != EINTR && errno != EAGAIN)) {
        stdin_open = 0;
        if (out_frame(&out, EXEC_FRAME_STDIN, NULL, 0) != 0) {
          snprintf(err, errlen, "out of memory");
          rc = MUSTER_E_NOMEM;
          goto out;
        }
      }
    }
    if (p[0].revents & POLLOUT) {
      /* (after GNUTLS_E_AGAIN the same record goes again: NULL, 0) */
      ssize_t w = tc.again ? gnutls_record_send(tc.s, NULL, 0)
                           : gnutls_record_send(tc.s, out.data, out.len);
      tc.again = w == GNUTLS_E_AGAIN || w == GNUTLS_E_INTERRUPTED;
      if (w > 0) {
        memmove(out.data, out.data + w, out.len - (size_t)w);
        out.len -= (size_t)w;
      } else if (w < 0 && !tc.again) {
        snprintf(err, errlen, "the connection to worker %s (%s:%d) broke: %s", t->worker_id,
                 t->host, t->port, gnutls_strerror((int)w));
        goto out;
      }
    }
    if ((p[0].revents & (POLLIN | POLLHUP | POLLERR)) || gnutls_record_check_pending(tc.s) > 0) {
      ssize_t n =
          gnutls_record_recv(tc.s, in + inlen, EXEC_WIRE_FRAME_MAX + EXEC_WIRE_HDR_LEN - inlen);
      if (n == 0 || (n < 0 && n != GNUTLS_E_AGAIN && n != GNUTLS_E_INTERRUPTED &&
                     n != GNUTLS_E_WARNING_ALERT_RECEIVED)) {
        snprintf(err, errlen,
                 "the connection to worker %s (%s:%d) closed before the command "
                 "ended%s%s",
                 t->worker_id, t->host, t->port, n < 0 ? ": " : "",
                 n < 0 ? gnutls_strerror((int)n) : "");
        goto out;
      }
      if (n < 0)
        continue;
      inlen += (size_t)n;
      /* Handle every complete frame. */
      for (;;) {
        struct exec_wire_hdr fh;
        /* A type this protocol does not define is skipped like the ones
         * this end has no use for. */
        enum exec_wire_rc hr = exec_wire_parse_hdr((const unsigned char *)in, inlen, &fh);
        const char *payload = in + EXEC_WIRE_HDR_LEN;
        size_t plen = fh.len;

        if (hr == EXEC_WIRE_SHORT)
          break;
        if (hr == EXEC_WIRE_TOO_LARGE) {
          snprintf(err, errlen, "worker %s sent a frame of %zu bytes", t->worker_id, plen);
          rc = MUSTER_E_PROTOCOL;
          goto out;
        }
        if (inlen < EXEC_WIRE_HDR_LEN + plen)
          break;
        if (fh.type == EXEC_FRAME_STDOUT || fh.type == EXEC_FRAME_STDERR) {
          if (deliver(o, fh.type == EXEC_FRAME_STDERR, payload, plen) != 0) {
            snprintf(err, errlen, "the output could not be delivered");
            rc = MUSTER_E_IO;
            goto out;
          }
        } else if (fh.type == EXEC_FRAME_EXIT) {
          json_t *x = json_loadb(payload, plen, 0, NULL);
          json_t *code = json_object_get(x, "exit_code"), *sig = json_object_get(x, "signal");
          const char *why = json_string_value(json_object_get(x, "error"));
          if (json_is_integer(code))
            *exit_code = (int)json_integer_value(code);
          else if (json_is_integer(sig) && json_integer_value(sig) > 0 &&
                   json_integer_value(sig) < 128) {
            *signo = (int)json_integer_value(sig);
            *exit_code = 128 + *signo;
          }
          rc = 0;
          /* err says why the worker did not run the command, or nothing
           * (not what a retry to connect left there). */
          err[0] = '\0';
          if (why) {
            snprintf(err, errlen, "worker %s: %s", t->worker_id, why);
            if (*exit_code == 126 &&
                (strcmp(why, EXEC_WIRE_ERR_TOKEN) == 0 || strcmp(why, EXEC_WIRE_ERR_NO_TOKEN) == 0))
              rc = MUSTER_E_FORBIDDEN;
            else if (*exit_code == 127)
              rc = MUSTER_E_NOT_FOUND;
          }
          json_decref(x);
          done = 1;
          break;
        }
        memmove(in, in + EXEC_WIRE_HDR_LEN + plen, inlen - EXEC_WIRE_HDR_LEN - plen);
        inlen -= EXEC_WIRE_HDR_LEN + plen;
      }
    }
  }
out:
  tls_close(&tc);
  close(fd);
  free(out.data);
  free(in);
  free(h);
  return rc;
}
