/* api_metrics_follow.c: GET /api/v1/runs/{run}/metrics?follow=1, a run's
 * points as server-sent events while it runs: the points so far, then each
 * call's new ones as they are committed (a POST of the run's metrics, or
 * its end, wakes the stream: no polling), and a keepalive comment every
 * 15 s; the answer ends once the run has ended and its last points are
 * sent. See api_internal.h and docs/design.md, "Metrics". */
#include "api_internal.h"
#include "api_metrics.h"

#include "muster_errors.h"
#include "state.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define KEEPALIVE_MS 15000

struct follow_ctx {
  struct stream s; /* first: the registry sees only this part (s.worker_id: the run) */
  struct db_metric_query q;
  const char *names[METRICS_POINT_NAMES];
  char list[METRICS_LIST_MAX];
  int sent_first;
  int ended;
  int64_t last_sent_ms;
  char *buf;
  size_t len, pos;
};

/* The run's points after q->since as one event into f->buf; 1 if there
 * were any (or it is the first event), 0 if none, -1 on a failed read.
 * *running: whether the run ran when the read began (read first: the
 * points read after it hold every point it took before it ended). */
static int next_event(struct follow_ctx *f, int *running) {
  struct reader *rd = api_reader_get();
  char st[16], session[SESSION_STORED_MAX], *text = NULL;
  size_t len = 0;
  int64_t next = 0;
  FILE *out;
  int rc;

  rc = db_run_state(rd->db, f->s.worker_id, st, sizeof(st), session, sizeof(session));
  *running = rc == 0 && strcmp(st, "running") == 0;
  out = rc ? NULL : open_memstream(&text, &len);
  if (out) {
    fputs("data: {\"points\":[", out);
    rc = db_metrics_query(rd->db, f->s.worker_id, &f->q, out, &next);
    fprintf(out, "],\"next_since\":%lld}\n\n", (long long)next);
    if (fclose(out) != 0 && !rc)
      rc = MUSTER_E_NOMEM;
  }
  api_reader_put(rd);
  if (rc || !out) {
    free(text);
    return -1;
  }
  if (next <= f->q.since && f->sent_first) {
    free(text);
    return 0;
  }
  f->q.since = next;
  /* After the first event, every new row (a follower is never far behind). */
  f->q.max_points = METRIC_SERIES_ROWS;
  f->sent_first = 1;
  free(f->buf);
  f->buf = text;
  f->len = len;
  f->pos = 0;
  return 1;
}

static ssize_t follow_reader(void *cls, uint64_t pos, char *out, size_t max) {
  struct follow_ctx *f = cls;
  int running, rc, waiting;

  (void)pos;
  for (;;) {
    if (f->s.client_gone)
      return MHD_CONTENT_READER_END_WITH_ERROR;
    if (f->pos < f->len) {
      size_t n = f->len - f->pos < max ? f->len - f->pos : max;
      memcpy(out, f->buf + f->pos, n);
      f->pos += n;
      f->last_sent_ms = util_mono_ms();
      return (ssize_t)n;
    }
    if (f->ended)
      return MHD_CONTENT_READER_END_OF_STREAM;
    rc = next_event(f, &running);
    if (rc < 0)
      return MHD_CONTENT_READER_END_WITH_ERROR;
    if (!running)
      f->ended = 1; /* what it had is read: sent, then the end */
    if (rc > 0 || f->ended)
      continue;
    if (util_mono_ms() - f->last_sent_ms >= KEEPALIVE_MS) {
      static const char ka[] = ": keepalive\n\n";
      free(f->buf);
      f->buf = strdup(ka);
      f->len = f->buf ? sizeof(ka) - 1 : 0;
      f->pos = 0;
      continue;
    }
    state_lock();
    waiting = 0;
    if (!g.shutting_down) {
      f->s.wake_at_ms = f->last_sent_ms + KEEPALIVE_MS;
      waiting = stream_wait_locked(&f->s);
    }
    state_unlock();
    if (waiting)
      return 0;
    if (g.shutting_down)
      return MHD_CONTENT_READER_END_OF_STREAM;
  }
}

static void follow_free(void *cls) {
  struct follow_ctx *f = cls;

  state_lock();
  stream_remove_locked(&f->s);
  state_unlock();
  free(f->buf);
  free(f);
}

enum MHD_Result api_metrics_follow(struct MHD_Connection *c, const char *run, const char *list,
                                   const struct db_metric_query *q) {
  struct follow_ctx *f = calloc(1, sizeof(*f));
  struct MHD_Response *r;

  if (!f)
    return MHD_NO;
  f->s.kind = STREAM_LOG; /* keyed by the run's id in the watch index */
  f->s.conn = c;
  snprintf(f->s.worker_id, sizeof(f->s.worker_id), "%s", run);
  f->q = *q;
  f->q.names = NULL;
  f->q.nnames = 0;
  if (list && *list) {
    snprintf(f->list, sizeof(f->list), "%s", list);
    for (char *save = NULL, *t = strtok_r(f->list, ",", &save);
         t && f->q.nnames < METRICS_POINT_NAMES; t = strtok_r(NULL, ",", &save))
      f->names[f->q.nnames++] = t;
    f->q.names = f->names;
  }
  f->last_sent_ms = util_mono_ms();
  r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 32 * 1024, follow_reader, f, follow_free);
  if (!r) {
    free(f);
    return MHD_NO;
  }
  return api_queue_stream(c, &f->s, r, "text/event-stream");
}
