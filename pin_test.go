package pgevents

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// TestWorkersKeepTheirConnection: with a pool of PoolSize connections,
// every batch of a partition runs on one server process, the worker's own,
// so that its statements are prepared and planned once; with a smaller
// pool, workers share the connections and every event is still handled.
func TestWorkersKeepTheirConnection(t *testing.T) {
	t.Parallel()
	const partitions = 6
	for _, tc := range []struct {
		name   string
		conns  int
		pinned bool
	}{{"pool of PoolSize", PoolSize(partitions), true}, {"smaller pool", 3, false}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			pool := newTopic(t, partitions)
			mustExec(t, pool, handledTable)
			mustExec(t, pool, `CREATE TABLE batch_pids (partition_id integer NOT NULL, pid integer NOT NULL)`)
			hs := &Handlers{}
			record := SQLHandler("g", recordSQL)
			hs.HandleAll(HandlerFunc(func(ctx context.Context, tx pgx.Tx, ev *Event) error {
				if _, err := tx.Exec(ctx, `INSERT INTO batch_pids VALUES ($1, pg_backend_pid())`, ev.PartitionID); err != nil {
					return err
				}
				return record.Handle(ctx, tx, ev)
			}))
			cfg := Config{GroupID: "g", TotalPartitions: partitions, BatchSize: 3, Handlers: hs}
			c, err := NewConsumer(consumerPool(t, pool, partitions, func(pc *pgxpool.Config) { pc.MaxConns = int32(tc.conns) }), cfg)
			if err != nil {
				t.Fatal(err)
			}
			cctx, cancel := context.WithCancel(ctx)
			done := make(chan error, 1)
			go func() { done <- c.Run(cctx) }()
			defer func() {
				cancel()
				if err := <-done; err != nil {
					t.Error(err)
				}
			}()
			// Rounds of transactions over every partition, each round
			// waited for: the workers go idle and run again many times.
			total := 0
			for range 8 {
				evs := make([]Event, 0, 30)
				for i := range 30 {
					evs = append(evs, ev(fmt.Sprintf("h%d", i), "t", `{}`))
				}
				appendTx(t, pool, evs...)
				total += len(evs)
				waitHandled(t, pool, int64(total), 30*time.Second)
			}
			checkHandled(t, pool)
			most := queryInt(t, pool, `SELECT max(n) FROM (SELECT count(DISTINCT pid) n FROM batch_pids GROUP BY partition_id) x`)
			if tc.pinned && most != 1 {
				t.Fatalf("a partition's batches ran on %d server processes, want 1 (its worker's connection)", most)
			}
			t.Logf("at most %d server processes per partition", most)
		})
	}
}
