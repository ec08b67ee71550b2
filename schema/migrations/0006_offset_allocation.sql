-- 0006: a second way to allocate offsets, chosen per topic.
--
-- 'counter' (the default) updates the topic's log_counter row and holds its
-- lock to commit: offsets are gapless and commit-ordered. Every append
-- leaves a dead version of that one row behind; while any snapshot in the
-- database stays open (a long report query), none of them can be removed,
-- and each append walks a longer chain of versions: appends slow down for
-- as long as the snapshot lives (measured in BENCHMARKS.md).
--
-- 'sequence' takes a transaction-scoped advisory lock per topic and draws
-- the offsets from a sequence of the topic's: the lock is held to commit,
-- so offsets stay commit-ordered (a visible offset implies that every lower
-- one is committed or will never be), but a rolled-back append leaves a gap,
-- since sequences are not transactional. No row is updated, so an open
-- snapshot costs nothing. Consumers do not need gapless offsets; a
-- producer that counts on them does.
ALTER TABLE log_counter ADD COLUMN allocation text NOT NULL DEFAULT 'counter'
    CHECK (allocation IN ('counter', 'sequence'));

-- append_lock_key is the advisory lock of a 'sequence' topic's appends.
CREATE FUNCTION append_lock_key(p_topic_id integer) RETURNS bigint
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
RETURN (hashtext('pgevents.append')::bigint << 32) | (p_topic_id::bigint & 4294967295);

-- offset_sequence names a 'sequence' topic's sequence.
CREATE FUNCTION offset_sequence(p_topic_id integer) RETURNS text
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
RETURN 'outbox_offset_seq_' || p_topic_id;

-- reserve_offsets is the single place where offsets are allocated.
--
-- It returns the first of count consecutive offsets and the topic's
-- partition count, and leaves the topic's append lock (the counter row's
-- lock, or the advisory lock) held until the caller's transaction ends
-- (invariant 1: a visible offset implies every lower one is committed, or
-- rolled back with its reservation). The counter path is one statement; the
-- sequence path is taken only when it finds no counter topic. In both,
-- total_partitions is read once the append lock is held, so it cannot change
-- (repartition_topic takes the same lock) before the events are written.
CREATE FUNCTION reserve_offsets(
    p_topic_id integer,
    p_count integer,
    OUT first_offset bigint,
    OUT total_partitions integer
)
LANGUAGE plpgsql AS $$
BEGIN
    UPDATE log_counter c
       SET next_offset = c.next_offset + p_count
     WHERE c.topic_id = p_topic_id AND c.allocation = 'counter'
    RETURNING c.next_offset - p_count, c.total_partitions
         INTO first_offset, total_partitions;
    IF FOUND THEN
        RETURN;
    END IF;
    PERFORM pg_advisory_xact_lock(append_lock_key(p_topic_id));
    SELECT c.total_partitions INTO total_partitions
      FROM log_counter c WHERE c.topic_id = p_topic_id AND c.allocation = 'sequence';
    IF NOT FOUND THEN
        RAISE EXCEPTION 'pgevents: topic % does not exist', p_topic_id
            USING ERRCODE = '23503',
                  HINT = 'create it with: consumer migrate --config FILE';
    END IF;
    -- Under the lock no other append draws from the sequence, so the block
    -- is contiguous.
    first_offset := nextval(offset_sequence(p_topic_id)::regclass);
    IF p_count > 1 THEN
        PERFORM setval(offset_sequence(p_topic_id)::regclass, first_offset + p_count - 1);
    END IF;
END;
$$;

-- topic_next_offset returns the offset the topic's next append will get,
-- and never more than an offset an append in flight holds: for a counter
-- topic the committed counter (an uncommitted reservation is invisible);
-- for a sequence topic, the sequence read after waiting for the append in
-- flight, under the advisory lock taken and released at once.
CREATE FUNCTION topic_next_offset(p_topic_id integer) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    c record;
    n bigint;
BEGIN
    SELECT lc.next_offset, lc.allocation INTO c FROM log_counter lc WHERE lc.topic_id = p_topic_id;
    IF NOT FOUND OR c.allocation = 'counter' THEN
        RETURN c.next_offset;
    END IF;
    PERFORM pg_advisory_lock_shared(append_lock_key(p_topic_id));
    EXECUTE format('SELECT last_value + CASE WHEN is_called THEN 1 ELSE 0 END FROM %I', offset_sequence(p_topic_id))
       INTO n;
    PERFORM pg_advisory_unlock_shared(append_lock_key(p_topic_id));
    RETURN n;
END;
$$;

-- set_offset_allocation switches a topic between 'counter' and 'sequence',
-- continuing from the next offset. It waits for the appends in flight.
CREATE FUNCTION set_offset_allocation(p_topic_id integer, p_allocation text) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    c record;
BEGIN
    SELECT lc.next_offset, lc.allocation INTO c FROM log_counter lc WHERE lc.topic_id = p_topic_id FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'pgevents: topic % does not exist', p_topic_id USING ERRCODE = '23503';
    END IF;
    PERFORM pg_advisory_xact_lock(append_lock_key(p_topic_id));
    IF c.allocation = p_allocation THEN
        RETURN;
    END IF;
    IF p_allocation = 'sequence' THEN
        EXECUTE format('CREATE SEQUENCE IF NOT EXISTS %I AS bigint MINVALUE 1', offset_sequence(p_topic_id));
        PERFORM setval(offset_sequence(p_topic_id)::regclass, c.next_offset, false);
    ELSIF p_allocation = 'counter' THEN
        UPDATE log_counter SET next_offset = topic_next_offset(p_topic_id) WHERE topic_id = p_topic_id;
    ELSE
        RAISE EXCEPTION 'pgevents: offset allocation must be counter or sequence, got %', p_allocation
            USING ERRCODE = '22023';
    END IF;
    UPDATE log_counter SET allocation = p_allocation WHERE topic_id = p_topic_id;
END;
$$;

-- repartition_topic changes a topic's partition count from the next offset
-- on, without a drain and without stopping producers: it takes the topic's
-- append lock (waiting for appends in flight, holding new ones for the
-- duration of this statement), records the new layout from the next offset,
-- and returns that offset, the cut. Appends after it compute partitions with
-- the new count; consumers finish the old layout up to the cut first.
CREATE FUNCTION repartition_topic(p_topic_id integer, p_partitions integer)
RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    c   record;
    v   integer;
    cut bigint;
BEGIN
    SELECT lc.next_offset, lc.total_partitions, lc.allocation INTO c
      FROM log_counter lc WHERE lc.topic_id = p_topic_id FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'pgevents: topic % does not exist', p_topic_id USING ERRCODE = '23503';
    END IF;
    IF c.total_partitions = p_partitions THEN
        RAISE EXCEPTION 'pgevents: topic % already has % partitions', p_topic_id, p_partitions
            USING ERRCODE = '22023';
    END IF;
    cut := c.next_offset;
    IF c.allocation = 'sequence' THEN
        PERFORM pg_advisory_xact_lock(append_lock_key(p_topic_id));
        EXECUTE format('SELECT last_value + CASE WHEN is_called THEN 1 ELSE 0 END FROM %I', offset_sequence(p_topic_id))
           INTO cut;
    END IF;
    SELECT max(version) INTO v FROM topic_layouts WHERE topic_id = p_topic_id;
    UPDATE log_counter SET total_partitions = p_partitions WHERE topic_id = p_topic_id;
    INSERT INTO topic_layouts (topic_id, version, total_partitions, from_offset)
    VALUES (p_topic_id, coalesce(v, 0) + 1, p_partitions, cut);
    PERFORM pg_notify('event_channel', p_topic_id || ':*');
    RETURN cut;
END;
$$;

-- ensure_outbox_segments creates the segments of outbox_message_t that cover
-- the topic's offsets from the counter's current segment to `ahead` segments
-- beyond it, and returns how many it created. Only segments that begin at or
-- above the next offset are created, so the DEFAULT partition can hold no
-- row of theirs and attaching them needs no data move. Run it with a short
-- lock_timeout: it takes a SHARE UPDATE EXCLUSIVE lock on outbox_message_t
-- and briefly an exclusive lock on the DEFAULT partition.
CREATE FUNCTION ensure_outbox_segments(p_topic_id integer, ahead integer DEFAULT 2)
RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    next    bigint;
    size    bigint;
    alloc   text;
    k       bigint;
    lo      bigint;
    hi      bigint;
    name    text;
    created integer := 0;
BEGIN
    IF NOT pg_try_advisory_xact_lock(hashtext('pgevents.schema.segments')) THEN
        RETURN 0;
    END IF;
    -- Hold the topic's append lock while attaching: an append in flight
    -- has offsets above the committed counter, and its rows, routed to the
    -- DEFAULT partition, would violate the constraint a new segment gives
    -- it. With the lock, no append is between reservation and insert, and
    -- the next ones route with the new segments. The caller's lock_timeout
    -- bounds the wait, and producers wait for the DDL only.
    SELECT lc.segment_size, lc.next_offset, lc.allocation INTO size, next, alloc
      FROM log_counter lc WHERE lc.topic_id = p_topic_id FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'pgevents: topic % does not exist', p_topic_id USING ERRCODE = '23503';
    END IF;
    IF alloc = 'sequence' THEN
        PERFORM pg_advisory_xact_lock(append_lock_key(p_topic_id));
        EXECUTE format('SELECT last_value + CASE WHEN is_called THEN 1 ELSE 0 END FROM %I', offset_sequence(p_topic_id))
           INTO next;
    END IF;
    -- Segment k covers offsets [k*size + 1, (k+1)*size + 1). Start at the
    -- first segment that begins at or above the next offset.
    FOR k IN ((next - 2 + size) / size) .. ((next - 1) / size + ahead) LOOP
        lo := k * size + 1;
        hi := (k + 1) * size + 1;
        name := format('outbox_message_t_%s_%s', p_topic_id, k);
        CONTINUE WHEN to_regclass(quote_ident(name)) IS NOT NULL;
        EXECUTE format('CREATE TABLE %I (LIKE outbox_message_t INCLUDING DEFAULTS INCLUDING CONSTRAINTS)', name);
        EXECUTE format('ALTER TABLE %I ADD CONSTRAINT %I CHECK (topic_id = %s AND c_offset >= %s AND c_offset < %s)',
                       name, name || '_bounds', p_topic_id, lo, hi);
        EXECUTE format('ALTER TABLE outbox_message_t ATTACH PARTITION %I FOR VALUES FROM (%s, %s) TO (%s, %s)',
                       name, p_topic_id, lo, p_topic_id, hi);
        created := created + 1;
    END LOOP;
    RETURN created;
END;
$$;
