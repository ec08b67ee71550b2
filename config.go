package pgevents

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/rs/zerolog"
	"go.opentelemetry.io/otel/trace"

	"github.com/pgevents/pgevents/internal/store"
	"github.com/pgevents/pgevents/partition"
	"github.com/pgevents/pgevents/schema"
)

// The defaults of Config, which WithDefaults gives its zero fields. The
// YAML configuration (package config) reads the same constants, and the
// README's configuration reference states them (a test checks it).
const (
	DefaultBatchSize           = 100
	DefaultWaitPeriod          = 10 * time.Second
	DefaultRetryInitial        = 100 * time.Millisecond
	DefaultRetryMax            = 30 * time.Second
	DefaultMaxAttempts         = 5
	DefaultMaxDeadLetters      = 100
	DefaultDeadLetterWindow    = time.Minute
	DefaultHandlerTimeout      = 30 * time.Second
	DefaultShutdownTimeout     = 10 * time.Second
	DefaultLeaseDuration       = time.Second
	DefaultStartFrom           = "earliest"
	DefaultDeadAfter           = time.Minute
	DefaultMaintenanceInterval = 10 * time.Second
)

// UnknownEventPolicy says what a consumer does with an event whose type has
// no handler and no catch-all.
type UnknownEventPolicy int

const (
	// UnknownEventFail treats the event as a permanent failure: its unit is
	// dead-lettered with ErrUnknownEventType. It is the default, because a
	// handler missing from a deploy should be loud, not silent.
	UnknownEventFail UnknownEventPolicy = iota
	// UnknownEventSkip passes over the event as handled.
	UnknownEventSkip
)

// unknownEventNames are the configuration names of the unknown-event
// policies, in the order of their values.
var unknownEventNames = []string{"fail", "skip"}

// String returns the policy's configuration name: "fail" or "skip".
func (p UnknownEventPolicy) String() string {
	return nameOf(unknownEventNames, int(p), "UnknownEventPolicy")
}

// MarshalText returns the policy's configuration name.
func (p UnknownEventPolicy) MarshalText() ([]byte, error) {
	return marshalName(unknownEventNames, int(p), "UnknownEventPolicy")
}

// UnmarshalText sets the policy from its configuration name.
func (p *UnknownEventPolicy) UnmarshalText(text []byte) error {
	i, err := lookupName(unknownEventNames, string(text))
	*p = UnknownEventPolicy(i)
	return err
}

// nameOf returns names[i], or the type and number of a value out of range.
func nameOf(names []string, i int, typ string) string {
	if i < 0 || i >= len(names) {
		return fmt.Sprintf("%s(%d)", typ, i)
	}
	return names[i]
}

// marshalName returns names[i] as text, or an error for a value out of
// range.
func marshalName(names []string, i int, typ string) ([]byte, error) {
	if i < 0 || i >= len(names) {
		return nil, fmt.Errorf("pgevents: %s(%d) has no name", typ, i)
	}
	return []byte(names[i]), nil
}

// lookupName returns the index of name in names, or an error that lists
// them.
func lookupName(names []string, name string) (int, error) {
	if i := slices.Index(names, name); i >= 0 {
		return i, nil
	}
	return 0, fmt.Errorf("must be one of %s, got %q", strings.Join(names, ", "), name)
}

// FailurePolicy says what a consumer does with a unit that failed
// permanently.
type FailurePolicy int

const (
	// PolicyDeadLetter records the unit in dead_letter_queue, with its
	// events and the reason, and moves on. It is the default.
	PolicyDeadLetter FailurePolicy = iota
	// PolicyParkHost dead-letters the unit and parks its hosts: their later
	// events are recorded in parked_events, not handled, until the dead
	// letter is replayed or discarded (consumer dlq), so a host's order is
	// never broken while other hosts flow.
	PolicyParkHost
	// PolicyHalt stops the partition before the unit, records why in
	// partition_halts, and logs it at error level until the process is
	// restarted, or until an operator removes the record (offsets.Unhalt:
	// consumer group unhalt, the console's unhalt; or an offsets reset that
	// moves the partition past it): the worker then tries the unit again
	// (after a reset, from the new position).
	PolicyHalt
)

// policyNames are the configuration names of the failure policies, in
// the order of their values.
var policyNames = []string{"deadLetter", "parkHost", "halt"}

// String returns the policy's configuration name: "deadLetter", "parkHost"
// or "halt".
func (p FailurePolicy) String() string { return nameOf(policyNames, int(p), "FailurePolicy") }

// MarshalText returns the policy's configuration name.
func (p FailurePolicy) MarshalText() ([]byte, error) {
	return marshalName(policyNames, int(p), "FailurePolicy")
}

// UnmarshalText sets the policy from its configuration name.
func (p *FailurePolicy) UnmarshalText(text []byte) error {
	i, err := lookupName(policyNames, string(text))
	*p = FailurePolicy(i)
	return err
}

// Config configures a Consumer. A zero field takes its default (the
// Default constants; WithDefaults applies them), NewConsumer validates the
// result once, and the consumer trusts it after. The YAML file of `consumer
// run` (package config) mirrors these fields and reads the same constants.
type Config struct {
	// GroupID names the consumer group; required, at most
	// MaxGroupIDLength (200) characters. Each group has its own position in
	// every partition.
	GroupID string
	// TopicID is the topic consumed; default DefaultTopic (1).
	TopicID int
	// TotalPartitions is the partition count the consumer expects;
	// required, 1 to schema.MaxPartitions (1024).
	// Run refuses to start (PartitionMismatchError) when the topic records
	// another count, because hosts would map to other partitions.
	TotalPartitions int
	// Partitions lists the partitions this process serves (static mode):
	// it takes their leases when they are free and otherwise waits as a hot
	// standby. Nil means auto mode: the live replicas of the group share all
	// partitions evenly, taking over those of a replica that dies within
	// about LeaseDuration.
	Partitions []int
	// ReplicaID names this process among the group's replicas; default a
	// new id from host name and process id.
	ReplicaID string
	// LeaseDuration is how long a partition lease lives without a heartbeat
	// (sent every third of it), and so how soon a dead or frozen replica's
	// partitions are taken over; default DefaultLeaseDuration (1 s), at
	// least MinLeaseDuration (100 ms).
	LeaseDuration time.Duration
	// BatchSize is the number of events read per batch, before extension
	// to the end of a producer transaction; default DefaultBatchSize (100).
	BatchSize int
	// WaitPeriod is how often every partition is polled for events whose
	// notification was lost; default DefaultWaitPeriod (10 s).
	WaitPeriod time.Duration
	// Channel is the notification channel the consumer listens on. Default
	// "": the topic's (recorded when the topic was created, see
	// schema.ChannelFor, and changed by schema.SetChannel). When set, it must
	// be the topic's: Run refuses to start otherwise
	// (*ChannelMismatchError). It must be an identifier
	// (schema.ValidIdentifier). A running consumer follows a change of the
	// topic's channel either way.
	Channel string
	// UnknownEventType is the policy for events without a handler; default
	// UnknownEventFail.
	UnknownEventType UnknownEventPolicy
	// RetryInitial is the first backoff after a failed batch; default
	// DefaultRetryInitial (100 ms).
	RetryInitial time.Duration
	// RetryMax caps the backoff; at least RetryInitial. Default
	// DefaultRetryMax (30 s), or RetryInitial when that is longer.
	RetryMax time.Duration
	// MaxAttempts is how often a failure of class ClassUnknown, or a
	// timeout of a unit run alone (HandlerTimeout, or a handler's statement
	// cancelled by the server's statement_timeout or lock_timeout), is
	// retried before it is treated as permanent; default
	// DefaultMaxAttempts (5).
	MaxAttempts int
	// OnPermanentFailure is the policy for units that fail permanently;
	// default PolicyDeadLetter.
	OnPermanentFailure FailurePolicy
	// MaxDeadLetters is the circuit breaker against a bad deploy: when a
	// partition has dead-lettered this many units within DeadLetterWindow,
	// the next permanent failure halts it instead. Default
	// DefaultMaxDeadLetters (100); negative disables the breaker.
	MaxDeadLetters int
	// DeadLetterWindow is the breaker's window; default
	// DefaultDeadLetterWindow (1 minute).
	DeadLetterWindow time.Duration
	// HandlerTimeout bounds the handling of one unit, per BatchSize events
	// (a unit of 3×BatchSize events gets three times as long); default
	// DefaultHandlerTimeout (30 s).
	// Running out is a timeout of the unit: the batch is narrowed to the
	// unit, which then runs alone, where MaxAttempts applies. A handler's
	// statement cancelled by the server's statement_timeout or
	// lock_timeout is the same failure.
	HandlerTimeout time.Duration
	// ShutdownTimeout bounds how long an in-flight batch may go on after
	// Run's context is cancelled before it is cancelled too (and rolled
	// back); default DefaultShutdownTimeout (10 s).
	ShutdownTimeout time.Duration
	// Handlers maps event types to handlers; required, at least one.
	Handlers *Handlers
	// Logger receives the consumer's logs; default: discard.
	Logger *zerolog.Logger
	// Observer receives what the consumer does, for metrics; default none.
	Observer Observer
	// TracerProvider, when set, traces the consumer with OpenTelemetry: a
	// span per batch and one per handler call, linked to the producers'
	// spans (see Append). Default nil: no tracing, at no cost.
	TracerProvider trace.TracerProvider
	// StartFrom is where the group starts the first time it runs:
	// "earliest" (DefaultStartFrom: the first retained event, so that a new
	// projection sees the history), "latest", "offset:N" or
	// "time:<RFC 3339>" (see ParseStartPosition). It has no effect once the
	// group has positions.
	StartFrom string
	// DeadAfter is how long the group may go without a live replica before
	// its subscription becomes DEAD and stops holding back retention;
	// default DefaultDeadAfter (1 minute).
	DeadAfter time.Duration
	// MaintenanceInterval is how often this process (one at a time per
	// topic) creates the log's next segments, marks dead subscriptions and
	// applies retention; default DefaultMaintenanceInterval (10 s).
	MaintenanceInterval time.Duration
	// Schema is the schema pgevents lives in (where `consumer migrate`
	// with the same schema created it): every statement of the consumer
	// names pgevents' objects in it, so that handlers, which run on the
	// consumer's connections, still see the application's tables through
	// the search_path. Default "": the first schema of the search_path.
	Schema string
}

// WithDefaults returns c with every zero field set to its default (the
// Default constants; a zero RetryMax is DefaultRetryMax, or RetryInitial
// when that is longer). ReplicaID and Observer are set by NewConsumer.
func (c Config) WithDefaults() Config {
	c.TopicID = cmp.Or(c.TopicID, DefaultTopic)
	c.BatchSize = cmp.Or(c.BatchSize, DefaultBatchSize)
	c.WaitPeriod = cmp.Or(c.WaitPeriod, DefaultWaitPeriod)
	c.RetryInitial = cmp.Or(c.RetryInitial, DefaultRetryInitial)
	c.RetryMax = cmp.Or(c.RetryMax, max(DefaultRetryMax, c.RetryInitial))
	c.MaxAttempts = cmp.Or(c.MaxAttempts, DefaultMaxAttempts)
	c.MaxDeadLetters = cmp.Or(c.MaxDeadLetters, DefaultMaxDeadLetters)
	c.DeadLetterWindow = cmp.Or(c.DeadLetterWindow, DefaultDeadLetterWindow)
	c.HandlerTimeout = cmp.Or(c.HandlerTimeout, DefaultHandlerTimeout)
	c.ShutdownTimeout = cmp.Or(c.ShutdownTimeout, DefaultShutdownTimeout)
	c.LeaseDuration = cmp.Or(c.LeaseDuration, DefaultLeaseDuration)
	c.StartFrom = cmp.Or(c.StartFrom, DefaultStartFrom)
	c.DeadAfter = cmp.Or(c.DeadAfter, DefaultDeadAfter)
	c.MaintenanceInterval = cmp.Or(c.MaintenanceInterval, DefaultMaintenanceInterval)
	return c
}

// Limits of Config's fields.
const (
	// MaxGroupIDLength is the longest GroupID, in characters.
	MaxGroupIDLength = 200
	// MinLeaseDuration is the shortest LeaseDuration.
	MinLeaseDuration = 100 * time.Millisecond
)

// ConfigError is returned by NewConsumer for a Config field whose value
// cannot be used; Field is the field's name.
type ConfigError struct {
	// Field names the Config field, as it is spelled in Go.
	Field string
	// Msg says what is wrong with its value.
	Msg string
}

// Error names the field and what is wrong with it.
func (e *ConfigError) Error() string { return "pgevents: Config." + e.Field + " " + e.Msg }

// Validate reports every field of c that NewConsumer would refuse once its
// defaults are applied (WithDefaults): nil when c is usable, otherwise the
// errors.Join of a *ConfigError per field at fault, in field order
// (errors.As finds the first). These are the only rules of a consumer's
// configuration: the YAML file of `consumer run` (package config) maps to
// a Config and reports what Validate finds under its own key names.
func (c Config) Validate() error {
	var errs []error
	d := c.WithDefaults()
	for _, e := range d.problems() {
		errs = append(errs, e)
	}
	return errors.Join(errs...)
}

// validate checks a Config with its defaults applied and returns a
// *ConfigError for the first field that is not usable.
func (c *Config) validate() error {
	if problems := c.problems(); len(problems) > 0 {
		return problems[0]
	}
	return nil
}

// problems returns a *ConfigError for each field of c, a Config with its
// defaults applied, that is not usable, in field order.
func (c *Config) problems() []*ConfigError {
	var errs []*ConfigError
	bad := func(field, format string, args ...any) {
		errs = append(errs, &ConfigError{Field: field, Msg: fmt.Sprintf(format, args...)})
	}
	positive := func(field string, v int64, show any) {
		if v <= 0 {
			bad(field, "must be greater than 0, got %v", show)
		}
	}
	switch n := utf8.RuneCountInString(c.GroupID); {
	case strings.TrimSpace(c.GroupID) == "":
		bad("GroupID", "is required")
	case n > MaxGroupIDLength:
		bad("GroupID", "must be at most %d characters long, got %d", MaxGroupIDLength, n)
	}
	positive("TopicID", int64(c.TopicID), c.TopicID)
	totalOK := schema.ValidPartitions(c.TotalPartitions) == nil
	if !totalOK {
		bad("TotalPartitions", "%v", schema.ValidPartitions(c.TotalPartitions))
	}
	if c.Partitions != nil && totalOK {
		if _, err := partition.Assign(c.TotalPartitions, c.Partitions); err != nil {
			bad("Partitions", "must hold partitions between 0 and %d (TotalPartitions - 1), got %v", c.TotalPartitions-1, c.Partitions)
		}
	}
	if c.LeaseDuration < MinLeaseDuration {
		bad("LeaseDuration", "must be at least %s (leases between %s and a few seconds hand a dead replica's partitions over quickly), got %s",
			MinLeaseDuration, MinLeaseDuration, c.LeaseDuration)
	}
	positive("BatchSize", int64(c.BatchSize), c.BatchSize)
	positive("WaitPeriod", int64(c.WaitPeriod), c.WaitPeriod)
	if c.Channel != "" {
		if err := schema.ValidIdentifier(c.Channel); err != nil {
			bad("Channel", "%v", err)
		}
	}
	if c.UnknownEventType < 0 || int(c.UnknownEventType) >= len(unknownEventNames) {
		bad("UnknownEventType", "is not a policy: %d", int(c.UnknownEventType))
	}
	positive("RetryInitial", int64(c.RetryInitial), c.RetryInitial)
	if c.RetryInitial > 0 && c.RetryMax < c.RetryInitial {
		bad("RetryMax", "must be at least RetryInitial (%s), got %s", c.RetryInitial, c.RetryMax)
	}
	positive("MaxAttempts", int64(c.MaxAttempts), c.MaxAttempts)
	if c.OnPermanentFailure < 0 || int(c.OnPermanentFailure) >= len(policyNames) {
		bad("OnPermanentFailure", "is not a policy: %d", int(c.OnPermanentFailure))
	}
	positive("DeadLetterWindow", int64(c.DeadLetterWindow), c.DeadLetterWindow)
	positive("HandlerTimeout", int64(c.HandlerTimeout), c.HandlerTimeout)
	positive("ShutdownTimeout", int64(c.ShutdownTimeout), c.ShutdownTimeout)
	switch {
	case c.Handlers == nil || c.Handlers.Len() == 0:
		bad("Handlers", "must register at least one handler")
	case c.Handlers.refused != "":
		bad("Handlers", "%s", c.Handlers.refused)
	}
	if _, err := ParseStartPosition(c.StartFrom); err != nil {
		bad("StartFrom", "%v", err)
	}
	positive("DeadAfter", int64(c.DeadAfter), c.DeadAfter)
	positive("MaintenanceInterval", int64(c.MaintenanceInterval), c.MaintenanceInterval)
	if c.Schema != "" {
		if err := schema.ValidName(c.Schema); err != nil {
			bad("Schema", "%v", err)
		}
	}
	return errs
}

// StartPosition is where a group starts reading the first time it runs
// (Config.StartFrom, `consumer offsets reset --to`).
type StartPosition struct {
	// Kind is "earliest" (the first retained event), "latest" (events
	// appended from now on), "offset" or "time".
	Kind string
	// Offset is the first offset of Kind "offset" (in every partition).
	Offset int64
	// Time is the time of Kind "time": the first event appended at or
	// after it.
	Time time.Time
}

// String returns the position in the form ParseStartPosition reads.
func (s StartPosition) String() string { return s.internal().String() }

// ParseStartPosition parses "earliest", "latest", "offset:N" (N ≥ 1) or
// "time:<RFC 3339>".
func ParseStartPosition(v string) (StartPosition, error) {
	switch {
	case v == "earliest" || v == "latest":
		return StartPosition{Kind: v}, nil
	case strings.HasPrefix(v, "offset:"):
		n, err := strconv.ParseInt(strings.TrimPrefix(v, "offset:"), 10, 64)
		if err != nil || n < 1 {
			return StartPosition{}, fmt.Errorf("offset:N needs an offset of at least 1, got %q", v)
		}
		return StartPosition{Kind: "offset", Offset: n}, nil
	case strings.HasPrefix(v, "time:"):
		t, err := time.Parse(time.RFC3339Nano, strings.TrimPrefix(v, "time:"))
		if err != nil {
			return StartPosition{}, fmt.Errorf("time:T needs an RFC 3339 timestamp such as time:2026-01-31T12:00:00Z, got %q", v)
		}
		return StartPosition{Kind: "time", Time: t}, nil
	}
	return StartPosition{}, errors.New(`must be earliest, latest, offset:N or time:<RFC 3339>, got "` + v + `"`)
}

// internal returns the position as the offset store takes it.
func (s StartPosition) internal() store.Start {
	return store.Start{Kind: s.Kind, Offset: s.Offset, Time: s.Time}
}
