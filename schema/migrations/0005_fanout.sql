-- 0005: subscriptions of consumer groups and retention by watermark.

-- subscriptions: the consumer groups of each topic and their lifecycle.
--
--   ACTIVE    consuming; holds the watermark
--   PAUSED    stopped by an operator (consumer group pause); its replicas
--             keep running but handle nothing; holds the watermark
--   DEAD      no replica for dead_after (automatic, from ACTIVE); does not
--             hold the watermark, so a forgotten group cannot stop
--             retention (zombie protection); back to ACTIVE when a replica
--             returns
--   CANCELLED terminal (consumer group cancel): never holds the watermark
--             and its replicas refuse to start
--
-- Valid transitions: ACTIVE <-> PAUSED (operator), ACTIVE -> DEAD (heartbeat
-- timeout), DEAD -> ACTIVE (heartbeat), ACTIVE|PAUSED|DEAD -> CANCELLED
-- (operator). last_seen_at is the latest heartbeat of any replica, on the
-- database clock.
CREATE TABLE subscriptions (
    group_id         text        NOT NULL,
    topic_id         integer     NOT NULL,
    state            text        NOT NULL DEFAULT 'ACTIVE'
                                 CHECK (state IN ('ACTIVE', 'PAUSED', 'DEAD', 'CANCELLED')),
    start_from       text        NOT NULL DEFAULT 'earliest',
    dead_after       interval    NOT NULL DEFAULT '60 seconds',
    created_at       timestamptz NOT NULL DEFAULT now(),
    state_changed_at timestamptz NOT NULL DEFAULT now(),
    last_seen_at     timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (group_id, topic_id)
) WITH (fillfactor = 50);

INSERT INTO subscriptions (group_id, topic_id)
SELECT DISTINCT group_id, topic_id FROM consumer_offsets
ON CONFLICT DO NOTHING;

-- topic_retention: how long a topic keeps its events, and how far
-- retention has removed them.
--
-- A segment of outbox_message_t is removed when its newest event is older
-- than retention and all its offsets are below the watermark (what every
-- ACTIVE or PAUSED group still needs), or, whatever the groups, when its
-- newest event is older than max_retention (a hard cap on disk). A topic
-- without subscriptions keeps events at least zero_subscription_retention.
-- removed_below: every offset below it is gone.
CREATE TABLE topic_retention (
    topic_id                    integer     PRIMARY KEY,
    retention                   interval    NOT NULL DEFAULT '7 days',
    max_retention               interval,
    zero_subscription_retention interval    NOT NULL DEFAULT '24 hours',
    removed_below               bigint      NOT NULL DEFAULT 1,
    removed_at                  timestamptz
);

INSERT INTO topic_retention (topic_id) SELECT topic_id FROM log_counter ON CONFLICT DO NOTHING;

-- retention_skips: events removed before a group handled them (it was
-- DEAD, or the max_retention cap struck), counted per group and partition
-- at removal, so that the group is told when it returns: nothing is
-- skipped silently.
CREATE TABLE retention_skips (
    id           bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    group_id     text        NOT NULL,
    topic_id     integer     NOT NULL,
    partition_id integer     NOT NULL,
    skipped      bigint      NOT NULL,
    first_offset bigint      NOT NULL,
    last_offset  bigint      NOT NULL,
    reason       text        NOT NULL,
    removed_at   timestamptz NOT NULL DEFAULT now(),
    reported_at  timestamptz
);

CREATE INDEX retention_skips_group_idx ON retention_skips (group_id, topic_id) WHERE reported_at IS NULL;
