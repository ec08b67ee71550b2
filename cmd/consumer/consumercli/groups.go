package consumercli

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"strings"

	"github.com/pgevents/pgevents"
	"github.com/pgevents/pgevents/offsets"
)

// offsetsCmd is `consumer offsets reset`.
func offsetsCmd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 || args[0] != "reset" {
		return usagef("usage: consumer offsets reset --group G --to earliest|latest|offset:N|time:T [--force] [--topic T] [--config FILE]")
	}
	fs := flag.NewFlagSet("offsets reset", flag.ContinueOnError)
	fs.SetOutput(stderr)
	path := fs.String("config", defaultConfigPath, "configuration file: the group's database (its groups item's databaseUrl, or the top level's), and its topicId when --topic is not given")
	group := fs.String("group", "", "the consumer group to move (required)")
	to := fs.String("to", "", "earliest (replay every retained event), latest (skip to now), offset:N or time:<RFC 3339>")
	topic := fs.Int("topic", 0, "topic (default: the group's topicId in the configuration, or the top level's)")
	force := fs.Bool("force", false, "reset although a replica of the group is running: its in-flight batch rolls back and it continues from the new positions")
	asJSON := fs.Bool("json", false, "print what moved as JSON")
	if err := fs.Parse(args[1:]); err != nil {
		return &usageError{err}
	}
	if *group == "" {
		return usagef("offsets reset: --group is required")
	}
	start, err := pgevents.ParseStartPosition(*to)
	if err != nil {
		return usagef("offsets reset: --to %v", err)
	}
	ctx, _, pool, err := connectGroup(ctx, *path, *group, topic)
	if err != nil {
		return err
	}
	defer pool.Close()
	moves, err := offsets.Reset(ctx, pool, *group, *topic, offsets.Start{Kind: start.Kind, Offset: start.Offset, Time: start.Time}, *force)
	if err != nil {
		return err
	}
	if *asJSON {
		return json.NewEncoder(stdout).Encode(moves)
	}
	fmt.Fprintf(stdout, "group %s on topic %d reset to %s:\n", *group, *topic, start)
	for _, m := range moves {
		from := "-"
		if m.From >= 0 {
			from = fmt.Sprint(m.From)
		}
		fmt.Fprintf(stdout, "  partition %d: %s -> %d\n", m.Partition, from, m.To)
	}
	return nil
}

// groupCmd is `consumer group pause|resume|cancel G`.
func groupCmd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	const use = "usage: consumer group pause|resume|cancel GROUP [--topic T] [--config FILE]"
	if len(args) < 2 {
		return usagef(use)
	}
	to := map[string]string{"pause": offsets.Paused, "resume": offsets.Active, "cancel": offsets.Cancelled}[args[0]]
	if to == "" {
		return usagef("group: unknown action %q; %s", args[0], use)
	}
	group := args[1]
	fs := flag.NewFlagSet("group "+args[0], flag.ContinueOnError)
	fs.SetOutput(stderr)
	path := fs.String("config", defaultConfigPath, "configuration file: the group's database (its groups item's databaseUrl, or the top level's), and its topicId when --topic is not given")
	topic := fs.Int("topic", 0, "topic (default: the group's topicId in the configuration, or the top level's)")
	if err := fs.Parse(args[2:]); err != nil {
		return &usageError{err}
	}
	ctx, _, pool, err := connectGroup(ctx, *path, group, topic)
	if err != nil {
		return err
	}
	defer pool.Close()
	prev, err := offsets.SetState(ctx, pool, group, *topic, to)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "group %s on topic %d: %s -> %s\n", group, *topic, prev, to)
	if to == offsets.Cancelled {
		fmt.Fprintln(stdout, strings.TrimSpace(`CANCELLED is terminal: the group no longer holds back retention and its replicas stop.`))
	}
	return nil
}
