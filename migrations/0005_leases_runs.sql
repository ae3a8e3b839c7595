-- 0005_leases_runs.sql: sessions' leases, and runs.
--
-- lease_ttl_seconds: the session's lease (NULL: none). Only the ttl is
-- kept: a renewal is a moment in the controller's memory, and a restarted
-- controller gives every lease one full ttl from its start.
ALTER TABLE sessions ADD COLUMN lease_ttl_seconds REAL;

-- A run: what `muster run` / run_cluster() did with a set of workers.
-- restarts: a JSON array of {"at", "cause"}, one per restart.
-- summary: the training summary (JSON), once the run ended well.
CREATE TABLE runs (
  id            TEXT PRIMARY KEY,
  session       TEXT NOT NULL,
  mode          TEXT NOT NULL,
  command       TEXT NOT NULL,    -- JSON array
  status        TEXT NOT NULL CHECK (status IN
                  ('running', 'succeeded', 'failed', 'stopped')),
  max_restarts  INTEGER NOT NULL,
  restarts      TEXT NOT NULL DEFAULT '[]',
  created_at    TEXT NOT NULL,
  finished_at   TEXT,
  summary       TEXT,
  failure       TEXT
);
CREATE INDEX runs_session ON runs(session);

-- An ended run never changes again.
CREATE TRIGGER runs_ended_final BEFORE UPDATE ON runs
WHEN OLD.status <> 'running'
BEGIN SELECT RAISE(ABORT, 'an ended run cannot change'); END;

-- The run a worker belongs to (NULL: none).
ALTER TABLE workers ADD COLUMN run TEXT;
CREATE INDEX workers_run ON workers(run) WHERE run IS NOT NULL;
