package store

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/pgevents/pgevents/internal/pgtest"
)

// TestRegistrationIsNotAHolder: replicas registering (their heartbeats
// hold the group's holder key shared for an instant) never make the group
// look held by another kind of consumer, to a replica starting meanwhile;
// a holder's session hold does, and then a registration is refused with a
// GroupInUseError naming the holder, until it is released.
func TestRegistrationIsNotAHolder(t *testing.T) {
	t.Parallel()
	ctx, url := setup(t, 1)
	pool := pgtest.Pool(t, url)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for i := range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				if _, err := pool.Exec(ctx, `SELECT register_replica('g', 1, $1, 'auto', 'h', 1, '10 seconds')`, string(rune('a'+i))); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	deadline := time.Now().Add(2 * time.Second)
	looks := 0
	for time.Now().Before(deadline) {
		by, err := GroupHolder(ctx, pool, "g")
		if err != nil {
			t.Fatal(err)
		}
		if by != "" {
			t.Fatalf("look %d: the group looks held by %q while only replicas register", looks, by)
		}
		looks++
	}
	close(stop)
	wg.Wait()

	// A holder's hold (the replicas' rows expire first: a live replica
	// refuses it).
	if _, err := pool.Exec(ctx, `UPDATE consumer_replicas SET expires_at = now() - interval '1 second'`); err != nil {
		t.Fatal(err)
	}
	conn, err := pool.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Release()
	if err := HoldGroup(ctx, conn, "g", true, "the test", "a holder"); err != nil {
		t.Fatal(err)
	}
	_, err = pool.Exec(ctx, `SELECT register_replica('g', 1, 'a', 'auto', 'h', 1, '10 seconds')`)
	var inUse *GroupInUseError
	if err = GroupInUse("g", err); !errors.As(err, &inUse) || inUse.By != "the test (a holder)" {
		t.Fatalf("a registration while the group is held: %v, want a GroupInUseError naming the holder", err)
	}
	if err := ReleaseGroup(context.Background(), conn, "g"); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `SELECT register_replica('g', 1, 'a', 'auto', 'h', 1, '10 seconds')`); err != nil {
		t.Fatalf("a registration after the release: %v", err)
	}
}
