package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgevents/pgevents"
	"github.com/pgevents/pgevents/schema"
)

// benchProducersPartitions is the partition count of the producers case's
// topics (but the wide ones').
const benchProducersPartitions = 8

// benchWidePartitions is the partition count of the producers case's wide
// topics: producers of one partition wait for each other, so their
// throughput grows with the partitions.
const benchWidePartitions = 64

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
var benchDefaultMode = benchProducerMode{1, "topic scope, wake waiting (default)", schema.ScopeTopic, schema.AllocationCounter, schema.WakeWaiting}

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

// benchProducersTopic is a topic of the producers case: its mode, its
// partition count, and whether a consumer group consumes it while the
// producers append (the shape users run: every figure the issue targets
// has one), or not (a reference).
type benchProducersTopic struct {
	mode       benchProducerMode
	partitions int
	attached   bool
	// sql: the topic is also appended to with SELECT append_event(s) on
	// plain connections.
	sql bool
	// target is the ratio to the ceiling the issue asks of the topic's
	// producers at 16 and 64 producers (0: none).
	target float64
}

// benchProducersTopics are the producers case's topics, all in one
// database. Topic 1 is the default mode.
var benchProducersTopics = []benchProducersTopic{
	{benchDefaultMode, benchProducersPartitions, true, true, 0.25},
	{benchProducerMode{2, "topic scope, wake always", schema.ScopeTopic, schema.AllocationCounter, schema.WakeAlways}, benchProducersPartitions, true, false, 0},
	{benchProducerMode{3, "topic scope, sequence allocation, wake waiting", schema.ScopeTopic, schema.AllocationSequence, schema.WakeWaiting}, benchProducersPartitions, true, false, 0.25},
	{benchProducerMode{4, "partition scope, wake waiting", schema.ScopePartition, schema.AllocationCounter, schema.WakeWaiting}, benchProducersPartitions, true, true, 0.70},
	{benchProducerMode{5, "partition scope, wake always", schema.ScopePartition, schema.AllocationCounter, schema.WakeAlways}, benchProducersPartitions, true, false, 0},
	{benchProducerMode{6, fmt.Sprintf("partition scope, wake waiting, %d partitions", benchWidePartitions), schema.ScopePartition, schema.AllocationCounter, schema.WakeWaiting}, benchWidePartitions, true, true, 0.70},
	{benchProducerMode{7, fmt.Sprintf("partition scope, wake always, %d partitions", benchWidePartitions), schema.ScopePartition, schema.AllocationCounter, schema.WakeAlways}, benchWidePartitions, true, false, 0},
	{benchProducerMode{8, "topic scope, wake waiting, no consumer (reference)", schema.ScopeTopic, schema.AllocationCounter, schema.WakeWaiting}, benchProducersPartitions, false, false, 0},
	{benchProducerMode{9, "partition scope, wake waiting, no consumer (reference)", schema.ScopePartition, schema.AllocationCounter, schema.WakeWaiting}, benchProducersPartitions, false, false, 0},
}

// benchTopicRun is a topic of the producers case while it runs: its
// consumer, if any, and the events appended to it so far.
type benchTopicRun struct {
	benchProducersTopic
	consumer *benchConsumer
	wakes    *benchWakeCounter
	appended atomic.Int64
}

// lag returns the events appended to the topic that its consumer has not
// handled yet.
func (t *benchTopicRun) lag() int64 {
	return t.appended.Load() - t.consumer.Stats().Handled
}

// caughtUp waits until the topic's consumer has handled every event
// appended to it, and returns how long that took.
func (t *benchTopicRun) caughtUp(ctx context.Context) (time.Duration, error) {
	began := time.Now()
	err := t.consumer.waitHandled(ctx, t.appended.Load(), time.Minute)
	return time.Since(began), err
}

// benchTxVariant is one way of running a producer transaction.
type benchTxVariant struct {
	name    string
	fn      benchTxFunc
	ceiling int            // the index of the ceiling it is compared with; -1 for a ceiling
	topic   *benchTopicRun // nil for a ceiling
	sql     bool           // SELECT append_event(s) in autocommit, not AppendCommit
}

// benchProducers measures producer throughput with 16 and 64 producers,
// each appending transactions of 1 or 10 events of one random host, in
// each offset scope and wake-up mode, with a consumer group attached and
// caught up (a no-op handler; one group per topic), against the ceiling
// of the same inserts into a plain table with no consumer; taking turns in
// slices. Producers go through pgevents.AppendCommit (BEGIN, then the
// append pipelined with COMMIT in one round trip), and through SELECT
// append_event(...) or append_events(...) on plain pooled connections in
// autocommit, whose ceiling is the plain insert sent the same way. Two
// topics without a consumer are measured beside, for reference.
func benchProducers(ctx context.Context, e *benchEnv) ([]benchResult, error) {
	db, err := e.newDB(ctx, benchProducersPartitions)
	if err != nil {
		return nil, err
	}
	defer db.close()
	if err := db.exec(ctx, benchProducersCeilingDDL); err != nil {
		return nil, err
	}
	topics := make([]*benchTopicRun, len(benchProducersTopics))
	for i, t := range benchProducersTopics {
		topics[i] = &benchTopicRun{benchProducersTopic: t}
		if t.mode.topic == benchTopic {
			continue // created with the database, in the default mode
		}
		if err := t.mode.create(ctx, db.pool, t.mode.topic, t.partitions); err != nil {
			return nil, err
		}
	}
	ensure := func() error {
		for _, t := range topics {
			if _, err := schema.EnsureSegments(ctx, db.pool, t.mode.topic); err != nil {
				return err
			}
		}
		return nil
	}
	if err := ensure(); err != nil {
		return nil, err
	}
	notifies, err := listenNotifies(ctx, db)
	if err != nil {
		return nil, err
	}
	defer notifies.close()
	for _, t := range topics {
		if !t.attached {
			continue
		}
		cpool, err := db.openConsumerPool(ctx, t.partitions)
		if err != nil {
			return nil, err
		}
		t.wakes = &benchWakeCounter{}
		c, err := startBenchConsumer(ctx, cpool, pgevents.Config{GroupID: fmt.Sprintf("producers-%d", t.mode.topic), TopicID: t.mode.topic,
			TotalPartitions: t.partitions, Observer: t.wakes})
		if err != nil {
			return nil, fmt.Errorf("%s: %w", t.mode.name, err)
		}
		t.consumer = c
		defer c.stop() //nolint:errcheck // the results are in
	}
	pool, err := db.openPool(ctx, "bench-producer", 66, nil)
	if err != nil {
		return nil, err
	}
	variants := []benchTxVariant{{name: "ceiling", fn: benchCeilingTx(benchProducersCeilingSQL), ceiling: -1}}
	for _, t := range topics {
		variants = append(variants, benchTxVariant{name: "AppendCommit, " + t.mode.name, fn: benchAppendCommitTx(t.mode.topic), topic: t})
	}
	sqlCeiling := len(variants)
	variants = append(variants, benchTxVariant{name: "ceiling, one statement", fn: benchCeilingStatementTx(benchProducersCeilingSQL), ceiling: -1, sql: true})
	for _, t := range topics {
		if t.sql {
			variants = append(variants, benchTxVariant{name: "SQL append_event(s), " + t.mode.name, fn: benchSQLAppendTx(t.mode.topic), ceiling: sqlCeiling, topic: t, sql: true})
		}
	}
	// Warm up: connections, prepared statements, caches, consumers.
	for _, v := range variants {
		if _, err := (benchLoad{producers: 64, txSize: 10, oneHost: true, txFn: v.fn}).run(ctx, pool, 300*time.Millisecond, benchAppended(v)); err != nil {
			return nil, fmt.Errorf("%s: %w", v.name, err)
		}
		if v.topic != nil && v.topic.consumer != nil {
			if _, err := v.topic.caughtUp(ctx); err != nil {
				return nil, fmt.Errorf("%s: %w", v.name, err)
			}
		}
	}

	var out []benchResult
	for _, size := range []int{1, 10} {
		for _, producers := range []int{16, 64} {
			if err := ensure(); err != nil {
				return out, err
			}
			turns, err := benchTakeTurns(ctx, e, db, pool, notifies, variants, size, producers)
			if err != nil {
				return out, err
			}
			cell := fmt.Sprintf("%d-event tx of 1 host, %d producers", size, producers)
			for k, v := range variants {
				r := newBenchResult("producers", cell+": "+v.name, "events/s", turns.rates[k])
				switch {
				case v.ceiling < 0 && v.sql:
					r = r.noted("plain table, offsets from a sequence, no lock held to commit, no NOTIFY, no consumer; the insert as one statement in autocommit on a pooled connection")
				case v.ceiling < 0:
					r = r.noted("plain table, offsets from a sequence, no lock held to commit, no NOTIFY, no consumer; BEGIN, then the INSERT pipelined with COMMIT")
				case v.sql && size == 1:
					r = r.noted("SELECT append_event(...) in autocommit on a pooled connection")
				case v.sql:
					r = r.noted("SELECT append_events(...) (a JSON array of %d events) in autocommit on a pooled connection", size)
				default:
					r = r.noted("pgevents.AppendCommit: BEGIN, then the append pipelined with COMMIT")
				}
				if v.topic != nil && v.topic.consumer != nil {
					r = r.noted("a consumer group attached (no-op handler, batchSize %d), caught up before every slice: %s",
						pgevents.DefaultBatchSize, turns.consumer[k])
				}
				if v.topic != nil {
					r = r.noted("%.3f notifications per committed transaction from a fifth of each slice to its end, %.3f over whole slices, each starting with the consumer asleep (the bench's LISTEN on the topic's channel)",
						turns.notified[k], turns.notifiedAll[k])
				}
				r = r.noted("%.0f µs CPU per event (bench process, its consumers and the server, from the slice's start until its consumer caught up); producers' sessions: %s",
					turns.cpuUS[k], turns.waits[k])
				out = append(out, r)
			}
			for k, v := range variants {
				if v.ceiling < 0 {
					continue
				}
				r := newBenchResult("producers", cell+": "+v.name+" / ceiling", "ratio", benchRatios(turns.rates[k], turns.rates[v.ceiling]))
				if v.topic.target > 0 {
					r = r.atLeast(v.topic.target)
				}
				out = append(out, r)
			}
			for _, pair := range [][2]int{{1, 2}, {4, 5}} {
				w, a := variants[pair[0]], variants[pair[1]]
				r := newBenchResult("producers", cell+": "+w.topic.mode.name+" / "+a.topic.mode.name, "ratio", benchRatios(turns.rates[pair[0]], turns.rates[pair[1]]))
				if pair[0] == 1 {
					r = r.atLeast(0.95).noted("the default wake-up mode no slower than a notification per append, within 5%% of noise; both with a consumer attached")
				}
				out = append(out, r)
			}
		}
	}
	return out, nil
}

// benchAppended returns the counter of events appended to the variant's
// topic (nil for a ceiling).
func benchAppended(v benchTxVariant) *atomic.Int64 {
	if v.topic == nil {
		return nil
	}
	return &v.topic.appended
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
// during the variant's slices, the notifications per committed
// transaction, the CPU per event, and what its consumer did.
type benchTurns struct {
	rates       [][]float64
	waits       []string
	notified    []float64 // from a fifth of each slice to its end
	notifiedAll []float64 // over whole slices
	cpuUS       []float64 // CPU µs per event of the bench process and the server
	consumer    []string
}

// benchTakeTurns measures the steady rate of each variant with producers
// running transactions of size events, e.reps times. Within a repetition
// the variants take turns in 300 ms slices, so that a slow spell of the
// disk or a busy neighbour falls on all alike. Meanwhile the producers'
// sessions are sampled in pg_stat_activity every 20 ms, the samples going
// to the variant whose slice runs. After a slice of a topic with a
// consumer, the next slice starts once that consumer has handled every
// event appended (so that each starts with every consumer caught up), and
// once the bench's LISTEN connection has received every notification sent
// (so that they are counted in the slice that sent them).
func benchTakeTurns(ctx context.Context, e *benchEnv, db *benchDB, pool *pgxpool.Pool, notifies *benchNotifies, variants []benchTxVariant, size, producers int) (benchTurns, error) {
	const slice = 300 * time.Millisecond
	rounds := int(benchPick(e, 900*time.Millisecond, 600*time.Millisecond) / slice)
	n := len(variants)
	t := benchTurns{rates: make([][]float64, n), waits: make([]string, n), notified: make([]float64, n),
		notifiedAll: make([]float64, n), cpuUS: make([]float64, n), consumer: make([]string, n)}
	cpu := make([]time.Duration, n)
	all := make([]int64, n)
	txs := make([]int64, n)
	notified := make([]int64, n)
	steadyNotified := make([]int64, n)
	steadyTxs := make([]int64, n)
	wakes := make([]benchWakes, n)
	maxLag := make([]int64, n)
	maxCatchUp := make([]time.Duration, n)
	emptyClaims := make([]int64, n)
	batches := make([]int64, n)
	waits := make([]*benchWaits, n)
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
	for rep := range e.reps {
		events := make([]int64, n)
		spans := make([]time.Duration, n)
		for round := range rounds {
			for i := range variants {
				k := (i + rep + round) % n
				v := variants[k]
				tp := v.topic
				var w0 benchWakes
				var n0 int64
				var st0 pgevents.Stats
				if tp != nil {
					n0 = notifies.count(tp.mode.topic)
					if tp.consumer != nil {
						if lag := tp.lag(); lag != 0 {
							return t, fmt.Errorf("%s: the consumer is %d events behind before the slice", v.name, lag)
						}
						w0, st0 = tp.wakes.read(), tp.consumer.Stats()
					}
				}
				// The notifications of the slice's steady part (from a fifth
				// of it, as its rate) are those received after a sync sent
				// then, per transaction committed after the sync did: every
				// slice starts with the consumer asleep on its partitions,
				// whose first appends notify.
				mid := make(chan error, 1)
				var n1 int64
				var counting atomic.Bool
				var counted atomic.Int64 // events committed after the sync
				if tp != nil {
					go func() {
						timer := time.NewTimer(slice / 5)
						defer timer.Stop()
						select {
						case <-ctx.Done():
							mid <- ctx.Err()
							return
						case <-timer.C:
						}
						err := notifies.syncThen(ctx, db, func() { counting.Store(true) })
						n1 = notifies.count(tp.mode.topic)
						mid <- err
					}()
				}
				current.Store(int32(k))
				c0 := e.cpu()
				load := benchLoad{producers: producers, txSize: size, oneHost: true, txFn: v.fn}
				if tp != nil {
					load.onCommit = func(evs []pgevents.Event, _ benchTxTimes) {
						if counting.Load() {
							counted.Add(int64(len(evs)))
						}
					}
				}
				lr, err := load.run(ctx, pool, slice, benchAppended(v))
				current.Store(-1)
				if tp != nil {
					if merr := <-mid; err == nil {
						err = merr
					}
				}
				if err != nil {
					return t, fmt.Errorf("%s: %w", v.name, err)
				}
				if tp != nil && tp.consumer != nil {
					maxLag[k] = max(maxLag[k], tp.lag())
					d, err := tp.caughtUp(ctx)
					if err != nil {
						return t, fmt.Errorf("%s: %w", v.name, err)
					}
					maxCatchUp[k] = max(maxCatchUp[k], d)
				}
				cpu[k] += e.cpu().since(c0).own
				if tp != nil {
					if err := notifies.sync(ctx, db); err != nil {
						return t, err
					}
					n2 := notifies.count(tp.mode.topic)
					notified[k] += n2 - n0
					steadyNotified[k] += n2 - n1
					steadyTxs[k] += counted.Load() / int64(size)
					if tp.consumer != nil {
						wakes[k] = wakes[k].add(tp.wakes.read().since(w0))
						st1 := tp.consumer.Stats()
						emptyClaims[k] += st1.EmptyClaims - st0.EmptyClaims
						batches[k] += st1.Batches - st0.Batches
					}
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
			line += fmt.Sprintf(" %s %.0f/s;", v.name, t.rates[k][rep])
		}
		e.logf("%s", line)
	}
	for k := range variants {
		t.waits[k] = waits[k].summary("bench-producer")
		if txs[k] > 0 {
			t.notified[k] = float64(steadyNotified[k]) / float64(max(1, steadyTxs[k]))
			t.notifiedAll[k] = float64(notified[k]) / float64(txs[k])
			t.cpuUS[k] = float64(cpu[k].Microseconds()) / float64(all[k])
			t.consumer[k] = fmt.Sprintf("%s; %.1f events per batch, %d empty claims; lag at the end of a slice at most %d events, caught up within %s",
				wakes[k].summary(txs[k]), float64(all[k])/float64(max(1, batches[k])), emptyClaims[k], maxLag[k], maxCatchUp[k].Round(time.Millisecond))
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

// benchSQLEvent is an element of append_events' JSON array.
type benchSQLEvent struct {
	HostID    string          `json:"host_id"`
	UserID    string          `json:"user_id"`
	EventType string          `json:"event_type"`
	Payload   json.RawMessage `json:"payload"`
}

// benchSQLAppendTx returns a producer transaction that appends its events
// to topic in SQL, as a producer in another language would: one statement
// in autocommit on a pooled connection (its own transaction), SELECT
// append_event(...) for one event, SELECT append_events(...) with a JSON
// array for more.
func benchSQLAppendTx(topic int) benchTxFunc {
	return func(ctx context.Context, pool *pgxpool.Pool, evs []pgevents.Event) error {
		if len(evs) == 1 {
			ev := &evs[0]
			_, err := pool.Exec(ctx, `SELECT append_event($1, $2, $3, $4, $5::jsonb)`, topic, ev.HostID, ev.UserID, ev.EventType, string(ev.Payload))
			return err
		}
		arr := make([]benchSQLEvent, len(evs))
		for i, ev := range evs {
			arr[i] = benchSQLEvent{ev.HostID, ev.UserID, ev.EventType, ev.Payload}
		}
		b, err := json.Marshal(arr)
		if err != nil {
			return err
		}
		_, err = pool.Exec(ctx, `SELECT append_events($1, $2::jsonb)`, topic, string(b))
		return err
	}
}

// benchCeilingArgs returns the arguments of benchProducersCeilingSQL for
// evs.
func benchCeilingArgs(evs []pgevents.Event) []any {
	hosts, users, types, payloads := make([]string, len(evs)), make([]string, len(evs)), make([]string, len(evs)), make([]string, len(evs))
	for i := range evs {
		hosts[i], users[i], types[i], payloads[i] = evs[i].HostID, evs[i].UserID, evs[i].EventType, string(evs[i].Payload)
	}
	return []any{benchTopic, benchProducersPartitions, hosts, users, types, payloads}
}

// benchCeilingTx returns a producer transaction that inserts its events
// with statement (benchProducersCeilingSQL): BEGIN, then the insert and
// COMMIT in one round trip, as benchAppendCommitTx does.
func benchCeilingTx(statement string) benchTxFunc {
	return func(ctx context.Context, pool *pgxpool.Pool, evs []pgevents.Event) error {
		args := benchCeilingArgs(evs)
		return benchPipelinedTx(ctx, pool, func(b *pgx.Batch) { b.Queue(statement, args...) })
	}
}

// benchPipelinedTx runs a producer transaction on an acquired connection:
// BEGIN, then the statements queue adds and COMMIT in one round trip.
func benchPipelinedTx(ctx context.Context, pool *pgxpool.Pool, queue func(*pgx.Batch)) error {
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
	queue(&b)
	b.Queue("COMMIT")
	if err := tx.SendBatch(ctx, &b).Close(); err != nil {
		_ = tx.Rollback(context.WithoutCancel(ctx))
		return err
	}
	return nil
}

// benchCeilingStatementTx returns a producer transaction that inserts its
// events with statement (benchProducersCeilingSQL) in autocommit, as
// benchSQLAppendTx appends.
func benchCeilingStatementTx(statement string) benchTxFunc {
	return func(ctx context.Context, pool *pgxpool.Pool, evs []pgevents.Event) error {
		_, err := pool.Exec(ctx, statement, benchCeilingArgs(evs)...)
		return err
	}
}

// oneHost gives every event of evs the host of the first, and returns evs.
func (m *benchEvents) oneHost(evs []pgevents.Event) []pgevents.Event {
	for i := range evs {
		evs[i].HostID = evs[0].HostID
	}
	return evs
}
