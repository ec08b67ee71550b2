package metrics

import (
	"errors"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/pgevents/pgevents"
	"github.com/pgevents/pgevents/schema"
)

// Label names.
const (
	labelGroup     = "group"
	labelTopic     = "topic"
	labelPartition = "partition"
	labelClass     = "class"
	labelSource    = "source"
	labelReason    = "reason"
)

// Defaults of Options.
const (
	// DefaultLagCacheTTL is how long the lag collector reuses a reading.
	DefaultLagCacheTTL = time.Second
	// DefaultLagTimeout bounds the lag collector's statement.
	DefaultLagTimeout = 3 * time.Second
)

// Latency buckets, in seconds: 100 µs to 60 s, about three per decade.
var latencyBuckets = []float64{
	0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
	0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60,
}

// Batch size buckets, in events.
var batchSizeBuckets = []float64{1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000}

// Options configures Metrics.
type Options struct {
	// Group is the consumer group observed; required.
	Group string
	// Topic is the topic consumed; default 1 (pgevents.DefaultTopic).
	Topic int
	// Partitions lists the partitions this process serves. Their counter
	// series are created at zero, so that rate() and increase() see the
	// first events; nil creates series as events come.
	Partitions []int
	// DB, when set, is where the lag collector reads the group's state at
	// scrape time (see ReadState); nil leaves the lag metrics out.
	DB schema.DB
	// Schema is the schema pgevents lives in (the consumer's
	// Config.Schema); default: the first schema of the search_path.
	Schema string
	// LagCap caps the events counted per partition for
	// pgevents_consumer_lag_events; default DefaultLagCap.
	LagCap int64
	// LagCacheTTL is how long a reading of the lag collector is reused, so
	// that concurrent or frequent scrapes cost one statement; default
	// DefaultLagCacheTTL.
	LagCacheTTL time.Duration
	// LagTimeout bounds the lag collector's statement; default
	// DefaultLagTimeout. A reading that fails or times out leaves the lag
	// metrics out of the scrape and sets pgevents_lag_query_up to 0.
	LagTimeout time.Duration
	// NoRuntimeMetrics leaves out the Go runtime and process collectors
	// (go_*, process_*), which are registered by default.
	NoRuntimeMetrics bool
}

// Metrics records a consumer's activity as Prometheus metrics on a
// registry of its own. It implements pgevents.Observer: set it as the
// consumer's Config.Observer. Its methods are safe for concurrent use and
// never block. See the package documentation for the metrics.
type Metrics struct {
	reg   *prometheus.Registry
	group string
	topic string

	handled      *prometheus.CounterVec
	batchSize    *prometheus.HistogramVec
	handlerTime  *prometheus.HistogramVec
	batchTime    *prometheus.HistogramVec
	endToEnd     *prometheus.HistogramVec
	retries      *prometheus.CounterVec
	deadLetters  *prometheus.CounterVec
	parkedUnits  *prometheus.CounterVec
	skipped      *prometheus.CounterVec
	wakeups      *prometheus.CounterVec
	reconnects   *prometheus.CounterVec
	connects     *prometheus.CounterVec
	failing      *prometheus.GaugeVec
	failingSince *prometheus.GaugeVec
	failMu       sync.Mutex
	failCount    map[int]int // failed batches since the partition's last commit
	owned        atomic.Pointer[func() int]
	unserved     atomic.Pointer[func() int]
	listenerUp   atomic.Pointer[func() bool]
	lagCollector *lagCollector
}

var _ pgevents.Observer = (*Metrics)(nil)

// New creates the metrics of opts.Group on opts.Topic and registers them,
// with the lag collector when opts.DB is set, on a new registry.
func New(opts Options) (*Metrics, error) {
	if opts.Group == "" {
		return nil, errors.New("metrics: Group is required")
	}
	if opts.Topic == 0 {
		opts.Topic = pgevents.DefaultTopic
	}
	m := &Metrics{
		reg:   prometheus.NewRegistry(),
		group: opts.Group,
		topic: strconv.Itoa(opts.Topic),
	}
	gtp := []string{labelGroup, labelTopic, labelPartition}
	gt := []string{labelGroup, labelTopic}
	m.handled = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "pgevents_events_handled_total",
		Help: "Events handled and committed by this process (dead-lettered and parked events excluded).",
	}, gtp)
	m.batchSize = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "pgevents_batch_size",
		Help:    "Events per committed batch (handled, dead-lettered or parked), after extension to a producer transaction's end.",
		Buckets: batchSizeBuckets,
	}, gt)
	m.handlerTime = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "pgevents_handler_duration_seconds",
		Help:    "Time spent in handlers per committed batch.",
		Buckets: latencyBuckets,
	}, gt)
	m.batchTime = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "pgevents_batch_duration_seconds",
		Help:    "Time of a committed batch from claim to commit.",
		Buckets: latencyBuckets,
	}, gt)
	m.endToEnd = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "pgevents_end_to_end_latency_seconds",
		Help:    "Time from an event's append (created_at) to its handling, on the database clock; up to 1024 samples per batch.",
		Buckets: latencyBuckets,
	}, gt)
	m.retries = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "pgevents_retries_total",
		Help: "Batches rolled back to be retried, by failure class (transient, deployment, permanent, unknown).",
	}, append(gtp, labelClass))
	m.deadLetters = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "pgevents_dead_letters_total",
		Help: "Units (partition-local slices of a producer transaction) written to dead_letter_queue by this process.",
	}, gtp)
	m.parkedUnits = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "pgevents_parked_units_total",
		Help: "Units held back in parked_events behind a dead letter of their host (policy parkHost).",
	}, gtp)
	m.skipped = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "pgevents_retention_skipped_events_total",
		Help: "Events retention removed before this group handled them (it was DEAD, or max_retention struck), reported when the group runs again, by reason.",
	}, append(gtp, labelReason))
	m.wakeups = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "pgevents_wakeups_total",
		Help: "Partition workers woken, by source: tail, the elected watcher of this process saw the partition's tail move (the usual source while events flow); in_flight, it saw an append in flight there; notify, a notification (from a producer after a quiet period, or from another process's elected watcher); poll, the waitPeriod safety net found work (lost notifications); reconnect, the poll after a listener reconnect; tick, the announcement of a tick of the sequencer this process runs (a sequenced topic), heard on the sequencer's session.",
	}, append(gt, labelSource))
	m.reconnects = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "pgevents_listener_reconnects_total",
		Help: "Reconnects of the listening connection (the first connect is not counted).",
	}, gt)
	m.connects = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "pgevents_listener_connects_total",
		Help: "Successful connects of the listening connection, the first one included.",
	}, gt)
	m.failing = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "pgevents_partition_failing_batches",
		Help: "Batches of the partition that failed since its last commit (0 once a batch commits): a partition whose batches keep failing holds its events back.",
	}, gtp)
	m.failingSince = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "pgevents_partition_failing_since_seconds",
		Help: "Unix time of the first of the partition's failed batches since its last commit; 0 while its batches commit.",
	}, gtp)
	m.failCount = map[int]int{}
	owned := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name:        "pgevents_partitions_owned",
		Help:        "Partitions this process serves and that are not halted.",
		ConstLabels: prometheus.Labels{labelGroup: m.group, labelTopic: m.topic},
	}, func() float64 {
		if f := m.owned.Load(); f != nil {
			return float64((*f)())
		}
		return 0
	})
	unserved := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name:        "pgevents_partitions_unserved",
		Help:        "Partitions this process holds whose batches are failing because they cannot get a database session (too many connections, the server starting, connection failures); each is released within pgevents.SessionFailureBound.",
		ConstLabels: prometheus.Labels{labelGroup: m.group, labelTopic: m.topic},
	}, func() float64 {
		if f := m.unserved.Load(); f != nil {
			return float64((*f)())
		}
		return 0
	})
	listenerUp := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name:        "pgevents_listener_connected",
		Help:        "1 while the listening connection is up with LISTEN in place, else 0.",
		ConstLabels: prometheus.Labels{labelGroup: m.group, labelTopic: m.topic},
	}, func() float64 {
		if f := m.listenerUp.Load(); f != nil && (*f)() {
			return 1
		}
		return 0
	})
	cs := []prometheus.Collector{m.handled, m.batchSize, m.handlerTime, m.batchTime, m.endToEnd, m.retries,
		m.deadLetters, m.parkedUnits, m.skipped, m.wakeups, m.reconnects, m.connects, m.failing, m.failingSince, owned, unserved, listenerUp}
	if !opts.NoRuntimeMetrics {
		cs = append(cs, collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	}
	if opts.DB != nil {
		m.lagCollector = newLagCollector(opts)
		cs = append(cs, m.lagCollector)
	}
	for _, c := range cs {
		if err := m.reg.Register(c); err != nil {
			return nil, err
		}
	}

	// Series that exist from the start.
	for _, p := range opts.Partitions {
		ps := strconv.Itoa(p)
		m.handled.WithLabelValues(m.group, m.topic, ps)
		m.deadLetters.WithLabelValues(m.group, m.topic, ps)
		m.parkedUnits.WithLabelValues(m.group, m.topic, ps)
		m.failing.WithLabelValues(m.group, m.topic, ps)
		m.failingSince.WithLabelValues(m.group, m.topic, ps)
		for _, c := range []pgevents.Class{pgevents.ClassTransient, pgevents.ClassDeployment, pgevents.ClassPermanent, pgevents.ClassUnknown} {
			m.retries.WithLabelValues(m.group, m.topic, ps, c.String())
		}
	}
	for _, s := range []pgevents.WakeSource{pgevents.WakeNotify, pgevents.WakePoll, pgevents.WakeReconnect} {
		m.wakeups.WithLabelValues(m.group, m.topic, s.String())
	}
	m.reconnects.WithLabelValues(m.group, m.topic)
	m.connects.WithLabelValues(m.group, m.topic)
	m.batchSize.WithLabelValues(m.group, m.topic)
	m.handlerTime.WithLabelValues(m.group, m.topic)
	m.batchTime.WithLabelValues(m.group, m.topic)
	m.endToEnd.WithLabelValues(m.group, m.topic)
	return m, nil
}

// Registry returns the registry the metrics are registered on, to add
// collectors of one's own or to gather them.
func (m *Metrics) Registry() *prometheus.Registry { return m.reg }

// Handler returns the HTTP handler of /metrics: the registry in the
// Prometheus exposition formats. A collector that fails does not fail the
// scrape; the other metrics are still served.
func (m *Metrics) Handler() http.Handler {
	return promhttp.InstrumentMetricHandler(m.reg, promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{
		Registry:          m.reg,
		ErrorHandling:     promhttp.ContinueOnError,
		EnableOpenMetrics: true,
	}))
}

// SetPartitionsOwnedFunc sets the function that pgevents_partitions_owned
// reads at each scrape: the number of partitions this process serves and
// that are not halted. Until it is set, the gauge is 0.
func (m *Metrics) SetPartitionsOwnedFunc(f func() int) { m.owned.Store(&f) }

// SetPartitionsUnservedFunc sets the function that
// pgevents_partitions_unserved reads at each scrape: the number of
// partitions this process holds whose batches cannot get a database
// session (pgevents.Stats.Unserved). Until it is set, the gauge is 0.
func (m *Metrics) SetPartitionsUnservedFunc(f func() int) { m.unserved.Store(&f) }

// SetListenerConnectedFunc sets the function that
// pgevents_listener_connected reads at each scrape (Consumer.Ready). Until
// it is set, the gauge is 0.
func (m *Metrics) SetListenerConnectedFunc(f func() bool) { m.listenerUp.Store(&f) }

// BatchCommitted implements pgevents.Observer.
func (m *Metrics) BatchCommitted(b pgevents.BatchStats) {
	group, topic := b.Group, strconv.Itoa(b.Topic)
	part := strconv.Itoa(b.Partition)
	m.failMu.Lock()
	if m.failCount[b.Partition] > 0 {
		delete(m.failCount, b.Partition)
		m.failing.WithLabelValues(group, topic, part).Set(0)
		m.failingSince.WithLabelValues(group, topic, part).Set(0)
	}
	m.failMu.Unlock()
	if b.Handled > 0 {
		m.handled.WithLabelValues(group, topic, part).Add(float64(b.Handled))
	}
	if b.DeadLettered > 0 {
		m.deadLetters.WithLabelValues(group, topic, part).Add(float64(b.DeadLettered))
	}
	if b.ParkedUnits > 0 {
		m.parkedUnits.WithLabelValues(group, topic, part).Add(float64(b.ParkedUnits))
	}
	m.batchSize.WithLabelValues(group, topic).Observe(float64(b.Events))
	m.handlerTime.WithLabelValues(group, topic).Observe(b.HandlerDuration.Seconds())
	m.batchTime.WithLabelValues(group, topic).Observe(b.Duration.Seconds())
	if len(b.EndToEnd) > 0 {
		e2e := m.endToEnd.WithLabelValues(group, topic)
		for _, d := range b.EndToEnd {
			e2e.Observe(max(d, 0).Seconds())
		}
	}
}

// BatchFailed implements pgevents.Observer.
func (m *Metrics) BatchFailed(partition int, class pgevents.Class) {
	part := strconv.Itoa(partition)
	m.retries.WithLabelValues(m.group, m.topic, part, class.String()).Inc()
	m.failMu.Lock()
	defer m.failMu.Unlock()
	m.failCount[partition]++
	if m.failCount[partition] == 1 {
		m.failingSince.WithLabelValues(m.group, m.topic, part).Set(float64(time.Now().UnixNano()) / 1e9)
	}
	m.failing.WithLabelValues(m.group, m.topic, part).Set(float64(m.failCount[partition]))
}

// Woken implements pgevents.Observer.
func (m *Metrics) Woken(_ int, source pgevents.WakeSource) {
	m.wakeups.WithLabelValues(m.group, m.topic, source.String()).Inc()
}

// Skipped implements pgevents.Observer.
func (m *Metrics) Skipped(partition int, n int64, reason string) {
	m.skipped.WithLabelValues(m.group, m.topic, strconv.Itoa(partition), reason).Add(float64(n))
}

// ListenerConnected implements pgevents.Observer.
func (m *Metrics) ListenerConnected(reconnect bool) {
	m.connects.WithLabelValues(m.group, m.topic).Inc()
	if reconnect {
		m.reconnects.WithLabelValues(m.group, m.topic).Inc()
	}
}
