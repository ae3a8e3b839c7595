/* api_list.c: reading workers: GET /api/v1/workers (a page of them),
 * GET /api/v1/workers/{id} and GET /api/v1/workers/{id}/events. See api_internal.h. */
#include "api_internal.h"
#include "api_scope.h"
#include "session_name.h"

#include "muster_errors.h"
#include "state.h"
#include "util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- GET /api/v1/workers ---- */

struct list_query {
  json_t *statuses;
  const char *bad;
};

static enum MHD_Result collect_status(void *cls, enum MHD_ValueKind kind, const char *key,
                                      const char *value) {
  struct list_query *q = cls;
  enum wstatus st;

  (void)kind;
  if (strcmp(key, "status") != 0 || !value)
    return MHD_YES;
  /* Both ?status=a&status=b and ?status=a,b are accepted. */
  for (const char *p = value; *p;) {
    char name[32];
    size_t n = strcspn(p, ",");
    snprintf(name, sizeof(name), "%.*s", (int)(n < sizeof(name) ? n : sizeof(name) - 1), p);
    if (ws_parse(name, &st) != 0) {
      q->bad = value;
      return MHD_NO;
    }
    json_array_append_new(q->statuses, json_string(name));
    p += n;
    if (*p == ',')
      p++;
  }
  return MHD_YES;
}

static enum MHD_Result api_list(struct MHD_Connection *c, struct req *rq, const char *arg) {
  (void)arg;
  struct list_query q = {json_array(), NULL};
  const char *session = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "session");
  char stored[SESSION_STORED_MAX], own[USER_NAME_MAX + 2];
  /* A caller who sees only their own sessions lists only theirs. */
  const char *prefix = api_own_prefix(rq, own, sizeof(own));
  const char *role = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "role");
  const char *run = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "run");
  char *statuses = NULL, seq[32], (*ids)[16];
  struct reader *rd;
  struct MHD_Response *r;
  char *text = NULL;
  size_t textlen = 0;
  FILE *out;
  enum MHD_Result ret;
  int64_t before, next;
  int limit, n = 0, rc;

  if (api_page_params(c, &limit, &before, &ret) != 0) {
    json_decref(q.statuses);
    return ret;
  }
  if (session) {
    rc = api_session_scope(rq, session, stored, sizeof(stored));
    if (rc == MUSTER_E_INVALID) {
      json_decref(q.statuses);
      return api_respond_error(c, rc, "session", "\"%.80s\" is not a session's name", session);
    }
    /* another user's session: nothing of it is listed */
    session = rc ? "/" : stored;
  }
  MHD_get_connection_values(c, MHD_GET_ARGUMENT_KIND, collect_status, &q);
  if (q.bad) {
    json_decref(q.statuses);
    return api_respond_error(c, MUSTER_E_INVALID, "status",
                             "status must be scheduling, starting, running, succeeded, failed or "
                             "stopped");
  }
  if (json_array_size(q.statuses))
    statuses = json_dumps(q.statuses, JSON_COMPACT);
  json_decref(q.statuses);
  ids = calloc((size_t)limit, sizeof(*ids));
  if (!ids) {
    free(statuses);
    return api_respond_error(c, MUSTER_E_NOMEM, NULL, NULL);
  }
  rd = api_reader_get();
  /* The seq first: events after it may already show in the list, none
   * before it can be missing from it. */
  snprintf(seq, sizeof(seq), "%lld", (long long)db_last_event_seq(rd->db));
  rc = db_worker_page(rd->db, statuses, session, prefix, role, run, before, limit, ids, &n, &next);
  /* The page is built as text from the cached objects: a page of finished
   * workers is copies, not queries. */
  out = rc ? NULL : open_memstream(&text, &textlen);
  if (out) {
    fputs("{\"workers\":[", out);
    for (int i = 0, written = 0; i < n; i++) {
      size_t len;
      char *w = api_worker_text(rd, ids[i], &len);
      if (!w)
        continue; /* pruned between the two reads */
      if (written++)
        fputc(',', out);
      fwrite(w, 1, len, out);
      free(w);
    }
    if (next)
      fprintf(out, "],\"next\":\"%lld\"}", (long long)next);
    else
      fputs("],\"next\":null}", out);
  }
  api_reader_put(rd);
  free(statuses);
  free(ids);
  if (!out || fclose(out) != 0) {
    free(text);
    return api_respond_error(c, MUSTER_E_DB, NULL, "could not list workers");
  }
  r = MHD_create_response_from_buffer(textlen, text, MHD_RESPMEM_MUST_FREE);
  if (!r) {
    free(text);
    return MHD_NO;
  }
  MHD_add_response_header(r, "Content-Type", "application/json");
  MHD_add_response_header(r, "Cache-Control", "no-store");
  /* The last event seq at the time of the list: a client that then follows
   * /api/v1/events?since= that seq misses nothing. */
  MHD_add_response_header(r, "X-Muster-Last-Event", seq);
  ret = MHD_queue_response(c, MHD_HTTP_OK, r);
  MHD_destroy_response(r);
  return ret;
}

/* ---- GET /api/v1/workers/{id} ---- */

static enum MHD_Result api_get(struct MHD_Connection *c, struct req *rq, const char *id) {
  struct reader *rd = api_reader_get();
  size_t len;
  char *text = api_sees_worker(rq, rd, id) ? api_worker_text(rd, id, &len) : NULL;

  api_reader_put(rd);
  if (!text)
    return api_respond_error(c, MUSTER_E_NOT_FOUND, "id", "there is no worker %s", id);
  return api_respond_text(c, MHD_HTTP_OK, text, len);
}

/* ---- GET /api/v1/workers/{id}/events ---- */

/* At most this many of a worker's events in one answer, the newest: a
 * worker has a handful (one per state change, two per new attempt), but
 * nothing caps its attempts (a backend that keeps requeueing it). */
#define WORKER_EVENTS_MAX 1000

static enum MHD_Result api_worker_events(struct MHD_Connection *c, struct req *rq, const char *id) {
  struct reader *rd = api_reader_get();
  json_t *events = NULL;
  int truncated = 0;
  int rc = api_sees_worker(rq, rd, id)
               ? db_worker_events(rd->db, id, WORKER_EVENTS_MAX, &events, &truncated)
               : MUSTER_E_NOT_FOUND;

  api_reader_put(rd);
  if (rc == MUSTER_E_NOT_FOUND)
    return api_respond_error(c, MUSTER_E_NOT_FOUND, "id", "there is no worker %s", id);
  if (rc)
    return api_respond_error(c, rc, NULL, "could not read the events of %s", id);
  return api_respond_json(
      c, MHD_HTTP_OK,
      json_pack("{s:s, s:o, s:b}", "worker_id", id, "events", events, "truncated", truncated));
}

/* The routes of this file (api_routes.c lists the table). */
const struct api_route api_list_routes[] = {
    {"GET", "/api/v1/workers", AUTH_CLIENT, api_list, NULL},
    {"GET", "/api/v1/workers/{id}", AUTH_CLIENT, api_get, NULL},
    {"GET", "/api/v1/workers/{id}/events", AUTH_CLIENT, api_worker_events, NULL},
    {NULL, NULL, AUTH_NONE, NULL, NULL},
};
