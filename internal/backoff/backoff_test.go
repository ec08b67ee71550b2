package backoff

import (
	"bytes"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"
)

func TestDelayDoublesToTheCapWithJitter(t *testing.T) {
	for n, want := range map[int]time.Duration{1: 100 * time.Millisecond, 2: 200 * time.Millisecond,
		4: 800 * time.Millisecond, 6: time.Second, 60: time.Second} {
		seen := map[time.Duration]bool{}
		for range 200 {
			d := Delay(100*time.Millisecond, time.Second, n)
			if d < want/2 || d > want {
				t.Fatalf("Delay after %d failures = %s, want within [%s, %s]", n, d, want/2, want)
			}
			seen[d] = true
		}
		if len(seen) < 10 {
			t.Fatalf("Delay after %d failures took %d values in 200 calls: no jitter", n, len(seen))
		}
	}
}

// clocked returns a Retry logging into buf whose clock is *now.
func clocked(buf *bytes.Buffer, now *time.Time) *Retry {
	r := New(zerolog.New(buf), "loop")
	r.now = func() time.Time { return *now }
	return r
}

type line struct {
	Level    string `json:"level"`
	Message  string `json:"message"`
	Repeated int    `json:"repeated"`
	Failures int    `json:"failures"`
}

func lines(t *testing.T, buf *bytes.Buffer) []line {
	t.Helper()
	var out []line
	for _, s := range strings.Split(strings.TrimSpace(buf.String()), "\n") {
		if s == "" {
			continue
		}
		var l line
		if err := json.Unmarshal([]byte(s), &l); err != nil {
			t.Fatal(err)
		}
		out = append(out, l)
	}
	buf.Reset()
	return out
}

// TestRetryLogsOncePerInterval: the first failure is logged at once, the
// repeats within the interval are not, the first one after it carries
// their count, and a success logs one recovery line with the number of
// failures and resets the backoff.
func TestRetryLogsOncePerInterval(t *testing.T) {
	var buf bytes.Buffer
	now := time.Unix(1000, 0)
	r := clocked(&buf, &now)
	err := errors.New("connection refused")
	for i := range 100 {
		r.Fail(err, "down")
		now = now.Add(50 * time.Millisecond) // 5 s in all
		if i == 0 {
			if got := lines(t, &buf); len(got) != 1 || got[0].Message != "down" || got[0].Level != "warn" {
				t.Fatalf("the first failure logged %+v, want one warning", got)
			}
		}
	}
	if got := lines(t, &buf); len(got) != 0 {
		t.Fatalf("99 repeats within the interval logged %d lines, want none: %+v", len(got), got)
	}
	now = now.Add(5 * time.Second)
	d := r.Fail(err, "down")
	got := lines(t, &buf)
	if len(got) != 1 || got[0].Repeated != 99 || got[0].Failures != 101 {
		t.Fatalf("the failure after the interval logged %+v, want one line with repeated 99 and failures 101", got)
	}
	if d < DefaultMax/2 || r.Backoff() != d {
		t.Fatalf("after 101 failures the wait is %s (Backoff %s), want the cap's [%s, %s]", d, r.Backoff(), DefaultMax/2, DefaultMax)
	}
	r.Ok()
	got = lines(t, &buf)
	if len(got) != 1 || got[0].Level != "info" || got[0].Message != "loop recovered after 101 failures" || got[0].Failures != 101 {
		t.Fatalf("the success logged %+v, want one recovery line", got)
	}
	if r.Backoff() != 0 {
		t.Fatalf("Backoff after a success = %s, want 0", r.Backoff())
	}
	r.Ok()
	if got := lines(t, &buf); len(got) != 0 {
		t.Fatalf("a second success logged %+v", got)
	}
	if d := r.Fail(err, "other"); d > DefaultMin {
		t.Fatalf("the first failure after a success waits %s, want at most %s", d, DefaultMin)
	}
	if got := lines(t, &buf); len(got) != 1 || got[0].Message != "other" {
		t.Fatalf("another message's first failure logged %+v, want it at once", got)
	}
}

// TestRetryFlappingLogsOncePerInterval: a loop that fails and succeeds in
// turn logs one failure and one recovery per interval, and the next
// failure line counts the failures in between.
func TestRetryFlappingLogsOncePerInterval(t *testing.T) {
	var buf bytes.Buffer
	now := time.Unix(1000, 0)
	r := clocked(&buf, &now)
	for range 50 {
		r.Fail(errors.New("x"), "flap")
		r.Ok()
		now = now.Add(100 * time.Millisecond)
	}
	if got := lines(t, &buf); len(got) != 2 {
		t.Fatalf("50 failures and recoveries within 5 s logged %d lines, want a failure and a recovery: %+v", len(got), got)
	}
	now = now.Add(10 * time.Second)
	r.Fail(errors.New("x"), "flap")
	if got := lines(t, &buf); len(got) != 1 || got[0].Repeated != 49 {
		t.Fatalf("the failure after the interval logged %+v, want repeated 49", got)
	}
}
