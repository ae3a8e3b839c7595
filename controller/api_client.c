/* api_client.c: the client endpoints of the REST API (launch, list, get,
 * stop, await, sessions, health, metrics, the web UI's files). See
 * api_internal.h. */
#include "api_internal.h"

#include "backend.h"
#include "lease.h"
#include "log.h"
#include "muster_errors.h"
#include "state.h"
#include "util.h"
#include "validate.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

static void client_ip(struct MHD_Connection *c, char *buf, size_t size) {
  const union MHD_ConnectionInfo *ci =
      MHD_get_connection_info(c, MHD_CONNECTION_INFO_CLIENT_ADDRESS);

  buf[0] = '\0';
  if (!ci || !ci->client_addr)
    return;
  if (ci->client_addr->sa_family == AF_INET)
    inet_ntop(AF_INET, &((const struct sockaddr_in *)ci->client_addr)->sin_addr, buf,
              (socklen_t)size);
  else if (ci->client_addr->sa_family == AF_INET6)
    inet_ntop(AF_INET6, &((const struct sockaddr_in6 *)ci->client_addr)->sin6_addr, buf,
              (socklen_t)size);
}

static char *dump_or_default(json_t *v, const char *dflt) {
  return v ? json_dumps(v, JSON_COMPACT) : strdup(dflt);
}

/* ---- POST /api/v1/workers ---- */

#define LAUNCH_MAX_GROUPS 16

/* One shape of a launch: a plain launch has one; {"groups": [...]} (muster
 * run's PS and workers of different shapes) several, started as one gang. */
struct group {
  struct launch_req lr;
  struct backend_req req;
  char (*ids)[16];
  char (*tokens)[72];
  char *command, *args, *env, *secret;
};

static void group_cleanup(struct group *gr) {
  free(gr->ids);
  free(gr->tokens);
  free(gr->command);
  free(gr->args);
  free(gr->env);
  free(gr->secret);
}

/* Validates one group's body and makes its ids and tokens. Returns 0 or an
 * error with *field and msg filled. */
static int group_prepare(json_t *body, struct group *gr, const char **field, char *msg,
                         size_t msglen) {
  int rc = validate_launch(body, &gr->lr, field, msg, msglen);

  if (rc)
    return rc;
  gr->req.cpu = gr->lr.cpu;
  gr->req.memory = gr->lr.memory;
  gr->req.ngpu = gr->lr.nvidia_gpu;
  rc = g.backend->could_ever_fit(&gr->req, field, msg, msglen);
  if (rc)
    return rc;
  gr->ids = calloc((size_t)gr->lr.n, sizeof(*gr->ids));
  gr->tokens = calloc((size_t)gr->lr.n, sizeof(*gr->tokens));
  gr->command = gr->lr.command ? json_dumps(gr->lr.command, JSON_COMPACT) : NULL;
  gr->args = dump_or_default(gr->lr.args, "[]");
  gr->env = dump_or_default(gr->lr.env, "{}");
  gr->secret = dump_or_default(gr->lr.secret_env, "{}");
  if (!gr->ids || !gr->tokens || !gr->args || !gr->env || !gr->secret ||
      (gr->lr.command && !gr->command)) {
    snprintf(msg, msglen, "out of memory");
    return MUSTER_E_NOMEM;
  }
  for (long i = 0; i < gr->lr.n; i++) {
    memcpy(gr->ids[i], "w-", 2);
    if (util_random_alnum(gr->ids[i] + 2, 10) != 0 || util_random_hex(gr->tokens[i], 24) != 0) {
      snprintf(msg, msglen, "no random bytes for worker ids");
      return MUSTER_E_INTERNAL;
    }
  }
  return 0;
}

/* The groups of a launch body: the body itself, or its "groups" array (of
 * 1..16 launch bodies, one session, at most LAUNCH_MAX_N workers in all). */
static int groups_prepare(json_t *body, struct group *grs, int *ngr, const char **field, char *msg,
                          size_t msglen) {
  json_t *arr = json_is_object(body) ? json_object_get(body, "groups") : NULL;
  long total = 0;
  int rc;

  *ngr = 0;
  if (!arr) {
    *ngr = 1;
    return group_prepare(body, &grs[0], field, msg, msglen);
  }
  *field = "groups";
  if (json_object_size(body) != 1) {
    snprintf(msg, msglen, "a body with \"groups\" holds nothing else: each group is a launch");
    return MUSTER_E_INVALID;
  }
  if (!json_is_array(arr) || json_array_size(arr) < 1 || json_array_size(arr) > LAUNCH_MAX_GROUPS) {
    snprintf(msg, msglen, "groups must be an array of 1 to %d launch objects", LAUNCH_MAX_GROUPS);
    return MUSTER_E_INVALID;
  }
  for (size_t i = 0; i < json_array_size(arr); i++) {
    rc = group_prepare(json_array_get(arr, i), &grs[i], field, msg, msglen);
    *ngr = (int)i + 1;
    if (rc) {
      char inner[640];
      snprintf(inner, sizeof(inner), "%.600s", msg);
      snprintf(msg, msglen, "groups[%zu]: %.500s", i, inner);
      return rc;
    }
    total += grs[i].lr.n;
    if (strcmp(grs[i].lr.session, grs[0].lr.session) != 0 || total > LAUNCH_MAX_N) {
      *field = "groups";
      snprintf(msg, msglen,
               total > LAUNCH_MAX_N ? "groups ask for more than %d workers in all"
                                    : "the groups of one launch share one session",
               LAUNCH_MAX_N);
      return MUSTER_E_INVALID;
    }
    if ((grs[i].lr.run == NULL) != (grs[0].lr.run == NULL) ||
        (grs[i].lr.run && strcmp(grs[i].lr.run, grs[0].lr.run) != 0)) {
      *field = "groups";
      snprintf(msg, msglen, "the groups of one launch belong to one run");
      return MUSTER_E_INVALID;
    }
  }
  return 0;
}

enum MHD_Result api_launch(struct MHD_Connection *c, struct req *rq, const char *arg) {
  (void)arg;
  struct group grs[LAUNCH_MAX_GROUPS];
  char launch[16];
  const char *field = NULL, *session;
  char msg[640], master_ip[64];
  json_t *body, *out = NULL;
  enum MHD_Result ret = MHD_NO;
  long total = 0;
  int rc, ngr = 0;

  memset(grs, 0, sizeof(grs));
  body = api_parse_body(c, rq, &ret);
  if (!body)
    return ret;
  rc = groups_prepare(body, grs, &ngr, &field, msg, sizeof(msg));
  if (rc) {
    ret = api_respond_error(c, rc, field, "%s", msg);
    goto out;
  }
  session = grs[0].lr.session;
  client_ip(c, master_ip, sizeof(master_ip));
  memcpy(launch, "l-", 2);
  if (util_random_alnum(launch + 2, 10) != 0) {
    ret = api_respond_error(c, MUSTER_E_INTERNAL, NULL, "no random bytes for the launch id");
    goto out;
  }

  state_lock();
  if (g.shutting_down) {
    state_unlock();
    ret = api_respond_error(c, MUSTER_E_SHUTTING_DOWN, NULL, NULL);
    goto out;
  }
  rc = db_begin(g.db);
  if (!rc)
    rc = db_session_touch(g.db, session, master_ip);
  if (!rc && grs[0].lr.run) {
    char st[16], run_session[72];
    int rrc = db_run_state(g.db, grs[0].lr.run, st, sizeof(st), run_session, sizeof(run_session));
    if (rrc == 0 && strcmp(st, "running") != 0)
      snprintf(msg, sizeof(msg), "run %s has ended (%s): it takes no more workers", grs[0].lr.run,
               st);
    else if (rrc == 0 && strcmp(run_session, session) != 0)
      snprintf(msg, sizeof(msg), "run %s belongs to session %s, not %s", grs[0].lr.run, run_session,
               session);
    else if (rrc == MUSTER_E_NOT_FOUND)
      snprintf(msg, sizeof(msg), "there is no run %s", grs[0].lr.run);
    else
      msg[0] = '\0';
    if (rrc == MUSTER_E_DB || msg[0]) {
      db_rollback(g.db);
      state_unlock();
      ret = rrc == MUSTER_E_DB
                ? api_respond_error(c, MUSTER_E_DB, NULL, "could not read the run")
                : api_respond_error(c,
                                    rrc == 0 && strcmp(st, "running") != 0 ? MUSTER_E_CONFLICT
                                                                           : MUSTER_E_INVALID,
                                    "run", "%s", msg);
      goto out;
    }
  }
  for (int k = 0; !rc && k < ngr; k++) {
    const struct group *gr = &grs[k];
    for (long i = 0; !rc && i < gr->lr.n; i++) {
      struct db_worker_new w = {.id = gr->ids[i],
                                .session = session,
                                .name = gr->lr.name,
                                .role = gr->lr.role,
                                .cpu = gr->lr.cpu,
                                .memory = gr->lr.memory,
                                .nvidia_gpu = gr->lr.nvidia_gpu,
                                .script = gr->lr.script,
                                .code = gr->lr.code,
                                .kernel = gr->lr.kernel,
                                .command_json = gr->command,
                                .args_json = gr->args,
                                .env_json = gr->env,
                                .secret_env_json = gr->secret,
                                .token = gr->tokens[i],
                                .master_ip = master_ip,
                                .backend = g.cfg.backend,
                                .launch_id = launch,
                                .run = grs[0].lr.run};
      rc = db_worker_insert(g.db, &w);
    }
  }
  if (!rc)
    rc = db_commit(g.db);
  if (rc) {
    LOG(LOG_ERROR, "launch failed: %s", db_errmsg(g.db));
    db_rollback(g.db);
    state_unlock();
    ret = api_respond_error(c, MUSTER_E_DB, NULL,
                            "the launch could not be stored; nothing was launched");
    goto out;
  }
  for (int k = 0; k < ngr; k++)
    for (long i = 0; i < grs[k].lr.n; i++)
      if (lw_add_locked(grs[k].ids[i], grs[k].tokens[i], session, launch, &grs[k].req) != 0)
        LOG(LOG_ERROR, "out of memory tracking %s", grs[k].ids[i]);
  streams_wake_events_locked();
  state_kick_locked();
  state_unlock();
  out = json_array();
  {
    struct reader *r = api_reader_get();
    for (int k = 0; k < ngr; k++)
      for (long i = 0; i < grs[k].lr.n; i++)
        json_array_append_new(out, db_worker_json(r->db, grs[k].ids[i]));
    api_reader_put(r);
  }
  for (int k = 0; k < ngr; k++)
    total += grs[k].lr.n;
  LOG(LOG_INFO, "launched %ld worker(s)%s in session %s", total, ngr > 1 ? " in groups" : "",
      session);
  ret = api_respond_json(c, MHD_HTTP_CREATED, json_pack("{s:o}", "workers", out));

out:
  json_decref(body);
  for (int k = 0; k < ngr; k++)
    group_cleanup(&grs[k]);
  return ret;
}

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

/* See api_internal.h. */
int api_page_params(struct MHD_Connection *c, int *limit, int64_t *before, enum MHD_Result *ret) {
  const char *l = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "limit");
  const char *b = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "before");
  long v;

  *limit = 500;
  *before = 0;
  if (l) {
    if (util_parse_long(l, 1, 5000, &v) != 0) {
      *ret = api_respond_error(c, MUSTER_E_INVALID, "limit", "limit must be 1 to 5000");
      return -1;
    }
    *limit = (int)v;
  }
  if (b && *b) {
    if (util_parse_long(b, 1, 0x7fffffffffffffffL, &v) != 0) {
      *ret = api_respond_error(c, MUSTER_E_INVALID, "before",
                               "before must be the \"next\" cursor of an earlier page");
      return -1;
    }
    *before = v;
  }
  return 0;
}

enum MHD_Result api_list(struct MHD_Connection *c, struct req *rq, const char *arg) {
  (void)rq;
  (void)arg;
  struct list_query q = {json_array(), NULL};
  const char *session = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "session");
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
  rc = db_worker_page(rd->db, statuses, session, role, run, before, limit, ids, &n, &next);
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

/* ---- GET /api/v1/workers/{id}, DELETE, POST stop ---- */

enum MHD_Result api_get(struct MHD_Connection *c, struct req *rq, const char *id) {
  (void)rq;
  struct reader *rd = api_reader_get();
  size_t len;
  char *text = api_worker_text(rd, id, &len);

  api_reader_put(rd);
  if (!text)
    return api_respond_error(c, MUSTER_E_NOT_FOUND, "id", "there is no worker %s", id);
  return api_respond_text(c, MHD_HTTP_OK, text, len);
}

enum MHD_Result api_delete(struct MHD_Connection *c, struct req *rq, const char *id) {
  (void)rq;
  char ids[1][16];
  json_t *w = api_worker_read(id);
  int rc;

  if (!w)
    return api_respond_error(c, MUSTER_E_NOT_FOUND, "id", "there is no worker %s", id);
  json_decref(w);
  snprintf(ids[0], sizeof(ids[0]), "%s", id);
  state_lock();
  rc = sm_stop_many_locked(ids, 1, "stopped by the user", NULL);
  state_unlock();
  if (rc)
    return api_respond_error(c, rc, NULL, "could not stop %s", id);
  w = api_worker_read(id);
  return w ? api_respond_json(c, MHD_HTTP_OK, w) : api_respond_error(c, MUSTER_E_DB, NULL, NULL);
}

/* The worker id of an ids[] item: an id, or a worker object (borrowed;
 * NULL if neither). */
static const char *item_id(json_t *item) {
  return json_is_object(item) ? json_string_value(json_object_get(item, "id"))
                              : json_string_value(item);
}

enum MHD_Result api_stop_workers(struct MHD_Connection *c, struct req *rq, const char *arg) {
  (void)arg;
  json_t *body = NULL, *ids, *item, *out = json_array();
  const char *session = "default";
  char(*targets)[16] = NULL;
  enum MHD_Result ret = MHD_NO;
  struct reader *rd;
  size_t i;
  int n = 0, rc = 0;

  if (rq->len) {
    body = api_parse_body(c, rq, &ret);
    if (!body)
      goto out;
  }
  ids = body ? json_object_get(body, "ids") : NULL;
  if (body && json_object_get(body, "session")) {
    session = json_string_value(json_object_get(body, "session"));
    if (!validate_name(session)) {
      ret = api_respond_error(c, MUSTER_E_INVALID, "session",
                              "session must be 1 to 64 letters, digits, '_', '.' or '-'");
      goto out;
    }
  }
  if (ids && !json_is_null(ids) && !json_is_array(ids)) {
    ret = api_respond_error(c, MUSTER_E_INVALID, "ids", "ids must be an array of worker ids");
    goto out;
  }
  if (json_array_size(ids) > 100000) {
    ret = api_respond_error(c, MUSTER_E_INVALID, "ids", "ids may name at most 100000 workers");
    goto out;
  }
  json_array_foreach(ids, i, item) {
    const char *id = item_id(item);
    if (!validate_worker_id(id)) {
      ret = api_respond_error(c, MUSTER_E_INVALID, "ids", "ids[%zu] is not a worker id", i);
      goto out;
    }
  }
  rd = api_reader_get();
  json_array_foreach(ids, i, item) {
    const char *id = item_id(item);
    json_t *w = db_worker_json(rd->db, id);
    if (!w) {
      api_reader_put(rd);
      ret = api_respond_error(c, MUSTER_E_NOT_FOUND, "ids", "there is no worker %s", id);
      goto out;
    }
    json_decref(w);
  }
  api_reader_put(rd);

  state_lock();
  n = (int)json_array_size(ids);
  if (n == 0)
    for (struct lw *w = g.head; w; w = w->next)
      n += strcmp(w->session, session) == 0;
  targets = calloc((size_t)n + 1, sizeof(*targets));
  if (!targets) {
    state_unlock();
    ret = api_respond_error(c, MUSTER_E_NOMEM, NULL, NULL);
    goto out;
  }
  if (json_array_size(ids)) {
    json_array_foreach(ids, i, item) {
      const char *id = item_id(item);
      snprintf(targets[i], sizeof(targets[i]), "%s", id);
    }
  } else {
    int k = 0;
    /* Every live worker of the session. */
    for (struct lw *w = g.head; w; w = w->next)
      if (strcmp(w->session, session) == 0)
        snprintf(targets[k++], sizeof(targets[0]), "%s", w->id);
  }
  /* One transaction for all of them, however many. */
  rc = sm_stop_many_locked(targets, n, "stopped by the user", NULL);
  state_unlock();
  if (rc) {
    ret = api_respond_error(c, rc, NULL, "could not stop the workers; none was stopped");
    goto out;
  }
  rd = api_reader_get();
  for (int k = 0; k < n; k++)
    json_array_append_new(out, db_worker_json(rd->db, targets[k]));
  api_reader_put(rd);
  ret = api_respond_json(c, MHD_HTTP_OK, json_pack("{s:O}", "workers", out));

out:
  free(targets);
  json_decref(out);
  json_decref(body);
  return ret;
}

/* ---- GET /api/v1/sessions/{name} ---- */

enum MHD_Result api_session(struct MHD_Connection *c, struct req *rq, const char *name) {
  (void)rq;
  struct reader *rd;
  json_t *o;

  if (!validate_name(name))
    return api_respond_error(c, MUSTER_E_NOT_FOUND, "name", "\"%.64s\" is not a session name",
                             name);
  rd = api_reader_get();
  o = db_session_json(rd->db, name);
  api_reader_put(rd);
  if (!o)
    return api_respond_error(c, MUSTER_E_NOT_FOUND, "name",
                             "there is no session %s (a session exists once it has launched)",
                             name);
  state_lock();
  json_object_set_new(o, "lease", lease_json_locked(name));
  state_unlock();
  return api_respond_json(c, MHD_HTTP_OK, o);
}

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

void api_waiter_free(struct waiter *wt) {
  if (!wt)
    return;
  free(wt->ids);
  free(wt->done);
  free(wt);
}

/* Finishes a resumed await: its waiter is ready. */
enum MHD_Result api_await_finish(struct MHD_Connection *c, struct req *rq) {
  struct waiter *wt = rq->waiter;
  json_t *ids = json_array(), *answer;
  int shutting, gone, timed_out;

  state_lock();
  waiter_remove_locked(wt);
  shutting = g.shutting_down && wt->pending > 0 && !wt->timed_out;
  gone = wt->client_gone;
  timed_out = wt->timed_out && wt->pending > 0;
  state_unlock();
  rq->waiter = NULL;
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

enum MHD_Result api_await(struct MHD_Connection *c, struct req *rq, const char *arg) {
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
  }
  if (!wt || !wt->ids || !wt->done) {
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
    if (w) {
      st = w->status;
    } else {
      struct db_worker_info info;
      if (db_worker_info(g.db, id, &info) != 0) {
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
  rq->waiter = wt;
  waiter_add_locked(wt);
  MHD_suspend_connection(c);
  if (wt->deadline_ms)
    pthread_cond_signal(&g.kick); /* the monitor must learn the new deadline */
  state_unlock();
  json_decref(ar.ids);
  return MHD_YES;
}

/* ---- health, metrics, web UI ---- */

enum MHD_Result api_health(struct MHD_Connection *c, struct req *rq, const char *arg) {
  (void)rq;
  (void)arg;
  json_t *counts;
  int shutting;

  struct reader *rd = api_reader_get();

  counts = db_status_counts(rd->db);
  api_reader_put(rd);
  shutting = g.shutting_down;
  return api_respond_json(
      c, shutting ? MHD_HTTP_SERVICE_UNAVAILABLE : MHD_HTTP_OK,
      json_pack("{s:s, s:s, s:s, s:s, s:o}", "status", shutting ? "shutting_down" : "ok", "version",
                MUSTER_VERSION, "backend", g.cfg.backend, "isolation",
                g.backend->isolation ? g.backend->isolation() : "none", "workers", counts));
}

/* One live worker's usage, as three labelled samples (their HELP and TYPE
 * lines come first, from api_metrics). */
struct usage_lines {
  FILE *cpu, *mem, *peak;
};

static void usage_line(void *arg, const char *id, const struct db_usage *u) {
  struct usage_lines *l = arg;

  /* (a counter the host lacks is -1: no sample) */
  if (u->cpu_seconds >= 0)
    fprintf(l->cpu, "muster_worker_cpu_seconds{id=\"%s\"} %.3f\n", id, u->cpu_seconds);
  if (u->memory_bytes >= 0)
    fprintf(l->mem, "muster_worker_memory_bytes{id=\"%s\"} %lld\n", id, u->memory_bytes);
  if (u->memory_peak_bytes >= 0)
    fprintf(l->peak, "muster_worker_memory_peak_bytes{id=\"%s\"} %lld\n", id, u->memory_peak_bytes);
}

static void lease_line(void *arg, const char *session, double ttl, double left) {
  (void)ttl;
  /* Session names are [A-Za-z0-9_.-]: nothing to escape. */
  fprintf(arg, "muster_session_lease_seconds_left{session=\"%s\"} %.3f\n", session, left);
}

enum MHD_Result api_metrics(struct MHD_Connection *c, struct req *rq, const char *arg) {
  (void)rq;
  (void)arg;
  char *text = NULL;
  size_t len = 0;
  FILE *f = open_memstream(&text, &len);
  struct MHD_Response *r;
  enum MHD_Result ret;
  json_t *counts, *v;
  const char *k;
  int waiters = 0, streams = 0;

  if (!f)
    return MHD_NO;
  struct reader *rd = api_reader_get();
  double cpu_used = 0, cpu_total = 0, mem_used = 0, mem_total = 0;
  char *mem_text = NULL, *peak_text = NULL;
  size_t mem_len = 0, peak_len = 0;
  struct usage_lines ul = {f, open_memstream(&mem_text, &mem_len),
                           open_memstream(&peak_text, &peak_len)};

  counts = db_status_counts(rd->db);
  fprintf(f, "# HELP muster_worker_cpu_seconds CPU time of a live worker's processes.\n"
             "# TYPE muster_worker_cpu_seconds counter\n");
  if (ul.mem && ul.peak)
    db_live_usage(rd->db, usage_line, &ul);
  api_reader_put(rd);
  if (ul.mem && ul.peak) {
    fflush(ul.mem);
    fflush(ul.peak);
    fprintf(f,
            "# HELP muster_worker_memory_bytes Memory a live worker uses.\n"
            "# TYPE muster_worker_memory_bytes gauge\n%s"
            "# HELP muster_worker_memory_peak_bytes The most memory a live worker used.\n"
            "# TYPE muster_worker_memory_peak_bytes gauge\n%s",
            mem_text ? mem_text : "", peak_text ? peak_text : "");
  }
  if (ul.mem)
    fclose(ul.mem);
  if (ul.peak)
    fclose(ul.peak);
  free(mem_text);
  free(peak_text);
  g.backend->usage(&cpu_used, &cpu_total, &mem_used, &mem_total);
  state_lock();
  for (struct waiter *wt = g.waiters; wt; wt = wt->next)
    waiters++;
  for (struct stream *s = g.streams; s; s = s->next)
    streams++;
  fprintf(f, "# HELP muster_session_lease_seconds_left Seconds until a session's lease runs out "
             "(its workers are then stopped).\n"
             "# TYPE muster_session_lease_seconds_left gauge\n");
  leases_each_locked(lease_line, f);
  fprintf(f,
          "# HELP muster_leases_expired_total Leases that ran out since start.\n"
          "# TYPE muster_leases_expired_total counter\nmuster_leases_expired_total %llu\n",
          (unsigned long long)g.leases_expired);
  state_unlock();
  fprintf(f, "# HELP muster_workers Workers by status.\n# TYPE muster_workers gauge\n");
  json_object_foreach(counts, k, v)
      fprintf(f, "muster_workers{status=\"%s\"} %lld\n", k, (long long)json_integer_value(v));
  fprintf(f,
          "# HELP muster_cpu_used Cores held by live workers.\n# TYPE muster_cpu_used gauge\n"
          "muster_cpu_used %g\n",
          cpu_used);
  fprintf(f,
          "# HELP muster_cpu_capacity Cores of the backend.\n"
          "# TYPE muster_cpu_capacity gauge\nmuster_cpu_capacity %g\n",
          cpu_total);
  fprintf(f,
          "# HELP muster_memory_used_gib Memory held by live workers.\n"
          "# TYPE muster_memory_used_gib gauge\nmuster_memory_used_gib %g\n",
          mem_used);
  fprintf(f,
          "# HELP muster_memory_capacity_gib Memory of the backend.\n"
          "# TYPE muster_memory_capacity_gib gauge\nmuster_memory_capacity_gib %g\n",
          mem_total);
  fprintf(f,
          "# HELP muster_transitions_total State changes since start.\n"
          "# TYPE muster_transitions_total counter\nmuster_transitions_total %llu\n",
          (unsigned long long)g.transitions);
  fprintf(f,
          "# HELP muster_http_requests_total Requests since start.\n"
          "# TYPE muster_http_requests_total counter\nmuster_http_requests_total %llu\n",
          (unsigned long long)g.http_requests);
  fprintf(f,
          "# HELP muster_await_waiting Suspended await calls.\n"
          "# TYPE muster_await_waiting gauge\nmuster_await_waiting %d\n",
          waiters);
  fprintf(f,
          "# HELP muster_streams_waiting Open event streams and followed logs.\n"
          "# TYPE muster_streams_waiting gauge\nmuster_streams_waiting %d\n",
          streams);
  json_decref(counts);
  fclose(f);
  r = MHD_create_response_from_buffer(len, text, MHD_RESPMEM_MUST_FREE);
  MHD_add_response_header(r, "Content-Type", "text/plain; version=0.0.4");
  ret = MHD_queue_response(c, MHD_HTTP_OK, r);
  MHD_destroy_response(r);
  return ret;
}

static const char *content_type(const char *path) {
  const char *dot = strrchr(path, '.');

  if (!dot)
    return "application/octet-stream";
  if (strcmp(dot, ".html") == 0)
    return "text/html; charset=utf-8";
  if (strcmp(dot, ".js") == 0 || strcmp(dot, ".mjs") == 0)
    return "text/javascript; charset=utf-8";
  if (strcmp(dot, ".css") == 0)
    return "text/css; charset=utf-8";
  if (strcmp(dot, ".svg") == 0)
    return "image/svg+xml";
  if (strcmp(dot, ".png") == 0)
    return "image/png";
  if (strcmp(dot, ".json") == 0)
    return "application/json";
  return "application/octet-stream";
}

/* Serves a file of the web UI; the UI holds no data, so no token is needed
 * (every API call it makes needs one). */
enum MHD_Result api_static(struct MHD_Connection *c, struct req *rq, const char *url) {
  (void)rq;
  char path[1400];
  struct stat st;
  struct MHD_Response *r;
  enum MHD_Result ret;
  int fd;

  if (strcmp(url, "/") == 0)
    url = "/index.html";
  if (strstr(url, "..") || strlen(url) > 200)
    return api_respond_error(c, MUSTER_E_NOT_FOUND, NULL, "no such page");
  snprintf(path, sizeof(path), "%s%s", g.cfg.web_dir, url);
  fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0 || fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    if (fd >= 0)
      close(fd);
    return api_respond_error(c, MUSTER_E_NOT_FOUND, NULL, "no such page: %s", url);
  }
  r = MHD_create_response_from_fd64((uint64_t)st.st_size, fd);
  if (!r) {
    close(fd);
    return MHD_NO;
  }
  MHD_add_response_header(r, "Content-Type", content_type(path));
  ret = MHD_queue_response(c, MHD_HTTP_OK, r);
  MHD_destroy_response(r);
  return ret;
}
