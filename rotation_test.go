package pgevents

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/rs/zerolog"

	"github.com/pgevents/pgevents/internal/pgtest"
	"github.com/pgevents/pgevents/schema"
)

// TestRotationAfterAnOpenProducer reproduces a staging rotation held back
// by an open REPEATABLE READ producer transaction, and checks that it
// happens at once after that transaction ends, not a period later.
//
// An append to a sequenced topic reads the current staging generation
// (log_counter.stage_gen) in its transaction's snapshot. A REPEATABLE
// READ transaction's snapshot is taken at its first statement: one that
// appends two rotations after it began writes into the generation the
// next rotation empties, which rotate_stage refuses while the writer is
// open (its lock) and until its events are sequenced. Here the producer
// begins its snapshot after one rotation, appends after two more, so the
// next one is refused, and commits after that refusal. The rotation
// follows its commit within rotateRetry (and the tick that sequences its
// event): it used to be tried a whole period later. Nothing is lost: the
// producer's event is in the log.
func TestRotationAfterAnOpenProducer(t *testing.T) {
	t.Parallel()
	const period = 6 * time.Second
	ctx := pgtest.Context(context.Background())
	pool := pgtest.TopicPoolSpec(t, schema.TopicSpec{ID: 1, Partitions: 2, Scope: schema.ScopeSequenced})
	startSequencer(ctx, t, pool, sequencerTiming{every: period, retry: 100 * time.Millisecond})
	gen := func() int {
		var g int16
		if err := pool.QueryRow(ctx, `SELECT stage_gen FROM log_counter WHERE topic_id = 1`).Scan(&g); err != nil {
			t.Fatal(err)
		}
		return int(g)
	}
	// rotated waits for the rotation after generation from, and returns
	// the generation it made current and when it was seen.
	rotated := func(from int, within time.Duration) (int, time.Time) {
		t.Helper()
		var g int
		pgtest.WaitFor(t, within, "a rotation of the staging tables", func() bool { g = gen(); return g != from })
		return g, time.Now()
	}

	g0, _ := rotated(gen(), period+5*time.Second)
	tx, err := pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)                              //nolint:errcheck
	if _, err := tx.Exec(ctx, `SELECT 1`); err != nil { // the snapshot: generation g0 current
		t.Fatal(err)
	}
	g1, _ := rotated(g0, period+5*time.Second)
	g2, last := rotated(g1, period+5*time.Second)
	if _, err := Append(ctx, tx, Event{HostID: "h", EventType: "held"}); err != nil { // into g0: the next to empty
		t.Fatal(err)
	}
	// The next rotation, due a period after the last, is refused: the
	// sequencer tries it within idleCheck of its due time.
	time.Sleep(time.Until(last.Add(period + idleCheck + 500*time.Millisecond)))
	if g := gen(); g != g2 {
		t.Fatalf("generation %d, into which an open transaction wrote, was emptied and made current (from %d)", g, g2)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	committed := time.Now()
	g3, at := rotated(g2, 2*period)
	if g3 != g0 {
		t.Fatalf("rotated to generation %d, want %d", g3, g0)
	}
	if waited := at.Sub(committed); waited > 2*time.Second {
		t.Errorf("the rotation came %s after the producer's commit, want within 2s (it was refused once already, and is tried again every rotateRetry)", waited)
	}
	pgtest.WaitFor(t, 10*time.Second, "the held event sequenced", func() bool {
		return queryInt(t, pool, `SELECT count(*) FROM outbox_message_t WHERE event_type = 'held'`) == 1
	})
}

// TestSleepingSequencerWakesOnAppend: an idle sequencer sleeps (its session
// holds the topic's sleep key) until an append notifies it, not until its
// own next look, which comes once a minute here. Each append, made while
// the sequencer sleeps, through Go (Append in a transaction, two events)
// or SQL (append_event with and without an idempotency key,
// append_events), is in the log within seconds. Without the wake-up (the
// sequencer not reading it, or appends not sending it), the first append
// waits the minute.
func TestSleepingSequencerWakesOnAppend(t *testing.T) {
	t.Parallel()
	ctx := pgtest.Context(context.Background())
	pool := pgtest.TopicPoolSpec(t, schema.TopicSpec{ID: 1, Partitions: 2, Scope: schema.ScopeSequenced})
	startSequencer(ctx, t, pool, sequencerTiming{every: rotateEvery, retry: rotateRetry, idle: time.Minute})
	forms := []struct {
		name   string
		events int
		append func()
	}{
		{"Append in a transaction", 2, func() { appendTx(t, pool, ev("h1", "t", `{}`), ev("h2", "t", `{}`)) }},
		{"SQL append_event", 1, func() { mustExec(t, pool, `SELECT append_event(1, 'h3', '', 't', '{}')`) }},
		{"SQL append_event with a key", 1, func() { mustExec(t, pool, `SELECT append_event(1, 'h4', '', 't', '{}', NULL, 'k4')`) }},
		{"SQL append_events", 2, func() {
			mustExec(t, pool, `SELECT append_events(1, '[{"host_id":"h5","event_type":"t"},{"host_id":"h6","event_type":"t"}]')`)
		}},
	}
	logged := int64(0)
	for _, f := range forms {
		pgtest.WaitFor(t, 10*time.Second, "the sequencer asleep before "+f.name, func() bool { return heldKey(t, pool, "sequencer", "1/sleep", "ExclusiveLock") == 1 })
		f.append()
		logged += int64(f.events)
		pgtest.WaitFor(t, 10*time.Second, fmt.Sprintf("the events of %s in the log (the sequencer's own look comes after a minute)", f.name), func() bool {
			return queryInt(t, pool, `SELECT count(*) FROM outbox_message_t WHERE topic_id = 1`) == logged
		})
	}
}

// startSequencer runs topic 1's sequencer on pool with timing until the
// test ends, and fails the test if Sequence returns an error.
func startSequencer(ctx context.Context, t *testing.T, pool *pgxpool.Pool, timing sequencerTiming) {
	t.Helper()
	log := zerolog.Nop()
	sctx, stop := context.WithCancel(context.WithValue(ctx, timingKey{}, timing))
	done := make(chan error, 1)
	go func() { done <- Sequence(sctx, pool, 1, "test", &log) }()
	t.Cleanup(func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("Sequence: %v", err)
		}
	})
}
