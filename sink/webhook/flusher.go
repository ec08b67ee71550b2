package webhook

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/pgevents/pgevents"
)

// flusher is one attempt at a batch: a lane per host, sending the host's
// requests in order, at most Concurrency requests at a time.
type flusher struct {
	s      *Sink
	p      *part
	ctx    context.Context // the requests'; cancelled by End
	cancel context.CancelFunc
	slots  chan struct{}
	wg     sync.WaitGroup // running lanes

	mu       sync.Mutex
	lanes    map[string]*lane
	failures []failure
}

// lane is the queue of one host's events.
type lane struct {
	queue   []queued
	running bool
	failed  bool // a request failed: the rest of the host's events wait
}

// failure is a request that failed.
type failure struct {
	offset int64
	err    error
}

func (s *Sink) newFlusher(p *part) *flusher {
	ctx, cancel := context.WithCancel(context.Background())
	return &flusher{s: s, p: p, ctx: ctx, cancel: cancel, slots: make(chan struct{}, s.opts.Concurrency),
		lanes: map[string]*lane{}}
}

// queued is an event waiting on its lane, with the trace context of its
// handler call (Handle's context does not reach the lane).
type queued struct {
	ev pgevents.Event
	tc map[string]string
}

// add queues ev, and tc, its trace context headers, on its host's lane,
// unless an earlier attempt delivered it.
func (f *flusher) add(ev *pgevents.Event, tc map[string]string) error {
	if f.p.acked.Has(ev.EventID) {
		return nil
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	l := f.lanes[ev.HostID]
	if l == nil {
		l = &lane{}
		f.lanes[ev.HostID] = l
	}
	if l.failed {
		return nil // not sent: the host's earlier event failed
	}
	l.queue = append(l.queue, queued{ev: *ev, tc: tc})
	if !l.running {
		l.running = true
		f.wg.Add(1)
		go f.run(l)
	}
	return nil
}

// run sends a lane's events in order until it is empty or one fails.
func (f *flusher) run(l *lane) {
	defer f.wg.Done()
	for {
		f.mu.Lock()
		if len(l.queue) == 0 || l.failed {
			l.queue, l.running = nil, false
			f.mu.Unlock()
			return
		}
		ev, tc := l.queue[0].ev, l.queue[0].tc
		l.queue = l.queue[1:]
		f.mu.Unlock()

		select {
		case f.slots <- struct{}{}:
		case <-f.ctx.Done():
			f.fail(l, ev.Offset, pgevents.Retryable(fmt.Errorf("webhook: event %s (offset %d) not sent: %w", ev.EventID, ev.Offset, f.ctx.Err())))
			continue
		}
		start := time.Now()
		err := f.s.send(f.ctx, &ev, tc)
		<-f.slots
		if err != nil {
			f.p.metrics.Failed(pgevents.Classify(err))
			f.fail(l, ev.Offset, err)
			continue
		}
		f.p.metrics.Delivered(time.Since(start))
		f.p.acked.Add(ev.EventID)
	}
}

// fail records that the request of the event at offset failed, which stops
// its lane.
func (f *flusher) fail(l *lane, offset int64, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	l.failed = true
	f.failures = append(f.failures, failure{offset: offset, err: err})
}

// Flush waits for every lane, then reports the earliest failure. A lane
// stops at its host's first failure, so every event before the earliest
// failure was delivered.
func (f *flusher) Flush(ctx context.Context) error {
	done := make(chan struct{})
	go func() {
		f.wg.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-ctx.Done():
		return pgevents.Retryable(fmt.Errorf("webhook: requests still running: %w", context.Cause(ctx)))
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.failures) == 0 {
		return nil
	}
	first := slices.MinFunc(f.failures, func(a, b failure) int { return cmp.Compare(a.offset, b.offset) })
	return &pgevents.EventError{Offset: first.offset, Err: first.err}
}

// End cancels what still runs and waits for the lanes to stop, so that the
// next attempt never races this one; it forgets the events delivered since
// the partition's last commit when the batch committed.
func (f *flusher) End(committed bool) {
	f.cancel()
	f.wg.Wait()
	if committed {
		f.p.acked.Clear()
	}
}
