-- 0017: the gateways of the Kafka endpoint (package kafka).
--
-- A Kafka consumer group has one coordinator at a time, among the gateway
-- processes that serve the database: the gateway whose coordinator session
-- holds the group's coordinator key, an advisory lock for the session
-- (lock_key('kafka-group', <group>)). A gateway takes the key when a client
-- asks it for the group's coordinator and nobody holds it; the key goes
-- with the session (the process exited, was killed, or lost its
-- connection), and the next gateway asked takes it. The other gateways
-- answer FindCoordinator with the holder's address: the session's
-- application_name names its node ("pgevents kafka <node_id>"), and
-- kafka_gateways the address its clients reach it at.
CREATE TABLE kafka_gateways (
    node_id    integer PRIMARY KEY,
    host       text        NOT NULL,
    port       integer     NOT NULL CHECK (port BETWEEN 1 AND 65535),
    started_at timestamptz NOT NULL DEFAULT clock_timestamp()
);
