package pgevents

import (
	"bytes"
	"context"
	"encoding/json"
	"strconv"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// This file: OpenTelemetry tracing, from the producer's span to the
// handler's.
//
// Append writes the W3C trace context of its context's span (traceparent,
// and tracestate when there is one) into each event's metadata, beside the
// producer's own keys; an SQL producer may write the same keys itself. A
// consumer configured with a TracerProvider starts a span per batch and one
// per handler call, children of the batch's, each linked to the producer's
// span of its events (a link, not a parent: a batch serves many producers,
// and a handler's span belongs to the consumer's trace). Failures are
// recorded on the batch's span with what the consumer does next (retry,
// dead-letter, halt, park); a unit dead-lettered or parked inside a batch
// that commits is an event of the batch's span. The relays send the context
// on (TraceHeaders).
//
// Off is the default: without a TracerProvider the consumer does nothing
// of this (one nil check per batch and per handler call), and Append writes
// nothing when its context carries no valid span.

// Metadata keys of the W3C trace context, and the header names the relays
// send it under.
const (
	// TraceParentKey is the metadata key (and header) of the W3C
	// traceparent.
	TraceParentKey = "traceparent"
	// TraceStateKey is the metadata key (and header) of the W3C tracestate.
	TraceStateKey = "tracestate"
)

// tracerName is the instrumentation scope of the consumer's spans.
const tracerName = "github.com/pgevents/pgevents"

// maxLinks bounds the producer links of one span (a batch of many
// producers', or a group handler's run): the first ones are kept.
const maxLinks = 128

// Span attributes, after OpenTelemetry's messaging conventions where one
// fits.
var (
	attrSystem = attribute.String("messaging.system", "pgevents")
	attrOpProc = attribute.String("messaging.operation.type", "process")
)

// w3c is the propagator of the context carried in metadata and headers.
var w3c = propagation.TraceContext{}

// tracing starts the consumer's spans; a nil *tracing traces nothing.
type tracing struct {
	t     trace.Tracer
	group attribute.KeyValue
	topic attribute.KeyValue
}

// newTracing returns the tracing of a consumer, nil when tp is nil.
func newTracing(tp trace.TracerProvider, group string, topic int) *tracing {
	if tp == nil {
		return nil
	}
	return &tracing{
		t:     tp.Tracer(tracerName),
		group: attribute.String("messaging.consumer.group.name", group),
		topic: attribute.String("messaging.destination.name", strconv.Itoa(topic)),
	}
}

// startBatch starts the span of a batch of partition, whose claim returned
// evs, and returns the context handlers run under.
func (t *tracing) startBatch(ctx context.Context, partition int, evs []Event) (context.Context, trace.Span) {
	ctx, span := t.t.Start(ctx, "pgevents batch", trace.WithSpanKind(trace.SpanKindConsumer),
		trace.WithLinks(producerLinks(evs)...),
		trace.WithAttributes(attrSystem, attrOpProc, t.group, t.topic,
			attribute.String("messaging.destination.partition.id", strconv.Itoa(partition)),
			attribute.Int64("pgevents.first_offset", evs[0].Offset)))
	return ctx, span
}

// endBatch ends a committed batch's span.
func endBatch(span trace.Span, st *batchState) {
	span.SetAttributes(attribute.Int64("pgevents.last_offset", st.last),
		attribute.Int("messaging.batch.message_count", st.events),
		attribute.Int("pgevents.handled", st.handled),
		attribute.Int("pgevents.dead_lettered", st.deadLettered),
		attribute.Int("pgevents.parked_units", st.parkedUnits))
	span.End()
}

// failBatch ends a rolled back batch's span with its error, its class and
// what the consumer does next.
func failBatch(span trace.Span, err error, class Class, next string) {
	span.RecordError(err)
	span.SetStatus(codes.Error, err.Error())
	span.SetAttributes(attribute.String("pgevents.failure.class", class.String()),
		attribute.String("pgevents.failure.next", next))
	span.End()
}

// unitEvent records on the batch's span a unit that was dead-lettered or
// parked instead of handled.
func unitEvent(span trace.Span, name string, first, last int64, reason string) {
	attrs := []attribute.KeyValue{attribute.Int64("pgevents.first_offset", first), attribute.Int64("pgevents.last_offset", last)}
	if reason != "" {
		attrs = append(attrs, attribute.String("pgevents.reason", reason))
	}
	span.AddEvent(name, trace.WithAttributes(attrs...))
}

// startHandler starts the span of one handler call: on ev, or on run, a
// group handler's, which starts with ev.
func (t *tracing) startHandler(ctx context.Context, ev *Event, run []Event) (context.Context, trace.Span) {
	var links []trace.Link
	if run == nil {
		if sc := ProducerSpanContext(ev); sc.IsValid() {
			links = []trace.Link{{SpanContext: sc}}
		}
	} else {
		links = producerLinks(run)
	}
	attrs := []attribute.KeyValue{attrSystem, attrOpProc, t.group, t.topic,
		attribute.String("messaging.destination.partition.id", strconv.Itoa(ev.PartitionID)),
		attribute.Int64("pgevents.offset", ev.Offset),
		attribute.String("pgevents.host_id", ev.HostID),
		attribute.String("pgevents.event_type", ev.EventType)}
	if run != nil {
		attrs = append(attrs, attribute.Int("messaging.batch.message_count", len(run)))
	}
	return t.t.Start(ctx, "pgevents handle "+ev.EventType, trace.WithSpanKind(trace.SpanKindConsumer),
		trace.WithLinks(links...), trace.WithAttributes(attrs...))
}

// endHandler ends a handler call's span, with its error.
func endHandler(span trace.Span, err error) {
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	}
	span.End()
}

// producerLinks returns links to the producers' spans of evs, each span
// once, at most maxLinks.
func producerLinks(evs []Event) []trace.Link {
	var links []trace.Link
	for i := range evs {
		sc := ProducerSpanContext(&evs[i])
		if !sc.IsValid() {
			continue
		}
		dup := false
		for _, l := range links {
			if l.SpanContext.Equal(sc) {
				dup = true
				break
			}
		}
		if !dup {
			links = append(links, trace.Link{SpanContext: sc})
			if len(links) == maxLinks {
				break
			}
		}
	}
	return links
}

// traceCarrier is the trace context in an event's metadata.
type traceCarrier struct {
	TraceParent string `json:"traceparent"`
	TraceState  string `json:"tracestate"`
}

// Get returns the value of key (propagation.TextMapCarrier).
func (c *traceCarrier) Get(key string) string {
	switch key {
	case TraceParentKey:
		return c.TraceParent
	case TraceStateKey:
		return c.TraceState
	}
	return ""
}

// Set sets the value of key (propagation.TextMapCarrier).
func (c *traceCarrier) Set(key, value string) {
	switch key {
	case TraceParentKey:
		c.TraceParent = value
	case TraceStateKey:
		c.TraceState = value
	}
}

// Keys returns the keys the carrier holds (propagation.TextMapCarrier).
func (c *traceCarrier) Keys() []string { return []string{TraceParentKey, TraceStateKey} }

// ProducerSpanContext returns the span context of the producer of ev, from
// the W3C trace context in its metadata (traceparent, tracestate), or an
// invalid one when the metadata carries none.
func ProducerSpanContext(ev *Event) trace.SpanContext {
	if !bytes.Contains(ev.Metadata, []byte(`"`+TraceParentKey+`"`)) {
		return trace.SpanContext{}
	}
	var c traceCarrier
	if json.Unmarshal(ev.Metadata, &c) != nil || c.TraceParent == "" {
		return trace.SpanContext{}
	}
	return trace.SpanContextFromContext(w3c.Extract(context.Background(), &c))
}

// TraceHeaders returns the W3C trace context to send ev on with (header
// names TraceParentKey and TraceStateKey): the span of ctx when it has one
// (a handler's, under a consumer that traces, which links to the
// producer's), else the producer's, from ev's metadata. It returns nil when
// there is neither. The Kafka and HTTP relays send it as headers.
func TraceHeaders(ctx context.Context, ev *Event) map[string]string {
	sc := trace.SpanContextFromContext(ctx)
	if !sc.IsValid() {
		sc = ProducerSpanContext(ev)
		if !sc.IsValid() {
			return nil
		}
	}
	var c traceCarrier
	w3c.Inject(trace.ContextWithSpanContext(context.Background(), sc), &c)
	out := map[string]string{TraceParentKey: c.TraceParent}
	if c.TraceState != "" {
		out[TraceStateKey] = c.TraceState
	}
	return out
}

// withTraceContext returns metadata with the W3C trace context of sc added
// (Append's events), unless it is not a JSON object or holds a traceparent
// already (the producer wrote its own).
func withTraceContext(metadata json.RawMessage, sc trace.SpanContext) json.RawMessage {
	var c traceCarrier
	w3c.Inject(trace.ContextWithSpanContext(context.Background(), sc), &c)
	md := bytes.TrimSpace(metadata)
	if len(md) == 0 || bytes.Equal(md, []byte("null")) {
		b, _ := json.Marshal(tracedMetadata(&c))
		return b
	}
	if md[0] != '{' || bytes.Contains(md, []byte(`"`+TraceParentKey+`"`)) {
		return metadata
	}
	var m map[string]json.RawMessage
	if json.Unmarshal(md, &m) != nil {
		return metadata // invalid JSON: the append reports it
	}
	if _, ok := m[TraceParentKey]; ok {
		return metadata
	}
	for k, v := range tracedMetadata(&c) {
		b, _ := json.Marshal(v)
		m[k] = b
	}
	b, err := json.Marshal(m)
	if err != nil {
		return metadata
	}
	return b
}

// tracedMetadata returns the metadata keys of c.
func tracedMetadata(c *traceCarrier) map[string]string {
	m := map[string]string{TraceParentKey: c.TraceParent}
	if c.TraceState != "" {
		m[TraceStateKey] = c.TraceState
	}
	return m
}
