package store

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/pgevents/pgevents/schema"
)

// This file: a partition halted by the failure policy halt, and the
// operator's unhalt.
const (
	haltSQL = `INSERT INTO {schema}partition_halts (group_id, topic_id, partition_id, c_offset, reason)
VALUES ($1, $2, $3, $4, $5)
ON CONFLICT (group_id, topic_id, partition_id)
DO UPDATE SET c_offset = excluded.c_offset, reason = excluded.reason, halted_at = now()`

	haltsSQL = `SELECT partition_id, c_offset, reason FROM {schema}partition_halts WHERE group_id = $1 AND topic_id = $2`

	// unhaltSQL removes the partition's halt record and returns it, and,
	// when there was one, tells the topic's consumers at the commit
	// (notifyEligibleSQL): the halted worker tries the unit again within
	// milliseconds.
	unhaltSQL = `WITH d AS (
    DELETE FROM {schema}partition_halts WHERE group_id = $1 AND topic_id = $2 AND partition_id = $3
    RETURNING partition_id, c_offset, reason
)
SELECT d.partition_id, d.c_offset, d.reason,
       (SELECT count(pg_notify(c.channel, $2::integer || ':*')) FROM {schema}log_counter c WHERE c.topic_id = $2)
FROM d`
)

// Halt records that the group's partition stopped at offset, and why.
func Halt(ctx context.Context, q schema.DB, group string, topic, partition int, offset int64, reason string) error {
	if _, err := q.Exec(ctx, schema.SQL(ctx, haltSQL), group, topic, partition, offset, reason); err != nil {
		return fmt.Errorf("record halt: %w", err)
	}
	return nil
}

// HaltRecord says where and why a partition halted.
type HaltRecord struct {
	Partition int
	Offset    int64
	Reason    string
}

// Halts returns the group's halted partitions.
func Halts(ctx context.Context, q schema.DB, group string, topic int) ([]HaltRecord, error) {
	rows, err := q.Query(ctx, schema.SQL(ctx, haltsSQL), group, topic)
	if err != nil {
		return nil, fmt.Errorf("halts: %w", err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowToStructByPos[HaltRecord])
	if err != nil {
		return nil, fmt.Errorf("halts: %w", err)
	}
	return out, nil
}

// Unhalt removes the partition's halt record and returns it; nil when the
// partition was not halted. The group's consumers are told at the commit.
func Unhalt(ctx context.Context, q schema.DB, group string, topic, partition int) (*HaltRecord, error) {
	var h HaltRecord
	var notified int64
	err := q.QueryRow(ctx, schema.SQL(ctx, unhaltSQL), group, topic, partition).Scan(&h.Partition, &h.Offset, &h.Reason, &notified)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("remove halt: %w", err)
	}
	return &h, nil
}
