package pgevents

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/rs/zerolog"

	"github.com/pgevents/pgevents/internal/eventtest"
	"github.com/pgevents/pgevents/internal/logtest"
	"github.com/pgevents/pgevents/internal/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// newTopic returns a pool on a fresh migrated database holding topic 1
// with the given partition count.
func newTopic(t *testing.T, partitions int) *pgxpool.Pool {
	t.Helper()
	return pgtest.TopicPool(t, partitions)
}

// startConsumer runs a consumer with cfg (defaults filled in for a test)
// until the test ends, and fails the test if Run returns an error.
func startConsumer(t *testing.T, pool *pgxpool.Pool, cfg Config) *Consumer {
	t.Helper()
	c, _ := startStoppableConsumer(t, pool, cfg)
	return c
}

// startStoppableConsumer is startConsumer with a function that stops the
// consumer and waits for Run to return.
func startStoppableConsumer(t *testing.T, pool *pgxpool.Pool, cfg Config) (*Consumer, func()) {
	t.Helper()
	if cfg.GroupID == "" {
		cfg.GroupID = "g"
	}
	if cfg.TotalPartitions == 0 {
		cfg.TotalPartitions = 4
	}
	if cfg.Schema == "" {
		cfg.Schema = pgtest.Schema()
	}
	if cfg.Logger == nil {
		l, _ := logtest.Logger(t, zerolog.WarnLevel) // every line checked, warnings shown
		cfg.Logger = &l
	}
	c, err := NewConsumer(consumerPool(t, pool, cfg.TotalPartitions), cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	var once sync.Once
	stop := func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("consumer: %v", err)
				}
			case <-time.After(30 * time.Second):
				t.Error("consumer did not stop within 30 s")
			}
		})
	}
	t.Cleanup(stop)
	pgtest.WaitFor(t, 10*time.Second, "consumer listener connected", c.Ready)
	return c, stop
}

// consumerPool returns a pool on pool's database with the settings a
// consumer runs with in production (ParsePoolConfig: statement and
// idle-in-transaction timeouts, asynchronous commit, keepalives), sized
// for partitions, and closed when the test ends. edit, when given, adjusts
// the configuration first.
func consumerPool(t testing.TB, pool *pgxpool.Pool, partitions int, edit ...func(*pgxpool.Config)) *pgxpool.Pool {
	t.Helper()
	pc, err := ParsePoolConfig(pool.Config().ConnString())
	if err != nil {
		t.Fatal(err)
	}
	pc.MaxConns = int32(PoolSize(partitions))
	for _, e := range edit {
		e(pc)
	}
	cp, err := pgxpool.NewWithConfig(context.Background(), pc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cp.Close)
	return cp
}

// appendTx appends evs in one READ COMMITTED transaction (producers are
// refused under a stricter isolation, whatever the session's default) and
// returns their offsets.
func appendTx(t *testing.T, pool *pgxpool.Pool, evs ...Event) []int64 {
	t.Helper()
	ctx := context.Background()
	tx, err := pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.ReadCommitted})
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck
	offs, err := Append(ctx, tx, evs...)
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	return offs
}

func ev(host, typ string, payload string) Event {
	return Event{HostID: host, UserID: "u", EventType: typ, Payload: []byte(payload)}
}

func queryInt(t *testing.T, pool *pgxpool.Pool, sql string, args ...any) int64 {
	t.Helper()
	return eventtest.QueryInt(t, pool, sql, args...)
}

// heldKeySQL counts the sessions of the database that hold the advisory
// key lock_key($1, $2) (a session's or a transaction's), in mode $3 (any
// mode when empty): pg_locks shows a bigint key as its high and low words.
const heldKeySQL = `SELECT count(*) FROM pg_locks l, (SELECT lock_key($1, $2) AS k) s
WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1 AND ($3 = '' OR l.mode = $3)
  AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
  AND l.classid = ((s.k >> 32) & 4294967295)::oid AND l.objid = (s.k & 4294967295)::oid`

// heldKey returns how many sessions hold pgevents' advisory key of purpose
// and id in mode ("ShareLock", "ExclusiveLock", or "" for either).
func heldKey(t *testing.T, pool *pgxpool.Pool, purpose, id, mode string) int64 {
	t.Helper()
	return queryInt(t, pool, heldKeySQL, purpose, id, mode)
}

func mustExec(t *testing.T, pool *pgxpool.Pool, sql string, args ...any) {
	t.Helper()
	eventtest.Exec(t, pool, sql, args...)
}

const (
	handledTable = eventtest.HandledTable
	recordSQL    = eventtest.RecordSQL
)

func checkHandled(t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	eventtest.CheckHandled(t, pool)
}

func waitHandled(t *testing.T, pool *pgxpool.Pool, n int64, timeout time.Duration) {
	t.Helper()
	eventtest.WaitHandled(t, pool, n, timeout)
}

// workerOf returns the consumer's worker of partition p in the layout it
// runs now, or nil.
func workerOf(c *Consumer, p int) *worker {
	if rt := c.rt.Load(); rt != nil {
		return rt.workers[p]
	}
	return nil
}
