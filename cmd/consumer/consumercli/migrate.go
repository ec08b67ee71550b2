package consumercli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgevents/pgevents"
	"github.com/pgevents/pgevents/config"
	"github.com/pgevents/pgevents/schema"
)

// migrateCmd is `consumer migrate`: the schema and the topics of the
// file's groups. It refuses a file that names a Go handler the binary does
// not have before it connects, as run does; the console's token is not
// needed (migrate never serves the console).
func (c *CLI) migrateCmd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := NewFlagSet(ctx, "migrate", "[--config FILE] [--print]",
		"Applies the schema migrations (idempotent, safe from several replicas) and creates the configured topics, writing their retention, channel and idempotency window.")
	path := fs.String("config", defaultConfigPath, "configuration file: its databaseUrl, schema, topicId and totalPartitions")
	print := fs.Bool("print", false, "write the migration SQL to stdout instead of applying it (into the configured schema, when the file exists)")
	if err := ParseFlags(fs, args, stdout, stderr); err != nil {
		return err
	}
	if fs.NArg() != 0 {
		return usagef("migrate: unexpected argument %q", fs.Arg(0))
	}
	if *print {
		// The file is optional here: without it, the SQL creates pgevents
		// in the first schema of the search_path.
		name := ""
		if cfg, err := config.Load(*path); err == nil {
			name = cfg.Schema
		} else if !errors.Is(err, os.ErrNotExist) {
			return err
		}
		_, err := io.WriteString(stdout, schema.ScriptIn(name, 0))
		return err
	}
	cfg, err := config.Load(*path)
	if err != nil {
		return err
	}
	if err := c.goHandlersError(cfg); err != nil {
		return inFile(err, *path)
	}
	// Each database of the file's groups (one unless groups set their
	// own databaseUrl), each schema there, then each group's topic.
	dbs := cfg.Databases()
	for _, d := range dbs {
		label := ""
		if len(dbs) > 1 {
			label = " (" + d.Key + ")"
		}
		if err := migrateDatabase(ctx, cfg, d, label, *path, stdout); err != nil {
			return err
		}
	}
	return nil
}

// migrateDatabase migrates database d of cfg: the schema of each of its
// groups' installations, and every topic they consume, with the file's
// topic settings. label names the database in what it prints.
func migrateDatabase(ctx context.Context, cfg *config.Config, d config.Database, label, path string, stdout io.Writer) error {
	pc, err := pgevents.ParsePoolConfig(d.URL)
	if err != nil {
		return &config.Error{File: path, Key: d.Key, Msg: err.Error()}
	}
	conn, err := pgx.ConnectConfig(ctx, pc.ConnConfig)
	if err != nil {
		return connectError(err, pc.ConnConfig, d.Key, path)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	groups := cfg.GroupConfigs()
	var migrated []string
	for _, i := range d.Groups {
		name := groups[i].Schema
		if slices.Contains(migrated, name) {
			continue
		}
		migrated = append(migrated, name)
		applied, err := schema.Migrate(schema.WithName(ctx, name), conn)
		if err != nil {
			return besideError(ctx, err, cfg.KeyPath(i, "schema"), name, path)
		}
		where := "the first schema of the search_path"
		if name != "" {
			where = "schema " + name
		}
		fmt.Fprintf(stdout, "pgevents in %s%s at version %d (applied: %v)\n", where, label, schema.Latest(), applied)
	}
	// Every topic the groups on this database consume.
	for _, i := range d.Groups {
		if err := migrateTopic(schema.WithName(ctx, groups[i].Schema), conn, cfg, i, path, stdout); err != nil {
			return err
		}
	}
	return nil
}

// besideError returns err, a failure of schema.Migrate into schema name
// ("" for the first of the search_path), as a configuration error naming
// schemaKey when it says that a table or function of pgevents' name
// exists there already while pgevents is not installed: a seed-style
// deployment (its log_counter, outbox_message_t, dead_letter_queue,
// notify_event()), which pgevents installs beside, in a schema of its
// own, and moves over with `consumer adopt`.
func besideError(ctx context.Context, err error, schemaKey, name, path string) error {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) || (pgErr.Code != "42P07" && pgErr.Code != "42723" && pgErr.Code != "42710") {
		return err
	}
	where := "the first schema of the search_path"
	if name != "" {
		where = "schema " + name
	}
	return &config.Error{File: path, Key: schemaKey,
		Msg: fmt.Sprintf("%s already has an object of pgevents' name that pgevents did not create (%s): a seed-style deployment? "+
			"Install pgevents beside it, in a schema of its own (schema: pgevents), and move the old log and its groups' positions over with `%s adopt --config %s` (docs/adopting.md)",
			where, pgErr.Message, cmdName(ctx), path)}
}

// migrateTopic creates or updates the topic of group i of cfg (in
// GroupConfigs order) on conn, in the schema of ctx: its partitions,
// segment size and scope when created; its retention, idempotency window,
// allocation and channel every time. Errors name the file's keys.
func migrateTopic(ctx context.Context, conn *pgx.Conn, cfg *config.Config, i int, path string, stdout io.Writer) error {
	g := cfg.GroupConfigs()[i]
	topic, created, err := schema.EnsureTopicSpec(ctx, conn, schema.TopicSpec{
		ID: g.TopicID, Partitions: g.TotalPartitions, SegmentSize: g.SegmentSize, Scope: g.OffsetScope})
	if err != nil {
		return err
	}
	if topic.Scope != g.OffsetScope {
		return &config.Error{File: path, Key: cfg.KeyPath(i, "offsetScope"),
			Msg: fmt.Sprintf("topic %d was created with offset scope %q, not %q; a topic's scope is chosen when it is created", topic.ID, topic.Scope, g.OffsetScope)}
	}
	if err := schema.SetRetention(ctx, conn, g.TopicID, retentionOf(&g)); err != nil {
		return err
	}
	window, _ := config.ParseDuration(g.IdempotencyWindow) // validated
	if err := schema.SetIdempotencyWindow(ctx, conn, g.TopicID, window); err != nil {
		return err
	}
	if err := schema.SetAllocation(ctx, conn, g.TopicID, g.OffsetAllocation); err != nil {
		return err
	}
	if g.Channel != "" {
		// A channel two installations share wakes each one's consumers
		// for the other's appends; by default they never do (see
		// schema.ChannelFor), so one set by hand is checked.
		users, err := schema.ChannelUsers(ctx, conn, g.Channel)
		if err != nil {
			return err
		}
		if len(users) > 0 {
			return &config.Error{File: path, Key: cfg.KeyPath(i, "channel"),
				Msg: fmt.Sprintf("channel %q is notified by %s already; two installations on one channel wake each other's consumers for nothing: choose another channel, or leave channel unset", g.Channel, users[0])}
		}
		if err := schema.SetChannel(ctx, conn, g.TopicID, g.Channel); err != nil {
			return err
		}
	}
	if topic.Partitions != g.TotalPartitions {
		return &config.Error{File: path, Key: cfg.KeyPath(i, "totalPartitions"),
			Msg: fmt.Sprintf("topic %d already has %d partitions, not %d; change it with `%s repartition --topic %d --partitions %d`",
				topic.ID, topic.Partitions, g.TotalPartitions, cmdName(ctx), topic.ID, g.TotalPartitions)}
	}
	verb := "exists"
	if created {
		verb = "created"
	}
	offsets := "offsets per " + topic.Scope
	if topic.Scope == schema.ScopeSequenced {
		offsets = "sequenced (offsets per partition, assigned after commit)"
	}
	fmt.Fprintf(stdout, "topic %d %s with %d partitions, %s, %s allocation\n", topic.ID, verb, topic.Partitions, offsets, g.OffsetAllocation)
	return nil
}

// retentionOf reads the topic's retention settings from a validated
// configuration.
func retentionOf(c *config.Config) schema.Retention {
	r := schema.Retention{}
	r.Retention, _ = config.ParseDuration(c.Retention)
	r.ZeroSubscription, _ = config.ParseDuration(c.ZeroSubscriptionRetention)
	if c.MaxRetention != "" {
		r.Max, _ = config.ParseDuration(c.MaxRetention)
	}
	return r
}
