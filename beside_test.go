package pgevents

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgevents/pgevents/internal/eventtest"
	"github.com/pgevents/pgevents/internal/pgtest"
	"github.com/pgevents/pgevents/schema"
)

// TestBesideSeedTables installs pgevents in a schema of its own in a
// database that holds a seed-style deployment (log_counter,
// outbox_message_t, consumer_offsets, dead_letter_queue and notify_event()
// in public), appends from SQL (schema-qualified, from sessions whose
// search_path does not hold pgevents' schema) and from Go, and consumes
// with a handler that writes the application's own dead_letter_queue:
// every event handled once, in order, and the application's tables
// untouched by pgevents.
func TestBesideSeedTables(t *testing.T) {
	t.Parallel()
	const name = "pgevents"
	ctx := context.Background()
	sctx := WithSchema(ctx, name)
	url := pgtest.NewDB(t)
	app := pgtest.Pool(t, url) // the application's sessions: the server's default search_path
	mustExec(t, app, pgtest.SeedTables)
	mustExec(t, app, `INSERT INTO public.outbox_message_t (id, host_id, event_type, payload, c_offset)
		VALUES (gen_random_uuid(), gen_random_uuid(), 'seed', '{}', 1)`)
	mustExec(t, app, `UPDATE public.log_counter SET next_offset = 2 WHERE id = 1`)

	// Without a schema of its own, pgevents clashes with the seed's tables.
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := schema.Migrate(ctx, conn); err == nil || !strings.Contains(err.Error(), "already exists") {
		t.Fatalf("Migrate into public beside the seed's tables: err %v, want a clash", err)
	}
	if _, err := schema.Migrate(sctx, conn); err != nil {
		t.Fatal(err)
	}
	if _, _, err := schema.EnsureTopicSpec(sctx, conn, schema.TopicSpec{ID: 1, Partitions: 4, Scope: pgtest.Scope()}); err != nil {
		t.Fatal(err)
	}
	publicTables := queryInt(t, app, `SELECT count(*) FROM pg_tables WHERE schemaname = 'public'`)
	if publicTables != 4 {
		t.Fatalf("public holds %d tables after migrate, want the seed's 4", publicTables)
	}
	if n := queryInt(t, app, `SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE n.nspname = $1 AND c.relname IN ('log_counter', 'outbox_message_t', 'consumer_offsets', 'dead_letter_queue')`, name); n != 4 {
		t.Fatalf("schema %s holds %d of pgevents' tables and views of the seed's names, want 4", name, n)
	}

	mustExec(t, app, handledTable)
	hs := &Handlers{}
	hs.HandleAll(HandlerFunc(func(ctx context.Context, tx pgx.Tx, ev *Event) error {
		if err := SQLHandler("g", recordSQL).Handle(ctx, tx, ev); err != nil {
			return err
		}
		return SQLHandler("g", `INSERT INTO dead_letter_queue (id, group_id, c_offset, payload, error)
			VALUES (@event_id::uuid, @group_id, @c_offset, @payload::jsonb, 'written by a handler')`).Handle(ctx, tx, ev)
	}))
	// The consumer's connections have the server's default search_path too.
	startConsumer(t, app, Config{TotalPartitions: 4, BatchSize: 5, Schema: name, Handlers: hs})

	seed := rand.Uint64()
	rng := rand.New(rand.NewPCG(seed, 0))
	t.Logf("seed %d", seed)
	want := 0
	for i := range 30 {
		tx, err := app.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		n := 1 + rng.IntN(4)
		switch i % 3 {
		case 0: // SQL, one event per statement, schema-qualified
			for k := range n {
				host := fmt.Sprintf("h%d", rng.IntN(7))
				if _, err := tx.Exec(ctx, `SELECT pgevents.append_event(1, $1, 'u', 'sql', $2::jsonb)`, host, fmt.Sprintf(`{"k":%d}`, k)); err != nil {
					t.Fatalf("pgevents.append_event from the application's session: %v", err)
				}
			}
		case 1: // SQL, a batch
			var evs []string
			for range n {
				evs = append(evs, fmt.Sprintf(`{"host_id":"h%d","event_type":"batch","payload":{}}`, rng.IntN(7)))
			}
			if _, err := tx.Exec(ctx, `SELECT pgevents.append_events(1, $1::jsonb)`, "["+strings.Join(evs, ",")+"]"); err != nil {
				t.Fatalf("pgevents.append_events from the application's session: %v", err)
			}
		default: // Go
			evs := make([]Event, n)
			for k := range evs {
				evs[k] = ev(fmt.Sprintf("h%d", rng.IntN(7)), "go", `{}`)
			}
			if _, err := Append(sctx, tx, evs...); err != nil {
				t.Fatalf("Append with the schema: %v", err)
			}
		}
		if err := tx.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		want += n
	}
	// The application's own producer keeps its table and counter.
	mustExec(t, app, `WITH r AS (UPDATE log_counter SET next_offset = next_offset + 1 WHERE id = 1 RETURNING next_offset - 1 AS o)
		INSERT INTO outbox_message_t (id, host_id, event_type, payload, c_offset)
		SELECT gen_random_uuid(), gen_random_uuid(), 'seed', '{}', o FROM r`)

	waitHandled(t, app, int64(want), 30*time.Second)
	inspect := schemaPool(t, url, name)
	eventtest.CheckHandled(t, inspect)
	if n := queryInt(t, app, `SELECT count(*) FROM public.dead_letter_queue WHERE error = 'written by a handler'`); n != int64(want) {
		t.Fatalf("the handler wrote %d rows of the application's dead_letter_queue, want %d", n, want)
	}
	if n := queryInt(t, app, `SELECT count(*) FROM pgevents.dead_letter_queue`); n != 0 {
		t.Fatalf("pgevents' dead_letter_queue holds %d rows, want none", n)
	}
	if n := queryInt(t, app, `SELECT next_offset FROM public.log_counter WHERE id = 1`); n != 3 {
		t.Fatalf("the seed's counter is at %d, want 3 (pgevents' appends must not touch it)", n)
	}
	if n := queryInt(t, app, `SELECT count(*) FROM public.outbox_message_t`); n != 2 {
		t.Fatalf("the seed's outbox holds %d rows, want its own 2", n)
	}
}

// TestSchemaFunctionsPinned checks that every PL/pgSQL function of pgevents
// finds pgevents' objects whatever the caller's search_path: each has its
// search_path pinned to its schema, in schema mode and without it.
func TestSchemaFunctionsPinned(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, name := range []string{"", "pgevents"} {
		url := pgtest.NewDB(t)
		conn, err := pgx.Connect(ctx, url)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close(ctx)
		if _, err := schema.Migrate(WithSchema(ctx, name), conn); err != nil {
			t.Fatal(err)
		}
		var unpinned []string
		rows, err := conn.Query(ctx, `SELECT p.proname FROM pg_proc p JOIN pg_language l ON l.oid = p.prolang
			WHERE p.pronamespace = $1::regnamespace AND l.lanname = 'plpgsql'
			  AND NOT coalesce('search_path=' || $1 || ', pg_temp' = ANY (p.proconfig), false)`, cmpOr(name, "public"))
		if err != nil {
			t.Fatal(err)
		}
		if unpinned, err = pgx.CollectRows(rows, pgx.RowTo[string]); err != nil {
			t.Fatal(err)
		}
		if len(unpinned) > 0 {
			t.Errorf("schema %q: PL/pgSQL functions without a pinned search_path: %v", cmpOr(name, "public"), unpinned)
		}
	}
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// schemaPool returns a pool on url whose sessions search schema name
// first, so that the checks of eventtest read pgevents' tables by their
// plain names.
func schemaPool(t *testing.T, url, name string) *pgxpool.Pool {
	t.Helper()
	pc, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	pc.ConnConfig.RuntimeParams["search_path"] = pgx.Identifier{name}.Sanitize() + ", public"
	pool, err := pgxpool.NewWithConfig(context.Background(), pc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}
