-- 0011: what operators did from the console.

-- console_audit: one row per action taken in the operator console (package
-- console): a reset of a group's positions, a pause or resume, an unhalt, a
-- dead letter replayed or discarded. The row is written in the transaction
-- of the action when the action runs in one the console owns (reset,
-- pause, resume, unhalt: the row exists if and only if the action
-- committed), and right after it otherwise (replay and discard run in the
-- consumer's own transaction), with the outcome; a refused or failed
-- attempt is recorded too. actor is the name the operator gave when
-- signing in (the token is shared, so it is what the operator says, not an
-- identity), remote the client's address. Nothing deletes rows: prune the
-- table by hand when it grows.
CREATE TABLE console_audit (
    id             bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at             timestamptz NOT NULL DEFAULT clock_timestamp(),
    actor          text        NOT NULL,
    remote         text        NOT NULL,
    action         text        NOT NULL CHECK (action <> ''),
    topic_id       integer,
    group_id       text,
    partition_id   integer,
    dead_letter_id bigint,
    detail         text        NOT NULL DEFAULT '',
    outcome        text        NOT NULL
);

CREATE INDEX console_audit_group_idx ON console_audit (group_id, topic_id, id DESC);
