package consumercli

import (
	"context"
	"flag"
	"fmt"
	"io"
	"slices"
	"time"

	"github.com/pgevents/pgevents"
)

// maintainCmd runs the configured topics' maintenance (segments ahead of
// the counter, rows out of the DEFAULT partition, dead groups, retention)
// once or every maintenanceIntervalMs, for deployments where producers run
// while no consumer does.
func maintainCmd(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("maintain", flag.ContinueOnError)
	fs.SetOutput(stderr)
	path := fs.String("config", defaultConfigPath, "configuration file: its databaseUrl, topics and maintenanceIntervalMs")
	once := fs.Bool("once", false, "run one pass and exit (for cron) instead of one every maintenanceIntervalMs")
	if err := fs.Parse(args); err != nil {
		return &usageError{err}
	}
	ctx, cfg, pool, err := connect(ctx, *path, nil)
	if err != nil {
		return err
	}
	defer pool.Close()
	log := newLogger(cfg, stderr)
	var topics []int
	for _, g := range cfg.GroupConfigs() {
		if !slices.Contains(topics, g.TopicID) {
			topics = append(topics, g.TopicID)
		}
	}
	slices.Sort(topics)
	t := time.NewTicker(cfg.MaintenanceInterval())
	defer t.Stop()
	for {
		for _, topic := range topics {
			m, err := pgevents.Maintain(ctx, pool, topic, &log)
			if err != nil {
				if ctx.Err() != nil {
					return nil
				}
				if *once {
					return err
				}
				log.Warn().Err(err).Int("topic", topic).Msg("maintenance failed")
				continue
			}
			if *once {
				status := "done"
				if !m.Ran {
					status = "skipped: another process is maintaining the topic"
				}
				fmt.Fprintf(stdout, "topic %d: %s; %d segments created, %d segments removed, %d groups marked DEAD\n",
					topic, status, m.SegmentsCreated, len(m.Retention.Removed), len(m.DeadGroups))
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
