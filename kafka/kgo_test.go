package kafka_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/pgevents/pgevents/kafka"
	"github.com/pgevents/pgevents/offsets"
)

// seen collects what consumers handled: payloads by host, in handling
// order, and the highest offset handled per partition.
type seen struct {
	mu      sync.Mutex
	byHost  map[string][]string
	last    map[int32]int64
	n       int
	errs    []string
	headers map[string]bool
}

func newSeen() *seen {
	return &seen{byHost: map[string][]string{}, last: map[int32]int64{}, headers: map[string]bool{}}
}

func (s *seen) add(who string, r *kgo.Record) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if last, ok := s.last[r.Partition]; ok && r.Offset <= last {
		s.errs = append(s.errs, fmt.Sprintf("%s: partition %d offset %d after %d", who, r.Partition, r.Offset, last))
	}
	s.last[r.Partition] = r.Offset
	s.byHost[string(r.Key)] = append(s.byHost[string(r.Key)], string(r.Value))
	for _, h := range r.Headers {
		s.headers[h.Key] = true
	}
	s.n++
}

func (s *seen) count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.n
}

// check compares what was handled with what was committed: every
// committed event once, in append order per host, nothing of a rolled-back
// transaction, in offset order per partition.
func (s *seen) check(t *testing.T, want map[string][]string, seed uint64) {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, e := range s.errs {
		t.Errorf("%s (seed %d)", e, seed)
	}
	for h, w := range want {
		if got := s.byHost[h]; !slices.Equal(got, w) {
			t.Errorf("host %s: handled %d events %v, want %d %v (seed %d)", h, len(got), got, len(w), w, seed)
		}
	}
	for h, got := range s.byHost {
		if want[h] == nil {
			t.Errorf("host %s: handled %v, which no committed transaction appended (seed %d)", h, got, seed)
		}
	}
}

func total(want map[string][]string) int {
	n := 0
	for _, w := range want {
		n += len(w)
	}
	return n
}

// member consumes with kgo in group g, committing after each poll with
// rebalances held off until the commit, until stop says so; it handles
// each record into s.
func member(ctx context.Context, t *testing.T, addr, g, name string, s *seen, stop func() bool) error {
	cl, err := kgo.NewClient(kgo.SeedBrokers(addr), kgo.ConsumerGroup(g), kgo.ConsumeTopics("events"),
		kgo.DisableAutoCommit(), kgo.BlockRebalanceOnPoll(), kgo.ClientID(name),
		kgo.FetchMaxWait(500*time.Millisecond), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		return err
	}
	defer cl.Close()
	for !stop() && ctx.Err() == nil {
		pctx, cancel := context.WithTimeout(ctx, time.Second)
		fs := cl.PollFetches(pctx)
		cancel()
		for _, fe := range fs.Errors() {
			if fe.Err != context.DeadlineExceeded && fe.Err != context.Canceled {
				t.Logf("%s: fetch error %s/%d: %v", name, fe.Topic, fe.Partition, fe.Err)
			}
		}
		recs := fs.Records()
		for _, r := range recs {
			s.add(name, r)
		}
		if len(recs) > 0 {
			if err := cl.CommitRecords(ctx, recs...); err != nil {
				cl.AllowRebalance()
				return fmt.Errorf("%s: commit: %w", name, err)
			}
		}
		cl.AllowRebalance()
	}
	return nil
}

// TestKgoGroupTakesOver: a kgo consumer group of two members reads a
// topic written by multi-event transactions over several hosts (a third
// rolled back); one member leaves half-way and the other takes over from
// its committed offsets. Every committed event is handled once, in order
// per host and per partition, and the group's committed offsets are the
// pgevents group's positions.
func TestKgoGroupTakesOver(t *testing.T) {
	t.Parallel()
	seed := uint64(time.Now().UnixNano())
	e := newEnv(t, 4, "", kafka.Options{})
	want := e.produceRandom(seed, 80, 7)
	n := total(want)
	s := newSeen()
	ctx, cancel := context.WithTimeout(e.ctx, 60*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	errs := make(chan error, 2)
	wg.Add(2)
	go func() {
		defer wg.Done()
		errs <- member(ctx, t, e.addr, "g", "a", s, func() bool { return s.count() >= n/3 })
	}()
	go func() {
		defer wg.Done()
		errs <- member(ctx, t, e.addr, "g", "b", s, func() bool { return s.count() >= n })
	}()
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatalf("%v (seed %d)", err, seed)
		}
	}
	s.check(t, want, seed)
	for _, h := range []string{kafka.HeaderEventType, kafka.HeaderEventID, kafka.HeaderTransactionID} {
		if !s.headers[h] {
			t.Errorf("no record carried the header %s", h)
		}
	}
	pos, err := offsets.Positions(e.ctx, e.pool, "g", 1, 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range pos {
		if last, ok := s.last[int32(p.Partition)]; ok && p.Next != last+1 {
			t.Errorf("partition %d: pgevents position %d, want %d (after the last offset handled) (seed %d)", p.Partition, p.Next, last+1, seed)
		}
	}
}
