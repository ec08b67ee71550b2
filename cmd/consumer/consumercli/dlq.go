package consumercli

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgevents/pgevents"
	"github.com/pgevents/pgevents/config"
	"github.com/pgevents/pgevents/offsets"
)

const dlqUsage = `usage:
  {cmd} dlq list    [--config FILE] [--group G] [--json]
  {cmd} dlq replay  (ID | --all) [--group G] [--config FILE]
  {cmd} dlq discard ID [--group G] [--config FILE]

replay runs the configured group's handlers again on a dead-lettered unit and
on the events parked behind it, in offset order, under the partition's lock,
and removes them when all succeed. discard removes a dead letter without
handling it and handles the events parked behind it, in order.
`

// dlqSynopsis and dlqAbout are each dlq subcommand's usage line and what
// it does.
var (
	dlqSynopsis = map[string]string{
		"list":    "[--config FILE] [--group G] [--json]",
		"replay":  "(ID | --all) [--group G] [--config FILE]",
		"discard": "ID [--group G] [--config FILE]",
	}
	dlqAbout = map[string]string{
		"list":    "Lists the dead letters: id, group, partition, offsets, hosts, event types, the events parked behind each, attempts and the last error.",
		"replay":  "Runs the configured group's handlers again on a dead-lettered unit and on the events parked behind it, in offset order, under the partition's lock, and removes them when all succeed.",
		"discard": "Removes a dead letter without handling it, and handles the events parked behind it, in order.",
	}
)

// dlqSub is `consumer dlq list|replay|discard`.
func dlqSub(sub string) func(*CLI, context.Context, []string, io.Writer, io.Writer) error {
	return func(c *CLI, ctx context.Context, args []string, stdout, stderr io.Writer) error {
		return c.dlqCmd(ctx, sub, args, stdout, stderr)
	}
}

func (c *CLI) dlqCmd(ctx context.Context, sub string, args []string, stdout, stderr io.Writer) error {
	fs := NewFlagSet(ctx, "dlq "+sub, dlqSynopsis[sub], dlqAbout[sub])
	path := fs.String("config", defaultConfigPath, "configuration file: the database (the group's, with --group) and, for replay and discard, the group's handlers")
	group := fs.String("group", "", "consumer group (replay and discard: default the configuration's only group)")
	asJSON := fs.Bool("json", false, "list as JSON")
	all := fs.Bool("all", false, "replay every dead letter of the group, oldest first")
	positional, err := parseInterleaved(fs, args, stdout, stderr)
	if err != nil {
		return err
	}
	if sub == "list" && len(positional) > 0 {
		return usagef("dlq list: unexpected argument %q", positional[0])
	}
	// The group's database: with --group (or, for replay and discard, the
	// file's only group), that group's; else the top level's.
	cfg, err := config.Load(*path)
	if err != nil {
		return err
	}
	name := *group
	if name == "" && sub != "list" && len(cfg.GroupConfigs()) == 1 {
		name = cfg.GroupConfigs()[0].GroupID
	}
	pl, err := groupPlace(cfg, name, 0)
	if err != nil {
		return err
	}
	ctx, pool, err := pl.open(ctx, cfg, cfg.PoolSize(), *path)
	if err != nil {
		return err
	}
	defer pool.Close()

	if sub == "list" {
		dls, err := pgevents.ListDeadLetters(ctx, pool, *group)
		if err != nil {
			return err
		}
		if len(dls) == 0 && *group != "" {
			// None: say so of a group the topic does not know.
			if err := knownGroup(ctx, pool, *group, pl.topic); err != nil {
				return err
			}
		}
		if *asJSON {
			enc := json.NewEncoder(stdout)
			enc.SetIndent("", "  ")
			if dls == nil {
				dls = []pgevents.DeadLetter{}
			}
			return enc.Encode(dls)
		}
		tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "ID\tGROUP\tTOPIC\tPARTITION\tOFFSETS\tEVENTS\tHOST\tEVENT TYPE\tPARKED\tATTEMPTS\tLAST FAILURE\tERROR")
		for _, d := range dls {
			fmt.Fprintf(tw, "%d\t%s\t%d\t%d\t%d-%d\t%d\t%s\t%s\t%d\t%d\t%s\t%s\n", d.ID, d.Group, d.Topic, d.Partition,
				d.FirstOffset, d.LastOffset, len(d.EventIDs), listed(d.HostIDs), listed(d.EventTypes), d.Parked, d.Attempts,
				d.LastFailedAt.Format("2006-01-02 15:04:05Z07:00"), shorten(d.Error, 80))
		}
		return tw.Flush()
	}

	// The handlers that run are those of the group in the configuration.
	groups := cfg.GroupConfigs()
	g := slices.IndexFunc(groups, func(gc config.Config) bool {
		return gc.GroupID == *group || (*group == "" && len(groups) == 1)
	})
	if len(pl.groups) == 1 {
		g = pl.groups[0] // the group's item on the database opened
	}
	if g < 0 {
		return usagef("dlq %s: the configuration has no group %q: name one of its groups with --group, whose handlers will run", sub, *group)
	}
	var ids []int64
	switch {
	case *all && sub == "replay":
		if len(positional) != 0 {
			return usagef("dlq replay: give an ID or --all, not both")
		}
		dls, err := pgevents.ListDeadLetters(ctx, pool, groups[g].GroupID)
		if err != nil {
			return err
		}
		for _, d := range dls {
			ids = append(ids, d.ID)
		}
	case len(positional) == 1:
		id, err := strconv.ParseInt(positional[0], 10, 64)
		if err != nil {
			return usagef("dlq %s: %q is not a dead letter id", sub, positional[0])
		}
		ids = []int64{id}
	default:
		return usagef("dlq %s: exactly one dead letter ID is required", sub)
	}

	log := newLogger(cfg, stderr)
	handlers, closeHandlers, err := c.buildHandlers(cfg, g, stdout)
	if err != nil {
		return inFile(err, *path)
	}
	defer closeHandlers()
	consumer, err := pgevents.NewConsumer(pool, groups[g].Consumer(handlers, &log))
	if err != nil {
		return inFile(cfg.ConsumerError(g, err), *path)
	}
	for _, id := range ids {
		n, err := resolveDeadLetter(ctx, pool, consumer, sub, id)
		if err != nil {
			return err
		}
		fmt.Fprintf(stdout, "dead letter %d %sed: %d events handled\n", id, strings.TrimSuffix(sub, "e"), n)
	}
	return nil
}

// resolveDeadLetter replays or discards (action) dead letter id with
// consumer's handlers, and records it in the audit with its outcome, right
// after: the replay commits in a transaction of its own.
func resolveDeadLetter(ctx context.Context, pool *pgxpool.Pool, consumer *pgevents.Consumer, action string, id int64) (int, error) {
	e := offsets.AuditEntry{Action: action, DeadLetter: &id}
	n, err := func() (int, error) {
		d, err := pgevents.GetDeadLetter(ctx, pool, id)
		if errors.Is(err, pgevents.ErrNoDeadLetter) {
			return 0, fmt.Errorf("dead letter %d does not exist (`%s dlq list` lists them)", id, cmdName(ctx))
		}
		if err != nil {
			return 0, err
		}
		e.Topic, e.Group, e.Partition = &d.Topic, &d.Group, &d.Partition
		e.Detail = fmt.Sprintf("offsets %d-%d, %d events, hosts %s", d.FirstOffset, d.LastOffset, len(d.EventIDs), strings.Join(d.HostIDs, " "))
		if action == "replay" {
			return consumer.ReplayDeadLetter(ctx, id)
		}
		return consumer.DiscardDeadLetter(ctx, id)
	}()
	e.Outcome = fmt.Sprintf("ok: %d events handled", n)
	if err != nil {
		e.Outcome = "failed: " + err.Error()
	}
	if aerr := recordAfter(ctx, pool, e); aerr != nil {
		return n, errors.Join(err, aerr)
	}
	return n, err
}

// parseInterleaved parses args with fs as ParseFlags does, flags before
// and after the positional arguments (dlq discard ID --config FILE), and
// returns the positional ones.
func parseInterleaved(fs *flag.FlagSet, args []string, stdout, stderr io.Writer) ([]string, error) {
	var positional []string
	for {
		if err := ParseFlags(fs, args, stdout, stderr); err != nil {
			return nil, err
		}
		if fs.NArg() == 0 {
			return positional, nil
		}
		positional = append(positional, fs.Arg(0))
		args = fs.Args()[1:]
	}
}

// listed joins a dead letter's hosts or event types for the table.
func listed(s []string) string {
	if len(s) == 0 {
		return "-"
	}
	return shorten(strings.Join(s, ","), 40)
}

func shorten(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	if len(s) > n {
		return s[:n-1] + "…"
	}
	return s
}
