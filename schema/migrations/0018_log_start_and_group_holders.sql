-- 0018: a partition's log start, and a group name held by one kind of
-- consumer at a time.
--
-- Log start. A Kafka client reads a partition from its log start offset up
-- to its high watermark, and a broker moves the log start only when it
-- deletes records. Under offset scope 'topic' a partition's offsets have
-- gaps (its first event may be at offset 57), and a log start read as "the
-- first retained event's offset" jumped from 1 to 57 when that event
-- arrived: a client placed at 1 was told OFFSET_OUT_OF_RANGE and, with
-- auto.offset.reset=latest, skipped to the end. partition_counters.log_start
-- is the first offset retention has not removed from the partition: 1 until
-- retention drops one of its segments, then the end of the newest segment
-- dropped. It moves in the dropping transaction (store.ApplyRetention), and
-- nowhere else. Events below it are gone; events at or above it are all
-- there, however sparse.
ALTER TABLE partition_counters ADD COLUMN log_start bigint NOT NULL DEFAULT 1 CHECK (log_start > 0);

-- Partitions of topics retention already removed from: removed_below is the
-- end of the newest segment dropped in any partition of the topic, at least
-- the end of each partition's own; the partition's first retained event is
-- at or above its own. The lower of the two is never below what was removed
-- from the partition, and never above its first retained event.
UPDATE partition_counters pc
   SET log_start = greatest(1, least(r.removed_below,
           coalesce((SELECT m.c_offset FROM outbox_message_t m
                      WHERE m.topic_id = pc.topic_id AND m.partition_id = pc.partition_id
                      ORDER BY m.c_offset LIMIT 1),
                    tail(pc.topic_id, pc.partition_id) + 1)))
  FROM topic_retention r
 WHERE r.topic_id = pc.topic_id AND r.removed_below > 1;

-- A group's name. pgevents replicas and the members of a Kafka group
-- (package kafka) both move a group's positions; running at once, they
-- would handle the same events twice and move each other's positions. So
-- a group's name belongs to one kind of consumer at a time:
--
--   - a consumer that is not a pgevents replica (the Kafka endpoint's
--     group coordinator) holds the group's holder key, an advisory lock for
--     its session, while it has members (hold_group), and describes itself
--     in group_holders;
--   - a replica registers (register_replica, at start and at every
--     heartbeat) only while nobody holds that key, and the holder takes it
--     only while no replica of the group is live.
--
-- The two checks are serialised by the group's name key (lock_key 'group'),
-- taken exclusive by hold_group and shared by register_replica for their
-- transactions: whichever comes second sees the other's work (a replica's
-- committed heartbeat, or the holder key, which is not transactional).
-- A holder also ends the batch a replica of the group that is no longer
-- live (frozen or cut off) still runs, and frees their leases: one that
-- wakes up has no batch left to commit, claims nothing (its lease is gone)
-- and its next heartbeat is refused.
CREATE TABLE group_holders (
    group_id text        PRIMARY KEY CHECK (group_id <> ''),
    holder   text        NOT NULL,
    detail   text        NOT NULL DEFAULT '',
    held_at  timestamptz NOT NULL DEFAULT clock_timestamp()
);

-- batch_backends returns the server processes that run a batch of replica
-- p_owner: a batch holds the owner's batch key (lock_key 'batch', shared)
-- from its claim to its end (claim_state, migration 0021), so that a
-- takeover can end the batch of a replica that lost its lease while frozen
-- or cut off, and nothing else of that replica's.
CREATE FUNCTION batch_backends(p_owner text) RETURNS TABLE (pid integer)
LANGUAGE sql STABLE STRICT
BEGIN ATOMIC
    SELECT l.pid
      FROM (SELECT lock_key('batch', p_owner) AS key) k
      JOIN pg_locks l ON l.locktype = 'advisory' AND l.objsubid = 1 AND l.granted
       AND l.database = (SELECT d.oid FROM pg_database d WHERE d.datname = current_database())
       AND l.classid = ((k.key >> 32) & 4294967295)::oid AND l.objid = (k.key & 4294967295)::oid
     WHERE l.pid <> pg_backend_pid();
END;

-- group_holder returns who holds group p_group's name while a session
-- holds its holder key (NULL otherwise): as group_holders describes it, or
-- by the session's application_name while the description is not
-- committed yet (the key is taken, and seen, before the transaction that
-- writes the row commits).
CREATE FUNCTION group_holder(p_group text) RETURNS text
LANGUAGE plpgsql STABLE STRICT AS $$
DECLARE
    k bigint := lock_key('group-holder', p_group);
    session text;
    d text;
BEGIN
    -- The holder's key is exclusive; a replica's registration holds it
    -- shared for an instant (register_replica), which is not a holder.
    SELECT coalesce(nullif(a.application_name, ''), 'backend ' || l.pid) INTO session
      FROM pg_locks l
      LEFT JOIN pg_stat_activity a ON a.pid = l.pid
     WHERE l.locktype = 'advisory' AND l.objsubid = 1 AND l.granted AND l.mode = 'ExclusiveLock'
       AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
       AND l.classid = ((k >> 32) & 4294967295)::oid AND l.objid = (k & 4294967295)::oid
     LIMIT 1;
    IF session IS NULL THEN
        RETURN NULL;
    END IF;
    SELECT h.holder || CASE WHEN h.detail <> '' THEN ' (' || h.detail || ')' ELSE '' END INTO d
      FROM group_holders h WHERE h.group_id = p_group;
    RETURN coalesce(d, 'the session ' || quote_literal(session));
END;
$$;

-- hold_group takes group p_group's name for a consumer that is not a
-- pgevents replica, described by p_holder and p_detail: for the session
-- when p_session (the holder key, until release_group or the session's
-- end), else for the calling transaction only (the name key, exclusive:
-- no replica registers until it ends). It raises SQLSTATE PGG01, naming
-- them, while a replica of the group is live, and frees the leases of the
-- group's replicas that are not. Taking the key a second time on a session
-- that holds it does nothing.
CREATE FUNCTION hold_group(p_group text, p_session boolean, p_holder text, p_detail text) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    k bigint := lock_key('group-holder', p_group);
    live text;
    mine boolean;
BEGIN
    PERFORM pg_advisory_xact_lock(lock_key('group', p_group));
    SELECT string_agg(format('%s on %s (pid %s, topic %s)', r.replica_id, nullif(r.hostname, ''), r.pid, r.topic_id), ', '
                      ORDER BY r.replica_id)
      INTO live
      FROM consumer_replicas r
     WHERE r.group_id = p_group AND r.expires_at > clock_timestamp();
    IF live IS NOT NULL THEN
        RAISE EXCEPTION 'group % is consumed by pgevents replicas: %', p_group, live
            USING ERRCODE = 'PGG01', DETAIL = live;
    END IF;
    -- The replicas that own leases are not live: a batch one of them still
    -- runs (frozen, or cut off) is ended, as a takeover ends it
    -- (internal/lease's fence), and their leases are freed.
    PERFORM pg_terminate_backend(b.pid)
       FROM (SELECT DISTINCT l.owner FROM partition_leases l WHERE l.group_id = p_group AND l.owner <> '') o
      CROSS JOIN LATERAL batch_backends(o.owner) b;
    UPDATE partition_leases l SET owner = '' WHERE l.group_id = p_group AND l.owner <> '';
    IF NOT p_session THEN
        RETURN;
    END IF;
    SELECT true INTO mine
      FROM pg_locks l
     WHERE l.locktype = 'advisory' AND l.objsubid = 1 AND l.granted AND l.mode = 'ExclusiveLock' AND l.pid = pg_backend_pid()
       AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
       AND l.classid = ((k >> 32) & 4294967295)::oid AND l.objid = (k & 4294967295)::oid
     LIMIT 1;
    IF mine IS NULL AND NOT pg_try_advisory_lock(k) THEN
        RAISE EXCEPTION 'group % is held by %', p_group, coalesce(group_holder(p_group), 'another session')
            USING ERRCODE = 'PGG02', DETAIL = coalesce(group_holder(p_group), 'another session');
    END IF;
    INSERT INTO group_holders AS h (group_id, holder, detail) VALUES (p_group, p_holder, p_detail)
    ON CONFLICT (group_id) DO UPDATE SET holder = excluded.holder, detail = excluded.detail,
                                         held_at = CASE WHEN mine THEN h.held_at ELSE excluded.held_at END;
END;
$$;

-- release_group gives group p_group's holder key back, if the session
-- holds it.
CREATE FUNCTION release_group(p_group text) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    k bigint := lock_key('group-holder', p_group);
BEGIN
    WHILE EXISTS (SELECT 1 FROM pg_locks l
                   WHERE l.locktype = 'advisory' AND l.objsubid = 1 AND l.granted AND l.mode = 'ExclusiveLock'
                     AND l.pid = pg_backend_pid()
                     AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
                     AND l.classid = ((k >> 32) & 4294967295)::oid AND l.objid = (k & 4294967295)::oid) LOOP
        PERFORM pg_advisory_unlock(k);
    END LOOP;
    DELETE FROM group_holders h WHERE h.group_id = p_group;
END;
$$;

-- register_replica records replica p_replica of group p_group on topic
-- p_topic as live until now + p_lease (the heartbeat of internal/lease),
-- unless another kind of consumer holds the group's name: then it raises
-- SQLSTATE PGG02 naming the holder, and the replica is not live.
CREATE FUNCTION register_replica(p_group text, p_topic integer, p_replica text, p_mode text,
                                 p_hostname text, p_pid integer, p_lease interval) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_advisory_xact_lock_shared(lock_key('group', p_group));
    IF NOT pg_try_advisory_xact_lock_shared(lock_key('group-holder', p_group)) THEN
        RAISE EXCEPTION 'group % is held by %', p_group, coalesce(group_holder(p_group), 'another kind of consumer')
            USING ERRCODE = 'PGG02', DETAIL = coalesce(group_holder(p_group), 'another kind of consumer');
    END IF;
    INSERT INTO consumer_replicas (group_id, topic_id, replica_id, mode, hostname, pid, expires_at)
    VALUES (p_group, p_topic, p_replica, p_mode, p_hostname, p_pid, clock_timestamp() + p_lease)
    ON CONFLICT (group_id, topic_id, replica_id)
    DO UPDATE SET heartbeat_at = clock_timestamp(), expires_at = excluded.expires_at, mode = excluded.mode;
END;
$$;
