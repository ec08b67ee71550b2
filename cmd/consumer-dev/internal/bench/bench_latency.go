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
	"github.com/pgevents/pgevents/cmd/consumer-dev/internal/latency"
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
	// schedule: report whether every transaction committed on schedule.
	schedule bool
}

// The latency case's steps: idle (one producer), the 1,000/s from
// 4 producers, and 3,000/s from 16, where every transaction must commit on
// schedule.
var (
	benchLatencyIdle = benchLatencyStep{100, 1, 6 * time.Second, 3 * time.Second, false}
	benchLatency1k   = benchLatencyStep{1000, 4, 5 * time.Second, 2 * time.Second, false}
	benchLatency3k   = benchLatencyStep{3000, 16, 4 * time.Second, 2 * time.Second, true}
)

// benchLatencyModes are the topic modes the latency case measures, each on
// a fresh database, and their steps.
var benchLatencyModes = []struct {
	mode  benchProducerMode
	steps []benchLatencyStep
}{
	{benchDefaultMode, []benchLatencyStep{benchLatencyIdle, benchLatency1k, benchLatency3k}},
	{benchProducerMode{name: "topic scope, wake always", scope: schema.ScopeTopic, wake: schema.WakeAlways}, []benchLatencyStep{benchLatency1k, benchLatency3k}},
	{benchProducerMode{name: "partition scope, wake waiting", scope: schema.ScopePartition}, []benchLatencyStep{benchLatency1k, benchLatency3k}},
	{benchProducerMode{name: "partition scope, wake always", scope: schema.ScopePartition, wake: schema.WakeAlways}, []benchLatencyStep{benchLatency1k, benchLatency3k}},
	{benchProducerMode{name: "sequenced, wake waiting", scope: schema.ScopeSequenced}, []benchLatencyStep{benchLatencyIdle, benchLatency1k, benchLatency3k}},
}

// benchLatency measures commit-to-handler latency at fixed rates of
// single-event transactions for random hosts, 8 partitions and one
// in-process consumer group: in both offset scopes and both wake-up modes,
// and for a sequenced topic (whose consumer's process runs the sequencer),
// and, at 1,000 events/s, with the producers committing asynchronously (a
// what-if).
func benchLatency(ctx context.Context, e *benchEnv) ([]benchResult, error) {
	var out []benchResult
	for _, m := range benchLatencyModes {
		rs, err := benchLatencyRun(ctx, e, benchProducerSetup{}, m.mode, m.steps)
		out = append(out, rs...)
		if err != nil {
			return out, err
		}
	}
	whatIf, err := benchLatencyRun(ctx, e, benchAsyncProducers, benchDefaultMode, []benchLatencyStep{benchLatency1k})
	return append(out, whatIf...), err
}

// benchLatencyRun measures the latency at each step on a fresh database
// whose topic is in mode m, with the producers' connections configured by
// v. Producers append with pgevents.AppendCommit.
//
// Latency is measured three ways. From the producer's COMMIT returned: the
// producer notes the time its AppendCommit returned, the handler the time
// it is called, both on this process's monotonic clock (keyed by the
// event's payload; it can be negative, as a notification may wake the
// consumer before the producer reads the server's answer). From the
// producer's call: the time before its BEGIN, so the producer's own
// transaction (two round trips and its WAL flush) is included. And from
// the commit record: the handler inserts the producer's commit time
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
	if err := db.ensureSegments(ctx); err != nil {
		return nil, err
	}
	notifies, err := listenNotifies(ctx, db)
	if err != nil {
		return nil, err
	}
	defer notifies.close()
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
		interval := time.Duration(float64(step.producers) / step.rate * float64(time.Second))
		var p50, p99, p999, b50, b99, b999, c50, c99, c999, achieved, samples, txP50, txP99, notified, committed, onTime, late99, lateMax []float64
		waits, stopWaits := benchWatch(ctx, db, 20*time.Millisecond)
		defer stopWaits()
		st0, w0 := c.Stats(), wakes.read()
		var txs int64
		for rep := range e.reps {
			var t0 time.Time
			if err := db.pool.QueryRow(ctx, `SELECT clock_timestamp()`).Scan(&t0); err != nil {
				return out, err
			}
			if err := notifies.sync(ctx, db); err != nil {
				return out, err
			}
			n0 := notifies.count(benchTopic)
			marks.reset()
			sched := &benchSchedule{interval: interval}
			txTimes := &latency.Recorder{}
			load := benchLoad{producers: step.producers, txSize: 1, rate: newBenchRate(step.rate), txTimes: txTimes,
				txFn: appendFn, onCommit: func(evs []pgevents.Event, t benchTxTimes) {
					marks.committed(evs, t)
					sched.add(t)
				}}
			lr, err := load.run(ctx, ppool, d, &appended)
			if err != nil {
				return out, err
			}
			if err := c.waitHandled(ctx, appended.Load(), 30*time.Second); err != nil {
				return out, err
			}
			if err := notifies.sync(ctx, db); err != nil {
				return out, err
			}
			notes := notifies.count(benchTopic) - n0
			txs += lr.events
			var count int64
			var q []float64
			if err := db.pool.QueryRow(ctx, benchLatencySQL, t0).Scan(&count, &q); err != nil {
				return out, err
			}
			g := marks.percentiles(false, 0.5, 0.99, 0.999)
			b := marks.percentiles(true, 0.5, 0.99, 0.999)
			t50, t99 := txTimes.Take()
			p50, p99, p999 = append(p50, g[0]), append(p99, g[1]), append(p999, g[2])
			b50, b99, b999 = append(b50, b[0]), append(b99, b[1]), append(b999, b[2])
			c50, c99, c999 = append(c50, q[0]*1000), append(c99, q[1]*1000), append(c999, q[2]*1000)
			achieved, samples = append(achieved, lr.rate()), append(samples, float64(count))
			txP50, txP99 = append(txP50, benchMillis(t50)), append(txP99, benchMillis(t99))
			notified = append(notified, float64(notes)/float64(max(1, lr.events)))
			offered := step.rate * d.Seconds()
			sc := sched.summary()
			committed, onTime = append(committed, float64(lr.events)/offered), append(onTime, float64(sc.onTime)/offered)
			late99, lateMax = append(late99, benchMillis(sc.p99)), append(lateMax, benchMillis(sc.max))
			e.logf("latency%s, %s: %5.0f/s offered, %5.0f/s achieved, rep %d: from COMMIT returned p50 %.2f ms, p99 %.2f ms, p99.9 %.2f ms; from the call p50 %.2f ms, p99 %.2f ms, p99.9 %.2f ms; from the commit record p50 %.2f ms, p99 %.2f ms (%d events); producer tx p50 %.2f ms; %.3f notifications/tx; committed %.3f of offered, %.3f on schedule, lateness p99 %.2f ms, max %.2f ms",
				v.name(""), m.name, step.rate, lr.rate(), rep+1, g[0], g[1], g[2], b[0], b[1], b[2], q[0]*1000, q[1]*1000, count, benchMillis(t50),
				notified[rep], committed[rep], onTime[rep], late99[rep], lateMax[rep])
		}
		stopWaits()
		st1 := c.Stats()
		wk := wakes.read().since(w0)
		perBatch := float64(st1.Handled-st0.Handled) / float64(max(1, st1.Batches-st0.Batches))
		name := v.name(fmt.Sprintf("%g events/s, 1-event tx, 8 partitions, %s", step.rate, m.name))
		r50 := newBenchResult("latency", name+": p50 from COMMIT", "ms", p50).
			noted("offered by %d paced producer(s) with AppendCommit; %.0f events per run; latency from the producer's COMMIT returned to the handler's call, on this process's clock; from %s to the handler's clock_timestamp(), on the database clock: p50 %.2f ms, p99 %.2f ms, p99.9 %.2f ms; producer transactions (BEGIN to COMMIT returned) took p50 %.2f ms, p99 %.2f ms; %.1f events per consumer batch, %d empty claims; %s; %s; %s",
				step.producers, benchMedian(samples), from, benchMedian(c50), benchMedian(c99), benchMedian(c999), benchMedian(txP50), benchMedian(txP99),
				perBatch, st1.EmptyClaims-st0.EmptyClaims, wk.summary(txs), waits.summary("pgevents-consumer"), waits.summary("bench-producer"))
		r99 := newBenchResult("latency", name+": p99 from COMMIT", "ms", p99)
		r999 := newBenchResult("latency", name+": p99.9 from COMMIT", "ms", p999)
		s50 := newBenchResult("latency", name+": p50 from the call", "ms", b50).
			noted("from the producer's call (before its BEGIN: its own transaction included) to the handler's call")
		s99 := newBenchResult("latency", name+": p99 from the call", "ms", b99)
		s999 := newBenchResult("latency", name+": p99.9 from the call", "ms", b999)
		if step.rate == 1000 && v.label == "" {
			r50, r99, r999 = r50.atMost(0.25), r99.atMost(1), r999.atMost(3)
			s50, s99 = s50.atMost(1), s99.atMost(5)
		}
		ach := newBenchResult("latency", name+": rate achieved", "events/s", achieved)
		nt := newBenchResult("latency", name+": notifications per committed transaction", "ratio", notified).
			noted("counted by the bench's LISTEN on the topic's channel; the consumer was woken by %d of them", wk[pgevents.WakeNotify])
		out = append(out, r50, r99, r999, s50, s99, s999, ach, nt)
		if step.schedule {
			out = append(out,
				newBenchResult("latency", name+": transactions committed / offered", "ratio", committed).atLeast(0.99).
					noted("offered: %g transactions/s for %s (%d producers, one every %s each, catching up by at most 1 s); %.3f of the offered committed within %s of their scheduled start (the producer's interval) (median)",
						step.rate, d, step.producers, interval.Round(time.Microsecond), benchMedian(onTime), interval.Round(time.Microsecond)),
				newBenchResult("latency", name+": lateness of the schedule, p99", "ms", late99).atMost(benchMillis(interval)).
					noted("COMMIT returned minus the transaction's scheduled start; the longest %.2f ms (median of the runs' longest)", benchMedian(lateMax)))
		}
	}
	return out, nil
}

// benchSchedule collects how late paced transactions committed.
type benchSchedule struct {
	interval time.Duration
	mu       sync.Mutex
	late     []time.Duration
}

// add records a committed transaction.
func (s *benchSchedule) add(t benchTxTimes) {
	if t.due.IsZero() {
		return
	}
	s.mu.Lock()
	s.late = append(s.late, t.done.Sub(t.due))
	s.mu.Unlock()
}

// benchScheduleSummary is how late transactions committed: how many within
// the producer's interval of their scheduled start, the 99th percentile
// and the longest.
type benchScheduleSummary struct {
	onTime   int
	p99, max time.Duration
}

func (s *benchSchedule) summary() benchScheduleSummary {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out benchScheduleSummary
	if len(s.late) == 0 {
		return out
	}
	slices.Sort(s.late)
	for _, l := range s.late {
		if l <= s.interval {
			out.onTime++
		}
	}
	out.p99 = s.late[min(len(s.late)-1, int(0.99*float64(len(s.late))))]
	out.max = s.late[len(s.late)-1]
	return out
}

// benchMillis returns d in milliseconds.
func benchMillis(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// benchMarks pairs the times of a producer's transaction (its call, and
// its COMMIT returned) with the time the handler was called, per event,
// keyed by the event's payload ({"producer": i, "seq": n}, as benchEvents
// makes it).
type benchMarks struct {
	mu   sync.Mutex
	done map[int64]benchTxTimes
	seen map[int64]time.Time
}

func newBenchMarks() *benchMarks {
	return &benchMarks{done: map[int64]benchTxTimes{}, seen: map[int64]time.Time{}}
}

// reset forgets every mark.
func (b *benchMarks) reset() {
	b.mu.Lock()
	b.done, b.seen = map[int64]benchTxTimes{}, map[int64]time.Time{}
	b.mu.Unlock()
}

// committed marks the events of a transaction with its times.
func (b *benchMarks) committed(evs []pgevents.Event, t benchTxTimes) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for i := range evs {
		if k, ok := benchPayloadKey(evs[i].Payload); ok {
			b.done[k] = t
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
// latencies of the events marked both committed and handled: from the
// producer's call when fromCall, else from its COMMIT returned.
func (b *benchMarks) percentiles(fromCall bool, ps ...float64) []float64 {
	b.mu.Lock()
	var ds []time.Duration
	for k, c := range b.done {
		if h, ok := b.seen[k]; ok {
			if fromCall {
				ds = append(ds, h.Sub(c.began))
			} else {
				ds = append(ds, h.Sub(c.done))
			}
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
