package console

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestLimiterCheckIsAtomic: the limiter's check, comparison and count are
// one step: a burst of concurrent wrong credentials from one address,
// each comparison slow enough for every other request to arrive meanwhile,
// gets max comparisons; the others are refused without one.
func TestLimiterCheckIsAtomic(t *testing.T) {
	t.Parallel()
	const n, max = 32, 5
	l := newLimiter(max, time.Minute)
	var (
		wg       sync.WaitGroup
		start    = make(chan struct{})
		compared atomic.Int32
		blocked  atomic.Int32
	)
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			_, b := l.check("192.0.2.1", func() bool {
				compared.Add(1)
				time.Sleep(2 * time.Millisecond) // a slow comparison: the others arrive meanwhile
				return false
			})
			if b {
				blocked.Add(1)
			}
		}()
	}
	close(start)
	wg.Wait()
	if c, b := compared.Load(), blocked.Load(); c != max || b != n-max {
		t.Fatalf("%d concurrent wrong credentials: %d compared, %d refused; want %d and %d", n, c, b, max, n-max)
	}
	if ok, b := l.check("192.0.2.1", func() bool { return true }); ok || !b {
		t.Fatalf("the right credential after %d failures: ok %v, blocked %v; want refused", max, ok, b)
	}
	if ok, b := l.check("192.0.2.2", func() bool { return true }); !ok || b {
		t.Fatalf("another address: ok %v, blocked %v; want the credential checked", ok, b)
	}
}
