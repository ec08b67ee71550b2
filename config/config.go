package config

import (
	"math"
	"slices"
	"time"
)

// maxMillis is the largest millisecond count that still fits in a
// time.Duration, so the duration helpers can never overflow.
const maxMillis = int(math.MaxInt64 / int64(time.Millisecond))

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
	// other: it is the database of the commands that name no group
	// (repartition, adopt, console, dlq list without --group), and of every
	// group that does not set its own.
	//
	// A groups item may set its own, so that one process serves groups on
	// several databases (topics spread over several): that group then runs,
	// is migrated, shown and administered on its database, and
	// DATABASE_URL does not replace it. See [Config.Databases].
	DatabaseURL string `yaml:"databaseUrl"`

	// Schema is the PostgreSQL schema pgevents lives in: `consumer migrate`
	// creates every pgevents object there (creating the schema when
	// missing), and every statement of every command names pgevents'
	// objects in it, qualified, so that pgevents installs beside tables of
	// the same names (an application's own log_counter or
	// dead_letter_queue, say) and handlers still see the application's
	// tables through the search_path. Defaults to "", the first schema of
	// the search_path; otherwise it must be a schema name
	// schema.ValidName accepts (a lowercase identifier, not starting with
	// pg_). A groups item may set its own (the schema of pgevents in its
	// database); by default it takes the top level's.
	Schema string `yaml:"schema"`

	// GroupID names the consumer group whose offsets this process reads
	// and commits. It is required and at most
	// pgevents.MaxGroupIDLength (200) characters long.
	GroupID string `yaml:"groupId"`

	// TopicID is the topic to consume. Defaults to 1; must be greater than
	// 0.
	TopicID int `yaml:"topicId"`

	// BatchSize is the maximum number of events fetched per partition in
	// one poll. Defaults to 100; must be greater than 0.
	BatchSize int `yaml:"batchSize"`

	// TotalPartitions is the number of partitions events are spread over.
	// Defaults to 8; must be between 1 and schema.MaxPartitions (1024).
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
	// refuses to start. Defaults to "": the topic's channel (see
	// schema.ChannelFor); otherwise it must be an identifier
	// (schema.ValidIdentifier).
	Channel string `yaml:"channel"`

	// LogLevel is the minimum level logged: "debug", "info", "warn" or
	// "error". Defaults to "info".
	LogLevel string `yaml:"logLevel"`

	// LogFormat selects the log encoding: "json", "console", or "auto"
	// for console output on a terminal and JSON otherwise. Defaults to
	// "auto".
	LogFormat string `yaml:"logFormat"`

	// UnknownEventType says what to do with an event no handler accepts:
	// "skip" it, or "fail": its unit fails permanently and goes where
	// onPermanentFailure says (by default, dead-lettered). Defaults to
	// "fail".
	UnknownEventType string `yaml:"unknownEventType"`

	// MaxConns caps the database connection pool. Defaults to 0, meaning
	// what the groups need (pgevents.PoolSize of the partitions each
	// serves, summed); must not be negative. See [Config.PoolSize].
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
	// 100; -1 (any negative value) disables the breaker; 0 is refused.
	MaxDeadLetterRate int `yaml:"maxDeadLetterRate"`

	// DeadLetterWindowMs is the breaker's window, in milliseconds.
	// Defaults to 60000; must be greater than 0.
	DeadLetterWindowMs int `yaml:"deadLetterWindowMs"`

	// HandlerTimeoutMs bounds the handling of one unit per batchSize events,
	// in milliseconds; running out is a transient failure. Defaults to
	// 30000; must be greater than 0, and shorter than the sessions'
	// idle_in_transaction_session_timeout (IdleInTransactionTimeoutMs,
	// unless the URL sets another), which consumer run checks when it
	// starts.
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

	// IdempotencyWindow is how long an idempotency key of the topic makes
	// a second append of it append nothing, as a Go duration with an
	// optional "d" for days ("24h", "2d"); see schema.SetIdempotencyWindow.
	// Defaults to "24h" (schema.DefaultIdempotencyWindow); must be
	// positive. Written by consumer migrate to every topic the file's
	// groups consume.
	IdempotencyWindow string `yaml:"idempotencyWindow"`

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

	// Console configures the operator console (see [Console]); nil, the
	// default, serves none. Top level only.
	Console *Console `yaml:"console"`

	// Kafka configures the Kafka protocol endpoint (see [Kafka]); nil, the
	// default, serves none. Top level only.
	Kafka *Kafka `yaml:"kafka"`

	// Tracing makes consumer run export the consumers' spans over
	// OTLP/HTTP (see [Tracing]); nil, the default, traces nothing. Top
	// level only: every group of the process exports through it.
	Tracing *Tracing `yaml:"tracing"`

	// Handlers lists the built-in handlers, in the order given. It may be
	// empty.
	Handlers []Handler `yaml:"handlers"`

	// Groups lists several consumer groups to run in one process. Each
	// item takes the top-level keys as defaults and may set groupId
	// (required), databaseUrl, schema, topicId, totalPartitions,
	// partitionId, batchSize, unknownEventType, onPermanentFailure,
	// maxAttempts, handlerTimeoutMs, startFrom, deadAfterMs and handlers.
	// With groups, the top-level groupId and handlers must not be set.
	// [Parse] fills each item's other keys from the top level; in a Config
	// built in Go, an item's empty DatabaseURL means the top level's. Two
	// items may not name the same group of the same topic, even on two
	// databases. See [Config.GroupConfigs].
	Groups []Config `yaml:"groups"`

	// warnings are what Parse read with a warning (Warnings).
	warnings []Warning
}

// Warnings returns what the file says that was read but should be said
// otherwise (a deprecated key, such as console.addr), in document order,
// each naming its key (and file and line, from [Load]). The commands log
// each one at start; nil when there is none.
func (c *Config) Warnings() []Warning { return c.warnings }

// groupKeys are the keys a groups item may set.
var groupKeys = []string{keyDatabaseURL, keySchema, "groupId", "topicId", "totalPartitions", "partitionId", "batchSize",
	"unknownEventType", "onPermanentFailure", "maxAttempts", "handlerTimeoutMs", "startFrom", "deadAfterMs", keyHandlers}

const (
	keyGroups      = "groups"
	keyDatabaseURL = "databaseUrl"
	keySchema      = "schema"
)

// GroupConfigs returns one configuration per consumer group to run: the
// items of Groups, or c itself when it has none. Each item's DatabaseURL
// is its database: its own, or the top level's.
func (c *Config) GroupConfigs() []Config {
	if len(c.Groups) == 0 {
		one := *c
		return []Config{one}
	}
	gs := slices.Clone(c.Groups)
	for i := range gs {
		if gs[i].DatabaseURL == "" {
			gs[i].DatabaseURL = c.DatabaseURL
		}
	}
	return gs
}

// Database is one database the file's groups run on: a distinct
// databaseUrl.
type Database struct {
	// URL is its connection string.
	URL string
	// Key is the file's key that sets URL: "databaseUrl" for the top
	// level's, else "groups[i].databaseUrl" of the first group that names
	// it. Errors about the database (a URL that does not parse, say) name
	// it.
	Key string
	// Groups are the groups that run on it, as indexes in GroupConfigs
	// order.
	Groups []int
	// PoolSize is the connections its groups' consumers need: maxConns
	// when set, otherwise pgevents.PoolSize of the partitions each of them
	// serves, summed.
	PoolSize int
}

// Databases returns the databases the file's groups run on, in the order
// of their first group, each with its groups and the size of its pool. A
// file whose groups set no databaseUrl has one: the top level's.
func (c *Config) Databases() []Database {
	var dbs []Database
	for i, g := range c.GroupConfigs() {
		j := slices.IndexFunc(dbs, func(d Database) bool { return d.URL == g.DatabaseURL })
		if j < 0 {
			dbs = append(dbs, Database{URL: g.DatabaseURL, Key: c.KeyPath(i, keyDatabaseURL)})
			j = len(dbs) - 1
		}
		dbs[j].Groups = append(dbs[j].Groups, i)
		dbs[j].PoolSize += g.groupPoolSize()
	}
	if c.MaxConns > 0 {
		for j := range dbs {
			dbs[j].PoolSize = c.MaxConns
		}
	}
	return dbs
}

// OwnDatabase reports whether group i (in GroupConfigs order) runs on a
// database of its own, other than the top level's.
func (c *Config) OwnDatabase(i int) bool {
	return len(c.Groups) > 0 && c.Groups[i].DatabaseURL != "" && c.Groups[i].DatabaseURL != c.DatabaseURL
}

// SameInstallation reports whether group i (in GroupConfigs order) runs on
// the top level's database and schema, the installation of the commands
// that name no group (the console, say).
func (c *Config) SameInstallation(i int) bool {
	return !c.OwnDatabase(i) && (len(c.Groups) == 0 || c.Groups[i].Schema == c.Schema)
}

// Handler configures one built-in handler.
type Handler struct {
	// EventType is the event type the handler accepts ("user.created"), a
	// prefix pattern ending in ".*" ("user.*": user.created,
	// user.admin.added), or "*" for every type (see pgevents.Handlers for
	// the precedence: exact type, longest prefix, "*"). It is required,
	// and two handlers of a group may not have the same one.
	EventType string `yaml:"eventType"`

	// Type is the kind of handler: "log" writes each event to Output;
	// "sql" runs Statement; "kafka" and "http" relay events (see below);
	// "go" runs the Go handler registered as Name in the binary
	// (consumercli.CLI.Handlers). It is required.
	Type string `yaml:"type"`

	// Statement is the SQL run for each event. It is required when Type
	// is "sql" and must be empty when Type is "log".
	Statement string `yaml:"statement"`

	// PrepareAtStart, for type sql, says whether `consumer run` prepares
	// Statement on the group's database when it starts
	// (pgevents.CheckSQLHandler) and refuses to start, exit status 2
	// naming the statement's key with the server's message, when it
	// cannot: a table or column that does not exist, a positional
	// parameter ($1), a named one a sql handler does not bind. Defaults
	// to true (nil); false leaves a statement over tables created after
	// the consumer starts to its first event, where a failure is retried
	// as a deployment failure. See [Handler.PreparesAtStart].
	PrepareAtStart *bool `yaml:"prepareAtStart"`

	// Output is where a "log" handler writes: "stdout", "stderr" or a file
	// path. [Parse] sets it to "stdout" when a log handler leaves it out;
	// [Config.Validate] treats empty as "stdout". It must be empty when
	// Type is "sql".
	Output string `yaml:"output"`

	// The keys below belong to the relays, types "kafka" and "http" (see
	// the packages sink/kafkasink and sink/webhook, whose Options they map to
	// and whose Validate checks them; see [Handler.KafkaOptions] and
	// [Handler.WebhookOptions]), and name to type go too; they must be
	// empty for the other types.

	// Name is, for type go, the name the Go handler was registered under
	// (required; a name the binary does not have is refused when consumer
	// run starts). For a relay it tells its metrics apart (label sink);
	// default the type.
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

// PreparesAtStart reports whether `consumer run` checks the statement of a
// handler of type sql when it starts: PrepareAtStart, default true.
func (h *Handler) PreparesAtStart() bool { return h.PrepareAtStart == nil || *h.PrepareAtStart }

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
