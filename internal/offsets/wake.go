package offsets

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/pgevents/pgevents/schema"
)

// The wake-up protocol of a worker that goes idle (see the pgevents
// package's doc): appends notify a partition only while its waiting flag
// is set, and clear it when they do. An append reads the flag while it
// holds its append lock (the topic's counter row or advisory append lock
// under scope 'topic', the partition's counter row under scope
// 'partition'), which it keeps until it ends. So a worker that finds
// nothing more to do must, before it sleeps:
//
//  1. set the flag, and commit (markWaitingSQL); appends whose flag read
//     comes after that commit notify;
//  2. wait for every append in flight that read the flag before step 1:
//     each held its append lock then, and holds it until it ends;
//  3. look for events once more (idleCheckSQL, pendingSQL): whatever such
//     an append committed is visible now.
//
// So no event waits for the poll period: it is either announced or found
// by step 3.
//
// Under scope 'partition' the flag is a column of the partition's counter
// row, so step 1 is step 2 too: setting the flag waits for the append that
// holds the row, and an append that finds the flag already set notifies;
// the flag set already (by this worker or another group's) means that
// whoever set it waited for the appends that had read it clear. Idle runs
// steps 1 and 3 in one round trip.
//
// Under scope 'topic' the append lock is the topic's, so step 2 waits for
// whatever append holds it, whichever partition it writes. A worker does
// not wait itself (it would sit out another partition's commit and its WAL
// flush, unable to take the events it is notified of meanwhile, and would
// lock the topic's counter row at every idle moment): Idle runs steps 1
// and 3 at once, and when that finds nothing the worker sleeps and asks
// Recheck, which one goroutine of the consumer runs for every partition
// that went idle meanwhile, to run steps 2 and 3 for it.
const (
	// markWaitingSQL sets the partition's waiting flag; Idle commits it
	// before it looks for events.
	markWaitingSQL = `UPDATE {schema}partition_counters SET waiting = true
WHERE topic_id = $1 AND partition_id = $2 AND NOT waiting`

	// waitAppendsCounterSQL waits for the append holding the topic's
	// counter row (scope 'topic', allocation 'counter'). Recheck commits
	// right after it, so that the share lock it takes keeps no append
	// waiting for longer than that.
	waitAppendsCounterSQL = `SELECT 1 FROM {schema}log_counter WHERE topic_id = $1 FOR SHARE`

	// waitAppendsAdvisorySQL waits for the append holding the topic's
	// advisory append lock (allocation 'sequence').
	waitAppendsAdvisorySQL = `SELECT pg_advisory_xact_lock_shared({schema}append_lock_key($1))`

	// idleCheckSQL returns the partition's highest offset beyond the
	// group's position in its layout $4, or NULL. %[1]s is the partition's
	// table.
	idleCheckSQL = `SELECT max(m.c_offset) FROM {schema}%[1]s m
JOIN {schema}consumer_offsets o ON o.group_id = $1 AND o.topic_id = $2 AND o.partition_id = $3
WHERE m.topic_id = $2 AND m.partition_id = $3 AND m.c_offset >= o.next_offset
  AND m.c_offset < ` + idleCut
)

// Idle runs steps 1 and 3 of the wake-up protocol for a worker of group
// that found nothing more to do in partition of topic, layout version
// layout, in one round trip: it sets the partition's waiting flag, commits,
// and returns the highest offset the group has to handle there, or -1 when
// there is none. Under scope 'partition' that is the whole protocol; under
// scope 'topic' the caller must Recheck the partition before it may rely
// on a notification.
func Idle(ctx context.Context, db Batcher, ps *PartitionSQL, group string, topic, partition, layout int) (int64, error) {
	var b pgx.Batch
	b.Queue("BEGIN")
	b.Queue(schema.SQL(ctx, markWaitingSQL), topic, partition)
	b.Queue("COMMIT")
	b.Queue(genericPlansSQL) // for the idle check, see genericPlansExpr
	b.Queue(schema.SQL(ctx, ps.idleCheck), group, topic, partition, layout)
	br := db.SendBatch(ctx, &b)
	defer br.Close()
	for range 4 {
		if _, err := br.Exec(); err != nil {
			return 0, fmt.Errorf("offsets: mark partition %d waiting: %w", partition, err)
		}
	}
	var max *int64
	if err := br.QueryRow().Scan(&max); err != nil {
		return 0, fmt.Errorf("offsets: idle check of partition %d: %w", partition, err)
	}
	if err := br.Close(); err != nil {
		return 0, fmt.Errorf("offsets: idle check of partition %d: %w", partition, err)
	}
	if max == nil {
		return -1, nil
	}
	return *max, nil
}

// Recheck runs steps 2 and 3 of the wake-up protocol under scope 'topic'
// for partitions of topic (their statements in sqls, in the same order)
// whose workers ran Idle, and found nothing, before Recheck was called: it
// waits for the append in flight on the topic, in a transaction that ends
// at once, and returns the partitions where the group has events of its
// layout (version layout) to handle, with their highest offset. One round
// trip; each partition is looked at through its own table, so that only
// the partitions rechecked are locked, and only for the look.
func Recheck(ctx context.Context, db Batcher, group string, topic int, partitions []int, sqls []*PartitionSQL, layout int) ([]Work, error) {
	var b pgx.Batch
	b.Queue("BEGIN")
	b.Queue(schema.SQL(ctx, waitAppendsCounterSQL), topic)
	b.Queue(schema.SQL(ctx, waitAppendsAdvisorySQL), topic)
	b.Queue("COMMIT")
	b.Queue(genericPlansSQL)
	for i, p := range partitions {
		b.Queue(schema.SQL(ctx, sqls[i].idleCheck), group, topic, p, layout)
	}
	br := db.SendBatch(ctx, &b)
	defer br.Close()
	for range 5 {
		if _, err := br.Exec(); err != nil {
			return nil, fmt.Errorf("offsets: wait for appends in flight: %w", err)
		}
	}
	var out []Work
	for _, p := range partitions {
		var max *int64
		if err := br.QueryRow().Scan(&max); err != nil {
			return nil, fmt.Errorf("offsets: recheck partition %d: %w", p, err)
		}
		if max != nil {
			out = append(out, Work{Partition: p, MaxOffset: *max})
		}
	}
	if err := br.Close(); err != nil {
		return nil, fmt.Errorf("offsets: recheck: %w", err)
	}
	return out, nil
}
