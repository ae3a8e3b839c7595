/* db_prune.c: the retention pruner, the one path that deletes rows. See
 * db.h. */
#include "db_internal.h"

#include "muster_errors.h"

/* Ended runs go with their last worker; sessions after their workers and
 * runs, unless they hold a lease; expired parts of leases once as old. */
static int prune_runs_sessions(struct db *db, const char *cutoff) {
  sqlite3_stmt *s = db_stmt(db, ST_PRUNE_RUNS);
  int rc;

  db_bind_text_or_null(s, 1, cutoff);
  rc = db_exec_stmt(s);
  if (rc)
    return rc;
  s = db_stmt(db, ST_PRUNE_HOLDERS);
  db_bind_text_or_null(s, 1, cutoff);
  rc = db_exec_stmt(s);
  if (rc)
    return rc;
  s = db_stmt(db, ST_PRUNE_SESSIONS);
  db_bind_text_or_null(s, 1, cutoff);
  return db_exec_stmt(s);
}

int db_prune(struct db *db, const char *cutoff, int max, char (*ids)[16], int *n) {
  sqlite3_stmt *s = db_stmt(db, ST_PRUNE_PICK);
  int rc, i;

  *n = 0;
  db_bind_text_or_null(s, 1, cutoff);
  sqlite3_bind_int(s, 2, max);
  while ((rc = sqlite3_step(s)) == SQLITE_ROW && *n < max)
    db_copy_col(s, 0, ids[(*n)++], sizeof(ids[0]));
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
  rc = db_exec_stmt(db_stmt(db, ST_GATE_OPEN));
  for (i = 0; !rc && i < *n; i++) {
    s = db_stmt(db, ST_PRUNE_EVENTS);
    db_bind_text_or_null(s, 1, ids[i]);
    rc = db_exec_stmt(s);
    if (rc)
      break;
    s = db_stmt(db, ST_PRUNE_WORKER);
    db_bind_text_or_null(s, 1, ids[i]);
    rc = db_exec_stmt(s);
    db_mark_dirty(db, ids[i]);
  }
  if (!rc)
    rc = prune_runs_sessions(db, cutoff);
  if (!rc)
    rc = db_exec_stmt(db_stmt(db, ST_GATE_CLOSE));
  if (!rc)
    rc = db_commit(db);
  if (rc) {
    db_rollback(db);
    *n = 0;
  }
  return rc;
}
