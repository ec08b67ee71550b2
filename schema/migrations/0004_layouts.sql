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

-- repartition_topic, which records a new layout under the append lock, is
-- defined in migration 0006, with both offset allocations.
