package pgevents

import (
	"context"
	"errors"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/rs/zerolog"
	"go.opentelemetry.io/otel/trace"

	"github.com/pgevents/pgevents/batching"
	"github.com/pgevents/pgevents/internal/store"
)

// pinIdle is how long a worker keeps its pinned connection (worker.conn)
// while it has no batch to run. A partition of steady traffic keeps its
// session, and its statements prepared and planned; one quiet for pinIdle
// closes it, so that an idle process holds its listener's session (which
// also runs its upkeep: control) and its watcher's, not one per
// partition. The next batch connects again and prepares its statements
// again, in a server process whose caches are cold: its event waits about
// 10 ms more than a warm one (measured here: 10.5–13.7 ms against
// 0.56–1.04 ms from COMMIT to handler), once per quiet spell of pinIdle or
// more. Shorter would pay that within ordinary lulls; longer would keep
// idle sessions for longer.
const pinIdle = 20 * time.Second

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
//   - transient or deployment: the batch is retried; the partition waits,
//     others flow. When the failure is a handler's (a unit's statement or
//     call) and units preceded the failing one, the batch is narrowed: the
//     next attempt, at once, commits the units before it and stops there,
//     and the unit runs alone after the backoff, so a statement that fails
//     now and then holds up only its own unit and those behind it. A
//     failure of the batch's own statements (claim, commit) or session
//     blames no unit and retries the batch as it is;
//   - permanent (or unknown, MaxAttempts times): the unit is remembered as
//     poisonous and the batch runs again; this time the unit is not handled
//     but dead-lettered (or parked behind a dead letter, or the partition
//     halts before it, committing what precedes it), in the transaction that
//     moves the position past it. The units before and after it are handled
//     as usual. This gives each unit the effect of a savepoint — a failing
//     unit's statements are undone, the others' stand — without a
//     savepoint's cost on the path where nothing fails (two round trips per
//     unit, and the subtransaction cache overflows past 64). From then on
//     the worker's attempts are guarded, until a batch commits without a
//     permanent failure: each unit runs in a savepoint of its own, and a
//     unit that fails permanently is rolled back to it and dead-lettered in
//     the attempt that met it (batchState.rescue), so a burst of k failing
//     units costs one rolled-back attempt, not k, each after a longer
//     backoff, while every host of the partition waits;
//   - a handler that returns nil on an aborted transaction (it swallowed a
//     SQL error) has failed permanently, with ErrAbortedTransaction: the
//     transaction status is checked after every handler call, so that unit,
//     not the next one, is blamed;
//   - a handler timeout, whoever enforces it (HandlerTimeout, or the
//     server's statement_timeout or lock_timeout on one of the unit's
//     statements), narrows the batch to its unit as above; each timeout of
//     the unit alone counts an attempt, and after MaxAttempts the unit
//     takes the group's failure policy (dead-letter, park or halt);
//   - a batch whose session the server ended (idle in transaction for too
//     long, terminated) is retried with half as many events.
//
// A batch also stops taking units, and commits what it has, once it has
// gone without a statement of its own for half of the time the server
// allows a transaction to sit idle beyond one unit's budget, so that slow
// handlers that only call out never hit idle_in_transaction_session_timeout.
type worker struct {
	// span is the span of the batch in flight, or of the last one, failed,
	// until retry ends it; nil when the consumer does not trace.
	span      trace.Span
	c         *Consumer
	lr        *layoutRun
	partition int
	sql       *store.PartitionSQL // the partition's statements
	log       zerolog.Logger

	wake    chan struct{}
	highest atomic.Int64 // highest offset known to exist in the partition
	next    atomic.Int64 // the group's position after our last commit
	// inFlight says that an append to the partition was in flight when the
	// watcher last looked, and the worker had nothing to do: its next
	// claim waits for that append's commit first (store.Claim.AwaitAppend).
	inFlight atomic.Bool

	epoch atomic.Int64 // the lease's epoch while this replica owns it; 0: not owned
	// failingSince is when the worker's batches started failing for a
	// session reason without one committing since (UnixNano); 0: they
	// are not (session.go).
	failingSince atomic.Int64
	releasing    atomic.Bool // give the lease up after the current batch
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
	failing  failingState    // the failed batches since the last commit, for Consumer.Failing
	limit    int             // events per batch: BatchSize, halved while sessions end
	last     batchShape      // what the last batch started, for decide

	// Units that failed, by producer transaction id. Entries go once the
	// position has moved past their unit.
	tries  map[int64]*unitFailure // failures so far (unknown class, timeouts)
	poison map[int64]*unitFailure // units to dead-letter
	park   map[int64]string       // units to park, for this host found parked mid-unit
	narrow int64                  // a unit to handle alone; 0: none
	haltAt *unitFailure           // the unit to halt before; nil: none

	// guard makes the batch's attempts handle each unit in a savepoint
	// (batchState.rescue), from a permanent failure until a batch commits
	// without one: a failing unit is then dead-lettered in the attempt
	// that meets it, and a burst of failing units costs one rollback, not
	// one per unit. Without a failure no savepoint is taken (two round
	// trips per unit, and a subtransaction each).
	guard bool

	slowLogged time.Time // when slowProducer last logged

	halted     atomic.Bool
	haltRecord bool        // partition_halts has a row for this partition
	deadTimes  []time.Time // recent dead letters, for the circuit breaker
}

// batchShape is what a batch had started when it ended.
type batchShape struct {
	first     int64 // the batch's first offset
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
		sql:       store.ForPartition(c.cfg.TopicID, p),
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

// batchConn returns the connection a batch runs on, and whether it is the
// worker's own (pinned: kept while it owns the partition, replaced when it
// broke or was left in a transaction) rather than acquired for this batch,
// which the caller releases when the batch ends. A batch ends its
// transaction itself (store.CommitBatch, or a rollback), so it needs a
// connection of its own, not the pool's transaction wrapper.
func (w *worker) batchConn(ctx context.Context) (*pgxpool.Conn, bool, error) {
	if w.conn != nil {
		if pc := w.conn.Conn().PgConn(); !pc.IsClosed() && pc.TxStatus() == 'I' {
			return w.conn, true, nil
		}
		w.unpin()
	}
	conn, err := w.c.pool.Acquire(ctx)
	if err != nil {
		return nil, false, err
	}
	// Once per session: the claim's generic plan (store.ReadySession).
	if err := store.ReadySession(ctx, conn.Conn()); err != nil {
		conn.Release()
		return nil, false, err
	}
	if !w.lr.pin {
		return conn, false, nil
	}
	w.conn = conn
	return conn, true, nil
}

// closePinned closes the worker's connection, quiet for pinIdle: the pool
// would keep it for MaxConnIdleTime more.
func (w *worker) closePinned() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_ = w.conn.Conn().Close(ctx)
	w.unpin()
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
	idle := time.NewTimer(pinIdle)
	defer idle.Stop()
	for {
		var quiet <-chan time.Time // fires when the pinned session has been idle for pinIdle
		if w.conn != nil {
			idle.Reset(pinIdle)
			quiet = idle.C
		}
		select {
		case <-ctx.Done():
			return nil
		case <-w.wake:
		case <-quiet:
			w.closePinned()
			continue
		}
		for ctx.Err() == nil {
			if w.releasing.Load() {
				// Asked to give the partition up, between two batches.
				epoch := w.epoch.Swap(0)
				w.releasing.Store(false)
				w.sessionOk()
				if err := w.lr.leaser.Released(ctx, w.partition, epoch); err != nil {
					w.log.Warn().Err(err).Msg("could not release the partition's lease; the next heartbeat finds it")
				}
				w.unpin()
				w.c.watch.poke() // stop watching it
				break
			}
			epoch := w.epoch.Load()
			if epoch == 0 {
				w.sessionOk()
				w.unpin() // not ours (any more)
				break
			}
			if w.c.paused.Load() {
				break
			}
			if w.highest.Load() < w.next.Load() {
				// Caught up: sleep until a hint (the watcher, a
				// notification, a poll) says there is more.
				break
			}
			if w.halted.Load() {
				if err := w.waitHalted(ctx); err != nil || ctx.Err() != nil {
					return err
				}
				continue // unhalted
			}
			more, err := w.batch(bctx, epoch)
			if errors.Is(err, store.ErrPaused) {
				// An operator paused the group: its claim saw it, after
				// the pause waited for the batches in flight.
				w.c.setState(store.StatePaused)
				break
			}
			if errors.Is(err, store.ErrLeaseLost) {
				// Taken over while this replica was slow, frozen or cut
				// off: the batch rolled back, the new owner handles it.
				w.epoch.CompareAndSwap(epoch, 0)
				w.unpin()
				w.failSpan(err, ClassTransient, "lease lost")
				w.log.Warn().Int64("epoch", epoch).Int64("next_offset", w.next.Load()).Msg("partition lease lost; batch rolled back")
				break
			}
			if err != nil {
				if ctx.Err() != nil {
					w.failSpan(err, Classify(err), "shutdown")
					return nil
				}
				bound, deadline := w.sessionFailed(err)
				if bound {
					w.letGo(ctx, err)
					break
				}
				if deadline.IsZero() {
					w.retry(ctx, err)
					continue
				}
				// Cut the backoff at the bound, so that the lease goes
				// within it, not after the next retry's wait.
				rctx, cancel := context.WithDeadline(ctx, deadline)
				w.retry(rctx, err)
				cancel()
				if ctx.Err() == nil && !time.Now().Before(deadline) {
					w.letGo(ctx, err)
					break
				}
				continue
			}
			w.sessionOk()
			w.failures = 0
			if more {
				w.hint(w.next.Load())
			}
		}
	}
}

// awaitAppend tells the worker, caught up, that an append to its
// partition is in flight: it claims at once, waiting in the claim's round
// trip for that append to commit, and handles its events as they become
// visible. It never blocks, and reports whether it woke the worker.
func (w *worker) awaitAppend() bool {
	next := w.next.Load()
	if w.highest.Load() >= next {
		return false // busy, or woken already
	}
	w.inFlight.Store(true)
	return w.hint(next)
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
		(*cancel)(store.ErrLeaseLost)
	}
}

// failSpan ends the span of the batch that failed with err, if the
// consumer traces, saying what comes next.
func (w *worker) failSpan(err error, class Class, next string) {
	if w.span != nil {
		failBatch(w.span, err, class, next)
		w.span = nil
	}
}
