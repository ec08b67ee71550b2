package pgevents

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgevents/pgevents/internal/pgtest"
)

// TestWithDefaults: every zero field takes its Default constant, and a set
// field keeps its value.
func TestWithDefaults(t *testing.T) {
	c := Config{}.WithDefaults()
	want := Config{
		TopicID: DefaultTopic, BatchSize: DefaultBatchSize, WaitPeriod: DefaultWaitPeriod,
		RetryInitial: DefaultRetryInitial, RetryMax: DefaultRetryMax, MaxAttempts: DefaultMaxAttempts,
		MaxDeadLetters: DefaultMaxDeadLetters, DeadLetterWindow: DefaultDeadLetterWindow,
		HandlerTimeout: DefaultHandlerTimeout, ShutdownTimeout: DefaultShutdownTimeout,
		LeaseDuration: DefaultLeaseDuration, StartFrom: DefaultStartFrom, DeadAfter: DefaultDeadAfter,
		MaintenanceInterval: DefaultMaintenanceInterval,
	}
	if c.TopicID != want.TopicID || c.BatchSize != want.BatchSize || c.WaitPeriod != want.WaitPeriod ||
		c.Channel != want.Channel || c.RetryInitial != want.RetryInitial || c.RetryMax != want.RetryMax ||
		c.MaxAttempts != want.MaxAttempts || c.MaxDeadLetters != want.MaxDeadLetters ||
		c.DeadLetterWindow != want.DeadLetterWindow || c.HandlerTimeout != want.HandlerTimeout ||
		c.ShutdownTimeout != want.ShutdownTimeout || c.LeaseDuration != want.LeaseDuration ||
		c.StartFrom != want.StartFrom || c.DeadAfter != want.DeadAfter || c.MaintenanceInterval != want.MaintenanceInterval {
		t.Fatalf("WithDefaults() = %+v", c)
	}
	if got := (Config{BatchSize: 7, RetryInitial: time.Minute}).WithDefaults(); got.BatchSize != 7 || got.RetryMax != time.Minute {
		t.Fatalf("set fields changed: BatchSize %d, RetryMax %s (want 7, and RetryMax raised to RetryInitial)", got.BatchSize, got.RetryMax)
	}
}

// TestNewConsumerNamesTheField: NewConsumer refuses a configuration it
// cannot use with a *ConfigError naming the field.
func TestNewConsumerNamesTheField(t *testing.T) {
	pool := &pgxpool.Pool{} // never used: validation comes first
	hs := &Handlers{}
	hs.HandleAll(HandlerFunc(nil))
	ok := Config{GroupID: "g", TotalPartitions: 2, Handlers: hs}
	for field, cfg := range map[string]Config{
		"GroupID":            {TotalPartitions: 2, Handlers: hs},
		"TotalPartitions":    {GroupID: "g", Handlers: hs},
		"Handlers":           {GroupID: "g", TotalPartitions: 2},
		"BatchSize":          with(ok, func(c *Config) { c.BatchSize = -1 }),
		"StartFrom":          with(ok, func(c *Config) { c.StartFrom = "yesterday" }),
		"Partitions":         with(ok, func(c *Config) { c.Partitions = []int{5} }),
		"Schema":             with(ok, func(c *Config) { c.Schema = "Not Valid" }),
		"WaitPeriod":         with(ok, func(c *Config) { c.WaitPeriod = -time.Second }),
		"OnPermanentFailure": with(ok, func(c *Config) { c.OnPermanentFailure = 9 }),
	} {
		_, err := NewConsumer(pool, cfg)
		var ce *ConfigError
		if !errors.As(err, &ce) || ce.Field != field {
			t.Errorf("%s: NewConsumer error %v, want a *ConfigError naming it", field, err)
		}
	}
	if _, err := NewConsumer(pool, ok); err != nil {
		t.Fatalf("a valid configuration refused: %v", err)
	}
}

func with(c Config, f func(*Config)) Config { f(&c); return c }

// TestPolicyNames: the policies read and write their configuration names,
// and an unknown name is an error that lists the known ones.
func TestPolicyNames(t *testing.T) {
	for _, p := range []FailurePolicy{PolicyDeadLetter, PolicyParkHost, PolicyHalt} {
		var back FailurePolicy
		text, err := p.MarshalText()
		if err != nil || back.UnmarshalText(text) != nil || back != p {
			t.Errorf("%v: %q, %v -> %v", p, text, err, back)
		}
	}
	for _, p := range []UnknownEventPolicy{UnknownEventFail, UnknownEventSkip} {
		var back UnknownEventPolicy
		text, err := p.MarshalText()
		if err != nil || back.UnmarshalText(text) != nil || back != p {
			t.Errorf("%v: %q, %v -> %v", p, text, err, back)
		}
	}
	var p FailurePolicy
	if err := p.UnmarshalText([]byte("park")); err == nil || err.Error() != `must be one of deadLetter, parkHost, halt, got "park"` {
		t.Errorf("UnmarshalText(park) = %v", err)
	}
}

// TestParseStartPosition: every form reads back as written.
func TestParseStartPosition(t *testing.T) {
	for _, v := range []string{"earliest", "latest", "offset:42", "time:2026-01-31T12:00:00Z"} {
		s, err := ParseStartPosition(v)
		if err != nil || s.String() != v {
			t.Errorf("ParseStartPosition(%q) = %v, %v; want it back", v, s, err)
		}
	}
	for _, v := range []string{"", "offset:0", "time:yesterday", "first"} {
		if _, err := ParseStartPosition(v); err == nil {
			t.Errorf("ParseStartPosition(%q) accepted", v)
		}
	}
}

// TestPoolSessionTimeouts: the consumer pool's sessions get the default
// timeouts, the ones PoolOptions gives, or, with ServerSetting, the
// server's own (statementTimeoutMs: 0 in the file), and a timeout the URL
// sets wins.
func TestPoolSessionTimeouts(t *testing.T) {
	t.Parallel()
	url := pgtest.MigratedDB(t)
	show := func(opts PoolOptions, url string) (statement, idle string) {
		t.Helper()
		pc, err := NewPoolConfig(url, opts)
		if err != nil {
			t.Fatal(err)
		}
		pool, err := pgxpool.NewWithConfig(context.Background(), pc)
		if err != nil {
			t.Fatal(err)
		}
		defer pool.Close()
		if err := pool.QueryRow(context.Background(), `SELECT current_setting('statement_timeout'), current_setting('idle_in_transaction_session_timeout')`).
			Scan(&statement, &idle); err != nil {
			t.Fatal(err)
		}
		return statement, idle
	}
	if s, i := show(PoolOptions{}, url); s != "30s" || i != "1min" {
		t.Errorf("defaults: statement_timeout %s, idle %s; want 30s, 1min", s, i)
	}
	if s, i := show(PoolOptions{StatementTimeout: 5 * time.Second, IdleInTransactionTimeout: 2 * time.Minute}, url); s != "5s" || i != "2min" {
		t.Errorf("set: statement_timeout %s, idle %s; want 5s, 2min", s, i)
	}
	if s, i := show(PoolOptions{StatementTimeout: ServerSetting, IdleInTransactionTimeout: ServerSetting}, url); s != "0" || i != "0" {
		t.Errorf("server's setting: statement_timeout %s, idle %s; want the server's 0, 0", s, i)
	}
	if s, _ := show(PoolOptions{StatementTimeout: ServerSetting}, url+"&statement_timeout=7000"); s != "7s" {
		t.Errorf("the URL's statement_timeout lost: %s", s)
	}
}

// TestPoolIdleTime: a consumer pool closes connections idle for
// DefaultMaxConnIdleTime, looking every DefaultHealthCheckPeriod, unless
// the URL sets either.
func TestPoolIdleTime(t *testing.T) {
	t.Parallel()
	const url = "postgres://u@localhost/db?sslmode=disable"
	pc, err := ParsePoolConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	if pc.MaxConnIdleTime != DefaultMaxConnIdleTime || pc.HealthCheckPeriod != DefaultHealthCheckPeriod {
		t.Errorf("defaults: idle %s, check %s; want %s, %s", pc.MaxConnIdleTime, pc.HealthCheckPeriod, DefaultMaxConnIdleTime, DefaultHealthCheckPeriod)
	}
	pc, err = ParsePoolConfig(url + "&pool_max_conn_idle_time=10m&pool_health_check_period=30s")
	if err != nil {
		t.Fatal(err)
	}
	if pc.MaxConnIdleTime != 10*time.Minute || pc.HealthCheckPeriod != 30*time.Second {
		t.Errorf("the URL's settings lost: idle %s, check %s", pc.MaxConnIdleTime, pc.HealthCheckPeriod)
	}
}
