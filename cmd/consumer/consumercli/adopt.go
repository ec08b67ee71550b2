package consumercli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/pgevents/pgevents/adopt"
	"github.com/pgevents/pgevents/config"
)

// mapFlag collects --map column=EXPR.
type mapFlag map[string]string

func (m mapFlag) String() string { return fmt.Sprint(map[string]string(m)) }

func (m mapFlag) Set(v string) error {
	col, expr, ok := strings.Cut(v, "=")
	if !ok || strings.TrimSpace(col) == "" || strings.TrimSpace(expr) == "" {
		return fmt.Errorf("want column=EXPR, got %q", v)
	}
	m[strings.TrimSpace(col)] = expr
	return nil
}

// adoptCmd is `consumer adopt`: a seed-style deployment onto pgevents.
func adoptCmd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := NewFlagSet(ctx, "adopt", "[--partitions N] [--dry-run | --print] [--bridge] | --unbridge [--config FILE]",
		"Moves a seed-style deployment (its log and every group's position) onto pgevents, in the configured schema.")
	path := fs.String("config", defaultConfigPath, "configuration file: its databaseUrl, schema (pgevents' own, beside the old tables), topicId, totalPartitions, segmentSize and channel")
	partitions := fs.Int("partitions", 0, "the partition count the old consumers ran with (their totalPartitions); required when the old consumer_offsets cannot tell")
	dryRun := fs.Bool("dry-run", false, "print what adopt would do and the counts, and the problems that would stop it; write nothing")
	print := fs.Bool("print", false, "write the adoption's SQL (one transaction) to stdout, for your own migration tool, instead of running it")
	bridge := fs.Bool("bridge", false, "also install a trigger on the old outbox that appends its new rows to pgevents' log (producers that cannot move on the day)")
	unbridge := fs.Bool("unbridge", false, "remove the bridge, once every producer appends with append_event")
	from := fs.String("from", "public", "schema of the old tables")
	outbox := fs.String("outbox", "outbox_message_t", "the old outbox table")
	counter := fs.String("counter", "log_counter", "the old counter table (its row id = 1)")
	offsetsTable := fs.String("offsets", "consumer_offsets", "the old consumer_offsets table")
	oldTopic := fs.Int("old-topic", 1, "the topic_id of the old log in the old consumer_offsets")
	maps := mapFlag{}
	fs.Var(maps, "map", "column=EXPR: where a column of pgevents' log comes from, an SQL expression over the old row o (event_id, host_id, user_id, event_type, payload, created_at, transaction_id); repeatable")
	if err := ParseFlags(fs, args, stdout, stderr); err != nil {
		return err
	}
	if fs.NArg() != 0 {
		return usagef("adopt: unexpected argument %q", fs.Arg(0))
	}
	if n := countTrue(*dryRun, *print, *unbridge); n > 1 {
		return usagef("adopt: --dry-run, --print and --unbridge exclude each other")
	}
	ctx, cfg, pool, err := connectTop(ctx, *path, nil, false) // adopt installs pgevents
	if err != nil {
		return err
	}
	defer pool.Close()
	opts := adopt.Options{
		From: *from, Outbox: *outbox, Counter: *counter, Offsets: *offsetsTable, OldTopic: *oldTopic,
		Topic: cfg.TopicID, Partitions: *partitions, SegmentSize: cfg.SegmentSize, Channel: cfg.Channel,
		Map: maps, Bridge: *bridge,
	}
	if *unbridge {
		if err := adopt.Unbridge(ctx, pool, opts); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "bridge of topic %d removed from %s.%s: new rows of the old outbox no longer reach pgevents\n", cfg.TopicID, *from, *outbox)
		return nil
	}
	if cfg.OffsetScope != "topic" {
		return &config.Error{File: *path, Key: "offsetScope",
			Msg: "adopt creates a topic with offset scope topic (the old offsets are one sequence across the log), got " + cfg.OffsetScope}
	}
	plan, err := adopt.Inspect(ctx, pool, opts)
	var unknown *adopt.PartitionsUnknownError
	if errors.As(err, &unknown) {
		return &usageError{err}
	}
	if err != nil {
		return err
	}
	if plan.Options.Partitions != cfg.TotalPartitions {
		return &config.Error{File: *path, Key: "totalPartitions",
			Msg: fmt.Sprintf("the old deployment has %d partitions (from %s) but the configuration says %d: set totalPartitions: %d, the count the adopted topic keeps",
				plan.Options.Partitions, plan.PartitionsFrom, cfg.TotalPartitions, plan.Options.Partitions)}
	}
	switch {
	case *print:
		if len(plan.Problems) > 0 {
			writeProblems(stderr, plan.Problems)
			return fmt.Errorf("adopt: %w (the SQL would refuse likewise)", adopt.ErrRefused)
		}
		_, err := io.WriteString(stdout, plan.Script())
		return err
	case *dryRun:
		writePlan(stdout, plan)
		if len(plan.Problems) > 0 {
			writeProblems(stdout, plan.Problems)
			return fmt.Errorf("adopt: %w", adopt.ErrRefused)
		}
		fmt.Fprintln(stdout, "dry run: nothing written; run without --dry-run to adopt")
		return nil
	}
	res, err := adopt.Adopt(ctx, pool, opts)
	if err != nil {
		if res != nil && len(res.Plan.Problems) > 0 {
			writeProblems(stderr, res.Plan.Problems)
		}
		return err
	}
	p := res.Plan
	fmt.Fprintf(stdout, "adopted %s into topic %d (schema %s) in %s: %d events copied, %d partitions, counter at %d, %d groups resume where they stood\n",
		p.Options.Outbox, p.Options.Topic, p.Schema, res.Took.Round(1e6), res.Copied, p.Options.Partitions, p.NextOffset, len(p.Groups))
	if p.Options.Bridge {
		fmt.Fprintf(stdout, "bridge: new rows of %s.%s go to pgevents' log too; remove it with `consumer adopt --unbridge` once every producer uses append_event\n",
			p.Options.From, p.Options.Outbox)
	}
	return nil
}

func countTrue(bs ...bool) int {
	n := 0
	for _, b := range bs {
		if b {
			n++
		}
	}
	return n
}

func writeProblems(w io.Writer, problems []string) {
	fmt.Fprintln(w, "adopt refuses:")
	for _, p := range problems {
		fmt.Fprintf(w, "  - %s\n", p)
	}
}

// writePlan prints what an adoption would do.
func writePlan(w io.Writer, p *adopt.Plan) {
	o := p.Options
	fmt.Fprintf(w, "adopt %s.%s into topic %d of pgevents in schema %s\n", o.From, o.Outbox, o.Topic, p.Schema)
	fmt.Fprintf(w, "  partitions:  %d (from %s)\n", o.Partitions, p.PartitionsFrom)
	if p.Events > 0 {
		fmt.Fprintf(w, "  events:      %d to copy, offsets %d..%d\n", p.Events, p.FirstOffset, p.LastOffset)
	} else {
		fmt.Fprintf(w, "  events:      none to copy\n")
	}
	if p.Unoffset > 0 {
		fmt.Fprintf(w, "               %d without an offset, left behind (no consumer of the old design reads them)\n", p.Unoffset)
	}
	fmt.Fprintf(w, "  counter:     the topic continues at offset %d\n", p.NextOffset)
	fmt.Fprintf(w, "  segments:    %d per partition of %d offsets, created before the copy\n", p.Segments, o.SegmentSize)
	fmt.Fprintf(w, "  columns:\n")
	for _, m := range p.Mapping {
		expr := m.Expr
		if m.Column == "metadata" {
			expr = "the old metadata"
			if len(p.Metadata) > 0 {
				expr += " with " + strings.Join(p.Metadata, ", ") + " under their own names"
			}
		}
		fmt.Fprintf(w, "    %-15s <- %s\n", m.Column, strings.Join(strings.Fields(expr), " "))
	}
	fmt.Fprintf(w, "  groups:      %d, their positions copied one to one\n", len(p.Groups))
	for _, g := range p.Groups {
		fmt.Fprintf(w, "    %s: %d positions, %d events to handle", g.ID, len(g.Positions), g.Unhandled)
		if len(g.Missing) > 0 {
			slices.Sort(g.Missing)
			fmt.Fprintf(w, "; no position in partitions %v (handled there from the first event)", g.Missing)
		}
		fmt.Fprintln(w)
	}
	if o.Bridge {
		fmt.Fprintf(w, "  bridge:      trigger %s on %s.%s appends its new rows to the topic\n", adopt.BridgeName(o.Topic), o.From, o.Outbox)
	}
}
