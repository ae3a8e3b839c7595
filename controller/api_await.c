/* api_await.c: POST /api/v1/workers/await: answered at once, or parked
 * until the workers it waits for get there (state.h's waiters) and then
 * answered when libmicrohttpd calls again. See api_internal.h. */
#include "api_internal.h"
#include "api_scope.h"

#include "muster_errors.h"
#include "state.h"
#include "util.h"
#include "validate.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- POST /api/v1/workers/await ---- */

/* Builds await's answer from the workers' current rows (read without the
 * state lock: every change that woke the await is committed). */
static json_t *await_answer(json_t *ids, int wfc, int timed_out) {
  json_t *done = json_array(), *failures = json_array(), *item;
  const char *target = wfc ? "succeeded" : "running";
  struct reader *rd = api_reader_get();
  size_t i;

  json_array_foreach(ids, i, item) {
    json_t *w = db_worker_json(rd->db, json_string_value(item));
    const char *st;
    if (!w)
      continue;
    st = json_string_value(json_object_get(w, "status"));
    json_array_append_new(st && strcmp(st, target) == 0 ? done : failures, w);
  }
  api_reader_put(rd);
  return json_pack("{s:o, s:o, s:b}", "workers", done, "failures", failures, "timed_out",
                   timed_out);
}

static void api_waiter_free(struct waiter *wt) {
  if (!wt)
    return;
  free(wt->ids);
  free(wt->done);
  free(wt->slots);
  free(wt);
}

/* The answer of a woken await has gone out, or its connection ended. */
static void await_answered(struct req *rq) {
  (void)rq;
  __atomic_sub_fetch(&g.awaits_answering, 1, __ATOMIC_RELAXED);
}

/* Finishes a resumed await: its waiter is ready. */
static enum MHD_Result api_await_finish(struct MHD_Connection *c, struct req *rq) {
  struct waiter *wt = rq->waiter;
  json_t *ids = json_array(), *answer;
  int shutting, gone, timed_out;

  /* Woken, it left the waiters' list and index (waiter_wake_locked()),
   * and what woke it wrote its flags under the state lock before the
   * resume: no other thread touches it now, and no lock is taken. */
  shutting = wt->shut_down && wt->pending > 0 && !wt->timed_out;
  gone = wt->client_gone;
  timed_out = wt->timed_out && wt->pending > 0;
  rq->waiter = NULL;
  rq->resume = NULL;
  rq->release = await_answered; /* (called when the answer has gone out) */
  if (gone) {
    /* Nobody to answer: close the connection, which frees it. */
    api_waiter_free(wt);
    json_decref(ids);
    return MHD_NO;
  }
  for (int i = 0; i < wt->n; i++)
    json_array_append_new(ids, json_string(wt->ids[i]));
  answer = shutting ? NULL : await_answer(ids, wt->wait_for_completion, timed_out);
  json_decref(ids);
  api_waiter_free(wt);
  if (shutting)
    return api_respond_error(c, MUSTER_E_SHUTTING_DOWN, NULL,
                             "the controller is shutting down; await again after it restarts");
  return api_respond_json(c, MHD_HTTP_OK, answer);
}

/* Frees the waiter of an await whose connection ended while it was parked. */
static void await_release(struct req *rq) {
  if (rq->waiter) {
    state_lock();
    if (rq->waiter->ready) /* (woken, its answer never built) */
      __atomic_sub_fetch(&g.awaits_answering, 1, __ATOMIC_RELAXED);
    waiter_remove_locked(rq->waiter);
    state_unlock();
    api_waiter_free(rq->waiter);
  }
}

static enum MHD_Result api_await(struct MHD_Connection *c, struct req *rq, const char *arg) {
  (void)arg;
  struct await_req ar;
  const char *field;
  char msg[512];
  struct waiter *wt = NULL;
  json_t *body, *item;
  enum MHD_Result ret = MHD_NO;
  size_t i;
  int n, rc;

  body = api_parse_body(c, rq, &ret);
  if (!body)
    return ret;
  rc = validate_await(body, &ar, &field, msg, sizeof(msg));
  json_decref(body);
  if (rc)
    return api_respond_error(c, rc, field, "%s", msg);

  n = (int)json_array_size(ar.ids);
  wt = calloc(1, sizeof(*wt));
  if (wt) {
    wt->ids = calloc((size_t)n + 1, sizeof(*wt->ids));
    wt->done = calloc((size_t)n + 1, 1);
    wt->slots = calloc((size_t)n + 1, sizeof(*wt->slots));
  }
  if (!wt || !wt->ids || !wt->done || !wt->slots) {
    api_waiter_free(wt);
    json_decref(ar.ids);
    return api_respond_error(c, MUSTER_E_NOMEM, NULL, NULL);
  }
  wt->conn = c;
  wt->n = n;
  wt->wait_for_completion = ar.wait_for_completion;

  state_lock();
  json_array_foreach(ar.ids, i, item) {
    const char *id = json_string_value(item);
    struct lw *w = lw_find_locked(id);
    enum wstatus st = WS_FAILED;

    snprintf(wt->ids[i], sizeof(wt->ids[i]), "%s", id);
    if (w && api_sees_session(rq, w->session)) {
      st = w->status;
    } else {
      struct db_worker_info info;
      /* (another user's worker: as if there were none) */
      int rc = w ? MUSTER_E_NOT_FOUND : db_worker_info(g.db, id, &info);
      if (!rc && !api_sees_session(rq, info.session)) {
        db_worker_info_cleanup(&info);
        rc = MUSTER_E_NOT_FOUND;
      }
      if (rc != 0) {
        enum MHD_Result ret;
        state_unlock();
        api_waiter_free(wt);
        ret = api_respond_error(c, MUSTER_E_NOT_FOUND, "ids", "there is no worker %s", id);
        json_decref(ar.ids); /* id points into it */
        return ret;
      }
      if (ws_parse(info.status, &st) != 0)
        st = WS_FAILED;
      db_worker_info_cleanup(&info);
    }
    if (ws_terminal(st) || (!ar.wait_for_completion && st == WS_RUNNING))
      wt->done[i] = 1;
    else
      wt->pending++;
  }
  if (wt->pending == 0 || g.shutting_down) {
    json_t *answer;
    state_unlock();
    answer = await_answer(ar.ids, ar.wait_for_completion, 0);
    api_waiter_free(wt);
    json_decref(ar.ids);
    return api_respond_json(c, MHD_HTTP_OK, answer);
  }
  /* Wait on the state change itself: the connection is parked, no thread
   * is held, and sm_commit() (or the monitor, at the deadline) resumes it. */
  if (ar.timeout_seconds > 0)
    wt->deadline_ms = util_mono_ms() + (int64_t)(ar.timeout_seconds * 1000);
  if (waiter_add_locked(wt) != 0) {
    state_unlock();
    api_waiter_free(wt);
    json_decref(ar.ids);
    return api_respond_error(c, MUSTER_E_NOMEM, NULL, NULL);
  }
  rq->waiter = wt;
  rq->resume = api_await_finish;
  rq->release = await_release;
  MHD_suspend_connection(c);
  if (wt->deadline_ms)
    pthread_cond_signal(&g.kick); /* the monitor must learn the new deadline */
  state_unlock();
  json_decref(ar.ids);
  return MHD_YES;
}

/* The routes of this file (api_routes.c lists the table). */
const struct api_route api_await_routes[] = {
    {"POST", "/api/v1/workers/await", AUTH_CLIENT, api_await, NULL},
    {NULL, NULL, AUTH_NONE, NULL, NULL},
};
