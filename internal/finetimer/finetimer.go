// Package finetimer sleeps for sub-millisecond durations with the
// precision the caller asked for.
//
// Go's timers wake an idle process through the runtime's network poller,
// whose wait is in whole milliseconds on Linux: a 100 µs timer in a process
// with nothing else to do fires after about 1.09 ms, as does every timer
// below a millisecond. A watcher that means to look every 100 µs would look
// every millisecond. On Linux a Timer sleeps on a timerfd, which the poller
// watches like a socket: the goroutine parks (no thread or processor is
// held), and the kernel's high-resolution timer wakes it within tens of
// microseconds of the deadline. Elsewhere it falls back to time.Sleep.
package finetimer

import "time"

// Timer sleeps precisely. It is used by one goroutine at a time.
type Timer struct {
	impl
}

// New returns a Timer. It never fails: when the precise clock cannot be
// had (not Linux, or no timerfd), the Timer sleeps with time.Sleep.
func New() *Timer {
	return &Timer{impl: newImpl()}
}

// Sleep waits for d. Use it for waits of a few milliseconds at most: it
// cannot be interrupted.
func (t *Timer) Sleep(d time.Duration) {
	if d <= 0 {
		return
	}
	if !t.sleep(d) {
		time.Sleep(d)
	}
}

// Close releases the Timer's clock.
func (t *Timer) Close() {
	t.close()
}
