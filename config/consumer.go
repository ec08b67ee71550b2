package config

import (
	"fmt"
	"math"
	"reflect"
	"time"

	"github.com/rs/zerolog"

	"github.com/pgevents/pgevents"
	"github.com/pgevents/pgevents/sink"
	"github.com/pgevents/pgevents/sink/kafkasink"
	"github.com/pgevents/pgevents/sink/webhook"
)

// consumerKeys are the keys of the file that are fields of pgevents.Config,
// in the order of Config's fields: the key, the field (as a
// *pgevents.ConfigError names it), and whether the field's zero value
// means its default. The file refuses a 0 for those: there, leaving the
// key out is how to get the default, and a 0 would be taken for it
// silently.
var consumerKeys = []struct {
	key, field  string
	zeroDefault bool
}{
	{"schema", "Schema", false},
	{"groupId", "GroupID", false},
	{"topicId", "TopicID", true},
	{"batchSize", "BatchSize", true},
	{"totalPartitions", "TotalPartitions", false},
	{"partitionId", "Partitions", false},
	{"waitPeriodMs", "WaitPeriod", true},
	{"channel", "Channel", false},
	{"unknownEventType", "UnknownEventType", false},
	{"shutdownTimeoutMs", "ShutdownTimeout", true},
	{"retryInitialMs", "RetryInitial", true},
	{"retryMaxMs", "RetryMax", true},
	{"maxAttempts", "MaxAttempts", true},
	{"onPermanentFailure", "OnPermanentFailure", false},
	{"maxDeadLetterRate", "MaxDeadLetters", true},
	{"deadLetterWindowMs", "DeadLetterWindow", true},
	{"handlerTimeoutMs", "HandlerTimeout", true},
	{"startFrom", "StartFrom", true},
	{"deadAfterMs", "DeadAfter", true},
	{"maintenanceIntervalMs", "MaintenanceInterval", true},
	{"leaseMs", "LeaseDuration", true},
	{"handlers", "Handlers", false},
}

// mapper collects the problems of the file's encoding of options (a 0
// where it would mean the default, milliseconds that do not fit in a
// duration), under keys that start with prefix.
type mapper struct {
	prefix string
	errs   []*Error
}

func (m *mapper) add(key, format string, args ...any) {
	m.errs = append(m.errs, &Error{Key: m.prefix + key, Msg: fmt.Sprintf(format, args...)})
}

// duration returns ms milliseconds as a duration; when that does not fit
// in one it adds a problem for key and returns the longest duration.
func (m *mapper) duration(key string, ms int) time.Duration {
	if ms > maxMillis || ms < -maxMillis {
		m.add(key, "must be at most %d, got %d", maxMillis, ms)
		return math.MaxInt64
	}
	return millis(ms)
}

// Consumer returns the pgevents.Config of a group of the file (one of
// GroupConfigs, validated), with handlers and logger. It is the one place
// where the file's keys become a consumer's configuration; validation
// checks the same mapping with pgevents.Config.Validate.
func (c *Config) Consumer(handlers *pgevents.Handlers, logger *zerolog.Logger) pgevents.Config {
	return c.consumer(&mapper{}, handlers, logger)
}

// consumer maps c to a pgevents.Config, adding the problems of the file's
// encoding of it to m.
func (c *Config) consumer(m *mapper, handlers *pgevents.Handlers, logger *zerolog.Logger) pgevents.Config {
	var parts []int
	switch {
	case c.PartitionID >= 0:
		parts = []int{c.PartitionID}
	case c.PartitionID < -1:
		m.add("partitionId", "must be -1 (every partition) or a partition, 0 to totalPartitions - 1, got %d", c.PartitionID)
	}
	var unknown pgevents.UnknownEventPolicy
	if err := unknown.UnmarshalText([]byte(c.UnknownEventType)); err != nil {
		m.add("unknownEventType", "%v", err)
	}
	var policy pgevents.FailurePolicy
	if err := policy.UnmarshalText([]byte(c.OnPermanentFailure)); err != nil {
		m.add("onPermanentFailure", "%v", err)
	}
	cc := pgevents.Config{
		GroupID:             c.GroupID,
		TopicID:             c.TopicID,
		TotalPartitions:     c.TotalPartitions,
		Partitions:          parts,
		LeaseDuration:       m.duration("leaseMs", c.LeaseMs),
		BatchSize:           c.BatchSize,
		WaitPeriod:          m.duration("waitPeriodMs", c.WaitPeriodMs),
		Channel:             c.Channel,
		UnknownEventType:    unknown,
		RetryInitial:        m.duration("retryInitialMs", c.RetryInitialMs),
		RetryMax:            m.duration("retryMaxMs", c.RetryMaxMs),
		MaxAttempts:         c.MaxAttempts,
		OnPermanentFailure:  policy,
		MaxDeadLetters:      c.MaxDeadLetterRate,
		DeadLetterWindow:    m.duration("deadLetterWindowMs", c.DeadLetterWindowMs),
		HandlerTimeout:      m.duration("handlerTimeoutMs", c.HandlerTimeoutMs),
		ShutdownTimeout:     m.duration("shutdownTimeoutMs", c.ShutdownTimeoutMs),
		Handlers:            handlers,
		Logger:              logger,
		StartFrom:           c.StartFrom,
		DeadAfter:           m.duration("deadAfterMs", c.DeadAfterMs),
		MaintenanceInterval: m.duration("maintenanceIntervalMs", c.MaintenanceIntervalMs),
		Schema:              c.Schema,
	}
	v := reflect.ValueOf(cc)
	for _, k := range consumerKeys {
		if f := v.FieldByName(k.field); k.zeroDefault && f.IsZero() {
			if f.Kind() == reflect.String {
				m.add(k.key, "must not be empty")
			} else {
				m.add(k.key, "must be greater than 0, got 0")
			}
		}
	}
	return cc
}

// PoolOptions returns the session timeouts of the file's consumer pool:
// statementTimeoutMs and idleInTransactionTimeoutMs, where 0 leaves the
// server's setting.
func (c *Config) PoolOptions() pgevents.PoolOptions {
	timeout := func(ms int) time.Duration {
		if ms == 0 {
			return pgevents.ServerSetting
		}
		return millis(ms)
	}
	return pgevents.PoolOptions{
		StatementTimeout:         timeout(c.StatementTimeoutMs),
		IdleInTransactionTimeout: timeout(c.IdleInTransactionTimeoutMs),
	}
}

// PoolSize returns the connections the file's consumers need in the pool
// they share: maxConns when set, otherwise pgevents.PoolSize of the
// partitions each group serves, summed over the groups. Groups on several
// databases have a pool per database: see [Config.Databases].
func (c *Config) PoolSize() int {
	if c.MaxConns > 0 {
		return c.MaxConns
	}
	n := 0
	for _, g := range c.GroupConfigs() {
		n += g.groupPoolSize()
	}
	return n
}

// groupPoolSize returns the connections the consumer of group g needs:
// pgevents.PoolSize of the partitions it serves.
func (g *Config) groupPoolSize() int {
	if g.PartitionID >= 0 {
		return pgevents.PoolSize(1)
	}
	return pgevents.PoolSize(g.TotalPartitions)
}

// KafkaOptions returns the options of the relay a handler of type kafka
// configures, as the file sets them: the one place where its keys become
// kafkasink.Options, whose Validate validation reports under the handler's
// keys. The caller adds TLS (from TLS.Files), Metrics and ClientOptions.
func (h *Handler) KafkaOptions() kafkasink.Options { return h.kafkaOptions(&mapper{}) }

func (h *Handler) kafkaOptions(m *mapper) kafkasink.Options {
	o := kafkasink.Options{Name: h.Name, Brokers: h.Brokers, Topic: h.Topic, Key: h.Key, Format: kafkasink.Format(h.Format),
		Source: h.Source, DeliveryTimeout: m.duration("deliveryTimeoutMs", h.DeliveryTimeoutMs), MaxRecordBytes: h.MaxRecordBytes}
	if s := h.SASL; s != nil {
		o.SASL = &kafkasink.SASL{Mechanism: s.Mechanism, User: s.User, Password: s.Password}
	}
	return o
}

// WebhookOptions returns the options of the relay a handler of type http
// configures, as the file sets them: the one place where its keys become
// webhook.Options, whose Validate validation reports under the handler's
// keys. The caller adds TLS (from TLS.Files) and Metrics.
func (h *Handler) WebhookOptions() webhook.Options { return h.webhookOptions(&mapper{}) }

func (h *Handler) webhookOptions(m *mapper) webhook.Options {
	return webhook.Options{Name: h.Name, URL: h.URL, Method: h.Method, Headers: h.Headers,
		Timeout: m.duration("timeoutMs", h.TimeoutMs), Format: webhook.Format(h.Format), Source: h.Source,
		Concurrency: h.Concurrency}
}

// Files returns the PEM files t names, as the relays load them.
func (t *TLS) Files() sink.TLSFiles {
	return sink.TLSFiles{CAFile: t.CAFile, CertFile: t.CertFile, KeyFile: t.KeyFile}
}
