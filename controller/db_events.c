/* db_events.c: reading the events table (the event stream's records, one
 * worker's events, the last seq). Events are written with each transition (db_workers.c). See
 * db.h. */
#include "db_internal.h"

#include "muster_errors.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Steps s, a query of (seq, worker_id, from, to, at, detail) rows, into
 * SSE records (db_events_since()); resets it. */
static int events_out(sqlite3_stmt *s, char **out, size_t *outlen, int64_t *last) {
  char *buf = NULL;
  size_t len = 0;
  int n = 0, rc;

  *out = NULL;
  *outlen = 0;
  while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
    json_t *e = json_object();
    char *data, *grown;
    int64_t seq = sqlite3_column_int64(s, 0);
    size_t need;

    json_object_set_new(e, "seq", json_integer(seq));
    json_object_set_new(e, "worker_id", db_col_text(s, 1));
    json_object_set_new(e, "from", db_col_text(s, 2));
    json_object_set_new(e, "to", db_col_text(s, 3));
    json_object_set_new(e, "at", db_col_text(s, 4));
    json_object_set_new(e, "detail", db_col_text(s, 5));
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

int db_events_since(struct db *db, int64_t since, int limit, char **out, size_t *outlen,
                    int64_t *last) {
  sqlite3_stmt *s = db_stmt(db, ST_EVENTS_SINCE);

  sqlite3_bind_int64(s, 1, since);
  sqlite3_bind_int(s, 2, limit);
  return events_out(s, out, outlen, last);
}

int db_events_since_scoped(struct db *db, int64_t since, int64_t upto, const char *prefix,
                           int limit, char **out, size_t *outlen, int64_t *last) {
  sqlite3_stmt *s = NULL;
  int n;

  if (sqlite3_prepare_v2(db->conn,
                         "SELECT e.seq, e.worker_id, e.\"from\", e.\"to\", e.at, e.detail "
                         "FROM events e JOIN workers w ON w.id = e.worker_id "
                         "WHERE e.seq > ?1 AND e.seq <= ?2 "
                         "AND substr(w.session, 1, length(?3)) = ?3 ORDER BY e.seq LIMIT ?4",
                         -1, &s, NULL) != SQLITE_OK)
    return MUSTER_E_DB;
  sqlite3_bind_int64(s, 1, since);
  sqlite3_bind_int64(s, 2, upto);
  sqlite3_bind_text(s, 3, prefix, -1, SQLITE_TRANSIENT);
  sqlite3_bind_int(s, 4, limit);
  n = events_out(s, out, outlen, last);
  sqlite3_finalize(s);
  return n;
}

int db_worker_events(struct db *db, const char *id, int limit, json_t **out, int *truncated) {
  sqlite3_stmt *s = db_stmt(db, ST_WORKER_EVENTS);
  json_t *list = json_array();
  int rc, found = 0, err = 0;

  *out = NULL;
  *truncated = 0;
  if (!list)
    return MUSTER_E_NOMEM;
  db_bind_text_or_null(s, 1, id);
  /* One more than asked: its presence says that older events were left out. */
  sqlite3_bind_int(s, 2, limit + 1);
  while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
    json_t *e;

    found = 1;
    if (sqlite3_column_type(s, 0) == SQLITE_NULL)
      continue; /* the worker, without events */
    e = json_pack("{s:I, s:o, s:o, s:o, s:o}", "seq", (json_int_t)sqlite3_column_int64(s, 0),
                  "from", db_col_text(s, 1), "to", db_col_text(s, 2), "at", db_col_text(s, 3),
                  "detail", db_col_text(s, 4));
    if (!e || json_array_append_new(list, e) != 0) {
      err = MUSTER_E_NOMEM;
      break;
    }
  }
  sqlite3_reset(s);
  if (!err && rc != SQLITE_DONE)
    err = MUSTER_E_DB;
  if (!err && !found)
    err = MUSTER_E_NOT_FOUND;
  if (err) {
    json_decref(list);
    return err;
  }
  if (json_array_size(list) > (size_t)limit) {
    json_array_remove(list, 0);
    *truncated = 1;
  }
  *out = list;
  return 0;
}

int64_t db_last_event_seq(struct db *db) {
  sqlite3_stmt *s = db_stmt(db, ST_LAST_SEQ);
  int64_t v = 0;

  if (sqlite3_step(s) == SQLITE_ROW)
    v = sqlite3_column_int64(s, 0);
  sqlite3_reset(s);
  return v;
}
