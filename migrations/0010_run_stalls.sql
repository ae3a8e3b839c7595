-- 0010_run_stalls.sql: a run's stall reports (docs/design.md, "Stalls"):
-- a JSON array of {"at", "report"}, at most 20.
ALTER TABLE runs ADD COLUMN stalls TEXT NOT NULL DEFAULT '[]';
