package pgevents

import (
	"testing"
	"time"

	"github.com/pgevents/pgevents/internal/pgtest"
	"github.com/pgevents/pgevents/internal/store"
)

// TestUnhaltRetriesTheUnit: a running consumer whose partition halted
// tries the unit again once an operator removes the halt record
// (store.Unhalt, the console's unhalt), without a restart: while the
// cause remains it halts again at the same unit (the record comes back,
// nothing after it is handled); once the cause is fixed, an unhalt lets the
// unit and what follows through, and the record goes.
func TestUnhaltRetriesTheUnit(t *testing.T) {
	t.Parallel()
	pool, poisoned := poisonTopic(t, 1)
	ctx := pgtest.Context(t.Context())
	c := startConsumer(t, pool, Config{TotalPartitions: 1, OnPermanentFailure: PolicyHalt, Handlers: poisonHandlers(poisoned)})
	appendTx(t, pool, ev("a", "t", `{}`))              // 1
	appendTx(t, pool, ev("a", "t", `{"poison":true}`)) // 2: halts here
	appendTx(t, pool, ev("b", "t", `{}`))              // 3
	halted := func(offset int64) func() bool {
		return func() bool {
			return queryInt(t, pool, `SELECT count(*) FROM partition_halts WHERE c_offset = $1`, offset) == 1 &&
				workerOf(c, 0).halted.Load()
		}
	}
	pgtest.WaitFor(t, 10*time.Second, "halt at 2", halted(2))

	// Unhalted while the cause remains: it halts again at the same unit.
	if _, err := store.Unhalt(ctx, pool, "g", 1, 0); err != nil {
		t.Fatal(err)
	}
	pgtest.WaitFor(t, 10*time.Second, "halt at 2 again", func() bool { return c.Stats().Halts == 2 && halted(2)() })
	if got := handledOffsets(t, pool); got != "[1]" {
		t.Fatalf("handled %s past the halt, want [1]", got)
	}

	poisoned.Store(false)
	if _, err := store.Unhalt(ctx, pool, "g", 1, 0); err != nil {
		t.Fatal(err)
	}
	waitHandled(t, pool, 3, 10*time.Second)
	if got := handledOffsets(t, pool); got != "[1 2 3]" {
		t.Fatalf("handled %s after the unhalt, want [1 2 3]", got)
	}
	if n := queryInt(t, pool, `SELECT count(*) FROM partition_halts`); n != 0 || workerOf(c, 0).halted.Load() {
		t.Fatalf("%d halt records, worker halted %v, after the unit went through", n, workerOf(c, 0).halted.Load())
	}
}
