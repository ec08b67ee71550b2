-- 0003: leased partition ownership across replicas.

-- consumer_replicas: the live consumer processes of each group, renewed by
-- their heartbeat on the database clock. A replica whose expires_at has
-- passed is dead for every other replica. Auto-mode replicas split the
-- group's partitions evenly among the live ones.
CREATE TABLE consumer_replicas (
    group_id     text        NOT NULL,
    topic_id     integer     NOT NULL,
    replica_id   text        NOT NULL,
    mode         text        NOT NULL CHECK (mode IN ('auto', 'static')),
    hostname     text        NOT NULL DEFAULT '',
    pid          integer     NOT NULL DEFAULT 0,
    started_at   timestamptz NOT NULL DEFAULT clock_timestamp(),
    heartbeat_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    expires_at   timestamptz NOT NULL,
    PRIMARY KEY (group_id, topic_id, replica_id)
) WITH (fillfactor = 50);

-- partition_leases: who may handle each partition of a group.
--
-- A replica handles a partition only while it owns the lease: owner is its
-- replica id and epoch the value it acquired. Acquiring bumps the epoch, so
-- every batch transaction checks owner and epoch in the statement that moves
-- the offset; a replica that lost the lease (expired and taken over while it
-- was frozen or cut off) cannot commit. The consumer_offsets row lock still
-- orders batches; the lease decides whose batches they are, and the epoch is
-- the fencing token handed to handlers for effects outside PostgreSQL.
-- A live lease (expires_at in the future) is never taken: leases are sticky.
-- owner is '' when the lease is free.
CREATE TABLE partition_leases (
    group_id     text        NOT NULL,
    topic_id     integer     NOT NULL,
    partition_id integer     NOT NULL,
    owner        text        NOT NULL DEFAULT '',
    epoch        bigint      NOT NULL DEFAULT 0,
    acquired_at  timestamptz,
    heartbeat_at timestamptz,
    expires_at   timestamptz NOT NULL DEFAULT '-infinity',
    PRIMARY KEY (group_id, topic_id, partition_id)
) WITH (fillfactor = 50);

-- partition_ownership: who holds what, since when, with which epoch and
-- heartbeat, and whether the lease is live, for operators and `consumer
-- status`.
CREATE VIEW partition_ownership AS
SELECT l.group_id, l.topic_id, l.partition_id,
       nullif(l.owner, '') AS owner, l.epoch, l.acquired_at, l.heartbeat_at, l.expires_at,
       l.owner <> '' AND l.expires_at > clock_timestamp() AS live,
       r.hostname, r.pid, r.mode
FROM partition_leases l
LEFT JOIN consumer_replicas r
       ON r.group_id = l.group_id AND r.topic_id = l.topic_id AND r.replica_id = l.owner;
