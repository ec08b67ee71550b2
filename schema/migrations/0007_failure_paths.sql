-- 0007: the notification channel as a property of the topic; offset reads
-- that cannot leak a lock; the DEFAULT partition of the log kept empty.

-- channel: the NOTIFY channel of the topic's wake-ups. The trigger and
-- repartition_topic() notify it; a consumer configured with another
-- channel refuses to start, since it would only ever learn of events by
-- polling. Written by `consumer migrate` (key `channel`).
ALTER TABLE log_counter ADD COLUMN channel text NOT NULL DEFAULT 'event_channel'
    CHECK (channel <> '' AND octet_length(channel) < 64);

-- The counter row is locked FOR NO KEY UPDATE, never FOR UPDATE, by the
-- functions below that change it or hold appends off: an append's own UPDATE
-- takes the same lock, while FOR UPDATE would also block the foreign-key
-- checks of rows that reference the topic (consumer_offsets), and a
-- transaction that holds a sequence topic's append lock shared
-- (topic_next_offset) and inserts a position would deadlock with it.

-- notify_event sends the wake-up hint for a statement's inserts, on each
-- topic's channel: one notification per topic per statement, never one per
-- row, whose payload names the partitions written and the highest offset in
-- each: "<topic>:<partition>/<max offset>,...", or "<topic>:*" when that
-- would not fit in a notification. The notification is delivered at commit,
-- so it never announces an invisible event. It is a hint: workers also
-- poll, because a notification can be lost with a listener's connection.
CREATE OR REPLACE FUNCTION notify_event() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    r record;
    msg text;
BEGIN
    FOR r IN
        SELECT c.channel,
               p.topic_id || ':' || string_agg(p.partition_id || '/' || p.max_offset, ',' ORDER BY p.partition_id) AS msg
          FROM (SELECT n.topic_id, n.partition_id, max(n.c_offset) AS max_offset
                  FROM new_rows n
                 GROUP BY n.topic_id, n.partition_id) p
          JOIN log_counter c ON c.topic_id = p.topic_id
         GROUP BY p.topic_id, c.channel
    LOOP
        msg := r.msg;
        IF length(msg) > 7000 THEN
            msg := split_part(msg, ':', 1) || ':*';
        END IF;
        PERFORM pg_notify(r.channel, msg);
    END LOOP;
    RETURN NULL;
END;
$$;

-- topic_next_offset returns the offset the topic's next append will get,
-- and never more than an offset an append in flight holds: for a counter
-- topic the committed counter (an uncommitted reservation is invisible);
-- for a sequence topic, the sequence read after waiting for the append in
-- flight, under the append lock taken shared. The lock is
-- transaction-scoped, so a caller cancelled between taking and releasing it
-- cannot leave it held on a pooled connection; it only keeps the caller's
-- transaction from overtaking an append, for as long as that transaction
-- lasts (callers are short).
CREATE OR REPLACE FUNCTION topic_next_offset(p_topic_id integer) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    c record;
    n bigint;
BEGIN
    SELECT lc.next_offset, lc.allocation INTO c FROM log_counter lc WHERE lc.topic_id = p_topic_id;
    IF NOT FOUND OR c.allocation = 'counter' THEN
        RETURN c.next_offset;
    END IF;
    PERFORM pg_advisory_xact_lock_shared(append_lock_key(p_topic_id));
    EXECUTE format('SELECT last_value + CASE WHEN is_called THEN 1 ELSE 0 END FROM %I', offset_sequence(p_topic_id))
       INTO n;
    RETURN n;
END;
$$;

-- repartition_topic changes a topic's partition count from the next offset
-- on, without a drain and without stopping producers: it takes the topic's
-- append lock (waiting for appends in flight, holding new ones for the
-- duration of this statement), records the new layout from the next offset,
-- and returns that offset, the cut. Appends after it compute partitions with
-- the new count; consumers finish the old layout up to the cut first. The
-- topic's channel is told, so that consumers look at once.
CREATE OR REPLACE FUNCTION repartition_topic(p_topic_id integer, p_partitions integer)
RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    c   record;
    v   integer;
    cut bigint;
BEGIN
    SELECT lc.next_offset, lc.total_partitions, lc.allocation, lc.channel INTO c
      FROM log_counter lc WHERE lc.topic_id = p_topic_id FOR NO KEY UPDATE;
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
    PERFORM pg_notify(c.channel, p_topic_id || ':*');
    RETURN cut;
END;
$$;

-- ensure_outbox_segments creates the segments of outbox_message_t that the
-- topic needs and returns how many it created: the one holding the next
-- offset and `ahead` beyond it, and any segment whose range has rows in the
-- DEFAULT partition. Rows land in DEFAULT only when the counter outran
-- maintenance (producers ran while nothing created segments); they are
-- moved into their segment as it is created, so DEFAULT is empty in steady
-- state: retention can remove every event, topic_retention.removed_below
-- is true, and the scan that ATTACH makes of DEFAULT (to prove no row of
-- the new range is there) reads an empty table.
--
-- It holds the topic's append lock while it works (the counter row, or the
-- advisory lock of a sequence topic): an append in flight has offsets above
-- the committed counter, and its rows, routed to DEFAULT, would violate the
-- constraint a new segment gives DEFAULT. With the lock no append is
-- between reservation and insert; the next ones route to the new segments.
-- Run it with a short lock_timeout (EnsureSegments does): producers of the
-- topic wait for it, for the DDL and for moving rows out of DEFAULT.
CREATE OR REPLACE FUNCTION ensure_outbox_segments(p_topic_id integer, ahead integer DEFAULT 2)
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
    SELECT lc.segment_size, lc.next_offset, lc.allocation INTO size, next, alloc
      FROM log_counter lc WHERE lc.topic_id = p_topic_id FOR NO KEY UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'pgevents: topic % does not exist', p_topic_id USING ERRCODE = '23503';
    END IF;
    IF alloc = 'sequence' THEN
        PERFORM pg_advisory_xact_lock(append_lock_key(p_topic_id));
        EXECUTE format('SELECT last_value + CASE WHEN is_called THEN 1 ELSE 0 END FROM %I', offset_sequence(p_topic_id))
           INTO next;
    END IF;
    -- Segment k covers offsets [k*size + 1, (k+1)*size + 1).
    FOR k IN
        SELECT DISTINCT (d.c_offset - 1) / size FROM outbox_message_t_default d WHERE d.topic_id = p_topic_id
        UNION
        SELECT generate_series((next - 1) / size, (next - 1) / size + ahead)
        ORDER BY 1
    LOOP
        lo := k * size + 1;
        hi := (k + 1) * size + 1;
        name := format('outbox_message_t_%s_%s', p_topic_id, k);
        CONTINUE WHEN to_regclass(quote_ident(name)) IS NOT NULL;
        EXECUTE format('CREATE TABLE %I (LIKE outbox_message_t INCLUDING DEFAULTS INCLUDING CONSTRAINTS)', name);
        EXECUTE format('ALTER TABLE %I ADD CONSTRAINT %I CHECK (topic_id = %s AND c_offset >= %s AND c_offset < %s)',
                       name, name || '_bounds', p_topic_id, lo, hi);
        IF lo < next THEN
            EXECUTE format('WITH moved AS (DELETE FROM outbox_message_t_default
                                           WHERE topic_id = %s AND c_offset >= %s AND c_offset < %s RETURNING *)
                            INSERT INTO %I SELECT * FROM moved', p_topic_id, lo, hi, name);
        END IF;
        EXECUTE format('ALTER TABLE outbox_message_t ATTACH PARTITION %I FOR VALUES FROM (%s, %s) TO (%s, %s)',
                       name, p_topic_id, lo, p_topic_id, hi);
        created := created + 1;
    END LOOP;
    RETURN created;
END;
$$;

-- set_offset_allocation switches a topic between 'counter' and 'sequence',
-- continuing from the next offset. It waits for the appends in flight.
CREATE OR REPLACE FUNCTION set_offset_allocation(p_topic_id integer, p_allocation text) RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    c record;
BEGIN
    SELECT lc.next_offset, lc.allocation INTO c FROM log_counter lc WHERE lc.topic_id = p_topic_id FOR NO KEY UPDATE;
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
