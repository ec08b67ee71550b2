// Package kafkasink relays events to Kafka: a pgevents handler that produces
// each event as a Kafka record, built on franz-go (github.com/twmb/franz-go),
// usable from Go ([New]) or as the `kafka` handler type of
// db-event-consumer.yml. It is how a transactional outbox in PostgreSQL
// feeds the services that consume Kafka.
//
// # Records
//
// A record goes to the topic that Options.Topic names, a template over the
// event's fields ("portal-events", "portal.{event_type}"), with the key
// Options.Key renders (default the host_id, so that a host's records stay
// in one Kafka partition; keyed records are partitioned by murmur2, as the
// Java producer does by default). With FormatRaw the value is the event's
// payload and the metadata travels in headers; with FormatCloudEvents the
// record is a CloudEvents 1.0 event in binary mode (ce_id = event_id,
// ce_type = event_type, ce_source = Options.Source, ce_time = created_at,
// ce_subject = host_id, content-type application/json). Every record
// carries the headers event_id, event_type, host_id, user_id, c_offset,
// topic_id, partition_id, transaction_id, created_at (RFC 3339, UTC),
// when the event has metadata, metadata, and, when there is a trace
// context (pgevents.TraceHeaders: the handler's span, else the producer's
// from the metadata), traceparent and tracestate.
//
// # Mechanism
//
// The relay keeps one franz-go client per partition it serves (created
// on first use), an idempotent producer with acks=all that sends only when
// flushed. During a batch, Handle adds the event's record to the client's
// buffer and returns; before the batch's offset commits, the consumer
// flushes the relay (see pgevents.Batch), which sends the batch's records
// together (one produce request per broker, a batch of records per Kafka
// partition) and waits until every one is acknowledged. Because the buffer
// holds only the batch's records when it is sent, and the producer fails
// every record buffered after a failed one in the same Kafka partition,
// no record of a host is ever written after a later record of the same host
// failed: per-key order never breaks, across failures and retries included.
// That holds only for records the producer has placed in their Kafka
// partition's buffer before the flush: a record produced before the
// client knows its topic waits for the topic's metadata, and, placed while
// a refused batch fails, it would start a new batch and be written. So a
// flush first waits until every record produced is placed (or failed).
// A batch larger than 10,000 records is flushed every 10,000.
//
// The producer keeps that order within a Kafka partition only: records to
// different topics are sent, and retried, independently. When the topic
// template can send a host's events to several topics (it uses a field
// other than host_id, partition_id and topic_id, as "portal.{event_type}"
// does), a host's record is therefore sent only once the host's earlier
// records, to other topics, are acknowledged: a flush sends the batch's
// records in waves, a host's record one wave after its previous record
// when that went to another topic, and stops at the first wave with a
// failure. So a host's order holds across topics: when a consumer of one
// topic sees a host's record, every earlier record of the host is in Kafka.
// It costs a round trip to the brokers per change of topic within a host in
// a batch (the most of any host), nothing where a host's events all go to
// one topic. A key not derived from host_id spreads a host over a topic's
// Kafka partitions, where its order is kept per partition only.
//
// # Guarantees and failures
//
// At least once into Kafka, never reordered per key: the consumer's offset
// commits only after every record of the batch is acknowledged (acks=all).
// A crash between acknowledgement and commit sends the batch again, and
// the duplicates carry the same event_id header; a retried batch skips the
// records an earlier attempt in this process delivered (see sink.Acked).
// The events of one producer transaction stay contiguous per key. Failures
// are classified by [Classify]:
//
//   - broker unreachable, request timeouts, not enough replicas, leader
//     changes, records not sent within Options.DeliveryTimeout, a flush
//     that ran out of the handler timeout: transient. The partition waits
//     with backoff and tries again, however long Kafka is down; nothing is
//     dead-lettered;
//   - unknown topics and authorization or SASL failures: deployment,
//     retried the same way, logged at error level and counted apart;
//   - a record too large (over Options.MaxRecordBytes, or over the topic's
//     max.message.bytes on the broker) or invalid, or a topic name the
//     template renders that is not a valid Kafka topic: permanent. The
//     event's unit is dead-lettered with the broker's reason. When the
//     broker refuses a batch of records, each is tried alone first, so
//     that only the unit of the record refused on its own is blamed.
//
// When a unit is dead-lettered, the records its earlier events produced in
// the failed attempt may already be in Kafka: a unit is atomic in
// PostgreSQL, not in Kafka.
package kafkasink

import (
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"maps"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl"
	"github.com/twmb/franz-go/pkg/sasl/plain"
	"github.com/twmb/franz-go/pkg/sasl/scram"

	"github.com/pgevents/pgevents"
	"github.com/pgevents/pgevents/internal/tmpl"
	"github.com/pgevents/pgevents/sink"
)

// Format is the shape of the records produced.
type Format string

// Formats.
const (
	// FormatRaw: the value is the event's payload (JSON; "null" when the
	// event has none), the event's fields are headers.
	FormatRaw Format = "raw"
	// FormatCloudEvents: a CloudEvents 1.0 event in Kafka binary mode: the
	// value is the payload, the attributes are ce_ headers.
	FormatCloudEvents Format = "cloudevents"
)

// Defaults of Options.
const (
	// DefaultKey keeps a host's records in one Kafka partition.
	DefaultKey = "host_id"
	// DefaultSource is the CloudEvents source of FormatCloudEvents.
	DefaultSource = sink.DefaultSource
	// DefaultDeliveryTimeout bounds the wait for a record to be sent; it is
	// shorter than the consumer's default handler timeout (30 s), which
	// bounds the whole flush.
	DefaultDeliveryTimeout = 20 * time.Second
	// DefaultMaxRecordBytes is franz-go's default batch limit, under
	// Kafka's default max.message.bytes (1048588).
	DefaultMaxRecordBytes = 1_000_012
	// flushEvery bounds the records buffered per partition: a larger batch
	// is flushed every flushEvery records.
	flushEvery = 10_000
)

// Options configures a Sink. Zero values take the documented defaults.
type Options struct {
	// Name tells this relay's metrics apart; default "kafka".
	Name string
	// Brokers are the seed brokers, "host:port"; required.
	Brokers []string
	// Topic is the topic records go to, a template over the event's fields
	// such as "portal.{event_type}" (see internal/tmpl for the fields);
	// required. A host's records keep their order across the topics it
	// renders (see the package documentation).
	Topic string
	// Key is the record key: a template, or a bare field name; default
	// "host_id". A key not derived from host_id spreads a host over Kafka
	// partitions, where its order is kept per partition only.
	Key string
	// Format is FormatRaw (default) or FormatCloudEvents.
	Format Format
	// Source is the CloudEvents source attribute; default "pgevents".
	Source string
	// TLS, when set, connects to the brokers over TLS.
	TLS *tls.Config
	// SASL, when set, authenticates to the brokers.
	SASL *SASL
	// DeliveryTimeout bounds how long a record may wait to be sent (no
	// broker reachable, a partition without a leader) before its batch
	// fails, transient, and is tried again; and how long a new attempt
	// waits for records an earlier attempt still has in flight. A record
	// already sent is retried by the idempotent producer until Kafka
	// answers (failing it could break the order), so a flush can also run
	// out of the consumer's HandlerTimeout, another transient failure.
	// Default 20 s, at least 1 s; keep it below HandlerTimeout.
	DeliveryTimeout time.Duration
	// MaxRecordBytes is the largest record accepted (the franz-go
	// producer's batch limit); a larger record is refused before it is sent
	// and its unit dead-lettered. Set it to the topics' max.message.bytes;
	// default 1,000,012.
	MaxRecordBytes int
	// Metrics, when set, records the relay's deliveries.
	Metrics *sink.Metrics
	// ClientOptions are added to the franz-go clients' options, after the
	// relay's own (client id, timeouts, compression, logging). They must
	// not disable idempotent writes, lower the acks, or change the
	// partitioner: the guarantees rest on them.
	ClientOptions []kgo.Opt
}

// SASL configures SASL authentication.
type SASL struct {
	// Mechanism is "PLAIN", "SCRAM-SHA-256" or "SCRAM-SHA-512".
	Mechanism string
	// User and Password are the credentials.
	User     string
	Password string
}

// ErrInvalidOptions is wrapped by New's errors about its options (and
// by every *OptionError).
var ErrInvalidOptions = sink.ErrInvalidOptions

// OptionError is an invalid option, named by its YAML key (brokers,
// brokers[i], topic, key, format, sasl.mechanism, sasl.user,
// sasl.password, deliveryTimeoutMs, maxRecordBytes).
type OptionError = sink.OptionError

// relayName is the relay's name in its errors.
const relayName = "kafka sink"

// Validate reports every option of o that New refuses: nil, or the
// errors.Join of an *OptionError per option at fault, named by its key in
// db-event-consumer.yml. Zero values are valid: they take the defaults.
// These are the relay's only option rules; the YAML layer reports them
// under the handler's keys.
func (o Options) Validate() error {
	errs := sink.OptionErrors{Relay: relayName}
	bad := errs.Add
	if len(o.Brokers) == 0 {
		bad("brokers", "", "is required: a list of the brokers to bootstrap from, host:port")
	}
	for i, b := range o.Brokers {
		if host, port, err := net.SplitHostPort(b); err != nil || host == "" || port == "" {
			bad("brokers", fmt.Sprintf("[%d]", i), "must be host:port, got %q", b)
		}
	}
	if o.Topic == "" {
		bad("topic", "", `is required: a topic, or a template such as "portal.{event_type}"`)
	} else if topic, err := tmpl.Parse(o.Topic); err != nil {
		bad("topic", "", "%v", err)
	} else if t, static := topic.Static(); static {
		if err := validTopic(t); err != nil {
			bad("topic", "", "%v", err)
		}
	}
	if o.Key != "" {
		if _, err := tmpl.ParseKey(o.Key); err != nil {
			bad("key", "", "%v", err)
		}
	}
	switch o.Format {
	case "", FormatRaw, FormatCloudEvents:
	default:
		bad("format", "", "must be raw or cloudevents, got %q", o.Format)
	}
	if s := o.SASL; s != nil {
		if _, ok := mechanisms[s.Mechanism]; !ok {
			bad("sasl.mechanism", "", "must be one of %s, got %q", strings.Join(slices.Sorted(maps.Keys(mechanisms)), ", "), s.Mechanism)
		}
		if s.User == "" {
			bad("sasl.user", "", "is required")
		}
		if s.Password == "" {
			bad("sasl.password", "", "is required (in the YAML file, it may be ${AN_ENVIRONMENT_VARIABLE})")
		}
	}
	if d := o.DeliveryTimeout; d != 0 && d < time.Second {
		bad("deliveryTimeoutMs", "", "must be at least 1000 (1 s), got %d", d.Milliseconds())
	}
	if n := o.MaxRecordBytes; n != 0 && (n < 512 || n > 1<<30) {
		bad("maxRecordBytes", "", "must be between 512 and %d, got %d", 1<<30, n)
	}
	return errs.Err()
}

// Sink is the Kafka relay handler. Register it for the event types to
// relay; Close it after the consumer stopped.
type Sink struct {
	opts  Options
	topic *tmpl.Template
	// topicPerEvent says that the topic template uses a field that can
	// change within a host, so that a host's records can go to several
	// topics (see flusher).
	topicPerEvent bool
	key           *tmpl.Template
	base          []kgo.Opt
	metrics       *sink.Recorder // for events handled outside a batch

	mu     sync.Mutex
	parts  map[sink.PartKey]*part
	direct *kgo.Client // for events handled outside a batch
	closed bool
}

// part is the relay's state for one partition of a group: its client, the
// events delivered since the partition's last commit, and the records the
// client has not placed yet.
type part struct {
	cl      *kgo.Client
	acked   sink.Acked
	metrics *sink.Recorder
	placing placing
}

// New validates opts (see Options.Validate) and returns the relay. It
// does not connect: the clients connect on first use.
func New(opts Options) (*Sink, error) {
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	opts.Name = cmp.Or(opts.Name, "kafka")
	opts.Key = cmp.Or(opts.Key, DefaultKey)
	opts.Format = cmp.Or(opts.Format, FormatRaw)
	opts.Source = cmp.Or(opts.Source, DefaultSource)
	opts.DeliveryTimeout = cmp.Or(opts.DeliveryTimeout, DefaultDeliveryTimeout)
	opts.MaxRecordBytes = cmp.Or(opts.MaxRecordBytes, DefaultMaxRecordBytes)
	topic, _ := tmpl.Parse(opts.Topic) // validated
	key, _ := tmpl.ParseKey(opts.Key)  // validated
	base := []kgo.Opt{
		kgo.SeedBrokers(opts.Brokers...),
		kgo.ClientID("pgevents"),
		kgo.RequiredAcks(kgo.AllISRAcks()),
		kgo.RecordPartitioner(kgo.StickyKeyPartitioner(nil)),
		kgo.RecordDeliveryTimeout(opts.DeliveryTimeout),
		kgo.ProducerBatchMaxBytes(int32(opts.MaxRecordBytes)),
		kgo.MaxBufferedRecords(2 * flushEvery),
	}
	if opts.TLS != nil {
		base = append(base, kgo.DialTLSConfig(opts.TLS.Clone()))
	}
	if s := opts.SASL; s != nil {
		base = append(base, kgo.SASL(mechanisms[s.Mechanism](s.User, s.Password)))
	}
	base = append(base, opts.ClientOptions...)
	// Let franz-go check the options now rather than at the first event.
	cl, err := kgo.NewClient(base...)
	if err != nil {
		return nil, fmt.Errorf("%s: %w: %w", relayName, ErrInvalidOptions, err)
	}
	cl.Close()
	return &Sink{opts: opts, topic: topic, topicPerEvent: variesWithinHost(topic), key: key, base: base,
		parts: map[sink.PartKey]*part{}, metrics: opts.Metrics.For("", opts.Name, "kafka")}, nil
}

// mechanisms are the SASL mechanisms, by name, and how each authenticates.
var mechanisms = map[string]func(user, password string) sasl.Mechanism{
	"PLAIN": func(u, p string) sasl.Mechanism { return plain.Auth{User: u, Pass: p}.AsMechanism() },
	"SCRAM-SHA-256": func(u, p string) sasl.Mechanism {
		return scram.Auth{User: u, Pass: p}.AsSha256Mechanism()
	},
	"SCRAM-SHA-512": func(u, p string) sasl.Mechanism {
		return scram.Auth{User: u, Pass: p}.AsSha512Mechanism()
	},
}

// errClosed is returned by Handle after Close.
var errClosed = errors.New("kafka sink: closed")

// part returns the state of the partition batch b serves, creating it.
func (s *Sink) part(b *pgevents.Batch) (*part, error) {
	k := sink.KeyOf(b)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, pgevents.Retryable(errClosed)
	}
	if p := s.parts[k]; p != nil {
		return p, nil
	}
	p := &part{}
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.ManualFlushing(), kgo.WithHooks(&p.placing)}, s.base...)...)
	if err != nil {
		return nil, pgevents.Deployment(fmt.Errorf("kafka sink: %w", err))
	}
	p.cl = cl
	p.metrics = s.opts.Metrics.For(k.Group, s.opts.Name, "kafka")
	s.parts[k] = p
	return p, nil
}

// Handle adds ev's record to the batch's records (see the package
// documentation), or, called outside a batch, produces it and waits for its
// acknowledgement.
func (s *Sink) Handle(ctx context.Context, _ pgx.Tx, ev *pgevents.Event) error {
	b := pgevents.BatchFromContext(ctx)
	if b == nil {
		return s.produceNow(ctx, ev)
	}
	var perr error
	f := b.Flusher(s, func() pgevents.Flusher {
		p, err := s.part(b)
		perr = err
		if p != nil {
			p.acked.Begin(b.Start())
		}
		return &flusher{s: s, p: p}
	}).(*flusher)
	if perr != nil || f.p == nil {
		return cmpErr(perr, pgevents.Retryable(errClosed))
	}
	return f.add(ctx, ev)
}

func cmpErr(err, otherwise error) error {
	if err != nil {
		return err
	}
	return otherwise
}

// produceNow produces ev's record on the relay's direct client and waits
// for its acknowledgement.
func (s *Sink) produceNow(ctx context.Context, ev *pgevents.Event) error {
	rec, err := s.record(ctx, ev)
	if err != nil {
		return err
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return pgevents.Retryable(errClosed)
	}
	if s.direct == nil {
		if s.direct, err = kgo.NewClient(s.base...); err != nil {
			s.mu.Unlock()
			return pgevents.Deployment(fmt.Errorf("kafka sink: %w", err))
		}
	}
	cl := s.direct
	s.mu.Unlock()
	start := time.Now()
	if err := cl.ProduceSync(ctx, rec).FirstErr(); err != nil {
		class := Classify(err)
		s.metrics.Failed(class)
		return s.failure(ev, rec, err, class)
	}
	s.metrics.Delivered(time.Since(start))
	return nil
}

// failure describes the failed delivery of ev's record, with its class.
func (s *Sink) failure(ev *pgevents.Event, rec *kgo.Record, err error, class pgevents.Class) error {
	return &pgevents.ClassifiedError{Class: class,
		Err: fmt.Errorf("kafka sink: produce event %s (offset %d) to topic %s: %w", ev.EventID, ev.Offset, rec.Topic, err)}
}

// Close closes the relay's clients; records not yet acknowledged fail.
// Close it after the consumer stopped.
func (s *Sink) Close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	for k, p := range s.parts {
		p.cl.Close()
		delete(s.parts, k)
	}
	if s.direct != nil {
		s.direct.Close()
		s.direct = nil
	}
}

// Record returns the record the relay produces for ev, or the permanent
// failure that refuses it (a topic name the template renders that Kafka
// does not accept, a record over MaxRecordBytes). Its trace context
// headers are the producer's, from ev's metadata.
func (s *Sink) Record(ev *pgevents.Event) (*kgo.Record, error) {
	return s.record(context.Background(), ev)
}

// record builds ev's record; its traceparent and tracestate headers carry
// the span of ctx (the handler's, under a consumer that traces), else the
// producer's from ev's metadata (pgevents.TraceHeaders).
func (s *Sink) record(ctx context.Context, ev *pgevents.Event) (*kgo.Record, error) {
	get := func(field string) string { return fieldValue(ev, field) }
	topic := s.topic.Render(get)
	if err := validTopic(topic); err != nil {
		return nil, pgevents.Permanent(fmt.Errorf("kafka sink: event %s (offset %d): topic template %q: %w", ev.EventID, ev.Offset, s.topic, err))
	}
	value := []byte(ev.Payload)
	if value == nil {
		value = []byte("null")
	}
	created := ev.CreatedAt.UTC().Format(time.RFC3339Nano)
	hs := make([]kgo.RecordHeader, 0, 16)
	add := func(k, v string) { hs = append(hs, kgo.RecordHeader{Key: k, Value: []byte(v)}) }
	add("event_id", ev.EventID)
	add("event_type", ev.EventType)
	add("host_id", ev.HostID)
	add("user_id", ev.UserID)
	add("c_offset", strconv.FormatInt(ev.Offset, 10))
	add("topic_id", strconv.Itoa(ev.TopicID))
	add("partition_id", strconv.Itoa(ev.PartitionID))
	add("transaction_id", strconv.FormatInt(ev.TransactionID, 10))
	add("created_at", created)
	if len(ev.Metadata) > 0 && string(ev.Metadata) != "null" {
		hs = append(hs, kgo.RecordHeader{Key: "metadata", Value: ev.Metadata})
	}
	if tc := pgevents.TraceHeaders(ctx, ev); tc != nil {
		add(pgevents.TraceParentKey, tc[pgevents.TraceParentKey])
		if ts, ok := tc[pgevents.TraceStateKey]; ok {
			add(pgevents.TraceStateKey, ts)
		}
	}
	if s.opts.Format == FormatCloudEvents {
		add("ce_specversion", "1.0")
		add("ce_id", ev.EventID)
		add("ce_type", ev.EventType)
		add("ce_source", s.opts.Source)
		add("ce_time", created)
		add("ce_subject", ev.HostID)
		add("content-type", "application/json")
	}
	rec := &kgo.Record{Topic: topic, Key: []byte(s.key.Render(get)), Value: value, Headers: hs}
	// Refuse a record too large here rather than let the producer refuse it
	// later: its failure would come after the host's later records went.
	if n := encodedSize(rec); n > s.opts.MaxRecordBytes {
		return nil, pgevents.Permanent(fmt.Errorf("kafka sink: event %s (offset %d): %w (the record takes up to %d bytes, over maxRecordBytes %d)",
			ev.EventID, ev.Offset, kerr.MessageTooLarge, n, s.opts.MaxRecordBytes))
	}
	return rec, nil
}

// encodedSize bounds the size of a batch holding only rec, as the
// producer measures it against its batch limit: the batch's fixed fields
// and the record with every variable-length integer at its widest.
func encodedSize(rec *kgo.Record) int {
	const batchOverhead = 61 + 16 // v2 batch header, with the produce request's framing
	const varint = 5
	n := batchOverhead + varint + 1 + 10 + varint + // length, attributes, timestamp and offset deltas
		varint + len(rec.Key) + varint + len(rec.Value) + varint
	for _, h := range rec.Headers {
		n += varint + len(h.Key) + varint + len(h.Value)
	}
	return n
}

// variesWithinHost reports whether t uses a field that can differ between
// two events of one host: any field but host_id, partition_id (a host's
// partition) and topic_id (the consumer's topic).
func variesWithinHost(t *tmpl.Template) bool {
	for _, f := range []string{"event_type", "user_id", "event_id", "transaction_id", "c_offset"} {
		if t.Uses(f) {
			return true
		}
	}
	return false
}

// fieldValue returns an event's field as a template renders it.
func fieldValue(ev *pgevents.Event, field string) string {
	switch field {
	case "event_type":
		return ev.EventType
	case "host_id":
		return ev.HostID
	case "user_id":
		return ev.UserID
	case "event_id":
		return ev.EventID
	case "topic_id":
		return strconv.Itoa(ev.TopicID)
	case "partition_id":
		return strconv.Itoa(ev.PartitionID)
	case "transaction_id":
		return strconv.FormatInt(ev.TransactionID, 10)
	case "c_offset":
		return strconv.FormatInt(ev.Offset, 10)
	}
	return ""
}

// validTopic checks a Kafka topic name: 1 to 249 characters of
// [a-zA-Z0-9._-], not "." or "..".
func validTopic(t string) error {
	if t == "" || t == "." || t == ".." || len(t) > 249 {
		return fmt.Errorf("%q is not a valid Kafka topic name (1 to 249 characters of a-z, A-Z, 0-9, '.', '_', '-'; not '.' or '..')", t)
	}
	for i := 0; i < len(t); i++ {
		c := t[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '.' || c == '_' || c == '-') {
			return fmt.Errorf("%q is not a valid Kafka topic name (1 to 249 characters of a-z, A-Z, 0-9, '.', '_', '-')", t)
		}
	}
	return nil
}
