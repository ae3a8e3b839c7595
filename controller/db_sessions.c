/* db_sessions.c: the sessions' rows and their leases. See db.h. */
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

/* ---- sessions' leases ---- */

int db_lease_set(struct db *db, const char *name, double ttl) {
  sqlite3_stmt *s;
  int rc = ttl > 0 ? db_session_touch(db, name, NULL) : 0;

  if (rc)
    return rc;
  s = db_stmt(db, ST_LEASE_SET);
  db_bind_text_or_null(s, 1, name);
  if (ttl > 0)
    sqlite3_bind_double(s, 2, ttl);
  return db_exec_stmt(s);
}

int db_leases(struct db *db, void (*fn)(void *arg, const char *session, double ttl), void *arg) {
  sqlite3_stmt *s = db_stmt(db, ST_LEASES);
  int rc;

  while ((rc = sqlite3_step(s)) == SQLITE_ROW)
    fn(arg, (const char *)sqlite3_column_text(s, 0), sqlite3_column_double(s, 1));
  sqlite3_reset(s);
  return rc == SQLITE_DONE ? 0 : MUSTER_E_DB;
}
