// Package pgeventstest helps test code built on pgevents, handlers above
// all, against a real PostgreSQL, in the spirit of River's riverdbtest and
// rivertest: a throwaway migrated database in one line, a consumer for the
// length of a test, and a handler that records what was handled, to wait
// for it and check it.
//
//	func TestMain(m *testing.M) { pgeventstest.Main(m) }
//
//	func TestInvoices(t *testing.T) {
//		t.Parallel()
//		url := pgeventstest.NewDB(t, nil) // migrated, topic 1 of 8 partitions
//		rec := &pgeventstest.Recorder{Next: invoices.Handler()}
//		hs := &pgevents.Handlers{}
//		hs.HandleAll(rec)
//		pgeventstest.StartConsumer(t, url, pgevents.Config{GroupID: "billing", TotalPartitions: 8, Handlers: hs})
//		// ... append 100 events ...
//		rec.WaitHandled(t, 100, 10*time.Second)
//		rec.RequireInOrder(t) // each event once, each host's in order
//	}
//
// # The server
//
// Main starts one PostgreSQL server for the test binary: the one
// PGEVENTS_TEST_DATABASE_URL names (a postgres:// URL of a user allowed to
// create databases), or else a throwaway cluster it starts from the
// PostgreSQL server binaries on the machine (initdb and postgres, on the
// PATH or under /usr/lib/postgresql/*/bin) in a temporary directory, with
// durability off, and removes after the tests. As root, the server runs as
// the postgres user. Missing binaries are an error that says how to install
// them, never a reason to skip.
//
// # Databases
//
// NewDB gives each test a database of its own, named after it and dropped
// when it ends, so tests run in parallel and never see each other's
// tables: pgevents' schema is applied once per test binary, to a template
// database every NewDB clones (one CREATE DATABASE per test), and the
// topic is created in it. ExampleDB is NewDB for runnable examples, which
// have no testing.TB.
//
// # Consumers and what they handled
//
// StartConsumer runs a consumer on the production pool settings until the
// test ends. A Recorder, registered as a handler (or around one, as Next),
// records each event once the batch that handled it has committed: a
// batch rolled back and retried is recorded once, as its effects in the
// database are. WaitHandled waits for the events, RequireInOrder checks
// that each was handled once and each host's in the order of its offsets.
// WaitFor polls any other condition (a row the handler wrote) until a
// deadline: never sleep for a fixed time.
package pgeventstest

import (
	"context"
	"fmt"
	"hash/fnv"
	neturl "net/url"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/rs/zerolog"

	"github.com/pgevents/pgevents"
	"github.com/pgevents/pgevents/internal/logtest"
	"github.com/pgevents/pgevents/internal/pgtest"
	"github.com/pgevents/pgevents/schema"
)

// Main is the TestMain of a package that uses pgeventstest: it starts the
// server the package's tests share (see the package documentation), runs
// the tests and examples, drops what they created and stops the server,
// and exits with the tests' status.
//
//	func TestMain(m *testing.M) { pgeventstest.Main(m) }
func Main(m *testing.M) { pgtest.Main(m) }

// DefaultPartitions is the partition count of the topic NewDB creates when
// DBOptions leaves it out: schema.DefaultPartitions, as consumer migrate
// creates it when the file leaves totalPartitions out.
const DefaultPartitions = schema.DefaultPartitions

// DBOptions configures NewDB. The zero value (or nil) is a database with
// pgevents in the first schema of the search_path and topic 1 of
// DefaultPartitions partitions.
type DBOptions struct {
	// Schema, when set, is the schema pgevents is installed in (as the
	// schema key of db-event-consumer.yml, or consumer migrate with it):
	// beside the application's tables of the same names, which stay in
	// public. Code under test then names it (pgevents.Config.Schema,
	// pgevents.WithSchema). Default "": the first schema of the
	// search_path.
	Schema string
	// Topic is the topic created: ID default pgevents.DefaultTopic,
	// Partitions default DefaultPartitions, Scope default
	// schema.ScopeTopic (or the scope PGEVENTS_TEST_OFFSET_SCOPE names, so
	// that a suite runs in both scopes).
	Topic schema.TopicSpec
	// NoTopic creates no topic, for code under test that creates its own
	// (consumer migrate, adopt.Adopt).
	NoTopic bool
}

// NewDB returns the URL of a fresh database for the test, with pgevents'
// schema applied and the topic of opts (nil: the defaults) created, and
// drops it when the test and its subtests have finished. It needs Main in
// the package's TestMain, and is safe to call from parallel tests.
func NewDB(tb testing.TB, opts *DBOptions) string {
	tb.Helper()
	var o DBOptions
	if opts != nil {
		o = *opts
	}
	var url string
	if o.Schema != "" {
		if err := schema.ValidName(o.Schema); err != nil {
			tb.Fatalf("pgeventstest: DBOptions.Schema: %v", err)
		}
		// One template per schema name, migrated once per test binary.
		h := fnv.New32a()
		h.Write([]byte(o.Schema))
		tpl := pgtest.Template(tb, fmt.Sprintf("pgeventstest_schema_%08x", h.Sum32()), func(ctx context.Context, url string) error {
			return migrate(schema.WithName(ctx, o.Schema), url)
		})
		url = pgtest.NewDBFrom(tb, tpl)
	} else {
		// In the suites' schema mode (pgtest.EnvSchema), pgevents lives in
		// a schema of its own, and the URL's sessions search it first.
		url = pgtest.MigratedDB(tb)
		if n := pgtest.Schema(); n != "" {
			url = withSearchPath(tb, url, pgx.Identifier{n}.Sanitize()+",public")
		}
	}
	if !o.NoTopic {
		CreateTopic(tb, url, o.Topic, o.Schema)
	}
	return url
}

// migrate applies pgevents' schema to the database at url, in the schema
// ctx names.
func migrate(ctx context.Context, url string) error {
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return err
	}
	defer conn.Close(ctx)
	_, err = schema.Migrate(ctx, conn)
	return err
}

// withSearchPath returns url with its sessions' search_path set to path.
func withSearchPath(tb testing.TB, url, path string) string {
	tb.Helper()
	u, err := neturl.Parse(url)
	if err != nil {
		tb.Fatalf("pgeventstest: %v", err)
	}
	q := u.Query()
	q.Set("search_path", path)
	u.RawQuery = q.Encode()
	return u.String()
}

// CreateTopic creates the topic spec describes (defaults as in
// DBOptions.Topic) in the database at url, pgevents living in schemaName
// ("" for the first schema of the search_path), as consumer migrate does;
// for a test that needs more than the topic NewDB created.
func CreateTopic(tb testing.TB, url string, spec schema.TopicSpec, schemaName string) {
	tb.Helper()
	if spec.ID == 0 {
		spec.ID = pgevents.DefaultTopic
	}
	if spec.Partitions == 0 {
		spec.Partitions = DefaultPartitions
	}
	if spec.Scope == "" {
		spec.Scope = pgtest.Scope()
	}
	ctx := schema.WithName(context.Background(), schemaName)
	if schemaName == "" {
		ctx = pgtest.Context(context.Background())
	}
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		tb.Fatalf("pgeventstest: %v", err)
	}
	defer conn.Close(ctx)
	if _, _, err := schema.EnsureTopicSpec(ctx, conn, spec); err != nil {
		tb.Fatalf("pgeventstest: topic %d: %v", spec.ID, err)
	}
}

// ExampleDB is NewDB for a runnable example, which has no testing.TB: a
// failure panics, which fails the example, and the database is dropped
// once the test binary's tests and examples have run (Main).
func ExampleDB(opts *DBOptions) string {
	return NewDB(pgtest.ExampleTB("example"), opts)
}

// NewPool returns a pool on url with a consumer's production settings
// (pgevents.ParsePoolConfig), closed when the test ends.
func NewPool(tb testing.TB, url string) *pgxpool.Pool {
	tb.Helper()
	pc, err := pgevents.ParsePoolConfig(url)
	if err != nil {
		tb.Fatalf("pgeventstest: %v", err)
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), pc)
	if err != nil {
		tb.Fatalf("pgeventstest: %v", err)
	}
	tb.Cleanup(pool.Close)
	return pool
}

// WaitFor calls cond every few milliseconds until it returns true, and
// fails the test, saying what it waited for, if that has not happened
// within timeout.
func WaitFor(tb testing.TB, timeout time.Duration, what string, cond func() bool) {
	tb.Helper()
	pgtest.WaitFor(tb, timeout, what, cond)
}

// StopTimeout bounds how long stopping a consumer may take before the test
// fails.
const StopTimeout = 30 * time.Second

// StartConsumer runs a consumer of cfg on the database url names, on a pool
// of its own with the production settings, until the test ends or stop is
// called, and returns once the consumer listens for notifications (Ready).
// A Logger left nil logs warnings and errors to stderr, with the test's
// name, and checks every line the consumer logs, at every level, against
// the rules pgevents' logs keep (a key once per line, durations as
// integer milliseconds under keys ending in _ms): a line that breaks them
// fails the test. The test fails if the consumer cannot start, if Run
// returns an error, or if it does not stop within StopTimeout.
func StartConsumer(tb testing.TB, url string, cfg pgevents.Config) (c *pgevents.Consumer, stop func()) {
	tb.Helper()
	if cfg.Logger == nil {
		l, _ := logtest.Logger(tb, zerolog.WarnLevel)
		cfg.Logger = &l
	}
	pc, err := pgevents.ParsePoolConfig(url)
	if err != nil {
		tb.Fatal(err)
	}
	pc.MaxConns = int32(pgevents.PoolSize(cfg.TotalPartitions))
	pool, err := pgxpool.NewWithConfig(context.Background(), pc)
	if err != nil {
		tb.Fatal(err)
	}
	c, err = pgevents.NewConsumer(pool, cfg)
	if err != nil {
		pool.Close()
		tb.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				if err != nil {
					tb.Errorf("pgeventstest: consumer %s: %v", cfg.GroupID, err)
				}
			case <-time.After(StopTimeout):
				tb.Errorf("pgeventstest: consumer %s did not stop within %s", cfg.GroupID, StopTimeout)
			}
			pool.Close()
		})
	}
	tb.Cleanup(stop)
	deadline := time.Now().Add(10 * time.Second)
	for !c.Ready() {
		select {
		case err := <-done:
			done <- err // for stop
			tb.Fatalf("pgeventstest: consumer %s stopped before it was ready: %v", cfg.GroupID, err)
		case <-time.After(10 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			tb.Fatalf("pgeventstest: consumer %s not ready within 10 s", cfg.GroupID)
		}
	}
	return c, stop
}
