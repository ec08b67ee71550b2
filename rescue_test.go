package pgevents

import (
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pgevents/pgevents/internal/pgtest"
)

var rescueSeed = flag.Uint64("rescue.seed", 0, "seed of TestFailingUnitsDeadLetteredInOneAttempt (0: from the clock)")

// poisonLoad appends, in one partition, producer transactions of one to
// three events over several hosts until it has appended total events;
// failing of the transactions carry one poison event (at a random place),
// the others none. It returns the offsets of the events of good units and
// the (first, last) offsets of the failing units, in offset order.
func poisonLoad(t *testing.T, pool *pgxpool.Pool, rng *rand.Rand, total, failing int) (good []int64, bad [][2]int64) {
	t.Helper()
	var sizes []int
	for n := total; n > 0; {
		k := min(n, 1+rng.IntN(3))
		sizes = append(sizes, k)
		n -= k
	}
	if failing > len(sizes) {
		t.Fatalf("%d failing units asked of %d", failing, len(sizes))
	}
	poisoned := map[int]bool{}
	for _, i := range rng.Perm(len(sizes))[:failing] {
		poisoned[i] = true
	}
	for i, k := range sizes {
		evs := make([]Event, k)
		at := rng.IntN(k)
		for j := range evs {
			payload := `{}`
			if poisoned[i] && j == at {
				payload = `{"poison": true}`
			}
			evs[j] = ev(fmt.Sprintf("h%d", rng.IntN(12)), "t", payload)
		}
		offs := appendTx(t, pool, evs...)
		if poisoned[i] {
			bad = append(bad, [2]int64{offs[0], offs[len(offs)-1]})
		} else {
			good = append(good, offs...)
		}
	}
	return good, bad
}

// TestFailingUnitsDeadLetteredInOneAttempt: a burst of units that fail
// permanently, among good ones, in one partition. Every failing unit must
// be dead-lettered whole and every good event handled once in offset
// order, within 2 s of the last append: a failing unit is dead-lettered in
// the attempt that meets it, not one rolled-back attempt (and a growing
// backoff) per failing unit.
func TestFailingUnitsDeadLetteredInOneAttempt(t *testing.T) {
	t.Parallel()
	seed := *rescueSeed
	if seed == 0 {
		seed = uint64(time.Now().UnixNano())
	}
	t.Logf("seed %d (rerun: -run TestFailingUnitsDeadLetteredInOneAttempt -rescue.seed %d)", seed, seed)
	rng := rand.New(rand.NewPCG(seed, 1))
	pool, poisoned := poisonTopic(t, 1)
	c := startConsumer(t, pool, Config{TotalPartitions: 1, WaitPeriod: time.Hour, Handlers: poisonHandlers(poisoned)})
	good, bad := poisonLoad(t, pool, rng, 200, 30)
	appended := time.Now()
	pgtest.WaitFor(t, 30*time.Second, "every unit handled or dead-lettered", func() bool {
		return queryInt(t, pool, `SELECT count(*) FROM handled`) >= int64(len(good)) &&
			queryInt(t, pool, `SELECT count(*) FROM dead_letter_queue`) >= int64(len(bad))
	})
	took := time.Since(appended)
	if got := handledOffsets(t, pool); got != fmt.Sprint(good) {
		t.Fatalf("seed %d: handled %s, want %v", seed, got, good)
	}
	var dls [][2]int64
	rows, err := pool.Query(context.Background(), `SELECT first_offset, last_offset FROM dead_letter_queue ORDER BY first_offset`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var d [2]int64
		if err := rows.Scan(&d[0], &d[1]); err != nil {
			t.Fatal(err)
		}
		dls = append(dls, d)
	}
	if !slices.Equal(dls, bad) {
		t.Fatalf("seed %d: dead letters %v, want the failing units %v", seed, dls, bad)
	}
	if took > 2*time.Second {
		t.Fatalf("seed %d: %d failing units among 200 events took %s to settle (%d retries), want within 2 s",
			seed, len(bad), took.Round(time.Millisecond), c.Stats().Retries)
	}
	t.Logf("%d units dead-lettered, %d events handled in %s, %d rolled-back attempts", len(bad), len(good), took.Round(time.Millisecond), c.Stats().Retries)
}

// TestBadDeployReachesTheBreaker: every event fails permanently (a bad
// deploy). Under each policy the partition halts within seconds: at once
// under PolicyHalt, and at the circuit breaker (MaxDeadLetters dead
// letters) under the others, which dead-letter up to it in a few attempts.
func TestBadDeployReachesTheBreaker(t *testing.T) {
	t.Parallel()
	for _, policy := range []FailurePolicy{PolicyDeadLetter, PolicyParkHost, PolicyHalt} {
		t.Run(fmt.Sprint(policy), func(t *testing.T) {
			t.Parallel()
			pool, poisoned := poisonTopic(t, 1)
			c := startConsumer(t, pool, Config{TotalPartitions: 1, WaitPeriod: time.Hour, OnPermanentFailure: policy,
				Handlers: poisonHandlers(poisoned)})
			for i := range 167 { // 501 events, more units than the breaker's 100
				evs := make([]Event, 3)
				for j := range evs {
					// Hosts of their own: under PolicyParkHost a unit
					// touching a parked host is parked, not dead-lettered.
					evs[j] = ev(fmt.Sprintf("h%d-%d", i, j), "t", `{"poison": true}`)
				}
				appendTx(t, pool, evs...)
			}
			appended := time.Now()
			pgtest.WaitFor(t, 30*time.Second, "the partition to halt", func() bool { return c.Stats().Halts == 1 })
			took := time.Since(appended)
			units := queryInt(t, pool, `SELECT count(*) FROM dead_letter_queue`)
			want := int64(DefaultMaxDeadLetters)
			if policy == PolicyHalt {
				want = 0
			}
			if units != want {
				t.Fatalf("%d dead letters before the halt, want %d", units, want)
			}
			if n := queryInt(t, pool, `SELECT count(*) FROM handled`); n != 0 {
				t.Fatalf("%d failing events handled", n)
			}
			if took > 10*time.Second {
				t.Fatalf("the partition halted %s after the appends (%d retries), want within seconds", took.Round(time.Millisecond), c.Stats().Retries)
			}
			t.Logf("halted after %s, %d dead letters, %d rolled-back attempts", took.Round(time.Millisecond), units, c.Stats().Retries)
		})
	}
}
