package offsets

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// The wake-up protocol of a worker that goes idle (see the pgevents
// package's doc): appends notify a partition only while its waiting flag
// is set, and clear it when they do, so a worker that finds nothing more to
// do must, before it sleeps:
//
//  1. set the flag, and commit (markWaitingSQL); appends whose flag read
//     comes after that commit notify;
//  2. wait for every append in flight on the topic or partition to end
//     (waitAppends*SQL: the append locks, taken shared): an append that
//     read the flag before step 1 held its lock then, and still does, or
//     has committed;
//  3. look for events once more (idleCheckSQL): whatever such an append
//     committed is visible now.
//
// So no event waits for the poll period: it is either announced or found
// by step 3. Step 1 is a no-op when the flag is set already (by this
// worker or another group's); steps 2 and 3 run anyway, since the flag may
// have been set before appends that this worker has not seen yet.
const (
	// markWaitingSQL sets the partition's waiting flag (autocommit: it
	// must be visible before the wait).
	markWaitingSQL = `UPDATE partition_counters SET waiting = true
WHERE topic_id = $1 AND partition_id = $2 AND NOT waiting`

	// waitAppendsCounterSQL waits for the appends holding the topic's
	// counter row (scope 'topic', allocation 'counter').
	waitAppendsCounterSQL = `SELECT 1 FROM log_counter WHERE topic_id = $1 FOR SHARE`

	// waitAppendsAdvisorySQL waits for the appends holding the topic's
	// advisory append lock (allocation 'sequence').
	waitAppendsAdvisorySQL = `SELECT pg_advisory_xact_lock_shared(append_lock_key($1))`

	// waitAppendsPartitionSQL waits for the appends holding the partition's
	// counter row (scope 'partition').
	waitAppendsPartitionSQL = `SELECT 1 FROM partition_counters WHERE topic_id = $1 AND partition_id = $2 FOR SHARE`

	// idleCheckSQL returns the partition's highest offset beyond the
	// group's position in its layout $4, or NULL. %[1]s is the partition's
	// table.
	idleCheckSQL = `SELECT max(m.c_offset) FROM %[1]s m
JOIN consumer_offsets o ON o.group_id = $1 AND o.topic_id = $2 AND o.partition_id = $3
WHERE m.topic_id = $2 AND m.partition_id = $3 AND m.c_offset >= o.next_offset
  AND m.c_offset < ` + idleCut
)

// Idle runs the wake-up protocol of a worker of group that found nothing
// more to do in partition of topic, layout version layout: it sets the
// partition's waiting flag, waits for the appends in flight, and returns the
// highest offset the group has to handle there, or -1 when there is none
// and the worker may sleep until a notification.
func Idle(ctx context.Context, db Batcher, ps *PartitionSQL, group string, topic, partition, layout int) (int64, error) {
	var b pgx.Batch
	b.Queue(markWaitingSQL, topic, partition)
	br := db.SendBatch(ctx, &b)
	if err := br.Close(); err != nil {
		return 0, fmt.Errorf("offsets: mark partition %d waiting: %w", partition, err)
	}
	b = pgx.Batch{}
	b.Queue(genericPlansSQL) // for the idle check, see genericPlansExpr
	b.Queue(waitAppendsCounterSQL, topic)
	b.Queue(waitAppendsAdvisorySQL, topic)
	b.Queue(waitAppendsPartitionSQL, topic, partition)
	b.Queue(ps.idleCheck, group, topic, partition, layout)
	br = db.SendBatch(ctx, &b)
	defer br.Close()
	for range 4 {
		if _, err := br.Exec(); err != nil {
			return 0, fmt.Errorf("offsets: wait for appends in flight: %w", err)
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
