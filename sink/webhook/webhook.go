// Package webhook relays events to an HTTP endpoint: a pgevents handler
// that sends each event as one request, usable from Go ([New]) or as the
// `http` handler type of db-event-consumer.yml, for consumers that are not
// written in Go. (The package is not called http so that it does not
// shadow net/http in the code that uses both.)
//
// # Requests
//
// Each event is one request (Options.Method, POST by default) to
// Options.URL with the header Idempotency-Key: <event_id>, the W3C trace
// context (traceparent, tracestate: pgevents.TraceHeaders of the handler's
// call) when there is one, and the configured headers. With FormatJSON
// the body is the event as JSON
// (c_offset, topic_id, partition_id, event_id, host_id, user_id,
// transaction_id, event_type, payload, metadata, created_at); with
// FormatCloudEvents it is a CloudEvents 1.0 event in structured mode
// (Content-Type application/cloudevents+json; id = event_id, type =
// event_type, source = Options.Source, subject = host_id, time =
// created_at, data = payload, and the extension attributes coffset,
// topicid, partitionid, transactionid, userid and, when present, metadata,
// as strings).
//
// # Mechanism
//
// During a batch, Handle queues the event on its host's lane and returns.
// A lane sends its host's requests one after another, in offset order,
// each only after the previous one succeeded; the lanes of different hosts
// run concurrently, at most Options.Concurrency requests at a time per
// batch. Before the batch's offset commits, the consumer flushes the relay
// (see pgevents.Batch), which waits for every lane. A lane stops at its
// host's first failure: the host's later events of the batch are not sent,
// while other hosts go on, and the batch is retried (or the failed event's
// unit dead-lettered) once all lanes are done. So a slow host delays the
// others of its batch only in that the batch commits when it is done.
//
// # Guarantees and failures
//
// At least once: an event's offset commits only after its request was
// answered with a 2xx. A crash between the answer and the commit sends it
// again with the same Idempotency-Key; a retried batch does not send again
// what an earlier attempt in this process delivered (see sink.Acked).
// Strict order per host: a host's request is sent only after its previous
// one succeeded. Answers are classified by [Classify]:
//
//   - 2xx: delivered;
//   - 408, 429 and 5xx, connection errors, timeouts (Options.Timeout per
//     request): transient, the partition waits and tries again with
//     backoff, never dead-letters; a Retry-After header on 429 or 503 is
//     honoured (up to the consumer's retryMaxMs);
//   - 401, 403, 407, and 3xx (redirects are not followed): deployment, the
//     endpoint or its credentials are wrong; retried the same way and
//     logged at error level;
//   - other 4xx: permanent, the event's unit is dead-lettered with the
//     status and the first 512 bytes of the answer's body.
package webhook

import (
	"bytes"
	"cmp"
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgevents/pgevents"
	"github.com/pgevents/pgevents/sink"
)

// Format is the shape of the requests' bodies.
type Format string

// Formats.
const (
	// FormatJSON: the body is the event as a JSON object.
	FormatJSON Format = "json"
	// FormatCloudEvents: the body is a CloudEvents 1.0 event in structured
	// mode.
	FormatCloudEvents Format = "cloudevents"
)

// Defaults of Options.
const (
	// DefaultMethod is the requests' method.
	DefaultMethod = http.MethodPost
	// DefaultTimeout bounds one request.
	DefaultTimeout = 10 * time.Second
	// DefaultConcurrency bounds the requests in flight per batch.
	DefaultConcurrency = 8
	// DefaultSource is the CloudEvents source of FormatCloudEvents.
	DefaultSource = sink.DefaultSource
	// bodyExcerpt is how much of a refusing answer's body a dead letter
	// quotes.
	bodyExcerpt = 512
)

// Options configures a Sink. Zero values take the documented defaults.
type Options struct {
	// Name tells this relay's metrics apart; default "http".
	Name string
	// URL is the endpoint, http or https; required.
	URL string
	// Method is the requests' method; default POST.
	Method string
	// Headers are added to every request (they may replace Content-Type,
	// not Idempotency-Key).
	Headers map[string]string
	// Timeout bounds one request, answer included; default 10 s.
	Timeout time.Duration
	// Format is FormatJSON (default) or FormatCloudEvents.
	Format Format
	// Source is the CloudEvents source attribute; default "pgevents".
	Source string
	// Concurrency bounds the requests in flight per batch (a partition's
	// batch; a process sends at most Concurrency times the partitions it
	// serves); default 8. Requests of one host are never concurrent.
	Concurrency int
	// TLS, when set, is the TLS configuration of https requests (a CA, a
	// client certificate).
	TLS *tls.Config
	// Client, when set, sends the requests instead of a client built from
	// Timeout and TLS. It should not follow redirects.
	Client *http.Client
	// Metrics, when set, records the relay's deliveries.
	Metrics *sink.Metrics
}

// OptionError is an invalid option, named by its YAML key (url, method,
// headers with the header at fault, timeoutMs, format, concurrency).
type OptionError = sink.OptionError

// relayName is the relay's name in its errors.
const relayName = "webhook"

// Validate reports every option of o that New refuses: nil, or the
// errors.Join of an *OptionError per option at fault, named by its key in
// db-event-consumer.yml. Zero values are valid: they take the defaults,
// except URL, which is required. These are the relay's only option rules;
// the YAML layer reports them under the handler's keys.
func (o Options) Validate() error {
	errs := sink.OptionErrors{Relay: relayName}
	bad := errs.Add
	if o.URL == "" {
		bad("url", "", "is required: the endpoint, http:// or https://")
	} else if u, err := url.Parse(o.URL); err != nil {
		bad("url", "", "%q is not a URL: %v", o.URL, err)
	} else if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		bad("url", "", "%q must be an absolute http:// or https:// URL", o.URL)
	}
	if o.Method != "" && !isToken(o.Method) {
		bad("method", "", "must be an HTTP method, got %q", o.Method)
	}
	for _, name := range slices.Sorted(maps.Keys(o.Headers)) {
		switch {
		case !isToken(name) || strings.ContainsAny(o.Headers[name], "\r\n"):
			bad("headers", "."+name, "is not a valid header")
		case http.CanonicalHeaderKey(name) == "Idempotency-Key":
			bad("headers", "."+name, "is set by the relay: the event_id")
		}
	}
	if o.Timeout < 0 {
		bad("timeoutMs", "", "must be positive, got %s", o.Timeout)
	}
	switch o.Format {
	case "", FormatJSON, FormatCloudEvents:
	default:
		bad("format", "", "must be json or cloudevents, got %q", o.Format)
	}
	if o.Concurrency < 0 {
		bad("concurrency", "", "must be positive, got %d", o.Concurrency)
	}
	return errs.Err()
}

// Sink is the HTTP relay handler. Register it for the event types to
// relay; Close it after the consumer stopped.
type Sink struct {
	opts    Options
	client  *http.Client
	header  http.Header
	metrics *sink.Recorder // for events handled outside a batch

	mu    sync.Mutex
	parts map[sink.PartKey]*part
}

// part is the relay's state for one partition of a group.
type part struct {
	acked   sink.Acked
	metrics *sink.Recorder
}

// New validates opts (see Options.Validate) and returns the relay.
func New(opts Options) (*Sink, error) {
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	opts.Name = cmp.Or(opts.Name, "http")
	opts.Method = cmp.Or(opts.Method, DefaultMethod)
	opts.Timeout = cmp.Or(opts.Timeout, DefaultTimeout)
	opts.Format = cmp.Or(opts.Format, FormatJSON)
	opts.Source = cmp.Or(opts.Source, DefaultSource)
	opts.Concurrency = cmp.Or(opts.Concurrency, DefaultConcurrency)
	header := http.Header{}
	for k, v := range opts.Headers {
		header.Set(k, v)
	}
	client := opts.Client
	if client == nil {
		tr := http.DefaultTransport.(*http.Transport).Clone()
		tr.MaxIdleConnsPerHost = max(opts.Concurrency, 16)
		if opts.TLS != nil {
			tr.TLSClientConfig = opts.TLS.Clone()
		}
		client = &http.Client{Transport: tr, Timeout: opts.Timeout,
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	}
	return &Sink{opts: opts, client: client, header: header, parts: map[sink.PartKey]*part{},
		metrics: opts.Metrics.For("", opts.Name, "http")}, nil
}

// isToken reports whether s is an HTTP token (RFC 9110): what a method or a
// header name must be.
func isToken(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0) {
			return false
		}
	}
	return true
}

// part returns the state of the partition batch b serves, creating it.
func (s *Sink) part(b *pgevents.Batch) *part {
	k := sink.KeyOf(b)
	s.mu.Lock()
	defer s.mu.Unlock()
	p := s.parts[k]
	if p == nil {
		p = &part{metrics: s.opts.Metrics.For(k.Group, s.opts.Name, "http")}
		s.parts[k] = p
	}
	return p
}

// Handle queues ev on its host's lane (see the package documentation),
// or, called outside a batch, sends it and waits for the answer.
func (s *Sink) Handle(ctx context.Context, _ pgx.Tx, ev *pgevents.Event) error {
	b := pgevents.BatchFromContext(ctx)
	if b == nil {
		start := time.Now()
		err := s.send(ctx, ev, pgevents.TraceHeaders(ctx, ev))
		if err != nil {
			s.metrics.Failed(pgevents.Classify(err))
			return err
		}
		s.metrics.Delivered(time.Since(start))
		return nil
	}
	f := b.Flusher(s, func() pgevents.Flusher {
		p := s.part(b)
		p.acked.Begin(b.Start())
		return s.newFlusher(p)
	}).(*flusher)
	return f.add(ev, pgevents.TraceHeaders(ctx, ev))
}

// Close releases the relay's idle connections.
func (s *Sink) Close() { s.client.CloseIdleConnections() }

// send sends ev's request, with the trace context tc (traceparent,
// tracestate: pgevents.TraceHeaders of the handler's call) as headers, and
// classifies the outcome.
func (s *Sink) send(ctx context.Context, ev *pgevents.Event, tc map[string]string) error {
	body, contentType, err := s.body(ev)
	if err != nil {
		return pgevents.Permanent(fmt.Errorf("webhook: event %s (offset %d): %w", ev.EventID, ev.Offset, err))
	}
	req, err := http.NewRequestWithContext(ctx, s.opts.Method, s.opts.URL, bytes.NewReader(body))
	if err != nil {
		return pgevents.Deployment(fmt.Errorf("webhook: %w", err))
	}
	req.Header.Set("Content-Type", contentType)
	for k, v := range s.header {
		req.Header[k] = v
	}
	req.Header.Set("Idempotency-Key", ev.EventID)
	for k, v := range tc {
		req.Header.Set(k, v)
	}
	resp, err := s.client.Do(req)
	if err != nil {
		return pgevents.Retryable(fmt.Errorf("webhook: %s %s: event %s (offset %d): %w", s.opts.Method, s.opts.URL, ev.EventID, ev.Offset, err))
	}
	defer resp.Body.Close()
	excerpt, _ := io.ReadAll(io.LimitReader(resp.Body, bodyExcerpt))
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10)) // so that the connection is reused
	if resp.StatusCode >= 200 && resp.StatusCode < 300 {
		return nil
	}
	return Classify(resp, fmt.Errorf("webhook: %s %s: event %s (offset %d): %s: %s",
		s.opts.Method, s.opts.URL, ev.EventID, ev.Offset, resp.Status, bytes.TrimSpace(excerpt)))
}

// Classify returns err, the failure of a request answered with resp,
// classified by resp's status (see the package documentation), with the
// wait Retry-After asks for.
func Classify(resp *http.Response, err error) error {
	code := resp.StatusCode
	switch {
	case code == http.StatusRequestTimeout, code == http.StatusTooManyRequests, code >= 500:
		return pgevents.RetryAfter(err, retryAfter(resp.Header.Get("Retry-After")))
	case code == http.StatusUnauthorized, code == http.StatusForbidden, code == http.StatusProxyAuthRequired,
		code >= 300 && code < 400:
		return pgevents.Deployment(err)
	case code >= 400:
		return pgevents.Permanent(err)
	}
	return &pgevents.ClassifiedError{Class: pgevents.ClassUnknown, Err: err} // 1xx
}

// retryAfter parses a Retry-After header: seconds, or an HTTP date.
func retryAfter(v string) time.Duration {
	if v == "" {
		return 0
	}
	if n, err := strconv.Atoi(strings.TrimSpace(v)); err == nil && n > 0 {
		return time.Duration(n) * time.Second
	}
	if t, err := http.ParseTime(v); err == nil {
		return max(time.Until(t), 0)
	}
	return 0
}

// body returns ev's request body and its content type.
func (s *Sink) body(ev *pgevents.Event) ([]byte, string, error) {
	if s.opts.Format == FormatJSON {
		b, err := json.Marshal(ev)
		return b, "application/json", err
	}
	data := ev.Payload
	if data == nil {
		data = json.RawMessage("null")
	}
	var metadata string
	if len(ev.Metadata) > 0 && string(ev.Metadata) != "null" {
		metadata = string(ev.Metadata)
	}
	b, err := json.Marshal(cloudEvent{
		SpecVersion: "1.0", ID: ev.EventID, Source: s.opts.Source, Type: ev.EventType, Subject: ev.HostID,
		Time: ev.CreatedAt.UTC().Format(time.RFC3339Nano), DataContentType: "application/json", Data: data,
		COffset: strconv.FormatInt(ev.Offset, 10), TopicID: strconv.Itoa(ev.TopicID), PartitionID: strconv.Itoa(ev.PartitionID),
		TransactionID: strconv.FormatInt(ev.TransactionID, 10), UserID: ev.UserID, Metadata: metadata,
	})
	return b, "application/cloudevents+json", err
}

// cloudEvent is a CloudEvents 1.0 event in the JSON format.
type cloudEvent struct {
	SpecVersion     string          `json:"specversion"`
	ID              string          `json:"id"`
	Source          string          `json:"source"`
	Type            string          `json:"type"`
	Subject         string          `json:"subject"`
	Time            string          `json:"time"`
	DataContentType string          `json:"datacontenttype"`
	Data            json.RawMessage `json:"data"`
	COffset         string          `json:"coffset"`
	TopicID         string          `json:"topicid"`
	PartitionID     string          `json:"partitionid"`
	TransactionID   string          `json:"transactionid"`
	UserID          string          `json:"userid,omitempty"`
	Metadata        string          `json:"metadata,omitempty"`
}
