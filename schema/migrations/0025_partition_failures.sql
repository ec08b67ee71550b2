-- 0025: partitions whose batches keep failing, as the consumers that own
-- them report it, for `consumer status` and the console.
--
-- A failed batch rolls back: nothing of it reaches the database, so only
-- the worker knows that its partition's batches fail. While they do, it
-- reports (store.ReportFailing, at most once per store.FailingReportEvery)
-- how many failed since its last commit, since when, the class of the
-- latest failure and its error, under its replica id; its first commit
-- after them deletes the row (store.ClearFailing). Both run only after a
-- failure: a partition whose batches commit writes nothing here.
--
-- Bounded: one row per (group, partition, replica). A replica that ended
-- while failing leaves its row behind: status shows a row only while its
-- replica owns the partition's lease, and each report deletes the group's
-- rows of replicas that are no longer registered.
CREATE TABLE partition_failures (
    group_id     text        NOT NULL,
    topic_id     integer     NOT NULL,
    partition_id integer     NOT NULL CHECK (partition_id >= 0),
    replica_id   text        NOT NULL,
    -- Batches that failed since the partition's last commit.
    failures     integer     NOT NULL CHECK (failures > 0),
    -- When the first of them failed, on the database clock.
    since        timestamptz NOT NULL,
    -- The class of the latest failure (transient, deployment, permanent,
    -- unknown), where it came from (handler, batch, session) and its error.
    class        text        NOT NULL,
    failed_in    text        NOT NULL,
    error        text        NOT NULL,
    reported_at  timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (group_id, topic_id, partition_id, replica_id)
);
