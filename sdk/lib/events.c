/* events.c: the streaming calls: a worker's logs (muster_logs()) and the
 * controller's event stream (muster_events(), server-sent events). */
#include "client_internal.h"
#include "muster.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_SSE_RECORD (1024 * 1024)

struct logs_ctx {
  muster_data_cb cb;
  void *arg;
  int stopped;
  struct buf err; /* an error answer's body */
};

static size_t logs_write(char *p, size_t size, size_t n, void *arg) {
  struct logs_ctx *l = arg;

  if (l->stopped)
    return 0;
  if (l->cb(l->arg, p, size * n)) {
    l->stopped = 1;
    return 0;
  }
  return size * n;
}

int muster_logs(muster_client *c, const char *id, muster_stream stream, int64_t offset, int follow,
                muster_data_cb cb, void *arg) {
  struct logs_ctx l = {cb, arg, 0, {NULL, 0, 0}};
  char path[128];
  int rc;

  if ((rc = muster_worker_id_ok_(c, id)))
    return rc;
  if (offset < 0)
    return muster_set_errorf_(c, MUSTER_E_INVALID, "offset", "offset must be >= 0");
  snprintf(path, sizeof(path), "/api/v1/workers/%s/logs?stream=%s&offset=%lld%s", id,
           stream == MUSTER_STDERR ? "stderr" : "stdout", (long long)offset,
           follow ? "&follow=1" : "");
  return muster_http_stream_(c, path, logs_write, &l, &l.stopped, 0);
}

struct events_ctx {
  muster_event_cb cb;
  void *arg;
  int stopped;
  char *rec;
  size_t len;
};

/* Handles one SSE record ("id: N\ndata: {...}"). Returns non-zero to stop. */
static int sse_record(struct events_ctx *e, char *rec) {
  char *data = strstr(rec, "data: ");
  json_t *j;
  muster_event ev;
  int stop;

  if (!data)
    return 0; /* a comment (keep-alive) or a retry: line */
  data += 6;
  data[strcspn(data, "\n")] = '\0';
  j = json_loads(data, 0, NULL);
  if (!j)
    return 0;
  memset(&ev, 0, sizeof(ev));
  ev.seq = json_integer_value(json_object_get(j, "seq"));
  snprintf(ev.worker_id, sizeof(ev.worker_id), "%s",
           json_string_value(json_object_get(j, "worker_id"))
               ? json_string_value(json_object_get(j, "worker_id"))
               : "");
  ev.from = muster_status_parse_(json_string_value(json_object_get(j, "from")));
  ev.to = muster_status_parse_(json_string_value(json_object_get(j, "to")));
  ev.at = json_string_value(json_object_get(j, "at"));
  ev.detail = json_string_value(json_object_get(j, "detail"));
  stop = e->cb(e->arg, &ev);
  json_decref(j);
  return stop;
}

static size_t events_write(char *p, size_t size, size_t n, void *arg) {
  struct events_ctx *e = arg;
  size_t len = size * n;
  char *end, *grown;

  if (e->len + len > MAX_SSE_RECORD)
    return 0; /* a record larger than any event: not a muster stream */
  grown = realloc(e->rec, e->len + len + 1);
  if (!grown)
    return 0;
  e->rec = grown;
  memcpy(e->rec + e->len, p, len);
  e->len += len;
  e->rec[e->len] = '\0';
  while ((end = strstr(e->rec, "\n\n")) != NULL) {
    size_t used = (size_t)(end - e->rec) + 2;
    *end = '\0';
    if (sse_record(e, e->rec)) {
      e->stopped = 1;
      return 0;
    }
    memmove(e->rec, e->rec + used, e->len - used + 1);
    e->len -= used;
  }
  return len;
}

int muster_events(muster_client *c, int64_t since, muster_event_cb cb, void *arg) {
  struct events_ctx e = {cb, arg, 0, NULL, 0};
  char path[96];
  int rc;

  if (since < 0)
    return muster_set_errorf_(c, MUSTER_E_INVALID, "since", "since must be >= 0");
  snprintf(path, sizeof(path), "/api/v1/events?since=%lld", (long long)since);
  rc = muster_http_stream_(c, path, events_write, &e, &e.stopped, 60);
  free(e.rec);
  return rc;
}
