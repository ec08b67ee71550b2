-- 0001: the event log, its offsets and the dead-letter table.
--
-- Every object is created in the first schema of the search_path, so a team
-- may keep pgevents in a schema of its own (ALTER ROLE ... SET search_path).

-- log_counter: one row per topic.
--
-- Invariant 1 (gapless, commit-ordered offsets): an append reserves its
-- offsets with UPDATE ... RETURNING on this row and holds the row lock until
-- its transaction ends, so a visible offset implies that every lower offset
-- is committed or was rolled back together with its reservation.
-- total_partitions is read under the same lock: an event's partition is
-- computed with the partition count in force when its offset was reserved.
-- The low fillfactor leaves room on the page for HOT updates of this very hot
-- row (no index covers next_offset).
CREATE TABLE log_counter (
    topic_id         integer     PRIMARY KEY CHECK (topic_id > 0),
    next_offset      bigint      NOT NULL DEFAULT 1 CHECK (next_offset > 0),
    total_partitions integer     NOT NULL CHECK (total_partitions BETWEEN 1 AND 1024),
    segment_size     bigint      NOT NULL DEFAULT 1000000 CHECK (segment_size >= 1000),
    created_at       timestamptz NOT NULL DEFAULT now()
) WITH (fillfactor = 10);

-- outbox_message_t: the log itself.
--
-- Range-partitioned on (topic_id, c_offset) into segments of segment_size
-- offsets, so that retention drops or detaches whole old segments instead of
-- deleting rows (no dead tuples, no table rewrite). Segments are created ahead
-- of the counter by ensure_outbox_segments(); the DEFAULT partition catches
-- anything beyond them, so an append never fails for want of a segment.
--
-- partition_id is computed once, at append, by event_partition(); readers
-- never recompute it (invariant 6: a worker reads its own partition through
-- outbox_message_t_partition_idx, whatever the number of partitions).
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
    PRIMARY KEY (topic_id, c_offset)
) PARTITION BY RANGE (topic_id, c_offset);

CREATE INDEX outbox_message_t_partition_idx
    ON outbox_message_t (topic_id, partition_id, c_offset);

CREATE TABLE outbox_message_t_default PARTITION OF outbox_message_t DEFAULT;

-- consumer_offsets: where each consumer group is in each partition.
--
-- next_offset is the next offset to read (Kafka style). Invariant 3 (exactly
-- once for database effects): a worker locks its row, handles the events and
-- advances next_offset in one transaction, so effects and position commit or
-- vanish together; the row lock orders the batches of one partition
-- (invariant 2). No index covers next_offset or updated_at, and the
-- fillfactor leaves room, so the update per batch is HOT.
CREATE TABLE consumer_offsets (
    group_id     text        NOT NULL CHECK (group_id <> ''),
    topic_id     integer     NOT NULL REFERENCES log_counter (topic_id),
    partition_id integer     NOT NULL CHECK (partition_id >= 0),
    next_offset  bigint      NOT NULL CHECK (next_offset > 0),
    updated_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (group_id, topic_id, partition_id)
) WITH (fillfactor = 50);

-- dead_letter_queue: units that failed permanently.
--
-- A unit is the partition-local slice of one producer transaction. Its row is
-- written in the same consumer transaction that moves next_offset past it, so
-- an event is either handled, dead-lettered, or still ahead: never dropped.
-- events keeps a copy of the unit, so it can be replayed after retention has
-- removed the original rows.
CREATE TABLE dead_letter_queue (
    id              bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    group_id        text        NOT NULL,
    topic_id        integer     NOT NULL,
    partition_id    integer     NOT NULL,
    first_offset    bigint      NOT NULL,
    last_offset     bigint      NOT NULL,
    transaction_id  bigint      NOT NULL,
    event_ids       uuid[]      NOT NULL,
    host_ids        text[]      NOT NULL,
    events          jsonb       NOT NULL,
    error           text        NOT NULL,
    attempts        integer     NOT NULL CHECK (attempts > 0),
    first_failed_at timestamptz NOT NULL,
    last_failed_at  timestamptz NOT NULL,
    created_at      timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX dead_letter_queue_position_idx
    ON dead_letter_queue (group_id, topic_id, partition_id, first_offset);

-- event_partition is the partition function, the only place it is computed.
--
-- It is the seed design's abs(hashtext(host_id)) % total_partitions for every
-- host, widened to bigint before abs() so that hashtext = -2147483648 does not
-- raise "integer out of range" (invariant 5). hashtext is internal to
-- PostgreSQL and may differ across platforms: never recompute it elsewhere.
CREATE FUNCTION event_partition(host_id text, total_partitions integer)
RETURNS integer
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
RETURN (abs(hashtext(host_id)::bigint) % total_partitions)::integer;

-- reserve_offsets, the single place where offsets are allocated, is defined
-- in migration 0006 with both allocations (functions resolve at call time).

-- append_event appends one event in the caller's transaction and returns its
-- offset. Call it as late in the transaction as possible: the topic's counter
-- row stays locked from here to commit.
CREATE FUNCTION append_event(
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
    r record;
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
    r := reserve_offsets(append_event.topic_id, 1);
    INSERT INTO outbox_message_t
        (c_offset, topic_id, partition_id, host_id, user_id,
         transaction_id, event_type, payload, metadata)
    VALUES
        (r.first_offset, append_event.topic_id,
         event_partition(append_event.host_id, r.total_partitions),
         append_event.host_id, coalesce(append_event.user_id, ''),
         txid_current(), append_event.event_type,
         append_event.payload, append_event.metadata);
    RETURN r.first_offset;
END;
$$;

-- append_events appends a JSON array of events, in array order, with
-- consecutive offsets, in one statement. Each element is an object with keys
-- host_id, user_id, event_type, payload and metadata. It returns the offsets
-- in array order.
CREATE FUNCTION append_events(topic_id integer, events jsonb)
RETURNS SETOF bigint
LANGUAGE plpgsql AS $$
DECLARE
    n   integer;
    bad record;
    r   record;
BEGIN
    IF events IS NULL OR jsonb_typeof(events) <> 'array' THEN
        RAISE EXCEPTION 'append_events: events must be a JSON array'
            USING ERRCODE = '22023';
    END IF;
    n := jsonb_array_length(events);
    IF n = 0 THEN
        RETURN;
    END IF;
    -- Validate before reserving: the counter lock is held from reservation
    -- to commit, so nothing that can fail on bad input runs after it.
    SELECT t.ord, t.e INTO bad
      FROM jsonb_array_elements(events) WITH ORDINALITY AS t(e, ord)
     WHERE jsonb_typeof(t.e) <> 'object'
        OR coalesce(t.e->>'host_id', '') = ''
        OR coalesce(t.e->>'event_type', '') = ''
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
    r := reserve_offsets(append_events.topic_id, n);
    INSERT INTO outbox_message_t
        (c_offset, topic_id, partition_id, host_id, user_id,
         transaction_id, event_type, payload, metadata)
    SELECT r.first_offset + t.ord - 1, append_events.topic_id,
           event_partition(t.e->>'host_id', r.total_partitions),
           t.e->>'host_id', coalesce(t.e->>'user_id', ''),
           txid_current(), t.e->>'event_type',
           nullif(t.e->'payload', 'null'::jsonb), nullif(t.e->'metadata', 'null'::jsonb)
      FROM jsonb_array_elements(events) WITH ORDINALITY AS t(e, ord)
     -- Rows of one partition next to each other on the page: a worker's
     -- read touches fewer pages. Offsets stay in array order.
     ORDER BY 3, 1;
    RETURN QUERY SELECT generate_series(r.first_offset, r.first_offset + n - 1);
END;
$$;

-- notify_event sends the wake-up hint for a statement's inserts: one
-- notification per topic per statement, never one per row, whose payload names
-- the partitions written and the highest offset in each:
-- "<topic>:<partition>/<max offset>,...", or "<topic>:*" when that would not
-- fit in a notification. The notification is delivered at commit, so it never
-- announces an invisible event. It is a hint: workers also poll, because a
-- notification can be lost with a listener's connection.
CREATE FUNCTION notify_event() RETURNS trigger
LANGUAGE plpgsql AS $$
DECLARE
    msg text;
BEGIN
    FOR msg IN
        SELECT p.topic_id || ':' || string_agg(p.partition_id || '/' || p.max_offset, ',' ORDER BY p.partition_id)
          FROM (SELECT n.topic_id, n.partition_id, max(n.c_offset) AS max_offset
                  FROM new_rows n
                 GROUP BY n.topic_id, n.partition_id) p
         GROUP BY p.topic_id
    LOOP
        IF length(msg) > 7000 THEN
            msg := split_part(msg, ':', 1) || ':*';
        END IF;
        PERFORM pg_notify(TG_ARGV[0], msg);
    END LOOP;
    RETURN NULL;
END;
$$;

CREATE TRIGGER outbox_message_t_notify
    AFTER INSERT ON outbox_message_t
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION notify_event('event_channel');

-- ensure_outbox_segments, which creates the segments ahead of the counter,
-- is defined in migration 0006.
