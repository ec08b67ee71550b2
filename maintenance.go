package pgevents

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/rs/zerolog"

	"github.com/pgevents/pgevents/internal/backoff"
	"github.com/pgevents/pgevents/internal/store"
	"github.com/pgevents/pgevents/pgeventstype"
	"github.com/pgevents/pgevents/schema"
)

// maintain runs the topic's maintenance every MaintenanceInterval.
func (c *Consumer) maintain(ctx context.Context) error {
	t := time.NewTicker(c.cfg.MaintenanceInterval)
	defer t.Stop()
	for {
		if _, err := maintainAs(ctx, c.pool, c.cfg.TopicID, c.replicaID, &c.topicLog); err != nil {
			if ctx.Err() != nil || !backoff.Sleep(ctx, c.maintaining.Fail(err, "maintenance failed")) {
				return nil
			}
			t.Reset(c.cfg.MaintenanceInterval)
			continue
		}
		c.maintaining.Ok()
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// Maintenance is what one pass of Maintain did.
type Maintenance struct {
	// Ran is false when another process held the topic's maintenance lock:
	// it did the pass.
	Ran bool
	// SegmentsCreated counts the segments of the log created: ahead of the
	// counter, and for offsets that had landed in the DEFAULT partition
	// (their rows were moved into them).
	SegmentsCreated int
	// DeadGroups lists the groups whose subscription became DEAD.
	DeadGroups []string
	// Pruned counts the rows deleted from partition_tails and
	// consumer_positions (all but the newest of each partition, which are
	// what appends and batches read), from idempotency_keys (those past
	// the topic's window) and from the samples (those older than
	// store.SampleKeep).
	Pruned int64
	// Sampled says that the pass wrote the topic's sample of the current
	// period (store.SamplePeriod): the console's charts. False when the
	// period had one, written by another pass of this process or another.
	Sampled bool
	// Retention is what retention found and removed.
	Retention pgeventstype.Retention
}

// SamplePeriod is how often maintenance samples a topic and its groups
// for the console's charts: one sample per topic and period, written by
// whichever process's pass comes first in the period.
const SamplePeriod = store.SamplePeriod

// Maintain runs one pass of a topic's maintenance: it creates the log's
// next segments (and moves rows that landed in the DEFAULT partition into
// theirs), marks the groups without a live replica DEAD, prunes the tails
// and positions that appends and batches left behind, samples the topic
// and its groups for the console's charts (once per store.SamplePeriod,
// whichever process's pass comes first; samples older than
// store.SampleKeep are deleted), and applies retention. It holds the topic's maintenance key (a session advisory
// lock) so that one process at a time does it for a topic; the others
// skip the pass (Ran false), unless the holder is frozen (a process
// stopped or cut off in the middle of a pass, whose session keeps the
// key): then its session is ended, and this pass runs.
//
// Consumers run it every MaintenanceInterval. Where producers run while no
// consumer does, run it too (`consumer maintain`, a cron job or a sidecar):
// without it the counter outruns the segments, events land in the DEFAULT
// partition, and nothing removes them until maintenance runs again.
func Maintain(ctx context.Context, pool *pgxpool.Pool, topic int, logger *zerolog.Logger) (Maintenance, error) {
	m, err := maintainAs(ctx, pool, topic, "maintain", logger)
	return m, prefixed(err)
}

// maintainAs is Maintain by holder, the replica id (or process name) its
// session names while it holds the maintenance key
// (store.RoleMaintenance.ApplicationName).
func maintainAs(ctx context.Context, pool *pgxpool.Pool, topic int, holder string, logger *zerolog.Logger) (Maintenance, error) {
	var out Maintenance
	log := zerolog.Nop()
	if logger != nil {
		log = logger.With().Str("task", "maintenance").Int("topic", topic).Logger()
	}
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return out, fmt.Errorf("pgevents: maintenance: %w", err)
	}
	// The session is named after its holder for the pass, and closed after
	// it, which releases the key: a pass every MaintenanceInterval would
	// otherwise keep a pool session open in every idle process (a
	// connect per pass costs less than a session held for ever).
	var locked bool
	defer func() {
		bctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_ = conn.Conn().Close(bctx)
		conn.Release()
	}()
	if _, err := conn.Exec(ctx, `SELECT set_config('application_name', $1, false)`, store.RoleMaintenance.ApplicationName(holder)); err != nil {
		return out, fmt.Errorf("pgevents: maintenance: %w", err)
	}
	if locked, err = takeRole(ctx, conn, store.RoleMaintenance, topic, &log); err != nil {
		return out, fmt.Errorf("pgevents: maintenance lock: %w", err)
	}
	if !locked {
		return out, nil
	}
	out.Ran = true
	if out.SegmentsCreated, err = schema.EnsureSegments(ctx, conn, topic); err != nil {
		log.Warn().Err(err).Msg("could not create the log's next segments; events go to the DEFAULT partition meanwhile")
	} else if out.SegmentsCreated > 0 {
		log.Info().Int("created", out.SegmentsCreated).Msg("created segments of the log")
	}
	if out.DeadGroups, err = store.SweepDead(ctx, conn, topic); err != nil {
		log.Warn().Err(err).Msg("could not sweep dead subscriptions")
	}
	for _, g := range out.DeadGroups {
		log.Warn().Str("dead_group", g).Msg("group has no live replica: subscription DEAD, it no longer holds back retention")
	}
	if out.Pruned, err = store.PruneHistory(ctx, conn, topic); err != nil {
		log.Warn().Err(err).Msg("could not prune the tails and positions appends and batches left behind")
	}
	if keys, err := store.PruneKeys(ctx, conn, topic); err != nil {
		log.Warn().Err(err).Msg("could not delete the idempotency keys past the topic's window")
	} else {
		out.Pruned += keys
	}
	if s, err := store.Sample(ctx, conn, topic, store.SamplePeriod); err != nil {
		log.Warn().Err(err).Msg("could not sample the topic (the console's charts miss this period)")
	} else {
		out.Sampled = s.Wrote
	}
	if n, err := store.PruneSamples(ctx, conn, topic, store.SampleKeep); err != nil {
		log.Warn().Err(err).Msg("could not delete the samples older than the console's charts")
	} else {
		out.Pruned += n
	}
	if out.Retention, err = store.ApplyRetention(ctx, conn, topic); err != nil {
		return out, fmt.Errorf("pgevents: retention of topic %d: %w", topic, err)
	}
	for _, r := range out.Retention.Removed {
		for g, n := range r.Skipped {
			log.Warn().Str("segment", r.Segment).Str("skipped_group", g).Int64("skipped", n).Str("reason", r.Reason).
				Msg("retention removes events a group has not handled")
		}
		log.Info().Str("segment", r.Segment).Int64("from_offset", r.Lo).Int64("below_offset", r.Hi).Str("reason", r.Reason).
			Msg("retention removed a segment of the log")
	}
	return out, nil
}
