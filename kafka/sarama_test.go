package kafka_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/pgevents/pgevents/kafka"
	"github.com/pgevents/pgevents/schema"
)

// gate holds a test's group back: an event of partition p is handled
// only while fewer than p's limit were, so that the test decides how far
// the group gets in each partition before it changes the membership.
type gate struct {
	mu     sync.Mutex
	used   map[int32]int
	limit  map[int32]int
	raised chan struct{}
}

func newGate() *gate {
	return &gate{used: map[int32]int{}, limit: map[int32]int{}, raised: make(chan struct{})}
}

// raise sets partition p's limit to limit(p) for each p in ps; limit is
// called with the gate's lock held (it may read g.used).
func (g *gate) raise(ps []int32, limit func(p int32) int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, p := range ps {
		g.limit[p] = limit(p)
	}
	close(g.raised)
	g.raised = make(chan struct{})
}

// reached reports whether every partition of ps has handled its limit.
func (g *gate) reached(ps []int32) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, p := range ps {
		if g.used[p] < g.limit[p] {
			return false
		}
	}
	return true
}

// handled returns how many events of p went through the gate.
func (g *gate) handled(p int32) int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.used[p]
}

// enter takes the place of one event of p under p's limit: true once it
// has it, false if ctx ends first; it calls blocked once before it blocks.
func (g *gate) enter(ctx context.Context, p int32, blocked func()) bool {
	for first := true; ; first = false {
		if ctx.Err() != nil {
			return false
		}
		g.mu.Lock()
		if g.used[p] < g.limit[p] {
			g.used[p]++
			g.mu.Unlock()
			return true
		}
		raised := g.raised
		g.mu.Unlock()
		if first {
			blocked()
		}
		select {
		case <-ctx.Done():
			return false
		case <-raised:
		}
	}
}

// owners records, per partition, the members that handled its events in
// turn.
type owners struct {
	mu sync.Mutex
	by map[int32][]string
}

func (o *owners) add(p int32, name string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if l := o.by[p]; len(l) == 0 || l[len(l)-1] != name {
		o.by[p] = append(l, name)
	}
}

// handedOver returns the partitions whose events first went to from and
// then to to.
func (o *owners) handedOver(from, to string) []int32 {
	o.mu.Lock()
	defer o.mu.Unlock()
	var out []int32
	for p, l := range o.by {
		if i := slices.Index(l, from); i >= 0 && slices.Contains(l[i+1:], to) {
			out = append(out, p)
		}
	}
	slices.Sort(out)
	return out
}

// assignments records the partitions each member's current session
// claims, with its generation.
type assignments struct {
	mu  sync.Mutex
	gen map[string]int32
	ps  map[string][]int32
}

func (a *assignments) set(name string, gen int32, ps []int32) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.gen[name], a.ps[name] = gen, ps
}

// shared reports whether every member in names claims partitions in the
// same generation.
func (a *assignments) shared(names ...string) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, n := range names {
		if len(a.ps[n]) == 0 || a.gen[n] != a.gen[names[0]] {
			return false
		}
	}
	return true
}

// saramaHandler handles a Sarama group member's claims into s, marking
// each message, and commits what it handled before it waits (for a
// message, or at the gate) and before ConsumeClaim returns, so that what
// was handled is committed before the member gives its partitions up:
// Sarama rejoins only once every ConsumeClaim returned. A commit per
// batch, not per message: the commit goes on the connection the fetches
// go on, where it waits for the fetch in flight (the endpoint, as a Kafka
// broker, answers a connection's requests in order), up to
// Consumer.MaxWaitTime.
type saramaHandler struct {
	name string
	s    *seen
	g    *gate
	as   *assignments
	own  *owners
}

func (h *saramaHandler) Setup(sess sarama.ConsumerGroupSession) error {
	ps := slices.Clone(sess.Claims()["events"])
	slices.Sort(ps)
	h.as.set(h.name, sess.GenerationID(), ps)
	return nil
}

func (h *saramaHandler) Cleanup(sarama.ConsumerGroupSession) error {
	h.as.set(h.name, -1, nil)
	return nil
}

func (h *saramaHandler) ConsumeClaim(sess sarama.ConsumerGroupSession, claim sarama.ConsumerGroupClaim) error {
	ctx := sess.Context()
	dirty := false
	commit := func() {
		if dirty {
			sess.Commit()
			dirty = false
		}
	}
	defer commit()
	for {
		var (
			m  *sarama.ConsumerMessage
			ok bool
		)
		select {
		case m, ok = <-claim.Messages():
		default:
			commit()
			select {
			case m, ok = <-claim.Messages():
			case <-ctx.Done():
				return nil
			}
		}
		if !ok || !h.g.enter(ctx, m.Partition, commit) {
			return nil
		}
		r := &kgo.Record{Topic: m.Topic, Partition: m.Partition, Offset: m.Offset, Key: m.Key, Value: m.Value}
		for _, hd := range m.Headers {
			r.Headers = append(r.Headers, kgo.RecordHeader{Key: string(hd.Key), Value: hd.Value})
		}
		h.s.add(h.name, r)
		h.own.add(m.Partition, h.name)
		sess.MarkMessage(m, "")
		dirty = true
	}
}

// saramaMember consumes topic events in group g with Sarama until ctx
// ends, then leaves the group (Close). Errors Sarama reports (a failed
// commit among them) are logged; a commit lost shows as an event handled
// twice.
func saramaMember(ctx context.Context, t *testing.T, addr, g string, version sarama.KafkaVersion, h *saramaHandler) error {
	cfg := sarama.NewConfig()
	cfg.ClientID = h.name
	cfg.Version = version
	cfg.Consumer.Offsets.Initial = sarama.OffsetOldest
	cfg.Consumer.Offsets.AutoCommit.Enable = false
	cfg.Consumer.Return.Errors = true
	cfg.Consumer.MaxWaitTime = 250 * time.Millisecond
	cfg.Consumer.Group.Heartbeat.Interval = 500 * time.Millisecond
	cfg.Consumer.Group.Rebalance.GroupStrategies = []sarama.BalanceStrategy{sarama.NewBalanceStrategyRange()}
	cg, err := sarama.NewConsumerGroup([]string{addr}, g, cfg)
	if err != nil {
		return fmt.Errorf("%s: %w", h.name, err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for err := range cg.Errors() {
			t.Logf("%s: %v", h.name, err)
		}
	}()
	var runErr error
	for ctx.Err() == nil {
		if err := cg.Consume(ctx, []string{"events"}, h); err != nil && !errors.Is(err, sarama.ErrClosedConsumerGroup) {
			runErr = fmt.Errorf("%s: consume: %w", h.name, err)
			break
		}
	}
	if err := cg.Close(); err != nil && runErr == nil {
		runErr = fmt.Errorf("%s: close: %w", h.name, err)
	}
	<-done
	return runErr
}

// TestSaramaGroupTakesOver: a Sarama consumer group reads a topic written
// by multi-event transactions over several hosts (a third rolled back).
// Member a alone handles an eighth of each partition; b joins and each
// handles half of what is left in its partitions; a leaves and b takes
// over its partitions from the committed offsets. Every committed event
// is handled once, in order per host and per partition, nothing of a
// rolled-back transaction; the group's committed offsets are the pgevents
// group's positions. In scope topic a partition's offsets have gaps,
// which Sarama must step over. Sarama's version is the oldest the endpoint
// serves (record batches v2: Kafka 0.11) and a recent one.
func TestSaramaGroupTakesOver(t *testing.T) {
	t.Parallel()
	for _, scope := range scopes {
		for _, version := range []sarama.KafkaVersion{sarama.V0_11_0_0, sarama.V3_6_0_0} {
			t.Run(fmt.Sprintf("%s/%s", scope, version), func(t *testing.T) {
				t.Parallel()
				saramaTakeOver(t, scope, version)
			})
		}
	}
}

func saramaTakeOver(t *testing.T, scope string, version sarama.KafkaVersion) {
	seed := uint64(time.Now().UnixNano())
	e := newEnv(t, 4, scope, kafka.Options{})
	want := e.produceRandom(seed, 80, 7)
	log := e.logRows()
	if scope == schema.ScopeTopic && !hasGaps(log) {
		t.Fatalf("scope topic: no partition has a gap in its offsets; the test does not exercise gaps (seed %d)", seed)
	}
	n := total(want)
	events := map[int32]int{}
	for k := range log {
		events[int32(k[0])]++
	}
	all := []int32{0, 1, 2, 3}
	s := newSeen()
	g := newGate()
	as := &assignments{gen: map[string]int32{}, ps: map[string][]int32{}}
	own := &owners{by: map[int32][]string{}}
	ctx, cancel := context.WithTimeout(e.ctx, 90*time.Second)
	defer cancel()
	ctxA, stopA := context.WithCancel(ctx)
	defer stopA()
	ctxB, stopB := context.WithCancel(ctx)
	defer stopB()
	var wg sync.WaitGroup
	errs := make(chan error, 2)
	run := func(ctx context.Context, name string) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- saramaMember(ctx, t, e.addr, "g", version, &saramaHandler{name: name, s: s, g: g, as: as, own: own})
		}()
	}

	// a alone: an eighth of each partition.
	g.raise(all, func(p int32) int { return events[p] / 8 })
	run(ctxA, "a")
	waitFor(t, 60*time.Second, fmt.Sprintf("a to handle an eighth of each partition (seed %d)", seed), func() bool { return g.reached(all) })

	// b joins: each handles half of what is left in its partitions.
	run(ctxB, "b")
	waitFor(t, 60*time.Second, fmt.Sprintf("a and b to share the partitions (seed %d)", seed), func() bool { return as.shared("a", "b") })
	as.mu.Lock()
	psA := as.ps["a"]
	as.mu.Unlock()
	var handOver []int32 // a's partitions where a handles some and leaves some
	for _, p := range psA {
		if events[p]-g.handled(p) >= 2 {
			handOver = append(handOver, p)
		}
	}
	if len(handOver) == 0 {
		t.Fatalf("a's partitions %v have fewer than 2 events left each; the test needs some to hand over (seed %d)", psA, seed)
	}
	g.raise(all, func(p int32) int { return g.used[p] + (events[p]-g.used[p])/2 })
	waitFor(t, 60*time.Second, fmt.Sprintf("a and b to handle half of what is left in each partition (seed %d)", seed), func() bool { return g.reached(all) })

	// a leaves: b takes its partitions over.
	stopA()
	g.raise(all, func(p int32) int { return events[p] })
	waitFor(t, 60*time.Second, fmt.Sprintf("b to take over and handle all %d events (seed %d)", n, seed), func() bool { return s.count() >= n })
	stopB()
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatalf("%v (seed %d)", err, seed)
		}
	}
	s.check(t, want, seed)
	if got := own.handedOver("a", "b"); !isSubset(handOver, got) {
		t.Errorf("partitions handled by a, then by b: %v, want all of %v, a's last partitions with events left (seed %d)", got, handOver, seed)
	}
	checkPositions(t, e, "g", s, seed)
}

func isSubset(sub, of []int32) bool {
	for _, p := range sub {
		if !slices.Contains(of, p) {
			return false
		}
	}
	return true
}
