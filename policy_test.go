package pgevents

import (
	"context"
	"errors"
	"fmt"
	"github.com/pgevents/pgevents/schema"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgevents/pgevents/internal/pgtest"
)

// Tests of the failure policies, end to end: a permanent failure
// dead-lettered, a host parked behind it (and released by a replay or a
// discard), a partition halted, the dead-letter circuit breaker, and
// transient failures retried with backoff, never dead-lettered.

// poisonTopic returns a topic of partitions with the handled table, and the
// switch poisonHandlers reads, turned on: events whose payload says
// "poison" fail permanently until the test turns it off.
func poisonTopic(t *testing.T, partitions int) (*pgxpool.Pool, *atomic.Bool) {
	t.Helper()
	pool := newTopic(t, partitions)
	mustExec(t, pool, handledTable)
	poisoned := new(atomic.Bool)
	poisoned.Store(true)
	return pool, poisoned
}

// poisonHandlers records events with the SQL handler and fails
// permanently on events whose payload is {"poison": true} while poisoned
// is set.
func poisonHandlers(poisoned *atomic.Bool) *Handlers {
	record := SQLHandler("g", recordSQL)
	hs := &Handlers{}
	hs.HandleAll(HandlerFunc(func(ctx context.Context, tx pgx.Tx, ev *Event) error {
		if poisoned.Load() && strings.Contains(string(ev.Payload), "poison") {
			return Permanent(errors.New("poison event"))
		}
		return record.Handle(ctx, tx, ev)
	}))
	return hs
}

// handledOffsets returns the handled offsets in handling order.
func handledOffsets(t *testing.T, pool *pgxpool.Pool) string {
	t.Helper()
	rows, err := pool.Query(context.Background(), `SELECT c_offset FROM handled ORDER BY seq`)
	if err != nil {
		t.Fatal(err)
	}
	got, err := pgx.CollectRows(rows, pgx.RowTo[int64])
	if err != nil {
		t.Fatal(err)
	}
	return fmt.Sprint(got)
}

// waitPosition waits until the group's position in partition 0 is next.
func waitPosition(t *testing.T, pool *pgxpool.Pool, next int64) {
	t.Helper()
	pgtest.WaitFor(t, 10*time.Second, fmt.Sprintf("position %d", next), func() bool {
		return queryInt(t, pool, `SELECT next_offset FROM consumer_offsets WHERE partition_id = 0`) == next
	})
}

// TestPolicyDeadLetter: good, poison, good for one host and user, each in
// its own transaction: the good ones are handled in order, the poison one
// is in the dead-letter table with its reason.
func TestPolicyDeadLetter(t *testing.T) {
	t.Parallel()
	pool, poisoned := poisonTopic(t, 1)
	startConsumer(t, pool, Config{TotalPartitions: 1, Handlers: poisonHandlers(poisoned)})
	appendTx(t, pool, ev("h", "t", `{"n":100}`))
	appendTx(t, pool, ev("h", "t", `{"poison":true}`))
	appendTx(t, pool, ev("h", "t", `{"n":102}`))
	waitPosition(t, pool, 4)
	if got := handledOffsets(t, pool); got != "[1 3]" {
		t.Fatalf("handled %s, want [1 3]", got)
	}
	if n := queryInt(t, pool, `SELECT count(*) FROM dead_letter_queue WHERE first_offset = 2 AND last_offset = 2
		AND error = 'poison event' AND attempts = 1 AND group_id = 'g' AND event_ids[1] IS NOT NULL
		AND first_failed_at <= last_failed_at`); n != 1 {
		t.Fatalf("dead letter for offset 2 with its reason: %d rows", n)
	}
}

// TestPolicyParkHost: the poison event's later events for the same host
// wait behind it while another host in the same partition flows; replaying
// it after the fix handles it and then the parked one, in order.
func TestPolicyParkHost(t *testing.T) {
	t.Parallel()
	pool, poisoned := poisonTopic(t, 1)
	c := startConsumer(t, pool, Config{TotalPartitions: 1, OnPermanentFailure: PolicyParkHost, Handlers: poisonHandlers(poisoned)})
	appendTx(t, pool, ev("a", "t", `{"n":100}`))              // 1
	appendTx(t, pool, ev("a", "t", `{"poison":true}`))        // 2
	appendTx(t, pool, ev("a", "t", `{"n":102}`))              // 3: parked
	appendTx(t, pool, ev("b", "t", `{}`))                     // 4: flows
	appendTx(t, pool, ev("a", "t", `{}`), ev("b", "t", `{}`)) // 5, 6: the unit touches a; parked whole, b with it
	appendTx(t, pool, ev("c", "t", `{}`))                     // 7: flows
	waitPosition(t, pool, 8)
	if got := handledOffsets(t, pool); got != "[1 4 7]" {
		t.Fatalf("handled %s, want [1 4 7]", got)
	}
	if n := queryInt(t, pool, `SELECT count(*) FROM parked_events`); n != 3 {
		t.Fatalf("%d parked events, want 3 (offsets 3, 5, 6)", n)
	}
	dls, err := ListDeadLetters(context.Background(), pool, "g")
	if err != nil || len(dls) != 1 || dls[0].FirstOffset != 2 || dls[0].Parked != 3 {
		t.Fatalf("dead letters %+v, %v; want one at offset 2 with 3 parked", dls, err)
	}
	// b is parked now (it shared a unit with a); c still flows.
	appendTx(t, pool, ev("b", "t", `{}`)) // 8: parked
	appendTx(t, pool, ev("c", "t", `{}`)) // 9: flows
	waitPosition(t, pool, 10)
	if got := handledOffsets(t, pool); got != "[1 4 7 9]" {
		t.Fatalf("handled %s, want [1 4 7 9]", got)
	}

	poisoned.Store(false) // the fix is deployed
	n, err := c.ReplayDeadLetter(context.Background(), dls[0].ID)
	if err != nil || n != 5 {
		t.Fatalf("replay handled %d events, %v; want 5", n, err)
	}
	if got := handledOffsets(t, pool); got != "[1 4 7 9 2 3 5 6 8]" {
		t.Fatalf("handled %s, want the dead letter then its parked events in order", got)
	}
	if n := queryInt(t, pool, `SELECT (SELECT count(*) FROM dead_letter_queue) + (SELECT count(*) FROM parked_events)
		+ (SELECT count(*) FROM parked_hosts)`); n != 0 {
		t.Fatalf("%d dead letters, parked events or parked hosts left after the replay", n)
	}
	appendTx(t, pool, ev("a", "t", `{}`)) // 10: flows again
	waitHandled(t, pool, 10, 10*time.Second)
	checkHandledOrderOnly(t, pool)
}

// checkHandledOrderOnly asserts per-host order over the handled table.
func checkHandledOrderOnly(t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	// A host's order is (layout, offset): a host is in one partition per
	// layout, whose offsets are commit-ordered.
	if n := queryInt(t, pool, `SELECT count(*) FROM (
		SELECT v, c_offset, lag(v) OVER w AS prev_v, lag(c_offset) OVER w AS prev
		FROM (SELECT h.*, (SELECT max(l.version) FROM topic_layouts l
		                   WHERE l.topic_id = 1 AND layout_start(1, l.version, h.partition_id) <= h.c_offset) AS v
		      FROM handled h) x
		WINDOW w AS (PARTITION BY host_id ORDER BY seq)) y
		WHERE (prev_v, prev) > (v, c_offset)`); n != 0 {
		t.Fatalf("%d events handled out of host order", n)
	}
}

// TestDiscardReleasesParkedEvents: discarding a dead letter handles the
// events parked behind it, in order, and not the dead unit.
func TestDiscardReleasesParkedEvents(t *testing.T) {
	t.Parallel()
	pool, poisoned := poisonTopic(t, 1)
	c := startConsumer(t, pool, Config{TotalPartitions: 1, OnPermanentFailure: PolicyParkHost, Handlers: poisonHandlers(poisoned)})
	appendTx(t, pool, ev("a", "t", `{"poison":true}`)) // 1
	appendTx(t, pool, ev("a", "t", `{}`))              // 2
	appendTx(t, pool, ev("a", "t", `{}`))              // 3
	waitPosition(t, pool, 4)
	dls, err := ListDeadLetters(context.Background(), pool, "g")
	if err != nil || len(dls) != 1 {
		t.Fatalf("dead letters %v, %v", dls, err)
	}
	if n, err := c.DiscardDeadLetter(context.Background(), dls[0].ID); err != nil || n != 2 {
		t.Fatalf("discard handled %d, %v; want 2", n, err)
	}
	if got := handledOffsets(t, pool); got != "[2 3]" {
		t.Fatalf("handled %s, want [2 3]", got)
	}
}

// TestPolicyHalt: nothing after the failing unit in its partition is
// handled, the stop is recorded and counted; a restart with the fix goes on
// and clears the record.
func TestPolicyHalt(t *testing.T) {
	t.Parallel()
	pool, poisoned := poisonTopic(t, 1)
	cfg := Config{TotalPartitions: 1, OnPermanentFailure: PolicyHalt, Handlers: poisonHandlers(poisoned)}
	c1, stop1 := startStoppableConsumer(t, pool, cfg)
	// Units of several events and hosts, the poison not first in its unit.
	appendTx(t, pool, ev("a", "t", `{}`), ev("b", "t", `{}`))              // 1, 2
	appendTx(t, pool, ev("a", "t", `{}`), ev("b", "t", `{"poison":true}`)) // 3, 4: halts at 3
	appendTx(t, pool, ev("a", "t", `{}`))                                  // 5
	appendTx(t, pool, ev("c", "t", `{}`))                                  // 6
	pgtest.WaitFor(t, 10*time.Second, "halt recorded", func() bool {
		return queryInt(t, pool, `SELECT count(*) FROM partition_halts WHERE c_offset = 3 AND reason = 'poison event'`) == 1
	})
	// The worker counts the halt once its row is written, which the test
	// can see first.
	pgtest.WaitFor(t, 10*time.Second, "the halt counted", func() bool { return c1.Stats().Halts >= 1 })
	if c1.Stats().Halts != 1 || !workerOf(c1, 0).halted.Load() {
		t.Fatalf("halt not reported: %+v", c1.Stats())
	}
	if got := handledOffsets(t, pool); got != "[1 2]" {
		t.Fatalf("handled %s, want [1 2]", got)
	}
	if n := queryInt(t, pool, `SELECT next_offset FROM consumer_offsets`); n != 3 {
		t.Fatalf("position %d, want 3: the partition stops at the failing unit", n)
	}
	if n := queryInt(t, pool, `SELECT count(*) FROM dead_letter_queue`); n != 0 {
		t.Fatalf("%d dead letters under halt", n)
	}
	stop1()
	poisoned.Store(false)
	startConsumer(t, pool, cfg)
	waitHandled(t, pool, 6, 10*time.Second)
	if got := handledOffsets(t, pool); got != "[1 2 3 4 5 6]" {
		t.Fatalf("handled %s after the restart, want [1 2 3 4 5 6]", got)
	}
	pgtest.WaitFor(t, 5*time.Second, "halt record cleared", func() bool {
		return queryInt(t, pool, `SELECT count(*) FROM partition_halts`) == 0
	})
}

// TestDeadLetterCircuitBreaker: past MaxDeadLetters within the window, the
// next permanent failure halts the partition.
func TestDeadLetterCircuitBreaker(t *testing.T) {
	t.Parallel()
	pool, poisoned := poisonTopic(t, 1)
	c := startConsumer(t, pool, Config{TotalPartitions: 1, MaxDeadLetters: 2, Handlers: poisonHandlers(poisoned)})
	for range 4 { // units 1-2, 3-4, 5-6 (halts here), 7-8; the poison is not first
		appendTx(t, pool, ev("a", "t", `{}`), ev("b", "t", `{"poison":true}`))
	}
	appendTx(t, pool, ev("a", "t", `{}`))
	pgtest.WaitFor(t, 10*time.Second, "breaker halts the partition", func() bool {
		return queryInt(t, pool, `SELECT count(*) FROM partition_halts WHERE c_offset = 5`) == 1
	})
	if n := queryInt(t, pool, `SELECT count(*) FROM dead_letter_queue`); n != 2 || c.Stats().DeadLettered != 2 {
		t.Fatalf("%d dead letters before the breaker, want 2", n)
	}
}

// TestSerializationFailureBacksOff: a handler failing with SQLSTATE 40001
// for a while: nothing dead-lettered, retry intervals grow to the cap,
// everything handled in order afterwards, and another partition keeps
// flowing meanwhile.
func TestSerializationFailureBacksOff(t *testing.T) {
	t.Parallel()
	pool := newTopic(t, 2)
	mustExec(t, pool, handledTable)
	var (
		mu       sync.Mutex
		attempts []time.Time
		until    = time.Now().Add(4 * time.Second)
	)
	record := SQLHandler("g", recordSQL)
	hs := &Handlers{}
	hs.HandleAll(HandlerFunc(func(ctx context.Context, tx pgx.Tx, ev *Event) error {
		if ev.EventType == "flaky" && time.Now().Before(until) {
			mu.Lock()
			attempts = append(attempts, time.Now())
			mu.Unlock()
			return &pgconn.PgError{Code: "40001", Message: "could not serialize access due to concurrent update"}
		}
		return record.Handle(ctx, tx, ev)
	}))
	const cap = 800 * time.Millisecond
	startConsumer(t, pool, Config{TotalPartitions: 2, Handlers: hs, RetryInitial: 50 * time.Millisecond, RetryMax: cap})
	a, b := hostIn(t, pool, 2, 0), hostIn(t, pool, 2, 1)
	appendTx(t, pool, ev(a, "flaky", `{}`))
	appendTx(t, pool, ev(a, "t", `{}`))
	// The other partition flows while the first one retries.
	for i := range 3 {
		appendTx(t, pool, ev(b, "t", `{}`))
		waitHandled(t, pool, int64(i+1), 2*time.Second)
	}
	waitHandled(t, pool, 5, 15*time.Second)
	checkHandled(t, pool)
	if n := queryInt(t, pool, `SELECT count(*) FROM dead_letter_queue`); n != 0 {
		t.Fatalf("%d dead letters for a transient failure", n)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(attempts) < 5 {
		t.Fatalf("%d attempts in 4 s; the backoff should have retried more", len(attempts))
	}
	var gaps []time.Duration
	for i := 1; i < len(attempts); i++ {
		gaps = append(gaps, attempts[i].Sub(attempts[i-1]))
	}
	// Jitter keeps each wait in [d/2, d]: the later waits must be longer
	// than the first ones, and none beyond the cap (plus scheduling slack).
	if gaps[len(gaps)-1] < 2*gaps[0] {
		t.Errorf("waits did not grow: %v", gaps)
	}
	for _, g := range gaps {
		if g > cap+200*time.Millisecond {
			t.Errorf("a wait of %s exceeds the %s cap: %v", g, cap, gaps)
		}
	}
}

// hostIn returns a host that maps to partition p of n.
func hostIn(t *testing.T, pool *pgxpool.Pool, n, p int) string {
	t.Helper()
	for i := 0; ; i++ {
		h := fmt.Sprintf("host-%d", i)
		if queryInt(t, pool, `SELECT event_partition($1, $2)`, h, n) == int64(p) {
			return h
		}
	}
}

// TestMissingTableIsNotDeadLettered: a consumer whose handler's table does
// not exist yet (42P01) dead-letters nothing and catches up once it does.
func TestMissingTableIsNotDeadLettered(t *testing.T) {
	t.Parallel()
	pool := newTopic(t, 1)
	hs := &Handlers{}
	hs.HandleAll(SQLHandler("g", recordSQL))
	c := startConsumer(t, pool, Config{TotalPartitions: 1, Handlers: hs, RetryInitial: 20 * time.Millisecond, RetryMax: 100 * time.Millisecond, MaxAttempts: 1})
	for range 5 {
		appendTx(t, pool, ev("a", "t", `{}`))
	}
	pgtest.WaitFor(t, 10*time.Second, "deployment failures counted", func() bool { return c.Stats().DeploymentFailures >= 3 })
	if n := queryInt(t, pool, `SELECT count(*) FROM dead_letter_queue`); n != 0 {
		t.Fatalf("%d dead letters for a missing table", n)
	}
	mustExec(t, pool, handledTable) // the migration arrives
	waitHandled(t, pool, 5, 10*time.Second)
	checkHandled(t, pool)
}

// TestPanicTimeoutAndUndecodablePayload: each is classified and ends in
// the dead-letter table with its reason, and the events around them are
// handled.
func TestPanicTimeoutAndUndecodablePayload(t *testing.T) {
	t.Parallel()
	pool := newTopic(t, 1)
	mustExec(t, pool, handledTable)
	record := SQLHandler("g", recordSQL)
	hs := &Handlers{}
	hs.HandleAll(record)
	hs.HandleFunc("panics", func(context.Context, pgx.Tx, *Event) error { panic("handler bug") })
	var timeouts atomic.Int64
	hs.HandleFunc("hangs", func(ctx context.Context, tx pgx.Tx, ev *Event) error {
		timeouts.Add(1)
		<-ctx.Done() // never finishes in time
		return ctx.Err()
	})
	hs.Handle("typed", JSONHandler(func(ctx context.Context, tx pgx.Tx, ev *Event, p struct{ N int }) error {
		return record.Handle(ctx, tx, ev)
	}))
	startConsumer(t, pool, Config{TotalPartitions: 1, Handlers: hs, HandlerTimeout: 150 * time.Millisecond,
		MaxAttempts: 2, RetryInitial: 10 * time.Millisecond, RetryMax: 20 * time.Millisecond})
	appendTx(t, pool, ev("a", "t", `{}`))            // 1
	appendTx(t, pool, ev("a", "panics", `{}`))       // 2
	appendTx(t, pool, ev("a", "hangs", `{}`))        // 3
	appendTx(t, pool, ev("a", "typed", `{"N":1}`))   // 4
	appendTx(t, pool, ev("a", "typed", `{"N":"x"}`)) // 5
	appendTx(t, pool, ev("a", "t", `{}`))            // 6
	waitPosition(t, pool, 7)
	if got := handledOffsets(t, pool); got != "[1 4 6]" {
		t.Fatalf("handled %s, want [1 4 6]", got)
	}
	rows, err := pool.Query(context.Background(), `SELECT first_offset || ': ' || error FROM dead_letter_queue ORDER BY first_offset`)
	if err != nil {
		t.Fatal(err)
	}
	dls, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"2: handler panicked: handler bug", "3: handler timeout", "5: decode payload"}
	if len(dls) != len(want) {
		t.Fatalf("dead letters %q, want %q", dls, want)
	}
	for i := range want {
		if !strings.HasPrefix(dls[i], want[i]) {
			t.Errorf("dead letter %q, want one starting %q", dls[i], want[i])
		}
	}
	// A timeout counts an attempt of the unit run alone: MaxAttempts (2)
	// runs at least, one more when it first timed out behind other units.
	if n := timeouts.Load(); n < 2 || n > 3 {
		t.Errorf("the hanging handler ran %d times; want MaxAttempts (2), or 3 after a narrowing", n)
	}
}

// TestParkedBehindTwoDeadLetters: a unit touching hosts parked
// behind two dead letters stays parked until both are resolved, whatever
// the order of resolution; and within one batch, a host that a parked unit
// touches is parked for the rest of the batch.
func TestParkedBehindTwoDeadLetters(t *testing.T) {
	t.Parallel()
	pool, poisoned := poisonTopic(t, 1)
	c := startConsumer(t, pool, Config{TotalPartitions: 1, OnPermanentFailure: PolicyParkHost, Handlers: poisonHandlers(poisoned)})
	appendTx(t, pool, ev("a", "t", `{"poison":true}`))        // 1: DL1, parks a
	appendTx(t, pool, ev("b", "t", `{"poison":true}`))        // 2: DL2, parks b
	appendTx(t, pool, ev("b", "t", `{}`))                     // 3: parked behind DL2
	appendTx(t, pool, ev("a", "t", `{}`), ev("b", "t", `{}`)) // 4, 5: parked behind both
	appendTx(t, pool, ev("b", "t", `{}`))                     // 6: parked
	appendTx(t, pool, ev("c", "t", `{}`))                     // 7: flows
	waitPosition(t, pool, 8)
	if got := handledOffsets(t, pool); got != "[7]" {
		t.Fatalf("handled %s, want [7]", got)
	}
	dls, err := ListDeadLetters(context.Background(), pool, "g")
	if err != nil || len(dls) != 2 {
		t.Fatalf("dead letters %+v, %v", dls, err)
	}
	poisoned.Store(false)
	// Discard DL2 first: 3 is released (b waits behind nothing else before
	// it), but 4-5 still wait behind DL1, and so does 6, behind 4-5's b.
	if n, err := c.DiscardDeadLetter(context.Background(), dls[1].ID); err != nil || n != 1 {
		t.Fatalf("discard of DL2 handled %d, %v; want 1 (offset 3)", n, err)
	}
	if got := handledOffsets(t, pool); got != "[7 3]" {
		t.Fatalf("handled %s after discarding DL2, want [7 3]", got)
	}
	appendTx(t, pool, ev("b", "t", `{}`)) // 8: b is still parked (behind 4-5)
	waitPosition(t, pool, 9)
	if got := handledOffsets(t, pool); got != "[7 3]" {
		t.Fatalf("handled %s: b's later event ran before its parked unit", got)
	}
	if n, err := c.ReplayDeadLetter(context.Background(), dls[0].ID); err != nil || n != 5 {
		t.Fatalf("replay of DL1 handled %d, %v; want 5 (1, 4, 5, 6, 8)", n, err)
	}
	if got := handledOffsets(t, pool); got != "[7 3 1 4 5 6 8]" {
		t.Fatalf("handled %s, want [7 3 1 4 5 6 8]", got)
	}
	if n := queryInt(t, pool, `SELECT (SELECT count(*) FROM dead_letter_queue) + (SELECT count(*) FROM parked_events)
		+ (SELECT count(*) FROM parked_hosts)`); n != 0 {
		t.Fatalf("%d dead letters, parked events or parked hosts left", n)
	}
	checkHandledOrderOnly(t, pool)
}

// TestParkedUnitParksItsHostsWithinTheBatch: in one batch, a
// unit parked because it touches a parked host parks its other hosts for
// the rest of the batch.
func TestParkedUnitParksItsHostsWithinTheBatch(t *testing.T) {
	t.Parallel()
	pool, poisoned := poisonTopic(t, 1)
	appendTx(t, pool, ev("a", "t", `{"poison":true}`))        // 1: dead letter, parks a
	appendTx(t, pool, ev("a", "t", `{}`), ev("b", "t", `{}`)) // 2, 3: parked, parks b
	appendTx(t, pool, ev("b", "t", `{}`))                     // 4: parked in the same batch
	appendTx(t, pool, ev("c", "t", `{}`))                     // 5: flows
	c := startConsumer(t, pool, Config{TotalPartitions: 1, OnPermanentFailure: PolicyParkHost, Handlers: poisonHandlers(poisoned)})
	waitPosition(t, pool, 6)
	if got := handledOffsets(t, pool); got != "[5]" {
		t.Fatalf("handled %s, want [5]: b's event 4 must wait behind the parked 3", got)
	}
	dls, err := ListDeadLetters(context.Background(), pool, "g")
	if err != nil || len(dls) != 1 {
		t.Fatalf("dead letters %+v, %v", dls, err)
	}
	poisoned.Store(false)
	if n, err := c.ReplayDeadLetter(context.Background(), dls[0].ID); err != nil || n != 4 {
		t.Fatalf("replay handled %d, %v; want 4", n, err)
	}
	if got := handledOffsets(t, pool); got != "[5 1 2 3 4]" {
		t.Fatalf("handled %s, want [5 1 2 3 4]", got)
	}
}

// TestPoisonUnitTouchingAParkedHostIsParked: a unit that fails
// permanently in its first chunk and touches a parked host in a later one
// (BatchSize 1 claims two events and reads the rest of a unit an event at a
// time) is parked behind that host's dead letter, not dead-lettered
// itself: a dead letter holding b's event 6 while b's earlier event 3
// waits parked would, once replayed, handle 6 before 3 (the soak's seed
// 1795545952976593459 did so).
func TestPoisonUnitTouchingAParkedHostIsParked(t *testing.T) {
	t.Parallel()
	pool, poisoned := poisonTopic(t, 1)
	appendTx(t, pool, ev("a", "t", `{"poison":true}`))        // 1: dead letter, parks a
	appendTx(t, pool, ev("a", "t", `{}`), ev("b", "t", `{}`)) // 2, 3: parked, parks b
	appendTx(t, pool, ev("c", "t", `{"poison":true}`), ev("c", "t", `{}`),
		ev("b", "t", `{}`)) // 4-6: b is parked, found in the unit's second chunk
	appendTx(t, pool, ev("c", "t", `{}`)) // 7: parked behind 4-6's c
	appendTx(t, pool, ev("d", "t", `{}`)) // 8: flows
	c := startConsumer(t, pool, Config{TotalPartitions: 1, BatchSize: 1, OnPermanentFailure: PolicyParkHost, Handlers: poisonHandlers(poisoned)})
	waitPosition(t, pool, 9)
	dls, err := ListDeadLetters(context.Background(), pool, "g")
	if err != nil {
		t.Fatal(err)
	}
	if len(dls) != 1 || dls[0].FirstOffset != 1 {
		t.Fatalf("dead letters %+v; want one, of offset 1 (4-6 touches the parked b)", dls)
	}
	if got := handledOffsets(t, pool); got != "[8]" {
		t.Fatalf("handled %s, want [8]", got)
	}
	poisoned.Store(false)
	if n, err := c.ReplayDeadLetter(context.Background(), dls[0].ID); err != nil || n != 7 {
		t.Fatalf("replay handled %d, %v; want 7 (1 to 7)", n, err)
	}
	if got := handledOffsets(t, pool); got != "[8 1 2 3 4 5 6 7]" {
		t.Fatalf("handled %s, want [8 1 2 3 4 5 6 7]", got)
	}
	checkHandledOrderOnly(t, pool)
}

// TestParkedReplayAfterRepartition: a dead letter with events
// parked behind it, then the topic goes from 2 partitions to 1: the switch
// moves the dead letter and its parked events with their host, and the
// replay, under the group's locks in the new layout, handles them in order.
func TestParkedReplayAfterRepartition(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool, poisoned := poisonTopic(t, 2)
	c := startConsumer(t, pool, Config{TotalPartitions: 2, OnPermanentFailure: PolicyParkHost, Handlers: poisonHandlers(poisoned)})
	a, b := hostIn(t, pool, 2, 1), hostIn(t, pool, 2, 0)
	var o [7]int64                                             // the offsets of events 1..6 (per partition under scope 'partition')
	o[1] = appendTx(t, pool, ev(a, "t", `{"poison":true}`))[0] // 1: dead letter in partition 1
	o[2] = appendTx(t, pool, ev(a, "t", `{}`))[0]              // 2: parked
	o[3] = appendTx(t, pool, ev(b, "t", `{}`))[0]              // 3: handled
	pgtest.WaitFor(t, 10*time.Second, "the poison dead-lettered and its successor parked", func() bool {
		return queryInt(t, pool, `SELECT count(*) FROM parked_events`) == 1 && queryInt(t, pool, `SELECT count(*) FROM handled`) == 1
	})
	if _, err := schema.Repartition(ctx, pool, 1, 1); err != nil {
		t.Fatal(err)
	}
	o[4] = appendTx(t, pool, ev(a, "t", `{}`))[0] // 4: parked, in the new layout's partition 0
	o[5] = appendTx(t, pool, ev(b, "t", `{}`))[0] // 5: handled
	pgtest.WaitFor(t, 10*time.Second, "the group in the new layout, 4 parked and 5 handled", func() bool {
		return queryInt(t, pool, `SELECT version FROM group_layouts WHERE group_id = 'g'`) == 2 &&
			queryInt(t, pool, `SELECT count(*) FROM parked_events`) == 2 && queryInt(t, pool, `SELECT count(*) FROM handled`) == 2
	})
	if n := queryInt(t, pool, `SELECT (SELECT count(*) FROM parked_events WHERE partition_id <> 0)
		+ (SELECT count(*) FROM dead_letter_queue WHERE partition_id <> 0) + (SELECT count(*) FROM parked_hosts WHERE partition_id <> 0)`); n != 0 {
		t.Fatalf("%d dead letters or parked rows left in a partition the layout no longer has", n)
	}
	dls, err := ListDeadLetters(ctx, pool, "g")
	if err != nil || len(dls) != 1 {
		t.Fatalf("dead letters %+v, %v", dls, err)
	}
	poisoned.Store(false)
	if n, err := c.ReplayDeadLetter(ctx, dls[0].ID); err != nil || n != 3 {
		t.Fatalf("replay after repartition handled %d, %v; want 3", n, err)
	}
	if got, want := handledOffsets(t, pool), fmt.Sprint([]int64{o[3], o[5], o[1], o[2], o[4]}); got != want {
		t.Fatalf("handled %s, want events 3 5 1 2 4: %s", got, want)
	}
	appendTx(t, pool, ev(a, "t", `{}`)) // 6: flows again
	waitHandled(t, pool, 6, 10*time.Second)
	checkHandledOrderOnly(t, pool)
}
