/* db_runs.c: the runs' rows. See db.h. */
#include "db_internal.h"
#include "session_name.h"

#include "muster_errors.h"
#include "util.h"

#include <stdio.h>

int db_run_insert(struct db *db, const struct db_run_new *r) {
  sqlite3_stmt *s = db_stmt(db, ST_RUN_INSERT);
  char now[32];

  util_now_iso(now, sizeof(now));
  db_bind_text_or_null(s, 1, r->id);
  db_bind_text_or_null(s, 2, r->session);
  db_bind_text_or_null(s, 3, r->mode);
  db_bind_text_or_null(s, 4, r->command_json);
  sqlite3_bind_int(s, 5, r->max_restarts);
  db_bind_text_or_null(s, 6, now);
  db_bind_text_or_null(s, 7, r->holder);
  return db_exec_stmt(s);
}

json_t *db_run_json(struct db *db, const char *id, int full) {
  sqlite3_stmt *s = db_stmt(db, ST_RUN_GET);
  json_t *o, *workers, *restarts, *summary = NULL;

  db_bind_text_or_null(s, 1, id);
  if (sqlite3_step(s) != SQLITE_ROW) {
    sqlite3_reset(s);
    return NULL;
  }
  restarts = db_col_json(s, 6, json_array());
  if (sqlite3_column_type(s, 9) != SQLITE_NULL)
    summary = json_loads((const char *)sqlite3_column_text(s, 9), JSON_DECODE_ANY, NULL);
  o = json_object();
  json_object_set_new(o, "id", db_col_text(s, 0));
  json_object_set_new(o, "session", db_col_text(s, 1));
  json_object_set_new(o, "mode", db_col_text(s, 2));
  json_object_set_new(o, "command", db_col_json(s, 3, json_array()));
  json_object_set_new(o, "status", db_col_text(s, 4));
  json_object_set_new(o, "max_restarts", json_integer(sqlite3_column_int(s, 5)));
  json_object_set_new(o, "restarts", json_integer((json_int_t)json_array_size(restarts)));
  json_object_set_new(o, "causes", restarts);
  json_object_set_new(o, "created_at", db_col_text(s, 7));
  json_object_set_new(o, "finished_at", db_col_text(s, 8));
  json_object_set_new(o, "summary", summary ? summary : json_null());
  json_object_set_new(o, "failure", db_col_text(s, 10));
  json_object_set_new(o, "holder", db_col_text(s, 11));
  {
    json_t *stalls = db_col_json(s, 12, json_array());
    json_object_set_new(o, "stall_count", json_integer((json_int_t)json_array_size(stalls)));
    if (full)
      json_object_set_new(o, "stalls", stalls);
    else
      json_decref(stalls);
  }
  sqlite3_reset(s);

  /* Its workers, replacements included, in launch order. */
  workers = json_array();
  s = db_stmt(db, ST_RUN_WORKERS);
  db_bind_text_or_null(s, 1, id);
  while (sqlite3_step(s) == SQLITE_ROW)
    json_array_append_new(workers, db_col_text(s, 0));
  sqlite3_reset(s);
  json_object_set_new(o, "workers", workers);
  json_object_set_new(o, "latest", db_metrics_latest(db, id));
  return o;
}

int db_run_page(struct db *db, const char *session, const char *prefix, const char *status,
                int64_t before, int limit, char (*ids)[16], int *n, int64_t *next) {
  sqlite3_stmt *s = db_stmt(db, ST_RUN_LIST);

  db_bind_text_or_null(s, 1, session);
  db_bind_text_or_null(s, 5, prefix);
  db_bind_text_or_null(s, 2, status);
  sqlite3_bind_int64(s, 3, before > 0 ? before : INT64_MAX);
  sqlite3_bind_int(s, 4, limit + 1);
  return db_page_ids(s, limit, ids, n, next);
}

int db_run_state(struct db *db, const char *id, char *status, size_t slen, char *session,
                 size_t sesslen) {
  sqlite3_stmt *s = db_stmt(db, ST_RUN_GET);
  int rc = MUSTER_E_NOT_FOUND;

  db_bind_text_or_null(s, 1, id);
  if (sqlite3_step(s) == SQLITE_ROW) {
    db_copy_col(s, 4, status, slen);
    db_copy_col(s, 1, session, sesslen);
    rc = 0;
  }
  sqlite3_reset(s);
  return rc;
}

/* Runs s, a bound conditional update of run id: MUSTER_E_NOT_FOUND if
 * there is no such run, MUSTER_E_CONFLICT if the condition kept it as it
 * was. */
static int run_update(struct db *db, sqlite3_stmt *s, const char *id) {
  char status[16], session[SESSION_STORED_MAX];
  int rc = db_exec_stmt(s);

  if (rc || sqlite3_changes(db->conn) == 1)
    return rc;
  rc = db_run_state(db, id, status, sizeof(status), session, sizeof(session));
  return rc ? rc : MUSTER_E_CONFLICT;
}

/* Adds an entry {at: now, text} to a list of run id's (statement st: a
 * restart's cause, a stall's report) while the run goes on. */
static int run_add_entry(struct db *db, int st, const char *id, const char *text) {
  sqlite3_stmt *s = db_stmt(db, st);
  char now[32];

  util_now_iso(now, sizeof(now));
  db_bind_text_or_null(s, 1, id);
  db_bind_text_or_null(s, 2, now);
  db_bind_text_or_null(s, 3, text);
  return run_update(db, s, id);
}

int db_run_restart(struct db *db, const char *id, const char *cause) {
  return run_add_entry(db, ST_RUN_RESTART, id, cause);
}

int db_run_stall(struct db *db, const char *id, const char *report) {
  return run_add_entry(db, ST_RUN_STALL, id, report);
}

int db_run_end(struct db *db, const char *id, const char *status, const char *summary_json,
               const char *failure) {
  sqlite3_stmt *s = db_stmt(db, ST_RUN_END);
  char now[32];

  util_now_iso(now, sizeof(now));
  db_bind_text_or_null(s, 1, id);
  db_bind_text_or_null(s, 2, status);
  db_bind_text_or_null(s, 3, summary_json);
  db_bind_text_or_null(s, 4, failure);
  db_bind_text_or_null(s, 5, now);
  return run_update(db, s, id);
}

int db_runs_fail_session(struct db *db, const char *session, const char *failure, int *n) {
  sqlite3_stmt *s = db_stmt(db, ST_RUNS_FAIL_SESSION);
  char now[32];
  int rc;

  util_now_iso(now, sizeof(now));
  db_bind_text_or_null(s, 1, session);
  db_bind_text_or_null(s, 2, failure);
  db_bind_text_or_null(s, 3, now);
  rc = db_exec_stmt(s);
  *n = rc ? 0 : sqlite3_changes(db->conn);
  return rc;
}

int db_runs_fail_holder(struct db *db, const char *session, const char *holder, const char *failure,
                        int *n) {
  sqlite3_stmt *s = db_stmt(db, ST_RUNS_FAIL_HOLDER);
  char now[32];
  int rc;

  util_now_iso(now, sizeof(now));
  db_bind_text_or_null(s, 1, session);
  db_bind_text_or_null(s, 2, holder);
  db_bind_text_or_null(s, 3, failure);
  db_bind_text_or_null(s, 4, now);
  rc = db_exec_stmt(s);
  *n = rc ? 0 : sqlite3_changes(db->conn);
  return rc;
}
