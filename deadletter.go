package pgevents

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"time"

	"github.com/pgevents/pgevents/internal/store"
	"github.com/pgevents/pgevents/pgeventstype"
	"github.com/pgevents/pgevents/schema"
)

// DeadLetter is a unit that failed permanently, as recorded in
// dead_letter_queue.
type DeadLetter = pgeventstype.DeadLetter

// ErrNoDeadLetter is wrapped by the errors of ReplayDeadLetter and
// DiscardDeadLetter when the dead letter does not exist (any more).
var ErrNoDeadLetter = store.ErrNoDeadLetter

// ErrOtherGroup is returned when a dead letter belongs to another group than
// the consumer's: only that group's handlers may replay it.
var ErrOtherGroup = errors.New("dead letter belongs to another consumer group")

// ListDeadLetters returns the dead letters of group, or of every group when
// group is empty, oldest first.
func ListDeadLetters(ctx context.Context, q schema.DB, group string) ([]DeadLetter, error) {
	dls, err := store.ListDeadLetters(ctx, q, group)
	return dls, prefixed(err)
}

// GetDeadLetter returns dead letter id with its events; the error wraps
// ErrNoDeadLetter when it does not exist.
func GetDeadLetter(ctx context.Context, q schema.DB, id int64) (DeadLetter, error) {
	d, err := store.GetDeadLetter(ctx, q, id)
	return d, prefixed(err)
}

// ParkedEvents returns the events parked behind dead letter id, in offset
// order: the units of its hosts that came after it, held back until it is
// replayed or discarded.
func ParkedEvents(ctx context.Context, q schema.DB, id int64) ([]Event, error) {
	evs, err := store.ParkedEvents(ctx, q, id)
	return evs, prefixed(err)
}

// ReplayDeadLetter runs the consumer's handlers again on dead letter id's
// unit and then on the parked events it releases, in offset order, in one
// transaction that holds every partition lock of the group (so it cannot
// race a worker, in this process or another, nor a change of layout), and
// removes the dead letter and the released events when all succeed. It
// returns the number of events handled. On failure nothing is removed, and
// the dead letter's attempt count, last failure time and error are
// updated.
//
// A parked event is released only when none of its unit's hosts still
// waits behind another dead letter or behind an earlier parked event: a
// unit that touches hosts parked behind two dead letters stays parked
// until both are resolved, so each host's order holds.
func (c *Consumer) ReplayDeadLetter(ctx context.Context, id int64) (int, error) {
	n, err := c.resolveDeadLetter(ctx, id, true)
	return n, prefixed(err)
}

// DiscardDeadLetter removes dead letter id without handling its unit, and
// runs the consumer's handlers on the parked events it releases, in offset
// order, in the same transaction, which holds every partition lock of the
// group. It returns the number of events handled.
func (c *Consumer) DiscardDeadLetter(ctx context.Context, id int64) (int, error) {
	n, err := c.resolveDeadLetter(ctx, id, false)
	return n, prefixed(err)
}

func (c *Consumer) resolveDeadLetter(ctx context.Context, id int64, replay bool) (int, error) {
	ctx = schema.WithName(ctx, c.cfg.Schema)
	d, err := store.GetDeadLetter(ctx, c.pool, id)
	if err != nil {
		return 0, err
	}
	if d.Group != c.cfg.GroupID || d.Topic != c.cfg.TopicID {
		return 0, fmt.Errorf("dead letter %d (group %q, topic %d): %w", id, d.Group, d.Topic, ErrOtherGroup)
	}
	tx, err := c.pool.BeginTx(ctx, store.ReadCommitted)
	if err != nil {
		return 0, fmt.Errorf("dead letter %d: %w", id, err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // no-op after Commit
	// The locks first, as workers and layout switches take them; then read
	// again what the locks now protect.
	partitions, err := store.LockGroup(ctx, tx, d.Group, d.Topic)
	if err != nil {
		return 0, err
	}
	if d, err = store.GetDeadLetter(ctx, tx, id); err != nil {
		return 0, err
	}
	parked, err := store.GroupParked(ctx, tx, d.Group, d.Topic)
	if err != nil {
		return 0, err
	}
	parking, order, err := store.ParkingDeadLetters(ctx, tx, d.Group, d.Topic)
	if err != nil {
		return 0, err
	}
	release, res := planRelease(id, parking, order, parked)
	res.Partitions = partitions
	var evs []Event
	if replay {
		evs = d.Events
	}
	evs = append(evs, release...)
	handled := 0
	// Unit by unit, in offset order, as the worker would have.
	for len(evs) > 0 {
		n := 1
		for n < len(evs) && evs[n].TransactionID == evs[0].TransactionID {
			n++
		}
		hctx, cancel := context.WithTimeout(ctx, c.cfg.HandlerTimeout*time.Duration(max(1, n/c.cfg.BatchSize)))
		ev, err := c.dispatch(hctx, handlerTx{Tx: tx}, evs[:n], &handled)
		cancel()
		if err != nil {
			err = fmt.Errorf("dead letter %d: event at offset %d: %w", id, ev.Offset, err)
			_ = tx.Rollback(ctx)
			if rerr := store.RecordFailedReplay(ctx, c.pool, id, err.Error()); rerr != nil {
				err = errors.Join(err, rerr)
			}
			return 0, err
		}
		evs = evs[n:]
	}
	if err := store.Resolve(ctx, tx, d.Group, d.Topic, res); err != nil {
		return 0, err
	}
	if err := tx.Commit(ctx); err != nil {
		return 0, fmt.Errorf("dead letter %d: commit: %w", id, err)
	}
	return handled, nil
}

// planRelease decides what resolving dead letter resolved releases. The
// hosts of the other parking dead letters (parking, visited in the order
// of their ids) stay parked behind them; then, in the order they were parked
// (each host's order), a parked
// unit (the parked events of one producer transaction) is released when
// none of its hosts is parked, and otherwise waits behind the dead letter
// of its first parked host, parking all its hosts behind it too: a later
// event of any host of a waiting unit must wait as well. It returns the
// released events, in offset order, and what stays parked.
func planRelease(resolved int64, parking map[int64][]string, order []int64, parked []store.Parked) ([]Event, store.Resolution) {
	res := store.Resolution{DeadLetterID: resolved, Hosts: map[string]int64{}, Waiting: map[int64]int64{}}
	for _, dl := range order {
		if dl == resolved {
			continue
		}
		for _, h := range parking[dl] {
			if _, ok := res.Hosts[h]; !ok {
				res.Hosts[h] = dl
			}
		}
	}
	// A unit is the parked events of one producer transaction in one
	// partition (the partition the events were appended to, which a
	// repartition does not change). Its events are not always adjacent in
	// parked order: workers of other partitions park at the same time.
	type unitKey struct {
		tx        int64
		partition int
	}
	var (
		order2 []unitKey
		units  = map[unitKey][]store.Parked{}
	)
	for _, p := range parked {
		k := unitKey{p.Event.TransactionID, p.Event.PartitionID}
		if _, ok := units[k]; !ok {
			order2 = append(order2, k)
		}
		units[k] = append(units[k], p)
	}
	var release []Event
	for _, k := range order2 {
		unit := units[k]
		sort.SliceStable(unit, func(i, j int) bool { return unit[i].Event.Offset < unit[j].Event.Offset })
		var behind int64
		for _, p := range unit {
			if dl, ok := res.Hosts[p.Event.HostID]; ok {
				behind = dl
				break
			}
		}
		if behind == 0 {
			for _, p := range unit {
				release = append(release, p.Event)
				res.Released = append(res.Released, p.ID)
			}
			continue
		}
		for _, p := range unit {
			if _, ok := res.Hosts[p.Event.HostID]; !ok {
				res.Hosts[p.Event.HostID] = behind
			}
			res.Waiting[p.ID] = behind
		}
	}
	return release, res
}
