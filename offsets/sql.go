package offsets

import "github.com/pgevents/pgevents/internal/store"

// The package's own statements; the others are the engine's
// (internal/store), which every writer of a position goes through.
const (
	// auditInsertSQL records an operator's action (console_audit,
	// migrations 0011 and 0013). It is the audit's only writer: the console
	// and the CLI both record through Audit.
	auditInsertSQL = `INSERT INTO {schema}console_audit
    (origin, actor, remote, action, topic_id, group_id, partition_id, dead_letter_id, detail, outcome)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)`

	// countRangesSQL counts, for each partition $2[i], the events of topic
	// $1 with offsets in [$3[i], $4[i]), up to $5 per partition. Each count
	// is a range scan of the partition's (topic_id, partition_id, c_offset)
	// index, so it reads at most $5 entries whatever the log's size.
	countRangesSQL = `SELECT u.p, c.n
FROM unnest($2::integer[], $3::bigint[], $4::bigint[]) AS u(p, f, t)
CROSS JOIN LATERAL (
    SELECT count(*) AS n FROM (
        SELECT 1 FROM {schema}outbox_message_t m
        WHERE m.topic_id = $1 AND m.partition_id = u.p AND m.c_offset >= u.f AND m.c_offset < u.t
        LIMIT $5
    ) x
) c`

	// positionsSQL reads group $1's position in each partition of its
	// layout on topic $2 (the topic's current partition count when the
	// group has no layout yet), with the partition's log end, the events at
	// or after the position up to $3, and the age of the first of them
	// below the partition's cut (a group finishing an older layout after a
	// repartition also counts the new layout's events of the same
	// partition number); for a sequenced topic, the events staged for the
	// partition that no tick moved into the log yet count too
	// (store.StagedSQL). Each position is the newest row of
	// consumer_positions, read from the end of its index whatever older
	// rows an open snapshot keeps; every read of outbox_message_t is an
	// index probe or a range scan bounded by $3 (as metrics' state).
	positionsSQL = `WITH ` + store.StagedSQL + `,
glayout AS (
    SELECT t.topic_id, coalesce(l.total_partitions, t.total_partitions) AS total_partitions, gl.version
    FROM {schema}log_counter t
    LEFT JOIN {schema}group_layouts gl ON gl.group_id = $1 AND gl.topic_id = t.topic_id
    LEFT JOIN {schema}topic_layouts l ON l.topic_id = t.topic_id AND l.version = gl.version
    WHERE t.topic_id = $2
),
parts AS (
    SELECT g.topic_id, p.partition_id, o.next_offset,
           coalesce({schema}layout_cut(g.topic_id, g.version, p.partition_id), 9223372036854775807) AS below
    FROM glayout g
    CROSS JOIN generate_series(0, g.total_partitions - 1) AS p(partition_id)
    LEFT JOIN LATERAL (
        SELECT o.next_offset FROM {schema}consumer_positions o
        WHERE o.group_id = $1 AND o.topic_id = g.topic_id AND o.partition_id = p.partition_id
        ORDER BY o.seq DESC LIMIT 1
    ) o ON true
)
SELECT s.partition_id, s.next_offset, e.log_end, lag.events,
       coalesce(greatest(extract(epoch FROM clock_timestamp() - lag.first_at)::float8, 0), 0)
FROM parts s` + store.LagReadsSQL + `ORDER BY s.partition_id`
)

// commitPositionsSQL sets group $1's positions on topic $2: partition
// $3[i] to $4[i]. Commit runs it after lockPositionsSQL took each
// partition's position lock (the lock a worker's claim holds for its
// batch), in the order of $3, which Commit sorts: a commit waits for a
// batch of the group in flight, and two commits never deadlock.
const commitPositionsSQL = `INSERT INTO {schema}consumer_positions (group_id, topic_id, partition_id, next_offset)
SELECT $1, $2, u.p, u.n FROM unnest($3::integer[], $4::bigint[]) WITH ORDINALITY AS u(p, n, i) ORDER BY u.i`

// lockPositionsSQL takes group $1's position locks of topic $2's
// partitions $3 (sorted), in that order, for Commit's transaction, before
// it removes or sets any: a batch of the group in flight there ends first.
const lockPositionsSQL = `SELECT {schema}lock_position($1, $2, u.p) FROM unnest($3::integer[]) AS u(p)`

// removePositionsSQL removes group $1's positions in topic $2's partitions
// $3, every row of them (a Kafka commit of a negative offset: no committed
// offset there). Commit holds their position locks.
const removePositionsSQL = `DELETE FROM {schema}consumer_positions
WHERE group_id = $1 AND topic_id = $2 AND partition_id = ANY($3::integer[])`
