package kafka

// The statements of the endpoint, over the tables of pgevents' schema
// ({schema} is replaced by schema.SQL). The statements a fetch runs name
// each partition's own table (schema.PartitionTable, partitioned by offset
// segments) rather than outbox_message_t: through the parent, PostgreSQL
// plans every partition's segments (8.5 ms of planning and 2.5 ms of
// execution for the bounds of 8 partitions, under EXPLAIN ANALYZE), where
// a partition's table costs an index probe at one end of it.
//
// Why a read never skips an event: an append writes its offsets under the
// partition's (or topic's) append lock held to commit, after the highest
// offset committed, so a visible offset implies that every lower offset of
// the partition is committed or was rolled back and taken again
// (invariant 1). A fetch that reads the offsets at or above its position,
// in order, sees a prefix of what will ever be there; the next fetch goes
// on from the first offset it did not return. Events of a rolled-back
// transaction are never visible, so never served.
const (
	// byTimeSQL finds the first offset of partition $2 whose event was
	// appended at or after $3 (NULL: none). created_at grows with offsets
	// within a partition up to clock differences between sessions, as
	// Kafka's timestamps do within a broker; the scan goes forward from the
	// start of the partition's index and stops at the first match.
	byTimeSQL = `SELECT m.c_offset FROM {schema}outbox_message_t m
WHERE m.topic_id = $1 AND m.partition_id = $2 AND m.created_at >= $3
ORDER BY m.c_offset LIMIT 1`

	// partitionsSQL reads the topic's partition count (log_counter).
	partitionsSQL = `SELECT c.total_partitions FROM {schema}log_counter c WHERE c.topic_id = $1`
)

// fetchSQL reads up to $2 events of the partition whose table is %s
// (schema.PartitionTable) at or above offset $1, in offset order.
const fetchSQL = `SELECT m.c_offset, m.event_id::text, m.host_id, m.user_id, m.transaction_id, m.event_type,
       m.payload::text, m.metadata::text, m.created_at
FROM {schema}%s m
WHERE m.c_offset >= $1
ORDER BY m.c_offset
LIMIT $2`

// boundsPartSQL is one partition's row of a bounds statement: its log
// start offset (the first retained event's; the high watermark when none
// is retained) and its high watermark (the offset after the highest
// committed, from partition_tails, which every append writes and
// retention keeps, or from the log itself). Three index probes, each at
// one end of an index. %[1]d is the topic, %[2]d the partition, %[3]s the
// partition's table; $1 is unused (the statement's rows are its
// partitions).
const boundsPartSQL = `SELECT %[2]d, coalesce((SELECT m.c_offset FROM {schema}%[3]s m ORDER BY m.c_offset LIMIT 1), h.hw), h.hw
FROM (SELECT greatest(
    (SELECT t.c_offset FROM {schema}partition_tails t WHERE t.topic_id = %[1]d AND t.partition_id = %[2]d ORDER BY t.c_offset DESC LIMIT 1),
    (SELECT m.c_offset FROM {schema}%[3]s m ORDER BY m.c_offset DESC LIMIT 1),
    0) + 1 AS hw) h`
