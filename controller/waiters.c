/* waiters.c: suspended awaits (g.waiters) and streaming answers
 * (g.streams): listing them, indexing them by the worker they wait on
 * (g.watch), waking them when changes commit, and resuming those whose
 * deadline passed or whose client hung up. See state.h and
 * docs/internals/controller.md, "Waking waiters". */
#include "state_internal.h"

#include "muster_errors.h"

#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

/* ---- the watch index: worker id -> the awaits and log streams naming it ---- */

static unsigned watch_bucket(const char *id) {
  return state_hash_id(id) % (sizeof(g.watch) / sizeof(g.watch[0]));
}

static struct watch *watch_find(const char *id) {
  for (struct watch *k = g.watch[watch_bucket(id)]; k; k = k->hnext)
    if (strcmp(k->id, id) == 0)
      return k;
  return NULL;
}

/* The entry of id, made if there is none. NULL when out of memory. */
static struct watch *watch_get(const char *id) {
  struct watch *k = watch_find(id);
  unsigned b;

  if (k)
    return k;
  k = calloc(1, sizeof(*k));
  if (!k)
    return NULL;
  snprintf(k->id, sizeof(k->id), "%s", id);
  b = watch_bucket(id);
  k->hnext = g.watch[b];
  g.watch[b] = k;
  return k;
}

/* Frees k once nothing is listed in it any more. */
static void watch_put(struct watch *k) {
  struct watch **pp;

  if (k->slots || k->logs)
    return;
  for (pp = &g.watch[watch_bucket(k->id)]; *pp && *pp != k; pp = &(*pp)->hnext)
    ;
  if (*pp)
    *pp = k->hnext;
  free(k);
}

static void slot_link(struct waiter_slot *sl, struct watch *k) {
  sl->key = k;
  sl->prev = NULL;
  sl->next = k->slots;
  if (k->slots)
    k->slots->prev = sl;
  k->slots = sl;
}

/* Takes sl out of its entry; the entry itself stays (the caller puts it). */
static void slot_unlink(struct waiter_slot *sl) {
  struct watch *k = sl->key;

  if (!k)
    return;
  if (sl->prev)
    sl->prev->next = sl->next;
  else
    k->slots = sl->next;
  if (sl->next)
    sl->next->prev = sl->prev;
  sl->next = sl->prev = NULL;
  sl->key = NULL;
}

/* Takes every slot of wt out of the index. */
static void waiter_unindex(struct waiter *wt) {
  for (int i = 0; i < wt->n; i++) {
    struct watch *k = wt->slots[i].key;
    if (k) {
      slot_unlink(&wt->slots[i]);
      watch_put(k);
    }
  }
}

/* ---- awaits ---- */

int waiter_add_locked(struct waiter *wt) {
  ASSERT_LOCKED();
  for (int i = 0; i < wt->n; i++) {
    struct waiter_slot *sl = &wt->slots[i];
    struct watch *k;

    sl->wt = wt;
    sl->i = i;
    sl->key = NULL;
    if (wt->done[i])
      continue;
    k = watch_get(wt->ids[i]);
    if (!k) {
      waiter_unindex(wt);
      return MUSTER_E_NOMEM;
    }
    slot_link(sl, k);
  }
  wt->prev = NULL;
  wt->next = g.waiters;
  if (g.waiters)
    g.waiters->prev = wt;
  g.waiters = wt;
  return 0;
}

void waiter_remove_locked(struct waiter *wt) {
  ASSERT_LOCKED();
  waiter_unindex(wt);
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
  __atomic_add_fetch(&g.awaits_answering, 1, __ATOMIC_RELAXED);
  /* Out of the index and the list at once: from here on only its
   * connection's thread touches it, and api_await_finish() builds the
   * answer without the state lock (which heartbeats keep busy). */
  waiter_remove_locked(wt);
  MHD_resume_connection(wt->conn);
}

/* A slot is listed exactly while its id is pending and its await is not
 * ready: a slot that reaches its target leaves the index, and a wake takes
 * out the rest. So waking the await whose last slot this was touches no
 * other slot of this list (it has none left listed), and next stays valid. */
void waiters_notify_locked(const char *id, enum wstatus to) {
  struct watch *k = watch_find(id);
  struct waiter_slot *sl, *next;

  if (!k)
    return;
  for (sl = k->slots; sl; sl = next) {
    struct waiter *wt = sl->wt;
    int reached = ws_terminal(to) || (!wt->wait_for_completion && to == WS_RUNNING);

    next = sl->next;
    if (!reached)
      continue;
    slot_unlink(sl);
    wt->done[sl->i] = 1;
    if (--wt->pending == 0)
      waiter_wake_locked(wt);
  }
  watch_put(k);
}

/* ---- streams ---- */

int stream_add_locked(struct stream *s) {
  struct stream **head;

  ASSERT_LOCKED();
  s->key = NULL;
  if (s->kind == STREAM_LOG) {
    s->key = watch_get(s->worker_id);
    if (!s->key)
      return MUSTER_E_NOMEM;
    head = &s->key->logs;
  } else {
    head = &g.event_streams;
  }
  s->iprev = NULL;
  s->inext = *head;
  if (*head)
    (*head)->iprev = s;
  *head = s;
  s->prev = NULL;
  s->next = g.streams;
  if (g.streams)
    g.streams->prev = s;
  g.streams = s;
  s->listed = 1;
  return 0;
}

void stream_remove_locked(struct stream *s) {
  ASSERT_LOCKED();
  if (!s->listed)
    return;
  if (s->iprev)
    s->iprev->inext = s->inext;
  else if (s->key)
    s->key->logs = s->inext;
  else
    g.event_streams = s->inext;
  if (s->inext)
    s->inext->iprev = s->iprev;
  s->inext = s->iprev = NULL;
  if (s->key) {
    watch_put(s->key);
    s->key = NULL;
  }
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

/* A suspended stream is resumed; one that is busy reading is told to look
 * again before it waits, so that no wake is ever lost between its read and
 * its wait. */
static void stream_wake_locked(struct stream *s) {
  if (s->suspended)
    stream_resume_locked(s);
  else
    s->pending = 1;
}

void streams_wake_locked(enum stream_kind kind, const char *id) {
  struct watch *k;

  if (kind == STREAM_EVENTS) {
    for (struct stream *s = g.event_streams; s; s = s->inext)
      stream_wake_locked(s);
  } else if (!id) {
    for (struct stream *s = g.streams; s; s = s->next)
      if (s->kind == STREAM_LOG)
        stream_wake_locked(s);
  } else if ((k = watch_find(id)) != NULL) {
    for (struct stream *s = k->logs; s; s = s->inext)
      stream_wake_locked(s);
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
  struct waiter *wt, *wnext;

  if (now - last < 1000)
    return;
  last = now;
  for (wt = g.waiters; wt; wt = wnext) {
    wnext = wt->next; /* (a wake takes wt out of the list) */
    if (!wt->ready && client_gone(wt->conn)) {
      wt->client_gone = 1;
      waiter_wake_locked(wt);
    }
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
  struct waiter *next;

  for (struct waiter *wt = g.waiters; wt; wt = next) {
    next = wt->next; /* (a wake takes wt out of the list) */
    if (!wt->ready && wt->deadline_ms && wt->deadline_ms <= now) {
      wt->timed_out = 1;
      waiter_wake_locked(wt);
    }
  }
}
