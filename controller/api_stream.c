/* api_stream.c: the streaming answers: the server-sent event stream and
 * logs (whole, or followed while the worker runs). See api_internal.h. */
#include "api_internal.h"
#include "api_scope.h"

#include "backend.h"
#include "fault.h"
#include "log.h"
#include "muster_errors.h"
#include "state.h"
#include "util.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* ---- streaming answers: GET /api/v1/events and logs with follow=1 ---- */

enum MHD_Result api_queue_stream(struct MHD_Connection *c, struct stream *s, struct MHD_Response *r,
                                 const char *type) {
  enum MHD_Result ret;
  int rc;

  state_lock();
  rc = stream_add_locked(s);
  state_unlock();
  if (rc) {
    MHD_destroy_response(r); /* its free callback frees s */
    return api_respond_error(c, rc, NULL, NULL);
  }
  MHD_add_response_header(r, "Content-Type", type);
  MHD_add_response_header(r, "Cache-Control", "no-store");
  ret = MHD_queue_response(c, MHD_HTTP_OK, r);
  MHD_destroy_response(r);
  return ret;
}

struct events_ctx {
  struct stream s;                /* first: the registry sees only this part */
  char prefix[USER_NAME_MAX + 2]; /* a caller who sees only their sessions: "USER/" */
  int64_t last_seq;
  int catching_up; /* the last batch was full: more are waiting */
  char *buf;
  size_t len, pos;
};

static ssize_t copy_out(char **bufp, size_t *len, size_t *pos, char *out, size_t max) {
  size_t n = *len - *pos;

  if (n > max)
    n = max;
  memcpy(out, *bufp + *pos, n);
  *pos += n;
  if (*pos == *len) {
    free(*bufp);
    *bufp = NULL;
    *len = *pos = 0;
  }
  return (ssize_t)n;
}

/* A client further behind than this many events is told to list again. */
#define EVENTS_MAX_BEHIND 100000
/* Events read (and buffered) at a time for one client. */
#define EVENTS_BATCH 512
/* Events scanned at a time for a client who sees only their own. */
#define EVENTS_SCAN_MAX 20000

/* libmicrohttpd asks for the next bytes of the event stream, only as fast
 * as the client takes them: at most 512 events are buffered per client. The
 * events are read without the state lock; with nothing new, the connection
 * is suspended (returning 0) until sm_commit() wakes it: no polling of the
 * database, no thread held. */
static ssize_t events_reader(void *cls, uint64_t pos, char *out, size_t max) {
  struct events_ctx *e = cls;
  struct reader *rd;
  int n, waiting, more;
  int64_t newest;

  (void)pos;
  if (e->len)
    return copy_out(&e->buf, &e->len, &e->pos, out, max);
  for (;;) {
    if (e->s.client_gone || e->s.too_slow)
      return MHD_CONTENT_READER_END_WITH_ERROR;
    if (g.shutting_down)
      return MHD_CONTENT_READER_END_OF_STREAM;
    rd = api_reader_get();
    /* Only a client that is catching up (its last batch was full) can be
     * far behind: the newest seq is looked up for it alone, not on every
     * wake of every stream. */
    newest = e->catching_up ? db_last_event_seq(rd->db) : e->last_seq;
    if (newest - e->last_seq > EVENTS_MAX_BEHIND) {
      api_reader_put(rd);
      /* Catching up event by event would take longer than a fresh list:
       * say so, and end; the client lists and follows from there. */
      e->s.too_slow = 1;
      e->buf = strdup("event: too_far_behind\ndata: {\"message\": \"more than 100000 events "
                      "behind: list the workers again and follow from X-Muster-Last-Event\"}"
                      "\nretry: 1000\n\n");
      e->len = e->buf ? strlen(e->buf) : 0;
      e->pos = 0;
      return e->len ? copy_out(&e->buf, &e->len, &e->pos, out, max)
                    : MHD_CONTENT_READER_END_WITH_ERROR;
    }
    more = 0;
    if (e->prefix[0]) {
      /* Only their own workers' events; past the others' up to the newest
       * seen before the read, so that they are not read again. */
      int64_t upto = db_last_event_seq(rd->db);
      /* (a bounded stretch at a time: the others' events are scanned too) */
      if (upto - e->last_seq > EVENTS_SCAN_MAX) {
        upto = e->last_seq + EVENTS_SCAN_MAX;
        more = 1;
      }
      n = db_events_since_scoped(rd->db, e->last_seq, upto, e->prefix, EVENTS_BATCH, &e->buf,
                                 &e->len, &e->last_seq);
      if (n >= 0 && n < EVENTS_BATCH && upto > e->last_seq)
        e->last_seq = upto;
    } else {
      n = db_events_since(rd->db, e->last_seq, EVENTS_BATCH, &e->buf, &e->len, &e->last_seq);
    }
    api_reader_put(rd);
    e->catching_up = n == EVENTS_BATCH || more;
    /* a stretch of the others' events alone: on to the next, not to sleep */
    if (n == 0 && more && !e->len)
      continue;
    if (n < 0)
      return MHD_CONTENT_READER_END_WITH_ERROR;
    if (n == 0 && e->s.keepalive_due) {
      e->s.keepalive_due = 0;
      e->buf = strdup(": keepalive\n\n");
      e->len = e->buf ? strlen(e->buf) : 0;
    }
    if (e->len) {
      /* Tests: events that reach their clients late (after what a client
       * sees directly, a command's exit through the exec channel). */
      if (n > 0)
        FAULT_POINT("events_before_send");
      e->pos = 0;
      return copy_out(&e->buf, &e->len, &e->pos, out, max);
    }
    state_lock();
    waiting = stream_wait_locked(&e->s);
    state_unlock();
    if (waiting)
      return 0;
  }
}

static void events_free(void *cls) {
  struct events_ctx *e = cls;

  state_lock();
  stream_remove_locked(&e->s);
  state_unlock();
  free(e->buf);
  free(e);
}

static enum MHD_Result api_events(struct MHD_Connection *c, struct req *rq, const char *arg) {
  (void)arg;
  const char *since = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "since");
  const char *last = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Last-Event-ID");
  struct events_ctx *e;
  struct MHD_Response *r;
  long v = 0;

  /* A browser's EventSource reconnects with Last-Event-ID; it wins. */
  if (last && *last)
    since = last;
  if (since && util_parse_long(since, 0, 0x7fffffffffffffffL, &v) != 0)
    return api_respond_error(c, MUSTER_E_INVALID, "since", "since must be an event seq (>= 0)");
  e = calloc(1, sizeof(*e));
  if (!e)
    return MHD_NO;
  e->s.kind = STREAM_EVENTS;
  e->s.conn = c;
  e->last_seq = v;
  if (!api_own_prefix(rq, e->prefix, sizeof(e->prefix)))
    e->prefix[0] = '\0';
  /* A stream that starts far behind is told so at once (the check runs
   * while catching up): a scoped one would scan the others' events too. */
  e->catching_up = 1;
  e->buf = strdup("retry: 1000\n\n");
  e->len = e->buf ? strlen(e->buf) : 0;
  r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16 * 1024, events_reader, e, events_free);
  if (!r) {
    free(e->buf);
    free(e);
    return MHD_NO;
  }
  return api_queue_stream(c, &e->s, r, "text/event-stream");
}

struct log_ctx {
  struct stream s;
  char path[700];
  int fd;
  off_t offset;
  /* After the worker's end: until when (util_mono_ms()) its last output
   * may still come; 0 not looked up yet, -1 none to wait for. */
  int64_t final_by_ms;
};

/* How long after a worker's end its workerd may still ship output. A
 * backend that cannot signal it (external) leaves it to learn of the stop
 * at its next heartbeat; then workerd gives the command the longer of the
 * stop grace and its own 5 s before SIGKILL, drains the pipes (2 s at
 * most), winds the exec channel down (5 s at most) and flushes; 5 s more of
 * margin. */
static int64_t final_output_wait_ms(const char *id) {
  double grace = g.cfg.stop_grace_s > 5 ? g.cfg.stop_grace_s : 5;
  int64_t interval = hb_interval_now_ms();
  struct reader *rd = api_reader_get();
  struct db_worker_info info;

  /* (the interval it was told, which may be longer than the one told now:
   * fewer workers live since its end) */
  if (db_worker_info(rd->db, id, &info) == 0) {
    if (info.heartbeat_interval_ms > interval)
      interval = info.heartbeat_interval_ms;
    db_worker_info_cleanup(&info);
  }
  api_reader_put(rd);
  return interval + (int64_t)((grace + 2 + 5 + 5) * 1000);
}

/* The API time iso ("2026-11-21T14:00:00.123Z") in ms since the epoch.
 * Returns 0, or -1 if it is not one. */
static int iso_ms(const char *iso, int64_t *ms) {
  struct tm tm;
  int frac = 0, n = 0;
  time_t t;

  memset(&tm, 0, sizeof(tm));
  if (!iso ||
      sscanf(iso, "%4d-%2d-%2dT%2d:%2d:%2d.%3dZ%n", &tm.tm_year, &tm.tm_mon, &tm.tm_mday,
             &tm.tm_hour, &tm.tm_min, &tm.tm_sec, &frac, &n) != 7 ||
      iso[n] != '\0')
    return -1;
  tm.tm_year -= 1900;
  tm.tm_mon -= 1;
  t = timegm(&tm);
  if (t == (time_t)-1)
    return -1;
  *ms = (int64_t)t * 1000 + frac;
  return 0;
}

/* Until when (util_mono_ms()) the last output of ended worker id may still
 * come: the end plus final_output_wait_ms(); -1 if that has passed, or if
 * it never ran a workerd (it never registered), so that nothing can come. */
static int64_t final_output_by(const char *id) {
  json_t *w = api_worker_read(id);
  int64_t end, left, wait;
  struct timespec now;

  if (!w || json_is_null(json_object_get(w, "running_at")) ||
      iso_ms(json_string_value(json_object_get(w, "finished_at")), &end) != 0) {
    json_decref(w);
    return -1;
  }
  json_decref(w);
  wait = final_output_wait_ms(id);
  clock_gettime(CLOCK_REALTIME, &now);
  left = end + wait - ((int64_t)now.tv_sec * 1000 + now.tv_nsec / 1000000);
  /* A wall clock stepped back since the end never stretches the wait. */
  if (left > wait)
    left = wait;
  return left > 0 ? util_mono_ms() + left : -1;
}

/* Whether the log of an ended worker may still grow: its workerd ships the
 * last output after the end was recorded (a stopped command's last words)
 * and says when it is done (api_log_end_path()); the wait is bounded by
 * final_output_by(), for a workerd that died. */
static int log_more_to_come(struct log_ctx *l) {
  char path[700];

  if (l->final_by_ms == 0)
    l->final_by_ms = final_output_by(l->s.worker_id);
  if (l->final_by_ms < 0 || util_mono_ms() >= l->final_by_ms)
    return 0;
  api_log_end_path(l->s.worker_id, path, sizeof(path));
  return access(path, F_OK) != 0;
}

/* Reads the next bytes of the log file (opened once it exists). */
static ssize_t log_read(struct log_ctx *l, char *out, size_t max) {
  ssize_t n;

  if (l->fd < 0)
    l->fd = open(l->path, O_RDONLY | O_CLOEXEC);
  n = l->fd >= 0 ? pread(l->fd, out, max, l->offset) : 0;
  if (n > 0)
    l->offset += n;
  return n;
}

/* Next bytes of a followed log; suspends at its end while the worker is
 * live, and after its end until its workerd said that its last output is
 * in (log_more_to_come(), bounded); then ends the answer once all is sent.
 * The file is read without the state lock; an append (or the mark that the
 * log is whole) that lands between the read and the wait marks the stream
 * pending, so it reads again instead of waiting (stream_wait_locked). */
static ssize_t log_reader(void *cls, uint64_t pos, char *out, size_t max) {
  struct log_ctx *l = cls;
  ssize_t n;
  int live, waiting, down;

  (void)pos;
  for (;;) {
    if (l->s.client_gone)
      return MHD_CONTENT_READER_END_WITH_ERROR;
    n = log_read(l, out, max);
    if (n > 0)
      return n;
    if (n < 0)
      return MHD_CONTENT_READER_END_WITH_ERROR;
    FAULT_POINT("log_follow_at_end");
    state_lock();
    down = g.shutting_down;
    live = !down && lw_find_locked(l->s.worker_id) != NULL;
    waiting = live ? stream_wait_locked(&l->s) : 0;
    state_unlock();
    if (waiting)
      return 0;
    if (!live && !down && log_more_to_come(l)) {
      state_lock();
      l->s.wake_at_ms = l->final_by_ms;
      waiting = !g.shutting_down && stream_wait_locked(&l->s);
      state_unlock();
      if (waiting)
        return 0;
      continue;
    }
    if (!live) {
      /* Ended, and its last output is in: that is all there is. */
      n = log_read(l, out, max);
      return n > 0   ? n
             : n < 0 ? MHD_CONTENT_READER_END_WITH_ERROR
                     : MHD_CONTENT_READER_END_OF_STREAM;
    }
  }
}

static void log_free(void *cls) {
  struct log_ctx *l = cls;

  state_lock();
  stream_remove_locked(&l->s);
  state_unlock();
  if (l->fd >= 0)
    close(l->fd);
  free(l);
}

static enum MHD_Result api_logs(struct MHD_Connection *c, struct req *rq, const char *id) {
  const char *stream = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "stream");
  const char *offs = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "offset");
  const char *follow = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "follow");
  struct MHD_Response *r;
  struct log_ctx *l;
  json_t *w;
  char path[700];
  long offset = 0;
  enum MHD_Result ret;

  if (api_log_path(id, stream, path, sizeof(path)) != 0)
    return api_respond_error(c, MUSTER_E_INVALID, "stream", "stream must be stdout or stderr");
  if (offs && util_parse_long(offs, 0, 0x7fffffffffffffffL, &offset) != 0)
    return api_respond_error(c, MUSTER_E_INVALID, "offset", "offset must be a byte offset (>= 0)");
  {
    struct reader *rd = api_reader_get();
    int sees = api_sees_worker(rq, rd, id);
    api_reader_put(rd);
    w = sees ? api_worker_read(id) : NULL;
  }
  if (!w)
    return api_respond_error(c, MUSTER_E_NOT_FOUND, "id", "there is no worker %s", id);
  json_decref(w);

  l = calloc(1, sizeof(*l));
  if (!l)
    return MHD_NO;
  l->s.kind = STREAM_LOG;
  l->s.conn = c;
  snprintf(l->s.worker_id, sizeof(l->s.worker_id), "%s", id);
  snprintf(l->path, sizeof(l->path), "%s", path);
  l->fd = open(path, O_RDONLY | O_CLOEXEC);
  l->offset = offset;
  if (!follow || strcmp(follow, "1") != 0) {
    struct stat st;
    off_t size = l->fd >= 0 && fstat(l->fd, &st) == 0 ? st.st_size : 0;
    int fd = l->fd;
    free(l);
    if (fd < 0 || offset >= size) {
      if (fd >= 0)
        close(fd);
      r = MHD_create_response_from_buffer(0, NULL, MHD_RESPMEM_PERSISTENT);
    } else {
      r = MHD_create_response_from_fd_at_offset64((uint64_t)(size - offset), fd, (uint64_t)offset);
    }
  } else {
    r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 32 * 1024, log_reader, l, log_free);
    if (r) {
      int rc;
      state_lock();
      rc = stream_add_locked(&l->s);
      state_unlock();
      if (rc) {
        MHD_destroy_response(r); /* log_free frees l */
        return api_respond_error(c, rc, NULL, NULL);
      }
    } else {
      if (l->fd >= 0)
        close(l->fd);
      free(l);
    }
  }
  if (!r)
    return MHD_NO;
  MHD_add_response_header(r, "Content-Type", "text/plain; charset=utf-8");
  MHD_add_response_header(r, "Cache-Control", "no-store");
  ret = MHD_queue_response(c, MHD_HTTP_OK, r);
  MHD_destroy_response(r);
  return ret;
}

/* The routes of this file (api_routes.c lists the table). */
const struct api_route api_stream_routes[] = {
    {"GET", "/api/v1/events", AUTH_CLIENT, api_events, NULL},
    {"GET", "/api/v1/workers/{id}/logs", AUTH_CLIENT, api_logs, NULL},
    {NULL, NULL, AUTH_NONE, NULL, NULL},
};
