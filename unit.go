package pgevents

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pgevents/pgevents/batching"
	"github.com/pgevents/pgevents/internal/store"
)

// This file: one batch transaction and its units. A batch claims the
// partition's next events, extends to the end of the last producer
// transaction, and walks them unit by unit (the partition-local slice of
// one producer transaction): each is handled, dead-lettered or parked, as
// the worker's failure state says, before the offset commits.

// batch runs one batch transaction and reports whether more events are
// known to follow it.
func (w *worker) batch(ctx context.Context, epoch int64) (more bool, err error) {
	cfg := &w.c.cfg
	known := w.highest.Load()
	start := time.Now()
	w.last = batchShape{}
	conn, pinned, err := w.batchConn(ctx)
	if err != nil {
		return false, fmt.Errorf("connection: %w", err)
	}
	if !pinned {
		defer conn.Release() // after the transaction ended (deferred below)
	}
	cl, err := store.Claim{Group: cfg.GroupID, Topic: cfg.TopicID, Partition: w.partition,
		Limit: w.limit + 1, Parked: cfg.OnPermanentFailure == PolicyParkHost,
		Owner: w.c.replicaID, Epoch: epoch, Layout: w.lr.layout.Version, SQL: w.sql,
		AwaitAppend: w.inFlight.Swap(false)}.Do(ctx, conn, w.buf[:0])
	w.buf = cl.Events
	if err != nil {
		return false, err
	}
	if cl.InFlight != nil {
		w.slowProducer(*cl.InFlight)
	}
	tx := cl.Tx
	ended := false // CommitBatch committed tx: nothing to roll back
	defer func() {
		if ended {
			return
		}
		if err != nil {
			// A connection that is gone tells that the server ended the
			// session (or the network did): decide shrinks the batch.
			w.last.lost = tx.Conn().IsClosed()
		}
		tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // the error is the batch's
	}()
	evs := cl.Events
	if len(evs) == 0 {
		// Nothing at or after the position: another process of the group
		// handled it, or a hint (a notification's payload, which anyone can
		// send) named an offset the log does not hold. The worker takes its
		// position from the database and forgets the hint it claimed on, so
		// that it claims again only on news of an offset at or after the
		// position (a hint that arrived meanwhile stays). A hint never moves
		// the position: one that named an offset above the log costs this
		// one empty claim, and the events appended later are handled.
		w.c.empty.Add(1)
		w.next.Store(cl.Next)
		w.highest.CompareAndSwap(known, cl.Next-1)
		if !w.lr.final() {
			w.c.pollNow(WakePoll) // finished below the cut? the group may move on
		}
		return false, nil
	}

	if w.c.trace != nil {
		ctx, w.span = w.c.trace.startBatch(ctx, w.partition, evs)
	}
	st := batchState{w: w, ctx: ctx, tx: handlerTx{Tx: tx, epoch: epoch}, parked: cl.Parked,
		first: evs[0].Offset, e2e: w.e2e[:0], lastSQL: start,
		batch: &Batch{group: cfg.GroupID, topic: cfg.TopicID, partition: w.partition, start: evs[0].Offset}}
	if w.span != nil {
		defer func() {
			if err == nil {
				// Committed, or ended before its first unit (a halt, a
				// cut). A failure's span is ended by retry, which decides
				// what comes next.
				endBatch(w.span, &st)
				w.span = nil
			}
		}()
	}
	st.arm()
	defer st.disarm()
	committed := false
	defer func() { st.batch.end(committed) }()

	n, extend, more := batching.Cut(keys, evs, w.limit)
	err = st.handle(evs[:n])
	for err == nil && extend {
		// The producer transaction of the last event goes on: read it in
		// chunks of BatchSize, handling each before reading the next, so
		// memory stays bounded whatever its size. (A transaction never
		// straddles a layout's cut: both take the counter row's lock.)
		txID := st.lastTx
		evs, err = store.Fetch(ctx, tx, w.sql, cfg.TopicID, w.partition, st.last, w.lr.cut(w.partition), cfg.BatchSize+1, w.buf[:0])
		w.buf = evs
		st.lastSQL = time.Now()
		if err != nil {
			return false, err
		}
		n, extend, more = batching.Continue(keys, txID, evs, cfg.BatchSize)
		err = st.handle(evs[:n])
	}
	switch {
	case errors.Is(err, errHalt):
		return false, w.halt(ctx)
	case errors.Is(err, errCut):
		more = true
	case err != nil:
		return false, err
	}
	if err := st.closeUnit(); err != nil {
		return false, err
	}
	if !st.started {
		return more, nil // cut before the first unit: nothing to commit
	}
	// Effects that handlers started and that complete outside the
	// transaction (see Batch) must all have happened before the offset
	// moves past their events.
	if err := st.flush(); err != nil {
		return false, err
	}
	// The position, the halt record and COMMIT in one round trip.
	if err := store.CommitBatch(ctx, tx, cfg.GroupID, cfg.TopicID, w.partition, st.last+1, w.haltRecord); err != nil {
		w.last.lost = sessionEnded(err)
		return false, err
	}
	ended = true
	committed = true
	w.committed(&st, start)
	if !more && !w.lr.final() {
		w.c.pollNow(WakePoll) // finished below the cut? the group may move on
	}
	return more, nil
}

// slowProducerEvery is how often a worker says, at most, that an append
// in flight on its partition kept it waiting.
const slowProducerEvery = time.Minute

// slowProducer logs, at most once per slowProducerEvery, that the claim's
// wait for an append in flight ran out (store.AwaitAppendMax), naming the
// producer's session that holds it: its events, and every later event of
// the partition, wait for its commit.
func (w *worker) slowProducer(holder string) {
	now := time.Now()
	if now.Sub(w.slowLogged) < slowProducerEvery {
		return
	}
	w.slowLogged = now
	w.log.Warn().Str("producer", holder).Int64("waited_ms", store.AwaitAppendMax.Milliseconds()).
		Msg("an append in flight on the partition has not committed: the partition's next events wait for that producer's transaction")
}

// sessionEnded says whether a failed COMMIT's error means that the
// session ended: the server's FATAL errors (25P03 idle in transaction, 57P0x
// terminated, 08 connection) or no answer from the server at all.
func sessionEnded(err error) bool {
	var pgErr *pgconn.PgError
	if !errors.As(err, &pgErr) {
		return true
	}
	return pgErr.Severity == "FATAL" || pgErr.Code == "25P03" || strings.HasPrefix(pgErr.Code, "57P") ||
		strings.HasPrefix(pgErr.Code, "08")
}

// committed updates the worker after a batch committed.
func (w *worker) committed(st *batchState, start time.Time) {
	w.next.Store(st.last + 1)
	w.haltRecord = false
	if st.deadLettered == 0 {
		w.guard = false // a batch went through without a permanent failure
	}
	w.limit = min(w.c.cfg.BatchSize, w.limit*2)
	for id, f := range w.tries {
		if f.unitFirst <= st.last {
			delete(w.tries, id)
			if w.narrow == id {
				w.narrow = 0
			}
		}
	}
	for id, f := range w.poison {
		if f.unitFirst <= st.last {
			delete(w.poison, id)
		}
	}
	for id := range w.park {
		delete(w.park, id) // parked units were all decided by this batch
	}
	now := time.Now()
	for range st.deadLettered {
		w.deadTimes = append(w.deadTimes, now)
	}
	w.c.handled.Add(int64(st.handled))
	w.c.batches.Add(1)
	w.c.deadLet.Add(int64(st.deadLettered))
	w.c.parked.Add(int64(st.parkedUnits))
	w.e2e = st.e2e
	cfg := &w.c.cfg
	cfg.Observer.BatchCommitted(BatchStats{
		Group: cfg.GroupID, Topic: cfg.TopicID, Partition: w.partition,
		FirstOffset: st.first, LastOffset: st.last, Events: st.events,
		Handled: st.handled, DeadLettered: st.deadLettered, ParkedUnits: st.parkedUnits,
		HandlerDuration: st.handlerTime, Duration: time.Since(start), EndToEnd: st.e2e,
	})
	w.log.Debug().Int64("first_offset", st.first).Int64("last_offset", st.last).Int("events", st.events).Int("handled", st.handled).
		Int("dead_lettered", st.deadLettered).Int("parked", st.parkedUnits).Msg("batch committed")
}

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
