-- 0016: sequenced topics.
--
-- A topic created with offset scope 'sequenced' (log_counter.sequenced; its
-- offset_scope is 'partition', and everything that reads the log sees a
-- topic of scope 'partition') takes its producers' events without a lock:
-- an append inserts the event into the topic's staging table, with a
-- sequence number (stage_seq, taken at insert) and its transaction's id,
-- and returns the sequence number. It reads no tail, takes no append lock
-- and sends no notification unless the topic's sequencer sleeps.
--
-- The sequencer (sequence_tick, run by one process at a time per topic,
-- under a session advisory lock: lock_key('sequencer', topic)) moves what
-- committed into the log. A tick takes a snapshot and selects the staged
-- events of the transactions visible in it and not in the previous tick's
-- snapshot (PgQ's rule: only those with an id at or above the previous
-- snapshot's xmax, or among its in-progress ids, can be such), orders them
-- by transaction, the transactions by their last sequence number, a
-- transaction's events by sequence number, and gives each partition's
-- events the partition's next offsets, gapless, in one transaction with
-- the tick's record. So:
--   * every committed event is sequenced exactly once (the tick's record,
--     sequencer_ticks, is locked and written in the tick's transaction:
--     a tick that rolls back, or a sequencer killed mid-tick, leaves the
--     previous snapshot in place, and the next tick selects the same
--     events); nothing of a rolled-back transaction ever is;
--   * offsets follow commit order at the tick's granularity; an event
--     inserted after another committed is later (causality: its
--     transaction's last sequence number is higher, and it commits in the
--     same tick or a later one); a transaction's events are contiguous in
--     each partition, in insert order, so a unit is what it is under the
--     other scopes;
--   * the partition is computed at the tick, with the count of that time:
--     a repartition between ticks needs nothing more.
--
-- Staging tables are emptied by rotation, never by DELETE: each sequenced
-- topic has a staging table partitioned in three generations. Producers
-- insert into the current one (log_counter.stage_gen). rotate_stage
-- truncates the next one, once it can lock it without waiting (no
-- producer is still writing there) and every row in it is visible in the
-- last tick's snapshot (sequenced), then makes it current. The generation
-- just left stays one more rotation, for producers that read the
-- generation before the switch.
ALTER TABLE log_counter
    ADD COLUMN sequenced boolean NOT NULL DEFAULT false,
    ADD COLUMN stage_gen smallint NOT NULL DEFAULT 0 CHECK (stage_gen BETWEEN 0 AND 2),
    ADD CONSTRAINT log_counter_sequenced_scope CHECK (NOT sequenced OR offset_scope = 'partition');

ALTER TABLE idempotency_keys ADD COLUMN seq bigint;

CREATE SEQUENCE stage_seq;

CREATE TABLE staged_events (
    topic_id        integer     NOT NULL,
    gen             smallint    NOT NULL,
    seq             bigint      NOT NULL DEFAULT nextval('stage_seq'),
    xid             xid8        NOT NULL DEFAULT pg_current_xact_id(),
    host_id         text        NOT NULL CHECK (host_id <> ''),
    user_id         text        NOT NULL DEFAULT '',
    event_type      text        NOT NULL CHECK (event_type <> ''),
    payload         jsonb,
    metadata        jsonb,
    idempotency_key text,
    created_at      timestamptz NOT NULL DEFAULT clock_timestamp(),
    -- Drawn at staging, not at the tick: a tick lost in a crash (the
    -- sequencer commits asynchronously) and done again gives the events
    -- the ids a relay may already have sent them with.
    event_id        uuid        NOT NULL DEFAULT gen_random_uuid()
) PARTITION BY LIST (topic_id);

-- sequencer_ticks: per sequenced topic, the last tick's snapshot. A tick
-- locks the row, selects what that snapshot did not see, and writes its
-- own snapshot, in one transaction.
CREATE TABLE sequencer_ticks (
    topic_id   integer     PRIMARY KEY REFERENCES log_counter (topic_id),
    tick       bigint      NOT NULL DEFAULT 0,
    snapshot   pg_snapshot NOT NULL,
    ticked_at  timestamptz NOT NULL DEFAULT now(),
    rotated_at timestamptz NOT NULL DEFAULT now()
) WITH (fillfactor = 50);

-- make_sequenced makes a topic of scope 'partition' with an empty log a
-- sequenced one: its staging tables, its tick record. consumer migrate
-- calls it when it creates a topic with offset scope 'sequenced'.
CREATE FUNCTION make_sequenced(p_topic_id integer) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    g integer;
    t text := 'staged_events_' || p_topic_id;
BEGIN
    IF (SELECT c.offset_scope FROM log_counter c WHERE c.topic_id = p_topic_id) IS DISTINCT FROM 'partition' THEN
        RAISE EXCEPTION 'make_sequenced: topic % does not exist or is not of offset scope partition', p_topic_id
            USING ERRCODE = '22023';
    END IF;
    IF EXISTS (SELECT 1 FROM sequencer_ticks s WHERE s.topic_id = p_topic_id) THEN
        RETURN;
    END IF;
    IF EXISTS (SELECT 1 FROM partition_tails pt WHERE pt.topic_id = p_topic_id) THEN
        RAISE EXCEPTION 'make_sequenced: topic % already has events: a topic is sequenced from its creation', p_topic_id
            USING ERRCODE = '22023';
    END IF;
    EXECUTE format('CREATE TABLE %I PARTITION OF staged_events FOR VALUES IN (%s) PARTITION BY LIST (gen)', t, p_topic_id);
    FOR g IN 0 .. 2 LOOP
        EXECUTE format('CREATE TABLE %I PARTITION OF %I FOR VALUES IN (%s)', t || '_' || g, t, g);
    END LOOP;
    EXECUTE format('CREATE INDEX ON %I (xid)', t);
    INSERT INTO sequencer_ticks (topic_id, snapshot) VALUES (p_topic_id, pg_current_snapshot());
    UPDATE log_counter SET sequenced = true WHERE topic_id = p_topic_id;
END;
$$;

-- wake_sequencer notifies a topic's sequencer when it sleeps. The sequencer
-- sleeps holding the topic's sequencer sleep key exclusive, and goes to
-- sleep only when it can take it, that is when no append is in flight: an
-- append holds the key shared to commit. So an append that cannot take it
-- shared notifies (the notification is delivered at its commit), and one
-- that can is seen in flight by a sequencer about to sleep, which then
-- looks again instead.
CREATE FUNCTION wake_sequencer(p_topic_id integer) RETURNS void
LANGUAGE sql VOLATILE
BEGIN ATOMIC
    SELECT pg_notify('pgevents_sequencer', p_topic_id::text)
     WHERE NOT pg_try_advisory_xact_lock_shared(lock_key('sequencer', p_topic_id || '/sleep'));
END;

-- check_events raises the error append_events gives for events that are
-- not a JSON array of objects, each with a host_id and an event_type.
CREATE FUNCTION check_events(events jsonb) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    bad record;
BEGIN
    IF events IS NULL OR jsonb_typeof(events) <> 'array' THEN
        RAISE EXCEPTION 'append_events: events must be a JSON array'
            USING ERRCODE = '22023';
    END IF;
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
END;
$$;

-- stage_many stages a JSON array of events (the elements as append_events
-- takes them) to a sequenced topic in the caller's transaction, and returns
-- per element, in array order, its sequence number and whether it was a
-- duplicate of an event staged before with its idempotency key (then
-- nothing is staged, and the sequence number is the first one's).
CREATE FUNCTION stage_many(p_topic_id integer, events jsonb)
RETURNS TABLE (seq bigint, duplicate boolean)
LANGUAGE plpgsql AS $$
DECLARE
    t     record;
    keys  text[];
    ck    record;
    fresh boolean[];
    seqs  bigint[];
    i     integer;
    k     integer;
BEGIN
    PERFORM check_events(events);
    SELECT c.stage_gen, c.idempotency_window INTO t FROM log_counter c WHERE c.topic_id = p_topic_id;
    SELECT array_agg(e.e->>'idempotency_key' ORDER BY e.ord) INTO keys
      FROM jsonb_array_elements(events) WITH ORDINALITY AS e(e, ord);
    IF keys IS NULL THEN
        RETURN;
    END IF;
    IF EXISTS (SELECT 1 FROM unnest(keys) AS k(k) WHERE k.k IS NOT NULL) THEN
        ck := claim_keys(p_topic_id, keys, t.idempotency_window);
        fresh := ck.fresh;
    ELSE
        fresh := array_fill(true, ARRAY[cardinality(keys)]);
    END IF;
    -- Inserted in array order, so the sequence numbers ascend in it.
    WITH ins AS (
        INSERT INTO staged_events (topic_id, gen, host_id, user_id, event_type, payload, metadata, idempotency_key)
        SELECT p_topic_id, t.stage_gen, e.e->>'host_id', coalesce(e.e->>'user_id', ''), e.e->>'event_type',
               nullif(e.e->'payload', 'null'::jsonb), nullif(e.e->'metadata', 'null'::jsonb), keys[e.ord]
          FROM jsonb_array_elements(events) WITH ORDINALITY AS e(e, ord)
         WHERE fresh[e.ord]
         ORDER BY e.ord
        RETURNING staged_events.seq
    )
    SELECT array_agg(ins.seq ORDER BY ins.seq) INTO seqs FROM ins;
    PERFORM wake_sequencer(p_topic_id);
    k := 0;
    FOR i IN 1 .. cardinality(keys) LOOP
        IF fresh[i] THEN
            k := k + 1;
            seq := seqs[k];
            duplicate := false;
            IF keys[i] IS NOT NULL THEN
                UPDATE idempotency_keys ik SET seq = seqs[k] WHERE ik.topic_id = p_topic_id AND ik.key = keys[i];
            END IF;
        ELSE
            seq := (SELECT ik.seq FROM idempotency_keys ik WHERE ik.topic_id = p_topic_id AND ik.key = keys[i]);
            duplicate := true;
        END IF;
        RETURN NEXT;
    END LOOP;
END;
$$;

-- stage_one stages one event (see stage_many) and returns its sequence
-- number, or, for a duplicate of its idempotency key, the first one's.
CREATE FUNCTION stage_one(p_topic_id integer, p_host_id text, p_user_id text, p_event_type text,
                          p_payload jsonb, p_metadata jsonb, p_key text)
RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    t  record;
    ck record;
    s  bigint;
BEGIN
    IF p_host_id IS NULL OR p_host_id = '' THEN
        RAISE EXCEPTION 'append_event: host_id is required (got %)',
            CASE WHEN p_host_id IS NULL THEN 'NULL' ELSE 'an empty string' END
            USING ERRCODE = '22023';
    END IF;
    IF p_event_type IS NULL OR p_event_type = '' THEN
        RAISE EXCEPTION 'append_event: event_type is required (got %)',
            CASE WHEN p_event_type IS NULL THEN 'NULL' ELSE 'an empty string' END
            USING ERRCODE = '22023';
    END IF;
    SELECT c.stage_gen, c.idempotency_window INTO t FROM log_counter c WHERE c.topic_id = p_topic_id;
    IF p_key IS NOT NULL THEN
        ck := claim_keys(p_topic_id, ARRAY[p_key], t.idempotency_window);
        IF NOT ck.fresh[1] THEN
            RETURN (SELECT ik.seq FROM idempotency_keys ik WHERE ik.topic_id = p_topic_id AND ik.key = p_key);
        END IF;
    END IF;
    INSERT INTO staged_events (topic_id, gen, host_id, user_id, event_type, payload, metadata, idempotency_key)
    VALUES (p_topic_id, t.stage_gen, p_host_id, coalesce(p_user_id, ''), p_event_type, p_payload, p_metadata, p_key)
    RETURNING staged_events.seq INTO s;
    IF p_key IS NOT NULL THEN
        UPDATE idempotency_keys ik SET seq = s WHERE ik.topic_id = p_topic_id AND ik.key = p_key;
    END IF;
    PERFORM wake_sequencer(p_topic_id);
    RETURN s;
END;
$$;

-- sequenced tells whether a topic is sequenced (false for one that does
-- not exist: the append then says so).
CREATE FUNCTION topic_sequenced(p_topic_id integer) RETURNS boolean
LANGUAGE sql STABLE
RETURN coalesce((SELECT c.sequenced FROM log_counter c WHERE c.topic_id = p_topic_id), false);

-- The public append functions stage the events of a sequenced topic.
CREATE OR REPLACE FUNCTION append_event(
    topic_id integer,
    host_id text,
    user_id text,
    event_type text,
    payload jsonb,
    metadata jsonb DEFAULT NULL,
    idempotency_key text DEFAULT NULL
)
RETURNS bigint
LANGUAGE sql VOLATILE
RETURN CASE WHEN topic_sequenced(topic_id)
            THEN stage_one(topic_id, host_id, user_id, event_type, payload, metadata, idempotency_key)
            WHEN idempotency_key IS NULL
            THEN append_one(topic_id, host_id, user_id, event_type, payload, metadata)
            ELSE append_keyed_one(topic_id, host_id, user_id, event_type, payload, metadata, idempotency_key) END;

CREATE OR REPLACE FUNCTION append_events(topic_id integer, events jsonb)
RETURNS SETOF bigint
LANGUAGE plpgsql AS $$
BEGIN
    IF topic_sequenced(append_events.topic_id) THEN
        RETURN QUERY SELECT s.seq FROM stage_many(append_events.topic_id, events) AS s;
    ELSIF jsonb_typeof(events) = 'array' AND jsonb_path_exists(events, '$[*].idempotency_key') THEN
        RETURN QUERY SELECT k.c_offset FROM append_events_keyed(append_events.topic_id, events) AS k;
    ELSE
        RETURN QUERY SELECT o FROM append_many(append_events.topic_id, events) AS o;
    END IF;
END;
$$;

-- append_results appends a JSON array of events to any topic and returns
-- per element, in array order: its offset and partition, or, for a
-- sequenced topic, its sequence number and partition -1; and whether it
-- was a duplicate of its idempotency key.
CREATE FUNCTION append_results(p_topic_id integer, events jsonb)
RETURNS TABLE (c_offset bigint, partition_id integer, duplicate boolean)
LANGUAGE plpgsql AS $$
BEGIN
    IF topic_sequenced(p_topic_id) THEN
        RETURN QUERY SELECT s.seq, -1, s.duplicate FROM stage_many(p_topic_id, events) AS s;
    ELSE
        RETURN QUERY SELECT k.c_offset, k.partition_id, k.duplicate FROM append_events_keyed(p_topic_id, events) AS k;
    END IF;
END;
$$;

-- sequence_tick moves what committed since the topic's last tick into the
-- log (see this migration's header) and returns how many events it
-- sequenced. A tick that finds nothing writes nothing.
CREATE FUNCTION sequence_tick(p_topic_id integer) RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    prev     pg_snapshot;
    cur      pg_snapshot;
    t        record;
    np       integer;
    n        integer;
    parts    integer[];
    maxes    bigint[];
    unmarked integer[];
    sleeping integer[];
    msg      text;
BEGIN
    -- What prev does not see: the ids at or above its xmax, and those in
    -- progress when it was taken (an id below its xmin, or between, not in
    -- progress, had ended: committed, prev sees it). Of those, a statement
    -- sees the committed ones. An index scan of the new ids and a lookup
    -- per id that was in progress: a long transaction costs a lookup.
    --
    -- A look without a lock first: an idle topic's tick writes nothing.
    SELECT s.snapshot INTO prev FROM sequencer_ticks s WHERE s.topic_id = p_topic_id;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'sequence_tick: topic % is not sequenced', p_topic_id USING ERRCODE = '22023';
    END IF;
    IF NOT EXISTS (SELECT 1 FROM staged_events e
                    WHERE e.topic_id = p_topic_id
                      AND (e.xid >= pg_snapshot_xmax(prev) OR e.xid = ANY (ARRAY(SELECT pg_snapshot_xip(prev))))
) THEN
        RETURN 0;
    END IF;
    SELECT c.channel, c.wake, c.appends INTO t FROM log_counter c WHERE c.topic_id = p_topic_id;
    -- One tick at a time: the row lock, held to commit (a tick that waited
    -- reads the snapshot the other one wrote).
    SELECT s.snapshot INTO prev FROM sequencer_ticks s WHERE s.topic_id = p_topic_id FOR UPDATE;
    -- The layout, as an append takes it: a repartition waits for the tick.
    np := lock_layout(p_topic_id);
    -- The snapshot and the partitions of what it sees, in one statement.
    SELECT pg_current_snapshot(), array_agg(DISTINCT event_partition(e.host_id, np))
      INTO cur, parts
      FROM staged_events e
     WHERE e.topic_id = p_topic_id
       AND (e.xid >= pg_snapshot_xmax(prev) OR e.xid = ANY (ARRAY(SELECT pg_snapshot_xip(prev))));
    IF parts IS NULL THEN
        RETURN 0;
    END IF;
    SELECT array_agg(u.p ORDER BY u.p) INTO parts FROM unnest(parts) AS u(p);
    IF t.appends IS NOT NULL THEN
        PERFORM nextval(t.appends);  -- see log_counter.appends
    END IF;
    unmarked := mark_flight(p_topic_id, parts);
    PERFORM lock_partitions(p_topic_id, parts);
    -- The events cur sees and prev does not, each partition's after its
    -- tail: transactions in the order of their last sequence number, a
    -- transaction's events in sequence order.
    WITH ev AS (
        SELECT e.*, event_partition(e.host_id, np) AS p, max(e.seq) OVER (PARTITION BY e.xid) AS last
          FROM staged_events e
         WHERE e.topic_id = p_topic_id
           AND (e.xid >= pg_snapshot_xmax(prev) OR e.xid = ANY (ARRAY(SELECT pg_snapshot_xip(prev))))
           AND pg_visible_in_snapshot(e.xid, cur)
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
    sleeping := wake_sleepers(p_topic_id, t.wake, parts, unmarked);
    IF cardinality(sleeping) > 0 THEN
        SELECT p_topic_id || ':' || string_agg(u.p || '/' || u.m, ',' ORDER BY u.p) INTO msg
          FROM unnest(parts, maxes) AS u(p, m) WHERE u.p = ANY (sleeping);
        IF length(msg) > 7000 THEN
            msg := p_topic_id || ':*';
        END IF;
        PERFORM pg_notify(t.channel, msg);
    END IF;
    RETURN n;
END;
$$;

-- rotate_stage makes the topic's next staging generation current, after
-- truncating it, and returns true; or returns false, changing nothing,
-- when a producer still writes there (its lock cannot be had at once) or
-- a row there is not sequenced yet (not visible in the last tick's
-- snapshot). The sequencer calls it every rotation period.
CREATE FUNCTION rotate_stage(p_topic_id integer) RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    g       integer;
    tbl     text;
    snap    pg_snapshot;
    pending boolean;
BEGIN
    SELECT s.snapshot INTO snap FROM sequencer_ticks s WHERE s.topic_id = p_topic_id FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'rotate_stage: topic % is not sequenced', p_topic_id USING ERRCODE = '22023';
    END IF;
    g := (SELECT (c.stage_gen + 1) % 3 FROM log_counter c WHERE c.topic_id = p_topic_id);
    tbl := 'staged_events_' || p_topic_id || '_' || g;
    BEGIN
        EXECUTE format('LOCK TABLE %I IN ACCESS EXCLUSIVE MODE NOWAIT', tbl);
    EXCEPTION WHEN lock_not_available THEN
        RETURN false;
    END;
    EXECUTE format('SELECT EXISTS (SELECT 1 FROM %I e WHERE NOT pg_visible_in_snapshot(e.xid, $1))', tbl)
       INTO pending USING snap;
    IF pending THEN
        RETURN false;
    END IF;
    EXECUTE format('TRUNCATE %I', tbl);
    UPDATE log_counter SET stage_gen = g WHERE topic_id = p_topic_id;
    UPDATE sequencer_ticks SET rotated_at = now() WHERE topic_id = p_topic_id;
    RETURN true;
END;
$$;
