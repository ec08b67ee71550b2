package bench

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"golang.org/x/sync/errgroup"

	"github.com/pgevents/pgevents"
	"github.com/pgevents/pgevents/kafka"
	"github.com/pgevents/pgevents/schema"
	"github.com/pgevents/pgevents/sink/kafkasink"
)

// The Kafka endpoint's part of the kafka case (package kafka: Kafka
// clients read and write pgevents topics through `consumer kafka`).
//
//   - Fetch: a backlog of N events of 1 KiB (100,000; 20,000 quick) over 16
//     partitions, read by a kgo consumer group of one member through an
//     in-process endpoint, from the first offset to the last; beside it, in
//     the same run and on the same backlog, a pgevents consumer draining it
//     with a no-op handler (batchSize 1000), and the relay of the same
//     events into kfake.
//   - Latency: single-event transactions at 1,000/s for 10 s (5 s quick)
//     while a kgo consumer waits on the endpoint (direct partitions, from
//     the end): from the producer's call, and from its COMMIT returned, to
//     the record's arrival from PollFetches.
//   - Produce: 16 producers of single-event transactions for 10 s (5 s
//     quick) to a topic of 8 partitions in scope partition, a pgevents
//     consumer group attached and caught up: from Go
//     (pgevents.Append, a transaction each) against one kgo client
//     producing through the endpoint (16 goroutines, ProduceSync each,
//     idempotent, acks all): the ratio.
const (
	gatewayPartitions = 16
	gatewayPayload    = 1024
)

// benchGateway runs the endpoint's measurements; it is part of the kafka
// case, whose relay it is reported beside.
func benchGateway(ctx context.Context, e *benchEnv, kc *kfake.Cluster) ([]benchResult, error) {
	n := benchPick(e, int64(100_000), int64(20_000))
	db, err := e.newDB(ctx, gatewayPartitions)
	if err != nil {
		return nil, err
	}
	defer db.close()
	e.logf("kafka endpoint: preloading %d events of %d bytes over %d partitions ...", n, gatewayPayload, gatewayPartitions)
	if err := gatewayPreload(ctx, db, n); err != nil {
		return nil, err
	}
	if err := db.exec(ctx, `VACUUM (ANALYZE) outbox_message_t`); err != nil {
		return nil, err
	}
	pool, err := db.openConsumerPool(ctx, gatewayPartitions)
	if err != nil {
		return nil, err
	}
	addr, stop, err := gatewayStart(ctx, pool)
	if err != nil {
		return nil, err
	}
	defer stop()
	bl := &benchBacklogDB{db: db, pool: pool, partitions: gatewayPartitions, events: n}
	relay, err := kafkasink.New(kafkasink.Options{Brokers: kc.ListenAddrs(), Topic: "bench"})
	if err != nil {
		return nil, err
	}
	defer relay.Close()

	var fetch, drain, relayed, ratio []float64
	for rep := range e.reps {
		r, err := gatewayFetch(ctx, addr, fmt.Sprintf("kgo-%d", rep), n)
		if err != nil {
			return nil, err
		}
		fetch = append(fetch, r)
		e.logf("kafka endpoint: kgo group fetch, rep %d: %.0f events/s", rep+1, r)
		d, err := bl.drain(ctx, fmt.Sprintf("drain-%d", rep), 1000)
		if err != nil {
			return nil, err
		}
		drain = append(drain, d.rate)
		ratio = append(ratio, r/d.rate)
		e.logf("kafka endpoint: pgevents drain, rep %d: %.0f events/s", rep+1, d.rate)
		hs := &pgevents.Handlers{}
		hs.HandleAll(relay)
		if r, err = benchKafkaDrain(ctx, bl, fmt.Sprintf("relay-%d", rep), 1000, hs); err != nil {
			return nil, err
		}
		relayed = append(relayed, r)
		e.logf("kafka endpoint: relay into kfake, rep %d: %.0f events/s", rep+1, r)
	}
	out := []benchResult{
		newBenchResult("kafka", fmt.Sprintf("endpoint: kgo group fetch, %d events of 1 KiB, 16 partitions", n), "events/s", fetch).atLeast(150_000).
			noted("one member, from the first offset to the last; the endpoint in the bench process"),
		newBenchResult("kafka", "pgevents drain of the same events, batchSize 1000", "events/s", drain).
			noted("a consumer with a no-op handler: claim, fetch, commit per batch"),
		newBenchResult("kafka", "endpoint fetch / pgevents drain", "ratio", ratio).noted("same events, same run"),
		newBenchResult("kafka", "relay of the same events into kfake, batchSize 1000", "events/s", relayed).
			noted("pgevents consumer + franz-go producer, acks=all"),
	}
	stop()
	lat, err := gatewayLatency(ctx, e)
	if err != nil {
		return out, err
	}
	out = append(out, lat...)
	prod, err := gatewayProduce(ctx, e)
	if err != nil {
		return out, err
	}
	return append(out, prod...), nil
}

// gatewayStart runs an endpoint on pool exposing the bench topic as
// "bench", and returns its address and how to stop it.
func gatewayStart(ctx context.Context, pool *pgxpool.Pool) (string, func(), error) {
	srv, err := kafka.New(pool, kafka.Options{Listen: "127.0.0.1:0", Topics: map[string]int{"bench": benchTopic}})
	if err != nil {
		return "", nil, err
	}
	if err := srv.Listen(); err != nil {
		return "", nil, err
	}
	cctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		_ = srv.Run(cctx)
		close(done)
	}()
	var once sync.Once
	return srv.Addr().String(), func() { once.Do(func() { cancel(); <-done }) }, nil
}

// gatewayPreload appends n events of gatewayPayload bytes, 100 per
// transaction, from 4 producers (the drain case's preload, with the
// payloads padded).
func gatewayPreload(ctx context.Context, db *benchDB, n int64) error {
	pool, err := db.openPool(ctx, "bench-producer", 4, nil)
	if err != nil {
		return err
	}
	defer pool.Close()
	pad := func(ctx context.Context, tx pgx.Tx, evs []pgevents.Event) error {
		for i := range evs {
			evs[i].Payload = gatewayPad(evs[i].Payload)
		}
		return benchAppendPgevents(ctx, tx, evs)
	}
	lr, err := (benchLoad{producers: 4, txSize: 100, limit: n, appendFn: pad}).run(ctx, pool, 10*time.Minute, nil)
	if err != nil {
		return err
	}
	if lr.events != n {
		return fmt.Errorf("preload: appended %d events, want %d", lr.events, n)
	}
	return nil
}

// gatewayPad pads a bench payload to gatewayPayload bytes with a "pad"
// member.
func gatewayPad(p []byte) []byte {
	out := make([]byte, 0, gatewayPayload)
	out = append(out, p[:len(p)-1]...)
	out = append(out, `,"pad":"`...)
	for len(out) < gatewayPayload-2 {
		out = append(out, 'x')
	}
	return append(out, `"}`...)
}

// gatewayFetch reads n records through the endpoint with a kgo consumer
// group of one member, and returns the records per second.
func gatewayFetch(ctx context.Context, addr, group string, n int64) (float64, error) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(addr), kgo.ConsumerGroup(group), kgo.ConsumeTopics("bench"),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.DisableAutoCommit())
	if err != nil {
		return 0, err
	}
	defer cl.Close()
	var got int64
	var began time.Time
	cctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	for got < n {
		fs := cl.PollFetches(cctx)
		if err := cctx.Err(); err != nil {
			return 0, fmt.Errorf("kgo fetch: %d of %d records: %w", got, n, err)
		}
		for _, fe := range fs.Errors() {
			return 0, fmt.Errorf("kgo fetch: %s/%d: %w", fe.Topic, fe.Partition, fe.Err)
		}
		if began.IsZero() && fs.NumRecords() > 0 {
			began = time.Now()
		}
		got += int64(fs.NumRecords())
	}
	if err := cl.CommitUncommittedOffsets(ctx); err != nil {
		return 0, err
	}
	return float64(n) / time.Since(began).Seconds(), nil
}

// gatewayLatency measures append → delivered to a waiting kgo consumer at
// 1,000 single-event transactions a second: with no pgevents consumer of
// the topic (the endpoint reads the tails itself), and with one attached
// (its elected watcher announces what moved, and the endpoint follows).
func gatewayLatency(ctx context.Context, e *benchEnv) ([]benchResult, error) {
	d := benchPick(e, 10*time.Second, 5*time.Second)
	var out []benchResult
	for _, attached := range []bool{false, true} {
		var fromCall, fromCommit [][]float64
		for rep := range e.reps {
			db, err := e.newDB(ctx, 8)
			if err != nil {
				return nil, err
			}
			call, commit, err := gatewayLatencyRun(ctx, db, d, attached)
			db.close()
			if err != nil {
				return nil, err
			}
			fromCall, fromCommit = append(fromCall, call), append(fromCommit, commit)
			e.logf("kafka endpoint: latency at 1000/s (consumer group attached: %v), rep %d: from the call p50 %.2f p99 %.2f ms, from COMMIT p50 %.2f p99 %.2f ms",
				attached, rep+1, call[0], call[1], commit[0], commit[1])
		}
		col := func(v [][]float64, i int) []float64 {
			out := make([]float64, len(v))
			for k := range v {
				out[k] = v[k][i]
			}
			return out
		}
		what, note := "no pgevents consumer", "single-event transactions at 1,000/s, 8 partitions; a kgo client waiting on every partition from the end; the endpoint reads the tails every millisecond"
		if attached {
			what, note = "a pgevents consumer attached", "the same with a pgevents consumer group of the topic running: the endpoint follows its elected watcher's announcements"
		}
		out = append(out,
			newBenchResult("kafka", "endpoint, "+what+": append call → record at kgo, p50", "ms", col(fromCall, 0)).atMost(2).noted("%s", note),
			newBenchResult("kafka", "endpoint, "+what+": append call → record at kgo, p99", "ms", col(fromCall, 1)).atMost(10),
			newBenchResult("kafka", "endpoint, "+what+": COMMIT returned → record at kgo, p50", "ms", col(fromCommit, 0)),
			newBenchResult("kafka", "endpoint, "+what+": COMMIT returned → record at kgo, p99", "ms", col(fromCommit, 1)))
	}
	return out, nil
}

func gatewayLatencyRun(ctx context.Context, db *benchDB, d time.Duration, attached bool) (call, commit []float64, err error) {
	pool, err := db.openConsumerPool(ctx, 8)
	if err != nil {
		return nil, nil, err
	}
	if attached {
		cpool, err := db.openConsumerPool(ctx, 8)
		if err != nil {
			return nil, nil, err
		}
		c, err := startBenchConsumer(ctx, cpool, pgevents.Config{GroupID: "attached", TotalPartitions: 8})
		if err != nil {
			return nil, nil, err
		}
		defer func() { _ = c.stop() }()
	}
	addr, stop, err := gatewayStart(ctx, pool)
	if err != nil {
		return nil, nil, err
	}
	defer stop()
	cl, err := kgo.NewClient(kgo.SeedBrokers(addr), kgo.ConsumeTopics("bench"), kgo.ConsumeResetOffset(kgo.NewOffset().AtEnd()),
		kgo.FetchMaxWait(5*time.Second))
	if err != nil {
		return nil, nil, err
	}
	defer cl.Close()
	marks := newBenchMarks()
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	polled := make(chan struct{})
	var once sync.Once
	go func() {
		for cctx.Err() == nil {
			fs := cl.PollFetches(cctx)
			at := time.Now()
			once.Do(func() { close(polled) })
			fs.EachRecord(func(r *kgo.Record) { marks.handled(r.Value, at) })
		}
	}()
	// The client has its offsets (the end) once a first poll returned;
	// events appended before would be skipped, which only shortens the run.
	ppool, err := db.openPool(ctx, "bench-producer", 4, nil)
	if err != nil {
		return nil, nil, err
	}
	// The warm-up runs at the measured rate, so that the window measures
	// a running endpoint: each of its pool's sessions plans the fetch's
	// statements the first time it serves one (the planner opens the log's
	// partitions then, 20 to 80 ms on this machine under this load), and
	// at 100 events/s only a session or two ever did before the window.
	warm, wcancel := context.WithTimeout(ctx, 3*time.Second)
	_, _ = (benchLoad{producers: 4, txSize: 1, rate: newBenchRate(1000)}).run(warm, ppool, 3*time.Second, nil)
	wcancel()
	marks.reset()
	if _, err := (benchLoad{producers: 4, txSize: 1, rate: newBenchRate(1000), onCommit: marks.committed}).run(ctx, ppool, d, nil); err != nil {
		return nil, nil, err
	}
	// The last records arrive within a few milliseconds.
	_ = benchWait(ctx, 10*time.Second, "records delivered", func() (bool, error) {
		marks.mu.Lock()
		defer marks.mu.Unlock()
		return len(marks.seen) >= len(marks.done), nil
	})
	cancel()
	return marks.percentiles(true, 0.5, 0.99), marks.percentiles(false, 0.5, 0.99), nil
}

// gatewayProduce measures 16 producers through the endpoint against 16
// from Go, a consumer group attached.
func gatewayProduce(ctx context.Context, e *benchEnv) ([]benchResult, error) {
	d := benchPick(e, 10*time.Second, 5*time.Second)
	var goRates, kRates, ratio []float64
	// Scope partition: under scope topic every producer of the topic holds
	// one lock through its commit's flush, and both sides would measure the
	// disk's flushes only.
	mode := benchProducerMode{benchTopic, "partition scope", schema.ScopePartition, schema.AllocationCounter, schema.WakeWaiting}
	for rep := range e.reps {
		db, err := e.newModeDB(ctx, 8, mode)
		if err != nil {
			return nil, err
		}
		g, k, err := gatewayProduceRun(ctx, db, d)
		db.close()
		if err != nil {
			return nil, err
		}
		goRates, kRates, ratio = append(goRates, g), append(kRates, k), append(ratio, k/g)
		e.logf("kafka endpoint: 16 producers, rep %d: Go %.0f events/s, through the endpoint %.0f events/s", rep+1, g, k)
	}
	note := "single-event transactions, 8 partitions in scope partition, a pgevents consumer group attached"
	return []benchResult{
		newBenchResult("kafka", "16 producers from Go (pgevents.Append, a transaction each)", "events/s", goRates).noted("%s", note),
		newBenchResult("kafka", "16 producers through the endpoint (kgo ProduceSync, idempotent, acks all)", "events/s", kRates).noted("%s", note),
		newBenchResult("kafka", "endpoint produce / Go append", "ratio", ratio).noted("same run"),
	}, nil
}

func gatewayProduceRun(ctx context.Context, db *benchDB, d time.Duration) (goRate, kRate float64, err error) {
	cpool, err := db.openConsumerPool(ctx, 8)
	if err != nil {
		return 0, 0, err
	}
	c, err := startBenchConsumer(ctx, cpool, pgevents.Config{GroupID: "attached", TotalPartitions: 8})
	if err != nil {
		return 0, 0, err
	}
	defer func() { _ = c.stop() }()
	ppool, err := db.openPool(ctx, "bench-producer", 16, nil)
	if err != nil {
		return 0, 0, err
	}
	lr, err := (benchLoad{producers: 16, txSize: 1}).run(ctx, ppool, d, nil)
	if err != nil {
		return 0, 0, err
	}
	goRate = lr.rate()
	gpool, err := db.openPool(ctx, "bench-gateway", 20, nil)
	if err != nil {
		return 0, 0, err
	}
	addr, stop, err := gatewayStart(ctx, gpool)
	if err != nil {
		return 0, 0, err
	}
	defer stop()
	cl, err := kgo.NewClient(kgo.SeedBrokers(addr), kgo.DefaultProduceTopic("bench"), kgo.ProducerLinger(0))
	if err != nil {
		return 0, 0, err
	}
	defer cl.Close()
	var done atomic.Int64
	deadline := time.Now().Add(d)
	began := time.Now()
	g, gctx := errgroup.WithContext(ctx)
	for p := range 16 {
		g.Go(func() error {
			m := newBenchEvents(100 + p)
			for time.Now().Before(deadline) {
				ev := m.next(1)[0]
				r := &kgo.Record{Key: []byte(ev.HostID), Value: ev.Payload,
					Headers: []kgo.RecordHeader{{Key: "event_type", Value: []byte(ev.EventType)}, {Key: "user_id", Value: []byte(ev.UserID)}}}
				if err := cl.ProduceSync(gctx, r).FirstErr(); err != nil {
					return fmt.Errorf("produce through the endpoint: %w", err)
				}
				done.Add(1)
			}
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return 0, 0, err
	}
	kRate = float64(done.Load()) / time.Since(began).Seconds()
	return goRate, kRate, nil
}
