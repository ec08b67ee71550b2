package bench

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/pgevents/pgevents"
	"github.com/pgevents/pgevents/schema"
)

// benchSustainedBatch is the consumer's batch size in the sustained case.
const benchSustainedBatch = 1000

// benchSustained finds the highest offered rate that producers (100-event
// transactions over random hosts, appended with pgevents.AppendCommit) and
// one in-process consumer group (8 partitions) sustain end to end: the
// offered rate steps up until the producers fall short of it or the lag
// grows during a step. Each repetition is a ladder on a fresh database; the
// note says what stopped each ladder and how many events the consumer's
// batches held. Ladders run in partition scope (the target) and once in the
// default mode; one more ladder runs with the producers committing
// asynchronously (a what-if).
func benchSustained(ctx context.Context, e *benchEnv) ([]benchResult, error) {
	steps := benchPick(e,
		[]float64{5000, 10000, 15000, 20000, 25000, 30000, 40000, 50000, 60000, 70000, 80000, 100000, 120000},
		[]float64{5000, 10000, 20000, 40000, 60000, 80000})
	stepDur := benchPick(e, 4*time.Second, 2*time.Second)
	partitionScope := benchProducerMode{name: "partition scope", scope: schema.ScopePartition}
	var out []benchResult
	for _, run := range []struct {
		v    benchProducerSetup
		m    benchProducerMode
		reps int
	}{
		{benchProducerSetup{}, partitionScope, e.reps},
		{benchProducerSetup{}, benchDefaultMode, 1},
		{benchAsyncProducers, partitionScope, 1},
	} {
		var best, batch []float64
		var limits string
		for rep := range run.reps {
			b, perBatch, why, err := benchLadder(ctx, e, steps, stepDur, run.v, run.m)
			if err != nil {
				return out, err
			}
			best, batch = append(best, b), append(batch, perBatch)
			limits += fmt.Sprintf(" run %d: %s.", rep+1, why)
		}
		name := run.v.name(fmt.Sprintf("100-event tx, 8 partitions, 1 group, batchSize %d, %s", benchSustainedBatch, run.m.name))
		r := newBenchResult("sustained", name, "events/s", best).
			noted("highest offered rate with producers on schedule and lag bounded over a %s step.%s", stepDur, limits)
		if run.v.label == "" && run.m.scope == schema.ScopePartition {
			r = r.atLeast(60000)
		}
		out = append(out, r)
		if run.v.label == "" {
			out = append(out, newBenchResult("sustained", name+": events per consumer batch at 10,000/s", "events", batch).
				noted("steady load: 100 transactions of 100 events per second over 8 partitions; each batch claims, commits and, between batches, announces the worker idle"))
		}
	}
	return out, nil
}

// benchStep is what happened during one step of a ladder.
type benchStep struct {
	offered, appended, handled float64 // events/s
	perBatch                   float64 // events per consumer batch
	lagFirst, lagLast          float64 // mean lag over the step's first and last second
	busy, foreign              float64 // machine CPU busy fraction, and the part used by other processes
	waits                      *benchWaits
}

// benchLadder runs one ladder of offered rates on a fresh database whose
// topic is in mode m, and returns the highest sustained rate, the events
// per consumer batch at the 10,000/s step, and why the next rate was not
// sustained. A step that fails is tried once more before the ladder stops.
func benchLadder(ctx context.Context, e *benchEnv, steps []float64, stepDur time.Duration, v benchProducerSetup, m benchProducerMode) (best, perBatch float64, why string, err error) {
	const partitions, producers = 8, 8
	db, err := e.newModeDB(ctx, partitions, m)
	if err != nil {
		return 0, 0, "", err
	}
	defer db.close()
	cpool, err := db.openConsumerPool(ctx, partitions)
	if err != nil {
		return 0, 0, "", err
	}
	ppool, err := db.openPool(ctx, "bench-producer", producers+2, v.producer)
	if err != nil {
		return 0, 0, "", err
	}
	c, err := startBenchConsumer(ctx, cpool, pgevents.Config{GroupID: "sustained", TotalPartitions: partitions, BatchSize: benchSustainedBatch})
	if err != nil {
		return 0, 0, "", err
	}
	defer c.stop() //nolint:errcheck // the results are in

	var appended atomic.Int64
	rate := newBenchRate(steps[0])
	lctx, stopLoad := context.WithCancel(ctx)
	loadErr := make(chan error, 1)
	go func() {
		load := benchLoad{producers: producers, txSize: 100, rate: rate, txFn: benchAppendCommitTx(benchTopic)}
		_, err := load.run(lctx, ppool, time.Duration(2*len(steps)+1)*stepDur, &appended)
		loadErr <- err
	}()
	defer func() {
		stopLoad()
		<-loadErr
	}()

	for i, tries := 0, 1; i < len(steps); tries++ {
		r := steps[i]
		if err := db.ensureSegments(ctx); err != nil {
			return best, perBatch, why, err
		}
		rate.set(r)
		s, err := benchRunStep(ctx, db, c, &appended, r, stepDur)
		if err != nil {
			return best, perBatch, why, err
		}
		margin := max(5000, r/20)
		onSchedule := s.appended >= 0.9*r // transactions under way at the step's ends blur a short step
		bounded := s.lagLast <= s.lagFirst+margin
		e.logf("sustained%s, %s: offered %6.0f/s: appended %6.0f/s, handled %6.0f/s (%.0f per batch), lag %6.0f -> %6.0f, CPU %3.0f%% busy (%.0f%% other processes)",
			v.name(""), m.name, r, s.appended, s.handled, s.perBatch, s.lagFirst, s.lagLast, 100*s.busy, 100*s.foreign)
		if r == 10000 {
			perBatch = s.perBatch
		}
		if onSchedule && bounded {
			best, i, tries = r, i+1, 0
			continue
		}
		if tries == 1 {
			continue // a spell of noise should not end the ladder: try the step once more
		}
		switch {
		case !onSchedule && bounded:
			why = fmt.Sprintf("at %.0f/s offered the producers appended only %.0f/s while the consumer kept up", r, s.appended)
		case onSchedule:
			why = fmt.Sprintf("at %.0f/s the consumer handled %.0f/s and the lag grew from %.0f to %.0f", r, s.handled, s.lagFirst, s.lagLast)
		default:
			why = fmt.Sprintf("at %.0f/s offered the producers appended only %.0f/s and the consumer handled %.0f/s (lag %.0f -> %.0f)",
				r, s.appended, s.handled, s.lagFirst, s.lagLast)
		}
		why += fmt.Sprintf("; %.0f events per consumer batch; CPU %.0f%% busy (%.0f%% other processes); %s; %s", s.perBatch, 100*s.busy, 100*s.foreign,
			s.waits.summary("bench-producer"), s.waits.summary("pgevents-consumer"))
		return best, perBatch, why, nil
	}
	return best, perBatch, fmt.Sprintf("every offered rate up to %.0f/s was sustained", best), nil
}

// benchRunStep keeps the offered rate for d and observes appends, handled
// events, lag, CPU and wait events.
func benchRunStep(ctx context.Context, db *benchDB, c *benchConsumer, appended *atomic.Int64, offered float64, d time.Duration) (benchStep, error) {
	s := benchStep{offered: offered, waits: &benchWaits{}}
	wctx, stopWaits := context.WithCancel(ctx)
	waitsDone := make(chan struct{})
	go func() {
		s.waits.run(wctx, db.pool, 100*time.Millisecond)
		close(waitsDone)
	}()
	defer func() {
		stopWaits()
		<-waitsDone
	}()

	const tick = 100 * time.Millisecond
	perSecond := int(time.Second / tick)
	cpu0 := db.env.cpu()
	st0 := c.Stats()
	a0, h0 := appended.Load(), st0.Handled
	var lags []float64
	t := time.NewTicker(tick)
	defer t.Stop()
	for end := time.Now().Add(d); time.Now().Before(end); {
		select {
		case <-ctx.Done():
			return s, ctx.Err()
		case <-t.C:
		}
		lags = append(lags, float64(appended.Load()-c.Stats().Handled))
	}
	cpu := db.env.cpu().since(cpu0)
	st1 := c.Stats()
	a1, h1 := appended.Load(), st1.Handled
	if b := st1.Batches - st0.Batches; b > 0 {
		s.perBatch = float64(h1-h0) / float64(b)
	}
	s.appended = float64(a1-a0) / cpu.wall.Seconds()
	s.handled = float64(h1-h0) / cpu.wall.Seconds()
	s.busy, s.foreign = cpu.busy, cpu.foreign
	k := min(perSecond, len(lags))
	s.lagFirst, s.lagLast = benchMean(lags[:k]), benchMean(lags[len(lags)-k:])
	return s, nil
}

// benchMean returns the mean of xs, 0 when empty.
func benchMean(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	sum := 0.0
	for _, x := range xs {
		sum += x
	}
	return sum / float64(len(xs))
}
