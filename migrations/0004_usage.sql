-- 0004_usage.sql: what a worker uses, as its backend measures it (the local
-- backend: its cgroup). Live while it runs (written at most once a second,
-- with the heartbeats), final after it ended; NULL where nothing measures.
--
-- usage_cpu_seconds: cpu time of every process of the worker so far.
-- usage_memory_bytes: memory in use now (the last sample, once ended).
-- usage_memory_peak_bytes: the most it ever used.
ALTER TABLE workers ADD COLUMN usage_cpu_seconds REAL;
ALTER TABLE workers ADD COLUMN usage_memory_bytes INTEGER;
ALTER TABLE workers ADD COLUMN usage_memory_peak_bytes INTEGER;
