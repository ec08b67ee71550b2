package consumercli

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/user"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgevents/pgevents"
	"github.com/pgevents/pgevents/config"
	"github.com/pgevents/pgevents/offsets"
)

const offsetsUsage = `usage:
  {cmd} offsets show  [--group G] [--topic T] [--json] [--config FILE]
  {cmd} offsets reset --group G --to earliest|latest|offset:N|time:T [--force] [--topic T] [--json] [--config FILE]

Run '{cmd} offsets show -h' or '{cmd} offsets reset -h' for their flags.
`

const groupUsage = `usage:
  {cmd} group pause  GROUP [--topic T] [--config FILE]
  {cmd} group resume GROUP [--topic T] [--config FILE]
  {cmd} group cancel GROUP [--topic T] [--config FILE]
  {cmd} group unhalt GROUP --partition N [--topic T] [--config FILE]

pause stops the group's consumers taking batches (it still holds back
retention); resume lets them take batches again; cancel ends the
subscription for good (it no longer holds back retention, and its
replicas stop). Pausing a paused group and resuming an active one succeed
and say so. unhalt releases a halted partition: its consumer tries the
unit it halted at again at once.
`

// shownPosition is a line of `consumer offsets show`, and its JSON form.
type shownPosition struct {
	Group     string `json:"group_id"`
	Topic     int    `json:"topic_id"`
	Partition int    `json:"partition_id"`
	// Position is the next offset the group reads; null when it has none
	// in the partition (no replica served it yet).
	Position *int64 `json:"position"`
	LogEnd   int64  `json:"log_end"`
	Lag      int64  `json:"lag"`
	// LagCapped says that the lag was counted up to the cap only: it is at
	// least Lag.
	LagCapped bool `json:"lag_capped"`
}

// offsetsShow is `consumer offsets show`: each group's position, log end
// and lag per partition (offsets.Positions), of the file's groups, each
// from its own database, or of --group.
func offsetsShow(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := NewFlagSet(ctx, "offsets show", "[--group G] [--topic T] [--json] [--config FILE]",
		"Each group's position (the next offset it reads), log end and lag per partition, of the file's groups, each from its own database, or of --group.")
	path := fs.String("config", defaultConfigPath, "configuration file: the groups to show, and their databases")
	group := fs.String("group", "", "show this group only (default: every group of the configuration)")
	topic := fs.Int("topic", 0, "topic (default: the group's topicId in the configuration, or the top level's)")
	asJSON := fs.Bool("json", false, "print a JSON array of positions")
	if err := ParseFlags(fs, args, stdout, stderr); err != nil {
		return err
	}
	if fs.NArg() != 0 {
		return usagef("offsets show: unexpected argument %q", fs.Arg(0))
	}
	cfg, err := config.Load(*path)
	if err != nil {
		return err
	}
	type target struct {
		pl     place
		groups []string
	}
	var targets []target
	if *group != "" {
		pl, err := groupPlace(cfg, *group, *topic)
		if err != nil {
			return err
		}
		if *topic != 0 {
			pl.topic = *topic
		}
		targets = append(targets, target{pl, []string{*group}})
	} else {
		for _, pl := range groupPlaces(cfg) {
			if *topic != 0 && pl.topic != *topic {
				continue
			}
			t := target{pl: pl}
			for _, i := range pl.groups {
				t.groups = append(t.groups, cfg.GroupConfigs()[i].GroupID)
			}
			targets = append(targets, t)
		}
		if len(targets) == 0 && *topic != 0 {
			// No group of the file on that topic: none to show, once the
			// topic is known to exist.
			pl := topPlace(cfg)
			pl.topic = *topic
			targets = append(targets, target{pl: pl})
		}
	}
	shown := []shownPosition{}
	for _, t := range targets {
		pctx, pool, err := t.pl.open(ctx, cfg, 1, *path)
		if err != nil {
			return err
		}
		if err := knownTopic(pctx, pool, t.pl.topic, *path); err != nil {
			pool.Close()
			return err
		}
		if *group != "" {
			if err := knownGroup(pctx, pool, *group, t.pl.topic); err != nil {
				pool.Close()
				return err
			}
		}
		for _, g := range t.groups {
			ps, err := offsets.Positions(pctx, pool, g, t.pl.topic, 0)
			if err != nil {
				pool.Close()
				return fmt.Errorf("group %s: %w", g, err)
			}
			for _, p := range ps {
				s := shownPosition{Group: g, Topic: t.pl.topic, Partition: p.Partition, LogEnd: p.LogEnd, Lag: p.Lag, LagCapped: p.LagCapped}
				if p.Next >= 0 {
					s.Position = &p.Next
				}
				shown = append(shown, s)
			}
		}
		pool.Close()
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(shown)
	}
	tw := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "GROUP\tTOPIC\tPARTITION\tPOSITION\tLOG END\tLAG\t")
	for _, s := range shown {
		pos, lag := "-", fmt.Sprint(s.Lag)
		if s.Position != nil {
			pos = fmt.Sprint(*s.Position)
		} else {
			lag = "-"
		}
		if s.LagCapped {
			lag = ">=" + lag
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%s\t%d\t%s\t\n", s.Group, s.Topic, s.Partition, pos, s.LogEnd, lag)
	}
	return tw.Flush()
}

// offsetsReset is `consumer offsets reset`: every position of the group
// moved to --to, recorded in the audit.
func offsetsReset(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := NewFlagSet(ctx, "offsets reset", "--group G --to earliest|latest|offset:N|time:T [--force] [--topic T] [--json] [--config FILE]",
		"Moves every position of the group on the topic, to replay or to skip events, and prints what moved. Refused while a replica of the group runs, unless --force.")
	path := fs.String("config", defaultConfigPath, "configuration file: the group's database (its groups item's databaseUrl, or the top level's), and its topicId when --topic is not given")
	group := fs.String("group", "", "the consumer group to move (required)")
	to := fs.String("to", "", "earliest (replay every retained event), latest (skip to now), offset:N or time:<RFC 3339>")
	topic := fs.Int("topic", 0, "topic (default: the group's topicId in the configuration, or the top level's)")
	force := fs.Bool("force", false, "reset although a replica of the group is running: its in-flight batch rolls back and it continues from the new positions")
	asJSON := fs.Bool("json", false, "print what moved as JSON")
	if err := ParseFlags(fs, args, stdout, stderr); err != nil {
		return err
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
	var moves []offsets.Move
	forced := ""
	if *force {
		forced = " (forced)"
	}
	err = audited(ctx, pool, offsets.AuditEntry{Action: "reset", Topic: topic, Group: group}, func(tx pgx.Tx) (string, error) {
		var err error
		moves, err = offsets.Reset(ctx, tx, *group, *topic, offsets.Start{Kind: start.Kind, Offset: start.Offset, Time: start.Time}, *force)
		var b strings.Builder
		fmt.Fprintf(&b, "to %s%s:", start, forced)
		for _, m := range moves {
			fmt.Fprintf(&b, " partition %d %s -> %d%s;", m.Partition, fromString(m.From), m.To, haltNote(m))
		}
		return strings.TrimSuffix(b.String(), ";"), err
	})
	if err != nil {
		return err
	}
	if *asJSON {
		return json.NewEncoder(stdout).Encode(moves)
	}
	fmt.Fprintf(stdout, "group %s on topic %d reset to %s:\n", *group, *topic, start)
	for _, m := range moves {
		fmt.Fprintf(stdout, "  partition %d: %s -> %d%s\n", m.Partition, fromString(m.From), m.To, haltNote(m))
	}
	return nil
}

// haltNote says what a reset did to the partition's halt: " (halt at 17
// cleared: moved past it)", " (still halted at 17: unhalt it to try that
// unit again)", or "".
func haltNote(m offsets.Move) string {
	switch {
	case m.Unhalted != nil:
		return fmt.Sprintf(" (halt at %d cleared: moved past it)", *m.Unhalted)
	case m.Halted != nil:
		return fmt.Sprintf(" (still halted at %d: unhalt it to try that unit again)", *m.Halted)
	}
	return ""
}

// fromString is a Move's From as shown: "-" when the group had no
// position.
func fromString(from int64) string {
	if from < 0 {
		return "-"
	}
	return fmt.Sprint(from)
}

// groupAction is `consumer group pause|resume|cancel GROUP`. Pausing a
// paused group and resuming an active one succeed and say so.
func groupAction(action string) func(*CLI, context.Context, []string, io.Writer, io.Writer) error {
	return func(_ *CLI, ctx context.Context, args []string, stdout, stderr io.Writer) error {
		return groupCmd(ctx, action, args, stdout, stderr)
	}
}

// groupAbout says what each action of `consumer group` does.
var groupAbout = map[string]string{
	"pause":  "Pauses the group's subscription on the topic: its consumers stop taking batches, and it still holds back retention. Pausing a paused group succeeds and says so.",
	"resume": "Resumes a paused group: its consumers take batches again. Resuming an active group succeeds and says so.",
	"cancel": "Cancels the group's subscription on the topic, for good: it no longer holds back retention, and its replicas stop.",
}

func groupCmd(ctx context.Context, action string, args []string, stdout, stderr io.Writer) error {
	to := map[string]string{"pause": offsets.Paused, "resume": offsets.Active, "cancel": offsets.Cancelled}[action]
	fs := NewFlagSet(ctx, "group "+action, "GROUP [--topic T] [--config FILE]", groupAbout[action])
	path := fs.String("config", defaultConfigPath, "configuration file: the group's database (its groups item's databaseUrl, or the top level's), and its topicId when --topic is not given")
	topic := fs.Int("topic", 0, "topic (default: the group's topicId in the configuration, or the top level's)")
	positional, err := parseInterleaved(fs, args, stdout, stderr)
	if err != nil {
		return err
	}
	if len(positional) != 1 {
		var b bytes.Buffer
		fs.SetOutput(&b)
		fs.Usage()
		fs.SetOutput(stderr)
		if len(positional) == 0 {
			return usagef("group %s: the group is required\n%s", action, strings.TrimSpace(b.String()))
		}
		return usagef("group %s: one group at a time, got %q\n%s", action, positional, strings.TrimSpace(b.String()))
	}
	group := positional[0]
	ctx, _, pool, err := connectGroup(ctx, *path, group, topic)
	if err != nil {
		return err
	}
	defer pool.Close()
	var prev string
	err = audited(ctx, pool, offsets.AuditEntry{Action: action, Topic: topic, Group: &group}, func(tx pgx.Tx) (string, error) {
		var err error
		prev, err = offsets.SetState(ctx, tx, group, *topic, to)
		return transition(prev, to), err
	})
	if err != nil {
		return err
	}
	if prev == to {
		fmt.Fprintf(stdout, "group %s on topic %d was already %s: nothing changed\n", group, *topic, to)
		return nil
	}
	fmt.Fprintf(stdout, "group %s on topic %d: %s -> %s\n", group, *topic, prev, to)
	if to == offsets.Cancelled {
		fmt.Fprintln(stdout, "CANCELLED is terminal: the group no longer holds back retention and its replicas stop.")
	}
	return nil
}

// groupUnhalt is `consumer group unhalt G --partition N`: the partition's
// halt record removed (offsets.Unhalt) and recorded in the audit. The
// group's consumers are told at the commit, and the partition's worker
// tries the unit it stopped before again at once (it halts again if the
// cause remains). Unhalting a partition that is not halted succeeds and
// says so.
func groupUnhalt(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := NewFlagSet(ctx, "group unhalt", "GROUP --partition N [--topic T] [--config FILE]",
		"Releases a halted partition of the group: its consumer tries the unit it halted at again at once, and halts again if the cause remains. Unhalting a partition that is not halted succeeds and says so.")
	path := fs.String("config", defaultConfigPath, "configuration file: the group's database (its groups item's databaseUrl, or the top level's), and its topicId when --topic is not given")
	topic := fs.Int("topic", 0, "topic (default: the group's topicId in the configuration, or the top level's)")
	partition := new(int)
	*partition = -1
	fs.Func("partition", "the halted partition to unhalt (required; consumer status shows the halted ones)", func(v string) error {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			return fmt.Errorf("a partition number is required, got %q", v)
		}
		*partition = n
		return nil
	})
	positional, err := parseInterleaved(fs, args, stdout, stderr)
	if err != nil {
		return err
	}
	if len(positional) != 1 {
		return usagef("group unhalt: one group is required, got %q", positional)
	}
	group := positional[0]
	if *partition < 0 {
		return usagef("group unhalt: --partition is required (consumer status shows the halted partitions)")
	}
	ctx, _, pool, err := connectGroup(ctx, *path, group, topic)
	if err != nil {
		return err
	}
	defer pool.Close()
	var (
		h  offsets.Halt
		ok bool
	)
	err = audited(ctx, pool, offsets.AuditEntry{Action: "unhalt", Topic: topic, Group: &group, Partition: partition}, func(tx pgx.Tx) (string, error) {
		var err error
		h, ok, err = offsets.Unhalt(ctx, tx, group, *topic, *partition)
		if !ok {
			return "not halted", err
		}
		return fmt.Sprintf("halted at offset %d: %s", h.Offset, h.Reason), err
	})
	if err != nil {
		return err
	}
	if !ok {
		fmt.Fprintf(stdout, "partition %d of group %s on topic %d was not halted: nothing changed\n", *partition, group, *topic)
		return nil
	}
	fmt.Fprintf(stdout, "group %s on topic %d: partition %d unhalted; it was halted at offset %d: %s\n", group, *topic, *partition, h.Offset, h.Reason)
	fmt.Fprintln(stdout, "Its consumer tries that unit again now, and halts again if the cause remains.")
	return nil
}

// transition describes a move from state prev to state to, as the audit
// records it: "PAUSED -> ACTIVE", or "already PAUSED".
func transition(prev, to string) string {
	if prev == to {
		return "already " + to
	}
	return prev + " -> " + to
}

// audited runs act in a transaction on pool and records it in the audit
// (offsets.Audit) as the CLI's, by cliActor, with the detail act returns:
// in act's transaction when act succeeds, so that the row exists if and
// only if the action committed; on the pool, as failed, when it does not.
func audited(ctx context.Context, pool *pgxpool.Pool, e offsets.AuditEntry, act func(tx pgx.Tx) (string, error)) error {
	e.Origin, e.Actor = offsets.OriginCLI, cliActor()
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		detail, err := act(tx)
		if err != nil {
			return err
		}
		ok := e
		ok.Detail, ok.Outcome = detail, "ok"
		return offsets.Audit(ctx, tx, ok)
	})
	if err != nil {
		e.Outcome = "failed: " + err.Error()
		if aerr := offsets.Audit(context.WithoutCancel(ctx), pool, e); aerr != nil {
			return errors.Join(err, aerr)
		}
	}
	return err
}

// recordAfter records in the audit, as the CLI's, an action that committed
// (or failed) in a transaction of its own: a dead letter's replay or
// discard.
func recordAfter(ctx context.Context, pool *pgxpool.Pool, e offsets.AuditEntry) error {
	e.Origin, e.Actor = offsets.OriginCLI, cliActor()
	return offsets.Audit(context.WithoutCancel(ctx), pool, e)
}

// cliActor names who runs the CLI, for the audit: the operating system's
// user name @ the host name.
func cliActor() string {
	name := os.Getenv("USER")
	if u, err := user.Current(); err == nil && u.Username != "" {
		name = u.Username
	}
	if name == "" {
		name = fmt.Sprintf("uid %d", os.Getuid())
	}
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "unknown host"
	}
	return name + "@" + host
}
