package store

// StagedSQL is a common table expression, staged, of the status statements
// (metrics' state, offsets.Positions), whose $2 is a topic and $3 a cap:
// for a sequenced topic, the events committed in its staging tables that
// no tick has moved into the log yet (a sequencer that does not run, or
// runs behind), by the partition they go to under the topic's partition
// count (events), with the oldest created_at of each partition's
// (oldest); counted up to $3 in all. Empty for a topic that is not
// sequenced. What is not committed is not counted: the statement's
// snapshot does not see it. The events no tick moved are those of the
// transactions the last tick's snapshot does not see, as sequence_tick
// selects them: ids at or above its xmax, or in progress in it; two index
// scans of the staging tables' xid index, whatever the staging tables
// hold besides.
const StagedSQL = `staged AS (
    SELECT x.partition_id, count(*) AS events, min(x.created_at) AS oldest
    FROM (
        SELECT {schema}event_partition(e.host_id, c.total_partitions) AS partition_id, e.created_at
        FROM {schema}log_counter c
        JOIN {schema}sequencer_ticks q ON q.topic_id = c.topic_id
        CROSS JOIN LATERAL (
            SELECT e.host_id, e.created_at FROM {schema}staged_events e
            WHERE e.topic_id = c.topic_id AND e.xid >= pg_snapshot_xmax(q.snapshot)
            UNION ALL
            SELECT e.host_id, e.created_at FROM {schema}staged_events e
            WHERE e.topic_id = c.topic_id AND e.xid = ANY (ARRAY(SELECT pg_snapshot_xip(q.snapshot)))
        ) e
        WHERE c.topic_id = $2
        LIMIT $3
    ) x
    GROUP BY x.partition_id
)`

// LagReadsSQL is the part of a status statement that reads, for each row
// s of its partitions (s.topic_id, s.partition_id, s.next_offset, and
// s.below, the partition's first offset in the group's next layout), the
// partition's log end (e.log_end), the events at or after the position up
// to $3 (l.events) and the creation time of the first of them below the cut
// (f.created_at); and, with the partition's staged events (the statement
// defines StagedSQL's staged), the group's lag: lag.events, the events at
// or after its position in the log and those staged for the partition
// (every group is yet to handle those), up to $3, and lag.first_at, the
// creation time of the oldest of them. Every read of outbox_message_t
// names topic, partition and a bound on c_offset, in index order with a
// LIMIT, or max(): an index probe or a range scan of at most $3 entries,
// never the partition's history. metrics' state and offsets.Positions
// splice it in after `FROM parts s`.
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
LEFT JOIN staged sg ON sg.partition_id = s.partition_id
CROSS JOIN LATERAL (
    SELECT least(l.events + coalesce(sg.events, 0), $3) AS events, least(f.created_at, sg.oldest) AS first_at
) lag
`
