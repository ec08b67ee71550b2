-- 0023: a sequencer's tick reads only what it moves, and announces all of
-- it.
--
-- Reads. sequence_tick (0016) selected the staged events its previous
-- snapshot did not see with one predicate, xid >= xmax OR xid = ANY (xip).
-- PL/pgSQL keeps a statement's plan: made while the staging table was
-- small, it scanned the table whole, and went on doing so as the table
-- grew to the two rotation periods of events it holds (about 20,000 rows
-- at 1,000 events/s). And the planner chose to plan the tick's statements
-- again at every call (a custom plan prunes the staging and log partitions
-- at planning; the generic plan, which prunes them at execution, looked
-- dearer), which cost more than their execution. Measured, 1,000
-- single-event transactions a second from 4 producers, a consumer
-- attached: 2.0 ms of server time a tick, 1.6 ms of it in the three reads
-- of the staging table; the sequencer ticked back to back, and an event
-- waited for the tick in progress and then for its own.
--
-- Now each read is two probes of the staging table's xid index: the ids
-- at or above the previous xmax (a range that starts at the new rows), and
-- the ids that were in progress (a lookup each). The function turns
-- sequential scans off for its statements (SET enable_seqscan), so that no
-- plan made on a small table outlives it, and keeps one generic plan per
-- statement (SET plan_cache_mode). A tick's work is then proportional to
-- what it moves, whatever the size of the staging table. What a tick
-- moves, and in what order, is 0016's.
--
-- Announcement. A tick notifies the topic's channel of every partition it
-- moved, in one notification of the producers' form
-- ("<topic>:<partition>/<tail>,..."), whatever the topic's wake-up mode,
-- and no longer marks its partitions in flight. A notifying commit holds
-- the database's notification lock until it ends, which is what the
-- 'waiting' mode spares producers; the sequencer commits its ticks
-- asynchronously (its session's synchronous_commit is the consumer pool's,
-- off), so a tick holds that lock for no flush, and a topic's ticks come
-- one at a time.
-- So consumers learn of sequenced events from the tick that moved them,
-- when it commits, and the watcher need not look for them: consumers treat
-- a sequenced topic as one of wake-up mode 'always' (no watching, no
-- sleep keys). A consumer of an earlier version, which still watches and
-- sleeps, is told of every moved partition too.
CREATE OR REPLACE FUNCTION sequence_tick(p_topic_id integer) RETURNS integer
LANGUAGE plpgsql
SET enable_seqscan = off
SET plan_cache_mode = force_generic_plan
AS $$
DECLARE
    prev     pg_snapshot;
    cur      pg_snapshot;
    lo       xid8;      -- prev's xmax
    open     xid8[];    -- prev's in-progress ids
    t        record;
    np       integer;
    n        integer;
    parts    integer[];
    maxes    bigint[];
    msg      text;
BEGIN
    -- A look without a lock first: an idle topic's tick writes nothing.
    SELECT s.snapshot INTO prev FROM sequencer_ticks s WHERE s.topic_id = p_topic_id;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'sequence_tick: topic % is not sequenced', p_topic_id USING ERRCODE = '22023';
    END IF;
    lo := pg_snapshot_xmax(prev);
    open := ARRAY(SELECT pg_snapshot_xip(prev));
    IF NOT EXISTS (SELECT 1 FROM staged_events e WHERE e.topic_id = p_topic_id AND e.xid >= lo)
       AND (cardinality(open) = 0
            OR NOT EXISTS (SELECT 1 FROM staged_events e WHERE e.topic_id = p_topic_id AND e.xid = ANY (open))) THEN
        RETURN 0;
    END IF;
    SELECT c.channel, c.appends INTO t FROM log_counter c WHERE c.topic_id = p_topic_id;
    -- One tick at a time: the row lock, held to commit (a tick that waited
    -- reads the snapshot the other one wrote).
    SELECT s.snapshot INTO prev FROM sequencer_ticks s WHERE s.topic_id = p_topic_id FOR UPDATE;
    lo := pg_snapshot_xmax(prev);
    open := ARRAY(SELECT pg_snapshot_xip(prev));
    -- The layout, as an append takes it: a repartition waits for the tick.
    np := lock_layout(p_topic_id);
    -- The snapshot and the partitions of what it sees, in one statement.
    SELECT pg_current_snapshot(), array_agg(DISTINCT event_partition(e.host_id, np) ORDER BY event_partition(e.host_id, np))
      INTO cur, parts
      FROM (SELECT e.host_id FROM staged_events e WHERE e.topic_id = p_topic_id AND e.xid >= lo
            UNION ALL
            SELECT e.host_id FROM staged_events e WHERE e.topic_id = p_topic_id AND e.xid = ANY (open)) e;
    IF parts IS NULL THEN
        RETURN 0;
    END IF;
    IF t.appends IS NOT NULL THEN
        PERFORM nextval(t.appends);  -- see log_counter.appends
    END IF;
    PERFORM lock_partitions(p_topic_id, parts);
    -- The events cur sees and prev does not, each partition's after its
    -- tail: transactions in the order of their last sequence number, a
    -- transaction's events in sequence order.
    WITH new AS (
        SELECT e.* FROM staged_events e WHERE e.topic_id = p_topic_id AND e.xid >= lo
        UNION ALL
        SELECT e.* FROM staged_events e WHERE e.topic_id = p_topic_id AND e.xid = ANY (open)
    ), ev AS (
        SELECT e.*, event_partition(e.host_id, np) AS p, max(e.seq) OVER (PARTITION BY e.xid) AS last
          FROM new e
         WHERE pg_visible_in_snapshot(e.xid, cur)
    ), tl AS (
        SELECT q.p, coalesce((SELECT pt.c_offset FROM partition_tails pt
                               WHERE pt.topic_id = p_topic_id AND pt.partition_id = q.p
                               ORDER BY pt.c_offset DESC LIMIT 1), 0) AS o
          FROM unnest(parts) AS q(p)
    ), o AS (
        SELECT ev.*, tl.o + row_number() OVER (PARTITION BY ev.p ORDER BY ev.last, ev.seq) AS off
          FROM ev JOIN tl ON tl.p = ev.p
    ), ins AS (
        INSERT INTO outbox_message_t
            (c_offset, topic_id, partition_id, event_id, host_id, user_id,
             transaction_id, event_type, payload, metadata, created_at)
        SELECT o.off, p_topic_id, o.p, o.event_id, o.host_id, o.user_id,
               o.xid::text::bigint, o.event_type, o.payload, o.metadata, o.created_at
          FROM o ORDER BY o.p, o.off
        RETURNING outbox_message_t.partition_id, outbox_message_t.c_offset
    ), keyed AS (
        UPDATE idempotency_keys ik SET partition_id = o.p, c_offset = o.off
          FROM o WHERE o.idempotency_key IS NOT NULL AND ik.topic_id = p_topic_id AND ik.key = o.idempotency_key
    )
    SELECT array_agg(x.p ORDER BY x.p), array_agg(x.m ORDER BY x.p), sum(x.n) INTO parts, maxes, n
      FROM (SELECT ins.partition_id AS p, max(ins.c_offset) AS m, count(*) AS n FROM ins GROUP BY ins.partition_id) x;
    INSERT INTO partition_tails SELECT p_topic_id, u.p, u.m FROM unnest(parts, maxes) AS u(p, m);
    UPDATE sequencer_ticks s SET snapshot = cur, tick = s.tick + 1, ticked_at = now() WHERE s.topic_id = p_topic_id;
    -- Every partition moved, announced (see the header), once the tick
    -- commits.
    SELECT p_topic_id || ':' || string_agg(u.p || '/' || u.m, ',' ORDER BY u.p) INTO msg
      FROM unnest(parts, maxes) AS u(p, m);
    IF length(msg) > 7000 THEN
        msg := p_topic_id || ':*';
    END IF;
    IF msg IS NOT NULL THEN
        PERFORM pg_notify(t.channel, msg);
    END IF;
    RETURN coalesce(n, 0);
END;
$$;
