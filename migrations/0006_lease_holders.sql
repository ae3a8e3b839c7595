-- 0006_lease_holders.sql: a session's lease is the union of its holders'.
--
-- One row per client holding a part of a session's lease (holder: the id
-- the client names itself by). Only the ttl is kept, as before: a renewal
-- is a moment in the controller's memory. expired_at is set when a part ran
-- out (the row stays, so that the holder's next renewal can be told so,
-- and whether the session's workers were stopped with it), until the
-- holder takes a part again or retention prunes it. stop_workers: whether
-- this part keeps the session's workers (a part that does not only binds
-- its runs: `muster run --no-lease`).
CREATE TABLE lease_holders (
  session         TEXT NOT NULL,
  holder          TEXT NOT NULL,
  ttl_seconds     REAL NOT NULL,
  stop_workers    INTEGER NOT NULL DEFAULT 1,
  expired_at      TEXT,
  workers_stopped INTEGER NOT NULL DEFAULT 0,
  PRIMARY KEY (session, holder)
) WITHOUT ROWID;

-- The session-wide leases of before become the part of the holder that
-- names none.
INSERT INTO lease_holders(session, holder, ttl_seconds)
  SELECT name, 'default', lease_ttl_seconds FROM sessions WHERE lease_ttl_seconds IS NOT NULL;
UPDATE sessions SET lease_ttl_seconds = NULL;

-- The holder a run is bound to: the run ends when that holder's part does.
-- Runs still running are bound to holder 'default': in a session that had
-- a lease, that is the lease's part; in one without, a part that keeps no
-- workers is made for it, so that such a run (whose client held no lease)
-- ends one ttl after the upgrade unless a client renews it, instead of
-- staying running for ever.
ALTER TABLE runs ADD COLUMN holder TEXT;
UPDATE runs SET holder = 'default' WHERE status = 'running';
INSERT OR IGNORE INTO lease_holders(session, holder, ttl_seconds, stop_workers)
  SELECT DISTINCT session, 'default', 30, 0 FROM runs WHERE status = 'running';
CREATE INDEX runs_running ON runs(session, holder) WHERE status = 'running';
