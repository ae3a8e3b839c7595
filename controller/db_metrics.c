/* db_metrics.c: runs' metrics, stored bounded (migrations/0009_metrics.sql)
 * and read back downsampled. See db.h. */
#include "db_internal.h"

#include "muster_errors.h"

#include <math.h>
#include <stdio.h>
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

/* Writes r of series; under its own id when keep_id, else under the next
 * one (*next). */
static int write_mrow(struct db *db, int64_t series, struct mrow *r, int keep_id, int64_t *next) {
  sqlite3_stmt *s = db_stmt(db, ST_MP_INSERT);

  sqlite3_bind_int64(s, 1, series);
  sqlite3_bind_int64(s, 2, r->step);
  if (r->has_epoch)
    sqlite3_bind_double(s, 3, r->epoch);
  sqlite3_bind_double(s, 4, r->at);
  sqlite3_bind_double(s, 5, r->value);
  sqlite3_bind_double(s, 6, r->vmin);
  sqlite3_bind_double(s, 7, r->vmax);
  sqlite3_bind_int64(s, 8, r->n);
  if (!keep_id)
    r->id = (*next)++;
  sqlite3_bind_int64(s, 9, r->id);
  return db_exec_stmt(s);
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
  int64_t *next;   /* the next row id */
  int64_t maxrows; /* its level's bound */
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
    sqlite3_bind_int64(s, 1, ss->id);
    sqlite3_bind_int64(s, 2, ss->open.id);
    rc = db_exec_stmt(s);
  }
  if (!rc)
    rc = write_mrow(db, ss->id, &ss->open, 0, ss->next);
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
    rc = write_mrow(db, ss->id, &m, 1, NULL);
    k++;
  }
  free(v);
  ss->nrows = k;
  ss->bucket *= 2;
  return rc ? rc : load_open(db, ss);
}

/* The series (run, name, rank), made if new (*made says so). */
static int series_get(struct db *db, const char *run, const char *name, int64_t rank, int level,
                      struct series *ss, int *made, int64_t *next) {
  sqlite3_stmt *s = db_stmt(db, ST_MS_GET);
  int rc;

  memset(ss, 0, sizeof(*ss));
  ss->next = next;
  ss->maxrows = level ? METRIC_COARSE_ROWS : METRIC_SERIES_ROWS;
  *made = 0;
  db_bind_text_or_null(s, 1, run);
  db_bind_text_or_null(s, 2, name);
  sqlite3_bind_int64(s, 3, rank);
  sqlite3_bind_int(s, 4, level);
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
  sqlite3_bind_int(s, 4, level);
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
  if (ss->nrows >= ss->maxrows) {
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
  int64_t nseries = -1, next = 0;
  int rc = 0, made;
  sqlite3_stmt *s;

  if (!v)
    return MUSTER_E_NOMEM;
  s = db_stmt(db, ST_MP_NEXT_GET);
  if (sqlite3_step(s) == SQLITE_ROW)
    next = sqlite3_column_int64(s, 0);
  sqlite3_reset(s);
  if (next < 1) {
    free(v);
    return MUSTER_E_DB;
  }
  for (size_t i = 0; i < n; i++)
    v[i] = (struct in_at){&p[i], i};
  qsort(v, n, sizeof(*v), in_cmp);
  for (size_t i = 0, j = 0; !rc && i < n; i = j) {
    while (j < n && strcmp(v[j].p->name, v[i].p->name) == 0 && v[j].p->rank == v[i].p->rank)
      j++;
    /* v[i..j): one series' points, at each level. */
    for (int level = 0; !rc && level < 2; level++) {
      rc = series_get(db, run, v[i].p->name, v[i].p->rank, level, &ss, &made, &next);
      if (!rc && made && level == 0) {
        if (nseries < 0)
          rc = series_count(db, run, &nseries);
        else
          nseries++;
        if (!rc && nseries > METRIC_RUN_SERIES)
          rc = MUSTER_E_INVALID;
      }
      for (size_t k = i; !rc && k < j; k++)
        rc = series_add(db, &ss, v[k].p);
      if (!rc)
        rc = series_done(db, &ss);
    }
  }
  free(v);
  if (!rc) {
    s = db_stmt(db, ST_MP_NEXT_SET);
    sqlite3_bind_int64(s, 1, next);
    rc = db_exec_stmt(s);
  }
  return rc;
}

int db_metrics_seen(struct db *db, const char *run, const char *sender, int64_t seq) {
  sqlite3_stmt *s = db_stmt(db, ST_MSEND_GET);
  int rc, seen = 0;

  db_bind_text_or_null(s, 1, run);
  db_bind_text_or_null(s, 2, sender);
  rc = sqlite3_step(s);
  if (rc == SQLITE_ROW)
    seen = sqlite3_column_int64(s, 0) >= seq;
  sqlite3_reset(s);
  if (rc != SQLITE_ROW && rc != SQLITE_DONE)
    return MUSTER_E_DB;
  if (seen)
    return 1;
  s = db_stmt(db, ST_MSEND_SET);
  db_bind_text_or_null(s, 1, run);
  db_bind_text_or_null(s, 2, sender);
  sqlite3_bind_int64(s, 3, seq);
  return db_exec_stmt(s);
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

/* Writes one point of series name of rank as the API's JSON (no name
 * needs escaping: name_ok() in api_metrics.c); first: none came before. */
static void write_point(FILE *out, int first, const char *name, int64_t rank,
                        const struct mrow *r) {
  fprintf(out, "%s{\"step\":%lld,\"rank\":%lld,\"at\":%.3f,", first ? "" : ",", (long long)r->step,
          (long long)rank, r->at);
  if (r->has_epoch)
    fprintf(out, "\"epoch\":%.9g,", r->epoch);
  else
    fputs("\"epoch\":null,", out);
  fprintf(out, "\"values\":{\"%s\":%.9g}", name, r->value);
  if (r->n > 1)
    fprintf(out, ",\"min\":{\"%s\":%.9g},\"max\":{\"%s\":%.9g},\"n\":%lld", name, r->vmin, name,
            r->vmax, (long long)r->n);
  fputc('}', out);
}

/* Reads one series' rows after since into points, at most max_points of
 * them (each bucket merged, with its extremes). */
static int series_read(struct db *db, int64_t id, const char *name, int64_t rank,
                       const struct db_metric_query *q, FILE *out, int *first, int64_t *next) {
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
    write_point(out, *first, name, rank, &m);
    *first = 0;
    if (m.id > *next)
      *next = m.id;
  }
  free(v);
  return 0;
}

/* One series of a read. */
struct series_ref {
  int64_t id, rank;
  char *name;
};

static void refs_free(struct series_ref *sv, size_t n) {
  for (size_t i = 0; i < n; i++)
    free(sv[i].name);
  free(sv);
}

/* The series of run at level that q wants, into *out (*n of them). */
static int series_list(struct db *db, const char *run, int level, const struct db_metric_query *q,
                       struct series_ref **out, size_t *n) {
  sqlite3_stmt *s = db_stmt(db, ST_MS_OF_RUN);
  struct series_ref *sv = NULL;
  size_t cap = 0;
  int rc;

  *n = 0;
  db_bind_text_or_null(s, 1, run);
  sqlite3_bind_int(s, 2, level);
  while ((rc = sqlite3_step(s)) == SQLITE_ROW) {
    const char *name = (const char *)sqlite3_column_text(s, 1);
    if (!name || !name_wanted(q, name))
      continue;
    if (*n == cap) {
      void *grown = realloc(sv, (cap = cap ? 2 * cap : 16) * sizeof(*sv));
      if (!grown) {
        rc = SQLITE_NOMEM;
        break;
      }
      sv = grown;
    }
    sv[*n].id = sqlite3_column_int64(s, 0);
    sv[*n].rank = sqlite3_column_int64(s, 2);
    sv[*n].name = strdup(name);
    if (!sv[(*n)++].name) {
      rc = SQLITE_NOMEM;
      break;
    }
  }
  sqlite3_reset(s);
  *out = sv;
  return rc == SQLITE_DONE ? 0 : MUSTER_E_DB;
}

int db_metrics_query(struct db *db, const char *run, const struct db_metric_query *q, FILE *out,
                     int64_t *next) {
  struct db_metric_query eff = *q;
  struct series_ref *sv = NULL;
  size_t n = 0;
  int first = 1, rc;

  *next = q->since;
  /* One snapshot for every series: next_since covers what was read, and
   * nothing a commit between two series wrote is skipped for good. */
  if (sqlite3_exec(db->conn, "BEGIN", NULL, NULL, NULL) != SQLITE_OK)
    return MUSTER_E_DB;
  rc = series_list(db, run, 0, q, &sv, &n);
  /* At most METRIC_READ_POINTS in all: many series get fewer each. */
  if (!rc && n > 0 && (eff.max_points <= 0 || (size_t)eff.max_points * n > METRIC_READ_POINTS))
    eff.max_points = METRIC_READ_POINTS / (int)n > 0 ? METRIC_READ_POINTS / (int)n : 1;
  /* The coarse level answers a read of all of each series in few points. */
  if (!rc && eff.since == 0 && eff.max_points <= METRIC_COARSE_ROWS) {
    refs_free(sv, n);
    rc = series_list(db, run, 1, q, &sv, &n);
  }
  for (size_t i = 0; !rc && i < n; i++)
    rc = series_read(db, sv[i].id, sv[i].name, sv[i].rank, &eff, out, &first, next);
  refs_free(sv, n);
  /* A reader left inside a transaction would read this snapshot for good. */
  if (sqlite3_exec(db->conn, "COMMIT", NULL, NULL, NULL) != SQLITE_OK) {
    sqlite3_exec(db->conn, "ROLLBACK", NULL, NULL, NULL);
    rc = MUSTER_E_DB;
  }
  return rc ? MUSTER_E_DB : 0;
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
  sqlite3_bind_int(s, 2, 0);
  while (sqlite3_step(s) == SQLITE_ROW) {
    const char *name = (const char *)sqlite3_column_text(s, 1);
    if (!name)
      continue;
    if (strcmp(name, last) == 0) {
      if (n > 0 && strcmp(v[n - 1].name, name) == 0)
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
