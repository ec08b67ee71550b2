package pgevents

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/pgevents/pgevents/internal/backoff"
	"github.com/pgevents/pgevents/internal/lease"
	"github.com/pgevents/pgevents/internal/store"
	"github.com/pgevents/pgevents/partition"
)

// layoutRun is a consumer's work on one layout of the topic: a worker per
// partition of the layout and the leaser that decides which of them this
// replica runs. The group moves to the next layout (after a repartition)
// once every partition of this one has handled every event below the cut;
// the run then ends and the consumer starts one for the next layout.
type layoutRun struct {
	c      *Consumer
	layout store.Layout
	// cuts holds each partition's cut: its events at or after it belong to
	// the next layout (store.NoLimit when none follows).
	cuts    atomic.Pointer[[]int64]
	workers map[int]*worker
	order   []int
	// pin says that each worker keeps a connection of its own while it
	// owns its partition (worker.conn): the pool has room for one per
	// partition and the consumer's other tasks (PoolSize).
	pin    bool
	leaser *lease.Leaser
	cancel context.CancelFunc
}

// consume runs the group's layouts one after the other until ctx is
// cancelled. Batches run on bctx.
func (c *Consumer) consume(ctx, bctx context.Context) error {
	for ctx.Err() == nil {
		l, err := store.GroupLayout(ctx, c.pool, c.cfg.GroupID, c.cfg.TopicID)
		if err == nil {
			err = c.runLayout(ctx, bctx, l)
		}
		if err == nil {
			continue
		}
		if ctx.Err() != nil {
			return nil
		}
		if inUse := (*GroupInUseError)(nil); errors.As(err, &inUse) {
			c.log.Error().Err(err).Msg("the group's name was taken by another kind of consumer while this replica was not live: stopping")
			return err
		}
		backoff.Sleep(ctx, c.layouts.Fail(err, "could not start consuming the group's layout"))
	}
	return nil
}

// runLayout consumes layout l until ctx is cancelled or the group moves
// past l.
func (c *Consumer) runLayout(ctx, bctx context.Context, l store.Layout) error {
	cfg := &c.cfg
	parts, _ := partition.Assign(l.Partitions, nil)
	if err := store.Init(ctx, c.pool, cfg.GroupID, cfg.TopicID, parts); err != nil {
		return err
	}
	lr := &layoutRun{c: c, layout: l, workers: make(map[int]*worker, len(parts)), order: parts,
		pin: int(c.pool.Config().MaxConns) >= PoolSize(len(parts))}
	lr.cuts.Store(&l.Below)
	for _, p := range parts {
		w := newWorker(c, lr, p)
		next, _, err := store.Position(ctx, c.pool, cfg.GroupID, cfg.TopicID, p)
		if err != nil {
			return err
		}
		w.next.Store(next)
		lr.workers[p] = w
	}
	halts, err := store.Halts(ctx, c.pool, cfg.GroupID, cfg.TopicID)
	if err != nil {
		return err
	}
	for _, h := range halts {
		if w := lr.workers[h.Partition]; w != nil {
			// Halted by an earlier run: try again, and clear the record in
			// the batch that gets past it.
			w.haltRecord = true
			w.log.Warn().Int64("offset", h.Offset).Str("reason", h.Reason).Msg("partition was halted; retrying it")
		}
	}
	var static []int
	if c.static != nil {
		static = []int{} // static mode, possibly with nothing in this layout
		for _, p := range c.static {
			if p < l.Partitions {
				static = append(static, p)
			}
		}
	}
	lr.leaser, err = lease.NewLeaser(lease.LeaserConfig{
		DB: control{c}, Group: cfg.GroupID, Topic: cfg.TopicID, Partitions: l.Partitions, Layout: l.Version,
		Static: static, ReplicaID: c.replicaID, Lease: cfg.LeaseDuration,
		Owner: lr, Logger: &c.log, Ready: c.ready,
	})
	if err != nil {
		return fmt.Errorf("pgevents: %w", err)
	}

	lctx, cancel := context.WithCancel(ctx)
	defer cancel()
	lr.cancel = cancel
	ev := c.log.Info().Int("layout", l.Version).Int("partitions", l.Partitions).Int64("from_offset", l.From)
	if !l.Final() {
		ev = ev.Ints64("cuts", l.Below)
	}
	ev.Msg("consuming layout")
	c.layouts.Ok()
	c.rt.Store(lr)
	g, gctx := errgroup.WithContext(lctx)
	g.Go(func() error { return lr.leaser.Run(gctx) })
	for _, p := range parts {
		w := lr.workers[p]
		g.Go(func() error { return w.run(gctx, bctx) })
	}
	err = g.Wait()
	c.rt.CompareAndSwap(lr, nil)
	// Every worker is done: hand the partitions over at once instead of
	// letting the leases expire.
	rctx, rcancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	if rerr := lr.leaser.ReleaseAll(rctx); rerr != nil {
		c.log.Warn().Err(rerr).Msg("could not release the partition leases; they will expire")
	}
	rcancel()
	return err
}

// checkLayout compares the group's layout in the database with the one
// being consumed. It ends the run when another replica moved the group on,
// records the cut when a repartition added one, and moves the group on
// when every partition is finished below the cut. It reports whether the
// run goes on.
func (c *Consumer) checkLayout(ctx context.Context, lr *layoutRun) bool {
	cfg := &c.cfg
	l, err := store.GroupLayout(ctx, control{c}, cfg.GroupID, cfg.TopicID)
	if err != nil {
		if ctx.Err() == nil {
			c.polling.Fail(err, "could not read the group's layout")
		}
		return true
	}
	if l.Version != lr.layout.Version {
		lr.cancel()
		return false
	}
	lr.cuts.Store(&l.Below)
	if l.Final() {
		return true
	}
	done, err := store.LayoutDone(ctx, control{c}, cfg.GroupID, cfg.TopicID, l.Version)
	if err != nil || !done {
		return true
	}
	next, ok, err := store.NextLayout(ctx, control{c}, cfg.TopicID, l.Version)
	if err != nil || !ok {
		return true
	}
	switched, err := store.SwitchLayout(ctx, c.pool, cfg.GroupID, cfg.TopicID, l, next)
	if err != nil {
		c.polling.Fail(err, "could not move the group to the next layout")
		return true
	}
	if !switched {
		return true
	}
	c.log.Info().Int("from_layout", l.Version).Int("to_layout", next.Version).Int("partitions", next.Partitions).
		Ints64("cuts", l.Below).Msg("group finished its layout up to the cut; moving to the next one")
	lr.cancel()
	return false
}

// cut returns partition p's cut in the layout being consumed.
func (lr *layoutRun) cut(p int) int64 {
	if cuts := lr.cuts.Load(); cuts != nil && p < len(*cuts) {
		return (*cuts)[p]
	}
	return store.NoLimit
}

// final reports whether no layout follows the one being consumed, as far
// as the run knows.
func (lr *layoutRun) final() bool {
	cuts := lr.cuts.Load()
	return cuts == nil || store.Layout{Below: *cuts}.Final()
}

// Acquired implements lease.Owner.
func (lr *layoutRun) Acquired(p int, epoch int64) {
	if w := lr.workers[p]; w != nil {
		w.releasing.Store(false)
		w.next.Store(0) // another replica moved the position: ask the database
		w.epoch.Store(epoch)
		lr.c.eligible(p) // read its tail from now on
		w.signal()
	}
}

// Lost implements lease.Owner.
func (lr *layoutRun) Lost(p int) {
	if w := lr.workers[p]; w != nil {
		w.lost()
		lr.c.watch.poke() // stop watching it
	}
}

// Release implements lease.Owner.
func (lr *layoutRun) Release(p int) {
	if w := lr.workers[p]; w != nil {
		w.releasing.Store(true)
		w.signal()
	}
}
