-- 0022: samples of each topic's throughput and of each group's progress,
-- written by maintenance, read by the console's charts.
--
-- The history of a topic lives in the database, not in the process that
-- shows it: every console, restarted or not, draws the same picture. A
-- maintenance pass (store.Sample, in every consumer process and `consumer
-- maintain`) writes one sample per topic and period: a row of
-- topic_samples (the partitions' heads, the events appended since the
-- previous sample) and a row of group_samples per group of the topic (its
-- positions, the events handled since the previous sample, its lag and lag
-- age, its dead letters), all read in one statement.
--
-- One writer per topic and period: a sample's key is its period's start
-- (bucket, date_bin of the writer's clock on the database), and the
-- statement writes the groups' rows only if it inserted the topic's row.
-- Two processes that sample the same topic in the same period (their
-- maintenance passes follow each other under the maintenance key, or one
-- runs `consumer maintain` beside the consumers) race for that row: the
-- second waits for the first's insert to commit, finds the key taken (ON
-- CONFLICT DO NOTHING) and writes nothing. So a bucket's rows are one
-- statement's, read in one snapshot.
--
-- Bounded: maintenance deletes the samples older than store.SampleKeep
-- (a little over the hour the console draws), so a topic holds at most
-- SampleKeep / SamplePeriod + 1 buckets, each one row per group and one
-- for the topic, whatever the load; nothing is written while no
-- maintenance runs.
CREATE TABLE topic_samples (
    topic_id integer     NOT NULL,
    -- The start of the sample's period: the key.
    bucket   timestamptz NOT NULL,
    -- When the figures were read (clock_timestamp() of the statement).
    taken_at timestamptz NOT NULL,
    -- Seconds since the previous sample of the topic; NULL for the first.
    seconds  float8 CHECK (seconds > 0),
    -- Events appended to the log since the previous sample (moved into
    -- the log by the sequencer, for a sequenced topic); NULL for the first.
    appended bigint CHECK (appended >= 0),
    -- The highest offset of each partition of any of the topic's layouts
    -- (element p + 1 for partition p; NULL: the partition is empty).
    heads    bigint[] NOT NULL,
    -- Events committed in staging that no tick has moved into the log
    -- (counted up to the sample's cap); NULL when the topic is not
    -- sequenced.
    staged   bigint,
    -- The application_name of the session that wrote it: the maintenance
    -- key's holder, "pgevents maintenance <replica>".
    writer   text NOT NULL,
    PRIMARY KEY (topic_id, bucket)
);

CREATE TABLE group_samples (
    topic_id      integer     NOT NULL,
    bucket        timestamptz NOT NULL,
    group_id      text        NOT NULL,
    taken_at      timestamptz NOT NULL,
    -- Seconds since the group's previous sample; NULL for its first.
    seconds       float8 CHECK (seconds > 0),
    -- Events handled since the group's previous sample, in every
    -- partition (a reset forward counts as handled, one backward as
    -- nothing); NULL for its first.
    handled       bigint CHECK (handled >= 0),
    -- The lag, summed over the partitions (staged events included), and
    -- whether a partition's was an estimate from the offsets (more events
    -- than the sample counts).
    lag           bigint  NOT NULL,
    lag_capped    boolean NOT NULL,
    -- The age of the oldest event the group is yet to handle, in seconds
    -- (the largest of its partitions'); 0 when it is yet to handle none.
    lag_seconds   float8  NOT NULL,
    -- Dead letters open, and dead letters written since the group's
    -- previous sample (NULL for its first).
    dead_letters  bigint  NOT NULL,
    dead_lettered bigint CHECK (dead_lettered >= 0),
    -- Per partition (element p + 1 for partition p): the position (NULL:
    -- none), the events handled since the previous sample, the lag, the
    -- lag's age, and the highest dead letter id seen, from which the next
    -- sample counts the new ones (a partition's dead letters are written
    -- by its batches in order, under its position lock).
    positions     bigint[] NOT NULL,
    part_handled  bigint[] NOT NULL,
    part_lag      bigint[] NOT NULL,
    part_lag_seconds float8[] NOT NULL,
    dead_letters_seen bigint[] NOT NULL,
    PRIMARY KEY (topic_id, bucket, group_id)
);
