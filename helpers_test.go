package pgevents

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/rs/zerolog"

	"github.com/pgevents/pgevents/internal/pgtest"
	"github.com/pgevents/pgevents/schema"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// newTopic returns a pool on a fresh migrated database holding topic 1 with
// the given partition count.
func newTopic(t *testing.T, partitions int) *pgxpool.Pool {
	t.Helper()
	url := pgtest.MigratedDB(t)
	pc, err := ParsePoolConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	pc.MaxConns = int32(partitions + 8)
	pool, err := pgxpool.NewWithConfig(context.Background(), pc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	if _, _, err := schema.EnsureTopic(context.Background(), pool, 1, partitions); err != nil {
		t.Fatal(err)
	}
	return pool
}

// startConsumer runs a consumer with cfg (defaults filled in for a test)
// until the test ends, and fails the test if Run returns an error.
func startConsumer(t *testing.T, pool *pgxpool.Pool, cfg Config) *Consumer {
	t.Helper()
	if cfg.GroupID == "" {
		cfg.GroupID = "g"
	}
	if cfg.TotalPartitions == 0 {
		cfg.TotalPartitions = 4
	}
	if cfg.Logger == nil {
		l := zerolog.New(zerolog.ConsoleWriter{Out: os.Stderr}).Level(zerolog.WarnLevel).With().Timestamp().Str("test", t.Name()).Logger()
		cfg.Logger = &l
	}
	c, err := NewConsumer(pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	t.Cleanup(func() {
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
	pgtest.WaitFor(t, 10*time.Second, "consumer listener connected", c.Ready)
	return c
}

// appendTx appends evs in one transaction and returns their offsets.
func appendTx(t *testing.T, pool *pgxpool.Pool, evs ...Event) []int64 {
	t.Helper()
	ctx := context.Background()
	tx, err := pool.Begin(ctx)
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

// queryInt runs a query returning one integer.
func queryInt(t *testing.T, pool *pgxpool.Pool, sql string, args ...any) int64 {
	t.Helper()
	var n int64
	if err := pool.QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return n
}

func mustExec(t *testing.T, pool *pgxpool.Pool, sql string, args ...any) {
	t.Helper()
	if _, err := pool.Exec(context.Background(), sql, args...); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

// handledTable is the effects table of the recording SQL handler.
const handledTable = `CREATE TABLE handled (
    seq            bigint GENERATED ALWAYS AS IDENTITY,
    c_offset       bigint NOT NULL,
    host_id        text NOT NULL,
    partition_id   int NOT NULL,
    transaction_id bigint NOT NULL,
    consumer_tx    bigint NOT NULL DEFAULT txid_current()
)`

// recordSQL is the statement of the recording SQL handler.
const recordSQL = `INSERT INTO handled (c_offset, host_id, partition_id, transaction_id)
VALUES (@c_offset, @host_id, @partition_id, @transaction_id)`

// checkHandled asserts the guarantees over the handled table: every
// committed event of topic 1 handled exactly once, per-host order, and each
// producer transaction's slice of a partition handled in one consumer
// transaction.
func checkHandled(t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	missing := queryInt(t, pool, `SELECT count(*) FROM outbox_message_t m WHERE m.topic_id = 1
		AND NOT EXISTS (SELECT 1 FROM handled h WHERE h.c_offset = m.c_offset)`)
	extra := queryInt(t, pool, `SELECT count(*) FROM handled h WHERE NOT EXISTS
		(SELECT 1 FROM outbox_message_t m WHERE m.topic_id = 1 AND m.c_offset = h.c_offset)`)
	dups := queryInt(t, pool, `SELECT count(*) FROM (SELECT c_offset FROM handled GROUP BY 1 HAVING count(*) > 1) d`)
	// Per host, the handling order (seq) follows the offset order.
	disorder := queryInt(t, pool, `SELECT count(*) FROM (
		SELECT c_offset, lag(c_offset) OVER (PARTITION BY host_id ORDER BY seq) AS prev FROM handled) x
		WHERE prev > c_offset`)
	split := queryInt(t, pool, `SELECT count(*) FROM (SELECT transaction_id, partition_id FROM handled
		GROUP BY 1, 2 HAVING count(DISTINCT consumer_tx) > 1) s`)
	if missing+extra+dups+disorder+split != 0 {
		t.Fatalf("missing %d, not in the log %d, duplicated %d, out of host order %d, producer transactions split across consumer transactions %d",
			missing, extra, dups, disorder, split)
	}
}

// waitHandled waits until the handled table holds n rows.
func waitHandled(t *testing.T, pool *pgxpool.Pool, n int64, timeout time.Duration) {
	t.Helper()
	var got int64
	pgtest.WaitFor(t, timeout, fmt.Sprintf("%d events handled", n), func() bool {
		err := pool.QueryRow(context.Background(), `SELECT count(*) FROM handled`).Scan(&got)
		return err == nil && got >= n
	})
	if got != n {
		t.Fatalf("%d events handled, want %d", got, n)
	}
}

