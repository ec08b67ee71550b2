package pgevents

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgevents/pgevents/internal/pgtest"
	"github.com/pgevents/pgevents/internal/store"
)

func recordingHandlers() *Handlers {
	hs := &Handlers{}
	hs.HandleAll(SQLHandler("g", recordSQL))
	return hs
}

func TestConsumerExactlyOnceInOrderAtomic(t *testing.T) {
	t.Parallel()
	pool := newTopic(t, 4)
	mustExec(t, pool, handledTable)
	startConsumer(t, pool, Config{TotalPartitions: 4, BatchSize: 10, Handlers: recordingHandlers()})

	ctx := context.Background()
	var committed atomic.Int64
	var wg sync.WaitGroup
	for p := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(p), 7))
			for i := range 60 {
				n := 1 + rng.IntN(20)
				evs := make([]Event, n)
				for k := range evs {
					evs[k] = ev(fmt.Sprintf("h%d", rng.IntN(30)), "t", fmt.Sprintf(`{"p":%d,"i":%d}`, p, i))
				}
				tx, err := pool.Begin(ctx)
				if err != nil {
					t.Error(err)
					return
				}
				if _, err := Append(ctx, tx, evs...); err != nil {
					t.Error(err)
					return
				}
				if i%4 == 3 {
					_ = tx.Rollback(ctx)
					continue
				}
				if err := tx.Commit(ctx); err != nil {
					t.Error(err)
					return
				}
				committed.Add(int64(n))
			}
		}()
	}
	// A single-host transaction of 35 events, larger than the batch size.
	big := make([]Event, 35)
	for k := range big {
		big[k] = ev("big-host", "t", `{}`)
	}
	appendTx(t, pool, big...)
	wg.Wait()
	waitHandled(t, pool, committed.Load()+35, 60*time.Second)
	checkHandled(t, pool)
	if n := queryInt(t, pool, `SELECT count(DISTINCT consumer_tx) FROM handled WHERE host_id = 'big-host'`); n != 1 {
		t.Fatalf("the 35-event transaction was handled in %d consumer transactions, want 1", n)
	}
}

func TestConsumerHandlesMinimumHashHost(t *testing.T) {
	t.Parallel()
	pool := newTopic(t, 8)
	mustExec(t, pool, handledTable)
	startConsumer(t, pool, Config{TotalPartitions: 8, Handlers: recordingHandlers()})
	const host = "host-859240973" // hashtext = -2147483648
	if h := queryInt(t, pool, `SELECT hashtext($1)`, host); h != -2147483648 {
		t.Fatalf("hashtext(%q) = %d, the test needs -2147483648", host, h)
	}
	appendTx(t, pool, ev(host, "t", `{}`), ev(host, "t", `{}`))
	waitHandled(t, pool, 2, 10*time.Second)
	if p := queryInt(t, pool, `SELECT DISTINCT partition_id FROM handled`); p != 2147483648%8 {
		t.Fatalf("handled in partition %d, want %d", p, 2147483648%8)
	}
}

// TestListenerReconnect kills the listener's backend: events appended while
// it is gone are handled, and pickup is notification-fast again within a
// second, although the poll period is a minute.
func TestListenerReconnect(t *testing.T) {
	t.Parallel()
	pool := newTopic(t, 4)
	mustExec(t, pool, handledTable)
	c := startConsumer(t, pool, Config{TotalPartitions: 4, WaitPeriod: time.Minute, Handlers: recordingHandlers()})

	appendTx(t, pool, ev("a", "t", `{}`))
	waitHandled(t, pool, 1, 5*time.Second)

	n := queryInt(t, pool, `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
		WHERE datname = current_database() AND application_name = 'pgevents-listener'`)
	if n != 1 {
		t.Fatalf("terminated %d listener backends, want 1", n)
	}
	killed := time.Now()
	appendTx(t, pool, ev("b", "t", `{}`)) // committed while nobody listens
	pgtest.WaitFor(t, time.Second, "listener reconnected within 1 s", func() bool { return c.Stats().ListenerConnects >= 2 })
	waitHandled(t, pool, 2, 2*time.Second)
	t.Logf("listener back after %s", time.Since(killed))

	// Notification-fast again: each event is handled well within the poll
	// period (a minute). 5 s, not less: under the full race suite one event
	// took 551 ms (with three CPU hogs, 194 ms at most in 50); what the test
	// tells apart is a wake-up from the poll.
	for i := range 5 {
		start := time.Now()
		appendTx(t, pool, ev(fmt.Sprintf("c%d", i), "t", `{}`))
		waitHandled(t, pool, int64(3+i), 5*time.Second)
		if d := time.Since(start); d > 5*time.Second {
			t.Fatalf("event %d took %s to handle after the reconnect", i, d)
		}
	}
	if q := queryInt(t, pool, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()
		AND application_name = 'pgevents-listener'`); q != 1 {
		t.Fatalf("%d listener connections, want 1", q)
	}
}

func TestUnknownEventType(t *testing.T) {
	t.Parallel()
	for _, policy := range []UnknownEventPolicy{UnknownEventFail, UnknownEventSkip} {
		t.Run(fmt.Sprint(policy), func(t *testing.T) {
			t.Parallel()
			pool := newTopic(t, 2)
			mustExec(t, pool, handledTable)
			hs := &Handlers{}
			hs.Handle("known", SQLHandler("g", recordSQL))
			startConsumer(t, pool, Config{TotalPartitions: 2, UnknownEventType: policy, Handlers: hs})
			appendTx(t, pool, ev("h", "known", `{}`))
			appendTx(t, pool, ev("h", "mystery", `{}`))
			appendTx(t, pool, ev("h", "known", `{}`))
			waitHandled(t, pool, 2, 10*time.Second)
			pgtest.WaitFor(t, 10*time.Second, "position past all events", func() bool {
				return queryInt(t, pool, `SELECT count(*) FROM consumer_offsets WHERE next_offset = 4`) == 1
			})
			dl := queryInt(t, pool, `SELECT count(*) FROM dead_letter_queue WHERE first_offset = 2 AND last_offset = 2
				AND error LIKE '%no handler for event type "mystery"%'`)
			want := int64(1)
			if policy == UnknownEventSkip {
				want = 0
			}
			if dl != want || queryInt(t, pool, `SELECT count(*) FROM dead_letter_queue`) != want {
				t.Fatalf("%d dead letters for the unknown type, want %d", dl, want)
			}
		})
	}
}

// TestPermanentFailureDeadLettersTheUnit: a handler that panics in the
// middle of a producer transaction dead-letters that whole unit, undoing
// the effects of its events that had succeeded, while the events around it
// are handled in order.
func TestPermanentFailureDeadLettersTheUnit(t *testing.T) {
	t.Parallel()
	pool := newTopic(t, 2)
	mustExec(t, pool, handledTable)
	hs := recordingHandlers()
	record := SQLHandler("g", recordSQL)
	hs.HandleFunc("poison", func(ctx context.Context, tx pgx.Tx, ev *Event) error {
		if err := record.Handle(ctx, tx, ev); err != nil {
			return err
		}
		panic("poisoned")
	})
	startConsumer(t, pool, Config{TotalPartitions: 2, Handlers: hs})

	appendTx(t, pool, ev("h", "ok", `{}`))                                               // 1
	appendTx(t, pool, ev("h", "ok", `{}`), ev("h", "poison", `{}`), ev("h", "ok", `{}`)) // 2..4
	appendTx(t, pool, ev("h", "ok", `{}`))                                               // 5
	waitHandled(t, pool, 2, 10*time.Second)
	pgtest.WaitFor(t, 10*time.Second, "position past all events", func() bool {
		return queryInt(t, pool, `SELECT count(*) FROM consumer_offsets WHERE next_offset = 6`) == 1
	})
	var got []int64
	rows, _ := pool.Query(context.Background(), `SELECT c_offset FROM handled ORDER BY seq`)
	got, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(got) != "[1 5]" {
		t.Fatalf("handled %v, want [1 5]: the poisoned unit's effects must be undone", got)
	}
	var first, last, n int64
	var errText string
	if err := pool.QueryRow(context.Background(), `SELECT first_offset, last_offset, cardinality(event_ids), error
		FROM dead_letter_queue`).Scan(&first, &last, &n, &errText); err != nil {
		t.Fatal(err)
	}
	if first != 2 || last != 4 || n != 3 {
		t.Fatalf("dead letter covers %d-%d with %d events, want 2-4 with 3", first, last, n)
	}
	if errText != "handler panicked: poisoned" {
		t.Fatalf("dead letter error %q", errText)
	}
}

// TestTransientFailureRetriesWithoutDeadLetter: serialization failures are
// retried until they stop, nothing is dead-lettered, order holds, and the
// other partition keeps flowing meanwhile.
func TestTransientFailureRetriesWithoutDeadLetter(t *testing.T) {
	t.Parallel()
	pool := newTopic(t, 2)
	mustExec(t, pool, handledTable)
	var failures atomic.Int64
	record := SQLHandler("g", recordSQL)
	hs := &Handlers{}
	hs.HandleAll(HandlerFunc(func(ctx context.Context, tx pgx.Tx, ev *Event) error {
		if ev.EventType == "flaky" && failures.Add(1) <= 4 {
			return &pgconn.PgError{Code: "40001", Message: "could not serialize access"}
		}
		return record.Handle(ctx, tx, ev)
	}))
	startConsumer(t, pool, Config{TotalPartitions: 2, Handlers: hs, RetryInitial: 10 * time.Millisecond, RetryMax: 50 * time.Millisecond, MaxAttempts: 2})
	// Two hosts in different partitions.
	var a, b string
	for i := 0; a == "" || b == ""; i++ {
		h := fmt.Sprintf("host%d", i)
		if queryInt(t, pool, `SELECT event_partition($1, 2)`, h) == 0 {
			a = h
		} else {
			b = h
		}
	}
	appendTx(t, pool, ev(a, "flaky", `{}`))
	appendTx(t, pool, ev(a, "ok", `{}`))
	appendTx(t, pool, ev(b, "ok", `{}`))
	waitHandled(t, pool, 3, 10*time.Second)
	checkHandled(t, pool)
	if n := queryInt(t, pool, `SELECT count(*) FROM dead_letter_queue`); n != 0 {
		t.Fatalf("%d dead letters for a transient failure", n)
	}
	if f := failures.Load(); f != 5 {
		t.Fatalf("flaky handler ran %d times, want 5 (4 failures + 1 success)", f)
	}
}

// TestTwoConsumersOnePartitionDoNotInterleave: two consumers of one group
// serve one partition at the same time, while producers append
// transactions of several events over several hosts. Their batches never
// interleave: each consumer transaction handles a contiguous run of
// offsets, starts where the one committed before it ended (it saw that
// commit), and the runs follow each other in the order the handlers ran,
// so every event is handled exactly once, in offset order.
//
// A partition's lease gives it to one consumer at a time, which would keep
// the two apart whatever their batches do. So both are given the lease
// under one fencing token (one replica id, and the lease's epoch handed to
// the second consumer's worker), which is more than any handover allows
// (there the old owner's batch can no longer commit): both claim batches
// whenever they hear of events, both can commit, and only the claim's lock
// on the group's position orders their batches.
func TestTwoConsumersOnePartitionDoNotInterleave(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := newTopic(t, 1)
	mustExec(t, pool, handledTable)
	// Which consumer handled the event, and the group's position that the
	// handler's statement saw: the offset its batch started at, once the
	// batch before it committed.
	mustExec(t, pool, `ALTER TABLE public.handled ADD COLUMN consumer text NOT NULL, ADD COLUMN position_seen bigint NOT NULL`)
	offsetsTable := "consumer_offsets"
	if s := pgtest.Schema(); s != "" {
		offsetsTable = pgx.Identifier{s, offsetsTable}.Sanitize()
	}
	handlers := func(name string) *Handlers {
		hs := &Handlers{}
		hs.HandleAll(SQLHandler("g", `INSERT INTO handled (c_offset, host_id, partition_id, transaction_id, consumer, position_seen)
			VALUES (@c_offset, @host_id, @partition_id, @transaction_id, '`+name+`',
			        (SELECT next_offset FROM `+offsetsTable+`
			         WHERE group_id = @group_id AND topic_id = @topic_id AND partition_id = @partition_id))`))
		return hs
	}
	cfg := func(name string) Config {
		return Config{TotalPartitions: 1, BatchSize: 5, ReplicaID: "one-replica", Handlers: handlers(name)}
	}
	a := startConsumer(t, pool, cfg("a"))
	pgtest.WaitFor(t, 10*time.Second, "consumer a holds the partition", func() bool { return fmt.Sprint(a.Partitions()) == "[0]" })
	b := startConsumer(t, pool, cfg("b"))
	pgtest.WaitFor(t, 10*time.Second, "consumer b runs its layout", func() bool { return b.rt.Load() != nil })
	epoch := queryInt(t, pool, `SELECT epoch FROM partition_leases WHERE group_id = 'g' AND partition_id = 0 AND owner = 'one-replica'`)
	b.rt.Load().Acquired(0, epoch)

	var committed atomic.Int64
	var wg sync.WaitGroup
	for p := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(p), 17))
			for i := range 80 {
				evs := make([]Event, 2+rng.IntN(4))
				for k := range evs {
					evs[k] = ev(fmt.Sprintf("h%d", rng.IntN(6)), "t", fmt.Sprintf(`{"p":%d,"i":%d}`, p, i))
				}
				tx, err := pool.Begin(ctx)
				if err != nil {
					t.Error(err)
					return
				}
				if _, err := Append(ctx, tx, evs...); err != nil {
					_ = tx.Rollback(ctx)
					t.Error(err)
					return
				}
				if i%5 == 4 { // rolled back: leaves no gap
					_ = tx.Rollback(ctx)
					continue
				}
				if err := tx.Commit(ctx); err != nil {
					t.Error(err)
					return
				}
				committed.Add(int64(len(evs)))
			}
		}()
	}
	wg.Wait()
	n := committed.Load()
	pgtest.WaitFor(t, 30*time.Second, "the group's position past every event", func() bool {
		return queryInt(t, pool, `SELECT next_offset FROM consumer_offsets WHERE group_id = 'g'`) == n+1
	})

	// In the order the handlers ran, the offsets are 1, 2, ..., n: every
	// event once, none handled before an earlier one.
	if bad := queryInt(t, pool, `SELECT count(*) FROM (SELECT c_offset, row_number() OVER (ORDER BY seq) AS rn FROM handled) x
		WHERE c_offset <> rn`); bad != 0 {
		t.Errorf("%d of %d handled events are out of place in handling order (want offsets 1 to %d in order)", bad, n, n)
	}
	// Each consumer transaction: one consumer, a contiguous run of offsets,
	// its rows not interleaved with another transaction's, starting where
	// the transaction before it ended, and starting from the position that
	// transaction committed.
	type run struct {
		tx                int64
		consumer          string
		lo, hi, n, lastHi int64
		firstSeq, lastSeq int64
		seenLo, seenHi    int64
		consumers         int64
	}
	rows, err := pool.Query(ctx, `SELECT consumer_tx, min(consumer), min(c_offset), max(c_offset), count(*),
		coalesce(lag(max(c_offset)) OVER (ORDER BY min(seq)), 0), min(seq), max(seq), min(position_seen), max(position_seen), count(DISTINCT consumer)
		FROM handled GROUP BY consumer_tx ORDER BY min(seq)`)
	if err != nil {
		t.Fatal(err)
	}
	runs, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (run, error) {
		var x run
		err := r.Scan(&x.tx, &x.consumer, &x.lo, &x.hi, &x.n, &x.lastHi, &x.firstSeq, &x.lastSeq, &x.seenLo, &x.seenHi, &x.consumers)
		return x, err
	})
	if err != nil {
		t.Fatal(err)
	}
	by := map[string]int{}
	var prevSeq int64
	var problems []string
	fail := func(format string, args ...any) {
		if len(problems) < 10 {
			problems = append(problems, fmt.Sprintf(format, args...))
		}
	}
	for _, r := range runs {
		by[r.consumer]++
		switch {
		case r.consumers != 1:
			fail("consumer transaction %d was handled by %d consumers", r.tx, r.consumers)
		case r.hi-r.lo+1 != r.n:
			fail("consumer transaction %d (consumer %s) handled %d events over offsets %d-%d: not contiguous", r.tx, r.consumer, r.n, r.lo, r.hi)
		case r.firstSeq <= prevSeq:
			fail("consumer transaction %d (consumer %s) handled events while the one before it did", r.tx, r.consumer)
		case r.lo != r.lastHi+1:
			fail("consumer transaction %d (consumer %s) started at offset %d, after a transaction that ended at %d", r.tx, r.consumer, r.lo, r.lastHi)
		case r.seenLo != r.lo || r.seenHi != r.lo:
			fail("consumer transaction %d (consumer %s) started at offset %d while its handlers saw the committed position at %d to %d",
				r.tx, r.consumer, r.lo, r.seenLo, r.seenHi)
		}
		prevSeq = r.lastSeq
	}
	if len(problems) > 0 {
		t.Fatalf("batches interleaved (first %d problems):\n  %s", len(problems), strings.Join(problems, "\n  "))
	}
	// Two consumers served the partition, or the test proved nothing.
	if by["a"] == 0 || by["b"] == 0 {
		t.Fatalf("consumer transactions by consumer: %v; want both consumers to have handled batches", by)
	}
	checkHandled(t, pool)
	t.Logf("%d events in %d consumer transactions: %v", n, len(runs), by)
}

// TestLargeTransactionBoundedMemory: a producer transaction 100 times the
// batch size is handled in one consumer transaction while the worker never
// holds more than a batch of events.
func TestLargeTransactionBoundedMemory(t *testing.T) {
	t.Parallel()
	pool := newTopic(t, 1)
	mustExec(t, pool, handledTable)
	var maxBuf atomic.Int64
	var c *Consumer
	record := SQLHandler("g", recordSQL)
	hs := &Handlers{}
	hs.HandleAll(HandlerFunc(func(ctx context.Context, tx pgx.Tx, ev *Event) error {
		if n := int64(cap(workerOf(c, 0).buf)); n > maxBuf.Load() {
			maxBuf.Store(n)
		}
		return record.Handle(ctx, tx, ev)
	}))
	cfg := Config{GroupID: "g", TotalPartitions: 1, BatchSize: 10, Handlers: hs}
	c = startConsumer(t, pool, cfg)
	big := make([]Event, 1000)
	for k := range big {
		big[k] = ev("h", "t", `{}`)
	}
	appendTx(t, pool, big...)
	waitHandled(t, pool, 1000, 30*time.Second)
	checkHandled(t, pool)
	if n := queryInt(t, pool, `SELECT count(DISTINCT consumer_tx) FROM handled`); n != 1 {
		t.Fatalf("handled in %d consumer transactions, want 1", n)
	}
	if m := maxBuf.Load(); m > int64(2*(cfg.BatchSize+1)) {
		t.Fatalf("worker buffer grew to %d events for batch size %d", m, cfg.BatchSize)
	}
}

func TestRunRefusesPartitionMismatch(t *testing.T) {
	t.Parallel()
	pool := newTopic(t, 8)
	c, err := NewConsumer(pool, Config{GroupID: "g", TotalPartitions: 6, Handlers: recordingHandlers(), Schema: pgtest.Schema()})
	if err != nil {
		t.Fatal(err)
	}
	err = c.Run(context.Background())
	var mm *PartitionMismatchError
	if !errors.As(err, &mm) || mm.Recorded != 8 || mm.Configured != 6 || !strings.HasPrefix(err.Error(), "pgevents: ") {
		t.Fatalf("Run = %v, want a PartitionMismatchError 8 vs 6, starting \"pgevents: \"", err)
	}
	if n := queryInt(t, pool, `SELECT count(*) FROM consumer_offsets`); n != 0 {
		t.Fatalf("a refused consumer created %d positions", n)
	}
}

// TestNewGroupStartsAtFirstRetainedEvent: retention removes a topic's
// oldest segments, as far in each partition as the groups let it (an older
// group still needs the second half of partition 1). A new group placed at
// "earliest" starts at the first retained event of every partition: it
// handles every event retained or appended since, exactly once, and
// nothing before; and it is told of no skipped events, since it never had
// them.
func TestNewGroupStartsAtFirstRetainedEvent(t *testing.T) {
	t.Parallel()
	ctx := pgtest.Context(context.Background())
	pool := newTopic(t, 2)
	mustExec(t, pool, handledTable)
	pgtest.ResizeSegments(t, pool, 1, 1000) // the smallest segments allowed
	mustExec(t, pool, `UPDATE topic_retention SET retention = '1 millisecond', zero_subscription_retention = '1 millisecond'`)
	// Three hosts in each partition.
	var hosts []string
	for i, n := 0, [2]int{}; n[0] < 3 || n[1] < 3; i++ {
		h := fmt.Sprintf("h%d", i)
		if p := queryInt(t, pool, `SELECT event_partition($1, 2)`, h); n[p] < 3 {
			n[p]++
			hosts = append(hosts, h)
		}
	}
	appendSome := func(txs int) {
		for i := range txs {
			evs := make([]Event, 5)
			for k := range evs {
				evs[k] = ev(hosts[(i*5+k)%len(hosts)], "t", `{}`)
			}
			appendTx(t, pool, evs...)
		}
	}
	// 4,500 events, 2,250 per partition: several segments in each, under
	// either offset scope.
	for range 45 {
		mustExec(t, pool, `SELECT append_events(1, (SELECT jsonb_agg(jsonb_build_object('host_id', ($1::text[])[1 + i % 6], 'event_type', 't'))
			FROM generate_series(1, 100) i))`, hosts)
	}
	// Group older has handled partition 0 and half of partition 1.
	if _, _, err := store.Subscribe(ctx, pool, "older", 1, store.Start{Kind: "earliest"}, time.Minute); err != nil {
		t.Fatal(err)
	}
	mustExec(t, pool, `UPDATE consumer_offsets SET next_offset = CASE partition_id
		WHEN 0 THEN (SELECT max(c_offset) + 1 FROM outbox_message_t WHERE partition_id = 0)
		ELSE (SELECT c_offset FROM outbox_message_t WHERE partition_id = 1 ORDER BY c_offset OFFSET 1125 LIMIT 1) END
		WHERE group_id = 'older'`)
	firstAppended := firstOffsets(t, pool)
	// Retention, as consumers run it, until it has nothing more to remove.
	pgtest.WaitFor(t, 20*time.Second, "retention removed all it may", func() bool {
		m, err := Maintain(ctx, pool, 1, nil)
		if err != nil {
			t.Fatal(err)
		}
		return m.Ran && len(m.Retention.Removed) == 0 && m.Retention.Blocked != "" &&
			!strings.Contains(m.Retention.Blocked, "lock was busy")
	})
	first := firstOffsets(t, pool)
	if first[0] <= firstAppended[0] || first[1] <= firstAppended[1] || first[1] >= first[0] {
		t.Fatalf("first offsets %v before retention, %v after: the test needs retention to remove events in both partitions, more in partition 0",
			firstAppended, first)
	}
	appendSome(2) // after retention, before the group starts
	c := startConsumer(t, pool, Config{TotalPartitions: 2, Handlers: recordingHandlers()})
	appendSome(2) // after the group started
	pgtest.WaitFor(t, 10*time.Second, "the group caught up", func() bool {
		return queryInt(t, pool, `SELECT count(*) FROM outbox_message_t m WHERE NOT EXISTS (SELECT 1 FROM consumer_offsets o
			WHERE o.group_id = 'g' AND o.partition_id = m.partition_id AND o.next_offset > m.c_offset)`) == 0
	})
	n := queryInt(t, pool, `SELECT count(*) FROM outbox_message_t`)
	for p := range 2 {
		var firstHandled, lowest int64
		if err := pool.QueryRow(ctx, `SELECT (SELECT c_offset FROM handled WHERE partition_id = $1 ORDER BY seq LIMIT 1),
			(SELECT min(c_offset) FROM handled WHERE partition_id = $1)`, p).Scan(&firstHandled, &lowest); err != nil {
			t.Fatal(err)
		}
		if firstHandled != first[p] || lowest != first[p] {
			t.Errorf("partition %d: the group began at offset %d (lowest handled %d), want the first retained event, %d",
				p, firstHandled, lowest, first[p])
		}
	}
	checkHandled(t, pool) // every retained or later event exactly once, nothing else
	if k := queryInt(t, pool, `SELECT count(*) FROM retention_skips WHERE group_id = 'g'`); k != 0 || c.Stats().Skipped != 0 {
		t.Errorf("the new group was told of skipped events: %d records, %d events", k, c.Stats().Skipped)
	}
	t.Logf("first retained offsets %v (first appended %v), %d events handled", first, firstAppended, n)
}

// firstOffsets returns the lowest offset in partitions 0 and 1 of topic 1.
func firstOffsets(t *testing.T, pool *pgxpool.Pool) [2]int64 {
	t.Helper()
	var out [2]int64
	for p := range out {
		out[p] = queryInt(t, pool, `SELECT coalesce(min(c_offset), 0) FROM outbox_message_t WHERE topic_id = 1 AND partition_id = $1`, p)
	}
	return out
}

func TestHandlerCannotCommitConsumerTransaction(t *testing.T) {
	t.Parallel()
	pool := newTopic(t, 1)
	mustExec(t, pool, handledTable)
	got := make(chan error, 1)
	record := SQLHandler("g", recordSQL)
	hs := &Handlers{}
	hs.HandleAll(HandlerFunc(func(ctx context.Context, tx pgx.Tx, ev *Event) error {
		select {
		case got <- tx.Commit(ctx):
		default:
		}
		return record.Handle(ctx, tx, ev)
	}))
	startConsumer(t, pool, Config{TotalPartitions: 1, Handlers: hs})
	appendTx(t, pool, ev("h", "t", `{}`))
	waitHandled(t, pool, 1, 10*time.Second)
	if err := <-got; err != ErrTxManaged {
		t.Fatalf("tx.Commit in a handler = %v, want ErrTxManaged", err)
	}
}

// TestNoEmptyClaims: a claim locks the offsets row and writes WAL even when
// nothing follows, so a worker must know of work before it claims. Polls
// with nothing to do, and notifications for events already handled, claim
// nothing; a notification naming an offset above the log (anyone may send
// one) costs its partition one empty claim, no more, and leaves the worker
// where it was.
func TestNoEmptyClaims(t *testing.T) {
	t.Parallel()
	pool := newTopic(t, 4)
	mustExec(t, pool, handledTable)
	c := startConsumer(t, pool, Config{TotalPartitions: 4, WaitPeriod: 50 * time.Millisecond, Handlers: recordingHandlers()})
	for i := range 20 {
		appendTx(t, pool, ev(fmt.Sprintf("h%d", i), "t", `{}`))
	}
	waitHandled(t, pool, 20, 10*time.Second)
	// The consumer counts a batch just after its COMMIT returns, which can
	// be after the test sees the commit.
	pgtest.WaitFor(t, 10*time.Second, "the consumer counted 20 events", func() bool { return c.Stats().Handled == 20 })
	before := c.Stats()
	// Stale notifications naming every partition and offsets already
	// handled, and twenty poll periods with nothing new.
	channel := topicChannel(t, pool)
	for range 20 {
		mustExec(t, pool, `SELECT pg_notify($1, '1:0/1,1/2,2/3,3/4')`, channel)
	}
	start := c.polls.Load()
	pgtest.WaitFor(t, 10*time.Second, "twenty polls", func() bool { return c.polls.Load() >= start+20 })
	if after := c.Stats(); after.EmptyClaims != before.EmptyClaims || after.Batches != before.Batches {
		t.Fatalf("idle consumer claimed: %d empty claims, %d batches (before: %d, %d)",
			after.EmptyClaims, after.Batches, before.EmptyClaims, before.Batches)
	}
	// Offsets above the log, every partition named in ten notifications:
	// at most one empty claim per partition and notification (a hint that
	// arrives during the claim it caused costs none), then nothing more
	// through twenty polls.
	for range 10 {
		mustExec(t, pool, `SELECT pg_notify($1, '1:0/1000,1/1000,2/1000,3/1000')`, channel)
	}
	pgtest.WaitFor(t, 10*time.Second, "an empty claim per partition", func() bool { return c.Stats().EmptyClaims >= before.EmptyClaims+4 })
	start = c.polls.Load()
	pgtest.WaitFor(t, 10*time.Second, "twenty polls", func() bool { return c.polls.Load() >= start+20 })
	mid := c.Stats()
	if n := mid.EmptyClaims - before.EmptyClaims; n < 4 || n > 40 || mid.Batches != before.Batches {
		t.Fatalf("after hints above the log: %d empty claims, %d batches (before: %d, %d); want 4 to 40 more empty claims, no batch",
			mid.EmptyClaims, mid.Batches, before.EmptyClaims, before.Batches)
	}
	start = c.polls.Load()
	pgtest.WaitFor(t, 10*time.Second, "twenty more polls", func() bool { return c.polls.Load() >= start+20 })
	if after := c.Stats(); after.EmptyClaims != mid.EmptyClaims {
		t.Fatalf("the workers went on claiming after the hints: %d empty claims, then %d", mid.EmptyClaims, after.EmptyClaims)
	}
	// And the workers are where the database says: new events are handled.
	for i := range 8 {
		appendTx(t, pool, ev(fmt.Sprintf("h%d", i), "t", `{}`))
	}
	waitHandled(t, pool, 28, 10*time.Second)
	checkHandled(t, pool)
}

// TestTwoWorkersRaceForOneOffsetsRow: two workers of one partition, both
// believing they own its lease (same owner and epoch, as during a
// handover), claim batches as fast as they can while producers append:
// the offsets row's lock alone must keep every event handled exactly once,
// in order, one consumer transaction per producer transaction.
func TestTwoWorkersRaceForOneOffsetsRow(t *testing.T) {
	t.Parallel()
	ctx := pgtest.Context(context.Background()) // the workers run outside Run, which names the schema
	pool := newTopic(t, 1)
	mustExec(t, pool, handledTable)
	c, err := NewConsumer(consumerPool(t, pool, 2), Config{GroupID: "g", TotalPartitions: 1, BatchSize: 7, Handlers: recordingHandlers(), Schema: pgtest.Schema()})
	if err != nil {
		t.Fatal(err)
	}
	if err := store.InitGroupLayout(ctx, pool, "g", 1); err != nil {
		t.Fatal(err)
	}
	if err := store.Init(ctx, pool, "g", 1, []int{0}); err != nil {
		t.Fatal(err)
	}
	mustExec(t, pool, `UPDATE partition_leases SET owner = $1, epoch = 1, expires_at = 'infinity'`, c.replicaID)
	lr := &layoutRun{c: c, layout: store.Layout{Version: 1, Partitions: 1, From: 1, Below: []int64{store.NoLimit}}}
	lr.cuts.Store(&lr.layout.Below)
	var stop atomic.Bool
	var wg sync.WaitGroup
	for range 2 {
		w := newWorker(c, lr, 0)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for !stop.Load() {
				w.highest.Store(store.NoLimit - 1) // always believe there is work
				if _, err := w.batch(ctx, 1); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	t.Cleanup(func() { stop.Store(true); wg.Wait() }) // before the pools close
	const txs = 300
	for i := range txs {
		h := fmt.Sprintf("h%d", i%5)
		appendTx(t, pool, ev(h, "t", `{}`), ev(fmt.Sprintf("h%d", (i+2)%5), "t", `{}`), ev(h, "t", `{}`))
	}
	waitHandled(t, pool, 3*txs, 30*time.Second)
	checkHandled(t, pool)
}
