package pgtest

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"

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
