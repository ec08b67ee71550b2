package pgevents

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/pgevents/pgevents/offsets"
)

// DeadLetter is a unit that failed permanently, as recorded in
// dead_letter_queue.
type DeadLetter = offsets.DeadLetter

// ErrNoDeadLetter is wrapped by the errors of ReplayDeadLetter and
// DiscardDeadLetter when the dead letter does not exist (any more).
var ErrNoDeadLetter = offsets.ErrNoDeadLetter

// ErrOtherGroup is returned when a dead letter belongs to another group than
// the consumer's: only that group's handlers may replay it.
var ErrOtherGroup = errors.New("dead letter belongs to another consumer group")

// ListDeadLetters returns the dead letters of group, or of every group when
// group is empty, oldest first.
func ListDeadLetters(ctx context.Context, q Querier, group string) ([]DeadLetter, error) {
	return offsets.ListDeadLetters(ctx, q, group)
}

// ReplayDeadLetter runs the consumer's handlers again on dead letter id's
// unit and then on the events parked behind it, in offset order, in one
// transaction that holds the partition's lock (so it cannot race the
// partition's worker, in this process or another), and removes the dead
// letter and the parked events when all succeed. It returns the number of
// events handled. On failure nothing is removed, and the dead letter's
// attempt count, last failure time and error are updated.
func (c *Consumer) ReplayDeadLetter(ctx context.Context, id int64) (int, error) {
	return c.resolveDeadLetter(ctx, id, true)
}

// DiscardDeadLetter removes dead letter id without handling its unit, and
// runs the consumer's handlers on the events parked behind it, in offset
// order, in the same transaction, which holds the partition's lock. It
// returns the number of events handled.
func (c *Consumer) DiscardDeadLetter(ctx context.Context, id int64) (int, error) {
	return c.resolveDeadLetter(ctx, id, false)
}

func (c *Consumer) resolveDeadLetter(ctx context.Context, id int64, replay bool) (int, error) {
	d, err := offsets.GetDeadLetter(ctx, c.pool, id)
	if err != nil {
		return 0, err
	}
	if d.Group != c.cfg.GroupID || d.Topic != c.cfg.TopicID {
		return 0, fmt.Errorf("dead letter %d (group %q, topic %d): %w", id, d.Group, d.Topic, ErrOtherGroup)
	}
	tx, err := c.pool.Begin(ctx)
	if err != nil {
		return 0, fmt.Errorf("dead letter %d: %w", id, err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // no-op after Commit
	// The partition's lock first, as a worker's claim takes it; then read
	// again what the lock now protects.
	if _, err := offsets.LockPosition(ctx, tx, d.Group, d.Topic, d.Partition); err != nil {
		return 0, err
	}
	if d, err = offsets.GetDeadLetter(ctx, tx, id); err != nil {
		return 0, err
	}
	parked, err := offsets.ParkedEvents(ctx, tx, id)
	if err != nil {
		return 0, err
	}
	var evs []Event
	if replay {
		evs = d.Events
	}
	evs = append(evs, parked...)
	handled := 0
	// Unit by unit, in offset order, as the worker would have.
	for len(evs) > 0 {
		n := 1
		for n < len(evs) && evs[n].TransactionID == evs[0].TransactionID {
			n++
		}
		hctx, cancel := context.WithTimeout(ctx, c.cfg.HandlerTimeout*time.Duration((n+c.cfg.BatchSize-1)/c.cfg.BatchSize))
		ev, err := c.dispatch(hctx, handlerTx{Tx: tx}, evs[:n], &handled)
		cancel()
		if err != nil {
			err = fmt.Errorf("dead letter %d: event at offset %d: %w", id, ev.Offset, err)
			_ = tx.Rollback(ctx)
			if rerr := offsets.RecordFailedReplay(ctx, c.pool, id, err.Error()); rerr != nil {
				err = errors.Join(err, rerr)
			}
			return 0, err
		}
		evs = evs[n:]
	}
	if err := offsets.ResolveDeadLetter(ctx, tx, id); err != nil {
		return 0, err
	}
	if err := tx.Commit(ctx); err != nil {
		return 0, fmt.Errorf("dead letter %d: commit: %w", id, err)
	}
	return handled, nil
}
