package pgevents

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgevents/pgevents/internal/pgtest"
)

// TestCheckSQLHandler: CheckSQLHandler accepts the statements SQLHandler
// runs (named parameters, casts, several commands without parameters)
// and refuses, before any event, those that cannot run: the server's
// error for a missing table or column or a syntax error, a positional
// parameter, a named one SQLHandler does not bind. It writes nothing.
func TestCheckSQLHandler(t *testing.T) {
	t.Parallel()
	ctx := pgtest.Context(context.Background())
	pool := newTopic(t, 2)
	mustExec(t, pool, handledTable)
	mustExec(t, pool, `CREATE TABLE public.paid (id bigint PRIMARY KEY, at timestamptz)`)
	check := func(statement string) error {
		return pool.AcquireFunc(ctx, func(c *pgxpool.Conn) error { return CheckSQLHandler(ctx, c.Conn(), statement) })
	}
	for _, ok := range []string{
		recordSQL,
		`INSERT INTO paid (id, at) VALUES ((@payload::jsonb->>'id')::bigint, @created_at) ON CONFLICT (id) DO NOTHING`,
		`INSERT INTO paid (id) SELECT @c_offset WHERE @event_type = 'invoice.paid' AND @epoch > 0 AND @group_id <> ''`,
		`UPDATE paid SET at = now() WHERE id = 1; DELETE FROM paid WHERE id = 2`, // several commands, no parameter
		`INSERT INTO paid (id) SELECT 1 WHERE '{"a":1}'::jsonb @> '{"a":1}'`,     // @> is an operator
	} {
		if err := check(ok); err != nil {
			t.Errorf("CheckSQLHandler(%q) = %v, want nil", ok, err)
		}
	}
	for _, tt := range []struct{ statement, code, want string }{
		{`INSERT INTO paid (id) VALUES ($1)`, "", "there is no parameter $1"},
		{`INSERT INTO paid (id) SELECT @c_offset WHERE $2::int = 1`, "", "there is no parameter $2"},
		{`INSERT INTO paid (id) VALUES ((@paylod::jsonb->>'id')::bigint)`, "", "@paylod"},
		{`INSERT INTO nosuch (id) VALUES (@c_offset)`, "42P01", `relation "nosuch" does not exist`},
		{`INSERT INTO paid (nosuch) VALUES (@c_offset)`, "42703", `column "nosuch"`},
		{`INSERT INTO paid (id) VALUS (@c_offset)`, "42601", "syntax error"},
	} {
		err := check(tt.statement)
		var pgErr *pgconn.PgError
		switch {
		case err == nil:
			t.Errorf("CheckSQLHandler(%q) = nil, want an error saying %q", tt.statement, tt.want)
		case !strings.Contains(err.Error(), tt.want):
			t.Errorf("CheckSQLHandler(%q) = %v, want it to say %q", tt.statement, err, tt.want)
		case tt.code != "" && (!errors.As(err, &pgErr) || pgErr.Code != tt.code):
			t.Errorf("CheckSQLHandler(%q) = %v, want the server's SQLSTATE %s in its chain", tt.statement, err, tt.code)
		}
	}
	if n := queryInt(t, pool, `SELECT count(*) FROM public.paid`); n != 0 {
		t.Errorf("checking wrote %d rows", n)
	}
}
