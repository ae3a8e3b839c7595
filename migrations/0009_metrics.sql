-- 0009_metrics.sql: runs' metrics (docs/design.md, "Metrics").
--
-- A series is one value name of one rank of one run. Its rows are its
-- points, each holding `n` points merged: the last one's step, epoch,
-- time and value, and the least and greatest value among them. A series
-- keeps every point up to a bound on its rows; past it, neighbouring rows
-- are merged in pairs and `bucket` (the points a new row takes before
-- another is begun) doubles, so a run of any length keeps a few thousand
-- rows per series at one even resolution, spikes included.
CREATE TABLE metric_series (
  id      INTEGER PRIMARY KEY,
  run     TEXT NOT NULL,
  name    TEXT NOT NULL,
  rank    INTEGER NOT NULL,
  bucket  INTEGER NOT NULL DEFAULT 1,
  nrows   INTEGER NOT NULL DEFAULT 0,
  points  INTEGER NOT NULL DEFAULT 0,  -- every point it was sent
  UNIQUE (run, name, rank)
);

-- id: the order in which rows were written, across every run: the cursor
-- of `since`. A row that takes more points is written again under a new
-- id, so that a reader following `since` sees it change.
CREATE TABLE metric_points (
  id      INTEGER PRIMARY KEY,
  series  INTEGER NOT NULL,
  step    INTEGER NOT NULL,
  epoch   REAL,
  at      REAL NOT NULL,
  value   REAL NOT NULL,
  vmin    REAL NOT NULL,
  vmax    REAL NOT NULL,
  n       INTEGER NOT NULL
);
CREATE INDEX metric_points_series ON metric_points(series, id);

-- A run's metrics go with it (the retention pruner deletes runs).
CREATE TRIGGER runs_metrics_pruned AFTER DELETE ON runs
BEGIN
  DELETE FROM metric_points WHERE series IN
    (SELECT id FROM metric_series WHERE run = OLD.id);
  DELETE FROM metric_series WHERE run = OLD.id;
END;
