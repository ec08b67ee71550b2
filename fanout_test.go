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

	"github.com/pgevents/pgevents/internal/pgtest"
	"github.com/pgevents/pgevents/internal/store"
	"github.com/pgevents/pgevents/schema"
)

const fxTable = `CREATE TABLE public.fx (group_id text NOT NULL, partition_id int NOT NULL, c_offset bigint NOT NULL)`

// fxConfig is a consumer of group that records (group, offset) per event.
func fxConfig(group string, partitions int) Config {
	hs := &Handlers{}
	hs.HandleAll(SQLHandler(group, `INSERT INTO fx VALUES (@group_id, @partition_id, @c_offset)`))
	return Config{GroupID: group, TotalPartitions: partitions, Handlers: hs, WaitPeriod: 500 * time.Millisecond, Schema: pgtest.Schema()}
}

// handledBy returns how many events group handled, and how many of them
// more than once.
func handledBy(t *testing.T, pool *pgxpool.Pool, group string) (n, dups int64) {
	t.Helper()
	n = queryInt(t, pool, `SELECT count(*) FROM fx WHERE group_id = $1`, group)
	dups = queryInt(t, pool, `SELECT count(*) FROM (SELECT 1 FROM fx WHERE group_id = $1 GROUP BY partition_id, c_offset HAVING count(*) > 1) d`, group)
	return n, dups
}

func waitGroupHandled(t *testing.T, pool *pgxpool.Pool, group string, n int64) {
	t.Helper()
	pgtest.WaitFor(t, 20*time.Second, fmt.Sprintf("group %s handled %d events", group, n), func() bool {
		got, _ := handledBy(t, pool, group)
		return got >= n
	})
}

// TestStartFrom: a late group with each start position sees exactly the
// events it should.
func TestStartFrom(t *testing.T) {
	t.Parallel()
	pool := newTopic(t, 2)
	mustExec(t, pool, fxTable)
	for i := range 10 {
		appendTx(t, pool, ev(fmt.Sprintf("h%d", i), "t", `{}`))
	}
	var at time.Time // the sixth event's append time
	if err := pool.QueryRow(context.Background(), `SELECT created_at FROM outbox_message_t ORDER BY created_at OFFSET 5 LIMIT 1`).Scan(&at); err != nil {
		t.Fatal(err)
	}
	mustExec(t, pool, `CREATE TABLE before_late AS SELECT partition_id, c_offset FROM outbox_message_t`)
	cases := []struct {
		start string
		want  string // the events the group handles, as a condition on outbox_message_t m
	}{
		{"earliest", `true`},
		{"latest", `NOT EXISTS (SELECT 1 FROM before_late b WHERE b.partition_id = m.partition_id AND b.c_offset = m.c_offset)`},
		{"offset:4", `m.c_offset >= 4`}, // in every partition under offset scope 'partition'
		{"time:" + at.Format(time.RFC3339Nano), `m.created_at >= '` + at.Format(time.RFC3339Nano) + `'`},
	}
	for i, tc := range cases {
		cfg := fxConfig(fmt.Sprintf("late%d", i), 2)
		cfg.StartFrom = tc.start
		startConsumer(t, pool, cfg)
	}
	for i := range 3 {
		appendTx(t, pool, ev(fmt.Sprintf("x%d", i), "t", `{}`))
	}
	for i, tc := range cases {
		group := fmt.Sprintf("late%d", i)
		want := queryInt(t, pool, `SELECT count(*) FROM outbox_message_t m WHERE `+tc.want)
		waitGroupHandled(t, pool, group, want)
		wrong := queryInt(t, pool, `SELECT count(*) FROM outbox_message_t m WHERE (`+tc.want+`) <>
			EXISTS (SELECT 1 FROM fx WHERE fx.group_id = $1 AND fx.partition_id = m.partition_id AND fx.c_offset = m.c_offset)`, group)
		n, dups := handledBy(t, pool, group)
		if wrong != 0 || n != want || dups != 0 {
			t.Errorf("startFrom %s: handled %d events (%d twice, %d wrongly handled or not), want %d", tc.start, n, dups, wrong, want)
		}
	}
}

// TestOffsetsResetReplaysOneGroup: resetting a group to earliest replays
// every retained event to that group only; a reset is refused while the
// group runs unless forced.
func TestOffsetsResetReplaysOneGroup(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := newTopic(t, 2)
	mustExec(t, pool, fxTable)
	a, stopA := startStoppableConsumer(t, pool, fxConfig("a", 2))
	startConsumer(t, pool, fxConfig("b", 2))
	for i := range 20 {
		appendTx(t, pool, ev(fmt.Sprintf("h%d", i%5), "t", `{}`))
	}
	waitGroupHandled(t, pool, "a", 20)
	waitGroupHandled(t, pool, "b", 20)
	earliest := store.Start{Kind: "earliest"}
	if _, err := store.Reset(ctx, pool, "a", 1, earliest, false); !errors.Is(err, store.ErrGroupRunning) {
		t.Fatalf("reset while running = %v, want ErrGroupRunning", err)
	}
	_ = a
	stopA()
	moves, err := store.Reset(ctx, pool, "a", 1, earliest, false)
	if err != nil || len(moves) != 2 {
		t.Fatalf("reset = %+v, %v; want both partitions moved", moves, err)
	}
	for _, m := range moves { // each partition at its first event
		if first := queryInt(t, pool, `SELECT min(c_offset) FROM outbox_message_t WHERE partition_id = $1`, m.Partition); m.To != first {
			t.Fatalf("reset moved partition %d to %d, want its first event %d", m.Partition, m.To, first)
		}
	}
	startConsumer(t, pool, fxConfig("a", 2))
	waitGroupHandled(t, pool, "a", 40)
	if n := queryInt(t, pool, `SELECT count(*) FROM (SELECT 1 FROM fx WHERE group_id = 'a' GROUP BY partition_id, c_offset HAVING count(*) <> 2) x`); n != 0 {
		t.Fatalf("%d events not replayed exactly once to group a", n)
	}
	if n, dups := handledBy(t, pool, "b"); n != 20 || dups != 0 {
		t.Fatalf("group b handled %d events (%d twice) after a's reset, want 20", n, dups)
	}
}

// TestPauseResumeCancel follows a group's subscription through its states.
func TestPauseResumeCancel(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := newTopic(t, 1)
	mustExec(t, pool, fxTable)
	cfg := fxConfig("g", 1)
	// Heartbeat every 500 ms: the cancellation is seen within a beat. (At
	// 400 ms, a heartbeat late by that much on a loaded -race run let the
	// group go DEAD before the test paused it.)
	cfg.DeadAfter = 2 * time.Second
	c, err := NewConsumer(pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	runCtx, cancelRun := context.WithCancel(ctx)
	defer cancelRun()
	done := make(chan error, 1)
	go func() { done <- c.Run(runCtx) }()
	pgtest.WaitFor(t, 10*time.Second, "ready", c.Ready)
	appendTx(t, pool, ev("h", "t", `{}`))
	waitGroupHandled(t, pool, "g", 1)

	if _, err := store.SetState(ctx, pool, "g", 1, store.StatePaused); err != nil {
		t.Fatal(err)
	}
	pgtest.WaitFor(t, 5*time.Second, "consumer paused", c.paused.Load)
	appendTx(t, pool, ev("h", "t", `{}`))
	// The worker learns of the event (notification, poll) and must not
	// handle it: give it the time it takes to when not paused.
	polls := c.polls.Load()
	c.pollNow(WakePoll)
	pgtest.WaitFor(t, 5*time.Second, "the paused consumer knows of offset 2", func() bool {
		return c.polls.Load() > polls && workerOf(c, 0).highest.Load() >= 2
	})
	pgtest.WaitFor(t, 5*time.Second, "a notification or poll after that", func() bool { return c.polls.Load() > polls+1 })
	if n := queryInt(t, pool, `SELECT next_offset FROM consumer_offsets`); n != 2 {
		t.Fatalf("a paused group moved to %d", n)
	}
	if _, err := store.SetState(ctx, pool, "g", 1, store.StateDead); !errors.Is(err, store.ErrTransition) {
		t.Fatalf("an operator set DEAD: %v", err)
	}
	if _, err := store.SetState(ctx, pool, "g", 1, store.StateActive); err != nil {
		t.Fatal(err)
	}
	waitGroupHandled(t, pool, "g", 2)

	if _, err := store.SetState(ctx, pool, "g", 1, store.StateCancelled); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if !errors.Is(err, ErrSubscriptionCancelled) {
			t.Fatalf("Run after cancel = %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the consumer of a cancelled group did not stop")
	}
	if _, err := store.SetState(ctx, pool, "g", 1, store.StateActive); !errors.Is(err, store.ErrTransition) {
		t.Fatalf("CANCELLED -> ACTIVE allowed: %v", err)
	}
	again, _ := NewConsumer(pool, cfg)
	if err := again.Run(ctx); !errors.Is(err, ErrSubscriptionCancelled) {
		t.Fatalf("a consumer of a cancelled group started: %v", err)
	}
}

// TestRetentionWithDeadGroup: three groups, one stopped mid-run. The
// others keep handling; after deadAfter the stopped one is DEAD and
// retention drops segments past it while producers append, so the log stays
// bounded, and dropping segments under running consumers loses nothing. When
// it returns, it resumes where it was for what is retained and is told how
// many events it skipped: every event is either handled by it or counted as
// skipped, exactly.
func TestRetentionWithDeadGroup(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := newTopic(t, 2)
	mustExec(t, pool, fxTable)
	// Small segments, immediate retention, fast maintenance.
	pgtest.ResizeSegments(t, pool, 1, 1000)
	mustExec(t, pool, `UPDATE topic_retention SET retention = '1 millisecond'`)
	mk := func(group string) Config {
		cfg := fxConfig(group, 2)
		cfg.BatchSize = 200
		cfg.DeadAfter = 500 * time.Millisecond
		cfg.MaintenanceInterval = 100 * time.Millisecond
		return cfg
	}
	startConsumer(t, pool, mk("a"))
	startConsumer(t, pool, mk("b"))
	c1, stopC := startStoppableConsumer(t, pool, mk("c"))

	var appended atomic.Int64
	var stop atomic.Bool
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for k := 0; !stop.Load(); k++ {
			evs := make([]Event, 20)
			for i := range evs {
				evs[i] = ev(fmt.Sprintf("h%d", (k+i)%17), "t", `{}`)
			}
			if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
				_, err := Append(ctx, tx, evs...)
				return err
			}); err != nil {
				t.Error(err)
				return
			}
			appended.Add(20)
			// A steady load, not a flood: at most ~2,000 events/s, two
			// segments per partition and second for maintenance to create
			// and drop, which it does with room to spare even on a loaded
			// CI machine under -race (at 2 ms it had to keep up with 10 per
			// second, and sometimes fell behind there).
			time.Sleep(10 * time.Millisecond)
		}
	}()
	pgtest.WaitFor(t, 20*time.Second, "c handled 1500 events", func() bool {
		n, _ := handledBy(t, pool, "c")
		return n >= 1500
	})
	stopC()
	_ = c1
	pgtest.WaitFor(t, 10*time.Second, "c is DEAD", func() bool {
		return queryInt(t, pool, `SELECT count(*) FROM subscriptions WHERE group_id = 'c' AND state = 'DEAD'`) == 1
	})
	// Retention goes past c while producers append: the log stays bounded.
	before := appended.Load()
	pgtest.WaitFor(t, 30*time.Second, "8,000 more events appended", func() bool { return appended.Load() >= before+8000 })
	pgtest.WaitFor(t, 20*time.Second, "a segment past c's position removed", func() bool {
		return queryInt(t, pool, `SELECT count(*) FROM retention_skips WHERE group_id = 'c'`) > 0
	})
	// Bounded: beyond what a and b have not handled yet (which they hold
	// back, as they should), the log keeps no more than a few segments.
	var rows, pending int64
	// Generous: on a loaded machine retention's locks wait for batches and
	// appends, and a few rounds of maintenance may pass before it catches up.
	for deadline := time.Now().Add(60 * time.Second); ; {
		rows = queryInt(t, pool, `SELECT count(*) FROM outbox_message_t`)
		pending = queryInt(t, pool, `SELECT count(*) FROM outbox_message_t m WHERE EXISTS (
			SELECT 1 FROM consumer_offsets o WHERE o.group_id IN ('a', 'b') AND o.partition_id = m.partition_id AND m.c_offset >= o.next_offset)`)
		if rows <= pending+4000 {
			break
		}
		if time.Now().After(deadline) {
			segs, err := schema.Segments(ctx, pool, 1)
			t.Fatalf("the log is not bounded by the ACTIVE groups' lag plus a few segments: %d events, %d not yet handled by a or b, "+
				"%d in the DEFAULT partitions, %d segments (err %v), %d appended",
				rows, pending, queryInt(t, pool, `SELECT count(*) FROM outbox_message_t m
					WHERE tableoid::regclass::text LIKE '%default'`), len(segs), err, appended.Load())
		}
		time.Sleep(50 * time.Millisecond) // polling the database until a deadline
	}
	t.Logf("log: %d events, %d not yet handled by a or b, %d appended", rows, pending, appended.Load())
	stop.Store(true)
	wg.Wait()
	total := appended.Load()
	waitGroupHandled(t, pool, "a", total)
	waitGroupHandled(t, pool, "b", total)
	for _, g := range []string{"a", "b"} {
		if n, dups := handledBy(t, pool, g); n != total || dups != 0 {
			t.Fatalf("ACTIVE group %s handled %d of %d events (%d twice) while segments were dropped", g, n, total, dups)
		}
	}

	// c returns: it is ACTIVE again, handles what is retained, and is told
	// what it skipped.
	// The skips are read as c catches up: retention may drop segments past
	// c until it is ACTIVE again.
	c2 := startConsumer(t, pool, mk("c"))
	var caught, skipped int64
	pgtest.WaitFor(t, 20*time.Second, fmt.Sprintf("c caught up: handled + skipped = %d", total), func() bool {
		caught, _ = handledBy(t, pool, "c")
		skipped = queryInt(t, pool, `SELECT coalesce(sum(skipped), 0) FROM retention_skips WHERE group_id = 'c'`)
		return caught+skipped >= total
	})
	t.Logf("c handled %d and skipped %d of %d", caught, skipped, total)
	n, dups := handledBy(t, pool, "c")
	if n+skipped != total || dups != 0 {
		t.Fatalf("c handled %d and skipped %d of %d events (%d twice): each event must be one or the other", n, skipped, total, dups)
	}
	if got := c2.Stats().Skipped; got != skipped {
		t.Fatalf("the returning consumer reported %d skipped events, the database counted %d", got, skipped)
	}
	if queryInt(t, pool, `SELECT count(*) FROM subscriptions WHERE group_id = 'c' AND state = 'ACTIVE'`) != 1 {
		t.Fatal("c is not ACTIVE again")
	}
}
