// Package latency collects durations from concurrent goroutines and
// summarises them as the demo and the benchmark report them: p50 and p99
// of what came since the last look, and the longest ever.
package latency

import (
	"slices"
	"sync"
	"time"
)

// Recorder collects durations. The zero value is ready to use; it is safe
// for concurrent use.
type Recorder struct {
	mu  sync.Mutex
	d   []time.Duration
	max time.Duration // the longest ever added
}

// Add records d.
func (l *Recorder) Add(d time.Duration) {
	l.mu.Lock()
	l.d = append(l.d, d)
	l.max = max(l.max, d)
	l.mu.Unlock()
}

// Longest returns the longest duration ever added.
func (l *Recorder) Longest() time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.max
}

// Take returns the p50 and p99 of what was added since the last call, or
// zeros when nothing was.
func (l *Recorder) Take() (p50, p99 time.Duration) {
	l.mu.Lock()
	d := l.d
	l.d = nil
	l.mu.Unlock()
	if len(d) == 0 {
		return 0, 0
	}
	slices.Sort(d)
	return d[len(d)*50/100], d[min(len(d)-1, len(d)*99/100)]
}
