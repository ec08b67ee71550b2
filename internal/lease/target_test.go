package lease

import (
	"fmt"
	"testing"
)

// TestTargetIsBalancedAndComplete: for any number of partitions and live
// replicas, the shares add up to the partition count and differ by at most
// one, and every replica computes the same split on its own.
func TestTargetIsBalancedAndComplete(t *testing.T) {
	t.Parallel()
	for n := 1; n <= 70; n++ {
		for r := 1; r <= 9; r++ {
			live := make([]string, r)
			for i := range live {
				live[i] = fmt.Sprintf("replica-%02d", i)
			}
			sum, lo, hi := 0, n, 0
			for _, me := range live {
				tgt := Target(n, live, me)
				sum += tgt
				lo, hi = min(lo, tgt), max(hi, tgt)
			}
			if sum != n || hi-lo > 1 || lo != n/r {
				t.Fatalf("n=%d r=%d: shares sum to %d, range [%d, %d]; want %d in [⌊n/r⌋, ⌈n/r⌉]", n, r, sum, lo, hi, n)
			}
		}
	}
	// A replica not registered yet counts itself in.
	if got := Target(16, []string{"a", "c"}, "b"); got != 5 {
		t.Fatalf("Target for a newcomer among 2 = %d, want 5 of 16 over 3", got)
	}
}
