package sinktest

import (
	"context"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/pgevents/pgevents"
)

// AppendInSpan appends evs in one transaction inside a span of an
// OpenTelemetry SDK tracer (always sampled, exported nowhere) and returns
// the span's context, which Append writes into each event's metadata.
func AppendInSpan(t testing.TB, pool *pgxpool.Pool, evs ...pgevents.Event) trace.SpanContext {
	t.Helper()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.AlwaysSample()))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	ctx, span := tp.Tracer("producer").Start(context.Background(), "produce")
	defer span.End()
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		_, err := pgevents.Append(ctx, tx, evs...)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return span.SpanContext()
}

// TraceParent returns the W3C traceparent of sc.
func TraceParent(sc trace.SpanContext) string {
	return fmt.Sprintf("00-%s-%s-%s", sc.TraceID(), sc.SpanID(), sc.TraceFlags())
}
