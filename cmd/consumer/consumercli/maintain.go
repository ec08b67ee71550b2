package consumercli

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"golang.org/x/sync/errgroup"

	"github.com/pgevents/pgevents"
	"github.com/pgevents/pgevents/config"
	"github.com/pgevents/pgevents/schema"
)

// maintainCmd runs the configured topics' maintenance (segments ahead of
// the counter, rows out of the DEFAULT partition, dead groups, retention)
// once or every maintenanceIntervalMs, for deployments where producers run
// while no consumer does; and the sequencer of each sequenced topic.
func maintainCmd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := NewFlagSet(ctx, "maintain", "[--once] [--config FILE]",
		"Runs the configured topics' maintenance (segments ahead of the counter, dead groups, retention) and the sequencers of sequenced topics, where producers run while no consumer does.")
	path := fs.String("config", defaultConfigPath, "configuration file: its groups' databases and topics, and maintenanceIntervalMs")
	once := fs.Bool("once", false, "run one pass and exit (for cron) instead of one every maintenanceIntervalMs")
	if err := ParseFlags(fs, args, stdout, stderr); err != nil {
		return err
	}
	if fs.NArg() != 0 {
		return usagef("maintain: unexpected argument %q", fs.Arg(0))
	}
	cfg, err := config.Load(*path)
	if err != nil {
		return err
	}
	// Each topic of the file's groups, on the group's database and in its
	// schema.
	pools, closePools, err := openPools(ctx, cfg, *path)
	if err != nil {
		return err
	}
	defer closePools()
	log := newLogger(cfg, stderr)
	type target struct {
		pool   *pgxpool.Pool
		schema string
		topic  int
		label  string // the database, when the file has several
	}
	several := len(cfg.Databases()) > 1
	var targets []target
	for _, p := range groupPlaces(cfg) {
		tg := target{pools[p.groups[0]], p.schema, p.topic, ""}
		if several {
			tg.label = " (" + p.key + ")"
		}
		targets = append(targets, tg)
	}
	slices.SortStableFunc(targets, func(a, b target) int { return cmp.Compare(a.topic, b.topic) })
	// Sequenced topics: their sequencer runs here too, beside any
	// consumer's (one of them at a time ticks); with --once, the ticks run
	// until nothing committed is left staged.
	sctx, stopSeq := context.WithCancel(ctx)
	seq, sctx := errgroup.WithContext(sctx)
	defer func() {
		stopSeq()
		_ = seq.Wait() // the sequencers log their own failures
	}()
	for _, tg := range targets {
		tctx := schema.WithName(ctx, tg.schema)
		if *once {
			st, err := pgevents.SequenceStaged(tctx, tg.pool, tg.topic, &log)
			if err != nil {
				return err
			}
			switch {
			case st.Busy:
				fmt.Fprintf(stdout, "topic %d%s: sequenced by another process\n", tg.topic, tg.label)
			case st.Sequenced:
				fmt.Fprintf(stdout, "topic %d%s: %d staged events sequenced\n", tg.topic, tg.label, st.Moved)
			}
			continue
		}
		seq.Go(func() error {
			err := pgevents.Sequence(schema.WithName(sctx, tg.schema), tg.pool, tg.topic, "maintain", &log)
			if err != nil && !errors.Is(err, pgevents.ErrNotSequenced) {
				log.Warn().Err(err).Int("topic", tg.topic).Msg("sequencer stopped")
			}
			return nil
		})
	}
	t := time.NewTicker(cfg.MaintenanceInterval())
	defer t.Stop()
	for {
		for _, tg := range targets {
			m, err := pgevents.Maintain(schema.WithName(ctx, tg.schema), tg.pool, tg.topic, &log)
			if err != nil {
				if ctx.Err() != nil {
					return nil
				}
				if *once {
					return err
				}
				log.Warn().Err(err).Int("topic", tg.topic).Str("schema", tg.schema).Msg("maintenance failed")
				continue
			}
			if *once {
				status := "done"
				if !m.Ran {
					status = "skipped: another process is maintaining the topic"
				}
				fmt.Fprintf(stdout, "topic %d%s: %s; %d segments created, %d segments removed, %d groups marked DEAD\n",
					tg.topic, tg.label, status, m.SegmentsCreated, len(m.Retention.Removed), len(m.DeadGroups))
			}
		}
		if *once {
			return nil
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}
