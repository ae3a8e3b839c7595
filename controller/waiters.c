/* waiters.c: suspended awaits (g.waiters) and streaming answers
 * (g.streams): listing them, waking them when changes commit, and resuming
 * those whose deadline passed or whose client hung up. See state.h
 * and docs/internals/controller.md, "Waking waiters". */
#include "state_internal.h"

#include <poll.h>
#include <stdint.h>
#include <string.h>
#include <sys/socket.h>

void waiter_add_locked(struct waiter *wt) {
  ASSERT_LOCKED();
  wt->prev = NULL;
  wt->next = g.waiters;
  if (g.waiters)
    g.waiters->prev = wt;
  g.waiters = wt;
}

void waiter_remove_locked(struct waiter *wt) {
  ASSERT_LOCKED();
  if (wt->prev)
    wt->prev->next = wt->next;
  else if (g.waiters == wt)
    g.waiters = wt->next;
  if (wt->next)
    wt->next->prev = wt->prev;
  wt->next = wt->prev = NULL;
}

void waiter_wake_locked(struct waiter *wt) {
  if (wt->ready)
    return;
  wt->ready = 1;
  MHD_resume_connection(wt->conn);
}

/* Counts worker id's move to status to in every waiting await. */
void waiters_notify_locked(const char *id, enum wstatus to) {
  for (struct waiter *wt = g.waiters; wt; wt = wt->next) {
    int reached = ws_terminal(to) || (!wt->wait_for_completion && to == WS_RUNNING);

    if (wt->ready || !reached)
      continue;
    for (int i = 0; i < wt->n; i++)
      if (!wt->done[i] && strcmp(wt->ids[i], id) == 0) {
        wt->done[i] = 1;
        wt->pending--;
      }
    if (wt->pending == 0)
      waiter_wake_locked(wt);
  }
}

void stream_add_locked(struct stream *s) {
  ASSERT_LOCKED();
  s->prev = NULL;
  s->next = g.streams;
  if (g.streams)
    g.streams->prev = s;
  g.streams = s;
  s->listed = 1;
}

void stream_remove_locked(struct stream *s) {
  ASSERT_LOCKED();
  if (!s->listed)
    return;
  if (s->prev)
    s->prev->next = s->next;
  else
    g.streams = s->next;
  if (s->next)
    s->next->prev = s->prev;
  s->next = s->prev = NULL;
  s->listed = 0;
}

int stream_wait_locked(struct stream *s) {
  ASSERT_LOCKED();
  if (s->pending) {
    s->pending = 0;
    return 0;
  }
  s->suspended = 1;
  MHD_suspend_connection(s->conn);
  return 1;
}

static void stream_resume_locked(struct stream *s) {
  if (!s->suspended)
    return;
  s->suspended = 0;
  MHD_resume_connection(s->conn);
}

/* Wakes the streams of kind (of worker id, if given): a suspended one is
 * resumed; one that is busy reading is told to look again before it waits,
 * so that no wake is ever lost between its read and its wait. */
void streams_wake_locked(enum stream_kind kind, const char *id) {
  for (struct stream *s = g.streams; s; s = s->next)
    if (s->kind == kind && (!id || strcmp(s->worker_id, id) == 0)) {
      if (s->suspended)
        stream_resume_locked(s);
      else
        s->pending = 1;
    }
}

void streams_wake_due_locked(int64_t now) {
  for (struct stream *s = g.streams; s; s = s->next)
    if (s->wake_at_ms && s->wake_at_ms <= now) {
      s->wake_at_ms = 0;
      if (s->suspended)
        stream_resume_locked(s);
      else
        s->pending = 1;
    }
}

void streams_wake_logs_locked(const char *id) {
  streams_wake_locked(STREAM_LOG, id);
}

void streams_wake_events_locked(void) {
  streams_wake_locked(STREAM_EVENTS, NULL);
}

/* 1 if the client of a suspended connection has hung up. A suspended
 * connection is not watched by libmicrohttpd, so nobody else would notice. */
static int client_gone(struct MHD_Connection *c) {
  const union MHD_ConnectionInfo *ci =
      MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
  struct pollfd p;
  char b;

  if (!ci)
    return 0;
  p.fd = ci->connect_fd;
  p.events = POLLIN | POLLRDHUP;
  p.revents = 0;
  if (poll(&p, 1, 0) != 1)
    return 0;
  if (p.revents & (POLLHUP | POLLERR | POLLRDHUP | POLLNVAL))
    return 1;
  /* Readable: a pipelined request, or the end of the stream. */
  return recv(p.fd, &b, 1, MSG_PEEK | MSG_DONTWAIT) == 0;
}

/* Resumes suspended awaits and streams whose clients left, so that
 * libmicrohttpd finishes them and their completion frees them. Checked once
 * a second. */
void reap_gone_clients_locked(int64_t now) {
  static int64_t last;
  struct stream *s, *next;

  if (now - last < 1000)
    return;
  last = now;
  for (struct waiter *wt = g.waiters; wt; wt = wt->next)
    if (!wt->ready && client_gone(wt->conn)) {
      wt->client_gone = 1;
      waiter_wake_locked(wt);
    }
  for (s = g.streams; s; s = next) {
    next = s->next;
    if (s->suspended && client_gone(s->conn)) {
      s->client_gone = 1;
      stream_resume_locked(s);
    }
  }
}

void expire_waiters_locked(int64_t now) {
  for (struct waiter *wt = g.waiters; wt; wt = wt->next)
    if (!wt->ready && wt->deadline_ms && wt->deadline_ms <= now) {
      wt->timed_out = 1;
      waiter_wake_locked(wt);
    }
}
