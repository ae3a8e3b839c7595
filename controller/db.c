/* db.c: the SQLite store's connection: opening, migrations, the prepared
 * statements, transactions and the cache invalidation they carry, and the
 * helpers that the query files (db_*.c) share. See db.h and db_internal.h. */
#include "db_internal.h"

#include "muster_errors.h"
#include "wcache.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define WORKER_COLS                                                                                \
  "id, session, name, role, status, cpu, memory, nvidia_gpu, script, code, command, "              \
  "kernel, args, env, secret_env, ip_address, hostname, exec_port, backend, "                      \
  "backend_ref, exit_code, failure, created_at, running_at, finished_at, "                         \
  "last_heartbeat, signal, attempt, waiting_for, usage_cpu_seconds, usage_memory_bytes, "          \
  "usage_memory_peak_bytes, run, cwd, path, owner"

#define INFO_COLS                                                                                  \
  "id, status, token, session, master_ip, bind_ip, gpu_indices, kernel, cpu, memory, "             \
  "nvidia_gpu, pid, script, code, command, args, env, secret_env, name, role, attempt, "           \
  "backend_ref, launch_id, cwd, path, run, heartbeat_interval_ms, owner, hostname"

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
        "created_at, launch_id, run, cwd, path, owner) VALUES (?1, ?2, ?3, ?4, 'scheduling', ?5, "
        "?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, ?18, ?19, ?20, ?21, ?22, ?23)",
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
    [ST_HEARTBEAT] =
        "UPDATE workers SET last_heartbeat = ?2, heartbeat_interval_ms = ?3 WHERE id = ?1",
    [ST_USAGE] = "UPDATE workers SET usage_cpu_seconds = ?2, usage_memory_bytes = ?3, "
                 "usage_memory_peak_bytes = ?4 WHERE id = ?1",
    [ST_WORKER_GET] = "SELECT " WORKER_COLS " FROM workers WHERE id = ?1",
    [ST_WORKER_LIST] = "SELECT id, rowid FROM workers "
                       "WHERE (?1 IS NULL OR status IN (SELECT value FROM json_each(?1))) "
                       "AND (?2 IS NULL OR session = ?2) AND (?3 IS NULL OR role = ?3) "
                       "AND (?6 IS NULL OR run = ?6) "
                       "AND (?7 IS NULL OR substr(session, 1, length(?7)) = ?7) "
                       "AND rowid < ?4 ORDER BY rowid DESC LIMIT ?5",
    [ST_WORKER_INFO] = "SELECT " INFO_COLS " FROM workers WHERE id = ?1",
    [ST_LIVE] = "SELECT " INFO_COLS " FROM workers "
                "WHERE status IN ('scheduling', 'starting', 'running') ORDER BY rowid",
    [ST_EVENTS_SINCE] = "SELECT seq, worker_id, \"from\", \"to\", at, detail FROM events "
                        "WHERE seq > ?1 ORDER BY seq LIMIT ?2",
    /* One statement, so one snapshot: no row means no such worker, a row
     * with a NULL seq a worker without events. The newest ?2 events,
     * returned oldest first. */
    [ST_WORKER_EVENTS] = "SELECT e.seq, e.\"from\", e.\"to\", e.at, e.detail FROM workers w "
                         "LEFT JOIN (SELECT seq, \"from\", \"to\", at, detail FROM events "
                         "WHERE worker_id = ?1 ORDER BY seq DESC LIMIT ?2) e "
                         "WHERE w.id = ?1 ORDER BY e.seq",
    [ST_LAST_SEQ] = "SELECT coalesce(max(seq), 0) FROM events",
    [ST_COUNTS] = "SELECT status, count(*) FROM workers "
                  "WHERE status IN ('succeeded', 'failed', 'stopped') GROUP BY status",
    [ST_LIVE_USAGE] =
        "SELECT id, usage_cpu_seconds, usage_memory_bytes, usage_memory_peak_bytes "
        "FROM workers INDEXED BY workers_live_usage WHERE status IN ('starting', 'running') "
        "AND usage_cpu_seconds IS NOT NULL ORDER BY id",
    [ST_SET_REF] = "UPDATE workers SET backend_ref = ?2 WHERE id = ?1 AND attempt = ?3 "
                   "AND status IN ('starting', 'running')",
    [ST_SET_WAITING] = "UPDATE workers SET waiting_for = ?2 WHERE id = ?1 "
                       "AND status = 'scheduling'",
    [ST_SET_TOKEN] = "UPDATE workers SET token = ?2 WHERE id = ?1",
    [ST_PRUNE_PICK] = "SELECT id FROM workers WHERE finished_at IS NOT NULL "
                      "AND finished_at < ?1 AND status IN ('succeeded', 'failed', 'stopped') "
                      "LIMIT ?2",
    [ST_PRUNE_EVENTS] = "DELETE FROM events WHERE worker_id = ?1",
    [ST_PRUNE_WORKER] = "DELETE FROM workers WHERE id = ?1",
    [ST_PRUNE_SESSIONS] = "DELETE FROM sessions WHERE created_at < ?1 "
                          "AND NOT EXISTS (SELECT 1 FROM lease_holders WHERE "
                          "lease_holders.session = sessions.name AND expired_at IS NULL) "
                          "AND NOT EXISTS "
                          "(SELECT 1 FROM workers WHERE workers.session = sessions.name) "
                          "AND NOT EXISTS (SELECT 1 FROM runs WHERE runs.session = sessions.name)",
    [ST_PRUNE_RUNS] = "DELETE FROM runs WHERE status <> 'running' AND finished_at < ?1 "
                      "AND NOT EXISTS (SELECT 1 FROM workers WHERE workers.run = runs.id)",
    [ST_SET_RUN] = "UPDATE workers SET run = ?2 WHERE id = ?1 AND run IS NULL",
    [ST_PRUNE_HOLDERS] = "DELETE FROM lease_holders WHERE expired_at < ?1",
    [ST_HOLDER_SET] = "INSERT INTO lease_holders(session, holder, ttl_seconds, stop_workers) "
                      "VALUES (?1, ?2, ?3, ?4) ON CONFLICT(session, holder) DO UPDATE SET "
                      "ttl_seconds = ?3, stop_workers = ?4, expired_at = NULL, "
                      "workers_stopped = 0",
    [ST_HOLDER_DROP] = "DELETE FROM lease_holders WHERE session = ?1 AND holder = ?2",
    [ST_HOLDER_EXPIRE] = "UPDATE lease_holders SET expired_at = ?3, workers_stopped = ?4 "
                         "WHERE session = ?1 AND holder = ?2",
    [ST_HOLDERS_STOPPED] = "UPDATE lease_holders SET workers_stopped = 1 WHERE session = ?1 "
                           "AND expired_at IS NOT NULL",
    [ST_HOLDER_PAST] = "SELECT workers_stopped FROM lease_holders WHERE session = ?1 "
                       "AND holder = ?2 AND expired_at IS NOT NULL",
    [ST_HOLDERS] = "SELECT session, holder, ttl_seconds, stop_workers FROM lease_holders "
                   "WHERE expired_at IS NULL ORDER BY session, holder",
    [ST_RUN_INSERT] = "INSERT INTO runs(id, session, mode, command, status, max_restarts, "
                      "created_at, holder) VALUES (?1, ?2, ?3, ?4, 'running', ?5, ?6, ?7)",
    [ST_RUN_GET] =
        "SELECT id, session, mode, command, status, max_restarts, restarts, "
        "created_at, finished_at, summary, failure, holder, stalls FROM runs WHERE id = ?1",
    [ST_RUN_WORKERS] = "SELECT id FROM workers WHERE run = ?1 ORDER BY rowid",
    [ST_RUN_LIST] = "SELECT id, rowid FROM runs WHERE (?1 IS NULL OR session = ?1) "
                    "AND (?2 IS NULL OR status = ?2) "
                    "AND (?5 IS NULL OR substr(session, 1, length(?5)) = ?5) "
                    "AND rowid < ?3 ORDER BY rowid DESC LIMIT ?4",
    [ST_RUN_RESTART] = "UPDATE runs SET restarts = json_insert(restarts, '$[#]', "
                       "json_object('at', ?2, 'cause', ?3)) WHERE id = ?1 "
                       "AND status = 'running' AND json_array_length(restarts) < max_restarts",
    [ST_RUN_STALL] = "UPDATE runs SET stalls = json_insert(stalls, '$[#]', "
                     "json_object('at', ?2, 'report', ?3)) WHERE id = ?1 "
                     "AND status = 'running' AND json_array_length(stalls) < 20",
    [ST_RUN_END] = "UPDATE runs SET status = ?2, summary = ?3, failure = ?4, finished_at = ?5 "
                   "WHERE id = ?1 AND status = 'running'",
    [ST_RUNS_FAIL_SESSION] = "UPDATE runs SET status = 'failed', failure = ?2, finished_at = ?3 "
                             "WHERE session = ?1 AND status = 'running'",
    [ST_RUNS_FAIL_HOLDER] = "UPDATE runs SET status = 'failed', failure = ?3, finished_at = ?4 "
                            "WHERE session = ?1 AND holder = ?2 AND status = 'running'",
    [ST_GATE_OPEN] = "INSERT INTO prune_gate(open) VALUES (1)",
    [ST_GATE_CLOSE] = "DELETE FROM prune_gate",
    [ST_MS_GET] = "SELECT id, bucket, nrows FROM metric_series "
                  "WHERE run = ?1 AND level = ?4 AND name = ?2 AND rank = ?3",
    [ST_MS_INSERT] = "INSERT INTO metric_series(run, name, rank, level) VALUES (?1, ?2, ?3, ?4)",
    [ST_MS_COUNT] = "SELECT count(*) FROM metric_series WHERE run = ?1 AND level = 0",
    [ST_MS_UPDATE] = "UPDATE metric_series SET bucket = ?2, nrows = ?3, points = points + ?4 "
                     "WHERE id = ?1",
    [ST_MS_OF_RUN] = "SELECT id, name, rank, points FROM metric_series WHERE run = ?1 "
                     "AND level = ?2 ORDER BY name, rank",
    [ST_MP_LAST] = "SELECT id, step, epoch, at, value, vmin, vmax, n FROM metric_points "
                   "WHERE series = ?1 ORDER BY id DESC LIMIT 1",
    [ST_MP_INSERT] = "INSERT INTO metric_points(series, step, epoch, at, value, vmin, vmax, n, "
                     "id) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
    [ST_MP_NEXT_GET] = "SELECT id FROM metric_next",
    [ST_MP_NEXT_SET] = "UPDATE metric_next SET id = ?1",
    [ST_MP_DELETE] = "DELETE FROM metric_points WHERE series = ?1 AND id = ?2",
    [ST_MP_DELETE_SERIES] = "DELETE FROM metric_points WHERE series = ?1",
    [ST_MP_ROWS] = "SELECT id, step, epoch, at, value, vmin, vmax, n FROM metric_points "
                   "WHERE series = ?1 AND id > ?2 ORDER BY id",
    [ST_MSEND_GET] = "SELECT seq FROM metric_senders WHERE run = ?1 AND sender = ?2",
    [ST_MSEND_SET] = "INSERT INTO metric_senders(run, sender, seq) VALUES (?1, ?2, ?3) "
                     "ON CONFLICT(run, sender) DO UPDATE SET seq = excluded.seq",
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
void db_mark_dirty(struct db *db, const char *id) {
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

/* Returns the cached statement i, reset and with its bindings cleared. */
sqlite3_stmt *db_stmt(struct db *db, int i) {
  sqlite3_stmt *s = db->st[i];

  sqlite3_reset(s);
  sqlite3_clear_bindings(s);
  return s;
}

void db_bind_text_or_null(sqlite3_stmt *s, int i, const char *v) {
  if (v)
    sqlite3_bind_text(s, i, v, -1, SQLITE_TRANSIENT);
  else
    sqlite3_bind_null(s, i);
}

void db_bind_int_or_null(sqlite3_stmt *s, int i, int v) {
  if (v >= 0)
    sqlite3_bind_int(s, i, v);
  else
    sqlite3_bind_null(s, i);
}

/* Steps a statement that returns no rows. */
int db_exec_stmt(sqlite3_stmt *s) {
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

void db_autocheckpoint(struct db *db, int pages) {
  sqlite3_wal_autocheckpoint(db->conn, pages);
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
  return db_exec_stmt(db_stmt(db, ST_BEGIN));
}
int db_commit(struct db *db) {
  int rc;

  wcache_write_begin();
  rc = db_exec_stmt(db_stmt(db, ST_COMMIT));
  dirty_flush(db); /* after a failed commit too: dropping is harmless */
  wcache_write_end();
  return rc;
}

/* Runs a statement that writes worker id's row, outside or inside a
 * transaction, with the cache kept behind no reader. */
MUST_CHECK int db_exec_write(struct db *db, sqlite3_stmt *s, const char *id) {
  int rc;

  if (!sqlite3_get_autocommit(db->conn)) {
    rc = db_exec_stmt(s);
    if (!rc)
      db_mark_dirty(db, id);
    return rc;
  }
  wcache_write_begin();
  rc = db_exec_stmt(s);
  wcache_invalidate(id);
  wcache_write_end();
  return rc;
}

void db_rollback(struct db *db) {
  if (!sqlite3_get_autocommit(db->conn))
    (void)db_exec_stmt(db_stmt(db, ST_ROLLBACK));
  /* Nothing changed; dropping cached objects is harmless. */
  dirty_flush(db);
}

const char *db_errmsg(struct db *db) {
  return sqlite3_errmsg(db->conn);
}

json_t *db_col_text(sqlite3_stmt *s, int i) {
  const unsigned char *v = sqlite3_column_text(s, i);

  return v ? json_string((const char *)v) : json_null();
}

json_t *db_col_int(sqlite3_stmt *s, int i) {
  return sqlite3_column_type(s, i) == SQLITE_NULL ? json_null()
                                                  : json_integer(sqlite3_column_int64(s, i));
}

/* Parses a JSON column, falling back to fallback (a new reference). */
json_t *db_col_json(sqlite3_stmt *s, int i, json_t *fallback) {
  const char *v = (const char *)sqlite3_column_text(s, i);
  json_t *j = v ? json_loads(v, 0, NULL) : NULL;

  if (!j)
    return fallback;
  json_decref(fallback);
  return j;
}

void db_copy_col(sqlite3_stmt *s, int i, char *dst, size_t size) {
  const char *v = (const char *)sqlite3_column_text(s, i);

  snprintf(dst, size, "%s", v ? v : "");
}

/* Steps s, a bound page query of (id, rowid) rows asking for limit + 1:
 * copies up to limit ids, and sets *next to the cursor of the page after
 * (0 if there is none). */
int db_page_ids(sqlite3_stmt *s, int limit, char (*ids)[16], int *n, int64_t *next) {
  int64_t last = 0;
  int rc;

  *n = 0;
  *next = 0;
  while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
    if (*n == limit) {
      *next = last;
      continue;
    }
    db_copy_col(s, 0, ids[(*n)++], sizeof(ids[0]));
    last = sqlite3_column_int64(s, 1);
  }
  sqlite3_reset(s);
  return rc == SQLITE_DONE ? 0 : MUSTER_E_DB;
}
