-- 0009: no row updated per append or per batch, and wake-ups that cost
-- producers nothing while consumers keep up.
--
-- A row updated on every append or batch keeps every version while any
-- snapshot older than them is open (a report, pg_dump, a forgotten
-- session), and each lookup walks them: appends and batches slow down for as
-- long as the snapshot lives. Until 0008, an append updated its counter row
-- (log_counter or partition_counters), a batch its consumer_offsets row, a
-- heartbeat its lease rows, and an idle worker its partition's waiting flag,
-- which the appends read under the same lock. From here:
--
--   - offsets come from partition_tails, rows inserted (never updated) by
--     the appends: the next offset is the tail's + 1, read under an
--     advisory lock held to commit (gapless: a rolled-back append's tail
--     goes with it; commit-ordered: the lock);
--   - a group's position is the newest row of consumer_positions, inserted
--     by each batch; consumer_offsets is a view of them;
--   - a lease row changes when its owner does; the heartbeat renews the
--     replica's row, and a lease is live while its owner's replica is;
--   - a consumer that may be asleep on a partition holds an advisory lock
--     (the partition's sleep key) shared: an append that cannot take it
--     notifies, one that can does not. The consumer learns of commits
--     otherwise by reading partition_tails while events flow.
--
-- Advisory lock keys are derived from the schema's name (lock_key), so two
-- installations in one database never share one.
--
-- Producers must append in READ COMMITTED: the append reads the tail after
-- taking its lock, and a REPEATABLE READ snapshot would not see the commit
-- it waited for. They are refused with an error that says so.
--
-- In-flight appends of the old code: this migration takes every topic's
-- append lock before it changes anything, and drops the columns the old
-- append code updates (log_counter.next_offset, partition_counters
-- .next_offset) and its functions; an append that waited for the migration
-- inside the old code then fails with an error instead of reserving
-- offsets the new code does not know of. A consumer of the old code fails
-- on consumer_offsets, now a view, and handles nothing until it runs the
-- new code. Nothing is lost either way.

-- ---------------------------------------------------------------------------
-- Advisory lock keys.

-- lock_key returns the advisory lock key of a purpose and an id in this
-- installation: a 64-bit hash of the schema's name (baked in when this
-- migration runs), the purpose and the id. Purposes: 'append' (a partition's
-- appends, id "topic/partition"; or a topic's, id "topic", under scope
-- 'topic'), 'sleep' ("topic/partition"), 'position' ("group/topic/partition"),
-- 'segments' (""), 'maintenance' and 'retention' ("topic").
DO $key$
BEGIN
    EXECUTE format($f$
        CREATE FUNCTION lock_key(p_purpose text, p_id text) RETURNS bigint
        LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
        RETURN hashtextextended(%L || p_purpose || '/' || p_id, 0)$f$,
        'pgevents/' || current_schema() || '/');
END;
$key$;

-- The appends in flight end before anything changes, and new ones wait for
-- this migration: the old code's locks, taken as it takes them.
DO $drain$
DECLARE
    t record;
BEGIN
    FOR t IN SELECT topic_id FROM log_counter ORDER BY topic_id LOOP
        PERFORM lock_appends(t.topic_id);
    END LOOP;
    PERFORM 1 FROM partition_counters ORDER BY topic_id, partition_id FOR NO KEY UPDATE;
END;
$drain$;

-- ---------------------------------------------------------------------------
-- Tails.

-- partition_tails: for every append call, the highest offset it wrote in
-- each partition (partition_id >= 0), and under scope 'topic' with
-- allocation 'counter' in the topic (partition_id -1). Rows are inserted in
-- the appending transaction and never updated: the newest of a partition is
-- its highest committed offset, read through the index from its end, one
-- lookup whatever the versions an open snapshot keeps. Maintenance deletes
-- all but the newest row of each.
--
-- Invariant 1: an append takes the partition's (or the topic's) append lock
-- (lock_key 'append'), reads the tail, writes the next offsets and a new
-- tail, and holds the lock to commit. The next append reads the tail after
-- the lock is released, which is after the commit became visible: offsets
-- are gapless (a rolled-back append's tail is gone with it, and its offsets
-- are taken again) and commit-ordered.
CREATE TABLE partition_tails (
    topic_id     integer NOT NULL,
    partition_id integer NOT NULL CHECK (partition_id >= -1),
    c_offset     bigint  NOT NULL CHECK (c_offset > 0),
    PRIMARY KEY (topic_id, partition_id, c_offset)
);

INSERT INTO partition_tails (topic_id, partition_id, c_offset)
SELECT pc.topic_id, pc.partition_id, pc.next_offset - 1
  FROM partition_counters pc JOIN log_counter c USING (topic_id)
 WHERE c.offset_scope = 'partition' AND pc.next_offset > 1;
INSERT INTO partition_tails (topic_id, partition_id, c_offset)
SELECT c.topic_id, -1, c.next_offset - 1
  FROM log_counter c
 WHERE c.offset_scope = 'topic' AND c.allocation = 'counter' AND c.next_offset > 1;
-- Under scope 'topic', every partition's tail too: consumers read them.
INSERT INTO partition_tails (topic_id, partition_id, c_offset)
SELECT pc.topic_id, pc.partition_id, m.o
  FROM partition_counters pc
  JOIN log_counter c USING (topic_id)
 CROSS JOIN LATERAL (SELECT max(o.c_offset) AS o FROM outbox_message_t o
                      WHERE o.topic_id = pc.topic_id AND o.partition_id = pc.partition_id) m
 WHERE c.offset_scope = 'topic' AND m.o IS NOT NULL;

-- tail returns the newest tail of a partition (-1: the topic's), or 0.
CREATE FUNCTION tail(p_topic_id integer, p_partition integer) RETURNS bigint
LANGUAGE sql STABLE STRICT PARALLEL SAFE
RETURN coalesce((SELECT t.c_offset FROM partition_tails t
                  WHERE t.topic_id = p_topic_id AND t.partition_id = p_partition
                  ORDER BY t.c_offset DESC LIMIT 1), 0);

-- The counters' columns go: nothing updates a row per append any more.
-- partition_counters lists a topic's partitions (every partition any of its
-- layouts had); waiting is true for ever, for the bridges adopt installed
-- before this migration, which call wake_partitions when it is.
ALTER TABLE log_counter DROP COLUMN next_offset;
ALTER TABLE partition_counters DROP COLUMN next_offset;
ALTER TABLE partition_counters ALTER COLUMN waiting SET DEFAULT true;
UPDATE partition_counters SET waiting = true WHERE NOT waiting;
ALTER TABLE partition_counters SET (fillfactor = 100);
ALTER TABLE log_counter SET (fillfactor = 100);

-- The old code's functions go; reserve_offsets and wake_partitions are
-- defined anew below, for bridges installed before this migration.
DROP FUNCTION append_lock_key(integer);
DROP FUNCTION topic_gate_key(integer);

-- log_counter.appends: a sequence of the topic's, which every append call
-- draws from when it starts (nextval: no row version, no lock held). A
-- consumer whose partitions are awake reads its last value every fraction
-- of a millisecond, a lookup as cheap as a round trip can be, and reads the
-- partitions' tails only when it moved (or lately did): an append is
-- coming, or in flight. Created with the topic's tables
-- (ensure_outbox_segments); NULL until then, and appends skip it.
ALTER TABLE log_counter ADD COLUMN appends regclass;

-- ensure_appends_sequence creates the topic's appends sequence when it has
-- none.
CREATE FUNCTION ensure_appends_sequence(p_topic_id integer) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    name text := format('outbox_appends_%s', p_topic_id);
BEGIN
    IF (SELECT c.appends FROM log_counter c WHERE c.topic_id = p_topic_id) IS NOT NULL THEN
        RETURN;
    END IF;
    EXECUTE format('CREATE SEQUENCE IF NOT EXISTS %I AS bigint CYCLE', name);
    UPDATE log_counter SET appends = to_regclass(quote_ident(current_schema()) || '.' || quote_ident(name))
     WHERE topic_id = p_topic_id;
END;
$$;

DO $appends$
DECLARE
    t record;
BEGIN
    FOR t IN SELECT topic_id FROM log_counter ORDER BY topic_id LOOP
        PERFORM ensure_appends_sequence(t.topic_id);
    END LOOP;
END;
$appends$;

-- ---------------------------------------------------------------------------
-- Appending.

-- refuse_snapshot refuses an append outside READ COMMITTED: it reads the
-- tail after taking its lock, which a transaction snapshot taken before
-- would not show, and two appends would get the same offset.
CREATE FUNCTION refuse_snapshot() RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        RAISE EXCEPTION 'pgevents: append in a READ COMMITTED transaction, not %', current_setting('transaction_isolation')
            USING ERRCODE = '0A000',
                  HINT = 'an append takes its offsets from what committed before it, which a transaction snapshot does not show';
    END IF;
END;
$$;

-- The wake-up keys. A consumer going to sleep on a partition takes its
-- sleep key shared and keeps it, and then looks at the partition's flight
-- key (below): if an append is in flight there, it gives the sleep key
-- back and stays awake. An append marks itself in flight when it starts,
-- and, once its events are written, tries to take the sleep key exclusive,
-- holding it to commit if it can: nobody sleeps, no notification. If it
-- cannot, either a consumer sleeps there (it holds the key shared: the key
-- can then be taken shared) and the append notifies, or another append
-- holds it (a commit releases its keys in no particular order, so the next
-- append of a partition often finds the previous one's sleep key still
-- held). Such an append notifies nobody if it is marked in flight: a
-- consumer that goes to sleep before it commits finds it in flight and
-- stays awake. An append that neither holds the key nor is marked
-- notifies. So a consumer asleep on a partition is notified of every
-- append that commits after it took the key, and finds the others in
-- flight, or in the tail it reads once it holds the key; a notification
-- is delivered at commit, so it never announces an invisible event.
--
-- wake_sleepers returns, of the partitions parts of a topic an append
-- wrote, those it must notify: all of them under wake 'always'; else those
-- whose sleep key it could not take, where a consumer holds the key shared
-- (the append can take it shared and still not exclusive) or where the
-- append is not marked in flight (unmarked, from mark_flight).
CREATE FUNCTION wake_sleepers(p_topic_id integer, p_wake text, parts integer[], unmarked integer[])
RETURNS integer[]
LANGUAGE plpgsql AS $$
DECLARE
    p   integer;
    k   bigint;
    out integer[] := '{}';
BEGIN
    IF p_wake = 'always' THEN
        RETURN parts;
    END IF;
    FOREACH p IN ARRAY parts LOOP
        k := lock_key('sleep', p_topic_id || '/' || p);
        -- Taken shared, the key is tried exclusive once more (a session's
        -- own hold never conflicts with its request): the append that held
        -- it exclusive may have committed between the two tries, and then
        -- nobody sleeps here; only a consumer's shared hold refuses it.
        IF NOT pg_try_advisory_xact_lock(k)
           AND (p = ANY (unmarked) OR (pg_try_advisory_xact_lock_shared(k) AND NOT pg_try_advisory_xact_lock(k))) THEN
            out := out || p;
        END IF;
    END LOOP;
    RETURN out;
END;
$$;

-- notify_sleepers notifies the topic's channel, in one notification, for
-- the partitions written (parts, with the highest offset written in each,
-- maxes) that wake_sleepers names, none of them marked in flight: for the
-- bridges adopt installed before this migration.
CREATE FUNCTION notify_sleepers(p_topic_id integer, p_channel text, p_wake text, parts integer[], maxes bigint[])
RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    msg  text;
    woke integer[];
BEGIN
    woke := wake_sleepers(p_topic_id, p_wake, parts, parts);
    SELECT p_topic_id || ':' || string_agg(u.p || '/' || u.m, ',' ORDER BY u.p) INTO msg
      FROM unnest(parts, maxes) AS u(p, m)
     WHERE u.p = ANY (woke);
    IF msg IS NULL THEN
        RETURN;
    END IF;
    IF length(msg) > 7000 THEN
        msg := p_topic_id || ':*';
    END IF;
    PERFORM pg_notify(p_channel, msg);
END;
$$;

-- mark_flight marks an append in flight on partitions parts of a topic: it
-- takes their flight keys shared, without waiting, until the transaction
-- ends, and returns the partitions where it could not (a consumer was
-- looking at the key, or waiting for it): see wake_sleepers. A consumer
-- with nothing to do in a partition looks at its flight key (taking it
-- exclusive without waiting, and releasing it at once): an append holds
-- it, so it waits for it (taking it exclusive, then releasing it), in the
-- round trip of its claim, and reads that append's events as soon as they
-- commit. The key never makes an append wait.
CREATE FUNCTION mark_flight(p_topic_id integer, parts integer[]) RETURNS integer[]
LANGUAGE plpgsql AS $$
DECLARE
    p   integer;
    out integer[] := '{}';
BEGIN
    FOREACH p IN ARRAY parts LOOP
        IF NOT pg_try_advisory_xact_lock_shared(lock_key('flight', p_topic_id || '/' || p)) THEN
            out := out || p;
        END IF;
    END LOOP;
    RETURN out;
END;
$$;

-- Append locks under scope 'partition'. An append takes the topic's append
-- key shared, then reads the partition count, then takes the append keys
-- of the partitions it writes, exclusive, in ascending order, all held to
-- commit. lock_appends (repartition_topic) takes the topic's key exclusive,
-- so the count cannot change while an append holds it, and every
-- transaction takes these keys in one order (the topic's, then partitions
-- ascending): one append call per transaction cannot deadlock, however the
-- count changes. (A partition's key taken before the count was known, and
-- a lower one after, would: found by TestFailureModel, seeds
-- 1795532250383803670 and 1795532254678770967.)
--
-- lock_layout takes the topic's append key shared and returns the
-- partition count, read under it.
CREATE FUNCTION lock_layout(p_topic_id integer) RETURNS integer
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_advisory_xact_lock_shared(lock_key('append', p_topic_id::text));
    RETURN (SELECT c.total_partitions FROM log_counter c WHERE c.topic_id = p_topic_id);
END;
$$;

-- lock_partitions takes the append keys of partitions ps (ascending) of a
-- topic of scope 'partition', the caller holding lock_layout.
CREATE FUNCTION lock_partitions(p_topic_id integer, ps integer[]) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    p integer;
BEGIN
    FOREACH p IN ARRAY ps LOOP
        PERFORM pg_advisory_xact_lock(lock_key('append', p_topic_id || '/' || p));
    END LOOP;
END;
$$;

-- append_one appends one event in the caller's transaction and returns its
-- offset (per partition under scope 'partition'); append_event calls it.
-- Call it as late in the transaction as possible: the append lock (the
-- partition's under scope 'partition', the topic's under scope 'topic')
-- stays held from here to commit.
CREATE FUNCTION append_one(
    topic_id integer,
    host_id text,
    user_id text,
    event_type text,
    payload jsonb,
    metadata jsonb DEFAULT NULL
)
RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    t      record;
    np     integer;
    np2    integer;
    p      integer;
    off    bigint;
    marked boolean;
BEGIN
    IF host_id IS NULL OR host_id = '' THEN
        RAISE EXCEPTION 'append_event: host_id is required (got %)',
            CASE WHEN host_id IS NULL THEN 'NULL' ELSE 'an empty string' END
            USING ERRCODE = '22023';
    END IF;
    IF event_type IS NULL OR event_type = '' THEN
        RAISE EXCEPTION 'append_event: event_type is required (got %)',
            CASE WHEN event_type IS NULL THEN 'NULL' ELSE 'an empty string' END
            USING ERRCODE = '22023';
    END IF;
    -- refuse_snapshot() and lock_layout(), written out: a plpgsql call
    -- costs more than their work (measured: 14 µs for lock_layout).
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        PERFORM refuse_snapshot();
    END IF;
    SELECT c.offset_scope, c.allocation, c.channel, c.wake, c.total_partitions, c.appends INTO t
      FROM log_counter c WHERE c.topic_id = append_one.topic_id;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'pgevents: topic % does not exist', append_one.topic_id
            USING ERRCODE = '23503', HINT = 'create it with: consumer migrate --config FILE';
    END IF;
    IF t.appends IS NOT NULL THEN
        PERFORM nextval(t.appends);  -- an append is coming: see log_counter.appends
    END IF;
    -- The partition's flight key, shared, before anything waits, and held
    -- to commit: a consumer that looks now sees an append in flight on the
    -- partition, and waits for its commit (see mark_flight). The partition
    -- is computed again if the count changed before the append's locks
    -- were had (repartition_topic changes it holding the topic's append
    -- key exclusive).
    np := t.total_partitions;
    p := event_partition(append_one.host_id, np);
    marked := pg_try_advisory_xact_lock_shared(lock_key('flight', append_one.topic_id || '/' || p));
    -- The tails are read here, not through tail(), whose plan would be
    -- made again at every call (an SQL function with a subquery is not
    -- inlined); this function's plans are kept.
    IF t.offset_scope = 'partition' THEN
        PERFORM pg_advisory_xact_lock_shared(lock_key('append', append_one.topic_id::text));
        SELECT c.total_partitions INTO np2 FROM log_counter c WHERE c.topic_id = append_one.topic_id;
        IF np2 <> np THEN
            p := event_partition(append_one.host_id, np2);
            marked := pg_try_advisory_xact_lock_shared(lock_key('flight', append_one.topic_id || '/' || p));
        END IF;
        PERFORM pg_advisory_xact_lock(lock_key('append', append_one.topic_id || '/' || p));
        off := coalesce((SELECT pt.c_offset FROM partition_tails pt
                          WHERE pt.topic_id = append_one.topic_id AND pt.partition_id = p
                          ORDER BY pt.c_offset DESC LIMIT 1), 0) + 1;
    ELSE
        PERFORM pg_advisory_xact_lock(lock_key('append', append_one.topic_id::text));
        SELECT c.total_partitions INTO np2 FROM log_counter c WHERE c.topic_id = append_one.topic_id;
        IF np2 <> np THEN
            p := event_partition(append_one.host_id, np2);
            marked := pg_try_advisory_xact_lock_shared(lock_key('flight', append_one.topic_id || '/' || p));
        END IF;
        IF t.allocation = 'sequence' THEN
            off := nextval(offset_sequence(append_one.topic_id)::regclass);
        ELSE
            off := coalesce((SELECT pt.c_offset FROM partition_tails pt
                              WHERE pt.topic_id = append_one.topic_id AND pt.partition_id = -1
                              ORDER BY pt.c_offset DESC LIMIT 1), 0) + 1;
            INSERT INTO partition_tails VALUES (append_one.topic_id, -1, off);
        END IF;
    END IF;
    INSERT INTO outbox_message_t
        (c_offset, topic_id, partition_id, host_id, user_id,
         transaction_id, event_type, payload, metadata)
    VALUES
        (off, append_one.topic_id, p,
         append_one.host_id, coalesce(append_one.user_id, ''),
         txid_current(), append_one.event_type,
         append_one.payload, append_one.metadata);
    INSERT INTO partition_tails VALUES (append_one.topic_id, p, off);
    -- See wake_sleepers, which this is for one partition.
    IF t.wake = 'always' OR (NOT pg_try_advisory_xact_lock(lock_key('sleep', append_one.topic_id || '/' || p))
                             AND (NOT marked OR (pg_try_advisory_xact_lock_shared(lock_key('sleep', append_one.topic_id || '/' || p))
                                                 AND NOT pg_try_advisory_xact_lock(lock_key('sleep', append_one.topic_id || '/' || p))))) THEN
        PERFORM pg_notify(t.channel, append_one.topic_id || ':' || p || '/' || off);
    END IF;
    RETURN off;
END;
$$;

-- append_event appends one event in the caller's transaction and returns
-- its offset: append_one's, in SQL, so that a call is inlined into the
-- caller's statement.
CREATE OR REPLACE FUNCTION append_event(
    topic_id integer,
    host_id text,
    user_id text,
    event_type text,
    payload jsonb,
    metadata jsonb DEFAULT NULL
)
RETURNS bigint
LANGUAGE sql VOLATILE
RETURN append_one(topic_id, host_id, user_id, event_type, payload, metadata);

-- append_many appends a JSON array of events, in one statement. Each
-- element is an object with keys host_id, user_id, event_type, payload and
-- metadata. It returns the offsets in array order: consecutive under scope
-- 'topic'; under scope 'partition', consecutive within each partition, in
-- array order, the partitions' append locks taken in ascending order.
-- append_events calls it.
CREATE FUNCTION append_many(topic_id integer, events jsonb)
RETURNS SETOF bigint
LANGUAGE plpgsql AS $$
DECLARE
    n        integer;
    bad      record;
    t        record;
    np       integer;
    np2      integer;
    first    bigint;
    sleeping integer[]; -- the partitions written that a consumer sleeps on
    unmarked integer[]; -- the partitions not marked in flight
    msg      text;
    ps     integer[];  -- each event's partition, in array order
    offs   bigint[];   -- each event's offset, in array order
    parts  integer[];  -- the partitions written, ascending
    maxes  bigint[];   -- the highest offset written in each
BEGIN
    IF events IS NULL OR jsonb_typeof(events) <> 'array' THEN
        RAISE EXCEPTION 'append_events: events must be a JSON array'
            USING ERRCODE = '22023';
    END IF;
    n := jsonb_array_length(events);
    IF n = 0 THEN
        RETURN;
    END IF;
    -- Validate before taking the append lock, which is held to commit.
    SELECT e.ord, e.e INTO bad
      FROM jsonb_array_elements(events) WITH ORDINALITY AS e(e, ord)
     WHERE jsonb_typeof(e.e) <> 'object'
        OR coalesce(e.e->>'host_id', '') = ''
        OR coalesce(e.e->>'event_type', '') = ''
     LIMIT 1;
    IF FOUND THEN
        IF jsonb_typeof(bad.e) <> 'object' THEN
            RAISE EXCEPTION 'append_events: event % is not a JSON object', bad.ord
                USING ERRCODE = '22023';
        ELSIF coalesce(bad.e->>'host_id', '') = '' THEN
            RAISE EXCEPTION 'append_events: event %: host_id is required (got %)', bad.ord,
                CASE WHEN bad.e->>'host_id' IS NULL THEN 'NULL' ELSE 'an empty string' END
                USING ERRCODE = '22023';
        ELSE
            RAISE EXCEPTION 'append_events: event %: event_type is required (got %)', bad.ord,
                CASE WHEN bad.e->>'event_type' IS NULL THEN 'NULL' ELSE 'an empty string' END
                USING ERRCODE = '22023';
        END IF;
    END IF;
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        PERFORM refuse_snapshot();  -- raises
    END IF;
    SELECT c.offset_scope, c.allocation, c.channel, c.wake, c.total_partitions, c.appends INTO t
      FROM log_counter c WHERE c.topic_id = append_many.topic_id;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'pgevents: topic % does not exist', append_many.topic_id
            USING ERRCODE = '23503', HINT = 'create it with: consumer migrate --config FILE';
    END IF;
    IF t.appends IS NOT NULL THEN
        PERFORM nextval(t.appends);  -- an append is coming: see log_counter.appends
    END IF;

    -- The partitions' flight keys, before anything waits (see
    -- append_event), and again for the partitions computed again if the
    -- count changed before the append's locks were had.
    np := t.total_partitions;
    SELECT array_agg(event_partition(e.e->>'host_id', np) ORDER BY e.ord) INTO ps
      FROM jsonb_array_elements(events) WITH ORDINALITY AS e(e, ord);
    SELECT array_agg(DISTINCT u.p ORDER BY u.p) INTO parts FROM unnest(ps) AS u(p);
    unmarked := mark_flight(append_many.topic_id, parts);
    IF t.offset_scope = 'partition' THEN
        np2 := lock_layout(append_many.topic_id);
        IF np2 <> np THEN
            np := np2;
            SELECT array_agg(event_partition(e.e->>'host_id', np) ORDER BY e.ord) INTO ps
              FROM jsonb_array_elements(events) WITH ORDINALITY AS e(e, ord);
            SELECT array_agg(DISTINCT u.p ORDER BY u.p) INTO parts FROM unnest(ps) AS u(p);
            unmarked := unmarked || mark_flight(append_many.topic_id, parts);
        END IF;
        PERFORM lock_partitions(append_many.topic_id, parts);
        -- Each partition's events take the offsets after its tail, in array
        -- order.
        SELECT array_agg(x.o ORDER BY x.ord) INTO offs
          FROM (SELECT u.ord, tl.o + row_number() OVER (PARTITION BY u.p ORDER BY u.ord) AS o
                  FROM unnest(ps) WITH ORDINALITY AS u(p, ord)
                  JOIN (SELECT q.p, coalesce((SELECT pt.c_offset FROM partition_tails pt
                                               WHERE pt.topic_id = append_many.topic_id AND pt.partition_id = q.p
                                               ORDER BY pt.c_offset DESC LIMIT 1), 0) AS o
                          FROM unnest(parts) AS q(p)) tl ON tl.p = u.p) x;
    ELSE
        PERFORM pg_advisory_xact_lock(lock_key('append', append_many.topic_id::text));
        np2 := (SELECT c.total_partitions FROM log_counter c WHERE c.topic_id = append_many.topic_id);
        IF np2 <> np THEN
            np := np2;
            SELECT array_agg(DISTINCT x.p ORDER BY x.p) INTO parts
              FROM (SELECT event_partition(e.e->>'host_id', np) AS p FROM jsonb_array_elements(events) AS e(e)) x;
            unmarked := unmarked || mark_flight(append_many.topic_id, parts);
        END IF;
        IF t.allocation = 'sequence' THEN
            -- Under the lock no other append draws from the sequence, so the
            -- block is contiguous.
            first := nextval(offset_sequence(append_many.topic_id)::regclass);
            IF n > 1 THEN
                PERFORM setval(offset_sequence(append_many.topic_id)::regclass, first + n - 1);
            END IF;
        ELSE
            first := coalesce((SELECT pt.c_offset FROM partition_tails pt
                                WHERE pt.topic_id = append_many.topic_id AND pt.partition_id = -1
                                ORDER BY pt.c_offset DESC LIMIT 1), 0) + 1;
            INSERT INTO partition_tails VALUES (append_many.topic_id, -1, first + n - 1);
        END IF;
        SELECT array_agg(event_partition(e.e->>'host_id', np) ORDER BY e.ord),
               array_agg(first + e.ord - 1 ORDER BY e.ord)
          INTO ps, offs
          FROM jsonb_array_elements(events) WITH ORDINALITY AS e(e, ord);
    END IF;
    INSERT INTO outbox_message_t
        (c_offset, topic_id, partition_id, host_id, user_id,
         transaction_id, event_type, payload, metadata)
    SELECT offs[e.ord], append_many.topic_id, ps[e.ord], e.e->>'host_id', coalesce(e.e->>'user_id', ''),
           txid_current(), e.e->>'event_type',
           nullif(e.e->'payload', 'null'::jsonb), nullif(e.e->'metadata', 'null'::jsonb)
      FROM jsonb_array_elements(events) WITH ORDINALITY AS e(e, ord)
     -- Rows of one partition next to each other, in offset order.
     ORDER BY ps[e.ord], offs[e.ord];
    SELECT array_agg(x.p ORDER BY x.p), array_agg(x.m ORDER BY x.p) INTO parts, maxes
      FROM (SELECT u.p, max(u.o) AS m FROM unnest(ps, offs) AS u(p, o) GROUP BY u.p) x;
    INSERT INTO partition_tails SELECT append_many.topic_id, u.p, u.m FROM unnest(parts, maxes) AS u(p, m);
    sleeping := wake_sleepers(append_many.topic_id, t.wake, parts, unmarked);
    IF cardinality(sleeping) > 0 THEN
        SELECT append_many.topic_id || ':' || string_agg(u.p || '/' || u.m, ',' ORDER BY u.p) INTO msg
          FROM unnest(parts, maxes) AS u(p, m) WHERE u.p = ANY (sleeping);
        IF length(msg) > 7000 THEN
            msg := append_many.topic_id || ':*';
        END IF;
        PERFORM pg_notify(t.channel, msg);
    END IF;
    RETURN QUERY SELECT unnest(offs);
END;
$$;

-- append_events appends a JSON array of events in the caller's transaction:
-- append_many's, in SQL.
CREATE OR REPLACE FUNCTION append_events(topic_id integer, events jsonb)
RETURNS SETOF bigint
LANGUAGE sql VOLATILE
BEGIN ATOMIC
    SELECT o FROM append_many(topic_id, events) AS o;
END;

-- reserve_offsets reserves count offsets of a topic of scope 'topic' and
-- returns the first and the partition count, leaving the topic's append
-- lock held to commit, as append_events does. It is kept for the bridges
-- adopt installed before this migration, which insert the events
-- themselves and then call wake_partitions, which writes the partitions'
-- tails.
CREATE OR REPLACE FUNCTION reserve_offsets(
    p_topic_id integer,
    p_count integer,
    OUT first_offset bigint,
    OUT total_partitions integer
)
LANGUAGE plpgsql AS $$
DECLARE
    alloc text;
    seq   regclass;
BEGIN
    PERFORM refuse_snapshot();
    PERFORM pg_advisory_xact_lock(lock_key('append', p_topic_id::text));
    SELECT c.total_partitions, c.allocation, c.appends INTO total_partitions, alloc, seq FROM log_counter c WHERE c.topic_id = p_topic_id;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'pgevents: topic % does not exist', p_topic_id
            USING ERRCODE = '23503', HINT = 'create it with: consumer migrate --config FILE';
    END IF;
    IF seq IS NOT NULL THEN
        PERFORM nextval(seq);
    END IF;
    IF alloc = 'sequence' THEN
        first_offset := nextval(offset_sequence(p_topic_id)::regclass);
        IF p_count > 1 THEN
            PERFORM setval(offset_sequence(p_topic_id)::regclass, first_offset + p_count - 1);
        END IF;
    ELSE
        first_offset := tail(p_topic_id, -1) + 1;
        INSERT INTO partition_tails VALUES (p_topic_id, -1, first_offset + p_count - 1);
    END IF;
END;
$$;

-- wake_partitions records the tails of the partitions an append wrote
-- itself (parts, with the highest offset written in each, maxes) and
-- notifies those where a consumer may be asleep (notify_sleepers). For the
-- bridges adopt installed before this migration; append_events does both
-- itself.
CREATE OR REPLACE FUNCTION wake_partitions(p_topic_id integer, p_channel text, p_wake text, parts integer[], maxes bigint[])
RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO partition_tails SELECT p_topic_id, u.p, u.m FROM unnest(parts, maxes) AS u(p, m)
    ON CONFLICT DO NOTHING;
    PERFORM notify_sleepers(p_topic_id, p_channel, p_wake, parts, maxes);
END;
$$;

-- ---------------------------------------------------------------------------
-- Offsets of a topic, and holding its appends off.

-- topic_next_offset returns the offset the topic's next append will get
-- under scope 'topic', never more than an offset an append in flight holds
-- (an uncommitted tail is invisible; a sequence's value is read after
-- waiting for the append in flight), and NULL under scope 'partition'.
CREATE OR REPLACE FUNCTION topic_next_offset(p_topic_id integer) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    c record;
    n bigint;
BEGIN
    SELECT lc.allocation, lc.offset_scope INTO c FROM log_counter lc WHERE lc.topic_id = p_topic_id;
    IF NOT FOUND OR c.offset_scope = 'partition' THEN
        RETURN NULL;
    END IF;
    IF c.allocation = 'counter' THEN
        RETURN tail(p_topic_id, -1) + 1;
    END IF;
    PERFORM pg_advisory_xact_lock_shared(lock_key('append', p_topic_id::text));
    EXECUTE format('SELECT last_value + CASE WHEN is_called THEN 1 ELSE 0 END FROM %I', offset_sequence(p_topic_id))
       INTO n;
    RETURN n;
END;
$$;

-- partition_next_offset returns the offset the next append to partition p
-- will get, never more than an offset an append in flight holds: the
-- partition's tail + 1 under scope 'partition', the topic's next offset
-- under scope 'topic'.
CREATE OR REPLACE FUNCTION partition_next_offset(p_topic_id integer, p_partition integer) RETURNS bigint
LANGUAGE plpgsql AS $$
BEGIN
    IF (SELECT offset_scope FROM log_counter WHERE topic_id = p_topic_id) = 'partition' THEN
        RETURN tail(p_topic_id, p_partition) + 1;
    END IF;
    RETURN topic_next_offset(p_topic_id);
END;
$$;

-- lock_appends holds the topic's appends off until the caller's
-- transaction ends, waiting for those in flight: it takes the topic's
-- append key exclusive, which every append holds (shared under scope
-- 'partition', see lock_layout) to commit. It locks the topic's row (FOR NO
-- KEY UPDATE), which orders the callers, and returns it.
CREATE OR REPLACE FUNCTION lock_appends(p_topic_id integer) RETURNS log_counter
LANGUAGE plpgsql AS $$
DECLARE
    c log_counter;
BEGIN
    SELECT * INTO c FROM log_counter lc WHERE lc.topic_id = p_topic_id FOR NO KEY UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'pgevents: topic % does not exist', p_topic_id USING ERRCODE = '23503';
    END IF;
    PERFORM pg_advisory_xact_lock(lock_key('append', p_topic_id::text));
    RETURN c;
END;
$$;

-- repartition_topic changes a topic's partition count from the next offsets
-- on, without a drain and without stopping producers: under the topic's
-- append locks (lock_appends: appends in flight end first, new ones wait for
-- this transaction), it records the new layout and returns its first offset
-- under scope 'topic' (the cut), or 0 under scope 'partition', where each
-- partition's first offset in the new layout is its next offset
-- (topic_layouts.from_offsets). An append that computed its partition with
-- the old count sees the new one once it has its lock, and computes it
-- again. Consumers finish the old layout up to the cut first.
CREATE OR REPLACE FUNCTION repartition_topic(p_topic_id integer, p_partitions integer)
RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    c     log_counter;
    v     integer;
    cut   bigint;
    froms bigint[];
BEGIN
    c := lock_appends(p_topic_id);
    IF c.total_partitions = p_partitions THEN
        RAISE EXCEPTION 'pgevents: topic % already has % partitions', p_topic_id, p_partitions
            USING ERRCODE = '22023';
    END IF;
    SELECT max(version) INTO v FROM topic_layouts WHERE topic_id = p_topic_id;
    INSERT INTO partition_counters (topic_id, partition_id)
    SELECT p_topic_id, p FROM generate_series(0, p_partitions - 1) AS p
    ON CONFLICT DO NOTHING;
    IF c.offset_scope = 'partition' THEN
        SELECT array_agg(tail(p_topic_id, pc.partition_id) + 1 ORDER BY pc.partition_id) INTO froms
          FROM partition_counters pc WHERE pc.topic_id = p_topic_id;
        cut := 0;
        INSERT INTO topic_layouts (topic_id, version, total_partitions, from_offset, from_offsets)
        VALUES (p_topic_id, coalesce(v, 0) + 1, p_partitions, 1, froms);
    ELSE
        cut := topic_next_offset(p_topic_id);
        INSERT INTO topic_layouts (topic_id, version, total_partitions, from_offset)
        VALUES (p_topic_id, coalesce(v, 0) + 1, p_partitions, cut);
    END IF;
    UPDATE log_counter SET total_partitions = p_partitions WHERE topic_id = p_topic_id;
    PERFORM pg_notify(c.channel, p_topic_id || ':*');
    RETURN cut;
END;
$$;

-- set_offset_allocation switches a topic of scope 'topic' between 'counter'
-- (offsets after the topic's tail) and 'sequence', continuing from the next
-- offset. It waits for the appends in flight. Under scope 'partition' the
-- setting is recorded and has no effect.
CREATE OR REPLACE FUNCTION set_offset_allocation(p_topic_id integer, p_allocation text) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    c    log_counter;
    next bigint;
BEGIN
    IF p_allocation NOT IN ('counter', 'sequence') THEN
        RAISE EXCEPTION 'pgevents: offset allocation must be counter or sequence, got %', p_allocation
            USING ERRCODE = '22023';
    END IF;
    c := lock_appends(p_topic_id);
    IF c.allocation = p_allocation THEN
        RETURN;
    END IF;
    IF c.offset_scope = 'partition' THEN
        -- Offsets per partition always come from the partitions' tails:
        -- the setting is kept, and means nothing.
        UPDATE log_counter SET allocation = p_allocation WHERE topic_id = p_topic_id;
        RETURN;
    END IF;
    next := topic_next_offset(p_topic_id);
    IF p_allocation = 'sequence' THEN
        EXECUTE format('CREATE SEQUENCE IF NOT EXISTS %I AS bigint MINVALUE 1', offset_sequence(p_topic_id));
        PERFORM setval(offset_sequence(p_topic_id)::regclass, next, false);
    ELSIF next > 1 THEN
        INSERT INTO partition_tails VALUES (p_topic_id, -1, next - 1) ON CONFLICT DO NOTHING;
    END IF;
    UPDATE log_counter SET allocation = p_allocation WHERE topic_id = p_topic_id;
END;
$$;

-- ensure_outbox_segments: as in 0008, with each partition's next offset
-- from partition_next_offset, and the segments lock of this installation.
CREATE OR REPLACE FUNCTION ensure_outbox_segments(p_topic_id integer, ahead integer DEFAULT 2)
RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    c       log_counter;
    size    bigint;
    p       integer;
    k       bigint;
    lo      bigint;
    hi      bigint;
    next    bigint;
    child   text;
    seg     text;
    created integer := 0;
    locked  boolean := false;
BEGIN
    IF NOT pg_try_advisory_xact_lock(lock_key('segments', '')) THEN
        RETURN 0;
    END IF;
    SELECT * INTO c FROM log_counter lc WHERE lc.topic_id = p_topic_id;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'pgevents: topic % does not exist', p_topic_id USING ERRCODE = '23503';
    END IF;
    size := c.segment_size;
    PERFORM ensure_appends_sequence(p_topic_id);
    FOR p IN
        SELECT g FROM generate_series(0, c.total_partitions - 1) AS g
        UNION
        SELECT DISTINCT d.partition_id FROM outbox_message_t_default d WHERE d.topic_id = p_topic_id
        ORDER BY 1
    LOOP
        child := format('outbox_message_t_%s_p%s', p_topic_id, p);
        IF to_regclass(quote_ident(child)) IS NULL THEN
            IF NOT locked THEN
                c := lock_appends(p_topic_id);
                locked := true;
            END IF;
            EXECUTE format('CREATE TABLE %I (LIKE outbox_message_t INCLUDING DEFAULTS INCLUDING CONSTRAINTS) PARTITION BY RANGE (c_offset)', child);
            EXECUTE format('ALTER TABLE %I ADD CONSTRAINT %I CHECK (topic_id = %s AND partition_id = %s)',
                           child, child || '_key', p_topic_id, p);
            EXECUTE format('CREATE TABLE %I PARTITION OF %I DEFAULT', child || '_default', child);
            EXECUTE format('WITH moved AS (DELETE FROM outbox_message_t_default
                                           WHERE topic_id = %s AND partition_id = %s RETURNING *)
                            INSERT INTO %I SELECT * FROM moved', p_topic_id, p, child);
            EXECUTE format('ALTER TABLE outbox_message_t ATTACH PARTITION %I FOR VALUES FROM (%s, %s) TO (%s, %s)',
                           child, p_topic_id, p, p_topic_id, p + 1);
            created := created + 1;
        END IF;
        -- The next offset, read without a lock (it only grows; segments are
        -- created under lock_appends, when no append is in flight).
        IF c.offset_scope = 'partition' THEN
            next := tail(p_topic_id, p) + 1;
        ELSIF c.allocation = 'sequence' THEN
            EXECUTE format('SELECT last_value + CASE WHEN is_called THEN 1 ELSE 0 END FROM %I', offset_sequence(p_topic_id))
               INTO next;
        ELSE
            next := tail(p_topic_id, -1) + 1;
        END IF;
        -- Segment k covers offsets [k*size + 1, (k+1)*size + 1).
        FOR k IN EXECUTE format(
            'SELECT DISTINCT (c_offset - 1) / %s FROM %I
             UNION SELECT generate_series((%s - 1) / %s, (%s - 1) / %s + %s) WHERE %s < %s
             ORDER BY 1', size, child || '_default', next, size, next, size, ahead, p, c.total_partitions)
        LOOP
            seg := format('%s_%s', child, k);
            CONTINUE WHEN to_regclass(quote_ident(seg)) IS NOT NULL;
            IF NOT locked THEN
                c := lock_appends(p_topic_id);
                locked := true;
            END IF;
            lo := k * size + 1;
            hi := (k + 1) * size + 1;
            EXECUTE format('CREATE TABLE %I (LIKE %I INCLUDING DEFAULTS INCLUDING CONSTRAINTS)', seg, child);
            EXECUTE format('ALTER TABLE %I ADD CONSTRAINT %I CHECK (topic_id = %s AND partition_id = %s AND c_offset >= %s AND c_offset < %s)',
                           seg, seg || '_bounds', p_topic_id, p, lo, hi);
            EXECUTE format('WITH moved AS (DELETE FROM %I WHERE c_offset >= %s AND c_offset < %s RETURNING *)
                            INSERT INTO %I SELECT * FROM moved', child || '_default', lo, hi, seg);
            EXECUTE format('ALTER TABLE %I ATTACH PARTITION %I FOR VALUES FROM (%s) TO (%s)', child, seg, lo, hi);
            created := created + 1;
        END LOOP;
    END LOOP;
    RETURN created;
END;
$$;

-- ---------------------------------------------------------------------------
-- Positions.

-- consumer_positions: a group's position in a partition is the newest row
-- (highest seq) of (group_id, topic_id, partition_id): the next offset to
-- read, Kafka style. A batch inserts a row in its transaction (invariant 3:
-- the position moves with the handlers' effects), an operator's reset or a
-- layout switch too; nothing updates one. The lookup reads the index from
-- its end, whatever older rows an open snapshot keeps; maintenance deletes
-- all but the newest row of each. Batches of a partition are ordered by its
-- position lock (lock_key 'position'), which every writer takes.
CREATE SEQUENCE position_seq AS bigint;

CREATE TABLE consumer_positions (
    group_id     text        NOT NULL CHECK (group_id <> ''),
    topic_id     integer     NOT NULL REFERENCES log_counter (topic_id),
    partition_id integer     NOT NULL CHECK (partition_id >= 0),
    seq          bigint      NOT NULL DEFAULT nextval('position_seq'),
    next_offset  bigint      NOT NULL CHECK (next_offset > 0),
    committed_at timestamptz NOT NULL DEFAULT now()
);
CREATE UNIQUE INDEX consumer_positions_idx ON consumer_positions (group_id, topic_id, partition_id, seq DESC);

INSERT INTO consumer_positions (group_id, topic_id, partition_id, next_offset, committed_at)
SELECT group_id, topic_id, partition_id, next_offset, updated_at FROM consumer_offsets;
DROP TABLE consumer_offsets;

-- consumer_offsets: every group's position in every partition, as before
-- (updated_at is when it was set).
CREATE VIEW consumer_offsets AS
SELECT DISTINCT ON (group_id, topic_id, partition_id)
       group_id, topic_id, partition_id, next_offset, committed_at AS updated_at
  FROM consumer_positions
 ORDER BY group_id, topic_id, partition_id, seq DESC;

-- consumer_offsets can be written as the table it was, by an operator or a
-- script: an insert or update of a row sets the position (a new row of
-- consumer_positions), a delete removes the partition's position, each
-- under the partition's position lock, as a batch takes it.
CREATE FUNCTION consumer_offsets_write() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        PERFORM lock_position(OLD.group_id, OLD.topic_id, OLD.partition_id);
        DELETE FROM consumer_positions
         WHERE group_id = OLD.group_id AND topic_id = OLD.topic_id AND partition_id = OLD.partition_id;
        RETURN OLD;
    END IF;
    IF TG_OP = 'UPDATE' AND (NEW.group_id, NEW.topic_id, NEW.partition_id) IS DISTINCT FROM (OLD.group_id, OLD.topic_id, OLD.partition_id) THEN
        RAISE EXCEPTION 'pgevents: a position moves within its group and partition; insert the other one'
            USING ERRCODE = '0A000';
    END IF;
    PERFORM lock_position(NEW.group_id, NEW.topic_id, NEW.partition_id);
    INSERT INTO consumer_positions (group_id, topic_id, partition_id, next_offset)
    VALUES (NEW.group_id, NEW.topic_id, NEW.partition_id, NEW.next_offset);
    RETURN NEW;
END;
$$;

CREATE TRIGGER consumer_offsets_write INSTEAD OF INSERT OR UPDATE OR DELETE ON consumer_offsets
    FOR EACH ROW EXECUTE FUNCTION consumer_offsets_write();

-- group_position returns a group's position in a partition, or NULL.
CREATE FUNCTION group_position(p_group text, p_topic_id integer, p_partition integer) RETURNS bigint
LANGUAGE sql STABLE STRICT PARALLEL SAFE
RETURN (SELECT o.next_offset FROM consumer_positions o
         WHERE o.group_id = p_group AND o.topic_id = p_topic_id AND o.partition_id = p_partition
         ORDER BY o.seq DESC LIMIT 1);

-- lock_position takes a group's position lock of a partition until the
-- transaction ends: a batch holds it from its claim to its commit, and so
-- does every other writer of the position (a reset, a layout switch, the
-- dead-letter admin), so batches never interleave (invariant 2).
CREATE FUNCTION lock_position(p_group text, p_topic_id integer, p_partition integer) RETURNS void
LANGUAGE sql VOLATILE STRICT
RETURN pg_advisory_xact_lock(lock_key('position', p_group || '/' || p_topic_id || '/' || p_partition));

-- lock_group_positions takes the position locks of every partition the
-- group has a position in, in ascending order (a batch holds one at a time,
-- so no deadlock), and returns those partitions.
CREATE FUNCTION lock_group_positions(p_group text, p_topic_id integer) RETURNS SETOF integer
LANGUAGE plpgsql AS $$
DECLARE
    p integer;
BEGIN
    FOR p IN SELECT DISTINCT o.partition_id FROM consumer_positions o
              WHERE o.group_id = p_group AND o.topic_id = p_topic_id ORDER BY 1 LOOP
        PERFORM lock_position(p_group, p_topic_id, p);
        RETURN NEXT p;
    END LOOP;
END;
$$;

-- init_positions creates the group's positions in partitions parts of its
-- layout that have none, at each partition's first offset in the layout.
-- It takes a partition's position lock before it looks, so that a position
-- a batch of another replica commits meanwhile is seen, and never put back.
CREATE FUNCTION init_positions(p_group text, p_topic_id integer, parts integer[]) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    p integer;
    v integer;
BEGIN
    SELECT g.version INTO v FROM group_layouts g WHERE g.group_id = p_group AND g.topic_id = p_topic_id;
    FOR p IN SELECT DISTINCT u.p FROM unnest(parts) AS u(p) ORDER BY 1 LOOP
        CONTINUE WHEN EXISTS (SELECT 1 FROM consumer_positions o
                               WHERE o.group_id = p_group AND o.topic_id = p_topic_id AND o.partition_id = p);
        PERFORM lock_position(p_group, p_topic_id, p);
        INSERT INTO consumer_positions (group_id, topic_id, partition_id, next_offset)
        SELECT p_group, p_topic_id, p, layout_start(p_topic_id, v, p)
         WHERE NOT EXISTS (SELECT 1 FROM consumer_positions o
                            WHERE o.group_id = p_group AND o.topic_id = p_topic_id AND o.partition_id = p);
    END LOOP;
END;
$$;

-- commit_position moves a group's position in a partition to p_next, in the
-- batch's transaction, if p_owner still owns the partition's lease with
-- p_epoch; otherwise it raises SQLSTATE PGL01 ('lease lost'), which aborts
-- the transaction, so that a COMMIT sent behind it in the same round trip
-- rolls it back. A replica that lost the lease while frozen or cut off thus
-- commits nothing; a takeover cannot have handled anything meanwhile, as
-- its claim waits for this transaction's position lock. p_unhalt clears the
-- partition's halt record in the same transaction.
CREATE FUNCTION commit_position(p_group text, p_topic_id integer, p_partition integer, p_next bigint,
                                p_owner text, p_epoch bigint, p_unhalt boolean) RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO consumer_positions (group_id, topic_id, partition_id, next_offset)
    VALUES (p_group, p_topic_id, p_partition, p_next);
    -- After the insert, which may have waited (an operator's lock): the
    -- lease as it is now.
    IF NOT EXISTS (SELECT 1 FROM partition_leases l
                    WHERE l.group_id = p_group AND l.topic_id = p_topic_id AND l.partition_id = p_partition
                      AND l.owner = p_owner AND l.epoch = p_epoch) THEN
        RAISE EXCEPTION 'pgevents: partition % of group % lost its lease (epoch %)', p_partition, p_group, p_epoch
            USING ERRCODE = 'PGL01';
    END IF;
    IF p_unhalt THEN
        DELETE FROM partition_halts WHERE group_id = p_group AND topic_id = p_topic_id AND partition_id = p_partition;
    END IF;
END;
$$;

-- ---------------------------------------------------------------------------
-- Leases.
--
-- A lease row changes when its owner does (acquired, released, freed by a
-- layout switch); the heartbeat renews the replica's consumer_replicas row.
-- A lease is live while its owner's replica is: a replica whose row expired
-- (it died, froze or lost the network) loses every lease at once, and
-- another takes them over with a higher epoch. The per-batch lease checks
-- read a row nothing updates between owners.
CREATE OR REPLACE VIEW partition_ownership AS
SELECT l.group_id, l.topic_id, l.partition_id,
       nullif(l.owner, '') AS owner, l.epoch, l.acquired_at, r.heartbeat_at,
       coalesce(r.expires_at, l.expires_at) AS expires_at,
       l.owner <> '' AND coalesce(r.expires_at > clock_timestamp(), false) AS live,
       r.hostname, r.pid, r.mode
FROM partition_leases l
LEFT JOIN consumer_replicas r
       ON r.group_id = l.group_id AND r.topic_id = l.topic_id AND r.replica_id = l.owner;

-- ---------------------------------------------------------------------------
-- Maintenance.

-- prune_history deletes, for a topic, every tail but the newest of each
-- partition (and of the topic), and every position but the newest of each
-- group and partition; it returns how many rows it deleted. The newest are
-- what appends and batches read; what an open snapshot still sees of the
-- others stays until it ends, and is never read. Maintenance runs it at
-- every pass.
CREATE FUNCTION prune_history(p_topic_id integer) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    k record;
    n bigint;
    total bigint := 0;
BEGIN
    FOR k IN SELECT -1 AS p UNION ALL SELECT pc.partition_id FROM partition_counters pc WHERE pc.topic_id = p_topic_id LOOP
        DELETE FROM partition_tails t
         WHERE t.topic_id = p_topic_id AND t.partition_id = k.p
           AND t.c_offset < (SELECT max(x.c_offset) FROM partition_tails x WHERE x.topic_id = p_topic_id AND x.partition_id = k.p);
        GET DIAGNOSTICS n = ROW_COUNT;
        total := total + n;
    END LOOP;
    FOR k IN SELECT DISTINCT o.group_id, o.partition_id FROM consumer_positions o WHERE o.topic_id = p_topic_id LOOP
        DELETE FROM consumer_positions o
         WHERE o.group_id = k.group_id AND o.topic_id = p_topic_id AND o.partition_id = k.partition_id
           AND o.seq < (SELECT max(x.seq) FROM consumer_positions x
                         WHERE x.group_id = k.group_id AND x.topic_id = p_topic_id AND x.partition_id = k.partition_id);
        GET DIAGNOSTICS n = ROW_COUNT;
        total := total + n;
    END LOOP;
    RETURN total;
END;
$$;
