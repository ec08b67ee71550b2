package finetimer

import (
	"runtime"
	"slices"
	"testing"
	"time"
)

// TestSleepIsPrecise: 100 µs sleeps in an idle process end well before the
// millisecond Go's timers round them up to (on Linux; elsewhere the
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
	// The tenth percentile, not the median: on a loaded machine many
	// wake-ups wait for a CPU, but not nine in ten; time.Sleep in this
	// idle process never ends before about a millisecond.
	if p10 := took[len(took)/10]; runtime.GOOS == "linux" && p10 > 600*time.Microsecond {
		t.Fatalf("the tenth percentile of %d sleeps of %v took %v: not precise", len(took), d, p10)
	}
}
