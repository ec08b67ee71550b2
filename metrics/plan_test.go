package metrics_test

import (
	"context"
	"fmt"
	"regexp"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgevents/pgevents"
	"github.com/pgevents/pgevents/internal/store"
	"github.com/pgevents/pgevents/metrics"
)

// TestStatePlanReadsThroughIndex checks that the state statement reads
// outbox_message_t only through the (topic_id, partition_id, c_offset)
// index, also with the generic plan that a cached prepared statement
// switches to, and that the lag count stops at the cap.
func TestStatePlanReadsThroughIndex(t *testing.T) {
	t.Parallel()
	pool := newTopic(t, 4)
	ctx := context.Background()
	if err := store.Init(ctx, pool, "g", 1, []int{0, 1, 2, 3}); err != nil {
		t.Fatal(err)
	}
	for i := range 100 {
		var evs []pgevents.Event
		for k := range 50 {
			evs = append(evs, pgevents.Event{HostID: fmt.Sprintf("h%d", (i+k)%37), EventType: "t"})
		}
		if err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			_, err := pgevents.Append(ctx, tx, evs...)
			return err
		}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := pool.Exec(ctx, "ANALYZE"); err != nil {
		t.Fatal(err)
	}
	for mode, plan := range statePlans(t, pool) {
		if regexp.MustCompile(`(Seq|Bitmap Heap) Scan on outbox_message_t`).MatchString(plan) {
			t.Errorf("%s: the state statement scans outbox_message_t:\n%s", mode, plan)
		}
		// No index scan returns more than the cap (100) rows per loop.
		for _, m := range regexp.MustCompile(`Index (Only )?Scan using outbox_message_t\S* on \S+ \S+ \(actual time=\S+ rows=(\d+) loops`).FindAllStringSubmatch(plan, -1) {
			var n int
			fmt.Sscan(m[2], &n)
			if n > 100 {
				t.Errorf("%s: an index scan returned %d rows, more than the cap:\n%s", mode, n, plan)
			}
		}
	}
}

// statePlans returns, by plan_cache_mode (force_custom_plan and
// force_generic_plan: the plan a cached prepared statement switches to),
// what the state statement does for group g on topic 1 with a cap of 100:
// EXPLAIN ANALYZE of it, prepared.
func statePlans(t *testing.T, pool *pgxpool.Pool) map[string]string {
	t.Helper()
	ctx := context.Background()
	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	plans := map[string]string{}
	for _, mode := range []string{"force_custom_plan", "force_generic_plan"} {
		for _, q := range []string{"SET plan_cache_mode = " + mode, "DEALLOCATE ALL",
			"PREPARE state(text, integer, bigint) AS " + metrics.StateSQL} {
			if _, err := conn.Exec(ctx, q); err != nil {
				t.Fatal(err)
			}
		}
		rows, err := conn.Query(ctx, "EXPLAIN (ANALYZE, COSTS OFF) EXECUTE state('g', 1, 100)", pgx.QueryExecModeSimpleProtocol)
		if err != nil {
			t.Fatal(err)
		}
		lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			t.Fatal(err)
		}
		plans[mode] = strings.Join(lines, "\n")
	}
	return plans
}
