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
	// retentionSettingsSQL reads a topic's retention, the counter, the
	// database clock and how many subscriptions the topic has (CANCELLED
	// ones are gone).
	retentionSettingsSQL = `SELECT extract(epoch FROM r.retention)::float8,
       extract(epoch FROM r.max_retention)::float8,
       extract(epoch FROM r.zero_subscription_retention)::float8,
       topic_next_offset($1), clock_timestamp(),
       (SELECT count(*) FROM subscriptions s WHERE s.topic_id = $1 AND s.state <> 'CANCELLED')
FROM topic_retention r JOIN log_counter c ON c.topic_id = r.topic_id
WHERE r.topic_id = $1`

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

	// recordSkipsSQL counts, per group and partition, the segment's events
	// that groups in states $2 have not handled, before the segment goes.
	// %s is the segment's table.
	recordSkipsSQL = `INSERT INTO retention_skips (group_id, topic_id, partition_id, skipped, first_offset, last_offset, reason)
SELECT o.group_id, o.topic_id, m.partition_id, count(*), min(m.c_offset), max(m.c_offset), $3
FROM consumer_offsets o
JOIN subscriptions s ON s.group_id = o.group_id AND s.topic_id = o.topic_id
JOIN %s m ON m.topic_id = o.topic_id AND m.partition_id = o.partition_id AND m.c_offset >= o.next_offset
WHERE o.topic_id = $1 AND s.state = ANY($2::text[])
GROUP BY o.group_id, o.topic_id, m.partition_id
RETURNING group_id, skipped`

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

// ApplyRetention removes the topic's oldest segments that retention allows,
// oldest first, stopping at the first one that must stay:
//
//   - a segment goes when its newest event is older than the topic's
//     retention and all its offsets are below the watermark (and, for a
//     topic without subscriptions, its newest event is older than the
//     zero-subscription retention); DEAD groups do not hold the watermark,
//     and the events they had not handled are counted for them;
//   - a segment goes whatever the groups when its newest event is older
//     than max_retention; the events any group had not handled are counted
//     for it.
//
// Each segment is dropped in its own transaction with a 100 ms lock
// timeout, together with the skip counts and topic_retention.removed_below,
// so producers and consumers wait at most that long; a segment that cannot
// get its lock stays until the next pass.
func ApplyRetention(ctx context.Context, db Pool, topic int) (Retention, error) {
	var (
		out                 Retention
		retention, zeroSubs float64
		maxRetention        *float64
		counter, subs       int64
		now                 time.Time
		wm                  *int64
	)
	if err := db.QueryRow(ctx, retentionSettingsSQL, topic).Scan(&retention, &maxRetention, &zeroSubs, &counter, &now, &subs); err != nil {
		return out, fmt.Errorf("offsets: retention settings of topic %d: %w", topic, err)
	}
	if err := db.QueryRow(ctx, watermarkSQL, topic).Scan(&wm); err != nil {
		return out, fmt.Errorf("offsets: watermark of topic %d: %w", topic, err)
	}
	out.Watermark = NoLimit
	if wm != nil {
		out.Watermark = *wm
	}
	segs, err := schema.Segments(ctx, db, topic)
	if err != nil {
		return out, err
	}
	for _, seg := range segs {
		if seg.Hi > counter {
			out.Blocked = "the oldest segment is the one being written"
			break
		}
		var newest *time.Time
		err := db.QueryRow(ctx, fmt.Sprintf(`SELECT max(created_at) FROM (SELECT created_at FROM %s ORDER BY c_offset DESC LIMIT 1) x`,
			pgx.Identifier{seg.Name}.Sanitize())).Scan(&newest)
		if err != nil {
			return out, fmt.Errorf("offsets: newest event of %s: %w", seg.Name, err)
		}
		age := time.Duration(0)
		if newest != nil {
			age = now.Sub(*newest)
		}
		seconds := age.Seconds()
		capped := maxRetention != nil && newest != nil && seconds > *maxRetention
		allowed := newest == nil || (seconds > retention && seg.Hi <= out.Watermark && (subs > 0 || seconds > zeroSubs))
		if !allowed && !capped {
			switch {
			case seg.Hi > out.Watermark:
				out.Blocked = fmt.Sprintf("offset %d is still needed by an ACTIVE or PAUSED group", out.Watermark)
			default:
				out.Blocked = fmt.Sprintf("its newest event is %s old, within retention", age.Round(time.Second))
			}
			break
		}
		reason, states := "retention", []string{StateDead}
		if !allowed {
			reason, states = "max_retention", []string{StateActive, StatePaused, StateDead}
		}
		r, err := dropSegment(ctx, db, topic, seg, reason, states)
		if err != nil {
			var pgErr *pgconn.PgError
			if errors.As(err, &pgErr) && pgErr.Code == "55P03" {
				out.Blocked = "the segment's lock was busy; retrying at the next pass"
				break
			}
			return out, err
		}
		out.Removed = append(out.Removed, r)
	}
	return out, nil
}

// dropSegment counts what groups in states lose, drops the segment and
// records how far retention went, in one transaction.
func dropSegment(ctx context.Context, db Beginner, topic int, seg schema.Segment, reason string, states []string) (Removed, error) {
	r := Removed{Segment: seg.Name, Lo: seg.Lo, Hi: seg.Hi, Reason: reason, Skipped: map[string]int64{}}
	tx, err := db.Begin(ctx)
	if err != nil {
		return r, fmt.Errorf("offsets: drop %s: %w", seg.Name, err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // no-op after Commit
	if _, err := tx.Exec(ctx, `SET LOCAL lock_timeout = '100ms'`); err != nil {
		return r, fmt.Errorf("offsets: drop %s: %w", seg.Name, err)
	}
	name := pgx.Identifier{seg.Name}.Sanitize()
	rows, err := tx.Query(ctx, fmt.Sprintf(recordSkipsSQL, name), topic, states, reason)
	if err != nil {
		return r, fmt.Errorf("offsets: count skips in %s: %w", seg.Name, err)
	}
	var (
		group string
		n     int64
	)
	if _, err := pgx.ForEachRow(rows, []any{&group, &n}, func() error { r.Skipped[group] += n; return nil }); err != nil {
		return r, fmt.Errorf("offsets: count skips in %s: %w", seg.Name, err)
	}
	// DROP takes an ACCESS EXCLUSIVE lock on outbox_message_t for the
	// instant it runs; the lock timeout bounds how long appends queue
	// behind it.
	if _, err := tx.Exec(ctx, `DROP TABLE `+name); err != nil {
		return r, fmt.Errorf("offsets: drop %s: %w", seg.Name, err)
	}
	if _, err := tx.Exec(ctx, removedSQL, topic, seg.Hi); err != nil {
		return r, fmt.Errorf("offsets: drop %s: %w", seg.Name, err)
	}
	if err := tx.Commit(ctx); err != nil {
		return r, fmt.Errorf("offsets: drop %s: %w", seg.Name, err)
	}
	return r, nil
}
