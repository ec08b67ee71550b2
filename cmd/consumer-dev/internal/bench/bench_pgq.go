package bench

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgevents/pgevents"
	"github.com/pgevents/pgevents/schema"
)

// benchPgqProducers is how many unpaced producers the pgq case runs.
const benchPgqProducers = 16

// benchPgqQueue is the PgQ queue of the pgq case, and the name of its
// consumer.
const benchPgqQueue = "bench"

// PgQ statements. The ticker ticks at most a loop's maxLag apart while
// events arrive (ticker_max_lag), as pgqd does with a short period; the
// consumer reads a batch, its events and finishes it in one transaction.
const (
	benchPgqSetupSQL = `CREATE EXTENSION IF NOT EXISTS pgq;
SELECT pgq.create_queue('` + benchPgqQueue + `');
SELECT pgq.register_consumer('` + benchPgqQueue + `', '` + benchPgqQueue + `');`
	benchPgqMaxLagSQL    = `SELECT pgq.set_queue_config('` + benchPgqQueue + `', 'ticker_max_lag', $1)`
	benchPgqInsertSQL    = `SELECT pgq.insert_event('` + benchPgqQueue + `', $1, $2)`
	benchPgqTickerSQL    = `SELECT pgq.ticker()`
	benchPgqTickQueueSQL = `SELECT pgq.ticker('` + benchPgqQueue + `')`
	benchPgqNextBatchSQL = `SELECT pgq.next_batch('` + benchPgqQueue + `', '` + benchPgqQueue + `')`
	benchPgqEventsSQL    = `SELECT ev_id, ev_type, ev_data FROM pgq.get_batch_events($1)`
	benchPgqFinishSQL    = `SELECT pgq.finish_batch($1)`
)

// benchPgqLoop is how PgQ's ticker and consumer run beside the producers.
type benchPgqLoop struct {
	// tick is how often the ticker goroutine calls pgq.ticker(), and
	// maxLag the queue's ticker_max_lag: with events waiting, a tick
	// closes a batch once maxLag has passed since the last one. With tick
	// 0 there is no ticker goroutine: the consumer calls the queue's
	// ticker itself whenever it finds no batch ready, and looks again at
	// once when that made a tick, so that ticks never outrun it (a batch
	// runs from one tick to the next, and a consumer slower than the
	// ticks falls behind for good).
	tick, maxLag time.Duration
	// idle is how long the consumer waits after finding no batch.
	idle time.Duration
	// handled, when not nil, is called with each event's payload as the
	// consumer reads it, and the time.
	handled func(payload []byte, at time.Time)
}

// benchPgqLoopPgq is the pgq case's loop: a tick every 50 ms, as pgqd
// does with a short period, the consumer polling every 20 ms when idle.
var benchPgqLoopPgq = benchPgqLoop{tick: 50 * time.Millisecond, maxLag: 50 * time.Millisecond, idle: 20 * time.Millisecond}

// benchPgqVariant is a producer transaction of the pgq case and how to
// tell that its consumer, if any, has caught up.
type benchPgqVariant struct {
	name     string
	fn       benchTxFunc
	appended *atomic.Int64
	caughtUp func(ctx context.Context) error // nil: no consumer
	note     string
}

// benchPgq measures 16 unpaced producers of single-event transactions:
// an INSERT into a plain table (no counter, no NOTIFY, no consumer);
// pgevents.AppendCommit to a topic of 8 partitions in topic and in
// partition scope, each with an in-process consumer group attached and
// caught up, and each with none; to a sequenced topic with a consumer
// group attached (whose process runs the sequencer), and with none; the
// attached topics again through SQL append_event in autocommit; and PgQ's
// pgq.insert_event with a ticker and a consumer keeping up. The variants
// take turns in slices.
func benchPgq(ctx context.Context, e *benchEnv) ([]benchResult, error) {
	db, err := e.newDB(ctx, benchProducersPartitions)
	if err != nil {
		return nil, err
	}
	defer db.close()
	if err := db.exec(ctx, benchProducersCeilingDDL); err != nil {
		return nil, err
	}
	type topic struct {
		id       int
		scope    string
		attached bool
	}
	topics := []topic{{benchTopic, schema.ScopeTopic, true}, {2, schema.ScopePartition, true}, {3, schema.ScopeTopic, false}, {4, schema.ScopePartition, false},
		{5, schema.ScopeSequenced, true}, {6, schema.ScopeSequenced, false}}
	for _, t := range topics[1:] {
		if _, _, err := schema.EnsureTopicSpec(ctx, db.pool, schema.TopicSpec{ID: t.id, Partitions: benchProducersPartitions, Scope: t.scope}); err != nil {
			return nil, err
		}
	}
	ensure := func() error {
		for _, t := range topics {
			if _, err := schema.EnsureSegments(ctx, db.pool, t.id); err != nil {
				return err
			}
		}
		return nil
	}
	if err := ensure(); err != nil {
		return nil, err
	}
	variants := []benchPgqVariant{{name: "plain insert", fn: benchCeilingTx(benchProducersCeilingSQL),
		note: "one row into a plain table with outbox_message_t's columns, defaults and keys, offsets from a sequence: no counter, no lock held to commit, no NOTIFY, no consumer; BEGIN, then the INSERT pipelined with COMMIT"}}
	for _, t := range topics {
		v := benchPgqVariant{fn: benchAppendCommitTx(t.id), appended: new(atomic.Int64)}
		v.name = fmt.Sprintf("pgevents, %s scope", t.scope)
		v.note = fmt.Sprintf("pgevents.AppendCommit (BEGIN, then the append pipelined with COMMIT) to a %s-scope topic of %d partitions", t.scope, benchProducersPartitions)
		if t.attached {
			v.name += ", consumer attached"
			cpool, err := db.openConsumerPool(ctx, benchProducersPartitions)
			if err != nil {
				return nil, err
			}
			c, err := startBenchConsumer(ctx, cpool, pgevents.Config{GroupID: fmt.Sprintf("pgq-%d", t.id), TopicID: t.id, TotalPartitions: benchProducersPartitions})
			if err != nil {
				return nil, fmt.Errorf("%s: %w", v.name, err)
			}
			defer c.stop() //nolint:errcheck // the results are in
			appended := v.appended
			v.caughtUp = func(ctx context.Context) error { return c.waitHandled(ctx, appended.Load(), time.Minute) }
			v.note += fmt.Sprintf("; an in-process consumer group attached (no-op handler, batchSize %d), caught up before every slice", pgevents.DefaultBatchSize)
		} else {
			v.name += ", no consumer"
		}
		variants = append(variants, v)
	}
	// The same topics with a consumer attached, appended to from SQL:
	// SELECT append_event(...) in autocommit, as an application without
	// the Go package appends (same counters, same consumers).
	for i, t := range topics {
		if !t.attached {
			continue
		}
		v := variants[1+i]
		variants = append(variants, benchPgqVariant{name: v.name + ", SQL append_event", fn: benchSQLAppendTx(t.id), appended: v.appended, caughtUp: v.caughtUp,
			note: fmt.Sprintf("SELECT append_event(...) in autocommit (one statement, its own transaction) to the %s-scope topic of the row above, whose consumer group is attached", t.scope)})
	}
	q, skipped := benchStartPgq(ctx, e, db, benchPgqLoopPgq)
	if q != nil {
		defer q.stop()
		variants = append(variants, benchPgqVariant{name: "PgQ insert_event", fn: benchPgqTx, appended: &q.appended,
			caughtUp: q.caughtUp,
			note: fmt.Sprintf("BEGIN, then SELECT pgq.insert_event(queue, type, payload) pipelined with COMMIT; pgq.ticker() called every %s (ticker_max_lag 50 ms); a consumer loops next_batch, get_batch_events (rows read), finish_batch in one transaction each, polling every 20 ms when no batch is ready, caught up before every slice",
				benchPgqLoopPgq.tick)})
	} else {
		e.logf("pgq: PgQ rows skipped: %s", skipped)
	}

	pool, err := db.openPool(ctx, "bench-producer", benchPgqProducers+2, nil)
	if err != nil {
		return nil, err
	}
	// Warm up: connections, prepared statements, caches, consumers.
	for _, v := range variants {
		if _, err := (benchLoad{producers: benchPgqProducers, txSize: 1, txFn: v.fn}).run(ctx, pool, 300*time.Millisecond, v.appended); err != nil {
			return nil, fmt.Errorf("%s: %w", v.name, err)
		}
		if v.caughtUp != nil {
			if err := v.caughtUp(ctx); err != nil {
				return nil, fmt.Errorf("%s: %w", v.name, err)
			}
		}
	}

	slice := time.Second
	rounds := benchPick(e, 3, 2)
	rates := make([][]float64, len(variants))
	for rep := range e.reps {
		if err := ensure(); err != nil {
			return nil, err
		}
		events := make([]int64, len(variants))
		spans := make([]time.Duration, len(variants))
		for round := range rounds {
			for i := range variants {
				k := (i + rep + round) % len(variants)
				v := variants[k]
				lr, err := (benchLoad{producers: benchPgqProducers, txSize: 1, txFn: v.fn}).run(ctx, pool, slice, v.appended)
				if err != nil {
					return nil, fmt.Errorf("%s: %w", v.name, err)
				}
				if v.caughtUp != nil {
					if err := v.caughtUp(ctx); err != nil {
						return nil, fmt.Errorf("%s: %w", v.name, err)
					}
				}
				events[k] += lr.steadyEvents
				spans[k] += lr.steadyDur
			}
		}
		line := fmt.Sprintf("pgq: rep %d:", rep+1)
		for k, v := range variants {
			rates[k] = append(rates[k], float64(events[k])/spans[k].Seconds())
			line += fmt.Sprintf(" %s %.0f/s;", v.name, rates[k][rep])
		}
		e.logf("%s", line)
	}
	drained := ""
	if q != nil {
		if err := q.caughtUp(ctx); err != nil {
			return nil, fmt.Errorf("PgQ: %w", err)
		}
		if c, a := q.consumed.Load(), q.appended.Load(); c != a {
			return nil, fmt.Errorf("PgQ: the consumer read %d events of %d appended", c, a)
		}
		drained = fmt.Sprintf("at the end the PgQ consumer had read all %d events appended, in %d batches", q.appended.Load(), q.batches.Load())
	}

	cell := fmt.Sprintf("%d producers, 1-event tx", benchPgqProducers)
	how := fmt.Sprintf("unpaced; steady rate (from a fifth of each slice to its end) over %d slices of %s per repetition, the variants taking turns", rounds, slice)
	var out []benchResult
	for k, v := range variants {
		r := newBenchResult("pgq", cell+": "+v.name, "tx/s", rates[k]).noted("%s; %s", v.note, how)
		if strings.HasPrefix(v.name, "PgQ") && drained != "" {
			r = r.noted("%s", drained)
		}
		out = append(out, r)
	}
	ratio := func(a, b int, note string) {
		r := newBenchResult("pgq", cell+": "+variants[a].name+" / "+variants[b].name, "ratio", benchRatios(rates[a], rates[b]))
		if note != "" {
			r = r.noted("%s", note)
		}
		out = append(out, r)
	}
	for k := 1; k < len(variants); k++ {
		ratio(k, 0, "")
	}
	ratio(1, 3, "what attaching a caught-up consumer group costs the producers, topic scope")
	ratio(2, 4, "what attaching a caught-up consumer group costs the producers, partition scope")
	if q != nil {
		pgq := len(variants) - 1
		ratio(1, pgq, "")
		ratio(2, pgq, "")
	} else {
		out[0] = out[0].noted("PgQ rows skipped: %s", skipped)
	}
	return out, nil
}

// benchPgqTx is a producer transaction that inserts its events into the
// PgQ queue: BEGIN, then pgq.insert_event per event pipelined with COMMIT.
func benchPgqTx(ctx context.Context, pool *pgxpool.Pool, evs []pgevents.Event) error {
	return benchPipelinedTx(ctx, pool, func(b *pgx.Batch) {
		for i := range evs {
			b.Queue(benchPgqInsertSQL, evs[i].EventType, string(evs[i].Payload))
		}
	})
}

// benchPgqRun is PgQ running beside the producers: its ticker and its
// consumer, and the events appended to and read from its queue.
type benchPgqRun struct {
	appended atomic.Int64
	consumed atomic.Int64
	batches  atomic.Int64
	handled  func(payload []byte, at time.Time) // see benchPgqLoop
	pools    []*pgxpool.Pool
	cancel   context.CancelFunc
	wg       sync.WaitGroup
	mu       sync.Mutex
	err      error
}

// benchStartPgq installs PgQ in db and starts its ticker and consumer as
// loop says (see benchSetupPgq and benchStartPgqLoops); or returns nil and
// why not.
func benchStartPgq(ctx context.Context, e *benchEnv, db *benchDB, loop benchPgqLoop) (*benchPgqRun, string) {
	if skipped := benchSetupPgq(ctx, e, db, loop); skipped != "" {
		return nil, skipped
	}
	q, err := benchStartPgqLoops(ctx, db, loop)
	if err != nil {
		return nil, err.Error()
	}
	return q, ""
}

// benchSetupPgq installs PgQ in db (and, when the extension is missing
// from the bench's own server and the bench runs as root, its Debian
// package) and creates the queue, with loop's ticker_max_lag, and its
// consumer; or returns why it could not. Running it again changes nothing
// but the queue's ticker_max_lag.
func benchSetupPgq(ctx context.Context, e *benchEnv, db *benchDB, loop benchPgqLoop) string {
	if err := db.exec(ctx, benchPgqSetupSQL); err != nil {
		if !strings.Contains(err.Error(), "extension control file") || e.cluster == nil {
			return err.Error()
		}
		var major int
		if err := db.pool.QueryRow(ctx, `SELECT current_setting('server_version_num')::int / 10000`).Scan(&major); err != nil {
			return err.Error()
		}
		pkg := fmt.Sprintf("postgresql-%d-pgq3", major)
		if os.Geteuid() != 0 {
			return fmt.Sprintf("the pgq extension is not installed (Debian package %s), and the bench is not root to install it", pkg)
		}
		e.logf("pgq: installing %s with apt-get ...", pkg)
		cmd := exec.CommandContext(ctx, "apt-get", "install", "-y", "-q", pkg)
		cmd.Env = append(os.Environ(), "DEBIAN_FRONTEND=noninteractive")
		if out, err := cmd.CombinedOutput(); err != nil {
			lines := strings.Split(strings.TrimSpace(string(out)), "\n")
			return fmt.Sprintf("apt-get install %s: %v: %s", pkg, err, lines[len(lines)-1])
		}
		if err := db.exec(ctx, benchPgqSetupSQL); err != nil {
			return err.Error()
		}
	}
	if err := db.exec(ctx, benchPgqMaxLagSQL, fmt.Sprintf("%d microseconds", loop.maxLag.Microseconds())); err != nil {
		return err.Error()
	}
	return ""
}

// benchStartPgqLoops starts PgQ's ticker and consumer on db, whose queue
// benchSetupPgq created, each on a connection of its own that stop
// closes.
func benchStartPgqLoops(ctx context.Context, db *benchDB, loop benchPgqLoop) (*benchPgqRun, error) {
	tpool, err := db.openPool(ctx, "bench-pgq-ticker", 1, nil)
	if err != nil {
		return nil, err
	}
	cpool, err := db.openPool(ctx, "bench-pgq-consumer", 1, nil)
	if err != nil {
		tpool.Close()
		return nil, err
	}
	rctx, cancel := context.WithCancel(ctx)
	q := &benchPgqRun{cancel: cancel, handled: loop.handled, pools: []*pgxpool.Pool{tpool, cpool}}
	q.wg.Add(1)
	go func() {
		defer q.wg.Done()
		if loop.tick == 0 {
			return
		}
		t := time.NewTicker(loop.tick)
		defer t.Stop()
		for {
			select {
			case <-rctx.Done():
				return
			case <-t.C:
			}
			if _, err := tpool.Exec(rctx, benchPgqTickerSQL); err != nil {
				q.fail(rctx, fmt.Errorf("ticker: %w", err))
				return
			}
		}
	}()
	q.wg.Add(1)
	go func() {
		defer q.wg.Done()
		for rctx.Err() == nil {
			n, got, err := q.readBatch(rctx, cpool)
			if err != nil {
				q.fail(rctx, fmt.Errorf("consumer: %w", err))
				return
			}
			q.consumed.Add(n)
			if got {
				q.batches.Add(1)
				continue
			}
			if loop.tick == 0 {
				var tick *int64
				if err := cpool.QueryRow(rctx, benchPgqTickQueueSQL).Scan(&tick); err != nil {
					q.fail(rctx, fmt.Errorf("consumer's ticker: %w", err))
					return
				}
				if tick != nil {
					continue
				}
			}
			select {
			case <-rctx.Done():
			case <-time.After(loop.idle):
			}
		}
	}()
	return q, nil
}

// readBatch reads the next batch, if any, in one transaction: its
// events, then finish_batch.
func (q *benchPgqRun) readBatch(ctx context.Context, pool *pgxpool.Pool) (n int64, got bool, err error) {
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		var id *int64
		if err := tx.QueryRow(ctx, benchPgqNextBatchSQL).Scan(&id); err != nil {
			return err
		}
		if id == nil {
			return nil
		}
		got = true
		rows, err := tx.Query(ctx, benchPgqEventsSQL, *id)
		if err != nil {
			return err
		}
		var evID int64
		var evType, evData *string
		if _, err := pgx.ForEachRow(rows, []any{&evID, &evType, &evData}, func() error {
			n++
			if q.handled != nil && evData != nil {
				q.handled([]byte(*evData), time.Now())
			}
			return nil
		}); err != nil {
			return err
		}
		_, err = tx.Exec(ctx, benchPgqFinishSQL, *id)
		return err
	})
	return n, got, err
}

// fail records the first error of the ticker or the consumer, unless the
// run is being stopped.
func (q *benchPgqRun) fail(ctx context.Context, err error) {
	if ctx.Err() != nil {
		return
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.err == nil {
		q.err = err
	}
}

// caughtUp waits, at most a minute, until the consumer has read every
// event appended.
func (q *benchPgqRun) caughtUp(ctx context.Context) error {
	return benchWait(ctx, time.Minute, "PgQ consumer caught up", func() (bool, error) {
		q.mu.Lock()
		err := q.err
		q.mu.Unlock()
		if err != nil {
			return false, err
		}
		return q.consumed.Load() >= q.appended.Load(), nil
	})
}

// stop stops the ticker and the consumer and closes their connections.
func (q *benchPgqRun) stop() {
	q.cancel()
	q.wg.Wait()
	for _, p := range q.pools {
		p.Close()
	}
}
