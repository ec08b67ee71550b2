package pgevents

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgevents/pgevents/internal/pgtest"
	"github.com/pgevents/pgevents/schema"
)

// Tests of a batch's failure paths: a halt behind a healthy unit, handlers
// idle past the session's idle timeout, a session ended mid-batch, a
// swallowed SQL error, a unit's time budget, a lost lease; and beside them
// maintenance without a consumer and the topic's channel. Each fails if the
// path it names goes wrong. The failure policies (dead letter, park, halt)
// are tested in policy_test.go, the decisions without a database in
// decide_test.go.

// callCounter counts handler calls, for asserting that no failure path
// spins.
type callCounter struct{ n atomic.Int64 }

func (c *callCounter) wrap(h Handler) Handler {
	return HandlerFunc(func(ctx context.Context, tx pgx.Tx, ev *Event) error {
		c.n.Add(1)
		return h.Handle(ctx, tx, ev)
	})
}

// TestHaltBeforeUnitWhosePoisonIsNotFirst: under halt, a unit
// {ok, poison} after a healthy unit: the healthy unit commits, the
// partition halts at the failing unit's first offset with a
// partition_halts row, and the handler is not called over and over.
func TestHaltBeforeUnitWhosePoisonIsNotFirst(t *testing.T) {
	t.Parallel()
	for _, breaker := range []bool{false, true} {
		t.Run(fmt.Sprintf("breaker=%v", breaker), func(t *testing.T) {
			t.Parallel()
			pool, poisoned := poisonTopic(t, 1)
			var calls callCounter
			hs := &Handlers{}
			hs.HandleAll(calls.wrap(poisonHandlers(poisoned).catchAll))
			cfg := Config{TotalPartitions: 1, OnPermanentFailure: PolicyHalt, Handlers: hs}
			if breaker {
				// The breaker halts instead of the policy: one dead letter
				// allowed, the second unit halts.
				cfg.OnPermanentFailure, cfg.MaxDeadLetters = PolicyDeadLetter, 1
			}
			// One batch: a healthy unit, (breaker: a poisoned unit that is
			// dead-lettered,) then {ok, poison}, then more.
			appendTx(t, pool, ev("a", "t", `{}`), ev("b", "t", `{}`)) // 1, 2
			first := int64(3)
			if breaker {
				appendTx(t, pool, ev("a", "t", `{}`), ev("a", "t", `{"poison":true}`)) // 3, 4: dead-lettered
				first = 5
			}
			appendTx(t, pool, ev("a", "t", `{}`), ev("b", "t", `{"poison":true}`)) // first, first+1: halts here
			appendTx(t, pool, ev("c", "t", `{}`))
			c := startConsumer(t, pool, cfg)
			pgtest.WaitFor(t, 10*time.Second, "halt recorded", func() bool {
				return queryInt(t, pool, `SELECT count(*) FROM partition_halts WHERE c_offset = $1 AND reason = 'poison event'`, first) == 1
			})
			if got := handledOffsets(t, pool); got != "[1 2]" {
				t.Fatalf("handled %s, want the healthy unit [1 2] committed before the halt", got)
			}
			if n := queryInt(t, pool, `SELECT next_offset FROM consumer_offsets`); n != first {
				t.Fatalf("position %d, want %d: the partition stops at the failing unit's first offset", n, first)
			}
			// No spin: halted means the handler is not called any more.
			before := calls.n.Load()
			time.Sleep(500 * time.Millisecond) // a window in which a spinning worker would call thousands of times
			if after := calls.n.Load(); after != before || before > 20 {
				t.Fatalf("handler called %d times before the halt and %d more after it", before, after-before)
			}
			if !workerOf(c, 0).halted.Load() {
				t.Fatal("worker not halted")
			}
		})
	}
}

// TestIdleHandlersDoNotLivelock: handlers that only call out,
// slowly, with no SQL, on the production pool settings with a short
// idle_in_transaction_session_timeout: batches commit before the server
// ends their session, so every event is handled, and each outside call is
// made about once.
func TestIdleHandlersDoNotLivelock(t *testing.T) {
	t.Parallel()
	pool := newTopic(t, 1)
	var (
		mu    sync.Mutex
		calls = map[string]int{}
	)
	hs := &Handlers{}
	hs.HandleAll(HandlerFunc(func(ctx context.Context, tx pgx.Tx, ev *Event) error {
		mu.Lock()
		calls[ev.EventID]++
		mu.Unlock()
		select { // a webhook taking 60 ms
		case <-time.After(60 * time.Millisecond):
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}))
	cp := consumerPool(t, pool, 1, func(pc *pgxpool.Config) {
		pc.ConnConfig.RuntimeParams["idle_in_transaction_session_timeout"] = "1000"
	})
	c, err := NewConsumer(cp, Config{GroupID: "g", TotalPartitions: 1, BatchSize: 50, HandlerTimeout: 400 * time.Millisecond, Handlers: hs, Schema: pgtest.Schema()})
	if err != nil {
		t.Fatal(err)
	}
	for range 30 { // 30 single-event units: 1.8 s of handlers, past the 1 s limit in one batch
		appendTx(t, pool, ev("a", "t", `{}`))
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	defer func() { cancel(); <-done }()
	pgtest.WaitFor(t, 20*time.Second, "every event handled", func() bool {
		return queryInt(t, pool, `SELECT coalesce(max(next_offset), 0) FROM consumer_offsets`) == 31
	})
	mu.Lock()
	defer mu.Unlock()
	for id, n := range calls {
		if n > 2 {
			t.Fatalf("event %s called out %d times: batches are being replayed", id, n)
		}
	}
	pgtest.WaitFor(t, 10*time.Second, "the consumer counted every event", func() bool { return c.Stats().Handled >= 30 })
	if s := c.Stats(); s.Batches < 2 || s.Retries != 0 {
		t.Fatalf("%d batches, %d retries: the batch should have been committed in parts before the server ended it", s.Batches, s.Retries)
	}
}

// TestRefusesHandlerTimeoutBeyondIdleTimeout: a handler timeout
// the session's idle timeout cannot accommodate is refused at start.
func TestRefusesHandlerTimeoutBeyondIdleTimeout(t *testing.T) {
	t.Parallel()
	pool := newTopic(t, 1)
	cp := consumerPool(t, pool, 1, func(pc *pgxpool.Config) {
		pc.ConnConfig.RuntimeParams["idle_in_transaction_session_timeout"] = "1000"
	})
	c, err := NewConsumer(cp, Config{GroupID: "g", TotalPartitions: 1, HandlerTimeout: 2 * time.Second, Handlers: recordingHandlers(), Schema: pgtest.Schema()})
	if err != nil {
		t.Fatal(err)
	}
	var te *TimeoutError
	if err := c.Run(context.Background()); !errors.As(err, &te) {
		t.Fatalf("Run = %v, want a TimeoutError", err)
	}
}

// TestSessionEndedMidBatchNarrows: a unit whose handler keeps
// its batch idle until the server ends the session (SQLSTATE 25P03): the
// batch shrinks until the unit is alone, the other units are handled, and
// that unit is dead-lettered after MaxAttempts instead of being retried
// forever.
func TestSessionEndedMidBatchNarrows(t *testing.T) {
	t.Parallel()
	pool := newTopic(t, 1)
	mustExec(t, pool, handledTable)
	record := SQLHandler("g", recordSQL)
	var calls callCounter
	hs := &Handlers{}
	hs.HandleAll(calls.wrap(HandlerFunc(func(ctx context.Context, tx pgx.Tx, ev *Event) error {
		if ev.EventType == "idle" {
			// Outlives the session's idle limit, set for this transaction.
			if _, err := tx.Exec(ctx, `SET LOCAL idle_in_transaction_session_timeout = 100`); err != nil {
				return err
			}
			time.Sleep(300 * time.Millisecond)
			return nil
		}
		return record.Handle(ctx, tx, ev)
	})))
	c := startConsumer(t, pool, Config{TotalPartitions: 1, BatchSize: 20, Handlers: hs, MaxAttempts: 3,
		RetryInitial: 10 * time.Millisecond, RetryMax: 50 * time.Millisecond})
	for i := range 12 {
		typ := "t"
		if i == 6 {
			typ = "idle"
		}
		appendTx(t, pool, ev("a", typ, `{}`), ev("b", "t", `{}`))
	}
	pgtest.WaitFor(t, 30*time.Second, "the position past every unit", func() bool {
		return queryInt(t, pool, `SELECT next_offset FROM consumer_offsets`) == 25
	})
	if got := queryInt(t, pool, `SELECT count(*) FROM handled`); got != 22 {
		t.Fatalf("%d events handled, want 22 (every unit but the idle one)", got)
	}
	var reason string
	if err := pool.QueryRow(context.Background(), `SELECT error FROM dead_letter_queue WHERE first_offset = 13`).Scan(&reason); err != nil {
		t.Fatalf("no dead letter for the idle unit: %v", err)
	}
	if !strings.Contains(reason, "session ended") {
		t.Fatalf("dead letter reason %q, want one saying the session ended", reason)
	}
	checkHandledOrderOnly(t, pool)
	// The consumer counts a batch once its COMMIT has returned, which can
	// be just after the test sees the commit.
	pgtest.WaitFor(t, 10*time.Second, "the consumer counted the dead letter", func() bool { return c.Stats().DeadLettered >= 1 })
	if c.Stats().DeadLettered != 1 {
		t.Fatalf("stats %+v", c.Stats())
	}
}

// TestSwallowedSQLErrorBlamesItsUnit: a handler that ignores a
// duplicate-key error and returns nil leaves the transaction aborted: its
// unit is dead-lettered with a reason saying so, the unit after it is
// handled, and a swallowing unit that is last does not stall the
// partition.
func TestSwallowedSQLErrorBlamesItsUnit(t *testing.T) {
	t.Parallel()
	pool := newTopic(t, 1)
	mustExec(t, pool, handledTable)
	mustExec(t, pool, `CREATE TABLE public.uniq (k text PRIMARY KEY)`)
	mustExec(t, pool, `INSERT INTO uniq VALUES ('taken')`)
	record := SQLHandler("g", recordSQL)
	hs := &Handlers{}
	hs.HandleAll(HandlerFunc(func(ctx context.Context, tx pgx.Tx, ev *Event) error {
		if ev.EventType == "swallow" {
			_, _ = tx.Exec(ctx, `INSERT INTO uniq VALUES ('taken')`) // "ignore duplicates"
			return nil
		}
		return record.Handle(ctx, tx, ev)
	}))
	c := startConsumer(t, pool, Config{TotalPartitions: 1, Handlers: hs})
	appendTx(t, pool, ev("a", "t", `{}`))                           // 1
	appendTx(t, pool, ev("a", "t", `{}`), ev("a", "swallow", `{}`)) // 2, 3: dead-lettered
	appendTx(t, pool, ev("b", "t", `{}`))                           // 4: innocent, handled
	appendTx(t, pool, ev("a", "swallow", `{}`), ev("c", "t", `{}`)) // 5, 6: last: dead-lettered, no stall
	waitPosition(t, pool, 7)
	if got := handledOffsets(t, pool); got != "[1 4]" {
		t.Fatalf("handled %s, want [1 4]", got)
	}
	rows, err := pool.Query(context.Background(), `SELECT first_offset || '-' || last_offset || ': ' || error FROM dead_letter_queue ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	dls, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	if len(dls) != 2 || !strings.HasPrefix(dls[0], "2-3: ") || !strings.HasPrefix(dls[1], "5-6: ") {
		t.Fatalf("dead letters %q, want units 2-3 and 5-6", dls)
	}
	for _, d := range dls {
		if !strings.Contains(d, ErrAbortedTransaction.Error()) {
			t.Fatalf("dead letter %q does not say the handler returned nil on an aborted transaction", d)
		}
	}
	pgtest.WaitFor(t, 10*time.Second, "the consumer counted the dead letters", func() bool { return c.Stats().DeadLettered >= 2 })
	if c.Stats().DeadLettered != 2 {
		t.Fatalf("stats %+v", c.Stats())
	}
}

// TestMaintainWithoutConsumer: producers outrun the segments
// while no consumer runs, so events land in the DEFAULT partition; one
// maintenance pass moves them into their segment, after which retention
// can remove them like any other.
func TestMaintainWithoutConsumer(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	// The counts below are those of offset scope 'topic'; under scope
	// 'partition' each partition's segments work the same way.
	pool := pgtest.TopicPoolSpec(t, schema.TopicSpec{ID: 1, Partitions: 2, Scope: schema.ScopeTopic})
	pgtest.ResizeSegments(t, pool, 1, 1000)
	mustExec(t, pool, `DROP TABLE outbox_message_t_1_p0_1, outbox_message_t_1_p0_2, outbox_message_t_1_p1_1, outbox_message_t_1_p1_2`) // segment 0 only
	mustExec(t, pool, `SELECT append_events(1, (SELECT jsonb_agg(jsonb_build_object('host_id', 'h' || i, 'event_type', 't'))
		FROM generate_series(1, 2500) i))`)
	inDefaults := `SELECT count(*) FROM outbox_message_t WHERE tableoid::regclass::text LIKE '%default'`
	if n, want := queryInt(t, pool, inDefaults), queryInt(t, pool, `SELECT count(*) FROM outbox_message_t WHERE c_offset > 1000`); n != want || n == 0 {
		t.Fatalf("%d events in DEFAULT tables, want the %d past segment 0", n, want)
	}
	m, err := Maintain(ctx, pool, 1, nil)
	if err != nil || !m.Ran || m.SegmentsCreated != 8 {
		t.Fatalf("Maintain = %+v, %v; want 8 segments (in each partition 1 and 2 for DEFAULT's rows, 3 and 4 ahead)", m, err)
	}
	if n := queryInt(t, pool, inDefaults); n != 0 {
		t.Fatalf("%d events left in DEFAULT tables", n)
	}
	// No group, no subscription: retention removes the full segments.
	mustExec(t, pool, `UPDATE topic_retention SET retention = '1 millisecond', zero_subscription_retention = '1 millisecond'`)
	time.Sleep(5 * time.Millisecond)
	if m, err = Maintain(ctx, pool, 1, nil); err != nil || len(m.Retention.Removed) != 4 {
		t.Fatalf("Maintain = %+v, %v; want segments 0 and 1 of each partition removed", m, err)
	}
	if left, below := queryInt(t, pool, `SELECT count(*) FROM outbox_message_t`),
		queryInt(t, pool, `SELECT removed_below FROM topic_retention`); left != 500 || below != 2001 {
		t.Fatalf("%d events left, removed_below %d; want 500 and 2001", left, below)
	}
}

// TestTopicChannel: the channel is the topic's: appends notify
// it, a consumer without a channel configured listens there and is woken at
// once, and a consumer configured with another one refuses to start.
func TestTopicChannel(t *testing.T) {
	t.Parallel()
	ctx := pgtest.Context(context.Background())
	pool := newTopic(t, 1)
	mustExec(t, pool, handledTable)
	if err := schema.SetChannel(ctx, pool, 1, "portal_events"); err != nil {
		t.Fatal(err)
	}
	c, err := NewConsumer(consumerPool(t, pool, 1), Config{GroupID: "g", TotalPartitions: 1, Channel: "event_channel", Handlers: recordingHandlers(), Schema: pgtest.Schema()})
	if err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	var mismatch *ChannelMismatchError
	if err := c.Run(rctx); !errors.As(err, &mismatch) || mismatch.Recorded != "portal_events" {
		t.Fatalf("Run with another channel = %v, want a ChannelMismatchError naming portal_events", err)
	}
	// Without a channel, and with the topic's, and a poll period of a
	// minute, only a notification on the topic's channel can wake the
	// consumers in time.
	for i, channel := range []string{"", "portal_events"} {
		group := fmt.Sprintf("g%d", i)
		hs := &Handlers{}
		hs.HandleAll(SQLHandler(group, recordSQL))
		startConsumer(t, pool, Config{GroupID: group, TotalPartitions: 1, Channel: channel, WaitPeriod: time.Minute, Handlers: hs})
	}
	time.Sleep(100 * time.Millisecond) // past the first poll
	appendTx(t, pool, ev("a", "t", `{}`))
	waitHandled(t, pool, 2, 5*time.Second)
}

// TestUnitBudgetEndsWithTheUnit: a unit that finishes just
// inside its budget, followed by a slow dead-letter write, does not get the
// next unit blamed for a timeout.
func TestUnitBudgetEndsWithTheUnit(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := newTopic(t, 1)
	mustExec(t, pool, handledTable)
	record := SQLHandler("g", recordSQL)
	var slowCalls atomic.Int64
	hs := &Handlers{}
	hs.HandleAll(HandlerFunc(func(hctx context.Context, tx pgx.Tx, ev *Event) error {
		switch ev.EventType {
		case "poison":
			return Permanent(errors.New("poison"))
		case "slow":
			if slowCalls.Add(1) == 2 {
				// In the attempt that dead-letters the poison, make the
				// dead-letter write wait past the end of this unit's
				// budget.
				conn, err := pool.Acquire(ctx)
				if err != nil {
					return err
				}
				if _, err := conn.Exec(ctx, `BEGIN; LOCK TABLE dead_letter_queue IN EXCLUSIVE MODE`); err != nil {
					conn.Release()
					return err
				}
				go func() {
					defer conn.Release()
					time.Sleep(900 * time.Millisecond) // past this unit's budget
					_, _ = conn.Exec(ctx, `COMMIT`)
				}()
			}
			// Inside its 700 ms budget with room for the lock above (a
			// budget of 300 ms once ran out under a loaded machine's
			// -race run, and the test blamed the product).
			time.Sleep(200 * time.Millisecond)
		}
		return record.Handle(hctx, tx, ev)
	}))
	appendTx(t, pool, ev("a", "slow", `{}`))   // 1
	appendTx(t, pool, ev("a", "poison", `{}`)) // 2: dead-lettered
	appendTx(t, pool, ev("a", "t", `{}`))      // 3: must not time out
	c := startConsumer(t, pool, Config{TotalPartitions: 1, HandlerTimeout: 700 * time.Millisecond, Handlers: hs})
	waitPosition(t, pool, 4)
	if got := handledOffsets(t, pool); got != "[1 3]" {
		t.Fatalf("handled %s, want [1 3]", got)
	}
	if r := c.Stats().Retries; r != 1 {
		t.Fatalf("%d retries, want 1 (the poison's): a unit was blamed for a budget that was not its own", r)
	}
}

// TestLostLeaseCancelsHandlers: when another replica takes the
// partition over, the in-flight handler's context is cancelled at once,
// with ErrLeaseLost as its cause, instead of running on under a stale
// epoch until its own timeout.
func TestLostLeaseCancelsHandlers(t *testing.T) {
	t.Parallel()
	pool := newTopic(t, 1)
	started := make(chan struct{}, 1)
	causes := make(chan error, 1)
	hs := &Handlers{}
	hs.HandleAll(HandlerFunc(func(ctx context.Context, tx pgx.Tx, ev *Event) error {
		select {
		case started <- struct{}{}:
		default:
		}
		<-ctx.Done()
		select {
		case causes <- context.Cause(ctx):
		default:
		}
		return ctx.Err()
	}))
	startConsumer(t, pool, Config{TotalPartitions: 1, Handlers: hs, HandlerTimeout: 50 * time.Second, LeaseDuration: 300 * time.Millisecond})
	appendTx(t, pool, ev("a", "t", `{}`))
	select {
	case <-started:
	case <-time.After(10 * time.Second):
		t.Fatal("handler not started")
	}
	// Another replica takes the partition over.
	mustExec(t, pool, `UPDATE partition_leases SET owner = 'usurper', epoch = epoch + 1, expires_at = now() + interval '1 hour'`)
	select {
	case cause := <-causes:
		if !errors.Is(cause, ErrLeaseLost) {
			t.Fatalf("handler context ended with %v, want ErrLeaseLost", cause)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the handler ran on after the lease was lost")
	}
}
