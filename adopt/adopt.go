package adopt

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgevents/pgevents/schema"
)

// Options says what to adopt and into which topic. pgevents' schema is the
// one the context names (schema.WithName), as for every pgevents function.
type Options struct {
	// From is the schema of the old tables; default "public".
	From string
	// Outbox, Counter and Offsets name the old tables; defaults
	// "outbox_message_t", "log_counter" and "consumer_offsets".
	Outbox, Counter, Offsets string
	// CounterID is the id of the old counter's row; default 1.
	CounterID int
	// OldTopic is the topic_id of the old log's rows in the old
	// consumer_offsets; default 1 (the seed's "global outbox").
	OldTopic int
	// Topic is pgevents' topic the log is adopted into; default 1. It must
	// be new: absent, or created by `consumer migrate` and still empty.
	Topic int
	// Partitions is the partition count the old consumers used; 0 reads it
	// from the old consumer_offsets, when every group has a position in
	// exactly the partitions 0..N-1.
	Partitions int
	// SegmentSize is the offsets per segment of a topic adopt creates;
	// default schema.DefaultSegmentSize.
	SegmentSize int
	// Channel is the NOTIFY channel of a topic adopt creates; default
	// schema.ChannelFor the schema pgevents was named in ("event_channel"
	// when none was named).
	Channel string
	// Map replaces the default source of a column of pgevents' log by an
	// SQL expression over a row o of the old outbox: keys event_id,
	// host_id, user_id, event_type, payload, created_at and
	// transaction_id. A bare column name counts as that column's place, so
	// it does not go into metadata too.
	Map map[string]string
	// Bridge installs the trigger that appends the old outbox's new rows
	// to pgevents' log (see the package documentation).
	Bridge bool
}

// Column is a column of the old outbox.
type Column struct {
	Name string
	Type string // as format_type writes it
}

// Mapped is where a column of pgevents' log comes from.
type Mapped struct {
	Column string // pgevents' column
	Expr   string // SQL over the old row o
}

// Group is a consumer group of the old deployment.
type Group struct {
	// ID is the group's id.
	ID string
	// Positions maps a partition to the group's next offset there.
	Positions map[int]int64
	// Missing lists the partitions where the group has no position: pgevents
	// starts it there at the first event.
	Missing []int
	// Unhandled counts the events at or after its positions.
	Unhandled int64
}

// Plan is what an adoption does, read from the database.
type Plan struct {
	// Options are the options with their defaults applied.
	Options Options
	// Schema is pgevents' schema ("": the first of the search_path).
	Schema string
	// PartitionsFrom says where the partition count came from:
	// "--partitions" or "consumer_offsets".
	PartitionsFrom string
	// Columns are the old outbox's columns.
	Columns []Column
	// Mapping says where each column of pgevents' log comes from.
	Mapping []Mapped
	// Metadata lists the old columns that go into metadata under their
	// own names.
	Metadata []string
	// NextOffset is the old counter's next offset, the topic's from then on.
	NextOffset int64
	// Events counts the events with an offset (copied); Unoffset those
	// without (left behind: no consumer of the old design ever reads them).
	Events, Unoffset int64
	// FirstOffset and LastOffset bound the copied offsets; 0 when none.
	FirstOffset, LastOffset int64
	// Groups are the old deployment's consumer groups.
	Groups []Group
	// Segments is how many segments per partition the copy needs.
	Segments int64
	// Problems says why the adoption would be refused; empty when it
	// would go ahead.
	Problems []string
	// Adopted is when the topic was adopted already, or zero.
	Adopted time.Time
}

// ErrRefused is wrapped by the error of Adopt when a check fails: the
// error says which, and nothing was written.
var ErrRefused = errors.New("adoption refused")

// PartitionsUnknownError is returned when the old partition count cannot
// be read from consumer_offsets and Options.Partitions is not set.
type PartitionsUnknownError struct {
	// Why says what consumer_offsets holds.
	Why string
}

// Error says what is missing and what to do.
func (e *PartitionsUnknownError) Error() string {
	return "the old table's partition count cannot be known: " + e.Why +
		"; give the count the old consumers ran with (their totalPartitions) with --partitions N"
}

// Columns of pgevents' log that Options.Map may set.
var mappable = []string{"event_id", "host_id", "user_id", "event_type", "payload", "created_at", "transaction_id"}

func (o *Options) defaults() {
	if o.From == "" {
		o.From = "public"
	}
	if o.Outbox == "" {
		o.Outbox = "outbox_message_t"
	}
	if o.Counter == "" {
		o.Counter = "log_counter"
	}
	if o.Offsets == "" {
		o.Offsets = "consumer_offsets"
	}
	if o.CounterID == 0 {
		o.CounterID = 1
	}
	if o.OldTopic == 0 {
		o.OldTopic = 1
	}
	if o.Topic == 0 {
		o.Topic = 1
	}
	if o.SegmentSize <= 0 {
		o.SegmentSize = schema.DefaultSegmentSize
	}
}

func (o *Options) validate() error {
	for k, v := range o.Map {
		if !slices.Contains(mappable, k) {
			return fmt.Errorf("adopt: cannot map %q: the columns that can be mapped are %s", k, strings.Join(mappable, ", "))
		}
		if strings.TrimSpace(v) == "" || strings.Contains(v, "$adopt$") || strings.Contains(v, "$bridge$") || strings.Contains(v, ";") {
			return fmt.Errorf("adopt: map %s: %q is not an expression", k, v)
		}
	}
	if o.Partitions != 0 {
		if err := schema.ValidPartitions(o.Partitions); err != nil {
			return fmt.Errorf("adopt: partitions %w", err)
		}
	}
	if o.SegmentSize < schema.MinSegmentSize {
		return fmt.Errorf("adopt: segment size must be at least %d, got %d", schema.MinSegmentSize, o.SegmentSize)
	}
	return nil
}

// names used in the generated SQL.
type names struct {
	outbox, counter, offsets string // the old tables, quoted and qualified
	s                        string // pgevents' prefix: `"pgevents".` or ""
}

func namesOf(ctx context.Context, o *Options) names {
	return names{
		outbox:  pgx.Identifier{o.From, o.Outbox}.Sanitize(),
		counter: pgx.Identifier{o.From, o.Counter}.Sanitize(),
		offsets: pgx.Identifier{o.From, o.Offsets}.Sanitize(),
		s:       schema.SQL(ctx, schema.Marker),
	}
}

const columnsSQL = `SELECT a.attname::text, format_type(a.atttypid, a.atttypmod)
FROM pg_attribute a
WHERE a.attrelid = to_regclass($1) AND a.attnum > 0 AND NOT a.attisdropped
ORDER BY a.attnum`

// columns returns the columns of table (quoted, qualified), or nil when it
// does not exist.
func columns(ctx context.Context, db schema.DB, table string) ([]Column, error) {
	rows, err := db.Query(ctx, columnsSQL, table)
	if err != nil {
		return nil, fmt.Errorf("adopt: columns of %s: %w", table, err)
	}
	cols, err := pgx.CollectRows(rows, pgx.RowToStructByPos[Column])
	if err != nil {
		return nil, fmt.Errorf("adopt: columns of %s: %w", table, err)
	}
	return cols, nil
}

func has(cols []Column, name string) (Column, bool) {
	for _, c := range cols {
		if c.Name == name {
			return c, true
		}
	}
	return Column{}, false
}

var bareColumn = regexp.MustCompile(`^(?:o\.)?("?)([a-z_][a-z0-9_$]*)"?$`)

// mapping decides where each column of pgevents' log comes from, and which
// old columns go into metadata.
func mapping(cols []Column, m map[string]string) ([]Mapped, []string, error) {
	used := map[string]bool{"c_offset": true}
	pick := func(target, def string, uses ...string) string {
		if e, ok := m[target]; ok {
			if sm := bareColumn.FindStringSubmatch(strings.TrimSpace(e)); sm != nil {
				if _, ok := has(cols, sm[2]); ok {
					used[sm[2]] = true
				}
			}
			return e
		}
		for _, u := range uses {
			used[u] = true
		}
		return def
	}
	need := func(name string) error {
		if _, ok := has(cols, name); !ok {
			return fmt.Errorf("the old outbox has no %s column: map one with --map %s=EXPR", name, name)
		}
		return nil
	}
	if _, ok := has(cols, "c_offset"); !ok {
		return nil, nil, errors.New("the old outbox has no c_offset column: it is not a table of the seed design")
	}
	var out []Mapped
	add := func(col, expr string) { out = append(out, Mapped{Column: col, Expr: expr}) }

	eventID := "gen_random_uuid()"
	var eventIDUses []string
	for _, c := range []string{"id", "event_id"} {
		if col, ok := has(cols, c); ok && col.Type == "uuid" {
			eventID, eventIDUses = "o."+pgx.Identifier{c}.Sanitize(), []string{c}
			break
		}
	}
	add("event_id", pick("event_id", eventID, eventIDUses...))

	if _, ok := m["host_id"]; !ok {
		if err := need("host_id"); err != nil {
			return nil, nil, err
		}
	}
	add("host_id", pick("host_id", "o.host_id::text", "host_id"))
	if _, ok := has(cols, "user_id"); ok {
		add("user_id", pick("user_id", "coalesce(o.user_id::text, '')", "user_id"))
	} else {
		add("user_id", pick("user_id", "''"))
	}
	if _, ok := m["event_type"]; !ok {
		if err := need("event_type"); err != nil {
			return nil, nil, err
		}
	}
	add("event_type", pick("event_type", "o.event_type::text", "event_type"))
	if _, ok := has(cols, "payload"); ok {
		add("payload", pick("payload", "o.payload::jsonb", "payload"))
	} else {
		add("payload", pick("payload", "NULL::jsonb"))
	}
	add("created_at", pick("created_at", "clock_timestamp()"))
	// transaction_id: one bigint per producer transaction, negative so that
	// it never meets a txid of pgevents' own appends, derived from the old
	// transaction's id (every event of it gets the same) or, without one,
	// from the event's own id (a transaction of its own). The old column
	// itself goes into metadata.
	txOf := func(x string) string {
		return "(-(('x' || substr(md5(" + x + "), 1, 15))::bit(60)::bigint) - 1)"
	}
	def := txOf("(" + out[0].Expr + ")::text")
	if _, ok := has(cols, "transaction_id"); ok {
		def = txOf("coalesce(o.transaction_id::text, (" + out[0].Expr + ")::text)")
	}
	add("transaction_id", pick("transaction_id", def))

	var extras []string
	for _, c := range cols {
		if !used[c.Name] && c.Name != "metadata" {
			extras = append(extras, c.Name)
		}
	}
	meta := metadataExpr(extras, hasColumn(cols, "metadata"))
	add("metadata", meta)
	if hasColumn(cols, "metadata") {
		used["metadata"] = true
	}
	return out, extras, nil
}

func hasColumn(cols []Column, name string) bool { _, ok := has(cols, name); return ok }

// metadataExpr builds pgevents' metadata: the old metadata (a JSON object)
// with the columns pgevents has no place for added under their own names;
// when the old metadata is not an object, or already has a key of one of
// those names, it is kept whole under "metadata" beside them. Nothing is
// dropped.
func metadataExpr(extras []string, oldMeta bool) string {
	var parts []string
	for i := 0; i < len(extras); i += 50 { // jsonb_build_object takes at most 100 arguments
		var args []string
		for _, c := range extras[i:min(i+50, len(extras))] {
			args = append(args, quoteLiteral(c), "o."+pgx.Identifier{c}.Sanitize())
		}
		parts = append(parts, "jsonb_build_object("+strings.Join(args, ", ")+")")
	}
	x := strings.Join(parts, " || ")
	switch {
	case !oldMeta && x == "":
		return "NULL::jsonb"
	case !oldMeta:
		return x
	case x == "":
		return "o.metadata::jsonb"
	}
	keys := make([]string, len(extras))
	for i, c := range extras {
		keys[i] = quoteLiteral(c)
	}
	return fmt.Sprintf(`CASE WHEN o.metadata IS NULL THEN %[1]s
     WHEN jsonb_typeof(o.metadata::jsonb) = 'object' AND NOT (o.metadata::jsonb ?| ARRAY[%[2]s]) THEN o.metadata::jsonb || %[1]s
     ELSE %[1]s || jsonb_build_object('metadata', o.metadata::jsonb) END`, x, strings.Join(keys, ", "))
}

func quoteLiteral(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

func (p *Plan) expr(col string) string {
	for _, m := range p.Mapping {
		if m.Column == col {
			return m.Expr
		}
	}
	panic("adopt: no mapping for " + col)
}

// Inspect reads what an adoption would do, without locking or writing
// anything: the old tables' columns and where they go, the partition
// count, the counts, the groups and their positions, and the problems that
// would make it refuse. Counts may change before Adopt runs, which checks
// again under its locks.
func Inspect(ctx context.Context, db schema.DB, opts Options) (*Plan, error) {
	opts.defaults()
	if opts.Channel == "" {
		opts.Channel = schema.ChannelFor(schema.Name(ctx))
	}
	if err := opts.validate(); err != nil {
		return nil, err
	}
	// pgevents' schema, named: the first of the search_path where it lives
	// when ctx names none, so that the SQL names it whatever the search_path
	// of whoever runs it.
	var home *string
	if err := db.QueryRow(ctx, `SELECT c.relnamespace::regnamespace::text FROM pg_class c
WHERE c.oid = to_regclass($1)`, schema.SQL(ctx, schema.Marker+"pgevents_schema_migrations")).Scan(&home); err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return nil, fmt.Errorf("adopt: %w", err)
	}
	if home == nil {
		where := "the first schema of the search_path"
		if schema.Name(ctx) != "" {
			where = "schema " + schema.Name(ctx)
		}
		return nil, fmt.Errorf("adopt: pgevents is not installed in %s: run consumer migrate first", where)
	}
	ctx = schema.WithName(ctx, strings.Trim(*home, `"`))
	n := namesOf(ctx, &opts)
	p := &Plan{Options: opts, Schema: schema.Name(ctx)}
	for _, t := range []struct {
		name string
		cols []string
	}{{n.counter, []string{"id", "next_offset"}}, {n.offsets, []string{"group_id", "topic_id", "partition_id", "next_offset"}}} {
		cols, err := columns(ctx, db, t.name)
		if err != nil {
			return nil, err
		}
		if len(cols) == 0 {
			return nil, fmt.Errorf("adopt: table %s does not exist", t.name)
		}
		for _, c := range t.cols {
			if !hasColumn(cols, c) {
				return nil, fmt.Errorf("adopt: table %s has no column %s: it is not a table of the seed design", t.name, c)
			}
		}
	}
	cols, err := columns(ctx, db, n.outbox)
	if err != nil {
		return nil, err
	}
	if len(cols) == 0 {
		return nil, fmt.Errorf("adopt: table %s does not exist", n.outbox)
	}
	p.Columns = cols
	if p.Mapping, p.Metadata, err = mapping(cols, opts.Map); err != nil {
		return nil, fmt.Errorf("adopt: %s: %w", n.outbox, err)
	}
	if err := p.readPartitions(ctx, db, n); err != nil {
		return nil, err
	}
	if err := p.check(ctx, db, n, false); err != nil {
		return nil, err
	}
	if len(p.Problems) == 0 || p.NextOffset > 0 {
		if err := p.readGroups(ctx, db, n); err != nil {
			return nil, err
		}
	}
	return p, nil
}

// readPartitions sets the partition count from the options or from the
// old consumer_offsets.
func (p *Plan) readPartitions(ctx context.Context, db schema.DB, n names) error {
	given := p.Options.Partitions
	rows, err := db.Query(ctx, `SELECT group_id::text, array_agg(partition_id ORDER BY partition_id)
FROM `+n.offsets+` WHERE topic_id = $1 GROUP BY 1 ORDER BY 1`, p.Options.OldTopic)
	if err != nil {
		return fmt.Errorf("adopt: partitions: %w", err)
	}
	var (
		g     string
		parts []int32
		seen  = map[string][]int32{}
		order []string
	)
	if _, err := pgx.ForEachRow(rows, []any{&g, &parts}, func() error {
		seen[g] = slices.Clone(parts)
		order = append(order, g)
		return nil
	}); err != nil {
		return fmt.Errorf("adopt: partitions: %w", err)
	}
	inferred, why := inferPartitions(order, seen)
	switch {
	case given > 0:
		p.PartitionsFrom = "--partitions"
		// Every group in exactly 0..k-1 says k: a count that differs would
		// send hosts to other partitions than the positions are for.
		if inferred > 0 && inferred != given {
			p.Problems = append(p.Problems, fmt.Sprintf("every group has positions in %s in exactly partitions 0..%d: the old consumers ran with %d partitions, not --partitions %d",
				n.offsets, inferred-1, inferred, given))
		}
		return nil
	case inferred == 0 && len(order) == 0:
		return &PartitionsUnknownError{Why: fmt.Sprintf("%s holds no position of topic_id %d", n.offsets, p.Options.OldTopic)}
	case inferred == 0:
		return &PartitionsUnknownError{Why: why}
	}
	p.Options.Partitions = inferred
	p.PartitionsFrom = n.offsets
	return nil
}

// inferPartitions returns N when every group has positions in exactly the
// partitions 0..N-1, or 0 and why not.
func inferPartitions(order []string, seen map[string][]int32) (int, string) {
	if len(order) == 0 {
		return 0, "no group has a position"
	}
	first := seen[order[0]]
	for i, part := range first {
		if int(part) != i {
			return 0, fmt.Sprintf("group %q has positions in partitions %v, not 0..N-1", order[0], first)
		}
	}
	for _, g := range order[1:] {
		if !slices.Equal(seen[g], first) {
			return 0, fmt.Sprintf("group %q has positions in partitions %v and group %q in %v", order[0], first, g, seen[g])
		}
	}
	return len(first), ""
}

// check runs the checks (checkSQL) and reads the counts.
func (p *Plan) check(ctx context.Context, db schema.DB, n names, adoptions bool) error {
	var (
		next, lo, hi *int64
		adopted      *time.Time
	)
	if !adoptions {
		var exists bool
		if err := db.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, n.s+"adoptions").Scan(&exists); err != nil {
			return fmt.Errorf("adopt: %w", err)
		}
		adoptions = exists
	}
	var problems []string
	err := db.QueryRow(ctx, p.checkSQL(n, adoptions)).Scan(&next, &p.Events, &p.Unoffset, &lo, &hi, &adopted, &problems)
	if err != nil {
		return fmt.Errorf("adopt: check: %w", err)
	}
	p.Problems = append(p.Problems, problems...)
	if next != nil {
		p.NextOffset = *next
	}
	if lo != nil {
		p.FirstOffset, p.LastOffset = *lo, *hi
	}
	if adopted != nil {
		p.Adopted = *adopted
	}
	size := int64(p.Options.SegmentSize)
	first := p.FirstOffset
	if first == 0 {
		first = max(p.NextOffset, 1)
	}
	p.Segments = (max(p.NextOffset, 1)-1)/size - (first-1)/size + 1 + schema.SegmentsAhead
	return nil
}

// checkSQL is the query of the checks: the counts, and every reason to
// refuse. Adopt runs it again under its locks, in the adoption's
// transaction, and refuses when it finds any. adoptions says whether the
// adoptions table exists yet.
func (p *Plan) checkSQL(n names, adoptions bool) string {
	o := p.Options
	N, T := strconv.Itoa(o.Partitions), strconv.Itoa(o.Topic)
	adopted := "NULL::timestamptz"
	if adoptions {
		adopted = "(SELECT a.adopted_at FROM " + n.s + "adoptions a WHERE a.topic_id = " + T + ")"
	}
	return `WITH c AS (
    SELECT (SELECT next_offset FROM ` + n.counter + ` WHERE id = ` + strconv.Itoa(o.CounterID) + `)::bigint AS next
), e AS (
    SELECT count(o.c_offset) AS events, count(*) - count(o.c_offset) AS unoffset,
           count(DISTINCT o.c_offset) AS distinct_offsets,
           min(o.c_offset)::bigint AS lo, max(o.c_offset)::bigint AS hi,
           count(*) FILTER (WHERE o.c_offset IS NOT NULL AND coalesce(` + p.expr("host_id") + `, '') = '') AS no_host,
           count(*) FILTER (WHERE o.c_offset IS NOT NULL AND coalesce(` + p.expr("event_type") + `, '') = '') AS no_type
    FROM ` + n.outbox + ` o
), g AS (
    SELECT group_id::text AS group_id, partition_id, next_offset::bigint AS next_offset
    FROM ` + n.offsets + ` WHERE topic_id = ` + strconv.Itoa(o.OldTopic) + `
), gs AS (
    SELECT count(*) FILTER (WHERE partition_id < 0 OR partition_id >= ` + N + `) AS out_of_range,
           max(partition_id) AS max_partition,
           min(next_offset) AS min_pos, max(next_offset) AS max_pos,
           (SELECT count(*) FROM (SELECT DISTINCT group_id FROM g) d CROSS JOIN generate_series(0, ` + N + ` - 1) AS pp(p)
             WHERE NOT EXISTS (SELECT 1 FROM g WHERE g.group_id = d.group_id AND g.partition_id = pp.p)) AS missing
    FROM g
), low AS (
    -- Offsets below it were handled by every group in every partition
    -- (one without a position somewhere starts there at 1): an event
    -- missing below it was removed after everyone had it.
    SELECT greatest(CASE WHEN gs.missing > 0 THEN 1 ELSE coalesce(gs.min_pos, c.next) END, 1) AS below
    FROM gs, c
), h AS (
    SELECT (c.next - least(low.below, c.next)) -
           (SELECT count(*) FROM ` + n.outbox + ` o WHERE o.c_offset >= low.below AND o.c_offset < c.next) AS holes
    FROM c, low
), oth AS (
    SELECT count(*) AS n FROM ` + n.offsets + ` WHERE topic_id IS DISTINCT FROM ` + strconv.Itoa(o.OldTopic) + `
), t AS (
    SELECT (SELECT lc.total_partitions FROM ` + n.s + `log_counter lc WHERE lc.topic_id = ` + T + `) AS partitions,
           (SELECT CASE WHEN lc.sequenced THEN 'sequenced' ELSE lc.offset_scope END
              FROM ` + n.s + `log_counter lc WHERE lc.topic_id = ` + T + `) AS scope,
           EXISTS (SELECT 1 FROM ` + n.s + `outbox_message_t m WHERE m.topic_id = ` + T + `)
             OR EXISTS (SELECT 1 FROM ` + n.s + `partition_tails t WHERE t.topic_id = ` + T + `) AS has_events,
           EXISTS (SELECT 1 FROM ` + n.s + `consumer_offsets x WHERE x.topic_id = ` + T + `)
             OR EXISTS (SELECT 1 FROM ` + n.s + `subscriptions x WHERE x.topic_id = ` + T + `) AS has_groups,
           ` + adopted + ` AS adopted_at,
           to_regclass(` + quoteLiteral(n.s+"outbox_message_t") + `) = to_regclass(` + quoteLiteral(n.outbox) + `)
             OR to_regclass(` + quoteLiteral(n.s+"log_counter") + `) = to_regclass(` + quoteLiteral(n.counter) + `)
             OR to_regclass(` + quoteLiteral(n.s+"consumer_offsets") + `) = to_regclass(` + quoteLiteral(n.offsets) + `) AS same
)
SELECT c.next, e.events, e.unoffset, e.lo, e.hi, t.adopted_at, array_remove(ARRAY[
    CASE WHEN t.same THEN 'pgevents lives in the same schema as the tables to adopt: give it a schema of its own (configuration key schema) and run consumer migrate' END,
    CASE WHEN t.adopted_at IS NOT NULL THEN format('topic %s was adopted already, at %s: adopt runs once', ` + T + `, t.adopted_at) END,
    CASE WHEN t.adopted_at IS NULL AND t.has_events THEN format('topic %s already has events: adopt into a new topic', ` + T + `) END,
    CASE WHEN t.adopted_at IS NULL AND t.has_groups THEN format('topic %s already has consumer groups: adopt into a new topic', ` + T + `) END,
    CASE WHEN t.partitions IS NOT NULL AND t.partitions <> ` + N + ` THEN format('topic %s exists with %s partitions, not %s: adopt into a new topic, or create it with totalPartitions: %s', ` + T + `, t.partitions, ` + N + `, ` + N + `) END,
    CASE WHEN t.scope IS NOT NULL AND t.scope <> 'topic' THEN format('topic %s has offset scope %s: the old offsets are one sequence across the topic (offsetScope: topic)', ` + T + `, t.scope) END,
    CASE WHEN c.next IS NULL THEN format('%s has no row with id = %s', ` + quoteLiteral(n.counter) + `, ` + strconv.Itoa(o.CounterID) + `) END,
    CASE WHEN e.lo < 1 THEN format('offset %s of %s is below 1', e.lo, ` + quoteLiteral(n.outbox) + `) END,
    CASE WHEN e.distinct_offsets < e.events THEN format('%s events of %s share an offset with another', e.events - e.distinct_offsets, ` + quoteLiteral(n.outbox) + `) END,
    CASE WHEN e.hi >= c.next THEN format('offset %s of %s is at or beyond the counter (%s.next_offset = %s)', e.hi, ` + quoteLiteral(n.outbox) + `, ` + quoteLiteral(n.counter) + `, c.next) END,
    CASE WHEN h.holes > 0 THEN format('%s offsets in %s..%s are missing from %s, and some group has not handled them (the lowest position is %s%s): they cannot be explained',
        h.holes, low.below, c.next - 1, ` + quoteLiteral(n.outbox) + `, low.below, CASE WHEN gs.missing > 0 THEN ', a group without a position in a partition starts there' ELSE '' END) END,
    CASE WHEN gs.out_of_range > 0 THEN format('%s positions in %s name partition %s, outside 0..%s: give the partition count the old consumers ran with (--partitions)', gs.out_of_range, ` + quoteLiteral(n.offsets) + `, gs.max_partition, ` + N + ` - 1) END,
    CASE WHEN gs.max_pos > c.next THEN format('a position in %s is %s, beyond the counter (%s): a group would skip the next events', ` + quoteLiteral(n.offsets) + `, gs.max_pos, c.next) END,
    CASE WHEN gs.min_pos < 1 THEN format('a position in %s is %s, below 1', ` + quoteLiteral(n.offsets) + `, gs.min_pos) END,
    CASE WHEN oth.n > 0 THEN format('%s rows of %s have a topic_id other than %s: adopt one log at a time', oth.n, ` + quoteLiteral(n.offsets) + `, ` + strconv.Itoa(o.OldTopic) + `) END,
    CASE WHEN e.no_host > 0 THEN format('%s events have no host_id: map one with --map host_id=EXPR', e.no_host) END,
    CASE WHEN e.no_type > 0 THEN format('%s events have no event_type: map one with --map event_type=EXPR', e.no_type) END
], NULL) AS problems
FROM c, e, gs, low, h, oth, t`
}

// readGroups reads the old groups, their positions and what they have not
// handled yet.
func (p *Plan) readGroups(ctx context.Context, db schema.DB, n names) error {
	o := p.Options
	N := strconv.Itoa(o.Partitions)
	rows, err := db.Query(ctx, `WITH d AS (
    SELECT DISTINCT group_id::text AS group_id FROM `+n.offsets+` WHERE topic_id = $1
), gp AS (
    SELECT d.group_id, pp.p, g.next_offset::bigint AS pos
    FROM d CROSS JOIN generate_series(0, `+N+` - 1) AS pp(p)
    LEFT JOIN `+n.offsets+` g ON g.group_id::text = d.group_id AND g.topic_id = $1 AND g.partition_id = pp.p
), ep AS (
    SELECT `+n.s+`event_partition(`+p.expr("host_id")+`, `+N+`) AS p, o.c_offset::bigint AS c_offset
    FROM `+n.outbox+` o WHERE o.c_offset IS NOT NULL
), u AS (
    SELECT gp.group_id, gp.p, count(ep.c_offset) AS unhandled
    FROM gp LEFT JOIN ep ON ep.p = gp.p AND ep.c_offset >= coalesce(gp.pos, 1)
    GROUP BY 1, 2
)
SELECT gp.group_id, gp.p, gp.pos, u.unhandled
FROM gp JOIN u USING (group_id, p)
ORDER BY 1, 2`, o.OldTopic)
	if err != nil {
		return fmt.Errorf("adopt: groups: %w", err)
	}
	var (
		g         string
		part      int
		pos       *int64
		unhandled int64
		byID      = map[string]*Group{}
	)
	if _, err := pgx.ForEachRow(rows, []any{&g, &part, &pos, &unhandled}, func() error {
		gr := byID[g]
		if gr == nil {
			gr = &Group{ID: g, Positions: map[int]int64{}}
			byID[g] = gr
		}
		if pos == nil {
			gr.Missing = append(gr.Missing, part)
		} else {
			gr.Positions[part] = *pos
		}
		gr.Unhandled += unhandled
		return nil
	}); err != nil {
		return fmt.Errorf("adopt: groups: %w", err)
	}
	for _, gr := range byID {
		p.Groups = append(p.Groups, *gr)
	}
	sort.Slice(p.Groups, func(i, j int) bool { return p.Groups[i].ID < p.Groups[j].ID })
	return nil
}
