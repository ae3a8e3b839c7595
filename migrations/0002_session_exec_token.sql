-- 0002_session_exec_token.sql: the credential of a session's exec channel
-- (docs/exec-protocol.md). Sessions made before this migration get one now.
ALTER TABLE sessions ADD COLUMN exec_token TEXT;
UPDATE sessions SET exec_token = lower(hex(randomblob(24))) WHERE exec_token IS NULL;
