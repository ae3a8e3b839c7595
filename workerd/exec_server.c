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
 */
#include "workerd.h"

#include "exec_wire.h"
#include "log.h"
#include "muster_errors.h"
#include "util.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
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

/* Limits and timings; EX_CONN_MAX, EX_SPARE and EX_POLL_MAX are in workerd.h. */
#define EX_HELLO_MS 10000         /* from accept to a complete hello */
#define EX_OUT_HIGH (1u << 20)    /* stop reading the command's output here */
#define EX_READ_CHUNK (64u << 10) /* one read from a pipe: one O/E frame */
#define EX_KILL_GRACE_MS 2000     /* SIGTERM to SIGKILL for exec commands */
#define EX_DRAIN_MS 2000          /* reading output pipes after the exit */
#define EX_LINGER_MS 2000         /* waiting for the client to close after X */
#define EX_STALL_MS 60000         /* a client that reads nothing of its X */
#define EX_STOP_MS 5000           /* workerd's stop: longest wait for exec */
#define EX_READS_PER_WAKE 16      /* reads per descriptor per poll round */
#define EX_NAME_MAX 200           /* bytes of argv[0] in logs and errors */
/* The hard bound of an output buffer: EX_OUT_HIGH plus what one round of
 * reads may add past it. */
#define EX_OUT_CAP (EX_OUT_HIGH + 4 * EX_READ_CHUNK)

enum ex_state {
  EX_HELLO,   /* waiting for the hello */
  EX_RUNNING, /* the command was started: relaying */
  EX_CLOSING, /* X queued: flushing, then waiting for the client to close */
  EX_ORPHAN   /* the client is gone: killing and reaping the command */
};

/* One exec connection and its command. */
struct ex_conn {
  enum ex_state state;
  int sock; /* -1 once released */
  char peer[INET6_ADDRSTRLEN + 8];
  char name[EX_NAME_MAX + 1]; /* argv[0], cut at a character, for the logs */
  int64_t deadline_ms;        /* HELLO: the hello is due; CLOSING: give up */

  /* The frame being read: its header, then its payload (in_len + 1 bytes,
   * so that a hello can be NUL-terminated). */
  unsigned char hdr[EXEC_WIRE_HDR_LEN];
  size_t hdr_got;
  unsigned char *in;
  size_t in_len, in_got;

  /* Frames to send, back to back, from out[out_start] on. */
  unsigned char *out;
  size_t out_start, out_len, out_cap;
  bool shut;     /* CLOSING: everything was sent and our side shut down */
  bool peer_eof; /* CLOSING: the client closed its side */

  /* The command; pid is also its process group. */
  pid_t pid;              /* 0 before it started */
  bool exited;            /* reaped; wait_status is valid */
  int wait_status;        /* -1 if it was lost */
  int64_t drain_until_ms; /* valid once exited */
  int64_t kill_at_ms;     /* SIGKILL to the group; INT64_MAX if none due */
  const char *stop_error; /* the X's error if workerd's stop killed it */
  int stdin_fd, out_fd, err_fd;
  unsigned char *pend; /* an I payload not yet all in the stdin pipe */
  size_t pend_len, pend_off;

  /* Where this round's pollfds are; -1 where none. */
  int at_sock, at_in, at_out, at_err;
};

static struct {
  struct ex_conn *conns[EX_CONN_MAX + EX_SPARE];
  size_t n;
  bool stopping; /* workerd is ending: refuse, kill, wind down */
  int64_t stop_deadline_ms;
  int64_t accept_after_ms; /* accept() ran out of descriptors: pause */
  int at_listen;
} ex;

/* ------------------------------------------------------------------------ */
/* The listening socket                                                     */

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

/* Length of the longest prefix of s, at most max bytes, that does not cut a
 * UTF-8 sequence (the hello's strings are valid UTF-8, checked by Jansson). */
static size_t utf8_prefix(const char *s, size_t max) {
  size_t n = strlen(s);

  if (n <= max)
    return n;
  n = max;
  while (n > 0 && ((unsigned char)s[n] & 0xC0) == 0x80)
    n--;
  return n;
}

/* Makes room for need more bytes at the end of c's output buffer, growing it
 * (up to EX_OUT_CAP) or moving its contents to the front. Returns where they
 * go, or NULL if out of memory or past the cap (which flow control makes
 * impossible: see EX_OUT_HIGH). */
static unsigned char *ex_out_room(struct ex_conn *c, size_t need) {
  size_t cap;
  unsigned char *p;

  if (c->out_len + need > EX_OUT_CAP)
    return NULL;
  if (c->out_start + c->out_len + need <= c->out_cap)
    return c->out + c->out_start + c->out_len;
  if (c->out_len + need <= c->out_cap && c->out_start > 0) {
    memmove(c->out, c->out + c->out_start, c->out_len);
    c->out_start = 0;
    return c->out + c->out_len;
  }
  if (c->out_start > 0) {
    memmove(c->out, c->out + c->out_start, c->out_len);
    c->out_start = 0;
  }
  cap = c->out_cap ? c->out_cap : 4096;
  while (cap < c->out_len + need)
    cap *= 2;
  if (cap > EX_OUT_CAP)
    cap = EX_OUT_CAP;
  p = realloc(c->out, cap);
  if (!p)
    return NULL;
  c->out = p;
  c->out_cap = cap;
  return c->out + c->out_len;
}

/* Queues one frame (len <= EXEC_WIRE_FRAME_MAX) on c. Returns 0 or MUSTER_E_NOMEM. */
MUST_CHECK static int ex_queue(struct ex_conn *c, char type, const void *data, size_t len) {
  unsigned char *w = ex_out_room(c, EXEC_WIRE_HDR_LEN + len);

  if (!w)
    return MUSTER_E_NOMEM;
  exec_wire_put_hdr(w, type, len);
  if (len)
    memcpy(w + EXEC_WIRE_HDR_LEN, data, len);
  c->out_len += EXEC_WIRE_HDR_LEN + len;
  return 0;
}

/* Builds the payload of an X frame: code and signo are -1 for null, error is
 * NULL for null. Returns a new string (free()), or NULL if out of memory. */
static char *ex_exit_json(int code, int signo, const char *error) {
  json_t *o =
      json_pack("{s:o, s:o, s:o}", "exit_code", code >= 0 ? json_integer(code) : json_null(),
                "signal", signo >= 0 ? json_integer(signo) : json_null(), "error",
                error ? json_string(error) : json_null());
  char *s = o ? json_dumps(o, JSON_COMPACT) : NULL;

  json_decref(o);
  return s;
}

/* Closes the command's pipes and drops unwritten stdin. */
static void ex_pipes_close(struct ex_conn *c) {
  fd_close(&c->stdin_fd);
  fd_close(&c->out_fd);
  fd_close(&c->err_fd);
  free(c->pend);
  c->pend = NULL;
  c->pend_len = c->pend_off = 0;
}

/* Closes c's socket and frees its buffers; the record itself stays while its
 * command needs reaping. */
static void ex_sock_release(struct ex_conn *c) {
  fd_close(&c->sock);
  free(c->in);
  free(c->out);
  c->in = c->out = NULL;
  c->in_len = c->in_got = c->hdr_got = 0;
  c->out_start = c->out_len = c->out_cap = 0;
}

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

/* Sends c's queued frames until the socket is full. Returns 0, or
 * MUSTER_E_IO when the client is gone (connection reset or closed). */
MUST_CHECK static int ex_flush(struct ex_conn *c, int64_t now) {
  while (c->out_len > 0) {
    ssize_t n = send(c->sock, c->out + c->out_start, c->out_len, MSG_NOSIGNAL);

    if (n > 0) {
      c->out_start += (size_t)n;
      c->out_len -= (size_t)n;
      if (c->state == EX_CLOSING)
        c->deadline_ms = now + EX_STALL_MS;
      continue;
    }
    if (n < 0 && errno == EINTR)
      continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
      return 0;
    return MUSTER_E_IO;
  }
  c->out_start = 0;
  return 0;
}

/* Sends sig to c's command's process group if the command is still there. */
static void ex_signal(struct ex_conn *c, int sig) {
  if (c->pid > 0 && !c->exited)
    kill(-c->pid, sig);
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

/* Builds the command's environment: the worker's script environment with
 * env (a JSON object of strings, borrowed; may be NULL) on top. Returns a new
 * NULL-terminated array (strv_free()), or NULL if out of memory. */
static char **ex_envp_build(json_t *env) {
  size_t own = 0, i = 0;
  const char *key;
  json_t *val;
  char **v;

  for (char **e = wd.envp; e && *e; e++)
    own++;
  v = calloc(own + json_object_size(env) + 1, sizeof(char *));
  if (!v)
    return NULL;
  for (char **e = wd.envp; e && *e; e++) {
    size_t kl = strcspn(*e, "=");

    if (env && json_object_getn(env, *e, kl))
      continue; /* the hello's value wins */
    if (!(v[i++] = strdup(*e)))
      goto fail;
  }
  json_object_foreach(env, key, val) {
    size_t kl = strlen(key), vl = json_string_length(val);

    if (!(v[i] = malloc(kl + vl + 2)))
      goto fail;
    memcpy(v[i], key, kl);
    v[i][kl] = '=';
    memcpy(v[i] + kl + 1, json_string_value(val), vl + 1);
    i++;
  }
  return v;
fail:
  strv_free(v);
  return NULL;
}

/* True if j is a JSON string without NUL bytes (which C strings cannot
 * carry); non-empty too if nonempty. */
static bool ex_is_cstring(json_t *j, bool nonempty) {
  return json_is_string(j) && strlen(json_string_value(j)) == json_string_length(j) &&
         (!nonempty || json_string_length(j) > 0);
}

/* Checks the hello (text, len bytes) and starts its command, moving c to
 * EX_RUNNING; or refuses it with an X. */
static void ex_start(struct ex_conn *c, const char *text, size_t len, int64_t now) {
  int inp[2] = {-1, -1}, outp[2] = {-1, -1}, errp[2] = {-1, -1}, statp[2] = {-1, -1};
  json_t *hello = json_loadb(text, len, 0, NULL);
  json_t *token = json_object_get(hello, "token");
  json_t *jargv = json_object_get(hello, "argv");
  json_t *env = json_object_get(hello, "env");
  json_t *jcwd = json_object_get(hello, "cwd");
  char **argv = NULL, **envp = NULL;
  const char *cwd = wd.cwd;
  char err[EX_NAME_MAX + 256];
  struct exec_status st;
  json_t *val;
  const char *key;
  size_t i;
  pid_t pid;

  if (!json_is_object(hello)) {
    ex_refuse(c, 126, "the hello is not a JSON object", now);
    goto out;
  }
  /* The token first: a client without it learns nothing more. */
  if (!wd.exec_token) {
    ex_refuse(c, 126, EXEC_WIRE_ERR_NO_TOKEN, now);
    goto out;
  }
  if (!ex_is_cstring(token, false) || !util_secret_equal(json_string_value(token), wd.exec_token)) {
    ex_refuse(c, 126, EXEC_WIRE_ERR_TOKEN, now);
    goto out;
  }
  if (!json_is_array(jargv) || json_array_size(jargv) == 0 ||
      json_array_size(jargv) > WD_ARGV_MAX) {
    ex_refuse(c, 126, "argv is not a non-empty array of at most 4096 strings", now);
    goto out;
  }
  json_array_foreach(jargv, i, val) {
    if (!ex_is_cstring(val, i == 0)) {
      snprintf(err, sizeof(err), "argv[%zu] is not a %sstring", i, i == 0 ? "non-empty " : "");
      ex_refuse(c, 126, err, now);
      goto out;
    }
  }
  if (json_is_null(env))
    env = NULL;
  if (env && (!json_is_object(env) || json_object_size(env) > WD_ENV_MAX)) {
    ex_refuse(c, 126, "env is not an object of at most 4096 strings", now);
    goto out;
  }
  json_object_foreach(env, key, val) {
    /* Values are never logged or echoed: they may be secrets. */
    if (key[0] == '\0' || strchr(key, '=') || !ex_is_cstring(val, false)) {
      snprintf(err, sizeof(err), "env entry \"%.*s\" is not NAME: string",
               (int)utf8_prefix(key, 64), key);
      ex_refuse(c, 126, err, now);
      goto out;
    }
  }
  if (jcwd && !json_is_null(jcwd)) {
    if (!ex_is_cstring(jcwd, true)) {
      ex_refuse(c, 126, "cwd is not a non-empty string or null", now);
      goto out;
    }
    cwd = json_string_value(jcwd);
  }

  snprintf(c->name, sizeof(c->name), "%.*s",
           (int)utf8_prefix(json_string_value(json_array_get(jargv, 0)), EX_NAME_MAX),
           json_string_value(json_array_get(jargv, 0)));
  LOG(LOG_INFO, "exec from %s: %s (%zu args)", c->peer, c->name, json_array_size(jargv) - 1);

  argv = calloc(json_array_size(jargv) + 1, sizeof(char *));
  if (!argv)
    goto nomem;
  json_array_foreach(jargv, i, val) {
    if (!(argv[i] = strdup(json_string_value(val))))
      goto nomem;
  }
  if (!(envp = ex_envp_build(env)))
    goto nomem;

  if (pipe2(inp, O_CLOEXEC) != 0 || pipe2(outp, O_CLOEXEC) != 0 || pipe2(errp, O_CLOEXEC) != 0 ||
      pipe2(statp, O_CLOEXEC) != 0 || fcntl(inp[1], F_SETFL, O_NONBLOCK) != 0 ||
      fcntl(outp[0], F_SETFL, O_NONBLOCK) != 0 || fcntl(errp[0], F_SETFL, O_NONBLOCK) != 0) {
    snprintf(err, sizeof(err), "cannot start \"%s\": %s", c->name, strerror(errno));
    ex_refuse(c, 126, err, now);
    goto out;
  }

  {
    struct child_spec cs = {.in_fd = inp[0],
                            .out_fd = outp[1],
                            .err_fd = errp[1],
                            .status_fd = statp[1],
                            .argv = argv,
                            .envp = envp,
                            .cwd = cwd,
                            .own_group = true,
                            .parent = getpid()};

    pid = child_spawn(&cs);
  }
  if (pid > 0)
    wd.exec_started = true;
  if (pid < 0) {
    snprintf(err, sizeof(err), "cannot start \"%s\": %s", c->name, strerror(errno));
    ex_refuse(c, 126, err, now);
    goto out;
  }
  /* The child does the same; whichever runs first makes the group, so it
   * exists before we could signal it. (EACCES once it has exec'd: fine.) */
  setpgid(pid, pid);
  fd_close(&statp[1]);
  if (child_exec_failed(statp[0], &st)) {
    int code = st.stage == STAGE_EXEC && st.err == ENOENT ? 127 : 126;

    /* It has written its status and is exiting: reap it here, so that it
     * is never mistaken for a running command. */
    while (waitpid(pid, NULL, 0) < 0 && errno == EINTR)
      ;
    if (st.stage == STAGE_CHDIR)
      snprintf(err, sizeof(err), "cannot change to directory \"%.*s\": %s",
               (int)utf8_prefix(cwd, EX_NAME_MAX), cwd, strerror(st.err));
    else if (st.stage == STAGE_EXEC)
      snprintf(err, sizeof(err), "cannot run \"%s\": %s", c->name, strerror(st.err));
    else
      snprintf(err, sizeof(err), "cannot set up \"%s\": %s", c->name, strerror(st.err));
    ex_refuse(c, code, err, now);
    goto out;
  }
  c->pid = pid;
  c->stdin_fd = inp[1];
  c->out_fd = outp[0];
  c->err_fd = errp[0];
  inp[1] = outp[0] = errp[0] = -1;
  c->state = EX_RUNNING;
  goto out;

nomem:
  ex_refuse(c, 126, "muster-workerd is out of memory", now);
out:
  fd_close_pair(inp);
  fd_close_pair(outp);
  fd_close_pair(errp);
  fd_close_pair(statp);
  strv_free(argv);
  strv_free(envp);
  json_decref(hello);
}

/* Writes pending stdin into the command's stdin pipe. A command that closed
 * its stdin (EPIPE) loses the rest, as it would from a terminal. */
static void ex_stdin_write(struct ex_conn *c) {
  while (c->pend && c->stdin_fd >= 0) {
    ssize_t n = write(c->stdin_fd, c->pend + c->pend_off, c->pend_len - c->pend_off);

    if (n > 0) {
      c->pend_off += (size_t)n;
      if (c->pend_off == c->pend_len) {
        free(c->pend);
        c->pend = NULL;
        c->pend_len = c->pend_off = 0;
      }
      continue;
    }
    if (n < 0 && errno == EINTR)
      continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
      return;
    fd_close(&c->stdin_fd);
  }
  if (c->stdin_fd < 0 && c->pend) {
    free(c->pend);
    c->pend = NULL;
    c->pend_len = c->pend_off = 0;
  }
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

/* Reads frames from c's socket, as long as c may take them: not while stdin
 * is pending (that is the flow control toward the command). In EX_CLOSING
 * everything is read and dropped, until the client closes. */
static void ex_sock_read(struct ex_conn *c, int64_t now) {
  for (int i = 0; i < EX_READS_PER_WAKE && c->sock >= 0; i++) {
    unsigned char drop[4096];
    unsigned char *where;
    size_t want;
    ssize_t n;

    if (c->state == EX_ORPHAN || (c->state == EX_RUNNING && c->pend))
      return;
    if (c->state == EX_CLOSING) {
      where = drop;
      want = sizeof(drop);
    } else if (c->hdr_got < EXEC_WIRE_HDR_LEN) {
      where = c->hdr + c->hdr_got;
      want = EXEC_WIRE_HDR_LEN - c->hdr_got;
    } else {
      where = c->in + c->in_got;
      want = c->in_len - c->in_got;
    }
    n = recv(c->sock, where, want, 0);
    if (n < 0 && errno == EINTR)
      continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
      return;
    if (n <= 0) {
      if (c->state == EX_CLOSING) {
        c->peer_eof = true;
        return;
      }
      ex_disconnect(c, n == 0 ? "the client closed the connection" : "the connection broke", now);
      return;
    }
    if (c->state == EX_CLOSING)
      continue;
    if (c->hdr_got < EXEC_WIRE_HDR_LEN) {
      struct exec_wire_hdr h;
      enum exec_wire_rc hr;

      c->hdr_got += (size_t)n;
      if (c->hdr_got < EXEC_WIRE_HDR_LEN)
        continue;
      /* A type this protocol does not define is read like any other, and
       * ex_dispatch() ignores it. */
      hr = exec_wire_parse_hdr(c->hdr, c->hdr_got, &h);
      c->in_len = h.len;
      c->in_got = 0;
      if (hr == EXEC_WIRE_TOO_LARGE) {
        if (c->state == EX_HELLO)
          ex_refuse(c, 126, "a frame is larger than 1 MiB", now);
        else
          ex_disconnect(c, "the client sent a frame larger than 1 MiB", now);
        return;
      }
      if (!(c->in = malloc(c->in_len + 1))) {
        if (c->state == EX_HELLO)
          ex_refuse(c, 126, "muster-workerd is out of memory", now);
        else
          ex_disconnect(c, "out of memory for a frame", now);
        return;
      }
      c->in[c->in_len] = '\0';
    } else {
      c->in_got += (size_t)n;
    }
    if (c->in_got == c->in_len)
      ex_dispatch(c, (char)c->hdr[0], now);
  }
}

/* Reads the command's output pipe *fd into type frames while c's buffer is
 * under EX_OUT_HIGH; closes *fd at end of file. */
static void ex_pipe_read(struct ex_conn *c, int *fd, char type) {
  for (int i = 0; i < EX_READS_PER_WAKE && *fd >= 0 && c->out_len < EX_OUT_HIGH; i++) {
    unsigned char *w = ex_out_room(c, EXEC_WIRE_HDR_LEN + EX_READ_CHUNK);
    ssize_t n;

    if (!w)
      return; /* out of memory: the pipe stays full until it passes */
    n = read(*fd, w + EXEC_WIRE_HDR_LEN, EX_READ_CHUNK);
    if (n > 0) {
      exec_wire_put_hdr(w, type, (size_t)n);
      c->out_len += EXEC_WIRE_HDR_LEN + (size_t)n;
      continue;
    }
    if (n < 0 && errno == EINTR)
      continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
      return;
    fd_close(fd);
  }
}

/* Collects the exit of every exec command that has exited. Each is waited
 * for by its own pid, so the script's child is left to child_reap(). */
void ex_reap(int64_t now) {
  for (size_t i = 0; i < ex.n; i++) {
    struct ex_conn *c = ex.conns[i];
    pid_t r;
    int st;

    if (c->pid <= 0 || c->exited)
      continue;
    do
      r = waitpid(c->pid, &st, WNOHANG);
    while (r < 0 && errno == EINTR);
    if (r == 0)
      continue;
    c->exited = true;
    c->wait_status = r < 0 ? -1 : st;
    c->drain_until_ms = now + EX_DRAIN_MS;
    if (c->state == EX_ORPHAN) {
      /* What the command left in its group goes with it. */
      kill(-c->pid, SIGKILL);
      c->kill_at_ms = INT64_MAX;
    }
  }
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
    if (now >= c->deadline_ms)
      ex_refuse(c, 126, "no hello within 10 s", now);
    break;
  case EX_RUNNING:
    if (c->exited && ((c->out_fd < 0 && c->err_fd < 0) || now >= c->drain_until_ms)) {
      int ws = c->wait_status;
      int code = ws >= 0 && WIFEXITED(ws) ? WEXITSTATUS(ws) : -1;
      int sig = ws >= 0 && WIFSIGNALED(ws) ? WTERMSIG(ws) : -1;
      const char *error = ws < 0 ? "muster-workerd lost track of the command" : c->stop_error;

      if (code >= 0)
        LOG(LOG_INFO, "exec from %s: %s exited with code %d", c->peer, c->name, code);
      else if (sig >= 0)
        LOG(LOG_INFO, "exec from %s: %s was killed by signal %d", c->peer, c->name, sig);
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
    /* Our FIN follows the X; the client answers with its close. */
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

/* Refuses a connection that gets no record (even the spare ones are taken,
 * or out of memory), best effort and without blocking: X, our FIN, and what
 * the client sent is read, so that the close is less likely to turn into a
 * reset. */
static void ex_refuse_now(int fd, const char *error) {
  char *x = ex_exit_json(126, -1, error);
  unsigned char buf[4096];

  if (x) {
    size_t len = strlen(x);
    unsigned char frame[EXEC_WIRE_HDR_LEN + 256];

    if (len <= sizeof(frame) - EXEC_WIRE_HDR_LEN) {
      exec_wire_put_hdr(frame, EXEC_FRAME_EXIT, len);
      memcpy(frame + EXEC_WIRE_HDR_LEN, x, len);
      (void)!send(fd, frame, EXEC_WIRE_HDR_LEN + len, MSG_NOSIGNAL);
    }
    free(x);
  }
  shutdown(fd, SHUT_WR);
  while (recv(fd, buf, sizeof(buf), 0) > 0)
    ;
  close(fd);
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
    if (ex.n == EX_CONN_MAX + EX_SPARE) {
      LOG(LOG_WARN, "exec from %s:%s refused: too many connections", host, port);
      ex_refuse_now(fd, ex.stopping ? "this worker is stopping"
                                    : "this worker serves too many exec connections");
      continue;
    }
    if (!(c = calloc(1, sizeof(*c)))) {
      ex_refuse_now(fd, "muster-workerd is out of memory");
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
    if (ex.stopping) {
      ex_refuse(c, 126, "this worker is stopping", now);
    } else {
      size_t busy = 0;

      /* Refusals on their way out do not count: they hold no command. */
      for (size_t k = 0; k < ex.n; k++)
        busy += ex.conns[k]->state != EX_CLOSING || ex.conns[k]->pid > 0;
      if (busy > EX_CONN_MAX)
        ex_refuse(c, 126, "this worker serves too many exec connections (64)", now);
    }
  }
}

/* workerd is ending: every exec command's group gets SIGTERM (SIGKILL 2 s
 * later), its client gets the X with error sentence, waiting hellos are
 * refused, and new connections will be. */
void ex_stop_all(int64_t now) {
  ex.stopping = true;
  ex.stop_deadline_ms = now + EX_STOP_MS;
  for (size_t i = 0; i < ex.n; i++) {
    struct ex_conn *c = ex.conns[i];

    if (c->state == EX_HELLO) {
      ex_refuse(c, 126, "this worker is stopping", now);
    } else if (c->state == EX_RUNNING && !c->exited) {
      LOG(LOG_INFO, "exec from %s: the worker is stopping; terminating %s", c->peer, c->name);
      c->stop_error = "the worker stopped while the command ran";
      ex_signal(c, SIGTERM);
      c->kill_at_ms = now + EX_KILL_GRACE_MS;
    }
  }
}

/* The earliest deadline among the exec connections, or INT64_MAX. */
int64_t ex_next_deadline(void) {
  int64_t next = ex.accept_after_ms > 0 ? ex.accept_after_ms : INT64_MAX;

  if (ex.stopping && ex.n > 0 && ex.stop_deadline_ms < next)
    next = ex.stop_deadline_ms;
  for (size_t i = 0; i < ex.n; i++) {
    const struct ex_conn *c = ex.conns[i];

    if (c->kill_at_ms < next)
      next = c->kill_at_ms;
    if ((c->state == EX_HELLO || (c->state == EX_CLOSING && c->sock >= 0)) && c->deadline_ms < next)
      next = c->deadline_ms;
    if (c->state == EX_RUNNING && c->exited && c->drain_until_ms < next)
      next = c->drain_until_ms;
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

      if (c->state == EX_HELLO || c->state == EX_CLOSING || (c->state == EX_RUNNING && !c->pend))
        ev |= POLLIN;
      if (c->out_len > 0)
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
      ex_pipe_read(c, &c->out_fd, EXEC_FRAME_STDOUT);
    if (c->at_err >= 0 && p[c->at_err].revents && c->state == EX_RUNNING)
      ex_pipe_read(c, &c->err_fd, EXEC_FRAME_STDERR);
    if (c->at_in >= 0 && p[c->at_in].revents && c->state == EX_RUNNING)
      ex_stdin_write(c);
    if (c->at_sock >= 0 && c->sock >= 0) {
      short rev = p[c->at_sock].revents;

      if (c->state == EX_RUNNING && c->pend && (rev & (POLLRDHUP | POLLHUP | POLLERR)))
        ex_disconnect(c, "the client closed the connection", now);
      else if (rev & (POLLIN | POLLRDHUP | POLLHUP | POLLERR))
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

    if (c->pid > 0 && !c->exited) {
      kill(-c->pid, SIGKILL);
      while (waitpid(c->pid, NULL, 0) < 0 && errno == EINTR)
        ;
    }
    ex_conn_free(c);
  }
  ex.n = 0;
}
