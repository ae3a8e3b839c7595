/*
 * exec_server.c: the server end of the exec channel (docs/exec-protocol.md;
 * the framing is common/exec_wire.h, shared with the client in
 * sdk/lib/exec.c).
 *
 * One TCP connection runs one command: the client sends a hello (token, argv,
 * env, cwd), then stdin (I) and signals (K); we send the command's stdout (O)
 * and stderr (E) as they come, then its exit (X), and close.
 *
 * Every connection lives in the main poll loop, with its socket, the
 * command's three pipes and its deadlines. Flow control both ways, with fixed
 * bounds: the command's output pipes are not read while the connection holds
 * EX_OUT_HIGH unsent bytes, and the socket is not read while the last stdin
 * frame (at most 1 MiB) has not gone into the command's stdin pipe. So a
 * client that stops reading stalls its command, as a full terminal would,
 * and costs at most about 2 MiB.
 *
 * A connection's life: EX_HELLO (waiting for the hello, 10 s at most) ->
 * EX_RUNNING (the command runs; it ends when the command has exited and its
 * output pipes reached end of file, or 2 s after its exit) -> EX_CLOSING (X
 * queued; send what is left, shut our side, read until the client closes,
 * so that unread input never turns the close into a reset that could destroy
 * the X on its way) -> freed. A client gone before the X turns the connection
 * into EX_ORPHAN: its command's process group gets SIGTERM, SIGKILL 2 s
 * later, and the record lives until the command is reaped.
 *
 * This file accepts connections and moves each through its states; the
 * hello is checked in exec_hello.c, frames are encoded and decoded in
 * exec_frame.c, and the command and its pipes are exec_relay.c's
 * (exec_internal.h).
 */
#include "exec_internal.h"

#include "log.h"
#include "muster_errors.h"
#include "util.h"

#include <errno.h>
#include <inttypes.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

static struct {
  struct ex_conn *conns[EX_RECORDS];
  size_t n;
  /* Connections dropped before their token held: counted, and said in one
   * log line per EX_QUIET_MS at most. */
  uint64_t refused;
  long quiet;
  int64_t quiet_logged_ms;
  bool stopping; /* workerd is ending: refuse, kill, wind down */
  int64_t stop_deadline_ms;
  int64_t accept_after_ms; /* accept() ran out of descriptors: pause */
  int at_listen;
} ex;

/* ------------------------------------------------------------------------ */
/* The listening socket                                                     */

void exec_prewarm(void) {
  if (ex_tls_init() != 0)
    LOG(LOG_WARN, "cannot set up the exec channel's TLS (GnuTLS) ahead; each worker tries");
}

/* Opens the exec channel's listening socket on wd.ip, port 0, and records the
 * port the kernel chose in wd.exec_port. The socket (wd.listen_fd, closed by
 * cleanup()) stays open for the daemon's life; the main loop accepts on it
 * (ex_accept()).
 * Returns 0, MUSTER_E_INVALID if wd.ip is not a numeric address, or
 * MUSTER_E_IO (logged). */
MUST_CHECK int exec_listen(void) {
  struct addrinfo hints;
  struct addrinfo *res = NULL;
  struct sockaddr_storage ss;
  socklen_t sl = sizeof(ss);
  int gai;
  int rc = MUSTER_E_IO;

  memset(&hints, 0, sizeof(hints));
  hints.ai_flags = AI_NUMERICHOST | AI_NUMERICSERV | AI_PASSIVE;
  hints.ai_socktype = SOCK_STREAM;
  gai = getaddrinfo(wd.ip, "0", &hints, &res);
  if (gai != 0) {
    LOG(LOG_ERROR, "\"%s\" is not an IP address: %s", wd.ip, gai_strerror(gai));
    rc = MUSTER_E_INVALID;
    goto out;
  }
  if (ex_tls_init() != 0) {
    LOG(LOG_ERROR, "cannot set up the exec channel's TLS (GnuTLS)");
    goto out;
  }
  /* Non-blocking: the main loop accepts until EAGAIN. */
  wd.listen_fd = socket(res->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (wd.listen_fd < 0) {
    LOG(LOG_ERROR, "cannot create the exec socket: %s", strerror(errno));
    goto out;
  }
  if (bind(wd.listen_fd, res->ai_addr, res->ai_addrlen) != 0 ||
      listen(wd.listen_fd, SOMAXCONN) != 0 ||
      getsockname(wd.listen_fd, (struct sockaddr *)&ss, &sl) != 0) {
    LOG(LOG_ERROR, "cannot listen on %s: %s", wd.ip, strerror(errno));
    goto out;
  }
  if (ss.ss_family == AF_INET6)
    wd.exec_port = ntohs(((struct sockaddr_in6 *)&ss)->sin6_port);
  else
    wd.exec_port = ntohs(((struct sockaddr_in *)&ss)->sin_port);
  rc = 0;
out:
  if (res)
    freeaddrinfo(res);
  return rc;
}

/* ------------------------------------------------------------------------ */
/* Connections                                                              */

/* Ends c's exchange with X: queues it, closes the pipes and moves to
 * EX_CLOSING. code and signo are -1 for null; error (NULL for null) is a
 * sentence for the client. If even the X cannot be queued, the socket is
 * released, which the client sees as a lost connection. */
static void ex_finish(struct ex_conn *c, int code, int signo, const char *error, int64_t now) {
  char *x = ex_exit_json(code, signo, error);

  ex_pipes_close(c);
  free(c->in);
  c->in = NULL;
  c->in_len = c->in_got = c->hdr_got = 0;
  c->state = EX_CLOSING;
  c->deadline_ms = now + EX_STALL_MS;
  if (!x || ex_queue(c, EXEC_FRAME_EXIT, x, strlen(x)) != 0) {
    LOG(LOG_ERROR, "exec from %s: out of memory for the exit frame", c->peer);
    ex_sock_release(c);
  }
  free(x);
}

/* Refuses c's request (nothing runs): X with exit code code and error. */
static void ex_refuse(struct ex_conn *c, int code, const char *error, int64_t now) {
  LOG(LOG_WARN, "exec from %s refused: %s", c->peer, error);
  ex_finish(c, code, -1, error, now);
}

/* Counts a connection refused before its token held (from peer, for why),
 * said in one log line per EX_QUIET_MS at most. */
static void ex_count_refusal(const char *peer, const char *why, int64_t now) {
  ex.refused++;
  ex.quiet++;
  if (!ex.quiet_logged_ms || now - ex.quiet_logged_ms >= EX_QUIET_MS) {
    LOG(LOG_WARN,
        "refused %ld exec connection%s without this session's token (the latest from %s: %s; "
        "%" PRIu64 " since start)",
        ex.quiet, ex.quiet == 1 ? "" : "s", peer, why, ex.refused);
    ex.quiet = 0;
    ex.quiet_logged_ms = now;
  }
}

/* Drops c, whose TLS handshake did not hold (or never ended): the
 * connection ends at once (there is no session to carry an X), so that a
 * client without the token holds no record. Nothing is logged for each:
 * the refusals are counted and summed up once a minute. */
static void ex_drop_unauth(struct ex_conn *c, const char *error, int64_t now) {
  ex_sock_release(c);
  c->state = EX_ORPHAN;
  ex_count_refusal(c->peer, error, now);
}

/* The client is gone (or broke the protocol) before its X: the command's
 * group gets SIGTERM now and SIGKILL 2 s later, and the record stays as an
 * orphan until the command is reaped. why is for the log. */
static void ex_disconnect(struct ex_conn *c, const char *why, int64_t now) {
  ex_sock_release(c);
  ex_pipes_close(c);
  if (c->state == EX_RUNNING && c->pid > 0 && !c->exited) {
    LOG(LOG_INFO, "exec from %s: %s; terminating %s", c->peer, why, c->name);
    ex_signal(c, SIGTERM);
    if (c->kill_at_ms == INT64_MAX)
      c->kill_at_ms = now + EX_KILL_GRACE_MS;
  } else if (c->state == EX_RUNNING && c->pid > 0) {
    /* The command exited but something it started still holds its output
     * pipes: that group is about to be reaped, not kept. */
    LOG(LOG_DEBUG, "exec from %s: %s after the command exited", c->peer, why);
    kill(-c->pid, SIGKILL);
  } else if (c->state != EX_CLOSING) {
    LOG(LOG_DEBUG, "exec from %s: %s", c->peer, why);
  }
  c->state = EX_ORPHAN;
}

/* Checks the hello (text, len bytes) and starts its command, moving c to
 * EX_RUNNING; or refuses it with an X. */
static void ex_start(struct ex_conn *c, const char *text, size_t len, int64_t now) {
  struct ex_cmd cmd = {0};
  char err[EX_ERR_MAX];
  int code = 126;

  if (ex_hello_parse(c, text, len, &cmd, err, sizeof(err)) != 0 ||
      ex_spawn(c, &cmd, &code, err, sizeof(err)) != 0)
    ex_refuse(c, code, err, now);
  else
    c->state = EX_RUNNING;
  ex_cmd_cleanup(&cmd);
}

/* Acts on one complete frame from the client; the payload (c->in, c->in_len
 * bytes) is taken over or freed. */
static void ex_dispatch(struct ex_conn *c, char type, int64_t now) {
  unsigned char *payload = c->in;
  size_t len = c->in_len;

  c->in = NULL;
  c->in_len = c->in_got = c->hdr_got = 0;
  if (c->state == EX_HELLO) {
    if (type != EXEC_FRAME_HELLO) {
      ex_refuse(c, 126, "the first frame must be a hello (H)", now);
    } else {
      ex_start(c, (const char *)payload, len, now);
    }
  } else if (c->state != EX_RUNNING) {
    /* CLOSING: whatever still comes in is read only to be dropped. */
  } else if (type == EXEC_FRAME_STDIN && len == 0) {
    fd_close(&c->stdin_fd);
  } else if (type == EXEC_FRAME_STDIN) {
    if (c->stdin_fd >= 0) {
      c->pend = payload;
      c->pend_len = len;
      c->pend_off = 0;
      payload = NULL;
      ex_stdin_write(c);
    }
  } else if (type == EXEC_FRAME_SIGNAL) {
    char num[16];
    long sig;

    /* A NUL inside would end the number early: "15\0junk" is not 15. */
    if (len > 0 && len < sizeof(num) && !memchr(payload, '\0', len)) {
      memcpy(num, payload, len);
      num[len] = '\0';
    } else {
      num[0] = '\0';
    }
    if (util_parse_long(num, 1, NSIG - 1, &sig) == 0) {
      LOG(LOG_DEBUG, "exec from %s: signal %ld to %s", c->peer, sig, c->name);
      ex_signal(c, (int)sig);
    } else {
      LOG(LOG_WARN, "exec from %s: ignoring a K frame that is not a signal number", c->peer);
    }
  } else {
    /* A second hello, or a type from a later protocol: ignored. */
    LOG(LOG_DEBUG, "exec from %s: ignoring a frame of type 0x%02x", c->peer,
        (unsigned)(unsigned char)type);
  }
  free(payload);
}

/* The connections whose token held that hold a command or wait for one
 * (refusals on their way out hold neither). */
static size_t ex_authed_busy(void) {
  size_t busy = 0;

  for (size_t k = 0; k < ex.n; k++) {
    const struct ex_conn *o = ex.conns[k];
    busy += o->authed && (o->state != EX_CLOSING || o->pid > 0) && o->state != EX_ORPHAN;
  }
  return busy;
}

/* Reads frames from c's socket, as long as c may take them: not while stdin
 * is pending (that is the flow control toward the command). In EX_CLOSING
 * everything is read and dropped, until the client closes. */
static void ex_sock_read(struct ex_conn *c, int64_t now) {
  if (c->sock >= 0 && !c->tls_done) {
    const char *why = NULL;
    int hs = ex_tls_handshake(c, &why);

    if (hs < 0) {
      ex_drop_unauth(c, wd.exec_token ? why : EXEC_WIRE_ERR_NO_TOKEN, now);
      return;
    }
    if (hs == 0)
      return;
    /* The client has the session's token. */
    c->authed = true;
    if (ex_authed_busy() > EX_CONN_MAX) {
      ex_refuse(c, 126, "this worker serves too many exec connections (64)", now);
      return;
    }
    /* The hello (its env) may take longer on a slow link: the client is
     * known now. */
    c->deadline_ms = now + EX_HELLO_REST_MS;
  }
  for (int i = 0; i < EX_READS_PER_WAKE && c->sock >= 0; i++) {
    enum ex_rx rx;

    if (c->state == EX_ORPHAN || (c->state == EX_RUNNING && c->pend))
      return;
    rx = ex_frame_recv(c, c->state == EX_CLOSING);
    switch (rx) {
    case EX_RX_AGAIN:
      return;
    case EX_RX_MORE:
      break;
    case EX_RX_CLOSED:
    case EX_RX_BROKEN:
      if (c->state == EX_CLOSING) {
        c->peer_eof = true;
        return;
      }
      ex_disconnect(
          c, rx == EX_RX_CLOSED ? "the client closed the connection" : "the connection broke", now);
      return;
    case EX_RX_TOO_LARGE:
      if (c->state == EX_HELLO)
        ex_refuse(c, 126, "a frame is larger than 1 MiB", now);
      else
        ex_disconnect(c, "the client sent a frame larger than 1 MiB", now);
      return;
    case EX_RX_NOMEM:
      if (c->state == EX_HELLO)
        ex_refuse(c, 126, "muster-workerd is out of memory", now);
      else
        ex_disconnect(c, "out of memory for a frame", now);
      return;
    case EX_RX_FRAME:
      ex_dispatch(c, (char)c->hdr[0], now);
      break;
    }
  }
}

/* Collects the exit of every exec command that has exited. Each is waited
 * for by its own pid, so the script's child is left to child_reap(). */
void ex_reap(int64_t now) {
  for (size_t i = 0; i < ex.n; i++)
    ex_child_reap(ex.conns[i], now);
}

/* Moves c on by the clock and by what it has seen: SIGKILL when due, the
 * hello's timeout, the X once the command has exited and its output is
 * drained. */
static void ex_step(struct ex_conn *c, int64_t now) {
  if (c->kill_at_ms <= now) {
    if (c->pid > 0 && !c->exited) {
      LOG(LOG_WARN, "exec from %s: %s still runs %d s after SIGTERM; sending SIGKILL", c->peer,
          c->name, EX_KILL_GRACE_MS / 1000);
      kill(-c->pid, SIGKILL);
    }
    c->kill_at_ms = INT64_MAX;
  }
  switch (c->state) {
  case EX_HELLO:
    if (now >= c->deadline_ms && c->authed)
      ex_refuse(c, 126, "the hello did not arrive whole within 10 s", now);
    else if (now >= c->deadline_ms)
      ex_drop_unauth(c, "no hello within 2 s", now);
    break;
  case EX_RUNNING:
    if (c->exited && ((c->out_fd < 0 && c->err_fd < 0) || now >= c->drain_until_ms)) {
      int ws = c->wait_status;
      int code = ws >= 0 && WIFEXITED(ws) ? WEXITSTATUS(ws) : -1;
      int sig = ws >= 0 && WIFSIGNALED(ws) ? WTERMSIG(ws) : -1;
      const char *error = ws < 0 ? "muster-workerd lost track of the command" : c->stop_error;

      /* What the command wrote is in the worker's log before its client
       * hears that it ended: the X waits for it to ship, but never for a
       * controller that is away or slow (2 s at most), and not while the
       * worker stops (it ships it on its way out). */
      if (!c->ship_wait_until_ms) {
        if (code >= 0)
          LOG(LOG_INFO, "exec from %s: %s exited with code %d", c->peer, c->name, code);
        else if (sig >= 0)
          LOG(LOG_INFO, "exec from %s: %s was killed by signal %d", c->peer, c->name, sig);
        ex_pipes_close(c);
        streams_mark(c->ship_mark);
        c->ship_wait_until_ms = now + EX_SHIP_WAIT_MS;
        streams_ship_soon(c->ship_mark);
      }
      if (!streams_shipped(c->ship_mark) && wd.controller_up && !wd.stopping && !wd.ending &&
          now < c->ship_wait_until_ms)
        break;
      ex_finish(c, code, sig, error, now);
    }
    break;
  case EX_CLOSING:
  case EX_ORPHAN:
    break;
  }
}

/* Sends what c has queued; in EX_CLOSING, once all is sent, shuts our side
 * down and releases the socket when the client has closed its side too, or
 * when it has not for too long. */
static void ex_send(struct ex_conn *c, int64_t now) {
  if (c->sock < 0)
    return;
  if (c->out_len > 0 && ex_flush(c, now) != 0) {
    if (c->state == EX_CLOSING)
      ex_sock_release(c);
    else
      ex_disconnect(c, "the connection broke", now);
    return;
  }
  if (c->state != EX_CLOSING)
    return;
  if (c->out_len == 0 && !c->shut) {
    /* Our close_notify and FIN follow the X; the client answers with its
     * close. */
    ex_tls_bye(c);
    shutdown(c->sock, SHUT_WR);
    c->shut = true;
    c->deadline_ms = now + EX_LINGER_MS;
  }
  if ((c->shut && c->peer_eof) || now >= c->deadline_ms)
    ex_sock_release(c);
}

/* True when c is over and may be freed: its socket is released and its
 * command, if it had one, reaped (and, for an orphan, its group killed). */
static bool ex_over(const struct ex_conn *c) {
  if (c->sock >= 0)
    return false;
  if (c->state == EX_ORPHAN)
    return c->pid <= 0 || (c->exited && c->kill_at_ms == INT64_MAX);
  return c->pid <= 0 || c->exited;
}

/* Frees c, which must be over (ex_over()) or be given up on. */
static void ex_conn_free(struct ex_conn *c) {
  if (!c)
    return;
  ex_sock_release(c);
  ex_pipes_close(c);
  free(c);
}

/* Frees the records that are over, keeping the others in their order. */
static void ex_reap_over(void) {
  size_t kept = 0;

  for (size_t i = 0; i < ex.n; i++) {
    if (ex_over(ex.conns[i])) {
      ex_conn_free(ex.conns[i]);
      continue;
    }
    ex.conns[kept++] = ex.conns[i];
  }
  ex.n = kept;
}

/* Accepts the connections waiting on the exec socket. */
static void ex_accept(int64_t now) {
  for (int i = 0; i < EX_READS_PER_WAKE; i++) {
    struct sockaddr_storage ss;
    socklen_t sl = sizeof(ss);
    char host[INET6_ADDRSTRLEN], port[8];
    struct ex_conn *c;
    int one = 1;
    int fd = accept4(wd.listen_fd, (struct sockaddr *)&ss, &sl, SOCK_NONBLOCK | SOCK_CLOEXEC);

    if (fd < 0) {
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
        LOG(LOG_WARN, "cannot accept an exec connection: %s", strerror(errno));
        ex.accept_after_ms = now + 100; /* else the waiting one spins the loop */
      }
      return;
    }
    if (getnameinfo((struct sockaddr *)&ss, sl, host, sizeof(host), port, sizeof(port),
                    NI_NUMERICHOST | NI_NUMERICSERV) != 0) {
      snprintf(host, sizeof(host), "?");
      snprintf(port, sizeof(port), "?");
    }
    /* Connections not yet past their token make room for a new one, the
     * oldest first (as OpenSSH's MaxStartups does): they never take the
     * session's own. What the oldest has sent already is read first, and
     * one whose key GnuTLS has checked (proven, its handshake's end to
     * come) is never dropped: a client with the token passes instead of
     * being dropped by a flood of connections behind it. */
    for (int tries = 0; tries < 4; tries++) {
      struct ex_conn *oldest = NULL;
      size_t waiting = 0;

      for (size_t k = 0; k < ex.n; k++)
        if (ex.conns[k]->state == EX_HELLO && ex.conns[k]->sock >= 0 && !ex.conns[k]->authed &&
            !ex.conns[k]->proven) {
          waiting++;
          if (!oldest || ex.conns[k]->deadline_ms < oldest->deadline_ms)
            oldest = ex.conns[k];
        }
      if (waiting < EX_UNAUTH_MAX || !oldest)
        break;
      ex_sock_read(oldest, now);
      if (oldest->state == EX_HELLO && oldest->sock >= 0 && !oldest->authed && !oldest->proven)
        ex_drop_unauth(oldest, "too many connections without a token", now);
    }
    ex_reap_over();
    if (ex.n == EX_RECORDS) {
      char peer[INET6_ADDRSTRLEN + 8];
      snprintf(peer, sizeof(peer), "%s:%s", host, port);
      ex_refuse_now(fd);
      ex_count_refusal(peer, ex.stopping ? "this worker is stopping" : "too many connections", now);
      continue;
    }
    if (!(c = calloc(1, sizeof(*c)))) {
      ex_refuse_now(fd);
      continue;
    }
    /* Frames are small and interactive (orted's control traffic); and a
     * client whose machine vanished is noticed within about two minutes. */
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof(one));
    {
      int idle = 60, intvl = 10, cnt = 6;
      setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof(idle));
      setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &intvl, sizeof(intvl));
      setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &cnt, sizeof(cnt));
    }
    c->sock = fd;
    if (ex.stopping || ex_tls_start(c) != 0) {
      char peer[INET6_ADDRSTRLEN + 8];
      snprintf(peer, sizeof(peer), "%s:%s", host, port);
      ex_refuse_now(fd);
      free(c);
      ex_count_refusal(peer, ex.stopping ? "this worker is stopping" : "no TLS session", now);
      continue;
    }
    c->stdin_fd = c->out_fd = c->err_fd = -1;
    c->at_sock = c->at_in = c->at_out = c->at_err = -1;
    c->state = EX_HELLO;
    c->deadline_ms = now + EX_HELLO_MS;
    c->kill_at_ms = INT64_MAX;
    c->wait_status = -1;
    snprintf(c->peer, sizeof(c->peer), strchr(host, ':') ? "[%s]:%s" : "%s:%s", host, port);
    snprintf(c->name, sizeof(c->name), "(no command yet)");
    ex.conns[ex.n++] = c;
    LOG(LOG_DEBUG, "exec connection from %s", c->peer);
  }
}

/* ------------------------------------------------------------------------ */
/* The main loop's hooks                                                    */

/* workerd is ending: every exec command's group gets SIGTERM (SIGKILL 2 s
 * later), its client gets the X with error sentence, waiting hellos are
 * refused, and new connections will be. */
void ex_stop_all(int64_t now) {
  ex.stopping = true;
  ex.stop_deadline_ms = now + EX_STOP_MS;
  for (size_t i = 0; i < ex.n; i++) {
    struct ex_conn *c = ex.conns[i];

    if (c->state == EX_HELLO && !c->tls_done) {
      ex_drop_unauth(c, "this worker is stopping", now);
    } else if (c->state == EX_HELLO) {
      ex_refuse(c, 126, "this worker is stopping", now);
    } else if (c->state == EX_RUNNING && !c->exited) {
      LOG(LOG_INFO, "exec from %s: the worker is stopping; terminating %s", c->peer, c->name);
      c->stop_error = "the worker stopped while the command ran";
      ex_signal(c, SIGTERM);
      c->kill_at_ms = now + EX_KILL_GRACE_MS;
    }
  }
}

/* Whether c's TLS session holds data already read off the socket that c
 * may take now (poll() says nothing of it). */
static bool ex_sock_readable(const struct ex_conn *c) {
  return c->sock >= 0 && c->state != EX_ORPHAN && !(c->state == EX_RUNNING && c->pend) &&
         ex_tls_pending(c);
}

/* The earliest deadline among the exec connections, or INT64_MAX. */
int64_t ex_next_deadline(void) {
  int64_t next = ex.accept_after_ms > 0 ? ex.accept_after_ms : INT64_MAX;

  for (size_t i = 0; i < ex.n; i++)
    if (ex_sock_readable(ex.conns[i]))
      return 0; /* at once */

  if (ex.stopping && ex.n > 0 && ex.stop_deadline_ms < next)
    next = ex.stop_deadline_ms;
  for (size_t i = 0; i < ex.n; i++) {
    const struct ex_conn *c = ex.conns[i];

    if (c->kill_at_ms < next)
      next = c->kill_at_ms;
    if ((c->state == EX_HELLO || (c->state == EX_CLOSING && c->sock >= 0)) && c->deadline_ms < next)
      next = c->deadline_ms;
    if (c->state == EX_RUNNING && c->exited && !c->ship_wait_until_ms &&
        (c->out_fd >= 0 || c->err_fd >= 0) && c->drain_until_ms < next)
      next = c->drain_until_ms;
    if (c->state == EX_RUNNING && c->ship_wait_until_ms && c->ship_wait_until_ms < next)
      next = c->ship_wait_until_ms;
  }
  return next;
}

/* Adds the exec socket and every connection's descriptors to p (n entries
 * so far; room for EX_POLL_MAX more), noting where each went. */
void ex_poll_add(struct pollfd *p, int *n, int64_t now) {
  ex.at_listen = -1;
  if (now >= ex.accept_after_ms)
    ex.accept_after_ms = 0;
  if (wd.listen_fd >= 0 && ex.accept_after_ms == 0) {
    ex.at_listen = *n;
    p[(*n)++] = (struct pollfd){.fd = wd.listen_fd, .events = POLLIN};
  }
  for (size_t i = 0; i < ex.n; i++) {
    struct ex_conn *c = ex.conns[i];

    c->at_sock = c->at_in = c->at_out = c->at_err = -1;
    if (c->sock >= 0) {
      short ev = POLLRDHUP;

      /* (a handshake that waits to write waits for that alone: its
       * client's bytes stay where they are meanwhile) */
      if (!c->tls_done && ex_tls_wants_write(c))
        ev |= POLLOUT;
      else if (c->state == EX_HELLO || c->state == EX_CLOSING ||
               (c->state == EX_RUNNING && !c->pend))
        ev |= POLLIN;
      if (c->tls_done && c->out_len > 0)
        ev |= POLLOUT;
      c->at_sock = *n;
      p[(*n)++] = (struct pollfd){.fd = c->sock, .events = ev};
    }
    if (c->state != EX_RUNNING)
      continue;
    if (c->stdin_fd >= 0 && c->pend) {
      c->at_in = *n;
      p[(*n)++] = (struct pollfd){.fd = c->stdin_fd, .events = POLLOUT};
    }
    if (c->out_len < EX_OUT_HIGH) {
      if (c->out_fd >= 0) {
        c->at_out = *n;
        p[(*n)++] = (struct pollfd){.fd = c->out_fd, .events = POLLIN};
      }
      if (c->err_fd >= 0) {
        c->at_err = *n;
        p[(*n)++] = (struct pollfd){.fd = c->err_fd, .events = POLLIN};
      }
    }
  }
}

/* Handles what poll() reported for the exec channel (reaping is separate:
 * ex_reap() on SIGCHLD), then moves every connection on and frees those that
 * are over. */
void ex_poll_handle(const struct pollfd *p, int64_t now) {
  size_t kept = 0;

  for (size_t i = 0; i < ex.n; i++) {
    struct ex_conn *c = ex.conns[i];

    /* The command's output before the client's input, so that an X decided
     * below comes after all that was read. */
    if (c->at_out >= 0 && p[c->at_out].revents && c->state == EX_RUNNING)
      ex_pipe_read(c, &c->out_fd, EXEC_FRAME_STDOUT, now);
    if (c->at_err >= 0 && p[c->at_err].revents && c->state == EX_RUNNING)
      ex_pipe_read(c, &c->err_fd, EXEC_FRAME_STDERR, now);
    if (c->at_in >= 0 && p[c->at_in].revents && c->state == EX_RUNNING)
      ex_stdin_write(c);
    if (c->at_sock >= 0 && c->sock >= 0) {
      short rev = p[c->at_sock].revents;

      if (c->state == EX_RUNNING && c->pend && (rev & (POLLRDHUP | POLLHUP | POLLERR)))
        ex_disconnect(c, "the client closed the connection", now);
      else if ((rev & (POLLIN | POLLOUT | POLLRDHUP | POLLHUP | POLLERR)) && !c->tls_done)
        ex_sock_read(c, now); /* (the handshake) */
      else if ((rev & (POLLIN | POLLRDHUP | POLLHUP | POLLERR)) || ex_sock_readable(c))
        ex_sock_read(c, now);
    }
  }
  if (ex.at_listen >= 0 && p[ex.at_listen].revents)
    ex_accept(now);
  for (size_t i = 0; i < ex.n; i++) {
    struct ex_conn *c = ex.conns[i];

    /* Frames queued above or by ex_step go out now, not a round later. */
    ex_step(c, now);
    ex_send(c, now);
    if (ex_over(c)) {
      LOG(LOG_DEBUG, "exec from %s: connection over", c->peer);
      ex_conn_free(c);
      continue;
    }
    ex.conns[kept++] = c;
  }
  ex.n = kept;
}

uint64_t ex_refused(void) {
  return ex.refused;
}

/* True once ex_stop_all() has run. */
bool ex_stopping(void) {
  return ex.stopping;
}

/* True when workerd may end as far as the exec channel is concerned: no
 * connection left, or the stop has waited long enough. */
bool ex_done(int64_t now) {
  return ex.n == 0 || now >= ex.stop_deadline_ms;
}

/* Ends the exec channel for good: what still runs is killed with its group
 * and reaped, every connection closed. Safe to call more than once. */
void ex_cleanup(void) {
  for (size_t i = 0; i < ex.n; i++) {
    struct ex_conn *c = ex.conns[i];

    ex_child_kill(c);
    ex_conn_free(c);
  }
  ex.n = 0;
  ex_tls_cleanup();
}
