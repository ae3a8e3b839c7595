/* db_sessions.c: the sessions' rows and the parts of their leases. See db.h. */
#include "db_internal.h"

#include "muster_errors.h"
#include "util.h"

int db_session_touch(struct db *db, const char *name, const char *master_ip) {
  sqlite3_stmt *s = db_stmt(db, ST_SESSION_TOUCH);
  char now[32], token[64];

  if (util_random_hex(token, 24) != 0)
    return MUSTER_E_IO;
  util_now_iso(now, sizeof(now));
  db_bind_text_or_null(s, 1, name);
  db_bind_text_or_null(s, 2, master_ip);
  db_bind_text_or_null(s, 3, now);
  db_bind_text_or_null(s, 4, token); /* used only if the session is new */
  return db_exec_stmt(s);
}

json_t *db_session_json(struct db *db, const char *name) {
  sqlite3_stmt *s = db_stmt(db, ST_SESSION_GET);
  json_t *o = NULL;

  db_bind_text_or_null(s, 1, name);
  if (sqlite3_step(s) == SQLITE_ROW) {
    o = json_object();
    json_object_set_new(o, "name", db_col_text(s, 0));
    json_object_set_new(o, "master_ip", db_col_text(s, 1));
    json_object_set_new(o, "created_at", db_col_text(s, 2));
    json_object_set_new(o, "exec_token", db_col_text(s, 3));
  }
  sqlite3_reset(s);
  return o;
}

/* ---- the parts of sessions' leases ---- */

int db_holder_set(struct db *db, const char *session, const char *holder, double ttl,
                  int stop_workers) {
  sqlite3_stmt *s;
  int rc = db_session_touch(db, session, NULL);

  if (rc)
    return rc;
  s = db_stmt(db, ST_HOLDER_SET);
  db_bind_text_or_null(s, 1, session);
  db_bind_text_or_null(s, 2, holder);
  sqlite3_bind_double(s, 3, ttl);
  sqlite3_bind_int(s, 4, stop_workers);
  return db_exec_stmt(s);
}

int db_holder_drop(struct db *db, const char *session, const char *holder) {
  sqlite3_stmt *s = db_stmt(db, ST_HOLDER_DROP);

  db_bind_text_or_null(s, 1, session);
  db_bind_text_or_null(s, 2, holder);
  return db_exec_stmt(s);
}

int db_holder_expire(struct db *db, const char *session, const char *holder, int workers_stopped) {
  sqlite3_stmt *s = db_stmt(db, ST_HOLDER_EXPIRE);
  char now[32];

  util_now_iso(now, sizeof(now));
  db_bind_text_or_null(s, 1, session);
  db_bind_text_or_null(s, 2, holder);
  db_bind_text_or_null(s, 3, now);
  sqlite3_bind_int(s, 4, workers_stopped);
  return db_exec_stmt(s);
}

int db_holders_stopped(struct db *db, const char *session) {
  sqlite3_stmt *s = db_stmt(db, ST_HOLDERS_STOPPED);

  db_bind_text_or_null(s, 1, session);
  return db_exec_stmt(s);
}

int db_holder_past(struct db *db, const char *session, const char *holder, int *workers_stopped) {
  sqlite3_stmt *s = db_stmt(db, ST_HOLDER_PAST);
  int rc;

  db_bind_text_or_null(s, 1, session);
  db_bind_text_or_null(s, 2, holder);
  rc = sqlite3_step(s);
  if (rc == SQLITE_ROW)
    *workers_stopped = sqlite3_column_int(s, 0);
  sqlite3_reset(s);
  return rc == SQLITE_ROW ? 1 : rc == SQLITE_DONE ? 0 : -1;
}

int db_holders(struct db *db,
               void (*fn)(void *arg, const char *session, const char *holder, double ttl,
                          int stop_workers),
               void *arg) {
  sqlite3_stmt *s = db_stmt(db, ST_HOLDERS);
  int rc;

  while ((rc = sqlite3_step(s)) == SQLITE_ROW)
    fn(arg, (const char *)sqlite3_column_text(s, 0), (const char *)sqlite3_column_text(s, 1),
       sqlite3_column_double(s, 2), sqlite3_column_int(s, 3));
  sqlite3_reset(s);
  return rc == SQLITE_DONE ? 0 : MUSTER_E_DB;
}
