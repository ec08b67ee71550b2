package pgevents

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/rs/zerolog"

	"github.com/pgevents/pgevents/internal/batching"
	"github.com/pgevents/pgevents/internal/offsets"
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
//
// # Failures
//
// A batch that fails is rolled back whole, and decide (failure.go) says
// what the next attempt does, always after a backoff. The failure's unit is
// the partition-local slice of one producer transaction it happened in:
//
//   - transient or deployment: the batch is retried, unchanged; the
//     partition waits, others flow;
//   - permanent (or unknown, MaxAttempts times): the unit is remembered as
//     poisonous and the batch runs again; this time the unit is not handled
//     but dead-lettered (or parked behind a dead letter, or the partition
//     halts before it, committing what precedes it), in the transaction that
//     moves the position past it. The units before and after it are handled
//     as usual. This gives each unit the effect of a savepoint — a failing
//     unit's statements are undone, the others' stand — without a
//     savepoint's cost on the path where nothing fails (two round trips per
//     unit, and the subtransaction cache overflows past 64);
//   - a handler that returns nil on an aborted transaction (it swallowed a
//     SQL error) has failed permanently, with ErrAbortedTransaction: the
//     transaction status is checked after every handler call, so that unit,
//     not the next one, is blamed;
//   - a handler timeout is transient, but after two timeouts of the same
//     unit the batch is narrowed to end before it, then to that unit alone,
//     where MaxAttempts applies;
//   - a batch whose session the server ended (idle in transaction for too
//     long, terminated) is retried with half as many events.
//
// A batch also stops taking units, and commits what it has, once it has
// gone without a statement of its own for half of the time the server
// allows a transaction to sit idle beyond one unit's budget, so that slow
// handlers that only call out never hit idle_in_transaction_session_timeout.
type worker struct {
	c         *Consumer
	lr        *layoutRun
	partition int
	sql       *offsets.PartitionSQL // the partition's statements
	log       zerolog.Logger

	wake    chan struct{}
	highest atomic.Int64 // highest offset known to exist in the partition
	next    atomic.Int64 // the group's position after our last commit

	epoch     atomic.Int64 // the lease's epoch while this replica owns it; 0: not owned
	releasing atomic.Bool  // give the lease up after the current batch
	// hcancel cancels the handlers of the batch in flight; Lost calls it.
	hcancel atomic.Pointer[context.CancelCauseFunc]

	// conn is the connection the worker's statements run on while it owns
	// the partition, when the pool has room for one per partition
	// (layoutRun.pin). Each partition has statements of its own (they
	// name its table), and a connection prepares a statement, and plans
	// it, the first time it runs it: a worker that took any connection of
	// the pool would make every connection prepare and plan every
	// partition's statements (a millisecond or more each, and the plans
	// kept by every server process). nil: the pool.
	conn *pgxpool.Conn

	buf      []Event
	e2e      []time.Duration // reused for BatchStats.EndToEnd
	failures int             // consecutive failed batches, for the backoff
	limit    int             // events per batch: BatchSize, halved while sessions end
	last     batchShape      // what the last batch started, for decide

	// Units that failed, by producer transaction id. Entries go once the
	// position has moved past their unit.
	tries  map[int64]*unitFailure // failures so far (unknown class, timeouts)
	poison map[int64]*unitFailure // units to dead-letter
	park   map[int64]string       // units to park, for this host found parked mid-unit
	narrow int64                  // a unit to handle alone; 0: none
	haltAt *unitFailure           // the unit to halt before; nil: none

	halted     atomic.Bool
	haltRecord bool        // partition_halts has a row for this partition
	deadTimes  []time.Time // recent dead letters, for the circuit breaker
}

// batchShape is what a batch had started when it ended.
type batchShape struct {
	units     int
	events    int
	lastTx    int64 // the unit in progress
	unitFirst int64 // its first offset
	lost      bool  // the batch's connection ended
}

// Sentinels by which a batch's handling stops before a unit.
var (
	errCut  = errors.New("batch cut before a unit")
	errHalt = errors.New("partition halts before this unit")
)

func newWorker(c *Consumer, lr *layoutRun, p int) *worker {
	w := &worker{
		c:         c,
		lr:        lr,
		partition: p,
		sql:       offsets.ForPartition(c.cfg.TopicID, p),
		log:       c.log.With().Int("partition", p).Logger(),
		wake:      make(chan struct{}, 1),
		limit:     c.cfg.BatchSize,
		tries:     map[int64]*unitFailure{},
		poison:    map[int64]*unitFailure{},
		park:      map[int64]string{},
	}
	w.highest.Store(-1)
	return w
}

// hint records that the partition holds offset max and wakes the worker if
// that is beyond its position. It never blocks, and reports whether it
// woke the worker. Offsets at or after the layout's cut belong to another
// layout's partition of the same number and are ignored.
func (w *worker) hint(max int64) bool {
	if below := w.lr.cut(w.partition); max >= below {
		max = below - 1
	}
	for {
		cur := w.highest.Load()
		if max <= cur || w.highest.CompareAndSwap(cur, max) {
			break
		}
	}
	if max < w.next.Load() {
		return false
	}
	select {
	case w.wake <- struct{}{}:
		return true
	default:
		return false // already woken
	}
}

// db returns what the worker's statements run on: its pinned connection
// (acquired now if need be, and replaced when it broke or was left in a
// transaction), or the pool when connections are not pinned or none could
// be had.
func (w *worker) db(ctx context.Context) offsets.Batcher {
	if w.conn != nil {
		if pc := w.conn.Conn().PgConn(); !pc.IsClosed() && pc.TxStatus() == 'I' {
			return w.conn
		}
		w.unpin()
	}
	if !w.lr.pin {
		return w.c.pool
	}
	conn, err := w.c.pool.Acquire(ctx)
	if err != nil {
		return w.c.pool
	}
	w.conn = conn
	return conn
}

// unpin gives the worker's connection back to the pool, which closes it
// if it is not idle.
func (w *worker) unpin() {
	if w.conn != nil {
		w.conn.Release()
		w.conn = nil
	}
}

// run handles batches until ctx is cancelled, while the replica owns the
// partition's lease. Batches run on bctx, which outlives ctx by the
// shutdown timeout.
func (w *worker) run(ctx, bctx context.Context) error {
	defer w.unpin()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-w.wake:
		}
		for ctx.Err() == nil {
			if w.releasing.Load() {
				// Asked to give the partition up, between two batches.
				epoch := w.epoch.Swap(0)
				w.releasing.Store(false)
				if err := w.lr.leaser.Released(ctx, w.partition, epoch); err != nil {
					w.log.Warn().Err(err).Msg("could not release the partition's lease; it will expire")
				}
				w.unpin()
				break
			}
			epoch := w.epoch.Load()
			if epoch == 0 {
				w.unpin() // not ours (any more)
				break
			}
			if w.c.paused.Load() {
				break
			}
			if w.highest.Load() < w.next.Load() {
				// Caught up: announce that the worker waits, and look once
				// more (the wake-up protocol) before sleeping.
				w.idle(ctx)
				break
			}
			if w.halted.Load() {
				return w.waitHalted(ctx)
			}
			more, err := w.batch(bctx, epoch)
			if errors.Is(err, offsets.ErrLeaseLost) {
				// Taken over while this replica was slow, frozen or cut
				// off: the batch rolled back, the new owner handles it.
				w.epoch.CompareAndSwap(epoch, 0)
				w.unpin()
				w.log.Warn().Int64("epoch", epoch).Int64("next_offset", w.next.Load()).Msg("partition lease lost; batch rolled back")
				break
			}
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

// idle runs the wake-up protocol before the worker sleeps (see
// offsets.Idle): appends to the partition notify it from now on, and what
// they committed before is found now, or, under scope 'topic', by the
// recheck it asks for once the appends in flight have ended. It hints the
// worker when there is work after all. A failure is logged; the poll is the
// safety net.
func (w *worker) idle(ctx context.Context) {
	if w.c.wakeAlways.Load() {
		return // every append notifies
	}
	max, err := offsets.Idle(ctx, w.db(ctx), w.sql, w.c.cfg.GroupID, w.c.cfg.TopicID, w.partition, w.lr.layout.Version)
	if err != nil {
		if ctx.Err() == nil {
			w.log.Warn().Err(err).Msg("could not announce that the worker waits; events may wait for the poll")
		}
		return
	}
	if max >= 0 {
		if w.hint(max) {
			w.c.cfg.Observer.Woken(w.partition, WakePoll)
		}
		return
	}
	if w.c.topicScope {
		w.c.awaitRecheck(w)
	}
}

// signal wakes the worker without saying there is work, so that it looks
// at its lease. It never blocks.
func (w *worker) signal() {
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

// lost cancels the handlers of the batch in flight: the lease went to
// another replica, so the batch cannot commit, and effects outside
// PostgreSQL should stop under the stale epoch.
func (w *worker) lost() {
	w.epoch.Store(0)
	if cancel := w.hcancel.Load(); cancel != nil {
		(*cancel)(offsets.ErrLeaseLost)
	}
}

// waitHalted keeps a halted partition stopped, repeating why every minute,
// until ctx is cancelled.
func (w *worker) waitHalted(ctx context.Context) error {
	t := time.NewTicker(time.Minute)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
			w.log.Error().Int64("offset", w.haltAt.unitFirst).Int64("failed_offset", w.haltAt.offset).Err(w.haltAt.err).
				Msg("partition HALTED: fix the cause and restart the consumer; nothing from this offset on is handled")
		}
	}
}

// retry applies decide's verdict on a failed batch and waits for the
// backoff before the next attempt.
func (w *worker) retry(ctx context.Context, err error) {
	w.c.retries.Add(1)
	f := batchFailure{err: err, sessionLost: w.last.lost, units: w.last.units}
	var pgErr *pgconn.PgError
	f.idleKilled = errors.As(err, &pgErr) && pgErr.Code == "25P03"
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
	if class == ClassDeployment {
		w.c.deployment.Add(1)
	}
	switch v {
	case shrinkBatch:
		w.limit = max(1, min(w.limit, w.last.events)/2)
	case narrowToUnit:
		w.narrow = ue.txID
		w.log.Warn().Int64("offset", ue.offset).Msg("unit timed out twice, narrowing the batch to it")
	case parkUnit:
		w.park[ue.txID] = ue.parkHost
	case deadLetterUnit, haltBeforeUnit:
		w.permanent(ue, h, class, v)
	}
	w.failures++
	d := backoff(w.c.cfg.RetryInitial, w.c.cfg.RetryMax, w.failures)
	if after := min(retryAfter(err), w.c.cfg.RetryMax); after > d {
		d = after // the failure asked for a longer wait (Retry-After)
	}
	ev := w.log.Warn()
	if class == ClassDeployment {
		ev = w.log.Error()
	}
	ev = ev.Err(err).Stringer("class", class).Stringer("next", v).Int("attempt", w.failures).
		Dur("retry_in", d).Int64("next_offset", w.next.Load())
	if ue != nil {
		ev = ev.Int64("offset", ue.offset)
	}
	if v == shrinkBatch {
		ev = ev.Int("batch_limit", w.limit)
	}
	ev.Msg("batch failed, rolled back")
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
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
		w.log.Error().Int("dead_letters", n).Dur("window", w.c.cfg.DeadLetterWindow).
			Msg("dead-letter circuit breaker tripped")
		return true
	}
	return false
}

// batch runs one batch transaction and reports whether more events are
// known to follow it.
func (w *worker) batch(ctx context.Context, epoch int64) (more bool, err error) {
	cfg := &w.c.cfg
	known := w.highest.Load()
	start := time.Now()
	w.last = batchShape{}
	cl, err := offsets.Claim{Group: cfg.GroupID, Topic: cfg.TopicID, Partition: w.partition,
		Limit: w.limit + 1, Parked: cfg.OnPermanentFailure == PolicyParkHost,
		Owner: w.c.replicaID, Epoch: epoch, Layout: w.lr.layout.Version, SQL: w.sql}.Do(ctx, w.db(ctx), w.buf[:0])
	w.buf = cl.Events
	if err != nil {
		return false, err
	}
	tx := cl.Tx
	ended := false // Commit was called: the connection went back to the pool
	defer func() {
		if err != nil && !ended {
			// A connection that is gone tells that the server ended the
			// session (or the network did): decide shrinks the batch.
			w.last.lost = tx.Conn().IsClosed()
		}
		tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // no-op after Commit
	}()
	evs := cl.Events
	if len(evs) == 0 {
		// The position is past everything known: another process of the
		// group handled it. Remember that instead of claiming again.
		w.c.empty.Add(1)
		w.next.Store(max(w.next.Load(), known+1))
		if !w.lr.final() {
			w.c.pollNow(WakePoll) // finished below the cut? the group may move on
		}
		return false, nil
	}

	st := batchState{w: w, ctx: ctx, tx: handlerTx{Tx: tx, epoch: epoch}, parked: cl.Parked,
		first: evs[0].Offset, e2e: w.e2e[:0], lastSQL: start,
		batch: &Batch{group: cfg.GroupID, topic: cfg.TopicID, partition: w.partition, start: evs[0].Offset}}
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
		evs, err = offsets.Fetch(ctx, tx, w.sql, cfg.TopicID, w.partition, st.last, w.lr.cut(w.partition), cfg.BatchSize+1, w.buf[:0])
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
	if err := offsets.Commit(ctx, tx, cfg.GroupID, cfg.TopicID, w.partition, st.last+1, w.c.replicaID, epoch); err != nil {
		return false, err
	}
	if w.haltRecord {
		if err := offsets.Unhalt(ctx, tx, cfg.GroupID, cfg.TopicID, w.partition); err != nil {
			return false, err
		}
	}
	ended = true
	if err := tx.Commit(ctx); err != nil {
		w.last.lost = sessionEnded(err)
		return false, fmt.Errorf("commit: %w", err)
	}
	committed = true
	w.committed(&st, start)
	if !more && !w.lr.final() {
		w.c.pollNow(WakePoll) // finished below the cut? the group may move on
	}
	return more, nil
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

// halt records that the partition stopped before the unit in haltAt, and
// stops the worker.
func (w *worker) halt(ctx context.Context) error {
	cfg := &w.c.cfg
	if err := offsets.Halt(ctx, w.c.pool, cfg.GroupID, cfg.TopicID, w.partition, w.haltAt.unitFirst, w.haltAt.err.Error()); err != nil {
		return err
	}
	w.haltRecord = true
	w.halted.Store(true)
	w.c.halts.Add(1)
	w.log.Error().Int64("offset", w.haltAt.unitFirst).Int64("failed_offset", w.haltAt.offset).Err(w.haltAt.err).
		Msg("partition HALTED: fix the cause and restart the consumer; nothing from this offset on is handled")
	return nil
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
	// (errHandlerTimeout) or the lease is lost (offsets.ErrLeaseLost).
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
		} else if st.action == actHandle {
			// The unit continues into a new chunk: a host in it may be
			// parked, which is only known now.
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
			return err
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
	}
	st.action, st.unitFirst, st.parkFor, st.fail = actHandle, head.Offset, 0, nil
	w.last.units++
	w.last.lastTx, w.last.unitFirst = tx, head.Offset
	if f := w.poison[tx]; f != nil {
		st.action, st.fail = actDeadLetter, f
	} else if dl, ok := st.parked[w.park[tx]]; ok {
		// Found parked mid-unit by an earlier attempt, and still parked
		// (the dead letter may have been resolved since: then the unit is
		// handled).
		st.action, st.parkFor = actPark, dl
	} else if dl, _, ok := st.parkedHost(unit); ok {
		st.action, st.parkFor = actPark, dl
	}
	if st.action == actHandle {
		st.batch.addUnit(head.Offset, tx)
	}
	return nil
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
		id, _, err := offsets.WriteDeadLetter(ctx, st.tx.Tx, w.sql, offsets.DeadLetter{
			Group: cfg.GroupID, Topic: cfg.TopicID, Partition: w.partition,
			FirstOffset: st.unitFirst, LastOffset: st.last, TransactionID: st.lastTx,
			Error: f.err.Error(), Attempts: max(f.attempts, 1), FirstFailedAt: f.first, LastFailedAt: f.last,
			ParkHosts: park,
		})
		if err != nil {
			return err
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
		if err := offsets.ParkEvents(ctx, st.tx.Tx, w.sql, cfg.GroupID, cfg.TopicID, w.partition, st.unitFirst, st.last, st.parkFor); err != nil {
			return err
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
// letter it is parked behind.
func (st *batchState) parkedHost(evs []Event) (int64, string, bool) {
	if len(st.parked) == 0 {
		return 0, "", false
	}
	for i := range evs {
		if dl, ok := st.parked[evs[i].HostID]; ok {
			return dl, evs[i].HostID, true
		}
	}
	return 0, "", false
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
		if errors.Is(context.Cause(st.hctx), offsets.ErrLeaseLost) {
			return offsets.ErrLeaseLost
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
	if errors.Is(cause, offsets.ErrLeaseLost) {
		return offsets.ErrLeaseLost
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
			err := callGroup(ctx, tx, gh, run)
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
	defer recoverPanic(&err)
	return h.Handle(ctx, tx, ev)
}

// callGroup runs a group handler on a run, turning a panic into a
// PanicError.
func callGroup(ctx context.Context, tx handlerTx, gh GroupHandler, run []Event) (err error) {
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
