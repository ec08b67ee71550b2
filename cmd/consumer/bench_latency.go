package main

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgevents/pgevents"
)

// benchLatencyDDL is the table the latency handler writes: handled_at is
// the database clock when the handler's statement runs, created_at the
// producer's commit time (pg_xact_commit_timestamp of the event's row,
// with track_commit_timestamp on), or else the event's created_at, which
// append_events takes with clock_timestamp() before the commit.
const benchLatencyDDL = `CREATE TABLE bench_latency (
    c_offset   bigint      NOT NULL,
    created_at timestamptz NOT NULL,
    handled_at timestamptz NOT NULL DEFAULT clock_timestamp()
)`

// benchLatencySQL computes the latency percentiles, in seconds, of the
// events created since $1.
const benchLatencySQL = `SELECT count(*), coalesce(percentile_cont(ARRAY[0.5, 0.99, 0.999])
    WITHIN GROUP (ORDER BY extract(epoch FROM handled_at - created_at)), ARRAY[0, 0, 0]::float8[])
FROM bench_latency WHERE created_at >= $1`

// benchLatencyStep is one offered rate of the latency case.
type benchLatencyStep struct {
	rate      float64 // events/s, in single-event transactions
	producers int
	full      time.Duration // per repetition
	quick     time.Duration
}

// benchLatencySteps are the rates measured.
var benchLatencySteps = []benchLatencyStep{
	{100, 1, 10 * time.Second, 3 * time.Second},
	{1000, 4, 5 * time.Second, 2 * time.Second},
	{5000, 16, 4 * time.Second, 2 * time.Second},
}

// benchLatency measures commit-to-handler latency at fixed rates of
// single-event transactions for random hosts, 8 partitions and one
// in-process consumer group; then, at 1,000 events/s, the same with the
// consumer committing asynchronously (a what-if).
func benchLatency(ctx context.Context, e *benchEnv) ([]benchResult, error) {
	out, err := benchLatencyRun(ctx, e, benchProducerSetup{}, benchLatencySteps)
	if err != nil {
		return out, err
	}
	whatIf, err := benchLatencyRun(ctx, e, benchAsyncProducers, benchLatencySteps[1:2])
	return append(out, whatIf...), err
}

// benchLatencyRun measures the latency at each step on a fresh database,
// with the consumer's connections configured by v. The handler inserts the
// event's created_at into bench_latency, whose handled_at defaults to
// clock_timestamp(), so latency is measured on the database clock alone.
func benchLatencyRun(ctx context.Context, e *benchEnv, v benchProducerSetup, steps []benchLatencyStep) ([]benchResult, error) {
	const partitions = 8
	db, err := e.newDB(ctx, partitions)
	if err != nil {
		return nil, err
	}
	defer db.close()
	if err := db.exec(ctx, benchLatencyDDL); err != nil {
		return nil, err
	}
	cpool, err := db.openConsumerPool(ctx, partitions)
	if err != nil {
		return nil, err
	}
	ppool, err := db.openPool(ctx, "bench-producer", 18, v.producer)
	if err != nil {
		return nil, err
	}
	var commitTS bool
	if err := db.pool.QueryRow(ctx, `SELECT current_setting('track_commit_timestamp')::bool`).Scan(&commitTS); err != nil {
		return nil, err
	}
	from, since := "created_at (before the producer's commit, so it includes the commit)", "$2::timestamptz"
	if commitTS {
		from, since = "the producer's commit (pg_xact_commit_timestamp)", "coalesce(pg_xact_commit_timestamp(m.xmin), $2::timestamptz)"
	}
	record := `INSERT INTO bench_latency (c_offset, created_at)
SELECT m.c_offset, ` + since + ` FROM outbox_message_t m WHERE m.topic_id = 1 AND m.c_offset = $1`
	hs := &pgevents.Handlers{}
	hs.HandleAll(pgevents.HandlerFunc(func(ctx context.Context, tx pgx.Tx, ev *pgevents.Event) error {
		_, err := tx.Exec(ctx, record, ev.Offset, ev.CreatedAt)
		return err
	}))
	c, err := startBenchConsumer(ctx, cpool, pgevents.Config{GroupID: "latency", TotalPartitions: partitions, Handlers: hs})
	if err != nil {
		return nil, err
	}
	defer c.stop() //nolint:errcheck // the results are in

	var appended atomic.Int64
	// Warm up connections and statement caches on both sides.
	if _, err := (benchLoad{producers: 16, txSize: 1, rate: newBenchRate(2000)}).run(ctx, ppool, time.Second, &appended); err != nil {
		return nil, err
	}
	if err := c.waitHandled(ctx, appended.Load(), 30*time.Second); err != nil {
		return nil, err
	}

	var out []benchResult
	for _, step := range steps {
		d := benchPick(e, step.full, step.quick)
		var p50, p99, p999, achieved, samples, txP50, txP99 []float64
		for rep := range e.reps {
			var t0 time.Time
			if err := db.pool.QueryRow(ctx, `SELECT clock_timestamp()`).Scan(&t0); err != nil {
				return out, err
			}
			txTimes := &latencies{}
			load := benchLoad{producers: step.producers, txSize: 1, rate: newBenchRate(step.rate), txTimes: txTimes}
			lr, err := load.run(ctx, ppool, d, &appended)
			if err != nil {
				return out, err
			}
			if err := c.waitHandled(ctx, appended.Load(), 30*time.Second); err != nil {
				return out, err
			}
			var count int64
			var q []float64
			if err := db.pool.QueryRow(ctx, benchLatencySQL, t0).Scan(&count, &q); err != nil {
				return out, err
			}
			t50, t99 := txTimes.take()
			p50, p99, p999 = append(p50, q[0]*1000), append(p99, q[1]*1000), append(p999, q[2]*1000)
			achieved, samples = append(achieved, lr.rate()), append(samples, float64(count))
			txP50, txP99 = append(txP50, benchMillis(t50)), append(txP99, benchMillis(t99))
			e.logf("latency: %5.0f/s offered, %5.0f/s achieved, rep %d: p50 %.2f ms, p99 %.2f ms, p99.9 %.2f ms (%d events); producer tx p50 %.2f ms%s",
				step.rate, lr.rate(), rep+1, q[0]*1000, q[1]*1000, q[2]*1000, count, benchMillis(t50), v.name(""))
		}
		name := v.name(fmt.Sprintf("%g events/s, 1-event tx, 8 partitions", step.rate))
		r50 := newBenchResult("latency", name+": p50", "ms", p50).
			noted("offered by %d paced producer(s); %.0f events per run; latency is the handler's clock_timestamp() minus %s, on the database clock; producer transactions (BEGIN to COMMIT returned, client side) took p50 %.2f ms, p99 %.2f ms",
				step.producers, benchMedian(samples), from, benchMedian(txP50), benchMedian(txP99))
		r99 := newBenchResult("latency", name+": p99", "ms", p99)
		r999 := newBenchResult("latency", name+": p99.9", "ms", p999)
		if step.rate == 1000 && v.label == "" {
			r50, r99 = r50.atMost(0.7), r99.atMost(3)
		}
		ach := newBenchResult("latency", name+": rate achieved", "events/s", achieved)
		out = append(out, r50, r99, r999, ach)
	}
	return out, nil
}

// benchMillis returns d in milliseconds.
func benchMillis(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
