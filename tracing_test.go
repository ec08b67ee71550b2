package pgevents

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/pgevents/pgevents/internal/pgtest"
)

// newRecorder returns a tracer provider that records every span in memory,
// shut down when the test ends.
func newRecorder(t *testing.T) (*sdktrace.TracerProvider, *tracetest.InMemoryExporter) {
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp), sdktrace.WithSampler(sdktrace.AlwaysSample()))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	return tp, exp
}

func spanAttr(s tracetest.SpanStub, key string) (attribute.Value, bool) {
	for _, a := range s.Attributes {
		if string(a.Key) == key {
			return a.Value, true
		}
	}
	return attribute.Value{}, false
}

// TestTracingFromProducerToHandler: producers append transactions of
// several hosts under spans of their own (one producer writes its trace
// context into the metadata itself, as an SQL producer would); a consumer
// that traces handles them, one event failing once (a retry) and one for
// good (a dead letter). Every handled event's handler span links to its
// producer's span and is a child of a batch span; the attributes name the
// group, topic, partition, offset, host and event type; the failed batch's
// span says what came next; the dead letter is an event of a committed
// batch's span; the producer's own metadata keys are kept.
func TestTracingFromProducerToHandler(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := newTopic(t, 4)
	mustExec(t, pool, handledTable)
	tp, exp := newRecorder(t)
	producer := tp.Tracer("producer")

	var once sync.Once
	hs := &Handlers{}
	record := SQLHandler("g", recordSQL)
	hs.HandleAll(HandlerFunc(func(ctx context.Context, tx pgx.Tx, ev *Event) error {
		switch ev.EventType {
		case "flaky":
			var err error
			once.Do(func() { err = Retryable(errors.New("flaky once")) })
			if err != nil {
				return err
			}
		case "poison":
			return Permanent(errors.New("poison"))
		}
		return record.Handle(ctx, tx, ev)
	}))
	startConsumer(t, pool, Config{TotalPartitions: 4, BatchSize: 5, Handlers: hs, TracerProvider: tp,
		OnPermanentFailure: PolicyDeadLetter, RetryInitial: time.Millisecond, RetryMax: 10 * time.Millisecond})

	// Producer transactions, each under a span, of several hosts each.
	producers := map[int64]trace.SpanContext{} // offset+partition key → producer span
	key := func(p int, off int64) int64 { return int64(p)<<40 | off }
	var handled int64
	for i := range 12 {
		pctx, span := producer.Start(ctx, fmt.Sprintf("produce %d", i))
		evs := make([]Event, 3)
		if i == 7 {
			evs = evs[:1] // a unit of its own, dead-lettered alone
		}
		for k := range evs {
			typ := "t"
			if i == 4 && k == 1 {
				typ = "flaky"
			}
			if i == 7 {
				typ = "poison"
			}
			evs[k] = Event{HostID: fmt.Sprintf("h%d", (i+k)%7), EventType: typ, Payload: []byte(`{}`)}
			if typ != "poison" {
				handled++
			}
		}
		evs[0].Metadata = json.RawMessage(`{"source":"test"}`) // kept beside the trace context
		tx, err := pool.Begin(pctx)
		if err != nil {
			t.Fatal(err)
		}
		res, err := AppendResults(pctx, tx, evs...)
		if err != nil {
			t.Fatal(err)
		}
		if err := tx.Commit(pctx); err != nil {
			t.Fatal(err)
		}
		span.End()
		for _, r := range res {
			producers[key(r.Partition, r.Offset)] = span.SpanContext()
		}
	}
	// An SQL producer writes its own trace context.
	sqlSpan := trace.NewSpanContext(trace.SpanContextConfig{TraceID: trace.TraceID{1, 2, 3}, SpanID: trace.SpanID{4, 5, 6}, TraceFlags: trace.FlagsSampled})
	var sqlOff int64
	var sqlPart int
	if err := pool.QueryRow(ctx, `SELECT o, event_partition('sql-host', 4) FROM append_event(1, 'sql-host', '', 't', '{}',
		jsonb_build_object('traceparent', $1::text)) AS o`, "00-"+sqlSpan.TraceID().String()+"-"+sqlSpan.SpanID().String()+"-01").Scan(&sqlOff, &sqlPart); err != nil {
		t.Fatal(err)
	}
	producers[key(sqlPart, sqlOff)] = sqlSpan
	handled++
	waitHandled(t, pool, handled, 20*time.Second)
	pgtest.WaitFor(t, 10*time.Second, "the poison event dead-lettered", func() bool {
		return queryInt(t, pool, `SELECT count(*) FROM dead_letter_queue`) == 1
	})
	if n := queryInt(t, pool, `SELECT count(*) FROM outbox_message_t WHERE metadata->>'source' = 'test' AND metadata ? 'traceparent'`); n != 12 {
		t.Errorf("%d events kept their own metadata beside the trace context, want 12", n)
	}

	var spans tracetest.SpanStubs
	// Every handled event's span, and the batch span of every handler
	// span: a batch span ends (and is exported) after its handlers', at
	// its commit.
	pgtest.WaitFor(t, 10*time.Second, "the handler and batch spans of every handled event", func() bool {
		spans = exp.GetSpans()
		ended := map[trace.SpanID]bool{}
		for _, s := range spans {
			if s.Name == "pgevents batch" {
				ended[s.SpanContext.SpanID()] = true
			}
		}
		var n int64
		for _, s := range spans {
			switch s.Name {
			case "pgevents handle t", "pgevents handle flaky", "pgevents handle poison":
				if !ended[s.Parent.SpanID()] {
					return false
				}
			}
			if s.Name == "pgevents handle t" || s.Name == "pgevents handle flaky" {
				if s.Status.Code != codes.Error {
					n++
				}
			}
		}
		return n >= handled
	})
	batches := map[trace.SpanID]tracetest.SpanStub{}
	for _, s := range spans {
		if s.Name == "pgevents batch" {
			batches[s.SpanContext.SpanID()] = s
		}
	}
	var linked, retried, deadLettered int
	for _, s := range spans {
		switch s.Name {
		case "pgevents handle t", "pgevents handle flaky", "pgevents handle poison":
		default:
			continue
		}
		if _, ok := batches[s.Parent.SpanID()]; !ok {
			t.Errorf("handler span %s is not a child of a batch span", s.Name)
		}
		if s.SpanKind != trace.SpanKindConsumer {
			t.Errorf("handler span kind %s", s.SpanKind)
		}
		part, _ := spanAttr(s, "messaging.destination.partition.id")
		off, _ := spanAttr(s, "pgevents.offset")
		var p int
		fmt.Sscan(part.AsString(), &p) //nolint:errcheck
		want, ok := producers[key(p, off.AsInt64())]
		if !ok {
			t.Errorf("handler span of partition %s offset %d: no such event appended", part.AsString(), off.AsInt64())
			continue
		}
		if len(s.Links) != 1 || !sameSpan(s.Links[0].SpanContext, want) {
			t.Errorf("handler span of offset %d links %v, want the producer's span %s", off.AsInt64(), s.Links, want.SpanID())
		} else {
			linked++
		}
		for k, v := range map[string]string{"messaging.consumer.group.name": "g", "messaging.destination.name": "1", "messaging.system": "pgevents"} {
			if got, _ := spanAttr(s, k); got.AsString() != v {
				t.Errorf("handler span attribute %s = %q, want %q", k, got.AsString(), v)
			}
		}
		for _, k := range []string{"pgevents.host_id", "pgevents.event_type"} {
			if got, _ := spanAttr(s, k); got.AsString() == "" {
				t.Errorf("handler span has no %s", k)
			}
		}
	}
	for _, b := range batches {
		if len(b.Links) == 0 {
			t.Errorf("batch span without links to its producers")
		}
		next, _ := spanAttr(b, "pgevents.failure.next")
		// A transient failure retries the batch, or narrows it to the
		// failing unit when units preceded it.
		if b.Status.Code == codes.Error && (next.AsString() == "retry" || next.AsString() == "narrow") {
			retried++
		}
		for _, e := range b.Events {
			if e.Name == "dead-lettered" {
				deadLettered++
			}
		}
	}
	if linked < int(handled) || retried == 0 || deadLettered != 1 {
		t.Fatalf("%d handler spans linked to their producers (want ≥ %d), %d batch spans failed for a retry (want ≥ 1), %d dead letters on batch spans (want 1)",
			linked, handled, retried, deadLettered)
	}
}

// TestTracingOff: without a span in the producer's context, Append writes
// no trace context (the events' metadata stays as given, NULL when none);
// a consumer without a TracerProvider starts no span (the global provider
// is not used).
func TestTracingOff(t *testing.T) {
	t.Parallel()
	pool := newTopic(t, 2)
	mustExec(t, pool, handledTable)
	c := startConsumer(t, pool, Config{TotalPartitions: 2, Handlers: recordingHandlers()})
	appendTx(t, pool, ev("a", "t", `{}`), Event{HostID: "b", EventType: "t", Metadata: json.RawMessage(`{"k":1}`)})
	waitHandled(t, pool, 2, 10*time.Second)
	if n := queryInt(t, pool, `SELECT count(*) FROM outbox_message_t WHERE metadata IS NULL OR metadata = '{"k":1}'`); n != 2 {
		t.Fatalf("%d events with their metadata as given, want 2", n)
	}
	if c.trace != nil {
		t.Fatal("a consumer without a TracerProvider traces")
	}
}

// TestWithTraceContext: the trace context joins a metadata object, keeps a
// producer's own traceparent, and leaves metadata that is not an object.
func TestWithTraceContext(t *testing.T) {
	sc := trace.NewSpanContext(trace.SpanContextConfig{TraceID: trace.TraceID{9}, SpanID: trace.SpanID{8}, TraceFlags: trace.FlagsSampled})
	tp := "00-" + sc.TraceID().String() + "-" + sc.SpanID().String() + "-01"
	for _, c := range []struct{ in, want string }{
		{"", `{"traceparent":"` + tp + `"}`},
		{"null", `{"traceparent":"` + tp + `"}`},
		{`{"a":1}`, `{"a":1,"traceparent":"` + tp + `"}`},
		{`{"traceparent":"mine"}`, `{"traceparent":"mine"}`},
		{`[1,2]`, `[1,2]`},
		{`"s"`, `"s"`},
	} {
		got := withTraceContext(json.RawMessage(c.in), sc)
		if string(got) != c.want {
			t.Errorf("withTraceContext(%s) = %s, want %s", c.in, got, c.want)
		}
		if c.want[0] == '{' && c.in != `{"traceparent":"mine"}` {
			if back := ProducerSpanContext(&Event{Metadata: got}); !sameSpan(back, sc) {
				t.Errorf("ProducerSpanContext(%s) = %v, want %v", got, back, sc)
			}
		}
	}
}

// sameSpan says whether a and b name one span (a link's context is remote,
// the producer's own is not).
func sameSpan(a, b trace.SpanContext) bool {
	return a.TraceID() == b.TraceID() && a.SpanID() == b.SpanID() && a.TraceFlags() == b.TraceFlags()
}
