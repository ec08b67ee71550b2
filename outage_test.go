package pgevents

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/pgevents/pgevents/internal/logtest"
	"github.com/pgevents/pgevents/internal/pgtest"
)

// logLines collects a logger's JSON lines (zerolog writes one line per
// Write), safe for concurrent use.
type logLines struct {
	mu    sync.Mutex
	lines []string
}

func (l *logLines) Write(p []byte) (int, error) {
	l.mu.Lock()
	l.lines = append(l.lines, strings.TrimSpace(string(p)))
	l.mu.Unlock()
	return len(p), nil
}

// since returns the lines written from index i on.
func (l *logLines) since(i int) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.lines[min(i, len(l.lines)):]...)
}

func (l *logLines) len() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.lines)
}

// logEntry is what the outage test reads of a line.
type logEntry struct {
	Level    string `json:"level"`
	Message  string `json:"message"`
	Repeated int    `json:"repeated"`
	Failures int    `json:"failures"`
}

func parseLine(t *testing.T, line string) logEntry {
	t.Helper()
	var e logEntry
	if err := json.Unmarshal([]byte(line), &e); err != nil {
		t.Fatalf("log line %q: %v", line, err)
	}
	return e
}

// TestOutageLogsAndBacksOff cuts a consumer of 8 partitions off the
// database for 10 s (every connection through its proxy closed, new ones
// refused), then restores it. The loops that retry against the database
// back off (fewer than 300 connection attempts in all; a watcher that
// retried at once made about 800 a second) and log a repeated failure at
// most once per interval (10 s): no message more than twice, fewer than
// 100 lines during the outage, at least one warning saying what fails,
// and, once the database is back, a line per loop saying that it
// recovered, after at most 25 failures. No event is lost: those appended
// before, during and after the outage are all handled.
func TestOutageLogsAndBacksOff(t *testing.T) {
	t.Parallel()
	const partitions = 8
	pool := newTopic(t, partitions)
	mustExec(t, pool, handledTable)
	proxied, proxy := pgtest.ProxiedPool(t, pool)
	var logs logLines
	log := zerolog.New(io.MultiWriter(&logs, logtest.New(t))).Level(zerolog.InfoLevel).With().Timestamp().Logger()
	startConsumer(t, proxied, Config{TotalPartitions: partitions, Handlers: recordingHandlers(), Logger: &log})

	var total int64
	appendRound := func(round string) {
		for i := range 2 * partitions {
			appendTx(t, pool, ev(fmt.Sprintf("h%d", i), "t", fmt.Sprintf(`{"round":%q}`, round)))
			total++
		}
	}
	appendRound("before")
	waitHandled(t, pool, total, 15*time.Second)

	cut := logs.len()
	proxy.SetRefuse(true)
	proxy.CloseAll()
	appendRound("during")
	// The outage's length is the point of the test, not a wait for
	// something to happen.
	time.Sleep(10 * time.Second)
	during := logs.since(cut)
	restored := cut + len(during)
	refused := proxy.Refused()
	proxy.SetRefuse(false)

	// Each connection attempt is refused: the loops' attempts, counted.
	if refused >= 300 {
		t.Errorf("%d connection attempts during a 10 s outage, want fewer than 300: a loop retries without backing off", refused)
	}

	if len(during) >= 100 {
		t.Errorf("%d log lines during a 10 s outage, want fewer than 100; the first ones:\n%s",
			len(during), strings.Join(during[:min(len(during), 20)], "\n"))
	}
	failed := 0
	perMessage := map[string]int{}
	for _, line := range during {
		e := parseLine(t, line)
		if e.Level == "warn" || e.Level == "error" {
			failed++
		}
		perMessage[e.Message]++
	}
	// One line per message per 10 s interval: the first failure, and at
	// most one more as the interval ends.
	for msg, n := range perMessage {
		if n > 2 {
			t.Errorf("%q logged %d times during a 10 s outage, want at most 2", msg, n)
		}
	}
	if failed == 0 {
		t.Errorf("no warning during the outage; lines:\n%s", strings.Join(during, "\n"))
	}

	appendRound("after")
	waitHandled(t, pool, total, 30*time.Second)
	checkHandled(t, pool)
	// The loops that fail for certain during the outage each say that
	// they recovered, and after how many failures: with the backoff, a
	// dozen or so in 10 s (the lease heartbeat alone, every 333 ms, made
	// 30).
	recovered := map[string]int{}
	pgtest.WaitFor(t, 30*time.Second, "lines saying the watcher, the listener and the lease heartbeat recovered", func() bool {
		for _, line := range logs.since(restored) {
			if e := parseLine(t, line); strings.Contains(e.Message, " recovered after ") && e.Failures > 0 {
				recovered[e.Message[:strings.Index(e.Message, " recovered after ")]] = e.Failures
			}
		}
		return recovered["watcher"] > 0 && recovered["listener"] > 0 && recovered["lease heartbeat"] > 0
	})
	for loop, n := range recovered {
		if n > 25 {
			t.Errorf("the %s recovered after %d failures in a 10 s outage, want at most 25: it does not back off", loop, n)
		}
	}
	t.Logf("%d connection attempts and %d log lines during the outage, %d warnings:\n%s\nthen:\n%s", refused, len(during), failed,
		strings.Join(during, "\n"), strings.Join(logs.since(restored), "\n"))
}
