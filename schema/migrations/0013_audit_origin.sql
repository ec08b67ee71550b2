-- 0013: where an operator's action was taken.
--
-- console_audit (0011) records the actions of the operator console. The
-- CLI's operator commands (group pause, resume and cancel, offsets reset,
-- dlq replay and discard) write their rows there too, through the same
-- function of package offsets, so that the audit shows every change an
-- operator made whatever the tool. origin says which tool: 'console' or
-- 'cli' (a service's own tools may name theirs). The actor of a CLI row is
-- the operating system's user@hostname, and its remote is empty. The rows
-- written before this migration are the console's.
ALTER TABLE console_audit
    ADD COLUMN origin text NOT NULL DEFAULT 'console' CHECK (origin <> '');
