package pgevents

import (
	"context"
	"time"

	"github.com/pgevents/pgevents/offsets"
	"github.com/pgevents/pgevents/schema"
)

// subscription keeps the group's subscription live: a heartbeat on the
// database clock every DeadAfter/4 (at most every 5 s) brings a DEAD
// subscription back to ACTIVE, follows an operator's pause and resume, stops
// the consumer when the subscription is cancelled, and reports events that
// retention removed before the group handled them.
func (c *Consumer) subscription(ctx context.Context) error {
	t := time.NewTicker(min(c.cfg.DeadAfter/4, 5*time.Second))
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		state, err := offsets.Heartbeat(ctx, c.pool, c.cfg.GroupID, c.cfg.TopicID)
		if err != nil {
			if ctx.Err() == nil {
				c.log.Warn().Err(err).Msg("subscription heartbeat failed")
			}
			continue
		}
		if state == offsets.StateCancelled {
			c.log.Error().Msg("the group's subscription was cancelled: stopping")
			return ErrSubscriptionCancelled
		}
		c.setState(state)
		c.reportSkips(ctx)
	}
}

// setState follows the subscription's state: PAUSED stops the workers
// between batches, ACTIVE wakes them again.
func (c *Consumer) setState(state string) {
	paused := state == offsets.StatePaused
	if c.paused.Swap(paused) == paused {
		return
	}
	if paused {
		c.log.Warn().Msg("the group's subscription is PAUSED: handling nothing until it is resumed")
		return
	}
	c.log.Info().Msg("the group's subscription is ACTIVE again")
	c.pollNow(WakePoll)
}

// reportSkips tells, once, about events retention removed before the group
// handled them: nothing is skipped silently.
func (c *Consumer) reportSkips(ctx context.Context) {
	skips, err := offsets.TakeSkips(ctx, c.pool, c.cfg.GroupID, c.cfg.TopicID)
	if err != nil {
		if ctx.Err() == nil {
			c.log.Warn().Err(err).Msg("could not read retention skips")
		}
		return
	}
	for _, s := range skips {
		c.skipped.Add(s.Skipped)
		c.cfg.Observer.Skipped(s.Partition, s.Skipped, s.Reason)
		c.log.Warn().Int("partition", s.Partition).Int64("skipped", s.Skipped).
			Int64("first_offset", s.FirstOffset).Int64("last_offset", s.LastOffset).Str("reason", s.Reason).
			Msg("retention removed events before this group handled them; they are skipped")
	}
}

// maintain runs the topic's maintenance every MaintenanceInterval.
func (c *Consumer) maintain(ctx context.Context) error {
	t := time.NewTicker(c.cfg.MaintenanceInterval)
	defer t.Stop()
	for {
		c.maintainOnce(ctx)
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// maintainOnce creates the log's next segments, marks the topic's dead
// subscriptions and applies retention, holding an advisory lock so that one
// process at a time does it for a topic; the others skip the pass.
func (c *Consumer) maintainOnce(ctx context.Context) {
	topic := c.cfg.TopicID
	conn, err := c.pool.Acquire(ctx)
	if err != nil {
		return
	}
	defer conn.Release()
	var locked bool
	if err := conn.QueryRow(ctx, `SELECT pg_try_advisory_lock(hashtext('pgevents.maintenance'), $1)`, topic).Scan(&locked); err != nil || !locked {
		return
	}
	defer conn.Exec(context.WithoutCancel(ctx), `SELECT pg_advisory_unlock(hashtext('pgevents.maintenance'), $1)`, topic) //nolint:errcheck
	log := c.log.With().Str("task", "maintenance").Logger()
	if n, err := schema.EnsureSegments(ctx, conn, topic); err != nil {
		log.Warn().Err(err).Msg("could not create the log's next segments; events go to the DEFAULT partition meanwhile")
	} else if n > 0 {
		log.Info().Int("created", n).Msg("created segments of the log ahead of the counter")
	}
	if dead, err := offsets.SweepDead(ctx, conn, topic); err != nil {
		log.Warn().Err(err).Msg("could not sweep dead subscriptions")
	} else {
		for _, g := range dead {
			log.Warn().Str("dead_group", g).Msg("group has no live replica: subscription DEAD, it no longer holds back retention")
		}
	}
	res, err := offsets.ApplyRetention(ctx, conn, topic)
	if err != nil {
		if ctx.Err() == nil {
			log.Warn().Err(err).Msg("retention failed")
		}
		return
	}
	for _, r := range res.Removed {
		ev := log.Info().Str("segment", r.Segment).Int64("from_offset", r.Lo).Int64("below_offset", r.Hi).Str("reason", r.Reason)
		for g, n := range r.Skipped {
			log.Warn().Str("segment", r.Segment).Str("skipped_group", g).Int64("skipped", n).Str("reason", r.Reason).
				Msg("retention removes events a group has not handled")
		}
		ev.Msg("retention removed a segment of the log")
	}
}
