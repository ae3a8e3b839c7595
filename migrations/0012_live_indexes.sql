-- 0012_live_indexes.sql: the live workers that have usage, for /metrics
-- (docs/internals/controller.md, "Reads"). With 100,000 live workers the
-- query read every live row to find the ones with usage, and sorted them.
-- An entry is made at a worker's first usage and goes at its end; each
-- usage sample writes it again (its condition names the sample's column),
-- at most 200 a second (the local backend's sampling).
CREATE INDEX workers_live_usage ON workers(id)
  WHERE status IN ('starting', 'running') AND usage_cpu_seconds IS NOT NULL;
