package pgevents

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgevents/pgevents/internal/pgtest"
)

// TestFailingShowsAPartitionThatKeepsFailing: a partition whose batches
// keep failing is reported by Consumer.Failing (how many batches, since
// when, the class), and no longer once a batch commits; the other
// partition is never reported.
func TestFailingShowsAPartitionThatKeepsFailing(t *testing.T) {
	t.Parallel()
	pool := newTopic(t, 2)
	mustExec(t, pool, handledTable)
	var broken atomic.Bool
	broken.Store(true)
	hs := &Handlers{}
	record := SQLHandler("g", recordSQL)
	hs.HandleAll(record)
	hs.HandleFunc("flaky", func(ctx context.Context, tx pgx.Tx, ev *Event) error {
		if broken.Load() {
			return Retryable(errors.New("downstream unavailable"))
		}
		return record.Handle(ctx, tx, ev)
	})
	c := startConsumer(t, pool, Config{TotalPartitions: 2, Handlers: hs, RetryInitial: 10 * time.Millisecond, RetryMax: 50 * time.Millisecond})
	start := time.Now()
	appendTx(t, pool, ev("a", "flaky", `{}`))
	var got []FailingPartition
	pgtest.WaitFor(t, 10*time.Second, "a failing partition reported", func() bool {
		got = c.Failing()
		return len(got) == 1 && got[0].Failures >= 3
	})
	f := got[0]
	if f.Class != ClassTransient || f.Since.Before(start) || time.Since(f.Since) > 10*time.Second {
		t.Errorf("Failing() = %+v; want class transient, since the append", f)
	}
	if p := queryRowPartition(t, pool, "a"); p != f.Partition {
		t.Errorf("partition %d reported failing, but host a is in partition %d", f.Partition, p)
	}
	// The report for `consumer status`, written while it fails.
	pgtest.WaitFor(t, 10*time.Second, "the failing partition reported in partition_failures", func() bool {
		return queryInt(t, pool, `SELECT count(*) FROM partition_failures WHERE group_id = 'g' AND partition_id = $1
			AND replica_id = $2 AND class = 'transient' AND failed_in = 'handler' AND error LIKE '%downstream unavailable%'`,
			f.Partition, c.ReplicaID()) == 1
	})
	broken.Store(false)
	pgtest.WaitFor(t, 10*time.Second, "no failing partition once the batch commits", func() bool { return len(c.Failing()) == 0 })
	pgtest.WaitFor(t, 10*time.Second, "the report deleted by the commit", func() bool {
		return queryInt(t, pool, `SELECT count(*) FROM partition_failures`) == 0
	})
}

// queryRowPartition returns the partition of host's events.
func queryRowPartition(t *testing.T, db interface {
	QueryRow(context.Context, string, ...any) pgx.Row
}, host string) int {
	t.Helper()
	var p int
	if err := db.QueryRow(context.Background(), `SELECT partition_id FROM outbox_message_t WHERE host_id = $1 LIMIT 1`, host).Scan(&p); err != nil {
		t.Fatal(err)
	}
	return p
}
