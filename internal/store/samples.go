package store

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgevents/pgevents/schema"
)

// Samples (migration 0022): what the console's charts draw. A maintenance
// pass writes one per topic and period: the partitions' heads and the
// events appended since the previous sample, and per group its positions,
// the events it handled since its previous sample, its lag, lag age and
// dead letters.
const (
	// SamplePeriod is how often a topic is sampled at most: the width of
	// a sample's bucket, its key. Maintenance runs every
	// MaintenanceInterval (10 s by default) in every consumer process, so
	// most periods get a sample; a pass in a period that has one writes
	// nothing.
	SamplePeriod = 10 * time.Second
	// SampleKeep is how long samples are kept: the hour the console draws
	// and a minute more, so that the chart's left edge has its sample.
	SampleKeep = time.Hour + time.Minute
	// SampleLagCap bounds the events counted for a partition's lag in a
	// sample, as the console counts a lag; beyond it the lag is an
	// estimate from the offsets (exact under offset scope partition, where
	// a partition's offsets are consecutive), and the sample says so
	// (lag_capped).
	SampleLagCap = 1_000
	// SampleCountCap bounds the events counted for a partition's handled
	// events in a sample, under offset scope topic (under scope partition
	// they are the difference of the positions, counted by nothing);
	// beyond it the count is an estimate from the offsets.
	SampleCountCap = 10_000
)

const (
	// sampleSQL samples topic $2 in the period of $1 ms that holds the
	// database clock, in one statement, unless the period has a sample:
	// it inserts the topic's row (topic_samples), and only if it did, a
	// row per group of the topic (group_samples). $3 caps the events
	// counted for a lag, $4 those counted for the events a group handled
	// under offset scope topic. It returns whether it wrote the topic's
	// row, how many groups' rows it wrote, and when it read them.
	//
	// One writer per topic and period (the invariant of migration 0022):
	// the topic's row is inserted ON CONFLICT DO NOTHING on its key
	// (topic_id, bucket); a concurrent writer of the same period waits for
	// that insert to commit, then inserts nothing, and its groups' insert,
	// which reads the topic insert's RETURNING, inserts nothing either. A
	// period that has a sample already is seen by `topic`, which is then
	// empty: the statement reads nothing else.
	//
	// What it reads, and why it is cheap whatever the size of the log:
	//
	//   - heads: one descending probe of the log's index (topic_id,
	//     partition_id, c_offset) per partition; the events appended are
	//     the heads' differences with the previous sample's (gapless
	//     offsets, invariant 1: per partition under scope partition and for
	//     sequenced topics, topic-wide under scope topic), counted by
	//     nothing (a partition empty at the previous sample probes its
	//     first offset);
	//   - each group's positions, lag and lag age as the status statements
	//     read them (LagReadsSQL: index probes, and at most $3 index
	//     entries per partition), its dead letters through
	//     dead_letter_queue_position_idx;
	//   - the events a group handled: its positions' differences with its
	//     previous sample's under scope partition; under scope topic, where
	//     a partition's offsets are not consecutive, the events between
	//     the two positions, counted through the log's index up to $4 per
	//     partition (an estimate from the offsets beyond);
	//   - the previous samples, by their keys' index, newest first.
	sampleSQL = `WITH clock AS MATERIALIZED (
    SELECT c.at, date_bin($1 * interval '1 millisecond', c.at, timestamptz '2000-01-01 00:00:00+00') AS bucket
    FROM (SELECT clock_timestamp() AS at) c
),
topic AS MATERIALIZED (
    SELECT c.topic_id, c.total_partitions, c.offset_scope, c.sequenced,
           greatest(c.total_partitions, (SELECT max(l.total_partitions) FROM {schema}topic_layouts l
                                          WHERE l.topic_id = c.topic_id)) AS all_partitions
    FROM {schema}log_counter c CROSS JOIN clock k
    WHERE c.topic_id = $2
      AND NOT EXISTS (SELECT 1 FROM {schema}topic_samples s WHERE s.topic_id = $2 AND s.bucket = k.bucket)
),
` + StagedSQL + `,
heads AS (
    SELECT array_agg(h.o ORDER BY p.p) AS heads
    FROM topic t
    CROSS JOIN generate_series(0, t.all_partitions - 1) AS p(p)
    LEFT JOIN LATERAL (SELECT max(m.c_offset) AS o FROM {schema}outbox_message_t m
                       WHERE m.topic_id = t.topic_id AND m.partition_id = p.p) h ON true
),
prev_topic AS (
    SELECT s.taken_at, s.heads
    FROM {schema}topic_samples s CROSS JOIN clock k
    WHERE s.topic_id = $2 AND s.bucket < k.bucket
    ORDER BY s.bucket DESC
    LIMIT 1
),
appended AS (
    SELECT CASE
        WHEN pt.taken_at IS NULL THEN NULL
        WHEN t.offset_scope = 'partition' THEN (
            SELECT coalesce(sum(greatest(h.head - coalesce(h.prev,
                       (SELECT min(m.c_offset) FROM {schema}outbox_message_t m
                         WHERE m.topic_id = t.topic_id AND m.partition_id = h.n - 1) - 1), 0)), 0)
            FROM unnest(hd.heads, pt.heads) WITH ORDINALITY AS h(head, prev, n))
        ELSE (
            SELECT greatest(max(h.head) - coalesce(max(h.prev),
                       (SELECT min(m.c_offset) FROM {schema}outbox_message_t m WHERE m.topic_id = t.topic_id) - 1), 0)
            FROM unnest(hd.heads, pt.heads) AS h(head, prev))
        END AS n
    FROM topic t CROSS JOIN heads hd LEFT JOIN prev_topic pt ON true
),
groups AS (
    SELECT gl.group_id FROM {schema}group_layouts gl JOIN topic t ON gl.topic_id = t.topic_id
    UNION
    SELECT s.group_id FROM {schema}subscriptions s JOIN topic t ON s.topic_id = t.topic_id
),
glayout AS (
    SELECT g.group_id, t.topic_id, coalesce(l.total_partitions, t.total_partitions) AS total_partitions, gl.version,
           ps.taken_at AS prev_at, ps.positions AS prev_positions, ps.dead_letters_seen AS prev_seen
    FROM topic t
    CROSS JOIN groups g
    CROSS JOIN clock k
    LEFT JOIN {schema}group_layouts gl ON gl.group_id = g.group_id AND gl.topic_id = t.topic_id
    LEFT JOIN {schema}topic_layouts l ON l.topic_id = t.topic_id AND l.version = gl.version
    LEFT JOIN LATERAL (
        SELECT s.taken_at, s.positions, s.dead_letters_seen FROM {schema}group_samples s
        WHERE s.topic_id = t.topic_id AND s.group_id = g.group_id AND s.bucket < k.bucket
        ORDER BY s.bucket DESC
        LIMIT 1
    ) ps ON true
),
parts AS (
    SELECT g.group_id, g.topic_id, p.partition_id, o.next_offset, g.prev_at,
           g.prev_positions[p.partition_id + 1] AS prev_position, g.prev_seen[p.partition_id + 1] AS prev_seen,
           coalesce({schema}layout_cut(g.topic_id, g.version, p.partition_id), 9223372036854775807) AS below
    FROM glayout g
    CROSS JOIN generate_series(0, g.total_partitions - 1) AS p(partition_id)
    LEFT JOIN LATERAL (
        SELECT o.next_offset FROM {schema}consumer_positions o
        WHERE o.group_id = g.group_id AND o.topic_id = g.topic_id AND o.partition_id = p.partition_id
        ORDER BY o.seq DESC LIMIT 1
    ) o ON true
),
state AS (
    SELECT s.group_id, s.partition_id, s.next_offset, s.prev_at,
           CASE WHEN s.next_offset IS NULL THEN 0
                WHEN lag.events >= $3 AND e.log_end IS NOT NULL
                THEN greatest(lag.events, (e.log_end + 1 - s.next_offset)
                                          / CASE WHEN t.offset_scope = 'partition' THEN 1 ELSE greatest(t.total_partitions, 1) END)
                ELSE lag.events END AS lag,
           s.next_offset IS NOT NULL AND lag.events >= $3 AS lag_capped,
           CASE WHEN s.next_offset IS NULL THEN 0
                ELSE coalesce(greatest(extract(epoch FROM k.at - lag.first_at)::float8, 0), 0) END AS lag_seconds,
           d.n AS dead_letters,
           CASE WHEN s.prev_at IS NOT NULL THEN d.new END AS dead_lettered,
           CASE WHEN s.prev_at IS NOT NULL THEN coalesce(greatest(s.prev_seen, d.top), 0) ELSE coalesce(d.top, 0) END AS seen,
           CASE WHEN s.prev_at IS NULL OR s.next_offset IS NULL OR s.prev_position IS NULL THEN NULL
                WHEN s.next_offset <= s.prev_position THEN 0
                WHEN t.offset_scope = 'partition' THEN s.next_offset - s.prev_position
                ELSE (SELECT greatest(x.n, CASE WHEN x.n >= $4 THEN (s.next_offset - s.prev_position) / greatest(t.total_partitions, 1) ELSE 0 END)
                      FROM (SELECT count(*) AS n FROM (
                                SELECT 1 FROM {schema}outbox_message_t m
                                WHERE m.topic_id = s.topic_id AND m.partition_id = s.partition_id
                                  AND m.c_offset >= s.prev_position AND m.c_offset < s.next_offset
                                LIMIT $4) c) x)
           END AS handled
    FROM parts s` + LagReadsSQL + `CROSS JOIN clock k
    CROSS JOIN topic t
    CROSS JOIN LATERAL (
        SELECT count(*) AS n, max(q.id) AS top, count(*) FILTER (WHERE q.id > coalesce(s.prev_seen, 0)) AS new
        FROM {schema}dead_letter_queue q
        WHERE q.group_id = s.group_id AND q.topic_id = s.topic_id AND q.partition_id = s.partition_id
    ) d
),
agg AS (
    SELECT st.group_id, max(st.prev_at) AS prev_at,
           sum(coalesce(st.handled, 0))::bigint AS handled,
           sum(st.lag)::bigint AS lag, bool_or(st.lag_capped) AS lag_capped, max(st.lag_seconds) AS lag_seconds,
           sum(st.dead_letters)::bigint AS dead_letters, sum(coalesce(st.dead_lettered, 0))::bigint AS dead_lettered,
           array_agg(st.next_offset ORDER BY st.partition_id) AS positions,
           array_agg(st.handled ORDER BY st.partition_id) AS part_handled,
           array_agg(st.lag ORDER BY st.partition_id) AS part_lag,
           array_agg(st.lag_seconds ORDER BY st.partition_id) AS part_lag_seconds,
           array_agg(st.seen ORDER BY st.partition_id) AS seen
    FROM state st
    GROUP BY st.group_id
),
ins_topic AS (
    INSERT INTO {schema}topic_samples (topic_id, bucket, taken_at, seconds, appended, heads, staged, writer)
    SELECT t.topic_id, k.bucket, k.at, extract(epoch FROM k.at - pt.taken_at)::float8, a.n, coalesce(hd.heads, '{}'),
           CASE WHEN t.sequenced THEN (SELECT coalesce(sum(sg.events), 0)::bigint FROM staged sg) END,
           current_setting('application_name')
    FROM topic t
    CROSS JOIN clock k
    CROSS JOIN heads hd
    CROSS JOIN appended a
    LEFT JOIN prev_topic pt ON true
    ON CONFLICT DO NOTHING
    RETURNING topic_id, bucket, taken_at
),
ins_groups AS (
    INSERT INTO {schema}group_samples (topic_id, bucket, group_id, taken_at, seconds, handled, lag, lag_capped, lag_seconds,
                                       dead_letters, dead_lettered, positions, part_handled, part_lag, part_lag_seconds,
                                       dead_letters_seen)
    SELECT i.topic_id, i.bucket, a.group_id, i.taken_at, extract(epoch FROM i.taken_at - a.prev_at)::float8,
           CASE WHEN a.prev_at IS NOT NULL THEN a.handled END, a.lag, a.lag_capped, a.lag_seconds,
           a.dead_letters, CASE WHEN a.prev_at IS NOT NULL THEN a.dead_lettered END,
           a.positions, a.part_handled, a.part_lag, a.part_lag_seconds, a.seen
    FROM ins_topic i CROSS JOIN agg a
    ON CONFLICT DO NOTHING
    RETURNING 1
)
SELECT (SELECT count(*) FROM ins_topic), (SELECT count(*) FROM ins_groups), (SELECT i.taken_at FROM ins_topic i)`

	// sampleSettingsSQL runs before sampleSQL, in the same implicit
	// transaction (one batch), and holds for it only: JIT off (see
	// jitOffSQL), and the statement's generic plan, made once per session
	// and kept with its prepared statement (the log's segments are pruned
	// when it runs). Planning it anew, with every segment of the log in
	// view, took longer than running it: 33 ms against 21 ms on a topic of
	// 8 partitions and 4 groups (EXPLAIN ANALYZE).
	sampleSettingsSQL = `SELECT set_config('jit', 'off', true), ` + genericPlansExpr

	// pruneSamplesSQL deletes topic $1's samples whose period began more
	// than $2 ms before the database clock, and returns how many rows it
	// deleted: the bound of migration 0022. Both reads go through the
	// tables' keys, which lead with (topic_id, bucket).
	pruneSamplesSQL = `WITH g AS (
    DELETE FROM {schema}group_samples WHERE topic_id = $1 AND bucket < clock_timestamp() - $2 * interval '1 millisecond' RETURNING 1
), t AS (
    DELETE FROM {schema}topic_samples WHERE topic_id = $1 AND bucket < clock_timestamp() - $2 * interval '1 millisecond' RETURNING 1
)
SELECT (SELECT count(*) FROM g) + (SELECT count(*) FROM t)`
)

// Sampled is what Sample wrote.
type Sampled struct {
	// Wrote is false when the period had a sample already: another pass
	// (of this process or another) wrote it.
	Wrote bool
	// Groups counts the groups' rows written.
	Groups int
	// At is when the sample was read, on the database clock (its
	// taken_at); zero when it wrote nothing.
	At time.Time
}

// Sample writes topic's sample of the current period of length period
// (SamplePeriod in production; a test may pass a shorter one) unless the
// period has one: one writer per topic and period, however many processes
// sample at once (sampleSQL).
func Sample(ctx context.Context, db schema.DB, topic int, period time.Duration) (Sampled, error) {
	var out Sampled
	var b pgx.Batch
	b.Queue(sampleSettingsSQL)
	b.Queue(schema.SQL(ctx, sampleSQL), max(period.Milliseconds(), 1), topic, int64(SampleLagCap), int64(SampleCountCap))
	br := db.SendBatch(ctx, &b)
	defer br.Close()
	if _, err := br.Exec(); err != nil {
		return out, fmt.Errorf("sample topic %d: %w", topic, err)
	}
	rows, err := br.Query()
	if err != nil {
		return out, fmt.Errorf("sample topic %d: %w", topic, err)
	}
	defer rows.Close()
	var (
		wrote, groups int64
		at            *time.Time
	)
	if rows.Next() {
		if err := rows.Scan(&wrote, &groups, &at); err != nil {
			return out, fmt.Errorf("sample topic %d: %w", topic, err)
		}
	}
	if err := rows.Err(); err != nil {
		return out, fmt.Errorf("sample topic %d: %w", topic, err)
	}
	out = Sampled{Wrote: wrote > 0, Groups: int(groups)}
	if at != nil {
		out.At = *at
	}
	return out, nil
}

// PruneSamples deletes topic's samples older than keep (SampleKeep in
// production) and returns how many rows it deleted.
func PruneSamples(ctx context.Context, db schema.DB, topic int, keep time.Duration) (int64, error) {
	var n int64
	if err := db.QueryRow(ctx, schema.SQL(ctx, pruneSamplesSQL), topic, keep.Milliseconds()).Scan(&n); err != nil {
		return 0, fmt.Errorf("prune the samples of topic %d: %w", topic, err)
	}
	return n, nil
}
