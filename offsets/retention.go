package offsets

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

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
       (SELECT count(*) FROM subscriptions s WHERE s.topic_id = $1 AND s.state <> 'CANCELLED')
FROM topic_retention r
WHERE r.topic_id = $1`

	// nextOffsetSQL reads the offset the topic's next append gets. For a
	// sequence topic it waits for the append in flight (topic_next_offset
	// takes the append lock shared): never call it while holding a lock an
	// append needs.
	nextOffsetSQL = `SELECT topic_next_offset($1)`

	// watermarkSQL is the lowest offset an ACTIVE or PAUSED group still
	// needs: for each of its partitions, the first event at or after its
	// position (below the end of its layout), or the end of its layout when
	// it has handled everything there. A partition without pending events
	// does not hold the watermark back, however old its position: it is as
	// if its position had advanced past the events of other partitions.
	// NULL when no such group has positions.
	watermarkSQL = `WITH pos AS (
    SELECT o.group_id, o.partition_id, o.next_offset,
           coalesce((SELECT n.from_offset FROM group_layouts g
                     JOIN topic_layouts n ON n.topic_id = g.topic_id AND n.version = g.version + 1
                     WHERE g.group_id = o.group_id AND g.topic_id = o.topic_id), 9223372036854775807) AS below
    FROM consumer_offsets o
    JOIN subscriptions s ON s.group_id = o.group_id AND s.topic_id = o.topic_id
    WHERE o.topic_id = $1 AND s.state IN ('ACTIVE', 'PAUSED')
)
SELECT min(coalesce(f.c_offset, p.below))
FROM pos p
LEFT JOIN LATERAL (
    SELECT m.c_offset FROM outbox_message_t m
    WHERE m.topic_id = $1 AND m.partition_id = p.partition_id
      AND m.c_offset >= p.next_offset AND m.c_offset < p.below
    ORDER BY m.c_offset LIMIT 1
) f ON true`

	// positionsPrintSQL is a fingerprint of what a count of skips depends
	// on: the positions below $2 (the segment's end) and the layout of
	// every group of the topic.
	positionsPrintSQL = `SELECT coalesce((SELECT string_agg(group_id || ':' || partition_id || ':' || next_offset, ',' ORDER BY group_id, partition_id)
                  FROM consumer_offsets WHERE topic_id = $1 AND next_offset < $2), '')
       || '|' || coalesce((SELECT string_agg(group_id || ':' || version, ',' ORDER BY group_id)
                           FROM group_layouts WHERE topic_id = $1), '')`

	// countSkipsSQL counts, per group (whatever its state) and partition,
	// the segment's events the group has not handled: those of its layout
	// at or after its position in their partition, and those of every
	// later layout, which it has not reached. A last row carries the
	// fingerprint of what was counted from, read in the same snapshot. %s
	// is the segment's table.
	countSkipsSQL = `WITH gl AS (
    SELECT g.group_id, l.from_offset AS lo,
           coalesce((SELECT n.from_offset FROM topic_layouts n
                     WHERE n.topic_id = g.topic_id AND n.version = g.version + 1), 9223372036854775807) AS hi
    FROM group_layouts g JOIN topic_layouts l ON l.topic_id = g.topic_id AND l.version = g.version
    WHERE g.topic_id = $1
), lost AS (
    SELECT gl.group_id, m.partition_id, m.c_offset
    FROM gl
    JOIN consumer_offsets o ON o.group_id = gl.group_id AND o.topic_id = $1 AND o.next_offset < $2
    JOIN %[1]s m ON m.topic_id = $1 AND m.partition_id = o.partition_id
                AND m.c_offset >= greatest(o.next_offset, gl.lo) AND m.c_offset < gl.hi
    UNION ALL
    SELECT gl.group_id, m.partition_id, m.c_offset
    FROM gl JOIN %[1]s m ON m.topic_id = $1 AND m.c_offset >= gl.hi
)
SELECT group_id, partition_id, count(*), min(c_offset), max(c_offset), NULL::text FROM lost GROUP BY 1, 2
UNION ALL
SELECT NULL, NULL, 0, NULL, NULL, (` + positionsPrintSQL + `)`

	// recordSkipsSQL records what a group loses with the segment.
	recordSkipsSQL = `INSERT INTO retention_skips (group_id, topic_id, partition_id, skipped, first_offset, last_offset, reason)
SELECT u.g, $1, u.p, u.n, u.lo, u.hi, $2
FROM unnest($3::text[], $4::integer[], $5::bigint[], $6::bigint[], $7::bigint[]) AS u(g, p, n, lo, hi)`

	removedSQL = `UPDATE topic_retention SET removed_below = greatest(removed_below, $2), removed_at = now()
WHERE topic_id = $1`
)

// Removed describes a segment that retention removed.
type Removed struct {
	Segment string
	Lo, Hi  int64 // the offsets [Lo, Hi)
	Reason  string
	// Skipped counts the events removed before a group handled them, by
	// group.
	Skipped map[string]int64
}

// Retention is what one pass of ApplyRetention found and did.
type Retention struct {
	// Watermark is the lowest offset an ACTIVE or PAUSED group needs;
	// NoLimit when none holds any.
	Watermark int64
	Removed   []Removed
	// Blocked says why the oldest segment stayed, when one did.
	Blocked string
}

// Pool is what ApplyRetention runs on: *pgxpool.Pool satisfies it.
type Pool interface {
	Querier
	Beginner
}

// retentionLockSQL serialises the removal of a topic's segments with the
// placing of groups (Place takes it shared): a group placed at "earliest"
// while a segment goes either sees the segment gone or holds the watermark
// below it.
const (
	retentionLockSQL       = `SELECT pg_advisory_xact_lock(hashtext('pgevents.retention'), $1)`
	retentionLockSharedSQL = `SELECT pg_advisory_xact_lock_shared(hashtext('pgevents.retention'), $1)`
)

// ApplyRetention removes the topic's oldest segments that retention allows,
// oldest first, stopping at the first one that must stay:
//
//   - a segment goes when its newest event is older than the topic's
//     retention and all its offsets are below the watermark (and, for a
//     topic without subscriptions, its newest event is older than the
//     zero-subscription retention); DEAD groups do not hold the watermark;
//   - a segment goes whatever the groups when its newest event is older
//     than max_retention.
//
// Each segment is decided and dropped in its own transaction. It takes the
// topic's retention lock (Place takes it shared, so no group is placed
// meanwhile), decides, and counts, per group and partition whatever the
// group's state, the events of the segment not handled yet. Then it takes
// the ACCESS EXCLUSIVE lock on outbox_message_t that dropping a partition
// needs (with a 100 ms lock timeout: producers and consumers wait at most
// that long, and a busy lock leaves the segment to the next pass). Under
// it no batch is in flight: it decides again, with the watermark as it is
// now (a DEAD group that came back holds it again), counts again if a
// position moved since the first count, and records the counts in
// retention_skips with the drop, so nothing is skipped silently.
func ApplyRetention(ctx context.Context, db Pool, topic int) (Retention, error) {
	out := Retention{Watermark: NoLimit}
	segs, err := schema.Segments(ctx, db, topic)
	if err != nil {
		return out, err
	}
	// The counter only grows: read once, on its own (for a sequence topic
	// it waits for the append in flight and would hold appends off for as
	// long as the transaction that read it lasts), it is safe to decide
	// every segment with.
	var counter int64
	if err := db.QueryRow(ctx, nextOffsetSQL, topic).Scan(&counter); err != nil {
		return out, fmt.Errorf("offsets: next offset of topic %d: %w", topic, err)
	}
	for _, seg := range segs {
		if seg.Hi > counter {
			out.Blocked = "the oldest segment is the one being written"
			break
		}
		r, blocked, err := dropSegment(ctx, db, topic, seg, &out.Watermark)
		if err != nil {
			var pgErr *pgconn.PgError
			if errors.As(err, &pgErr) && pgErr.Code == "55P03" {
				out.Blocked = "the log's lock was busy; retrying at the next pass"
				break
			}
			return out, err
		}
		if blocked != "" {
			out.Blocked = blocked
			break
		}
		out.Removed = append(out.Removed, r)
	}
	return out, nil
}

// testHookBeforeDropLock, when set by a test, runs between the first
// decision on a segment and the lock under which it is decided again.
var testHookBeforeDropLock func()

// skipCount is what a group loses in one partition when a segment goes.
type skipCount struct {
	group     string
	partition int
	n, lo, hi int64
}

// dropSegment decides whether seg may go, and if so counts what groups
// lose, drops it and records how far retention went, in one transaction.
// It returns why the segment stays, or "" when it went, and sets
// *watermark.
func dropSegment(ctx context.Context, db Beginner, topic int, seg schema.Segment, watermark *int64) (Removed, string, error) {
	r := Removed{Segment: seg.Name, Lo: seg.Lo, Hi: seg.Hi, Skipped: map[string]int64{}}
	fail := func(err error) (Removed, string, error) {
		return r, "", fmt.Errorf("offsets: drop %s: %w", seg.Name, err)
	}
	tx, err := db.Begin(ctx)
	if err != nil {
		return fail(err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // no-op after Commit
	if _, err := tx.Exec(ctx, `SET LOCAL lock_timeout = '100ms'`); err != nil {
		return fail(err)
	}
	if _, err := tx.Exec(ctx, retentionLockSQL, topic); err != nil {
		return fail(err)
	}
	name := pgx.Identifier{seg.Name}.Sanitize()
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
	// No batch is in flight once this is held, and none starts.
	if err := lockLog(ctx, tx); err != nil {
		return fail(err)
	}
	if blocked, err := decideDrop(ctx, tx, topic, seg, name, watermark, &r); err != nil || blocked != "" {
		return r, blocked, err
	}
	var now string
	if err := tx.QueryRow(ctx, positionsPrintSQL, topic, seg.Hi).Scan(&now); err != nil {
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
		groups, parts = append(groups, c.group), append(parts, int32(c.partition))
		ns, los, highs = append(ns, c.n), append(los, c.lo), append(highs, c.hi)
		r.Skipped[c.group] += c.n
	}
	if _, err := tx.Exec(ctx, recordSkipsSQL, topic, r.Reason, groups, parts, ns, los, highs); err != nil {
		return fail(err)
	}
	if _, err := tx.Exec(ctx, `DROP TABLE `+name); err != nil {
		return fail(err)
	}
	if _, err := tx.Exec(ctx, removedSQL, topic, seg.Hi); err != nil {
		return fail(err)
	}
	if err := tx.Commit(ctx); err != nil {
		return fail(err)
	}
	return r, "", nil
}

// Taking the log's ACCESS EXCLUSIVE lock: first without waiting, a few
// times, in a savepoint each, so that producers and batches never queue
// behind a waiting request while the lock is busy; then waiting, for at
// most the transaction's lock_timeout.
const (
	lockLogNowaitSQL = `LOCK TABLE ONLY outbox_message_t IN ACCESS EXCLUSIVE MODE NOWAIT`
	lockLogSQL       = `LOCK TABLE ONLY outbox_message_t IN ACCESS EXCLUSIVE MODE`
	lockLogTries     = 20
	lockLogPause     = 5 * time.Millisecond
)

// lockLog takes the log's ACCESS EXCLUSIVE lock in tx, preferring a moment
// when nobody holds a lock on it to a wait that holds appends off.
func lockLog(ctx context.Context, tx pgx.Tx) error {
	for range lockLogTries {
		sp, err := tx.Begin(ctx) // a savepoint: a refused NOWAIT aborts only it
		if err != nil {
			return err
		}
		if _, err := sp.Exec(ctx, lockLogNowaitSQL); err == nil {
			return sp.Commit(ctx)
		}
		if err := sp.Rollback(ctx); err != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(lockLogPause):
		}
	}
	_, err := tx.Exec(ctx, lockLogSQL)
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
	if err := tx.QueryRow(ctx, retentionSettingsSQL, topic).Scan(&retention, &maxRetention, &zeroSubs, &now, &subs); err != nil {
		return "", fmt.Errorf("offsets: retention settings of topic %d: %w", topic, err)
	}
	if err := tx.QueryRow(ctx, watermarkSQL, topic).Scan(&wm); err != nil {
		return "", fmt.Errorf("offsets: watermark of topic %d: %w", topic, err)
	}
	*watermark = NoLimit
	if wm != nil {
		*watermark = *wm
	}
	if err := tx.QueryRow(ctx, fmt.Sprintf(`SELECT max(created_at) FROM (SELECT created_at FROM %s ORDER BY c_offset DESC LIMIT 1) x`, name)).
		Scan(&newest); err != nil {
		return "", fmt.Errorf("offsets: newest event of %s: %w", seg.Name, err)
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
	rows, err := tx.Query(ctx, fmt.Sprintf(countSkipsSQL, name), topic, seg.Hi)
	if err != nil {
		return nil, "", fmt.Errorf("count skips: %w", err)
	}
	var (
		out    []skipCount
		print  string
		group  *string
		part   *int
		n      int64
		lo, hi *int64
		fp     *string
	)
	if _, err := pgx.ForEachRow(rows, []any{&group, &part, &n, &lo, &hi, &fp}, func() error {
		if fp != nil {
			print = *fp
			return nil
		}
		out = append(out, skipCount{group: *group, partition: *part, n: n, lo: *lo, hi: *hi})
		return nil
	}); err != nil {
		return nil, "", fmt.Errorf("count skips: %w", err)
	}
	return out, print, nil
}
