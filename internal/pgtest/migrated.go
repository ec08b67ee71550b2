package pgtest

import (
	"context"
	"fmt"
	"os"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgevents/pgevents/schema"
)

// MigratedDB returns the URL of a fresh database with pgevents' schema
// applied and no topic. The schema is applied once per test binary, to a
// template database that every call clones, so the common case costs one
// CREATE DATABASE.
//
// In schema mode (EnvSchema), the database also holds, in public, the
// tables of a seed-style deployment (SeedTables), and pgevents lives in
// the schema beside them.
func MigratedDB(tb testing.TB) string {
	tb.Helper()
	name := "pgevents_migrated"
	if Schema() != "" {
		name = "pgevents_migrated_beside_seed"
	}
	tmpl := Template(tb, name, func(ctx context.Context, url string) error {
		conn, err := pgx.Connect(ctx, url)
		if err != nil {
			return err
		}
		defer conn.Close(ctx)
		if Schema() != "" {
			if _, err := conn.Exec(ctx, SeedTables); err != nil {
				return err
			}
		}
		_, err = schema.Migrate(Context(ctx), conn)
		return err
	})
	return NewDBFrom(tb, tmpl)
}

// EnvSchema names the environment variable that runs the tests in schema
// mode: pgevents lives in the schema it names (say "pgevents"), beside the
// tables of a seed-style deployment of the same names in public
// (SeedTables), as a team adopting pgevents has it. Consumers in tests run
// with Config.Schema set to it (Schema) on connections whose search_path
// is the server's default, without that schema: what pgevents runs must
// name its objects in it, and what handlers run finds public's tables.
// Pools from TopicPool search the schema first and then public, so that
// tests read pgevents' tables by their plain names; tables the handlers
// write are created in public (public.handled).
const EnvSchema = "PGEVENTS_TEST_SCHEMA"

// Schema returns the schema of schema mode (EnvSchema), or "" when the tests
// run with pgevents in the first schema of the search_path. An invalid name
// panics: the run is misconfigured.
func Schema() string {
	n := os.Getenv(EnvSchema)
	if n == "" {
		return ""
	}
	if err := schema.ValidName(n); err != nil {
		panic(fmt.Sprintf("pgtest: %s: %v", EnvSchema, err))
	}
	return n
}

// Context returns ctx naming the schema of schema mode (schema.WithName), for
// the statements tests run through pgevents' packages.
func Context(ctx context.Context) context.Context {
	return schema.WithName(ctx, Schema())
}

// SeedTables creates the tables of a deployment of the seed design, as
// teams run it in production, in the first schema of the search_path:
// log_counter(id, next_offset) with its one row, outbox_message_t with uuid
// ids, hosts, users and transactions and a c_offset, consumer_offsets,
// a dead_letter_queue of its own, and the trigger function notify_event()
// that sends 'new_event' on event_channel. Every name but the trigger's
// is one that pgevents uses too.
const SeedTables = `CREATE TABLE log_counter (
    id INT PRIMARY KEY,
    next_offset BIGINT NOT NULL DEFAULT 1
);
INSERT INTO log_counter (id, next_offset) VALUES (1, 1);

CREATE TABLE consumer_offsets (
    group_id VARCHAR(255),
    topic_id INT,
    partition_id INT,
    next_offset BIGINT NOT NULL DEFAULT 1,
    PRIMARY KEY (group_id, topic_id, partition_id)
);

CREATE TABLE outbox_message_t (
    id                uuid PRIMARY KEY,
    host_id           uuid NOT NULL,
    user_id           uuid,
    nonce             bigint NOT NULL DEFAULT 1,
    aggregate_id      varchar(255) NOT NULL DEFAULT '',
    aggregate_type    varchar(255) NOT NULL DEFAULT '',
    event_type        varchar(255) NOT NULL,
    aggregate_version bigint NOT NULL DEFAULT 1,
    payload           jsonb NOT NULL,
    metadata          jsonb,
    transaction_id    uuid,
    correlation_id    varchar(255),
    created_dt        timestamptz NOT NULL DEFAULT now(),
    c_offset          bigint UNIQUE
);
CREATE INDEX idx_outbox_offset ON outbox_message_t (c_offset);

CREATE TABLE dead_letter_queue (
    id         uuid PRIMARY KEY,
    group_id   varchar(255) NOT NULL,
    c_offset   bigint NOT NULL,
    payload    jsonb,
    error      text,
    created_dt timestamptz NOT NULL DEFAULT now()
);

CREATE FUNCTION notify_event() RETURNS TRIGGER AS $$
BEGIN
    PERFORM pg_notify('event_channel', 'new_event');
    RETURN NEW;
END;
$$ LANGUAGE plpgsql;

CREATE TRIGGER event_trigger
AFTER INSERT ON outbox_message_t
FOR EACH STATEMENT EXECUTE FUNCTION notify_event();
`

// EnvOffsetScope names the environment variable that chooses the offset
// scope of the topics TopicPool creates: "topic" (the default) or
// "partition". make test runs the main suites in both.
const EnvOffsetScope = "PGEVENTS_TEST_OFFSET_SCOPE"

// Scope returns the offset scope tests create topics with (EnvOffsetScope).
func Scope() string {
	if os.Getenv(EnvOffsetScope) == schema.ScopePartition {
		return schema.ScopePartition
	}
	return schema.ScopeTopic
}

// TopicPool returns a pool on a fresh migrated database that holds topic 1
// with the given partition count, in the offset scope of Scope, with room
// for a consumer of every partition plus test queries. The pool is closed
// when the test ends.
func TopicPool(tb testing.TB, partitions int) *pgxpool.Pool {
	tb.Helper()
	return TopicPoolSpec(tb, schema.TopicSpec{ID: 1, Partitions: partitions, Scope: Scope()})
}

// TopicPoolSpec is TopicPool for the topic spec describes.
//
// In schema mode the pool's sessions search that schema first, then
// public; the search_path is set on the pool's configuration, not in its
// connection string, so that a pool made from the string (as consumers in
// tests are given) has the server's default search_path.
func TopicPoolSpec(tb testing.TB, spec schema.TopicSpec) *pgxpool.Pool {
	tb.Helper()
	ctx := Context(context.Background())
	pc, err := pgxpool.ParseConfig(MigratedDB(tb))
	if err != nil {
		tb.Fatal(err)
	}
	pc.MaxConns = int32(spec.Partitions + 8)
	pc.ConnConfig.RuntimeParams["jit"] = "off" // as consumer pools have it
	if n := Schema(); n != "" {
		pc.ConnConfig.RuntimeParams["search_path"] = pgx.Identifier{n}.Sanitize() + ", public"
	}
	pool, err := pgxpool.NewWithConfig(ctx, pc)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(pool.Close)
	if _, _, err := schema.EnsureTopicSpec(ctx, pool, spec); err != nil {
		tb.Fatal(err)
	}
	return pool
}

// ResizeSegments gives an empty topic segments of size offsets: its
// segments are dropped and created again at that size, as a topic created
// with that size would have them. Tests use it to see segments fill and go
// with few events.
func ResizeSegments(tb testing.TB, pool *pgxpool.Pool, topic, size int) {
	tb.Helper()
	if err := schema.SetSegmentSize(Context(context.Background()), pool, topic, int64(size), schema.SegmentsAhead); err != nil {
		tb.Fatal(err)
	}
}
