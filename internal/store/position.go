package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgevents/pgevents/schema"
)

// This file: a group's position in a partition, the data path's commit
// step: created (Init), found behind the log (Pending, for the poll), read,
// locked, and moved past a batch with its COMMIT (CommitBatch).
const (
	// initSQL creates a group's positions for the partitions of its layout
	// that have none (a group from before subscriptions): at the partition's
	// first offset in the layout. An existing position is never moved: each
	// partition's position lock is taken first, so that a batch of another
	// replica that commits meanwhile is seen, not overwritten.
	initSQL = `SELECT {schema}init_positions($1, $2, $3::integer[])`

	// pendingSQL finds, without locking anything, the partitions among $3
	// whose log holds an offset at or above the group's next_offset (and
	// below the end of the partition in the group's layout $4), and the
	// highest such offset: a cheap question asked before taking a lock.
	pendingSQL = `SELECT u.p, o.next_offset, h.max_offset, clock_timestamp()
FROM unnest($3::integer[]) AS u(p)
CROSS JOIN LATERAL (
    -- The position: the newest row, from the index's end (not the
    -- consumer_offsets view, which reads every row an open snapshot keeps).
    SELECT o.next_offset FROM {schema}consumer_positions o
    WHERE o.group_id = $1 AND o.topic_id = $2 AND o.partition_id = u.p
    ORDER BY o.seq DESC LIMIT 1
) o
CROSS JOIN LATERAL (
    SELECT max(m.c_offset) AS max_offset
    FROM {schema}outbox_message_t m
    WHERE m.topic_id = $2 AND m.partition_id = u.p
      AND m.c_offset < ` + pendingCut + `
) h
WHERE h.max_offset >= o.next_offset
UNION ALL
SELECT -1, 0, 0, clock_timestamp()`

	// commitSQL moves the group's position past the batch, in the batch's
	// transaction (invariant 3), under the position lock the claim took:
	// CommitBatch sends it with COMMIT in one round trip (and the removal
	// of the partition's halt record before it, when asked). The lease is
	// not checked again: see claimSQL and migration 0021.
	commitSQL = `INSERT INTO {schema}consumer_positions (group_id, topic_id, partition_id, next_offset) VALUES ($1, $2, $3, $4)`

	// lockPositionSQL takes the group's position lock of the partition for
	// the rest of the transaction, as a batch's claim does, for the other
	// writers of a position (the dead-letter admin); the statements that
	// read under it come after it: a statement's snapshot is taken when it
	// starts.
	lockPositionSQL = `SELECT {schema}lock_position($1, $2, $3)`

	// positionSQL reads a group's position in a partition.
	positionSQL = `SELECT ` + positionExpr

	// initLeasesSQL creates the free lease rows of the group's partitions.
	initLeasesSQL = `INSERT INTO {schema}partition_leases (group_id, topic_id, partition_id)
SELECT $1, $2, p FROM unnest($3::integer[]) AS p
ON CONFLICT (group_id, topic_id, partition_id) DO NOTHING`
)

// Init creates the group's positions for partitions of topic that it has
// none for yet, at their first offset in the group's layout (see initSQL;
// the group is given a layout first if it has none, see InitGroupLayout),
// and their free lease rows.
func Init(ctx context.Context, q schema.DB, group string, topic int, partitions []int) error {
	if err := InitGroupLayout(ctx, q, group, topic); err != nil {
		return err
	}
	if _, err := q.Exec(ctx, schema.SQL(ctx, initSQL), group, topic, partitions); err != nil {
		return fmt.Errorf("init group %q: %w", group, err)
	}
	if _, err := q.Exec(ctx, schema.SQL(ctx, initLeasesSQL), group, topic, partitions); err != nil {
		return fmt.Errorf("init leases of group %q: %w", group, err)
	}
	return nil
}

// Work says that a partition has events at or after the group's position.
type Work struct {
	// Partition is the partition with work.
	Partition int
	// NextOffset is the group's position in it.
	NextOffset int64
	// MaxOffset is the highest offset in it, at least NextOffset.
	MaxOffset int64
}

// Pending returns the partitions among partitions where the group has events
// of its layout (version layout) to handle, without taking any lock, and the
// database clock when it answered.
// The statement runs on its generic plan (genericPlansSQL), planned once per
// connection: a custom plan would plan it, over every segment of every
// partition, at every poll.
func Pending(ctx context.Context, db schema.DB, group string, topic int, partitions []int, layout int) ([]Work, time.Time, error) {
	var b pgx.Batch
	b.Queue(genericPlansSQL)
	b.Queue(schema.SQL(ctx, pendingSQL), group, topic, partitions, layout)
	br := db.SendBatch(ctx, &b)
	defer br.Close()
	if _, err := br.Exec(); err != nil {
		return nil, time.Time{}, fmt.Errorf("pending: %w", err)
	}
	rows, err := br.Query()
	if err != nil {
		return nil, time.Time{}, fmt.Errorf("pending: %w", err)
	}
	out, now, err := scanWork(rows)
	if err != nil {
		return nil, now, fmt.Errorf("pending: %w", err)
	}
	return out, now, nil
}

// scanWork reads the rows of pendingSQL: the partitions with work, and the
// database clock.
func scanWork(rows pgx.Rows) ([]Work, time.Time, error) {
	defer rows.Close()
	var (
		out []Work
		now time.Time
	)
	for rows.Next() {
		var w Work
		if err := rows.Scan(&w.Partition, &w.NextOffset, &w.MaxOffset, &now); err != nil {
			return nil, now, err
		}
		if w.Partition >= 0 {
			out = append(out, w)
		}
	}
	return out, now, rows.Err()
}

// Position returns the group's next offset in a partition, and false when
// the group has no position there.
func Position(ctx context.Context, q schema.DB, group string, topic, partition int) (int64, bool, error) {
	var next int64
	err := q.QueryRow(ctx, schema.SQL(ctx, positionSQL), group, topic, partition).Scan(&next)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, fmt.Errorf("position: %w", err)
	}
	return next, true, nil
}

// ErrNoPosition is returned by LockPosition (and a claim) when the group has
// no position in the partition (Init was not run).
var ErrNoPosition = errors.New("no position for the partition (group not initialised)")

// CommitBatch sets the group's position in the partition to next and
// commits tx, in one round trip, under the position lock the claim took;
// unhalt also clears the partition's halt record (a statement more, in the
// same round trip). The lease is not checked again (see commitSQL). Once
// CommitBatch returned nil, tx is committed although the pgx.Tx does not
// know it: do not call its Commit or Rollback. On an error tx is aborted
// or gone: the caller rolls it back.
func CommitBatch(ctx context.Context, tx pgx.Tx, group string, topic, partition int, next int64, unhalt bool) error {
	var b pgx.Batch
	if unhalt {
		b.Queue(schema.SQL(ctx, unhaltSQL), group, topic, partition)
	}
	b.Queue(schema.SQL(ctx, commitSQL), group, topic, partition, next)
	b.Queue("COMMIT")
	br := tx.Conn().SendBatch(ctx, &b)
	var err error
	for range b.Len() - 1 {
		if _, err = br.Exec(); err != nil {
			break
		}
	}
	if err == nil {
		var tag pgconn.CommandTag
		tag, err = br.Exec()
		if err == nil && tag.String() != "COMMIT" {
			err = fmt.Errorf("the transaction rolled back (%s)", tag)
		}
	}
	if cerr := br.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("commit: %w", err)
	}
	return nil
}

// LockPosition locks the group's position in a partition for the rest of
// tx, as a worker's claim does, and returns it.
func LockPosition(ctx context.Context, tx pgx.Tx, group string, topic, partition int) (int64, error) {
	if _, err := tx.Exec(ctx, schema.SQL(ctx, lockPositionSQL), group, topic, partition); err != nil {
		return 0, fmt.Errorf("lock position: %w", err)
	}
	var next *int64
	if err := tx.QueryRow(ctx, schema.SQL(ctx, positionSQL), group, topic, partition).Scan(&next); err != nil {
		return 0, fmt.Errorf("lock position: %w", err)
	}
	if next == nil {
		return 0, ErrNoPosition
	}
	return *next, nil
}
