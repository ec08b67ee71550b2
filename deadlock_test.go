package pgevents

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgevents/pgevents/internal/pgtest"
	"github.com/pgevents/pgevents/schema"
)

// TestAppendDeadlockAcrossPartitions: under offset scope 'partition' an
// Append call locks the partitions of its events until the transaction
// ends. Two transactions that each call Append twice, for hosts of two
// partitions in opposite orders, deadlock: PostgreSQL ends one of them with
// SQLSTATE 40P01, which Classify calls transient; once it has rolled back
// and run again, both transactions' events are in the log exactly once,
// with gapless offsets in each partition. The same appends made as one
// Append call per transaction never deadlock, even when a third
// transaction holds one of the partitions while both wait.
//
// The steps are ordered by waiting, through pg_blocking_pids, until each
// transaction waits for the one it must: nothing depends on timing.
func TestAppendDeadlockAcrossPartitions(t *testing.T) {
	t.Parallel()
	t.Run("two calls per transaction", func(t *testing.T) {
		t.Parallel()
		ctx := context.Background()
		pool, a, b := deadlockTopic(t)
		txA := beginOn(t, pool)
		txB := beginOn(t, pool)
		txA.mustAppend(t, a[0]...) // A holds partition 0
		txB.mustAppend(t, b[0]...) // B holds partition 1
		resA := txA.appendAsync(a[1]...)
		waitBlockedBy(t, pool, txA.pid, txB.pid) // A waits for B's partition 1
		resB := txB.appendAsync(b[1]...)
		// Each now waits for the other. PostgreSQL's deadlock detector
		// (deadlock_timeout, 1 s by default) ends one of them; the other's
		// append then completes.
		errA, errB := receive(t, "A", resA), receive(t, "B", resB)
		loser, winner, loserEvs, lost := txA, txB, a, errA
		if errA == nil {
			loser, winner, loserEvs, lost = txB, txA, b, errB
		}
		if (errA == nil) == (errB == nil) {
			t.Fatalf("the second appends returned %v (A) and %v (B): want one deadlock error and one success", errA, errB)
		}
		var pgErr *pgconn.PgError
		if !errors.As(lost, &pgErr) || pgErr.Code != "40P01" {
			t.Fatalf("the append that failed got %v, want a *pgconn.PgError with SQLSTATE 40P01 (deadlock_detected)", lost)
		}
		if c := Classify(lost); c != ClassTransient {
			t.Fatalf("Classify(%v) = %v, want %v: a producer retries a deadlock", lost, c, ClassTransient)
		}
		t.Logf("transaction %s lost: %v", map[bool]string{true: "A", false: "B"}[loser == txA], lost)
		if err := loser.Rollback(ctx); err != nil {
			t.Fatal(err)
		}
		if err := winner.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		// The producer retries its whole transaction, as it would for any
		// transient failure.
		if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			for _, evs := range loserEvs {
				if _, err := Append(ctx, tx, evs...); err != nil {
					return err
				}
			}
			return nil
		}); err != nil {
			t.Fatalf("retry of the transaction that lost: %v", err)
		}
		checkDeadlockLog(t, pool)
	})

	t.Run("one call per transaction", func(t *testing.T) {
		t.Parallel()
		ctx := context.Background()
		pool, a, b := deadlockTopic(t)
		// C holds partition 1 while A and B, each with one Append call for
		// both partitions, queue up. B lists its partition-1 events first
		// and starts first; A lists its partition-0 events first. Locked in
		// the order of the events, B would wait for partition 1 holding
		// nothing, A would take partition 0 and wait behind B, and once C
		// commits B would take partition 1 and wait for A's partition 0: a
		// deadlock. Locked in ascending partition order, B takes partition
		// 0 first and A waits for it, holding nothing.
		txC := beginOn(t, pool)
		txC.mustAppend(t, ev(b[0][0].HostID, "t", `{"tx":"C","i":1}`))
		txB := beginOn(t, pool)
		resB := txB.appendAsync(append(append([]Event{}, b[0]...), b[1]...)...)
		waitBlockedBy(t, pool, txB.pid, txC.pid)
		txA := beginOn(t, pool)
		resA := txA.appendAsync(append(append([]Event{}, a[0]...), a[1]...)...)
		waitBlocked(t, pool, txA.pid)
		if err := txC.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		for _, w := range []struct {
			name string
			tx   *producerTx
			res  <-chan error
		}{{"B", txB, resB}, {"A", txA, resA}} {
			if err := receive(t, w.name, w.res); err != nil {
				t.Fatalf("transaction %s, one Append call: %v", w.name, err)
			}
			if err := w.tx.Commit(ctx); err != nil {
				t.Fatalf("commit %s: %v", w.name, err)
			}
		}
		checkDeadlockLog(t, pool, "C1")
	})
}

// deadlockTopic creates topic 1 with 2 partitions in scope 'partition' and
// returns the appends of transactions A (partition 0, then partition 1) and
// B (partition 1, then partition 0), each event's payload naming its
// transaction and its number.
func deadlockTopic(t *testing.T) (pool *pgxpool.Pool, a, b [][]Event) {
	t.Helper()
	pool = pgtest.TopicPoolSpec(t, schema.TopicSpec{ID: 1, Partitions: 2, Scope: schema.ScopePartition})
	h0, h1 := hostIn(t, pool, 2, 0), hostIn(t, pool, 2, 1)
	e := func(host, tx string, i int) Event {
		return ev(host, "t", fmt.Sprintf(`{"tx":%q,"i":%d}`, tx, i))
	}
	a = [][]Event{{e(h0, "A", 1), e(h0, "A", 2)}, {e(h1, "A", 3)}}
	b = [][]Event{{e(h1, "B", 1)}, {e(h0, "B", 2), e(h0, "B", 3)}}
	return pool, a, b
}

// checkDeadlockLog fails the test unless the log holds A1 to A3 and B1 to B3
// (see deadlockTopic) and the extra events named, each exactly once, with
// offsets 1 to n in each partition, and each transaction's events of a
// partition contiguous.
func checkDeadlockLog(t *testing.T, pool *pgxpool.Pool, extra ...string) {
	t.Helper()
	rows, err := pool.Query(context.Background(), `SELECT payload->>'tx' || (payload->>'i'), count(*)
		FROM outbox_message_t GROUP BY 1 ORDER BY 1`)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]int64{}
	var k string
	var n int64
	if _, err := pgx.ForEachRow(rows, []any{&k, &n}, func() error { got[k] = n; return nil }); err != nil {
		t.Fatal(err)
	}
	want := append([]string{"A1", "A2", "A3", "B1", "B2", "B3"}, extra...)
	for _, w := range want {
		if got[w] != 1 {
			t.Errorf("event %s is in the log %d times, want once", w, got[w])
		}
	}
	if len(got) != len(want) {
		t.Errorf("log holds %v, want exactly %v once each", got, want)
	}
	if gaps := queryInt(t, pool, `SELECT count(*) FROM (SELECT partition_id FROM outbox_message_t
		GROUP BY 1 HAVING min(c_offset) <> 1 OR max(c_offset) <> count(*)) g`); gaps != 0 {
		t.Errorf("%d partitions whose offsets are not 1 to n", gaps)
	}
	if split := queryInt(t, pool, `SELECT count(*) FROM (SELECT transaction_id, partition_id FROM outbox_message_t
		GROUP BY 1, 2 HAVING max(c_offset) - min(c_offset) + 1 <> count(*)) s`); split != 0 {
		t.Errorf("%d transactions whose events of a partition are not contiguous", split)
	}
}

// producerTx is a producer's transaction on a connection of its own.
type producerTx struct {
	pgx.Tx
	pid    uint32 // the connection's backend
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup // appends in flight on other goroutines
}

// beginOn begins a transaction on a connection of pool. When the test
// ends, appends still in flight are cancelled and waited for, and the
// transaction is rolled back if it is still open.
func beginOn(t *testing.T, pool *pgxpool.Pool) *producerTx {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	tx, err := pool.Begin(ctx)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	p := &producerTx{Tx: tx, pid: tx.Conn().PgConn().PID(), ctx: ctx, cancel: cancel}
	t.Cleanup(func() {
		cancel()
		p.wg.Wait()
		_ = tx.Rollback(context.Background())
	})
	return p
}

// mustAppend appends evs and fails the test on error.
func (p *producerTx) mustAppend(t *testing.T, evs ...Event) {
	t.Helper()
	if _, err := Append(p.ctx, p.Tx, evs...); err != nil {
		t.Fatal(err)
	}
}

// appendAsync appends evs on another goroutine; the channel receives
// Append's error.
func (p *producerTx) appendAsync(evs ...Event) <-chan error {
	res := make(chan error, 1)
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		_, err := Append(p.ctx, p.Tx, evs...)
		res <- err
	}()
	return res
}

// receive returns what an append on another goroutine returned, and fails
// the test if that takes more than 30 s.
func receive(t *testing.T, name string, res <-chan error) error {
	t.Helper()
	select {
	case err := <-res:
		return err
	case <-time.After(30 * time.Second):
		t.Fatalf("transaction %s's append did not return within 30 s", name)
		return nil
	}
}

// waitBlockedBy waits until the backend waiter waits for a lock that
// holder holds (or waits for ahead of it).
func waitBlockedBy(t *testing.T, pool *pgxpool.Pool, waiter, holder uint32) {
	t.Helper()
	pgtest.WaitFor(t, 10*time.Second, fmt.Sprintf("backend %d waits for backend %d", waiter, holder), func() bool {
		return queryInt(t, pool, `SELECT count(*) FROM unnest(pg_blocking_pids($1)) AS b(pid) WHERE pid = $2`,
			int32(waiter), int32(holder)) == 1
	})
}

// waitBlocked waits until the backend waiter waits for a lock.
func waitBlocked(t *testing.T, pool *pgxpool.Pool, waiter uint32) {
	t.Helper()
	pgtest.WaitFor(t, 10*time.Second, fmt.Sprintf("backend %d waits for a lock", waiter), func() bool {
		return queryInt(t, pool, `SELECT cardinality(pg_blocking_pids($1))`, int32(waiter)) > 0
	})
}
