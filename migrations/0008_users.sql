-- 0008_users.sql: the people who share a controller (docs/design.md,
-- "Users").
--
-- A user's token is never stored: only its SHA-256 (hex) and a short clear
-- prefix of it, by which a call's token finds its row. The bootstrap
-- administrator's token stays in the state directory's `token` file.
-- Limits are NULL where the user has none (the controller's own capacity
-- bounds them).
CREATE TABLE users (
  name          TEXT PRIMARY KEY,
  admin         INTEGER NOT NULL DEFAULT 0,
  unix_user     TEXT,
  max_cpu       REAL,
  max_memory    REAL,
  max_gpus      INTEGER,
  max_workers   INTEGER,
  token_prefix  TEXT NOT NULL UNIQUE,
  token_sha256  TEXT NOT NULL,
  created_at    TEXT NOT NULL,
  -- A removed user's row stays, its token dead: a name is never given to
  -- another user, who would find the first one's sessions, runs and logs.
  removed_at    TEXT
) WITHOUT ROWID;

-- Who made a worker (NULL: the bootstrap administrator, and every worker
-- from before users).
ALTER TABLE workers ADD COLUMN owner TEXT;
CREATE INDEX workers_owner_live ON workers(owner)
  WHERE status IN ('scheduling', 'starting', 'running');
