package console

// countCap bounds the events a page counts in a partition: those before
// an event or a host's next one in the host and event paths (the last
// parameter of eventPathSQL and hostPathSQL).
const countCap = 10_000_000

// The console's own statements: what the pages read beyond what package
// metrics (ReadState) and the offsets API give. Each reads one page's
// figures; every value a user typed is a parameter. Reads of
// outbox_message_t name topic_id and partition_id where they can (the
// log's index), and every page runs under Options.QueryTimeout, so a
// search the index cannot answer (by event id, by type over a whole
// topic) costs at most that.
const (
	// topicsSQL lists every topic with its partitions, offset scope,
	// allocation, retention settings (in seconds; NULL: none) and head (highest offset: one
	// descending probe of the log's index, topic_id, partition_id,
	// c_offset, per partition of any layout; max(c_offset) over the topic
	// has no index in that order and read the whole log).
	topicsSQL = `SELECT c.topic_id, c.total_partitions, CASE WHEN c.sequenced THEN 'sequenced' ELSE c.offset_scope END, c.allocation, c.segment_size, c.channel, c.wake,
       extract(epoch FROM r.retention)::float8, extract(epoch FROM r.max_retention)::float8,
       extract(epoch FROM r.zero_subscription_retention)::float8,
       coalesce(r.removed_below, 1),
       (SELECT max(h.o) FROM generate_series(0, greatest(c.total_partitions,
                                          (SELECT max(l.total_partitions) FROM {schema}topic_layouts l WHERE l.topic_id = c.topic_id)) - 1) AS p
        CROSS JOIN LATERAL (SELECT m.c_offset AS o FROM {schema}outbox_message_t m
                            WHERE m.topic_id = c.topic_id AND m.partition_id = p ORDER BY m.c_offset DESC LIMIT 1) h)
FROM {schema}log_counter c
LEFT JOIN {schema}topic_retention r ON r.topic_id = c.topic_id
ORDER BY c.topic_id`

	// topicSamplesSQL reads topic $1's samples (migration 0022) of the
	// last $2 ms on the database clock, oldest first, and the newest one
	// whatever its age (what says when maintenance last ran): through the
	// key (topic_id, bucket), at most SampleKeep / SamplePeriod rows.
	topicSamplesSQL = `SELECT s.taken_at, s.seconds, s.appended, s.staged, s.writer, clock_timestamp()
FROM {schema}topic_samples s
WHERE s.topic_id = $1
  AND (s.bucket > clock_timestamp() - $2 * interval '1 millisecond'
       OR s.bucket = (SELECT max(x.bucket) FROM {schema}topic_samples x WHERE x.topic_id = $1))
ORDER BY s.bucket`

	// groupSamplesSQL reads the samples of the last $2 ms of the groups
	// of topic $1, by group, oldest first: the groups' totals, not the
	// partitions' arrays, through the key (topic_id, bucket, group_id).
	groupSamplesSQL = `SELECT s.group_id, s.taken_at, s.seconds, s.handled, s.lag, s.lag_capped, s.lag_seconds,
       s.dead_letters, s.dead_lettered
FROM {schema}group_samples s
WHERE s.topic_id = $1 AND s.bucket > clock_timestamp() - $2 * interval '1 millisecond'
ORDER BY s.group_id, s.bucket`

	// partitionSamplesSQL reads group $3's samples of the last $2 ms on
	// topic $1, oldest first, with its partitions' figures.
	partitionSamplesSQL = `SELECT s.taken_at, s.seconds, s.handled, s.lag, s.lag_capped, s.lag_seconds, s.dead_letters, s.dead_lettered,
       s.part_handled, s.part_lag, s.part_lag_seconds
FROM {schema}group_samples s
WHERE s.topic_id = $1 AND s.bucket > clock_timestamp() - $2 * interval '1 millisecond' AND s.group_id = $3
ORDER BY s.bucket`

	// topicScopeSQL reads topic $1's offset scope and partition count,
	// for the lag estimate (lagEstimate).
	topicScopeSQL = `SELECT c.offset_scope, c.total_partitions FROM {schema}log_counter c WHERE c.topic_id = $1`

	// subscriptionsSQL lists the groups subscribed to topic $1 (every
	// topic when $1 is 0) with their lifecycle.
	subscriptionsSQL = `SELECT s.topic_id, s.group_id, s.state, s.start_from, s.created_at, s.state_changed_at, s.last_seen_at,
       extract(epoch FROM s.dead_after)::float8, coalesce(gl.version, 0)
FROM {schema}subscriptions s
LEFT JOIN {schema}group_layouts gl ON gl.group_id = s.group_id AND gl.topic_id = s.topic_id
WHERE $1 = 0 OR s.topic_id = $1
ORDER BY s.topic_id, s.group_id`

	// parkedHostsSQL counts the hosts of group $1 on topic $2 parked in
	// each partition, with the first few of them.
	parkedHostsSQL = `SELECT partition_id, count(*), (array_agg(host_id ORDER BY parked_at, host_id))[1:5]
FROM {schema}parked_hosts
WHERE group_id = $1 AND topic_id = $2
GROUP BY partition_id`

	// replicasSQL lists the replicas of every group, live ones first, with
	// the partitions whose lease each holds and the age of its heartbeat
	// on the database clock.
	replicasSQL = `SELECT r.group_id, r.topic_id, r.replica_id, r.mode, r.hostname, r.pid, r.started_at, r.heartbeat_at,
       r.expires_at, r.expires_at > clock_timestamp(),
       greatest(extract(epoch FROM clock_timestamp() - r.heartbeat_at)::float8, 0),
       coalesce((SELECT array_agg(l.partition_id ORDER BY l.partition_id) FROM {schema}partition_leases l
                  WHERE l.group_id = r.group_id AND l.topic_id = r.topic_id AND l.owner = r.replica_id), '{}')
FROM {schema}consumer_replicas r
ORDER BY r.expires_at > clock_timestamp() DESC, r.group_id, r.topic_id, r.replica_id`

	eventCols = `m.c_offset, m.topic_id, m.partition_id, m.event_id::text, m.host_id, m.user_id, m.transaction_id,
       m.event_type, m.payload, m.metadata, m.created_at`

	// browsePartsSQL is the partitions a browse reads (the common table
	// expression parts of browseSQL and browseBackSQL): partition $2 of
	// topic $1 (-1: every partition of any of its layouts), and only the
	// partitions host $5 had in some layout when $5 is given.
	browsePartsSQL = `WITH parts AS (
    SELECT p FROM generate_series(0, (SELECT max(x.n) - 1 FROM (SELECT c.total_partitions FROM {schema}log_counter c WHERE c.topic_id = $1
                                                               UNION ALL
                                                               SELECT l.total_partitions FROM {schema}topic_layouts l WHERE l.topic_id = $1) x(n))) AS p
    WHERE ($2::integer < 0 OR p = $2)
      AND ($5::text = '' OR p IN (SELECT {schema}event_partition($5, l.total_partitions) FROM {schema}topic_layouts l WHERE l.topic_id = $1
                                  UNION
                                  SELECT {schema}event_partition($5, c.total_partitions) FROM {schema}log_counter c WHERE c.topic_id = $1))
)
`

	// browseSQL reads up to $8 events of topic $1 in offset order from
	// offset $3 (and partition $9 within it, which orders events of
	// different partitions with one offset under scope partition): of
	// partition $2 (-1: every partition), created at or after $4 (NULL:
	// any time), of host $5, type $6 and event id $7 ('' : any).
	//
	// The log's only index in offset order is per partition (its primary
	// key, topic_id, partition_id, c_offset), so each partition is read
	// apart, from the index at $3, up to $8 events, and the partitions'
	// events merged: at most $8 events per partition when no filter is
	// given, whatever the size of the log. A filter (host, type, id, time)
	// is checked on the rows read: a rare one reads the partition until it
	// has $8 matches or reaches the end (the host's is narrowed to the
	// host's partitions first). The time is also a bound on the offset:
	// eventsPage starts at timeStartSQL's offset.
	browseSQL = browsePartsSQL + `SELECT ` + eventCols + `
FROM parts
CROSS JOIN LATERAL (
    SELECT m.* FROM {schema}outbox_message_t m
    WHERE m.topic_id = $1 AND m.partition_id = parts.p AND m.c_offset >= $3
      AND (m.c_offset, m.partition_id) >= ($3::bigint, $9::integer)
      AND ($4::timestamptz IS NULL OR m.created_at >= $4)
      AND ($5::text = '' OR m.host_id = $5)
      AND ($6::text = '' OR m.event_type = $6)
      AND ($7::text = '' OR m.event_id::text = $7)
    ORDER BY m.c_offset
    LIMIT $8
) m
ORDER BY m.c_offset, m.partition_id
LIMIT $8`

	// browseBackSQL is browseSQL from the newest events back: those before
	// offset $3 (and partition $9), newest first.
	browseBackSQL = browsePartsSQL + `SELECT ` + eventCols + `
FROM parts
CROSS JOIN LATERAL (
    SELECT m.* FROM {schema}outbox_message_t m
    WHERE m.topic_id = $1 AND m.partition_id = parts.p AND m.c_offset <= $3
      AND (m.c_offset, m.partition_id) < ($3::bigint, $9::integer)
      AND ($4::timestamptz IS NULL OR m.created_at >= $4)
      AND ($5::text = '' OR m.host_id = $5)
      AND ($6::text = '' OR m.event_type = $6)
      AND ($7::text = '' OR m.event_id::text = $7)
    ORDER BY m.c_offset DESC
    LIMIT $8
) m
ORDER BY m.c_offset DESC, m.partition_id DESC
LIMIT $8`

	// timeStartSQL finds, by bisection over partition $2 of topic $1, the
	// lowest offset whose next event (at or after it) was created at or
	// after $3, or just past the partition's last event: about 2 log2(N)
	// index probes instead of a scan of the events before that time (the
	// log has no index on created_at). It relies on created_at growing
	// with the offset within a partition, as appends make it (an append
	// takes its offsets and writes its rows under the partition's append
	// lock, with the clock read at the insert); the browse still checks
	// created_at on every event it shows.
	timeStartSQL = `WITH RECURSIVE b(lo, hi) AS (
    SELECT coalesce((SELECT m.c_offset FROM {schema}outbox_message_t m WHERE m.topic_id = $1 AND m.partition_id = $2
                      ORDER BY m.c_offset LIMIT 1), 0),
           coalesce((SELECT m.c_offset FROM {schema}outbox_message_t m WHERE m.topic_id = $1 AND m.partition_id = $2
                      ORDER BY m.c_offset DESC LIMIT 1), 0) + 1
    UNION ALL
    SELECT CASE WHEN f.ok THEN b.lo ELSE (b.lo + b.hi) / 2 + 1 END,
           CASE WHEN f.ok THEN (b.lo + b.hi) / 2 ELSE b.hi END
    FROM b
    CROSS JOIN LATERAL (SELECT coalesce((SELECT m.created_at >= $3 FROM {schema}outbox_message_t m
                                          WHERE m.topic_id = $1 AND m.partition_id = $2 AND m.c_offset >= (b.lo + b.hi) / 2
                                          ORDER BY m.c_offset LIMIT 1), true) AS ok) f
    WHERE b.lo < b.hi
)
SELECT b.lo FROM b WHERE b.lo >= b.hi`

	// eventSQL reads one event of topic $1, partition $2, offset $3.
	eventSQL = `SELECT ` + eventCols + `
FROM {schema}outbox_message_t m
WHERE m.topic_id = $1 AND m.partition_id = $2 AND m.c_offset = $3`

	// hostEventsSQL reads the newest $3 events of host $2 on topic $1, in
	// the partitions the host had in every layout of the topic: each read
	// apart, backwards from the end of the log's index (topic_id,
	// partition_id, c_offset), up to $3 of the host's events (with the
	// partitions in a subquery the planner cannot prune, every partition
	// of the log was read to its start).
	hostEventsSQL = `SELECT ` + eventCols + `
FROM (SELECT DISTINCT {schema}event_partition($2, l.total_partitions) AS p FROM {schema}topic_layouts l WHERE l.topic_id = $1) hp
CROSS JOIN LATERAL (
    SELECT m.* FROM {schema}outbox_message_t m
    WHERE m.topic_id = $1 AND m.partition_id = hp.p AND m.host_id = $2
    ORDER BY m.c_offset DESC
    LIMIT $3
) m
ORDER BY m.c_offset DESC
LIMIT $3`

	// eventPathSQL follows the event $4 (event id) of host $5 at offset $3
	// of partition $2 of topic $1 through every group subscribed to the
	// topic. For each group: whether a dead letter holds the event, or it
	// is parked behind one; the group's layout and position in the
	// event's partition; whether the group handled it (an event of an
	// older layout than the group's was handled before the group switched;
	// one of the group's layout when its position is past it), by when (the
	// oldest position row kept past it: maintenance prunes older ones, so
	// "by" is an upper bound), and else how many events are before it
	// (counted up to $6); and what may block it: the subscription's state,
	// a halt, the host parked, the partition's lease.
	eventPathSQL = `WITH ev AS (
    SELECT coalesce((SELECT max(l.version) FROM {schema}topic_layouts l
                      WHERE l.topic_id = $1 AND $2 < l.total_partitions AND {schema}layout_start($1, l.version, $2) <= $3), 1) AS layout
)
SELECT s.group_id, s.state, coalesce(gl.version, 0), ev.layout,
       dl.id, dl.error, pe.dead_letter_id,
       pos.next_offset,
       (SELECT min(o.committed_at) FROM {schema}consumer_positions o
         WHERE o.group_id = s.group_id AND o.topic_id = $1 AND o.partition_id = $2 AND o.next_offset > $3),
       CASE WHEN pos.next_offset IS NOT NULL AND pos.next_offset <= $3 THEN (
           SELECT count(*) FROM (SELECT 1 FROM {schema}outbox_message_t m
                                  WHERE m.topic_id = $1 AND m.partition_id = $2 AND m.c_offset >= pos.next_offset AND m.c_offset < $3
                                  LIMIT $6) x) END,
       h.c_offset, h.reason, h.halted_at,
       ph.dead_letter_id,
       w.owner, coalesce(w.live, false), CASE WHEN isfinite(w.expires_at) THEN w.expires_at END
FROM ev
CROSS JOIN {schema}subscriptions s
LEFT JOIN {schema}group_layouts gl ON gl.group_id = s.group_id AND gl.topic_id = s.topic_id
LEFT JOIN LATERAL (SELECT d.id, d.error FROM {schema}dead_letter_queue d
                    WHERE d.group_id = s.group_id AND d.topic_id = $1 AND d.event_ids @> ARRAY[$4::uuid]
                    ORDER BY d.id LIMIT 1) dl ON true
LEFT JOIN LATERAL (SELECT p.dead_letter_id FROM {schema}parked_events p
                    WHERE p.group_id = s.group_id AND p.topic_id = $1 AND p.c_offset = $3 AND p.event->>'event_id' = $4::text
                    LIMIT 1) pe ON true
LEFT JOIN LATERAL (SELECT o.next_offset FROM {schema}consumer_positions o
                    WHERE o.group_id = s.group_id AND o.topic_id = $1 AND o.partition_id = $2
                    ORDER BY o.seq DESC LIMIT 1) pos ON true
LEFT JOIN {schema}partition_halts h ON h.group_id = s.group_id AND h.topic_id = $1 AND h.partition_id = $2
LEFT JOIN {schema}parked_hosts ph ON ph.group_id = s.group_id AND ph.topic_id = $1 AND ph.host_id = $5
LEFT JOIN {schema}partition_ownership w ON w.group_id = s.group_id AND w.topic_id = $1 AND w.partition_id = $2
WHERE s.topic_id = $1
ORDER BY s.group_id`

	// hostPathSQL follows host $2 of topic $1 through every group
	// subscribed to the topic: the host's partition in the group's layout,
	// the group's position there, the host's last event before the
	// position (handled; by when, as in eventPathSQL) and first at or
	// after it (the next to handle, with the events before it, counted up
	// to $3), the host's open dead letters and parked events, and what may
	// block it: the subscription's state, the partition's halt, the host
	// parked, the partition's lease.
	hostPathSQL = `WITH g AS (
    SELECT s.group_id, s.state, coalesce(gl.version, 0) AS version,
           {schema}event_partition($2, coalesce(l.total_partitions, c.total_partitions)) AS p
    FROM {schema}subscriptions s
    JOIN {schema}log_counter c ON c.topic_id = s.topic_id
    LEFT JOIN {schema}group_layouts gl ON gl.group_id = s.group_id AND gl.topic_id = s.topic_id
    LEFT JOIN {schema}topic_layouts l ON l.topic_id = s.topic_id AND l.version = gl.version
    WHERE s.topic_id = $1
)
SELECT g.group_id, g.state, g.version, g.p, pos.next_offset,
       last.c_offset, last.created_at,
       (SELECT min(o.committed_at) FROM {schema}consumer_positions o
         WHERE o.group_id = g.group_id AND o.topic_id = $1 AND o.partition_id = g.p AND o.next_offset > last.c_offset),
       nxt.c_offset, nxt.created_at,
       CASE WHEN nxt.c_offset IS NOT NULL THEN (
           SELECT count(*) FROM (SELECT 1 FROM {schema}outbox_message_t m
                                  WHERE m.topic_id = $1 AND m.partition_id = g.p AND m.c_offset >= pos.next_offset
                                    AND m.c_offset < nxt.c_offset LIMIT $3) x) END,
       coalesce((SELECT array_agg(d.id ORDER BY d.id) FROM {schema}dead_letter_queue d
                  WHERE d.group_id = g.group_id AND d.topic_id = $1 AND $2 = ANY (d.host_ids)), '{}'),
       (SELECT count(*) FROM {schema}parked_events pe
         WHERE pe.group_id = g.group_id AND pe.topic_id = $1 AND pe.event->>'host_id' = $2),
       h.c_offset, h.reason, h.halted_at,
       ph.dead_letter_id, ph.parked_at,
       w.owner, coalesce(w.live, false), CASE WHEN isfinite(w.expires_at) THEN w.expires_at END
FROM g
LEFT JOIN LATERAL (SELECT o.next_offset FROM {schema}consumer_positions o
                    WHERE o.group_id = g.group_id AND o.topic_id = $1 AND o.partition_id = g.p
                    ORDER BY o.seq DESC LIMIT 1) pos ON true
LEFT JOIN LATERAL (SELECT m.c_offset, m.created_at FROM {schema}outbox_message_t m
                    WHERE m.topic_id = $1 AND m.partition_id = g.p AND m.c_offset < pos.next_offset AND m.host_id = $2
                    ORDER BY m.c_offset DESC LIMIT 1) last ON true
LEFT JOIN LATERAL (SELECT m.c_offset, m.created_at FROM {schema}outbox_message_t m
                    WHERE m.topic_id = $1 AND m.partition_id = g.p AND m.c_offset >= pos.next_offset AND m.host_id = $2
                    ORDER BY m.c_offset LIMIT 1) nxt ON true
LEFT JOIN {schema}partition_halts h ON h.group_id = g.group_id AND h.topic_id = $1 AND h.partition_id = g.p
LEFT JOIN {schema}parked_hosts ph ON ph.group_id = g.group_id AND ph.topic_id = $1 AND ph.host_id = $2
LEFT JOIN {schema}partition_ownership w ON w.group_id = g.group_id AND w.topic_id = $1 AND w.partition_id = g.p
ORDER BY g.group_id`

	// deadLettersSQL lists up to $8 dead letters, oldest first, filtered
	// by group $1, topic $2 (0: any), a host among the unit's $3, an event
	// type among its events' $4, a reason containing $5 (case-insensitive,
	// as plain text: no pattern characters), failed at or after $6 and
	// before $7 (NULL: unbounded).
	deadLettersSQL = `SELECT d.id, d.group_id, d.topic_id, d.partition_id, d.first_offset, d.last_offset, d.host_ids,
       coalesce((SELECT array_agg(DISTINCT e->>'event_type') FROM jsonb_array_elements(d.events) e), '{}'),
       jsonb_array_length(d.events), d.error, d.attempts, d.last_failed_at, d.parked_hosts,
       (SELECT count(*) FROM {schema}parked_events p WHERE p.dead_letter_id = d.id)
FROM {schema}dead_letter_queue d
WHERE ($1::text = '' OR d.group_id = $1)
  AND ($2::integer = 0 OR d.topic_id = $2)
  AND ($3::text = '' OR $3 = ANY (d.host_ids))
  AND ($4::text = '' OR d.events @> jsonb_build_array(jsonb_build_object('event_type', $4::text)))
  AND ($5::text = '' OR strpos(lower(d.error), lower($5)) > 0)
  AND ($6::timestamptz IS NULL OR d.last_failed_at >= $6)
  AND ($7::timestamptz IS NULL OR d.last_failed_at < $7)
ORDER BY d.id
LIMIT $8`

	// groupsWithDeadLettersSQL lists the groups that have dead letters,
	// for the filter's choices.
	groupsWithDeadLettersSQL = `SELECT DISTINCT group_id, topic_id FROM {schema}dead_letter_queue ORDER BY group_id, topic_id`
)
