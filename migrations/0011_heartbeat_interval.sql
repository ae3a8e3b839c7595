-- 0011_heartbeat_interval.sql: the heartbeat interval each worker was last
-- told (docs/internals/controller.md, "Heartbeats"): it grows with the
-- number of live workers, and a restarted controller gives each restored
-- worker the timeout of the interval it beats at.
ALTER TABLE workers ADD COLUMN heartbeat_interval_ms INTEGER;
