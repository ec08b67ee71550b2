package store

import (
	"context"
	"fmt"
	"time"

	"github.com/pgevents/pgevents/schema"
)

// This file: the reports of a partition whose batches keep failing
// (partition_failures, migration 0025), written by its worker on the
// failure path only and read by the status (metrics.ReadState).

// FailingReportEvery is how often, at most, a worker whose batches keep
// failing writes its report.
const FailingReportEvery = 2 * time.Second

// Failing is a worker's report of its partition's failed batches.
type Failing struct {
	Group, Replica  string
	Topic           int
	Partition       int
	Failures        int
	Since           time.Time
	Class, FailedIn string
	Error           string
}

const (
	// reportFailingSQL writes the report, and deletes the group's reports
	// of replicas no longer registered (ended while failing). Since is
	// kept from the first report of the spell.
	reportFailingSQL = `WITH gone AS (
    DELETE FROM {schema}partition_failures f
    WHERE f.group_id = $1 AND f.topic_id = $2 AND f.replica_id <> $4
      AND NOT EXISTS (SELECT 1 FROM {schema}consumer_replicas r
                      WHERE r.group_id = f.group_id AND r.topic_id = f.topic_id AND r.replica_id = f.replica_id)
)
INSERT INTO {schema}partition_failures AS f (group_id, topic_id, partition_id, replica_id, failures, since, class, failed_in, error)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)
ON CONFLICT (group_id, topic_id, partition_id, replica_id) DO UPDATE
SET failures = excluded.failures, class = excluded.class, failed_in = excluded.failed_in,
    error = excluded.error, reported_at = clock_timestamp()`

	// clearFailingSQL deletes the report once a batch committed.
	clearFailingSQL = `DELETE FROM {schema}partition_failures
WHERE group_id = $1 AND topic_id = $2 AND partition_id = $3 AND replica_id = $4`
)

// ReportFailing writes f.
func ReportFailing(ctx context.Context, db schema.DB, f Failing) error {
	if _, err := db.Exec(ctx, schema.SQL(ctx, reportFailingSQL), f.Group, f.Topic, f.Partition, f.Replica,
		f.Failures, f.Since, f.Class, f.FailedIn, f.Error); err != nil {
		return fmt.Errorf("report failing partition: %w", err)
	}
	return nil
}

// ClearFailing deletes the report of partition by replica.
func ClearFailing(ctx context.Context, db schema.DB, group string, topic, partition int, replica string) error {
	if _, err := db.Exec(ctx, schema.SQL(ctx, clearFailingSQL), group, topic, partition, replica); err != nil {
		return fmt.Errorf("clear failing partition: %w", err)
	}
	return nil
}
