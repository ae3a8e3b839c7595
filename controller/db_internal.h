/*
 * db_internal.h: what the files of the SQLite store share (db.c owns the
 * connection, the migrations and the prepared statements; db_workers.c,
 * db_events.c, db_sessions.c, db_runs.c and db_prune.c each the queries of
 * one kind of row). Nothing outside db*.c includes it.
 */
#ifndef MUSTER_DB_INTERNAL_H
#define MUSTER_DB_INTERNAL_H

#include "db.h"
#include "util.h"

#include <jansson.h>
#include <sqlite3.h>
#include <stddef.h>
#include <stdint.h>

/* The prepared statements, by index into db.c's table of SQL. */
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
  ST_WORKER_EVENTS,
  ST_LAST_SEQ,
  ST_COUNTS,
  ST_LIVE_USAGE,
  ST_SESSION_GET,
  ST_SET_REF,
  ST_SET_WAITING,
  ST_SET_TOKEN,
  ST_PRUNE_PICK,
  ST_PRUNE_EVENTS,
  ST_PRUNE_WORKER,
  ST_PRUNE_SESSIONS,
  ST_PRUNE_RUNS,
  ST_SET_RUN,
  ST_PRUNE_HOLDERS,
  ST_HOLDER_SET,
  ST_HOLDER_DROP,
  ST_HOLDER_EXPIRE,
  ST_HOLDERS_STOPPED,
  ST_HOLDER_PAST,
  ST_HOLDERS,
  ST_RUN_INSERT,
  ST_RUN_GET,
  ST_RUN_WORKERS,
  ST_RUN_LIST,
  ST_RUN_RESTART,
  ST_RUN_STALL,
  ST_RUN_END,
  ST_RUNS_FAIL_SESSION,
  ST_RUNS_FAIL_HOLDER,
  ST_GATE_OPEN,
  ST_GATE_CLOSE,
  ST_MS_GET,
  ST_MS_INSERT,
  ST_MS_COUNT,
  ST_MS_UPDATE,
  ST_MS_OF_RUN,
  ST_MP_LAST,
  ST_MP_INSERT,
  ST_MP_NEXT_GET,
  ST_MP_NEXT_SET,
  ST_MP_DELETE,
  ST_MP_DELETE_SERIES,
  ST_MP_ROWS,
  ST_MSEND_GET,
  ST_MSEND_SET,
  ST_COUNT_
};

struct db {
  sqlite3 *conn;
  sqlite3_stmt *st[ST_COUNT_];
  /* Workers changed by the open transaction: their cached objects are
   * dropped once it has committed (wcache.h). */
  char (*dirty)[16];
  int ndirty, cap_dirty, dirty_all;
};

/* Notes that worker id's row changed in the open transaction: its cached
 * object is dropped at the commit (a reader must never find the cache
 * emptied before the change is there to be read). */
void db_mark_dirty(struct db *db, const char *id);

/* Returns the cached statement i, reset and with its bindings cleared
 * (borrowed: it belongs to db). */
sqlite3_stmt *db_stmt(struct db *db, int i);

/* Binds v to parameter i, or NULL if v is NULL (text) or negative (int). */
void db_bind_text_or_null(sqlite3_stmt *s, int i, const char *v);
void db_bind_int_or_null(sqlite3_stmt *s, int i, int v);

/* Steps a statement that returns no rows: 0 or MUSTER_E_DB. */
int db_exec_stmt(sqlite3_stmt *s);

/* Runs a statement that writes worker id's row, outside or inside a
 * transaction, with the cache kept behind no reader. */
MUST_CHECK int db_exec_write(struct db *db, sqlite3_stmt *s, const char *id);

/* Column i of the current row as JSON: a string (or null), an integer (or
 * null), or parsed JSON text falling back to fallback (a new reference,
 * taken over). Each returns a new reference. */
json_t *db_col_text(sqlite3_stmt *s, int i);
json_t *db_col_int(sqlite3_stmt *s, int i);
json_t *db_col_json(sqlite3_stmt *s, int i, json_t *fallback);

/* Copies column i of the current row as text into dst ("" for NULL). */
void db_copy_col(sqlite3_stmt *s, int i, char *dst, size_t size);

/* Steps s, a bound page query of (id, rowid) rows asking for limit + 1:
 * copies up to limit ids, and sets *next to the cursor of the page after
 * (0 if there is none). Returns 0 or MUSTER_E_DB. */
MUST_CHECK int db_page_ids(sqlite3_stmt *s, int limit, char (*ids)[16], int *n, int64_t *next);

#endif
