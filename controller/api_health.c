/* api_health.c: GET /api/v1/health and GET /metrics (Prometheus' text
 * format). See api_internal.h. */
#include "api_internal.h"

#include "api_guard.h"
#include "users.h"

#include "backend.h"
#include "checkpoint.h"
#include "lease.h"
#include "network.h"
#include "state.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---- health, metrics ---- */

/* Workers by status, a new JSON object {status: count}: the live ones as
 * the state module counts them, the ended ones from the database. */
static json_t *status_counts(struct reader *rd) {
  json_t *counts = db_ended_counts(rd->db);
  long live[WS_LIVE_N];

  state_live_counts(live);
  for (int s = 0; s < WS_LIVE_N; s++)
    json_object_set_new(counts, ws_name((enum wstatus)s), json_integer(live[s]));
  return counts;
}

static enum MHD_Result api_health(struct MHD_Connection *c, struct req *rq, const char *arg) {
  (void)rq;
  (void)arg;
  json_t *counts;
  int shutting;
  char dir[2 * PATH_MAX], token_file[2 * PATH_MAX + 8];

  /* Where the API token is kept, for the web UI's sign-in page (which has
   * no token yet): a path, never the token. Absolute where it resolves, so
   * that a controller started with a relative --state-dir names it fully. */
  if (!realpath(g.cfg.state_dir, dir)) {
    char cwd[PATH_MAX];

    /* Removed since the start, say: still an absolute path, as promised. */
    if (g.cfg.state_dir[0] != '/' && getcwd(cwd, sizeof(cwd)))
      snprintf(dir, sizeof(dir), "%s/%s", cwd, g.cfg.state_dir);
    else
      snprintf(dir, sizeof(dir), "%s", g.cfg.state_dir);
  }
  snprintf(token_file, sizeof(token_file), "%s/token", dir);

  struct reader *rd = api_reader_get();

  counts = status_counts(rd);
  api_reader_put(rd);
  shutting = g.shutting_down;
  return api_respond_json(
      c, shutting ? MHD_HTTP_SERVICE_UNAVAILABLE : MHD_HTTP_OK,
      json_pack("{s:s, s:s, s:s, s:s, s:o, s:s, s:o, s:s, s:o}", "status",
                shutting ? "shutting_down" : "ok", "version", MUSTER_VERSION, "backend",
                g.cfg.backend, "isolation", g.backend->isolation ? g.backend->isolation() : "none",
                "workers", counts, "token_file", token_file, "run_as",
                g.cfg.run_as[0] ? json_string(g.cfg.run_as) : json_null(), "network", net_mode(),
                "network_reason", net_reason() ? json_string(net_reason()) : json_null()));
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

static void lease_line(void *arg, const char *session, double ttl, double left, int stops) {
  (void)ttl;
  /* Only a lease that keeps the session's workers: one whose parts bind
   * runs only stops nothing when it runs out. */
  if (!stops)
    return;
  /* Session names are [A-Za-z0-9_.-]: nothing to escape. */
  fprintf(arg, "muster_session_lease_seconds_left{session=\"%s\"} %.3f\n", session, left);
}

/* What every user's live workers hold, gathered for /metrics. */
struct user_rows {
  struct {
    char user[USER_NAME_MAX + 1];
    struct user_usage u;
  } * rows;
  size_t n;
};

static void user_usage_row(void *arg, const char *user, const struct user_usage *u) {
  struct user_rows *ur = arg;
  void *grown = realloc(ur->rows, (ur->n + 1) * sizeof(*ur->rows));

  if (!grown)
    return;
  ur->rows = grown;
  snprintf(ur->rows[ur->n].user, sizeof(ur->rows[ur->n].user), "%s", user);
  ur->rows[ur->n++].u = *u;
}

static enum MHD_Result api_metrics(struct MHD_Connection *c, struct req *rq, const char *arg) {
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
  struct api_guard_stats gs;
  struct checkpoint_stats ckst;
  uint64_t exec_refused, hb_calls, hb_vouched;

  if (!f)
    return MHD_NO;
  struct reader *rd = api_reader_get();
  double cpu_used = 0, cpu_total = 0, mem_used = 0, mem_total = 0;
  char *mem_text = NULL, *peak_text = NULL;
  size_t mem_len = 0, peak_len = 0;
  struct usage_lines ul = {f, open_memstream(&mem_text, &mem_len),
                           open_memstream(&peak_text, &peak_len)};

  counts = status_counts(rd);
  fprintf(f, "# HELP muster_worker_cpu_seconds CPU time of a live worker's processes.\n"
             "# TYPE muster_worker_cpu_seconds counter\n");
  if (ul.mem && ul.peak)
    db_live_usage(rd->db, usage_line, &ul);
  {
    /* Each metric's lines together, as Prometheus's text format wants. */
    struct user_rows ur = {NULL, 0};

    /* (the sums the live table keeps: no row is read) */
    state_lock();
    user_live_each_locked(user_usage_row, &ur);
    state_unlock();
    {
      static const char *const names[] = {"muster_user_cpu", "muster_user_memory_gib",
                                          "muster_user_gpus", "muster_user_workers"};
      static const char *const help[] = {
          "Cores a user's live workers hold.", "Memory (GiB) a user's live workers hold.",
          "GPUs a user's live workers hold.", "A user's live workers."};
      for (int m = 0; m < 4; m++) {
        fprintf(f, "# HELP %s %s\n# TYPE %s gauge\n", names[m], help[m], names[m]);
        for (size_t i = 0; i < ur.n; i++) {
          const struct user_usage *u = &ur.rows[i].u;
          double v = m == 0   ? u->cpu
                     : m == 1 ? u->memory
                     : m == 2 ? (double)u->gpus
                              : (double)u->workers;
          fprintf(f, "%s{user=\"%s\"} %g\n", names[m], ur.rows[i].user, v);
        }
      }
    }
    free(ur.rows);
  }
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
  exec_refused = g.exec_refused;
  hb_calls = g.hb_calls;
  hb_vouched = g.hb_vouched;
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
  api_guard_stats(&gs);
  fprintf(f,
          "# HELP muster_http_connections Open connections to the API.\n"
          "# TYPE muster_http_connections gauge\nmuster_http_connections %ld\n"
          "# HELP muster_http_connections_unauthenticated Open connections that no token has "
          "held on yet.\n"
          "# TYPE muster_http_connections_unauthenticated gauge\n"
          "muster_http_connections_unauthenticated %ld\n"
          "# HELP muster_http_connections_closed_total Unauthenticated connections closed to make "
          "room or past their grace.\n"
          "# TYPE muster_http_connections_closed_total counter\n"
          "muster_http_connections_closed_total %llu\n"
          "# HELP muster_http_connections_refused_total Connections refused at the limit.\n"
          "# TYPE muster_http_connections_refused_total counter\n"
          "muster_http_connections_refused_total %llu\n",
          gs.open, gs.unauthenticated, (unsigned long long)gs.closed_unauthenticated,
          (unsigned long long)gs.refused);
  fprintf(f,
          "# HELP muster_exec_refused_total Exec connections the workers refused before their "
          "token held (as their heartbeats said).\n"
          "# TYPE muster_exec_refused_total counter\nmuster_exec_refused_total %llu\n",
          (unsigned long long)exec_refused);
  fprintf(f,
          "# HELP muster_heartbeat_calls_total Heartbeat calls answered (each a workerd's own).\n"
          "# TYPE muster_heartbeat_calls_total counter\nmuster_heartbeat_calls_total %llu\n"
          "# HELP muster_heartbeats_vouched_total Heartbeats one workerd's call carried for "
          "another worker of its host.\n"
          "# TYPE muster_heartbeats_vouched_total counter\nmuster_heartbeats_vouched_total %llu\n",
          (unsigned long long)hb_calls, (unsigned long long)hb_vouched);
  fprintf(f,
          "# HELP muster_unserved_seconds_total Time the controller could not serve, given back "
          "to leases and heartbeat timeouts.\n"
          "# TYPE muster_unserved_seconds_total counter\nmuster_unserved_seconds_total %.3f\n",
          (double)__atomic_load_n(&g.unserved_ms, __ATOMIC_RELAXED) / 1000.0);
  checkpointer_stats(&ckst);
  fprintf(f,
          "# HELP muster_db_log_frames The database's write-ahead log at the checkpointer's last "
          "look: pages written since it last started over.\n"
          "# TYPE muster_db_log_frames gauge\nmuster_db_log_frames %lld\n"
          "# HELP muster_db_log_checkpointed_frames Of those, the ones copied into the database "
          "by then.\n"
          "# TYPE muster_db_log_checkpointed_frames gauge\n"
          "muster_db_log_checkpointed_frames %lld\n",
          ckst.log_frames, ckst.checkpointed_frames);
  fprintf(f,
          "# HELP muster_heartbeat_interval_seconds The heartbeat interval workers are told now "
          "(stretched past --heartbeat-interval to keep all within --heartbeat-rate).\n"
          "# TYPE muster_heartbeat_interval_seconds gauge\n"
          "muster_heartbeat_interval_seconds %g\n",
          (double)hb_interval_now_ms() / 1000.0);
  fprintf(f,
          "# HELP muster_await_waiting Await calls parked, waiting for their workers.\n"
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

/* The routes of this file (api_routes.c lists the table). */
const struct api_route api_health_routes[] = {
    {"GET", "/api/v1/health", AUTH_NONE, api_health, NULL},
    {"GET", "/metrics", AUTH_NONE, api_metrics, NULL},
    {NULL, NULL, AUTH_NONE, NULL, NULL},
};
