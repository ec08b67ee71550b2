package pgevents

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// This file: a replica that cannot get database sessions lets go of its
// partitions (issue 46).
//
// A worker whose batches keep failing because no session can be opened
// for them while other replicas' can (the role's or the server's
// connection limit, SQLSTATE 53300; a pool acquisition that times out)
// cannot serve its
// partition, and while it holds the lease no other replica can. So once
// its batches have failed for a session reason for SessionFailureBound
// without one committing, it releases the partition's lease (one warning
// line) and its replica steps back from the group (lease.Leaser.StepBack):
// its other partitions are released after their batch, it leaves the live
// replicas, so the healthy ones' shares grow to cover its partitions, and
// it rejoins after a back-off (lease.StepBackMin doubling to
// lease.StepBackMax). While any of its workers is failing so, and while its
// pool cannot open a session, the replica acquires nothing
// (Consumer.ready), so it takes only what it can serve.

// SessionFailureBound is how long a partition's batches may fail for a
// session reason (sessionFailure) without one committing before its
// worker releases the lease and the replica steps back. A partition whose
// replica cannot get sessions therefore stalls for about this long, plus
// the takeover by another replica (one heartbeat, LeaseDuration/3). It is
// longer than a connection slot freed by a closing session takes to be
// found again (the pool's next attempt, a few hundred milliseconds) and
// than a server restart's recovery on a small database, so a blip does
// not move partitions; short enough that a replica stuck without sessions
// does not hold work the others could do for long.
const SessionFailureBound = 5 * time.Second

// sessionFailure reports whether err says that a batch could not get a
// database session while others can: too many connections (53300, the
// role's CONNECTION LIMIT or the server's max_connections), or a pool
// acquisition that timed out. A failure every replica meets alike (the
// server starting or shutting down, 57P03 and 57P01, a connection refused
// or broken, 08xxx) is not one: stepping back would only keep this
// replica away once the database is back, when every replica is needed,
// so such batches are retried as before (worker.retry).
func sessionFailure(err error) bool {
	if err == nil {
		return false
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return pgErr.Code == "53300"
	}
	return errors.Is(err, context.DeadlineExceeded) && strings.Contains(err.Error(), "acquire")
}

// sessionFailed records that the worker's batch failed with err, and
// reports whether its batches have failed for a session reason for
// longer than SessionFailureBound, so that it must let the partition go.
// It returns too the deadline by which it must, for the retry's wait.
func (w *worker) sessionFailed(err error) (bool, time.Time) {
	if !sessionFailure(err) {
		w.sessionOk()
		return false, time.Time{}
	}
	since := w.failingSince.Load()
	if since == 0 {
		since = time.Now().UnixNano()
		w.failingSince.Store(since)
	}
	deadline := time.Unix(0, since).Add(SessionFailureBound)
	return !time.Now().Before(deadline), deadline
}

// sessionOk records that the worker's batch committed, or failed for
// another reason than its session.
func (w *worker) sessionOk() { w.failingSince.Store(0) }

// letGo releases the partition's lease because its batches could not get
// a session for SessionFailureBound, and steps the replica back from the
// group.
func (w *worker) letGo(ctx context.Context, err error) {
	since := time.Unix(0, w.failingSince.Load())
	w.sessionOk()
	epoch := w.epoch.Swap(0)
	w.releasing.Store(false)
	w.failSpan(err, Classify(err), "release the partition")
	w.log.Warn().Err(err).Int64("epoch", epoch).Time("failing_since", since).Int64("bound_ms", SessionFailureBound.Milliseconds()).
		Msg("releasing the partition: its batches could not get a database session for longer than the bound; another replica takes it over")
	away := w.lr.leaser.StepBack(fmt.Errorf("partition %d: %w", w.partition, err))
	if err := w.lr.leaser.Released(ctx, w.partition, epoch); err != nil {
		w.log.Warn().Err(err).Int64("away_ms", away.Milliseconds()).Msg("could not release the partition's lease; it expires while the replica steps back")
	}
	w.unpin()
	w.c.watch.poke() // stop watching it
}

// ready is the lease.Leaser's Ready: the replica acquires partitions only
// while none of its workers is failing for want of a session, and while its
// pool is not refused a session for want of a slot (SQLSTATE 53300: an
// idle session, a new one opened, a pool whose sessions are all in use, or
// a connect that is only slow count as ready).
func (c *Consumer) ready(ctx context.Context) error {
	if rt := c.rt.Load(); rt != nil {
		for _, w := range rt.workers {
			if w.epoch.Load() != 0 && w.failingSince.Load() != 0 {
				return fmt.Errorf("pgevents: partition %d cannot get a session", w.partition)
			}
		}
	}
	// Only a pool that has no session yet is probed: one that has some
	// got them from the server, and its workers' failures (above) say when
	// it no longer can. A probe opens a session inside the lease
	// heartbeat's deadline, which a connect on a loaded server can eat (a
	// model soak saw the heartbeat's acquisition time out after it).
	if c.pool.Stat().TotalConns() > 0 {
		return nil
	}
	actx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	conn, err := c.pool.Acquire(actx)
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "53300" {
		// Refused for want of a slot: the replica cannot serve more.
		return fmt.Errorf("pgevents: open a session: %w", err)
	}
	if err == nil {
		conn.Release()
	}
	// A connect that was slow (the heartbeat's deadline, a loaded
	// server) or failed for another reason says nothing of this
	// replica's share: every replica meets it alike, and stepping back
	// would only move partitions (a model soak saw a replica step back
	// for a connect slower than its 400 ms lease, and a partition wait).
	return nil
}

// unserved returns the partitions this replica holds whose batches are
// failing for want of a session, for Stats.
func (c *Consumer) unserved() int {
	rt := c.rt.Load()
	if rt == nil {
		return 0
	}
	n := 0
	for _, p := range rt.leaser.Held() {
		if w := rt.workers[p]; w != nil && w.failingSince.Load() != 0 {
			n++
		}
	}
	return n
}
