package main

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgevents/pgevents"
	"github.com/pgevents/pgevents/schema"
)

// benchProducersPartitions is the partition count of the producers case's
// topics.
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

// benchTxVariant is one way of running a producer transaction.
type benchTxVariant struct {
	name string
	fn   benchTxFunc
}

// benchProducers measures how producer throughput scales with the number
// of producers: 1, 4, 16 and 64 producers, each appending transactions of 1
// or 10 events of one random host, into pgevents in each mode against the
// ceiling of the same inserts into a plain table, taking turns in slices.
// Every transaction is BEGIN, then the append (or insert) pipelined with
// COMMIT in one round trip: pgevents.AppendCommit, the fast path of a
// producer whose append is its last statement.
func benchProducers(ctx context.Context, e *benchEnv) ([]benchResult, error) {
	db, err := e.newDB(ctx, benchProducersPartitions)
	if err != nil {
		return nil, err
	}
	defer db.close()
	if err := db.exec(ctx, benchProducersCeilingDDL); err != nil {
		return nil, err
	}
	for _, m := range benchProducerModes[1:] { // topic 1 is the default mode
		if err := m.create(ctx, db.pool, m.topic, benchProducersPartitions); err != nil {
			return nil, err
		}
	}
	pool, err := db.openPool(ctx, "bench-producer", 66, nil)
	if err != nil {
		return nil, err
	}
	variants := []benchTxVariant{{"ceiling", benchCeilingTx(benchProducersCeilingSQL)}}
	for _, m := range benchProducerModes {
		variants = append(variants, benchTxVariant{m.name, benchAppendCommitTx(m.topic)})
	}
	ensure := func() error {
		for _, m := range benchProducerModes {
			if _, err := schema.EnsureSegments(ctx, db.pool, m.topic); err != nil {
				return err
			}
		}
		return nil
	}
	// Warm up: connections, prepared statements, caches.
	for _, v := range variants {
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
			rates, err := benchTakeTurns(ctx, e, pool, variants, size, producers)
			if err != nil {
				return out, err
			}
			cell := fmt.Sprintf("%d-event tx of 1 host, %d producer(s)", size, producers)
			out = append(out, newBenchResult("producers", cell+": ceiling", "events/s", rates[0]).
				noted("plain table, offsets from a sequence, no counter and no NOTIFY; BEGIN, then INSERT pipelined with COMMIT"))
			for k, m := range benchProducerModes {
				out = append(out, newBenchResult("producers", cell+": "+m.name, "events/s", rates[k+1]))
			}
			for k, m := range benchProducerModes {
				r := newBenchResult("producers", cell+": "+m.name+" / ceiling", "ratio", benchRatios(rates[k+1], rates[0]))
				if m.scope == schema.ScopePartition && m.wake == schema.WakeWaiting && producers >= 16 {
					r = r.atLeast(0.7)
				}
				out = append(out, r)
			}
			out = append(out, newBenchResult("producers", cell+": default (wake waiting) / wake always", "ratio", benchRatios(rates[1], rates[2])).
				atLeast(0.95).noted("the default mode no slower than before the wake-up change (notify on every append), within 5%% of noise"))
		}
	}
	return out, nil
}

// benchRatios returns a[i]/b[i] for each repetition.
func benchRatios(a, b []float64) []float64 {
	out := make([]float64, 0, len(a))
	for i := range min(len(a), len(b)) {
		out = append(out, a[i]/b[i])
	}
	return out
}

// benchTakeTurns measures the steady rate of each variant with producers
// running transactions of size events, e.reps times, and returns the rates
// by variant. Within a repetition the variants take turns in 300 ms slices,
// so that a slow spell of the disk or a busy neighbour falls on all alike.
func benchTakeTurns(ctx context.Context, e *benchEnv, pool *pgxpool.Pool, variants []benchTxVariant, size, producers int) ([][]float64, error) {
	const slice = 300 * time.Millisecond
	rounds := int(benchPick(e, 1200*time.Millisecond, 600*time.Millisecond) / slice)
	rates := make([][]float64, len(variants))
	for rep := range e.reps {
		events := make([]int64, len(variants))
		spans := make([]time.Duration, len(variants))
		for round := range rounds {
			for i := range variants {
				k := (i + rep + round) % len(variants)
				lr, err := (benchLoad{producers: producers, txSize: size, oneHost: true, txFn: variants[k].fn}).run(ctx, pool, slice, nil)
				if err != nil {
					return rates, fmt.Errorf("%s: %w", variants[k].name, err)
				}
				events[k] += lr.steadyEvents
				spans[k] += lr.steadyDur
			}
		}
		line := fmt.Sprintf("producers: %2d-event tx, %2d producers, rep %d:", size, producers, rep+1)
		for k, v := range variants {
			rates[k] = append(rates[k], float64(events[k])/spans[k].Seconds())
			line += fmt.Sprintf(" %s %.0f/s", v.name, rates[k][rep])
		}
		e.logf("%s", line)
	}
	return rates, nil
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
