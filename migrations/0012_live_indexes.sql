-- 0012_live_indexes.sql: what /metrics and a launch's quota read about
-- live workers, from indexes alone (docs/internals/controller.md,
-- "Metrics"). With 100,000 live workers, the users' sums read every live
-- row of the table and sorted them, and the live workers' usage read every
-- live row to find those with usage: /metrics took 90-120 ms.

-- A user's live workers' cores, memory and GPUs in the index itself (none
-- of them changes after the launch), in owner order: no row read, no sort.
DROP INDEX workers_owner_live;
CREATE INDEX workers_owner_live ON workers(owner, cpu, memory, nvidia_gpu)
  WHERE status IN ('scheduling', 'starting', 'running');

-- The live workers that have usage, in id order (an entry is made once,
-- at a worker's first usage, and goes at its end).
CREATE INDEX workers_live_usage ON workers(id)
  WHERE status IN ('starting', 'running') AND usage_cpu_seconds IS NOT NULL;
