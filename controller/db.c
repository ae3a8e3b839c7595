/* db.c: see db.h. */
#include "db.h"

#include "muster_errors.h"
#include "muster_status.h"
#include "util.h"
#include "wcache.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum {
  ST_BEGIN,
  ST_COMMIT,
  ST_ROLLBACK,
  ST_SESSION_TOUCH,
  ST_WORKER_INSERT,
  ST_EVENT_INSERT,
  ST_TRANSITION,
  ST_HEARTBEAT,
  ST_USAGE,
  ST_WORKER_GET,
  ST_WORKER_LIST,
  ST_WORKER_INFO,
  ST_LIVE,
  ST_EVENTS_SINCE,
  ST_LAST_SEQ,
  ST_COUNTS,
  ST_LIVE_USAGE,
  ST_SESSION_GET,
  ST_SET_REF,
  ST_SET_WAITING,
  ST_PRUNE_PICK,
  ST_PRUNE_EVENTS,
  ST_PRUNE_WORKER,
  ST_PRUNE_SESSIONS,
  ST_PRUNE_RUNS,
  ST_SET_RUN,
  ST_LEASE_SET,
  ST_LEASES,
  ST_RUN_INSERT,
  ST_RUN_GET,
  ST_RUN_WORKERS,
  ST_RUN_LIST,
  ST_RUN_RESTART,
  ST_RUN_END,
  ST_RUNS_FAIL_SESSION,
  ST_GATE_OPEN,
  ST_GATE_CLOSE,
  ST_COUNT_
};

#define WORKER_COLS                                                                                \
  "id, session, name, role, status, cpu, memory, nvidia_gpu, script, code, command, "              \
  "kernel, args, env, secret_env, ip_address, hostname, exec_port, backend, "                      \
  "backend_ref, exit_code, failure, created_at, running_at, finished_at, "                         \
  "last_heartbeat, signal, attempt, waiting_for, usage_cpu_seconds, usage_memory_bytes, "          \
  "usage_memory_peak_bytes, run"

#define INFO_COLS                                                                                  \
  "id, status, token, session, master_ip, bind_ip, gpu_indices, kernel, cpu, memory, "             \
  "nvidia_gpu, pid, script, code, command, args, env, secret_env, name, role, attempt, "           \
  "backend_ref, launch_id"

static const char *const statement_sql[ST_COUNT_] = {
    [ST_BEGIN] = "BEGIN IMMEDIATE",
    [ST_COMMIT] = "COMMIT",
    [ST_ROLLBACK] = "ROLLBACK",
    [ST_SESSION_TOUCH] = "INSERT INTO sessions(name, master_ip, created_at, exec_token) "
                         "VALUES (?1, ?2, ?3, ?4) ON CONFLICT(name) DO UPDATE SET "
                         "master_ip = coalesce(master_ip, excluded.master_ip)",
    [ST_SESSION_GET] = "SELECT name, master_ip, created_at, exec_token FROM sessions "
                       "WHERE name = ?1",
    [ST_WORKER_INSERT] =
        "INSERT INTO workers(id, session, name, role, status, cpu, memory, nvidia_gpu, "
        "script, code, command, kernel, args, env, secret_env, token, master_ip, backend, "
        "created_at, launch_id, run) VALUES (?1, ?2, ?3, ?4, 'scheduling', ?5, ?6, ?7, ?8, ?9, "
        "?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, ?18, ?19, ?20)",
    [ST_EVENT_INSERT] = "INSERT INTO events(worker_id, at, \"from\", \"to\", detail) "
                        "VALUES (?1, ?2, ?3, ?4, ?5)",
    [ST_TRANSITION] =
        "UPDATE workers SET status = ?2, "
        "ip_address = coalesce(?3, ip_address), hostname = coalesce(?4, hostname), "
        "failure = coalesce(?6, failure), "
        "exec_port = coalesce(?7, exec_port), pid = coalesce(?8, pid), "
        "exit_code = coalesce(?9, exit_code), signal = coalesce(?10, signal), "
        "running_at = coalesce(?11, running_at), finished_at = coalesce(?12, finished_at), "
        "last_heartbeat = coalesce(?13, last_heartbeat), bind_ip = coalesce(?14, bind_ip), "
        "gpu_indices = coalesce(?15, gpu_indices), attempt = coalesce(?17, attempt), "
        "waiting_for = CASE WHEN ?2 = 'scheduling' THEN waiting_for ELSE NULL END, "
        "backend_ref = CASE WHEN ?17 IS NULL THEN coalesce(?5, backend_ref) ELSE ?5 END "
        "WHERE id = ?1 AND status = ?16",
    [ST_HEARTBEAT] = "UPDATE workers SET last_heartbeat = ?2 WHERE id = ?1",
    [ST_USAGE] = "UPDATE workers SET usage_cpu_seconds = ?2, usage_memory_bytes = ?3, "
                 "usage_memory_peak_bytes = ?4 WHERE id = ?1",
    [ST_WORKER_GET] = "SELECT " WORKER_COLS " FROM workers WHERE id = ?1",
    [ST_WORKER_LIST] = "SELECT id, rowid FROM workers "
                       "WHERE (?1 IS NULL OR status IN (SELECT value FROM json_each(?1))) "
                       "AND (?2 IS NULL OR session = ?2) AND (?3 IS NULL OR role = ?3) "
                       "AND (?6 IS NULL OR run = ?6) "
                       "AND rowid < ?4 ORDER BY rowid DESC LIMIT ?5",
    [ST_WORKER_INFO] = "SELECT " INFO_COLS " FROM workers WHERE id = ?1",
    [ST_LIVE] = "SELECT " INFO_COLS " FROM workers "
                "WHERE status IN ('scheduling', 'starting', 'running') ORDER BY rowid",
    [ST_EVENTS_SINCE] = "SELECT seq, worker_id, \"from\", \"to\", at, detail FROM events "
                        "WHERE seq > ?1 ORDER BY seq LIMIT ?2",
    [ST_LAST_SEQ] = "SELECT coalesce(max(seq), 0) FROM events",
    [ST_COUNTS] = "SELECT status, count(*) FROM workers GROUP BY status",
    [ST_LIVE_USAGE] = "SELECT id, usage_cpu_seconds, usage_memory_bytes, usage_memory_peak_bytes "
                      "FROM workers WHERE status IN ('starting', 'running') "
                      "AND usage_cpu_seconds IS NOT NULL ORDER BY id",
    [ST_SET_REF] = "UPDATE workers SET backend_ref = ?2 WHERE id = ?1 AND attempt = ?3 "
                   "AND status IN ('starting', 'running')",
    [ST_SET_WAITING] = "UPDATE workers SET waiting_for = ?2 WHERE id = ?1 "
                       "AND status = 'scheduling'",
    [ST_PRUNE_PICK] = "SELECT id FROM workers WHERE finished_at IS NOT NULL "
                      "AND finished_at < ?1 AND status IN ('succeeded', 'failed', 'stopped') "
                      "LIMIT ?2",
    [ST_PRUNE_EVENTS] = "DELETE FROM events WHERE worker_id = ?1",
    [ST_PRUNE_WORKER] = "DELETE FROM workers WHERE id = ?1",
    [ST_PRUNE_SESSIONS] = "DELETE FROM sessions WHERE created_at < ?1 "
                          "AND lease_ttl_seconds IS NULL AND NOT EXISTS "
                          "(SELECT 1 FROM workers WHERE workers.session = sessions.name) "
                          "AND NOT EXISTS (SELECT 1 FROM runs WHERE runs.session = sessions.name)",
    [ST_PRUNE_RUNS] = "DELETE FROM runs WHERE status <> 'running' AND finished_at < ?1 "
                      "AND NOT EXISTS (SELECT 1 FROM workers WHERE workers.run = runs.id)",
    [ST_SET_RUN] = "UPDATE workers SET run = ?2 WHERE id = ?1 AND run IS NULL",
    [ST_LEASE_SET] = "UPDATE sessions SET lease_ttl_seconds = ?2 WHERE name = ?1",
    [ST_LEASES] = "SELECT name, lease_ttl_seconds FROM sessions "
                  "WHERE lease_ttl_seconds IS NOT NULL ORDER BY name",
    [ST_RUN_INSERT] = "INSERT INTO runs(id, session, mode, command, status, max_restarts, "
                      "created_at) VALUES (?1, ?2, ?3, ?4, 'running', ?5, ?6)",
    [ST_RUN_GET] = "SELECT id, session, mode, command, status, max_restarts, restarts, "
                   "created_at, finished_at, summary, failure FROM runs WHERE id = ?1",
    [ST_RUN_WORKERS] = "SELECT id FROM workers WHERE run = ?1 ORDER BY rowid",
    [ST_RUN_LIST] = "SELECT id, rowid FROM runs WHERE (?1 IS NULL OR session = ?1) "
                    "AND (?2 IS NULL OR status = ?2) AND rowid < ?3 ORDER BY rowid DESC LIMIT ?4",
    [ST_RUN_RESTART] = "UPDATE runs SET restarts = json_insert(restarts, '$[#]', "
                       "json_object('at', ?2, 'cause', ?3)) WHERE id = ?1 "
                       "AND status = 'running' AND json_array_length(restarts) < max_restarts",
    [ST_RUN_END] = "UPDATE runs SET status = ?2, summary = ?3, failure = ?4, finished_at = ?5 "
                   "WHERE id = ?1 AND status = 'running'",
    [ST_RUNS_FAIL_SESSION] = "UPDATE runs SET status = 'failed', failure = ?2, finished_at = ?3 "
                             "WHERE session = ?1 AND status = 'running'",
    [ST_GATE_OPEN] = "INSERT INTO prune_gate(open) VALUES (1)",
    [ST_GATE_CLOSE] = "DELETE FROM prune_gate",
};

struct db {
  sqlite3 *conn;
  sqlite3_stmt *st[ST_COUNT_];
  /* Workers changed by the open transaction: their cached objects are
   * dropped once it has committed (wcache.h). */
  char (*dirty)[16];
  int ndirty, cap_dirty, dirty_all;
};

/* Drops the cached objects of the workers written since the last commit. */
static void dirty_flush(struct db *db) {
  if (db->dirty_all)
    wcache_clear();
  for (int i = 0; i < db->ndirty; i++)
    wcache_invalidate(db->dirty[i]);
  db->ndirty = 0;
  db->dirty_all = 0;
}

/* Notes that worker id's row changed in the open transaction: its cached
 * object is dropped at the commit (a reader must never find the cache
 * emptied before the change is there to be read). */
static void mark_dirty(struct db *db, const char *id) {
  if (db->ndirty == db->cap_dirty) {
    int cap = db->cap_dirty ? 2 * db->cap_dirty : 64;
    char(*grown)[16] = realloc(db->dirty, (size_t)cap * sizeof(*grown));
    if (!grown) {
      db->dirty_all = 1;
      return;
    }
    db->dirty = grown;
    db->cap_dirty = cap;
  }
  snprintf(db->dirty[db->ndirty++], sizeof(db->dirty[0]), "%s", id);
}

static json_t *col_text(sqlite3_stmt *s, int i);

/* Returns the cached statement i, reset and with its bindings cleared. */
static sqlite3_stmt *stmt(struct db *db, int i) {
  sqlite3_stmt *s = db->st[i];

  sqlite3_reset(s);
  sqlite3_clear_bindings(s);
  return s;
}

static void bind_text_or_null(sqlite3_stmt *s, int i, const char *v) {
  if (v)
    sqlite3_bind_text(s, i, v, -1, SQLITE_TRANSIENT);
  else
    sqlite3_bind_null(s, i);
}

static void bind_int_or_null(sqlite3_stmt *s, int i, int v) {
  if (v >= 0)
    sqlite3_bind_int(s, i, v);
  else
    sqlite3_bind_null(s, i);
}

/* Steps a statement that returns no rows. */
static int exec_stmt(sqlite3_stmt *s) {
  int rc = sqlite3_step(s);

  sqlite3_reset(s);
  return rc == SQLITE_DONE ? 0 : MUSTER_E_DB;
}

static MUST_CHECK int apply_migrations(struct db *db, char *errbuf, size_t errlen) {
  sqlite3_stmt *s = NULL;
  int version = 0, rc;
  char *err = NULL;

  if (sqlite3_prepare_v2(db->conn, "PRAGMA user_version", -1, &s, NULL) != SQLITE_OK)
    goto db_error;
  if (sqlite3_step(s) == SQLITE_ROW)
    version = sqlite3_column_int(s, 0);
  sqlite3_finalize(s);

  if (version > db_migration_count) {
    snprintf(errbuf, errlen,
             "the database was written by a newer muster (schema version %d; this "
             "muster-controller knows versions up to %d): upgrade muster or use another "
             "--state-dir; the database was left as it is",
             version, db_migration_count);
    return MUSTER_E_SCHEMA_TOO_NEW;
  }
  if (version == db_migration_count)
    return 0;

  /* All pending migrations in one transaction: either the database moves
   * to the binary's version or it stays exactly as it was. */
  if (sqlite3_exec(db->conn, "BEGIN EXCLUSIVE", NULL, NULL, &err) != SQLITE_OK)
    goto exec_error;
  for (int i = version; i < db_migration_count; i++) {
    char pragma[64];

    if (sqlite3_exec(db->conn, db_migrations[i].sql, NULL, NULL, &err) != SQLITE_OK) {
      snprintf(errbuf, errlen, "migration %s failed: %s", db_migrations[i].name, err ? err : "?");
      sqlite3_free(err);
      sqlite3_exec(db->conn, "ROLLBACK", NULL, NULL, NULL);
      return MUSTER_E_DB;
    }
    snprintf(pragma, sizeof(pragma), "PRAGMA user_version = %d", i + 1);
    if (sqlite3_exec(db->conn, pragma, NULL, NULL, &err) != SQLITE_OK) {
      sqlite3_exec(db->conn, "ROLLBACK", NULL, NULL, NULL);
      goto exec_error;
    }
  }
  rc = sqlite3_exec(db->conn, "COMMIT", NULL, NULL, &err);
  if (rc != SQLITE_OK)
    goto exec_error;
  return 0;

exec_error:
  snprintf(errbuf, errlen, "could not migrate the database: %s", err ? err : "?");
  sqlite3_free(err);
  return MUSTER_E_DB;
db_error:
  snprintf(errbuf, errlen, "could not read the schema version: %s", sqlite3_errmsg(db->conn));
  return MUSTER_E_DB;
}

/* Opens path; readonly skips the set-up and migrations that only the
 * writer does. */
static MUST_CHECK int db_open_mode(const char *path, int readonly, struct db **out, char *errbuf,
                                   size_t errlen) {
  struct db *db = calloc(1, sizeof(*db));
  int rc, flags = readonly ? SQLITE_OPEN_READONLY : SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE;

  *out = NULL;
  if (!db)
    return MUSTER_E_NOMEM;
  if (sqlite3_open_v2(path, &db->conn, flags | SQLITE_OPEN_NOMUTEX, NULL) != SQLITE_OK) {
    snprintf(errbuf, errlen, "could not open %s: %s", path,
             db->conn ? sqlite3_errmsg(db->conn) : "out of memory");
    rc = MUSTER_E_DB;
    goto fail;
  }
  sqlite3_busy_timeout(db->conn, 5000);
  /* WAL with synchronous=NORMAL: a committed transaction survives a crash
   * (kill -9) of the process; only a power loss can cost the last commits. */
  if (!readonly && sqlite3_exec(db->conn,
                                "PRAGMA journal_mode = WAL; PRAGMA synchronous = NORMAL; "
                                "PRAGMA foreign_keys = ON;",
                                NULL, NULL, NULL) != SQLITE_OK) {
    snprintf(errbuf, errlen, "could not set up %s: %s", path, sqlite3_errmsg(db->conn));
    rc = MUSTER_E_DB;
    goto fail;
  }
  rc = readonly ? 0 : apply_migrations(db, errbuf, errlen);
  if (rc)
    goto fail;
  for (int i = 0; i < ST_COUNT_; i++) {
    if (sqlite3_prepare_v3(db->conn, statement_sql[i], -1, SQLITE_PREPARE_PERSISTENT, &db->st[i],
                           NULL) != SQLITE_OK) {
      snprintf(errbuf, errlen, "could not prepare statement %d: %s", i, sqlite3_errmsg(db->conn));
      rc = MUSTER_E_DB;
      goto fail;
    }
  }
  *out = db;
  return 0;

fail:
  db_close(db);
  return rc;
}

int db_open(const char *path, struct db **out, char *errbuf, size_t errlen) {
  return db_open_mode(path, 0, out, errbuf, errlen);
}

int db_open_reader(const char *path, struct db **out, char *errbuf, size_t errlen) {
  return db_open_mode(path, 1, out, errbuf, errlen);
}

void db_close(struct db *db) {
  if (!db)
    return;
  for (int i = 0; i < ST_COUNT_; i++)
    sqlite3_finalize(db->st[i]);
  sqlite3_close(db->conn);
  free(db->dirty);
  free(db);
}

int db_begin(struct db *db) {
  return exec_stmt(stmt(db, ST_BEGIN));
}
int db_commit(struct db *db) {
  int rc;

  wcache_write_begin();
  rc = exec_stmt(stmt(db, ST_COMMIT));
  dirty_flush(db); /* after a failed commit too: dropping is harmless */
  wcache_write_end();
  return rc;
}

/* Runs a statement that writes worker id's row, outside or inside a
 * transaction, with the cache kept behind no reader. */
static MUST_CHECK int exec_write(struct db *db, sqlite3_stmt *s, const char *id) {
  int rc;

  if (!sqlite3_get_autocommit(db->conn)) {
    rc = exec_stmt(s);
    if (!rc)
      mark_dirty(db, id);
    return rc;
  }
  wcache_write_begin();
  rc = exec_stmt(s);
  wcache_invalidate(id);
  wcache_write_end();
  return rc;
}

void db_rollback(struct db *db) {
  if (!sqlite3_get_autocommit(db->conn))
    (void)exec_stmt(stmt(db, ST_ROLLBACK));
  /* Nothing changed; dropping cached objects is harmless. */
  dirty_flush(db);
}

int db_worker_set_run(struct db *db, const char *id, const char *run) {
  sqlite3_stmt *s = stmt(db, ST_SET_RUN);
  int rc;

  bind_text_or_null(s, 1, id);
  bind_text_or_null(s, 2, run);
  rc = exec_write(db, s, id);
  if (!rc && sqlite3_changes(db->conn) != 1)
    rc = MUSTER_E_CONFLICT;
  return rc;
}

const char *db_errmsg(struct db *db) {
  return sqlite3_errmsg(db->conn);
}

int db_session_touch(struct db *db, const char *name, const char *master_ip) {
  sqlite3_stmt *s = stmt(db, ST_SESSION_TOUCH);
  char now[32], token[64];

  if (util_random_hex(token, 24) != 0)
    return MUSTER_E_IO;
  util_now_iso(now, sizeof(now));
  bind_text_or_null(s, 1, name);
  bind_text_or_null(s, 2, master_ip);
  bind_text_or_null(s, 3, now);
  bind_text_or_null(s, 4, token); /* used only if the session is new */
  return exec_stmt(s);
}

json_t *db_session_json(struct db *db, const char *name) {
  sqlite3_stmt *s = stmt(db, ST_SESSION_GET);
  json_t *o = NULL;

  bind_text_or_null(s, 1, name);
  if (sqlite3_step(s) == SQLITE_ROW) {
    o = json_object();
    json_object_set_new(o, "name", col_text(s, 0));
    json_object_set_new(o, "master_ip", col_text(s, 1));
    json_object_set_new(o, "created_at", col_text(s, 2));
    json_object_set_new(o, "exec_token", col_text(s, 3));
  }
  sqlite3_reset(s);
  return o;
}

static int event_insert(struct db *db, const char *id, const char *at, const char *from,
                        const char *to, const char *detail) {
  sqlite3_stmt *s = stmt(db, ST_EVENT_INSERT);

  bind_text_or_null(s, 1, id);
  bind_text_or_null(s, 2, at);
  bind_text_or_null(s, 3, from);
  bind_text_or_null(s, 4, to);
  bind_text_or_null(s, 5, detail);
  return exec_stmt(s);
}

int db_worker_insert(struct db *db, const struct db_worker_new *w) {
  sqlite3_stmt *s = stmt(db, ST_WORKER_INSERT);
  char now[32];
  int rc;

  util_now_iso(now, sizeof(now));
  bind_text_or_null(s, 1, w->id);
  bind_text_or_null(s, 2, w->session);
  bind_text_or_null(s, 3, w->name);
  bind_text_or_null(s, 4, w->role);
  sqlite3_bind_double(s, 5, w->cpu);
  sqlite3_bind_double(s, 6, w->memory);
  sqlite3_bind_int(s, 7, w->nvidia_gpu);
  bind_text_or_null(s, 8, w->script);
  bind_text_or_null(s, 9, w->code);
  bind_text_or_null(s, 10, w->command_json);
  bind_text_or_null(s, 11, w->kernel);
  bind_text_or_null(s, 12, w->args_json);
  bind_text_or_null(s, 13, w->env_json);
  bind_text_or_null(s, 14, w->secret_env_json);
  bind_text_or_null(s, 15, w->token);
  bind_text_or_null(s, 16, w->master_ip);
  bind_text_or_null(s, 17, w->backend);
  bind_text_or_null(s, 18, now);
  bind_text_or_null(s, 19, w->launch_id);
  bind_text_or_null(s, 20, w->run);
  rc = exec_stmt(s);
  if (rc)
    return rc;
  return event_insert(db, w->id, now, NULL, "scheduling", "launched");
}

int db_worker_transition(struct db *db, const char *id, const char *from, const char *to,
                         const struct db_fields *f, const char *detail) {
  sqlite3_stmt *s = stmt(db, ST_TRANSITION);
  char now[32];
  int rc;

  util_now_iso(now, sizeof(now));
  bind_text_or_null(s, 1, id);
  bind_text_or_null(s, 2, to);
  bind_text_or_null(s, 3, f->ip_address);
  bind_text_or_null(s, 4, f->hostname);
  bind_text_or_null(s, 5, f->backend_ref);
  bind_text_or_null(s, 6, f->failure);
  bind_int_or_null(s, 7, f->exec_port);
  bind_int_or_null(s, 8, f->pid);
  bind_int_or_null(s, 9, f->exit_code);
  bind_int_or_null(s, 10, f->signal);
  bind_text_or_null(s, 11, f->set_running_at ? now : NULL);
  bind_text_or_null(s, 12, f->set_finished_at ? now : NULL);
  bind_text_or_null(s, 13, f->set_heartbeat ? now : NULL);
  bind_text_or_null(s, 14, f->bind_ip);
  bind_text_or_null(s, 15, f->gpu_indices);
  bind_text_or_null(s, 16, from);
  bind_int_or_null(s, 17, f->attempt);
  rc = exec_stmt(s);
  if (rc)
    return rc;
  /* The WHERE clause names the expected old status: if the row moved on
   * underneath us, nothing changed and the transition is refused. */
  if (sqlite3_changes(db->conn) != 1)
    return MUSTER_E_CONFLICT;
  mark_dirty(db, id);
  return event_insert(db, id, now, from, to, detail);
}

int db_worker_usage(struct db *db, const char *id, const struct db_usage *u) {
  sqlite3_stmt *s = stmt(db, ST_USAGE);

  bind_text_or_null(s, 1, id);
  sqlite3_bind_double(s, 2, u->cpu_seconds);
  sqlite3_bind_int64(s, 3, u->memory_bytes);
  sqlite3_bind_int64(s, 4, u->memory_peak_bytes);
  return exec_write(db, s, id);
}

int db_worker_touch_heartbeat(struct db *db, const char *id) {
  sqlite3_stmt *s = stmt(db, ST_HEARTBEAT);
  char now[32];
  int rc;

  util_now_iso(now, sizeof(now));
  bind_text_or_null(s, 1, id);
  bind_text_or_null(s, 2, now);
  rc = exec_write(db, s, id);
  return rc;
}

static json_t *col_text(sqlite3_stmt *s, int i) {
  const unsigned char *v = sqlite3_column_text(s, i);

  return v ? json_string((const char *)v) : json_null();
}

static json_t *col_int(sqlite3_stmt *s, int i) {
  return sqlite3_column_type(s, i) == SQLITE_NULL ? json_null()
                                                  : json_integer(sqlite3_column_int64(s, i));
}

/* Parses a JSON column, falling back to fallback (a new reference). */
static json_t *col_json(sqlite3_stmt *s, int i, json_t *fallback) {
  const char *v = (const char *)sqlite3_column_text(s, i);
  json_t *j = v ? json_loads(v, 0, NULL) : NULL;

  if (!j)
    return fallback;
  json_decref(fallback);
  return j;
}

/* Builds the API worker object from a row of WORKER_COLS. New reference. */
static json_t *row_to_worker(sqlite3_stmt *s) {
  json_t *w = json_object();
  json_t *secret = col_json(s, 14, json_object());
  json_t *secret_keys = json_array();
  const char *key;
  json_t *val;
  double memory;

  json_object_foreach(secret, key, val) json_array_append_new(secret_keys, json_string(key));
  json_decref(secret);
  memory = sqlite3_column_double(s, 6);

  json_object_set_new(w, "id", col_text(s, 0));
  json_object_set_new(w, "session", col_text(s, 1));
  json_object_set_new(w, "name", col_text(s, 2));
  json_object_set_new(w, "role", col_text(s, 3));
  json_object_set_new(w, "status", col_text(s, 4));
  json_object_set_new(w, "cpu", json_real(sqlite3_column_double(s, 5)));
  json_object_set_new(w, "memory", json_real(memory));
  json_object_set_new(w, "nvidia_gpu", json_integer(sqlite3_column_int(s, 7)));
  json_object_set_new(w, "script", col_text(s, 8));
  json_object_set_new(w, "code", col_text(s, 9));
  json_object_set_new(w, "command", col_json(s, 10, json_null()));
  json_object_set_new(w, "kernel", col_text(s, 11));
  json_object_set_new(w, "args", col_json(s, 12, json_array()));
  json_object_set_new(w, "env", col_json(s, 13, json_object()));
  json_object_set_new(w, "secret_env", secret_keys);
  json_object_set_new(w, "ip_address", col_text(s, 15));
  json_object_set_new(w, "hostname", col_text(s, 16));
  json_object_set_new(w, "exec_port", col_int(s, 17));
  json_object_set_new(w, "backend", col_text(s, 18));
  json_object_set_new(w, "backend_ref", col_text(s, 19));
  json_object_set_new(w, "exit_code", col_int(s, 20));
  json_object_set_new(w, "signal", col_int(s, 26));
  json_object_set_new(w, "failure", col_text(s, 21));
  json_object_set_new(w, "created_at", col_text(s, 22));
  json_object_set_new(w, "running_at", col_text(s, 23));
  json_object_set_new(w, "finished_at", col_text(s, 24));
  json_object_set_new(w, "last_heartbeat", col_text(s, 25));
  json_object_set_new(w, "attempt", json_integer(sqlite3_column_int(s, 27)));
  json_object_set_new(w, "waiting_for", col_text(s, 28));
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
  json_object_set_new(w, "run", col_text(s, 32));
  return w;
}

json_t *db_worker_json(struct db *db, const char *id) {
  sqlite3_stmt *s = stmt(db, ST_WORKER_GET);
  json_t *w = NULL;

  bind_text_or_null(s, 1, id);
  if (sqlite3_step(s) == SQLITE_ROW)
    w = row_to_worker(s);
  sqlite3_reset(s);
  return w;
}

static void copy_col(sqlite3_stmt *s, int i, char *dst, size_t size) {
  const char *v = (const char *)sqlite3_column_text(s, i);

  snprintf(dst, size, "%s", v ? v : "");
}

/* Steps s, a bound page query of (id, rowid) rows asking for limit + 1:
 * copies up to limit ids, and sets *next to the cursor of the page after
 * (0 if there is none). */
static int page_ids(sqlite3_stmt *s, int limit, char (*ids)[16], int *n, int64_t *next) {
  int64_t last = 0;
  int rc;

  *n = 0;
  *next = 0;
  while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
    if (*n == limit) {
      *next = last;
      continue;
    }
    copy_col(s, 0, ids[(*n)++], sizeof(ids[0]));
    last = sqlite3_column_int64(s, 1);
  }
  sqlite3_reset(s);
  return rc == SQLITE_DONE ? 0 : MUSTER_E_DB;
}

int db_worker_page(struct db *db, const char *statuses_json, const char *session, const char *role,
                   const char *run, int64_t before, int limit, char (*ids)[16], int *n,
                   int64_t *next) {
  sqlite3_stmt *s = stmt(db, ST_WORKER_LIST);

  bind_text_or_null(s, 1, statuses_json);
  bind_text_or_null(s, 2, session);
  bind_text_or_null(s, 3, role);
  bind_text_or_null(s, 6, run);
  sqlite3_bind_int64(s, 4, before > 0 ? before : INT64_MAX);
  /* One row more than asked for tells whether there is a next page. */
  sqlite3_bind_int(s, 5, limit + 1);
  return page_ids(s, limit, ids, n, next);
}

static char *dup_col(sqlite3_stmt *s, int i) {
  const char *v = (const char *)sqlite3_column_text(s, i);

  return v ? strdup(v) : NULL;
}

static void row_to_info(sqlite3_stmt *s, struct db_worker_info *o) {
  memset(o, 0, sizeof(*o));
  copy_col(s, 0, o->id, sizeof(o->id));
  copy_col(s, 1, o->status, sizeof(o->status));
  copy_col(s, 2, o->token, sizeof(o->token));
  copy_col(s, 3, o->session, sizeof(o->session));
  copy_col(s, 4, o->master_ip, sizeof(o->master_ip));
  copy_col(s, 5, o->bind_ip, sizeof(o->bind_ip));
  copy_col(s, 6, o->gpu_indices, sizeof(o->gpu_indices));
  copy_col(s, 7, o->kernel, sizeof(o->kernel));
  o->cpu = sqlite3_column_double(s, 8);
  o->memory = sqlite3_column_double(s, 9);
  o->nvidia_gpu = sqlite3_column_int(s, 10);
  o->pid = sqlite3_column_type(s, 11) == SQLITE_NULL ? -1 : sqlite3_column_int64(s, 11);
  o->script = dup_col(s, 12);
  o->code = dup_col(s, 13);
  o->command_json = dup_col(s, 14);
  o->args_json = dup_col(s, 15);
  o->env_json = dup_col(s, 16);
  o->secret_env_json = dup_col(s, 17);
  o->name = dup_col(s, 18);
  o->role = dup_col(s, 19);
  o->attempt = sqlite3_column_int(s, 20);
  o->backend_ref = dup_col(s, 21);
  copy_col(s, 22, o->launch_id, sizeof(o->launch_id));
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
  memset(o, 0, sizeof(*o));
}

int db_worker_info(struct db *db, const char *id, struct db_worker_info *out) {
  sqlite3_stmt *s = stmt(db, ST_WORKER_INFO);
  int rc;

  bind_text_or_null(s, 1, id);
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
  sqlite3_stmt *s = stmt(db, ST_LIVE);
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

int db_events_since(struct db *db, int64_t since, int limit, char **out, size_t *outlen,
                    int64_t *last) {
  sqlite3_stmt *s = stmt(db, ST_EVENTS_SINCE);
  char *buf = NULL;
  size_t len = 0;
  int n = 0, rc;

  *out = NULL;
  *outlen = 0;
  sqlite3_bind_int64(s, 1, since);
  sqlite3_bind_int(s, 2, limit);
  while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
    json_t *e = json_object();
    char *data, *grown;
    int64_t seq = sqlite3_column_int64(s, 0);
    size_t need;

    json_object_set_new(e, "seq", json_integer(seq));
    json_object_set_new(e, "worker_id", col_text(s, 1));
    json_object_set_new(e, "from", col_text(s, 2));
    json_object_set_new(e, "to", col_text(s, 3));
    json_object_set_new(e, "at", col_text(s, 4));
    json_object_set_new(e, "detail", col_text(s, 5));
    data = json_dumps(e, JSON_COMPACT);
    json_decref(e);
    if (!data)
      goto nomem;
    need = strlen(data) + 48;
    grown = realloc(buf, len + need);
    if (!grown) {
      free(data);
      goto nomem;
    }
    buf = grown;
    len += (size_t)snprintf(buf + len, need, "id: %lld\ndata: %s\n\n", (long long)seq, data);
    free(data);
    *last = seq;
    n++;
  }
  sqlite3_reset(s);
  if (rc != SQLITE_DONE) {
    free(buf);
    return MUSTER_E_DB;
  }
  *out = buf;
  *outlen = len;
  return n;

nomem:
  sqlite3_reset(s);
  free(buf);
  return MUSTER_E_NOMEM;
}

int64_t db_last_event_seq(struct db *db) {
  sqlite3_stmt *s = stmt(db, ST_LAST_SEQ);
  int64_t v = 0;

  if (sqlite3_step(s) == SQLITE_ROW)
    v = sqlite3_column_int64(s, 0);
  sqlite3_reset(s);
  return v;
}

json_t *db_status_counts(struct db *db) {
  static const char *const names[] = {
#define MUSTER_X_STATUS(sym, name, terminal) name,
      MUSTER_STATUSES(MUSTER_X_STATUS)
#undef MUSTER_X_STATUS
  };
  sqlite3_stmt *s = stmt(db, ST_COUNTS);
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
  sqlite3_stmt *s = stmt(db, ST_LIVE_USAGE);

  while (sqlite3_step(s) == SQLITE_ROW) {
    struct db_usage u = {sqlite3_column_double(s, 1), sqlite3_column_int64(s, 2),
                         sqlite3_column_int64(s, 3)};
    fn(arg, (const char *)sqlite3_column_text(s, 0), &u);
  }
  sqlite3_reset(s);
}

int db_worker_set_ref(struct db *db, const char *id, int attempt, const char *ref) {
  sqlite3_stmt *s = stmt(db, ST_SET_REF);
  int rc;

  bind_text_or_null(s, 1, id);
  bind_text_or_null(s, 2, ref);
  sqlite3_bind_int(s, 3, attempt);
  rc = exec_write(db, s, id);
  return rc;
}

int db_worker_set_waiting(struct db *db, const char *id, const char *why) {
  sqlite3_stmt *s = stmt(db, ST_SET_WAITING);
  int rc;

  bind_text_or_null(s, 1, id);
  bind_text_or_null(s, 2, why);
  rc = exec_write(db, s, id);
  return rc;
}

/* Ended runs go with their last worker; sessions after their workers and
 * runs, unless they hold a lease. */
static int prune_runs_sessions(struct db *db, const char *cutoff) {
  sqlite3_stmt *s = stmt(db, ST_PRUNE_RUNS);
  int rc;

  bind_text_or_null(s, 1, cutoff);
  rc = exec_stmt(s);
  if (rc)
    return rc;
  s = stmt(db, ST_PRUNE_SESSIONS);
  bind_text_or_null(s, 1, cutoff);
  return exec_stmt(s);
}

int db_prune(struct db *db, const char *cutoff, int max, char (*ids)[16], int *n) {
  sqlite3_stmt *s = stmt(db, ST_PRUNE_PICK);
  int rc, i;

  *n = 0;
  bind_text_or_null(s, 1, cutoff);
  sqlite3_bind_int(s, 2, max);
  while ((rc = sqlite3_step(s)) == SQLITE_ROW && *n < max)
    copy_col(s, 0, ids[(*n)++], sizeof(ids[0]));
  sqlite3_reset(s);
  if (rc != SQLITE_DONE && rc != SQLITE_ROW)
    return MUSTER_E_DB;
  /* No worker to prune: ended runs without workers, and idle sessions,
   * may still be old enough (no trigger guards those two tables). */
  if (*n == 0)
    return prune_runs_sessions(db, cutoff);
  rc = db_begin(db);
  if (rc)
    return rc;
  rc = exec_stmt(stmt(db, ST_GATE_OPEN));
  for (i = 0; !rc && i < *n; i++) {
    s = stmt(db, ST_PRUNE_EVENTS);
    bind_text_or_null(s, 1, ids[i]);
    rc = exec_stmt(s);
    if (rc)
      break;
    s = stmt(db, ST_PRUNE_WORKER);
    bind_text_or_null(s, 1, ids[i]);
    rc = exec_stmt(s);
    mark_dirty(db, ids[i]);
  }
  if (!rc)
    rc = prune_runs_sessions(db, cutoff);
  if (!rc)
    rc = exec_stmt(stmt(db, ST_GATE_CLOSE));
  if (!rc)
    rc = db_commit(db);
  if (rc) {
    db_rollback(db);
    *n = 0;
  }
  return rc;
}

/* ---- sessions' leases ---- */

int db_lease_set(struct db *db, const char *name, double ttl) {
  sqlite3_stmt *s;
  int rc = ttl > 0 ? db_session_touch(db, name, NULL) : 0;

  if (rc)
    return rc;
  s = stmt(db, ST_LEASE_SET);
  bind_text_or_null(s, 1, name);
  if (ttl > 0)
    sqlite3_bind_double(s, 2, ttl);
  return exec_stmt(s);
}

int db_leases(struct db *db, void (*fn)(void *arg, const char *session, double ttl), void *arg) {
  sqlite3_stmt *s = stmt(db, ST_LEASES);
  int rc;

  while ((rc = sqlite3_step(s)) == SQLITE_ROW)
    fn(arg, (const char *)sqlite3_column_text(s, 0), sqlite3_column_double(s, 1));
  sqlite3_reset(s);
  return rc == SQLITE_DONE ? 0 : MUSTER_E_DB;
}

/* ---- runs ---- */

int db_run_insert(struct db *db, const struct db_run_new *r) {
  sqlite3_stmt *s = stmt(db, ST_RUN_INSERT);
  char now[32];

  util_now_iso(now, sizeof(now));
  bind_text_or_null(s, 1, r->id);
  bind_text_or_null(s, 2, r->session);
  bind_text_or_null(s, 3, r->mode);
  bind_text_or_null(s, 4, r->command_json);
  sqlite3_bind_int(s, 5, r->max_restarts);
  bind_text_or_null(s, 6, now);
  return exec_stmt(s);
}

json_t *db_run_json(struct db *db, const char *id) {
  sqlite3_stmt *s = stmt(db, ST_RUN_GET);
  json_t *o, *workers, *restarts, *summary = NULL;

  bind_text_or_null(s, 1, id);
  if (sqlite3_step(s) != SQLITE_ROW) {
    sqlite3_reset(s);
    return NULL;
  }
  restarts = col_json(s, 6, json_array());
  if (sqlite3_column_type(s, 9) != SQLITE_NULL)
    summary = json_loads((const char *)sqlite3_column_text(s, 9), JSON_DECODE_ANY, NULL);
  o = json_object();
  json_object_set_new(o, "id", col_text(s, 0));
  json_object_set_new(o, "session", col_text(s, 1));
  json_object_set_new(o, "mode", col_text(s, 2));
  json_object_set_new(o, "command", col_json(s, 3, json_array()));
  json_object_set_new(o, "status", col_text(s, 4));
  json_object_set_new(o, "max_restarts", json_integer(sqlite3_column_int(s, 5)));
  json_object_set_new(o, "restarts", json_integer((json_int_t)json_array_size(restarts)));
  json_object_set_new(o, "causes", restarts);
  json_object_set_new(o, "created_at", col_text(s, 7));
  json_object_set_new(o, "finished_at", col_text(s, 8));
  json_object_set_new(o, "summary", summary ? summary : json_null());
  json_object_set_new(o, "failure", col_text(s, 10));
  sqlite3_reset(s);

  /* Its workers, replacements included, in launch order. */
  workers = json_array();
  s = stmt(db, ST_RUN_WORKERS);
  bind_text_or_null(s, 1, id);
  while (sqlite3_step(s) == SQLITE_ROW)
    json_array_append_new(workers, col_text(s, 0));
  sqlite3_reset(s);
  json_object_set_new(o, "workers", workers);
  return o;
}

int db_run_page(struct db *db, const char *session, const char *status, int64_t before, int limit,
                char (*ids)[16], int *n, int64_t *next) {
  sqlite3_stmt *s = stmt(db, ST_RUN_LIST);

  bind_text_or_null(s, 1, session);
  bind_text_or_null(s, 2, status);
  sqlite3_bind_int64(s, 3, before > 0 ? before : INT64_MAX);
  sqlite3_bind_int(s, 4, limit + 1);
  return page_ids(s, limit, ids, n, next);
}

int db_run_state(struct db *db, const char *id, char *status, size_t slen, char *session,
                 size_t sesslen) {
  sqlite3_stmt *s = stmt(db, ST_RUN_GET);
  int rc = MUSTER_E_NOT_FOUND;

  bind_text_or_null(s, 1, id);
  if (sqlite3_step(s) == SQLITE_ROW) {
    copy_col(s, 4, status, slen);
    copy_col(s, 1, session, sesslen);
    rc = 0;
  }
  sqlite3_reset(s);
  return rc;
}

/* Runs s, a bound conditional update of run id: MUSTER_E_NOT_FOUND if
 * there is no such run, MUSTER_E_CONFLICT if the condition kept it as it
 * was. */
static int run_update(struct db *db, sqlite3_stmt *s, const char *id) {
  char status[16], session[72];
  int rc = exec_stmt(s);

  if (rc || sqlite3_changes(db->conn) == 1)
    return rc;
  rc = db_run_state(db, id, status, sizeof(status), session, sizeof(session));
  return rc ? rc : MUSTER_E_CONFLICT;
}

int db_run_restart(struct db *db, const char *id, const char *cause) {
  sqlite3_stmt *s = stmt(db, ST_RUN_RESTART);
  char now[32];

  util_now_iso(now, sizeof(now));
  bind_text_or_null(s, 1, id);
  bind_text_or_null(s, 2, now);
  bind_text_or_null(s, 3, cause);
  return run_update(db, s, id);
}

int db_run_end(struct db *db, const char *id, const char *status, const char *summary_json,
               const char *failure) {
  sqlite3_stmt *s = stmt(db, ST_RUN_END);
  char now[32];

  util_now_iso(now, sizeof(now));
  bind_text_or_null(s, 1, id);
  bind_text_or_null(s, 2, status);
  bind_text_or_null(s, 3, summary_json);
  bind_text_or_null(s, 4, failure);
  bind_text_or_null(s, 5, now);
  return run_update(db, s, id);
}

int db_runs_fail_session(struct db *db, const char *session, const char *failure, int *n) {
  sqlite3_stmt *s = stmt(db, ST_RUNS_FAIL_SESSION);
  char now[32];
  int rc;

  util_now_iso(now, sizeof(now));
  bind_text_or_null(s, 1, session);
  bind_text_or_null(s, 2, failure);
  bind_text_or_null(s, 3, now);
  rc = exec_stmt(s);
  *n = rc ? 0 : sqlite3_changes(db->conn);
  return rc;
}
