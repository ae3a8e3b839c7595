/*
 * exec_internal.h: the exec server's parts, shared by its files and no
 * others (the rest of workerd sees the exec server through workerd.h):
 *
 *   exec_server.c  the listening socket, accepting, each connection's state
 *                  machine, and the main loop's hooks (ex_poll_add() ...)
 *   exec_hello.c   the hello: checked, and the command it asks for built
 *   exec_frame.c   the framing: frames queued and sent, frames received
 *   exec_tls.c     the TLS under the frames (the session's token as its key)
 *   exec_relay.c   the command: started on pipes, its stdin written, its
 *                  output read into frames (and copied into the worker's
 *                  log), signalled, reaped
 *
 * Calls go one way: exec_server.c calls the three others; exec_relay.c calls
 * exec_frame.c (output frames), ex_utf8_prefix() and logship.c (the
 * worker's log); none calls
 * exec_server.c, which alone moves a connection from one state to another.
 */
#ifndef MUSTER_WORKERD_EXEC_INTERNAL_H
#define MUSTER_WORKERD_EXEC_INTERNAL_H

#include "exec_wire.h"
#include "workerd.h"

#include <gnutls/gnutls.h>
#include <jansson.h>
#include <netinet/in.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/* Limits and timings; EX_CONN_MAX, EX_UNAUTH_MAX, EX_SPARE, EX_RECORDS and
 * EX_POLL_MAX are in workerd.h. */
#define EX_HELLO_MS 2000          /* from accept to the TLS handshake's end */
#define EX_HELLO_REST_MS 10000    /* the hello, once the handshake held */
#define EX_QUIET_MS 60000         /* one log line for the refusals of this long */
#define EX_OUT_HIGH (1u << 20)    /* stop reading the command's output here */
#define EX_READ_CHUNK (64u << 10) /* one read from a pipe: one O/E frame */
#define EX_KILL_GRACE_MS 2000     /* SIGTERM to SIGKILL for exec commands */
#define EX_DRAIN_MS 2000          /* reading output pipes after the exit */
#define EX_LINGER_MS 2000         /* waiting for the client to close after X */
#define EX_STALL_MS 60000         /* a client that reads nothing of its X */
#define EX_STOP_MS 5000           /* workerd's stop: longest wait for exec */
#define EX_SHIP_WAIT_MS 2000      /* an X waiting for its output to ship */
#define EX_READS_PER_WAKE 16      /* reads per descriptor per poll round */
#define EX_NAME_MAX 200           /* bytes of argv[0] in logs and errors */
#define EX_TAIL_MAX EX_READ_CHUNK /* a line held back from the worker's log */
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
  int sock;             /* -1 once released */
  gnutls_session_t tls; /* over sock (exec_tls.c); NULL once released */
  bool tls_done;        /* its handshake held: the client has the token */
  bool proven;          /* ...or GnuTLS checked its key already, the end to come */
  bool tls_again;       /* the last record sent waits to be sent again */
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
  bool authed;   /* the TLS handshake held (tls_done): the session's client */
  bool shut;     /* CLOSING: everything was sent and our side shut down */
  bool peer_eof; /* CLOSING: the client closed its side */

  /* The command; pid is also its process group. */
  pid_t pid;              /* 0 before it started */
  bool exited;            /* reaped; wait_status is valid */
  int wait_status;        /* -1 if it was lost */
  int64_t drain_until_ms; /* valid once exited */
  int64_t kill_at_ms;     /* SIGKILL to the group; INT64_MAX if none due */
  const char *stop_error; /* the X's error if workerd's stop killed it */
  /* Once the command is over: its output must ship (the streams' counts at
   * that moment) before the X goes, until this time at most (0: not yet). */
  uint64_t ship_mark[2];
  int64_t ship_wait_until_ms;
  int stdin_fd, out_fd, err_fd;
  unsigned char *pend; /* an I payload not yet all in the stdin pipe */
  size_t pend_len, pend_off;

  /* The command's stdout [0] and stderr [1] go to the worker's log too, a
   * whole line at a time: here is the start of a line not yet ended
   * (EX_TAIL_MAX bytes, allocated when first needed). */
  struct {
    char *buf;
    size_t len;
  } tail[2];

  /* Where this round's pollfds are; -1 where none. */
  int at_sock, at_in, at_out, at_err;
};

/* Room for a refusal's sentence: argv[0] or cwd (cut to EX_NAME_MAX) and
 * some words. */
#define EX_ERR_MAX (EX_NAME_MAX + 256)

/* ------------------------------------------------------------------------ */
/* exec_frame.c: the framing                                                */

/* What one ex_frame_recv() found. */
enum ex_rx {
  EX_RX_AGAIN,     /* nothing more to read now */
  EX_RX_MORE,      /* bytes read (or dropped), or interrupted: read again */
  EX_RX_FRAME,     /* a whole frame: type c->hdr[0], payload c->in (c->in_len) */
  EX_RX_CLOSED,    /* the client closed its side */
  EX_RX_BROKEN,    /* the connection broke */
  EX_RX_TOO_LARGE, /* the header announced a frame over 1 MiB */
  EX_RX_NOMEM      /* no memory for the frame's payload */
};

unsigned char *ex_out_room(struct ex_conn *c, size_t need);
MUST_CHECK int ex_queue(struct ex_conn *c, char type, const void *data, size_t len);
char *ex_exit_json(int code, int signo, const char *error);
void ex_sock_release(struct ex_conn *c);
MUST_CHECK int ex_flush(struct ex_conn *c, int64_t now);
enum ex_rx ex_frame_recv(struct ex_conn *c, bool drop);
void ex_refuse_now(int fd);

/* ------------------------------------------------------------------------ */
/* exec_tls.c: the TLS                                                      */

/* The credentials and priorities every connection shares. 0, or -1. */
MUST_CHECK int ex_tls_init(void);
void ex_tls_cleanup(void);
/* A server session over c->sock. 0, or -1 (c->tls stays NULL). */
MUST_CHECK int ex_tls_start(struct ex_conn *c);
/* Moves the handshake on: 1 done (c->tls_done), 0 not yet, -1 failed (why:
 * EXEC_WIRE_ERR_TOKEN, or another sentence). */
int ex_tls_handshake(struct ex_conn *c, const char **why);
/* Whether the handshake waits to write, not to read. */
bool ex_tls_wants_write(const struct ex_conn *c);
/* Whether records already read hold data not yet taken (poll() says
 * nothing of them). */
bool ex_tls_pending(const struct ex_conn *c);
/* recv() and send() through the session: -1 with errno EAGAIN, EINTR or
 * ECONNRESET; recv's 0 is the end. */
ssize_t ex_tls_recv(struct ex_conn *c, void *buf, size_t n);
ssize_t ex_tls_send(struct ex_conn *c, const void *buf, size_t n);
void ex_tls_bye(struct ex_conn *c);
void ex_tls_free(struct ex_conn *c);

/* ------------------------------------------------------------------------ */
/* exec_hello.c: the hello                                                  */

/* The command a hello asks for. argv and envp are NULL-terminated and owned
 * here; cwd is borrowed from hello or from wd. ex_cmd_cleanup() frees it. */
struct ex_cmd {
  json_t *hello; /* the parsed hello (new reference), or NULL */
  char **argv;
  char **envp;
  const char *cwd; /* the hello's, else the script's (wd.cwd); NULL: neither */
};

size_t ex_utf8_prefix(const char *s, size_t max);
MUST_CHECK int ex_hello_parse(struct ex_conn *c, const char *text, size_t len, struct ex_cmd *cmd,
                              char *err, size_t size);
void ex_cmd_cleanup(struct ex_cmd *cmd);

/* ------------------------------------------------------------------------ */
/* exec_relay.c: the command                                                */

void ex_pipes_close(struct ex_conn *c);
void ex_signal(struct ex_conn *c, int sig);
MUST_CHECK int ex_spawn(struct ex_conn *c, const struct ex_cmd *cmd, int *code, char *err,
                        size_t size);
void ex_stdin_write(struct ex_conn *c);
void ex_pipe_read(struct ex_conn *c, int *fd, char type, int64_t now);
void ex_child_reap(struct ex_conn *c, int64_t now);
void ex_child_kill(struct ex_conn *c);

#endif
