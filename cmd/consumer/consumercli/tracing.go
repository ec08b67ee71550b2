package consumercli

import (
	"context"
	"fmt"
	"runtime/debug"

	"github.com/rs/zerolog"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/pgevents/pgevents/config"
)

// tracerProvider returns the tracer provider of the run's consumers: the
// CLI's own (CLI.TracerProvider), which wins; else one built from the
// file's tracing section; else nil, which traces nothing. shutdown flushes
// the spans still buffered and stops the provider it built (not the
// CLI's, whose owner does that), within the file's shutdownTimeoutMs.
func (c *CLI) tracerProvider(ctx context.Context, cfg *config.Config, path string) (tp trace.TracerProvider, shutdown func(log *zerolog.Logger), err error) {
	nothing := func(*zerolog.Logger) {}
	if c.TracerProvider != nil {
		return c.TracerProvider, nothing, nil
	}
	if cfg.Tracing == nil {
		return nil, nothing, nil
	}
	sdk, err := newTracerProvider(ctx, cfg.Tracing)
	if err != nil {
		return nil, nil, &config.Error{File: path, Key: "tracing", Msg: err.Error()}
	}
	return sdk, func(log *zerolog.Logger) {
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cfg.ShutdownTimeout())
		defer cancel()
		if err := sdk.Shutdown(sctx); err != nil {
			log.Warn().Err(err).Msg("tracing: spans not exported at shutdown")
		}
	}, nil
}

// newTracerProvider builds the OpenTelemetry SDK tracer provider the
// tracing section describes: an OTLP/HTTP (protobuf) exporter, which the
// OTEL_EXPORTER_OTLP_* variables configure where the section says nothing,
// behind a batch span processor; a parent-based sampler of the section's
// ratio; a resource with service.name (and the OTEL_RESOURCE_ATTRIBUTES
// and defaults of resource.Default).
func newTracerProvider(ctx context.Context, t *config.Tracing) (*sdktrace.TracerProvider, error) {
	var opts []otlptracehttp.Option
	if t.Endpoint != "" {
		u, err := t.TracesURL()
		if err != nil {
			return nil, err
		}
		opts = append(opts, otlptracehttp.WithEndpointURL(u))
	}
	if t.Headers != nil {
		opts = append(opts, otlptracehttp.WithHeaders(t.Headers))
	}
	exp, err := otlptracehttp.New(ctx, opts...)
	if err != nil {
		return nil, fmt.Errorf("otlp exporter: %w", err)
	}
	attrs := []attribute.KeyValue{attribute.String("service.name", t.Service())}
	if v := readVersion(buildInfo(), version, commit).Version; v != "" {
		attrs = append(attrs, attribute.String("service.version", v))
	}
	res, err := resource.Merge(resource.Default(), resource.NewSchemaless(attrs...))
	if err != nil {
		return nil, fmt.Errorf("resource: %w", err)
	}
	return sdktrace.NewTracerProvider(
		sdktrace.WithBatcher(exp),
		sdktrace.WithResource(res),
		sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.TraceIDRatioBased(t.SampleRatio))),
	), nil
}

// buildInfo returns the build information the toolchain recorded, or nil.
func buildInfo() *debug.BuildInfo {
	bi, _ := debug.ReadBuildInfo()
	return bi
}
