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

// This file: one batch transaction, the data path's claim, handler and
// commit steps in order. worker.batch claims the partition's next events
// (store.Claim: the position lock, the lease's and the pause's checks and
// the events, in one round trip), extends to the end of the last producer
// transaction, hands the events to batchState (handle.go), flushes the
// effects outside PostgreSQL (flush.go), and writes the position with
// COMMIT (store.CommitBatch); committed then updates the worker.

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
		AwaitAppend: w.inFlight.Swap(false), AwaitMax: w.c.awaitMax}.Do(ctx, conn, w.buf[:0])
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
	w.last.first = evs[0].Offset
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
	w.failing.reset()
	w.clearFailing()
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
