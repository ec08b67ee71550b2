package pgevents

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgevents/pgevents/internal/pgtest"
	"github.com/pgevents/pgevents/internal/store"
	"github.com/pgevents/pgevents/offsets"
	"github.com/pgevents/pgevents/schema"
)

// The tests of this file check the rule that every change making a
// partition eligible again wakes it (Consumer.eligible): with the poll at
// an hour, an event appended right after the consumer observed the change
// must be handled at once. The bound, eligibleWithin, is far above a
// wake-up's milliseconds so that a loaded -race run does not fail it, and
// far below the poll.
const eligibleWithin = time.Second

// eligibleConfig is a one-partition consumer that polls once an hour and
// follows its subscription every half second.
func eligibleConfig(hs *Handlers) Config {
	return Config{TotalPartitions: 1, WaitPeriod: time.Hour, DeadAfter: 2 * time.Second, Handlers: hs}
}

// handledPromptly appends one event and fails the test unless it is
// handled within eligibleWithin: n events handled in all.
func handledPromptly(t *testing.T, pool *pgxpool.Pool, n int64, what string) {
	t.Helper()
	appendTx(t, pool, ev("probe", "t", `{}`))
	waitPrompt(t, pool, n, "an event appended after "+what)
}

// waitPrompt fails the test unless n events are handled within
// eligibleWithin.
func waitPrompt(t *testing.T, pool *pgxpool.Pool, n int64, what string) {
	t.Helper()
	deadline := time.Now().Add(eligibleWithin)
	for queryInt(t, pool, `SELECT count(*) FROM handled`) < n {
		if time.Now().After(deadline) {
			t.Fatalf("%s was not handled within %s (poll at an hour): nothing woke the partition", what, eligibleWithin)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// idleConsumer is a one-partition topic with a recording consumer
// (eligibleConfig) that has handled one event and gone idle.
func idleConsumer(t *testing.T) (*pgxpool.Pool, *Consumer) {
	t.Helper()
	pool := newTopic(t, 1)
	mustExec(t, pool, handledTable)
	c := startConsumer(t, pool, eligibleConfig(recordingHandlers()))
	handledPromptly(t, pool, 1, "the start")
	return pool, c
}

// pauseObserved pauses or resumes the group and waits until the consumer
// has observed it.
func pauseObserved(t *testing.T, pool *pgxpool.Pool, c *Consumer, pause bool) {
	t.Helper()
	ctx := context.Background()
	var err error
	if pause {
		_, err = offsets.Pause(ctx, pool, "g", 1)
	} else {
		_, err = offsets.Resume(ctx, pool, "g", 1)
	}
	if err != nil {
		t.Fatal(err)
	}
	pgtest.WaitFor(t, 10*time.Second, "the consumer to observe the group's state", func() bool { return c.paused.Load() == pause })
}

// TestResumeWakesThePartition: after a pause and a resume, an idle
// partition's next event is handled at once.
func TestResumeWakesThePartition(t *testing.T) {
	t.Parallel()
	pool, c := idleConsumer(t)
	pauseObserved(t, pool, c, true)
	pauseObserved(t, pool, c, false)
	handledPromptly(t, pool, 2, "a resume")
}

// TestStartWhilePausedThenResume: a consumer that starts while its group
// is paused handles the next event at once after the resume.
func TestStartWhilePausedThenResume(t *testing.T) {
	t.Parallel()
	pool := newTopic(t, 1)
	mustExec(t, pool, handledTable)
	_, stop := startStoppableConsumer(t, pool, eligibleConfig(recordingHandlers()))
	stop() // the group exists now
	if _, err := offsets.Pause(context.Background(), pool, "g", 1); err != nil {
		t.Fatal(err)
	}
	c := startConsumer(t, pool, eligibleConfig(recordingHandlers()))
	pgtest.WaitFor(t, 10*time.Second, "the consumer to own its partition", func() bool { return c.Owned() == 1 })
	if !c.paused.Load() {
		t.Fatal("the consumer started as if its group were active")
	}
	pauseObserved(t, pool, c, false)
	handledPromptly(t, pool, 1, "a resume of a consumer that started paused")
}

// TestUnhaltWakesThePartition: after an operator unhalts a halted
// partition (the cause fixed), the next event is handled at once.
func TestUnhaltWakesThePartition(t *testing.T) {
	t.Parallel()
	pool, poisoned := poisonTopic(t, 1)
	cfg := eligibleConfig(poisonHandlers(poisoned))
	cfg.OnPermanentFailure = PolicyHalt
	c := startConsumer(t, pool, cfg)
	appendTx(t, pool, ev("a", "t", `{"poison": true}`))
	pgtest.WaitFor(t, 10*time.Second, "the partition to halt", func() bool { return c.Stats().Halts == 1 })
	poisoned.Store(false)
	if _, _, err := offsets.Unhalt(context.Background(), pool, "g", 1, 0); err != nil {
		t.Fatal(err)
	}
	waitHandled(t, pool, 1, 10*time.Second) // the unit, tried again
	pgtest.WaitFor(t, 10*time.Second, "the worker to leave its halt", func() bool {
		w := workerOf(c, 0)
		return w != nil && !w.halted.Load()
	})
	handledPromptly(t, pool, 2, "an unhalt")
}

// TestNothingHandledAfterPauseReturns: a consumer handles a burst from
// several producers when an operator pauses its group. Once the pause has
// returned, no batch may commit (batches in flight finish before it
// returns; later claims see it), while producers go on appending; after
// the resume every event is handled once, in order.
func TestNothingHandledAfterPauseReturns(t *testing.T) {
	t.Parallel()
	pool := newTopic(t, 4)
	mustExec(t, pool, handledTable)
	c := startConsumer(t, pool, Config{TotalPartitions: 4, BatchSize: 5, WaitPeriod: time.Hour, Handlers: recordingHandlers()})
	ctx, stopProducers := context.WithCancel(context.Background())
	produced := make(chan int64)
	go func() {
		var n int64
		defer func() { produced <- n }()
		for i := 0; ctx.Err() == nil; i++ {
			evs := []Event{ev(fmt.Sprintf("h%d", i%7), "t", `{}`), ev(fmt.Sprintf("h%d", (i+3)%7), "t", `{}`), ev(fmt.Sprintf("h%d", (i+5)%7), "t", `{}`)}
			appendTx(t, pool, evs...)
			n += int64(len(evs))
		}
	}()
	pgtest.WaitFor(t, 10*time.Second, "the burst under way", func() bool { return queryInt(t, pool, `SELECT count(*) FROM handled`) >= 60 })
	if _, err := offsets.Pause(context.Background(), pool, "g", 1); err != nil {
		t.Fatal(err)
	}
	atPause := queryInt(t, pool, `SELECT count(*) FROM handled`)
	pgtest.WaitFor(t, 10*time.Second, "the consumer to see the pause", func() bool { return c.paused.Load() })
	time.Sleep(500 * time.Millisecond) // producers go on: a batch committing now would be seen below
	stopProducers()
	total := <-produced
	if n := queryInt(t, pool, `SELECT count(*) FROM handled`); n != atPause {
		t.Fatalf("%d events handled after the pause returned (%d at its return, %d now)", n-atPause, atPause, n)
	}
	if atPause >= total {
		t.Fatalf("the producers appended nothing after the pause (%d events, %d handled): the test proves nothing", total, atPause)
	}
	pauseObserved(t, pool, c, false)
	waitHandled(t, pool, total, 30*time.Second)
	checkHandled(t, pool)
}

// TestWakeModeAlwaysWhileAnAppendIsInFlight: the topic's wake-up mode
// turns 'always' while an append that started under 'waiting' is in
// flight on an awake partition (so it will notify nobody). Its event must
// still be handled at once when it commits: the watcher watches the
// appends that started before the switch to their commit.
func TestWakeModeAlwaysWhileAnAppendIsInFlight(t *testing.T) {
	t.Parallel()
	pool, c := idleConsumer(t)
	ctx := context.Background()
	producer, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer producer.Rollback(ctx) //nolint:errcheck
	if _, err := Append(ctx, producer, ev("a", "t", `{}`)); err != nil {
		t.Fatal(err)
	}
	if err := schema.SetWake(ctx, pool, 1, schema.WakeAlways); err != nil {
		t.Fatal(err)
	}
	_, channel, err := schema.TopicWake(ctx, pool, 1)
	if err != nil {
		t.Fatal(err)
	}
	mustExec(t, pool, `SELECT pg_notify($1, '1:*')`, channel) // poll now: the consumer reads the mode
	pgtest.WaitFor(t, 10*time.Second, "the consumer to see the mode 'always'", c.wakeAlways.Load)
	// The producer stays open past the claim's own wait for it
	// (store.AwaitAppendMax): its commit must be seen by the watcher.
	time.Sleep(store.AwaitAppendMax + 500*time.Millisecond)
	if err := producer.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	waitPrompt(t, pool, 2, "an append in flight when the wake-up mode turned 'always'")
	handledPromptly(t, pool, 3, "the switch to 'always'")
}
