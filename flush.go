package pgevents

import (
	"context"
	"errors"
	"fmt"
	"sort"
)

// This file: effects outside PostgreSQL, flushed before a batch commits.

// Batch is one attempt at a batch transaction, as the handlers that run in
// it see it. It is how a handler whose effect outside PostgreSQL completes
// after the handler returns — a record produced asynchronously to Kafka, a
// request sent concurrently with others — keeps the consumer's guarantees:
//
//  1. Handle starts the effect and registers, once per batch, a [Flusher]
//     with [Batch.Flusher]; it returns at once, so that the effects of a
//     batch's events proceed together instead of one round trip each;
//  2. after the last unit of the batch, before the group's offset commits,
//     the consumer calls every Flusher's Flush, which waits until every
//     effect started in the batch has completed. The offset commits only if
//     all of them succeeded: an effect is never acknowledged by a commit
//     before it happened (at least once);
//  3. a Flush that fails names the earliest event whose effect did not
//     complete, with an [*EventError]; the consumer blames that event's
//     unit exactly as if its handler had returned the error (see
//     [Classify]): the batch rolls back and is retried, or the unit is
//     dead-lettered and the batch runs again without it;
//  4. when the attempt ends, committed or not, the consumer calls End on
//     every Flusher, so that the next attempt never races the last one.
//
// A Flusher keeps per-host order by the way it completes effects: a
// Flusher must never let an effect of a host happen after a later effect
// of the same host has (sink/kafkasink relies on the Kafka producer's
// per-partition order, sink/webhook sends a host's requests one after
// another). The consumer hands a Batch only to handlers it runs from its
// workers; a handler called without one (see [BatchFromContext]) must
// complete its effect before it returns.
type Batch struct {
	group     string
	topic     int
	partition int
	start     int64
	flushers  []keyedFlusher
	units     []unitSpan // the units handled so far, in offset order
}

// keyedFlusher is a Flusher registered under a key.
type keyedFlusher struct {
	key any
	f   Flusher
}

// unitSpan is a unit handled in the batch: its first offset and producer
// transaction.
type unitSpan struct {
	first int64
	txID  int64
}

// Flusher completes the effects a handler started during one attempt at a
// batch. Its methods are called by the consumer's worker goroutine, one at
// a time; the handler that registered it may run other goroutines.
type Flusher interface {
	// Flush waits until every effect started in the batch has completed,
	// or until ctx is done (the handler time budget ran out, the lease was
	// lost, the process stops). It returns nil when all succeeded.
	// Otherwise it returns an *EventError naming the earliest event (in
	// offset order) whose effect did not complete, every effect of an
	// earlier event having completed; or, when it cannot say which event
	// failed (ctx ended), any other error, which retries the batch as a
	// transient failure.
	Flush(ctx context.Context) error
	// End is called once the attempt is over: committed says whether the
	// batch's transaction committed. End stops what is still running, or
	// makes sure that the next attempt waits for it, so that two attempts'
	// effects never overlap.
	End(committed bool)
}

// EventError is the failure of the effect of one event of a batch,
// reported by a [Flusher] (or returned by a handler) after the event's
// handler returned: it names the event by its offset in the batch's
// partition, so that the consumer blames the event's unit and dead-letters
// it with Err as the reason when Err is permanent.
type EventError struct {
	// Offset is the event's c_offset.
	Offset int64
	// Err is why its effect failed; Classify(Err) is the failure's class.
	Err error
}

// Error returns the offset and the reason.
func (e *EventError) Error() string { return fmt.Sprintf("event at offset %d: %v", e.Offset, e.Err) }

// Unwrap returns Err.
func (e *EventError) Unwrap() error { return e.Err }

type batchKey struct{}

// BatchFromContext returns the batch attempt whose handlers run with ctx,
// or nil when ctx is not a handler's context from a consumer's worker (a
// handler called directly, or for a dead-letter replay), in which case
// the handler must complete its effect before it returns.
func BatchFromContext(ctx context.Context) *Batch {
	b, _ := ctx.Value(batchKey{}).(*Batch)
	return b
}

// Group returns the consumer group of the batch.
func (b *Batch) Group() string { return b.group }

// Topic returns the topic of the batch.
func (b *Batch) Topic() int { return b.topic }

// Partition returns the partition of the batch. One worker handles a
// partition's batches one after another, so a handler may keep state per
// (Group, Topic, Partition) across attempts.
func (b *Batch) Partition() int { return b.partition }

// Start returns the offset the batch starts at, the group's position in
// the partition: the same for every attempt at one batch, and past it once
// the batch committed.
func (b *Batch) Start() int64 { return b.start }

// Flusher returns the Flusher registered under key in this attempt,
// calling newFlusher to create and register it the first time. Handlers of
// a batch run one at a time, so Flusher needs no locking; key is usually
// the handler itself.
func (b *Batch) Flusher(key any, newFlusher func() Flusher) Flusher {
	for i := range b.flushers {
		if b.flushers[i].key == key {
			return b.flushers[i].f
		}
	}
	f := newFlusher()
	b.flushers = append(b.flushers, keyedFlusher{key: key, f: f})
	return f
}

// addUnit records that the unit starting at first, of producer transaction
// txID, is handled in the batch.
func (b *Batch) addUnit(first, txID int64) {
	b.units = append(b.units, unitSpan{first: first, txID: txID})
}

// unitOf returns the handled unit that holds offset.
func (b *Batch) unitOf(offset int64) (unitSpan, bool) {
	i := sort.Search(len(b.units), func(i int) bool { return b.units[i].first > offset })
	if i == 0 {
		return unitSpan{}, false
	}
	return b.units[i-1], true
}

// flush calls every Flusher's Flush and returns the failure of the
// earliest event among theirs: an *EventError if one names an event,
// otherwise the first other error.
func (b *Batch) flush(ctx context.Context) error {
	var (
		earliest *EventError
		other    error
	)
	for _, kf := range b.flushers {
		err := kf.f.Flush(ctx)
		if err == nil {
			continue
		}
		var ee *EventError
		if errors.As(err, &ee) {
			if earliest == nil || ee.Offset < earliest.Offset {
				earliest = ee
			}
			continue
		}
		if other == nil {
			other = err
		}
	}
	if earliest != nil {
		return earliest
	}
	return other
}

// end calls every Flusher's End.
func (b *Batch) end(committed bool) {
	for _, kf := range b.flushers {
		kf.f.End(committed)
	}
}
