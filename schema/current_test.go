package schema_test

import (
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgevents/pgevents/internal/pgtest"
	"github.com/pgevents/pgevents/schema"
)

// update rewrites schema/current from a freshly migrated database instead of
// comparing with it: `make schema` (or go test ./schema -run
// TestCurrentSchema -update).
var update = flag.Bool("update", false, "rewrite schema/current/*.sql from a migrated database")

// concern is one file of schema/current: its name, the paragraph that opens
// it, and the objects it shows, in reading order.
type concern struct {
	file    string
	about   string
	objects []string
}

// currentServer is the PostgreSQL major version whose deparsers wrote
// schema/current.
const currentServer = 15

// currentSchema is where every object the migrations leave behind is shown as
// it is today, one file per concern. The objects of a file are listed in
// reading order; an object the migrations create that no file lists fails
// TestCurrentSchema, so that a new table or function gets a home when it is
// added.
var currentSchema = []concern{
	{"log.sql", `The log: topics (log_counter), their partitions (partition_counters),
each partition's last committed offset (partition_tails) and the events
(outbox_message_t, partitioned by topic and partition, then into offset
segments that retention drops whole). Offsets are gapless and, within a
partition, in commit order. lock_key names every advisory lock pgevents
takes.`, []string{
		"log_counter", "partition_counters", "partition_tails", "outbox_message_t", "outbox_message_t_default",
		"event_partition", "tail", "topic_next_offset", "partition_next_offset", "offset_sequence",
		"ensure_appends_sequence", "set_offset_allocation", "reserve_offsets", "ensure_outbox_segments", "lock_key",
	}},
	{"append.sql", `The producer's side: append_event and append_events, called inside the
producer's own transaction from Go or from any SQL client, and what they
dispatch to per topic mode; idempotency keys.`, []string{
		"append_event", "append_events", "append_events_keyed", "append_results", "append_one", "append_many",
		"append_keyed_one", "check_events", "refuse_snapshot", "lock_appends", "lock_partitions",
		"idempotency_keys", "set_idempotency_window", "claim_keys", "prune_keys",
	}},
	{"sequenced.sql", `Sequenced topics: appends stage events without a lock held through the
commit (staged_events), and one sequencer per topic gives them offsets in
commit order (sequence_tick).`, []string{
		"staged_events", "stage_seq", "sequencer_ticks", "make_sequenced", "topic_sequenced", "stage_one", "stage_many",
		"sequence_tick", "rotate_stage", "wake_sequencer",
	}},
	{"wake.sql", `Waking a sleeping partition: which partitions have a worker that may be
waiting, and the notifications an append or the watcher sends them. The
protocol is described in docs/concepts.md, "How a sleeping partition
wakes".`, []string{
		"mark_flight", "await_flight", "wake_sleepers", "wake_partitions", "notify_sleepers",
	}},
	{"positions.sql", `A group's position per partition, and the claim and commit of a batch:
claim_state locks the position and reads lease, pause and position in one
statement; commit_position writes the next offset in the batch's own
transaction, which is what makes database effects exactly-once.
consumer_offsets is the compatibility view over consumer_positions.`, []string{
		"consumer_positions", "position_seq", "consumer_offsets", "consumer_offsets_write",
		"claim_state", "lock_position", "commit_position", "group_position", "init_positions",
		"lock_group_positions",
	}},
	{"ownership.sql", `Who runs what: partition leases with their fencing epochs, replicas of a
group, group holders (the Kafka endpoint's groups, the maintenance and
sequencer roles) and subscriptions.`, []string{
		"partition_leases", "partition_ownership", "consumer_replicas", "register_replica",
		"batch_backends", "group_holders", "group_holder", "hold_group", "release_group", "subscriptions",
	}},
	{"layouts.sql", `Repartitioning: a topic's layout versions and the cut each group crosses
from one to the next.`, []string{
		"topic_layouts", "group_layouts", "lock_layout", "repartition_topic", "layout_start", "layout_cut",
	}},
	{"failures.sql", `Failed units: the dead-letter table, events parked behind a failed host,
halted partitions, and the reports of partitions whose batches keep failing.`, []string{
		"dead_letter_queue", "parked_events", "parked_hosts",
		"partition_halts", "partition_failures",
	}},
	{"maintenance.sql", `Retention and the samples the console draws: what retention keeps, what
it skipped, and the lag and throughput samples maintenance takes.`, []string{
		"topic_retention", "retention_skips", "topic_samples", "group_samples", "prune_history",
	}},
	{"tools.sql", `The console's audit log, the Kafka endpoint's gateways, and the record of
applied migrations.`, []string{
		"console_audit", "kafka_gateways", "pgevents_schema_migrations",
	}},
}

// TestCurrentSchema migrates an empty database and compares every table,
// view, sequence and function it then holds with schema/current/*.sql. A
// migration that changes an object without `make schema` fails here, and so
// does an object no file of currentSchema lists: the files cannot drift from
// what the migrations build.
func TestCurrentSchema(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := pgtest.Pool(t, pgtest.NewDB(t))
	// A schema of its own, whatever the run's mode, so that the files name
	// their objects the same way on every machine.
	if _, err := schema.Migrate(schema.WithName(ctx, "pgevents"), pool); err != nil {
		t.Fatal(err)
	}
	var version int
	if err := pool.QueryRow(ctx, "SELECT current_setting('server_version_num')::int / 10000").Scan(&version); err != nil {
		t.Fatal(err)
	}
	if version != currentServer {
		// The server's deparsers word definitions differently from one major
		// version to the next: the files are compared on the version that
		// wrote them, the one the tests' own cluster runs.
		t.Skipf("schema/current is written by PostgreSQL %d; this server is %d", currentServer, version)
	}
	defs, err := definitions(ctx, pool, "pgevents")
	if err != nil {
		t.Fatal(err)
	}
	history := historyOf(schema.Migrations())

	listed := map[string]bool{}
	for _, f := range currentSchema {
		var b strings.Builder
		fmt.Fprintf(&b, "-- schema/current/%s: generated by `make schema` from a database migrated\n", f.file)
		fmt.Fprintf(&b, "-- to version %d by PostgreSQL %d. Do not edit: write a migration in\n", schema.Latest(), currentServer)
		fmt.Fprintf(&b, "-- schema/migrations, then run `make schema`. Each object names the\n")
		fmt.Fprintf(&b, "-- migrations that created or changed it: their comments give the reasons.\n--\n")
		for _, line := range strings.Split(f.about, "\n") {
			fmt.Fprintf(&b, "-- %s\n", line)
		}
		for _, name := range f.objects {
			if listed[name] {
				t.Errorf("%s lists %s, which another file lists", f.file, name)
			}
			listed[name] = true
			objs := defs[name]
			if len(objs) == 0 {
				t.Errorf("%s lists %s, which the migrated database does not hold", f.file, name)
				continue
			}
			for _, def := range objs {
				b.WriteString("\n")
				if h := history[name]; len(h) > 0 {
					fmt.Fprintf(&b, "-- %s, from %s\n", name, strings.Join(h, ", "))
				}
				b.WriteString(def)
			}
		}
		path := filepath.Join("current", f.file)
		if *update {
			if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
				t.Fatal(err)
			}
			continue
		}
		got, err := os.ReadFile(path)
		if err != nil {
			t.Errorf("%v: run `make schema`", err)
			continue
		}
		if string(got) != b.String() {
			t.Errorf("schema/current/%s differs from the migrated database (first difference at line %d): run `make schema`",
				f.file, firstDiff(string(got), b.String()))
		}
	}
	for name := range defs {
		if !listed[name] {
			t.Errorf("the migrations create %s, which no file of currentSchema lists: give it a home in current_test.go", name)
		}
	}
	if *update {
		return
	}
	files, _ := filepath.Glob(filepath.Join("current", "*.sql"))
	for _, path := range files {
		if !slices.ContainsFunc(currentSchema, func(f concern) bool { return f.file == filepath.Base(path) }) {
			t.Errorf("%s is not generated any more: remove it", path)
		}
	}
}

// firstDiff returns the 1-based line at which a and b first differ.
func firstDiff(a, b string) int {
	la, lb := strings.Split(a, "\n"), strings.Split(b, "\n")
	for i := range min(len(la), len(lb)) {
		if la[i] != lb[i] {
			return i + 1
		}
	}
	return min(len(la), len(lb)) + 1
}

// historyOf returns, per object name, the migrations that create, replace or
// alter it, so that a reader goes from an object's current definition to the
// comments that give its reasons.
func historyOf(ms []schema.Migration) map[string][]string {
	re := regexp.MustCompile(`(?i)\b(?:CREATE(?:\s+OR\s+REPLACE)?(?:\s+UNLOGGED)?\s+(?:TABLE|VIEW|SEQUENCE|FUNCTION|PROCEDURE)|ALTER\s+(?:TABLE|VIEW|SEQUENCE|FUNCTION))\s+(?:IF\s+(?:NOT\s+)?EXISTS\s+)?(?:ONLY\s+)?(?:[a-z_{}.]*\.)?([a-z_][a-z0-9_]*)`)
	out := map[string][]string{}
	for _, m := range ms {
		file := fmt.Sprintf("%04d_%s.sql", m.Version, m.Name)
		for _, sub := range re.FindAllStringSubmatch(stripComments(m.SQL), -1) {
			name := strings.ToLower(sub[1])
			if h := out[name]; len(h) == 0 || h[len(h)-1] != file {
				out[name] = append(h, file)
			}
		}
	}
	return out
}

// stripComments drops -- comments, so that prose naming an object does not
// count as changing it.
func stripComments(sql string) string {
	lines := strings.Split(sql, "\n")
	for i, l := range lines {
		if j := strings.Index(l, "--"); j >= 0 {
			lines[i] = l[:j]
		}
	}
	return strings.Join(lines, "\n")
}

// definitions returns the current definition of every table, view, sequence
// and function in schema ns, keyed by name (a function's overloads and a
// table's partitions share their name's entry), each ending with a newline.
// Everything is read from the catalog with the server's own deparsers
// (pg_get_functiondef, pg_get_viewdef, pg_get_constraintdef,
// pg_get_indexdef, pg_get_triggerdef), so no client tool is needed.
func definitions(ctx context.Context, pool *pgxpool.Pool, ns string) (map[string][]string, error) {
	out := map[string][]string{}
	rows, err := pool.Query(ctx, currentObjectsSQL, ns)
	if err != nil {
		return nil, fmt.Errorf("read catalog: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var name, def string
		if err := rows.Scan(&name, &def); err != nil {
			return nil, err
		}
		out[name] = append(out[name], def)
	}
	return out, rows.Err()
}

// currentObjectsSQL renders, for schema $1, one row (name, definition) per
// table (columns, partition key, storage options, constraints, indexes and
// triggers), partition, view (with its triggers), sequence not owned by an
// identity column, and function or procedure, ordered by name and, for
// overloads, by their arguments.
const currentObjectsSQL = `
WITH rel AS (
  SELECT c.oid, c.relname, c.relkind, c.relispartition, c.relpersistence, c.reloptions
    FROM pg_class c
   WHERE c.relnamespace = $1::regnamespace AND c.relkind IN ('r', 'p', 'v', 'S')
), tables AS (
  SELECT r.relname AS name, r.relname AS sortkey,
         CASE WHEN r.relispartition THEN
           format(E'CREATE TABLE %I.%I PARTITION OF %s %s;\n', $1, r.relname,
                  (SELECT i.inhparent::regclass::text FROM pg_inherits i WHERE i.inhrelid = r.oid),
                  pg_get_expr((SELECT c.relpartbound FROM pg_class c WHERE c.oid = r.oid), r.oid))
         ELSE
           format(E'CREATE %sTABLE %I.%I (\n%s\n)%s%s;\n',
                  CASE r.relpersistence WHEN 'u' THEN 'UNLOGGED ' ELSE '' END, $1, r.relname,
                  (SELECT string_agg(x.line, E',\n' ORDER BY x.ord, x.sub) FROM (
                     SELECT 0 AS ord, a.attnum::int AS sub,
                            format('    %I %s', a.attname, format_type(a.atttypid, a.atttypmod))
                            || CASE WHEN a.attidentity = 'a' THEN ' GENERATED ALWAYS AS IDENTITY'
                                    WHEN a.attidentity = 'd' THEN ' GENERATED BY DEFAULT AS IDENTITY' ELSE '' END
                            || CASE WHEN a.attgenerated = 's' THEN ' GENERATED ALWAYS AS (' || pg_get_expr(d.adbin, d.adrelid) || ') STORED'
                                    WHEN d.adbin IS NOT NULL THEN ' DEFAULT ' || pg_get_expr(d.adbin, d.adrelid) ELSE '' END
                            || CASE WHEN a.attnotnull THEN ' NOT NULL' ELSE '' END AS line
                       FROM pg_attribute a
                       LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
                      WHERE a.attrelid = r.oid AND a.attnum > 0 AND NOT a.attisdropped
                     UNION ALL
                     SELECT 1, row_number() OVER (ORDER BY position(k.contype IN 'pufcx'), k.conname)::int,
                            format('    CONSTRAINT %I %s', k.conname, pg_get_constraintdef(k.oid, true))
                       FROM pg_constraint k WHERE k.conrelid = r.oid AND k.contype <> 'n') x),
                  CASE WHEN r.relkind = 'p' THEN E'\nPARTITION BY ' || pg_get_partkeydef(r.oid) ELSE '' END,
                  CASE WHEN r.reloptions IS NOT NULL THEN E'\nWITH (' || array_to_string(r.reloptions, ', ') || ')' ELSE '' END)
           || coalesce((SELECT string_agg(pg_get_indexdef(ix.indexrelid) || E';\n', '' ORDER BY ic.relname)
                          FROM pg_index ix JOIN pg_class ic ON ic.oid = ix.indexrelid
                         WHERE ix.indrelid = r.oid
                           AND NOT EXISTS (SELECT FROM pg_constraint k WHERE k.conindid = ix.indexrelid AND k.conrelid = r.oid)), '')
           || coalesce((SELECT string_agg(pg_get_triggerdef(tg.oid, true) || E';\n', '' ORDER BY tg.tgname)
                          FROM pg_trigger tg WHERE tg.tgrelid = r.oid AND NOT tg.tgisinternal), '')
         END AS def
    FROM rel r WHERE r.relkind IN ('r', 'p')
), views AS (
  SELECT r.relname, r.relname,
         format(E'CREATE VIEW %I.%I AS\n%s\n', $1, r.relname, pg_get_viewdef(r.oid, true))
           || coalesce((SELECT string_agg(pg_get_triggerdef(tg.oid, true) || E';\n', '' ORDER BY tg.tgname)
                          FROM pg_trigger tg WHERE tg.tgrelid = r.oid AND NOT tg.tgisinternal), '')
    FROM rel r WHERE r.relkind = 'v'
), sequences AS (
  SELECT r.relname, r.relname,
         format(E'CREATE SEQUENCE %I.%I AS %s INCREMENT %s MINVALUE %s MAXVALUE %s START %s CACHE %s%s;\n',
                $1, r.relname, format_type(s.seqtypid, NULL), s.seqincrement, s.seqmin, s.seqmax, s.seqstart, s.seqcache,
                CASE WHEN s.seqcycle THEN ' CYCLE' ELSE '' END)
           || coalesce((SELECT format(E'ALTER SEQUENCE %I.%I OWNED BY %s.%I;\n', $1, r.relname, d.refobjid::regclass, a.attname)
                          FROM pg_depend d JOIN pg_attribute a ON a.attrelid = d.refobjid AND a.attnum = d.refobjsubid
                         WHERE d.classid = 'pg_class'::regclass AND d.objid = r.oid AND d.deptype = 'a'), '')
    FROM rel r JOIN pg_sequence s ON s.seqrelid = r.oid
   WHERE NOT EXISTS (SELECT FROM pg_depend d WHERE d.classid = 'pg_class'::regclass AND d.objid = r.oid AND d.deptype = 'i')
), functions AS (
  SELECT p.proname, p.proname || '(' || pg_get_function_identity_arguments(p.oid) || ')',
         pg_get_functiondef(p.oid) || E';\n'
    FROM pg_proc p WHERE p.pronamespace = $1::regnamespace AND p.prokind IN ('f', 'p')
)
SELECT name, def FROM (
  SELECT * FROM tables UNION ALL SELECT * FROM views UNION ALL SELECT * FROM sequences UNION ALL SELECT * FROM functions
) o ORDER BY name, sortkey`
