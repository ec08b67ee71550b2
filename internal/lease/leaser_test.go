package lease

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/rs/zerolog"

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
	logger := zerolog.New(zerolog.NewTestWriter(t))
	l, err := NewLeaser(LeaserConfig{DB: pool, Group: "g", Topic: 1, Partitions: 4, Static: static,
		ReplicaID: id, Lease: 300 * time.Millisecond, Owner: r, Logger: &logger})
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

// TestAcquisitionWhoseAnswerWasLost: the statement that acquires leases
// commits on the server, but its answer never reaches the replica (its
// deadline passed, the network dropped it): the database says the replica
// owns the partitions, the replica does not know. Its next heartbeat finds
// them among the leases it renews and takes them up. Before, the heartbeat
// renewed them forever without serving them: nobody else could take them
// and nobody handled their events (found by TestFailureModel: a group
// stuck with every partition at epoch 0).
func TestAcquisitionWhoseAnswerWasLost(t *testing.T) {
	t.Parallel()
	pool := leasePool(t)
	proxied, proxy := pgtest.ProxiedPool(t, pool)
	lost := proxy.LoseAnswer("SKIP LOCKED")
	a := startReplica(t, proxied, "a", nil)
	t.Logf("started")
	select {
	case <-lost:
	case <-time.After(10 * time.Second):
		t.Fatal("the acquisition was not sent")
	}
	owned := func() int64 {
		var n int64
		if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM partition_leases WHERE group_id = 'g' AND owner = 'a'`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	pgtest.WaitFor(t, 10*time.Second, "the acquisition committed", func() bool { return owned() == 4 })
	if n := len(a.held()); n != 0 {
		t.Fatalf("the replica knows of %d partitions before the answer was lost", n)
	}
	proxy.CloseAll() // the replica's connection dies without the answer
	pgtest.WaitFor(t, 10*time.Second, "a serves the 4 partitions it owns", func() bool { return len(a.held()) == 4 })
	rows, err := pool.Query(context.Background(), `SELECT partition_id, epoch FROM partition_leases WHERE group_id = 'g' AND owner = 'a'`)
	if err != nil {
		t.Fatal(err)
	}
	var p int
	var e int64
	held := a.held()
	if _, err := pgx.ForEachRow(rows, []any{&p, &e}, func() error {
		if held[p] != e {
			t.Errorf("partition %d: the replica serves it under epoch %d, the database says %d", p, held[p], e)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}

// TestLeaserOfAnOldLayoutAcquiresNothing: a replica still running the
// layout its group has just left (another replica switched the group) must
// not take the new layout's leases, which the switch freed: its workers do
// not serve them, and a replica of the new layout could not take them until
// the old one let go.
func TestLeaserOfAnOldLayoutAcquiresNothing(t *testing.T) {
	t.Parallel()
	pool := leasePool(t)
	if _, err := pool.Exec(context.Background(), `UPDATE group_layouts SET version = version + 1 WHERE group_id = 'g'`); err != nil {
		t.Fatal(err)
	}
	var layout int
	if err := pool.QueryRow(context.Background(), `SELECT version FROM group_layouts WHERE group_id = 'g'`).Scan(&layout); err != nil {
		t.Fatal(err)
	}
	run := func(id string, layout int) (*recorder, func()) {
		r := &recorder{epochs: map[int]int64{}, lost: map[int]int{}}
		l, err := NewLeaser(LeaserConfig{DB: pool, Group: "g", Topic: 1, Partitions: 4, Layout: layout,
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
		return r, stop
	}
	old, stopOld := run("old", layout-1)
	owned := func(id string) int64 {
		var n int64
		if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM partition_leases WHERE group_id = 'g' AND owner = $1`, id).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	// Several heartbeats (every 100 ms): nothing taken.
	deadline := time.Now().Add(time.Second)
	for time.Now().Before(deadline) {
		if n := owned("old"); n != 0 || len(old.held()) != 0 {
			t.Fatalf("the replica of layout %d took %d leases of layout %d", layout-1, n, layout)
		}
		time.Sleep(50 * time.Millisecond)
	}
	// A replica of the current layout takes its share (the old one is still
	// live, and counted), and everything once the old one has gone.
	cur, _ := run("cur", layout)
	pgtest.WaitFor(t, 10*time.Second, "the replica of the current layout holds its share", func() bool { return len(cur.held()) == 2 })
	if n := owned("old"); n != 0 {
		t.Fatalf("the replica of layout %d took %d leases of layout %d", layout-1, n, layout)
	}
	stopOld()
	pgtest.WaitFor(t, 10*time.Second, "the replica of the current layout holds every partition", func() bool { return len(cur.held()) == 4 })
}
