package pgevents

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime/debug"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/rs/zerolog"

	"github.com/pgevents/pgevents/batching"
	"github.com/pgevents/pgevents/offsets"
)

var keys = batching.Keys[Event]{
	TxID: func(e *Event) int64 { return e.TransactionID },
	Host: func(e *Event) string { return e.HostID },
	User: func(e *Event) string { return e.UserID },
}

// worker handles one partition of a group, one batch transaction at a time.
//
// It sleeps until it knows that the partition holds an offset at or beyond
// its position: a notification or a poll raises highest, and the worker runs
// batches while highest >= next. So a notification for events already
// handled wakes nothing, and the claim's lock (which writes WAL even for an
// empty batch) is only taken when there is work.
type worker struct {
	c         *Consumer
	partition int
	log       zerolog.Logger

	wake    chan struct{}
	highest atomic.Int64 // highest offset known to exist in the partition
	next    atomic.Int64 // the group's position after our last commit

	buf      []Event
	failures int                    // consecutive failed batches, for backoff
	poison   map[int64]*unitFailure // by transaction id: units to dead-letter
	unknown  map[int64]*unitFailure // by transaction id: ClassUnknown failures so far
}

// unitFailure is what the worker remembers of a failing unit.
type unitFailure struct {
	err         error
	attempts    int
	first, last time.Time
}

// unitError is a handler failure, with the unit it happened in.
type unitError struct {
	txID   int64
	offset int64
	err    error
}

func (e *unitError) Error() string {
	return fmt.Sprintf("handler failed at offset %d: %v", e.offset, e.err)
}

func (e *unitError) Unwrap() error { return e.err }

func newWorker(c *Consumer, p int) *worker {
	w := &worker{
		c:         c,
		partition: p,
		log:       c.log.With().Int("partition", p).Logger(),
		wake:      make(chan struct{}, 1),
		poison:    map[int64]*unitFailure{},
		unknown:   map[int64]*unitFailure{},
	}
	w.highest.Store(-1)
	return w
}

// hint records that the partition holds offset max and wakes the worker if
// that is beyond its position. It never blocks.
func (w *worker) hint(max int64) {
	for {
		cur := w.highest.Load()
		if max <= cur || w.highest.CompareAndSwap(cur, max) {
			break
		}
	}
	if max >= w.next.Load() {
		w.signal()
	}
}

func (w *worker) signal() {
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

// run handles batches until ctx is cancelled. Batches run on bctx, which
// outlives ctx by the shutdown timeout.
func (w *worker) run(ctx, bctx context.Context) error {
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-w.wake:
		}
		for ctx.Err() == nil && w.highest.Load() >= w.next.Load() {
			more, err := w.batch(bctx)
			if err != nil {
				if ctx.Err() != nil {
					return nil
				}
				w.retry(ctx, err)
				continue
			}
			w.failures = 0
			if more {
				w.hint(w.next.Load())
			}
		}
	}
}

// retry logs a failed batch and waits before the next attempt: exponential
// backoff with jitter for transient failures, none when the failure was a
// unit now marked for dead-lettering.
func (w *worker) retry(ctx context.Context, err error) {
	w.c.retries.Add(1)
	class := w.classify(err)
	var ue *unitError
	if errors.As(err, &ue) && (class == ClassPermanent || class == ClassUnknown) {
		if w.markFailed(ue, class) {
			return // retried at once, without the poisoned unit
		}
	}
	w.failures++
	d := backoff(w.c.cfg.RetryInitial, w.c.cfg.RetryMax, w.failures)
	ev := w.log.Warn()
	if class == ClassDeployment {
		ev = w.log.Error()
	}
	ev.Err(err).Stringer("class", class).Int("attempt", w.failures).Dur("retry_in", d).Msg("batch failed, rolled back")
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// classify is Classify, except that any error on a connection that has
// gone is transient.
func (w *worker) classify(err error) Class {
	var ue *unitError
	if !errors.As(err, &ue) {
		// Claim, fetch, dead-letter or commit failed: nothing the events
		// did. Retrying is the only safe course.
		if c := Classify(err); c == ClassDeployment {
			return c
		}
		return ClassTransient
	}
	return Classify(err)
}

// markFailed records a unit's permanent or unknown failure. It returns true
// when the unit is now to be dead-lettered.
func (w *worker) markFailed(ue *unitError, class Class) bool {
	now := time.Now()
	f := w.unknown[ue.txID]
	if f == nil {
		f = &unitFailure{first: now}
		w.unknown[ue.txID] = f
	}
	f.attempts++
	f.last = now
	f.err = ue.err
	if class == ClassUnknown && f.attempts < w.c.cfg.MaxAttempts {
		return false
	}
	w.poison[ue.txID] = f
	delete(w.unknown, ue.txID)
	var pe *PanicError
	if errors.As(ue.err, &pe) {
		w.log.Error().Str("panic", fmt.Sprint(pe.Value)).Bytes("stack", pe.Stack).Int64("offset", ue.offset).Msg("handler panicked")
	}
	w.log.Error().Err(ue.err).Stringer("class", class).Int64("offset", ue.offset).Int("attempts", f.attempts).
		Msg("unit failed permanently, dead-lettering it")
	return true
}

// backoff returns the wait before attempt n (1-based): initial doubled per
// attempt, capped at max, with jitter in [d/2, d).
func backoff(initial, max time.Duration, n int) time.Duration {
	d := initial
	for i := 1; i < n && d < max; i++ {
		d *= 2
	}
	d = min(d, max)
	return d/2 + rand.N(d/2+1)
}

// batch runs one batch transaction and reports whether more events are
// known to follow it.
func (w *worker) batch(ctx context.Context) (more bool, err error) {
	cfg := &w.c.cfg
	known := w.highest.Load()
	tx, evs, err := offsets.Claim(ctx, w.c.pool, cfg.GroupID, cfg.TopicID, w.partition, cfg.BatchSize+1, w.buf[:0])
	w.buf = evs
	if err != nil {
		return false, err
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // no-op after Commit

	if len(evs) == 0 {
		// The position is past everything known: another process of the
		// group handled it. Remember that instead of claiming again.
		w.next.Store(max(w.next.Load(), known+1))
		return false, nil
	}
	n, extend, more := batching.Cut(keys, evs, cfg.BatchSize)
	st := batchState{w: w, tx: handlerTx{tx}, first: evs[0].Offset}
	if err := st.handle(ctx, evs[:n]); err != nil {
		return false, err
	}
	for extend {
		// The producer transaction of the last event goes on: read it in
		// chunks of BatchSize, handling each before reading the next, so
		// memory stays bounded whatever its size.
		txID := st.lastTx
		evs, err = offsets.Fetch(ctx, tx, cfg.TopicID, w.partition, st.last, cfg.BatchSize+1, w.buf[:0])
		w.buf = evs
		if err != nil {
			return false, err
		}
		n, extend, more = batching.Continue(keys, txID, evs, cfg.BatchSize)
		if err := st.handle(ctx, evs[:n]); err != nil {
			return false, err
		}
	}
	if err := st.closeDeadUnit(ctx); err != nil {
		return false, err
	}
	if err := offsets.Commit(ctx, tx, cfg.GroupID, cfg.TopicID, w.partition, st.last+1); err != nil {
		return false, err
	}
	if err := tx.Commit(ctx); err != nil {
		return false, fmt.Errorf("commit: %w", err)
	}
	w.next.Store(st.last + 1)
	for _, id := range st.deadLettered {
		delete(w.poison, id)
	}
	w.c.handled.Add(int64(st.handled))
	w.c.batches.Add(1)
	w.c.deadLet.Add(int64(len(st.deadLettered)))
	w.log.Debug().Int64("first_offset", st.first).Int64("last_offset", st.last).Int("events", st.handled).
		Int("dead_lettered", len(st.deadLettered)).Msg("batch committed")
	return more, nil
}

// batchState follows one batch transaction through its events.
type batchState struct {
	w     *worker
	tx    handlerTx
	first int64

	last    int64 // last offset seen
	lastTx  int64 // its transaction id
	started bool
	handled int

	dead         *offsets.DeadLetter // unit being skipped for dead-lettering
	deadLettered []int64
}

// handle runs the handlers of evs, consecutive events of the partition,
// skipping (and later dead-lettering) the units marked poisonous.
func (st *batchState) handle(ctx context.Context, evs []Event) error {
	w := st.w
	for i := range evs {
		ev := &evs[i]
		if !st.started || ev.TransactionID != st.lastTx {
			// A unit starts.
			if err := st.closeDeadUnit(ctx); err != nil {
				return err
			}
			if f := w.poison[ev.TransactionID]; f != nil {
				cfg := &w.c.cfg
				st.dead = &offsets.DeadLetter{
					Group: cfg.GroupID, Topic: cfg.TopicID, Partition: w.partition,
					FirstOffset: ev.Offset, LastOffset: ev.Offset, TransactionID: ev.TransactionID,
					Error: f.err.Error(), Attempts: f.attempts, FirstFailedAt: f.first, LastFailedAt: f.last,
				}
			}
		}
		st.started = true
		st.last, st.lastTx = ev.Offset, ev.TransactionID
		if st.dead != nil {
			st.dead.LastOffset = ev.Offset
			continue
		}
		if err := st.call(ctx, ev); err != nil {
			return &unitError{txID: ev.TransactionID, offset: ev.Offset, err: err}
		}
		st.handled++
	}
	return nil
}

// closeDeadUnit writes the dead letter of the unit being skipped, if any.
func (st *batchState) closeDeadUnit(ctx context.Context) error {
	if st.dead == nil {
		return nil
	}
	d := st.dead
	st.dead = nil
	if _, err := offsets.WriteDeadLetter(ctx, st.tx.Tx, *d); err != nil {
		return err
	}
	st.deadLettered = append(st.deadLettered, d.TransactionID)
	return nil
}

// call runs the handler of ev, turning a panic into a PanicError.
func (st *batchState) call(ctx context.Context, ev *Event) (err error) {
	h, ok := st.w.c.cfg.Handlers.Lookup(ev.EventType)
	if !ok {
		if st.w.c.cfg.UnknownEventType == UnknownEventSkip {
			return nil
		}
		return fmt.Errorf("%w %q", ErrUnknownEventType, ev.EventType)
	}
	defer func() {
		if r := recover(); r != nil {
			err = &PanicError{Value: r, Stack: debug.Stack()}
		}
	}()
	return h.Handle(ctx, st.tx, ev)
}

// handlerTx is used as pgx.Tx.
var _ pgx.Tx = handlerTx{}
