package partition

import (
	"fmt"
	"testing"
)

func TestAssign(t *testing.T) {
	t.Parallel()
	all, err := Assign(4, nil)
	if err != nil || fmt.Sprint(all) != "[0 1 2 3]" {
		t.Fatalf("Assign(4, nil) = %v, %v", all, err)
	}
	got, err := Assign(8, []int{5, 1, 5})
	if err != nil || fmt.Sprint(got) != "[1 5]" {
		t.Fatalf("Assign(8, [5 1 5]) = %v, %v", got, err)
	}
	for _, bad := range [][]int{{8}, {-1}} {
		if _, err := Assign(8, bad); err == nil {
			t.Errorf("Assign(8, %v) accepted a partition outside [0, 8)", bad)
		}
	}
	if _, err := Assign(0, nil); err == nil {
		t.Error("Assign(0, nil) accepted no partitions")
	}
}

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
