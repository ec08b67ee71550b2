package config

import (
	httpsink "github.com/pgevents/pgevents/sink/http"

	"fmt"
	"maps"
	"net"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/pgevents/pgevents"
	"github.com/pgevents/pgevents/internal/tmpl"
)

// Values accepted by the enumerated keys.
var (
	logLevels      = []string{"debug", "info", "warn", "error"}
	logFormats     = []string{"auto", "json", "console"}
	handlerTypes   = []string{handlerLog, handlerSQL, handlerKafka, handlerHTTP}
	saslMechanisms = []string{"PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"}
)

const (
	handlerLog   = "log"
	handlerSQL   = "sql"
	handlerKafka = "kafka"
	handlerHTTP  = "http"
	outputStdout = "stdout"
)

// Validate reports whether c holds a usable configuration. It returns nil or
// an [*Error] for the first problem found, in field order; Line and File are
// not set. Validate does not apply defaults or the DATABASE_URL override,
// so a Config built in Go should start from [Default].
func (c *Config) Validate() error {
	if problems := c.problems(); len(problems) > 0 {
		return problems[0]
	}
	return nil
}

// problems returns every validation problem of c, in field order.
func (c *Config) problems() []*Error {
	var errs []*Error
	add := func(key, format string, args ...any) {
		errs = append(errs, &Error{Key: key, Msg: fmt.Sprintf(format, args...)})
	}
	positive := func(key string, v int) {
		if v <= 0 {
			add(key, "must be greater than 0, got %d", v)
		}
	}
	positiveMillis := func(key string, v int) {
		switch {
		case v <= 0:
			add(key, "must be greater than 0, got %d", v)
		case v > maxMillis:
			add(key, "must be at most %d, got %d", maxMillis, v)
		}
	}
	oneOf := func(key, v string, allowed []string) {
		if !slices.Contains(allowed, v) {
			add(key, "must be one of %s, got %q", strings.Join(allowed, ", "), v)
		}
	}

	if c.DatabaseURL == "" {
		add("databaseUrl", "is required: set databaseUrl or the %s environment variable", envDatabaseURL)
	}
	if c.Schema != "" && (!IsValidIdentifier(c.Schema) || strings.HasPrefix(c.Schema, "pg_")) {
		add("schema", "must be a lowercase PostgreSQL identifier ([a-z_][a-z0-9_]*, at most %d bytes, not a reserved word, not starting with pg_), got %q",
			maxIdentifierLen, c.Schema)
	}
	switch {
	case len(c.Groups) > 0 && c.GroupID != "":
		add("groupId", "must not be set at the top level when groups lists the groups: set it in each group")
	case len(c.Groups) > 0:
	case strings.TrimSpace(c.GroupID) == "":
		add("groupId", "is required")
	case utf8.RuneCountInString(c.GroupID) > maxGroupIDLen:
		add("groupId", "must be at most %d characters long, got %d", maxGroupIDLen, utf8.RuneCountInString(c.GroupID))
	}
	positive("topicId", c.TopicID)
	positive("batchSize", c.BatchSize)
	totalOK := c.TotalPartitions >= 1 && c.TotalPartitions <= maxTotalPartitions
	if !totalOK {
		add("totalPartitions", "must be between 1 and %d, got %d", maxTotalPartitions, c.TotalPartitions)
	}
	if c.PartitionID != -1 && (c.PartitionID < 0 || (totalOK && c.PartitionID >= c.TotalPartitions)) {
		if totalOK {
			add("partitionId", "must be -1 (every partition) or between 0 and %d (totalPartitions - 1), got %d", c.TotalPartitions-1, c.PartitionID)
		} else {
			add("partitionId", "must be -1 (every partition) or at least 0, got %d", c.PartitionID)
		}
	}
	positiveMillis("waitPeriodMs", c.WaitPeriodMs)
	if c.Channel != "" && !IsValidIdentifier(c.Channel) {
		add("channel", "must be a lowercase PostgreSQL identifier ([a-z_][a-z0-9_]*, at most %d bytes, not a reserved word), got %q", maxIdentifierLen, c.Channel)
	}
	oneOf("logLevel", c.LogLevel, logLevels)
	oneOf("logFormat", c.LogFormat, logFormats)
	var unknown pgevents.UnknownEventPolicy
	if err := unknown.UnmarshalText([]byte(c.UnknownEventType)); err != nil {
		add("unknownEventType", "%v", err)
	}
	if c.MaxConns < 0 {
		add("maxConns", "must be 0 (automatic) or greater, got %d", c.MaxConns)
	}
	positiveMillis("shutdownTimeoutMs", c.ShutdownTimeoutMs)
	positiveMillis("retryInitialMs", c.RetryInitialMs)
	switch {
	case c.RetryMaxMs > maxMillis:
		add("retryMaxMs", "must be at most %d, got %d", maxMillis, c.RetryMaxMs)
	case c.RetryInitialMs > 0 && c.RetryMaxMs < c.RetryInitialMs:
		add("retryMaxMs", "must be at least retryInitialMs (%d), got %d", c.RetryInitialMs, c.RetryMaxMs)
	case c.RetryMaxMs <= 0:
		add("retryMaxMs", "must be greater than 0, got %d", c.RetryMaxMs)
	}
	positive("maxAttempts", c.MaxAttempts)
	var policy pgevents.FailurePolicy
	if err := policy.UnmarshalText([]byte(c.OnPermanentFailure)); err != nil {
		add("onPermanentFailure", "%v", err)
	}
	if c.MaxDeadLetterRate != -1 {
		positive("maxDeadLetterRate", c.MaxDeadLetterRate)
	}
	positiveMillis("deadLetterWindowMs", c.DeadLetterWindowMs)
	positiveMillis("handlerTimeoutMs", c.HandlerTimeoutMs)
	optionalMillis := func(key string, v int) {
		if v < 0 || v > maxMillis {
			add(key, "must be 0 (the server's setting) or between 1 and %d, got %d", maxMillis, v)
		}
	}
	optionalMillis("statementTimeoutMs", c.StatementTimeoutMs)
	optionalMillis("idleInTransactionTimeoutMs", c.IdleInTransactionTimeoutMs)
	if c.IdleInTransactionTimeoutMs > 0 && c.HandlerTimeoutMs >= c.IdleInTransactionTimeoutMs {
		add("handlerTimeoutMs", "must be shorter than idleInTransactionTimeoutMs (%d): a handler that runs no SQL for its whole budget "+
			"would have its batch's session ended by the server; got %d", c.IdleInTransactionTimeoutMs, c.HandlerTimeoutMs)
	}
	if _, err := pgevents.ParseStartPosition(c.StartFrom); err != nil {
		add("startFrom", "%v", err)
	}
	positiveMillis("deadAfterMs", c.DeadAfterMs)
	positiveMillis("maintenanceIntervalMs", c.MaintenanceIntervalMs)
	for _, d := range []struct {
		key, v   string
		optional bool
	}{{"retention", c.Retention, false}, {"maxRetention", c.MaxRetention, true}, {"zeroSubscriptionRetention", c.ZeroSubscriptionRetention, false}} {
		if d.optional && d.v == "" {
			continue
		}
		if v, err := ParseDuration(d.v); err != nil || v <= 0 {
			add(d.key, "must be a positive duration such as \"36h\" or \"7d\", got %q", d.v)
		}
	}
	oneOf("offsetAllocation", c.OffsetAllocation, []string{"counter", "sequence"})
	oneOf("offsetScope", c.OffsetScope, []string{"topic", "partition"})
	if c.SegmentSize < 1000 {
		add("segmentSize", "must be at least 1000, got %d", c.SegmentSize)
	}
	if c.LeaseMs < 100 || c.LeaseMs > maxMillis {
		add("leaseMs", "must be between 100 and %d, got %d", maxMillis, c.LeaseMs)
	}
	if c.MetricsAddr != "" {
		if _, port, err := net.SplitHostPort(c.MetricsAddr); err != nil || port == "" {
			add("metricsAddr", "must be host:port or :port, got %q", c.MetricsAddr)
		}
	}
	if c.Pprof && c.MetricsAddr == "" {
		add("pprof", "needs metricsAddr, the server it is served on")
	}
	c.consoleProblems(add)

	if len(c.Groups) > 0 && len(c.Handlers) > 0 {
		add(keyHandlers, "must not be set at the top level when groups lists the groups: set them in each group")
	}
	seen := map[string]int{}
	for i := range c.Groups {
		g := &c.Groups[i]
		prefix := keyGroups + "[" + strconv.Itoa(i) + "]."
		for _, e := range g.problems() {
			base, _, _ := strings.Cut(e.Key, "[")
			if slices.Contains(groupKeys, base) {
				e.Key = prefix + e.Key
				errs = append(errs, e)
			}
		}
		id := g.GroupID + "\x00" + strconv.Itoa(g.TopicID)
		if first, dup := seen[id]; dup {
			add(prefix+"groupId", "group %q of topic %d is already listed as groups[%d]", g.GroupID, g.TopicID, first)
		}
		seen[id] = i
	}
	for i := range c.Handlers {
		h := &c.Handlers[i]
		path := keyHandlers + "[" + strconv.Itoa(i) + "]."
		if h.EventType == "" {
			add(path+"eventType", `is required: an event type, or "*" for every type`)
		}
		switch h.Type {
		case "":
			add(path+"type", "is required: one of %s", strings.Join(handlerTypes, ", "))
			continue
		case handlerLog, handlerSQL, handlerKafka, handlerHTTP:
		default:
			add(path+"type", "must be one of %s, got %q", strings.Join(handlerTypes, ", "), h.Type)
			continue
		}
		for _, k := range h.setKeys() {
			if !slices.Contains(handlerKeyTypes[k], h.Type) {
				add(path+k, "must be empty for type %s", h.Type)
			}
		}
		switch h.Type {
		case handlerSQL:
			if strings.TrimSpace(h.Statement) == "" {
				add(path+"statement", "is required for type %s", handlerSQL)
			}
		case handlerKafka:
			h.kafkaProblems(path, c.HandlerTimeoutMs, add)
		case handlerHTTP:
			h.httpProblems(path, add)
		}
	}
	return errs
}

// kafkaProblems adds the problems of a kafka handler at key path.
func (h *Handler) kafkaProblems(path string, handlerTimeoutMs int, add func(key, format string, args ...any)) {
	if len(h.Brokers) == 0 {
		add(path+"brokers", "is required: a list of the brokers to bootstrap from, host:port")
	}
	for i, b := range h.Brokers {
		if host, port, err := net.SplitHostPort(b); err != nil || host == "" || port == "" {
			add(fmt.Sprintf("%sbrokers[%d]", path, i), "must be host:port, got %q", b)
		}
	}
	if h.Topic == "" {
		add(path+"topic", `is required: a topic, or a template such as "portal.{event_type}"`)
	} else if _, err := tmpl.Parse(h.Topic); err != nil {
		add(path+"topic", "%v", err)
	}
	if h.Key != "" {
		if _, err := tmpl.ParseKey(h.Key); err != nil {
			add(path+"key", "%v", err)
		}
	}
	if h.Format != "" && h.Format != "raw" && h.Format != "cloudevents" {
		add(path+"format", "must be raw or cloudevents for type kafka, got %q", h.Format)
	}
	h.TLS.problems(path, add)
	if s := h.SASL; s != nil {
		if !slices.Contains(saslMechanisms, s.Mechanism) {
			add(path+"sasl.mechanism", "must be one of %s, got %q", strings.Join(saslMechanisms, ", "), s.Mechanism)
		}
		if s.User == "" {
			add(path+"sasl.user", "is required")
		}
		if s.Password == "" {
			add(path+"sasl.password", "is required (it may be ${AN_ENVIRONMENT_VARIABLE})")
		}
	}
	switch d := h.DeliveryTimeoutMs; {
	case d == 0:
	case d < 1000 || d > maxMillis:
		add(path+"deliveryTimeoutMs", "must be at least 1000, got %d", d)
	case d >= handlerTimeoutMs:
		add(path+"deliveryTimeoutMs", "must be less than handlerTimeoutMs (%d), which bounds the wait for a batch's records; got %d", handlerTimeoutMs, d)
	}
	if n := h.MaxRecordBytes; n != 0 && (n < 512 || n > 1<<30) {
		add(path+"maxRecordBytes", "must be between 512 and %d, got %d", 1<<30, n)
	}
}

// httpProblems adds the problems of an http handler at key path.
func (h *Handler) httpProblems(path string, add func(key, format string, args ...any)) {
	if h.URL == "" {
		add(path+"url", "is required: the endpoint, http:// or https://")
	} else if err := httpsink.ValidURL(h.URL); err != nil {
		add(path+"url", "%v", err)
	}
	if h.Method != "" && !httpsink.IsToken(h.Method) {
		add(path+"method", "must be an HTTP method, got %q", h.Method)
	}
	for _, name := range slices.Sorted(maps.Keys(h.Headers)) {
		switch {
		case !httpsink.IsToken(name) || strings.ContainsAny(h.Headers[name], "\r\n"):
			add(path+"headers."+name, "is not a valid header")
		case strings.EqualFold(name, "Idempotency-Key"):
			add(path+"headers."+name, "is set by the relay: the event_id")
		}
	}
	if h.Format != "" && h.Format != "json" && h.Format != "cloudevents" {
		add(path+"format", "must be json or cloudevents for type http, got %q", h.Format)
	}
	if h.TimeoutMs < 0 || h.TimeoutMs > maxMillis {
		add(path+"timeoutMs", "must be positive, got %d", h.TimeoutMs)
	}
	if h.Concurrency < 0 {
		add(path+"concurrency", "must be positive, got %d", h.Concurrency)
	}
	h.TLS.problems(path, add)
}

// problems adds the problems of a relay's tls key at path.
func (t *TLS) problems(path string, add func(key, format string, args ...any)) {
	if t != nil && (t.CertFile == "") != (t.KeyFile == "") {
		add(path+"tls", "certFile and keyFile go together")
	}
}

// IsValidIdentifier reports whether s can be used unquoted as a PostgreSQL
// identifier, such as a LISTEN channel, and still mean exactly s: it
// matches [a-z_][a-z0-9_]*, is at most 63 bytes long (longer names are
// truncated by the server), and is not a reserved key word.
func IsValidIdentifier(s string) bool {
	if s == "" || len(s) > maxIdentifierLen {
		return false
	}
	for i := 0; i < len(s); i++ {
		ch := s[i]
		switch {
		case ch == '_' || ('a' <= ch && ch <= 'z'):
		case i > 0 && '0' <= ch && ch <= '9':
		default:
			return false
		}
	}
	_, reserved := reservedWords[s]
	return !reserved
}

// reservedWords holds the PostgreSQL key words that cannot be used as an
// unquoted column name or channel: the "reserved" and "reserved (can be
// function or type)" categories.
var reservedWords = func() map[string]struct{} {
	words := strings.Fields(`
		all analyse analyze and any array as asc asymmetric authorization
		binary both case cast check collate collation column concurrently
		constraint create cross current_catalog current_date current_role
		current_schema current_time current_timestamp current_user default
		deferrable desc distinct do else end except false fetch for foreign
		freeze from full grant group having ilike in initially inner
		intersect into is isnull join lateral leading left like limit
		localtime localtimestamp natural not notnull null offset on only or
		order outer overlaps placing primary references returning right
		select session_user similar some symmetric system_user table
		tablesample then to trailing true union unique user using variadic
		verbose when where window with`)
	m := make(map[string]struct{}, len(words))
	for _, w := range words {
		m[w] = struct{}{}
	}
	return m
}()
