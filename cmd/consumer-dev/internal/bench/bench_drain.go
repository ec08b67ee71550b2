package bench

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgevents/pgevents"
)

// benchDrain measures how fast one in-process consumer with a no-op
// handler burns down a preloaded backlog: N events (1M in full mode) in
// 100-event transactions over many hosts and 8 partitions, for a few batch
// sizes; and then the cost per event with one process serving 1, 8 and 64
// partitions. Every repetition is a new consumer group reading the same
// backlog from its start.
func benchDrain(ctx context.Context, e *benchEnv) ([]benchResult, error) {
	n := benchPick(e, int64(500_000), int64(60_000))
	batchSizes := []int{100, 1000, 5000}
	bl, err := benchBacklog(ctx, e, 8, n)
	if err != nil {
		return nil, err
	}
	defer bl.db.close()
	out := []benchResult{newBenchResult("drain", fmt.Sprintf("preload %d events, 100-event tx, 4 producers", n), "events/s",
		[]float64{bl.preloadRate}).noted("append rate while loading the backlog; one load per database")}

	runs := make([][]benchDrainRun, len(batchSizes))
	for rep := range e.reps {
		for i := range batchSizes {
			k := (i + rep) % len(batchSizes) // rotate the order across repetitions
			r, err := bl.drain(ctx, fmt.Sprintf("drain-b%d-r%d", batchSizes[k], rep), batchSizes[k])
			if err != nil {
				return out, err
			}
			runs[k] = append(runs[k], r)
			e.logf("drain: %d events, batchSize %d, rep %d: %.0f events/s, %.2f µs CPU/event (%.2f consumer), %d batches, %.0f%% foreign CPU",
				n, batchSizes[k], rep+1, r.rate, r.ownUS, r.selfUS, r.batches, 100*r.foreign)
		}
	}
	for k, b := range batchSizes {
		target := 500000.0
		if b == 1000 {
			target = 600000 // at batch 1000 the drain keeps 600k events/s or more
		}
		out = append(out, benchDrainResult(fmt.Sprintf("%d events, 8 partitions, batchSize %d", n, b), runs[k]).atLeast(target))
	}
	scaling, err := benchDrainPartitions(ctx, e)
	return append(out, scaling...), err
}

// benchDrainPartitions drains a backlog with one process serving 1, 8 and 64
// partitions (the topic created with that count) and compares the cost per
// event.
func benchDrainPartitions(ctx context.Context, e *benchEnv) ([]benchResult, error) {
	n := benchPick(e, int64(200_000), int64(30_000))
	const batch = 1000
	var out []benchResult
	cost := map[int][]benchDrainRun{}
	for _, parts := range []int{1, 8, 64} {
		runs, err := func() ([]benchDrainRun, error) {
			bl, err := benchBacklog(ctx, e, parts, n)
			if err != nil {
				return nil, err
			}
			defer bl.db.close()
			var runs []benchDrainRun
			for rep := range e.reps {
				r, err := bl.drain(ctx, fmt.Sprintf("parts-r%d", rep), batch)
				if err != nil {
					return runs, err
				}
				runs = append(runs, r)
				e.logf("drain: %d partitions, %d events, rep %d: %.0f events/s, %.2f µs CPU/event (%.2f consumer), %.0f%% foreign CPU",
					parts, n, rep+1, r.rate, r.ownUS, r.selfUS, 100*r.foreign)
			}
			return runs, nil
		}()
		if err != nil {
			return out, err
		}
		cost[parts] = runs
		out = append(out, benchDrainResult(fmt.Sprintf("%d events, %d partition(s), batchSize %d", n, parts, batch), runs))
	}
	var cpuRatio, wallRatio []float64
	for i := range min(len(cost[1]), len(cost[64])) {
		cpuRatio = append(cpuRatio, cost[64][i].ownUS/cost[1][i].ownUS)
		wallRatio = append(wallRatio, cost[1][i].rate/cost[64][i].rate)
	}
	out = append(out,
		newBenchResult("drain", "CPU per event, 64 partitions / 1 partition", "ratio", cpuRatio).atMost(1.2).
			noted("CPU of the consumer process and the server per event drained"),
		newBenchResult("drain", "wall time per event, 64 partitions / 1 partition", "ratio", wallRatio).
			noted("one process; 1 partition is served by a single worker, 64 by 64 concurrent ones"))
	return out, nil
}

// benchBacklogDB is a database holding a preloaded backlog.
type benchBacklogDB struct {
	db          *benchDB
	pool        *pgxpool.Pool // the consumers' pool, warmed up
	partitions  int
	events      int64
	preloadRate float64
}

// benchBacklog creates a fresh database whose topic has the given partition
// count and appends n events to it in 100-event transactions for random
// hosts, then vacuums and analyses the log (as autovacuum would, so that
// every drain finds hint bits set).
func benchBacklog(ctx context.Context, e *benchEnv, partitions int, n int64) (*benchBacklogDB, error) {
	db, err := e.newDB(ctx, partitions)
	if err != nil {
		return nil, err
	}
	bl := &benchBacklogDB{db: db, partitions: partitions, events: n}
	ok := false
	defer func() {
		if !ok {
			db.close()
		}
	}()
	ppool, err := db.openPool(ctx, "bench-producer", 4, nil)
	if err != nil {
		return nil, err
	}
	e.logf("drain: preloading %d events over %d partitions ...", n, partitions)
	lr, err := (benchLoad{producers: 4, txSize: 100, limit: n}).run(ctx, ppool, 10*time.Minute, nil)
	if err != nil {
		return nil, err
	}
	if lr.events != n {
		return nil, fmt.Errorf("preload: appended %d events, want %d", lr.events, n)
	}
	ppool.Close()
	bl.preloadRate = lr.rate()
	if err := db.exec(ctx, `VACUUM (ANALYZE) outbox_message_t`); err != nil {
		return nil, err
	}
	if bl.pool, err = db.openConsumerPool(ctx, partitions); err != nil {
		return nil, err
	}
	if err := benchWarmPool(ctx, bl.pool); err != nil {
		return nil, err
	}
	ok = true
	return bl, nil
}

// benchWarmPool opens all of pool's connections ahead of a measurement.
func benchWarmPool(ctx context.Context, pool *pgxpool.Pool) error {
	n := int(pool.Config().MaxConns)
	conns := make([]*pgxpool.Conn, 0, n)
	defer func() {
		for _, c := range conns {
			c.Release()
		}
	}()
	for range n {
		c, err := pool.Acquire(ctx)
		if err != nil {
			return err
		}
		conns = append(conns, c)
	}
	return nil
}

// benchDrainRun is one burn-down of a backlog.
type benchDrainRun struct {
	rate    float64 // events/s
	ownUS   float64 // CPU µs per event of the consumer and the server
	selfUS  float64 // CPU µs per event of the consumer (this process)
	foreign float64 // fraction of the machine busy with other processes
	batches int64
}

// drain runs a new consumer group over the whole backlog with a no-op
// handler and the given batch size, and times it until it has handled every
// event.
func (bl *benchBacklogDB) drain(ctx context.Context, group string, batch int) (benchDrainRun, error) {
	return bl.drainWith(ctx, pgevents.Config{GroupID: group, BatchSize: batch})
}

// drainWith is drain with the consumer configuration cfg (its group and
// batch size, and what else the case varies; TotalPartitions is the
// backlog's).
func (bl *benchBacklogDB) drainWith(ctx context.Context, cfg pgevents.Config) (benchDrainRun, error) {
	cpu0 := bl.db.env.cpu()
	cfg.TotalPartitions = bl.partitions
	c, err := startBenchConsumer(ctx, bl.pool, cfg)
	if err != nil {
		return benchDrainRun{}, err
	}
	err = c.waitHandled(ctx, bl.events, 3*time.Minute)
	d := bl.db.env.cpu().since(cpu0)
	st := c.Stats()
	if serr := c.stop(); err == nil {
		err = serr
	}
	n := float64(bl.events)
	return benchDrainRun{
		rate:    n / d.wall.Seconds(),
		ownUS:   float64(d.own.Microseconds()) / n,
		selfUS:  float64(d.self.Microseconds()) / n,
		foreign: d.foreign,
		batches: st.Batches,
	}, err
}

// benchDrainResult reports the rate of drain runs, with their CPU cost in
// the note.
func benchDrainResult(name string, runs []benchDrainRun) benchResult {
	var rate, own, self, batches, foreign []float64
	for _, r := range runs {
		rate, own, self = append(rate, r.rate), append(own, r.ownUS), append(self, r.selfUS)
		batches, foreign = append(batches, float64(r.batches)), append(foreign, r.foreign)
	}
	return newBenchResult("drain", name, "events/s", rate).
		noted("CPU per event: %.2f µs consumer and server together, of which %.2f µs in the consumer; %.0f batches; other processes kept %.0f%% of the machine busy (medians)",
			benchMedian(own), benchMedian(self), benchMedian(batches), 100*benchMedian(foreign))
}
