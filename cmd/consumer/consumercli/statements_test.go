package consumercli

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgevents/pgevents"
	"github.com/pgevents/pgevents/config"
	"github.com/pgevents/pgevents/internal/eventtest"
	"github.com/pgevents/pgevents/internal/pgtest"
)

// sqlHandlerConfig is a configuration of group g whose one handler runs
// statement, with extra keys for the handler.
func sqlHandlerConfig(statement, extra string) string {
	return fmt.Sprintf(`groupId: g
totalPartitions: 4
offsetScope: %s
waitPeriodMs: 1000
logLevel: warn
retryMaxMs: 200
handlers:
  - eventType: "*"
    type: sql
    statement: %q
%s`, pgtest.Scope(), statement, extra)
}

// TestStatementsPreparedAtStart: `run` prepares each sql handler's
// statement before anything is handled, and exits with status 2 naming
// the statement's key and giving the server's message when one cannot
// run: a positional parameter (docs/reference.md's old example), a table
// or a column that does not exist, a named parameter a sql handler does
// not bind. The event appended before stays unhandled, its position
// unmoved. prepareAtStart: false keeps the old behaviour for a table
// created later: the consumer starts, retries, and handles the event once
// the table exists.
func TestStatementsPreparedAtStart(t *testing.T) {
	t.Parallel()
	url, pool := migrated(t, 4)
	eventtest.Exec(t, pool, `CREATE TABLE public.paid_invoices (id bigint PRIMARY KEY)`)
	ctx := pgtest.Context(context.Background())
	if _, err := pgevents.Append(ctx, pool, pgevents.Event{HostID: "h", EventType: "invoice_paid", Payload: []byte(`{"id": 7}`)}); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name, statement, want string
	}{
		{"positional parameter", `INSERT INTO paid_invoices (id) VALUES ($1)`, "there is no parameter $1"},
		{"positional after a named one", `INSERT INTO paid_invoices (id) SELECT @c_offset WHERE $2::int = 1`, "there is no parameter $2"},
		{"missing table", `INSERT INTO paid_invoicez (id) VALUES (@c_offset)`, `relation "paid_invoicez" does not exist (SQLSTATE 42P01)`},
		{"missing column", `INSERT INTO paid_invoices (invoice_id) VALUES (@c_offset)`, `column "invoice_id" of relation "paid_invoices" does not exist`},
		{"misspelt parameter", `INSERT INTO paid_invoices (id) VALUES ((@paylod::jsonb->>'id')::bigint)`, "@paylod"},
		{"syntax", `INSERT INTO paid_invoices (id) VALUS (@c_offset)`, "syntax error"},
	} {
		cfg := writeConfig(t, sqlHandlerConfig(tt.statement, ""))
		code, out := runOnce(t, url, "run", "--config", cfg)
		if code != exitUsage || !strings.Contains(out, "handlers[0].statement: cannot be prepared") || !strings.Contains(out, tt.want) {
			t.Errorf("%s: run exited %d, want 2 naming handlers[0].statement and saying %q\n%s", tt.name, code, tt.want, out)
		}
	}
	// A file of several groups names the group's item.
	two := writeConfig(t, fmt.Sprintf(`totalPartitions: 4
offsetScope: %s
logLevel: warn
groups:
  - groupId: a
    handlers:
      - eventType: "*"
        type: log
        output: stderr
  - groupId: b
    handlers:
      - eventType: "*"
        type: sql
        statement: INSERT INTO paid_invoices (id) VALUES ($1)
`, pgtest.Scope()))
	if code, out := runOnce(t, url, "run", "--config", two); code != exitUsage || !strings.Contains(out, "groups[1].handlers[0].statement: cannot be prepared") {
		t.Errorf("two groups: run exited %d, want 2 naming groups[1].handlers[0].statement\n%s", code, out)
	}
	if n := eventtest.QueryInt(t, pool, `SELECT count(*) FROM consumer_offsets WHERE next_offset > 1`); n != 0 {
		t.Errorf("a refused run moved %d positions", n)
	}

	// The reference's example, fixed, runs.
	fixed := writeConfig(t, sqlHandlerConfig(`INSERT INTO paid_invoices (id) VALUES ((@payload::jsonb->>'id')::bigint)`, ""))
	p := start(t, url, "run", "--config", fixed)
	pgtest.WaitFor(t, 20*time.Second, "invoice 7 inserted", func() bool {
		return eventtest.QueryInt(t, pool, `SELECT count(*) FROM public.paid_invoices WHERE id = 7`) == 1
	})
	if code := p.stop(t, 20*time.Second); code != 0 {
		t.Fatalf("run exited %d", code)
	}

	// prepareAtStart: false: a table created after the start.
	url2, pool2 := migrated(t, 4)
	if _, err := pgevents.Append(ctx, pool2, pgevents.Event{HostID: "h", EventType: "invoice_paid", Payload: []byte(`{"id": 8}`)}); err != nil {
		t.Fatal(err)
	}
	late := writeConfig(t, sqlHandlerConfig(`INSERT INTO later_invoices (id) VALUES ((@payload::jsonb->>'id')::bigint)`, "    prepareAtStart: false\n"))
	p = start(t, url2, "run", "--config", late)
	pgtest.WaitFor(t, 20*time.Second, "the batch retried as a deployment failure", func() bool {
		return strings.Contains(p.out.String(), `relation \"later_invoices\" does not exist`)
	})
	eventtest.Exec(t, pool2, `CREATE TABLE public.later_invoices (id bigint PRIMARY KEY)`)
	pgtest.WaitFor(t, 20*time.Second, "invoice 8 inserted once the table exists", func() bool {
		return eventtest.QueryInt(t, pool2, `SELECT count(*) FROM public.later_invoices WHERE id = 8`) == 1
	})
	if code := p.stop(t, 20*time.Second); code != 0 {
		t.Fatalf("run exited %d", code)
	}
}

// TestStatementsCheckNotTheStatementsFault: what stops the check without
// the statement being at fault is no configuration error. A consumer
// stopped as it prepares (SIGTERM while starting: ctx ended) is not
// refused, and run returns as a stop does (a run of processes stopped
// during their start once exited 2 naming handlers[0].statement, "cannot
// be prepared: context canceled"); a session that cannot be had (the
// server gone) is an error of its own, not the statement's.
func TestStatementsCheckNotTheStatementsFault(t *testing.T) {
	t.Parallel()
	url, _ := migrated(t, 4)
	path := writeConfig(t, fmt.Sprintf("databaseUrl: %q\n", url)+sqlHandlerConfig(`INSERT INTO paid_invoices (id) VALUES (@c_offset)`, ""))
	cfg, err := config.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	ctx := pgtest.Context(context.Background())
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	stopped, cancel := context.WithCancel(ctx)
	cancel()
	if err := checkStatements(stopped, cfg, []*pgxpool.Pool{pool}, path); err != nil {
		t.Errorf("check stopped as it started: %v, want nil (a stop, not a refusal)", err)
	}
	gone, err := pgxpool.New(ctx, "postgres://pgevents@127.0.0.1:1/none?connect_timeout=2")
	if err != nil {
		t.Fatal(err)
	}
	defer gone.Close()
	err = checkStatements(ctx, cfg, []*pgxpool.Pool{gone}, path)
	var ce *config.Error
	if err == nil || errors.As(err, &ce) {
		t.Errorf("check on a server that is gone: %v, want an error that is not the configuration's", err)
	}
}
