package store

// LagReadsSQL is the part of a status statement that reads, for each row
// s of its partitions (s.topic_id, s.partition_id, s.next_offset, and
// s.below, the partition's first offset in the group's next layout), the
// partition's log end (e.log_end), the events at or after the position up
// to $3 (l.events) and the creation time of the first of them below the cut
// (f.created_at). Every read of outbox_message_t names topic, partition and
// a bound on c_offset, in index order with a LIMIT, or max(): an index
// probe or a range scan of at most $3 entries, never the partition's
// history. metrics' state and offsets.Positions splice it in after
// `FROM parts s`.
const LagReadsSQL = `
CROSS JOIN LATERAL (
    SELECT max(m.c_offset) AS log_end FROM {schema}outbox_message_t m
    WHERE m.topic_id = s.topic_id AND m.partition_id = s.partition_id
) e
CROSS JOIN LATERAL (
    SELECT count(*) AS events FROM (
        SELECT 1 FROM {schema}outbox_message_t m
        WHERE m.topic_id = s.topic_id AND m.partition_id = s.partition_id AND m.c_offset >= s.next_offset
        ORDER BY m.c_offset
        LIMIT $3
    ) x
) l
LEFT JOIN LATERAL (
    SELECT m.created_at FROM {schema}outbox_message_t m
    WHERE m.topic_id = s.topic_id AND m.partition_id = s.partition_id AND m.c_offset >= s.next_offset
      AND m.c_offset < s.below
    ORDER BY m.c_offset
    LIMIT 1
) f ON true
`
