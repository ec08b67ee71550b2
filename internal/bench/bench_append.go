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

// benchPlainDDL creates the plain-SQL baselines beside pgevents' tables: a
// counter like log_counter and plain (unpartitioned) log tables with the
// same columns, defaults, constraints and indexes as outbox_message_t, one
// filled through the counter, one through a sequence.
const benchPlainDDL = `
CREATE TABLE plain_counter (LIKE log_counter INCLUDING ALL) WITH (fillfactor = 10);
INSERT INTO plain_counter (topic_id, total_partitions)
SELECT topic_id, total_partitions FROM log_counter WHERE topic_id = 1;
CREATE TABLE plain_log (LIKE outbox_message_t INCLUDING ALL);
CREATE INDEX plain_log_partition_idx ON plain_log (topic_id, partition_id, c_offset);
CREATE TABLE seq_log (LIKE plain_log INCLUDING ALL);
CREATE SEQUENCE seq_log_offset;
`

// benchPlainSQL returns a plain-SQL append in one statement. With counter,
// it is the same work as append_events without the framework: reserve the
// offsets with UPDATE ... RETURNING on the counter row (whose lock is held
// to commit), insert the rows with one multi-row INSERT into plain_log, and
// (with notify) send one notification naming the partitions and their
// highest offsets. Without counter, offsets come from a sequence into
// seq_log, neither gapless nor commit-ordered: the ceiling without the
// counter lock.
func benchPlainSQL(counter, notify bool) string {
	reserve := `UPDATE plain_counter SET next_offset = next_offset + $2::integer
    WHERE topic_id = $1::integer
    RETURNING next_offset - $2::integer AS first_offset, total_partitions`
	offset, table := "r.first_offset + e.ord - 1", "plain_log"
	if !counter {
		reserve = "SELECT $2::integer AS n, 8 AS total_partitions"
		offset, table = "nextval('seq_log_offset')", "seq_log"
	}
	final := "SELECT count(*) FROM ins"
	if notify {
		final = `SELECT pg_notify('plain_channel', $1::integer::text || ':' || string_agg(p.partition_id || '/' || p.max_offset, ',' ORDER BY p.partition_id))
FROM (SELECT partition_id, max(c_offset) AS max_offset FROM ins GROUP BY partition_id) p`
	}
	return `WITH r AS (
    ` + reserve + `
), ins AS (
    INSERT INTO ` + table + ` (c_offset, topic_id, partition_id, host_id, user_id, transaction_id, event_type, payload)
    SELECT ` + offset + `, $1::integer,
           (abs(hashtext(e.host_id)::bigint) % r.total_partitions)::integer,
           e.host_id, e.user_id, txid_current(), e.event_type, e.payload::jsonb
    FROM r, unnest($3::text[], $4::text[], $5::text[], $6::text[]) WITH ORDINALITY AS e(host_id, user_id, event_type, payload, ord)
    RETURNING partition_id, c_offset
)
` + final
}

// benchPlainAppender returns a producer that appends with statement, a
// benchPlainSQL.
func benchPlainAppender(statement string) benchAppendFunc {
	return func(ctx context.Context, tx pgx.Tx, evs []pgevents.Event) error {
		hosts, users, types, payloads := make([]string, len(evs)), make([]string, len(evs)), make([]string, len(evs)), make([]string, len(evs))
		for i := range evs {
			hosts[i], users[i], types[i], payloads[i] = evs[i].HostID, evs[i].UserID, evs[i].EventType, string(evs[i].Payload)
		}
		_, err := tx.Exec(ctx, statement, benchTopic, len(evs), hosts, users, types, payloads)
		return err
	}
}

// benchVariant is one way of appending, measured against the others.
type benchVariant struct {
	name string
	fn   benchAppendFunc
}

// benchAppend measures the append rate of pgevents.Append against the
// plain-SQL baseline, for transactions of 1 to 1000 events and 1 to 16
// producers, alternating the two in every repetition; then the ceiling of
// single-event transactions without the counter row; then the rate while a
// snapshot is held open.
func benchAppend(ctx context.Context, e *benchEnv) ([]benchResult, error) {
	db, err := e.newDB(ctx, 8)
	if err != nil {
		return nil, err
	}
	defer db.close()
	if err := db.exec(ctx, benchPlainDDL); err != nil {
		return nil, err
	}
	pool, err := db.openPool(ctx, "bench-producer", 20, nil)
	if err != nil {
		return nil, err
	}
	variants := []benchVariant{
		{"pgevents", benchAppendPgevents},
		{"plain SQL", benchPlainAppender(benchPlainSQL(true, true))},
	}
	ceiling := []benchVariant{
		{"no counter (sequence), NOTIFY", benchPlainAppender(benchPlainSQL(false, true))},
		{"no counter, no NOTIFY", benchPlainAppender(benchPlainSQL(false, false))},
	}
	// Warm up: connections, prepared statements, caches.
	for _, v := range append(variants, ceiling...) {
		if _, err := (benchLoad{producers: 16, txSize: 10, appendFn: v.fn}).run(ctx, pool, 300*time.Millisecond, nil); err != nil {
			return nil, err
		}
	}

	var out []benchResult
	for _, size := range []int{1, 10, 100, 1000} {
		for _, producers := range []int{1, 4, 16} {
			rates, err := benchCompare(ctx, e, db, pool, variants, size, producers)
			if err != nil {
				return out, err
			}
			var ratios []float64
			for i := range rates[0] {
				ratios = append(ratios, rates[0][i]/rates[1][i])
			}
			cell := fmt.Sprintf("%d-event tx, %d producer(s)", size, producers)
			for k, v := range variants {
				out = append(out, newBenchResult("append", cell+": "+v.name, "events/s", rates[k]))
			}
			out = append(out, newBenchResult("append", cell+": pgevents/plain", "ratio", ratios).atLeast(0.9))
		}
	}
	for _, producers := range []int{1, 4, 16} {
		rates, err := benchCompare(ctx, e, db, pool, ceiling, 1, producers)
		if err != nil {
			return out, err
		}
		for k, v := range ceiling {
			out = append(out, newBenchResult("append", fmt.Sprintf("1-event tx, %d producer(s): %s", producers, v.name), "events/s", rates[k]).
				noted("ceiling without the counter row lock: offsets from a sequence, neither gapless nor commit-ordered"))
		}
	}
	snap, err := benchSnapshot(ctx, e)
	return append(out, snap...), err
}

// benchCompare measures the steady append rate of each variant with
// producers appending transactions of size events, e.reps times, and
// returns the rates by variant. Within a repetition the variants take turns
// in slices (300 ms for small transactions, up to 2 s for large ones, so
// that a slice holds many transactions), so that a slow spell of the disk
// or a busy neighbour falls on all of them alike.
func benchCompare(ctx context.Context, e *benchEnv, db *benchDB, pool *pgxpool.Pool, variants []benchVariant, size, producers int) ([][]float64, error) {
	slice := 300 * time.Millisecond
	switch {
	case size >= 1000:
		slice = 2 * time.Second
	case size >= 100:
		slice = 600 * time.Millisecond
	}
	d := max(slice, benchPick(e, 1200*time.Millisecond, 600*time.Millisecond))
	rounds := int(d / slice)
	rates := make([][]float64, len(variants))
	for rep := range e.reps {
		line := fmt.Sprintf("append: %4d-event tx, %2d producers, rep %d:", size, producers, rep+1)
		events := make([]int64, len(variants))
		spans := make([]time.Duration, len(variants))
		for round := range rounds {
			for i := range variants {
				k := (i + rep + round) % len(variants)
				if err := db.ensureSegments(ctx); err != nil {
					return rates, err
				}
				lr, err := (benchLoad{producers: producers, txSize: size, appendFn: variants[k].fn}).run(ctx, pool, slice, nil)
				if err != nil {
					return rates, fmt.Errorf("%s: %w", variants[k].name, err)
				}
				events[k] += lr.steadyEvents
				spans[k] += lr.steadyDur
			}
		}
		for k := range variants {
			rates[k] = append(rates[k], float64(events[k])/spans[k].Seconds())
		}
		for k, v := range variants {
			line += fmt.Sprintf(" %s %.0f/s", v.name, rates[k][rep])
		}
		e.logf("%s", line)
	}
	return rates, nil
}

// benchSnapshot measures single-event appends by 4 producers for a while
// (40 s in full mode) on a fresh database, without and then with another
// session holding a REPEATABLE READ snapshot open for the whole run. It
// reports the rate of the whole run and of its last window, and how many
// buffers a lookup of the counter row reads at the end.
func benchSnapshot(ctx context.Context, e *benchEnv) ([]benchResult, error) {
	d := benchPick(e, 40*time.Second, 8*time.Second)
	window := benchPick(e, 10*time.Second, 2*time.Second)
	type outcome struct {
		whole, first, last float64
		buffers            int64
		counterBytes       int64
	}
	runs := []struct {
		hold       bool
		allocation string
	}{{false, schema.AllocationCounter}, {true, schema.AllocationCounter}, {true, schema.AllocationSequence}}
	var res [3]outcome
	for k, run := range runs {
		hold := run.hold
		o, err := func() (outcome, error) {
			db, err := e.newDB(ctx, 8)
			if err != nil {
				return outcome{}, err
			}
			defer db.close()
			if err := schema.SetAllocation(ctx, db.pool, benchTopic, run.allocation); err != nil {
				return outcome{}, err
			}
			pool, err := db.openPool(ctx, "bench-producer", 6, nil)
			if err != nil {
				return outcome{}, err
			}
			if hold {
				conn, err := db.pool.Acquire(ctx)
				if err != nil {
					return outcome{}, err
				}
				defer conn.Release()
				tx, err := conn.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
				if err != nil {
					return outcome{}, err
				}
				defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // ends the snapshot
				var n int64
				if err := tx.QueryRow(ctx, `SELECT count(*) FROM log_counter`).Scan(&n); err != nil {
					return outcome{}, err
				}
			}
			var appended atomic.Int64
			perWindow := benchSampleRate(ctx, &appended, window)
			lr, err := (benchLoad{producers: 4, txSize: 1}).run(ctx, pool, d, &appended)
			wins := perWindow()
			if err != nil {
				return outcome{}, err
			}
			o := outcome{whole: lr.rate()}
			if len(wins) > 0 {
				o.first, o.last = wins[0], wins[len(wins)-1]
			}
			o.buffers, err = benchCounterLookupBuffers(ctx, db)
			if err != nil {
				return o, err
			}
			err = db.pool.QueryRow(ctx, `SELECT pg_relation_size('log_counter')`).Scan(&o.counterBytes)
			return o, err
		}()
		if err != nil {
			return nil, err
		}
		res[k] = o
		e.logf("append: %s allocation, snapshot held=%v for %s: %.0f events/s (first %s %.0f/s, last %s %.0f/s), counter lookup reads %d buffers, log_counter %d kB",
			run.allocation, hold, d, o.whole, window, o.first, window, o.last, o.buffers, o.counterBytes/1024)
	}
	name := func(s string) string { return fmt.Sprintf("1-event tx, 4 producers, %s, %s", s, d) }
	note := func(o outcome) string {
		return fmt.Sprintf("first %s %.0f/s, last %s %.0f/s; at the end a lookup of the counter row reads %d buffers and log_counter is %d kB",
			window, o.first, window, o.last, o.buffers, o.counterBytes/1024)
	}
	return []benchResult{
		newBenchResult("append", name("no open snapshot"), "events/s", []float64{res[0].whole}).noted("%s", note(res[0])),
		newBenchResult("append", name("snapshot held open"), "events/s", []float64{res[1].whole}).noted("%s", note(res[1])),
		newBenchResult("append", fmt.Sprintf("snapshot/no snapshot, last %s", window), "ratio", []float64{res[1].last / res[0].last}).
			noted("one run each, on fresh databases: the effect grows with the time the snapshot has been open"),
		newBenchResult("append", name("snapshot held open, sequence allocation"), "events/s", []float64{res[2].whole}).
			noted("offsetAllocation: sequence (advisory lock + sequence: commit-ordered, gaps on rollback); first %s %.0f/s, last %s %.0f/s",
				window, res[2].first, window, res[2].last),
		newBenchResult("append", fmt.Sprintf("sequence with snapshot/counter without, last %s", window), "ratio", []float64{res[2].last / res[0].last}),
	}, nil
}

// benchSampleRate samples counter every window in the background and
// returns a function that stops sampling and returns the rate (per second)
// of each complete window.
func benchSampleRate(ctx context.Context, counter *atomic.Int64, window time.Duration) func() []float64 {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan []float64, 1)
	go func() {
		var rates []float64
		t := time.NewTicker(window)
		defer t.Stop()
		last := counter.Load()
		for {
			select {
			case <-ctx.Done():
				done <- rates
				return
			case <-t.C:
				cur := counter.Load()
				rates = append(rates, float64(cur-last)/window.Seconds())
				last = cur
			}
		}
	}()
	return func() []float64 {
		cancel()
		return <-done
	}
}

// benchCounterLookupBuffers returns how many shared buffers a lookup of the
// bench topic's counter row touches (EXPLAIN (ANALYZE, BUFFERS)): the
// versions an append must step over to find the live one.
func benchCounterLookupBuffers(ctx context.Context, db *benchDB) (int64, error) {
	var plan []struct {
		Plan struct {
			SharedHit  int64 `json:"Shared Hit Blocks"`
			SharedRead int64 `json:"Shared Read Blocks"`
		} `json:"Plan"`
	}
	var raw []byte
	if err := db.pool.QueryRow(ctx, `EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON)
SELECT next_offset FROM log_counter WHERE topic_id = $1`, benchTopic).Scan(&raw); err != nil {
		return 0, err
	}
	if err := json.Unmarshal(raw, &plan); err != nil || len(plan) == 0 {
		return 0, fmt.Errorf("explain: %v", err)
	}
	return plan[0].Plan.SharedHit + plan[0].Plan.SharedRead, nil
}
