package kafka

// The statements of the endpoint, over the tables of pgevents' schema
// ({schema} is replaced by schema.SQL). Every statement that reads events
// names topic_id and partition_id and a bound on c_offset, so it is
// answered from outbox_message_t's partition index and touches one
// partition's rows.
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
	// fetchSQL reads up to $4 events of partition $2 of topic $1 at or
	// above offset $3, in offset order.
	fetchSQL = `SELECT m.c_offset, m.event_id, m.host_id, m.user_id, m.transaction_id, m.event_type,
       m.payload::text, m.metadata::text, m.created_at
FROM {schema}outbox_message_t m
WHERE m.topic_id = $1 AND m.partition_id = $2 AND m.c_offset >= $3
ORDER BY m.c_offset
LIMIT $4`

	// boundsSQL reads, for each partition in $2, its log start offset and
	// its tail, the highest offset committed there (NULL: the partition
	// has no tail row). The log start is the first offset retention has
	// not removed from the partition (partition_counters.log_start,
	// migration 0018), which moves only when retention drops one of the
	// partition's segments: a broker's log start moves only when records
	// are deleted, so a partition whose first event lands at offset 57
	// (offsets are topic-wide under scope topic) still starts at 1, and a
	// fetch at 1 serves that event. The high watermark is the offset after
	// the tail, never below the log start (readBounds).
	//
	// The tail comes from partition_tails, not from the log: every path
	// that commits events to a partition (append_one, append_many, the
	// sequencer's tick, adopt's copy) writes a row at the highest offset it
	// committed there, in the same transaction, and the only deletion
	// (prune_history) keeps each partition's newest row; so the newest row
	// is the highest offset committed, and it is one index probe. Reading
	// the log's own end here instead (one probe in each of the partition's
	// segments, and a plan over every segment of the topic, made again at
	// each call) cost a fetch 4 ms of server time against 0.5 ms, and a
	// fetch runs for every wake-up: with a pgevents consumer attached at
	// 1,000 events/s the fetches' statements kept the cores busy and the
	// records waited (issue 33's latency).
	boundsSQL = `SELECT u.p, coalesce(pc.log_start, 1),
       (SELECT t.c_offset FROM {schema}partition_tails t WHERE t.topic_id = $1 AND t.partition_id = u.p ORDER BY t.c_offset DESC LIMIT 1)
FROM unnest($2::integer[]) AS u(p)
LEFT JOIN {schema}partition_counters pc ON pc.topic_id = $1 AND pc.partition_id = u.p`

	// logEndSQL reads, for each partition in $2 that has no tail row, the
	// highest offset its log holds (NULL: none): events that reached it by
	// another path than those that write tails (none does today; the
	// former bounds read the log, and this keeps its answer for them).
	logEndSQL = `SELECT u.p, (SELECT m.c_offset FROM {schema}outbox_message_t m
                WHERE m.topic_id = $1 AND m.partition_id = u.p ORDER BY m.c_offset DESC LIMIT 1)
FROM unnest($2::integer[]) AS u(p)`

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
