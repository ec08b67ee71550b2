package metrics

import (
	"context"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/pgevents/pgevents/schema"
)

// lagCollector reads the group's state from the database at scrape time
// (ReadState, one statement) and exposes it. A reading is reused for
// LagCacheTTL, and concurrent scrapes wait for the one reading in flight,
// so scrapes never multiply statements.
type lagCollector struct {
	db      schema.DB
	schema  string
	group   string
	topic   int
	lagCap  int64
	ttl     time.Duration
	timeout time.Duration

	lagEvents   *prometheus.Desc
	lagCapped   *prometheus.Desc
	lagSeconds  *prometheus.Desc
	nextOffset  *prometheus.Desc
	logEnd      *prometheus.Desc
	deadOpen    *prometheus.Desc
	halted      *prometheus.Desc
	queueUsage  *prometheus.Desc
	up          *prometheus.Desc
	duration    *prometheus.Desc
	lagCapGauge *prometheus.Desc
	partitions  *prometheus.Desc
	staged      *prometheus.Desc
	tickAge     *prometheus.Desc

	mu   sync.Mutex // held during a reading
	at   time.Time  // when the cached reading was taken; zero: none
	st   State
	err  error
	took time.Duration
}

func newLagCollector(opts Options) *lagCollector {
	c := &lagCollector{
		db:      opts.DB,
		schema:  opts.Schema,
		group:   opts.Group,
		topic:   opts.Topic,
		lagCap:  opts.LagCap,
		ttl:     opts.LagCacheTTL,
		timeout: opts.LagTimeout,
	}
	if c.lagCap <= 0 {
		c.lagCap = DefaultLagCap
	}
	if c.ttl <= 0 {
		c.ttl = DefaultLagCacheTTL
	}
	if c.timeout <= 0 {
		c.timeout = DefaultLagTimeout
	}
	gtp := []string{labelGroup, labelTopic, labelPartition}
	gt := prometheus.Labels{labelGroup: c.group, labelTopic: strconv.Itoa(c.topic)}
	c.lagEvents = prometheus.NewDesc("pgevents_consumer_lag_events",
		"Events at or after the group's next_offset in the partition, counted up to pgevents_consumer_lag_events_cap.", gtp, nil)
	c.lagCapped = prometheus.NewDesc("pgevents_consumer_lag_events_capped",
		"1 when pgevents_consumer_lag_events stopped counting at the cap (the lag is at least that), else 0.", gtp, nil)
	c.lagSeconds = prometheus.NewDesc("pgevents_consumer_lag_seconds",
		"Database clock minus created_at of the partition's first unhandled event; 0 when there is none.", gtp, nil)
	c.nextOffset = prometheus.NewDesc("pgevents_consumer_next_offset",
		"The group's position in the partition: the next offset it reads.", gtp, nil)
	c.logEnd = prometheus.NewDesc("pgevents_log_end_offset",
		"Highest offset in the partition (absent while the partition is empty).", gtp, nil)
	c.deadOpen = prometheus.NewDesc("pgevents_dead_letters_open",
		"Rows of dead_letter_queue for the group and partition: dead letters neither replayed nor discarded.", gtp, nil)
	c.halted = prometheus.NewDesc("pgevents_partition_halted",
		"1 while partition_halts has a row for the group and partition (the partition is stopped before a failing unit), else 0.", gtp, nil)
	c.queueUsage = prometheus.NewDesc("pgevents_notification_queue_usage",
		"pg_notification_queue_usage(): fraction of the server's notification queue in use (0 to 1).", nil, nil)
	c.lagCapGauge = prometheus.NewDesc("pgevents_consumer_lag_events_cap",
		"The cap on pgevents_consumer_lag_events.", nil, gt)
	c.partitions = prometheus.NewDesc("pgevents_topic_partitions",
		"The topic's partition count (log_counter.total_partitions).", nil, gt)
	c.staged = prometheus.NewDesc("pgevents_sequencer_staged_events",
		"Events committed in a sequenced topic's staging tables that no tick of its sequencer has moved into the log yet, counted up to pgevents_consumer_lag_events_cap (absent for a topic that is not sequenced).", nil, gt)
	c.tickAge = prometheus.NewDesc("pgevents_sequencer_last_tick_age_seconds",
		"Seconds since a tick of a sequenced topic's sequencer last moved events into the log (absent for a topic that is not sequenced).", nil, gt)
	c.up = prometheus.NewDesc("pgevents_lag_query_up",
		"1 when the last reading of the lag metrics from the database succeeded, else 0 (and the lag metrics are absent).", nil, gt)
	c.duration = prometheus.NewDesc("pgevents_lag_query_duration_seconds",
		"Duration of the last reading of the lag metrics from the database.", nil, gt)
	return c
}

// Describe implements prometheus.Collector.
func (c *lagCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.lagEvents, c.lagCapped, c.lagSeconds, c.nextOffset, c.logEnd,
		c.deadOpen, c.halted, c.queueUsage, c.lagCapGauge, c.partitions, c.staged, c.tickAge, c.up, c.duration} {
		ch <- d
	}
}

// read returns the cached reading, taking a new one when it is older than
// the TTL.
func (c *lagCollector) read() (State, time.Duration, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.at.IsZero() && time.Since(c.at) < c.ttl {
		return c.st, c.took, c.err
	}
	ctx, cancel := context.WithTimeout(schema.WithName(context.Background(), c.schema), c.timeout)
	defer cancel()
	start := time.Now()
	c.st, c.err = ReadState(ctx, c.db, c.group, c.topic, c.lagCap)
	c.took = time.Since(start)
	c.at = time.Now()
	return c.st, c.took, c.err
}

// Collect implements prometheus.Collector.
func (c *lagCollector) Collect(ch chan<- prometheus.Metric) {
	st, took, err := c.read()
	ch <- prometheus.MustNewConstMetric(c.duration, prometheus.GaugeValue, took.Seconds())
	ch <- prometheus.MustNewConstMetric(c.lagCapGauge, prometheus.GaugeValue, float64(c.lagCap))
	if err != nil {
		ch <- prometheus.MustNewConstMetric(c.up, prometheus.GaugeValue, 0)
		return
	}
	ch <- prometheus.MustNewConstMetric(c.up, prometheus.GaugeValue, 1)
	ch <- prometheus.MustNewConstMetric(c.queueUsage, prometheus.GaugeValue, st.NotificationQueueUsage)
	if st.TotalPartitions > 0 {
		ch <- prometheus.MustNewConstMetric(c.partitions, prometheus.GaugeValue, float64(st.TotalPartitions))
	}
	if sq := st.Sequencer; sq != nil {
		ch <- prometheus.MustNewConstMetric(c.staged, prometheus.GaugeValue, float64(sq.Staged))
		ch <- prometheus.MustNewConstMetric(c.tickAge, prometheus.GaugeValue, sq.LastTickSeconds)
	}
	topic := strconv.Itoa(c.topic)
	for i := range st.Partitions {
		p := &st.Partitions[i]
		if !p.HasPosition() {
			continue // no process of the group ever served it: no lag to speak of
		}
		lv := []string{p.Group, topic, strconv.Itoa(p.Partition)}
		gauge := func(d *prometheus.Desc, v float64) {
			ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, lv...)
		}
		gauge(c.lagEvents, float64(p.LagEvents))
		gauge(c.lagCapped, b2f(p.LagCapped))
		gauge(c.lagSeconds, p.LagSeconds)
		gauge(c.nextOffset, float64(*p.NextOffset))
		if p.LogEnd != nil {
			gauge(c.logEnd, float64(*p.LogEnd))
		}
		gauge(c.deadOpen, float64(p.DeadLettersOpen))
		gauge(c.halted, b2f(p.Halt != nil))
	}
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
