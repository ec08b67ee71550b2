package pgevents

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgevents/pgevents/internal/pgtest"
)

// stricterIsolations are the role or database defaults under which a
// consumer must still read positions and leases after their locks.
var stricterIsolations = []string{"repeatable read", "serializable"}

// defaultIsolation makes level the default isolation of new sessions on
// pool's database, as a shop that defaults to stronger isolation sets it
// for its roles.
func defaultIsolation(t *testing.T, pool *pgxpool.Pool, level string) {
	t.Helper()
	var db string
	if err := pool.QueryRow(context.Background(), `SELECT current_database()`).Scan(&db); err != nil {
		t.Fatal(err)
	}
	mustExec(t, pool, fmt.Sprintf(`ALTER DATABASE %s SET default_transaction_isolation = '%s'`, pgx.Identifier{db}.Sanitize(), level))
	pool.Reset() // the test's own sessions start again with the new default
}

// waitLockWait waits until a session of the consumer's pool waits for a
// lock (the claim, behind the operator's position lock).
func waitLockWait(t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	pgtest.WaitFor(t, 10*time.Second, "a consumer session waiting for the position lock", func() bool {
		return queryInt(t, pool, `SELECT count(*) FROM pg_stat_activity
WHERE datname = current_database() AND wait_event_type = 'Lock' AND wait_event = 'advisory'`) > 0
	})
}

// TestOperatorPositionSurvivesStricterIsolation: an operator moves a
// group's position while an event is appended and the consumer's claim
// waits for the operator's position lock. Under a REPEATABLE READ or
// SERIALIZABLE session default, a claim whose snapshot was taken before
// the lock would read the old position, handle the event and write its
// position over the operator's. The operator's position must stand and
// nothing below it be handled.
func TestOperatorPositionSurvivesStricterIsolation(t *testing.T) {
	t.Parallel()
	for _, level := range stricterIsolations {
		t.Run(level, func(t *testing.T) {
			t.Parallel()
			pool := newTopic(t, 1)
			mustExec(t, pool, handledTable)
			defaultIsolation(t, pool, level)
			appendTx(t, pool, ev("a", "t", `{}`), ev("b", "t", `{}`))
			c := startConsumer(t, pool, Config{TotalPartitions: 1, WaitPeriod: time.Hour, Handlers: recordingHandlers()})
			waitHandled(t, pool, 2, 10*time.Second)

			ctx := context.Background()
			op, err := pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.ReadCommitted})
			if err != nil {
				t.Fatal(err)
			}
			defer op.Rollback(ctx) //nolint:errcheck
			if _, err := op.Exec(ctx, `UPDATE consumer_offsets SET next_offset = 1000 WHERE group_id = 'g' AND partition_id = 0`); err != nil {
				t.Fatal(err)
			}
			before := c.Stats()
			appendTx(t, pool, ev("c", "t", `{}`))
			waitLockWait(t, pool)
			if err := op.Commit(ctx); err != nil {
				t.Fatal(err)
			}
			pgtest.WaitFor(t, 10*time.Second, "the waiting claim to end", func() bool {
				s := c.Stats()
				return s.Batches+s.EmptyClaims+s.Retries > before.Batches+before.EmptyClaims+before.Retries
			})
			t.Logf("stats before %+v after %+v", before, c.Stats())
			if n := queryInt(t, pool, `SELECT next_offset FROM consumer_offsets WHERE group_id = 'g' AND partition_id = 0`); n != 1000 {
				t.Fatalf("position %d after the operator set 1000 (session default %s): the claim read the position from a snapshot older than its lock", n, level)
			}
			if n := queryInt(t, pool, `SELECT count(*) FROM handled`); n != 2 {
				t.Fatalf("%d events handled, want 2: the event below the operator's position was handled", n)
			}
		})
	}
}

// TestConsumerSessionsAreReadCommitted: every session of a consumer pool
// runs READ COMMITTED whatever the database's or role's default, and the
// producer's refusal under a stricter default is unchanged.
func TestConsumerSessionsAreReadCommitted(t *testing.T) {
	t.Parallel()
	pool := newTopic(t, 1)
	defaultIsolation(t, pool, "serializable")
	cp := consumerPool(t, pool, 1)
	var level string
	if err := cp.QueryRow(context.Background(), `SHOW transaction_isolation`).Scan(&level); err != nil {
		t.Fatal(err)
	}
	if level != "read committed" {
		t.Fatalf("a consumer session runs %q, want read committed", level)
	}
	ctx := context.Background()
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck
	if _, err := Append(ctx, tx, ev("a", "t", `{}`)); err == nil {
		t.Fatal("an append under a serializable default was accepted; producers must be refused there")
	}
}
