package pgevents

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgevents/pgevents/internal/backoff"
	"github.com/pgevents/pgevents/internal/store"
)

// This file: a worker's failure state. decide (failure.go) says what a
// failed batch's next attempt does; the worker records it here (units to
// dead-letter, park, narrow to, or halt before), counts dead letters for
// the circuit breaker, and waits for the backoff.

// retry applies decide's verdict on a failed batch and waits for the
// backoff before the next attempt.
func (w *worker) retry(ctx context.Context, err error) {
	w.c.retries.Add(1)
	f := batchFailure{err: err, sessionLost: w.last.lost, units: w.last.units}
	var pgErr *pgconn.PgError
	f.idleKilled = errors.As(err, &pgErr) && pgErr.Code == pgerrIdleInTransaction
	var ue *unitError
	if errors.As(err, &ue) {
		f.unit = ue
	} else if f.idleKilled && w.last.units == 1 {
		// The unit alone took longer than the server lets a transaction
		// sit idle: blame it.
		ue = &unitError{txID: w.last.lastTx, unitFirst: w.last.unitFirst, offset: w.last.unitFirst, err: errSessionLost}
	}
	var h *unitFailure
	if ue != nil {
		f.narrowed = w.narrow == ue.txID
		f.unitsBefore = ue.unitFirst > w.last.first
		h = w.failure(ue)
		if f.idleKilled && !errors.Is(h.err, errSessionLost) {
			h.err = fmt.Errorf("%w: the unit's handlers ran without a statement for longer than the server's idle_in_transaction_session_timeout: %v",
				errSessionLost, ue.err)
		}
	}
	v, class := decide(f, h, failurePolicy{
		maxAttempts: w.c.cfg.MaxAttempts, onPermanent: w.c.cfg.OnPermanentFailure,
		breakerOpen: w.breakerTripped(),
	})
	w.c.cfg.Observer.BatchFailed(w.partition, class)
	w.failSpan(err, class, v.String())
	if class == ClassDeployment {
		w.c.deployment.Add(1)
	}
	switch v {
	case shrinkBatch:
		w.limit = max(1, min(w.limit, w.last.events)/2)
	case narrowToUnit:
		w.narrow = ue.txID
	case parkUnit:
		w.park[ue.txID] = ue.parkHost
	case deadLetterUnit, haltBeforeUnit:
		w.permanent(ue, h, class, v)
		w.guard = true
	}
	w.failures++
	w.failing.record(class, time.Now())
	d := backoff.Delay(w.c.cfg.RetryInitial, w.c.cfg.RetryMax, w.failures)
	if after := min(retryAfter(err), w.c.cfg.RetryMax); after > d {
		d = after // the failure asked for a longer wait (Retry-After)
	}
	if v == narrowToUnit {
		// The units before the failing one passed in this attempt: the
		// next one commits them at once, and stops before that unit,
		// which alone waits for the backoff (its own next failure). The
		// batch ends earlier at each narrowing, so this cannot spin.
		d = 0
	}
	ev := w.log.Warn()
	if class == ClassDeployment {
		ev = w.log.Error()
	}
	if (v == retryBatch || v == narrowToUnit) && (class == ClassTransient || class == ClassDeployment) {
		// The same failure in every partition (an outage, a missing
		// table, a statement that times out under load): one line per
		// interval for the consumer, with the count.
		ok, repeated := w.c.batchLines.Allow(class.String())
		if !ok {
			ev = nil
		} else if repeated > 0 {
			ev = ev.Int("repeated", repeated)
		}
	}
	in := failedIn(ue, f.sessionLost)
	w.reportFailing(err, class, in)
	ev = ev.Err(err).Stringer("class", class).Str("failed_in", in).Stringer("next", v).
		Int("attempt", w.failures).Int64("retry_in_ms", d.Milliseconds())
	if next := w.next.Load(); next > 0 {
		ev = ev.Int64("next_offset", next) // 0: not known since the lease was taken (offsets start at 1)
	}
	if ue != nil {
		ev = ev.Int64("offset", ue.offset).Int64("unit_offset", ue.unitFirst)
		if h != nil && h.attempts > 0 {
			ev = ev.Int("unit_attempts", h.attempts)
		}
	}
	if v == shrinkBatch {
		ev = ev.Int("batch_limit", w.limit)
	}
	ev.Msg("batch failed, rolled back")
	if d == 0 {
		return
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// failedIn names, for the log, the part of a batch its failure came
// from: a handler's (the unit's statements and calls), or the batch's own
// machinery (the claim, a fetch, a dead letter's write, the commit), or
// the batch's session, which ended.
func failedIn(ue *unitError, sessionLost bool) string {
	switch {
	case ue != nil && errors.Is(ue.err, errSessionLost), ue == nil && sessionLost:
		return "session"
	case ue != nil:
		return "handler"
	}
	return "batch"
}

// failure returns the record of the unit's failures, creating it, with the
// unit's latest failure.
func (w *worker) failure(ue *unitError) *unitFailure {
	now := time.Now()
	f := w.tries[ue.txID]
	if f == nil {
		f = &unitFailure{txID: ue.txID, unitFirst: ue.unitFirst, first: now}
		w.tries[ue.txID] = f
	}
	f.last = now
	f.offset = ue.offset
	f.err = ue.err
	if ue.timeout {
		f.err = fmt.Errorf("handler timeout: the unit ran out of its %s budget", w.c.cfg.HandlerTimeout)
	}
	return f
}

// permanent records a unit that will not succeed: the next attempt
// dead-letters it, or halts before it.
func (w *worker) permanent(ue *unitError, f *unitFailure, class Class, v verdict) {
	var pe *PanicError
	if errors.As(ue.err, &pe) {
		w.log.Error().Str("panic", fmt.Sprint(pe.Value)).Bytes("stack", pe.Stack).Int64("offset", ue.offset).Msg("handler panicked")
	}
	ev := w.log.Error().Err(f.err).Stringer("class", class).Int64("unit_offset", f.unitFirst).
		Int64("offset", ue.offset).Int("attempts", f.attempts)
	if v == haltBeforeUnit {
		w.haltAt = f
		ev.Msg("unit failed permanently; the partition halts before it")
		return
	}
	w.poison[ue.txID] = f
	ev.Msg("unit failed permanently, dead-lettering it")
}

// breakerTripped reports whether one more dead letter would exceed
// MaxDeadLetters within DeadLetterWindow.
func (w *worker) breakerTripped() bool {
	max := w.c.cfg.MaxDeadLetters
	if max < 0 {
		return false
	}
	cutoff := time.Now().Add(-w.c.cfg.DeadLetterWindow)
	kept := w.deadTimes[:0]
	for _, t := range w.deadTimes {
		if t.After(cutoff) {
			kept = append(kept, t)
		}
	}
	w.deadTimes = kept
	// Units already marked count too: they are dead-lettered in the next
	// attempt of this batch.
	if n := len(kept) + len(w.poison); n >= max {
		w.log.Error().Int("dead_letters", n).Int64("window_ms", w.c.cfg.DeadLetterWindow.Milliseconds()).
			Msg("dead-letter circuit breaker tripped")
		return true
	}
	return false
}

// halt records that the partition stopped before the unit in haltAt, and
// stops the worker.
func (w *worker) halt(ctx context.Context) error {
	cfg := &w.c.cfg
	if err := store.Halt(ctx, w.c.pool, cfg.GroupID, cfg.TopicID, w.partition, w.haltAt.unitFirst, w.haltAt.err.Error()); err != nil {
		return err
	}
	w.haltRecord = true
	w.halted.Store(true)
	w.c.halts.Add(1)
	w.logHalted()
	return nil
}

// haltCheck is how often a halted worker looks whether an operator
// removed its partition's halt record.
const haltCheck = time.Second

// waitHalted keeps a halted partition stopped, repeating why every minute,
// until ctx is cancelled, or until an operator removes the partition's
// halt record (offsets.Unhalt: `consumer group unhalt`, the console's
// unhalt; or an offsets reset past it), which it reads at once when the
// command's notification arrives (Consumer.recheck), else within
// haltCheck: then the worker
// forgets the unit's failures and returns, to try the unit again as a
// restart would (if it fails permanently again, it halts again).
func (w *worker) waitHalted(ctx context.Context) error {
	t := time.NewTicker(time.Minute)
	defer t.Stop()
	check := time.NewTicker(haltCheck)
	defer check.Stop()
	cfg := &w.c.cfg
	retry := backoff.New(w.log, "halted partition's check").Periodic(haltCheck)
	// An operator's unhalt is notified at its commit (Consumer.recheck):
	// the record is read at once. The channel is taken before each read
	// (the first one at once), so that an unhalt that commits before the
	// read is seen by it, and one after it fires the channel.
	for {
		rechecked := w.c.haltChecks.wait()
		halts, err := store.Halts(ctx, w.c.pool, cfg.GroupID, cfg.TopicID)
		if err == nil {
			retry.Ok()
			if !slices.ContainsFunc(halts, func(h store.HaltRecord) bool { return h.Partition == w.partition }) {
				break
			}
		} else if ctx.Err() == nil && backoff.Sleep(ctx, retry.Fail(err, "could not read the partition's halt record")) {
			check.Reset(haltCheck)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-check.C:
		case <-rechecked:
		case <-t.C:
			w.logHalted()
		}
	}
	w.log.Warn().Int64("offset", w.haltAt.unitFirst).Msg("partition unhalted by an operator: trying the unit again")
	delete(w.tries, w.haltAt.txID)
	w.haltAt, w.haltRecord = nil, false
	w.halted.Store(false)
	w.c.eligible(w.partition)
	return nil
}

// logHalted says that the partition is halted, where, why, and what to do.
func (w *worker) logHalted() {
	cfg := &w.c.cfg
	w.log.Error().Int64("offset", w.haltAt.unitFirst).Int64("failed_offset", w.haltAt.offset).Err(w.haltAt.err).
		Msgf("partition HALTED: fix the cause, then unhalt it (consumer group unhalt %s --partition %d --topic %d, or the console), or restart the consumer; nothing from this offset on is handled",
			cfg.GroupID, w.partition, cfg.TopicID)
}

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
