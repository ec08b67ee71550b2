package bench

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgevents/pgevents"
	"github.com/pgevents/pgevents/schema"
)

// benchProducersPartitions is the partition count of the producers case's
// topics (but benchWideMode's).
const benchProducersPartitions = 8

// benchProducersCeilingDDL creates the ceiling of the producers case: a
// plain table with the columns, defaults, checks and primary key of
// outbox_message_t (not partitioned), whose offsets come from a sequence.
// Nothing is held to commit and nothing is notified.
const benchProducersCeilingDDL = `
CREATE TABLE ceiling_log (LIKE outbox_message_t INCLUDING ALL);
CREATE SEQUENCE ceiling_offset;
`

// benchProducersCeilingSQL inserts the events into ceiling_log: the same
// rows append_events writes, partition computed the same way, offsets from
// the sequence.
const benchProducersCeilingSQL = `INSERT INTO ceiling_log (c_offset, topic_id, partition_id, host_id, user_id, transaction_id, event_type, payload)
SELECT nextval('ceiling_offset'), $1::integer, (abs(hashtext(e.host_id)::bigint) % $2::integer)::integer,
       e.host_id, e.user_id, txid_current(), e.event_type, e.payload::jsonb
FROM unnest($3::text[], $4::text[], $5::text[], $6::text[]) AS e(host_id, user_id, event_type, payload)`

// benchProducerMode is one way a topic allocates offsets and wakes
// consumers.
type benchProducerMode struct {
	topic      int
	name       string
	scope      string
	allocation string
	wake       string
}

// benchDefaultMode is a topic's mode unless configured otherwise.
var benchDefaultMode = benchProducerMode{1, "counter, wake waiting (default)", schema.ScopeTopic, schema.AllocationCounter, schema.WakeWaiting}

// create creates topic in mode m with the given partition count.
func (m benchProducerMode) create(ctx context.Context, db schema.DB, topic, partitions int) error {
	if _, _, err := schema.EnsureTopicSpec(ctx, db, schema.TopicSpec{ID: topic, Partitions: partitions, Scope: m.scope}); err != nil {
		return err
	}
	if m.allocation != "" && m.allocation != schema.AllocationCounter {
		if err := schema.SetAllocation(ctx, db, topic, m.allocation); err != nil {
			return err
		}
	}
	if m.wake != "" && m.wake != schema.WakeWaiting {
		return schema.SetWake(ctx, db, topic, m.wake)
	}
	return nil
}

// benchProducerModes are the modes the producers case compares, each on a
// topic of its own in one database. Topic 1 is the default mode.
var benchProducerModes = []benchProducerMode{
	benchDefaultMode,
	{2, "counter, wake always", schema.ScopeTopic, schema.AllocationCounter, schema.WakeAlways},
	{3, "sequence, wake waiting", schema.ScopeTopic, schema.AllocationSequence, schema.WakeWaiting},
	{4, "sequence, wake always", schema.ScopeTopic, schema.AllocationSequence, schema.WakeAlways},
	{5, "partition scope, wake waiting", schema.ScopePartition, schema.AllocationCounter, schema.WakeWaiting},
	{6, "partition scope, wake always", schema.ScopePartition, schema.AllocationCounter, schema.WakeAlways},
}

// benchAttachedModes are the modes measured a second time with a consumer
// group attached (on topics of their own): its workers go idle between
// events and announce it, so appends notify again, and the idle protocol
// takes locks beside the producers'. Measured at 16 and 64 producers.
var benchAttachedModes = []benchProducerMode{
	{7, "partition scope, wake waiting, consumer attached", schema.ScopePartition, schema.AllocationCounter, schema.WakeWaiting},
	{8, "partition scope, wake always, consumer attached", schema.ScopePartition, schema.AllocationCounter, schema.WakeAlways},
}

// benchWideMode is partition scope on a topic of benchWidePartitions
// partitions: producers of one partition wait for each other, so their
// throughput grows with the partitions. Measured at 16 and 64 producers.
var benchWideMode = benchProducerMode{9, fmt.Sprintf("partition scope, wake waiting, %d partitions", benchWidePartitions), schema.ScopePartition, schema.AllocationCounter, schema.WakeWaiting}

// benchWidePartitions is the partition count of benchWideMode's topic.
const benchWidePartitions = 64

// benchTxVariant is one way of running a producer transaction.
type benchTxVariant struct {
	name string
	fn   benchTxFunc
	// woken, when set, counts the notifications the variant's consumer
	// was woken by.
	woken *atomic.Int64
}

// benchProducers measures how producer throughput scales with the number
// of producers: 1, 4, 16 and 64 producers, each appending transactions of 1
// or 10 events of one random host, into pgevents in each mode against the
// ceiling of the same inserts into a plain table, taking turns in slices.
// Every transaction is BEGIN, then the append (or insert) pipelined with
// COMMIT in one round trip: pgevents.AppendCommit, the fast path of a
// producer whose append is its last statement. No consumer runs, except
// for the modes of benchAttachedModes.
func benchProducers(ctx context.Context, e *benchEnv) ([]benchResult, error) {
	db, err := e.newDB(ctx, benchProducersPartitions)
	if err != nil {
		return nil, err
	}
	defer db.close()
	if err := db.exec(ctx, benchProducersCeilingDDL); err != nil {
		return nil, err
	}
	modes := append(slices.Clone(benchProducerModes), benchAttachedModes...)
	for _, m := range modes[1:] { // topic 1 is the default mode
		if err := m.create(ctx, db.pool, m.topic, benchProducersPartitions); err != nil {
			return nil, err
		}
	}
	if err := benchWideMode.create(ctx, db.pool, benchWideMode.topic, benchWidePartitions); err != nil {
		return nil, err
	}
	modes = append(modes, benchWideMode)
	pool, err := db.openPool(ctx, "bench-producer", 66, nil)
	if err != nil {
		return nil, err
	}
	variants := []benchTxVariant{{name: "ceiling", fn: benchCeilingTx(benchProducersCeilingSQL)}}
	for _, m := range benchProducerModes {
		variants = append(variants, benchTxVariant{name: m.name, fn: benchAppendCommitTx(m.topic)})
	}
	attached := make([]benchTxVariant, 0, len(benchAttachedModes))
	for _, m := range benchAttachedModes {
		cpool, err := db.openConsumerPool(ctx, benchProducersPartitions)
		if err != nil {
			return nil, err
		}
		obs := &benchWakeCounter{}
		c, err := startBenchConsumer(ctx, cpool, pgevents.Config{GroupID: fmt.Sprintf("attached-%d", m.topic), TopicID: m.topic,
			TotalPartitions: benchProducersPartitions, Observer: obs})
		if err != nil {
			return nil, err
		}
		defer c.stop() //nolint:errcheck // the results are in
		attached = append(attached, benchTxVariant{name: m.name, fn: benchAppendCommitTx(m.topic), woken: &obs.notified})
	}
	attached = append(attached, benchTxVariant{name: benchWideMode.name, fn: benchAppendCommitTx(benchWideMode.topic)})
	ensure := func() error {
		for _, m := range modes {
			if _, err := schema.EnsureSegments(ctx, db.pool, m.topic); err != nil {
				return err
			}
		}
		return nil
	}
	// Warm up: connections, prepared statements, caches.
	for _, v := range append(slices.Clone(variants), attached...) {
		if _, err := (benchLoad{producers: 64, txSize: 10, oneHost: true, txFn: v.fn}).run(ctx, pool, 300*time.Millisecond, nil); err != nil {
			return nil, fmt.Errorf("%s: %w", v.name, err)
		}
	}

	var out []benchResult
	for _, size := range []int{1, 10} {
		for _, producers := range []int{1, 4, 16, 64} {
			if err := ensure(); err != nil {
				return out, err
			}
			vs := variants
			if producers >= 16 {
				vs = append(slices.Clone(variants), attached...)
			}
			turns, err := benchTakeTurns(ctx, e, db, pool, vs, size, producers)
			if err != nil {
				return out, err
			}
			rates := turns.rates
			cell := fmt.Sprintf("%d-event tx of 1 host, %d producer(s)", size, producers)
			out = append(out, newBenchResult("producers", cell+": ceiling", "events/s", rates[0]).
				noted("plain table, offsets from a sequence, no counter and no NOTIFY; BEGIN, then INSERT pipelined with COMMIT; %.0f µs CPU per event (bench and server); producers' sessions: %s",
					turns.cpuUS[0], turns.waits[0]))
			for k, v := range vs[1:] {
				r := newBenchResult("producers", cell+": "+v.name, "events/s", rates[k+1])
				if producers >= 16 && strings.HasPrefix(v.name, "partition") || v.woken != nil {
					r = r.noted("%.0f µs CPU per event (bench and server); producers' sessions: %s", turns.cpuUS[k+1], turns.waits[k+1])
				}
				if v.woken != nil {
					r = r.noted("the consumer was woken by %.2f notifications per transaction", turns.notified[k+1])
				}
				out = append(out, r)
			}
			for k, v := range vs[1:] {
				r := newBenchResult("producers", cell+": "+v.name+" / ceiling", "ratio", benchRatios(rates[k+1], rates[0]))
				if (v.name == "partition scope, wake waiting" || v.name == benchWideMode.name) && producers >= 16 {
					r = r.atLeast(0.7)
				}
				out = append(out, r)
			}
			out = append(out, newBenchResult("producers", cell+": default (wake waiting) / wake always", "ratio", benchRatios(rates[1], rates[2])).
				atLeast(0.95).noted("the default mode no slower than before the wake-up change (a notification per append), within 5%% of noise"))
		}
	}
	return out, nil
}

// benchWakeCounter is a consumer's Observer that counts the wake-ups, by
// source.
type benchWakeCounter struct {
	notified atomic.Int64
	sources  [8]atomic.Int64
}

// summary says how many wake-ups came from each source.
func (o *benchWakeCounter) summary() string {
	var parts []string
	for s := range o.sources {
		if n := o.sources[s].Load(); n > 0 {
			parts = append(parts, fmt.Sprintf("%s %d", pgevents.WakeSource(s), n))
		}
	}
	if len(parts) == 0 {
		return "no wake-ups"
	}
	return "wake-ups: " + strings.Join(parts, ", ")
}

func (o *benchWakeCounter) BatchCommitted(pgevents.BatchStats) {}
func (o *benchWakeCounter) BatchFailed(int, pgevents.Class)    {}
func (o *benchWakeCounter) ListenerConnected(bool)             {}
func (o *benchWakeCounter) Skipped(int, int64, string)         {}
func (o *benchWakeCounter) Woken(_ int, src pgevents.WakeSource) {
	if src == pgevents.WakeNotify {
		o.notified.Add(1)
	}
	if int(src) < len(o.sources) {
		o.sources[src].Add(1)
	}
}

// benchRatios returns a[i]/b[i] for each repetition.
func benchRatios(a, b []float64) []float64 {
	out := make([]float64, 0, len(a))
	for i := range min(len(a), len(b)) {
		out = append(out, a[i]/b[i])
	}
	return out
}

// benchTurns is what benchTakeTurns measured, by variant: the steady
// rates of each repetition, the wait events of the producers' sessions
// during the variant's slices, and the consumer's wake-ups by
// notification per transaction (variants with a consumer).
type benchTurns struct {
	rates    [][]float64
	waits    []string
	notified []float64
	cpuUS    []float64 // CPU µs per event of the bench process and the server
}

// benchTakeTurns measures the steady rate of each variant with producers
// running transactions of size events, e.reps times. Within a repetition
// the variants take turns in 300 ms slices, so that a slow spell of the
// disk or a busy neighbour falls on all alike. Meanwhile the producers'
// sessions are sampled in pg_stat_activity every 20 ms, the samples going
// to the variant whose slice runs.
func benchTakeTurns(ctx context.Context, e *benchEnv, db *benchDB, pool *pgxpool.Pool, variants []benchTxVariant, size, producers int) (benchTurns, error) {
	const slice = 300 * time.Millisecond
	rounds := int(benchPick(e, 900*time.Millisecond, 600*time.Millisecond) / slice)
	t := benchTurns{rates: make([][]float64, len(variants)), waits: make([]string, len(variants)), notified: make([]float64, len(variants)),
		cpuUS: make([]float64, len(variants))}
	cpu := make([]time.Duration, len(variants))
	all := make([]int64, len(variants))
	waits := make([]*benchWaits, len(variants))
	for k := range waits {
		waits[k] = &benchWaits{}
	}
	var current atomic.Int32
	current.Store(-1)
	sctx, stopSampling := context.WithCancel(ctx)
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		benchSampleWaits(sctx, db.pool, 20*time.Millisecond, func() *benchWaits {
			if k := current.Load(); k >= 0 {
				return waits[k]
			}
			return nil
		})
	}()
	defer func() {
		stopSampling()
		<-sampled
	}()
	txs := make([]int64, len(variants))
	woken := make([]int64, len(variants))
	for rep := range e.reps {
		events := make([]int64, len(variants))
		spans := make([]time.Duration, len(variants))
		for round := range rounds {
			for i := range variants {
				k := (i + rep + round) % len(variants)
				v := variants[k]
				var w0 int64
				if v.woken != nil {
					w0 = v.woken.Load()
				}
				current.Store(int32(k))
				c0 := e.cpu()
				lr, err := (benchLoad{producers: producers, txSize: size, oneHost: true, txFn: v.fn}).run(ctx, pool, slice, nil)
				cpu[k] += e.cpu().since(c0).own
				current.Store(-1)
				if err != nil {
					return t, fmt.Errorf("%s: %w", v.name, err)
				}
				if v.woken != nil {
					woken[k] += v.woken.Load() - w0
				}
				txs[k] += lr.events / int64(size)
				all[k] += lr.events
				events[k] += lr.steadyEvents
				spans[k] += lr.steadyDur
			}
		}
		line := fmt.Sprintf("producers: %2d-event tx, %2d producers, rep %d:", size, producers, rep+1)
		for k, v := range variants {
			t.rates[k] = append(t.rates[k], float64(events[k])/spans[k].Seconds())
			line += fmt.Sprintf(" %s %.0f/s", v.name, t.rates[k][rep])
		}
		e.logf("%s", line)
	}
	for k := range variants {
		t.waits[k] = waits[k].summary("bench-producer")
		if txs[k] > 0 {
			t.notified[k] = float64(woken[k]) / float64(txs[k])
			t.cpuUS[k] = float64(cpu[k].Microseconds()) / float64(all[k])
		}
	}
	return t, nil
}

// benchAppendCommitTx returns a producer transaction that appends its
// events to topic with pgevents.AppendCommit: BEGIN, then the append and
// COMMIT in one round trip. The transaction is begun on an acquired
// connection, which is released without the round trip a Rollback of the
// finished pgx.Tx would cost.
func benchAppendCommitTx(topic int) benchTxFunc {
	return func(ctx context.Context, pool *pgxpool.Pool, evs []pgevents.Event) error {
		for i := range evs {
			evs[i].TopicID = topic
		}
		conn, err := pool.Acquire(ctx)
		if err != nil {
			return err
		}
		defer conn.Release()
		tx, err := conn.Begin(ctx)
		if err != nil {
			return err
		}
		_, err = pgevents.AppendCommit(ctx, tx, evs...)
		return err
	}
}

// benchCeilingTx returns a producer transaction that inserts its events
// with statement (benchProducersCeilingSQL): BEGIN, then the insert and
// COMMIT in one round trip, as benchAppendCommitTx does.
func benchCeilingTx(statement string) benchTxFunc {
	return func(ctx context.Context, pool *pgxpool.Pool, evs []pgevents.Event) error {
		hosts, users, types, payloads := make([]string, len(evs)), make([]string, len(evs)), make([]string, len(evs)), make([]string, len(evs))
		for i := range evs {
			hosts[i], users[i], types[i], payloads[i] = evs[i].HostID, evs[i].UserID, evs[i].EventType, string(evs[i].Payload)
		}
		conn, err := pool.Acquire(ctx)
		if err != nil {
			return err
		}
		defer conn.Release()
		tx, err := conn.Begin(ctx)
		if err != nil {
			return err
		}
		var b pgx.Batch
		b.Queue(statement, benchTopic, benchProducersPartitions, hosts, users, types, payloads)
		b.Queue("COMMIT")
		if err := tx.SendBatch(ctx, &b).Close(); err != nil {
			_ = tx.Rollback(context.WithoutCancel(ctx))
			return err
		}
		return nil
	}
}

// oneHost gives every event of evs the host of the first, and returns evs.
func (m *benchEvents) oneHost(evs []pgevents.Event) []pgevents.Event {
	for i := range evs {
		evs[i].HostID = evs[0].HostID
	}
	return evs
}
