-- 0010: idempotent appends.
--
-- An event may carry an idempotency key. Within the topic's window
-- (log_counter.idempotency_window), a second append of the same key to the
-- topic appends nothing and returns the first append's offset: a producer
-- that retries after a lost COMMIT reply, or two services reacting to one
-- upstream event, append it once.
--
-- idempotency_keys holds one row per key appended within the window. An
-- append with a key inserts its row first, before it takes any append lock,
-- with ON CONFLICT DO NOTHING: a concurrent append of the same key waits for
-- the first one's transaction (the unique index makes it), then finds the
-- row if that transaction committed, or inserts it if it rolled back. So
-- concurrent appends of one key from many sessions give exactly one event,
-- appends of other keys never wait for each other here, and no append waits
-- for a key while it holds an append lock (a key is waited for before the
-- lock is taken), so keys and locks cannot deadlock within one call. A key
-- older than the window is taken as absent (its row is replaced); maintenance
-- deletes them, so the table holds about one window of keys.
--
-- Appends without a key never look at the table.
ALTER TABLE log_counter ADD COLUMN idempotency_window interval NOT NULL DEFAULT '1 day'
    CHECK (idempotency_window > interval '0');

CREATE TABLE idempotency_keys (
    topic_id       integer     NOT NULL,
    key            text        NOT NULL CHECK (key <> ''),
    partition_id   integer,
    c_offset       bigint,
    created_at     timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (topic_id, key)
);
CREATE INDEX idempotency_keys_created_idx ON idempotency_keys (topic_id, created_at);

-- claim_keys claims the idempotency keys of an append call (keys, in the
-- call's order, NULL for an event without one) and returns, in that order,
-- whether each event is to be appended (its key was claimed here, or it has
-- none), and, for a duplicate, the partition and offset its key was
-- appended at. A key repeated within the call is a duplicate of its first
-- occurrence (partition and offset NULL: append_events fills them in). Keys
-- are claimed in sorted order, so two calls with overlapping keys wait for
-- each other in one direction only.
CREATE FUNCTION claim_keys(p_topic_id integer, keys text[], p_window interval,
                           OUT fresh boolean[], OUT dup_partitions integer[], OUT dup_offsets bigint[])
LANGUAGE plpgsql AS $$
DECLARE
    k       text;
    claimed text[] := '{}';
    r       record;
    i       integer;
BEGIN
    FOR k IN SELECT DISTINCT u.k FROM unnest(keys) AS u(k) WHERE u.k IS NOT NULL ORDER BY 1 LOOP
        IF k = '' THEN
            RAISE EXCEPTION 'append: an idempotency key must not be empty' USING ERRCODE = '22023';
        END IF;
        -- A key past the window is absent.
        DELETE FROM idempotency_keys ik
         WHERE ik.topic_id = p_topic_id AND ik.key = k AND ik.created_at < now() - p_window;
        INSERT INTO idempotency_keys (topic_id, key) VALUES (p_topic_id, k)
        ON CONFLICT (topic_id, key) DO NOTHING;
        IF FOUND THEN
            claimed := claimed || k;
        END IF;
    END LOOP;
    fresh := '{}';
    dup_partitions := '{}';
    dup_offsets := '{}';
    FOR i IN 1 .. coalesce(cardinality(keys), 0) LOOP
        k := keys[i];
        IF k IS NULL OR (k = ANY (claimed) AND array_position(keys, k) = i) THEN
            fresh := fresh || true;
            dup_partitions := dup_partitions || NULL::integer;
            dup_offsets := dup_offsets || NULL::bigint;
        ELSE
            SELECT ik.partition_id, ik.c_offset INTO r FROM idempotency_keys ik WHERE ik.topic_id = p_topic_id AND ik.key = k;
            fresh := fresh || false;
            dup_partitions := dup_partitions || r.partition_id;
            dup_offsets := dup_offsets || r.c_offset;
        END IF;
    END LOOP;
END;
$$;

-- append_keyed_one claims the key before append_one takes the append locks
-- (see this migration's header). A duplicate appends nothing and returns
-- the offset its key was appended at.
CREATE FUNCTION append_keyed_one(p_topic_id integer, p_host_id text, p_user_id text, p_event_type text,
                                 p_payload jsonb, p_metadata jsonb, p_key text)
RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    w   interval;
    ck  record;
    off bigint;
BEGIN
    SELECT c.idempotency_window INTO w FROM log_counter c WHERE c.topic_id = p_topic_id;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'pgevents: topic % does not exist', p_topic_id
            USING ERRCODE = '23503', HINT = 'create it with: consumer migrate --config FILE';
    END IF;
    ck := claim_keys(p_topic_id, ARRAY[p_key], w);
    IF NOT ck.fresh[1] THEN
        RETURN ck.dup_offsets[1];
    END IF;
    off := append_one(p_topic_id, p_host_id, p_user_id, p_event_type, p_payload, p_metadata);
    -- The partition: the host's, with the count append_one read under its
    -- locks, held to commit.
    UPDATE idempotency_keys ik
       SET partition_id = event_partition(p_host_id, lc.total_partitions), c_offset = off
      FROM log_counter lc
     WHERE lc.topic_id = p_topic_id AND ik.topic_id = p_topic_id AND ik.key = p_key;
    RETURN off;
END;
$$;

-- append_event, with an idempotency key, passed by name:
-- append_event(..., idempotency_key => 'k'). Without one it is append_one
-- (0009), inlined into the caller's statement; with one, append_keyed_one.
DROP FUNCTION append_event(integer, text, text, text, jsonb, jsonb);
CREATE FUNCTION append_event(
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
RETURN CASE WHEN idempotency_key IS NULL
            THEN append_one(topic_id, host_id, user_id, event_type, payload, metadata)
            ELSE append_keyed_one(topic_id, host_id, user_id, event_type, payload, metadata, idempotency_key) END;

-- append_events_keyed appends a JSON array of events as append_many does
-- (see 0009), each element with an optional key idempotency_key, and
-- returns one row per element, in array order: the offset and partition it
-- was appended at, and whether it was a duplicate (nothing appended: the
-- offset and partition its key was appended at).
CREATE FUNCTION append_events_keyed(topic_id integer, events jsonb)
RETURNS TABLE (c_offset bigint, partition_id integer, duplicate boolean)
LANGUAGE plpgsql AS $$
DECLARE
    keys   text[];
    w      interval;
    ck     record;
    sub    jsonb;
    idx    integer[];   -- the elements appended, 1-based, in array order
    offs   bigint[];
    parts  integer[];
    i      integer;
    k      integer;
BEGIN
    IF events IS NULL OR jsonb_typeof(events) <> 'array' THEN
        RAISE EXCEPTION 'append_events: events must be a JSON array'
            USING ERRCODE = '22023';
    END IF;
    SELECT array_agg(e.e->>'idempotency_key' ORDER BY e.ord) INTO keys
      FROM jsonb_array_elements(events) WITH ORDINALITY AS e(e, ord);
    IF keys IS NULL THEN
        RETURN;
    END IF;
    SELECT lc.idempotency_window INTO w FROM log_counter lc WHERE lc.topic_id = append_events_keyed.topic_id;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'pgevents: topic % does not exist', append_events_keyed.topic_id
            USING ERRCODE = '23503', HINT = 'create it with: consumer migrate --config FILE';
    END IF;
    -- The keys first, before any append lock (see 0010's header).
    ck := claim_keys(append_events_keyed.topic_id, keys, w);
    SELECT array_agg(e.ord ORDER BY e.ord), jsonb_agg(e.e ORDER BY e.ord) INTO idx, sub
      FROM jsonb_array_elements(events) WITH ORDINALITY AS e(e, ord)
     WHERE ck.fresh[e.ord];
    IF sub IS NOT NULL THEN
        SELECT array_agg(o) INTO offs FROM append_many(append_events_keyed.topic_id, sub) AS o;
        -- The partitions the appended events landed in: their hosts', with
        -- the count append_many read under the append locks, which it
        -- holds until commit, so the count has not changed since.
        SELECT array_agg(event_partition(e.e->>'host_id', lc.total_partitions) ORDER BY e.ord) INTO parts
          FROM jsonb_array_elements(sub) WITH ORDINALITY AS e(e, ord)
          CROSS JOIN log_counter lc WHERE lc.topic_id = append_events_keyed.topic_id;
        UPDATE idempotency_keys ik SET partition_id = x.p, c_offset = x.o
          FROM (SELECT keys[idx[u.i]] AS key, u.o, parts[u.i] AS p FROM unnest(offs) WITH ORDINALITY AS u(o, i)) x
         WHERE ik.topic_id = append_events_keyed.topic_id AND ik.key = x.key AND x.key IS NOT NULL;
    END IF;
    k := 0;
    FOR i IN 1 .. cardinality(keys) LOOP
        IF ck.fresh[i] THEN
            k := k + 1;
            c_offset := offs[k];
            partition_id := parts[k];
            duplicate := false;
        ELSE
            duplicate := true;
            c_offset := ck.dup_offsets[i];
            partition_id := ck.dup_partitions[i];
            IF c_offset IS NULL THEN
                -- A key repeated within the call: its first occurrence's.
                c_offset := offs[array_position(idx, array_position(keys, keys[i]))];
                partition_id := parts[array_position(idx, array_position(keys, keys[i]))];
            END IF;
        END IF;
        RETURN NEXT;
    END LOOP;
END;
$$;

-- set_idempotency_window sets how long a topic's idempotency keys are kept.
-- A standard-SQL body (BEGIN ATOMIC), bound to this schema's log_counter
-- when created: a string body would find log_counter through the caller's
-- search_path, another installation's or none.
CREATE FUNCTION set_idempotency_window(p_topic_id integer, p_window interval) RETURNS void
LANGUAGE sql VOLATILE STRICT
BEGIN ATOMIC
    UPDATE log_counter SET idempotency_window = p_window WHERE topic_id = p_topic_id;
END;

-- prune_keys deletes a topic's idempotency keys older than its window, and
-- returns how many it deleted. Maintenance runs it at every pass.
CREATE FUNCTION prune_keys(p_topic_id integer) RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    n bigint;
BEGIN
    DELETE FROM idempotency_keys ik
     WHERE ik.topic_id = p_topic_id
       AND ik.created_at < now() - (SELECT lc.idempotency_window FROM log_counter lc WHERE lc.topic_id = p_topic_id);
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
END;
$$;

-- append_events appends a JSON array of events and returns their offsets in
-- array order. An element may carry an idempotency_key: then the call is
-- append_events_keyed's (a duplicate's offset is its key's first append's);
-- without any, append_many's.
CREATE OR REPLACE FUNCTION append_events(topic_id integer, events jsonb)
RETURNS SETOF bigint
LANGUAGE plpgsql AS $$
BEGIN
    IF jsonb_typeof(events) = 'array' AND jsonb_path_exists(events, '$[*].idempotency_key') THEN
        RETURN QUERY SELECT k.c_offset FROM append_events_keyed(append_events.topic_id, events) AS k;
    ELSE
        RETURN QUERY SELECT o FROM append_many(append_events.topic_id, events) AS o;
    END IF;
END;
$$;
