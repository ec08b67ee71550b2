package pgtest

import (
	"context"
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
func MigratedDB(tb testing.TB) string {
	tb.Helper()
	tmpl := Template(tb, "pgevents_migrated", func(ctx context.Context, url string) error {
		conn, err := pgx.Connect(ctx, url)
		if err != nil {
			return err
		}
		defer conn.Close(ctx)
		_, err = schema.Migrate(ctx, conn)
		return err
	})
	return NewDBFrom(tb, tmpl)
}

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
func TopicPoolSpec(tb testing.TB, spec schema.TopicSpec) *pgxpool.Pool {
	tb.Helper()
	ctx := context.Background()
	pc, err := pgxpool.ParseConfig(MigratedDB(tb))
	if err != nil {
		tb.Fatal(err)
	}
	pc.MaxConns = int32(spec.Partitions + 8)
	pc.ConnConfig.RuntimeParams["jit"] = "off" // as consumer pools have it
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
	if err := schema.SetSegmentSize(context.Background(), pool, topic, int64(size), schema.SegmentsAhead); err != nil {
		tb.Fatal(err)
	}
}
