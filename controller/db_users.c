/* db_users.c: the users' rows (users.h). Their few queries are prepared
 * each time: users are read once a client call, written by hand. */
#include "db_internal.h"
#include "users.h"

#include "muster_errors.h"
#include "util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char cols[] = "name, admin, unix_user, max_cpu, max_memory, max_gpus, max_workers, "
                           "token_prefix, token_sha256, created_at, removed_at IS NOT NULL";

static sqlite3_stmt *prep(struct db *db, const char *sql) {
  sqlite3_stmt *s = NULL;

  if (sqlite3_prepare_v2(db->conn, sql, -1, &s, NULL) != SQLITE_OK)
    return NULL;
  return s;
}

static void read_row(sqlite3_stmt *s, struct db_user *u) {
  memset(u, 0, sizeof(*u));
  db_copy_col(s, 0, u->name, sizeof(u->name));
  u->admin = sqlite3_column_int(s, 1);
  db_copy_col(s, 2, u->unix_user, sizeof(u->unix_user));
  u->max_cpu = sqlite3_column_type(s, 3) == SQLITE_NULL ? -1 : sqlite3_column_double(s, 3);
  u->max_memory = sqlite3_column_type(s, 4) == SQLITE_NULL ? -1 : sqlite3_column_double(s, 4);
  u->max_gpus = sqlite3_column_type(s, 5) == SQLITE_NULL ? -1 : sqlite3_column_int64(s, 5);
  u->max_workers = sqlite3_column_type(s, 6) == SQLITE_NULL ? -1 : sqlite3_column_int64(s, 6);
  db_copy_col(s, 7, u->token_prefix, sizeof(u->token_prefix));
  db_copy_col(s, 8, u->token_sha256, sizeof(u->token_sha256));
  db_copy_col(s, 9, u->created_at, sizeof(u->created_at));
  u->removed = sqlite3_column_int(s, 10);
}

/* One row by a column's value (where: "name" or "token_prefix"). */
static int user_where(struct db *db, const char *where, const char *value, struct db_user *out) {
  char sql[256];
  sqlite3_stmt *s;
  int rc;

  snprintf(sql, sizeof(sql), "SELECT %s FROM users WHERE %s = ?1", cols, where);
  if (!(s = prep(db, sql)))
    return MUSTER_E_DB;
  sqlite3_bind_text(s, 1, value, -1, SQLITE_TRANSIENT);
  rc = sqlite3_step(s);
  if (rc == SQLITE_ROW)
    read_row(s, out);
  sqlite3_finalize(s);
  return rc == SQLITE_ROW ? 0 : rc == SQLITE_DONE ? MUSTER_E_NOT_FOUND : MUSTER_E_DB;
}

int db_user_by_prefix(struct db *db, const char *prefix, struct db_user *out) {
  int rc = user_where(db, "token_prefix", prefix, out);

  return rc == 0 && out->removed ? MUSTER_E_NOT_FOUND : rc;
}

int db_user_get(struct db *db, const char *name, struct db_user *out) {
  return user_where(db, "name", name, out);
}

static void bind_limit(sqlite3_stmt *s, int i, double v) {
  if (v < 0)
    sqlite3_bind_null(s, i);
  else
    sqlite3_bind_double(s, i, v);
}

int db_user_add(struct db *db, const struct db_user *u) {
  sqlite3_stmt *s = prep(db, "INSERT INTO users(name, admin, unix_user, max_cpu, max_memory, "
                             "max_gpus, max_workers, token_prefix, token_sha256, created_at) "
                             "VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)");
  char now[32];
  int rc;

  if (!s)
    return MUSTER_E_DB;
  util_now_iso(now, sizeof(now));
  sqlite3_bind_text(s, 1, u->name, -1, SQLITE_TRANSIENT);
  sqlite3_bind_int(s, 2, u->admin);
  db_bind_text_or_null(s, 3, u->unix_user[0] ? u->unix_user : NULL);
  bind_limit(s, 4, u->max_cpu);
  bind_limit(s, 5, u->max_memory);
  bind_limit(s, 6, (double)u->max_gpus);
  bind_limit(s, 7, (double)u->max_workers);
  sqlite3_bind_text(s, 8, u->token_prefix, -1, SQLITE_TRANSIENT);
  sqlite3_bind_text(s, 9, u->token_sha256, -1, SQLITE_TRANSIENT);
  sqlite3_bind_text(s, 10, now, -1, SQLITE_TRANSIENT);
  rc = sqlite3_step(s);
  if (rc != SQLITE_DONE && sqlite3_extended_errcode(db->conn) == SQLITE_CONSTRAINT_UNIQUE) {
    sqlite3_finalize(s);
    return USER_PREFIX_TAKEN;
  }
  sqlite3_finalize(s);
  if (rc == SQLITE_CONSTRAINT)
    return MUSTER_E_CONFLICT;
  return rc == SQLITE_DONE ? 0 : MUSTER_E_DB;
}

/* Runs sql with name (and a, b) bound; MUSTER_E_NOT_FOUND when no row changed. */
static int change(struct db *db, const char *sql, const char *name, const char *a, const char *b) {
  sqlite3_stmt *s = prep(db, sql);
  int rc;

  if (!s)
    return MUSTER_E_DB;
  sqlite3_bind_text(s, 1, name, -1, SQLITE_TRANSIENT);
  if (a)
    sqlite3_bind_text(s, 2, a, -1, SQLITE_TRANSIENT);
  if (b)
    sqlite3_bind_text(s, 3, b, -1, SQLITE_TRANSIENT);
  rc = sqlite3_step(s);
  if (rc != SQLITE_DONE && sqlite3_extended_errcode(db->conn) == SQLITE_CONSTRAINT_UNIQUE) {
    sqlite3_finalize(s);
    return USER_PREFIX_TAKEN;
  }
  sqlite3_finalize(s);
  if (rc != SQLITE_DONE)
    return MUSTER_E_DB;
  return sqlite3_changes(db->conn) ? 0 : MUSTER_E_NOT_FOUND;
}

int db_user_set_token(struct db *db, const char *name, const char *prefix, const char *sha256) {
  return change(db,
                "UPDATE users SET token_prefix = ?2, token_sha256 = ?3 "
                "WHERE name = ?1 AND removed_at IS NULL",
                name, prefix, sha256);
}

int db_user_remove(struct db *db, const char *name) {
  /* One statement: no launch of theirs can come between the count and the
   * removal. */
  char now[32];
  int rc;
  struct db_user u;

  /* The row stays, its token dead (a prefix no token has): the name is
   * never another's (users.h). */
  util_now_iso(now, sizeof(now));
  rc = change(db,
              "UPDATE users SET removed_at = ?2, token_prefix = 'removed:' || ?1, "
              "token_sha256 = '' WHERE name = ?1 AND removed_at IS NULL AND NOT EXISTS "
              "(SELECT 1 FROM workers WHERE owner = ?1 AND status IN "
              "('scheduling', 'starting', 'running'))",
              name, now, NULL);
  if (rc != MUSTER_E_NOT_FOUND)
    return rc;
  rc = db_user_get(db, name, &u);
  return rc == 0 && !u.removed ? MUSTER_E_CONFLICT : rc == 0 ? MUSTER_E_NOT_FOUND : rc;
}

int db_user_each(struct db *db, void (*fn)(void *arg, const struct db_user *u), void *arg) {
  char sql[200];
  sqlite3_stmt *s;
  struct db_user u;
  int rc;

  snprintf(sql, sizeof(sql), "SELECT %s FROM users WHERE removed_at IS NULL ORDER BY name", cols);
  if (!(s = prep(db, sql)))
    return MUSTER_E_DB;
  while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
    read_row(s, &u);
    fn(arg, &u);
  }
  sqlite3_finalize(s);
  return rc == SQLITE_DONE ? 0 : MUSTER_E_DB;
}

int db_user_live_ids(struct db *db, const char *name, char (**ids)[16], int *n) {
  sqlite3_stmt *s = prep(db, "SELECT id FROM workers WHERE owner = ?1 AND status IN "
                             "('scheduling', 'starting', 'running')");
  char(*v)[16] = NULL;
  int rc, cap = 0;

  *ids = NULL;
  *n = 0;
  if (!s)
    return MUSTER_E_DB;
  sqlite3_bind_text(s, 1, name, -1, SQLITE_TRANSIENT);
  while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
    if (*n == cap) {
      char(*grown)[16] = realloc(v, (size_t)(cap ? 2 * cap : 64) * sizeof(*v));
      if (!grown) {
        rc = SQLITE_NOMEM;
        break;
      }
      v = grown;
      cap = cap ? 2 * cap : 64;
    }
    snprintf(v[(*n)++], sizeof(v[0]), "%s", (const char *)sqlite3_column_text(s, 0));
  }
  sqlite3_finalize(s);
  if (rc != SQLITE_DONE) {
    free(v);
    *n = 0;
    return rc == SQLITE_NOMEM ? MUSTER_E_NOMEM : MUSTER_E_DB;
  }
  *ids = v;
  return 0;
}

int db_user_live_workers(struct db *db, const char *name, long *n) {
  sqlite3_stmt *s = prep(db, "SELECT count(*) FROM workers WHERE owner = ?1 AND status IN "
                             "('scheduling', 'starting', 'running')");
  int rc;

  if (!s)
    return MUSTER_E_DB;
  sqlite3_bind_text(s, 1, name, -1, SQLITE_TRANSIENT);
  rc = sqlite3_step(s);
  *n = rc == SQLITE_ROW ? (long)sqlite3_column_int64(s, 0) : 0;
  sqlite3_finalize(s);
  return rc == SQLITE_ROW ? 0 : MUSTER_E_DB;
}

int db_worker_session(struct db *db, const char *id, char *out, size_t size) {
  sqlite3_stmt *s = prep(db, "SELECT session FROM workers WHERE id = ?1");
  int rc;

  if (!s)
    return MUSTER_E_DB;
  sqlite3_bind_text(s, 1, id, -1, SQLITE_TRANSIENT);
  rc = sqlite3_step(s);
  if (rc == SQLITE_ROW)
    db_copy_col(s, 0, out, size);
  sqlite3_finalize(s);
  return rc == SQLITE_ROW ? 0 : rc == SQLITE_DONE ? MUSTER_E_NOT_FOUND : MUSTER_E_DB;
}
