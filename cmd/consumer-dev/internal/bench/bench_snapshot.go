package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgevents/pgevents"
	"github.com/pgevents/pgevents/schema"
)

// benchSnapshotProducers is how many producers append during the snapshot
// case.
const benchSnapshotProducers = 16

// benchSnapshotModes are the topic modes the snapshot case runs in, each on
// a fresh database.
var benchSnapshotModes = []benchProducerMode{
	{name: "partition scope", scope: schema.ScopePartition},
	{name: "topic scope", scope: schema.ScopeTopic},
}

// benchHotStatement is a statement that appends, batches or the watcher run
// all the time, looked up from the end of an index whatever older versions
// an open snapshot keeps: EXPLAIN (ANALYZE, BUFFERS) says what one
// execution reads.
type benchHotStatement struct {
	name string
	sql  string
	// lookups is how many index lookups one execution makes (one per
	// partition for the watcher's tails): the target allows each of them
	// two more buffers at the end, for an index grown by a level.
	lookups int
}

// benchHotStatements returns the hot statements of the bench topic in mode
// m, for the group and the lease (owner, epoch) of partition 0.
func benchHotStatements(m benchProducerMode, group, owner string, epoch int64, partitions int) []benchHotStatement {
	tail := 0
	if m.scope == schema.ScopeTopic {
		tail = -1 // the topic's tail, which appends read under scope topic
	}
	parts := make([]string, partitions)
	for i := range parts {
		parts[i] = fmt.Sprint(i)
	}
	q := func(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }
	return []benchHotStatement{
		{"an append's tail lookup", fmt.Sprintf(`SELECT pt.c_offset FROM partition_tails pt
WHERE pt.topic_id = 1 AND pt.partition_id = %d ORDER BY pt.c_offset DESC LIMIT 1`, tail), 1},
		{"a claim's position lookup", fmt.Sprintf(`SELECT o.next_offset FROM consumer_positions o
WHERE o.group_id = %s AND o.topic_id = 1 AND o.partition_id = 0 ORDER BY o.seq DESC LIMIT 1`, q(group)), 1},
		{"a claim's lease check", fmt.Sprintf(`SELECT EXISTS (SELECT 1 FROM partition_leases
WHERE group_id = %s AND topic_id = 1 AND partition_id = 0 AND owner = %s AND epoch = %d)`, q(group), q(owner), epoch), 1},
		{"the watcher's appends counter", `SELECT pg_sequence_last_value(c.appends) FROM log_counter c WHERE c.topic_id = 1`, 1},
		{"the watcher's tails", fmt.Sprintf(`SELECT coalesce((SELECT t.c_offset FROM partition_tails t
                  WHERE t.topic_id = 1 AND t.partition_id = u.p ORDER BY t.c_offset DESC LIMIT 1), 0),
       CASE WHEN pg_try_advisory_lock(k.key) THEN NOT pg_advisory_unlock(k.key) ELSE true END
FROM unnest('{%s}'::integer[]) WITH ORDINALITY AS u(p, i)
CROSS JOIN LATERAL (SELECT lock_key('flight', 1 || '/' || u.p) AS key) k
ORDER BY u.i`, strings.Join(parts, ",")), partitions},
		{"the poll's positions", fmt.Sprintf(`SELECT u.p, (SELECT o.next_offset FROM consumer_positions o
                  WHERE o.group_id = %s AND o.topic_id = 1 AND o.partition_id = u.p ORDER BY o.seq DESC LIMIT 1)
FROM unnest('{%s}'::integer[]) AS u(p)`, q(group), strings.Join(parts, ",")), partitions},
	}
}

// benchExplained is what EXPLAIN (ANALYZE, BUFFERS) said of one execution.
type benchExplained struct {
	buffers int64   // shared buffers hit or read, the plan's top node
	ms      float64 // execution time
}

// benchExplain runs EXPLAIN (ANALYZE, BUFFERS) of sql on db (a connection
// of its own, READ COMMITTED) and returns the buffers its plan touched and
// its execution time.
func benchExplain(ctx context.Context, db *benchDB, sql string) (benchExplained, error) {
	var plan []struct {
		Plan struct {
			SharedHit  int64 `json:"Shared Hit Blocks"`
			SharedRead int64 `json:"Shared Read Blocks"`
		} `json:"Plan"`
		ExecutionTime float64 `json:"Execution Time"`
	}
	var raw []byte
	if err := db.pool.QueryRow(ctx, `EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) `+sql).Scan(&raw); err != nil {
		return benchExplained{}, fmt.Errorf("explain %s: %w", strings.Fields(sql)[:4], err)
	}
	if err := json.Unmarshal(raw, &plan); err != nil || len(plan) == 0 {
		return benchExplained{}, fmt.Errorf("explain: %v", err)
	}
	return benchExplained{plan[0].Plan.SharedHit + plan[0].Plan.SharedRead, plan[0].ExecutionTime}, nil
}

// benchSnapshot measures what a REPEATABLE READ snapshot held open for a
// long time (10 minutes, 1 with --quick) costs producers and a consumer:
// 16 unpaced producers append single-event transactions (AppendCommit) for
// random hosts to a topic of 8 partitions, one in-process consumer group
// consumes it, and another session holds the snapshot from the start
// (after a SELECT) to the end. Per offset scope, on a fresh database: the
// producers' and the consumer's events/s in the first and the last window
// (a minute; 10 s with --quick), and EXPLAIN (ANALYZE, BUFFERS) of each
// hot statement before the snapshot is taken and at the end, with it still
// open.
func benchSnapshot(ctx context.Context, e *benchEnv) ([]benchResult, error) {
	var out []benchResult
	for _, m := range benchSnapshotModes {
		rs, err := benchSnapshotRun(ctx, e, m)
		out = append(out, rs...)
		if err != nil {
			return out, err
		}
	}
	return out, nil
}

// benchSnapshotRun is benchSnapshot in mode m.
func benchSnapshotRun(ctx context.Context, e *benchEnv, m benchProducerMode) ([]benchResult, error) {
	const partitions = 8
	const group = "snapshot"
	d := benchPick(e, 10*time.Minute, time.Minute)
	window := benchPick(e, time.Minute, 10*time.Second)
	db, err := e.newModeDB(ctx, partitions, m)
	if err != nil {
		return nil, err
	}
	defer db.close()
	if err := db.ensureSegments(ctx); err != nil {
		return nil, err
	}
	cpool, err := db.openConsumerPool(ctx, partitions)
	if err != nil {
		return nil, err
	}
	ppool, err := db.openPool(ctx, "bench-producer", benchSnapshotProducers+2, nil)
	if err != nil {
		return nil, err
	}
	c, err := startBenchConsumer(ctx, cpool, pgevents.Config{GroupID: group, TotalPartitions: partitions})
	if err != nil {
		return nil, err
	}
	defer c.stop() //nolint:errcheck // the results are in
	var appended atomic.Int64
	load := benchLoad{producers: benchSnapshotProducers, txSize: 1, txFn: benchAppendCommitTx(benchTopic)}
	if _, err := load.run(ctx, ppool, time.Second, &appended); err != nil {
		return nil, err
	}
	if err := c.waitHandled(ctx, appended.Load(), time.Minute); err != nil {
		return nil, err
	}
	var owner string
	var epoch int64
	if err := db.pool.QueryRow(ctx, `SELECT owner, epoch FROM partition_leases WHERE group_id = $1 AND topic_id = 1 AND partition_id = 0`, group).Scan(&owner, &epoch); err != nil {
		return nil, err
	}
	hot := benchHotStatements(m, group, owner, epoch, partitions)
	explain := func() ([]benchExplained, error) {
		out := make([]benchExplained, len(hot))
		for i, h := range hot {
			x, err := benchExplain(ctx, db, h.sql)
			if err != nil {
				return nil, err
			}
			out[i] = x
		}
		return out, nil
	}
	sizes := func() (string, error) {
		var s string
		err := db.pool.QueryRow(ctx, `SELECT format('partition_tails %s, consumer_positions %s (with indexes)',
    pg_size_pretty(pg_total_relation_size('partition_tails')), pg_size_pretty(pg_total_relation_size('consumer_positions')))`).Scan(&s)
		return s, err
	}
	before, err := explain()
	if err != nil {
		return nil, err
	}
	size0, err := sizes()
	if err != nil {
		return nil, err
	}

	// The snapshot: a REPEATABLE READ transaction that ran a SELECT, held
	// open on a connection of its own until the end.
	sconn, err := db.pool.Acquire(ctx)
	if err != nil {
		return nil, err
	}
	defer sconn.Release()
	stx, err := sconn.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead})
	if err != nil {
		return nil, err
	}
	defer stx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // ends the snapshot
	var n int64
	if err := stx.QueryRow(ctx, `SELECT count(*) FROM partition_tails`).Scan(&n); err != nil {
		return nil, err
	}

	e.logf("snapshot: %s: a REPEATABLE READ snapshot held open while %d producers append for %s ...", m.name, benchSnapshotProducers, d)
	produced := benchSampleRate(ctx, appended.Load, window)
	handled := benchSampleRate(ctx, func() int64 { return c.Stats().Handled }, window)
	st0 := c.Stats()
	lr, err := load.run(ctx, ppool, d, &appended)
	pw, hw := produced(), handled()
	if err != nil {
		return nil, err
	}
	st1 := c.Stats()
	after, err := explain()
	if err != nil {
		return nil, err
	}
	size1, err := sizes()
	if err != nil {
		return nil, err
	}
	if err := stx.Rollback(ctx); err != nil {
		return nil, err
	}
	if len(pw) < 2 || len(hw) < 2 {
		return nil, fmt.Errorf("snapshot: %d windows of %s in %s", len(pw), window, d)
	}
	first, last := pw[0], pw[len(pw)-1]
	cfirst, clast := hw[0], hw[len(hw)-1]
	lag := appended.Load() - c.Stats().Handled
	e.logf("snapshot: %s: producers %.0f/s in the first %s, %.0f/s in the last; consumer %.0f/s, %.0f/s; lag at the end %d events; %s at the start, %s at the end",
		m.name, first, window, last, cfirst, clast, lag, size0, size1)
	name := fmt.Sprintf("%s, snapshot held %s, %d producers of 1-event tx, 8 partitions, a consumer", m.name, d, benchSnapshotProducers)
	out := []benchResult{
		newBenchResult("snapshot", name+": producers, first "+window.String(), "events/s", []float64{first}).
			noted("AppendCommit, unpaced, random hosts; %.0f events/s over the whole run; another session holds a REPEATABLE READ snapshot (a SELECT ran, the transaction stays open) from the start to the end; rates per window: %s",
				lr.rate(), benchRates(pw)),
		newBenchResult("snapshot", name+": producers, last "+window.String(), "events/s", []float64{last}),
		newBenchResult("snapshot", name+": producers, last / first", "ratio", []float64{last / first}).atLeast(0.9),
		newBenchResult("snapshot", name+": consumer, first "+window.String(), "events/s", []float64{cfirst}).
			noted("in-process consumer, no-op handler, batchSize %d; %.1f events per batch; lag at the end %d events; rates per window: %s",
				pgevents.DefaultBatchSize, float64(st1.Handled-st0.Handled)/float64(max(1, st1.Batches-st0.Batches)), lag, benchRates(hw)),
		newBenchResult("snapshot", name+": consumer, last "+window.String(), "events/s", []float64{clast}),
		newBenchResult("snapshot", name+": consumer, last / first", "ratio", []float64{clast / cfirst}).atLeast(0.9),
	}
	for i, h := range hot {
		r := newBenchResult("snapshot", name+": "+h.name+", buffers at the end", "buffers", []float64{float64(after[i].buffers)}).
			atMost(float64(before[i].buffers+2*int64(h.lookups))).
			noted("EXPLAIN (ANALYZE, BUFFERS): %d buffers and %.3f ms before the snapshot, %d buffers and %.3f ms at the end with it open; `%s`",
				before[i].buffers, before[i].ms, after[i].buffers, after[i].ms, strings.Join(strings.Fields(h.sql), " "))
		if i == 0 {
			r = r.noted("%s before the snapshot, %s at the end", size0, size1)
		}
		out = append(out, r)
	}
	return out, nil
}

// benchRates formats rates per window.
func benchRates(rs []float64) string {
	parts := make([]string, len(rs))
	for i, r := range rs {
		parts[i] = fmt.Sprintf("%.0f", r)
	}
	return strings.Join(parts, ", ")
}

// benchSampleRate samples counter every window in the background and
// returns a function that stops sampling and returns the rate (per second)
// of each complete window.
func benchSampleRate(ctx context.Context, counter func() int64, window time.Duration) func() []float64 {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan []float64, 1)
	go func() {
		var rates []float64
		t := time.NewTicker(window)
		defer t.Stop()
		last := counter()
		for {
			select {
			case <-ctx.Done():
				done <- rates
				return
			case <-t.C:
				cur := counter()
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
