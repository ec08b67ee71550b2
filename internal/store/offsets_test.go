package store

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgevents/pgevents/internal/pgtest"
	"github.com/pgevents/pgevents/schema"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

func setup(t *testing.T, partitions int) (context.Context, string) {
	t.Helper()
	ctx := context.Background()
	url := pgtest.MigratedDB(t)
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, _, err := schema.EnsureTopic(ctx, conn, 1, partitions); err != nil {
		t.Fatal(err)
	}
	return ctx, url
}

// TestClaimPlanSurvivesGrowth guards against a known trap: a statement
// prepared while outbox_message_t was empty can keep a sequential-scan plan
// as the table grows. The claim and fetch statements are cached per
// connection, so their generic plan, made on an empty table, must read
// through the index.
func TestClaimPlanSurvivesGrowth(t *testing.T) {
	t.Parallel()
	ctx, url := setup(t, 1)
	admin := pgtest.Pool(t, url)
	for _, tbl := range []string{"outbox_message_t_1_p0_0", "outbox_message_t_1_p0_default"} {
		// Statistics of an empty table, and no autovacuum to refresh them.
		if _, err := admin.Exec(ctx, `ALTER TABLE `+tbl+` SET (autovacuum_enabled = off)`); err != nil {
			t.Fatal(err)
		}
		if _, err := admin.Exec(ctx, `ANALYZE `+tbl); err != nil {
			t.Fatal(err)
		}
	}
	if err := InitGroupLayout(ctx, admin, "g", 1); err != nil {
		t.Fatal(err)
	}
	if err := Init(ctx, admin, "g", 1, []int{0}); err != nil {
		t.Fatal(err)
	}
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	// Make the server use the generic plan at once, as it may after five
	// executions.
	if _, err := conn.Exec(ctx, `SET plan_cache_mode = force_generic_plan`); err != nil {
		t.Fatal(err)
	}
	ps := ForPartition(1, 0)
	stmts := map[string]string{"claim_stmt": schema.SQL(ctx, ps.claim), "fetch_stmt": schema.SQL(ctx, ps.fetch)}
	args := map[string]string{"claim_stmt": `('g', 1, 0, 11, 1, '', 0)`, "fetch_stmt": `(1, 0, 0, 11, 9223372036854775807)`}
	for name, sql := range stmts {
		if _, err := conn.Prepare(ctx, name, sql); err != nil {
			t.Fatal(err)
		}
		if _, err := conn.Exec(ctx, `EXECUTE `+name+args[name]); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := admin.Exec(ctx, `SELECT append_events(1, (SELECT jsonb_agg(jsonb_build_object('host_id', 'h', 'event_type', 't'))
		FROM generate_series(1, 100000)))`); err != nil {
		t.Fatal(err)
	}
	for name := range stmts {
		rows, err := conn.Query(ctx, `EXPLAIN (ANALYZE, COSTS OFF) EXECUTE `+name+args[name])
		if err != nil {
			t.Fatal(err)
		}
		lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
		if err != nil {
			t.Fatal(err)
		}
		plan := strings.Join(lines, "\n")
		if strings.Contains(plan, "Seq Scan") || !strings.Contains(plan, "Index Scan using outbox_message_t_1_p0_0_") {
			t.Fatalf("%s: the generic plan made on an empty table does not read through the index:\n%s", name, plan)
		}
	}
}

// TestClaimOrdersCompetingClaimers: a second claimer of the same partition
// waits for the first one's transaction and then reads after its commit,
// so batches never interleave.
func TestClaimOrdersCompetingClaimers(t *testing.T) {
	t.Parallel()
	ctx, url := setup(t, 1)
	pool := pgtest.Pool(t, url)
	if _, err := pool.Exec(ctx, `SELECT append_events(1, (SELECT jsonb_agg(jsonb_build_object('host_id', 'h', 'event_type', 't'))
		FROM generate_series(1, 10)))`); err != nil {
		t.Fatal(err)
	}
	if err := InitGroupLayout(ctx, pool, "g", 1); err != nil {
		t.Fatal(err)
	}
	if err := Init(ctx, pool, "g", 1, []int{0}); err != nil {
		t.Fatal(err)
	}
	ps := ForPartition(1, 0)
	conn1, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn1.Release()
	c1, err := Claim{Group: "g", Topic: 1, Partition: 0, Limit: 4, Layout: 1, SQL: ps}.Do(ctx, conn1, nil)
	tx1, evs1 := c1.Tx, c1.Events
	if err != nil || len(evs1) != 4 || evs1[0].Offset != 1 {
		t.Fatalf("first claim: %d events from %v, %v", len(evs1), evs1, err)
	}
	second := make(chan []Event, 1)
	go func() {
		c2, err := Claim{Group: "g", Topic: 1, Partition: 0, Limit: 4, Layout: 1, SQL: ps}.Do(ctx, pool, nil)
		if err != nil {
			t.Error(err)
			second <- nil
			return
		}
		defer c2.Tx.Rollback(ctx) //nolint:errcheck
		second <- c2.Events
	}()
	// The second claimer is blocked on the row lock.
	pgtest.WaitFor(t, 5*time.Second, "second claimer waiting on the lock", func() bool {
		var waiting int
		_ = pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()
			AND wait_event_type = 'Lock'`).Scan(&waiting)
		return waiting == 1
	})
	if err := CommitBatch(ctx, tx1, "g", 1, 0, evs1[3].Offset+1, false); err != nil {
		t.Fatal(err)
	}
	evs2 := <-second
	if len(evs2) != 4 || evs2[0].Offset != 5 {
		t.Fatalf("second claim read from %v, want 4 events from offset 5", evs2)
	}
}

// TestClaimWithoutLeaseHandlesNothing: a claim under a lease the replica
// does not own (another replica's, or an older epoch) returns
// ErrLeaseLost and no event, and a claim while the group is PAUSED
// returns ErrPaused; neither leaves the transaction open or writes a
// position.
func TestClaimWithoutLeaseHandlesNothing(t *testing.T) {
	t.Parallel()
	ctx, url := setup(t, 1)
	pool := pgtest.Pool(t, url)
	if _, err := pool.Exec(ctx, `SELECT append_events(1, (SELECT jsonb_agg(jsonb_build_object('host_id', 'h', 'event_type', 't'))
		FROM generate_series(1, 3)))`); err != nil {
		t.Fatal(err)
	}
	if err := Init(ctx, pool, "g", 1, []int{0}); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `UPDATE partition_leases SET owner = 'other', epoch = 3 WHERE group_id = 'g'`); err != nil {
		t.Fatal(err)
	}
	ps := ForPartition(1, 0)
	for _, c := range []Claim{
		{Group: "g", Topic: 1, Partition: 0, Limit: 10, Layout: 1, SQL: ps, Owner: "me", Epoch: 3},
		{Group: "g", Topic: 1, Partition: 0, Limit: 10, Layout: 1, SQL: ps, Owner: "other", Epoch: 2},
	} {
		got, err := c.Do(ctx, pool, nil)
		if !errors.Is(err, ErrLeaseLost) || len(got.Events) != 0 {
			t.Errorf("claim as %s epoch %d under other's lease of epoch 3: %d events, %v; want none and ErrLeaseLost", c.Owner, c.Epoch, len(got.Events), err)
		}
	}
	if _, err := pool.Exec(ctx, `INSERT INTO subscriptions (group_id, topic_id, state) VALUES ('g', 1, 'PAUSED')
		ON CONFLICT (group_id, topic_id) DO UPDATE SET state = 'PAUSED'`); err != nil {
		t.Fatal(err)
	}
	got, err := Claim{Group: "g", Topic: 1, Partition: 0, Limit: 10, Layout: 1, SQL: ps, Owner: "other", Epoch: 3}.Do(ctx, pool, nil)
	if !errors.Is(err, ErrPaused) || len(got.Events) != 0 {
		t.Errorf("claim under the lease while the group is PAUSED: %d events, %v; want none and ErrPaused", len(got.Events), err)
	}
	var n, idle int
	if err := pool.QueryRow(ctx, `SELECT (SELECT count(*) FROM consumer_positions WHERE next_offset > 1),
		(SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND state LIKE 'idle in transaction%')`).Scan(&n, &idle); err != nil || n != 0 || idle != 0 {
		t.Fatalf("%d positions moved, %d transactions left open (%v)", n, idle, err)
	}
}

// TestStatementsUseGenericPlans: on a session readied for batches
// (ReadySession: plan_cache_mode force_generic_plan), the claim and the
// poll run on their generic plans
// from the first execution (a custom plan of the claim, which PostgreSQL
// tries for the first five executions and whenever it looks cheaper, is
// planned anew at every batch, and once read and sorted the partition's
// whole backlog), the batch transaction gives handlers plan_cache_mode
// auto, and the claim calls no SQL function that the server would plan at
// every execution.
func TestStatementsUseGenericPlans(t *testing.T) {
	t.Parallel()
	ctx, url := setup(t, 1)
	admin := pgtest.Pool(t, url)
	if _, err := admin.Exec(ctx, `SELECT append_events(1, (SELECT jsonb_agg(jsonb_build_object('host_id', 'h' || g, 'event_type', 't'))
		FROM generate_series(1, 3000) g))`); err != nil {
		t.Fatal(err)
	}
	if err := Init(ctx, admin, "g", 1, []int{0}); err != nil {
		t.Fatal(err)
	}
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	// Function calls are counted (pg_stat_xact_user_functions).
	if _, err := conn.Exec(ctx, `SET track_functions = 'all'`); err != nil {
		t.Fatal(err)
	}
	if err := ReadySession(ctx, conn); err != nil {
		t.Fatal(err)
	}
	ps := ForPartition(1, 0)
	const runs = 7
	for range runs {
		cl, err := Claim{Group: "g", Topic: 1, Partition: 0, Limit: 10, Layout: 1, SQL: ps}.Do(ctx, conn, nil)
		if err != nil {
			t.Fatal(err)
		}
		if len(cl.Events) != 10 || cl.Events[0].Offset != 1 {
			t.Fatalf("claim read %d events from %v, want 10 from offset 1", len(cl.Events), cl.Events)
		}
		var mode string
		if err := cl.Tx.QueryRow(ctx, `SELECT current_setting('plan_cache_mode')`).Scan(&mode); err != nil {
			t.Fatal(err)
		}
		if mode != "auto" {
			t.Fatalf("handlers run with plan_cache_mode %q, want %q", mode, "auto")
		}
		// The claim reads the cut without calling layout_cut, which the
		// server would parse and plan again at every execution.
		var calls int64
		if err := cl.Tx.QueryRow(ctx, `SELECT coalesce(sum(calls), 0) FROM pg_stat_xact_user_functions
			WHERE funcname IN ('layout_cut', 'layout_start')`).Scan(&calls); err != nil {
			t.Fatal(err)
		}
		if calls != 0 {
			t.Fatalf("the claim called the layout functions %d times", calls)
		}
		if err := cl.Tx.Rollback(ctx); err != nil {
			t.Fatal(err)
		}
		if _, _, err := Pending(ctx, conn, "g", 1, []int{0}, 1); err != nil {
			t.Fatal(err)
		}
	}
	for _, s := range []struct{ name, like string }{
		{"claim", "%claim_state%LIMIT $4%"},
		{"poll", "%CROSS JOIN LATERAL%"},
	} {
		var custom, generic int64
		if err := conn.QueryRow(ctx, `SELECT coalesce(sum(custom_plans), -1), coalesce(sum(generic_plans), -1)
			FROM pg_prepared_statements WHERE statement LIKE $1`, s.like).Scan(&custom, &generic); err != nil {
			t.Fatal(err)
		}
		if custom != 0 || generic != runs {
			t.Errorf("%s: %d custom and %d generic plans, want 0 and %d", s.name, custom, generic, runs)
		}
	}
	var mode string
	if err := conn.QueryRow(ctx, `SELECT current_setting('plan_cache_mode')`).Scan(&mode); err != nil || mode != "force_generic_plan" {
		t.Fatalf("after the batches the session's plan_cache_mode is %q (%v), want its own, force_generic_plan", mode, err)
	}
}

// TestClaimWaitForAnAppendInFlightIsBounded: a claim that waits for an
// append in flight (Claim.AwaitAppend) while the producer keeps its
// transaction open longer than the consumer's statement_timeout gives up
// after its own bound, without an error and keeping its connection, names
// the producer's session, and reads the append's events once it commits.
func TestClaimWaitForAnAppendInFlightIsBounded(t *testing.T) {
	t.Parallel()
	ctx, url := setup(t, 1)
	admin := pgtest.Pool(t, url)
	if err := Init(ctx, admin, "g", 1, []int{0}); err != nil {
		t.Fatal(err)
	}
	producer, err := admin.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer producer.Rollback(ctx) //nolint:errcheck
	var pid int
	if err := producer.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&pid); err != nil {
		t.Fatal(err)
	}
	if _, err := producer.Exec(ctx, `SELECT append_event(1, 'h', 'u', 't', '{}'::jsonb)`); err != nil {
		t.Fatal(err)
	}
	cc, err := pgx.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	cc.RuntimeParams["statement_timeout"] = "3000" // longer than AwaitAppendMax, shorter than the producer
	conn, err := pgx.ConnectConfig(ctx, cc)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	ps := ForPartition(1, 0)
	cl, err := Claim{Group: "g", Topic: 1, Partition: 0, Limit: 10, Layout: 1, SQL: ps, AwaitAppend: true}.Do(ctx, conn, nil)
	if err != nil {
		t.Fatalf("a claim waiting for a producer that stays open failed: %v", err)
	}
	if cl.InFlight == nil || !strings.Contains(*cl.InFlight, fmt.Sprintf("pid %d ", pid)) {
		t.Fatalf("the claim's wait ran out naming %v, want the producer's session, pid %d", cl.InFlight, pid)
	}
	if len(cl.Events) != 0 {
		t.Fatalf("the claim read %d events of a transaction in flight", len(cl.Events))
	}
	if err := cl.Tx.Rollback(ctx); err != nil {
		t.Fatalf("the claim's connection is not usable after its wait: %v", err)
	}
	if err := producer.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	cl, err = Claim{Group: "g", Topic: 1, Partition: 0, Limit: 10, Layout: 1, SQL: ps, AwaitAppend: true}.Do(ctx, conn, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Tx.Rollback(ctx) //nolint:errcheck
	if len(cl.Events) != 1 || cl.InFlight != nil {
		t.Fatalf("after the commit the claim read %d events (in flight: %v), want the append's one", len(cl.Events), cl.InFlight)
	}
}
