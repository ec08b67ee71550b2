package schema_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/pgevents/pgevents/internal/pgtest"
	"github.com/pgevents/pgevents/schema"
)

// TestSequencedAppendsWakeSleepingSequencer: every SQL form of an append to
// a sequenced topic (append_event and append_events, with and without
// idempotency keys, one or two appends in a transaction) keeps the
// sequencer's sleep protocol (migration 0016, wake_sequencer): while the
// sequencer sleeps (its session holds the sleep key exclusive), the
// transaction notifies the sequencer's channel once, at its commit; while
// it is awake, the append holds the key shared until its commit, so that a
// sequencer about to sleep sees it in flight, and notifies nobody. A
// sentinel notification after each case orders what arrived: exactly one
// wake-up for a sleeping case, none for an awake one. Without the try-lock
// (wake_sequencer doing nothing), a sleeping sequencer sleeps on through
// the append; with a notification every time, awake cases notify.
func TestSequencedAppendsWakeSleepingSequencer(t *testing.T) {
	t.Parallel()
	ctx := pgtest.Context(context.Background())
	pool := pgtest.TopicPoolSpec(t, schema.TopicSpec{ID: 1, Partitions: 4, Scope: schema.ScopeSequenced})
	seq, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer seq.Release()
	mustExec(t, seq, `LISTEN pgevents_sequencer`)
	const sleepKey = `lock_key('sequencer', '1/sleep')`
	forms := []struct{ name, sql string }{
		{"append_event", `SELECT append_event(1, 'h1', '', 't', '{}')`},
		{"append_event with a key", `SELECT append_event(1, 'h2', '', 't', '{}', NULL, 'k' || clock_timestamp()::text || random()::text)`},
		{"append_events", `SELECT append_events(1, '[{"host_id":"h3","event_type":"t"},{"host_id":"h4","event_type":"t"}]')`},
		{"append_events with keys", `SELECT append_events(1, jsonb_build_array(jsonb_build_object('host_id', 'h5', 'event_type', 't', 'idempotency_key', 'k' || clock_timestamp()::text || random()::text)))`},
	}
	n := 0
	for _, f := range forms {
		for _, appends := range []int{1, 2} {
			for _, asleep := range []bool{true, false} {
				n++
				name := fmt.Sprintf("%s ×%d, sequencer %s", f.name, appends, map[bool]string{true: "asleep", false: "awake"}[asleep])
				if asleep {
					var got bool
					if err := seq.QueryRow(ctx, `SELECT pg_try_advisory_lock(`+sleepKey+`)`).Scan(&got); err != nil || !got {
						t.Fatalf("%s: the sequencer's session could not take its sleep key (%v, %v)", name, got, err)
					}
				}
				tx, err := pool.Begin(ctx)
				if err != nil {
					t.Fatal(err)
				}
				// On a failure, the pool's close waits for the transaction's
				// connection: rolled back (nothing once committed).
				defer func() { _ = tx.Rollback(context.Background()) }()
				for range appends {
					mustExec(t, tx, f.sql)
				}
				if !asleep {
					// In flight: the sequencer cannot go to sleep now.
					var got bool
					if err := seq.QueryRow(ctx, `SELECT pg_try_advisory_lock(`+sleepKey+`)`).Scan(&got); err != nil {
						t.Fatal(err)
					}
					if got {
						t.Fatalf("%s: the sequencer took its sleep key while the append was in flight", name)
					}
				}
				if err := tx.Commit(ctx); err != nil {
					t.Fatal(err)
				}
				if asleep {
					mustExec(t, seq, `SELECT pg_advisory_unlock(`+sleepKey+`)`)
				}
				sentinel := fmt.Sprintf("end %d", n)
				mustExec(t, pool, `SELECT pg_notify('pgevents_sequencer', $1)`, sentinel)
				woken := 0
				for {
					wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
					nt, err := seq.Conn().WaitForNotification(wctx)
					cancel()
					if err != nil {
						t.Fatalf("%s: waiting for the notifications: %v", name, err)
					}
					if nt.Payload == sentinel {
						break
					}
					if nt.Payload != "1" {
						t.Fatalf("%s: notification %q, want the topic's id", name, nt.Payload)
					}
					woken++
				}
				if want := map[bool]int{true: 1, false: 0}[asleep]; woken != want {
					t.Errorf("%s: the sequencer was notified %d times, want %d", name, woken, want)
				}
			}
		}
	}
}
