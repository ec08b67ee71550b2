package pgevents

import (
	"context"
	"sync"
	"time"

	"github.com/pgevents/pgevents/internal/store"
	"github.com/pgevents/pgevents/schema"
)

// This file: what a consumer says of its partitions whose batches keep
// failing, for Consumer.Failing, the metrics and the status line a
// worker logs. A worker records each failed batch (retry) and forgets
// them at its next commit (committed).

// FailingPartition describes a partition of this consumer whose batches
// have failed since its last commit.
type FailingPartition struct {
	// Partition is the partition's number.
	Partition int
	// Failures counts the batches that failed since the last commit.
	Failures int
	// Since is when the first of them failed.
	Since time.Time
	// Class is the class of the latest failure.
	Class Class
}

// failingState is a worker's record of its failed batches since its
// last commit. It is written by the worker and read by Consumer.Failing,
// from another goroutine.
type failingState struct {
	mu       sync.Mutex
	failures int
	since    time.Time
	class    Class
	// Written by the worker only: when it last reported the spell to the
	// database (partition_failures), zero when it did not.
	reported time.Time
}

// record counts a failed batch of class.
func (f *failingState) record(class Class, now time.Time) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.failures == 0 {
		f.since = now
	}
	f.failures++
	f.class = class
}

// reset forgets the failures: a batch committed.
func (f *failingState) reset() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.failures, f.since, f.class = 0, time.Time{}, 0
}

// report writes, at most once per store.FailingReportEvery, the
// partition's failing spell to partition_failures, where `consumer
// status` reads it; best effort: the database may be why batches fail.
func (w *worker) reportFailing(err error, class Class, in string) {
	now := time.Now()
	if now.Sub(w.failing.reported) < store.FailingReportEvery {
		return
	}
	f, _ := w.failing.get(w.partition)
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	cfg := &w.c.cfg
	ctx = schema.WithName(ctx, cfg.Schema)
	if rerr := store.ReportFailing(ctx, w.c.pool, store.Failing{Group: cfg.GroupID, Topic: cfg.TopicID, Partition: w.partition,
		Replica: w.c.replicaID, Failures: f.Failures, Since: f.Since.Add(time.Duration(w.c.clockSkew.Load())),
		Class: class.String(), FailedIn: in, Error: err.Error()}); rerr != nil {
		w.log.Debug().Err(rerr).Msg("could not report the partition's failing batches")
		return
	}
	w.failing.reported = now
}

// clearFailing deletes the partition's report of a failing spell after a
// commit, when one was written.
func (w *worker) clearFailing() {
	if w.failing.reported.IsZero() {
		return
	}
	w.failing.reported = time.Time{}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	cfg := &w.c.cfg
	ctx = schema.WithName(ctx, cfg.Schema)
	if err := store.ClearFailing(ctx, w.c.pool, cfg.GroupID, cfg.TopicID, w.partition, w.c.replicaID); err != nil {
		w.log.Debug().Err(err).Msg("could not clear the partition's report of failing batches")
	}
}

// get returns the failures since the last commit, when there are any.
func (f *failingState) get(p int) (FailingPartition, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return FailingPartition{Partition: p, Failures: f.failures, Since: f.since, Class: f.class}, f.failures > 0
}

// Failing returns the partitions this consumer serves whose batches have
// failed since their last commit, in partition order: how many batches,
// since when, and the class of the latest failure. A partition that keeps
// failing holds its events back (a transient failure is retried forever);
// the metrics export it as pgevents_partition_failing_batches and
// pgevents_partition_failing_since_seconds.
func (c *Consumer) Failing() []FailingPartition {
	lr := c.rt.Load()
	if lr == nil {
		return nil
	}
	var out []FailingPartition
	for _, p := range lr.leaser.Held() { // ascending
		if w := lr.workers[p]; w != nil {
			if f, ok := w.failing.get(p); ok {
				out = append(out, f)
			}
		}
	}
	return out
}
