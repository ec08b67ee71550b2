package pgtest

import (
	"flag"
	"math/rand/v2"
	"testing"
	"time"
)

// seedFlag fixes the seed of every randomized test that calls Seed, to
// replay a failed case: go test -run TestName -pgtest.seed N.
var seedFlag = flag.Uint64("pgtest.seed", 0, "seed of the randomized tests (0: the time); a failed test prints its seed")

// Seed returns the seed of a randomized test: the -pgtest.seed flag's, if
// set, or else one from the clock. It logs the seed, and the command that
// replays the case if the test fails. Derive every random choice of the
// test from it (Rand), so that a rerun with the seed makes the same ones.
func Seed(tb testing.TB) uint64 {
	tb.Helper()
	seed := *seedFlag
	if seed == 0 {
		seed = uint64(time.Now().UnixNano())
	}
	tb.Logf("seed %d", seed)
	tb.Cleanup(func() {
		if tb.Failed() {
			tb.Logf("FAILED with seed %d: replay with go test -run '^%s$' -pgtest.seed %d", seed, tb.Name(), seed)
		}
	})
	return seed
}

// Rand returns the random stream number stream of seed: give each
// goroutine of a test a stream of its own, so that its choices do not
// depend on how the goroutines interleave.
func Rand(seed uint64, stream int) *rand.Rand {
	return rand.New(rand.NewPCG(seed, uint64(stream)))
}
