package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgevents/pgevents/pgeventstype"
	"github.com/pgevents/pgevents/schema"
)

// Retention statements.
const (
	// retentionSettingsSQL reads a topic's retention, the database clock
	// and how many subscriptions the topic has (CANCELLED ones are gone).
	retentionSettingsSQL = `SELECT extract(epoch FROM r.retention)::float8,
       extract(epoch FROM r.max_retention)::float8,
       extract(epoch FROM r.zero_subscription_retention)::float8,
       clock_timestamp(),
       (SELECT count(*) FROM {schema}subscriptions s WHERE s.topic_id = $1 AND s.state <> 'CANCELLED')
FROM {schema}topic_retention r
WHERE r.topic_id = $1`

	// unhandledFromSQL is, for each group of the topic and partition $2,
	// the offset from which the group has not handled the partition's
	// events: its position there, in its layout, and from the partition's
	// first offset in that layout when the layout does not have the
	// partition (every event of the partition from there on belongs to a
	// later layout, which the group has not reached). Events below it
	// belong to layouts the group has finished.
	unhandledFromSQL = `SELECT gl.group_id, s.state,
       CASE WHEN $2 < l.total_partitions
            THEN greatest(coalesce(o.next_offset, 0), {schema}layout_start($1, gl.version, $2))
            ELSE {schema}layout_start($1, gl.version, $2) END AS from_offset
FROM {schema}group_layouts gl
JOIN {schema}topic_layouts l ON l.topic_id = gl.topic_id AND l.version = gl.version
LEFT JOIN {schema}subscriptions s ON s.group_id = gl.group_id AND s.topic_id = gl.topic_id
LEFT JOIN LATERAL (SELECT o.next_offset FROM {schema}consumer_positions o
                   WHERE o.group_id = gl.group_id AND o.topic_id = gl.topic_id AND o.partition_id = $2
                   ORDER BY o.seq DESC LIMIT 1) o ON true
WHERE gl.topic_id = $1`

	// watermarkSQL is the lowest offset of partition $2 an ACTIVE or PAUSED
	// group still needs: the first event at or after where each such group
	// stopped handling the partition (unhandledFromSQL). A group with
	// nothing pending there does not hold the watermark back, however old
	// its position. NULL when no group holds it.
	watermarkSQL = `SELECT min(f.c_offset)
FROM (` + unhandledFromSQL + `) g
CROSS JOIN LATERAL (
    SELECT m.c_offset FROM {schema}outbox_message_t m
    WHERE m.topic_id = $1 AND m.partition_id = $2 AND m.c_offset >= g.from_offset
    ORDER BY m.c_offset LIMIT 1
) f
WHERE g.state IN ('ACTIVE', 'PAUSED')`

	// positionsPrintSQL is a fingerprint of what a count of skips in
	// partition $2 depends on: the groups' positions there and their
	// layouts.
	positionsPrintSQL = `SELECT coalesce(string_agg(g.group_id || ':' || g.from_offset, ',' ORDER BY g.group_id), '')
FROM (` + unhandledFromSQL + `) g`

	// countSkipsSQL counts, per group (whatever its state), the segment's
	// events the group has not handled (unhandledFromSQL). A last row carries
	// the fingerprint of what was counted from, read in the same snapshot.
	// %s is the segment's table.
	countSkipsSQL = `SELECT g.group_id, count(m.c_offset), min(m.c_offset), max(m.c_offset), NULL::text
FROM (` + unhandledFromSQL + `) g
JOIN %s m ON m.topic_id = $1 AND m.partition_id = $2 AND m.c_offset >= g.from_offset
GROUP BY g.group_id
UNION ALL
SELECT NULL, 0, NULL, NULL, (` + positionsPrintSQL + `)`

	// recordSkipsSQL records what a group loses with the segment.
	recordSkipsSQL = `INSERT INTO {schema}retention_skips (group_id, topic_id, partition_id, skipped, first_offset, last_offset, reason)
SELECT u.g, $1, u.p, u.n, u.lo, u.hi, $2
FROM unnest($3::text[], $4::integer[], $5::bigint[], $6::bigint[], $7::bigint[]) AS u(g, p, n, lo, hi)`

	// removedSQL records how far retention went, in the transaction that
	// dropped the segment ending below $2 from partition $3: the topic's
	// removed_below, and the partition's log start (migration 0018), the
	// first offset of the partition not removed, which nothing else moves.
	removedSQL = `WITH p AS (
    UPDATE {schema}partition_counters SET log_start = greatest(log_start, $2)
    WHERE topic_id = $1 AND partition_id = $3
)
UPDATE {schema}topic_retention SET removed_below = greatest(removed_below, $2), removed_at = now()
WHERE topic_id = $1`
)

// Removed describes a segment that retention removed
// (pgeventstype.RemovedSegment).
type Removed = pgeventstype.RemovedSegment

// Retention is what one pass of ApplyRetention found and did
// (pgeventstype.Retention).
type Retention = pgeventstype.Retention

// retentionLockSQL serialises the removal of a topic's segments with the
// placing of groups (Place takes it shared): a group placed at "earliest"
// while a segment goes either sees the segment gone or holds the watermark
// below it.
const (
	retentionLockSQL       = `SELECT pg_advisory_xact_lock({schema}lock_key('retention', $1::integer::text))`
	retentionLockSharedSQL = `SELECT pg_advisory_xact_lock_shared({schema}lock_key('retention', $1::integer::text))`
)

// ApplyRetention removes, partition by partition, the oldest segments that
// retention allows, oldest first, stopping in each partition at the first
// one that must stay:
//
//   - a segment goes when its newest event is older than the topic's
//     retention and all its offsets are below the partition's watermark
//     (and, for a topic without subscriptions, its newest event is older
//     than the zero-subscription retention); DEAD groups do not hold the
//     watermark;
//   - a segment goes whatever the groups when its newest event is older
//     than max_retention.
//
// Each segment is decided and dropped in its own transaction. It takes the
// topic's retention lock (Place takes it shared, so no group is placed
// meanwhile), decides, and counts, per group whatever its state, the events
// of the segment not handled yet. Then it takes the ACCESS EXCLUSIVE lock on
// the partition's table that dropping a segment needs: without waiting
// first, a few times, then waiting at most 100 ms (the partition's producers
// and batches wait at most that long, and a busy lock leaves the segment to
// the next pass; other partitions are not touched). Under it no batch of the
// partition is in flight: it decides again, with the watermark as it is now
// (a DEAD group that came back holds it again), counts again if a position
// or layout changed since the first count, and records the counts in
// retention_skips with the drop, so nothing is skipped silently.
func ApplyRetention(ctx context.Context, db schema.DB, topic int) (Retention, error) {
	out := Retention{Watermark: NoLimit}
	segs, err := schema.Segments(ctx, db, topic)
	if err != nil {
		return out, err
	}
	// The next offsets only grow: read once, on their own (for a sequence
	// topic it waits for the append in flight and would hold appends off
	// for as long as the transaction that read it lasts), they are safe to
	// decide every segment with.
	var nexts []int64
	if err := db.QueryRow(ctx, schema.SQL(ctx, nextOffsetsSQL), topic).Scan(&nexts); err != nil {
		return out, fmt.Errorf("next offsets of topic %d: %w", topic, err)
	}
	stays := map[int]bool{} // partitions whose oldest segment stays
	for _, seg := range segs {
		if stays[seg.Partition] {
			continue
		}
		block := func(why string) {
			stays[seg.Partition] = true
			if out.Blocked == "" {
				out.Blocked = fmt.Sprintf("partition %d: %s", seg.Partition, why)
			}
		}
		if seg.Partition >= len(nexts) || seg.Hi > nexts[seg.Partition] {
			block("the oldest segment is the one being written")
			continue
		}
		var wm int64
		r, blocked, err := dropSegment(ctx, db, topic, seg, &wm)
		out.Watermark = min(out.Watermark, wm)
		if err != nil {
			var pgErr *pgconn.PgError
			if errors.As(err, &pgErr) && pgErr.Code == "55P03" {
				block("the partition's lock was busy; retrying at the next pass")
				continue
			}
			return out, err
		}
		if blocked != "" {
			block(blocked)
			continue
		}
		out.Removed = append(out.Removed, r)
	}
	return out, nil
}

// testHookBeforeDropLock, when set by a test, runs between the first
// decision on a segment and the lock under which it is decided again.
var testHookBeforeDropLock func()

// skipCount is what a group loses when a segment goes.
type skipCount struct {
	group     string
	n, lo, hi int64
}

// dropSegment decides whether seg may go, and if so counts what groups
// lose, drops it and records how far retention went, in one transaction.
// It returns why the segment stays, or "" when it went, and sets
// *watermark to the partition's.
func dropSegment(ctx context.Context, db schema.DB, topic int, seg schema.Segment, watermark *int64) (Removed, string, error) {
	r := Removed{Segment: seg.Name, Partition: seg.Partition, Lo: seg.Lo, Hi: seg.Hi, Skipped: map[string]int64{}}
	fail := func(err error) (Removed, string, error) {
		return r, "", fmt.Errorf("drop %s: %w", seg.Name, err)
	}
	tx, err := Begin(ctx, db)
	if err != nil {
		return fail(err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // no-op after Commit
	if _, err := tx.Exec(ctx, `SET LOCAL lock_timeout = '100ms'`); err != nil {
		return fail(err)
	}
	if _, err := tx.Exec(ctx, schema.SQL(ctx, retentionLockSQL), topic); err != nil {
		return fail(err)
	}
	name := schema.Ident(ctx, seg.Name)
	if blocked, err := decideDrop(ctx, tx, topic, seg, name, watermark, &r); err != nil || blocked != "" {
		return r, blocked, err
	}
	counts, print, err := countSkips(ctx, tx, topic, seg, name)
	if err != nil {
		return fail(err)
	}
	if testHookBeforeDropLock != nil {
		testHookBeforeDropLock()
	}
	// No batch of the partition is in flight once this is held, and none
	// starts.
	if err := lockPartition(ctx, tx, schema.Ident(ctx, PartitionTable(topic, seg.Partition))); err != nil {
		return fail(err)
	}
	if blocked, err := decideDrop(ctx, tx, topic, seg, name, watermark, &r); err != nil || blocked != "" {
		return r, blocked, err
	}
	var now string
	if err := tx.QueryRow(ctx, schema.SQL(ctx, positionsPrintSQL), topic, seg.Partition).Scan(&now); err != nil {
		return fail(err)
	}
	if now != print {
		// A batch or a layout switch committed since the count.
		if counts, _, err = countSkips(ctx, tx, topic, seg, name); err != nil {
			return fail(err)
		}
	}
	var (
		groups         []string
		parts          []int32
		ns, los, highs []int64
	)
	for _, c := range counts {
		if c.n == 0 {
			continue
		}
		groups, parts = append(groups, c.group), append(parts, int32(seg.Partition))
		ns, los, highs = append(ns, c.n), append(los, c.lo), append(highs, c.hi)
		r.Skipped[c.group] += c.n
	}
	if _, err := tx.Exec(ctx, schema.SQL(ctx, recordSkipsSQL), topic, r.Reason, groups, parts, ns, los, highs); err != nil {
		return fail(err)
	}
	if _, err := tx.Exec(ctx, `DROP TABLE `+name); err != nil {
		return fail(err)
	}
	if _, err := tx.Exec(ctx, schema.SQL(ctx, removedSQL), topic, seg.Hi, seg.Partition); err != nil {
		return fail(err)
	}
	if err := tx.Commit(ctx); err != nil {
		return fail(err)
	}
	return r, "", nil
}

// Taking a partition table's ACCESS EXCLUSIVE lock: first without waiting,
// a few times, in a savepoint each, so that the partition's producers and
// batches never queue behind a waiting request while the lock is busy;
// then waiting, for at most the transaction's lock_timeout.
const (
	lockNowaitSQL = `LOCK TABLE ONLY %s IN ACCESS EXCLUSIVE MODE NOWAIT`
	lockSQL       = `LOCK TABLE ONLY %s IN ACCESS EXCLUSIVE MODE`
	lockTries     = 20
	lockPause     = 5 * time.Millisecond
)

// lockPartition takes the ACCESS EXCLUSIVE lock on table in tx, preferring
// a moment when nobody holds a lock on it to a wait that holds appends off.
func lockPartition(ctx context.Context, tx pgx.Tx, table string) error {
	for range lockTries {
		sp, err := tx.Begin(ctx) // a savepoint: a refused NOWAIT aborts only it
		if err != nil {
			return err
		}
		if _, err := sp.Exec(ctx, fmt.Sprintf(lockNowaitSQL, table)); err == nil {
			return sp.Commit(ctx)
		}
		if err := sp.Rollback(ctx); err != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(lockPause):
		}
	}
	_, err := tx.Exec(ctx, fmt.Sprintf(lockSQL, table))
	return err
}

// decideDrop reads the topic's retention, the watermark and the age of
// seg's newest event (it takes no lock an append needs), and says why seg must stay, or "" when it may go,
// setting r.Reason.
func decideDrop(ctx context.Context, tx pgx.Tx, topic int, seg schema.Segment, name string, watermark *int64, r *Removed) (string, error) {
	var (
		retention, zeroSubs float64
		maxRetention        *float64
		subs                int64
		now                 time.Time
		wm                  *int64
		newest              *time.Time
	)
	if err := tx.QueryRow(ctx, schema.SQL(ctx, retentionSettingsSQL), topic).Scan(&retention, &maxRetention, &zeroSubs, &now, &subs); err != nil {
		return "", fmt.Errorf("retention settings of topic %d: %w", topic, err)
	}
	if err := tx.QueryRow(ctx, schema.SQL(ctx, watermarkSQL), topic, seg.Partition).Scan(&wm); err != nil {
		return "", fmt.Errorf("watermark of topic %d: %w", topic, err)
	}
	*watermark = NoLimit
	if wm != nil {
		*watermark = *wm
	}
	if err := tx.QueryRow(ctx, fmt.Sprintf(`SELECT max(created_at) FROM (SELECT created_at FROM %s ORDER BY c_offset DESC LIMIT 1) x`, name)).
		Scan(&newest); err != nil {
		return "", fmt.Errorf("newest event of %s: %w", seg.Name, err)
	}
	age := time.Duration(0)
	if newest != nil {
		age = now.Sub(*newest)
	}
	seconds := age.Seconds()
	capped := maxRetention != nil && newest != nil && seconds > *maxRetention
	allowed := newest == nil || (seconds > retention && seg.Hi <= *watermark && (subs > 0 || seconds > zeroSubs))
	switch {
	case !allowed && !capped && seg.Hi > *watermark:
		return fmt.Sprintf("offset %d is still needed by an ACTIVE or PAUSED group", *watermark), nil
	case !allowed && !capped:
		return fmt.Sprintf("its newest event is %s old, within retention", age.Round(time.Second)), nil
	case allowed:
		r.Reason = "retention"
	default:
		r.Reason = "max_retention"
	}
	return "", nil
}

// countSkips counts what each group loses with seg (see countSkipsSQL),
// and returns the fingerprint of the positions and layouts it counted from.
func countSkips(ctx context.Context, tx pgx.Tx, topic int, seg schema.Segment, name string) ([]skipCount, string, error) {
	rows, err := tx.Query(ctx, fmt.Sprintf(schema.SQL(ctx, countSkipsSQL), name), topic, seg.Partition)
	if err != nil {
		return nil, "", fmt.Errorf("count skips: %w", err)
	}
	var (
		out    []skipCount
		print  string
		group  *string
		n      int64
		lo, hi *int64
		fp     *string
	)
	if _, err := pgx.ForEachRow(rows, []any{&group, &n, &lo, &hi, &fp}, func() error {
		if fp != nil {
			print = *fp
			return nil
		}
		c := skipCount{group: *group, n: n}
		if lo != nil {
			c.lo, c.hi = *lo, *hi
		}
		out = append(out, c)
		return nil
	}); err != nil {
		return nil, "", fmt.Errorf("count skips: %w", err)
	}
	return out, print, nil
}
