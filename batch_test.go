package pgevents

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pgevents/pgevents/internal/pgtest"
)

// asyncSink is a handler whose effects complete at Flush: Handle only
// queues the event on the batch's Flusher; Flush delivers the queued events
// in order, stopping at the first for which fail returns an error.
type asyncSink struct {
	fail func(ev *Event) error

	mu        sync.Mutex
	delivered []int64 // offsets delivered, in delivery order
	flushers  int
	ends      int
	committed int // ends with committed true
}

func (s *asyncSink) Handle(ctx context.Context, _ pgx.Tx, ev *Event) error {
	b := BatchFromContext(ctx)
	if b == nil {
		return errors.New("no batch in the handler's context")
	}
	f := b.Flusher(s, func() Flusher {
		s.mu.Lock()
		s.flushers++
		s.mu.Unlock()
		return &asyncFlusher{s: s}
	}).(*asyncFlusher)
	f.pending = append(f.pending, *ev)
	return nil
}

type asyncFlusher struct {
	s       *asyncSink
	pending []Event
}

func (f *asyncFlusher) Flush(ctx context.Context) error {
	for i := range f.pending {
		ev := &f.pending[i]
		if err := f.s.fail(ev); err != nil {
			return &EventError{Offset: ev.Offset, Err: err}
		}
		f.s.mu.Lock()
		f.s.delivered = append(f.s.delivered, ev.Offset)
		f.s.mu.Unlock()
	}
	return nil
}

func (f *asyncFlusher) End(committed bool) {
	f.s.mu.Lock()
	defer f.s.mu.Unlock()
	f.s.ends++
	if committed {
		f.s.committed++
	}
}

// TestBatchFlushBlamesTheEventsUnit: three producer transactions in one
// batch; the flush reports that the second event of the middle one
// failed permanently. That unit, and only it, is dead-lettered with the
// reason; the others are delivered and committed; every Flusher ends.
func TestBatchFlushBlamesTheEventsUnit(t *testing.T) {
	t.Parallel()
	pool := newTopic(t, 1)
	appendTx(t, pool, ev("h", "t", `{"n":1}`), ev("h", "t", `{"n":2}`))
	appendTx(t, pool, ev("h", "t", `{"n":3}`), ev("h", "t", `{"poison":4}`), ev("h", "t", `{"n":5}`))
	appendTx(t, pool, ev("h", "t", `{"n":6}`), ev("h", "t", `{"n":7}`))
	s := &asyncSink{fail: func(ev *Event) error {
		if strings.Contains(string(ev.Payload), "poison") {
			return Permanent(errors.New("refused: poison"))
		}
		return nil
	}}
	hs := &Handlers{}
	hs.HandleAll(s)
	startConsumer(t, pool, Config{TotalPartitions: 1, Handlers: hs, RetryInitial: time.Millisecond, RetryMax: 10 * time.Millisecond})
	waitPosition(t, pool, 8)
	if n := queryInt(t, pool, `SELECT count(*) FROM dead_letter_queue WHERE first_offset = 3 AND last_offset = 5
		AND error = 'refused: poison'`); n != 1 {
		t.Fatalf("no dead letter for the unit at offsets 3-5 with the flush's reason")
	}
	if n := queryInt(t, pool, `SELECT count(*) FROM dead_letter_queue`); n != 1 {
		t.Fatalf("%d dead letters, want 1", n)
	}
	// End is called once the attempt is over, after its commit made the
	// position visible.
	pgtest.WaitFor(t, 10*time.Second, "every flusher ended", func() bool {
		s.mu.Lock()
		defer s.mu.Unlock()
		return s.ends == s.flushers && s.committed > 0
	})
	s.mu.Lock()
	defer s.mu.Unlock()
	// The committed attempt delivered 1, 2, 6, 7 in order (earlier attempts
	// may have delivered a prefix too: at least once).
	if got := s.delivered[len(s.delivered)-4:]; !slices.Equal(got, []int64{1, 2, 6, 7}) {
		t.Fatalf("delivered %v, want it to end with [1 2 6 7]", s.delivered)
	}
	if s.ends != s.flushers || s.committed != 1 {
		t.Fatalf("%d flushers, %d ended, %d committed; want every flusher ended and one commit", s.flushers, s.ends, s.committed)
	}
}

// TestBatchCommitsOnlyAfterFlush: the flush fails transiently three times.
// The group's position stays before the batch until a flush succeeds;
// then every event is delivered, nothing is dead-lettered.
func TestBatchCommitsOnlyAfterFlush(t *testing.T) {
	t.Parallel()
	pool := newTopic(t, 1)
	for i := range 5 {
		appendTx(t, pool, ev(fmt.Sprint("h", i), "t", `{}`))
	}
	var failures atomic.Int64
	var early atomic.Int64 // flushes that found the position already past their batch
	s := &asyncSink{}
	s.fail = func(ev *Event) error {
		if queryInt(t, pool, `SELECT next_offset FROM consumer_offsets WHERE partition_id = 0`) > ev.Offset {
			early.Add(1)
		}
		if failures.Add(1) <= 3 {
			return Retryable(errors.New("downstream unavailable"))
		}
		return nil
	}
	hs := &Handlers{}
	hs.HandleAll(s)
	c := startConsumer(t, pool, Config{TotalPartitions: 1, Handlers: hs, RetryInitial: time.Millisecond, RetryMax: 10 * time.Millisecond})
	waitPosition(t, pool, 6)
	if early.Load() != 0 {
		t.Fatalf("%d flushes ran after the position moved past their event", early.Load())
	}
	s.mu.Lock()
	delivered := slices.Clone(s.delivered)
	s.mu.Unlock()
	slices.Sort(delivered)
	if !slices.Equal(slices.Compact(delivered), []int64{1, 2, 3, 4, 5}) {
		t.Fatalf("delivered %v, want every event 1-5", delivered)
	}
	if st := c.Stats(); st.Retries < 3 || st.DeadLettered != 0 {
		t.Fatalf("retries %d, dead letters %d; want at least 3 retries and none dead-lettered", st.Retries, st.DeadLettered)
	}
}
