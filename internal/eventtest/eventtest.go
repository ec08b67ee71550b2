// Package eventtest holds test helpers that know pgevents' guarantees: a
// recording handler's effects table and the checks that every committed
// event was handled exactly once, in host order, one consumer transaction
// per producer transaction and partition. Root package tests and the
// binary's process tests share it.
package eventtest

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgevents/pgevents/internal/pgtest"
)

// HandledTable creates the effects table of the recording SQL handler:
// one row per handled event, numbered in the order handlers ran (seq), with
// the consumer transaction that handled it. It is created in public, where
// handlers find it whatever schema pgevents lives in (pgtest.EnvSchema).
const HandledTable = `CREATE TABLE public.handled (
    seq            bigint GENERATED ALWAYS AS IDENTITY,
    c_offset       bigint NOT NULL,
    host_id        text NOT NULL,
    partition_id   int NOT NULL,
    transaction_id bigint NOT NULL,
    consumer_tx    bigint NOT NULL DEFAULT txid_current()
)`

// RecordSQL is the statement of the recording SQL handler.
const RecordSQL = `INSERT INTO handled (c_offset, host_id, partition_id, transaction_id)
VALUES (@c_offset, @host_id, @partition_id, @transaction_id)`

// QueryInt runs a query that returns one integer.
func QueryInt(tb testing.TB, pool *pgxpool.Pool, sql string, args ...any) int64 {
	tb.Helper()
	var n int64
	if err := pool.QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
		tb.Fatalf("%s: %v", sql, err)
	}
	return n
}

// Exec runs a statement and fails the test on error.
func Exec(tb testing.TB, pool *pgxpool.Pool, sql string, args ...any) {
	tb.Helper()
	if _, err := pool.Exec(context.Background(), sql, args...); err != nil {
		tb.Fatalf("%s: %v", sql, err)
	}
}

// CheckHandled asserts the guarantees over the handled table for topic 1:
// every committed event handled exactly once and nothing else, per-host
// handling order equal to offset order, and the events of each producer
// transaction in one partition handled by one consumer transaction.
func CheckHandled(tb testing.TB, pool *pgxpool.Pool) {
	tb.Helper()
	// Events are identified by (partition_id, c_offset): under offset scope
	// 'partition' offsets repeat across partitions. A host's order is
	// (layout, offset): a host is in one partition per layout.
	missing := QueryInt(tb, pool, `SELECT count(*) FROM outbox_message_t m WHERE m.topic_id = 1
		AND NOT EXISTS (SELECT 1 FROM handled h WHERE h.partition_id = m.partition_id AND h.c_offset = m.c_offset)`)
	extra := QueryInt(tb, pool, `SELECT count(*) FROM handled h WHERE NOT EXISTS
		(SELECT 1 FROM outbox_message_t m WHERE m.topic_id = 1 AND m.partition_id = h.partition_id AND m.c_offset = h.c_offset)`)
	dups := QueryInt(tb, pool, `SELECT count(*) FROM (SELECT partition_id, c_offset FROM handled GROUP BY 1, 2 HAVING count(*) > 1) d`)
	disorder := QueryInt(tb, pool, `SELECT count(*) FROM (
		SELECT v, c_offset, lag(v) OVER w AS prev_v, lag(c_offset) OVER w AS prev
		FROM (SELECT h.*, (SELECT max(l.version) FROM topic_layouts l
		                   WHERE l.topic_id = 1 AND layout_start(1, l.version, h.partition_id) <= h.c_offset) AS v
		      FROM handled h) x
		WINDOW w AS (PARTITION BY host_id ORDER BY seq)) y
		WHERE (prev_v, prev) > (v, c_offset)`)
	split := QueryInt(tb, pool, `SELECT count(*) FROM (SELECT transaction_id, partition_id FROM handled
		GROUP BY 1, 2 HAVING count(DISTINCT consumer_tx) > 1) s`)
	if missing+extra+dups+disorder+split != 0 {
		tb.Fatalf("missing %d, not in the log %d, duplicated %d, out of host order %d, producer transactions split across consumer transactions %d",
			missing, extra, dups, disorder, split)
	}
}

// WaitHandled waits until the handled table holds n rows, and fails the
// test if it holds more.
func WaitHandled(tb testing.TB, pool *pgxpool.Pool, n int64, timeout time.Duration) {
	tb.Helper()
	var got int64
	pgtest.WaitFor(tb, timeout, fmt.Sprintf("%d events handled", n), func() bool {
		err := pool.QueryRow(context.Background(), `SELECT count(*) FROM handled`).Scan(&got)
		return err == nil && got >= n
	})
	if got != n {
		tb.Fatalf("%d events handled, want %d", got, n)
	}
}
