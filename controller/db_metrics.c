/* db_metrics.c: runs' metrics, stored bounded (migrations/0009_metrics.sql)
 * and read back downsampled. See db.h. */
#include "db_internal.h"

#include "muster_errors.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* A row of metric_points. */
struct mrow {
  int64_t id; /* 0: not written yet */
  int64_t step;
  double epoch;
  int has_epoch;
  double at, value, vmin, vmax;
  int64_t n;
};

static void read_mrow(sqlite3_stmt *s, struct mrow *r) {
  r->id = sqlite3_column_int64(s, 0);
  r->step = sqlite3_column_int64(s, 1);
  r->has_epoch = sqlite3_column_type(s, 2) != SQLITE_NULL;
  r->epoch = sqlite3_column_double(s, 2);
  r->at = sqlite3_column_double(s, 3);
  r->value = sqlite3_column_double(s, 4);
  r->vmin = sqlite3_column_double(s, 5);
  r->vmax = sqlite3_column_double(s, 6);
  r->n = sqlite3_column_int64(s, 7);
}

/* Writes r of series; under its own id when keep_id, else under a new one. */
static int write_mrow(struct db *db, int64_t series, struct mrow *r, int keep_id) {
  sqlite3_stmt *s = db_stmt(db, keep_id ? ST_MP_INSERT_ID : ST_MP_INSERT);
  int rc;

  sqlite3_bind_int64(s, 1, series);
  sqlite3_bind_int64(s, 2, r->step);
  if (r->has_epoch)
    sqlite3_bind_double(s, 3, r->epoch);
  sqlite3_bind_double(s, 4, r->at);
  sqlite3_bind_double(s, 5, r->value);
  sqlite3_bind_double(s, 6, r->vmin);
  sqlite3_bind_double(s, 7, r->vmax);
  sqlite3_bind_int64(s, 8, r->n);
  if (keep_id)
    sqlite3_bind_int64(s, 9, r->id);
  rc = db_exec_stmt(s);
  if (!rc && !keep_id)
    r->id = sqlite3_last_insert_rowid(db->conn);
  return rc;
}

/* Merges b, which came after a, into a: b's step, time and value, both's
 * extremes. */
static void merge_into(struct mrow *a, const struct mrow *b) {
  a->id = b->id;
  a->step = b->step;
  a->epoch = b->epoch;
  a->has_epoch = b->has_epoch;
  a->at = b->at;
  a->value = b->value;
  a->vmin = fmin(a->vmin, b->vmin);
  a->vmax = fmax(a->vmax, b->vmax);
  a->n += b->n;
}

/* One series being written. open: its last row, while it takes more
 * points (n < bucket); dirty: open has points not yet written. */
struct series {
  int64_t id;
  int64_t bucket, nrows, added;
  struct mrow open;
  int has_open, dirty;
};

/* Writes the open row: the row it replaces goes, and it gets a new id, so
 * that a reader following since sees it again. */
static int flush_open(struct db *db, struct series *ss) {
  int rc = 0;

  if (!ss->has_open || !ss->dirty)
    return 0;
  if (ss->open.id) {
    sqlite3_stmt *s = db_stmt(db, ST_MP_DELETE);
    sqlite3_bind_int64(s, 1, ss->open.id);
    rc = db_exec_stmt(s);
  }
  if (!rc)
    rc = write_mrow(db, ss->id, &ss->open, 0);
  ss->dirty = 0;
  return rc;
}

/* The series' last row becomes the open one if it takes more points. */
static int load_open(struct db *db, struct series *ss) {
  sqlite3_stmt *s = db_stmt(db, ST_MP_LAST);
  int rc;

  ss->has_open = ss->dirty = 0;
  sqlite3_bind_int64(s, 1, ss->id);
  rc = sqlite3_step(s);
  if (rc == SQLITE_ROW) {
    read_mrow(s, &ss->open);
    ss->has_open = ss->open.n < ss->bucket;
  }
  sqlite3_reset(s);
  return rc == SQLITE_ROW || rc == SQLITE_DONE ? 0 : MUSTER_E_DB;
}

/* Halves the series' rows: each two neighbours become one, under the
 * later one's id (what a reader has seen stays seen), and the bucket
 * doubles. */
static int compact(struct db *db, struct series *ss) {
  sqlite3_stmt *s = db_stmt(db, ST_MP_ROWS);
  struct mrow *v = malloc((size_t)(ss->nrows + 8) * sizeof(*v));
  int64_t n = 0, cap = ss->nrows + 8, k = 0;
  int rc = 0;

  if (!v)
    return MUSTER_E_NOMEM;
  sqlite3_bind_int64(s, 1, ss->id);
  sqlite3_bind_int64(s, 2, 0);
  while ((rc = sqlite3_step(s)) == SQLITE_ROW && n < cap)
    read_mrow(s, &v[n++]);
  sqlite3_reset(s);
  rc = rc == SQLITE_ROW || rc == SQLITE_DONE ? 0 : MUSTER_E_DB;
  if (!rc) {
    s = db_stmt(db, ST_MP_DELETE_SERIES);
    sqlite3_bind_int64(s, 1, ss->id);
    rc = db_exec_stmt(s);
  }
  for (int64_t i = 0; !rc && i < n; i += 2) {
    struct mrow m = v[i];
    if (i + 1 < n)
      merge_into(&m, &v[i + 1]);
    rc = write_mrow(db, ss->id, &m, 1);
    k++;
  }
  free(v);
  ss->nrows = k;
  ss->bucket *= 2;
  return rc ? rc : load_open(db, ss);
}

/* The series (run, name, rank), made if new (*made says so). */
static int series_get(struct db *db, const char *run, const char *name, int64_t rank,
                      struct series *ss, int *made) {
  sqlite3_stmt *s = db_stmt(db, ST_MS_GET);
  int rc;

  memset(ss, 0, sizeof(*ss));
  *made = 0;
  db_bind_text_or_null(s, 1, run);
  db_bind_text_or_null(s, 2, name);
  sqlite3_bind_int64(s, 3, rank);
  rc = sqlite3_step(s);
  if (rc == SQLITE_ROW) {
    ss->id = sqlite3_column_int64(s, 0);
    ss->bucket = sqlite3_column_int64(s, 1);
    ss->nrows = sqlite3_column_int64(s, 2);
    sqlite3_reset(s);
    return ss->bucket > 1 ? load_open(db, ss) : 0;
  }
  sqlite3_reset(s);
  if (rc != SQLITE_DONE)
    return MUSTER_E_DB;
  s = db_stmt(db, ST_MS_INSERT);
  db_bind_text_or_null(s, 1, run);
  db_bind_text_or_null(s, 2, name);
  sqlite3_bind_int64(s, 3, rank);
  rc = db_exec_stmt(s);
  if (rc)
    return rc;
  ss->id = sqlite3_last_insert_rowid(db->conn);
  ss->bucket = 1;
  *made = 1;
  return 0;
}

/* Adds one point to the series. */
static int series_add(struct db *db, struct series *ss, const struct db_metric_in *p) {
  struct mrow r = {0, p->step, p->epoch, p->has_epoch, p->at, p->value, p->value, p->value, 1};
  int rc;

  ss->added++;
  if (ss->has_open && ss->open.n < ss->bucket) {
    int64_t id = ss->open.id;
    merge_into(&ss->open, &r);
    ss->open.id = id;
    ss->dirty = 1;
    return 0;
  }
  rc = flush_open(db, ss);
  if (rc)
    return rc;
  if (ss->nrows >= METRIC_SERIES_ROWS) {
    rc = compact(db, ss);
    if (rc)
      return rc;
    if (ss->has_open) {
      int64_t id = ss->open.id;
      merge_into(&ss->open, &r);
      ss->open.id = id;
      ss->dirty = 1;
      return 0;
    }
  }
  ss->open = r;
  ss->has_open = 1;
  ss->dirty = 1;
  ss->nrows++;
  return 0;
}

static int series_done(struct db *db, struct series *ss) {
  sqlite3_stmt *s;
  int rc = flush_open(db, ss);

  if (rc)
    return rc;
  s = db_stmt(db, ST_MS_UPDATE);
  sqlite3_bind_int64(s, 1, ss->id);
  sqlite3_bind_int64(s, 2, ss->bucket);
  sqlite3_bind_int64(s, 3, ss->nrows);
  sqlite3_bind_int64(s, 4, ss->added);
  return db_exec_stmt(s);
}

/* Orders values by series, then by when they were logged: the index
 * breaks ties (qsort is not stable), so it rides along. */
struct in_at {
  struct db_metric_in *p;
  size_t i;
};

static int in_cmp(const void *a, const void *b) {
  const struct in_at *x = a, *y = b;
  int c = strcmp(x->p->name, y->p->name);

  if (c)
    return c;
  if (x->p->rank != y->p->rank)
    return x->p->rank < y->p->rank ? -1 : 1;
  return (x->i > y->i) - (x->i < y->i);
}

static int series_count(struct db *db, const char *run, int64_t *n) {
  sqlite3_stmt *s = db_stmt(db, ST_MS_COUNT);
  int rc;

  db_bind_text_or_null(s, 1, run);
  rc = sqlite3_step(s);
  *n = rc == SQLITE_ROW ? sqlite3_column_int64(s, 0) : 0;
  sqlite3_reset(s);
  return rc == SQLITE_ROW ? 0 : MUSTER_E_DB;
}

int db_metrics_add(struct db *db, const char *run, struct db_metric_in *p, size_t n) {
  struct in_at *v = calloc(n + 1, sizeof(*v));
  struct series ss;
  int64_t nseries = -1;
  int rc = 0, made;

  if (!v)
    return MUSTER_E_NOMEM;
  for (size_t i = 0; i < n; i++)
    v[i] = (struct in_at){&p[i], i};
  qsort(v, n, sizeof(*v), in_cmp);
  for (size_t i = 0; !rc && i < n;) {
    size_t j = i;
    rc = series_get(db, run, v[i].p->name, v[i].p->rank, &ss, &made);
    if (!rc && made) {
      if (nseries < 0)
        rc = series_count(db, run, &nseries);
      else
        nseries++;
      if (!rc && nseries > METRIC_RUN_SERIES)
        rc = MUSTER_E_INVALID;
    }
    for (; !rc && j < n && strcmp(v[j].p->name, v[i].p->name) == 0 && v[j].p->rank == v[i].p->rank;
         j++)
      rc = series_add(db, &ss, v[j].p);
    if (!rc)
      rc = series_done(db, &ss);
    i = j;
  }
  free(v);
  return rc;
}

/* ---- reads ---- */

static int name_wanted(const struct db_metric_query *q, const char *name) {
  if (!q->names)
    return 1;
  for (size_t i = 0; i < q->nnames; i++)
    if (strcmp(q->names[i], name) == 0)
      return 1;
  return 0;
}

static json_t *one_value(const char *name, double v) {
  json_t *o = json_object();

  json_object_set_new(o, name, json_real(v));
  return o;
}

static void append_point(json_t *points, const char *name, int64_t rank, const struct mrow *r) {
  json_t *pt = json_object();

  json_object_set_new(pt, "step", json_integer(r->step));
  json_object_set_new(pt, "epoch", r->has_epoch ? json_real(r->epoch) : json_null());
  json_object_set_new(pt, "rank", json_integer(rank));
  json_object_set_new(pt, "at", json_real(r->at));
  json_object_set_new(pt, "values", one_value(name, r->value));
  if (r->n > 1) {
    json_object_set_new(pt, "min", one_value(name, r->vmin));
    json_object_set_new(pt, "max", one_value(name, r->vmax));
    json_object_set_new(pt, "n", json_integer(r->n));
  }
  json_array_append_new(points, pt);
}

/* Reads one series' rows after since into points, at most max_points of
 * them (each bucket merged, with its extremes). */
static int series_read(struct db *db, int64_t id, const char *name, int64_t rank,
                       const struct db_metric_query *q, json_t *points, int64_t *next) {
  sqlite3_stmt *s = db_stmt(db, ST_MP_ROWS);
  struct mrow *v = NULL, *grown;
  size_t n = 0, cap = 0, per;
  int rc;

  sqlite3_bind_int64(s, 1, id);
  sqlite3_bind_int64(s, 2, q->since);
  while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
    if (n == cap) {
      cap = cap ? 2 * cap : 256;
      grown = realloc(v, cap * sizeof(*v));
      if (!grown) {
        rc = SQLITE_NOMEM;
        break;
      }
      v = grown;
    }
    read_mrow(s, &v[n++]);
  }
  sqlite3_reset(s);
  if (rc != SQLITE_DONE) {
    free(v);
    return MUSTER_E_DB;
  }
  per = q->max_points > 0 && n > (size_t)q->max_points
            ? (n + (size_t)q->max_points - 1) / (size_t)q->max_points
            : 1;
  for (size_t i = 0; i < n; i += per) {
    struct mrow m = v[i];
    for (size_t k = i + 1; k < i + per && k < n; k++)
      merge_into(&m, &v[k]);
    append_point(points, name, rank, &m);
    if (m.id > *next)
      *next = m.id;
  }
  free(v);
  return 0;
}

json_t *db_metrics_query(struct db *db, const char *run, const struct db_metric_query *q,
                         int64_t *next) {
  sqlite3_stmt *s = db_stmt(db, ST_MS_OF_RUN);
  json_t *points = json_array();
  struct {
    int64_t id, rank;
    char *name;
  } *sv = NULL;
  size_t n = 0, cap = 0;
  int rc;

  *next = q->since;
  db_bind_text_or_null(s, 1, run);
  while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
    const char *name = (const char *)sqlite3_column_text(s, 1);
    if (!name || !name_wanted(q, name))
      continue;
    if (n == cap) {
      void *grown = realloc(sv, (cap = cap ? 2 * cap : 16) * sizeof(*sv));
      if (!grown) {
        rc = SQLITE_NOMEM;
        break;
      }
      sv = grown;
    }
    sv[n].id = sqlite3_column_int64(s, 0);
    sv[n].rank = sqlite3_column_int64(s, 2);
    sv[n].name = strdup(name);
    if (!sv[n++].name) {
      rc = SQLITE_NOMEM;
      break;
    }
  }
  sqlite3_reset(s);
  for (size_t i = 0; i < n; i++) {
    if (rc == SQLITE_DONE && series_read(db, sv[i].id, sv[i].name, sv[i].rank, q, points, next))
      rc = SQLITE_ERROR;
    free(sv[i].name);
  }
  free(sv);
  if (rc != SQLITE_DONE) {
    json_decref(points);
    return NULL;
  }
  return points;
}

json_t *db_metrics_latest(struct db *db, const char *run) {
  sqlite3_stmt *s = db_stmt(db, ST_MS_OF_RUN);
  json_t *latest = json_object();
  char last[256] = "";
  struct {
    int64_t id;
    char name[256];
    int ranks;
  } v[64];
  int n = 0;

  db_bind_text_or_null(s, 1, run);
  while (sqlite3_step(s) == SQLITE_ROW) {
    const char *name = (const char *)sqlite3_column_text(s, 1);
    if (!name)
      continue;
    if (strcmp(name, last) == 0) {
      if (n > 0)
        v[n - 1].ranks++;
      continue;
    }
    snprintf(last, sizeof(last), "%s", name);
    if (n == (int)(sizeof(v) / sizeof(v[0])))
      continue;
    v[n].id = sqlite3_column_int64(s, 0);
    v[n].ranks = 1;
    snprintf(v[n++].name, sizeof(v[0].name), "%s", name);
  }
  sqlite3_reset(s);
  for (int i = 0; i < n; i++) {
    struct mrow r;
    s = db_stmt(db, ST_MP_LAST);
    sqlite3_bind_int64(s, 1, v[i].id);
    if (sqlite3_step(s) == SQLITE_ROW) {
      read_mrow(s, &r);
      json_object_set_new(latest, v[i].name,
                          json_pack("{s:I, s:f, s:i}", "step", (json_int_t)r.step, "value", r.value,
                                    "ranks", v[i].ranks));
    }
    sqlite3_reset(s);
  }
  return latest;
}
