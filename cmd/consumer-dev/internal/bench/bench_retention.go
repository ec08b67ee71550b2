package bench

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/pgevents/pgevents/cmd/consumer-dev/internal/latency"
	"github.com/pgevents/pgevents/internal/store"
	"github.com/pgevents/pgevents/schema"
)

// benchRetention measures the two ways of removing old events while
// producers append: DELETE of the rows, and the drop of whole segments that
// retention does. Each runs on a fresh database holding the same preloaded
// log, removes the same offsets, and reports the time it took, the dead
// tuples and the log's size it leaves, and the producers' transaction
// times meanwhile (their stalls).
func benchRetention(ctx context.Context, e *benchEnv) ([]benchResult, error) {
	const segment = 20000
	preload := benchPick(e, int64(400000), int64(100000))
	var (
		out     []benchResult
		removed int64 // offsets below it are removed, by both ways
	)
	for _, mode := range []string{"drop segments", "DELETE rows"} {
		db, err := e.newDB(ctx, 8)
		if err != nil {
			return out, err
		}
		res, err := func() ([]benchResult, error) {
			defer db.close()
			ahead := preload/segment + 4
			if err := schema.SetSegmentSize(ctx, db.pool, benchTopic, segment, int(ahead)); err != nil {
				return nil, err
			}
			for _, stmt := range []string{
				`UPDATE topic_retention SET retention = '1 millisecond', zero_subscription_retention = '1 millisecond'`,
			} {
				if err := db.exec(ctx, stmt); err != nil {
					return nil, err
				}
			}
			ppool, err := db.openPool(ctx, "bench-producer", 6, nil)
			if err != nil {
				return nil, err
			}
			if _, err := (benchLoad{producers: 4, txSize: 100, limit: preload}).run(ctx, ppool, 10*time.Minute, nil); err != nil {
				return nil, err
			}
			sizeBefore, err := benchLogSize(ctx, db)
			if err != nil {
				return nil, err
			}

			// Producers append single-event transactions at a steady rate
			// while the removal runs; their transaction times show stalls.
			txTimes := &latency.Recorder{}
			var appended atomic.Int64
			loadCtx, stopLoad := context.WithCancel(ctx)
			loadDone := make(chan error, 1)
			go func() {
				_, err := (benchLoad{producers: 4, txSize: 1, rate: newBenchRate(400), txTimes: txTimes}).run(loadCtx, ppool, 10*time.Minute, &appended)
				loadDone <- err
			}()
			// A second of steady load before and after the removal.
			settle := func() {
				select {
				case <-ctx.Done():
				case <-time.After(time.Second):
				}
			}
			settle()
			began := time.Now()
			if mode == "drop segments" {
				r, err := store.ApplyRetention(ctx, db.pool, benchTopic)
				if err != nil {
					stopLoad()
					<-loadDone
					return nil, err
				}
				if len(r.Removed) == 0 {
					stopLoad()
					<-loadDone
					return nil, fmt.Errorf("retention removed nothing: %s", r.Blocked)
				}
				removed = r.Removed[len(r.Removed)-1].Hi
			} else {
				for lo := int64(1); lo < removed; lo += segment {
					if err := db.exec(ctx, `DELETE FROM outbox_message_t WHERE topic_id = 1 AND c_offset >= $1 AND c_offset < $2`,
						lo, min(lo+segment, removed)); err != nil {
						stopLoad()
						<-loadDone
						return nil, err
					}
				}
			}
			took := time.Since(began)
			settle()
			stopLoad()
			if err := <-loadDone; err != nil && ctx.Err() == nil && !errors.Is(err, context.Canceled) {
				return nil, err
			}
			p50, p99 := txTimes.Take()
			maxTx := txTimes.Longest()
			sizeAfter, err := benchLogSize(ctx, db)
			if err != nil {
				return nil, err
			}
			var dead int64
			if err := db.exec(ctx, `SELECT pg_stat_force_next_flush()`); err != nil {
				return nil, err
			}
			// The removing sessions flush their statistics when idle.
			if err := benchWait(ctx, 5*time.Second, "statistics", func() (bool, error) {
				err := db.pool.QueryRow(ctx, `SELECT coalesce(sum(n_dead_tup), 0) FROM pg_stat_user_tables
					WHERE relname LIKE 'outbox_message_t%'`).Scan(&dead)
				return err == nil && (mode == "drop segments" || dead > 0), err
			}); err != nil {
				e.logf("retention: %v", err)
			}
			e.logf("retention: %s below offset %d in %s: log %d -> %d MiB, %d dead tuples; producers p50 %.2f ms, p99 %.2f ms, max %.2f ms",
				mode, removed, took.Round(time.Millisecond), sizeBefore>>20, sizeAfter>>20, dead, benchMillis(p50), benchMillis(p99), benchMillis(maxTx))
			name := func(s string) string { return fmt.Sprintf("remove %d events by %s: %s", removed-1, mode, s) }
			return []benchResult{
				newBenchResult("retention", name("time"), "ms", []float64{benchMillis(took)}),
				newBenchResult("retention", name("dead tuples left"), "rows", []float64{float64(dead)}),
				newBenchResult("retention", name("log size after (before)"), "MiB", []float64{float64(sizeAfter >> 20)}).
					noted("%d MiB before; DELETE frees no space until VACUUM, and then only for reuse", sizeBefore>>20),
				newBenchResult("retention", name("producer tx p99 meanwhile"), "ms", []float64{benchMillis(p99)}).
					noted("4 producers, 400 single-event tx/s in all, from a second before the removal to a second after; p50 %.2f ms, longest %.2f ms", benchMillis(p50), benchMillis(maxTx)),
			}, nil
		}()
		out = append(out, res...)
		if err != nil {
			return out, err
		}
	}
	return out, nil
}

// benchLogSize returns the size of the log, every leaf of
// outbox_message_t's partition tree (the segments of each partition) with
// its indexes and TOAST.
func benchLogSize(ctx context.Context, db *benchDB) (int64, error) {
	var n int64
	err := db.pool.QueryRow(ctx, `SELECT coalesce(sum(pg_total_relation_size(relid)), 0)
		FROM pg_partition_tree('outbox_message_t') WHERE isleaf`).Scan(&n)
	return n, err
}
