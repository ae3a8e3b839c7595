/* db_runs.c: sessions' leases and runs, see db.h. These calls are rare (a
 * lease is written when it is taken, changed or given back, a run a few
 * times in its life), so each prepares its statement when called. */
#include "db.h"

#include "muster_errors.h"
#include "util.h"

#include <stdio.h>
#include <string.h>

/* Prepares sql on db's connection; NULL on error. */
static sqlite3_stmt *prep(struct db *db, const char *sql) {
  sqlite3_stmt *s = NULL;

  if (sqlite3_prepare_v2(db_sqlite_(db), sql, -1, &s, NULL) != SQLITE_OK) {
    sqlite3_finalize(s);
    return NULL;
  }
  return s;
}

static void bind_str(sqlite3_stmt *s, int i, const char *v) {
  if (v)
    sqlite3_bind_text(s, i, v, -1, SQLITE_TRANSIENT);
  else
    sqlite3_bind_null(s, i);
}

/* Steps s to its end and finalizes it; 0 or MUSTER_E_DB. */
static int run_done(sqlite3_stmt *s) {
  int rc = sqlite3_step(s);

  sqlite3_finalize(s);
  return rc == SQLITE_DONE ? 0 : MUSTER_E_DB;
}

static json_t *text_or_null(sqlite3_stmt *s, int i) {
  const char *v = (const char *)sqlite3_column_text(s, i);
  return v ? json_string(v) : json_null();
}

/* ---- leases ---- */

int db_lease_set(struct db *db, const char *name, double ttl) {
  sqlite3_stmt *s;
  int rc = 0;

  if (ttl > 0)
    rc = db_session_touch(db, name, NULL);
  if (rc)
    return rc;
  s = prep(db, "UPDATE sessions SET lease_ttl_seconds = ?2 WHERE name = ?1");
  if (!s)
    return MUSTER_E_DB;
  bind_str(s, 1, name);
  if (ttl > 0)
    sqlite3_bind_double(s, 2, ttl);
  else
    sqlite3_bind_null(s, 2);
  return run_done(s);
}

int db_leases(struct db *db, void (*fn)(void *arg, const char *session, double ttl), void *arg) {
  sqlite3_stmt *s = prep(db, "SELECT name, lease_ttl_seconds FROM sessions "
                             "WHERE lease_ttl_seconds IS NOT NULL ORDER BY name");
  int rc;

  if (!s)
    return MUSTER_E_DB;
  while ((rc = sqlite3_step(s)) == SQLITE_ROW)
    fn(arg, (const char *)sqlite3_column_text(s, 0), sqlite3_column_double(s, 1));
  sqlite3_finalize(s);
  return rc == SQLITE_DONE ? 0 : MUSTER_E_DB;
}

/* ---- runs ---- */

int db_run_insert(struct db *db, const struct db_run_new *r) {
  sqlite3_stmt *s = prep(db, "INSERT INTO runs(id, session, mode, command, status, max_restarts, "
                             "created_at) VALUES (?1, ?2, ?3, ?4, 'running', ?5, ?6)");
  char now[32];

  if (!s)
    return MUSTER_E_DB;
  util_now_iso(now, sizeof(now));
  bind_str(s, 1, r->id);
  bind_str(s, 2, r->session);
  bind_str(s, 3, r->mode);
  bind_str(s, 4, r->command_json);
  sqlite3_bind_int(s, 5, r->max_restarts);
  bind_str(s, 6, now);
  return run_done(s);
}

json_t *db_run_json(struct db *db, const char *id) {
  sqlite3_stmt *s = prep(db, "SELECT id, session, mode, command, status, max_restarts, restarts, "
                             "created_at, finished_at, summary, failure FROM runs WHERE id = ?1");
  json_t *o = NULL, *workers, *restarts;

  if (!s)
    return NULL;
  bind_str(s, 1, id);
  if (sqlite3_step(s) != SQLITE_ROW) {
    sqlite3_finalize(s);
    return NULL;
  }
  restarts = json_loads((const char *)sqlite3_column_text(s, 6), 0, NULL);
  if (!json_is_array(restarts)) {
    json_decref(restarts);
    restarts = json_array();
  }
  o = json_object();
  json_object_set_new(o, "id", text_or_null(s, 0));
  json_object_set_new(o, "session", text_or_null(s, 1));
  json_object_set_new(o, "mode", text_or_null(s, 2));
  json_object_set_new(o, "command", json_loads((const char *)sqlite3_column_text(s, 3), 0, NULL));
  json_object_set_new(o, "status", text_or_null(s, 4));
  json_object_set_new(o, "max_restarts", json_integer(sqlite3_column_int(s, 5)));
  json_object_set_new(o, "restarts", json_integer((json_int_t)json_array_size(restarts)));
  json_object_set_new(o, "causes", restarts);
  json_object_set_new(o, "created_at", text_or_null(s, 7));
  json_object_set_new(o, "finished_at", text_or_null(s, 8));
  json_object_set_new(
      o, "summary",
      sqlite3_column_type(s, 9) == SQLITE_NULL
          ? json_null()
          : json_loads((const char *)sqlite3_column_text(s, 9), JSON_DECODE_ANY, NULL));
  if (!json_object_get(o, "summary"))
    json_object_set_new(o, "summary", json_null());
  if (!json_object_get(o, "command"))
    json_object_set_new(o, "command", json_array());
  json_object_set_new(o, "failure", text_or_null(s, 10));
  sqlite3_finalize(s);

  /* Its workers, replacements included, in launch order. */
  workers = json_array();
  s = prep(db, "SELECT id FROM workers WHERE run = ?1 ORDER BY rowid");
  if (s) {
    bind_str(s, 1, id);
    while (sqlite3_step(s) == SQLITE_ROW)
      json_array_append_new(workers, text_or_null(s, 0));
    sqlite3_finalize(s);
  }
  json_object_set_new(o, "workers", workers);
  return o;
}

int db_run_page(struct db *db, const char *session, const char *status, int64_t before, int limit,
                char (*ids)[16], int *n, int64_t *next) {
  sqlite3_stmt *s = prep(db, "SELECT id, rowid FROM runs WHERE (?1 IS NULL OR session = ?1) "
                             "AND (?2 IS NULL OR status = ?2) AND rowid < ?3 "
                             "ORDER BY rowid DESC LIMIT ?4");
  int64_t last = 0;
  int rc;

  *n = 0;
  *next = 0;
  if (!s)
    return MUSTER_E_DB;
  bind_str(s, 1, session);
  bind_str(s, 2, status);
  sqlite3_bind_int64(s, 3, before > 0 ? before : INT64_MAX);
  sqlite3_bind_int(s, 4, limit + 1); /* one more tells whether a next page exists */
  while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
    const char *id = (const char *)sqlite3_column_text(s, 0);
    if (*n == limit) {
      *next = last;
      continue;
    }
    snprintf(ids[(*n)++], sizeof(ids[0]), "%s", id ? id : "");
    last = sqlite3_column_int64(s, 1);
  }
  sqlite3_finalize(s);
  return rc == SQLITE_DONE ? 0 : MUSTER_E_DB;
}

/* MUSTER_E_NOT_FOUND if run id does not exist, else MUSTER_E_CONFLICT (a
 * conditional update of it changed nothing). */
static int why_unchanged(struct db *db, const char *id) {
  sqlite3_stmt *s = prep(db, "SELECT 1 FROM runs WHERE id = ?1");
  int found;

  if (!s)
    return MUSTER_E_DB;
  bind_str(s, 1, id);
  found = sqlite3_step(s) == SQLITE_ROW;
  sqlite3_finalize(s);
  return found ? MUSTER_E_CONFLICT : MUSTER_E_NOT_FOUND;
}

int db_run_restart(struct db *db, const char *id, const char *cause) {
  sqlite3_stmt *s =
      prep(db, "UPDATE runs SET restarts = json_insert(restarts, '$[#]', "
               "json_object('at', ?2, 'cause', ?3)) WHERE id = ?1 "
               "AND status = 'running' AND json_array_length(restarts) < max_restarts");
  char now[32];
  int rc;

  if (!s)
    return MUSTER_E_DB;
  util_now_iso(now, sizeof(now));
  bind_str(s, 1, id);
  bind_str(s, 2, now);
  bind_str(s, 3, cause);
  rc = run_done(s);
  if (!rc && sqlite3_changes(db_sqlite_(db)) != 1)
    rc = why_unchanged(db, id);
  return rc;
}

int db_run_end(struct db *db, const char *id, const char *status, const char *summary_json,
               const char *failure) {
  sqlite3_stmt *s = prep(db, "UPDATE runs SET status = ?2, summary = ?3, failure = ?4, "
                             "finished_at = ?5 WHERE id = ?1 AND status = 'running'");
  char now[32];
  int rc;

  if (!s)
    return MUSTER_E_DB;
  util_now_iso(now, sizeof(now));
  bind_str(s, 1, id);
  bind_str(s, 2, status);
  bind_str(s, 3, summary_json);
  bind_str(s, 4, failure);
  bind_str(s, 5, now);
  rc = run_done(s);
  if (!rc && sqlite3_changes(db_sqlite_(db)) != 1)
    rc = why_unchanged(db, id);
  return rc;
}

int db_runs_fail_session(struct db *db, const char *session, const char *failure, int *n) {
  sqlite3_stmt *s = prep(db, "UPDATE runs SET status = 'failed', failure = ?2, finished_at = ?3 "
                             "WHERE session = ?1 AND status = 'running'");
  char now[32];
  int rc;

  *n = 0;
  if (!s)
    return MUSTER_E_DB;
  util_now_iso(now, sizeof(now));
  bind_str(s, 1, session);
  bind_str(s, 2, failure);
  bind_str(s, 3, now);
  rc = run_done(s);
  if (!rc)
    *n = sqlite3_changes(db_sqlite_(db));
  return rc;
}

int db_run_state(struct db *db, const char *id, char *status, size_t slen, char *session,
                 size_t sesslen) {
  sqlite3_stmt *s = prep(db, "SELECT status, session FROM runs WHERE id = ?1");
  int rc = MUSTER_E_NOT_FOUND;

  if (!s)
    return MUSTER_E_DB;
  bind_str(s, 1, id);
  if (sqlite3_step(s) == SQLITE_ROW) {
    const char *st = (const char *)sqlite3_column_text(s, 0);
    const char *se = (const char *)sqlite3_column_text(s, 1);
    snprintf(status, slen, "%s", st ? st : "");
    snprintf(session, sesslen, "%s", se ? se : "");
    rc = 0;
  }
  sqlite3_finalize(s);
  return rc;
}
