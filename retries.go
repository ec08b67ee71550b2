package pgevents

import "github.com/pgevents/pgevents/internal/backoff"

// newRetries creates the failure states of the consumer's loops that retry
// against the database. Each backs off with jitter after a failure and
// logs a repeated failure once per backoff.DefaultInterval (10 s), with the
// count of the repeats, and once more when it succeeds again:
//
//   - the poller (and the layout and wake-up mode checks it runs): no poll,
//     even one asked for, within 50 ms to 5 s of a failed one;
//   - the subscription's heartbeat and the maintenance: from their period
//     up to 5 s (or the period, when longer);
//   - the layout's start: from RetryInitial to RetryMax, as a batch.
//
// The watcher, the lease heartbeat, the listener and a halted partition's
// check keep their own (watcher.go, internal/lease, listener, retry.go).
func (c *Consumer) newRetries() {
	c.polling = backoff.New(c.log, "poller")
	c.beating = backoff.New(c.log, "subscription heartbeat").Periodic(subscriptionBeat(c.cfg.DeadAfter))
	c.maintaining = backoff.New(c.log, "maintenance").Periodic(c.cfg.MaintenanceInterval)
	c.layouts = backoff.New(c.log, "layout")
	c.layouts.Min, c.layouts.Max = c.cfg.RetryInitial, c.cfg.RetryMax
}
