package pgevents

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgevents/pgevents/internal/pgtest"
	"github.com/pgevents/pgevents/schema"
)

// TestNoEventWaitsForThePoll stresses the wake-up protocol: appends notify
// only partitions whose worker may be waiting, so the race between an
// append that read "busy" and a worker that goes idle must be closed by the
// worker. With a poll period of an hour, producers append in bursts with
// random pauses (so that workers keep going idle while appends are in
// flight), and every event must be handled promptly: one that missed its
// wake-up would wait for the poll, an hour. It runs in each offset mode,
// with two replicas of the group.
func TestNoEventWaitsForThePoll(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{schema.AllocationCounter, schema.AllocationSequence, schema.ScopePartition} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			scope := schema.ScopeTopic
			if mode == schema.ScopePartition {
				scope = schema.ScopePartition
			}
			pool := pgtest.TopicPoolSpec(t, schema.TopicSpec{ID: 1, Partitions: 4, Scope: scope})
			if mode == schema.AllocationSequence {
				if err := schema.SetAllocation(ctx, pool, 1, mode); err != nil {
					t.Fatal(err)
				}
			}
			mustExec(t, pool, handledTable)
			mustExec(t, pool, `ALTER TABLE handled ADD COLUMN handled_at timestamptz NOT NULL DEFAULT clock_timestamp(),
				ADD COLUMN appended_at timestamptz`)
			hs := &Handlers{}
			hs.HandleAll(SQLHandler("g", `INSERT INTO handled (c_offset, host_id, partition_id, transaction_id, appended_at)
				VALUES (@c_offset, @host_id, @partition_id, @transaction_id, @created_at)`))
			cfg := Config{TotalPartitions: 4, BatchSize: 5, WaitPeriod: time.Hour, Handlers: hs}
			c1 := startConsumer(t, pool, cfg)
			c2 := startConsumer(t, pool, cfg)
			pgtest.WaitFor(t, 10*time.Second, "the replicas share the partitions", func() bool {
				return len(c1.Partitions())+len(c2.Partitions()) == 4
			})
			seed := uint64(time.Now().UnixNano())
			t.Logf("seed %d", seed)
			var total atomic.Int64
			rngs := make([]*rand.Rand, 4)
			for p := range rngs {
				rngs[p] = rand.New(rand.NewPCG(seed, uint64(p)))
			}
			// Bursts, each waited for: an event missed at the end of a
			// burst would wait for the poll, and the burst for it.
			for burst := range 15 {
				var wg sync.WaitGroup
				for p := range 4 {
					wg.Add(1)
					go func() {
						defer wg.Done()
						r := rngs[p]
						for range 10 {
							n := 1 + r.IntN(3)
							evs := make([]Event, n)
							for i := range evs {
								evs[i] = ev(fmt.Sprintf("h%d", r.IntN(20)), "t", `{}`)
							}
							// A third of the transactions stay open a while
							// after their append: workers go idle while the
							// append, which found their flag clear, is in flight.
							hold := time.Duration(0)
							if r.IntN(3) == 0 {
								hold = time.Duration(r.IntN(3000)) * time.Microsecond
							}
							if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
								_, err := Append(ctx, tx, evs...)
								time.Sleep(hold)
								return err
							}); err != nil {
								t.Error(err)
								return
							}
							total.Add(int64(n))
							// Pauses about as long as a batch: workers go idle
							// while others append.
							time.Sleep(time.Duration(r.IntN(3000)) * time.Microsecond)
						}
					}()
				}
				wg.Wait()
				if t.Failed() {
					return
				}
				t.Logf("burst %d appended, %d events so far", burst, total.Load())
				waitHandled(t, pool, total.Load(), 20*time.Second) // else a wake-up was missed
			}
			checkHandled(t, pool)
			var worst float64
			if err := pool.QueryRow(ctx, `SELECT extract(epoch FROM max(handled_at - appended_at)) FROM handled`).Scan(&worst); err != nil {
				t.Fatal(err)
			}
			t.Logf("%d events, slowest handled %.0f ms after its append", total.Load(), worst*1000)
			if worst > 10 {
				t.Fatalf("an event waited %.1f s: a wake-up was missed (seed %d)", worst, seed)
			}
		})
	}
}

// sleepers returns how many sessions sleep on partition p of topic 1: hold
// its sleep key shared.
func sleepers(t *testing.T, pool *pgxpool.Pool, p int) int64 {
	t.Helper()
	return heldKey(t, pool, "sleep", fmt.Sprintf("1/%d", p), "ShareLock")
}

// TestSleepWaitsForAppendsInFlight plays the race the wake-up protocol
// closes, step by step: an append finds nobody asleep on its partition (it
// takes the partition's sleep key and holds it to commit, and sends no
// notification), and commits only after the consumer wanted to go to
// sleep there. The consumer cannot take the key until that append
// commits, so it stays awake, reading the partition's tail, and finds the
// event: it does not wait for the poll (an hour here).
func TestSleepWaitsForAppendsInFlight(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{schema.AllocationCounter, schema.AllocationSequence, schema.ScopePartition} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			scope := schema.ScopeTopic
			if mode == schema.ScopePartition {
				scope = schema.ScopePartition
			}
			pool := pgtest.TopicPoolSpec(t, schema.TopicSpec{ID: 1, Partitions: 1, Scope: scope})
			if mode == schema.AllocationSequence {
				if err := schema.SetAllocation(ctx, pool, 1, mode); err != nil {
					t.Fatal(err)
				}
			}
			mustExec(t, pool, handledTable)
			startConsumer(t, pool, Config{TotalPartitions: 1, WaitPeriod: time.Hour, Handlers: recordingHandlers()})
			pgtest.WaitFor(t, 10*time.Second, "the consumer asleep on the idle partition", func() bool { return sleepers(t, pool, 0) == 1 })
			var tx pgx.Tx
			for n := int64(1); ; n++ {
				// The consumer wakes for this one (a notification), handles
				// it, and, the partition quiet, wants to sleep again.
				appendTx(t, pool, ev("a", "t", `{}`))
				waitHandled(t, pool, 2*n-1, 10*time.Second)
				// Awake for a quiet period (50 ms and more) before it sleeps
				// again: a poll on a loaded machine can miss that window,
				// and then the append below finds it asleep and the loop
				// plays again.
				for until := time.Now().Add(time.Second); sleepers(t, pool, 0) != 0 && time.Now().Before(until); {
					time.Sleep(time.Millisecond)
				}
				// An append finds nobody asleep, and stays in flight longer
				// than the consumer's quiet period.
				var err error
				if tx, err = pool.Begin(ctx); err != nil {
					t.Fatal(err)
				}
				defer tx.Rollback(ctx) //nolint:errcheck
				if _, err := Append(ctx, tx, ev("a", "t", `{}`)); err != nil {
					t.Fatal(err)
				}
				if heldKey(t, pool, "sleep", "1/0", "ExclusiveLock") == 1 {
					break
				}
				// On a slow machine the consumer went back to sleep before
				// the append looked (which then notified it): not the race
				// played here. Again.
				t.Logf("the consumer fell asleep before the append %d looked; again", n)
				if err := tx.Commit(ctx); err != nil {
					t.Fatal(err)
				}
				waitHandled(t, pool, 2*n, 10*time.Second)
				if n == 5 {
					t.Fatal("the consumer fell asleep before the append looked, 5 times")
				}
			}
			deadline := time.Now().Add(3 * quietMin)
			for time.Now().Before(deadline) {
				if n := sleepers(t, pool, 0); n != 0 {
					t.Fatal("the consumer went to sleep while an append that notifies nobody was in flight")
				}
				time.Sleep(10 * time.Millisecond)
			}
			if err := tx.Commit(ctx); err != nil {
				t.Fatal(err)
			}
			waitHandled(t, pool, queryInt(t, pool, `SELECT count(*) FROM outbox_message_t`), 5*time.Second)
			// And once the partition is quiet, the consumer sleeps on it.
			pgtest.WaitFor(t, 10*time.Second, "the consumer asleep again", func() bool { return sleepers(t, pool, 0) == 1 })
		})
	}
}

// TestWakeModeSwitchReachesRunningConsumers: a consumer started while its
// topic notified on every append ('always') never announced that its
// workers wait; once the topic switches to 'waiting', appends notify only
// announced partitions, so the running consumer must learn the switch and
// announce, or every later event would wait for its poll (an hour here).
func TestWakeModeSwitchReachesRunningConsumers(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := newTopic(t, 2)
	if err := schema.SetWake(ctx, pool, 1, schema.WakeAlways); err != nil {
		t.Fatal(err)
	}
	mustExec(t, pool, handledTable)
	hs := &Handlers{}
	hs.HandleAll(SQLHandler("g", recordSQL))
	startConsumer(t, pool, Config{TotalPartitions: 2, WaitPeriod: time.Hour, Handlers: hs})
	appendTx(t, pool, ev("a", "t", `{}`), ev("b", "t", `{}`))
	waitHandled(t, pool, 2, 10*time.Second)
	if err := schema.SetWake(ctx, pool, 1, schema.WakeWaiting); err != nil {
		t.Fatal(err)
	}
	// Events right after the switch, and later ones, for idle workers.
	appendTx(t, pool, ev("a", "t", `{}`), ev("b", "t", `{}`))
	waitHandled(t, pool, 4, 10*time.Second)
	for i := range 3 {
		appendTx(t, pool, ev("a", "t", `{}`), ev("b", "t", `{}`))
		waitHandled(t, pool, int64(6+2*i), 10*time.Second)
	}
	checkHandled(t, pool)
}

// TestNoRowUpdatedPerAppendOrBatch: appends and batches insert rows and
// update none, so that a snapshot held open elsewhere (which keeps every
// version of an updated row, and makes each lookup walk them) costs them
// nothing. Producers append in multi-host transactions while a group of
// two replicas consumes; the rows an append or a batch reads by key (the
// topic's row, the partitions' rows, the leases) keep their physical place
// (an update writes a new version elsewhere), and the tails and positions
// only grow.
func TestNoRowUpdatedPerAppendOrBatch(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := newTopic(t, 4)
	mustExec(t, pool, handledTable)
	cfg := Config{TotalPartitions: 4, BatchSize: 3, Handlers: recordingHandlers(), MaintenanceInterval: time.Hour}
	a := startConsumer(t, pool, cfg)
	b := startConsumer(t, pool, cfg)
	pgtest.WaitFor(t, 10*time.Second, "the replicas share the partitions", func() bool {
		return len(a.Partitions())+len(b.Partitions()) == 4
	})
	// The physical place of each row, by key; a lease's with its owner and
	// epoch, which a rebalance may change (a lease changes hands then, as
	// it should; it must not change otherwise).
	places := func() map[string]string {
		rows, err := pool.Query(ctx, `SELECT 'topic ' || topic_id, ctid::text FROM log_counter
			UNION ALL SELECT 'partition ' || topic_id || '/' || partition_id, ctid::text FROM partition_counters
			UNION ALL SELECT 'lease ' || partition_id || ' of ' || owner || ' epoch ' || epoch, ctid::text FROM partition_leases`)
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]string{}
		var k, v string
		if _, err := pgx.ForEachRow(rows, []any{&k, &v}, func() error { out[k] = v; return nil }); err != nil {
			t.Fatal(err)
		}
		return out
	}
	updated := func() int64 {
		// Versions of tails and positions that something replaced: an
		// update, not an insert, leaves xmax set on the old version, which
		// a later reader would see as dead.
		return queryInt(t, pool, `SELECT (SELECT count(*) FROM partition_tails WHERE xmax <> 0) +
			(SELECT count(*) FROM consumer_positions WHERE xmax <> 0)`)
	}
	// The topic's row is not even locked: a lock (FOR KEY SHARE, as a
	// foreign key's check takes) is written into the row's xmax and to the
	// WAL, a MultiXact once two batches hold it, which every append then
	// resolves when it reads the row.
	locker := func() int64 {
		return queryInt(t, pool, `SELECT xmax::text::bigint FROM log_counter WHERE topic_id = 1`)
	}
	lockedBefore := locker()
	before := places()
	var total int64
	for i := range 60 {
		evs := []Event{ev(fmt.Sprintf("h%d", i%7), "t", `{}`), ev(fmt.Sprintf("h%d", (i+3)%7), "t", `{}`)}
		if i%3 == 0 {
			evs = evs[:1]
		}
		appendTx(t, pool, evs...)
		total += int64(len(evs))
	}
	waitHandled(t, pool, total, 20*time.Second)
	checkHandled(t, pool)
	for k, place := range places() {
		if was, ok := before[k]; ok && was != place {
			t.Errorf("%s was updated by appends or batches (its row moved from %s to %s)", k, was, place)
		}
	}
	if n := updated(); n != 0 {
		t.Fatalf("%d versions of tails or positions were replaced", n)
	}
	if after := locker(); after != lockedBefore {
		t.Errorf("the topic's log_counter row was locked by appends or batches (xmax %d, was %d)", after, lockedBefore)
	}
	if n := queryInt(t, pool, `SELECT count(*) FROM consumer_positions WHERE group_id = 'g'`); n < 4 {
		t.Fatalf("%d positions, want at least one per partition", n)
	}
}

// TestSleepAfterAnAppendThatHoldsNoSleepKey plays the other half of the
// race: an append that could not take its partition's sleep key (the
// previous append of the partition still held it, committing) notifies
// nobody, being marked in flight. A consumer that goes to sleep before it
// commits must find it in flight and stay awake, or its event would wait
// for the poll (an hour here).
func TestSleepAfterAnAppendThatHoldsNoSleepKey(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.TopicPoolSpec(t, schema.TopicSpec{ID: 1, Partitions: 1, Scope: schema.ScopePartition})
	mustExec(t, pool, handledTable)
	startConsumer(t, pool, Config{TotalPartitions: 1, WaitPeriod: time.Hour, Handlers: recordingHandlers()})
	pgtest.WaitFor(t, 10*time.Second, "the consumer asleep on the idle partition", func() bool { return sleepers(t, pool, 0) == 1 })
	appendTx(t, pool, ev("a", "t", `{}`)) // wakes it (a notification)
	waitHandled(t, pool, 1, 10*time.Second)
	// The previous append, committing, still holds the sleep key: a
	// transaction of the test's holds it exclusive. The consumer may have
	// gone back to sleep (the partition quiet for 50 ms) before the test
	// took it: then a notification wakes it, and the test tries again.
	var prev pgx.Tx
	pgtest.WaitFor(t, 10*time.Second, "the sleep key taken while the consumer is awake", func() bool {
		tx, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var got bool
		if err := tx.QueryRow(ctx, `SELECT pg_try_advisory_xact_lock(lock_key('sleep', '1/0'))`).Scan(&got); err != nil {
			t.Fatal(err)
		}
		if got {
			prev = tx
			return true
		}
		_ = tx.Rollback(ctx)
		mustExec(t, pool, `SELECT pg_notify(channel, '1:0/1') FROM log_counter WHERE topic_id = 1`)
		return false
	})
	defer prev.Rollback(ctx) //nolint:errcheck
	// The append: it cannot take the key, and sends nothing.
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck
	if _, err := Append(ctx, tx, ev("a", "t", `{}`)); err != nil {
		t.Fatal(err)
	}
	// The previous append commits; the consumer, the partition quiet, tries
	// to sleep for a while (several quiet periods).
	if err := prev.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(3 * quietMin)
	for time.Now().Before(deadline) {
		if sleepers(t, pool, 0) != 0 {
			t.Fatal("the consumer went to sleep while an append that notifies nobody was in flight")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	waitHandled(t, pool, 2, 5*time.Second)
}
