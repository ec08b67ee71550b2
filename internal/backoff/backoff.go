// Package backoff paces the loops of a consumer process that retry against
// the database, and keeps their failures from flooding the log.
//
// A Retry is one loop's failure state. Each failure (Fail) doubles the wait
// before the next attempt, from Min to Max, with jitter; a success (Ok)
// resets it. The failures are logged at warning level, at most one line
// per message per Interval: the first one at once, the repeats within the
// interval counted, and the next line carries their count ("repeated").
// When the loop succeeds again after a failure that was logged, one line
// at info level says so, with the number of failures ("recovered after N
// failures"). A failure that comes and goes within the interval after the
// last line of its message is counted in the next line of that message,
// so that a flapping loop logs at most a failure and a recovery per
// interval.
package backoff

import (
	"cmp"
	"context"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/rs/zerolog"
)

// Defaults of New.
const (
	// DefaultMin is the first wait after a failure.
	DefaultMin = 50 * time.Millisecond
	// DefaultMax caps the wait between attempts: a database back after an
	// outage is found within it.
	DefaultMax = 5 * time.Second
	// DefaultInterval is how often, at most, a failure that repeats is
	// logged.
	DefaultInterval = 10 * time.Second
)

// Delay returns the wait after n consecutive failures (n ≥ 1): lo doubled
// per failure after the first, capped at hi, with jitter: uniformly in
// [d/2, d].
func Delay(lo, hi time.Duration, n int) time.Duration {
	d := lo
	for i := 1; i < n && d < hi; i++ {
		d *= 2
	}
	d = min(d, hi)
	return d/2 + rand.N(d/2+1)
}

// Retry is the failure state of one loop that retries against the
// database. Create it with New. It is safe for concurrent use, though a
// loop usually calls it from one goroutine.
type Retry struct {
	// Min and Max bound the wait between attempts (Delay).
	Min, Max time.Duration
	// Interval is how often, at most, a repeated failure is logged, per
	// message.
	Interval time.Duration

	log  zerolog.Logger
	name string
	now  func() time.Time

	mu       sync.Mutex
	failures int           // consecutive failures
	since    time.Time     // the first of them
	delay    time.Duration // the wait after the last failure; 0: not failing
	logged   bool          // a line of this run of failures was logged
	lines    Limiter
}

// Limiter lets a message's line through at most once per Interval,
// counting the lines it holds back: the repeats of one failure in loops
// that each fail on their own (a consumer's workers during an outage) make
// one line per interval. The zero value is ready, with DefaultInterval. It
// is safe for concurrent use.
type Limiter struct {
	// Interval is how often, at most, a line of one message goes through;
	// zero: DefaultInterval.
	Interval time.Duration

	mu    sync.Mutex
	sites map[string]*site
	now   func() time.Time // time.Now when nil
}

// site is what a Limiter knows of one message's lines.
type site struct {
	last       time.Time // when a line was last let through; zero: never
	suppressed int       // lines held back since
}

// Allow reports whether a line of msg may be logged now, and how many
// lines of it were held back since the last one that was (to log with
// it). A line held back is counted.
func (l *Limiter) Allow(msg string) (ok bool, suppressed int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := time.Now()
	if l.now != nil {
		now = l.now()
	}
	if l.sites == nil {
		l.sites = map[string]*site{}
	}
	s := l.sites[msg]
	if s == nil {
		s = &site{}
		l.sites[msg] = s
	}
	if !s.last.IsZero() && now.Sub(s.last) < cmp.Or(l.Interval, DefaultInterval) {
		s.suppressed++
		return false, 0
	}
	suppressed = s.suppressed
	s.last, s.suppressed = now, 0
	return true, suppressed
}

// New returns the failure state of a loop that logs to log and is named
// name in its recovery line ("watcher", "poller", ...), with the default
// bounds and interval; change them before the first call.
func New(log zerolog.Logger, name string) *Retry {
	return &Retry{Min: DefaultMin, Max: DefaultMax, Interval: DefaultInterval, log: log, name: name,
		now: time.Now}
}

// Periodic sets r's bounds for a loop that runs every period: from the
// period up to DefaultMax, or the period when longer. It returns r.
func (r *Retry) Periodic(period time.Duration) *Retry {
	r.Min, r.Max = period, max(period, DefaultMax)
	return r
}

// Fail records a failure of the loop, logs it with err and msg (a constant
// message: the key of its lines) unless a line of msg was logged within
// Interval, and returns how long to wait before the next attempt.
func (r *Retry) Fail(err error, msg string) time.Duration {
	r.mu.Lock()
	defer r.mu.Unlock()
	now := r.now()
	if r.failures == 0 {
		r.since = now
	}
	r.failures++
	r.delay = Delay(r.Min, r.Max, r.failures)
	r.lines.Interval, r.lines.now = r.Interval, r.now
	ok, repeated := r.lines.Allow(msg)
	if !ok {
		return r.delay
	}
	ev := r.log.Warn().Err(err).Int("failures", r.failures).Int64("retry_in_ms", r.delay.Milliseconds())
	if repeated > 0 {
		ev = ev.Int("repeated", repeated).Int64("interval_ms", r.Interval.Milliseconds())
	}
	ev.Msg(msg)
	r.logged = true
	return r.delay
}

// Ok records that the loop succeeded: the next failure waits Min again.
// After a run of failures of which a line was logged, it logs one line
// saying that the loop recovered, and after how many failures.
func (r *Retry) Ok() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.failures == 0 {
		return
	}
	if r.logged {
		r.log.Info().Int("failures", r.failures).Int64("failing_for_ms", r.now().Sub(r.since).Milliseconds()).
			Msgf("%s recovered after %d failures", r.name, r.failures)
	}
	r.failures, r.delay, r.logged = 0, 0, false
}

// Backoff returns the wait before the next attempt that the last failure
// asked for, or 0 when the loop has succeeded since (or never failed).
func (r *Retry) Backoff() time.Duration {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.delay
}

// Sleep waits d, or until ctx is done, and reports whether ctx is still
// live.
func Sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
