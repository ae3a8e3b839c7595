-- 0001_init.sql: workers, their append-only events, and sessions.
-- Applied once, in one transaction, by the controller at start; the schema
-- version is PRAGMA user_version (the number of migrations applied).

CREATE TABLE sessions (
  name        TEXT PRIMARY KEY,
  master_ip   TEXT,
  created_at  TEXT NOT NULL
);

CREATE TABLE workers (
  -- rowid orders workers by creation ("newest first" lists).
  id              TEXT PRIMARY KEY,
  session         TEXT NOT NULL REFERENCES sessions(name),
  name            TEXT,
  role            TEXT NOT NULL,
  status          TEXT NOT NULL CHECK (status IN
                    ('scheduling', 'starting', 'running',
                     'succeeded', 'failed', 'stopped')),
  cpu             REAL NOT NULL,
  memory          REAL NOT NULL,
  nvidia_gpu      INTEGER NOT NULL,
  gpu_indices     TEXT,             -- "0,1" while GPUs are held
  script          TEXT,
  code            TEXT,
  command         TEXT,             -- JSON array, or NULL
  kernel          TEXT NOT NULL,
  args            TEXT NOT NULL,    -- JSON array
  env             TEXT NOT NULL,    -- JSON object
  secret_env      TEXT NOT NULL,    -- JSON object; never returned by the API
  token           TEXT NOT NULL,    -- the worker's own bearer token
  master_ip       TEXT,
  bind_ip         TEXT,             -- address the backend gave the worker
  ip_address      TEXT,
  hostname        TEXT,
  exec_port       INTEGER,
  pid             INTEGER,
  backend         TEXT NOT NULL,
  backend_ref     TEXT,
  exit_code       INTEGER,
  signal          INTEGER,
  failure         TEXT,
  created_at      TEXT NOT NULL,
  running_at      TEXT,
  finished_at     TEXT,
  last_heartbeat  TEXT
);

CREATE INDEX workers_session ON workers(session);
CREATE INDEX workers_status ON workers(status);

CREATE TABLE events (
  seq        INTEGER PRIMARY KEY AUTOINCREMENT,
  worker_id  TEXT NOT NULL REFERENCES workers(id),
  at         TEXT NOT NULL,
  "from"     TEXT,                  -- NULL for the creation event
  "to"       TEXT NOT NULL,
  detail     TEXT
);

-- Events are append-only: the database itself refuses edits.
CREATE TRIGGER events_no_update BEFORE UPDATE ON events
BEGIN SELECT RAISE(ABORT, 'events are append-only'); END;
CREATE TRIGGER events_no_delete BEFORE DELETE ON events
BEGIN SELECT RAISE(ABORT, 'events are append-only'); END;

-- Terminal states never change again, whatever writes the row.
CREATE TRIGGER workers_terminal_final BEFORE UPDATE OF status ON workers
WHEN OLD.status IN ('succeeded', 'failed', 'stopped') AND NEW.status <> OLD.status
BEGIN SELECT RAISE(ABORT, 'terminal worker state cannot change'); END;
