package bench

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgevents/pgevents"
	"github.com/pgevents/pgevents/internal/latency"
	"github.com/pgevents/pgevents/schema"
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

// benchLatencySteps are the rates measured in the default mode; the other
// modes are measured at benchLatencySteps[1], 1,000 events/s, and wake-ups
// 'always' also at 100 events/s (idle latency).
var benchLatencySteps = []benchLatencyStep{
	{100, 1, 6 * time.Second, 3 * time.Second},
	{1000, 4, 5 * time.Second, 2 * time.Second},
	{5000, 16, 4 * time.Second, 2 * time.Second},
}

// benchLatencyModes are the offset modes measured besides the default.
var benchLatencyModes = []struct {
	mode  benchProducerMode
	steps []benchLatencyStep
}{
	{benchProducerMode{name: "wake always", scope: schema.ScopeTopic, wake: schema.WakeAlways}, benchLatencySteps[:2]},
	{benchProducerMode{name: "sequence", scope: schema.ScopeTopic, allocation: schema.AllocationSequence}, benchLatencySteps[1:2]},
	{benchProducerMode{name: "partition scope", scope: schema.ScopePartition}, benchLatencySteps[1:2]},
}

// benchLatency measures commit-to-handler latency at fixed rates of
// single-event transactions for random hosts, 8 partitions and one
// in-process consumer group: in the default mode, in the other offset and
// wake-up modes, and, at 1,000 events/s, with the producers committing
// asynchronously (a what-if).
func benchLatency(ctx context.Context, e *benchEnv) ([]benchResult, error) {
	out, err := benchLatencyRun(ctx, e, benchProducerSetup{}, benchDefaultMode, benchLatencySteps)
	if err != nil {
		return out, err
	}
	for _, m := range benchLatencyModes {
		rs, err := benchLatencyRun(ctx, e, benchProducerSetup{}, m.mode, m.steps)
		out = append(out, rs...)
		if err != nil {
			return out, err
		}
	}
	whatIf, err := benchLatencyRun(ctx, e, benchAsyncProducers, benchDefaultMode, benchLatencySteps[1:2])
	return append(out, whatIf...), err
}

// benchLatencyRun measures the latency at each step on a fresh database
// whose topic is in mode m, with the producers' connections configured by
// v. Producers append with pgevents.AppendCommit.
//
// Latency is measured two ways. From the producer's COMMIT returned: the
// producer notes the time its AppendCommit returned, the handler the time
// it is called, both on this process's monotonic clock (keyed by the
// event's payload; it can be negative, as a notification may wake the
// consumer before the producer reads the server's answer). And from the
// commit record: the handler inserts the producer's commit time
// (pg_xact_commit_timestamp) into bench_latency, whose handled_at defaults
// to clock_timestamp(), both on the database clock; that one includes the
// producer's WAL flush.
func benchLatencyRun(ctx context.Context, e *benchEnv, v benchProducerSetup, m benchProducerMode, steps []benchLatencyStep) ([]benchResult, error) {
	const partitions = 8
	db, err := e.newModeDB(ctx, partitions, m)
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
	from, since := "created_at (before the producer's commit, so it includes the commit)", "$3::timestamptz"
	if commitTS {
		from, since = "the producer's commit record (pg_xact_commit_timestamp)", "coalesce(pg_xact_commit_timestamp(m.xmin), $3::timestamptz)"
	}
	record := `INSERT INTO bench_latency (c_offset, created_at)
SELECT m.c_offset, ` + since + ` FROM outbox_message_t m WHERE m.topic_id = 1 AND m.partition_id = $2 AND m.c_offset = $1`
	marks := newBenchMarks()
	hs := &pgevents.Handlers{}
	hs.HandleAll(pgevents.HandlerFunc(func(ctx context.Context, tx pgx.Tx, ev *pgevents.Event) error {
		marks.handled(ev.Payload, time.Now())
		_, err := tx.Exec(ctx, record, ev.Offset, ev.PartitionID, ev.CreatedAt)
		return err
	}))
	wakes := &benchWakeCounter{}
	c, err := startBenchConsumer(ctx, cpool, pgevents.Config{GroupID: "latency", TotalPartitions: partitions, Handlers: hs, Observer: wakes})
	if err != nil {
		return nil, err
	}
	defer c.stop() //nolint:errcheck // the results are in

	var appended atomic.Int64
	appendFn := benchAppendCommitTx(benchTopic)
	// Warm up connections and statement caches on both sides.
	if _, err := (benchLoad{producers: 16, txSize: 1, rate: newBenchRate(2000), txFn: appendFn}).run(ctx, ppool, time.Second, &appended); err != nil {
		return nil, err
	}
	if err := c.waitHandled(ctx, appended.Load(), 30*time.Second); err != nil {
		return nil, err
	}

	var out []benchResult
	for _, step := range steps {
		d := benchPick(e, step.full, step.quick)
		var p50, p99, p999, c50, c99, c999, achieved, samples, txP50, txP99 []float64
		waits, stopWaits := benchWatch(ctx, db, 20*time.Millisecond)
		defer stopWaits()
		st0 := c.Stats()
		for rep := range e.reps {
			var t0 time.Time
			if err := db.pool.QueryRow(ctx, `SELECT clock_timestamp()`).Scan(&t0); err != nil {
				return out, err
			}
			marks.reset()
			txTimes := &latency.Recorder{}
			load := benchLoad{producers: step.producers, txSize: 1, rate: newBenchRate(step.rate), txTimes: txTimes,
				txFn: appendFn, onCommit: marks.committed}
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
			g := marks.percentiles(0.5, 0.99, 0.999)
			t50, t99 := txTimes.Take()
			p50, p99, p999 = append(p50, g[0]), append(p99, g[1]), append(p999, g[2])
			c50, c99, c999 = append(c50, q[0]*1000), append(c99, q[1]*1000), append(c999, q[2]*1000)
			achieved, samples = append(achieved, lr.rate()), append(samples, float64(count))
			txP50, txP99 = append(txP50, benchMillis(t50)), append(txP99, benchMillis(t99))
			e.logf("latency%s, %s: %5.0f/s offered, %5.0f/s achieved, rep %d: from COMMIT returned p50 %.2f ms, p99 %.2f ms, p99.9 %.2f ms; from the commit record p50 %.2f ms, p99 %.2f ms (%d events); producer tx p50 %.2f ms; %s",
				v.name(""), m.name, step.rate, lr.rate(), rep+1, g[0], g[1], g[2], q[0]*1000, q[1]*1000, count, benchMillis(t50), wakes.summary())
		}
		stopWaits()
		st1 := c.Stats()
		perBatch := float64(st1.Handled-st0.Handled) / float64(max(1, st1.Batches-st0.Batches))
		name := v.name(fmt.Sprintf("%g events/s, 1-event tx, 8 partitions", step.rate))
		if m.name != benchDefaultMode.name {
			name += ", " + m.name
		}
		r50 := newBenchResult("latency", name+": p50", "ms", p50).
			noted("offered by %d paced producer(s) with AppendCommit; %.0f events per run; latency from the producer's COMMIT returned to the handler's call, on this process's clock; from %s to the handler's clock_timestamp(), on the database clock: p50 %.2f ms, p99 %.2f ms, p99.9 %.2f ms; producer transactions (BEGIN to COMMIT returned) took p50 %.2f ms, p99 %.2f ms; %.1f events per consumer batch; %s; %s",
				step.producers, benchMedian(samples), from, benchMedian(c50), benchMedian(c99), benchMedian(c999), benchMedian(txP50), benchMedian(txP99),
				perBatch, waits.summary("pgevents-consumer"), waits.summary("bench-producer"))
		r99 := newBenchResult("latency", name+": p99", "ms", p99)
		r999 := newBenchResult("latency", name+": p99.9", "ms", p999)
		if step.rate == 1000 && v.label == "" {
			r50, r99 = r50.atMost(0.5), r99.atMost(2.5)
		}
		ach := newBenchResult("latency", name+": rate achieved", "events/s", achieved)
		out = append(out, r50, r99, r999, ach)
	}
	return out, nil
}

// benchMillis returns d in milliseconds.
func benchMillis(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// benchMarks pairs the time a producer's COMMIT returned with the time the
// handler was called, per event, keyed by the event's payload
// ({"producer": i, "seq": n}, as benchEvents makes it).
type benchMarks struct {
	mu   sync.Mutex
	done map[int64]time.Time
	seen map[int64]time.Time
}

func newBenchMarks() *benchMarks {
	return &benchMarks{done: map[int64]time.Time{}, seen: map[int64]time.Time{}}
}

// reset forgets every mark.
func (b *benchMarks) reset() {
	b.mu.Lock()
	b.done, b.seen = map[int64]time.Time{}, map[int64]time.Time{}
	b.mu.Unlock()
}

// committed marks the events of a transaction whose COMMIT returned at.
func (b *benchMarks) committed(evs []pgevents.Event, at time.Time) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for i := range evs {
		if k, ok := benchPayloadKey(evs[i].Payload); ok {
			b.done[k] = at
		}
	}
}

// handled marks an event the handler was called for at.
func (b *benchMarks) handled(payload []byte, at time.Time) {
	if k, ok := benchPayloadKey(payload); ok {
		b.mu.Lock()
		if _, dup := b.seen[k]; !dup {
			b.seen[k] = at
		}
		b.mu.Unlock()
	}
}

// percentiles returns the given percentiles, in milliseconds, of the
// latencies of the events marked both committed and handled.
func (b *benchMarks) percentiles(ps ...float64) []float64 {
	b.mu.Lock()
	var ds []time.Duration
	for k, c := range b.done {
		if h, ok := b.seen[k]; ok {
			ds = append(ds, h.Sub(c))
		}
	}
	b.mu.Unlock()
	out := make([]float64, len(ps))
	if len(ds) == 0 {
		return out
	}
	slices.Sort(ds)
	for i, p := range ps {
		out[i] = benchMillis(ds[min(len(ds)-1, int(p*float64(len(ds))))])
	}
	return out
}

// benchPayloadKey returns producer<<32 | seq from a bench event's payload,
// in the producer's form or the server's (jsonb reorders the keys and adds
// spaces).
func benchPayloadKey(p []byte) (int64, bool) {
	num := func(key string) (int64, bool) {
		i := bytes.Index(p, []byte(`"`+key+`":`))
		if i < 0 {
			return 0, false
		}
		i += len(key) + 3
		for i < len(p) && p[i] == ' ' {
			i++
		}
		var v int64
		j := i
		for ; j < len(p) && p[j] >= '0' && p[j] <= '9'; j++ {
			v = v*10 + int64(p[j]-'0')
		}
		return v, j > i
	}
	producer, ok1 := num("producer")
	seq, ok2 := num("seq")
	return producer<<32 | seq, ok1 && ok2
}
