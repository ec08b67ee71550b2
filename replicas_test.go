package pgevents

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgevents/pgevents/internal/lease"
	"github.com/pgevents/pgevents/internal/pgtest"
	"github.com/pgevents/pgevents/schema"
)

// balanced reports whether the consumers hold every partition between
// them, each ⌊n/R⌋ or ⌈n/R⌉, without overlap, and the database agrees.
func balanced(t *testing.T, pool *pgxpool.Pool, n int, cs ...*Consumer) bool {
	t.Helper()
	seen := map[int]bool{}
	for _, c := range cs {
		held := c.Partitions()
		if len(held) < n/len(cs) || len(held) > (n+len(cs)-1)/len(cs) {
			return false
		}
		for _, p := range held {
			if seen[p] {
				return false
			}
			seen[p] = true
		}
	}
	if len(seen) != n {
		return false
	}
	live := queryInt(t, pool, `SELECT count(*) FROM partition_ownership WHERE live`)
	owners := queryInt(t, pool, `SELECT count(DISTINCT owner) FROM partition_ownership WHERE live`)
	return live == int64(n) && owners == int64(len(cs))
}

// TestReplicasShareAndRebalance: replicas in auto mode split the partitions
// evenly within seconds of a replica joining or leaving, and every event is
// handled exactly once in host order throughout.
func TestReplicasShareAndRebalance(t *testing.T) {
	t.Parallel()
	const n = 16
	pool := newTopic(t, n)
	mustExec(t, pool, handledTable)
	cfg := Config{TotalPartitions: n, BatchSize: 5, Handlers: recordingHandlers(), LeaseDuration: 600 * time.Millisecond}
	a := startConsumer(t, pool, cfg)
	b, stopB := startStoppableConsumer(t, pool, cfg)
	c := startConsumer(t, pool, cfg)
	pgtest.WaitFor(t, 5*time.Second, "3 replicas balanced", func() bool { return balanced(t, pool, n, a, b, c) })

	var total int64
	appendSome := func() {
		for i := range 40 {
			appendTx(t, pool, ev(fmt.Sprintf("h%d", i%23), "t", `{}`), ev(fmt.Sprintf("h%d", i%23), "t", `{}`))
			total += 2
		}
	}
	appendSome()
	heldA, heldC := a.Partitions(), c.Partitions()
	stopB() // leaves: its leases are released at once
	appendSome()
	pgtest.WaitFor(t, 5*time.Second, "2 replicas balanced", func() bool { return balanced(t, pool, n, a, c) })
	// Sticky: the survivors kept what they held and only took B's share.
	keeps(t, "a", heldA, a.Partitions())
	keeps(t, "c", heldC, c.Partitions())
	heldA, heldC = a.Partitions(), c.Partitions()
	d := startConsumer(t, pool, cfg) // joins: the others release their surplus
	appendSome()
	pgtest.WaitFor(t, 5*time.Second, "3 replicas balanced again", func() bool { return balanced(t, pool, n, a, c, d) })
	// The newcomer got only what the others released.
	keeps(t, "a", a.Partitions(), heldA)
	keeps(t, "c", c.Partitions(), heldC)
	waitHandled(t, pool, total, 20*time.Second)
	checkHandled(t, pool)
}

// keeps fails the test unless every partition of before is in after.
func keeps(t *testing.T, who string, before, after []int) {
	t.Helper()
	in := map[int]bool{}
	for _, p := range after {
		in[p] = true
	}
	for _, p := range before {
		if !in[p] {
			t.Fatalf("replica %s held %v, then %v: partition %d moved although its owner stayed live", who, before, after, p)
		}
	}
}

// TestStaticStandby: two consumers configured for the same partition: one
// holds it, the other waits; when the holder stops, the standby takes over.
func TestStaticStandby(t *testing.T) {
	t.Parallel()
	pool := newTopic(t, 2)
	mustExec(t, pool, handledTable)
	cfg := Config{TotalPartitions: 2, Partitions: []int{1}, Handlers: recordingHandlers()}
	first, stopFirst := startStoppableConsumer(t, pool, cfg)
	pgtest.WaitFor(t, 5*time.Second, "first holds partition 1", func() bool { return fmt.Sprint(first.Partitions()) == "[1]" })
	standby := startConsumer(t, pool, cfg)
	host := hostIn(t, pool, 2, 1)
	appendTx(t, pool, ev(host, "t", `{}`))
	waitHandled(t, pool, 1, 5*time.Second)
	if len(standby.Partitions()) != 0 {
		t.Fatalf("the standby holds %v while the first replica is live", standby.Partitions())
	}
	stopFirst()
	pgtest.WaitFor(t, 5*time.Second, "standby takes partition 1", func() bool { return fmt.Sprint(standby.Partitions()) == "[1]" })
	appendTx(t, pool, ev(host, "t", `{}`))
	waitHandled(t, pool, 2, 5*time.Second)
	if queryInt(t, pool, `SELECT count(*) FROM partition_leases WHERE partition_id = 0 AND owner <> ''`) != 0 {
		t.Fatal("a static replica of partition 1 took partition 0")
	}
}

// TestLostLeaseCannotCommit: a batch whose lease was taken over while it
// ran is ended by the takeover's fence (lease.Fence, what a replica that
// acquires an expired lease does first) and rolls back: its effects
// vanish, the position does not move, and the replica lets the partition
// go. (The commit does not check the lease again: a batch the fence could
// not end holds the position lock, so the new owner's claim waits for it
// and goes on from the position it committed, handling nothing twice.)
func TestLostLeaseCannotCommit(t *testing.T) {
	t.Parallel()
	pool := newTopic(t, 1)
	mustExec(t, pool, handledTable)
	inHandler := make(chan struct{})
	resume := make(chan struct{})
	record := SQLHandler("g", recordSQL)
	hs := &Handlers{}
	var first = true
	hs.HandleFunc("t", func(ctx context.Context, tx pgx.Tx, e *Event) error {
		if err := record.Handle(ctx, tx, e); err != nil {
			return err
		}
		if first {
			first = false
			close(inHandler)
			<-resume
		}
		return nil
	})
	c := startConsumer(t, pool, Config{TotalPartitions: 1, Handlers: hs})
	appendTx(t, pool, ev("h", "t", `{}`))
	<-inHandler
	// Another replica takes the lease over (as after an expiry), and
	// fences the batch in flight.
	mustExec(t, pool, `UPDATE partition_leases SET owner = 'usurper', epoch = epoch + 1`)
	n, err := lease.Fence(pgtest.Context(context.Background()), pool, "g", 1, 0, c.ReplicaID())
	close(resume)
	if err != nil || n != 1 {
		t.Fatalf("the takeover's fence ended %d batches (%v), want the one in flight", n, err)
	}
	pgtest.WaitFor(t, 5*time.Second, "the batch rolled back and the lease is dropped", func() bool {
		return len(c.Partitions()) == 0 || workerOf(c, 0).epoch.Load() == 0
	})
	if n := queryInt(t, pool, `SELECT count(*) FROM handled`); n != 0 {
		t.Fatalf("%d effects committed by a replica that lost its lease", n)
	}
	if n := queryInt(t, pool, `SELECT next_offset FROM consumer_offsets`); n != 1 {
		t.Fatalf("position moved to %d by a replica that lost its lease", n)
	}
}

// TestRepartitionWhileProducing: the topic goes from 8 to 12 partitions
// while producers append and two replicas consume: every event is handled
// exactly once, and each host's events in offset order across the change,
// although most hosts move to another partition.
func TestRepartitionWhileProducing(t *testing.T) {
	t.Parallel()
	pool := newTopic(t, 8)
	mustExec(t, pool, handledTable)
	cfg := Config{TotalPartitions: 8, BatchSize: 7, Handlers: recordingHandlers(), WaitPeriod: time.Second}
	startConsumer(t, pool, cfg)
	startConsumer(t, pool, cfg)

	ctx := context.Background()
	var (
		total atomic.Int64
		stop  atomic.Bool
		wg    sync.WaitGroup
	)
	defer stop.Store(true)
	for i := range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for k := 0; !stop.Load(); k++ {
				host := fmt.Sprintf("h%d", (i*31+k)%40)
				evs := []Event{ev(host, "t", `{}`), ev(host, "t", `{}`), ev(fmt.Sprintf("h%d", k%40), "t", `{}`)}
				if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
					_, err := Append(ctx, tx, evs...)
					return err
				}); err != nil {
					t.Error(err)
					return
				}
				total.Add(int64(len(evs)))
			}
		}()
	}
	pgtest.WaitFor(t, 10*time.Second, "600 events handled before the change", func() bool {
		return queryInt(t, pool, `SELECT count(*) FROM handled`) >= 600
	})
	if _, err := schema.Repartition(ctx, pool, 1, 12); err != nil {
		t.Fatal(err)
	}
	// An event is after the cut when it is at or after its partition's
	// first offset in layout 2 (the cut of either offset scope).
	const afterCut = `SELECT %s FROM handled h WHERE h.c_offset >= layout_start(1, 2, h.partition_id)`
	pgtest.WaitFor(t, 20*time.Second, "600 events handled after the cut", func() bool {
		return queryInt(t, pool, fmt.Sprintf(afterCut, "count(*)")) >= 600
	})
	stop.Store(true)
	wg.Wait()
	waitHandled(t, pool, total.Load(), 30*time.Second)
	checkHandled(t, pool)
	if n := queryInt(t, pool, fmt.Sprintf(afterCut, "count(DISTINCT h.partition_id)")); n != 12 {
		t.Fatalf("events after the cut were handled in %d partitions, want 12", n)
	}
	if n := queryInt(t, pool, `SELECT version FROM group_layouts WHERE group_id = 'g'`); n != 2 {
		t.Fatalf("group at layout %d, want 2", n)
	}
	// A consumer configured with the old count now refuses to start.
	c, err := NewConsumer(pool, Config{GroupID: "g", TotalPartitions: 8, Handlers: recordingHandlers(), Schema: pgtest.Schema()})
	if err != nil {
		t.Fatal(err)
	}
	var mm *PartitionMismatchError
	if err := c.Run(context.Background()); !errors.As(err, &mm) || mm.Recorded != 12 {
		t.Fatalf("a consumer configured for 8 partitions after the change: %v", err)
	}
}

// TestSequenceTopic: on a topic with the sequence allocation (offsets with
// gaps where appends rolled back), consumers handle every committed event
// exactly once, in host order, across a repartition, while concurrent
// producers hold their reservations open for a while and some roll back:
// an offset reserved but not committed yet is never skipped.
func TestSequenceTopic(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := newTopic(t, 4)
	mustExec(t, pool, handledTable)
	if err := schema.SetAllocation(ctx, pool, 1, schema.AllocationSequence); err != nil {
		t.Fatal(err)
	}
	cfg := Config{TotalPartitions: 4, BatchSize: 5, Handlers: recordingHandlers(), WaitPeriod: time.Second}
	startConsumer(t, pool, cfg)
	startConsumer(t, pool, cfg)
	var committed atomic.Int64
	appendSome := func(n int) {
		var wg sync.WaitGroup
		for p := range 6 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := range n / 6 {
					tx, err := pool.Begin(ctx)
					if err != nil {
						t.Error(err)
						return
					}
					h, h2 := fmt.Sprintf("h%d", (i+p)%11), fmt.Sprintf("h%d", (i+p+5)%11)
					if _, err := Append(ctx, tx, ev(h, "t", `{}`), ev(h2, "t", `{}`), ev(h, "t", `{}`)); err != nil {
						_ = tx.Rollback(ctx)
						t.Error(err)
						return
					}
					time.Sleep(time.Duration(i%3) * time.Millisecond) // the reservation stays in flight
					if (i+p)%4 == 3 {
						_ = tx.Rollback(ctx) // a gap in the offsets
						continue
					}
					if err := tx.Commit(ctx); err != nil {
						t.Error(err)
						return
					}
					committed.Add(3)
				}
			}()
		}
		wg.Wait()
	}
	appendSome(60)
	if _, err := schema.Repartition(ctx, pool, 1, 6); err != nil {
		t.Fatal(err)
	}
	appendSome(60)
	// The new partitions' tables come with the next maintenance pass (every
	// 10 s), and their workers' retries back off meanwhile.
	waitHandled(t, pool, committed.Load(), 60*time.Second)
	checkHandled(t, pool)
	if gaps := queryInt(t, pool, `SELECT max(c_offset) - count(*) FROM outbox_message_t`); gaps == 0 {
		t.Fatal("no gap in the offsets: the test did not exercise the sequence allocation")
	}
}

// TestConsumerTakesUpALostAcquisition: the statement that acquires a
// replica's leases commits, but its answer never reaches the replica (a
// deadline passed under load, a connection died). The database says the
// replica owns the partitions, so the replica must take them up: a replica
// that renewed them at every heartbeat without serving them would leave
// them to nobody, which TestFailureModel shows as a group stuck with every
// partition at epoch 0 (seed 1795521792761953940) and a partition nobody
// served (seed 1795521797056921243). The interleaving is pinned with a proxy that lets
// the acquisition through and drops its answer.
func TestConsumerTakesUpALostAcquisition(t *testing.T) {
	t.Parallel()
	pool := newTopic(t, 4)
	mustExec(t, pool, handledTable)
	proxied, proxy := pgtest.ProxiedPool(t, pool)
	lost := proxy.LoseAnswer("SKIP LOCKED")
	c := startConsumer(t, proxied, Config{TotalPartitions: 4, BatchSize: 5, Handlers: recordingHandlers(),
		WaitPeriod: 200 * time.Millisecond, LeaseDuration: 600 * time.Millisecond})
	select {
	case <-lost:
	case <-time.After(10 * time.Second):
		t.Fatal("the acquisition was not sent")
	}
	pgtest.WaitFor(t, 10*time.Second, "the acquisition committed", func() bool {
		return queryInt(t, pool, `SELECT count(*) FROM partition_leases WHERE group_id = 'g' AND owner = $1`, c.ReplicaID()) == 4
	})
	proxy.CloseAll()
	var total int64
	for i := range 10 {
		appendTx(t, pool, ev(fmt.Sprintf("h%d", i), "t", `{}`), ev(fmt.Sprintf("h%d", i+10), "t", `{}`))
		total += 2
	}
	waitHandled(t, pool, total, 15*time.Second)
	checkHandled(t, pool)
	if n := len(c.Partitions()); n != 4 {
		t.Fatalf("the consumer serves %d partitions, want 4", n)
	}
}
