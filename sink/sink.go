// Package sink holds what the relay handlers share: sink/kafkasink produces
// events to Kafka, sink/webhook sends them to an HTTP endpoint. Both are
// ordinary pgevents handlers, built in Go or from the `kafka` and `http`
// handler types of db-event-consumer.yml.
//
// # Mechanism
//
// A relay's effect happens outside PostgreSQL, so it cannot commit with
// the group's offset. Each relay therefore uses the consumer's batch hook
// (pgevents.Batch): Handle starts the event's delivery and returns at once,
// so that a batch's events travel together (one Kafka produce request per
// broker, concurrent HTTP requests across hosts) instead of one round trip
// each; before the batch's offset commits, the consumer flushes the relay,
// which waits until every delivery of the batch is acknowledged. A delivery
// that failed is reported against its event, and the consumer treats the
// event's unit as if its handler had failed: the batch rolls back and is
// retried after a backoff (transient and deployment failures, forever), or
// the unit is dead-lettered with the reason (permanent failures).
//
// # Guarantees
//
//   - At least once: an event's offset commits only after its delivery was
//     acknowledged. A crash, a lost lease or a failed commit after the
//     acknowledgement delivers it again; every copy carries the same
//     event_id (Kafka header event_id, HTTP Idempotency-Key), by which the
//     receiver drops duplicates.
//   - Order per host: the deliveries of one host happen in offset order,
//     and none happens after a later one of the same host. Duplicates may
//     repeat earlier events, so the order holds once duplicates are
//     removed (keep the first copy of each event_id).
//   - A retried batch does not deliver again what an earlier attempt of
//     the same batch, in the same process, delivered: the relays remember
//     the event ids acknowledged since the partition's last commit
//     ([Acked]).
//   - An outage is never a dead letter: unreachable brokers or endpoints,
//     timeouts, throttling and server errors are transient; only what the
//     receiver refuses for the event itself (a record too large, an HTTP
//     400) dead-letters the event's unit.
package sink

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/pgevents/pgevents"
)

// DefaultSource is the CloudEvents source attribute of the relays' events
// in format cloudevents, unless their options name another.
const DefaultSource = "pgevents"

// Metrics are the relays' Prometheus metrics. One Metrics serves every
// relay of a process; each relay records under its own labels (see
// [Metrics.For]). Register it on the registry that serves /metrics.
//
//   - pgevents_sink_records_total{group,sink,type}: records or requests
//     acknowledged (Kafka: acks=all; HTTP: a 2xx answer).
//   - pgevents_sink_latency_seconds{group,sink,type}: histogram of the time
//     from a record's produce to its acknowledgement, or of an HTTP
//     request's round trip.
//   - pgevents_sink_failures_total{group,sink,type,class}: deliveries that
//     failed, by the class of their failure (transient, deployment,
//     permanent, unknown). A failed delivery is retried with its batch, so
//     one event can count several times.
type Metrics struct {
	records  *prometheus.CounterVec
	latency  *prometheus.HistogramVec
	failures *prometheus.CounterVec
}

// NewMetrics creates the relays' metrics, not registered anywhere.
func NewMetrics() *Metrics {
	labels := []string{"group", "sink", "type"}
	return &Metrics{
		records: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "pgevents_sink_records_total",
			Help: "Records (Kafka) or requests (HTTP) a relay delivered and saw acknowledged.",
		}, labels),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "pgevents_sink_latency_seconds",
			Help: "Time from a record's produce to its acknowledgement (Kafka), or an HTTP request's round trip.",
			Buckets: []float64{0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
				0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60},
		}, labels),
		failures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "pgevents_sink_failures_total",
			Help: "Deliveries a relay saw fail, by failure class (transient, deployment, permanent, unknown).",
		}, append(labels, "class")),
	}
}

// Describe implements prometheus.Collector.
func (m *Metrics) Describe(ch chan<- *prometheus.Desc) {
	m.records.Describe(ch)
	m.latency.Describe(ch)
	m.failures.Describe(ch)
}

// Collect implements prometheus.Collector.
func (m *Metrics) Collect(ch chan<- prometheus.Metric) {
	m.records.Collect(ch)
	m.latency.Collect(ch)
	m.failures.Collect(ch)
}

// For returns the recorder of relay name, of kind typ ("kafka", "http"),
// serving group, with its series created at zero. A nil Metrics returns
// a nil Recorder, which records nothing.
func (m *Metrics) For(group, name, typ string) *Recorder {
	if m == nil {
		return nil
	}
	r := &Recorder{
		records: m.records.WithLabelValues(group, name, typ),
		latency: m.latency.WithLabelValues(group, name, typ),
	}
	for i, c := range classes {
		r.failures[i] = m.failures.WithLabelValues(group, name, typ, c.String())
	}
	return r
}

var classes = [...]pgevents.Class{pgevents.ClassTransient, pgevents.ClassDeployment, pgevents.ClassPermanent, pgevents.ClassUnknown}

// Recorder records one relay's deliveries. Its methods may be called
// concurrently, and on a nil Recorder, which records nothing.
type Recorder struct {
	records  prometheus.Counter
	latency  prometheus.Observer
	failures [len(classes)]prometheus.Counter
}

// Delivered records an acknowledged delivery that took d.
func (r *Recorder) Delivered(d time.Duration) {
	if r == nil {
		return
	}
	r.records.Inc()
	r.latency.Observe(d.Seconds())
}

// Failed records a failed delivery of the given class.
func (r *Recorder) Failed(class pgevents.Class) {
	if r == nil {
		return
	}
	for i, c := range classes {
		if c == class {
			r.failures[i].Inc()
		}
	}
}

// Acked remembers, per partition of a group, the events a relay delivered
// in attempts at the partition's current batch: a retried batch skips
// them, so that it delivers again only what was not acknowledged. This is
// safe for order because a relay acknowledges a host's deliveries in
// offset order: when an event was delivered, so was every earlier event of
// its host in the batch (or that event's unit was dead-lettered). Call
// Begin at the start of every attempt, Clear when the batch commits. Its
// methods are safe for concurrent use.
type Acked struct {
	mu    sync.Mutex
	ids   map[string]struct{}
	start int64 // the batch the ids belong to (pgevents.Batch.Start)
}

// Begin starts an attempt at the batch that starts at offset start: the
// events of another batch (one that this process never committed, its
// partition taken over meanwhile) are forgotten.
func (a *Acked) Begin(start int64) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if start != a.start {
		clear(a.ids)
		a.start = start
	}
}

// Has reports whether the event id was delivered.
func (a *Acked) Has(id string) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	_, ok := a.ids[id]
	return ok
}

// Add records that the event id was delivered.
func (a *Acked) Add(id string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.ids == nil {
		a.ids = map[string]struct{}{}
	}
	a.ids[id] = struct{}{}
}

// Clear forgets every event: the batch committed.
func (a *Acked) Clear() {
	a.mu.Lock()
	defer a.mu.Unlock()
	clear(a.ids)
}

// Len returns the number of events remembered.
func (a *Acked) Len() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.ids)
}

// PartKey names the partition of a group whose batches a relay serves.
type PartKey struct {
	Group     string
	Topic     int
	Partition int
}

// KeyOf returns the partition key of batch b.
func KeyOf(b *pgevents.Batch) PartKey {
	return PartKey{Group: b.Group(), Topic: b.Topic(), Partition: b.Partition()}
}

// TLSFiles names the PEM files of a TLS client configuration.
type TLSFiles struct {
	// CAFile holds the certificates that verify the server; empty: the
	// system's roots.
	CAFile string
	// CertFile and KeyFile hold the client's certificate and key, for
	// servers that authenticate clients; both or neither.
	CertFile string
	KeyFile  string
}

// Validate reports what is wrong with the names themselves, without
// reading the files: CertFile and KeyFile go together.
func (f TLSFiles) Validate() error {
	if (f.CertFile == "") != (f.KeyFile == "") {
		return errors.New("tls: certFile and keyFile go together")
	}
	return nil
}

// Config loads the files into a TLS client configuration (TLS 1.2 or
// later).
func (f TLSFiles) Config() (*tls.Config, error) {
	if err := f.Validate(); err != nil {
		return nil, err
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if f.CAFile != "" {
		pem, err := os.ReadFile(f.CAFile)
		if err != nil {
			return nil, fmt.Errorf("tls: caFile: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("tls: caFile %s: no PEM certificate found", f.CAFile)
		}
		cfg.RootCAs = pool
	}
	if f.CertFile != "" {
		cert, err := tls.LoadX509KeyPair(f.CertFile, f.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("tls: certFile/keyFile: %w", err)
		}
		cfg.Certificates = []tls.Certificate{cert}
	}
	return cfg, nil
}

// ErrInvalidOptions is wrapped by every *OptionError.
var ErrInvalidOptions = errors.New("invalid options")

// OptionError is an option a relay refuses, named by its key in
// db-event-consumer.yml (brokers, topic, url, deliveryTimeoutMs, ...), so
// that the YAML layer reports a relay's own rules under the file's keys
// instead of restating them. A relay's Options.Validate returns every
// OptionError of its options, joined (errors.Join); New returns the same.
type OptionError struct {
	// Relay is the relay's name in messages: "kafka sink" or "webhook".
	Relay string
	// Key is the option's key in the YAML file.
	Key string
	// Entry names the item of a list or map option at fault, as it
	// extends Key in the file: "[1]" for brokers[1], ".Authorization" for
	// headers.Authorization; empty when the option as a whole is at fault.
	Entry string
	// Msg says what is wrong.
	Msg string
}

// Path returns the option's key with its entry: "brokers[1]".
func (e *OptionError) Path() string { return e.Key + e.Entry }

// Error names the relay and the option.
func (e *OptionError) Error() string { return e.Relay + ": " + e.Path() + ": " + e.Msg }

// Unwrap returns ErrInvalidOptions.
func (e *OptionError) Unwrap() error { return ErrInvalidOptions }

// OptionErrors collects the *OptionError values of a relay's options, for
// its Options.Validate.
type OptionErrors struct {
	// Relay is the relay's name in messages, as OptionError.Relay.
	Relay string
	errs  []error
}

// Add records that the option at key (and entry, see OptionError) is
// wrong, as the format says.
func (o *OptionErrors) Add(key, entry, format string, args ...any) {
	o.errs = append(o.errs, &OptionError{Relay: o.Relay, Key: key, Entry: entry, Msg: fmt.Sprintf(format, args...)})
}

// Err returns nil, or the errors.Join of every error added, in order.
func (o *OptionErrors) Err() error { return errors.Join(o.errs...) }
