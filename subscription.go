package pgevents

import (
	"context"
	"time"

	"github.com/pgevents/pgevents/internal/backoff"
	"github.com/pgevents/pgevents/internal/store"
)

// subscriptionBeat is how often the subscription's heartbeat runs.
func subscriptionBeat(deadAfter time.Duration) time.Duration {
	return min(deadAfter/4, 5*time.Second)
}

// subscription keeps the group's subscription live: a heartbeat on the
// database clock every DeadAfter/4 (at most every 5 s) brings a DEAD
// subscription back to ACTIVE, follows an operator's pause and resume, stops
// the consumer when the subscription is cancelled, and reports events that
// retention removed before the group handled them. Between heartbeats, a
// recheck (an operator's command, notified at its commit) reads the
// state at once.
func (c *Consumer) subscription(ctx context.Context) error {
	period := subscriptionBeat(c.cfg.DeadAfter)
	t := time.NewTicker(period)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-c.rechecks:
			// The halted workers read their records, and the state is
			// read here (the heartbeat reads it too, when this fails).
			c.haltChecks.fire()
			state, err := store.SubscriptionState(ctx, control{c}, c.cfg.GroupID, c.cfg.TopicID)
			if err == nil && state == store.StateCancelled {
				c.log.Error().Msg("the group's subscription was cancelled: stopping")
				return ErrSubscriptionCancelled
			}
			if err == nil {
				c.setState(state)
			}
			select { // the next recheck waits: see recheckEvery
			case <-ctx.Done():
				return nil
			case <-time.After(recheckEvery):
			}
			continue
		case <-t.C:
		}
		state, err := store.Heartbeat(ctx, control{c}, c.cfg.GroupID, c.cfg.TopicID)
		if err != nil {
			if ctx.Err() != nil || !backoff.Sleep(ctx, c.beating.Fail(err, "subscription heartbeat failed")) {
				return nil
			}
			t.Reset(period)
			continue
		}
		c.beating.Ok()
		if state == store.StateCancelled {
			c.log.Error().Msg("the group's subscription was cancelled: stopping")
			return ErrSubscriptionCancelled
		}
		c.setState(state)
		c.reportSkips(ctx)
	}
}

// setState follows the subscription's state, as the heartbeat reads it
// or a claim found it: PAUSED stops the workers between batches, ACTIVE
// wakes them again.
func (c *Consumer) setState(state string) {
	paused := state == store.StatePaused
	if c.paused.Swap(paused) == paused {
		return
	}
	if paused {
		c.log.Warn().Msg("the group's subscription is PAUSED: handling nothing until it is resumed")
		return
	}
	c.log.Info().Msg("the group's subscription is ACTIVE again")
	c.eligible()
}

// reportSkips tells, once, about events retention removed before the group
// handled them: nothing is skipped silently.
func (c *Consumer) reportSkips(ctx context.Context) {
	skips, err := store.TakeSkips(ctx, control{c}, c.cfg.GroupID, c.cfg.TopicID)
	if err != nil {
		if ctx.Err() == nil {
			c.beating.Fail(err, "could not read retention skips")
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
