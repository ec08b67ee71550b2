package pgeventstest

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgevents/pgevents"
)

// Recorder is a Handler that records each event it handles once the batch
// that handled it has committed, in the order the batches committed (a
// partition's events in offset order): what the consumer did, as the
// database saw it, for a test to wait for and check. Register it as the
// handler, or around the handler under test with Next.
//
// It records at commit through the consumer's batch hook
// (pgevents.Batch): Handle keeps the event with the batch's attempt, and
// the attempt's end records its events only if the batch's transaction
// committed. So an attempt rolled back (a transient failure, a unit
// dead-lettered and the batch run again without it, a lost lease) records
// nothing, and each event is recorded as often as its effects in the
// database happened: once. An event handled outside a batch (a dead-letter
// replay) is recorded when its handler returns.
//
// The zero Recorder is ready to use, by any number of consumers and
// partitions at once.
type Recorder struct {
	// Next, when set, handles each event first; the Recorder records only
	// the events it handled without error, and returns its error.
	Next pgevents.Handler

	mu      sync.Mutex
	events  []pgevents.Event
	changed chan struct{} // closed at the next record
}

// Handle runs Next, if any, and keeps ev to record when its batch commits.
func (r *Recorder) Handle(ctx context.Context, tx pgx.Tx, ev *pgevents.Event) error {
	if r.Next != nil {
		if err := r.Next.Handle(ctx, tx, ev); err != nil {
			return err
		}
	}
	b := pgevents.BatchFromContext(ctx)
	if b == nil {
		r.record(clone(ev))
		return nil
	}
	f := b.Flusher(r, func() pgevents.Flusher { return &recording{r: r} }).(*recording)
	f.events = append(f.events, clone(ev))
	return nil
}

// clone copies ev, with its own payload and metadata.
func clone(ev *pgevents.Event) pgevents.Event {
	c := *ev
	c.Payload = slices.Clone(ev.Payload)
	c.Metadata = slices.Clone(ev.Metadata)
	return c
}

// recording is the events a Recorder handled in one attempt at a batch.
type recording struct {
	r      *Recorder
	events []pgevents.Event
}

// Flush has nothing to wait for: the events' effects are the handler's.
func (*recording) Flush(context.Context) error { return nil }

// End records the attempt's events if its transaction committed.
func (f *recording) End(committed bool) {
	if committed {
		f.r.record(f.events...)
	}
	f.events = nil
}

// record appends evs to the events recorded and wakes the waiters.
func (r *Recorder) record(evs ...pgevents.Event) {
	if len(evs) == 0 {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events = append(r.events, evs...)
	if r.changed != nil {
		close(r.changed)
		r.changed = nil
	}
}

// Events returns the events recorded so far, in the order their batches
// committed.
func (r *Recorder) Events() []pgevents.Event {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.events)
}

// WaitHandled waits until n events are recorded, and returns them; the
// test fails if that has not happened within timeout, or if more than n
// are recorded.
func (r *Recorder) WaitHandled(tb testing.TB, n int, timeout time.Duration) []pgevents.Event {
	tb.Helper()
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for {
		r.mu.Lock()
		got := len(r.events)
		if got >= n {
			evs := slices.Clone(r.events)
			r.mu.Unlock()
			if got > n {
				tb.Fatalf("pgeventstest: %d events handled, want %d", got, n)
			}
			return evs
		}
		if r.changed == nil {
			r.changed = make(chan struct{})
		}
		changed := r.changed
		r.mu.Unlock()
		select {
		case <-changed:
		case <-deadline.C:
			tb.Fatalf("pgeventstest: %d events handled within %s, want %d", got, timeout, n)
			return nil
		}
	}
}

// RequireInOrder fails the test unless the events recorded hold each
// event once (no (topic, partition, offset) twice) and each host's events
// in the order of their offsets: what a consumer guarantees.
func (r *Recorder) RequireInOrder(tb testing.TB) {
	tb.Helper()
	type position struct {
		topic, partition int
		offset           int64
	}
	seen := map[position]bool{}
	last := map[string]pgevents.Event{} // per host, its last event
	for _, ev := range r.Events() {
		p := position{ev.TopicID, ev.PartitionID, ev.Offset}
		if seen[p] {
			tb.Errorf("pgeventstest: event at offset %d of topic %d, partition %d handled twice", ev.Offset, ev.TopicID, ev.PartitionID)
			continue
		}
		seen[p] = true
		key := fmt.Sprint(ev.TopicID, "\x00", ev.HostID)
		if prev, ok := last[key]; ok && prev.Offset >= ev.Offset {
			tb.Errorf("pgeventstest: host %q: offset %d handled after offset %d", ev.HostID, ev.Offset, prev.Offset)
		}
		last[key] = ev
	}
}
