-- 0007_cwd_path.sql: where a worker starts and where its commands are
-- looked up, as its launch gave them (the clients send their own working
-- directory and PATH by default).
--
-- cwd: an absolute directory; the worker's command starts there and a
-- relative script resolves against it. NULL (every row from before, and
-- a launch that names none): the controller's --workdir.
-- path: the PATH the worker's commands are looked up on. NULL: the
-- worker's own (muster-workerd's environment), as before.
ALTER TABLE workers ADD COLUMN cwd TEXT;
ALTER TABLE workers ADD COLUMN path TEXT;
