package pgevents

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgevents/pgevents/internal/pgtest"
	"github.com/pgevents/pgevents/offsets"
	"github.com/pgevents/pgevents/schema"
)

// The tests of this file time an operator's command that makes partitions
// eligible again (a resume, an unhalt, a repartition's layout switch) from
// its return to the handling of an event appended at once, with the
// consumer's production timing (the subscription's heartbeat every 5 s, a
// halted worker's check every second) and the poll at an hour. The command
// notifies the group's consumers at its commit (store.NotifyEligible), so
// the event is handled within milliseconds; commandWithin is far above
// that, so that a loaded -race run does not fail it, and below the
// periods the consumers followed the commands at before (a resume was seen
// at the next heartbeat, 2.9 s later on average; an unhalt at the next
// check). The tests that time it run alone in the package, not in
// parallel (t.Parallel): beside the package's other tests, the
// partition-scope pass of a loaded -race make test took 493 ms and more,
// where a run alone takes 14–117 ms.
const commandWithin = 500 * time.Millisecond

// handledWithin appends one event (of host) and waits until n events are
// handled, failing the test unless they are within commandWithin of since.
// It returns how long after since they were.
func handledWithin(t *testing.T, pool *pgxpool.Pool, since time.Time, n int64, host, what string) time.Duration {
	t.Helper()
	appendTx(t, pool, ev(host, "t", `{}`))
	deadline := since.Add(commandWithin)
	for queryInt(t, pool, `SELECT count(*) FROM handled`) < n {
		if time.Now().After(deadline) {
			t.Fatalf("an event appended at once after %s was not handled within %s of its return (poll at an hour)", what, commandWithin)
		}
		time.Sleep(2 * time.Millisecond)
	}
	return time.Since(since)
}

// TestResumeWakesWithinMilliseconds: pause then resume a group three
// times; each time an event appended as the resume returns is handled
// within commandWithin of it (the consumer used to see the resume at its
// next subscription heartbeat, up to 5 s later).
func TestResumeWakesWithinMilliseconds(t *testing.T) {
	pool := newTopic(t, 2)
	mustExec(t, pool, handledTable)
	c := startConsumer(t, pool, Config{TotalPartitions: 2, WaitPeriod: time.Hour, Handlers: recordingHandlers()})
	pgtest.WaitFor(t, 10*time.Second, "the consumer to own its partitions", func() bool { return c.Owned() == 2 })
	ctx := context.Background()
	var n int64
	for round := range 3 {
		if _, err := offsets.Pause(ctx, pool, "g", 1); err != nil {
			t.Fatal(err)
		}
		pgtest.WaitFor(t, 10*time.Second, "the consumer to see the pause", func() bool { return c.paused.Load() })
		if _, err := offsets.Resume(ctx, pool, "g", 1); err != nil {
			t.Fatal(err)
		}
		n++
		took := handledWithin(t, pool, time.Now(), n, fmt.Sprintf("h%d", round), "a resume")
		t.Logf("round %d: handled %s after the resume returned", round, took.Round(time.Microsecond))
	}
}

// TestUnhaltWakesWithinMilliseconds: a partition halts on a poison unit
// three times; each time, once the cause is fixed, an unhalt is followed
// within commandWithin by the unit and an event appended as it returns
// (the halted worker used to see the unhalt at its next check, up to a
// second later).
func TestUnhaltWakesWithinMilliseconds(t *testing.T) {
	pool, poisoned := poisonTopic(t, 1)
	cfg := Config{TotalPartitions: 1, WaitPeriod: time.Hour, Handlers: poisonHandlers(poisoned), OnPermanentFailure: PolicyHalt}
	c := startConsumer(t, pool, cfg)
	ctx := context.Background()
	var n int64
	for round := range 3 {
		poisoned.Store(true)
		appendTx(t, pool, ev("a", "t", `{"poison": true}`))
		pgtest.WaitFor(t, 10*time.Second, "the partition to halt", func() bool {
			w := workerOf(c, 0)
			return c.Stats().Halts == int64(round+1) && w != nil && w.halted.Load()
		})
		poisoned.Store(false)
		if _, ok, err := offsets.Unhalt(ctx, pool, "g", 1, 0); err != nil || !ok {
			t.Fatalf("unhalt: %v, %v", ok, err)
		}
		n += 2 // the unit, and the event after it
		took := handledWithin(t, pool, time.Now(), n, "a", "an unhalt")
		t.Logf("round %d: handled %s after the unhalt returned", round, took.Round(time.Microsecond))
	}
	checkHandled(t, pool)
}

// TestLayoutSwitchWakesWithinMilliseconds: two replicas of a group on a
// topic of 2 partitions; the topic is repartitioned to 4 while they idle.
// Events appended to every partition of the new layout as the repartition
// returns are handled within commandWithin of it: the replicas learn of
// the cut, the one that finds the group done below it switches the layout,
// and the other follows, each at a notification.
func TestLayoutSwitchWakesWithinMilliseconds(t *testing.T) {
	pool := newTopic(t, 2)
	mustExec(t, pool, handledTable)
	cfg := Config{TotalPartitions: 2, WaitPeriod: time.Hour, Handlers: recordingHandlers()}
	a := startConsumer(t, pool, cfg)
	b := startConsumer(t, pool, cfg)
	pgtest.WaitFor(t, 10*time.Second, "the replicas to share the partitions", func() bool { return a.Owned() == 1 && b.Owned() == 1 })
	for i := range 8 {
		appendTx(t, pool, ev(fmt.Sprintf("h%d", i), "t", `{}`))
	}
	waitHandled(t, pool, 8, 10*time.Second)
	ctx := context.Background()
	if _, err := schema.Repartition(ctx, pool, 1, 4); err != nil {
		t.Fatal(err)
	}
	for i := range 15 {
		appendTx(t, pool, ev(fmt.Sprintf("h%d", i), "t", `{}`))
	}
	if n := queryInt(t, pool, `SELECT count(DISTINCT partition_id) FROM outbox_message_t WHERE c_offset >= layout_start(1, 2, partition_id)`); n != 4 {
		t.Fatalf("the events after the cut are in %d partitions, want 4", n)
	}
	// Timed from the 15 appends' end, not from the repartition's return:
	// on a loaded -race run the appends alone took most of commandWithin.
	// A consumer that followed the layout switch at its former period (20 s)
	// would still miss it by far.
	since := time.Now()
	took := handledWithin(t, pool, since, 24, "h15", "a repartition and 15 appends")
	t.Logf("handled %s after the appends that followed the repartition", took.Round(time.Microsecond))
	checkHandled(t, pool)
}
