package config

import (
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"math"
	"net"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"gopkg.in/yaml.v3"

	"github.com/pgevents/pgevents/internal/tmpl"
)

// Limits enforced by validation.
const (
	maxGroupIDLen      = 200
	maxTotalPartitions = 1024
	maxIdentifierLen   = 63

	// maxMillis is the largest millisecond count that still fits in a
	// time.Duration, so the duration helpers can never overflow.
	maxMillis = int(math.MaxInt64 / int64(time.Millisecond))
)

// envDatabaseURL names the environment variable that overrides databaseUrl.
const envDatabaseURL = "DATABASE_URL"

// Config is the validated content of db-event-consumer.yml.
//
// The yaml key of each field is given in its tag. A Config returned by
// [Load] or [Parse] has passed [Config.Validate].
type Config struct {
	// DatabaseURL is the PostgreSQL connection string, as a URL or as
	// keyword/value pairs. The DATABASE_URL environment variable replaces
	// it when set and non-empty. It is required from one source or the
	// other.
	DatabaseURL string `yaml:"databaseUrl"`

	// Schema is the PostgreSQL schema pgevents lives in: `consumer migrate`
	// creates every pgevents object there (creating the schema when
	// missing), and every statement of every command names pgevents'
	// objects in it, qualified, so that pgevents installs beside tables of
	// the same names (an application's own log_counter or
	// dead_letter_queue, say) and handlers still see the application's
	// tables through the search_path. Defaults to "", the first schema of
	// the search_path; otherwise it must satisfy [IsValidIdentifier] and
	// not start with pg_. Top level only: every group of a process shares
	// it.
	Schema string `yaml:"schema"`

	// GroupID names the consumer group whose offsets this process reads
	// and commits. It is required and at most 200 characters long.
	GroupID string `yaml:"groupId"`

	// TopicID is the topic to consume. Defaults to 1; must be greater than
	// 0.
	TopicID int `yaml:"topicId"`

	// BatchSize is the maximum number of events fetched per partition in
	// one poll. Defaults to 100; must be greater than 0.
	BatchSize int `yaml:"batchSize"`

	// TotalPartitions is the number of partitions events are spread over.
	// Defaults to 8; must be between 1 and 1024.
	TotalPartitions int `yaml:"totalPartitions"`

	// PartitionID is the one partition this process serves, or -1 for
	// every partition. Defaults to -1; otherwise it must be at least 0 and
	// less than TotalPartitions.
	PartitionID int `yaml:"partitionId"`

	// WaitPeriodMs is how long, in milliseconds, a consumer waits between
	// polls when no notification arrives. Defaults to 10000; must be
	// greater than 0. See [Config.WaitPeriod].
	WaitPeriodMs int `yaml:"waitPeriodMs"`

	// Channel is the PostgreSQL LISTEN/NOTIFY channel announcing new
	// events. It is a property of the topic: `consumer migrate` writes it,
	// appends notify it, and a consumer configured with another channel
	// refuses to start. Defaults to "event_channel"; must satisfy
	// [IsValidIdentifier].
	Channel string `yaml:"channel"`

	// LogLevel is the minimum level logged: "debug", "info", "warn" or
	// "error". Defaults to "info".
	LogLevel string `yaml:"logLevel"`

	// LogFormat selects the log encoding: "json", "console", or "auto"
	// for console output on a terminal and JSON otherwise. Defaults to
	// "auto".
	LogFormat string `yaml:"logFormat"`

	// UnknownEventType says what to do with an event no handler accepts:
	// "skip" it, or "fail" and stop consuming its partition. Defaults to
	// "fail".
	UnknownEventType string `yaml:"unknownEventType"`

	// MaxConns caps the database connection pool. Defaults to 0, meaning
	// the number of partitions served plus 4; must not be negative.
	MaxConns int `yaml:"maxConns"`

	// ShutdownTimeoutMs is how long, in milliseconds, a graceful shutdown
	// may take before work in progress is abandoned. Defaults to 10000;
	// must be greater than 0. See [Config.ShutdownTimeout].
	ShutdownTimeoutMs int `yaml:"shutdownTimeoutMs"`

	// RetryInitialMs is the delay, in milliseconds, before the first retry
	// of a failed operation. Defaults to 100; must be greater than 0. See
	// [Config.RetryInitial].
	RetryInitialMs int `yaml:"retryInitialMs"`

	// RetryMaxMs caps the delay, in milliseconds, between retries as it
	// grows. Defaults to 30000; must be at least RetryInitialMs. See
	// [Config.RetryMax].
	RetryMaxMs int `yaml:"retryMaxMs"`

	// MaxAttempts is how many times an event is tried before the failure
	// is final. Defaults to 5; must be greater than 0.
	MaxAttempts int `yaml:"maxAttempts"`

	// OnPermanentFailure is the policy for a unit that fails permanently:
	// "deadLetter" records it in dead_letter_queue and moves on,
	// "parkHost" also holds back its hosts' later events until the dead
	// letter is replayed or discarded, "halt" stops the partition before
	// it. Defaults to "deadLetter".
	OnPermanentFailure string `yaml:"onPermanentFailure"`

	// MaxDeadLetterRate is the circuit breaker against a bad deploy: when a
	// partition has dead-lettered this many units within
	// DeadLetterWindowMs, the next permanent failure halts it. Defaults to
	// 100; -1 disables the breaker; otherwise must be greater than 0.
	MaxDeadLetterRate int `yaml:"maxDeadLetterRate"`

	// DeadLetterWindowMs is the breaker's window, in milliseconds.
	// Defaults to 60000; must be greater than 0.
	DeadLetterWindowMs int `yaml:"deadLetterWindowMs"`

	// HandlerTimeoutMs bounds the handling of one unit per batchSize events,
	// in milliseconds; running out is a transient failure. Defaults to
	// 30000; must be greater than 0, and shorter than
	// IdleInTransactionTimeoutMs when that is set.
	HandlerTimeoutMs int `yaml:"handlerTimeoutMs"`

	// StatementTimeoutMs is the statement_timeout of consumer connections,
	// in milliseconds. Defaults to 30000; 0 leaves the server's setting.
	StatementTimeoutMs int `yaml:"statementTimeoutMs"`

	// IdleInTransactionTimeoutMs is the
	// idle_in_transaction_session_timeout of consumer connections, in
	// milliseconds, so that no consumer pins the xmin horizon for long.
	// A batch whose handlers run no SQL commits early enough never to
	// reach it. Defaults to 60000; 0 leaves the server's setting.
	IdleInTransactionTimeoutMs int `yaml:"idleInTransactionTimeoutMs"`

	// StartFrom is where a group starts the first time it runs: "earliest"
	// (the first retained event, so that a new projection sees the
	// history, as in the seed design), "latest" (events appended from now
	// on), "offset:N", or "time:<RFC 3339 timestamp>" (the first event
	// appended at or after it). Defaults to "earliest". It has no effect
	// on a group that has positions already: use consumer offsets reset.
	StartFrom string `yaml:"startFrom"`

	// DeadAfterMs is how long a group may go without a live replica
	// before its subscription becomes DEAD and stops holding back
	// retention. Defaults to 60000; must be greater than 0.
	DeadAfterMs int `yaml:"deadAfterMs"`

	// MaintenanceIntervalMs is how often a consumer creates the log's next
	// segments, marks dead subscriptions and applies retention (one
	// process at a time per topic). Defaults to 10000; must be greater
	// than 0.
	MaintenanceIntervalMs int `yaml:"maintenanceIntervalMs"`

	// Retention is how long the topic keeps events that every ACTIVE or
	// PAUSED group has handled, as a Go duration with an optional "d"
	// for days ("168h", "7d"). Defaults to "7d". Written to the database
	// by consumer migrate.
	Retention string `yaml:"retention"`

	// MaxRetention caps how long the topic keeps any event, whatever the
	// groups; events removed unhandled are counted and reported to their
	// group. Defaults to "" (no cap). Written by consumer migrate.
	MaxRetention string `yaml:"maxRetention"`

	// ZeroSubscriptionRetention is how long a topic that has no
	// subscription at all keeps its events. Defaults to "24h". Written by
	// consumer migrate.
	ZeroSubscriptionRetention string `yaml:"zeroSubscriptionRetention"`

	// SegmentSize is the number of offsets per segment of the log, the
	// unit that retention removes, for a topic created by consumer
	// migrate. Defaults to 1000000; must be at least 1000.
	SegmentSize int `yaml:"segmentSize"`

	// OffsetAllocation is how the topic allocates offsets: "counter"
	// (gapless and commit-ordered; appends slow down while any snapshot in
	// the database stays open) or "sequence" (commit-ordered, with a gap
	// for each rolled-back append; unaffected by open snapshots). Defaults
	// to "counter". Written by consumer migrate.
	OffsetAllocation string `yaml:"offsetAllocation"`

	// OffsetScope is the scope of the topic's offsets, chosen when `consumer
	// migrate` creates the topic: "topic" (one sequence of offsets across
	// the topic, gapless with the counter allocation; every producer of the
	// topic waits for the others' commits) or "partition" (a sequence per
	// partition, gapless and commit-ordered per partition, as in Kafka;
	// producers of different partitions never wait for each other).
	// Defaults to "topic".
	OffsetScope string `yaml:"offsetScope"`

	// LeaseMs is how long a partition lease lives without a heartbeat, in
	// milliseconds: a dead or frozen replica's partitions are taken over
	// about that long after it stopped. Defaults to 1000; must be at least
	// 100.
	LeaseMs int `yaml:"leaseMs"`

	// MetricsAddr is the address ("host:port" or ":port") of the HTTP
	// server for /metrics (Prometheus), /healthz and /readyz. Defaults to
	// "", which serves nothing.
	MetricsAddr string `yaml:"metricsAddr"`

	// Pprof adds Go's /debug/pprof/ endpoints to the MetricsAddr server.
	// Defaults to false.
	Pprof bool `yaml:"pprof"`

	// Handlers lists the built-in handlers, in the order given. It may be
	// empty.
	Handlers []Handler `yaml:"handlers"`

	// Groups lists several consumer groups to run in one process. Each
	// item takes the top-level keys as defaults and may set groupId
	// (required), topicId, totalPartitions, partitionId, batchSize,
	// unknownEventType, onPermanentFailure, maxAttempts, handlerTimeoutMs,
	// startFrom, deadAfterMs and handlers. With groups, the top-level groupId and handlers must
	// not be set. See [Config.GroupConfigs].
	Groups []Config `yaml:"groups"`
}

// groupKeys are the keys a groups item may set.
var groupKeys = []string{"groupId", "topicId", "totalPartitions", "partitionId", "batchSize",
	"unknownEventType", "onPermanentFailure", "maxAttempts", "handlerTimeoutMs", "startFrom", "deadAfterMs", keyHandlers}

const keyGroups = "groups"

// GroupConfigs returns one configuration per consumer group to run: the
// items of Groups, or c itself when it has none.
func (c *Config) GroupConfigs() []Config {
	if len(c.Groups) == 0 {
		one := *c
		return []Config{one}
	}
	return c.Groups
}

// Handler configures one built-in handler.
type Handler struct {
	// EventType is the event type the handler accepts, or "*" for every
	// type. It is required.
	EventType string `yaml:"eventType"`

	// Type is the kind of handler: "log" writes each event to Output;
	// "sql" runs Statement. It is required.
	Type string `yaml:"type"`

	// Statement is the SQL run for each event. It is required when Type
	// is "sql" and must be empty when Type is "log".
	Statement string `yaml:"statement"`

	// Output is where a "log" handler writes: "stdout", "stderr" or a file
	// path. [Parse] sets it to "stdout" when a log handler leaves it out;
	// [Config.Validate] treats empty as "stdout". It must be empty when
	// Type is "sql".
	Output string `yaml:"output"`

	// The keys below belong to the relays, types "kafka" and "http"
	// (see the packages sink/kafka and sink/http); they must be empty for
	// the other types.

	// Name tells a relay's metrics apart (label sink); default the type.
	Name string `yaml:"name"`
	// Format is the shape of what a relay sends: "raw" (default) or
	// "cloudevents" for kafka; "json" (default) or "cloudevents" for http.
	Format string `yaml:"format"`
	// Source is the CloudEvents source attribute of format cloudevents;
	// default "pgevents".
	Source string `yaml:"source"`
	// TLS configures TLS to the brokers (kafka) or to an https endpoint
	// (http). Absent: plaintext (kafka) or the system's roots (http).
	TLS *TLS `yaml:"tls"`

	// Brokers are a kafka relay's seed brokers, "host:port"; required.
	Brokers []string `yaml:"brokers"`
	// Topic is the Kafka topic, a template over the event's fields such
	// as "portal.{event_type}"; required.
	Topic string `yaml:"topic"`
	// Key is the record key: an event field ("host_id", the default, keeps
	// a host's records in one Kafka partition, in order) or a template.
	Key string `yaml:"key"`
	// SASL authenticates to the brokers; absent: none.
	SASL *SASL `yaml:"sasl"`
	// DeliveryTimeoutMs bounds how long a record may wait to be sent
	// before its batch fails (transient) and is tried again; a batch's
	// whole wait for its acknowledgements is bounded by handlerTimeoutMs.
	// Defaults to 20000; at least 1000 and less than handlerTimeoutMs.
	DeliveryTimeoutMs int `yaml:"deliveryTimeoutMs"`
	// MaxRecordBytes is the largest record produced; a larger one is
	// refused and its unit dead-lettered. Set it to the topics'
	// max.message.bytes. Defaults to 1000012; between 512 and 2^30.
	MaxRecordBytes int `yaml:"maxRecordBytes"`

	// URL is an http relay's endpoint, http:// or https://; required.
	URL string `yaml:"url"`
	// Method is the requests' method. Defaults to "POST".
	Method string `yaml:"method"`
	// Headers are added to every request. A value may name environment
	// variables as ${NAME}, replaced when the file is loaded.
	Headers map[string]string `yaml:"headers"`
	// TimeoutMs bounds one request. Defaults to 10000.
	TimeoutMs int `yaml:"timeoutMs"`
	// Concurrency bounds the requests in flight per batch, across hosts
	// (a host's requests are never concurrent). Defaults to 8.
	Concurrency int `yaml:"concurrency"`
}

// TLS names the PEM files of a relay's TLS client configuration.
type TLS struct {
	// CAFile holds the certificates that verify the server; empty: the
	// system's roots.
	CAFile string `yaml:"caFile"`
	// CertFile and KeyFile hold the client's certificate and key; both or
	// neither.
	CertFile string `yaml:"certFile"`
	KeyFile  string `yaml:"keyFile"`
}

// SASL configures a kafka relay's SASL authentication.
type SASL struct {
	// Mechanism is "PLAIN", "SCRAM-SHA-256" or "SCRAM-SHA-512".
	Mechanism string `yaml:"mechanism"`
	// User is the user name; required.
	User string `yaml:"user"`
	// Password is the password; required. It may name environment
	// variables as ${NAME} (password: ${KAFKA_PASSWORD}), replaced when
	// the file is loaded, so that the secret stays out of the file.
	Password string `yaml:"password"`
}

// Default returns a Config holding every default. DatabaseURL and GroupID,
// which have no default, are empty, so the result does not pass
// [Config.Validate] until they are set.
func Default() Config {
	return Config{
		TopicID:           1,
		BatchSize:         100,
		TotalPartitions:   8,
		PartitionID:       -1,
		WaitPeriodMs:      10000,
		Channel:           "event_channel",
		LogLevel:          "info",
		LogFormat:         "auto",
		UnknownEventType:  "fail",
		MaxConns:          0,
		ShutdownTimeoutMs: 10000,
		RetryInitialMs:    100,
		RetryMaxMs:        30000,
		MaxAttempts:       5,

		OnPermanentFailure:         "deadLetter",
		MaxDeadLetterRate:          100,
		DeadLetterWindowMs:         60000,
		HandlerTimeoutMs:           30000,
		StatementTimeoutMs:         30000,
		IdleInTransactionTimeoutMs: 60000,
		LeaseMs:                    1000,
		StartFrom:                  "earliest",
		DeadAfterMs:                60000,
		MaintenanceIntervalMs:      10000,
		Retention:                  "7d",
		ZeroSubscriptionRetention:  "24h",
		SegmentSize:                1000000,
		OffsetAllocation:           "counter",
		OffsetScope:                "topic",
	}
}

// WaitPeriod returns WaitPeriodMs as a duration.
func (c *Config) WaitPeriod() time.Duration { return millis(c.WaitPeriodMs) }

// RetryInitial returns RetryInitialMs as a duration.
func (c *Config) RetryInitial() time.Duration { return millis(c.RetryInitialMs) }

// RetryMax returns RetryMaxMs as a duration.
func (c *Config) RetryMax() time.Duration { return millis(c.RetryMaxMs) }

// DeadLetterWindow returns DeadLetterWindowMs as a duration.
func (c *Config) DeadLetterWindow() time.Duration { return millis(c.DeadLetterWindowMs) }

// DeadAfter returns DeadAfterMs as a duration.
func (c *Config) DeadAfter() time.Duration { return millis(c.DeadAfterMs) }

// MaintenanceInterval returns MaintenanceIntervalMs as a duration.
func (c *Config) MaintenanceInterval() time.Duration { return millis(c.MaintenanceIntervalMs) }

// Lease returns LeaseMs as a duration.
func (c *Config) Lease() time.Duration { return millis(c.LeaseMs) }

// HandlerTimeout returns HandlerTimeoutMs as a duration.
func (c *Config) HandlerTimeout() time.Duration { return millis(c.HandlerTimeoutMs) }

// ShutdownTimeout returns ShutdownTimeoutMs as a duration.
func (c *Config) ShutdownTimeout() time.Duration { return millis(c.ShutdownTimeoutMs) }

func millis(ms int) time.Duration { return time.Duration(ms) * time.Millisecond }

// Error is a configuration error that names the offending key.
//
// Key uses the YAML spelling, with a path for nested keys: "batchSize",
// "handlers[2].statement" (handler indexes start at 0). Key is empty only
// when the file itself cannot be read or parsed. Line is the 1-based line
// of the offending key in the file, or 0 when unknown (for example when a
// required key is missing). File is the path given to [Load], or empty.
type Error struct {
	// File is the path of the configuration file, or empty.
	File string
	// Key is the YAML path of the offending key, or empty.
	Key string
	// Line is the 1-based line of the offending key, or 0 when unknown.
	Line int
	// Msg describes the problem.
	Msg string

	err error // underlying cause, if any; see Unwrap
}

// Error formats the error as, for example,
// "config db-event-consumer.yml: batchSize: must be greater than 0 (line 3)",
// leaving out the parts that are empty or zero.
func (e *Error) Error() string {
	var b strings.Builder
	b.WriteString("config")
	if e.File != "" {
		b.WriteString(" ")
		b.WriteString(e.File)
	}
	b.WriteString(": ")
	if e.Key != "" {
		b.WriteString(e.Key)
		b.WriteString(": ")
	}
	b.WriteString(e.Msg)
	if e.Line > 0 {
		b.WriteString(" (line ")
		b.WriteString(strconv.Itoa(e.Line))
		b.WriteString(")")
	}
	return b.String()
}

// Unwrap returns the underlying cause, such as the [fs.ErrNotExist] behind a
// missing file, or nil.
func (e *Error) Unwrap() error { return e.err }

// Load reads the configuration file at path and parses it with [Parse]. Any
// error is an [*Error] whose File is path; a file that cannot be read
// yields an *Error with an empty Key that unwraps to the cause.
func Load(path string) (*Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		msg := err.Error()
		var pathErr *fs.PathError
		if errors.As(err, &pathErr) {
			msg = pathErr.Err.Error()
		}
		return nil, &Error{File: path, Msg: "cannot read file: " + msg, err: err}
	}
	c, err := Parse(data)
	if err != nil {
		var cfgErr *Error
		if errors.As(err, &cfgErr) {
			cfgErr.File = path
		}
		return nil, err
	}
	return c, nil
}

// Parse decodes the YAML content of a configuration file, applies defaults
// and the DATABASE_URL override, and validates the result. Any error is an
// [*Error] naming the first offending key; see the package documentation
// for the order in which problems are reported.
func Parse(data []byte) (*Config, error) {
	root, cfgErr := decodeDocument(data)
	if cfgErr != nil {
		return nil, cfgErr
	}

	p := parser{cfg: Default(), lines: make(map[string]int)}
	if cfgErr := p.topLevel(root); cfgErr != nil {
		return nil, cfgErr
	}

	if url := os.Getenv(envDatabaseURL); url != "" {
		p.cfg.DatabaseURL = url
	}
	defaultOutputs(p.cfg.Handlers)
	for i := range p.cfg.Groups {
		g := &p.cfg.Groups[i]
		g.DatabaseURL = p.cfg.DatabaseURL
		defaultOutputs(g.Handlers)
	}

	problems := p.cfg.problems()
	if len(problems) > 0 {
		for _, e := range problems {
			e.Line = p.lineOf(e.Key)
		}
		// Document order; problems without a line (missing keys) last.
		// The sort is stable, so ties keep field order.
		slices.SortStableFunc(problems, func(a, b *Error) int {
			return cmp.Or(
				cmp.Compare(lineRank(a.Line), lineRank(b.Line)),
				cmp.Compare(a.Line, b.Line),
			)
		})
		return nil, problems[0]
	}

	c := p.cfg
	return &c, nil
}

// defaultOutputs sets the output of log handlers that give none.
func defaultOutputs(hs []Handler) {
	for i := range hs {
		if hs[i].Type == handlerLog && hs[i].Output == "" {
			hs[i].Output = outputStdout
		}
	}
}

func lineRank(line int) int {
	if line == 0 {
		return 1
	}
	return 0
}

// decodeDocument parses data as a single YAML document and returns its top
// level mapping.
func decodeDocument(data []byte) (*yaml.Node, *Error) {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var doc yaml.Node
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, &Error{Msg: "file is empty"}
		}
		return nil, &Error{Msg: "invalid YAML: " + strings.TrimPrefix(err.Error(), "yaml: "), err: err}
	}
	var extra yaml.Node
	switch err := dec.Decode(&extra); {
	case errors.Is(err, io.EOF):
	case err != nil:
		return nil, &Error{Msg: "invalid YAML: " + strings.TrimPrefix(err.Error(), "yaml: "), err: err}
	default:
		return nil, &Error{Line: extra.Line, Msg: "file must hold a single YAML document"}
	}

	root := &doc
	if root.Kind == yaml.DocumentNode {
		if len(root.Content) == 0 {
			return nil, &Error{Msg: "file is empty"}
		}
		root = root.Content[0]
	}
	root = resolve(root)
	if isNull(root) {
		return nil, &Error{Msg: "file is empty"}
	}
	if root.Kind != yaml.MappingNode {
		return nil, &Error{Line: root.Line, Msg: "top level must be a mapping of keys to values, got " + describe(root)}
	}
	return root, nil
}

// parser fills a Config from a YAML node tree, remembering the line of
// every key it sees so that validation problems can be located.
type parser struct {
	cfg   Config
	lines map[string]int // key path → line of the key
}

// lineOf returns the line of key, or of the nearest enclosing key present
// in the file, or 0.
func (p *parser) lineOf(key string) int {
	for {
		if line, ok := p.lines[key]; ok {
			return line
		}
		i := strings.LastIndexAny(key, ".[")
		if i <= 0 {
			return 0
		}
		key = key[:i]
	}
}

type topField func(c *Config, v *yaml.Node) string

func intField(get func(c *Config) *int) topField {
	return func(c *Config, v *yaml.Node) string { return decodeInt(v, get(c)) }
}

func stringField(get func(c *Config) *string) topField {
	return func(c *Config, v *yaml.Node) string { return decodeString(v, get(c)) }
}

// topFields maps every known top-level key except handlers to its decoder.
var topFields = map[string]topField{
	"databaseUrl":       stringField(func(c *Config) *string { return &c.DatabaseURL }),
	"schema":            stringField(func(c *Config) *string { return &c.Schema }),
	"groupId":           stringField(func(c *Config) *string { return &c.GroupID }),
	"topicId":           intField(func(c *Config) *int { return &c.TopicID }),
	"batchSize":         intField(func(c *Config) *int { return &c.BatchSize }),
	"totalPartitions":   intField(func(c *Config) *int { return &c.TotalPartitions }),
	"partitionId":       intField(func(c *Config) *int { return &c.PartitionID }),
	"waitPeriodMs":      intField(func(c *Config) *int { return &c.WaitPeriodMs }),
	"channel":           stringField(func(c *Config) *string { return &c.Channel }),
	"logLevel":          stringField(func(c *Config) *string { return &c.LogLevel }),
	"logFormat":         stringField(func(c *Config) *string { return &c.LogFormat }),
	"unknownEventType":  stringField(func(c *Config) *string { return &c.UnknownEventType }),
	"maxConns":          intField(func(c *Config) *int { return &c.MaxConns }),
	"shutdownTimeoutMs": intField(func(c *Config) *int { return &c.ShutdownTimeoutMs }),
	"retryInitialMs":    intField(func(c *Config) *int { return &c.RetryInitialMs }),
	"retryMaxMs":        intField(func(c *Config) *int { return &c.RetryMaxMs }),
	"maxAttempts":       intField(func(c *Config) *int { return &c.MaxAttempts }),

	"onPermanentFailure":         stringField(func(c *Config) *string { return &c.OnPermanentFailure }),
	"maxDeadLetterRate":          intField(func(c *Config) *int { return &c.MaxDeadLetterRate }),
	"deadLetterWindowMs":         intField(func(c *Config) *int { return &c.DeadLetterWindowMs }),
	"handlerTimeoutMs":           intField(func(c *Config) *int { return &c.HandlerTimeoutMs }),
	"statementTimeoutMs":         intField(func(c *Config) *int { return &c.StatementTimeoutMs }),
	"idleInTransactionTimeoutMs": intField(func(c *Config) *int { return &c.IdleInTransactionTimeoutMs }),

	"leaseMs": intField(func(c *Config) *int { return &c.LeaseMs }),

	"startFrom":                 stringField(func(c *Config) *string { return &c.StartFrom }),
	"deadAfterMs":               intField(func(c *Config) *int { return &c.DeadAfterMs }),
	"maintenanceIntervalMs":     intField(func(c *Config) *int { return &c.MaintenanceIntervalMs }),
	"retention":                 stringField(func(c *Config) *string { return &c.Retention }),
	"maxRetention":              stringField(func(c *Config) *string { return &c.MaxRetention }),
	"zeroSubscriptionRetention": stringField(func(c *Config) *string { return &c.ZeroSubscriptionRetention }),
	"segmentSize":               intField(func(c *Config) *int { return &c.SegmentSize }),
	"offsetAllocation":          stringField(func(c *Config) *string { return &c.OffsetAllocation }),
	"offsetScope":               stringField(func(c *Config) *string { return &c.OffsetScope }),
	"metricsAddr":               stringField(func(c *Config) *string { return &c.MetricsAddr }),
	"pprof":                     boolField(func(c *Config) *bool { return &c.Pprof }),
}

const keyHandlers = "handlers"

// handlerFields maps every known string handler key to its field.
var handlerFields = map[string]func(h *Handler) *string{
	"eventType": func(h *Handler) *string { return &h.EventType },
	"type":      func(h *Handler) *string { return &h.Type },
	"statement": func(h *Handler) *string { return &h.Statement },
	"output":    func(h *Handler) *string { return &h.Output },
	"name":      func(h *Handler) *string { return &h.Name },
	"format":    func(h *Handler) *string { return &h.Format },
	"source":    func(h *Handler) *string { return &h.Source },
	"topic":     func(h *Handler) *string { return &h.Topic },
	"key":       func(h *Handler) *string { return &h.Key },
	"url":       func(h *Handler) *string { return &h.URL },
	"method":    func(h *Handler) *string { return &h.Method },
}

// handlerInts maps every integer handler key to its field.
var handlerInts = map[string]func(h *Handler) *int{
	"deliveryTimeoutMs": func(h *Handler) *int { return &h.DeliveryTimeoutMs },
	"maxRecordBytes":    func(h *Handler) *int { return &h.MaxRecordBytes },
	"timeoutMs":         func(h *Handler) *int { return &h.TimeoutMs },
	"concurrency":       func(h *Handler) *int { return &h.Concurrency },
}

// handlerKeyTypes lists, for each handler key but eventType and type, the
// handler types that take it.
var handlerKeyTypes = map[string][]string{
	"statement": {handlerSQL}, "output": {handlerLog},
	"name": {handlerKafka, handlerHTTP}, "format": {handlerKafka, handlerHTTP}, "source": {handlerKafka, handlerHTTP},
	"tls": {handlerKafka, handlerHTTP}, "brokers": {handlerKafka}, "topic": {handlerKafka}, "key": {handlerKafka},
	"sasl": {handlerKafka}, "deliveryTimeoutMs": {handlerKafka}, "maxRecordBytes": {handlerKafka},
	"url": {handlerHTTP}, "method": {handlerHTTP}, "headers": {handlerHTTP}, "timeoutMs": {handlerHTTP},
	"concurrency": {handlerHTTP},
}

// setKeys returns the handler keys h sets, besides eventType and type.
func (h *Handler) setKeys() []string {
	var keys []string
	for k, f := range handlerFields {
		if k != "eventType" && k != "type" && *f(h) != "" {
			keys = append(keys, k)
		}
	}
	for k, f := range handlerInts {
		if *f(h) != 0 {
			keys = append(keys, k)
		}
	}
	if h.TLS != nil {
		keys = append(keys, "tls")
	}
	if h.SASL != nil {
		keys = append(keys, "sasl")
	}
	if h.Brokers != nil {
		keys = append(keys, "brokers")
	}
	if h.Headers != nil {
		keys = append(keys, "headers")
	}
	slices.Sort(keys)
	return keys
}

// handlerKey decodes the value v of handler key name (at key path) into h.
func (p *parser) handlerKey(h *Handler, path, name string, k, v *yaml.Node) *Error {
	key := path + "." + name
	fail := func(msg string) *Error { return &Error{Key: key, Line: k.Line, Msg: msg} }
	if field, ok := handlerFields[name]; ok {
		if msg := decodeString(v, field(h)); msg != "" {
			return fail(msg)
		}
		return nil
	}
	if field, ok := handlerInts[name]; ok {
		if msg := decodeInt(v, field(h)); msg != "" {
			return fail(msg)
		}
		return nil
	}
	switch name {
	case "brokers":
		if v.Kind != yaml.SequenceNode {
			return fail("must be a list of host:port, got " + describe(v))
		}
		h.Brokers = []string{}
		for i, item := range v.Content {
			var b string
			if msg := decodeString(resolve(item), &b); msg != "" {
				return &Error{Key: fmt.Sprintf("%s[%d]", key, i), Line: item.Line, Msg: msg}
			}
			h.Brokers = append(h.Brokers, b)
		}
		return nil
	case "headers":
		if v.Kind != yaml.MappingNode {
			return fail("must be a mapping of header names to values, got " + describe(v))
		}
		h.Headers = map[string]string{}
		return p.mapping(v, key+".", func(hname string, hk, hv *yaml.Node) *Error {
			var value string
			if msg := decodeString(hv, &value); msg != "" {
				return &Error{Key: key + "." + hname, Line: hk.Line, Msg: msg}
			}
			value, err := expandEnv(value)
			if err != nil {
				return &Error{Key: key + "." + hname, Line: hk.Line, Msg: err.Error()}
			}
			h.Headers[hname] = value
			return nil
		})
	case "tls":
		if v.Kind != yaml.MappingNode && !isNull(v) {
			return fail("must be a mapping (caFile, certFile, keyFile), got " + describe(v))
		}
		h.TLS = &TLS{}
		fields := map[string]*string{"caFile": &h.TLS.CAFile, "certFile": &h.TLS.CertFile, "keyFile": &h.TLS.KeyFile}
		if isNull(v) {
			return nil
		}
		return p.subFields(v, key, fields, nil)
	case "sasl":
		if v.Kind != yaml.MappingNode {
			return fail("must be a mapping (mechanism, user, password), got " + describe(v))
		}
		h.SASL = &SASL{}
		fields := map[string]*string{"mechanism": &h.SASL.Mechanism, "user": &h.SASL.User, "password": &h.SASL.Password}
		return p.subFields(v, key, fields, map[string]bool{"password": true})
	}
	return fail("unknown key")
}

// subFields decodes the string keys of mapping v (at key path) into
// fields; the keys in env may name environment variables as ${NAME}.
func (p *parser) subFields(v *yaml.Node, key string, fields map[string]*string, env map[string]bool) *Error {
	return p.mapping(v, key+".", func(name string, k, v *yaml.Node) *Error {
		dst, ok := fields[name]
		if !ok {
			names := slices.Sorted(maps.Keys(fields))
			return &Error{Key: key + "." + name, Line: k.Line, Msg: "unknown key (" + strings.Join(names, ", ") + ")"}
		}
		if msg := decodeString(v, dst); msg != "" {
			return &Error{Key: key + "." + name, Line: k.Line, Msg: msg}
		}
		if env[name] {
			value, err := expandEnv(*dst)
			if err != nil {
				return &Error{Key: key + "." + name, Line: k.Line, Msg: err.Error()}
			}
			*dst = value
		}
		return nil
	})
}

// expandEnv replaces each ${NAME} in s with the environment variable NAME,
// which must be set.
func expandEnv(s string) (string, error) {
	var b strings.Builder
	for {
		i := strings.Index(s, "${")
		if i < 0 {
			b.WriteString(s)
			return b.String(), nil
		}
		end := strings.IndexByte(s[i:], '}')
		if end < 0 {
			return "", fmt.Errorf("has a ${ without }")
		}
		name := s[i+2 : i+end]
		if !validEnvName(name) {
			return "", fmt.Errorf("${%s} is not an environment variable name", name)
		}
		value, ok := os.LookupEnv(name)
		if !ok {
			return "", fmt.Errorf("names the environment variable %s, which is not set", name)
		}
		b.WriteString(s[:i])
		b.WriteString(value)
		s = s[i+end+1:]
	}
}

func validEnvName(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c == '_' || 'A' <= c && c <= 'Z' || 'a' <= c && c <= 'z' || i > 0 && '0' <= c && c <= '9') {
			return false
		}
	}
	return true
}

func (p *parser) topLevel(m *yaml.Node) *Error {
	var groups *yaml.Node
	err := p.mapping(m, "", func(name string, k, v *yaml.Node) *Error {
		if name == keyGroups {
			groups = v
			return nil
		}
		if name == keyHandlers {
			hs, err := p.handlers(v, keyHandlers)
			p.cfg.Handlers = hs
			return err
		}
		decode, ok := topFields[name]
		if !ok {
			return &Error{Key: name, Line: k.Line, Msg: "unknown key"}
		}
		if msg := decode(&p.cfg, v); msg != "" {
			return &Error{Key: name, Line: k.Line, Msg: msg}
		}
		return nil
	})
	if err != nil || groups == nil {
		return err
	}
	return p.groups(groups)
}

// groups decodes the groups list, each item over a copy of the top level.
func (p *parser) groups(v *yaml.Node) *Error {
	if isNull(v) {
		return nil
	}
	if v.Kind != yaml.SequenceNode {
		return &Error{Key: keyGroups, Line: p.lines[keyGroups], Msg: "must be a list of groups, got " + describe(v)}
	}
	for i, item := range v.Content {
		item = resolve(item)
		path := keyGroups + "[" + strconv.Itoa(i) + "]"
		p.lines[path] = item.Line
		if item.Kind != yaml.MappingNode {
			return &Error{Key: path, Line: item.Line, Msg: "must be a mapping, got " + describe(item)}
		}
		g := p.cfg
		g.Groups = nil
		g.GroupID = ""
		err := p.mapping(item, path+".", func(name string, k, v *yaml.Node) *Error {
			key := path + "." + name
			if !slices.Contains(groupKeys, name) {
				return &Error{Key: key, Line: k.Line, Msg: "unknown key (a group may set " + strings.Join(groupKeys, ", ") + ")"}
			}
			if name == keyHandlers {
				hs, err := p.handlers(v, key)
				g.Handlers = hs
				return err
			}
			if msg := topFields[name](&g, v); msg != "" {
				return &Error{Key: key, Line: k.Line, Msg: msg}
			}
			return nil
		})
		if err != nil {
			return err
		}
		p.cfg.Groups = append(p.cfg.Groups, g)
	}
	return nil
}

// handlers decodes a list of handlers found at key path.
func (p *parser) handlers(v *yaml.Node, key string) ([]Handler, *Error) {
	if isNull(v) {
		return nil, nil
	}
	if v.Kind != yaml.SequenceNode {
		return nil, &Error{Key: key, Line: p.lines[key], Msg: "must be a list of handlers, got " + describe(v)}
	}
	handlers := make([]Handler, 0, len(v.Content))
	for i, item := range v.Content {
		item = resolve(item)
		path := key + "[" + strconv.Itoa(i) + "]"
		p.lines[path] = item.Line
		if item.Kind != yaml.MappingNode {
			return nil, &Error{Key: path, Line: item.Line, Msg: "must be a mapping, got " + describe(item)}
		}
		var h Handler
		err := p.mapping(item, path+".", func(name string, k, v *yaml.Node) *Error {
			return p.handlerKey(&h, path, name, k, v)
		})
		if err != nil {
			return nil, err
		}
		handlers = append(handlers, h)
	}
	return handlers, nil
}

// mapping walks the key/value pairs of m in document order, rejecting
// non-scalar and duplicate keys, recording each key's line under prefix,
// and calling fn for every pair. It stops at the first error.
func (p *parser) mapping(m *yaml.Node, prefix string, fn func(name string, k, v *yaml.Node) *Error) *Error {
	seen := make(map[string]int, len(m.Content)/2)
	for i := 0; i+1 < len(m.Content); i += 2 {
		k, v := m.Content[i], resolve(m.Content[i+1])
		if k.Kind != yaml.ScalarNode {
			return &Error{Key: strings.TrimSuffix(prefix, "."), Line: k.Line, Msg: "keys must be plain strings, got " + describe(k)}
		}
		name := k.Value
		if first, dup := seen[name]; dup {
			return &Error{Key: prefix + name, Line: k.Line, Msg: fmt.Sprintf("duplicate key, first set on line %d", first)}
		}
		seen[name] = k.Line
		p.lines[prefix+name] = k.Line
		if err := fn(name, k, v); err != nil {
			return err
		}
	}
	return nil
}

// resolve follows aliases to the node they refer to.
func resolve(n *yaml.Node) *yaml.Node {
	for n != nil && n.Kind == yaml.AliasNode && n.Alias != nil {
		n = n.Alias
	}
	return n
}

func isNull(n *yaml.Node) bool {
	return n == nil || n.Kind == 0 || (n.Kind == yaml.ScalarNode && n.ShortTag() == "!!null")
}

// describe names the kind of a node for error messages.
func describe(n *yaml.Node) string {
	switch {
	case isNull(n):
		return "no value"
	case n.Kind == yaml.MappingNode:
		return "a mapping"
	case n.Kind == yaml.SequenceNode:
		return "a list"
	case n.Kind == yaml.ScalarNode:
		return strconv.Quote(n.Value)
	default:
		return "an unsupported value"
	}
}

// decodeInt stores the integer held by v in dst, or returns why it cannot.
func decodeInt(v *yaml.Node, dst *int) string {
	if v.Kind != yaml.ScalarNode || v.ShortTag() != "!!int" {
		return "must be an integer, got " + describe(v)
	}
	var n int
	if err := v.Decode(&n); err != nil {
		return "must be an integer that fits in 64 bits, got " + describe(v)
	}
	*dst = n
	return ""
}

// decodeString stores the scalar held by v in dst, or returns why it
// cannot. Any scalar is accepted as its literal text, so "groupId: 42"
// means "42"; an empty value means "".
func decodeString(v *yaml.Node, dst *string) string {
	if isNull(v) {
		*dst = ""
		return ""
	}
	if v.Kind != yaml.ScalarNode {
		return "must be a string, got " + describe(v)
	}
	*dst = v.Value
	return ""
}

func decodeBool(v *yaml.Node, dst *bool) string {
	if isNull(v) {
		*dst = false
		return ""
	}
	if v.Kind != yaml.ScalarNode || v.ShortTag() != "!!bool" {
		return "must be true or false, got " + describe(v)
	}
	*dst = v.Value == "true" || v.Value == "True" || v.Value == "TRUE"
	return ""
}

func boolField(get func(c *Config) *bool) topField {
	return func(c *Config, v *yaml.Node) string { return decodeBool(v, get(c)) }
}

// Values accepted by the enumerated keys.
var (
	logLevels         = []string{"debug", "info", "warn", "error"}
	logFormats        = []string{"auto", "json", "console"}
	unknownEventTypes = []string{"skip", "fail"}
	failurePolicies   = []string{"deadLetter", "parkHost", "halt"}
	handlerTypes      = []string{handlerLog, handlerSQL, handlerKafka, handlerHTTP}
	saslMechanisms    = []string{"PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"}
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
	if !IsValidIdentifier(c.Channel) {
		add("channel", "must be a lowercase PostgreSQL identifier ([a-z_][a-z0-9_]*, at most %d bytes, not a reserved word), got %q", maxIdentifierLen, c.Channel)
	}
	oneOf("logLevel", c.LogLevel, logLevels)
	oneOf("logFormat", c.LogFormat, logFormats)
	oneOf("unknownEventType", c.UnknownEventType, unknownEventTypes)
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
	oneOf("onPermanentFailure", c.OnPermanentFailure, failurePolicies)
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
	if _, err := ParseStart(c.StartFrom); err != nil {
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
	} else if u, err := url.Parse(h.URL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		add(path+"url", "must be an absolute http:// or https:// URL, got %q", h.URL)
	}
	if h.Method != "" && !isToken(h.Method) {
		add(path+"method", "must be an HTTP method, got %q", h.Method)
	}
	for _, name := range slices.Sorted(maps.Keys(h.Headers)) {
		switch {
		case !isToken(name) || strings.ContainsAny(h.Headers[name], "\r\n"):
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

// isToken reports whether s is an HTTP token (a method or a header name).
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
