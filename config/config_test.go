package config

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/pgevents/pgevents"
	"github.com/pgevents/pgevents/schema"
)

// clearEnv makes the tests independent of the caller's DATABASE_URL.
func clearEnv(t *testing.T) {
	t.Helper()
	t.Setenv(envDatabaseURL, "")
}

// mustParse parses src and fails the test on error.
func mustParse(t *testing.T, src string) *Config {
	t.Helper()
	c, err := Parse([]byte(src))
	if err != nil {
		t.Fatalf("Parse: unexpected error: %v", err)
	}
	return c
}

// parseErr parses src and returns the *Error it must fail with.
func parseErr(t *testing.T, src string) *Error {
	t.Helper()
	c, err := Parse([]byte(src))
	if err == nil {
		t.Fatalf("Parse: expected an error, got %+v", c)
	}
	if c != nil {
		t.Errorf("Parse: expected a nil *Config with the error, got %+v", c)
	}
	var cfgErr *Error
	if !errors.As(err, &cfgErr) {
		t.Fatalf("Parse: error %v (%T) is not a *config.Error", err, err)
	}
	return cfgErr
}

const fullFile = `# every key
databaseUrl: postgres://u:p@db:5432/app
schema: pgevents
groupId: billing
topicId: 3
batchSize: 250
totalPartitions: 16
partitionId: 15
waitPeriodMs: 2500
channel: billing_events
logLevel: debug
logFormat: json
unknownEventType: skip
maxConns: 12
shutdownTimeoutMs: 5000
retryInitialMs: 50
retryMaxMs: 60000
maxAttempts: 9
onPermanentFailure: parkHost
maxDeadLetterRate: -1
deadLetterWindowMs: 1000
handlerTimeoutMs: 2000
statementTimeoutMs: 0
idleInTransactionTimeoutMs: 5000
leaseMs: 1500
startFrom: time:2026-01-31T12:00:00Z
deadAfterMs: 30000
maintenanceIntervalMs: 5000
retention: 36h
maxRetention: 30d
zeroSubscriptionRetention: 2d
idempotencyWindow: 36h
segmentSize: 50000
offsetAllocation: sequence
offsetScope: partition
metricsAddr: 127.0.0.1:9464
pprof: true
tracing:
  endpoint: http://collector:4318
  serviceName: billing-consumer
  sampleRatio: 0.25
  headers: {Authorization: Bearer t0k}
handlers:
  - eventType: "*"
    type: log
  - eventType: invoice.*
    type: log
    output: /var/log/paid.log
  - eventType: invoice_paid
    type: sql
    statement: |
      INSERT INTO paid (id) VALUES (@c_offset)
`

func TestParseFullFile(t *testing.T) {
	clearEnv(t)
	got := mustParse(t, fullFile)
	want := &Config{
		DatabaseURL:       "postgres://u:p@db:5432/app",
		Schema:            "pgevents",
		GroupID:           "billing",
		TopicID:           3,
		BatchSize:         250,
		TotalPartitions:   16,
		PartitionID:       15,
		WaitPeriodMs:      2500,
		Channel:           "billing_events",
		LogLevel:          "debug",
		LogFormat:         "json",
		UnknownEventType:  "skip",
		MaxConns:          12,
		ShutdownTimeoutMs: 5000,
		RetryInitialMs:    50,
		RetryMaxMs:        60000,
		MaxAttempts:       9,

		OnPermanentFailure:         "parkHost",
		MaxDeadLetterRate:          -1,
		DeadLetterWindowMs:         1000,
		HandlerTimeoutMs:           2000,
		StatementTimeoutMs:         0,
		IdleInTransactionTimeoutMs: 5000,
		LeaseMs:                    1500,
		StartFrom:                  "time:2026-01-31T12:00:00Z",
		DeadAfterMs:                30000,
		MaintenanceIntervalMs:      5000,
		Retention:                  "36h",
		MaxRetention:               "30d",
		ZeroSubscriptionRetention:  "2d",
		IdempotencyWindow:          "36h",
		SegmentSize:                50000,
		OffsetAllocation:           "sequence",
		OffsetScope:                "partition",
		MetricsAddr:                "127.0.0.1:9464",
		Pprof:                      true,
		Tracing: &Tracing{Endpoint: "http://collector:4318", ServiceName: "billing-consumer", SampleRatio: 0.25,
			Headers: map[string]string{"Authorization": "Bearer t0k"}},
		Handlers: []Handler{
			{EventType: "*", Type: "log", Output: "stdout"},
			{EventType: "invoice.*", Type: "log", Output: "/var/log/paid.log"},
			{EventType: "invoice_paid", Type: "sql", Statement: "INSERT INTO paid (id) VALUES (@c_offset)\n"},
		},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("Parse:\n got %+v\nwant %+v", got, want)
	}
	if err := got.Validate(); err != nil {
		t.Errorf("Validate on a parsed config: %v", err)
	}
}

func TestParseSeedFile(t *testing.T) {
	clearEnv(t)
	got := mustParse(t, `databaseUrl: postgres://localhost/events
groupId: group-1
batchSize: 10
totalPartitions: 4
partitionId: 2
waitPeriodMs: 500
`)
	want := Default()
	want.DatabaseURL = "postgres://localhost/events"
	want.GroupID = "group-1"
	want.BatchSize = 10
	want.TotalPartitions = 4
	want.PartitionID = 2
	want.WaitPeriodMs = 500
	if !reflect.DeepEqual(*got, want) {
		t.Errorf("Parse:\n got %+v\nwant %+v", *got, want)
	}
}

func TestParseAppliesDefaults(t *testing.T) {
	clearEnv(t)
	got := mustParse(t, "databaseUrl: postgres://localhost/db\ngroupId: g\nhandlers:\n")
	want := Default()
	want.DatabaseURL = "postgres://localhost/db"
	want.GroupID = "g"
	if !reflect.DeepEqual(*got, want) {
		t.Errorf("Parse:\n got %+v\nwant %+v", *got, want)
	}

	// Spot-check the documented defaults themselves.
	d := Default()
	checks := []struct {
		name      string
		got, want any
	}{
		{"DatabaseURL", d.DatabaseURL, ""},
		{"GroupID", d.GroupID, ""},
		{"TopicID", d.TopicID, 1},
		{"BatchSize", d.BatchSize, 100},
		{"TotalPartitions", d.TotalPartitions, 8},
		{"PartitionID", d.PartitionID, -1},
		{"WaitPeriodMs", d.WaitPeriodMs, 10000},
		{"Channel", d.Channel, ""},
		{"LogLevel", d.LogLevel, "info"},
		{"LogFormat", d.LogFormat, "auto"},
		{"UnknownEventType", d.UnknownEventType, "fail"},
		{"MaxConns", d.MaxConns, 0},
		{"ShutdownTimeoutMs", d.ShutdownTimeoutMs, 10000},
		{"RetryInitialMs", d.RetryInitialMs, 100},
		{"RetryMaxMs", d.RetryMaxMs, 30000},
		{"MaxAttempts", d.MaxAttempts, 5},
		{"Handlers", len(d.Handlers), 0},
	}
	for _, c := range checks {
		if c.got != c.want {
			t.Errorf("Default().%s = %v, want %v", c.name, c.got, c.want)
		}
	}
}

func TestDatabaseURLOverride(t *testing.T) {
	tests := []struct {
		name    string
		env     string
		file    string
		want    string
		wantErr bool
	}{
		{"env replaces file", "postgres://env/db", "databaseUrl: postgres://file/db\n", "postgres://env/db", false},
		{"env alone", "postgres://env/db", "", "postgres://env/db", false},
		{"empty env keeps file", "", "databaseUrl: postgres://file/db\n", "postgres://file/db", false},
		{"neither", "", "", "", true},
		{"empty in file, no env", "", "databaseUrl: \"\"\n", "", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Setenv(envDatabaseURL, tt.env)
			src := tt.file + "groupId: g\n"
			if tt.wantErr {
				e := parseErr(t, src)
				if e.Key != "databaseUrl" {
					t.Fatalf("Key = %q, want %q (error: %v)", e.Key, "databaseUrl", e)
				}
				if !strings.Contains(e.Msg, "DATABASE_URL") {
					t.Errorf("Msg = %q, want a mention of DATABASE_URL", e.Msg)
				}
				return
			}
			if got := mustParse(t, src).DatabaseURL; got != tt.want {
				t.Errorf("DatabaseURL = %q, want %q", got, tt.want)
			}
		})
	}
}

func TestParseErrors(t *testing.T) {
	clearEnv(t)
	const head = "databaseUrl: postgres://localhost/db\ngroupId: g\n" // lines 1-2

	tests := []struct {
		name     string
		src      string
		wantKey  string
		wantLine int    // 0: do not check
		wantMsg  string // substring; "": do not check
	}{
		// The file itself.
		{"empty file", "", "", 0, "empty"},
		{"only comments", "# nothing\n", "", 0, "empty"},
		{"top level is a list", "- a\n- b\n", "", 1, "mapping"},
		{"top level is a scalar", "hello\n", "", 1, "mapping"},
		{"syntax error", "groupId: [unclosed\n", "", 0, "invalid YAML"},
		{"bad indentation", "groupId: g\n  batchSize: 3\n", "", 0, "invalid YAML"},
		{"two documents", head + "---\ngroupId: h\n", "", 0, "single YAML document"},

		// Shape problems.
		{"unknown key", head + "batchSzie: 10\n", "batchSzie", 3, "unknown key"},
		{"duplicate key", head + "batchSize: 1\nbatchSize: 2\n", "batchSize", 4, "duplicate key"},
		{"wrong type string for int", head + "batchSize: abc\n", "batchSize", 3, "integer"},
		{"quoted int", head + `batchSize: "10"` + "\n", "batchSize", 3, "integer"},
		{"float for int", head + "batchSize: 1.5\n", "batchSize", 3, "integer"},
		{"null for int", head + "batchSize:\n", "batchSize", 3, "integer"},
		{"list for int", head + "waitPeriodMs: [1]\n", "waitPeriodMs", 3, "integer"},
		{"int overflow", head + "maxConns: 99999999999999999999\n", "maxConns", 3, "integer"},
		{"mapping for string", head + "channel: {a: b}\n", "channel", 3, "string"},
		{"handlers not a list", head + "handlers: {eventType: x}\n", "handlers", 3, "list"},
		{"handler not a mapping", head + "handlers:\n  - log\n", "handlers[0]", 4, "mapping"},
		{"unknown key in handler", head + "handlers:\n  - eventType: a\n    type: log\n    outptu: stderr\n", "handlers[0].outptu", 6, "unknown key"},
		{"duplicate key in handler", head + "handlers:\n  - eventType: a\n    eventType: b\n", "handlers[0].eventType", 5, "duplicate key"},
		{"wrong type in handler", head + "handlers:\n  - eventType: [a]\n    type: log\n", "handlers[0].eventType", 4, "string"},

		// Value problems.
		{"missing groupId", "databaseUrl: postgres://localhost/db\n", "groupId", 0, "required"},
		{"empty groupId", "databaseUrl: x\ngroupId: \"\"\n", "groupId", 2, "required"},
		{"long groupId", "databaseUrl: x\ngroupId: " + strings.Repeat("g", 201) + "\n", "groupId", 2, "200"},
		{"topicId 0", head + "topicId: 0\n", "topicId", 3, "greater than 0"},
		{"batchSize 0", head + "batchSize: 0\n", "batchSize", 3, "greater than 0"},
		{"batchSize -1", head + "batchSize: -1\n", "batchSize", 3, "greater than 0"},
		{"onPermanentFailure unknown", head + "onPermanentFailure: retry\n", "onPermanentFailure", 3, "must be one of"},
		{"maxDeadLetterRate 0", head + "maxDeadLetterRate: 0\n", "maxDeadLetterRate", 3, "greater than 0"},
		{"statementTimeoutMs negative", head + "statementTimeoutMs: -1\n", "statementTimeoutMs", 3, "must be 0"},
		{"leaseMs too short", head + "leaseMs: 50\n", "leaseMs", 3, "between 100"},
		{"startFrom unknown", head + "startFrom: beginning\n", "startFrom", 3, "earliest, latest"},
		{"startFrom bad time", head + "startFrom: time:yesterday\n", "startFrom", 3, "RFC 3339"},
		{"startFrom offset 0", head + "startFrom: offset:0\n", "startFrom", 3, "at least 1"},
		{"retention not a duration", head + "retention: forever\n", "retention", 3, "positive duration"},
		{"idempotencyWindow not a duration", head + "idempotencyWindow: a day\n", "idempotencyWindow", 3, "positive duration"},
		{"idempotencyWindow zero", head + "idempotencyWindow: 0s\n", "idempotencyWindow", 3, "positive duration"},
		{"idempotencyWindow negative", head + "idempotencyWindow: -2h\n", "idempotencyWindow", 3, "positive duration"},
		{"idempotencyWindow empty", head + "idempotencyWindow: \"\"\n", "idempotencyWindow", 3, "positive duration"},
		{"tracing not a mapping", head + "tracing: on\n", "tracing", 3, "mapping"},
		{"tracing unknown key", head + "tracing:\n  insecure: true\n", "tracing.insecure", 4, "unknown key"},
		{"tracing endpoint without scheme", head + "tracing:\n  endpoint: collector:4318\n", "tracing.endpoint", 4, "http://"},
		{"tracing endpoint grpc", head + "tracing:\n  endpoint: grpc://collector:4317\n", "tracing.endpoint", 4, "http://"},
		{"tracing endpoint without host", head + "tracing:\n  endpoint: http:///v1\n", "tracing.endpoint", 4, "host"},
		{"tracing sampleRatio above 1", head + "tracing:\n  sampleRatio: 1.5\n", "tracing.sampleRatio", 4, "between 0 and 1"},
		{"tracing sampleRatio negative", head + "tracing:\n  sampleRatio: -0.1\n", "tracing.sampleRatio", 4, "between 0 and 1"},
		{"tracing sampleRatio NaN", head + "tracing:\n  sampleRatio: .nan\n", "tracing.sampleRatio", 4, "number"},
		{"tracing sampleRatio text", head + "tracing:\n  sampleRatio: all\n", "tracing.sampleRatio", 4, "number"},
		{"tracing headers not a mapping", head + "tracing:\n  headers: [a]\n", "tracing.headers", 4, "mapping"},
		{"tracing header unset variable", head + "tracing:\n  headers: {X-Token: \"${PGEVENTS_TEST_UNSET_VARIABLE}\"}\n", "tracing.headers.X-Token", 4, "not set"},
		{"tracing header bad name", head + "tracing:\n  headers: {\"a b\": x}\n", "tracing.headers", 4, "header name"},
		{"offsetAllocation unknown", head + "offsetAllocation: uuid\n", "offsetAllocation", 3, "must be one of"},
		{"offsetScope unknown", head + "offsetScope: host\n", "offsetScope", 3, "must be one of"},
		{"schema uppercase", head + "schema: PgEvents\n", "schema", 3, "identifier"},
		{"schema quoted", head + "schema: 'pg\"events'\n", "schema", 3, "identifier"},
		{"schema system", head + "schema: pg_events\n", "schema", 3, "pg_"},
		{"segmentSize too small", head + "segmentSize: 10\n", "segmentSize", 3, "at least 1000"},
		{"metricsAddr without port", head + "metricsAddr: localhost\n", "metricsAddr", 3, "host:port"},
		{"pprof not a bool", head + "pprof: maybe\n", "pprof", 3, "true or false"},
		{"totalPartitions 0", head + "totalPartitions: 0\n", "totalPartitions", 3, "between 1 and 1024"},
		{"totalPartitions 1025", head + "totalPartitions: 1025\n", "totalPartitions", 3, "between 1 and 1024"},
		{"partitionId == totalPartitions", head + "totalPartitions: 4\npartitionId: 4\n", "partitionId", 4, "between 0 and 3"},
		{"partitionId == default totalPartitions", head + "partitionId: 8\n", "partitionId", 3, "between 0 and 7"},
		{"partitionId -2", head + "partitionId: -2\n", "partitionId", 3, "-1"},
		{"waitPeriodMs 0", head + "waitPeriodMs: 0\n", "waitPeriodMs", 3, "greater than 0"},
		{"waitPeriodMs overflow", head + "waitPeriodMs: 9223372036854775807\n", "waitPeriodMs", 3, "at most"},
		{"channel uppercase", head + "channel: Events\n", "channel", 3, "identifier"},
		{"channel reserved", head + "channel: select\n", "channel", 3, "identifier"},
		{"logLevel", head + "logLevel: verbose\n", "logLevel", 3, "debug, info, warn, error"},
		{"logFormat", head + "logFormat: text\n", "logFormat", 3, "auto, json, console"},
		{"unknownEventType", head + "unknownEventType: ignore\n", "unknownEventType", 3, "fail, skip"},
		{"maxConns -1", head + "maxConns: -1\n", "maxConns", 3, "0"},
		{"shutdownTimeoutMs 0", head + "shutdownTimeoutMs: 0\n", "shutdownTimeoutMs", 3, "greater than 0"},
		{"retryInitialMs 0", head + "retryInitialMs: 0\n", "retryInitialMs", 3, "greater than 0"},
		{"retryMaxMs below initial", head + "retryInitialMs: 500\nretryMaxMs: 400\n", "retryMaxMs", 4, "retryInitialMs"},
		{"maxAttempts 0", head + "maxAttempts: 0\n", "maxAttempts", 3, "greater than 0"},
		{"handler missing eventType", head + "handlers:\n  - type: log\n", "handlers[0].eventType", 4, "required"},
		{"handler missing type", head + "handlers:\n  - eventType: a\n", "handlers[0].type", 4, "required"},
		{"handler bad type", head + "handlers:\n  - eventType: a\n    type: grpc\n", "handlers[0].type", 5, "log, sql, kafka, http"},
		{"sql handler without statement", head + "handlers:\n  - eventType: a\n    type: log\n  - eventType: b\n    type: sql\n", "handlers[1].statement", 6, "required"},
		{"sql handler with output", head + "handlers:\n  - eventType: a\n    type: sql\n    statement: SELECT 1\n    output: stderr\n", "handlers[0].output", 7, "empty"},
		{"log handler with statement", head + "handlers:\n  - eventType: a\n    type: log\n    statement: SELECT 1\n", "handlers[0].statement", 6, "empty"},
		{"log handler with prepareAtStart", head + "handlers:\n  - eventType: a\n    type: log\n    prepareAtStart: false\n", "handlers[0].prepareAtStart", 6, "empty for type log"},
		{"prepareAtStart not a boolean", head + "handlers:\n  - eventType: a\n    type: sql\n    statement: SELECT 1\n    prepareAtStart: later\n", "handlers[0].prepareAtStart", 7, "true or false"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := parseErr(t, tt.src)
			if e.Key != tt.wantKey {
				t.Fatalf("Key = %q, want %q (error: %v)", e.Key, tt.wantKey, e)
			}
			if tt.wantLine != 0 && e.Line != tt.wantLine {
				t.Errorf("Line = %d, want %d (error: %v)", e.Line, tt.wantLine, e)
			}
			if !strings.Contains(e.Msg, tt.wantMsg) {
				t.Errorf("Msg = %q, want it to contain %q", e.Msg, tt.wantMsg)
			}
			if e.File != "" {
				t.Errorf("File = %q, want empty from Parse", e.File)
			}
		})
	}
}

func TestParseReportsFirstErrorInDocumentOrder(t *testing.T) {
	clearEnv(t)
	tests := []struct {
		name    string
		src     string
		wantKey string
	}{
		{
			"value problems in file order, not field order",
			"databaseUrl: x\ngroupId: g\nmaxAttempts: 0\nbatchSize: 0\n",
			"maxAttempts",
		},
		{
			"shape problem before value problem",
			"databaseUrl: x\ngroupId: g\nbatchSize: 0\nbogus: 1\n",
			"bogus",
		},
		{
			"first of two unknown keys",
			"databaseUrl: x\ngroupId: g\nzzz: 1\naaa: 2\n",
			"zzz",
		},
		{
			"values present in the file before missing keys",
			"databaseUrl: x\nbatchSize: 0\n",
			"batchSize",
		},
		{
			"missing keys in field order",
			"batchSize: 5\n",
			"databaseUrl",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// Run twice: the choice must be deterministic.
			for range 2 {
				if e := parseErr(t, tt.src); e.Key != tt.wantKey {
					t.Fatalf("Key = %q, want %q (error: %v)", e.Key, tt.wantKey, e)
				}
			}
		})
	}
}

func TestParseAcceptsEdgeValues(t *testing.T) {
	clearEnv(t)
	const head = "databaseUrl: x\ngroupId: g\n"
	tests := []struct {
		name  string
		src   string
		check func(c *Config) bool
	}{
		{"partitionId 0", head + "partitionId: 0\n", func(c *Config) bool { return c.PartitionID == 0 }},
		{"partitionId last", head + "totalPartitions: 1024\npartitionId: 1023\n", func(c *Config) bool { return c.PartitionID == 1023 }},
		{"partitionId -1 explicit", head + "partitionId: -1\n", func(c *Config) bool { return c.PartitionID == -1 }},
		{"retryMaxMs equal to initial", head + "retryInitialMs: 7\nretryMaxMs: 7\n", func(c *Config) bool { return c.RetryMaxMs == 7 }},
		{"numeric groupId", "databaseUrl: x\ngroupId: 42\n", func(c *Config) bool { return c.GroupID == "42" }},
		{"groupId 200 chars", "databaseUrl: x\ngroupId: " + strings.Repeat("é", 200) + "\n", func(c *Config) bool { return len(c.GroupID) == 400 }},
		{"empty handler list", head + "handlers: []\n", func(c *Config) bool { return len(c.Handlers) == 0 }},
		{"log handler to stderr", head + "handlers:\n  - {eventType: a, type: log, output: stderr}\n", func(c *Config) bool { return c.Handlers[0].Output == "stderr" }},
		{"alias", head + "batchSize: &n 7\nmaxAttempts: *n\n", func(c *Config) bool { return c.MaxAttempts == 7 }},
		{"hex int", head + "batchSize: 0x10\n", func(c *Config) bool { return c.BatchSize == 16 }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if c := mustParse(t, tt.src); !tt.check(c) {
				t.Errorf("unexpected result %+v", c)
			}
		})
	}
}

func TestLoad(t *testing.T) {
	clearEnv(t)
	dir := t.TempDir()
	write := func(name, content string) string {
		t.Helper()
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}

	t.Run("good", func(t *testing.T) {
		path := write("good.yml", "databaseUrl: x\ngroupId: g\nbatchSize: 3\n")
		c, err := Load(path)
		if err != nil {
			t.Fatalf("Load: %v", err)
		}
		if c.BatchSize != 3 || c.GroupID != "g" {
			t.Errorf("Load = %+v", c)
		}
	})

	t.Run("invalid value", func(t *testing.T) {
		path := write("bad.yml", "databaseUrl: x\ngroupId: g\nbatchSize: 0\n")
		_, err := Load(path)
		var e *Error
		if !errors.As(err, &e) {
			t.Fatalf("Load error %v (%T) is not a *config.Error", err, err)
		}
		if e.File != path || e.Key != "batchSize" || e.Line != 3 {
			t.Errorf("Load error = %+v, want File %q, Key batchSize, Line 3", e, path)
		}
		want := "config " + path + ": batchSize: must be greater than 0, got 0 (line 3)"
		if err.Error() != want {
			t.Errorf("Error() = %q, want %q", err.Error(), want)
		}
	})

	t.Run("missing file", func(t *testing.T) {
		path := filepath.Join(dir, "nope.yml")
		_, err := Load(path)
		var e *Error
		if !errors.As(err, &e) {
			t.Fatalf("Load error %v (%T) is not a *config.Error", err, err)
		}
		if e.Key != "" || e.File != path {
			t.Errorf("Load error = %+v, want empty Key and File %q", e, path)
		}
		if !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("errors.Is(%v, fs.ErrNotExist) = false, want true", err)
		}
	})

	t.Run("syntax error", func(t *testing.T) {
		path := write("syntax.yml", "groupId: [\n")
		_, err := Load(path)
		var e *Error
		if !errors.As(err, &e) {
			t.Fatalf("Load error %v (%T) is not a *config.Error", err, err)
		}
		if e.Key != "" || e.File != path {
			t.Errorf("Load error = %+v, want empty Key and File %q", e, path)
		}
	})
}

func TestValidate(t *testing.T) {
	valid := func() Config {
		c := Default()
		c.DatabaseURL = "postgres://localhost/db"
		c.GroupID = "g"
		return c
	}

	tests := []struct {
		name    string
		mutate  func(c *Config)
		wantKey string // "": valid
	}{
		{"defaults plus required keys", func(c *Config) {}, ""},
		{"zero Config", func(c *Config) { *c = Config{} }, "databaseUrl"},
		{"Default alone", func(c *Config) { *c = Default() }, "databaseUrl"},
		{"missing groupId", func(c *Config) { c.GroupID = "" }, "groupId"},
		{"blank groupId", func(c *Config) { c.GroupID = "  " }, "groupId"},
		{"batchSize 0", func(c *Config) { c.BatchSize = 0 }, "batchSize"},
		{"partitionId too big", func(c *Config) { c.PartitionID = 8 }, "partitionId"},
		{"partitionId -2", func(c *Config) { c.PartitionID = -2 }, "partitionId"},
		{"log handler empty output", func(c *Config) { c.Handlers = []Handler{{EventType: "*", Type: "log"}} }, ""},
		{"sql handler blank statement", func(c *Config) { c.Handlers = []Handler{{EventType: "*", Type: "sql", Statement: " \n"}} }, "handlers[0].statement"},
		{"retryMaxMs 0 with bad initial", func(c *Config) { c.RetryInitialMs, c.RetryMaxMs = 0, 0 }, "retryInitialMs"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := valid()
			tt.mutate(&c)
			err := c.Validate()
			if tt.wantKey == "" {
				if err != nil {
					t.Fatalf("Validate: unexpected error: %v", err)
				}
				return
			}
			var e *Error
			if !errors.As(err, &e) {
				t.Fatalf("Validate error %v (%T) is not a *config.Error", err, err)
			}
			if e.Key != tt.wantKey {
				t.Errorf("Key = %q, want %q (error: %v)", e.Key, tt.wantKey, e)
			}
			if e.Line != 0 || e.File != "" {
				t.Errorf("Validate set Line %d / File %q, want neither", e.Line, e.File)
			}
		})
	}
}

func TestErrorString(t *testing.T) {
	tests := []struct {
		err  *Error
		want string
	}{
		{&Error{File: "db-event-consumer.yml", Key: "batchSize", Line: 3, Msg: "must be greater than 0"}, "config db-event-consumer.yml: batchSize: must be greater than 0 (line 3)"},
		{&Error{Key: "batchSize", Msg: "must be greater than 0"}, "config: batchSize: must be greater than 0"},
		{&Error{File: "c.yml", Msg: "file is empty"}, "config c.yml: file is empty"},
		{&Error{Line: 2, Msg: "top level must be a mapping"}, "config: top level must be a mapping (line 2)"},
	}
	for _, tt := range tests {
		if got := tt.err.Error(); got != tt.want {
			t.Errorf("Error() = %q, want %q", got, tt.want)
		}
	}
}

func TestIsValidIdentifier(t *testing.T) {
	tests := []struct {
		s    string
		want bool
	}{
		{"event_channel", true},
		{"_x", true},
		{"a1", true},
		{strings.Repeat("a", 63), true},
		{"listen", true}, // unreserved key word
		{"", false},
		{strings.Repeat("a", 64), false},
		{"1a", false},
		{"Events", false},
		{"event-channel", false},
		{"event channel", false},
		{"évent", false},
		{"select", false},
		{"user", false},
		{"order", false},
	}
	for _, tt := range tests {
		if got := IsValidIdentifier(tt.s); got != tt.want {
			t.Errorf("IsValidIdentifier(%q) = %v, want %v", tt.s, got, tt.want)
		}
	}
}

func TestDurations(t *testing.T) {
	c := Default()
	c.WaitPeriodMs = 1500
	c.RetryInitialMs = 100
	c.RetryMaxMs = 30000
	c.ShutdownTimeoutMs = 10000
	tests := []struct {
		name string
		got  time.Duration
		want time.Duration
	}{
		{"WaitPeriod", c.WaitPeriod(), 1500 * time.Millisecond},
		{"RetryInitial", c.RetryInitial(), 100 * time.Millisecond},
		{"RetryMax", c.RetryMax(), 30 * time.Second},
		{"ShutdownTimeout", c.ShutdownTimeout(), 10 * time.Second},
	}
	for _, tt := range tests {
		if tt.got != tt.want {
			t.Errorf("%s() = %v, want %v", tt.name, tt.got, tt.want)
		}
	}
}

func TestParseGroups(t *testing.T) {
	clearEnv(t)
	c := mustParse(t, `databaseUrl: postgres://x
batchSize: 50
totalPartitions: 4
groups:
  - groupId: emails
    handlers:
      - eventType: "*"
        type: log
  - groupId: search
    batchSize: 500
    partitionId: 2
    handlers:
      - eventType: user.created
        type: sql
        statement: SELECT 1
`)
	gs := c.GroupConfigs()
	if len(gs) != 2 {
		t.Fatalf("%d groups, want 2", len(gs))
	}
	if gs[0].GroupID != "emails" || gs[0].BatchSize != 50 || gs[0].TotalPartitions != 4 || gs[0].PartitionID != -1 ||
		gs[0].DatabaseURL != "postgres://x" || gs[0].Handlers[0].Output != "stdout" {
		t.Errorf("first group does not inherit the top level: %+v", gs[0])
	}
	if gs[1].GroupID != "search" || gs[1].BatchSize != 500 || gs[1].PartitionID != 2 || gs[1].Handlers[0].Type != "sql" {
		t.Errorf("second group's own keys: %+v", gs[1])
	}
	one := mustParse(t, "databaseUrl: x\ngroupId: solo\n")
	if gs := one.GroupConfigs(); len(gs) != 1 || gs[0].GroupID != "solo" {
		t.Errorf("a file without groups runs its one group: %+v", gs)
	}
}

func TestParseGroupsErrors(t *testing.T) {
	clearEnv(t)
	head := "databaseUrl: x\ngroups:\n"
	cases := []struct{ name, yaml, key string }{
		{"top-level groupId", "databaseUrl: x\ngroupId: g\ngroups:\n  - groupId: a\n", "groupId"},
		{"top-level handlers", "databaseUrl: x\nhandlers:\n  - eventType: \"*\"\n    type: log\ngroups:\n  - groupId: a\n", "handlers"},
		{"unknown group key", head + "  - groupId: a\n    channel: c\n", "groups[0].channel"},
		{"group batchSize 0", head + "  - groupId: a\n  - groupId: b\n    batchSize: 0\n", "groups[1].batchSize"},
		{"group without groupId", head + "  - batchSize: 5\n", "groups[0].groupId"},
		{"group partitionId outside", head + "  - groupId: a\n    totalPartitions: 2\n    partitionId: 2\n", "groups[0].partitionId"},
		{"duplicate group", head + "  - groupId: a\n  - groupId: a\n", "groups[1].groupId"},
		{"bad group handler", head + "  - groupId: a\n    handlers:\n      - eventType: x\n        type: sql\n", "groups[0].handlers[0].statement"},
		{"groups not a list", "databaseUrl: x\ngroups: 3\n", "groups"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse([]byte(tc.yaml))
			var ce *Error
			if !errors.As(err, &ce) || ce.Key != tc.key {
				t.Fatalf("Parse error %v, want one naming %q", err, tc.key)
			}
		})
	}
}

// TestHandlerEventTypes: a handler's eventType is an event type, a prefix
// pattern ending in ".*" or "*"; any other "*" is refused, and so is a
// second handler of one group with the same eventType, naming both keys.
// Groups have their handlers each: one eventType in two groups is fine.
func TestHandlerEventTypes(t *testing.T) {
	clearEnv(t)
	const head = "databaseUrl: x\ngroupId: g\nhandlers:\n" // lines 1-3
	item := func(eventType string) string {
		return "  - eventType: \"" + eventType + "\"\n    type: sql\n    statement: SELECT 1\n"
	}

	t.Run("valid", func(t *testing.T) {
		c := mustParse(t, head+item("user.created")+item("user.*")+item("user.admin.*")+item("*")+item("order.placed"))
		if len(c.Handlers) != 5 {
			t.Fatalf("%d handlers, want 5", len(c.Handlers))
		}
		mustParse(t, "databaseUrl: x\ngroups:\n  - groupId: a\n    handlers: [{eventType: order.placed, type: log}]\n"+
			"  - groupId: b\n    handlers: [{eventType: order.placed, type: log}]\n")
	})

	for _, tc := range []struct {
		name, src, key string
		line           int
		msg            string
	}{
		{"two sql handlers for one type", head + item("order.placed") + item("order.placed"),
			"handlers[1].eventType", 7, `duplicates handlers[0].eventType "order.placed"`},
		{"the duplicate after others", head + item("a") + item("user.*") + item("b") + item("user.*"),
			"handlers[3].eventType", 13, `duplicates handlers[1].eventType "user.*"`},
		{"two catch-alls", head + item("*") + item("*"), "handlers[1].eventType", 7, `duplicates handlers[0].eventType "*"`},
		{"in a group", "databaseUrl: x\ngroups:\n  - groupId: a\n  - groupId: b\n    handlers:\n" +
			"      - {eventType: order.placed, type: log}\n      - {eventType: order.placed, type: sql, statement: SELECT 1}\n",
			"groups[1].handlers[1].eventType", 7, `duplicates groups[1].handlers[0].eventType "order.placed"`},
		{"star inside a segment", head + item("us*er"), "handlers[0].eventType", 4, "not an event type or pattern"},
		{"star ending a segment", head + item("user*"), "handlers[0].eventType", 4, "not an event type or pattern"},
		{"star not last", head + item("*.created"), "handlers[0].eventType", 4, "not an event type or pattern"},
		{"star in the middle", head + item("user.*.created"), "handlers[0].eventType", 4, "not an event type or pattern"},
		{"two stars", head + item("user.**"), "handlers[0].eventType", 4, "not an event type or pattern"},
		{"double star", head + item("**"), "handlers[0].eventType", 4, "not an event type or pattern"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := parseErr(t, tc.src)
			if e.Key != tc.key || e.Line != tc.line || !strings.Contains(e.Msg, tc.msg) {
				t.Fatalf("error %q (key %q, line %d), want key %q, line %d, a message with %q", e, e.Key, e.Line, tc.key, tc.line, tc.msg)
			}
		})
	}

	t.Run("message", func(t *testing.T) {
		e := parseErr(t, "databaseUrl: x\ngroups:\n  - groupId: a\n    handlers:\n"+
			"      - {eventType: order.placed, type: sql, statement: SELECT 1}\n      - {eventType: order.placed, type: sql, statement: SELECT 2}\n")
		want := `config: groups[0].handlers[1].eventType: duplicates groups[0].handlers[0].eventType "order.placed"`
		if !strings.HasPrefix(e.Error(), want) {
			t.Fatalf("error %q, want it to start with %q", e, want)
		}
	})
}

func TestParseDuration(t *testing.T) {
	if d, err := ParseDuration("1.5d"); err != nil || d != 36*time.Hour {
		t.Errorf("ParseDuration(1.5d) = %v, %v", d, err)
	}
}

// TestParseRelays: the kafka and http handler types, every key.
func TestParseRelays(t *testing.T) {
	clearEnv(t)
	t.Setenv("TEST_KAFKA_PASSWORD", "s3cret")
	t.Setenv("TEST_TOKEN", "tok")
	c := mustParse(t, `databaseUrl: x
groupId: g
handlers:
  - eventType: "*"
    type: kafka
    name: portal
    brokers: ["kafka-1:9092", "kafka-2:9092"]
    topic: portal.{event_type}
    key: host_id
    format: cloudevents
    source: /portal
    tls: {caFile: /ca.pem, certFile: /c.pem, keyFile: /k.pem}
    sasl: {mechanism: SCRAM-SHA-512, user: relay, password: "${TEST_KAFKA_PASSWORD}"}
    deliveryTimeoutMs: 5000
    maxRecordBytes: 65536
  - eventType: trade.booked
    type: http
    url: https://hooks.example.com/trades
    method: PUT
    headers: {Authorization: "Bearer ${TEST_TOKEN}", X-Source: pgevents}
    timeoutMs: 2000
    format: json
    concurrency: 4
`)
	want := []Handler{{
		EventType: "*", Type: "kafka", Name: "portal", Brokers: []string{"kafka-1:9092", "kafka-2:9092"},
		Topic: "portal.{event_type}", Key: "host_id", Format: "cloudevents", Source: "/portal",
		TLS:  &TLS{CAFile: "/ca.pem", CertFile: "/c.pem", KeyFile: "/k.pem"},
		SASL: &SASL{Mechanism: "SCRAM-SHA-512", User: "relay", Password: "s3cret"}, DeliveryTimeoutMs: 5000, MaxRecordBytes: 65536,
	}, {
		EventType: "trade.booked", Type: "http", URL: "https://hooks.example.com/trades", Method: "PUT",
		Headers: map[string]string{"Authorization": "Bearer tok", "X-Source": "pgevents"}, TimeoutMs: 2000, Format: "json", Concurrency: 4,
	}}
	if !reflect.DeepEqual(c.Handlers, want) {
		t.Fatalf("handlers\n%+v\nwant\n%+v", c.Handlers, want)
	}
}

// TestParseRelayErrors: an invalid relay configuration names the key.
func TestParseRelayErrors(t *testing.T) {
	clearEnv(t)
	const head = "databaseUrl: x\ngroupId: g\nhandlers:\n  - eventType: \"*\"\n" // lines 1-4
	const kafka = head + "    type: kafka\n"                                     // line 5
	const http = head + "    type: http\n"
	const brokers = "    brokers: [k:9092]\n"
	for _, tt := range []struct{ name, src, key, msg string }{
		{"no brokers", kafka + "    topic: t\n", "handlers[0].brokers", "required"},
		{"empty brokers", kafka + "    brokers: []\n    topic: t\n", "handlers[0].brokers", "required"},
		{"broker without port", kafka + "    brokers: [kafka]\n    topic: t\n", "handlers[0].brokers[0]", "host:port"},
		{"brokers not a list", kafka + "    brokers: k:9092\n    topic: t\n", "handlers[0].brokers", "list"},
		{"no topic", kafka + brokers, "handlers[0].topic", "required"},
		{"bad template", kafka + brokers + "    topic: portal.{event_typ}\n", "handlers[0].topic", "unknown field {event_typ}"},
		{"unclosed template", kafka + brokers + "    topic: portal.{event_type\n", "handlers[0].topic", "without '}'"},
		{"bad key template", kafka + brokers + "    topic: t\n    key: \"{tenant}\"\n", "handlers[0].key", "unknown field"},
		{"unknown kafka format", kafka + brokers + "    topic: t\n    format: avro\n", "handlers[0].format", "raw or cloudevents"},
		{"json is not a kafka format", kafka + brokers + "    topic: t\n    format: json\n", "handlers[0].format", "raw or cloudevents"},
		{"sasl mechanism", kafka + brokers + "    topic: t\n    sasl: {mechanism: GSSAPI, user: u, password: p}\n", "handlers[0].sasl.mechanism", "SCRAM-SHA-512"},
		{"sasl without password", kafka + brokers + "    topic: t\n    sasl: {mechanism: PLAIN, user: u}\n", "handlers[0].sasl.password", "required"},
		{"password from an unset variable", kafka + brokers + "    topic: t\n    sasl: {mechanism: PLAIN, user: u, password: \"${TEST_UNSET_PASSWORD}\"}\n", "handlers[0].sasl.password", "TEST_UNSET_PASSWORD"},
		{"unknown sasl key", kafka + brokers + "    topic: t\n    sasl: {mechanism: PLAIN, usr: u}\n", "handlers[0].sasl.usr", "unknown key"},
		{"tls cert without key", kafka + brokers + "    topic: t\n    tls: {certFile: c.pem}\n", "handlers[0].tls", "together"},
		{"delivery timeout too short", kafka + brokers + "    topic: t\n    deliveryTimeoutMs: 10\n", "handlers[0].deliveryTimeoutMs", "at least 1000"},
		{"delivery timeout over the handler timeout", kafka + brokers + "    topic: t\n    deliveryTimeoutMs: 30000\n", "handlers[0].deliveryTimeoutMs", "handlerTimeoutMs"},
		{"maxRecordBytes", kafka + brokers + "    topic: t\n    maxRecordBytes: 100\n", "handlers[0].maxRecordBytes", "between 512"},
		{"http key on kafka", kafka + brokers + "    topic: t\n    url: http://x\n", "handlers[0].url", "empty for type kafka"},
		{"statement on kafka", kafka + brokers + "    topic: t\n    statement: SELECT 1\n", "handlers[0].statement", "empty for type kafka"},
		{"missing url", http, "handlers[0].url", "required"},
		{"relative url", http + "    url: /hooks\n", "handlers[0].url", "absolute"},
		{"ftp url", http + "    url: ftp://x/y\n", "handlers[0].url", "absolute"},
		{"unknown http format", http + "    url: http://x\n    format: xml\n", "handlers[0].format", "json or cloudevents"},
		{"bad method", http + "    url: http://x\n    method: \"GET /\"\n", "handlers[0].method", "HTTP method"},
		{"idempotency key header", http + "    url: http://x\n    headers: {Idempotency-Key: k}\n", "handlers[0].headers.Idempotency-Key", "event_id"},
		{"header from an unset variable", http + "    url: http://x\n    headers: {Authorization: \"Bearer ${TEST_UNSET_TOKEN}\"}\n", "handlers[0].headers.Authorization", "not set"},
		{"negative concurrency", http + "    url: http://x\n    concurrency: -1\n", "handlers[0].concurrency", "positive"},
		{"kafka key on http", http + "    url: http://x\n    topic: t\n", "handlers[0].topic", "empty for type http"},
		{"relay key on log", head + "    type: log\n    brokers: [k:1]\n", "handlers[0].brokers", "empty for type log"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			e := parseErr(t, tt.src)
			if e.Key != tt.key || !strings.Contains(e.Msg, tt.msg) {
				t.Fatalf("error %v, want key %s and a message with %q", e, tt.key, tt.msg)
			}
		})
	}
}

// TestParseGroupDatabases: a groups item may run on a database (and in a
// schema) of its own; the others take the top level's, after DATABASE_URL,
// which does not replace a group's own. Databases lists each database
// once, with its groups, the key that sets it and its pool's size.
func TestParseGroupDatabases(t *testing.T) {
	t.Setenv(envDatabaseURL, "postgres://env/main")
	c := mustParse(t, `databaseUrl: postgres://file/main
schema: pgevents
totalPartitions: 4
groups:
  - groupId: emails
  - groupId: orders
    databaseUrl: postgres://file/orders
    schema: orders_log
    totalPartitions: 2
  - groupId: search
  - groupId: audit
    databaseUrl: postgres://file/orders
    partitionId: 1
`)
	gs := c.GroupConfigs()
	for i, want := range []struct{ url, schema string }{
		{"postgres://env/main", "pgevents"}, {"postgres://file/orders", "orders_log"},
		{"postgres://env/main", "pgevents"}, {"postgres://file/orders", "pgevents"},
	} {
		if gs[i].DatabaseURL != want.url || gs[i].Schema != want.schema {
			t.Errorf("groups[%d] on %q in %q, want %q in %q", i, gs[i].DatabaseURL, gs[i].Schema, want.url, want.schema)
		}
	}
	for i, own := range []bool{false, true, false, true} {
		if c.OwnDatabase(i) != own {
			t.Errorf("OwnDatabase(%d) = %v, want %v", i, c.OwnDatabase(i), own)
		}
	}
	for i, same := range []bool{true, false, true, false} {
		if c.SameInstallation(i) != same {
			t.Errorf("SameInstallation(%d) = %v, want %v", i, c.SameInstallation(i), same)
		}
	}
	want := []Database{
		{URL: "postgres://env/main", Key: "databaseUrl", Groups: []int{0, 2}, PoolSize: 2 * pgevents.PoolSize(4)},
		{URL: "postgres://file/orders", Key: "groups[1].databaseUrl", Groups: []int{1, 3}, PoolSize: pgevents.PoolSize(2) + pgevents.PoolSize(1)},
	}
	if got := c.Databases(); !reflect.DeepEqual(got, want) {
		t.Errorf("Databases() = %+v\nwant %+v", got, want)
	}
	c.MaxConns = 7
	for _, d := range c.Databases() {
		if d.PoolSize != 7 {
			t.Errorf("with maxConns 7, the pool of %s has %d connections", d.URL, d.PoolSize)
		}
	}
	if k := c.KeyPath(3, "databaseUrl"); k != "groups[3].databaseUrl" {
		t.Errorf("KeyPath(3, databaseUrl) = %q", k)
	}
	if k := c.KeyPath(2, "databaseUrl"); k != "databaseUrl" {
		t.Errorf("KeyPath(2, databaseUrl) = %q: the group takes the top level's", k)
	}
	if k := c.KeyPath(3, "schema"); k != "schema" {
		t.Errorf("KeyPath(3, schema) = %q: the group takes the top level's", k)
	}

	// One database: the top level's, whatever the groups.
	one := mustParse(t, "databaseUrl: x\ngroups:\n  - groupId: a\n  - groupId: b\n")
	if dbs := one.Databases(); len(dbs) != 1 || dbs[0].URL != "postgres://env/main" || dbs[0].Key != "databaseUrl" || len(dbs[0].Groups) != 2 {
		t.Errorf("Databases() of groups without databaseUrl = %+v", dbs)
	}
}

// TestParseGroupDatabaseErrors: the keys of a group's database and schema
// are the group's when it sets them, the top level's when it inherits.
func TestParseGroupDatabaseErrors(t *testing.T) {
	clearEnv(t)
	for _, tc := range []struct{ name, yaml, key, msg string }{
		{"empty group databaseUrl", "databaseUrl: x\ngroups:\n  - groupId: a\n    databaseUrl: \"\"\n", "groups[0].databaseUrl", "must not be empty"},
		{"group databaseUrl not a string", "databaseUrl: x\ngroups:\n  - groupId: a\n    databaseUrl: [x]\n", "groups[0].databaseUrl", "string"},
		{"bad group schema", "databaseUrl: x\ngroups:\n  - groupId: a\n  - groupId: b\n    schema: Orders\n", "groups[1].schema", "identifier"},
		{"bad top-level schema under groups", "databaseUrl: x\nschema: Orders\ngroups:\n  - groupId: a\n  - groupId: b\n", "schema", "identifier"},
		{"no top-level databaseUrl", "groups:\n  - groupId: a\n    databaseUrl: postgres://a/b\n", "databaseUrl", "required"},
		{"one group twice on two databases", "databaseUrl: x\ngroups:\n  - groupId: a\n  - groupId: a\n    databaseUrl: y\n", "groups[1].groupId", "already listed"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := parseErr(t, tc.yaml)
			if e.Key != tc.key || !strings.Contains(e.Msg, tc.msg) {
				t.Fatalf("error %v, want one naming %q and saying %q", e, tc.key, tc.msg)
			}
		})
	}
}

// TestIdempotencyWindowDefault: the file's default is the schema's.
func TestIdempotencyWindowDefault(t *testing.T) {
	clearEnv(t)
	c := mustParse(t, "databaseUrl: x\ngroupId: g\n")
	d, err := ParseDuration(c.IdempotencyWindow)
	if err != nil || d != schema.DefaultIdempotencyWindow {
		t.Fatalf("default idempotencyWindow %q = %v (%v), want schema.DefaultIdempotencyWindow %v", c.IdempotencyWindow, d, err, schema.DefaultIdempotencyWindow)
	}
	if c := mustParse(t, "databaseUrl: x\ngroupId: g\nidempotencyWindow: 2d\n"); c.IdempotencyWindow != "2d" {
		t.Fatalf("idempotencyWindow = %q", c.IdempotencyWindow)
	}
}

// TestParseTracing: without the section nothing is traced; the section
// alone (or empty) is on with every default; TracesURL appends /v1/traces
// as OTEL_EXPORTER_OTLP_ENDPOINT does; the service name falls back on
// OTEL_SERVICE_NAME, then on the default.
func TestParseTracing(t *testing.T) {
	clearEnv(t)
	t.Setenv(EnvServiceName, "")
	if c := mustParse(t, "databaseUrl: x\ngroupId: g\n"); c.Tracing != nil {
		t.Fatalf("Tracing without the section: %+v", c.Tracing)
	}
	for _, src := range []string{"tracing:\n", "tracing: {}\n"} {
		c := mustParse(t, "databaseUrl: x\ngroupId: g\n"+src)
		if c.Tracing == nil || c.Tracing.SampleRatio != 1 || c.Tracing.Endpoint != "" || c.Tracing.Service() != DefaultTracingServiceName {
			t.Errorf("%q: Tracing %+v, want on with the defaults", src, c.Tracing)
		}
	}
	t.Setenv(EnvServiceName, "from-env")
	c := mustParse(t, "databaseUrl: x\ngroupId: g\ntracing: {sampleRatio: 0}\n")
	if c.Tracing.SampleRatio != 0 || c.Tracing.Service() != "from-env" {
		t.Errorf("Tracing %+v, service %q", c.Tracing, c.Tracing.Service())
	}
	c.Tracing.ServiceName = "mine"
	if c.Tracing.Service() != "mine" {
		t.Errorf("serviceName does not win over %s", EnvServiceName)
	}
	for in, want := range map[string]string{
		"http://collector:4318":      "http://collector:4318/v1/traces",
		"https://collector/":         "https://collector/v1/traces",
		"https://gw.example/otlp/":   "https://gw.example/otlp/v1/traces",
		"http://127.0.0.1:9/a/b/c":   "http://127.0.0.1:9/a/b/c/v1/traces",
		"http://user:pw@collector:1": "http://user:pw@collector:1/v1/traces",
	} {
		got, err := (&Tracing{Endpoint: in}).TracesURL()
		if err != nil || got != want {
			t.Errorf("TracesURL of %q = %q, %v; want %q", in, got, err, want)
		}
	}
}
