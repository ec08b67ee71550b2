package partition

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgevents/pgevents/internal/pgtest"
)

// recorder is an Owner that records what a Leaser tells it and releases a
// partition as soon as it is asked to, as an idle worker does.
type recorder struct {
	mu     sync.Mutex
	l      *Leaser
	epochs map[int]int64 // partition -> epoch while held
	lost   map[int]int
}

func (r *recorder) Acquired(p int, epoch int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.epochs[p] = epoch
}

func (r *recorder) Lost(p int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.epochs, p)
	r.lost[p]++
}

func (r *recorder) Release(p int) {
	r.mu.Lock()
	epoch := r.epochs[p]
	delete(r.epochs, p)
	r.mu.Unlock()
	go r.l.Released(context.Background(), p, epoch) //nolint:errcheck // expiry is the fallback
}

func (r *recorder) held() map[int]int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make(map[int]int64, len(r.epochs))
	for p, e := range r.epochs {
		out[p] = e
	}
	return out
}

// replica is a running Leaser and its recorder.
type replica struct {
	*recorder
	stop func() // stops the heartbeat without releasing: a crash, as far as the lease can tell
}

// startReplica runs a Leaser of group "g" over the topic's 4 partitions
// until the test ends.
func startReplica(t *testing.T, pool *pgxpool.Pool, id string, static []int) *replica {
	t.Helper()
	r := &recorder{epochs: map[int]int64{}, lost: map[int]int{}}
	l, err := NewLeaser(LeaserConfig{DB: pool, Group: "g", Topic: 1, Partitions: 4, Static: static,
		ReplicaID: id, Lease: 300 * time.Millisecond, Owner: r})
	if err != nil {
		t.Fatal(err)
	}
	r.l = l
	ctx, cancel := context.WithCancel(pgtest.Context(context.Background()))
	done := make(chan struct{})
	go func() { defer close(done); _ = l.Run(ctx) }()
	var once sync.Once
	stop := func() { once.Do(func() { cancel(); <-done }) }
	t.Cleanup(stop)
	return &replica{recorder: r, stop: stop}
}

// leasePool is leaseDB with 4 partitions.
func leasePool(t *testing.T) *pgxpool.Pool {
	t.Helper()
	_, pool := leaseDBN(t, 4)
	return pool
}

// TestLeaserAloneTakesEverything: a single replica holds every partition,
// each under an epoch of its own that fences the previous owner.
func TestLeaserAloneTakesEverything(t *testing.T) {
	t.Parallel()
	pool := leasePool(t)
	a := startReplica(t, pool, "a", nil)
	pgtest.WaitFor(t, 10*time.Second, "a holds 4 partitions", func() bool { return len(a.held()) == 4 })
	for p, e := range a.held() {
		if e <= 0 {
			t.Errorf("partition %d held with epoch %d", p, e)
		}
	}
}

// TestLeasersShareAndTakeOver: two replicas split the partitions evenly,
// never holding one partition at once; when one dies (stops heartbeating
// without releasing), the other takes its partitions over after the lease
// expires, with higher epochs.
func TestLeasersShareAndTakeOver(t *testing.T) {
	t.Parallel()
	pool := leasePool(t)
	a := startReplica(t, pool, "a", nil)
	pgtest.WaitFor(t, 10*time.Second, "a holds 4 partitions", func() bool { return len(a.held()) == 4 })
	b := startReplica(t, pool, "b", nil)
	pgtest.WaitFor(t, 10*time.Second, "a and b hold 2 partitions each", func() bool {
		return len(a.held()) == 2 && len(b.held()) == 2
	})
	ha, hb := a.held(), b.held()
	for p := range ha {
		if _, both := hb[p]; both {
			t.Fatalf("partition %d held by a and b", p)
		}
	}
	a.stop() // crashed: its leases expire
	pgtest.WaitFor(t, 10*time.Second, "b holds 4 partitions", func() bool { return len(b.held()) == 4 })
	for p, e := range b.held() {
		if old, ok := ha[p]; ok && e <= old {
			t.Errorf("partition %d taken over with epoch %d, not above a's %d: the fencing token did not move", p, e, old)
		}
	}
}

// TestStaticReplicaStandsBy: a static replica of a partition held by
// another waits as a hot standby and takes the partition when the holder
// dies; it never takes partitions it was not given.
func TestStaticReplicaStandsBy(t *testing.T) {
	t.Parallel()
	pool := leasePool(t)
	a := startReplica(t, pool, "a", []int{1})
	pgtest.WaitFor(t, 10*time.Second, "a holds partition 1", func() bool { _, ok := a.held()[1]; return ok })
	b := startReplica(t, pool, "b", []int{1, 2})
	pgtest.WaitFor(t, 10*time.Second, "b holds partition 2", func() bool { _, ok := b.held()[2]; return ok })
	if _, ok := b.held()[1]; ok {
		t.Fatal("b took partition 1 from a live static replica")
	}
	a.stop()
	pgtest.WaitFor(t, 10*time.Second, "b took partition 1 over", func() bool { _, ok := b.held()[1]; return ok })
	for p := range b.held() {
		if p != 1 && p != 2 {
			t.Fatalf("static replica b holds partition %d it was not given", p)
		}
	}
}
