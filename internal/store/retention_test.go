package store

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgevents/pgevents/internal/pgtest"
)

// retentionSetup returns a pool on a topic of 2 partitions with segments
// of 1,000 offsets, 2,500 events old enough for retention, a group "back"
// at the start that is DEAD and a group "live" past everything.
func retentionSetup(t *testing.T) (context.Context, *pgxpool.Pool) {
	t.Helper()
	ctx, url := setup(t, 2)
	pool := pgtest.Pool(t, url)
	pgtest.ResizeSegments(t, pool, 1, 1000)
	for _, q := range []string{
		`UPDATE topic_retention SET retention = '1 millisecond'`,
		`SELECT append_events(1, (SELECT jsonb_agg(jsonb_build_object('host_id', 'h' || (i % 7), 'event_type', 't'))
			FROM generate_series(1, 2500) i))`,
		// What was appended, to account for every event after retention.
		`CREATE TABLE appended AS SELECT c_offset, partition_id FROM outbox_message_t`,
	} {
		if _, err := pool.Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	earliest := Start{Kind: "earliest"}
	latest := Start{Kind: "latest"}
	for _, g := range []struct {
		name  string
		start Start
	}{{"back", earliest}, {"live", latest}} {
		if _, _, err := Subscribe(ctx, pool, g.name, 1, g.start, time.Minute); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := pool.Exec(ctx, `UPDATE subscriptions SET state = 'DEAD' WHERE group_id = 'back'`); err != nil {
		t.Fatal(err)
	}
	time.Sleep(5 * time.Millisecond) // older than the 1 ms retention
	return ctx, pool
}

// TestRetentionSeesAGroupThatCameBack: a DEAD group
// whose replica returns while a segment is being decided holds the
// watermark again, and the segment stays.
func TestRetentionSeesAGroupThatCameBack(t *testing.T) {
	ctx, pool := retentionSetup(t)
	var once sync.Once
	testHookBeforeDropLock = func() {
		once.Do(func() {
			if _, err := Heartbeat(ctx, pool, "back", 1); err != nil {
				t.Error(err)
			}
		})
	}
	defer func() { testHookBeforeDropLock = nil }()
	res, err := ApplyRetention(ctx, pool, 1)
	if err != nil {
		t.Fatal(err)
	}
	var rows, skips int64
	if err := pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM outbox_message_t), (SELECT count(*) FROM retention_skips)`).Scan(&rows, &skips); err != nil {
		t.Fatal(err)
	}
	if len(res.Removed) != 0 || rows != 2500 || skips != 0 {
		t.Fatalf("removed %v (%d events left, %d skips) although group back is ACTIVE at offset 1; blocked: %q",
			res.Removed, rows, skips, res.Blocked)
	}
}

// TestRetentionCountsEveryGroupBehind: skips are
// recorded for every group whose position is below a dropped segment's
// end, whatever its state; a group placed at "earliest" while segments go
// starts after them, or is told.
func TestRetentionCountsEveryGroupBehind(t *testing.T) {
	ctx, pool := retentionSetup(t)
	// Under max_retention the cap removes segments whatever the groups: an
	// ACTIVE group behind them loses events too, and must be told.
	if _, err := pool.Exec(ctx, `UPDATE subscriptions SET state = 'ACTIVE' WHERE group_id = 'back';
		UPDATE topic_retention SET retention = '1 day', max_retention = '1 millisecond'`); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var once sync.Once
	earliest := Start{Kind: "earliest"}
	testHookBeforeDropLock = func() {
		once.Do(func() {
			// A batch of group back commits between the first count and
			// the lock: the count must be made again.
			if _, err := pool.Exec(ctx, `UPDATE consumer_offsets SET next_offset = next_offset + 100
				WHERE group_id = 'back' AND partition_id = 0`); err != nil {
				t.Error(err)
			}
			wg.Add(1)
			go func() { // placed while the first segment is being dropped
				defer wg.Done()
				if _, _, err := Subscribe(ctx, pool, "new", 1, earliest, time.Minute); err != nil {
					t.Error(err)
				}
			}()
			time.Sleep(50 * time.Millisecond) // let it reach its first statement
		})
	}
	defer func() { testHookBeforeDropLock = nil }()
	res, err := ApplyRetention(ctx, pool, 1)
	if err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	for pass := 0; len(res.Blocked) > 0 && pass < 5; pass++ {
		// A partition whose lock the racing subscription held when the
		// drop tried it (NOWAIT) is left to the next pass, as maintenance
		// runs it.
		more, err := ApplyRetention(ctx, pool, 1)
		if err != nil {
			t.Fatal(err)
		}
		res.Removed, res.Blocked = append(res.Removed, more.Removed...), more.Blocked
	}
	if len(res.Removed) != 4 {
		t.Fatalf("removed %+v, want the two full segments of each partition; blocked: %q", res.Removed, res.Blocked)
	}
	// Every group: what it has not handled is either still in the log or
	// counted as skipped, exactly.
	for _, g := range []string{"back", "live", "new"} {
		var retained, skipped int64
		err := pool.QueryRow(ctx, `SELECT
			(SELECT count(*) FROM outbox_message_t m JOIN consumer_offsets o ON o.partition_id = m.partition_id
			  WHERE o.group_id = $1 AND m.c_offset >= o.next_offset),
			(SELECT coalesce(sum(skipped), 0) FROM retention_skips WHERE group_id = $1)`, g).Scan(&retained, &skipped)
		if err != nil {
			t.Fatal(err)
		}
		var unhandled int64 // events at or after the group's position in their partition
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM appended a
			JOIN consumer_offsets o ON o.group_id = $1 AND o.partition_id = a.partition_id
			WHERE a.c_offset >= o.next_offset`, g).Scan(&unhandled); err != nil {
			t.Fatal(err)
		}
		if retained+skipped != unhandled {
			t.Errorf("group %s: %d retained + %d skipped, want the %d events at or after its position", g, retained, skipped, unhandled)
		}
	}
}

// TestStartWhileAnAppendCommits: a group placed at "earliest" on an empty
// sequence topic while an append is in flight waits for it, and starts at
// its first event, not after it (found by TestFailureModel: the start was
// resolved in one statement, whose snapshot predated the append's commit).
func TestStartWhileAnAppendCommits(t *testing.T) {
	t.Parallel()
	ctx, url := setup(t, 2)
	pool := pgtest.Pool(t, url)
	if _, err := pool.Exec(ctx, `SELECT set_offset_allocation(1, 'sequence')`); err != nil {
		t.Fatal(err)
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck
	if _, err := tx.Exec(ctx, `SELECT append_events(1, '[{"host_id":"a","event_type":"t"},{"host_id":"b","event_type":"t"}]')`); err != nil {
		t.Fatal(err)
	}
	earliest := Start{Kind: "earliest"}
	done := make(chan error, 1)
	go func() {
		_, _, err := Subscribe(ctx, pool, "g", 1, earliest, time.Minute)
		done <- err
	}()
	// Subscribe waits for the append in flight.
	pgtest.WaitFor(t, 5*time.Second, "the subscriber waiting for the append lock", func() bool {
		var n int
		_ = pool.QueryRow(ctx, `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted`).Scan(&n)
		return n > 0
	})
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	var skipped, placed int64
	if err := pool.QueryRow(ctx, `SELECT
		(SELECT count(*) FROM outbox_message_t m JOIN consumer_offsets o ON o.partition_id = m.partition_id
		  WHERE o.group_id = 'g' AND m.c_offset < o.next_offset),
		(SELECT count(*) FROM consumer_offsets WHERE group_id = 'g')`).Scan(&skipped, &placed); err != nil {
		t.Fatal(err)
	}
	if placed != 2 || skipped != 0 {
		t.Fatalf("%d positions, %d events below them: the events of the append that committed meanwhile would be skipped", placed, skipped)
	}
}
