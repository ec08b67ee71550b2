-- 0004: partition layouts, for online repartitioning.

-- topic_layouts: the partition counts a topic has had, and the offset from
-- which each applies. An event's partition was computed with the layout in
-- force when its offset was reserved: offsets in [from_offset, the next
-- layout's from_offset) belong to this layout. A new layout is recorded by
-- repartition_topic() under the counter row's lock, so no append straddles
-- the cut.
CREATE TABLE topic_layouts (
    topic_id         integer     NOT NULL,
    version          integer     NOT NULL CHECK (version > 0),
    total_partitions integer     NOT NULL CHECK (total_partitions BETWEEN 1 AND 1024),
    from_offset      bigint      NOT NULL CHECK (from_offset > 0),
    created_at       timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (topic_id, version)
);

INSERT INTO topic_layouts (topic_id, version, total_partitions, from_offset)
SELECT topic_id, 1, total_partitions, 1 FROM log_counter;

-- group_layouts: the layout each consumer group is consuming. A group
-- finishes every partition of its layout up to the next layout's
-- from_offset before it moves to the next one, so a host's events are
-- handled in order across a change of partition count, although the host
-- usually lands in another partition.
CREATE TABLE group_layouts (
    group_id    text        NOT NULL,
    topic_id    integer     NOT NULL,
    version     integer     NOT NULL,
    switched_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (group_id, topic_id)
);

-- repartition_topic changes a topic's partition count from the next offset
-- on, without a drain and without stopping producers: it takes the
-- counter row's lock (waiting for appends in flight, holding new ones for
-- the duration of this statement), records the new layout from the next
-- offset, and returns that offset, the cut. Appends after it compute
-- partitions with the new count; consumers finish the old layout up to the
-- cut first.
CREATE FUNCTION repartition_topic(p_topic_id integer, p_partitions integer)
RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    c record;
    v integer;
BEGIN
    SELECT lc.next_offset, lc.total_partitions INTO c
      FROM log_counter lc WHERE lc.topic_id = p_topic_id FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'pgevents: topic % does not exist', p_topic_id USING ERRCODE = '23503';
    END IF;
    IF c.total_partitions = p_partitions THEN
        RAISE EXCEPTION 'pgevents: topic % already has % partitions', p_topic_id, p_partitions
            USING ERRCODE = '22023';
    END IF;
    SELECT max(version) INTO v FROM topic_layouts WHERE topic_id = p_topic_id;
    UPDATE log_counter SET total_partitions = p_partitions WHERE topic_id = p_topic_id;
    INSERT INTO topic_layouts (topic_id, version, total_partitions, from_offset)
    VALUES (p_topic_id, coalesce(v, 0) + 1, p_partitions, c.next_offset);
    -- Wake every consumer of the topic to look at the new layout.
    PERFORM pg_notify('event_channel', p_topic_id || ':*');
    RETURN c.next_offset;
END;
$$;
