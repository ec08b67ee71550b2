package finetimer

import (
	"runtime"
	"slices"
	"testing"
	"time"
)

// TestSleepIsPrecise: a 100 µs sleep in an idle process ends well before
// the millisecond Go's timers round it up to (on Linux; elsewhere the
// fallback is only checked to sleep at least d).
func TestSleepIsPrecise(t *testing.T) {
	tm := New()
	defer tm.Close()
	const d = 100 * time.Microsecond
	var took []time.Duration
	for range 200 {
		start := time.Now()
		tm.Sleep(d)
		took = append(took, time.Since(start))
	}
	slices.Sort(took)
	if took[0] < d {
		t.Fatalf("slept %v, less than %v", took[0], d)
	}
	if med := took[len(took)/2]; runtime.GOOS == "linux" && med > 600*time.Microsecond {
		t.Fatalf("median sleep of %v took %v: not precise", d, med)
	}
}
