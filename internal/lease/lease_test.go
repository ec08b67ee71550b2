package lease

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgevents/pgevents/internal/pgtest"
	"github.com/pgevents/pgevents/internal/store"
	"github.com/pgevents/pgevents/schema"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// leaseDB returns a pool on a topic of 2 partitions whose group "g" has
// positions and lease rows.
func leaseDB(t *testing.T) (context.Context, *pgxpool.Pool) {
	t.Helper()
	return leaseDBN(t, 2)
}

// leaseDBN is leaseDB with n partitions.
func leaseDBN(t *testing.T, n int) (context.Context, *pgxpool.Pool) {
	t.Helper()
	ctx := pgtest.Context(context.Background())
	pool := pgtest.TopicPool(t, n)
	if err := store.InitGroupLayout(ctx, pool, "g", 1); err != nil {
		t.Fatal(err)
	}
	parts := make([]int, n)
	for i := range parts {
		parts[i] = i
	}
	if err := store.Init(ctx, pool, "g", 1, parts); err != nil {
		t.Fatal(err)
	}
	return ctx, pool
}

// owner records what a Leaser tells it.
type owner struct{ acquired chan int }

func (o *owner) Acquired(p int, epoch int64) { o.acquired <- p }
func (o *owner) Lost(int)                    {}
func (o *owner) Release(int)                 {}

// TestAcquireCommitsSynchronously: on a connection
// that commits asynchronously, as consumer connections do, the statement
// that bumps a lease's epoch makes its own transaction commit
// synchronously, so a server crash cannot hand the same epoch out twice.
func TestAcquireCommitsSynchronously(t *testing.T) {
	t.Parallel()
	ctx, pool := leaseDB(t)
	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	var mode string
	err = pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SET LOCAL synchronous_commit = off`); err != nil {
			return err
		}
		rows, err := tx.Query(ctx, schema.SQL(ctx, acquireSQL), "g", 1, "r1", []int{0, 1}, 2, 0)
		if err != nil {
			return err
		}
		n := 0
		for rows.Next() {
			n++
		}
		if err := rows.Err(); err != nil || n != 2 {
			t.Fatalf("acquired %d leases, %v", n, err)
		}
		return tx.QueryRow(ctx, `SHOW synchronous_commit`).Scan(&mode)
	})
	if err != nil {
		t.Fatal(err)
	}
	if mode != "on" {
		t.Fatalf("the acquisition's transaction commits with synchronous_commit = %s, want on", mode)
	}
}

// TestFenceSparesOtherLockers: taking a partition
// over from an owner that is no longer live ends that owner's batch, and
// only that: a backend holding the partition's position lock for something
// else (a dead-letter replay, an offsets reset) is left alone.
func TestFenceSparesOtherLockers(t *testing.T) {
	t.Parallel()
	ctx, pool := leaseDB(t)
	if _, err := pool.Exec(ctx, `UPDATE partition_leases SET owner = 'stale', epoch = 7, expires_at = now() - interval '1 second'
		WHERE partition_id IN (0, 1)`); err != nil {
		t.Fatal(err)
	}
	// Partition 0: the stale owner's batch, holding the owner's batch key
	// as batches do. Partition 1: an administrator's transaction, holding
	// another owner's key.
	lock := func(p int, name string) *pgxpool.Conn {
		c, err := pool.Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(c.Release)
		if _, err := c.Exec(ctx, `BEGIN`); err != nil {
			t.Fatal(err)
		}
		if _, err := c.Exec(ctx, `SELECT pg_advisory_xact_lock_shared(lock_key('batch', $1))`, name); err != nil {
			t.Fatal(err)
		}
		if _, err := c.Exec(ctx, `SELECT lock_position('g', 1, $1)`, p); err != nil {
			t.Fatal(err)
		}
		return c
	}
	batch := lock(0, "stale")
	admin := lock(1, "consumer dlq replay")
	o := &owner{acquired: make(chan int, 2)}
	l, err := NewLeaser(LeaserConfig{DB: pool, Group: "g", Topic: 1, Partitions: 2, ReplicaID: "new", Lease: time.Second, Owner: o})
	if err != nil {
		t.Fatal(err)
	}
	lctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go l.Run(lctx) //nolint:errcheck
	for range 2 {
		select {
		case <-o.acquired:
		case <-time.After(10 * time.Second):
			t.Fatal("partitions not taken over")
		}
	}
	pgtest.WaitFor(t, 5*time.Second, "the stale owner's batch ended", func() bool {
		_, err := batch.Exec(ctx, `SELECT 1`)
		return err != nil
	})
	if _, err := admin.Exec(ctx, `COMMIT`); err != nil {
		t.Fatalf("the administrator's transaction was ended by the fence: %v", err)
	}
}
