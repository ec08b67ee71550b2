package bench

import (
	"context"
	"fmt"
	"math"
	"sync/atomic"
	"time"

	"github.com/pgevents/pgevents"
)

// benchNotifyStep is a steady offered rate of the notify case.
type benchNotifyStep struct {
	rate      float64 // events/s in single-event transactions
	producers int
}

// benchNotifySteps are the notify case's rates.
var benchNotifySteps = []benchNotifyStep{{1000, 4}, {10000, 64}}

// benchNotify measures what wake-ups cost the database: the notifications
// producers send per committed transaction at a steady 1,000 and 10,000
// events/s, with a consumer attached and caught up (the default mode:
// producers notify only partitions a consumer sleeps on); and what an idle
// consumer runs, nothing being appended.
func benchNotify(ctx context.Context, e *benchEnv) ([]benchResult, error) {
	out, err := benchNotifySteady(ctx, e)
	if err != nil {
		return out, err
	}
	idle, err := benchNotifyIdle(ctx, e)
	return append(out, idle...), err
}

// benchNotifySteady offers each step's rate of single-event transactions
// over 10,000 hosts (AppendCommit, paced producers) to a topic of 8
// partitions in the default mode, consumed by one in-process consumer, and
// counts the notifications on the topic's channel (the bench's own LISTEN)
// per committed transaction. Each repetition runs a second at the rate
// first, not counted, so that the consumer is awake as under steady
// traffic.
func benchNotifySteady(ctx context.Context, e *benchEnv) ([]benchResult, error) {
	const partitions = 8
	db, err := e.newDB(ctx, partitions)
	if err != nil {
		return nil, err
	}
	defer db.close()
	if err := db.ensureSegments(ctx); err != nil {
		return nil, err
	}
	notifies, err := listenNotifies(ctx, db)
	if err != nil {
		return nil, err
	}
	defer notifies.close()
	tracer := &benchTracer{}
	pc, err := pgevents.ParsePoolConfig(db.url)
	if err != nil {
		return nil, err
	}
	tracer.install(pc)
	cpool, err := db.newPool(ctx, pc, "pgevents-consumer", pgevents.PoolSize(partitions), nil)
	if err != nil {
		return nil, err
	}
	ppool, err := db.openPool(ctx, "bench-producer", 66, nil)
	if err != nil {
		return nil, err
	}
	wakes := &benchWakeCounter{}
	c, err := startBenchConsumer(ctx, cpool, pgevents.Config{GroupID: "notify", TotalPartitions: partitions, Observer: wakes})
	if err != nil {
		return nil, err
	}
	defer c.stop() //nolint:errcheck // the results are in
	var appended atomic.Int64
	fn := benchAppendCommitTx(benchTopic)
	d := benchPick(e, 10*time.Second, 3*time.Second)
	var out []benchResult
	for _, step := range benchNotifySteps {
		var perTx, achieved, cpuUS []float64
		var wk benchWakes
		var txs int64
		var took time.Duration
		tasks := benchTaskCounts{}
		st0 := c.Stats()
		for rep := range e.reps {
			load := benchLoad{producers: step.producers, txSize: 1, rate: newBenchRate(step.rate), txFn: fn}
			if _, err := load.run(ctx, ppool, time.Second, &appended); err != nil {
				return out, err
			}
			if err := notifies.sync(ctx, db); err != nil {
				return out, err
			}
			n0, w0, c0, k0 := notifies.count(benchTopic), wakes.read(), e.cpu(), tracer.read()
			lr, err := load.run(ctx, ppool, d, &appended)
			for k, v := range tracer.read().since(k0) {
				tasks[k] += v
			}
			took += lr.took
			if err != nil {
				return out, err
			}
			if err := c.waitHandled(ctx, appended.Load(), time.Minute); err != nil {
				return out, err
			}
			cpu := e.cpu().since(c0)
			if err := notifies.sync(ctx, db); err != nil {
				return out, err
			}
			n := notifies.count(benchTopic) - n0
			wk = wk.add(wakes.read().since(w0))
			txs += lr.events
			perTx = append(perTx, float64(n)/float64(max(1, lr.events)))
			achieved = append(achieved, lr.rate())
			cpuUS = append(cpuUS, float64(cpu.own.Microseconds())/float64(max(1, lr.events)))
			e.logf("notify: %5.0f/s offered, %5.0f/s achieved, rep %d: %d notifications for %d transactions (%.4f/tx)",
				step.rate, lr.rate(), rep+1, n, lr.events, perTx[rep])
		}
		st1 := c.Stats()
		name := fmt.Sprintf("%g events/s offered, 1-event tx, 8 partitions, default mode, a consumer attached", step.rate)
		out = append(out,
			newBenchResult("notify", name+": notifications per committed transaction", "ratio", perTx).atMost(0.01).
				noted("%d paced producers with AppendCommit over 10,000 hosts for %s after a second at the rate, not counted; notifications counted by the bench's LISTEN on the topic's channel; the consumer: %s, %.1f events per batch, %d empty claims; %.0f µs CPU per event (bench process, consumer and server, until the consumer caught up) (median); the consumer's transactions by task while the producers ran: %s",
					step.producers, d, wk.summary(txs), float64(st1.Handled-st0.Handled)/float64(max(1, st1.Batches-st0.Batches)),
					st1.EmptyClaims-st0.EmptyClaims, benchMedian(cpuUS), tasks.summary(took)),
			newBenchResult("notify", name+": rate achieved", "events/s", achieved))
	}
	return out, nil
}

// benchNotifyIdle runs one consumer with the default settings on a database
// of its own, in which nothing is appended, and counts the transactions its
// sessions run over a while (30 s, 10 s with --quick): the database's
// xact_commit + xact_rollback from pg_stat_database, read from another
// database's connection (the bench's own statements are not counted), and,
// from a tracer on the consumer's connections, whose transactions they were.
// What it may run: the lease heartbeat (every LeaseDuration/3), the
// listener's canary (every second), the subscription heartbeat (every
// DeadAfter/4, at most 5 s), maintenance (every MaintenanceInterval) and
// the poll (every WaitPeriod).
func benchNotifyIdle(ctx context.Context, e *benchEnv) ([]benchResult, error) {
	const partitions = 8
	db, err := e.newDB(ctx, partitions)
	if err != nil {
		return nil, err
	}
	defer db.close()
	tracer := &benchTracer{}
	pc, err := pgevents.ParsePoolConfig(db.url)
	if err != nil {
		return nil, err
	}
	tracer.install(pc)
	cpool, err := db.newPool(ctx, pc, "pgevents-consumer", pgevents.PoolSize(partitions), nil)
	if err != nil {
		return nil, err
	}
	cfg := pgevents.Config{GroupID: "idle", TotalPartitions: partitions}
	c, err := startBenchConsumer(ctx, cpool, cfg)
	if err != nil {
		return nil, err
	}
	defer c.stop() //nolint:errcheck // the results are in
	cfg = cfg.WithDefaults()
	// Settle: the start's statements done, every partition asleep (the
	// watcher quiet for a second), and the start's transactions reported
	// (a backend reports its transaction counts along with other
	// statistics, at most every second: those of statements that touch no
	// table can wait for its next statement that does).
	quiet, last := time.Now(), tracer.read()["watcher"]
	if err := benchWait(ctx, 30*time.Second, "the idle consumer's watcher quiet", func() (bool, error) {
		if n := tracer.read()["watcher"]; n != last {
			quiet, last = time.Now(), n
		}
		return time.Since(quiet) > time.Second, nil
	}); err != nil {
		return nil, err
	}
	// Vacuum and analyse the new database now, so that autovacuum, whose
	// transactions pg_stat_database counts with the consumer's, has no
	// reason to visit its tables during the window (but those the
	// heartbeats update).
	if err := db.exec(ctx, `VACUUM (ANALYZE)`); err != nil {
		return nil, err
	}
	select {
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-time.After(benchPick(e, 15*time.Second, 10*time.Second)):
	}
	d := benchPick(e, 30*time.Second, 10*time.Second)
	x0, t0, err := benchDBXacts(ctx, e, db.name)
	if err != nil {
		return nil, err
	}
	c0, began := tracer.read(), time.Now()
	select {
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-time.After(d):
	}
	x1, _, err := benchDBXacts(ctx, e, db.name)
	if err != nil {
		return nil, err
	}
	c1, took := tracer.read(), time.Since(began)
	var autovacuums int64
	if err := db.pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_all_tables WHERE last_autovacuum >= $1 OR last_autoanalyze >= $1`, t0).Scan(&autovacuums); err != nil {
		return nil, err
	}
	tasks := c1.since(c0)
	allowed, other := tasks.split()
	// Each canary is a transaction twice: its pg_notify, and the
	// listener's session reading it (a backend signalled with a
	// notification reads the queue in a transaction of its own).
	canaries := tasks["listener canary"]
	allowed += canaries
	server := float64(x1-x0) / took.Seconds()
	allowedRate := float64(allowed) / took.Seconds()
	e.logf("notify: idle consumer over %s: %d transactions on the server (%.2f/s); client-side %s; %d tables autovacuumed or autoanalysed",
		took.Round(time.Millisecond), x1-x0, server, tasks.summary(took), autovacuums)
	nominal := fmt.Sprintf("lease heartbeat every %s, listener canary every 1s, subscription heartbeat every %s, maintenance every %s, poll every %s",
		cfg.LeaseDuration/3, min(cfg.DeadAfter/4, 5*time.Second), cfg.MaintenanceInterval, cfg.WaitPeriod)
	return []benchResult{
		newBenchResult("notify", "idle consumer, 8 partitions, default settings: transactions per second", "1/s", []float64{server}).
			noted("nothing appended; xact_commit + xact_rollback of its database in pg_stat_database over %s (read from another database, after pg_stat_clear_snapshot(); a backend reports its counts at most every second, so a second's worth may fall on either side of the window); its schedule: %s; by task, counted by a tracer on its connections (transactions ended, pgxpool's pings of connections idle over a second included): %s, and the listener's session reading each canary; %d tables autovacuumed or autoanalysed in the window (autovacuum's transactions count in pg_stat_database too; the bench vacuumed and analysed the database before the window)",
				took.Round(time.Millisecond), nominal, tasks.summary(took), autovacuums),
		newBenchResult("notify", "idle consumer: transactions per second beyond heartbeats, canary, maintenance and poll", "1/s", []float64{server - allowedRate}).
			atMost(math.Round(100*allowedRate/took.Seconds())/100).
			noted("the server's count minus the client-side count of the tasks on its schedule and the listener's reading of each canary (%.2f/s); client-side, other tasks ran %.2f/s; the target allows a second's worth of the schedule's transactions over the window (PostgreSQL reports a backend's counts up to a second late, or at its next statement that touches a table)",
				allowedRate, float64(other)/took.Seconds()),
	}, nil
}

// benchDBXacts returns the transactions database name has committed and
// rolled back, from pg_stat_database read on the bench's admin connection
// (another database), and the server's clock.
func benchDBXacts(ctx context.Context, e *benchEnv, name string) (int64, time.Time, error) {
	conn, err := e.admin.Acquire(ctx)
	if err != nil {
		return 0, time.Time{}, err
	}
	defer conn.Release()
	if _, err := conn.Exec(ctx, `SELECT pg_stat_clear_snapshot()`); err != nil {
		return 0, time.Time{}, err
	}
	var n int64
	var at time.Time
	err = conn.QueryRow(ctx, `SELECT xact_commit + xact_rollback, clock_timestamp() FROM pg_stat_database WHERE datname = $1`, name).Scan(&n, &at)
	return n, at, err
}
