package schema

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

//go:embed migrations/*.sql
var migrationFS embed.FS

// DB is the database handle every package of pgevents runs its statements
// on, this one's Migrate and topic functions as the engine's and the
// operator's: *pgxpool.Pool, *pgxpool.Conn, *pgx.Conn and pgx.Tx all
// satisfy it. Where a function needs a transaction of its own it calls
// Begin, which on a pgx.Tx is a savepoint: given a transaction, its work
// commits or rolls back with the caller's.
type DB interface {
	// Begin starts a transaction (a savepoint inside a pgx.Tx).
	Begin(ctx context.Context) (pgx.Tx, error)
	// Exec runs a statement that returns no rows.
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	// Query runs a statement that returns rows.
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	// QueryRow runs a statement that returns at most one row.
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	// SendBatch sends queued statements in one round trip.
	SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults
}

// Migration is one embedded migration file.
type Migration struct {
	// Version orders the migrations; it is the number the file name starts with.
	Version int
	// Name is the file name without its version and extension.
	Name string
	// SQL is the file's content.
	SQL string
}

// Migrations returns every embedded migration in version order.
func Migrations() []Migration {
	entries, err := fs.ReadDir(migrationFS, "migrations")
	if err != nil {
		panic(fmt.Sprintf("schema: read embedded migrations: %v", err))
	}
	out := make([]Migration, 0, len(entries))
	for _, e := range entries {
		base := strings.TrimSuffix(e.Name(), ".sql")
		num, name, ok := strings.Cut(base, "_")
		v, err := strconv.Atoi(num)
		if !ok || err != nil {
			panic(fmt.Sprintf("schema: migration %q is not named NNNN_name.sql", e.Name()))
		}
		body, err := migrationFS.ReadFile(path.Join("migrations", e.Name()))
		if err != nil {
			panic(fmt.Sprintf("schema: read %s: %v", e.Name(), err))
		}
		out = append(out, Migration{Version: v, Name: name, SQL: string(body)})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Version < out[j].Version })
	return out
}

// Latest returns the version of the newest embedded migration.
func Latest() int {
	m := Migrations()
	return m[len(m)-1].Version
}

// SQL that Migrate runs around the migrations themselves.
const (
	// lockSQL serialises concurrent Migrate calls of one installation: the
	// lock is released when the migrating transaction ends. Its key is
	// derived from the schema the migrations run in (the first of the
	// search_path, which enterSchema sets), as lock_key derives the others:
	// installations in other schemas migrate at the same time.
	lockSQL = `SELECT pg_advisory_xact_lock(hashtextextended('pgevents/' || coalesce(%s, current_schema()) || '/migrate', 0))`

	versionTableSQL = `CREATE TABLE IF NOT EXISTS {schema}pgevents_schema_migrations (
    version    integer     PRIMARY KEY,
    name       text        NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
)`

	currentVersionSQL = `SELECT coalesce(max(version), 0) FROM {schema}pgevents_schema_migrations`

	recordVersionSQL = `INSERT INTO {schema}pgevents_schema_migrations (version, name) VALUES ($1, $2)`

	// pinSQL pins the search_path of pgevents' PL/pgSQL functions to the
	// schema they live in (current_schema(), where the migrations created
	// them), so that they find pgevents' objects whatever the caller's
	// search_path: append_event called schema-qualified from a session
	// whose search_path holds an application's log_counter still reserves
	// from pgevents'. pg_temp comes last, so that no temporary table can
	// stand in for one of them. SQL-language functions with a standard
	// body (RETURN or BEGIN ATOMIC, as all of ours) need no pin: it binds
	// names when the function is created (a string body would not). CREATE
	// OR REPLACE FUNCTION drops the pin, so it runs after every migration;
	// %s is the list of the functions' names.
	pinSQL = `DO $pin$
DECLARE
    f record;
BEGIN
    FOR f IN
        SELECT n.nspname, p.proname, pg_get_function_identity_arguments(p.oid) AS args
          FROM pg_proc p
          JOIN pg_namespace n ON n.oid = p.pronamespace
          JOIN pg_language l ON l.oid = p.prolang
         WHERE n.nspname = current_schema() AND l.lanname = 'plpgsql'
           AND p.proname = ANY ('%s'::text[])
           AND NOT coalesce('search_path=' || quote_ident(n.nspname) || ', pg_temp' = ANY (p.proconfig), false)
    LOOP
        EXECUTE format('ALTER FUNCTION %%I.%%I(%%s) SET search_path = %%I, pg_temp', f.nspname, f.proname, f.args, f.nspname);
    END LOOP;
END
$pin$`
)

// Functions returns the names of the SQL functions the migrations leave
// behind (created and not dropped since), in the order they are created.
func Functions() []string {
	var names []string
	for _, m := range Migrations() {
		for _, sm := range functionDDL.FindAllStringSubmatch(m.SQL, -1) {
			name := strings.ToLower(sm[2])
			i := slices.Index(names, name)
			switch {
			case strings.EqualFold(sm[1], "DROP") && i >= 0:
				names = slices.Delete(names, i, i+1)
			case !strings.EqualFold(sm[1], "DROP") && i < 0:
				names = append(names, name)
			}
		}
	}
	return names
}

var functionDDL = regexp.MustCompile(`(?im)^\s*(CREATE|CREATE OR REPLACE|DROP)\s+FUNCTION\s+(?:IF\s+EXISTS\s+)?(\w+)`)

// pinStatement is pinSQL for the functions of the migrations.
func pinStatement() string {
	return fmt.Sprintf(pinSQL, "{"+strings.Join(Functions(), ",")+"}")
}

// Migrate applies the embedded migrations that db lacks and returns the
// versions it applied. It is idempotent and safe to call from several
// processes at once: the first caller applies, the others wait for its
// transaction and find nothing to do.
//
// With a schema name on ctx (WithName), every object is created in that
// schema, which is created first when missing; otherwise in the first
// schema of the search_path. Either way the PL/pgSQL functions' search_path
// is pinned to the schema they live in.
func Migrate(ctx context.Context, db DB) ([]int, error) {
	tx, err := db.Begin(ctx)
	if err != nil {
		return nil, fmt.Errorf("schema: begin: %w", err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck // after Commit this is a no-op

	if _, err := tx.Exec(ctx, migrateLock(Name(ctx))); err != nil {
		return nil, fmt.Errorf("schema: lock: %w", err)
	}
	// The search_path the caller's transaction had, for after (Migrate may
	// run in a savepoint of the caller's own transaction).
	var path string
	if err := tx.QueryRow(ctx, `SELECT current_setting('search_path')`).Scan(&path); err != nil {
		return nil, fmt.Errorf("schema: %w", err)
	}
	for _, stmt := range enterSchema(Name(ctx)) {
		if _, err := tx.Exec(ctx, stmt); err != nil {
			return nil, fmt.Errorf("schema: schema %s: %w", Name(ctx), err)
		}
	}
	if _, err := tx.Exec(ctx, SQL(ctx, versionTableSQL)); err != nil {
		return nil, fmt.Errorf("schema: create version table: %w", err)
	}
	var current int
	if err := tx.QueryRow(ctx, SQL(ctx, currentVersionSQL)).Scan(&current); err != nil {
		return nil, fmt.Errorf("schema: read version: %w", err)
	}
	var applied []int
	for _, m := range Migrations() {
		if m.Version <= current {
			continue
		}
		// Exec without arguments uses the simple protocol, which runs a
		// file of several statements.
		if _, err := tx.Exec(ctx, m.SQL); err != nil {
			return nil, fmt.Errorf("schema: migration %04d_%s: %w", m.Version, m.Name, err)
		}
		if _, err := tx.Exec(ctx, SQL(ctx, recordVersionSQL), m.Version, m.Name); err != nil {
			return nil, fmt.Errorf("schema: record migration %d: %w", m.Version, err)
		}
		applied = append(applied, m.Version)
	}
	if _, err := tx.Exec(ctx, pinStatement()); err != nil {
		return nil, fmt.Errorf("schema: pin the functions' search_path: %w", err)
	}
	if Name(ctx) != "" {
		if _, err := tx.Exec(ctx, `SELECT set_config('search_path', $1, true)`, path); err != nil {
			return nil, fmt.Errorf("schema: %w", err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return nil, fmt.Errorf("schema: commit: %w", err)
	}
	return applied, nil
}

// migrateLock returns lockSQL for schema name ("": the first schema of
// the search_path).
func migrateLock(name string) string {
	lit := "NULL"
	if name != "" {
		lit = "'" + name + "'" // ValidName: a lowercase identifier
	}
	return fmt.Sprintf(lockSQL, lit)
}

// enterSchema returns the statements that make the migrating transaction
// create everything in schema name: the schema itself, and a search_path
// of only that schema for the rest of the transaction. None for "".
func enterSchema(name string) []string {
	if name == "" {
		return nil
	}
	id := pgx.Identifier{name}.Sanitize()
	return []string{`CREATE SCHEMA IF NOT EXISTS ` + id, `SET LOCAL search_path TO ` + id}
}

// Script returns the SQL of every migration after version from, wrapped in
// one transaction with the same advisory lock and version bookkeeping that
// Migrate uses, for teams that apply migrations with their own tool. Version
// checks are the tool's job: run the script once per version. The objects
// go to the first schema of the search_path; see ScriptIn.
func Script(from int) string { return ScriptIn("", from) }

// ScriptIn is Script for pgevents in schema name ("": the first schema of
// the search_path).
func ScriptIn(name string, from int) string {
	var b strings.Builder
	b.WriteString("-- pgevents schema migrations, generated by `consumer migrate --print`.\n")
	b.WriteString("BEGIN;\n")
	b.WriteString(migrateLock(name) + ";\n")
	for _, stmt := range enterSchema(name) {
		b.WriteString(stmt + ";\n")
	}
	b.WriteString(Qualify(name, versionTableSQL) + ";\n\n")
	for _, m := range Migrations() {
		if m.Version <= from {
			continue
		}
		fmt.Fprintf(&b, "-- migration %04d_%s\n", m.Version, m.Name)
		b.WriteString(m.SQL)
		fmt.Fprintf(&b, "\nINSERT INTO %spgevents_schema_migrations (version, name) VALUES (%d, '%s');\n\n",
			Qualify(name, Marker), m.Version, m.Name)
	}
	b.WriteString("-- the PL/pgSQL functions find pgevents' objects whatever the caller's search_path\n")
	b.WriteString(pinStatement() + ";\n")
	b.WriteString("COMMIT;\n")
	return b.String()
}

// Version returns the newest migration version applied to db, or 0 when
// pgevents was never migrated there.
func Version(ctx context.Context, db DB) (int, error) {
	var exists bool
	if err := db.QueryRow(ctx, SQL(ctx, `SELECT to_regclass('{schema}pgevents_schema_migrations') IS NOT NULL`)).Scan(&exists); err != nil {
		return 0, fmt.Errorf("schema: version: %w", err)
	}
	if !exists {
		return 0, nil
	}
	var v int
	if err := db.QueryRow(ctx, SQL(ctx, currentVersionSQL)).Scan(&v); err != nil {
		return 0, fmt.Errorf("schema: version: %w", err)
	}
	return v, nil
}

// ErrTopicNotFound is returned when a topic has no row in log_counter.
var ErrTopicNotFound = errors.New("topic does not exist")
