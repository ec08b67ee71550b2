-- 0002: parked hosts and halted partitions, for the failure policies.

-- parked_hosts: hosts whose later events wait behind an open dead letter
-- (policy parkHost). A worker reads its partition's rows in the transaction
-- that claims the partition, after taking the partition's lock; the
-- dead-letter admin changes them under the same lock, so the two never race.
-- A host's order is never broken: while it is parked, its events are
-- recorded in parked_events instead of being handled.
CREATE TABLE parked_hosts (
    group_id       text        NOT NULL,
    topic_id       integer     NOT NULL,
    partition_id   integer     NOT NULL,
    host_id        text        NOT NULL,
    dead_letter_id bigint      NOT NULL REFERENCES dead_letter_queue (id),
    parked_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (group_id, topic_id, partition_id, host_id)
);

-- parked_events: the events held back behind a dead letter, with a copy of
-- each (retention may remove the original), released in offset order when
-- the dead letter is replayed or discarded.
CREATE TABLE parked_events (
    group_id       text        NOT NULL,
    topic_id       integer     NOT NULL,
    partition_id   integer     NOT NULL,
    c_offset       bigint      NOT NULL,
    dead_letter_id bigint      NOT NULL REFERENCES dead_letter_queue (id),
    event          jsonb       NOT NULL,
    parked_at      timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (group_id, topic_id, c_offset)
);

CREATE INDEX parked_events_dead_letter_idx ON parked_events (dead_letter_id, c_offset);

-- partition_halts: partitions stopped at a failing unit (policy halt, or the
-- dead-letter circuit breaker). The row says where and why; the worker
-- removes it in the batch that finally moves past that offset.
CREATE TABLE partition_halts (
    group_id     text        NOT NULL,
    topic_id     integer     NOT NULL,
    partition_id integer     NOT NULL,
    c_offset     bigint      NOT NULL,
    reason       text        NOT NULL,
    halted_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (group_id, topic_id, partition_id)
);

ALTER TABLE dead_letter_queue ADD COLUMN parked_hosts boolean NOT NULL DEFAULT false;
