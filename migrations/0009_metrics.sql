-- 0009_metrics.sql: runs' metrics (docs/design.md, "Metrics").
--
-- A series is one value name of one rank of one run. Its rows are its
-- points, each holding `n` points merged: the last one's step, epoch,
-- time and value, and the least and greatest value among them. A series
-- keeps every point up to a bound on its rows; past it, neighbouring rows
-- are merged in pairs and `bucket` (the points a new row takes before
-- another is begun) doubles, so a run of any length keeps a few thousand
-- rows per series at one even resolution, spikes included.
--
-- Each series is kept twice: level 0 up to 2,000 rows, level 1 up to 256
-- (a read of at most 256 points per series, a chart's, sweeps only those).
CREATE TABLE metric_series (
  id      INTEGER PRIMARY KEY,
  run     TEXT NOT NULL,
  name    TEXT NOT NULL,
  rank    INTEGER NOT NULL,
  level   INTEGER NOT NULL,
  bucket  INTEGER NOT NULL DEFAULT 1,
  nrows   INTEGER NOT NULL DEFAULT 0,
  points  INTEGER NOT NULL DEFAULT 0,  -- every point it was sent
  UNIQUE (run, level, name, rank)
);

-- id: the order in which rows were written, across every run: the cursor
-- of `since`, handed out from metric_next. A row that takes more points
-- is written again under a new id, so that a reader following `since`
-- sees it change. Kept in (series, id) order: a series is read in one
-- sweep.
CREATE TABLE metric_points (
  series  INTEGER NOT NULL,
  id      INTEGER NOT NULL,
  step    INTEGER NOT NULL,
  epoch   REAL,
  at      REAL NOT NULL,
  value   REAL NOT NULL,
  vmin    REAL NOT NULL,
  vmax    REAL NOT NULL,
  n       INTEGER NOT NULL,
  PRIMARY KEY (series, id)
) WITHOUT ROWID;

-- The next id of metric_points.
CREATE TABLE metric_next (id INTEGER NOT NULL);
INSERT INTO metric_next(id) VALUES (1);

-- The last call each sender (one process's logger) had stored, by its
-- sequence number: a retry of a call whose answer was lost is stored once.
CREATE TABLE metric_senders (
  run     TEXT NOT NULL,
  sender  TEXT NOT NULL,
  seq     INTEGER NOT NULL,
  PRIMARY KEY (run, sender)
) WITHOUT ROWID;

-- A run's metrics go with it (the retention pruner deletes runs).
CREATE TRIGGER runs_metrics_pruned AFTER DELETE ON runs
BEGIN
  DELETE FROM metric_points WHERE series IN
    (SELECT id FROM metric_series WHERE run = OLD.id);
  DELETE FROM metric_series WHERE run = OLD.id;
  DELETE FROM metric_senders WHERE run = OLD.id;
END;
