package pgevents

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"time"

	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/trace"

	"github.com/pgevents/pgevents/batching"
	"github.com/pgevents/pgevents/internal/store"
)

// This file: the handler step of a batch. batchState walks the claimed
// events unit by unit (the partition-local slice of one producer
// transaction): each is handled, dead-lettered or parked, as the worker's
// failure state says, in a savepoint while the worker is guarded; dispatch
// calls the handlers of a unit's events, in order, with panics and
// swallowed SQL errors turned into failures. The batch transaction around
// it is in batch.go.

// unitAction is what a batch does with a unit.
type unitAction int

const (
	actHandle unitAction = iota
	actDeadLetter
	actPark
)

// batchState follows one batch transaction through its events.
type batchState struct {
	w      *worker
	ctx    context.Context // the batch's context; handlers get hctx
	tx     handlerTx
	batch  *Batch           // the attempt as handlers see it (in hctx)
	parked map[string]int64 // parked hosts of the partition (policy parkHost)
	first  int64

	// The handlers' context, cancelled when a unit's budget runs out
	// (errHandlerTimeout) or the lease is lost (store.ErrLeaseLost).
	hctx   context.Context
	cancel context.CancelCauseFunc
	timer  *time.Timer

	started bool
	last    int64     // last offset consumed (handled, dead-lettered or parked)
	lastTx  int64     // its transaction id
	lastSQL time.Time // when the batch's own last statement ended

	// The current unit.
	action    unitAction
	unitFirst int64
	parkFor   int64
	fail      *unitFailure
	// In a guarded attempt (worker.guard): a savepoint is open before the
	// current unit; the unit is in its first chunk; the handled count and
	// end-to-end samples before it, restored when it is rolled back.
	savepoint            bool
	firstChunk           bool
	unitHandled, unitE2E int
	units                int // units opened to be handled in this attempt
	rescued              int // units dead-lettered in the attempt that met their failure

	handled      int
	deadLettered int
	parkedUnits  int
	handlerTime  time.Duration
	e2e          []time.Duration // samples, at most MaxEndToEndSamples
	events       int             // events consumed: handled, dead-lettered or parked
}

// arm gives the handlers a new context, with a stopped timer that cancels
// it; Lost cancels it too.
func (st *batchState) arm() {
	st.hctx, st.cancel = context.WithCancelCause(context.WithValue(st.ctx, batchKey{}, st.batch))
	cancel := st.cancel
	st.timer = time.AfterFunc(time.Hour, func() { cancel(errHandlerTimeout) })
	st.timer.Stop()
	st.w.hcancel.Store(&cancel)
}

// disarm releases the handlers' context at the end of the batch.
func (st *batchState) disarm() {
	st.w.hcancel.Store(nil)
	st.timer.Stop()
	st.cancel(nil)
}

// handle consumes evs, consecutive events of the partition that continue
// the batch, unit by unit.
func (st *batchState) handle(evs []Event) error {
	return batching.EachUnit(keys, evs, func(unit []Event) error {
		head := &unit[0]
		if !st.started || head.TransactionID != st.lastTx {
			if err := st.openUnit(unit); err != nil {
				return err
			}
		} else if st.firstChunk = false; st.action != actPark {
			// The unit continues into a new chunk: a host in it may be
			// parked, which is only known now. A unit to be dead-lettered
			// is parked instead: its dead letter would hold a later event
			// of a host whose earlier events wait parked, and replaying it
			// would handle that event before them.
			if dl, host, ok := st.parkedHost(unit); ok {
				return &unitError{txID: head.TransactionID, unitFirst: st.unitFirst, offset: head.Offset, parkFor: dl, parkHost: host}
			}
		}
		st.started = true
		st.lastTx = head.TransactionID
		st.events += len(unit)
		st.w.last.events = st.events
		if st.action != actHandle {
			st.last = unit[len(unit)-1].Offset
			st.addParked(unit, st.parkFor)
			return nil
		}
		if err := st.run(unit); err != nil {
			rescued, err := st.rescue(unit, err)
			if !rescued {
				return err
			}
			st.last = unit[len(unit)-1].Offset
			st.addParked(unit, st.parkFor)
			return nil
		}
		st.last = unit[len(unit)-1].Offset
		return nil
	})
}

// openUnit closes the previous unit and decides what to do with the one
// that starts with unit, its events in this chunk.
func (st *batchState) openUnit(unit []Event) error {
	if err := st.closeUnit(); err != nil {
		return err
	}
	w := st.w
	head := &unit[0]
	tx := head.TransactionID
	switch {
	case w.haltAt != nil && w.haltAt.txID == tx:
		if st.started {
			return errCut // commit what comes before it first
		}
		return errHalt
	case w.narrow != 0 && st.started && (w.narrow == tx || w.narrow == st.lastTx):
		return errCut // the narrowed unit runs alone
	case st.started && w.c.idleCut > 0 && time.Since(st.lastSQL) > w.c.idleCut:
		// The batch has gone long without a statement: commit before the
		// server's idle_in_transaction_session_timeout ends the session.
		return errCut
	case w.guard && st.units >= guardedUnits:
		return errCut // see guardedUnits
	}
	st.action, st.unitFirst, st.parkFor, st.fail = actHandle, head.Offset, 0, nil
	w.last.units++
	w.last.lastTx, w.last.unitFirst = tx, head.Offset
	// Parking comes first, even for a unit that failed permanently: a unit
	// that touches a parked host waits behind that host's dead letter, so
	// that no dead letter holds a host's event that is later than one of
	// its parked events.
	if dl, ok := st.foundParked(tx); ok {
		// Found parked mid-unit by an earlier attempt, and still parked
		// (the dead letter may have been resolved since: then the unit is
		// handled, or dead-lettered).
		st.action, st.parkFor = actPark, dl
	} else if dl, _, ok := st.parkedHost(unit); ok {
		st.action, st.parkFor = actPark, dl
	} else if f := w.poison[tx]; f != nil {
		st.action, st.fail = actDeadLetter, f
	}
	if st.action == actHandle {
		st.batch.addUnit(head.Offset, tx)
		st.units++
		if w.guard {
			return st.guardUnit()
		}
	}
	return nil
}

// guardedUnits bounds the units of a guarded attempt: each is a
// subtransaction, and past 64 of them a transaction's subtransactions
// overflow the server's per-backend cache, which slows every snapshot
// taken in the database until the transaction ends.
const guardedUnits = 60

// unitSavepointSQL opens the savepoint of a unit in a guarded attempt,
// releasing the previous unit's: one round trip (a statement without
// arguments runs on the simple protocol, which takes several).
const (
	unitSavepointSQL     = `SAVEPOINT pgevents_unit`
	nextUnitSavepointSQL = `RELEASE SAVEPOINT pgevents_unit; SAVEPOINT pgevents_unit`
	rollbackUnitSQL      = `ROLLBACK TO SAVEPOINT pgevents_unit`
)

// guardUnit opens a savepoint before the unit that opens, in a guarded
// attempt, so that its failure can be undone alone (rescue).
func (st *batchState) guardUnit() error {
	sql := unitSavepointSQL
	if st.savepoint {
		sql = nextUnitSavepointSQL
	}
	if _, err := st.tx.Tx.Exec(st.ctx, sql); err != nil {
		return fmt.Errorf("savepoint: %w", err)
	}
	st.savepoint, st.firstChunk = true, true
	st.unitHandled, st.unitE2E = st.handled, len(st.e2e)
	st.lastSQL = time.Now()
	return nil
}

// rescue dead-letters, in the attempt that met it, the unit whose handlers
// failed with err, when the attempt is guarded and the failure is
// permanent: the unit's statements are rolled back to its savepoint, the
// unit becomes a dead letter (written when it closes, as a unit marked in
// an earlier attempt is), and the batch goes on with the next unit. So a
// batch with k failing units commits its good units and k dead letters in
// one attempt, rather than rolling back k times with a growing backoff
// while every host of the partition waits.
//
// It reports false, with the error to fail the batch with, for everything
// else, which the batch's rollback and decide handle as always: transient
// and unknown failures (retried), timeouts, failures in a later chunk of a
// unit (its earlier chunks' hosts are not recorded for parking), failures
// blamed on an earlier unit, PolicyHalt and an open circuit breaker (the
// next attempt commits the units before it and halts).
func (st *batchState) rescue(unit []Event, err error) (bool, error) {
	w := st.w
	var ue *unitError
	if !st.savepoint || !st.firstChunk || !errors.As(err, &ue) || ue.timeout || ue.parkFor != 0 ||
		ue.txID != unit[0].TransactionID || Classify(ue.err) != ClassPermanent ||
		w.c.cfg.OnPermanentFailure == PolicyHalt || w.breakerTripped() {
		return false, err
	}
	if _, rerr := st.tx.Tx.Exec(st.ctx, rollbackUnitSQL); rerr != nil {
		return false, fmt.Errorf("rollback to the unit's savepoint: %w (after %w)", rerr, err)
	}
	st.lastSQL = time.Now()
	h := w.failure(ue)
	v, class := decide(batchFailure{err: err, unit: ue, units: w.last.units}, h, failurePolicy{
		maxAttempts: w.c.cfg.MaxAttempts, onPermanent: w.c.cfg.OnPermanentFailure,
	})
	w.permanent(ue, h, class, v)
	st.handled, st.e2e = st.unitHandled, st.e2e[:st.unitE2E]
	st.action, st.fail = actDeadLetter, h
	st.rescued++
	return true, nil
}

// closeUnit writes the dead letter or the parked events of the unit that
// just ended, if it was not handled.
func (st *batchState) closeUnit() error {
	if !st.started || st.action == actHandle {
		return nil
	}
	w := st.w
	cfg := &w.c.cfg
	ctx := st.ctx
	action := st.action
	st.action = actHandle
	defer func() { st.lastSQL = time.Now() }()
	switch action {
	case actDeadLetter:
		f := st.fail
		park := cfg.OnPermanentFailure == PolicyParkHost
		id, _, err := store.WriteDeadLetter(ctx, st.tx.Tx, w.sql, store.DeadLetter{
			Group: cfg.GroupID, Topic: cfg.TopicID, Partition: w.partition,
			FirstOffset: st.unitFirst, LastOffset: st.last, TransactionID: st.lastTx,
			Error: f.err.Error(), Attempts: max(f.attempts, 1), FirstFailedAt: f.first, LastFailedAt: f.last,
			ParkHosts: park,
		})
		if err != nil {
			return err
		}
		if w.span != nil {
			unitEvent(w.span, "dead-lettered", st.unitFirst, st.last, f.err.Error())
		}
		if park {
			// The rest of this batch parks the unit's hosts too: every
			// host of the unit was recorded by addParked as the unit went
			// by; they now wait behind this dead letter.
			for h, dl := range st.parked {
				if dl == pendingDeadLetter {
					st.parked[h] = id
				}
			}
		}
		st.deadLettered++
	case actPark:
		if err := store.ParkEvents(ctx, st.tx.Tx, w.sql, cfg.GroupID, cfg.TopicID, w.partition, st.unitFirst, st.last, st.parkFor); err != nil {
			return err
		}
		if w.span != nil {
			unitEvent(w.span, "parked", st.unitFirst, st.last, "")
		}
		st.parkedUnits++
	}
	return nil
}

// pendingDeadLetter marks, in batchState.parked, the hosts of a unit whose
// dead letter is not written yet.
const pendingDeadLetter = -1

// addParked records that the hosts of evs, events of a unit that is not
// handled, now wait: behind dead letter dl when the unit is parked, or
// behind the unit's own dead letter once it is written. A host keeps the
// first dead letter it waits behind; later events of these hosts in the
// batch are parked.
func (st *batchState) addParked(evs []Event, dl int64) {
	if st.w.c.cfg.OnPermanentFailure != PolicyParkHost {
		return
	}
	if st.action == actDeadLetter {
		dl = pendingDeadLetter
	}
	if st.parked == nil {
		st.parked = map[string]int64{}
	}
	for i := range evs {
		if _, ok := st.parked[evs[i].HostID]; !ok {
			st.parked[evs[i].HostID] = dl
		}
	}
}

// parkedHost returns the first host of evs that is parked, and the dead
// letter it is parked behind. The hosts of the unit being dead-lettered
// (pendingDeadLetter) are not parked behind anything yet.
func (st *batchState) parkedHost(evs []Event) (int64, string, bool) {
	if len(st.parked) == 0 {
		return 0, "", false
	}
	for i := range evs {
		if dl, ok := st.parked[evs[i].HostID]; ok && dl != pendingDeadLetter {
			return dl, evs[i].HostID, true
		}
	}
	return 0, "", false
}

// foundParked says whether an earlier attempt found unit tx touching a
// parked host mid-unit, and that host is still parked.
func (st *batchState) foundParked(tx int64) (int64, bool) {
	host, ok := st.w.park[tx]
	if !ok {
		return 0, false
	}
	dl, ok := st.parked[host]
	return dl, ok
}

// run handles one unit (or the part of it in this chunk) under its time
// budget: HandlerTimeout per BatchSize events.
func (st *batchState) run(unit []Event) error {
	cfg := &st.w.c.cfg
	st.timer.Reset(cfg.HandlerTimeout * time.Duration(max(1, len(unit)/cfg.BatchSize)))
	began := time.Now()
	ev, err := st.w.c.dispatch(st.hctx, st.tx, unit, &st.handled)
	done := time.Now()
	fired := !st.timer.Stop()
	st.handlerTime += done.Sub(began)
	if err != nil {
		if errors.Is(context.Cause(st.hctx), store.ErrLeaseLost) {
			return store.ErrLeaseLost
		}
		timeout := errors.Is(context.Cause(st.hctx), errHandlerTimeout)
		if ue := st.blame(err, timeout); ue != nil {
			return ue // the effect of an earlier event failed
		}
		return &unitError{txID: ev.TransactionID, unitFirst: st.unitFirst, offset: ev.Offset, err: err, timeout: timeout}
	}
	if fired {
		// The budget ran out just as the unit finished in time: the next
		// unit gets a context of its own.
		st.cancel(nil)
		st.arm()
	}
	now := done.Add(time.Duration(st.w.c.clockSkew.Load())) // on the database clock
	for i := range unit {
		if len(st.e2e) == MaxEndToEndSamples {
			break
		}
		st.e2e = append(st.e2e, now.Sub(unit[i].CreatedAt))
	}
	return nil
}

// flush waits, under a handler time budget for the events handled, for
// the effects that handlers started and that complete outside the
// transaction (see Batch), and returns the failure of the earliest event
// whose effect did not complete, blamed on its unit.
func (st *batchState) flush() error {
	if len(st.batch.flushers) == 0 {
		return nil
	}
	cfg := &st.w.c.cfg
	st.timer.Reset(cfg.HandlerTimeout * time.Duration(max(1, st.handled/cfg.BatchSize)))
	err := st.batch.flush(st.hctx)
	st.timer.Stop()
	st.lastSQL = time.Now()
	if err == nil {
		return nil
	}
	cause := context.Cause(st.hctx)
	if errors.Is(cause, store.ErrLeaseLost) {
		return store.ErrLeaseLost
	}
	if ue := st.blame(err, false); ue != nil {
		return ue
	}
	if cause != nil && !errors.Is(err, cause) {
		err = fmt.Errorf("%w (%w)", err, cause)
	}
	return fmt.Errorf("flush: %w", err)
}

// blame returns the failure of the unit of the event an *EventError in
// err names, or nil when err names no event handled in this batch.
func (st *batchState) blame(err error, timeout bool) *unitError {
	var ee *EventError
	if !errors.As(err, &ee) {
		return nil
	}
	u, ok := st.batch.unitOf(ee.Offset)
	if !ok || ee.Offset > st.last && u.txID != st.lastTx {
		return nil
	}
	return &unitError{txID: u.txID, unitFirst: u.first, offset: ee.Offset, err: ee.Err, timeout: timeout}
}

// dispatch runs the handlers of evs, a unit or the part of one in a chunk,
// in order on tx: the group handler on each run when one is registered,
// otherwise each event's handler. It counts the events handled in *handled
// and returns the event at which it failed, also when ctx ended while a
// handler that ignored it ran, or when a handler returned nil on a
// transaction that an error it swallowed had aborted.
func (c *Consumer) dispatch(ctx context.Context, tx handlerTx, evs []Event, handled *int) (*Event, error) {
	var failed *Event
	if gh := c.cfg.Handlers.groups; gh != nil {
		err := batching.EachRun(keys, evs, func(run []Event) error {
			err := c.callGroup(ctx, tx, gh, run)
			if err == nil {
				err = tx.check(&run[0])
			}
			if err != nil || ctx.Err() != nil {
				failed = &run[0]
				return errOr(err, ctx)
			}
			*handled += len(run)
			return nil
		})
		return failed, err
	}
	for i := range evs {
		ev := &evs[i]
		err := c.call(ctx, tx, ev)
		if err == nil {
			err = tx.check(ev)
		}
		if err != nil || ctx.Err() != nil {
			return ev, errOr(err, ctx)
		}
		*handled++
	}
	return nil, nil
}

// errOr returns err, or the cause of ctx's end when err is nil.
func errOr(err error, ctx context.Context) error {
	if err != nil {
		return err
	}
	return context.Cause(ctx)
}

// call runs the handler of ev, turning a panic into a PanicError.
func (c *Consumer) call(ctx context.Context, tx handlerTx, ev *Event) (err error) {
	h, ok := c.cfg.Handlers.Lookup(ev.EventType)
	if !ok {
		if c.cfg.UnknownEventType == UnknownEventSkip {
			return nil
		}
		return fmt.Errorf("%w %q", ErrUnknownEventType, ev.EventType)
	}
	if c.trace != nil {
		var span trace.Span
		ctx, span = c.trace.startHandler(ctx, ev, nil)
		defer func() { endHandler(span, err) }() // after recoverPanic set err
	}
	defer recoverPanic(&err)
	return h.Handle(ctx, tx, ev)
}

// callGroup runs a group handler on a run, turning a panic into a
// PanicError.
func (c *Consumer) callGroup(ctx context.Context, tx handlerTx, gh GroupHandler, run []Event) (err error) {
	if c.trace != nil {
		var span trace.Span
		ctx, span = c.trace.startHandler(ctx, &run[0], run)
		defer func() { endHandler(span, err) }()
	}
	defer recoverPanic(&err)
	return gh.HandleGroup(ctx, tx, run)
}

func recoverPanic(err *error) {
	if r := recover(); r != nil {
		*err = &PanicError{Value: r, Stack: debug.Stack()}
	}
}

// handlerTx is used as pgx.Tx.
var _ pgx.Tx = handlerTx{}
