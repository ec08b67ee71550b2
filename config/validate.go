package config

import (
	"cmp"
	"errors"
	"fmt"
	"net"
	"reflect"
	"slices"
	"strconv"
	"strings"

	"github.com/pgevents/pgevents"
	"github.com/pgevents/pgevents/schema"
	"github.com/pgevents/pgevents/sink"
)

// Values accepted by the enumerated keys that only the file has.
var (
	logLevels        = []string{"debug", "info", "warn", "error"}
	logFormats       = []string{"auto", "json", "console"}
	handlerTypes     = []string{handlerLog, handlerSQL, handlerKafka, handlerHTTP, handlerGo}
	offsetAllocation = []string{schema.AllocationCounter, schema.AllocationSequence}
	offsetScopes     = []string{schema.ScopeTopic, schema.ScopePartition, schema.ScopeSequenced}
)

// Handler types.
const (
	handlerLog   = "log"
	handlerSQL   = "sql"
	handlerKafka = "kafka"
	handlerHTTP  = "http"
	handlerGo    = "go"
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
//
// Each rule lives where its option is defined, and is checked here only
// through it: a group's consumer keys are mapped to a pgevents.Config and
// checked by pgevents.Config.Validate, a relay's keys are mapped to its
// Options and checked by their Validate, identifiers by
// schema.ValidIdentifier, partition counts by schema.ValidPartitions. What
// is left here is what only the file has: its own keys (databaseUrl,
// logging, the pool, the topic's retention, the metrics server), its
// encoding of the others (durations in milliseconds, partitionId -1, no 0
// for a value whose Go zero means the default), groups and handler types.
func (c *Config) problems() []*Error {
	var errs []*Error
	add := func(key, format string, args ...any) {
		errs = append(errs, &Error{Key: key, Msg: fmt.Sprintf(format, args...)})
	}
	oneOf := func(key, v string, allowed []string) {
		if !slices.Contains(allowed, v) {
			add(key, "must be one of %s, got %q", strings.Join(allowed, ", "), v)
		}
	}

	if c.DatabaseURL == "" {
		add("databaseUrl", "is required: set databaseUrl or the %s environment variable", envDatabaseURL)
	}
	if len(c.Groups) > 0 && c.GroupID != "" {
		add("groupId", "must not be set at the top level when groups lists the groups: set it in each group")
	}
	if len(c.Groups) > 0 && len(c.Handlers) > 0 {
		add(keyHandlers, "must not be set at the top level when groups lists the groups: set them in each group")
	}
	oneOf("logLevel", c.LogLevel, logLevels)
	oneOf("logFormat", c.LogFormat, logFormats)
	if c.MaxConns < 0 {
		add("maxConns", "must be 0 (automatic) or greater, got %d", c.MaxConns)
	}
	for key, v := range map[string]int{"statementTimeoutMs": c.StatementTimeoutMs, "idleInTransactionTimeoutMs": c.IdleInTransactionTimeoutMs} {
		if v < 0 || v > maxMillis {
			add(key, "must be 0 (the server's setting) or between 1 and %d, got %d", maxMillis, v)
		}
	}
	for _, d := range []struct {
		key, v   string
		optional bool
	}{{"retention", c.Retention, false}, {"maxRetention", c.MaxRetention, true}, {"zeroSubscriptionRetention", c.ZeroSubscriptionRetention, false},
		{"idempotencyWindow", c.IdempotencyWindow, false}} {
		if d.optional && d.v == "" {
			continue
		}
		if v, err := ParseDuration(d.v); err != nil || v <= 0 {
			add(d.key, "must be a positive duration such as \"36h\" or \"7d\", got %q", d.v)
		}
	}
	if c.SegmentSize < schema.MinSegmentSize {
		add("segmentSize", "must be at least %d, got %d", schema.MinSegmentSize, c.SegmentSize)
	}
	oneOf("offsetAllocation", c.OffsetAllocation, offsetAllocation)
	oneOf("offsetScope", c.OffsetScope, offsetScopes)
	if c.MetricsAddr != "" {
		if _, port, err := net.SplitHostPort(c.MetricsAddr); err != nil || port == "" {
			add("metricsAddr", "must be host:port or :port, got %q", c.MetricsAddr)
		}
	}
	if c.Pprof && c.MetricsAddr == "" {
		add("pprof", "needs metricsAddr, the server it is served on")
	}
	c.consoleProblems(add)
	c.kafkaProblems(add)
	c.tracingProblems(add)

	seen := map[string]int{}
	for i, g := range c.GroupConfigs() {
		m := &mapper{}
		cc := g.consumer(m, nil, nil)
		errs = append(errs, c.keyed(i, m.errs)...)
		errs = append(errs, c.keyed(i, c.consumerProblems(cc))...)
		errs = append(errs, c.keyed(i, g.handlerProblems())...)
		for _, d := range g.duplicateHandlers() {
			add(c.KeyPath(i, handlerKey(d[1], "eventType")), "duplicates %s %q: an event type or pattern has one handler",
				c.KeyPath(i, handlerKey(d[0], "eventType")), g.Handlers[d[0]].EventType)
		}
		if len(c.Groups) > 0 {
			id := g.GroupID + "\x00" + strconv.Itoa(g.TopicID)
			if first, dup := seen[id]; dup {
				add(c.KeyPath(i, "groupId"), "group %q of topic %d is already listed as groups[%d]", g.GroupID, g.TopicID, first)
			}
			seen[id] = i
		}
	}
	// In the file's field order, a key the groups share reported once.
	slices.SortStableFunc(errs, func(a, b *Error) int { return cmp.Compare(fieldRank(a.Key), fieldRank(b.Key)) })
	return slices.CompactFunc(errs, func(a, b *Error) bool { return a.Key == b.Key && a.Msg == b.Msg })
}

// consumerProblems returns what pgevents.Config.Validate finds in cc, the
// mapping of a group, under the file's keys. Handlers are left out: the
// file names them, the binary builds them, and NewConsumer reports a group
// without any (see ConsumerError).
func (c *Config) consumerProblems(cc pgevents.Config) []*Error {
	var errs []*Error
	for _, e := range configErrors(cc.Validate()) {
		if e.Field != "Handlers" {
			errs = append(errs, fieldError(e))
		}
	}
	return errs
}

// handlerProblems returns the problems of g's handlers, with keys relative
// to the group (handlers[1].topic).
func (g *Config) handlerProblems() []*Error {
	var errs []*Error
	for i := range g.Handlers {
		h := &g.Handlers[i]
		m := &mapper{prefix: handlerKey(i, "")}
		if h.EventType == "" {
			m.add("eventType", `is required: an event type, a prefix pattern such as "user.*", or "*" for every type`)
		} else if err := pgevents.ValidEventPattern(h.EventType); err != nil {
			m.add("eventType", "%v", err)
		}
		if !slices.Contains(handlerTypes, h.Type) {
			if h.Type == "" {
				m.add("type", "is required: one of %s", strings.Join(handlerTypes, ", "))
			} else {
				m.add("type", "must be one of %s, got %q", strings.Join(handlerTypes, ", "), h.Type)
			}
			errs = append(errs, m.errs...)
			continue
		}
		for _, k := range h.setKeys() {
			if !slices.Contains(handlerKeyTypes[k], h.Type) {
				m.add(k, "must be empty for type %s", h.Type)
			}
		}
		switch h.Type {
		case handlerSQL:
			if strings.TrimSpace(h.Statement) == "" {
				m.add("statement", "is required for type %s", handlerSQL)
			}
		case handlerGo:
			if h.Name == "" {
				m.add("name", "is required for type %s: the name the Go handler was registered under", handlerGo)
			}
		case handlerKafka:
			opts := h.kafkaOptions(m)
			m.relay(opts.Validate())
			if d := h.DeliveryTimeoutMs; d != 0 && d >= g.HandlerTimeoutMs {
				m.add("deliveryTimeoutMs", "must be less than handlerTimeoutMs (%d), which bounds the wait for a batch's records; got %d", g.HandlerTimeoutMs, d)
			}
		case handlerHTTP:
			m.relay(h.webhookOptions(m).Validate())
		}
		if h.TLS != nil {
			if err := h.TLS.Files().Validate(); err != nil {
				m.add("tls", "%s", strings.TrimPrefix(err.Error(), "tls: "))
			}
		}
		errs = append(errs, m.errs...)
	}
	return errs
}

// duplicateHandlers returns, for each handler of g whose eventType an
// earlier one has, the indexes of the first one and its own.
func (g *Config) duplicateHandlers() [][2]int {
	var dups [][2]int
	first := map[string]int{}
	for i, h := range g.Handlers {
		if h.EventType == "" {
			continue
		}
		if j, dup := first[h.EventType]; dup {
			dups = append(dups, [2]int{j, i})
			continue
		}
		first[h.EventType] = i
	}
	return dups
}

// handlerKey returns the key of handler i's key k, relative to its group
// ("handlers[1].eventType").
func handlerKey(i int, k string) string {
	return keyHandlers + "[" + strconv.Itoa(i) + "]." + k
}

// keyed returns errs, whose keys are relative to group i, with the keys of
// the file (see KeyPath).
func (c *Config) keyed(i int, errs []*Error) []*Error {
	for _, e := range errs {
		e.Key = c.KeyPath(i, e.Key)
	}
	return errs
}

// KeyPath returns the key of the file behind key of group i (in
// GroupConfigs order): "groups[1].batchSize" for a key that groups items
// set, the key itself for the others, which the groups share, and for a
// file without groups. databaseUrl and schema are the group's when its
// value differs from the top level's, the top level's otherwise.
func (c *Config) KeyPath(group int, key string) string {
	base, _, _ := strings.Cut(key, "[")
	base, _, _ = strings.Cut(base, ".")
	if len(c.Groups) == 0 || !slices.Contains(groupKeys, base) {
		return key
	}
	if group >= 0 && group < len(c.Groups) {
		switch base {
		case keyDatabaseURL:
			if !c.OwnDatabase(group) {
				return key
			}
		case keySchema:
			if c.Groups[group].Schema == c.Schema {
				return key
			}
		}
	}
	return keyGroups + "[" + strconv.Itoa(group) + "]." + key
}

// ConsumerError returns err, an error of pgevents.NewConsumer or of
// pgevents.Config.Validate for group i of the file (in GroupConfigs
// order), as an *Error naming the file's key behind the first
// *pgevents.ConfigError in it, with the message in the file's terms. Other
// errors are returned as they are.
func (c *Config) ConsumerError(group int, err error) error {
	errs := configErrors(err)
	if len(errs) == 0 {
		return err
	}
	e := fieldError(errs[0])
	e.Key = c.KeyPath(group, e.Key)
	e.err = err
	return e
}

// configErrors returns the *pgevents.ConfigError values in err, which may
// join several.
func configErrors(err error) []*pgevents.ConfigError {
	var out []*pgevents.ConfigError
	for _, e := range split(err) {
		var ce *pgevents.ConfigError
		if errors.As(e, &ce) {
			out = append(out, ce)
		}
	}
	return out
}

// split returns the errors err joins (errors.Join), or err alone.
func split(err error) []error {
	if joined, ok := err.(interface{ Unwrap() []error }); ok {
		return joined.Unwrap()
	}
	if err == nil {
		return nil
	}
	return []error{err}
}

// fieldError returns e as an *Error naming the file's key of its field,
// with the fields its message names spelled as the file's keys.
func fieldError(e *pgevents.ConfigError) *Error {
	return &Error{Key: fieldKeys[e.Field], Msg: fieldNames.Replace(e.Msg)}
}

// fieldKeys maps the pgevents.Config fields that the file sets to their
// keys; fieldNames rewrites the field names in a message as keys.
var (
	fieldKeys  = map[string]string{}
	fieldNames *strings.Replacer
)

func init() {
	var pairs []string
	for _, k := range consumerKeys {
		fieldKeys[k.field] = k.key
		pairs = append(pairs, k.field, k.key)
	}
	fieldNames = strings.NewReplacer(pairs...)
}

// fieldRank orders keys as the fields of Config: the first part of key,
// then what follows it.
var fieldRank = func() func(key string) int {
	rank := map[string]int{}
	t := reflect.TypeFor[Config]()
	for i := range t.NumField() {
		rank[t.Field(i).Tag.Get("yaml")] = i
	}
	return func(key string) int {
		base, _, _ := strings.Cut(key, "[")
		base, _, _ = strings.Cut(base, ".")
		if r, ok := rank[base]; ok {
			return r
		}
		return len(rank)
	}
}()

// relay adds the *sink.OptionError values in err, a relay's
// Options.Validate, under the handler's keys.
func (m *mapper) relay(err error) {
	for _, e := range split(err) {
		var oe *sink.OptionError
		if errors.As(e, &oe) {
			m.add(oe.Path(), "%s", oe.Msg)
		}
	}
}

// IsValidIdentifier reports whether s can be used unquoted as a PostgreSQL
// identifier, such as a LISTEN channel, and still mean exactly s: whether
// schema.ValidIdentifier, the one rule for identifiers, accepts it.
func IsValidIdentifier(s string) bool { return schema.ValidIdentifier(s) == nil }
