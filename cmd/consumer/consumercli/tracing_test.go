package consumercli

import (
	"bytes"
	"compress/gzip"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	coltracepb "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"

	"github.com/pgevents/pgevents"
	"github.com/pgevents/pgevents/internal/pgtest"
	"github.com/pgevents/pgevents/internal/sinktest"
)

// otlpReceiver is an OTLP/HTTP traces endpoint (POST /v1/traces,
// protobuf) that keeps every span it receives with its resource's
// service.name.
type otlpReceiver struct {
	mu      sync.Mutex
	spans   []*tracepb.Span
	service []string // service.name of each span's resource
	bad     []string // requests it could not decode
}

func (r *otlpReceiver) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	body := io.Reader(req.Body)
	if req.Header.Get("Content-Encoding") == "gzip" {
		zr, err := gzip.NewReader(req.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		body = zr
	}
	raw, err := io.ReadAll(body)
	var export coltracepb.ExportTraceServiceRequest
	if err == nil {
		err = proto.Unmarshal(raw, &export)
	}
	if err != nil || req.URL.Path != "/v1/traces" || req.Header.Get("Content-Type") != "application/x-protobuf" {
		r.mu.Lock()
		r.bad = append(r.bad, req.Method+" "+req.URL.Path+" "+req.Header.Get("Content-Type"))
		r.mu.Unlock()
		http.Error(w, "not an OTLP/HTTP protobuf export", http.StatusBadRequest)
		return
	}
	r.mu.Lock()
	for _, rs := range export.ResourceSpans {
		service := ""
		for _, kv := range rs.GetResource().GetAttributes() {
			if kv.Key == "service.name" {
				service = kv.GetValue().GetStringValue()
			}
		}
		for _, ss := range rs.ScopeSpans {
			for _, s := range ss.Spans {
				r.spans = append(r.spans, s)
				r.service = append(r.service, service)
			}
		}
	}
	r.mu.Unlock()
	out, _ := proto.Marshal(&coltracepb.ExportTraceServiceResponse{})
	w.Header().Set("Content-Type", "application/x-protobuf")
	_, _ = w.Write(out)
}

// linkedTo returns the span linked to the span (traceID, spanID) and
// named name, its resource's service.name, and every span received.
func (r *otlpReceiver) linkedTo(name string, traceID, spanID []byte) (*tracepb.Span, string, []*tracepb.Span) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for i, s := range r.spans {
		for _, l := range s.Links {
			if s.Name == name && bytes.Equal(l.TraceId, traceID) && bytes.Equal(l.SpanId, spanID) {
				return s, r.service[i], r.spans
			}
		}
	}
	return nil, "", r.spans
}

// TestRunExportsLinkedSpans: a `consumer run` process whose file has a
// tracing section pointing at an OTLP/HTTP receiver exports, for an event
// appended inside a producer's span in the test, a handler span
// ("pgevents handle traced", kind consumer, service.name of the section)
// linked to the producer's span context, with the group and offset as
// attributes, a child of a batch span linked to the same producer span.
func TestRunExportsLinkedSpans(t *testing.T) {
	// The batch span processor exports every 200 ms rather than 5 s.
	t.Setenv("OTEL_BSP_SCHEDULE_DELAY", "200")
	recv := &otlpReceiver{}
	srv := httptest.NewServer(recv)
	t.Cleanup(srv.Close)
	url, pool := migrated(t, 2)
	cfg := writeConfig(t, recordingConfig(2, -1, 10)+`tracing:
  endpoint: `+srv.URL+`
  serviceName: pgevents-tracing-test
`)
	p := start(t, url, "run", "--config", cfg)
	sc := sinktest.AppendInSpan(t, pool, pgevents.Event{HostID: "h1", EventType: "traced", Payload: []byte(`{}`)})
	tid, sid := sc.TraceID(), sc.SpanID()

	var handler *tracepb.Span
	var service string
	var all []*tracepb.Span
	var batch *tracepb.Span
	// The batch's span ends after its handlers' (at the commit), and may
	// come in a later export.
	pgtest.WaitFor(t, 60*time.Second, "a handler span linked to the producer's, and its batch span", func() bool {
		handler, service, all = recv.linkedTo("pgevents handle traced", tid[:], sid[:])
		if handler == nil {
			return false
		}
		for _, s := range all {
			if bytes.Equal(s.SpanId, handler.ParentSpanId) && bytes.Equal(s.TraceId, handler.TraceId) {
				batch = s
			}
		}
		return batch != nil
	})
	if service != "pgevents-tracing-test" {
		t.Fatalf("service.name %q, want the tracing section's pgevents-tracing-test", service)
	}
	if handler.Kind != tracepb.Span_SPAN_KIND_CONSUMER {
		t.Fatalf("handler span kind %v, want consumer", handler.Kind)
	}
	if bytes.Equal(handler.TraceId, tid[:]) {
		t.Fatalf("the handler span is in the producer's trace: want a link, not a parent")
	}
	attrs := map[string]string{}
	for _, kv := range handler.Attributes {
		attrs[kv.Key] = kv.GetValue().GetStringValue()
	}
	if attrs["messaging.consumer.group.name"] != "g" || attrs["pgevents.host_id"] != "h1" || attrs["pgevents.event_type"] != "traced" {
		t.Fatalf("handler span attributes %v, want group g, host h1, event type traced", attrs)
	}
	if batch.Name != "pgevents batch" {
		t.Fatalf("the handler span's parent is %q, want the batch span (%d spans received)", batch.Name, len(all))
	}
	linked := false
	for _, l := range batch.Links {
		linked = linked || bytes.Equal(l.TraceId, tid[:]) && bytes.Equal(l.SpanId, sid[:])
	}
	if !linked {
		t.Fatalf("the batch span has no link to the producer's span")
	}
	if code := p.stop(t, 30*time.Second); code != 0 {
		t.Fatalf("exit %d after SIGTERM", code)
	}
	recv.mu.Lock()
	defer recv.mu.Unlock()
	if len(recv.bad) > 0 {
		t.Fatalf("requests the receiver could not decode: %v", recv.bad)
	}
}
