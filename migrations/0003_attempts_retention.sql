-- 0003_attempts_retention.sql: exactly-once starts, launches as gangs, why a
-- worker waits, and retention.
--
-- attempt: the start attempt the backend was last asked for; committed with
-- the worker's `starting` state before the backend acts, so a muster-workerd
-- of any other attempt is refused when it registers.
-- launch_id: the launch (gang) a worker came from; a backend may place a
-- launch all or nothing.
-- waiting_for: while `scheduling`, why, in words.
-- backend_ref: opaque to all but the backend that wrote it (the local
-- backend's is "pid:start-time", never a bare pid).
ALTER TABLE workers ADD COLUMN attempt INTEGER NOT NULL DEFAULT 0;
ALTER TABLE workers ADD COLUMN launch_id TEXT;
ALTER TABLE workers ADD COLUMN waiting_for TEXT;

-- Workers that were live under an earlier controller keep their pid as
-- their reference, which a restarted controller no longer trusts.
UPDATE workers SET attempt = 1 WHERE status <> 'scheduling';

CREATE INDEX events_worker ON events(worker_id);
CREATE INDEX workers_finished ON workers(finished_at) WHERE finished_at IS NOT NULL;

-- Retention has one designated path: the pruner opens this gate, deletes the
-- terminal workers that are past --retain with their events, and closes it,
-- all in one transaction. Every other writer still meets the triggers.
CREATE TABLE prune_gate (open INTEGER NOT NULL);

DROP TRIGGER events_no_delete;
CREATE TRIGGER events_no_delete BEFORE DELETE ON events
WHEN NOT EXISTS (SELECT 1 FROM prune_gate)
BEGIN SELECT RAISE(ABORT, 'events are append-only'); END;

CREATE TRIGGER workers_no_delete BEFORE DELETE ON workers
WHEN NOT EXISTS (SELECT 1 FROM prune_gate)
  OR OLD.status NOT IN ('succeeded', 'failed', 'stopped')
BEGIN SELECT RAISE(ABORT, 'only terminal workers are pruned, and only by retention'); END;
