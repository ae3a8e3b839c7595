/* db_workers.c: the workers' rows: a launch's insert, state transitions
 * with their events, field updates, and the reads (the API's object, pages
 * of ids, the facts the controller keeps). See db.h. */
#include "db_internal.h"
#include "users.h"

#include "muster_errors.h"
#include "muster_status.h"
#include "util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int db_worker_set_run(struct db *db, const char *id, const char *run) {
  sqlite3_stmt *s = db_stmt(db, ST_SET_RUN);
  int rc;

  db_bind_text_or_null(s, 1, id);
  db_bind_text_or_null(s, 2, run);
  rc = db_exec_write(db, s, id);
  if (!rc && sqlite3_changes(db->conn) != 1)
    rc = MUSTER_E_CONFLICT;
  return rc;
}

static int event_insert(struct db *db, const char *id, const char *at, const char *from,
                        const char *to, const char *detail) {
  sqlite3_stmt *s = db_stmt(db, ST_EVENT_INSERT);

  db_bind_text_or_null(s, 1, id);
  db_bind_text_or_null(s, 2, at);
  db_bind_text_or_null(s, 3, from);
  db_bind_text_or_null(s, 4, to);
  db_bind_text_or_null(s, 5, detail);
  return db_exec_stmt(s);
}

int db_worker_insert(struct db *db, const struct db_worker_new *w) {
  sqlite3_stmt *s = db_stmt(db, ST_WORKER_INSERT);
  char now[32];
  int rc;

  util_now_iso(now, sizeof(now));
  db_bind_text_or_null(s, 1, w->id);
  db_bind_text_or_null(s, 2, w->session);
  db_bind_text_or_null(s, 3, w->name);
  db_bind_text_or_null(s, 4, w->role);
  sqlite3_bind_double(s, 5, w->cpu);
  sqlite3_bind_double(s, 6, w->memory);
  sqlite3_bind_int(s, 7, w->nvidia_gpu);
  db_bind_text_or_null(s, 8, w->script);
  db_bind_text_or_null(s, 9, w->code);
  db_bind_text_or_null(s, 10, w->command_json);
  db_bind_text_or_null(s, 11, w->kernel);
  db_bind_text_or_null(s, 12, w->args_json);
  db_bind_text_or_null(s, 13, w->env_json);
  db_bind_text_or_null(s, 14, w->secret_env_json);
  db_bind_text_or_null(s, 15, w->token);
  db_bind_text_or_null(s, 16, w->master_ip);
  db_bind_text_or_null(s, 17, w->backend);
  db_bind_text_or_null(s, 18, now);
  db_bind_text_or_null(s, 19, w->launch_id);
  db_bind_text_or_null(s, 20, w->run);
  db_bind_text_or_null(s, 21, w->cwd);
  db_bind_text_or_null(s, 22, w->path);
  db_bind_text_or_null(s, 23, w->owner);
  rc = db_exec_stmt(s);
  if (rc)
    return rc;
  {
    /* who launched it (docs/design.md, "Users") */
    char detail[64];
    snprintf(detail, sizeof(detail), "launched by %s", w->owner ? w->owner : USER_BOOTSTRAP);
    return event_insert(db, w->id, now, NULL, "scheduling", detail);
  }
}

int db_worker_transition(struct db *db, const char *id, const char *from, const char *to,
                         const struct db_fields *f, const char *detail) {
  sqlite3_stmt *s = db_stmt(db, ST_TRANSITION);
  char now[32];
  int rc;

  util_now_iso(now, sizeof(now));
  db_bind_text_or_null(s, 1, id);
  db_bind_text_or_null(s, 2, to);
  db_bind_text_or_null(s, 3, f->ip_address);
  db_bind_text_or_null(s, 4, f->hostname);
  db_bind_text_or_null(s, 5, f->backend_ref);
  db_bind_text_or_null(s, 6, f->failure);
  db_bind_int_or_null(s, 7, f->exec_port);
  db_bind_int_or_null(s, 8, f->pid);
  db_bind_int_or_null(s, 9, f->exit_code);
  db_bind_int_or_null(s, 10, f->signal);
  db_bind_text_or_null(s, 11, f->set_running_at ? now : NULL);
  db_bind_text_or_null(s, 12, f->set_finished_at ? now : NULL);
  db_bind_text_or_null(s, 13, f->set_heartbeat ? now : NULL);
  db_bind_text_or_null(s, 14, f->bind_ip);
  db_bind_text_or_null(s, 15, f->gpu_indices);
  db_bind_text_or_null(s, 16, from);
  db_bind_int_or_null(s, 17, f->attempt);
  rc = db_exec_stmt(s);
  if (rc)
    return rc;
  /* The WHERE clause names the expected old status: if the row moved on
   * underneath us, nothing changed and the transition is refused. */
  if (sqlite3_changes(db->conn) != 1)
    return MUSTER_E_CONFLICT;
  db_mark_dirty(db, id);
  return event_insert(db, id, now, from, to, detail);
}

int db_worker_usage(struct db *db, const char *id, const struct db_usage *u) {
  sqlite3_stmt *s = db_stmt(db, ST_USAGE);

  db_bind_text_or_null(s, 1, id);
  sqlite3_bind_double(s, 2, u->cpu_seconds);
  sqlite3_bind_int64(s, 3, u->memory_bytes);
  sqlite3_bind_int64(s, 4, u->memory_peak_bytes);
  return db_exec_write(db, s, id);
}

int db_worker_touch_heartbeat(struct db *db, const char *id, int64_t interval_ms) {
  sqlite3_stmt *s = db_stmt(db, ST_HEARTBEAT);
  char now[32];
  int rc;

  util_now_iso(now, sizeof(now));
  db_bind_text_or_null(s, 1, id);
  db_bind_text_or_null(s, 2, now);
  sqlite3_bind_int64(s, 3, interval_ms);
  rc = db_exec_write(db, s, id);
  return rc;
}

/* Builds the API worker object from a row of WORKER_COLS. New reference. */
static json_t *row_to_worker(sqlite3_stmt *s) {
  json_t *w = json_object();
  json_t *secret = db_col_json(s, 14, json_object());
  json_t *secret_keys = json_array();
  const char *key;
  json_t *val;
  double memory;

  json_object_foreach(secret, key, val) json_array_append_new(secret_keys, json_string(key));
  json_decref(secret);
  memory = sqlite3_column_double(s, 6);

  json_object_set_new(w, "id", db_col_text(s, 0));
  json_object_set_new(w, "session", db_col_text(s, 1));
  json_object_set_new(w, "name", db_col_text(s, 2));
  json_object_set_new(w, "role", db_col_text(s, 3));
  json_object_set_new(w, "status", db_col_text(s, 4));
  json_object_set_new(w, "cpu", json_real(sqlite3_column_double(s, 5)));
  json_object_set_new(w, "memory", json_real(memory));
  json_object_set_new(w, "nvidia_gpu", json_integer(sqlite3_column_int(s, 7)));
  json_object_set_new(w, "script", db_col_text(s, 8));
  json_object_set_new(w, "code", db_col_text(s, 9));
  json_object_set_new(w, "command", db_col_json(s, 10, json_null()));
  json_object_set_new(w, "kernel", db_col_text(s, 11));
  json_object_set_new(w, "args", db_col_json(s, 12, json_array()));
  json_object_set_new(w, "env", db_col_json(s, 13, json_object()));
  json_object_set_new(w, "secret_env", secret_keys);
  json_object_set_new(w, "ip_address", db_col_text(s, 15));
  json_object_set_new(w, "hostname", db_col_text(s, 16));
  json_object_set_new(w, "exec_port", db_col_int(s, 17));
  json_object_set_new(w, "backend", db_col_text(s, 18));
  json_object_set_new(w, "backend_ref", db_col_text(s, 19));
  json_object_set_new(w, "exit_code", db_col_int(s, 20));
  json_object_set_new(w, "signal", db_col_int(s, 26));
  json_object_set_new(w, "failure", db_col_text(s, 21));
  json_object_set_new(w, "created_at", db_col_text(s, 22));
  json_object_set_new(w, "running_at", db_col_text(s, 23));
  json_object_set_new(w, "finished_at", db_col_text(s, 24));
  json_object_set_new(w, "last_heartbeat", db_col_text(s, 25));
  json_object_set_new(w, "attempt", json_integer(sqlite3_column_int(s, 27)));
  json_object_set_new(w, "waiting_for", db_col_text(s, 28));
  /* Filled in by the backends that measure it: null until one did. */
  if (sqlite3_column_type(s, 29) != SQLITE_NULL) {
    /* (a counter the host lacks, as memory.peak before Linux 5.19, is -1: null) */
    double cpu = sqlite3_column_double(s, 29);
    long long mem = sqlite3_column_int64(s, 30), peak = sqlite3_column_int64(s, 31);
    json_object_set_new(w, "usage",
                        json_pack("{s:o, s:o, s:o}", "cpu_seconds",
                                  cpu >= 0 ? json_real(cpu) : json_null(), "memory_bytes",
                                  mem >= 0 ? json_integer(mem) : json_null(), "memory_peak_bytes",
                                  peak >= 0 ? json_integer(peak) : json_null()));
  } else
    json_object_set_new(w, "usage", json_null());
  json_object_set_new(w, "run", db_col_text(s, 32));
  json_object_set_new(w, "cwd", db_col_text(s, 33));
  json_object_set_new(w, "path", db_col_text(s, 34));
  /* who launched it: the bootstrap administrator where no user did */
  json_object_set_new(w, "user",
                      sqlite3_column_type(s, 35) == SQLITE_NULL ? json_string(USER_BOOTSTRAP)
                                                                : db_col_text(s, 35));
  return w;
}

json_t *db_worker_json(struct db *db, const char *id) {
  sqlite3_stmt *s = db_stmt(db, ST_WORKER_GET);
  json_t *w = NULL;

  db_bind_text_or_null(s, 1, id);
  if (sqlite3_step(s) == SQLITE_ROW)
    w = row_to_worker(s);
  sqlite3_reset(s);
  return w;
}

int db_worker_page(struct db *db, const char *statuses_json, const char *session,
                   const char *prefix, const char *role, const char *run, int64_t before, int limit,
                   char (*ids)[16], int *n, int64_t *next) {
  sqlite3_stmt *s = db_stmt(db, ST_WORKER_LIST);

  db_bind_text_or_null(s, 1, statuses_json);
  db_bind_text_or_null(s, 2, session);
  db_bind_text_or_null(s, 7, prefix);
  db_bind_text_or_null(s, 3, role);
  db_bind_text_or_null(s, 6, run);
  sqlite3_bind_int64(s, 4, before > 0 ? before : INT64_MAX);
  /* One row more than asked for tells whether there is a next page. */
  sqlite3_bind_int(s, 5, limit + 1);
  return db_page_ids(s, limit, ids, n, next);
}

/* Column i's text, malloc'ed (NULL if it is NULL); *nomem set when a
 * text could not be copied. */
static char *dup_col(sqlite3_stmt *s, int i, int *nomem) {
  const char *v = (const char *)sqlite3_column_text(s, i);
  char *copy = v ? strdup(v) : NULL;

  if (v && !copy)
    *nomem = 1;
  return copy;
}

static void row_to_info(sqlite3_stmt *s, struct db_worker_info *o) {
  memset(o, 0, sizeof(*o));
  db_copy_col(s, 0, o->id, sizeof(o->id));
  db_copy_col(s, 1, o->status, sizeof(o->status));
  db_copy_col(s, 2, o->token, sizeof(o->token));
  db_copy_col(s, 3, o->session, sizeof(o->session));
  db_copy_col(s, 4, o->master_ip, sizeof(o->master_ip));
  db_copy_col(s, 5, o->bind_ip, sizeof(o->bind_ip));
  db_copy_col(s, 6, o->gpu_indices, sizeof(o->gpu_indices));
  db_copy_col(s, 7, o->kernel, sizeof(o->kernel));
  o->cpu = sqlite3_column_double(s, 8);
  o->memory = sqlite3_column_double(s, 9);
  o->nvidia_gpu = sqlite3_column_int(s, 10);
  o->pid = sqlite3_column_type(s, 11) == SQLITE_NULL ? -1 : sqlite3_column_int64(s, 11);
  o->script = dup_col(s, 12, &o->nomem);
  o->code = dup_col(s, 13, &o->nomem);
  o->command_json = dup_col(s, 14, &o->nomem);
  o->args_json = dup_col(s, 15, &o->nomem);
  o->env_json = dup_col(s, 16, &o->nomem);
  o->secret_env_json = dup_col(s, 17, &o->nomem);
  o->name = dup_col(s, 18, &o->nomem);
  o->role = dup_col(s, 19, &o->nomem);
  o->attempt = sqlite3_column_int(s, 20);
  o->backend_ref = dup_col(s, 21, &o->nomem);
  db_copy_col(s, 22, o->launch_id, sizeof(o->launch_id));
  o->cwd = dup_col(s, 23, &o->nomem);
  o->path = dup_col(s, 24, &o->nomem);
  db_copy_col(s, 25, o->run, sizeof(o->run));
  o->heartbeat_interval_ms = sqlite3_column_int64(s, 26);
  db_copy_col(s, 27, o->owner, sizeof(o->owner));
  db_copy_col(s, 28, o->hostname, sizeof(o->hostname));
}

void db_worker_info_cleanup(struct db_worker_info *o) {
  if (!o)
    return;
  free(o->script);
  free(o->code);
  free(o->command_json);
  free(o->args_json);
  free(o->env_json);
  free(o->secret_env_json);
  free(o->name);
  free(o->role);
  free(o->backend_ref);
  free(o->cwd);
  free(o->path);
  memset(o, 0, sizeof(*o));
}

int db_worker_info(struct db *db, const char *id, struct db_worker_info *out) {
  sqlite3_stmt *s = db_stmt(db, ST_WORKER_INFO);
  int rc;

  db_bind_text_or_null(s, 1, id);
  rc = sqlite3_step(s);
  if (rc == SQLITE_ROW)
    row_to_info(s, out);
  sqlite3_reset(s);
  if (rc == SQLITE_ROW)
    return 0;
  return rc == SQLITE_DONE ? MUSTER_E_NOT_FOUND : MUSTER_E_DB;
}

int db_live_workers(struct db *db, void (*fn)(void *arg, const struct db_worker_info *w),
                    void *arg) {
  sqlite3_stmt *s = db_stmt(db, ST_LIVE);
  struct db_worker_info info;
  int rc;

  while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
    row_to_info(s, &info);
    fn(arg, &info);
    db_worker_info_cleanup(&info);
  }
  sqlite3_reset(s);
  return rc == SQLITE_DONE ? 0 : MUSTER_E_DB;
}

json_t *db_ended_counts(struct db *db) {
  static const char *const names[] = {
#define MUSTER_X_STATUS(sym, name, terminal) name,
      MUSTER_STATUSES(MUSTER_X_STATUS)
#undef MUSTER_X_STATUS
  };
  sqlite3_stmt *s = db_stmt(db, ST_COUNTS);
  json_t *o = json_object();

  for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
    json_object_set_new(o, names[i], json_integer(0));
  while (sqlite3_step(s) == SQLITE_ROW)
    json_object_set_new(o, (const char *)sqlite3_column_text(s, 0),
                        json_integer(sqlite3_column_int64(s, 1)));
  sqlite3_reset(s);
  return o;
}

void db_live_usage(struct db *db, void (*fn)(void *arg, const char *id, const struct db_usage *u),
                   void *arg) {
  sqlite3_stmt *s = db_stmt(db, ST_LIVE_USAGE);

  while (sqlite3_step(s) == SQLITE_ROW) {
    struct db_usage u = {sqlite3_column_double(s, 1), sqlite3_column_int64(s, 2),
                         sqlite3_column_int64(s, 3)};
    fn(arg, (const char *)sqlite3_column_text(s, 0), &u);
  }
  sqlite3_reset(s);
}

int db_worker_set_ref(struct db *db, const char *id, int attempt, const char *ref) {
  sqlite3_stmt *s = db_stmt(db, ST_SET_REF);
  int rc;

  db_bind_text_or_null(s, 1, id);
  db_bind_text_or_null(s, 2, ref);
  sqlite3_bind_int(s, 3, attempt);
  rc = db_exec_write(db, s, id);
  return rc;
}

int db_worker_set_token(struct db *db, const char *id, const char *token) {
  sqlite3_stmt *s = db_stmt(db, ST_SET_TOKEN);

  db_bind_text_or_null(s, 1, id);
  db_bind_text_or_null(s, 2, token);
  return db_exec_write(db, s, id);
}

int db_worker_set_waiting(struct db *db, const char *id, const char *why) {
  sqlite3_stmt *s = db_stmt(db, ST_SET_WAITING);
  int rc;

  db_bind_text_or_null(s, 1, id);
  db_bind_text_or_null(s, 2, why);
  rc = db_exec_write(db, s, id);
  return rc;
}
