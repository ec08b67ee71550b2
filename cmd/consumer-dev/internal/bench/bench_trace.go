package bench

import (
	"context"
	"fmt"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/pgevents/pgevents"
)

// This file: the cost of two optional features, each measured next to the
// plain path on the same database and pool, in turns (benchCompare):
// appends with an idempotency key, and tracing.

// benchKeySeq numbers the idempotency keys of the keyed appends, so that
// every key is new (the common case: a retry is rare).
var benchKeySeq atomic.Int64

// benchAppendKeyed appends evs each with a new idempotency key.
func benchAppendKeyed(ctx context.Context, tx pgx.Tx, evs []pgevents.Event) error {
	for i := range evs {
		evs[i].IdempotencyKey = "k" + strconv.FormatInt(benchKeySeq.Add(1), 36)
	}
	_, err := pgevents.Append(ctx, tx, evs...)
	return err
}

// benchAppendDuplicate appends evs with keys already appended (the first
// keys of benchAppendKeyed's, appended during the warm-up): every event is
// a duplicate, and nothing is appended. Its rate counts the events offered.
func benchAppendDuplicate(ctx context.Context, tx pgx.Tx, evs []pgevents.Event) error {
	for i := range evs {
		evs[i].IdempotencyKey = "k" + strconv.FormatInt(int64(1+i), 36)
	}
	_, err := pgevents.Append(ctx, tx, evs...)
	return err
}

// benchIdempotency measures appends with an idempotency key per event (new
// keys; and keys appended before, which append nothing) against appends
// without, for transactions of 1 and 100 events and 1 and 4 producers.
func benchIdempotency(ctx context.Context, e *benchEnv) ([]benchResult, error) {
	db, err := e.newDB(ctx, 8)
	if err != nil {
		return nil, err
	}
	defer db.close()
	pool, err := db.openPool(ctx, "bench-producer", 8, nil)
	if err != nil {
		return nil, err
	}
	variants := []benchVariant{
		{"unkeyed", benchAppendPgevents},
		{"keyed (new keys)", benchAppendKeyed},
		{"keyed (duplicates)", benchAppendDuplicate},
	}
	// Warm up, the keyed one first: its first keys are the duplicates'.
	for _, v := range variants {
		if _, err := (benchLoad{producers: 4, txSize: 100, appendFn: v.fn}).run(ctx, pool, 300*time.Millisecond, nil); err != nil {
			return nil, fmt.Errorf("%s: %w", v.name, err)
		}
	}
	var out []benchResult
	for _, size := range []int{1, 100} {
		for _, producers := range []int{1, 4} {
			rates, err := benchCompare(ctx, e, db, pool, variants, size, producers)
			if err != nil {
				return out, err
			}
			cell := fmt.Sprintf("%d-event tx, %d producer(s)", size, producers)
			for k, v := range variants {
				out = append(out, newBenchResult("idempotency", cell+": "+v.name, "events/s", rates[k]))
			}
			out = append(out, newBenchResult("idempotency", cell+": keyed/unkeyed", "ratio", benchRatios(rates[1], rates[0])).
				noted("a new key is one more row (idempotency_keys) and index entry per event, kept for the window"))
		}
	}
	return out, nil
}

// benchDiscard is a span exporter that drops what it is given: tracing on,
// with the SDK's batching, without a collector's cost.
type benchDiscard struct{}

func (benchDiscard) ExportSpans(context.Context, []sdktrace.ReadOnlySpan) error { return nil }
func (benchDiscard) Shutdown(context.Context) error                             { return nil }

// benchTracerProvider returns an SDK tracer provider that samples every
// span and exports them in batches to benchDiscard.
func benchTracerProvider() *sdktrace.TracerProvider {
	return sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.AlwaysSample()),
		sdktrace.WithBatcher(benchDiscard{}))
}

// benchAppendInSpan returns an appender that appends in a span of tp
// started per transaction: Append writes its trace context into every
// event's metadata.
func benchAppendInSpan(tp trace.TracerProvider) benchAppendFunc {
	tr := tp.Tracer("bench-producer")
	return func(ctx context.Context, tx pgx.Tx, evs []pgevents.Event) error {
		ctx, span := tr.Start(ctx, "produce")
		defer span.End()
		_, err := pgevents.Append(ctx, tx, evs...)
		return err
	}
}

// benchTracing measures tracing on against off: appends inside a span
// (the trace context written into each event's metadata) against appends
// outside any, then the drain of a backlog by a consumer with a
// TracerProvider (a span per batch and per handler call) against one
// without.
func benchTracing(ctx context.Context, e *benchEnv) ([]benchResult, error) {
	tp := benchTracerProvider()
	defer func() { _ = tp.Shutdown(context.WithoutCancel(ctx)) }()
	db, err := e.newDB(ctx, 8)
	if err != nil {
		return nil, err
	}
	defer db.close()
	pool, err := db.openPool(ctx, "bench-producer", 8, nil)
	if err != nil {
		return nil, err
	}
	variants := []benchVariant{
		{"tracing off", benchAppendPgevents},
		{"in a span", benchAppendInSpan(tp)},
	}
	for _, v := range variants {
		if _, err := (benchLoad{producers: 4, txSize: 10, appendFn: v.fn}).run(ctx, pool, 300*time.Millisecond, nil); err != nil {
			return nil, err
		}
	}
	var out []benchResult
	for _, size := range []int{1, 100} {
		rates, err := benchCompare(ctx, e, db, pool, variants, size, 4)
		if err != nil {
			return out, err
		}
		cell := fmt.Sprintf("append, %d-event tx, 4 producers", size)
		for k, v := range variants {
			out = append(out, newBenchResult("tracing", cell+": "+v.name, "events/s", rates[k]))
		}
		out = append(out, newBenchResult("tracing", cell+": in a span/off", "ratio", benchRatios(rates[1], rates[0])).
			noted("the span is the SDK's, sampled, exported to nowhere; the metadata grows by a traceparent"))
	}
	pool.Close()

	n := benchPick(e, int64(200_000), int64(30_000))
	bl, err := benchBacklog(ctx, e, 8, n)
	if err != nil {
		return out, err
	}
	defer bl.db.close()
	var off, on []benchDrainRun
	for rep := range e.reps {
		for i := range 2 {
			traced := (i+rep)%2 == 1
			cfg := pgevents.Config{GroupID: fmt.Sprintf("trace-%v-r%d", traced, rep), BatchSize: 1000}
			if traced {
				cfg.TracerProvider = tp
			}
			r, err := bl.drainWith(ctx, cfg)
			if err != nil {
				return out, err
			}
			if traced {
				on = append(on, r)
			} else {
				off = append(off, r)
			}
			e.logf("tracing: drain %d events, batchSize 1000, tracing %v, rep %d: %.0f events/s, %.2f µs CPU/event (%.2f consumer)",
				n, traced, rep+1, r.rate, r.ownUS, r.selfUS)
		}
	}
	cell := fmt.Sprintf("drain %d events, 8 partitions, batchSize 1000", n)
	offRes := benchDrainResult(cell+": tracing off", off)
	onRes := benchDrainResult(cell+": TracerProvider (every span sampled)", on)
	offRes.Case, onRes.Case = "tracing", "tracing"
	var ratios []float64
	for i := range on {
		ratios = append(ratios, on[i].rate/off[i].rate)
	}
	return append(out, offRes, onRes,
		newBenchResult("tracing", cell+": on/off", "ratio", ratios).
			noted("a span per batch and per handler call; the events carry no producer context (no links)")), nil
}
