/* api_launch.c: POST /api/v1/workers, a launch (of one shape, or of
 * groups started as one gang). See api_internal.h. */
#include "api_internal.h"
#include "api_scope.h"
#include "session_name.h"

#include "backend.h"
#include "log.h"
#include "muster_errors.h"
#include "resources.h"
#include "state.h"
#include "users.h"
#include "util.h"
#include "validate.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

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

/* One resource of a gang's sum, in words: each group's count times its
 * share ("3 workers × 1 core"), joined by " + ", into buf. Only whole terms
 * are written: where the next would not fit, the rest are counted instead
 * (" + 5 more groups"), so the text is never cut inside a term, or inside
 * the two bytes of "×" (invalid UTF-8 has no JSON string). */
static void gang_terms(const struct group *grs, int ngr, int what, char *buf, size_t len) {
  /* Room kept for " + 16 more groups" after the last whole term. */
  const size_t tail = 32;
  size_t used = 0;

  buf[0] = '\0';
  for (int k = 0; k < ngr; k++) {
    const struct launch_req *lr = &grs[k].lr;
    const char *role = lr->role && *lr->role ? lr->role : "worker";
    size_t rl = strlen(role);
    char each[48], term[160];
    int tl;
    if (what == 0)
      res_words_cores(lr->cpu, each, sizeof(each));
    else if (what == 1)
      res_words_gib(lr->memory, each, sizeof(each));
    else
      res_words_gpus(lr->nvidia_gpu, each, sizeof(each));
    tl = snprintf(term, sizeof(term), "%s%ld %.40s%s × %s", k ? " + " : "", lr->n, role,
                  lr->n == 1 || (rl && role[rl - 1] == 's') ? "" : "s", each);
    if (tl < 0 || (size_t)tl >= sizeof(term) ||
        used + (size_t)tl + (k + 1 < ngr ? tail : 0) >= len) {
      snprintf(buf + used, len - used, " + %d more group%s", ngr - k, ngr - k == 1 ? "" : "s");
      return;
    }
    memcpy(buf + used, term, (size_t)tl + 1);
    used += (size_t)tl;
  }
}

/* A gang's workers must all run at once: 0 if together they could fit the
 * backend when it is empty (or where the backend does not know its size),
 * else MUSTER_E_CAPACITY with *field naming the resource and the arithmetic
 * in msg ("3 workers × 1 core = 3 cores, but this host has 2 cores in
 * all"). */
static int gang_could_ever_fit(const struct group *grs, int ngr, const char **field, char *msg,
                               size_t msglen) {
  struct backend_capacity cap = {0};
  double cpu = 0, memory = 0;
  long ngpu = 0, n = 0;
  char terms[400], sum[48], all[48], sum_n[32], all_n[32];
  int what;

  if (!g.backend->capacity || !g.backend->capacity(&cap))
    return 0;
  for (int k = 0; k < ngr; k++) {
    cpu += (double)grs[k].lr.n * grs[k].lr.cpu;
    memory += (double)grs[k].lr.n * grs[k].lr.memory;
    ngpu += grs[k].lr.n * grs[k].lr.nvidia_gpu;
    n += grs[k].lr.n;
  }
  if (n > cap.workers) {
    *field = "n";
    snprintf(msg, msglen, "%ld workers must run at once, but %s holds at most %ld live workers", n,
             cap.where, cap.workers);
    return MUSTER_E_CAPACITY;
  }
  /* The same slack as admission's, for fractional cores. */
  if (cpu > cap.cpu + 1e-9) {
    what = 0;
    *field = "cpu";
    res_words_apart(cpu, cap.cpu, sum_n, all_n, sizeof(sum_n));
    res_words_cores_of(sum_n, sum, sizeof(sum));
    res_words_cores_of(all_n, all, sizeof(all));
  } else if (memory > cap.memory + 1e-9) {
    what = 1;
    *field = "memory";
    res_words_apart(memory, cap.memory, sum_n, all_n, sizeof(sum_n));
    snprintf(sum, sizeof(sum), "%s GiB", sum_n);
    snprintf(all, sizeof(all), "%s GiB", all_n);
  } else if (ngpu > cap.ngpu) {
    what = 2;
    *field = "nvidia_gpu";
    res_words_gpus(ngpu, sum, sizeof(sum));
    res_words_gpus(cap.ngpu, all, sizeof(all));
  } else {
    return 0;
  }
  gang_terms(grs, ngr, what, terms, sizeof(terms));
  snprintf(msg, msglen,
           "%s = %s, but %s has %s%s in all; the workers of %s must run at once, so they can "
           "never start",
           terms, sum, cap.where, all, what == 1 ? " of memory" : "",
           grs[0].lr.run ? "a run" : "a launch of groups");
  return MUSTER_E_CAPACITY;
}

static enum MHD_Result api_launch(struct MHD_Connection *c, struct req *rq, const char *arg) {
  (void)arg;
  struct group grs[LAUNCH_MAX_GROUPS];
  char launch[16];
  const char *field = NULL, *session;
  char msg[640], master_ip[64], stored[SESSION_STORED_MAX];
  json_t *body, *out = NULL;
  enum MHD_Result ret = MHD_NO;
  struct lw **held = NULL; /* the live table's entries, reserved before the commit */
  long total = 0, nheld = 0;
  int rc, ngr = 0;

  memset(grs, 0, sizeof(grs));
  body = api_parse_body(c, rq, &ret);
  if (!body)
    return ret;
  rc = groups_prepare(body, grs, &ngr, &field, msg, sizeof(msg));
  /* A gang (a launch of groups, or a run's workers) is refused at once
   * when it could never run together; a plain launch's workers may wait
   * for each other's room (docs/design.md, "Gangs"). */
  if (!rc && (json_object_get(body, "groups") || grs[0].lr.run))
    rc = gang_could_ever_fit(grs, ngr, &field, msg, sizeof(msg));
  if (rc) {
    ret = api_respond_error(c, rc, field, "%s", msg);
    goto out;
  }
  /* The session as stored: a user's own (api_scope.h). */
  rc = api_session_scope(rq, grs[0].lr.session, stored, sizeof(stored));
  if (rc) {
    ret = api_respond_error(c, rc, "session",
                            rc == MUSTER_E_NOT_FOUND ? "there is no session %.80s"
                                                     : "\"%.80s\" is not a session's name",
                            grs[0].lr.session);
    goto out;
  }
  session = stored;
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
  /* A user's limits, with the admission (under the same lock as every
   * other launch): what their live workers hold and what this one asks. */
  if (rq->who.name[0]) {
    double cpu = 0, memory = 0;
    long gpus = 0, workers = 0;

    for (int k = 0; k < ngr; k++) {
      cpu += grs[k].lr.cpu * (double)grs[k].lr.n;
      memory += grs[k].lr.memory * (double)grs[k].lr.n;
      gpus += (long)grs[k].lr.nvidia_gpu * grs[k].lr.n;
      workers += grs[k].lr.n;
    }
    rc = quota_check_locked(g.db, rq->who.name, cpu, memory, gpus, workers, &field, msg,
                            sizeof(msg));
    if (rc) {
      state_unlock();
      ret = rc == MUSTER_E_DB ? api_respond_error(c, rc, NULL, "could not read the user's limits")
                              : api_respond_error(c, rc, field, "%s", msg);
      goto out;
    }
  }
  /* Every worker's entry in the live table is allocated before its row
   * is stored: once the rows are committed, nothing may fail, or they
   * would stay `scheduling` with nothing in memory to start them. */
  for (int k = 0; k < ngr; k++)
    total += grs[k].lr.n;
  held = calloc((size_t)total, sizeof(*held));
  for (nheld = 0; held && nheld < total; nheld++)
    if (!(held[nheld] = lw_reserve_locked(rq->who.name)))
      break;
  if (nheld < total) {
    state_unlock();
    ret = api_respond_error(c, MUSTER_E_NOMEM, NULL,
                            "the controller is out of memory; nothing was launched");
    goto out;
  }
  rc = db_begin(g.db);
  if (!rc)
    rc = db_session_touch(g.db, session, master_ip);
  if (!rc && grs[0].lr.run) {
    char st[16], run_session[SESSION_STORED_MAX];
    int rrc = db_run_state(g.db, grs[0].lr.run, st, sizeof(st), run_session, sizeof(run_session));
    if (rrc == 0 && !api_sees_session(rq, run_session))
      rrc = MUSTER_E_NOT_FOUND; /* another user's run: as if there were none */
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
                                .run = grs[0].lr.run,
                                .cwd = gr->lr.cwd,
                                .path = gr->lr.path,
                                .owner = rq->who.name[0] ? rq->who.name : NULL};
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
  nheld = 0; /* (each one the table's now) */
  for (int k = 0, at = 0; k < ngr; k++)
    for (long i = 0; i < grs[k].lr.n; i++)
      lw_link_locked(held[at++], grs[k].ids[i], grs[k].tokens[i], session, launch, &grs[k].req);
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
  LOG(LOG_INFO, "launched %ld worker(s)%s in session %s", total, ngr > 1 ? " in groups" : "",
      session);
  ret = api_respond_json(c, MHD_HTTP_CREATED, json_pack("{s:o}", "workers", out));

out:
  for (long i = 0; i < nheld; i++)
    lw_unreserve(held[i]);
  free(held);
  json_decref(body);
  for (int k = 0; k < ngr; k++)
    group_cleanup(&grs[k]);
  return ret;
}

/* The routes of this file (api_routes.c lists the table). */
const struct api_route api_launch_routes[] = {
    {"POST", "/api/v1/workers", AUTH_CLIENT, api_launch, NULL},
    {NULL, NULL, AUTH_NONE, NULL, NULL},
};
