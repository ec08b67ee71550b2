-- 0008: a partition's rows stored together, partition-scoped offsets, and
-- wake-ups sent only to workers that may be waiting.

-- ---------------------------------------------------------------------------
-- Storage.
--
-- outbox_message_t is partitioned in two levels: by (topic_id,
-- partition_id), one table per partition of a topic, each partitioned by
-- c_offset into segments of segment_size offsets:
--
--   outbox_message_t                         RANGE (topic_id, partition_id)
--     outbox_message_t_<topic>_p<partition>  RANGE (c_offset)
--       outbox_message_t_<topic>_p<partition>_<k>    offsets [k*size+1, (k+1)*size+1)
--       outbox_message_t_<topic>_p<partition>_default
--     outbox_message_t_default
--
-- A partition's rows are stored together: a worker reading its partition
-- reads pages that hold only its rows, whatever the number of partitions
-- (invariant 6), and retention drops a partition's old segments without
-- touching the others'. The DEFAULT tables catch rows that outran
-- maintenance (no table for the partition or segment yet); maintenance
-- moves them into their place (ensure_outbox_segments), so they are empty
-- in steady state. The primary key (topic_id, partition_id, c_offset) is the
-- index every reader uses.
ALTER TABLE outbox_message_t RENAME TO outbox_message_v1;
ALTER TABLE outbox_message_t_default RENAME TO outbox_message_v1_default;
ALTER INDEX outbox_message_t_pkey RENAME TO outbox_message_v1_pkey;
ALTER INDEX outbox_message_t_partition_idx RENAME TO outbox_message_v1_partition_idx;
DROP TRIGGER outbox_message_t_notify ON outbox_message_v1;
-- Appends notify themselves now (below); the trigger function goes too.
DROP FUNCTION notify_event();

CREATE TABLE outbox_message_t (
    c_offset       bigint      NOT NULL,
    topic_id       integer     NOT NULL,
    partition_id   integer     NOT NULL CHECK (partition_id >= 0),
    event_id       uuid        NOT NULL DEFAULT gen_random_uuid(),
    host_id        text        NOT NULL CHECK (host_id <> ''),
    user_id        text        NOT NULL DEFAULT '',
    transaction_id bigint      NOT NULL DEFAULT txid_current(),
    event_type     text        NOT NULL CHECK (event_type <> ''),
    payload        jsonb,
    metadata       jsonb,
    created_at     timestamptz NOT NULL DEFAULT clock_timestamp(),
    PRIMARY KEY (topic_id, partition_id, c_offset)
) PARTITION BY RANGE (topic_id, partition_id);

CREATE TABLE outbox_message_t_default PARTITION OF outbox_message_t DEFAULT;

-- ---------------------------------------------------------------------------
-- Topics: offset scope and wake-ups.
--
-- offset_scope 'topic' (the default, the seed's design): offsets are
-- gapless (allocation 'counter') and commit-ordered across the whole topic,
-- from the topic's log_counter row. 'partition': every partition has its
-- own counter (partition_counters.next_offset), so offsets are gapless and
-- commit-ordered per partition, as in Kafka, and producers of different
-- partitions never wait for each other; a transaction that appends to
-- several partitions locks their counters in ascending partition order.
--
-- wake 'waiting' (the default): an append notifies only the partitions whose
-- worker may be waiting for events (partition_counters.waiting); 'always':
-- every append notifies (as before 0008).
ALTER TABLE log_counter ADD COLUMN offset_scope text NOT NULL DEFAULT 'topic'
    CHECK (offset_scope IN ('topic', 'partition'));
ALTER TABLE log_counter ADD COLUMN wake text NOT NULL DEFAULT 'waiting'
    CHECK (wake IN ('waiting', 'always'));

-- partition_counters: one row per partition of a topic (every partition
-- that any of its layouts had).
--
-- next_offset is the partition's next offset when the topic's scope is
-- 'partition'. Invariant 1, per partition: an append reserves offsets by
-- updating this row and holds its lock until it ends, so a visible offset
-- implies that every lower one of the partition is committed or was rolled
-- back with its reservation. Unused under scope 'topic'.
--
-- waiting says that the partition's worker found nothing more to do and
-- may be asleep: the next append to the partition notifies it and clears
-- the flag, so that one notification per idle period is sent, and appends
-- to busy partitions send none (a notification serialises its
-- transaction's commit with every other notifying one). The race between an
-- append that read the flag clear and a worker that sets it is closed by
-- the worker (see the pgevents package's wake-up protocol): it sets the
-- flag, then waits for every append in flight on the topic (or partition)
-- to end, then looks for events once more.
CREATE TABLE partition_counters (
    topic_id     integer NOT NULL REFERENCES log_counter (topic_id),
    partition_id integer NOT NULL CHECK (partition_id >= 0),
    next_offset  bigint  NOT NULL DEFAULT 1 CHECK (next_offset > 0),
    waiting      boolean NOT NULL DEFAULT false,
    PRIMARY KEY (topic_id, partition_id)
) WITH (fillfactor = 10);

INSERT INTO partition_counters (topic_id, partition_id)
SELECT c.topic_id, p FROM log_counter c CROSS JOIN LATERAL generate_series(0, c.total_partitions - 1) AS p;
INSERT INTO partition_counters (topic_id, partition_id)
SELECT l.topic_id, p FROM topic_layouts l CROSS JOIN LATERAL generate_series(0, l.total_partitions - 1) AS p
ON CONFLICT DO NOTHING;

-- topic_layouts.from_offsets: under scope 'partition', the first offset of
-- each partition p in the layout, at from_offsets[p + 1], for every
-- partition the topic had when the layout was recorded (partitions past the
-- array start at 1); from_offset is then 1. NULL under scope 'topic', where
-- from_offset is the layout's first offset in every partition.
ALTER TABLE topic_layouts ADD COLUMN from_offsets bigint[];

-- layout_start returns the first offset of partition p in layout v of the
-- topic; layout_cut the first offset of p in layout v + 1, or NULL when v is
-- the newest layout. An event of partition p with offset o belongs to the
-- layout v with layout_start(t, v, p) <= o < coalesce(layout_cut(t, v, p),
-- infinity).
CREATE FUNCTION layout_start(p_topic_id integer, p_version integer, p_partition integer)
RETURNS bigint
LANGUAGE sql STABLE STRICT PARALLEL SAFE
RETURN (SELECT CASE WHEN l.from_offsets IS NULL THEN l.from_offset
                    ELSE coalesce(l.from_offsets[p_partition + 1], 1) END
          FROM topic_layouts l WHERE l.topic_id = p_topic_id AND l.version = p_version);

CREATE FUNCTION layout_cut(p_topic_id integer, p_version integer, p_partition integer)
RETURNS bigint
LANGUAGE sql STABLE STRICT PARALLEL SAFE
RETURN layout_start(p_topic_id, p_version + 1, p_partition);

-- topic_gate_key is the advisory lock a partition-scope topic's appends take
-- shared, and repartition_topic and ensure_outbox_segments exclusive: the
-- partition count cannot change between an append's computing its
-- partitions and its insert.
CREATE FUNCTION topic_gate_key(p_topic_id integer) RETURNS bigint
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
RETURN (hashtext('pgevents.gate')::bigint << 32) | (p_topic_id::bigint & 4294967295);

-- partition_next_offset returns the offset the next append to partition p
-- will get, never more than an offset an append in flight holds: the
-- partition's committed counter under scope 'partition', the topic's next
-- offset (topic_next_offset) under scope 'topic'.
CREATE FUNCTION partition_next_offset(p_topic_id integer, p_partition integer) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    n bigint;
BEGIN
    IF (SELECT offset_scope FROM log_counter WHERE topic_id = p_topic_id) = 'partition' THEN
        SELECT pc.next_offset INTO n FROM partition_counters pc
         WHERE pc.topic_id = p_topic_id AND pc.partition_id = p_partition;
        RETURN coalesce(n, 1);
    END IF;
    RETURN topic_next_offset(p_topic_id);
END;
$$;

-- wake_partitions notifies the topic's channel for the partitions written
-- (parts, with the highest offset written in each, maxes) whose worker may
-- be waiting, or for all of them under wake 'always', and clears their
-- waiting flags. Called by the append functions once their rows are in, and
-- while they hold the append lock (the counter row, the advisory lock, or
-- the partitions' counter rows): the flags read here are at least as new as
-- any a worker set before that lock was taken. A notification is delivered
-- at commit, so it never announces an invisible event.
CREATE FUNCTION wake_partitions(p_topic_id integer, p_channel text, p_wake text, parts integer[], maxes bigint[])
RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    woken integer[];
    msg   text;
BEGIN
    IF p_wake = 'always' THEN
        woken := parts;
    ELSE
        WITH w AS (
            UPDATE partition_counters pc SET waiting = false
             WHERE pc.topic_id = p_topic_id AND pc.partition_id = ANY (parts) AND pc.waiting
            RETURNING pc.partition_id
        )
        SELECT array_agg(w.partition_id) INTO woken FROM w;
    END IF;
    IF woken IS NULL OR cardinality(woken) = 0 THEN
        RETURN;
    END IF;
    SELECT p_topic_id || ':' || string_agg(u.p || '/' || u.m, ',' ORDER BY u.p) INTO msg
      FROM unnest(parts, maxes) AS u(p, m) WHERE u.p = ANY (woken);
    IF length(msg) > 7000 THEN
        msg := p_topic_id || ':*';
    END IF;
    PERFORM pg_notify(p_channel, msg);
END;
$$;

-- ---------------------------------------------------------------------------
-- Appending.

-- append_event appends one event in the caller's transaction and returns its
-- offset (per partition under scope 'partition'). Call it as late in the
-- transaction as possible: the append lock (the topic's counter row, the
-- advisory lock of a sequence topic, or the partition's counter row) stays
-- held from here to commit.
CREATE OR REPLACE FUNCTION append_event(
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
    t   record;
    r   record;
    p   integer;
    off bigint;
    w   boolean;
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
    SELECT c.offset_scope, c.channel, c.wake INTO t FROM log_counter c WHERE c.topic_id = append_event.topic_id;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'pgevents: topic % does not exist', append_event.topic_id
            USING ERRCODE = '23503', HINT = 'create it with: consumer migrate --config FILE';
    END IF;
    IF t.offset_scope = 'partition' THEN
        PERFORM pg_advisory_xact_lock_shared(topic_gate_key(append_event.topic_id));
        p := event_partition(append_event.host_id,
                             (SELECT c.total_partitions FROM log_counter c WHERE c.topic_id = append_event.topic_id));
        UPDATE partition_counters pc SET next_offset = pc.next_offset + 1
         WHERE pc.topic_id = append_event.topic_id AND pc.partition_id = p
        RETURNING pc.next_offset - 1, pc.waiting INTO off, w;
        IF NOT FOUND THEN
            RAISE EXCEPTION 'pgevents: topic % has no counter for partition %', append_event.topic_id, p
                USING ERRCODE = '23503', HINT = 'run consumer migrate or consumer maintain';
        END IF;
    ELSE
        r := reserve_offsets(append_event.topic_id, 1);
        off := r.first_offset;
        p := event_partition(append_event.host_id, r.total_partitions);
    END IF;
    INSERT INTO outbox_message_t
        (c_offset, topic_id, partition_id, host_id, user_id,
         transaction_id, event_type, payload, metadata)
    VALUES
        (off, append_event.topic_id, p,
         append_event.host_id, coalesce(append_event.user_id, ''),
         txid_current(), append_event.event_type,
         append_event.payload, append_event.metadata);
    -- Under scope 'partition' the counter row said whether the worker may
    -- be waiting; otherwise the flags are read under the topic's lock.
    IF t.wake = 'always' OR w OR (t.offset_scope = 'topic' AND EXISTS (
           SELECT 1 FROM partition_counters pc
            WHERE pc.topic_id = append_event.topic_id AND pc.partition_id = p AND pc.waiting)) THEN
        PERFORM wake_partitions(append_event.topic_id, t.channel, t.wake, ARRAY[p], ARRAY[off]);
    END IF;
    RETURN off;
END;
$$;

-- append_events appends a JSON array of events, in one statement. Each
-- element is an object with keys host_id, user_id, event_type, payload and
-- metadata. It returns the offsets in array order: consecutive under scope
-- 'topic'; under scope 'partition', consecutive within each partition, in
-- array order, the partitions' counters locked in ascending order.
CREATE OR REPLACE FUNCTION append_events(topic_id integer, events jsonb)
RETURNS SETOF bigint
LANGUAGE plpgsql AS $$
DECLARE
    n      integer;
    bad    record;
    t      record;
    r      record;
    np     integer;
    q      record;
    ps     integer[];  -- each event's partition, in array order
    offs   bigint[];   -- each event's offset, in array order
    pids   integer[] := '{}';
    firsts bigint[] := '{}';
    parts  integer[];
    maxes  bigint[];
    waking boolean := false;
BEGIN
    IF events IS NULL OR jsonb_typeof(events) <> 'array' THEN
        RAISE EXCEPTION 'append_events: events must be a JSON array'
            USING ERRCODE = '22023';
    END IF;
    n := jsonb_array_length(events);
    IF n = 0 THEN
        RETURN;
    END IF;
    -- Validate before reserving: the append lock is held from reservation
    -- to commit, so nothing that can fail on bad input runs after it.
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
    SELECT c.offset_scope, c.channel, c.wake INTO t FROM log_counter c WHERE c.topic_id = append_events.topic_id;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'pgevents: topic % does not exist', append_events.topic_id
            USING ERRCODE = '23503', HINT = 'create it with: consumer migrate --config FILE';
    END IF;

    IF t.offset_scope = 'partition' THEN
        PERFORM pg_advisory_xact_lock_shared(topic_gate_key(append_events.topic_id));
        SELECT c.total_partitions INTO np FROM log_counter c WHERE c.topic_id = append_events.topic_id;
        SELECT array_agg(event_partition(e.e->>'host_id', np) ORDER BY e.ord) INTO ps
          FROM jsonb_array_elements(events) WITH ORDINALITY AS e(e, ord);
        -- Each partition's counter, in ascending partition order.
        FOR q IN SELECT u.p, count(*) AS k FROM unnest(ps) AS u(p) GROUP BY 1 ORDER BY 1 LOOP
            UPDATE partition_counters pc SET next_offset = pc.next_offset + q.k
             WHERE pc.topic_id = append_events.topic_id AND pc.partition_id = q.p
            RETURNING pc.next_offset - q.k AS first_offset, pc.waiting INTO r;
            IF NOT FOUND THEN
                RAISE EXCEPTION 'pgevents: topic % has no counter for partition %', append_events.topic_id, q.p
                    USING ERRCODE = '23503', HINT = 'run consumer migrate or consumer maintain';
            END IF;
            pids := pids || q.p;
            firsts := firsts || r.first_offset;
            maxes := maxes || (r.first_offset + q.k - 1);
            waking := waking OR r.waiting;
        END LOOP;
        parts := pids;
        SELECT array_agg(x.o ORDER BY x.ord) INTO offs
          FROM (SELECT u.ord, firsts[array_position(pids, u.p)] + row_number() OVER (PARTITION BY u.p ORDER BY u.ord) - 1 AS o
                  FROM unnest(ps) WITH ORDINALITY AS u(p, ord)) x;
    ELSE
        r := reserve_offsets(append_events.topic_id, n);
        SELECT array_agg(event_partition(e.e->>'host_id', r.total_partitions) ORDER BY e.ord),
               array_agg(r.first_offset + e.ord - 1 ORDER BY e.ord)
          INTO ps, offs
          FROM jsonb_array_elements(events) WITH ORDINALITY AS e(e, ord);
        SELECT array_agg(x.p ORDER BY x.p), array_agg(x.m ORDER BY x.p) INTO parts, maxes
          FROM (SELECT u.p, max(u.o) AS m FROM unnest(ps, offs) AS u(p, o) GROUP BY u.p) x;
        -- The flags are read under the topic's append lock.
        waking := EXISTS (SELECT 1 FROM partition_counters pc
                           WHERE pc.topic_id = append_events.topic_id AND pc.partition_id = ANY (parts) AND pc.waiting);
    END IF;
    INSERT INTO outbox_message_t
        (c_offset, topic_id, partition_id, host_id, user_id,
         transaction_id, event_type, payload, metadata)
    SELECT offs[e.ord], append_events.topic_id, ps[e.ord], e.e->>'host_id', coalesce(e.e->>'user_id', ''),
           txid_current(), e.e->>'event_type',
           nullif(e.e->'payload', 'null'::jsonb), nullif(e.e->'metadata', 'null'::jsonb)
      FROM jsonb_array_elements(events) WITH ORDINALITY AS e(e, ord)
     -- Rows of one partition next to each other, in offset order.
     ORDER BY ps[e.ord], offs[e.ord];
    IF t.wake = 'always' OR waking THEN
        PERFORM wake_partitions(append_events.topic_id, t.channel, t.wake, parts, maxes);
    END IF;
    RETURN QUERY SELECT unnest(offs);
END;
$$;

-- topic_next_offset returns the offset the topic's next append will get
-- under scope 'topic' (see 0007), and NULL under scope 'partition', whose
-- offsets are per partition (partition_next_offset).
CREATE OR REPLACE FUNCTION topic_next_offset(p_topic_id integer) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    c record;
    n bigint;
BEGIN
    SELECT lc.next_offset, lc.allocation, lc.offset_scope INTO c FROM log_counter lc WHERE lc.topic_id = p_topic_id;
    IF NOT FOUND OR c.offset_scope = 'partition' THEN
        RETURN NULL;
    END IF;
    IF c.allocation = 'counter' THEN
        RETURN c.next_offset;
    END IF;
    PERFORM pg_advisory_xact_lock_shared(append_lock_key(p_topic_id));
    EXECUTE format('SELECT last_value + CASE WHEN is_called THEN 1 ELSE 0 END FROM %I', offset_sequence(p_topic_id))
       INTO n;
    RETURN n;
END;
$$;

-- lock_appends holds the topic's appends off until the caller's transaction
-- ends, waiting for those in flight: the gate exclusively under scope
-- 'partition'; the counter row (FOR NO KEY UPDATE, see 0007), and the
-- advisory lock of a sequence topic, under scope 'topic'. It returns the
-- topic's counter row.
CREATE FUNCTION lock_appends(p_topic_id integer) RETURNS log_counter
LANGUAGE plpgsql AS $$
DECLARE
    c log_counter;
BEGIN
    SELECT * INTO c FROM log_counter lc WHERE lc.topic_id = p_topic_id FOR NO KEY UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'pgevents: topic % does not exist', p_topic_id USING ERRCODE = '23503';
    END IF;
    IF c.offset_scope = 'partition' THEN
        PERFORM pg_advisory_xact_lock(topic_gate_key(p_topic_id));
    ELSIF c.allocation = 'sequence' THEN
        PERFORM pg_advisory_xact_lock(append_lock_key(p_topic_id));
    END IF;
    RETURN c;
END;
$$;

-- repartition_topic changes a topic's partition count from the next offsets
-- on, without a drain and without stopping producers: under the topic's
-- append lock (lock_appends: appends in flight end first, new ones wait for
-- this statement), it records the new layout and returns its first offset
-- under scope 'topic' (the cut), or 0 under scope 'partition', where each
-- partition's first offset in the new layout is its counter's next offset
-- (topic_layouts.from_offsets). Appends after it compute partitions with the
-- new count; consumers finish the old layout up to the cut first.
CREATE OR REPLACE FUNCTION repartition_topic(p_topic_id integer, p_partitions integer)
RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    c   log_counter;
    v   integer;
    cut bigint;
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
        SELECT array_agg(pc.next_offset ORDER BY pc.partition_id) INTO froms
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

-- ensure_outbox_segments creates the tables of outbox_message_t that the
-- topic needs, and returns how many it created: for every partition of the
-- topic's current layout its table, its segment holding its next offset and
-- `ahead` segments beyond; and for rows that landed in a DEFAULT table
-- (they outran maintenance), their partition's table and segment, into
-- which they are moved, so the DEFAULT tables are empty in steady state and
-- the scan that ATTACH makes of them (to prove no row of the new range is
-- there) reads an empty table.
--
-- When something is to be created, it holds the topic's appends off
-- (lock_appends) while it works: an append in flight may have reserved
-- offsets it has not inserted yet, and its rows, routed to a DEFAULT table,
-- would violate the constraint a new table gives that DEFAULT. Run it with a
-- short lock_timeout (EnsureSegments does): producers of the topic wait for
-- the DDL and for moving rows out of DEFAULT, and only when there is
-- something to create.
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
    IF NOT pg_try_advisory_xact_lock(hashtext('pgevents.schema.segments')) THEN
        RETURN 0;
    END IF;
    SELECT * INTO c FROM log_counter lc WHERE lc.topic_id = p_topic_id;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'pgevents: topic % does not exist', p_topic_id USING ERRCODE = '23503';
    END IF;
    size := c.segment_size;
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
            SELECT pc.next_offset INTO next FROM partition_counters pc WHERE pc.topic_id = p_topic_id AND pc.partition_id = p;
        ELSIF c.allocation = 'sequence' THEN
            EXECUTE format('SELECT last_value + CASE WHEN is_called THEN 1 ELSE 0 END FROM %I', offset_sequence(p_topic_id))
               INTO next;
        ELSE
            SELECT lc.next_offset INTO next FROM log_counter lc WHERE lc.topic_id = p_topic_id;
        END IF;
        next := coalesce(next, 1);
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
            -- LIKE the partition's table: its CHECK constraint comes along,
            -- as attaching requires.
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
-- The rows of the old table, into the new one.
DO $$
DECLARE
    t integer;
BEGIN
    FOR t IN SELECT topic_id FROM log_counter ORDER BY topic_id LOOP
        PERFORM ensure_outbox_segments(t);
    END LOOP;
    INSERT INTO outbox_message_t (c_offset, topic_id, partition_id, event_id, host_id, user_id,
                                  transaction_id, event_type, payload, metadata, created_at)
    SELECT c_offset, topic_id, partition_id, event_id, host_id, user_id,
           transaction_id, event_type, payload, metadata, created_at
      FROM outbox_message_v1;
    -- Rows of old segments landed in DEFAULT tables: their segments now.
    FOR t IN SELECT topic_id FROM log_counter ORDER BY topic_id LOOP
        PERFORM ensure_outbox_segments(t);
    END LOOP;
END;
$$;
DROP TABLE outbox_message_v1;

-- parked_events: a row id that orders the events as they were parked (a
-- host's parked events are released in that order, whatever their
-- partition's offsets after a repartition), and the primary key, which must
-- hold under scope 'partition' where offsets repeat across partitions.
ALTER TABLE parked_events DROP CONSTRAINT parked_events_pkey;
ALTER TABLE parked_events ADD COLUMN id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY;
CREATE INDEX parked_events_position_idx ON parked_events (group_id, topic_id, partition_id, c_offset);
